#!/usr/bin/env bash
# Group setup, two builds side by side: the wall time of a local job whose ranks form a group with
# every kind of shared memory (the all-reduce segment, registered-memory arenas with
# DDP_PG_DIRECT_BYTES, point-to-point rings with DDP_PG_P2P=1), run one 1 MiB all-reduce and exit.
# Runs alternate between the builds; medians and minima of RUNS per rank count.
# Usage: bench/setup_ab.sh OLD_BUILD_DIR NEW_BUILD_DIR   (each with ddprun and tests/pgtest)
set -euo pipefail
OLD=$(cd "$1" && pwd)
NEW=$(cd "$2" && pwd)
RUNS=${RUNS:-21}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cd "$T"
for n in 2 4 8; do
  for v in old new; do
    B=$OLD; [ $v = new ] && B=$NEW
    printf 'command: [%s, big, "1"]\nnproc_per_node: %d\nenv: {DDP_PG_DIRECT_BYTES: "4096", DDP_PG_P2P: "1"}\n' \
      "$B/tests/pgtest" "$n" >"job-$v-$n.yaml"
  done
  for _ in $(seq "$RUNS"); do
    for v in old new; do
      B=$OLD; [ $v = new ] && B=$NEW
      t0=$(date +%s%N)
      "$B/ddprun" "job-$v-$n.yaml" >out.txt 2>&1 || { cat out.txt >&2; exit 1; }
      t1=$(date +%s%N)
      echo "$n $v $(((t1 - t0) / 1000))" >>results
    done
  done
done
echo "# $(date -u +%F) $(getconf _NPROCESSORS_ONLN) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); RUNS=$RUNS"
echo "| ranks | old ms (min) | new ms (min) | new / old |"
echo "|---:|---:|---:|---:|"
python3 - results <<'PY'
import statistics, sys
d = {}
for line in open(sys.argv[1]):
    n, v, us = line.split()
    d.setdefault((int(n), v), []).append(int(us) / 1000)
for n in sorted({k[0] for k in d}):
    o, w = d[(n, 'old')], d[(n, 'new')]
    mo, mw = statistics.median(o), statistics.median(w)
    print(f"| {n} | {mo:.1f} ({min(o):.1f}) | {mw:.1f} ({min(w):.1f}) | {mw / mo:.3f} |")
PY
