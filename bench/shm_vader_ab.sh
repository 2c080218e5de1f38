#!/usr/bin/env bash
# ddprun's shared-memory all-reduce against Open MPI's vader, 2 ranks on one node, unbound and
# with each rank bound to a core (ddprun --bind-to core, mpirun --bind-to core), in rounds of
# four runs seconds apart: this VM has spells of several seconds in which every implementation
# runs at a fifth of its speed, and allreduce_compare.sh's rounds (a minute each, Gloo and TCP
# between) let one spell fall on one side of a ratio. Medians over the rounds, and each
# ratio's median (min-max) over the rounds' ratios.
# Usage: [REPS=N] bench/shm_vader_ab.sh [BUILD_DIR]   (needs openmpi-bin, libopenmpi-dev)
set -euo pipefail
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
REPS=${REPS:-10}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mpicc -O2 -o "$T/mpi_allreduce" bench/mpi_allreduce.c
R="$T/results"
echo "# $(date -u +%F) $(lscpu | sed -n "s/^Model name: *//p"), $(getconf _NPROCESSORS_ONLN) cores; $(mpirun --version | head -n1); REPS=$REPS" >"$R"
for rep in $(seq "$REPS"); do
  for bind in none core; do
    "$B/ddprun" --nproc 2 --bind-to "$bind" --no-python "$B/bench/allreduce_bench" "ddp-$bind" 2>/dev/null |
      sed -n "s/^\[localhost:0\] RESULT /RESULT $rep /p" >>"$R"
    mpirun --allow-run-as-root --bind-to "$bind" --mca btl self,vader -np 2 "$T/mpi_allreduce" "mpi-$bind" |
      sed -n "s/^RESULT /RESULT $rep /p" >>"$R"
  done
done
/usr/bin/python3 - "$R" <<'PY'
import sys
from collections import defaultdict
from statistics import median
lines = open(sys.argv[1]).read().splitlines()
print(lines[0])
runs = defaultdict(lambda: defaultdict(dict))  # bytes -> impl -> rep -> busbw
for l in lines[1:]:
    _, rep, impl, n, b, us, alg, bus, wrong = l.split()
    if int(wrong):
        sys.exit(f"{impl} got a wrong sum at {b} bytes")
    runs[int(b)][impl][rep] = float(bus)
def ratio(r, a, k):
    rs = [r[a][p] / r[k][p] for p in r[a] if p in r[k] and r[k][p]]
    return f"{median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})" if rs else "-"
print("\n2 ranks on one node, busbw GB/s (medians over the rounds)\n")
print("| size | ddprun | vader | ddprun / vader | ddprun bound | vader bound | bound: ddprun / vader |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for b in sorted(runs):
    r = runs[b]
    m = {k: median(v.values()) for k, v in r.items()}
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"| {size} | {m['ddp-none']:.2f} | {m['mpi-none']:.2f} | {ratio(r, 'ddp-none', 'mpi-none')} "
          f"| {m['ddp-core']:.2f} | {m['mpi-core']:.2f} | {ratio(r, 'ddp-core', 'mpi-core')} |")
PY
