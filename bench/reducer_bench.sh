#!/usr/bin/env bash
# Per-step time of the Fashion-MNIST MLP trainer with 2 ranks on this machine: compute only
# (the same 2 processes training their shards at once, no reducer), the reducer with overlap
# forced on (DDP_REDUCER_OVERLAP=on), with it disabled, and by default (overlap where it pays:
# on a 2-core machine, none), with and without bucket view, and by default with each rank bound to
# cores of its own (bind_to: core); both modes in one process on alternate steps
# (--bench-view-copy); a bucket-size sweep; and PyTorch DDP (gloo, Debian's python3-torch)
# on a model of the same shapes and batch, one thread per rank, with its own compute-only run
# ($PY, default /usr/bin/python3, is the PyTorch used).
# Configurations alternate within each repetition; medians over the repetitions. The reducer's
# runs are paired (ddprun-fmnist --bench-paired): each step has beside it the same step without
# the reducer (after it on even steps, before it on odd ones, so neither of the pair always
# follows the cache-flushing all-reduce) and a bare all-reduce of all the gradients' bytes (one
# buffer in registered memory, as the buckets), so what the reducer adds is measured against
# the all-reduce it must do, in the same seconds of this drifting VM; and where it goes: the
# step's forward+backward and optimizer beside the compute-only step's, its finalize beside the
# bare all-reduce.
# Usage: bench/reducer_bench.sh [BUILD_DIR] [REPS]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record reducer_bench "$@" # its output goes to bench/results/<machine>/reducer_bench.md too
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
REPS=${2:-3}
HIDDEN=${HIDDEN:-2048,2048,2048}
BATCH=${BATCH:-64}
STEPS=${STEPS:-40}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

ours() { # label extra-args... : prints "label ms"
  local label=$1; shift
  local a="$B/ddprun-fmnist, --hidden, '$HIDDEN', --batch, '$BATCH', --max-steps, '$STEPS', --eval-every, '0', --bench" x
  for x in "$@"; do a="$a, '$x'"; done
  printf 'command: [%s]\nnproc_per_node: 2\nlogs: {dir: %s/logs}\nenv: {DDP_REDUCER_OVERLAP: "%s"}\nbind_to: %s\n' \
    "$a" "$T" "${OVERLAP:-auto}" "${BIND:-none}" >"$T/job.yaml"
  "$B/ddprun" "$T/job.yaml" >"$T/out" 2>/dev/null
  echo "$label $(sed -n 's/.*bench: median step \([0-9.]*\) ms.*/\1/p' "$T/out")"
  # --bench-paired: each step followed by the same step without the reducer and a bare
  # all-reduce of all the gradients; medians of the pairs' differences
  sed -n 's/.*bench: paired.*compute-only \([0-9.]*\) ms, bare.* \([0-9.]*\) ms; added by the reducer \([0-9.]*\) ms.*/\1 \2 \3/p' \
    "$T/out" | while read -r c b a; do
      echo "$label:compute $c"; echo "$label:bare $b"; echo "$label:added $a"
      echo "$label:ratio $(awk -v a="$a" -v b="$b" 'BEGIN { print a / b }')"
    done
  sed -n 's/.*gradients were ready \([0-9.]*\) ms after.*beyond that wait \([0-9.-]*\) ms = \([0-9.-]*\) x bare.*/\1 \3/p' \
    "$T/out" | while read -r w r; do echo "$label:lastwait $w"; echo "$label:ratio-beyond $r"; done
  # where the step's time goes, beside the compute-only step's (medians over the steps)
  sed -n "s/.*paired phases.*step forward+backward \([0-9.]*\) ms, finalize \([0-9.]*\) ms, optimizer \([0-9.]*\) ms; the compute-only step forward+backward \([0-9.]*\) ms, optimizer \([0-9.]*\) ms.*/\1 \2 \3 \4 \5/p" \
    "$T/out" | while read -r f w o cf co; do
      echo "$label:fb $f"; echo "$label:fin $w"; echo "$label:opt $o"; echo "$label:cofb $cf"; echo "$label:coopt $co"
    done
  # --bench-view-copy: both modes in one process, alternate steps
  sed -n 's/.*bench: view-copy over.*: step view \([0-9.]*\) copy \([0-9.]*\),.*/\1 \2/p' "$T/out" |
    while read -r v k; do echo "$label:view $v"; echo "$label:copy $k"; done
  sed -n 's/.*copy \/ view step, pair by pair: median \([0-9.]*\).*/\1/p' "$T/out" |
    while read -r r; do echo "$label:ratio $r"; done
}

