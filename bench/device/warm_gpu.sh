#!/usr/bin/env bash
# Warm ranks on a lent GPU machine (issue 62), in one device call: after bench/device/bundle.sh
# packed .dev/ here, run on the machine from the repository root as
#   . .dev/setup.sh && bench/device/warm_gpu.sh
# An unmodified PyTorch program (bench/torch_gpu_restart.py: NCCL on cuda:LOCAL_RANK, a matmul
# and a 4 MiB all-reduce every 20 ms) fails RESTARTS times (rank 0 exits 1 after SECS seconds
# of training); each time ddprun restarts it, with warm: off, then warm: on, then torchrun
# --max-restarts. Per restart: the rank's failure to the next attempt's first all-reduce done
# (its own clock, "FIRST"/"FAIL" lines), and ddprun's recovery event (its phases, how many ranks
# started warm). First it says whether `import torch` maps libcuda there (a warm interpreter
# where it does would start cold) and what importing torch costs. Tables to stdout and to
# $OUT/warm_gpu.txt where the device tool gave one.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
if [ -z "${B:-}" ] || [ ! -x "$B/ddprun" ]; then
  echo "warm_gpu.sh: source .dev/setup.sh first (sets B)" >&2
  exit 2
fi
R=${RESTARTS:-3}
S=${SECS:-8}
NP=${NPROC:-1}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
OUTF=${OUT:+$OUT/warm_gpu.txt}
say() { echo "$*"; [ -n "$OUTF" ] && echo "$*" >>"$OUTF"; }
PY=$(command -v python3)
WORKER=$PWD/bench/torch_gpu_restart.py

say "## warm ranks on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1), $(nproc) CPUs, $(date -u +%F)"
say "torch $("$PY" -c 'import torch; print(torch.__version__)'); after 'import torch':" \
  "$("$PY" -c 'import torch; m = open("/proc/self/maps").read(); print("libcuda mapped" if "libcuda" in m else "libcuda not mapped", "| cuda initialized:", torch.cuda.is_initialized())')"
for k in 1 2 3; do
  say "import torch, run $k: $("$PY" -X importtime -c 'import torch' 2>&1 | tail -n1 | awk -F'|' '{printf "%.2f s", $2 / 1e6}')"
done

# gaps FILE: the seconds from each FAIL to the next FIRST, one line each
gaps() {
  awk 'match($0, / t=[0-9.]+/) { t = substr($0, RSTART + 3, RLENGTH - 3) }
       /FAIL restart=/ { f = t }
       /FIRST restart=/ && f { printf "%.3f\n", t - f; f = 0 }' "$1"
}

run_ddprun() { # mode [restarts] [warm key]
  local d=$W/$1 r=${2:-$R}
  mkdir -p "$d"
  cat >"$d/job.yaml" <<YAML
command: [$PY, $WORKER, "$r", "$S"]
nproc_per_node: $NP
elastic: {max_restarts: $r}
logs: {dir: $d/logs}
warm: ${3:-$1}
env: {PYTHONPATH: "$W"}
YAML
  (cd "$d" && timeout 300 "$B/ddprun" job.yaml >out.txt 2>&1)
  echo "ddprun rc=$? ($1)"
  grep -i "warm\|cuda" "$d/out.txt" | grep -v "^\[" | head -5
  gaps "$d/out.txt" >"$d/gaps"
  grep '"event": "recovery"' "$d"/logs/*/events.jsonl |
    "$PY" -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print(" ".join(str(r.get(k)) for k in ("stopped_ms", "formed_ms", "started_ms",
          "group_formed_ms", "first_collective_ms", "warm_ranks")))' >"$d/phases"
}

run_torchrun() {
  local d=$W/torchrun
  mkdir -p "$d"
  (cd "$d" && timeout 300 "$PY" -m torch.distributed.run --standalone --redirects 1 --tee 1 --nproc_per_node "$NP" \
    --max_restarts "$R" "$WORKER" "$R" "$S" >out.txt 2>&1)
  echo "torchrun rc=$?"
  tail -n3 "$d/out.txt"
  gaps "$d/out.txt" >"$d/gaps"
  grep -q "cuda_before=1" "$d/out.txt" && echo "torchrun: libcuda mapped before the first line"
}

run_ddprun off
run_ddprun on
run_torchrun
# a module of warm.imports that initialises CUDA: said once, the ranks start cold
printf 'import torch\ntorch.cuda.init()\n' >"$W/ddp_cudainit.py"
run_ddprun cudainit 1 "{imports: [torch, ddp_cudainit]}"
say "a warm.imports module calling torch.cuda.init(): warm ranks per restart: $(awk '{print $6}' "$W/cudainit/phases" | tr '\n' ' ')"
say ""
say "| restart | ddprun cold s | ddprun warm s | torchrun s | cold / warm | torchrun / warm | warm: stopped, formed, started, groups formed, first all-reduce ms (warm ranks) |"
say "|---|---|---|---|---|---|---|"
for i in $(seq "$R"); do
  c=$(sed -n "${i}p" "$W/off/gaps") w=$(sed -n "${i}p" "$W/on/gaps") t=$(sed -n "${i}p" "$W/torchrun/gaps")
  say "| $i | $c | $w | $t | $(awk -v a="$c" -v b="$w" 'BEGIN { if (b > 0) printf "%.1fx", a / b }') |" \
    "$(awk -v a="$t" -v b="$w" 'BEGIN { if (b > 0) printf "%.1fx", a / b }') |" \
    "$(sed -n "${i}p" "$W/on/phases" | awk '{printf "%s, %s, %s, %s, %s (%s)", $1, $2, $3, $4, $5, $6}') |"
done
say ""
say "cold phases (ms): $(tr '\n' ';' <"$W/off/phases")"
grep -h "cuda_before=1" "$W"/on/out.txt "$W"/off/out.txt | head -n2
true
