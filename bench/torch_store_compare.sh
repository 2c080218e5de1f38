#!/usr/bin/env bash
# PyTorch's store, served by ddprun vs PyTorch itself (Debian's python3-torch, /usr/bin/python3):
#  1. init_process_group("gloo") wall time on 2, 4 and 8 local ranks: under ddprun with the job's
#     store as TCPStore (the default: each rank reaches it through its node's agent), under ddprun
#     with rank 0's own TCPStore (rendezvous.torch_store: rank0), and under torchrun --standalone;
#     with the connections the launcher's store accepted in the default's runs;
#  2. torch's own TCPStore client from 1, 16 and 64 processes against `ddprun store
#     --torch-listen` and against a real TCPStore (bench/tcpstore_server.py), plus the same C
#     client threads (bench/store_bench, 1.13 wire protocol) against both, which measures the
#     servers rather than the Python clients.
# Runs interleaved; medians. Usage: bench/torch_store_compare.sh [BUILD_DIR]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record torch_store_compare "$@" # its output goes to bench/results/<machine>/torch_store_compare.md too
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. bench/lib.sh
B=$(cd "${1:-build/release}" && pwd)
RUNS=${RUNS:-5}
REPS=${REPS:-3}
SECS=${SECS:-2}
INIT=$PWD/bench/torch_init_time.py
BENCH="$B/bench/store_bench"
PY=/usr/bin/python3
T=$(mktemp -d)
DDP_PID='' TS_PID=''
trap 'kill $DDP_PID $TS_PID 2>/dev/null || true; rm -rf "$T"' EXIT
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1

