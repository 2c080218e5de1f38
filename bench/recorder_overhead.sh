#!/usr/bin/env bash
# The flight recorder's cost (issue 20): the three recorder calls per collective alone
# (bench/recorder_cost.c), then the step time of the Fashion-MNIST trainer under ddprun, 2 ranks,
# reducer with overlap, with the recorder on (the default: it writes the agent's progress page)
# and off (DDP_FLIGHT_RECORDER=0), on two models: the large MLP of reducer_bench.sh (a few 25 MiB
# buckets per step) and a small one with a bucket per tensor (many small collectives per step,
# the recorder's worst case relative to step time). On and off alternate within each
# repetition, in turn first; the table gives their medians and the median of the per-pair ratios.
# Usage: bench/recorder_overhead.sh [BUILD_DIR] [REPS]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record recorder_overhead "$@" # its output goes to bench/results/<machine>/recorder_overhead.md too
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
REPS=${2:-9}
STEPS=${STEPS:-60}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

echo "recorder calls per collective (enter, start, end), median of 9 x 1,000,000:"
"$B/bench/recorder_cost" | awk '{printf "  %-8s %6.1f ns\n", $2, $3}'

step() { # recorder(0|1) hidden batch extra... : prints the median step in ms
  local rec=$1 hidden=$2 batch=$3 a x
  shift 3
  a="$B/ddprun-fmnist, --hidden, '$hidden', --batch, '$batch', --max-steps, '$STEPS', --eval-every, '0', --bench, --bucket-view"
  for x in "$@"; do a="$a, '$x'"; done
  printf 'command: [%s]\nnproc_per_node: 2\nenv: {DDP_FLIGHT_RECORDER: "%s"}\nlogs: {dir: %s/logs}\n' \
    "$a" "$rec" "$T" >"$T/job.yaml"
  "$B/ddprun" "$T/job.yaml" 2>/dev/null | sed -n 's/.*bench: median step \([0-9.]*\) ms.*/\1/p' | head -n1
}

R="$T/r"
: >"$R"
for i in $(seq "$REPS"); do
  for model in "large 2048,2048,2048 64" "small 256,128 64 --bucket-mb 0 --first-bucket-mb 0"; do
    read -r name hidden batch extra <<<"$model"
    # shellcheck disable=SC2086
    if [ $((i % 2)) -eq 1 ]; then
      on=$(step 1 "$hidden" "$batch" $extra); off=$(step 0 "$hidden" "$batch" $extra)
    else
      off=$(step 0 "$hidden" "$batch" $extra); on=$(step 1 "$hidden" "$batch" $extra)
    fi
    echo "$name $on $off" >>"$R"
  done
done
/usr/bin/python3 - "$R" "$REPS" <<'PY'
import statistics, sys
from collections import defaultdict
d = defaultdict(list)
for l in open(sys.argv[1]):
    k, on, off = l.split()
    d[k].append((float(on), float(off)))
print(f"\ntrainer step, 2 ranks, reducer with overlap, median of {sys.argv[2]} pairs")
print("| model | recorder on ms | off ms | on / off (median of pairs) | pairs' range |")
print("|---|---|---|---|---|")
names = {"large": "784-2048-2048-2048-10, batch 64, 25 MiB buckets",
         "small": "784-256-128-10, batch 64, a bucket per tensor"}
for k in ("large", "small"):
    on = statistics.median(p[0] for p in d[k])
    off = statistics.median(p[1] for p in d[k])
    r = [p[0] / p[1] for p in d[k]]
    print(f"| {names[k]} | {on:.3f} | {off:.3f} | {statistics.median(r):.4f} | "
          f"{min(r):.3f} .. {max(r):.3f} |")
PY
