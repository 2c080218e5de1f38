#!/usr/bin/env bash
# Detection and recovery time after a node is lost, for ddprun on 2, 3 and 4 SSH test hosts
# (network namespaces from tests/lib/sshd.bash, one rank each), its ranks started cold
# (warm: off) and warm (the default: restarted from the warm interpreters their agents keep),
# and for torchrun's elastic agent (Debian's python3-torch, --rdzv-backend c10d, N agents on
# this machine, the last one lost with its worker). Both run bench/elastic_worker.py, an
# unmodified PyTorch script (gloo, one all-reduce every 20 ms); recovery is from the loss to the
# first all-reduce of the next attempt on the survivors. A node is lost either killed (SIGKILL of
# everything on it but its listening sshd) or, in the last row, hung (SIGSTOP of the same): that
# one is found by its missed heartbeats, so its time includes heartbeat_timeout. Same settings on
# both sides: last call 1 s, heartbeat 5 s / 15 s (torch 1.13's fixed keep-alive: 5 s interval,
# 3 attempts), monitor interval 0.1 s. For ddprun with warm ranks, the phases of its recovery
# timeline (the recovery event: seconds after the loss was detected until the old ranks stopped,
# the round formed, the ranks started, their process groups formed and their first all-reduce
# was done). The row "3+1" has a spare node beyond elastic.max_nodes 3, which takes the lost
# node's place: warm, it restarts from the interpreters its agent keeps since it joined.
# The second table has a checkpoint: rank 0 saves CKPT_MB MiB with torch.save once, and every rank
# of the next attempt loads it before it joins the group. For ddprun each host's checkpoint folder
# is a private tmpfs (no folder in common) with checkpoint.replicas 1, and the host lost is rank
# 0's, which saved it: the members without a copy get one from the node that holds it before their
# ranks start (the timeline's "restored" phase, and how long the restore took). torchrun has no
# such thing: its checkpoint is in a folder all its agents share (this machine's).
# Medians of RUNS runs. Needs root, openssh-server, iproute2 and python3-torch.
# Usage: bench/elastic_recovery.sh [BUILD_DIR] [RUNS]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record elastic_recovery "$@" # its output goes to bench/results/<machine>/elastic_recovery.md too
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. bench/lib.sh
REPO=$PWD
B=$(cd "${1:-build/release}" && pwd)
RUNS=${2:-5}
PY=/usr/bin/python3
BATS_TEST_TMPDIR=$(mktemp -d)
# shellcheck source=../tests/lib/sshd.bash
. tests/lib/sshd.bash
trap 'sshd_teardown; rm -rf "$BATS_TEST_TMPDIR"' EXIT
cd "$BATS_TEST_TMPDIR"
CK=$BATS_TEST_TMPDIR/ck # each host's own (a tmpfs in its mount namespace)
mkdir -p "$CK" shared
# shellcheck disable=SC2034 # (read by tests/lib/sshd.bash)
SSHD_TMPFS=$CK
export XDG_RUNTIME_DIR=$BATS_TEST_TMPDIR/run
mkdir -m 700 "$XDG_RUNTIME_DIR"
sshd_setup
[ -n "$SSHD_NETNS" ] || { echo "needs network namespaces" >&2; exit 1; }
for k in 1 2 3 4; do sshd_start "$k"; done

