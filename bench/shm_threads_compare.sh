#!/usr/bin/env bash
# The shared-memory all-reduce of one node on 1, 2, 4 and auto threads per rank
# (DDP_PG_SHM_THREADS; worker/team.c), side by side with Gloo (Debian's python3-torch) and a
# one-thread memcpy, in one run: float32 sum in place, 256 KiB to 64 MiB (from 1 MiB the
# slots share each step out), busbw medians over REPS rounds (default 3) that run every
# configuration in turn; ratios: median (min-max) of the rounds' ratios. CONFIGS: the
# DDP_PG_SHM_THREADS values to run (default "1 2 4 auto"; the first is the baseline, the last is
# compared with Gloo), each optionally /SLOT_BYTES (DDP_PG_SHM_SLOT_BYTES), e.g. 4/4194304.
# Usage: [REPS=N] [NPROC=2] [CONFIGS="..."] bench/shm_threads_compare.sh [BUILD_DIR]
# (needs python3-torch)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. bench/lib.sh
bench_dirs "$@"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
REPS=${REPS:-3}
NPROC=${NPROC:-2}
read -r -a CONFIGS <<<"${CONFIGS:-1 2 4 auto}"
R="$T/results"
echo "# $(date -u +%F) $(lscpu | sed -n "s/^Model name: *//p"), $(getconf _NPROCESSORS_ONLN) cores; torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'); REPS=$REPS NPROC=$NPROC" >"$R"
for rep in $(seq "$REPS"); do
  {
    "$B/bench/allreduce_bench" memcpy
    for cf in "${CONFIGS[@]}"; do
      t=${cf%%/*} slot=${cf#*/}
      [ "$slot" != "$cf" ] || slot=1048576
      printf 'command: [%s, ddp-shm]\nnproc_per_node: %d\nlogs: {dir: %s/logs}\nenv: {DDP_PG_SHM_THREADS: "%s", DDP_PG_SHM_SLOT_BYTES: "%s"}\n' \
        "$B/bench/allreduce_bench" "$NPROC" "$T" "$t" "$slot" >"$T/job.yaml"
      "$B/ddprun" "$T/job.yaml" 2>/dev/null | sed -n 's/^\[localhost:0\] //p' | sed "s|^RESULT ddp-shm |RESULT t$cf |"
    done
    /usr/bin/python3 bench/gloo_allreduce.py "$NPROC" "$(free_port)"
  } | sed -n "s/^RESULT /RESULT $rep /p" >>"$R"
done
cp "$R" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
/usr/bin/python3 - "$R" "$NPROC" "${CONFIGS[@]}" <<'PY'
import sys
from collections import defaultdict
from statistics import median
lines = open(sys.argv[1]).read().splitlines()
nproc, configs = int(sys.argv[2]), ["t" + c for c in sys.argv[3:]]
print(lines[0])
runs = defaultdict(lambda: defaultdict(dict))  # bytes -> impl -> rep -> busbw
for l in lines[1:]:
    _, rep, impl, n, b, us, alg, bus, wrong = l.split()
    if int(wrong):
        print("WRONG RESULTS:", l)
    if impl == "memcpy" or int(n) == nproc:
        runs[int(b)][impl][rep] = float(bus)
def fmt(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
def med(r, k):
    return f"{median(r[k].values()):.2f}" if r.get(k) else "-"
def ratio(r, a, k):
    rs = [r[a][p] / r[k][p] for p in r.get(a, {}) if p in r.get(k, {}) and r[k][p]]
    return f"{median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})" if rs else "-"
def name(c):
    t, _, slot = c[1:].partition("/")
    return t + (" thread" if t == "1" else " threads") + (f", {int(slot) >> 10} KiB slots" if slot else "")
names = [name(c) for c in configs]
print(f"\n{nproc} ranks on one node, busbw GB/s (medians); ratios: median (min-max) of the rounds'.\n")
print("| size | " + " | ".join(names) + " | Gloo | memcpy | " +
      " | ".join(f"{n} / {names[0]}" for n in names[1:]) + f" | {names[-1]} / Gloo | {names[-1]} / memcpy |")
print("|---:|" + "---:|" * (len(configs) + 2 + len(configs) - 1 + 2))
for b in sorted(runs):
    if b < 256 << 10:
        continue
    r = runs[b]
    print(f"| {fmt(b)} | " + " | ".join(med(r, c) for c in configs) + f" | {med(r, 'gloo')} | {med(r, 'memcpy')} | " +
          " | ".join(ratio(r, c, configs[0]) for c in configs[1:]) +
          f" | {ratio(r, configs[-1], 'gloo')} | {ratio(r, configs[-1], 'memcpy')} |")
PY
