#!/usr/bin/env bash
# `ddprun pipeline plan` side by side with PipeDream's released planner
# (optimizer/optimizer_graph_hierarchical.py of msr-fiddle/pipedream) on the released profiles:
# for each profile, machine count and bandwidth, both planners' configuration (workers per
# stage), whether every layer lands in the same stage, the predicted speedup over data
# parallelism and the time of the slowest stage, and each planner's run time. A "tie" is a
# different split with the same slowest-stage time: the released planner picks among equal
# splits in the iteration order of a Python set, which changes from run to run, so it runs RUNS
# times and "yes" means ddprun's stages are those of one of its runs.
# Needs /usr/bin/python3 with numpy and graphviz (Debian: python3-numpy python3-graphviz).
# Usage: bench/planner_compare.sh PIPEDREAM_CHECKOUT [BUILD_DIR]
#   PROFILES="vgg16 alexnet ..." MACHINES="4 8 16 4,4" BANDWIDTHS="1Gbit 10Gbit" RATIO=1|none
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record planner_compare "$@" # its output goes to bench/results/<machine>/planner_compare.md too
cd "$(dirname "$0")/.."
PD=$(cd "${1:?usage: bench/planner_compare.sh PIPEDREAM_CHECKOUT [BUILD_DIR]}" && pwd)
B=$(cd "${2:-build/release}" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PROFILES=${PROFILES:-"vgg16 alexnet resnet18 resnet50 squeezenet1_0 gnmt gnmt_large"}
MACHINES=${MACHINES:-"4 8 16 4,4"}
BANDWIDTHS=${BANDWIDTHS:-"1Gbit 10Gbit 100Gbit"}
RATIO=${RATIO:-1}
RUNS=${RUNS:-3} # the released planner's runs: its choice among equal splits varies run to run
bytes_of() { /usr/bin/python3 -c "import sys; print(float(sys.argv[1][:-4]) * 1.25e8)" "$1"; }
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); activation compression ratio: $RATIO"
echo
echo "| profile | machines | bandwidth | released planner (RUNS runs) | ddprun | same stages | speedup released | speedup ddprun | slowest stage, ms (released / ddprun) | time released / ddprun |"
echo "|---|---|---|---|---|---|---:|---:|---|---|"
for prof in $PROFILES; do
  f=$(ls "$PD"/profiler/*/profiles/"$prof"/graph.txt)
  for m in $MACHINES; do
    for bw in $BANDWIDTHS; do
      bps=$(bytes_of "$bw")
      bl=$(echo "$m" | tr ',' ' ' | awk -v b="$bps" '{for (i = 1; i <= NF; i++) printf "%s ", b}')
      ratio=() ; ours=(--activation-compression "$RATIO")
      [ "$RATIO" != none ] && ratio=(--activation_compression_ratio "$RATIO")
      rm -rf "$T"/py* && fail=
      t0=$(date +%s.%N)
      for run in $(seq "$RUNS"); do
        mkdir "$T/py$run"
        (cd "$PD/optimizer" && /usr/bin/python3 optimizer_graph_hierarchical.py -f "$f" \
          -n $(echo "$m" | tr ',' ' ') -b $bl "${ratio[@]}" -o "$T/py$run" >"$T/py$run.out" 2>&1) ||
          fail="$(tail -1 "$T/py$run.out")"
      done
      [ -z "$fail" ] || { echo "| $prof | $m | $bw | (failed: $fail) | | | | | | |"; continue; }
      t1=$(date +%s.%N)
      "$B/ddprun" pipeline plan "$f" --machines "$m" --bandwidth "$(echo "$m" | tr ',' '\n' | sed "s/.*/$bw/" | paste -sd,)" \
        "${ours[@]}" --output "$T/ours.txt" >"$T/ours.out"
      t2=$(date +%s.%N)
      /usr/bin/python3 - "$prof" "$m" "$bw" "$T" "$t0" "$t1" "$t2" "$RUNS" <<'PY'
import re, sys, glob
prof, m, bw, T, t0, t1, t2, RUNS = sys.argv[1:]
def stages(path):
    d = {}
    for l in open(path):
        if l.startswith("\t"): continue
        g = re.search(r" -- stage_id=(\d+)$", l.strip())
        if g: d[l.split(" -- ")[0]] = int(g.group(1))
    return d
def released(run):
    out = open(f"{T}/py{run}.out").read()
    # each level's stages, top level first; a stage's workers are the product of its
    # replication at every level
    blocks = re.split(r"=+\nLevel (\d+)\n=+", out)
    levels = {}
    for k in range(1, len(blocks), 2):
        levels[int(blocks[k])] = [(int(a), int(b), int(r)) for a, b, r in
                                  re.findall(r"^\((\d+), (\d+)\) \S+ (\d+)$", blocks[k + 1], re.M)]
    def workers(a):
        w = 1
        for l in sorted(levels):
            for (x, y, r) in levels[l]:
                if x <= a < y: w *= r; break
        return w
    conf = "-".join(str(workers(a)) for (a, b, r) in levels[min(levels)])
    speed = float(re.search(r"Throughput increase \(compared to \(.*\)-machine DP\): (\S+)", out).group(1))
    time = float(re.search(r"Time per stage in pipeline: (\S+)", out).group(1))
    return conf, stages(glob.glob(f"{T}/py{run}/gpus=*.txt")[0]), speed, time
runs = [released(r) for r in range(1, int(RUNS) + 1)]
ours = open(T + "/ours.out").read()
our_conf = re.search(r"^configuration: (\S+)", ours, re.M).group(1)
our_speed = float(re.search(r"speedup over data parallel: (\S+)x", ours).group(1))
our_time = float(re.search(r"pipeline (\S+) ms", ours).group(1)) / 1e3
ours_st = stages(T + "/ours.txt")
def same(r):
    return r[0] == our_conf and all(ours_st.get(k) == v for k, v in r[1].items())
confs = sorted({r[0] for r in runs})
py_speed, py_time = runs[0][2], runs[0][3]
rel_t = max(abs(r[3] - our_time) / r[3] for r in runs)
verdict = "yes" if any(same(r) for r in runs) else ("tie" if rel_t < 1e-6 else "**no**")
print(f"| {prof} | {m} | {bw} | {' or '.join(confs)} | {our_conf} | {verdict} | {py_speed:.4f} | {our_speed:.4f} | "
      f"{py_time*1e3:.4f} / {our_time*1e3:.4f} | {(float(t1)-float(t0))/int(RUNS):.2f} s / {float(t2)-float(t1):.3f} s |")
PY
    done
  done
done
