#!/usr/bin/env bash
# The reducer behind a straggler: a busy loop pinned to the last CPU and the 2 ranks bound to
# cores of their own (bind_to: core), so the rank on that CPU runs at about half speed. Each
# run is ddprun-fmnist --bench-paired without overlap (the Fashion-MNIST MLP of
# bench/reducer_bench.sh), with bucket view and without (copy mode); it prints the wait for the
# last rank's gradients and what the reducer added beyond that wait over the bare all-reduce
# (the tail that streaming the buckets shortens: see BENCHMARKS.md, "Streamed buckets"). Given
# a second build directory, the two alternate run by run, so both see the same minutes of the VM.
# Usage: bench/reducer_straggler.sh BUILD_DIR [OTHER_BUILD_DIR] [RUNS]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record reducer_straggler "$@" # its output goes to bench/results/<machine>/reducer_straggler.md too
cd "$(dirname "$0")/.."
BUILDS=("$(cd "${1:-build/release}" && pwd)")
[ -n "${2:-}" ] && BUILDS+=("$(cd "$2" && pwd)")
RUNS=${3:-3}
command -v taskset >/dev/null || { echo "reducer_straggler: needs taskset (util-linux)" >&2; exit 2; }
NCPU=$(nproc) # before OMP_NUM_THREADS=1, which GNU nproc honours
LAST=$((NCPU - 1))
[ "$LAST" -ge 1 ] || { echo "reducer_straggler: needs 2 CPUs" >&2; exit 2; }
T=$(mktemp -d)
HOG=
cleanup() { [ -n "$HOG" ] && kill "$HOG" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
taskset -c "$LAST" bash -c 'while :; do :; done' &
HOG=$!

run() { # build mode-args...
  local b=$1; shift
  local a="$b/ddprun-fmnist, --hidden, '2048,2048,2048', --batch, '64', --max-steps, '${STEPS:-100}', --eval-every, '0', --bench, --no-overlap, --bench-paired" x
  for x in "$@"; do a="$a, '$x'"; done
  printf 'command: [%s]\nnproc_per_node: 2\nlogs: {dir: %s/logs}\nbind_to: core\n' "$a" "$T" >"$T/job.yaml"
  "$b/ddprun" "$T/job.yaml" >"$T/out" 2>/dev/null
  local step wait beyond
  step=$(sed -n 's/.*bench: paired over.*: step \([0-9.]*\) ms.*/\1/p' "$T/out")
  wait=$(sed -n 's/.*gradients were ready \([0-9.]*\) ms after.*/\1/p' "$T/out")
  beyond=$(sed -n 's/.*beyond that wait [0-9.-]* ms = \([0-9.-]*\) x bare.*/\1/p' "$T/out")
  printf '| %s | %s | %s | %s | %s |\n' "$b" "${*:-(copy)}" "$step" "$wait" "$beyond"
}

echo "# $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p' | head -1), $NCPU CPUs; busy loop on CPU $LAST"
echo "| build | mode | step ms | last rank's wait ms | beyond it / bare |"
echo "|---|---|---:|---:|---:|"
for _ in $(seq "$RUNS"); do
  for mode in --bucket-view ""; do
    for b in "${BUILDS[@]}"; do
      # shellcheck disable=SC2086
      run "$b" $mode
    done
  done
done
