#!/usr/bin/env bash
# The launcher's CPU per /metrics scrape (metrics.listen; cli/supervisor/metrics.h) of a job of
# NPROC ranks (default 1,024: 2 local nodes, each an agent of NPROC/2 bench/metrics_rank ranks,
# which record an all-reduce every 100 ms in their flight recorder pages, without a network),
# so that every series of a training job is there. After every rank has reported, the
# launcher's CPU time (/proc/PID/stat, all its threads) is read over SECS seconds without a
# scrape, then over SCRAPES scrapes one after the other; the idle rate is taken off. The issue's
# bound: 50 ms of launcher CPU per scrape at 1,024 ranks. No other launcher serves metrics
# (torchrun has none), so there is nothing beside it.
#   usage: bench/metrics_scrape.sh [BUILD_DIR]   (NPROC, SCRAPES, SECS: environment)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_record metrics_scrape "$@"
bench_dirs "${1:-build/release}"
NPROC=${NPROC:-1024}
SCRAPES=${SCRAPES:-50}
SECS=${SECS:-5}
[ -x "$B/ddprun" ] && [ -x "$B/bench/metrics_rank" ] || { echo "build $B first (ddprun, bench/metrics_rank)" >&2; exit 1; }
per=$((NPROC / 2))
cd "$T"
cat >job.yaml <<JOB
command: [$B/bench/metrics_rank]
nodes:
  - {host: localhost, slots: $per}
  - {host: 127.0.0.1, slots: $per}
logs: {dir: logs}
stop_grace: 2s
elastic: {heartbeat_interval: 1s, heartbeat_timeout: 30s}
rendezvous: {timeout: 5m}
metrics: {listen: "127.0.0.1:0"}
JOB
ulimit -n 65536 2>/dev/null || true
setsid "$B/ddprun" job.yaml >out.txt 2>&1 & # (a session of its own: its stop is its own)
ddp=$!
trap 'kill -INT $ddp 2>/dev/null || true; wait $ddp 2>/dev/null || true; rm -rf "$T"' EXIT
url=""
for _ in $(seq 600); do
  url=$(grep -o "http://[^ ]*/metrics" out.txt 2>/dev/null | head -n1) && [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { cat out.txt >&2; exit 1; }
for _ in $(seq 1200); do
  kill -0 "$ddp" 2>/dev/null || { cat out.txt >&2; exit 1; }
  [ "$(curl -s "$url" | grep -c '^ddprun_rank_collectives_total{')" -ge "$NPROC" ] && break
  sleep 0.5
done
curl -s "$url" >m.txt
ranks=$(grep -c '^ddprun_rank_collectives_total{' m.txt)
[ "$ranks" -ge "$NPROC" ] || { echo "only $ranks of $NPROC ranks reported" >&2; exit 1; }
cpu_ms() { awk '{ print ($14 + $15) * 1000 / '"$(getconf CLK_TCK)"' }' "/proc/$ddp/stat"; }
now_s() { date +%s.%N; }
c0=$(cpu_ms); t0=$(now_s)
sleep "$SECS"
c1=$(cpu_ms); t1=$(now_s)
: >walls.txt
for _ in $(seq "$SCRAPES"); do
  curl -s -o /dev/null -w '%{time_total}\n' "$url" >>walls.txt
done
c2=$(cpu_ms); t2=$(now_s)
series=$(grep -vc '^#' m.txt)
bytes=$(wc -c <m.txt)
echo "a job of $ranks ranks on 2 local nodes (bench/metrics_rank: an all-reduce every 100 ms each);"
echo "the launcher's CPU (all threads) per scrape, its idle rate over $SECS s taken off; $SCRAPES scrapes"
echo
echo "| ranks | series | body | launcher CPU per scrape | scrape wall time, median | launcher CPU idle |"
echo "|---|---|---|---|---|---|"
awk -v r="$ranks" -v s="$series" -v b="$bytes" -v c0="$c0" -v c1="$c1" -v c2="$c2" \
  -v t0="$t0" -v t1="$t1" -v t2="$t2" -v n="$SCRAPES" -v med="$(sort -n walls.txt | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')" 'BEGIN {
  idle = (c1 - c0) / (t1 - t0)
  per = ((c2 - c1) - idle * (t2 - t1)) / n
  printf "| %d | %d | %.0f KiB | %.1f ms | %.1f ms | %.0f ms/s |\n", r, s, b / 1024, per, med * 1000, idle
}'
kill -INT "$ddp"
wait "$ddp" || true
