#!/usr/bin/env bash
# Launch-to-barrier latency: ddprun's smoke job (the default job's worker when no trainer is
# installed: N local ranks connect to the job's store, pass a barrier, all-gather a line, pass a
# second barrier) vs torchrun --standalone running a gloo init and
# one barrier (Debian's python3-torch). Wall time from start to exit, median of RUNS, interleaved.
# Usage: bench/launch_compare.sh [BUILD_DIR]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record launch_compare "$@" # its output goes to bench/results/<machine>/launch_compare.md too
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
RUNS=${RUNS:-5}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
SCRIPT=$PWD/bench/torch_barrier.py
TORCHRUN=(/usr/bin/python3 -m torch.distributed.run --standalone --redirects 1 --tee 1)
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1

ms() { # command... -> wall milliseconds (fails if the command fails)
  local t0 t1
  t0=$(date +%s%N)
  "$@" >"$T/out" 2>&1 || { cat "$T/out" >&2; return 1; }
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000))
}

cd "$T"
echo "# $(date -u +%F) $(getconf _NPROCESSORS_ONLN) cores; torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'); RUNS=$RUNS" >results
for n in 2 4; do
  # the smoke worker by name: with ddprun-fmnist beside ddprun, the default job trains instead
  printf "command: ['%s', __smoke-worker]\nnproc_per_node: %d\n" "$B/ddprun" "$n" >"job$n.yaml"
  for _ in $(seq "$RUNS"); do
    echo "ddprun $n $(ms "$B/ddprun" "job$n.yaml")" >>results
    echo "torchrun-0.1 $n $(ms "${TORCHRUN[@]}" --monitor_interval 0.1 --nproc_per_node "$n" "$SCRIPT")" >>results
    echo "torchrun-default $n $(ms "${TORCHRUN[@]}" --nproc_per_node "$n" "$SCRIPT")" >>results
  done
done
/usr/bin/python3 - results <<'PY'
import statistics, sys
from collections import defaultdict
lines = open(sys.argv[1]).read().splitlines()
print(lines[0])
d = defaultdict(list)
for l in lines[1:]:
    k, n, v = l.split()
    d[(k, int(n))].append(int(v))
print("\n| ranks | ddprun ms | torchrun ms (--monitor_interval 0.1) | ratio | torchrun ms (default 5 s monitor) | ratio |")
print("|---:|---:|---:|---:|---:|---:|")
for n in (2, 4):
    a = statistics.median(d[("ddprun", n)])
    b = statistics.median(d[("torchrun-0.1", n)])
    c = statistics.median(d[("torchrun-default", n)])
    print(f"| {n} | {a:.0f} (min {min(d[('ddprun', n)])}) | {b:.0f} | {b/a:.0f}x | {c:.0f} | {c/a:.0f}x |")
PY