now() { date +%s.%N; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
wait_for() { # file pattern [count]: within 90 s
  for _ in $(seq 1800); do
    [ "$(grep -c "$2" "$1" 2>/dev/null || true)" -ge "${3:-1}" ] && return 0
    sleep 0.05
  done
  echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; return 1
}
tval() { grep "$2" "$1" | sed -n "${3:-1}p" | grep -o ' t=[0-9.]*' | cut -d= -f2; }

# Every pid of node K but its sshd: agent, ranks.
node_job_pids() { sshd_tree "$1" | cut -s -d' ' -f2-; }

warm_ready() { ps -eo stat=,comm= | awk '$2 == "ddprun-warm" && $1 !~ /^Z/' | wc -l; }

ddprun_run() { # nodes warm(on|off) loss(killed|hung) [spares] [checkpoint MiB]
  # -> "detect recover stopped formed started groups first restored restore_took"
  local n=$1 warm=$2 loss=$3 spares=${4:-0} mb=${5:-0}
  ssh_job job.yaml 1 $(seq $((n + spares))) -- "$PY" "$REPO/bench/elastic_worker.py"
  cat >>job.yaml <<JOB
elastic: {min_nodes: 1, max_nodes: $n, max_restarts: 3, heartbeat_interval: 5s, heartbeat_timeout: 15s}
rendezvous: {last_call: 1s}
warm: $warm
JOB
  [ "$mb" = 0 ] || printf 'checkpoint: {dir: %s, replicas: 1}\nenv: {CKPT: %s/ckpt.pt, CKPT_MB: "%s"}\n' \
    "$CK" "$CK" "$mb" >>job.yaml
  rm -rf logs
  "$B/ddprun" job.yaml >out.txt 2>&1 &
  local ddp=$!
  wait_for out.txt "TRAINING restart=0"
  sleep 1
  if [ "$warm" = on ]; then # every node's warm interpreter is ready (made after the first
    # collective; a spare's at once)
    for _ in $(seq 300); do [ "$(warm_ready)" -ge $((n + spares)) ] && break; sleep 0.1; done
  fi
  # the node lost: the last member to join (rank 0, which prints, is on the first)
  local victim=$n members k
  members=$(grep '"event": "membership"' logs/*/events.jsonl | head -n1 | grep -o '"nodes": "[^"]*' | cut -d'"' -f4)
  for k in $(seq $((n + spares))); do
    [ "$(sshd_addr "$k")" = "$(echo "$members" | tr ',' '\n' | tail -n1 | tr -d ' ')" ] && victim=$k
  done
  if [ "$mb" != 0 ]; then # rank 0's host, once its checkpoint has its copy on another node
    for k in $(seq $((n + spares))); do
      [ "$(sshd_addr "$k")" = "$(echo "$members" | cut -d, -f1 | tr -d ' ')" ] && victim=$k
    done
    wait_for out.txt "SAVED"
    for _ in $(seq 600); do
      "$B/ddprun" status 2>/dev/null | grep -q "^checkpoint replication: 1 file, each with" && break
      sleep 0.1
    done
  fi
  local t0 pids; pids=$(node_job_pids "$victim")
  t0=$(now)
  if [ "$loss" = killed ]; then kill -9 $pids; else kill -STOP $pids; fi
  wait_for out.txt "TRAINING restart=1"
  local tl; tl=$(date -d "$(grep '"event": "node_lost"' logs/*/events.jsonl | sed -n 1p | grep -o '"time": "[^"]*' | cut -d'"' -f4)" +%s.%N)
  local tr; tr=$(tval out.txt "TRAINING restart=1")
  # the timeline's event comes once the ranks' first collective is known (a heartbeat later)
  wait_for logs/*/events.jsonl '"event": "recovery"'
  local phases
  phases=$(grep '"event": "recovery"' logs/*/events.jsonl | head -n1 |
    grep -oE '"[a-z_]+_ms": ([0-9]+|null)' | grep -v detected |
    awk '{ if ($2 == "null") printf " -"; else printf " %.3f", $2 / 1000 }')
  if [ "$loss" = hung ]; then kill -CONT $pids 2>/dev/null || true; fi
  kill -INT "$ddp"; wait "$ddp" || true
  kill -9 $pids 2>/dev/null || true
  sshd_start "$victim" >/dev/null 2>&1 || true # back for the next run (the key is known already)
  awk -v a="$t0" -v l="$tl" -v r="$tr" -v p="$phases" 'BEGIN { printf "%.3f %.3f%s\n", l - a, r - a, p }'
}

torchrun_run() { # agents loss(killed|hung) [checkpoint MiB] -> "recover" (">60": not within 60 s)
  local n=$1 loss=$2 mb=${3:-0} port pids=() k
  port=$(free_port)
  rm -f shared/ckpt.pt
  for k in $(seq "$n"); do
    local ck=()
    [ "$mb" = 0 ] || ck=(env CKPT="$PWD/shared/ckpt.pt" CKPT_MB="$mb")
    setsid "${ck[@]}" "$PY" -m torch.distributed.run --redirects 1 --tee 1 --nnodes "1:$n" --nproc_per_node 1 \
      --rdzv_backend c10d \
      --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "bench$port" --max_restarts 3 \
      --monitor_interval 0.1 --rdzv_conf last_call_timeout=1 \
      "$REPO/bench/elastic_worker.py" >"tr$k.txt" 2>&1 &
    pids+=($!)
    [ "$k" -eq 1 ] && sleep 1 # the first agent hosts the c10d store
  done
  cat tr*.txt >/dev/null
  for _ in $(seq 600); do grep -q "TRAINING restart=0 world=$n" tr*.txt 2>/dev/null && break; sleep 0.05; done
  [ "$mb" = 0 ] || for _ in $(seq 600); do grep -q "SAVED" tr*.txt && break; sleep 0.05; done
  sleep 1
  local t0; t0=$(now)
  if [ "$loss" = killed ]; then kill -9 -- "-${pids[$((n - 1))]}"; else kill -STOP -- "-${pids[$((n - 1))]}"; fi
  for _ in $(seq 1200); do grep -q "TRAINING restart=1" tr*.txt 2>/dev/null && break; sleep 0.05; done
  local tr; tr=$(grep -h "TRAINING restart=1" tr*.txt | sed -n 1p | grep -o ' t=[0-9.]*' | cut -d= -f2 || true)
  for p in "${pids[@]}"; do kill -CONT -- "-$p" 2>/dev/null || true; kill -9 -- "-$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -f tr*.txt
  [ -n "$tr" ] || { echo ">60"; return; }
  awk -v a="$t0" -v r="$tr" 'BEGIN { printf "%.3f\n", r - a }'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^>/) printf ">%.0fx", substr(a, 2) / b; else printf "%.1fx", a / b }'; }