torchrun_() { # label mode
  ms=$("${PY:-/usr/bin/python3}" bench/torch_ddp_step.py --hidden "$HIDDEN" --batch "$BATCH" --steps "$STEPS" \
    --mode "$2" | sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p')
  echo "$1 $ms"
}

R="$T/r"
: >"$R"
trap 'cp "$R" "${RESULTS_OUT:-/dev/null}" 2>/dev/null; rm -rf "$T"' EXIT
for _ in $(seq "$REPS"); do
  ours compute --no-ddp >>"$R"
  OVERLAP=on ours overlap --bucket-view --bench-paired >>"$R"
  ours no-overlap --bucket-view --no-overlap --bench-paired >>"$R"
  ours auto --bucket-view --bench-paired >>"$R"
  ours auto-copy --bench-paired >>"$R"
  BIND=core ours auto-bound --bucket-view --bench-paired >>"$R"
  ours view-copy --bench-view-copy >>"$R"
  torchrun_ torch-compute compute >>"$R"
  torchrun_ torch-ddp ddp >>"$R"
  if [ -z "${NO_SWEEP:-}" ]; then
    for mb in 0 1 5 10 25 50 100; do ours "sweep-$mb" --bucket-view --bucket-mb "$mb" --first-bucket-mb "$mb" >>"$R"; done
  fi
done
/usr/bin/python3 - "$R" "$HIDDEN" "$BATCH" <<'PY'
import statistics, sys
from collections import defaultdict
d = defaultdict(list)
for l in open(sys.argv[1]):
    k, v = l.split()
    d[k].append(float(v))
m = {k: statistics.median(v) for k, v in d.items()}
print(f"MLP 784-{sys.argv[2].replace(',', '-')}-10, global batch {sys.argv[3]}, 2 ranks, median of {len(d['compute'])} runs")
print(f"| {'configuration':34} | step ms | / compute-only |")
print(f"|{'-'*36}|---------|----------------|")
for k, name, base in [("compute", "ddprun: compute only", "compute"),
                      ("overlap", "ddprun: reducer, overlap on (view)", "compute"),
                      ("no-overlap", "ddprun: reducer, no overlap (view)", "compute"),
                      ("auto", "ddprun: reducer, default (view)", "compute"),
                      ("auto-copy", "ddprun: reducer, default (copy)", "compute"),
                      ("auto-bound", "ddprun: default (view), bound", "compute"),
                      ("torch-compute", "PyTorch: compute only", "torch-compute"),
                      ("torch-ddp", "PyTorch DDP (gloo)", "torch-compute")]:
    if k in m:
        print(f"| {name:34} | {m[k]:7.1f} | {m[k] / m[base]:14.2f} |")
paired = [k for k in ("overlap", "no-overlap", "auto", "auto-copy", "auto-bound") if k + ":added" in m]
if paired:
    print()
    print("Paired (--bench-paired): beside each step, the same step without the reducer (after it, or")
    print("before it on odd steps) and a bare all-reduce of all the gradients (one registered buffer, alone);")
    print("medians over the steps, then over the runs")
    print("(added / bare: each run's ratio, then their median and range). Target: added <= 1.1 x bare.")
    print("Last rank: how long after rank 0's the last rank's gradients were ready (median over the steps;")
    print("no all-reduce can end before that); beyond it: added less that wait, pair by pair, / bare.")
    print("| configuration | step ms | compute-only ms | added ms | bare all-reduce ms | added / bare | range | last rank ms | beyond it / bare | range |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    names = {"overlap": "reducer, overlap on (view)", "no-overlap": "reducer, no overlap (view)",
             "auto": "reducer, default (view)", "auto-copy": "reducer, default (copy)",
             "auto-bound": "reducer, default (view), --bind-to core"}
    for k in paired:
        a, b, rs = m[k + ":added"], m[k + ":bare"], d[k + ":ratio"]
        bs = d.get(k + ":ratio-beyond", [])
        beyond = (f"{m[k + ':lastwait']:.1f} | {m[k + ':ratio-beyond']:.2f} | {min(bs):.2f}-{max(bs):.2f}"
                  if bs else "- | - | -")
        print(f"| {names[k]} | {m[k]:.1f} | {m[k + ':compute']:.1f} | {a:.1f} | {b:.1f} "
              f"| {m[k + ':ratio']:.2f} | {min(rs):.2f}-{max(rs):.2f} | {beyond} |")
    ph = [k for k in paired if k + ":fb" in m]
    if ph:
        print()
        print("Where the added time goes (the step's phases beside the compute-only step's, medians over")
        print("the steps, then over the runs): forward+backward and the optimizer, the reducer's step less")
        print("the compute-only step's; finalize (the all-reduces left for it) less the bare all-reduce.")
        print("| configuration | forward+backward ms | + | finalize ms | bare ms | finalize - bare | optimizer ms | + |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for k in ph:
            g = lambda x: m[k + ":" + x]
            print(f"| {names[k]} | {g('fb'):.1f} | {g('fb') - g('cofb'):+.2f} | {g('fin'):.1f} | {g('bare'):.1f} "
                  f"| {g('fin') - g('bare'):+.2f} | {g('opt'):.1f} | {g('opt') - g('coopt'):+.2f} |")
if "view-copy:ratio" in m:
    rs = d["view-copy:ratio"]
    print()
    print("Copy mode against bucket view in one process (--bench-view-copy: two reducers on the same")
    print("parameters, used on alternate steps; each copy step over the view step before it, median")
    print("over the pairs, then over the runs). Target: copy within 5% of view.")
    print("| view step ms | copy step ms | copy / view | range |")
    print("|---:|---:|---:|---:|")
    print(f"| {m['view-copy:view']:.1f} | {m['view-copy:copy']:.1f} | {m['view-copy:ratio']:.3f} "
          f"| {min(rs):.3f}-{max(rs):.3f} |")
sw = [k for k in m if k.startswith("sweep-")]
if sw:
    print()
    print("| bucket cap (MiB) | step ms | / compute-only |")
    print("|------------------|---------|----------------|")
    for k in sorted(sw, key=lambda k: float(k[6:])):
        cap = "per tensor" if k == "sweep-0" else k[6:]
        print(f"| {cap:16} | {m[k]:7.1f} | {m[k] / m['compute']:14.2f} |")
PY
