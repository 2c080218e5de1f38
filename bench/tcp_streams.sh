#!/usr/bin/env bash
# Several connections per peer, measured before built (issue 21, part 2): two test hosts
# (network namespaces on veth through a bridge, from tests/lib/sshd.bash) exchange a message
# both ways at once, the transport of a 2-rank ring step without its reduction
# (bench/tcp_streams.c), cut over 1, 2 and 4 connections, with a thread per connection (as
# ddp__xfer) or two (one sends, one receives: DDP_PG_TCP_THREADS=2); beside it iperf3 --bidir
# with as many parallel streams. REPS runs of each, interleaved; the table shows GB/s each way,
# the median of the runs' medians. RATE as in tcp_link_compare.sh (default none: the veths' own
# speed). Needs root, iproute2, iperf3.
# Usage: bench/tcp_streams.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
RATE=${RATE:-none} REPS=${REPS:-3}
# shellcheck source=lib.sh
. bench/lib.sh
two_netns_hosts
R=results
echo "# $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; link: ${RATE}; $(iperf3 --version | head -n1 | cut -d' ' -f1-2)" >"$R"

ip netns exec "$ns1" iperf3 -s -D -p 5201 --pidfile "$PWD/iperf.pid"
sleep 0.5
for rep in $(seq "$REPS"); do
  for c in 1 2 4; do
    ip netns exec "$ns2" iperf3 -c "$a1" -p 5201 -t 4 -O 1 -P "$c" --bidir -J >iperf.json
    /usr/bin/python3 -c "import json, sys; e = json.load(open('iperf.json'))['end']; print('IPERF', sys.argv[1], min(e['sum_received']['bits_per_second'], e['sum_received_bidir_reverse']['bits_per_second']) / 8e9)" "$c" >>"$R"
    for t in 1 2; do
      for bytes in 4194304 67108864; do
        iters=$((bytes > 4194304 ? 10 : 30))
        ip netns exec "$ns1" "$B/bench/tcp_streams" listen "$a1" "$c" "$t" "$bytes" "$iters" >srv.out &
        srv=$!
        for _ in $(seq 100); do [ -s srv.out ] && break; sleep 0.02; done
        ip netns exec "$ns2" "$B/bench/tcp_streams" connect "$a1" "$(awk '{print $2}' srv.out)" \
          "$c" "$t" "$bytes" "$iters" >>"$R"
        wait "$srv"
      done
    done
  done
done
kill "$(cat iperf.pid)" 2>/dev/null || true
cp "$R" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
/usr/bin/python3 - "$R" <<'PY'
import statistics, sys
lines = open(sys.argv[1]).read().splitlines()
print(lines[0])
ip, st = {}, {}
for l in lines[1:]:
    w = l.split()
    if w[0] == "IPERF":
        ip.setdefault(int(w[1]), []).append(float(w[2]))
    elif w[0] == "STREAMS":
        st.setdefault((int(w[1]), int(w[2]), int(w[3])), []).append(float(w[5]))
med = statistics.median
print("\nGB/s each way, both ways at once (iperf3: the slower direction); median of", len(ip[1]), "runs")
print("\n| connections | iperf3 --bidir -P n | 4 MiB, 1 thread each | 4 MiB, 2 threads each | 64 MiB, 1 thread each | 64 MiB, 2 threads each |")
print("|---:|---:|---:|---:|---:|---:|")
for c in sorted(ip):
    cell = lambda t, b: f"{med(st[(c, t, b)]):.2f}" if (c, t, b) in st else "-"
    print(f"| {c} | {med(ip[c]):.2f} | {cell(1, 4 << 20)} | {cell(2, 4 << 20)} | {cell(1, 64 << 20)} | {cell(2, 64 << 20)} |")
PY
