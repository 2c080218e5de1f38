#!/usr/bin/env bash
# Rendezvous of N agents (separate processes: join with a lease, then all-gather 64-byte
# addresses) through ddprun's built-in store vs through etcd (Debian's etcd-server, one member,
# on 127.0.0.1 over TCP like the store), runs interleaved, median of REPS; then the keepalive
# load: N agents renewing their leases every second, the server's CPU and the round trip.
# Usage: bench/rdzv_etcd.sh [BUILD_DIR]   (default build/release)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record rdzv_etcd "$@" # its output goes to bench/results/<machine>/rdzv_etcd.md too
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. bench/lib.sh
B=${1:-build/release}
REPS=${REPS:-5}
KEEP_S=${KEEP_S:-10}
BENCH="$B/bench/rdzv_bench"
T=$(mktemp -d)
trap 'kill $DDP_PID $ETCD_PID 2>/dev/null || true; rm -rf "$T"' EXIT

(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/token")
"$B/ddprun" store --listen 127.0.0.1:0 --token-file "$T/token" >"$T/ddp.out" 2>"$T/ddp.err" &
DDP_PID=$!
PORT=$(free_port)
(cd "$T" && exec /usr/bin/etcd --name m0 --data-dir d --listen-client-urls "http://127.0.0.1:$PORT" \
  --advertise-client-urls "http://127.0.0.1:$PORT" --listen-peer-urls unix://p0:0 \
  --initial-advertise-peer-urls unix://p0:0 --initial-cluster m0=unix://p0:0 >"$T/etcd.log" 2>&1) &
ETCD_PID=$!
for _ in $(seq 200); do
  [ -s "$T/ddp.out" ] && curl -s "http://127.0.0.1:$PORT/health" | grep -q true && break
  sleep 0.1
done
STORE=$(head -n1 "$T/ddp.out")
ETCD="http://127.0.0.1:$PORT"
ETCD_VER=$(curl -s "$ETCD/version" | sed 's/.*"etcdserver":"\([^"]*\)".*/\1/')

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
run=0
one() { # backend agents
  run=$((run + 1))
  if [ "$1" = store ]; then
    "$BENCH" --store "$STORE" --token-file "$T/token" --agents "$2" --tag "r$run"
  else
    "$BENCH" --etcd "$ETCD" --agents "$2" --tag "r$run"
  fi | awk '/^RESULT rdzv/ {print $5}'
}

echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); etcd $ETCD_VER; REPS=$REPS"
printf '%-8s %14s %14s %8s\n' agents "store ms" "etcd ms" "etcd/store"
for n in 8 32 128; do
  s=""; e=""
  for _ in $(seq "$REPS"); do
    s="$s $(one store "$n")"
    e="$e $(one etcd "$n")"
  done
  ms=$(tr ' ' '\n' <<<"$s" | grep . | median)
  me=$(tr ' ' '\n' <<<"$e" | grep . | median)
  printf '%-8s %14s %14s %8.2f\n' "$n" "$ms" "$me" "$(awk -v a="$me" -v b="$ms" 'BEGIN {print a / b}')"
done

echo
echo "# keepalive load: N agents renew every 1000 ms for $KEEP_S s (after their rendezvous)"
printf '%-8s %-6s %20s %18s %10s %10s\n' agents server "server CPU ms/s" "per agent ms/s" "p50 us" "p99 us"
for n in 8 32 128; do
  for b in store etcd; do
    run=$((run + 1))
    if [ "$b" = store ]; then
      line=$("$BENCH" --store "$STORE" --token-file "$T/token" --agents "$n" --tag "k$run" \
        --keepalive-s "$KEEP_S" --interval-ms 1000 --server-pid "$DDP_PID" | grep '^RESULT keepalive')
    else
      line=$("$BENCH" --etcd "$ETCD" --agents "$n" --tag "k$run" --keepalive-s "$KEEP_S" \
        --interval-ms 1000 --server-pid "$ETCD_PID" | grep '^RESULT keepalive')
    fi
    read -r _ _ _ _ _ cpu p50 p99 <<<"$line"
    printf '%-8s %-6s %20s %18.3f %10s %10s\n' "$n" "$b" "$cpu" "$(awk -v c="$cpu" -v n="$n" 'BEGIN {print c / n}')" "$p50" "$p99"
  done
done
