#!/usr/bin/env bash
# The single-copy all-reduce (DDP_PG_DIRECT_BYTES) against the shared-memory slots, 2 ranks on
# one node, 256 KiB to 64 MiB: slots; single-copy through cross-memory attach (malloc'd
# buffers); single-copy through registered memory (ddp_pg_mem_alloc), by default in chunks
# claimed by whichever rank is free and summed into every rank's buffer (worker/shm_claim.c),
# and in fixed shards and blocks (DDP_PG_DIRECT_CLAIM=0, as the other kinds). The variants run
# interleaved REPS times (default 5; this kind of machine drifts between runs) and the table
# shows each one's median busbw. Then the memory system's bound: one memcpy alone, and two at
# once (each rank of a 2-rank all-reduce must read its buffer and write it once, at the same
# time as the other: busbw <= half of what two concurrent memcpys move in all), and a memcpy
# out of a buffer another core has just written (allreduce_bench xcore): each rank reads its
# peer's half that way twice (its shard to reduce, then the peer's reduced shard), so busbw is
# also bound by that rate.
# Usage: [REPS=N] [NPROC=ranks] bench/shm_direct_compare.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for rep in $(seq "${REPS:-5}"); do
  for v in "slots ddp-shm 0 1" "cma ddp-shm 262144 1" "registered ddp-shm-reg 262144 1" "fixed ddp-shm-reg 262144 0"; do
    set -- $v
    printf 'command: [%s, %s]\nnproc_per_node: %d\nlogs: {dir: %s/logs}\nenv: {DDP_PG_DIRECT_BYTES: "%s", DDP_PG_DIRECT_CLAIM: "%s"}\n' \
      "$B/bench/allreduce_bench" "$2" "${NPROC:-2}" "$T" "$3" "$4" >"$T/job.yaml"
    "$B/ddprun" "$T/job.yaml" 2>/dev/null | awk -v n="$1" '/RESULT/ && $5 >= 262144 {print n, $5, $8}' >>"$T/r"
  done
done
"$B/bench/allreduce_bench" memcpy | awk '{print "memcpy1", $4, $6}' >>"$T/r"
"$B/bench/allreduce_bench" memcpy >"$T/m2" &
"$B/bench/allreduce_bench" memcpy | awk '{print "memcpy2", $4, $6}' >>"$T/r"
wait
awk '{print "memcpy2", $4, $6}' "$T/m2" >>"$T/r"
"$B/bench/allreduce_bench" xcore | awk '{print "xcore", $4, $6}' >>"$T/r"
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(getconf _NPROCESSORS_ONLN) cores; REPS=${REPS:-5}"
/usr/bin/python3 - "$T/r" <<'PY'
import sys
from collections import defaultdict
from statistics import median
d = defaultdict(list)
for l in open(sys.argv[1]):
    n, b, bw = l.split()
    d[(n, int(b))].append(float(bw))
print("\n| size | slots | single-copy, CMA | single-copy, registered | registered, fixed shards | CMA / slots | registered / slots | registered / fixed shards | memcpy alone | two memcpys at once, in all | bound: that / 2 | copy of another core's writes |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for b in sorted({k[1] for k in d if k[0] == "slots"}):
    s, c, r, f = (median(d[(n, b)]) for n in ("slots", "cma", "registered", "fixed"))
    m1 = median(d[("memcpy1", b)])
    m2 = d[("memcpy2", b)]
    print(f"| {b >> 20 and f'{b >> 20} MiB' or f'{b >> 10} KiB'} | {s:.2f} | {c:.2f} | {r:.2f} | {f:.2f} | {c / s:.2f}x | {r / s:.2f}x | {r / f:.2f}x "
          f"| {m1:.1f} | {sum(m2):.1f} | {sum(m2) / 2:.1f} | {median(d[('xcore', b)]):.1f} |")
PY
