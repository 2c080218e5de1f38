#!/usr/bin/env bash
# Launch to first barrier through srun vs through SSH, on 1, 4 and 16 test hosts of a real
# Slurm (tests/lib/slurm.bash: slurmctld here, each host a network namespace running its own
# slurmd and sshd). One rank per host runs ddprun's store-barrier smoke worker; inside one
# `salloc -N n` per size, RUNS runs with `launcher: srun` (the agents one srun step) and RUNS with
# `launcher: ssh` (the same hosts by address, over libssh), and at 16 hosts RUNS with
# `ssh.fanout: 4` (the SSH tree: the launcher reaches 4 hosts, each of them 3 more). Per phase, from the job's
# events.jsonl and rank 0's timestamped log: provision (start to the last node joined: agent
# started and in the store), rendezvous (to the round's membership), start (to workers
# running), barrier (to rank 0 past the store barrier: ranks exec'd, connected, met), and the
# whole `ddprun` run to exit; the CPU time of ddprun and all it ran on the launching host (its
# bridges or srun: the login node's cost). Medians in ms. Also the launcher-side cost of one srun step:
# memory of the srun processes. Needs root, slurm-wlm and openssh-server.
# Usage: bench/slurm_launch.sh [BUILD_DIR] [RUNS]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record slurm_launch "$@" # its output goes to bench/results/<machine>/slurm_launch.md too
cd "$(dirname "$0")/.."
REPO=$PWD
B=$(cd "${1:-build/release}" && pwd)
RUNS=${2:-7}
BATS_TEST_TMPDIR=$(mktemp -d)
skip() { echo "cannot run: $*" >&2; exit 1; }
# shellcheck source=../tests/lib/sshd.bash
. tests/lib/sshd.bash
# shellcheck source=../tests/lib/slurm.bash
. tests/lib/slurm.bash
trap 'slurm_teardown; rm -rf "$BATS_TEST_TMPDIR"' EXIT
cd "$BATS_TEST_TMPDIR"
slurm_setup 16 2
for k in $(seq 16); do sshd_start "$k"; done
export B RUNS REPO

# One size: runs inside the allocation; prints one table row per launcher.
cat >one.sh <<'ONE'
#!/usr/bin/env bash
set -euo pipefail
n=$1
printf 'command: [%s, __smoke-worker]\nnodes: slurm\nnproc_per_node: 1\nlauncher: srun\nlogs: {dir: logs-srun, timestamps: true}\n' "$B/ddprun" >srun.yaml
. "$REPO/tests/lib/sshd.bash"
eval "$(cat vars)"
ssh_job ssh.yaml 1 $(seq "$n") -- "$B/ddprun" __smoke-worker
sed -i 's/^logs: .*/logs: {dir: logs-ssh, timestamps: true}/' ssh.yaml
echo "launcher: ssh" >>ssh.yaml
sed 's/^ssh: {\(.*\)}$/ssh: {\1, fanout: 4}/; s/logs-ssh/logs-tree/' ssh.yaml >tree.yaml
ms() { date -d "$1" +%s%3N; }
# CPU of the children this shell has reaped (ddprun, and what it reaped), in ms
reaped_cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print int(($16 + $17) * 1000 / hz) }' /proc/$$/stat; }
ls="srun ssh"
[ "$n" -ge 16 ] && ls="$ls tree"
for l in $ls; do
  rm -rf "logs-$l"
  tot=() cpu=()
  for _ in $(seq "$RUNS"); do
    c=$(reaped_cpu)
    s=$(date +%s%N)
    "$B/ddprun" "$l.yaml" >out.txt 2>&1 || { cat out.txt >&2; exit 1; }
    e=$(date +%s%N)
    tot+=($(((e - s) / 1000000)))
    cpu+=($(($(reaped_cpu) - c)))
  done
  # phases of each run, from its records
  for d in logs-$l/*/; do
    ev=$d/events.jsonl
    t() { grep "\"event\": \"$1\"" "$ev" | tail -n1 | grep -o '"time": "[^"]*' | cut -d'"' -f4; }
    t0=$(ms "$(t job_start)"); tj=$(ms "$(t node_joined)"); tm=$(ms "$(t membership)")
    tw=$(ms "$(t workers_running)")
    met=$(grep -m1 -E 'ranks? met at the store' "$d/rank-0.log" | cut -d' ' -f1)
    [ -n "$met" ] || { echo "$d/rank-0.log: no 'met at the store' line" >&2; exit 1; }
    tb=$(ms "$met")
    echo "$((tj - t0)) $((tm - tj)) $((tw - tm)) $((tb - tw)) $((tb - t0))"
  done >phases.txt
  med() { sort -n | sed -n "$(((RUNS + 1) / 2))p"; }
  name=$l
  [ "$l" = tree ] && name="ssh, fanout 4"
  row="| $n | $name"
  for c in 1 2 3 4 5; do row="$row | $(cut -d' ' -f$c phases.txt | med)"; done
  echo "$row | $(printf '%s\n' "${tot[@]}" | med) | $(printf '%s\n' "${cpu[@]}" | med) |"
done
ONE
chmod +x one.sh
declare -p SSHD_TAG SSHD_NETNS SSH_DIR SSH_PORT SSH_KEY SSH_KH >vars

echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; slurm $(srun --version | cut -d' ' -f2); $(sshd -V 2>&1 | head -n1 || true)"
echo "| hosts | launcher | provision | rendezvous | start | barrier | launch to barrier | whole run | launcher CPU |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|"
for n in 1 4 16; do
  slurm_login salloc -N "$n" --quiet ./one.sh "$n"
done
# What one srun step costs on the launching host: the proportional set size (shared pages
# divided among their users) of the srun processes of a 16-node job.
printf 'command: [sleep, "3"]\nnodes: slurm\nnproc_per_node: 1\nlogs: {dir: logs-rss}\n' >rss.yaml
slurm_login salloc -N 16 --quiet "$B/ddprun" rss.yaml >rss.out 2>&1 &
sleep 2
kb=$(for p in $(pgrep -x srun); do awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup"; done |
  awk '{s += $1; n++} END { if (n) printf "%d srun processes, %.0f KiB PSS in all (%.0f KiB per node)", n, s, s / 16 }')
wait
# The launching host's SSH connections, 16 nodes over SSH, flat and as a tree.
conns=""
for f in "" ", fanout: 4"; do
  ssh_job conn.yaml 1 $(seq 16) -- sleep 3
  sed -i "s/^ssh: {\(.*\)}$/ssh: {\1$f}/; s/^logs: .*/logs: {dir: logs-conn}/" conn.yaml
  "$B/ddprun" conn.yaml >conn.out 2>&1 &
  sleep 2.5
  conns="$conns $(ss -Htn state established "( dport = :$SSH_PORT )" | wc -l)"
  wait
done
echo
echo "launching host, 16 nodes: $kb"
echo "launching host, 16 nodes over SSH: $(echo $conns | cut -d' ' -f1) SSH connections flat, $(echo $conns | cut -d' ' -f2) with ssh.fanout 4"
