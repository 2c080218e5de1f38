#!/usr/bin/env bash
# The launcher at scale on one machine, with real processes and sockets: a job of N nodes x R ranks
# whose N agents are started after ddprun's own start, as another system would start them
# (launcher: external, `ddprun agent --join`), each with its guard and R ranks (bench/scale_rank: one
# store barrier of all ranks, then a wait). For each N: ddprun's start to the first barrier; the
# launcher's CPU seconds, resident memory and open sockets then; a node loss (an agent SIGKILLed:
# until the launcher counts it lost, and until the next round's barrier); a clean stop (SIGINT to
# ddprun, until it has exited). Everything runs in a PID namespace of its own (unshare --pid
# --kill-child): whatever is left dies with it.
# Usage: bench/scale.sh [BUILD] [N[xR]...]   (BUILD default build/release; N nodes of R ranks, R
#        default 2; default 16 64 256 1024 256x1 256x8: the launcher's cost grows with nodes, and
#        with ranks a node only as their store connections do)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
if [ -z "${DDP_SCALE_INNER:-}" ]; then
  bench_record scale "$@"
  exec unshare --pid --fork --kill-child --mount --mount-proc env DDP_SCALE_INNER=1 "$0" "$@"
fi
cd "$(dirname "$0")/.."
bench_dirs "${1:-build/release}"
shift || true
sizes=${*:-16 64 256 1024 256x1 256x8}
[ -x "$B/ddprun" ] && [ -x "$B/bench/scale_rank" ] || { echo "build $B first (ddprun, bench/scale_rank)" >&2; exit 1; }
ulimit -n "$(ulimit -Hn)"
tck=$(getconf CLK_TCK)

cpu_s() { awk -v t="$tck" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; }
rss_mib() { awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
sockets() { find "/proc/$1/fd" -lname 'socket:*' 2>/dev/null | wc -l; }
now_ns() { date +%s%N; }
# Waits until file $1 has $2 lines matching $3 (at most $4 s, and while ddprun runs): 0, or 1.
wait_lines() {
  local end=$((SECONDS + $4))
  while [ "$(grep -c "$3" "$1" 2>/dev/null || true)" -lt "$2" ]; do
    [ "$SECONDS" -lt "$end" ] && kill -0 "$ddp" 2>/dev/null || return 1
    sleep 0.05
  done
}

echo "| nodes | ranks | all joined s | ranks running s | first barrier s | launcher CPU s | launcher CPU ms/node | launcher RSS MiB | launcher sockets | loss: lost s | loss: next barrier s | stop s | store requests | requests/node |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for spec in $sizes; do
  n=${spec%x*} R=2
  [ "$spec" = "$n" ] || R=${spec#*x}
  d="$T/n$spec"
  mkdir -p "$d"
  cd "$d"
  openssl rand -hex 32 >tok
  chmod 600 tok
  # the rendezvous port and the agent port after it, both free now
  port=$(/usr/bin/python3 -c 'import socket
while True:
    a, b = socket.socket(), socket.socket()
    a.bind(("0.0.0.0", 0))
    p = a.getsockname()[1]
    try:
        b.bind(("0.0.0.0", p + 1))
        print(p)
        break
    except OSError:
        pass')
  cat >job.yaml <<JOB
command: [$B/bench/scale_rank]
launcher: external
nodes: $n
nproc_per_node: $R
rendezvous: {listen: 0.0.0.0, port: $port, token_file: tok, timeout: 600s, last_call: 1s}
elastic: {min_nodes: $((n - 1)), max_restarts: 1, heartbeat_interval: 2s, heartbeat_timeout: 20s}
logs: {dir: logs}
stop_grace: 5s
JOB
  t0=$(now_ns)
  "$B/ddprun" job.yaml >out.txt 2>err.txt &
  ddp=$!
  agents=()
  for ((k = 0; k < n; k++)); do
    "$B/ddprun" agent --join "127.0.0.1:$port" --token-file tok </dev/null >/dev/null 2>>agents.err &
    agents+=($!)
  done
  if ! wait_lines out.txt 1 'barrier [0-9]' 900; then
    echo "| $n | $((n * R)) | | | no barrier (ddprun: $(tail -n1 err.txt)) | | | | | | | | | |"
    tail -n 5 err.txt agents.err >&2
    kill -9 "$ddp" "${agents[@]}" 2>/dev/null || true
    continue
  fi
  tb=$(grep -o 'barrier [0-9]*' out.txt | head -n1 | cut -d' ' -f2)
  start_s=$(awk -v a="$t0" -v b="$tb" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
  cpu=$(cpu_s "$ddp") rss=$(rss_mib "$ddp") socks=$(sockets "$ddp")
  per=$(awk -v c="$cpu" -v n="$n" 'BEGIN { printf "%.2f", c * 1000 / n }')
  # from events.jsonl ("t": seconds since ddprun's start): round 0 formed, its ranks all started
  ev_t() { grep -m1 "\"event\": \"$1\"" logs/*/events.jsonl | sed 's/.*"t": \([0-9.]*\).*/\1/'; }
  joined_s=$(ev_t membership) running_s=$(ev_t workers_running)
  # a node's agent SIGKILLed: its ranks die with it (their parent-death signal)
  tk=$(now_ns)
  kill -9 "${agents[$((n - 1))]}"
  lost_s="-" next_s="-"
  if wait_lines logs/*/events.jsonl 1 '"event": "node_lost"' 60; then
    lost_s=$(awk -v a="$tk" -v b="$(now_ns)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
    wait_lines out.txt 2 'barrier [0-9]' 300 &&
      next_s=$(awk -v a="$tk" -v b="$(grep -o 'barrier [0-9]*' out.txt | sed -n 2p | cut -d' ' -f2)" \
        'BEGIN { printf "%.2f", (b - a) / 1e9 }')
  fi
  ts=$(now_ns)
  kill -INT "$ddp"
  wait "$ddp" 2>/dev/null || true
  stop_s=$(awk -v a="$ts" -v b="$(now_ns)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
  # the job's store: every request it served in the whole run (summary.json)
  reqs=$(grep -o '"requests": [0-9]*' logs/*/summary.json | grep -o '[0-9]*$')
  reqs=${reqs:-0}
  echo "| $n | $((n * R)) | $joined_s | $running_s | $start_s | $cpu | $per | $rss | $socks | $lost_s | $next_s | $stop_s | $reqs | $((reqs / n)) |"
  kill -9 "${agents[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  cd "$T"
done
echo
echo "Seconds from ddprun's start (agents started after it by a shell loop); launcher CPU, RSS and"
echo "sockets: ddprun's own process at the first barrier; store requests: the whole run's. All processes share"
echo "the machine's $(nproc) CPUs."
