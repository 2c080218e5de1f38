#!/usr/bin/env bash
# The reducer on a GPU (needs a CUDA device): per-step time of ddprun-fmnist-cuda at world size 1
# with the reducer (an NCCL group of one, buckets on the device, overlap) against compute only
# (--no-ddp, no process group), for a compute-heavy configuration (wide layers, large batch) and
# a communication-heavy one (the same parameters, a small batch, per-tensor buckets), plus the
# host time each bucket launch costs (the reducer's own statistics). Each step ends with a
# stream synchronisation, so step times include the device work. Configurations alternate
# within each repetition; medians over the repetitions.
# Beside them, what a user would pick instead: PyTorch DDP (NCCL, 25 MiB buckets, gradient as
# bucket view) on the same MLP, batch and optimizer (bench/torch_gpu_mlp.py), and its compute
# only, when $PY (default python3) has PyTorch with CUDA.
# Usage: [PY=python3] bench/gpu_reducer.sh [BUILD_DIR] [REPS]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record gpu_reducer "$@" # its output goes to bench/results/<machine>/gpu_reducer.md too
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
REPS=${2:-5}
STEPS=${STEPS:-300}
[ -x "$B/ddprun-fmnist-cuda" ] || { echo "no $B/ddprun-fmnist-cuda (built when nvcc is found)" >&2; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

run() { # label hidden batch extra-args... : prints "label ms us-per-launch buckets"
  local label=$1 hidden=$2 batch=$3 a x out
  shift 3
  a="$B/ddprun-fmnist-cuda, --hidden, '$hidden', --batch, '$batch', --max-steps, '$STEPS', --eval-every, '0', --bench"
  for x in "$@"; do a="$a, '$x'"; done
  printf 'command: [%s]\nnproc_per_node: 1\nbackend: nccl\nlogs: {dir: %s/logs}\n' "$a" "$T" >"$T/job.yaml"
  out=$("$B/ddprun" "$T/job.yaml" 2>&1)
  echo "$label $(sed -n 's/.*bench: median step \([0-9.]*\) ms.*/\1/p' <<<"$out") \
$(sed -n 's/.* \([0-9.]*\) us host time per launch.*/\1/p' <<<"$out") \
$(sed -n 's/.*bench: \([0-9]*\) buckets.*/\1/p' <<<"$out")"
}

PY=${PY:-python3}
TORCH=0
"$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null && TORCH=1
torch_run() { # label hidden batch ddp|compute : prints "label ms"
  printf 'command: [%s, %s, "%s", "%s", "%s", %s]\nnproc_per_node: 1\nlogs: {dir: %s/logs}\n' \
    "$PY" "$PWD/bench/torch_gpu_mlp.py" "$2" "$3" "$STEPS" "$4" "$T" >"$T/tjob.yaml"
  echo "$1 $("$B/ddprun" "$T/tjob.yaml" 2>&1 | sed -n 's/.*bench: median step \([0-9.]*\) ms.*/\1/p')"
}

R="$T/r"
: >"$R"
for _ in $(seq "$REPS"); do
  if [ "$TORCH" = 1 ]; then
    torch_run compute-heavy/torch-compute 4096,4096,4096 4096 compute >>"$R"
    torch_run compute-heavy/torch-ddp 4096,4096,4096 4096 ddp >>"$R"
    torch_run comm-heavy/torch-compute 4096,4096,4096 32 compute >>"$R"
    torch_run comm-heavy/torch-ddp 4096,4096,4096 32 ddp >>"$R"
  fi
  run compute-heavy/compute 4096,4096,4096 4096 --no-ddp >>"$R"
  run compute-heavy/reducer 4096,4096,4096 4096 --bucket-view >>"$R"
  run comm-heavy/compute 4096,4096,4096 32 --no-ddp >>"$R"
  run comm-heavy/reducer 4096,4096,4096 32 --bucket-view --bucket-mb 0 >>"$R"
  run comm-heavy/reducer-25MiB 4096,4096,4096 32 --bucket-view >>"$R"
done
cp "$R" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/device: /' || true
/usr/bin/python3 - "$R" <<'PY'
import statistics, sys
from collections import defaultdict
ms, us, nb = defaultdict(list), defaultdict(list), {}
for l in open(sys.argv[1]):
    f = l.split()
    ms[f[0]].append(float(f[1]))
    if len(f) > 3:
        us[f[0]].append(float(f[2])); nb[f[0]] = f[3]
med = {k: statistics.median(v) for k, v in ms.items()}
print("MLP 784-4096-4096-4096-10 (36.8 M parameters), world size 1, median of", len(ms["compute-heavy/compute"]), "runs")
print(f"| {'configuration':37} | step ms | overhead | buckets | host us / bucket launch |")
print(f"|{'-'*39}|---------|----------|---------|-------------------------|")
for k, name in [("compute-heavy/compute", "batch 4096: compute only"),
                ("compute-heavy/reducer", "batch 4096: reducer (25 MiB buckets)"),
                ("comm-heavy/compute", "batch 32: compute only"),
                ("comm-heavy/reducer", "batch 32: reducer, per-tensor buckets"),
                ("comm-heavy/reducer-25MiB", "batch 32: reducer, 25 MiB buckets"),
                ("compute-heavy/torch-compute", "batch 4096: PyTorch compute only"),
                ("compute-heavy/torch-ddp", "batch 4096: PyTorch DDP (25 MiB)"),
                ("comm-heavy/torch-compute", "batch 32: PyTorch compute only"),
                ("comm-heavy/torch-ddp", "batch 32: PyTorch DDP (25 MiB)")]:
    if k not in med:
        continue
    torch = "torch" in k
    base = med[k.split("/")[0] + ("/torch-compute" if torch else "/compute")]
    ov = f"{(med[k] / base - 1) * 100:+7.1f}%" if "compute" not in k.split("/")[1] else "       -"
    u = f"{statistics.median(us[k]):23.2f}" if us.get(k) else " " * 23
    print(f"| {name:37} | {med[k]:7.2f} | {ov} | {nb.get(k, '-'):>7} | {u} |")
PY