echo "# $(date -u +%F) $(nproc) cores; torch $($PY -c 'import torch; print(torch.__version__)')"
echo "| nodes | loss | ddprun detection s | ddprun cold s | ddprun warm s | torchrun s | torchrun / ddprun warm | warm: stopped | formed | started | groups formed | first all-reduce |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
# "3+1": 3 nodes and a spare (beyond elastic.max_nodes), which takes the lost node's place; no
# torchrun beside it (its agents beyond --nnodes's maximum are not spares of a round)
IFS=, read -r -a ROWS <<<"${ROWS:-2 killed,3 killed,3+1 killed,4 killed,4 hung}" # (ROWS: some of them)
for row in "${ROWS[@]}"; do
  set -- $row
  loss=$2 n=${1%+*} sp=0
  [[ $1 == *+* ]] && sp=${1#*+}
  : >c.txt; : >w.txt; : >t.txt
  for _ in $(seq "$RUNS"); do
    [ "$loss" = killed ] && ddprun_run "$n" off "$loss" "$sp" >>c.txt
    ddprun_run "$n" on "$loss" "$sp" >>w.txt
    [ "$sp" = 0 ] && torchrun_run "$n" "$loss" >>t.txt
  done
  det=$(cut -d' ' -f1 w.txt | median); warm=$(cut -d' ' -f2 w.txt | median)
  cold=-; [ -s c.txt ] && cold=$(cut -d' ' -f2 c.txt | median)
  trr=- rat=-
  if [ "$sp" = 0 ]; then
    trr=">60" # (a median: when most runs did not recover within 60 s, that)
    [ "$(grep -c '^>' t.txt)" -le $((RUNS / 2)) ] && trr=$(grep -v '^>' t.txt | median)
    rat=$(ratio "$trr" "$warm")
  fi
  ph=""
  for c in 3 4 5 6 7; do ph="$ph | $(cut -d' ' -f$c w.txt | median)"; done
  printf '| %s | %s | %s | %s | %s | %s | %s%s |\n' "$1" "$loss" "$det" "$cold" "$warm" "$trr" \
    "$rat" "$ph"
done

# With a checkpoint: 4 nodes, rank 0's host killed
echo
echo "| nodes | checkpoint | ddprun cold s | ddprun warm s | torchrun s (shared folder) | torchrun / ddprun warm | warm: stopped | formed | checkpoint restored | restore took | started | groups formed | first all-reduce |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
IFS=, read -r -a CROWS <<<"${CROWS:-1,100}" # (CROWS: checkpoint sizes in MiB)
for mb in "${CROWS[@]}"; do
  : >c.txt; : >w.txt; : >t.txt
  for _ in $(seq "$RUNS"); do
    ddprun_run 4 off killed 0 "$mb" >>c.txt
    ddprun_run 4 on killed 0 "$mb" >>w.txt
    torchrun_run 4 killed "$mb" >>t.txt
  done
  warm=$(cut -d' ' -f2 w.txt | median); cold=$(cut -d' ' -f2 c.txt | median)
  trr=">60"
  [ "$(grep -c '^>' t.txt)" -le $((RUNS / 2)) ] && trr=$(grep -v '^>' t.txt | median)
  ph=""
  for c in 3 4 8 9 5 6 7; do ph="$ph | $(cut -d' ' -f$c w.txt | median)"; done
  printf '| 4 | %s MiB, replicas 1 | %s | %s | %s | %s%s |\n' "$mb" "$cold" "$warm" "$trr" \
    "$(ratio "$trr" "$warm")" "$ph"
done