# The connections the launcher's store accepted in the last ddprun run (its summary.json).
store_conns() {
  local d
  d=$(ls -td ddprun-logs/*/ | head -n1)
  grep -o '"connections": [0-9]*' "${d}summary.json" | grep -o '[0-9]*$'
}

# The slowest rank's init_process_group, in ms, from the INIT lines of one run.
init_ms() { # command...
  "$@" >"$T/out" 2>&1 || { cat "$T/out" >&2; return 1; }
  grep -o 'INIT [0-9]* [0-9.]* [0-9.]*' "$T/out" |
    awk '{ d = ($4 - $3) * 1000; if (d > m) m = d; n++ } END { if (!n) exit 1; printf "%.0f\n", m }'
}

echo "# $(date -u +%F) $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); torch $("$PY" -c 'import torch; print(torch.__version__)'); RUNS=$RUNS REPS=$REPS SECS=$SECS" >"$T/results"
(
  cd "$T"
  for n in 2 4 8; do
    for _ in $(seq "$RUNS"); do
      echo "init ddprun $n $(init_ms "$B/ddprun" --nproc-per-node "$n" --no-python "$PY" "$INIT")"
      echo "conns ddprun $n $(store_conns)"
      echo "init ddprun-rank0 $n $(init_ms "$B/ddprun" --nproc-per-node "$n" \
        --set rendezvous.torch_store=rank0 --no-python "$PY" "$INIT")"
      echo "init torchrun $n $(init_ms "$PY" -m torch.distributed.run --standalone --redirects 1 \
        --tee 1 --monitor_interval 0.1 --nproc_per_node "$n" "$INIT")"
    done
  done
) >>"$T/results"

(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/token")
"$B/ddprun" store --listen 127.0.0.1:0 --token-file "$T/token" --torch-listen 127.0.0.1:0 \
  >"$T/ddp.out" 2>"$T/ddp.err" &
DDP_PID=$!
TS_PORT=$(free_port)
"$PY" bench/tcpstore_server.py "$TS_PORT" >"$T/ts.out" 2>&1 &
TS_PID=$!
for _ in $(seq 300); do
  [ "$(wc -l <"$T/ddp.out")" -ge 2 ] && grep -q ready "$T/ts.out" && break
  sleep 0.1
done
DDP_PORT=$(sed -n 2p "$T/ddp.out" | sed 's/.*://')
[ -n "$DDP_PORT" ] || { cat "$T/ddp.err"; exit 1; }

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
measure() { # side server-pid command... (appends the server's CPU ticks during the run)
  local side=$1 pid=$2 t0 t1 line
  shift 2
  t0=$(cpu_ticks "$pid")
  line=$("$@")
  t1=$(cpu_ticks "$pid")
  echo "$side $line $((t1 - t0))"
}
for clients in 1 16 64; do
  for op in get add set; do
    for _ in $(seq "$REPS"); do
      measure py-ddprun "$DDP_PID" "$PY" bench/tcpstore_pyclients.py "$DDP_PORT" "$op" "$clients" "$SECS"
      measure py-torch "$TS_PID" "$PY" bench/tcpstore_pyclients.py "$TS_PORT" "$op" "$clients" "$SECS"
      [ "$op" = set ] && continue # 1.13's SET has no reply: a C client only measures its writes
      measure c-ddprun "$DDP_PID" "$BENCH" --proto tcpstore --addr "127.0.0.1:$DDP_PORT" ops \
        --op "$op" --clients "$clients" --seconds "$SECS"
      measure c-torch "$TS_PID" "$BENCH" --proto tcpstore --addr "127.0.0.1:$TS_PORT" ops \
        --op "$op" --clients "$clients" --seconds "$SECS"
    done
  done
done >>"$T/results"
cp "$T/results" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true

"$PY" - "$T/results" "$SECS" <<'PY'
import statistics, sys
from collections import defaultdict
lines = open(sys.argv[1]).read().splitlines()
secs = float(sys.argv[2])
print(lines[0])
init, ops = defaultdict(list), defaultdict(list)
for l in lines[1:]:
    f = l.split()
    if f[0] in ("init", "conns"):
        init[(f[0] == "conns" and "conns" or f[1], int(f[2]))].append(int(f[3]))
    else:  # side RESULT ops proto op clients rate p50 p99 ticks
        rate = float(f[6])
        ops[(f[0], f[4], int(f[5]))].append((rate, int(f[7]), int(f[8]), int(f[9]) * 10000 / (rate * secs) if rate else 0))
med = statistics.median
print("\ninit_process_group(\"gloo\"), the slowest rank, ms (median of runs):\n")
print("| ranks | ddprun, the job's store | ddprun, rank 0's TCPStore | torchrun --standalone | rank 0's / the job's store | torchrun / the job's store | the job's store: connections |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for n in (2, 4, 8):
    a, b, c = (med(init[(k, n)]) for k in ("ddprun", "ddprun-rank0", "torchrun"))
    print(f"| {n} | {a:.0f} | {b:.0f} | {c:.0f} | {b/a:.2f}x | {c/a:.2f}x | {max(init[('conns', n)])} |")
m = lambda xs, i: med(x[i] for x in xs)
for kind, title in (("py", "torch's own client, N Python processes"), ("c", "the same C client threads, TCPStore 1.13 wire protocol")):
    print(f"\n{title} (ops/s; p50/p99 us; server CPU us per op):\n")
    print("| op | clients | ddprun's port ops/s | TCPStore ops/s | ratio | ddprun p50/p99 | TCPStore p50/p99 | CPU us/op ddprun | TCPStore |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for op in ("get", "add", "set"):
        for c in (1, 16, 64):
            d, t = ops[(kind + "-ddprun", op, c)], ops[(kind + "-torch", op, c)]
            if not d or not t:
                continue
            print(f"| {op} | {c} | {m(d,0):,.0f} | {m(t,0):,.0f} | {m(d,0)/m(t,0):.2f}x | {m(d,1):.0f} / {m(d,2):.0f} "
                  f"| {m(t,1):.0f} / {m(t,2):.0f} | {m(d,3):.1f} | {m(t,3):.1f} |")
PY
