#!/usr/bin/env bash
# Side-by-side store benchmark: ddprun's store vs PyTorch's TCPStore (Debian python3-torch),
# same machine, same C client threads, runs interleaved, median of REPS runs.
# Usage: bench/store_compare.sh [BUILD_DIR]   (default build/release; needs /usr/bin/python3 + torch)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record store_compare "$@" # its output goes to bench/results/<machine>/store_compare.md too
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. bench/lib.sh
B=${1:-build/release}
REPS=${REPS:-3}
SECS=${SECS:-2}
BENCH="$B/bench/store_bench"
T=$(mktemp -d)
trap 'kill $DDP_PID $TS_PID 2>/dev/null || true; rm -rf "$T"' EXIT

(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/token")
"$B/ddprun" store --listen 127.0.0.1:0 --token-file "$T/token" >"$T/ddp.out" 2>"$T/ddp.err" &
DDP_PID=$!
TS_PORT=$(free_port)
/usr/bin/python3 bench/tcpstore_server.py "$TS_PORT" >"$T/ts.out" 2>&1 &
TS_PID=$!
for _ in $(seq 200); do [ -s "$T/ddp.out" ] && grep -q ready "$T/ts.out" && break; sleep 0.1; done
DDP_ADDR=$(head -n1 "$T/ddp.out")
TORCH=$(awk '{print $2}' "$T/ts.out")

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Runs one ops measurement and appends the server's CPU ticks (1/100 s) spent during it.
measure() { # server-pid command...
  local pid=$1 t0 t1 line
  shift
  t0=$(cpu_ticks "$pid")
  line=$("$@")
  t1=$(cpu_ticks "$pid")
  echo "$line $((t1 - t0))"
}
ours() { measure "$DDP_PID" "$BENCH" --proto ddp --addr "$DDP_ADDR" --token-file "$T/token" "$@"; }
theirs() { measure "$TS_PID" "$BENCH" --proto tcpstore --addr "127.0.0.1:$TS_PORT" "$@"; }
theirs_py() { # op clients
  measure "$TS_PID" /usr/bin/python3 bench/tcpstore_pyclients.py "$TS_PORT" "$1" "$2" "$SECS"
}

echo "# $(date -u +%F) $(nproc) cores, $(uname -r); TCPStore from torch $TORCH; REPS=$REPS SECS=$SECS" >"$T/results"
for clients in 1 16 64; do
  for op in get add set; do
    for rep in $(seq "$REPS"); do
      ours ops --op "$op" --clients "$clients" --seconds "$SECS" >>"$T/results"
      theirs ops --op "$op" --clients "$clients" --seconds "$SECS" >>"$T/results"
      [ "$op" = set ] || theirs_py "$op" "$clients" >>"$T/results"
    done
  done
done
for n in 64 1024 4096; do
  for rep in $(seq "$REPS"); do
    "$BENCH" --proto ddp --addr "$DDP_ADDR" --token-file "$T/token" barrier --clients "$n" \
      --name "b-$n-$rep" >>"$T/results" || echo "RESULT barrier ddp $n fail 1" >>"$T/results"
    timeout 120 "$BENCH" --proto tcpstore --addr "127.0.0.1:$TS_PORT" barrier --clients "$n" \
      --name "b-$n-$rep" >>"$T/results" || echo "RESULT barrier tcpstore $n fail 1" >>"$T/results"
  done
done
cp "$T/results" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
/usr/bin/python3 - "$T/results" "$SECS" <<'PY'
import statistics, sys
from collections import defaultdict
lines = open(sys.argv[1]).read().splitlines()
secs = float(sys.argv[2])
print(lines[0])
ops = defaultdict(list); bar = defaultdict(list)
for l in lines[1:]:
    f = l.split()
    if f[1] == "ops":
        rate = float(f[5])
        cpu_us = int(f[8]) * 10000 / (rate * secs) if rate else 0  # server CPU per op
        ops[(f[3], int(f[4]), f[2])].append((rate, int(f[6]), int(f[7]), cpu_us))
    elif f[1] == "barrier":
        bar[(int(f[3]), f[2])].append(None if f[4] == "fail" or int(f[5]) else float(f[4]))
med = lambda xs, i: statistics.median(x[i] for x in xs)
print("\nSame C client threads against both servers (measures the servers):\n")
print("| op | clients | ddprun ops/s | TCPStore ops/s | ratio | ddprun p50/p99 us | TCPStore p50/p99 us | server CPU us/op ddprun | TCPStore | ratio |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for op in ("get", "add", "set"):
    for c in (1, 16, 64):
        d, t = ops[(op, c, "ddp")], ops[(op, c, "tcpstore")]
        if not d or not t: continue
        lat = lambda xs: f"{med(xs,1):.0f} / {med(xs,2):.0f}"
        name = op + ("*" if op == "set" else "")
        print(f"| {name} | {c} | {med(d,0):,.0f} | {med(t,0):,.0f} | {med(d,0)/med(t,0):.2f}x | {lat(d)} | {lat(t)} "
              f"| {med(d,3):.1f} | {med(t,3):.1f} | {med(t,3)/med(d,3):.2f}x |")
print("\n\\* TCPStore 1.13's SET has no reply: its rate is how fast a client can write into the socket.")
print("\nEach store with its own client, as users run it (ddprun: libddp from C threads; TCPStore: torch's client from N Python processes):\n")
print("| op | clients | ddprun ops/s | TCPStore (Python clients) ops/s | ratio | ddprun p50/p99 us | TCPStore p50/p99 us |")
print("|---|---:|---:|---:|---:|---:|---:|")
for op in ("get", "add"):
    for c in (1, 16, 64):
        d, t = ops[(op, c, "ddp")], ops[(op, c, "tcpstore-py")]
        if not d or not t: continue
        lat = lambda xs: f"{med(xs,1):.0f} / {med(xs,2):.0f}"
        print(f"| {op} | {c} | {med(d,0):,.0f} | {med(t,0):,.0f} | {med(d,0)/med(t,0):.2f}x | {lat(d)} | {lat(t)} |")
print("\n| clients | ddprun connect+auth+barrier ms | TCPStore connect+barrier ms | ratio |")
print("|---:|---:|---:|---:|")
for n in (64, 1024, 4096):
    d, t = bar[(n, "ddp")], bar[(n, "tcpstore")]
    ok = lambda xs: [x for x in xs if x is not None]
    dm = statistics.median(ok(d)) if ok(d) else None
    tm = statistics.median(ok(t)) if ok(t) else None
    fmt = lambda m, xs: (f"{m:.1f}" if m is not None else "failed") + ("" if len(ok(xs)) == len(xs) else f" ({len(xs)-len(ok(xs))}/{len(xs)} runs failed)")
    r = f"{tm/dm:.2f}x faster" if dm and tm else "-"
    print(f"| {n} | {fmt(dm, d)} | {fmt(tm, t)} | {r} |")
PY
