#!/usr/bin/env bash
# The default choice between single-copy and the slots (DDP_PG_DIRECT_BYTES unset: trials on
# the program's own all-reduces, worker/shm_auto.c) against the slots alone (=0), on the
# reducer's buckets: the Fashion-MNIST MLP trainer with gradient-as-bucket-view (its buckets
# are registered memory), 2 ranks, --bench-paired (each step beside a compute-only step and a
# bare all-reduce of all the gradients' bytes), at bucket caps of 5 and 25 MB. The two run
# alternately within each repetition; medians over the repetitions, and what each trial chose
# per size class (rank 0's log). The bare all-reduce is malloc'd memory: the slots either way.
# Usage: bench/direct_auto.sh [BUILD_DIR] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
REPS=${2:-5}
HIDDEN=${HIDDEN:-2048,2048,2048}
STEPS=${STEPS:-100}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
R="$T/r"
: >"$R"

run() { # cap direct-bytes
  printf 'command: [%s/ddprun-fmnist, --hidden, "%s", --batch, "64", --max-steps, "%s", --eval-every, "0", --bench-paired, --bucket-view, --bucket-mb, "%s"]\nnproc_per_node: 2\nenv: {DDP_PG_DIRECT_BYTES: "%s", OMP_NUM_THREADS: "1", OPENBLAS_NUM_THREADS: "1", DDP_LOG_LEVEL: debug, DDP_LOG_SUBSYS: pg}\n' \
    "$B" "$HIDDEN" "$STEPS" "$1" "$2" >"$T/job.yaml"
  "$B/ddprun" "$T/job.yaml" >"$T/out" 2>&1
  local label="$1-${2:-auto}"
  sed -n 's/.*bench: paired over.*: step \([0-9.]*\) ms, compute-only \([0-9.]*\) ms, bare[^0-9]*[0-9]* bytes \([0-9.]*\) ms; added by the reducer \([0-9.]*\) ms.*/\1 \2 \3 \4/p' \
    "$T/out" | while read -r s c b a; do
      echo "$label:step $s"; echo "$label:compute $c"; echo "$label:bare $b"; echo "$label:added $a"
    done
  sed -n 's/.*registered memory from \([0-9 to]*\) MiB \(o[nf]*\) (trial [0-9]*: its time per byte over the slots. \([a-z, ]*[0-9.]*\),.*/\1 MiB \2 \3/p' \
    "$T/out" | while read -r line; do echo "$label:trial ${line// /_}"; done
}

for _ in $(seq "$REPS"); do
  for cap in 5 25; do
    run "$cap" 0 >>"$R"
    run "$cap" "" >>"$R"
  done
done
/usr/bin/python3 - "$R" "$HIDDEN" "$REPS" <<'PY'
import statistics, sys
from collections import defaultdict
d, trials = defaultdict(list), defaultdict(list)
for l in open(sys.argv[1]):
    k, v = l.split()
    if k.endswith(":trial"):
        trials[k[:-6]].append(v.replace("_", " "))
    else:
        d[k].append(float(v))
m = {k: statistics.median(v) for k, v in d.items()}
print(f"MLP 784-{sys.argv[2].replace(',', '-')}-10, global batch 64, bucket view, 2 ranks, "
      f"median of {sys.argv[3]} runs each (alternating)")
print("| bucket cap | all-reduce | step ms | compute-only ms | added ms | bare ms | added / bare |")
print("|---|---|---:|---:|---:|---:|---:|")
for cap in ("5", "25"):
    for mode, name in (("0", "slots only (=0)"), ("auto", "default (trials)")):
        k = f"{cap}-{mode}"
        if k + ":step" not in m:
            continue
        print(f"| {cap} MB | {name} | {m[k + ':step']:.1f} | {m[k + ':compute']:.1f} | "
              f"{m[k + ':added']:.1f} | {m[k + ':bare']:.1f} | {m[k + ':added'] / m[k + ':bare']:.2f} |")
print()
print("Trials (rank 0's log: size class, choice, single-copy's time per byte over the slots'):")
for cap in ("5", "25"):
    seen = defaultdict(list)
    for t in trials.get(f"{cap}-auto", []):
        cls, rest = t.split(" MiB ")
        seen[cls].append(rest)
    for cls, v in seen.items():
        print(f"- cap {cap} MB, {cls} MiB: " + "; ".join(v))
PY
