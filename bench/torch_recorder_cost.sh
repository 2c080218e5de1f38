#!/usr/bin/env bash
# The cost of ddprun's flight recorder for PyTorch ranks (cli/diag/torch_rec.py): 2 ranks of Debian's
# torch over Gloo on this machine (bench/torch_recorder_cost.py), the median time of a 4-float
# all_reduce, of a barrier and of a DDP step of a 64-64-10 MLP (batch 16), with the recorder
# (the default) and without it (DDP_FLIGHT_RECORDER=0), alternating, each first in turn; the
# table gives the medians of the runs and the median of the per-pair ratios.
# DEVICE=cuda: the same over NCCL, one rank per GPU (NPROC of them, default 1), each call timed to
# its end on the device.
# Usage: [DEVICE=cuda [NPROC=N]] bench/torch_recorder_cost.sh [BUILD_DIR] [PAIRS]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record torch_recorder_cost "$@" # its output goes to bench/results/<machine>/torch_recorder_cost.md too
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
PAIRS=${2:-7}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1
DEVICE=${DEVICE:-cpu}
NPROC=${NPROC:-$([ "$DEVICE" = cuda ] && echo 1 || echo 2)}
run() { # recorder 1|0: the rank 0 line's three numbers
  printf 'command: [/usr/bin/python3, %s/bench/torch_recorder_cost.py]\nnproc_per_node: %s\nenv: {DDP_FLIGHT_RECORDER: "%s", DDP_BENCH_DEVICE: %s}\nlogs: {dir: %s/logs}\n' \
    "$PWD" "$NPROC" "$1" "$DEVICE" "$T" >"$T/job.yaml"
  [ "$DEVICE" = cuda ] && echo "backend: nccl" >>"$T/job.yaml"
  "$B/ddprun" "$T/job.yaml" 2>/dev/null >"$T/out"
  sed -n 's/.*bench: all_reduce \([0-9.]*\) us, barrier \([0-9.]*\) us, ddp step \([0-9.]*\) us.*/\1 \2 \3/p' "$T/out"
  sed -n 's/.*bench: recorder alone \([0-9.]*\) us.*/\1/p' "$T/out" >>"$T/alone"
  sed -n 's/.*bench: in one process, all_reduce through the wrapper \([0-9.]*\) us, direct \([0-9.]*\) us.*/\1 \2/p' "$T/out" >>"$T/inproc"
  sed -n 's/.*bench: in one process, ddp step through the recorder \([0-9.]*\) us, direct \([0-9.]*\) us.*/\1 \2/p' "$T/out" >>"$T/inproc_step"
}
: >"$T/r"
: >"$T/alone"
: >"$T/inproc"
: >"$T/inproc_step"
for i in $(seq "$PAIRS"); do
  if [ $((i % 2)) -eq 1 ]; then on=$(run 1); off=$(run 0); else off=$(run 0); on=$(run 1); fi
  echo "$on $off" >>"$T/r"
done
echo "# $(date +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) cores; torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'); PAIRS=$PAIRS DEVICE=$DEVICE NPROC=$NPROC"
/usr/bin/python3 - "$T/r" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 6]
print("| call | recorder on, us | off, us | on - off, us | on / off (median of pairs) | pairs' range |")
print("|---|---:|---:|---:|---:|---:|")
for k, name in enumerate(("all_reduce, 4 floats", "barrier", "DDP step, 64-64-10 MLP")):
    on = statistics.median(r[k] for r in rows)
    off = statistics.median(r[k + 3] for r in rows)
    ratios = sorted(r[k] / r[k + 3] for r in rows)
    print(f"| {name} | {on:.1f} | {off:.1f} | {on - off:+.1f} | {statistics.median(ratios):.3f} | "
          f"{ratios[0]:.3f}-{ratios[-1]:.3f} |")
PY
echo
/usr/bin/python3 - "$T/inproc" "$T/inproc_step" <<'PY'
import statistics, sys
for f, what in ((sys.argv[1], "all_reduce of 4 floats through the wrapper"),
                (sys.argv[2], "DDP step through the recorder's forward")):
    rows = [list(map(float, l.split())) for l in open(f) if len(l.split()) == 2]
    if rows:
        w = statistics.median(r[0] for r in rows)
        d = statistics.median(r[1] for r in rows)
        print(f"\nin one process (recorder on), {what} {w:.1f} us, torch's directly {d:.1f} us: "
              f"{w - d:+.1f} us, x{w / d:.3f} (medians over the runs of alternating blocks)")
PY
echo "the recorder alone (an entry written and finished, as its wrapper does per call; median of the runs): $(sort -n "$T/alone" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') us"
