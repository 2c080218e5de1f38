#!/usr/bin/env bash
# All-reduce across two hosts over TCP, side by side with what bounds it: 2 test hosts (network
# namespaces on veth through a bridge, from tests/lib/sshd.bash), one rank each, links
# optionally rate-limited with tc (RATE, e.g. 1Gbit; "none" = the veths' own speed, which on a VM
# is CPU-bound). In one run: one iperf3 stream between the hosts (each direction alone, then
# one each way at once, --bidir: the traffic of an all-reduce, which sends and receives), ddprun's TCP
# all-reduce (bench/allreduce_bench, one rank started in each host's namespace with the
# environment ddprun gives a rank, meeting at a `ddprun store` on the bridge: the launcher takes
# no part in the timed collectives, and no sshd is needed) and Gloo's (Debian's python3-torch,
# one process per host). float32 sum in place, 4 KiB to 64 MiB, the slowest rank's median.
# busbw = algbw x 2(n-1)/n = algbw at 2 ranks: the bytes each host must send and receive per
# second, so one stream's rate is its ceiling when the link is the bottleneck.
# The ranks inherit the environment: DDP_PG_TCP_SNDBUF=0 measures the kernel's autotuned send
# buffers, as between two machines (the test hosts share this machine's kernel).
# Needs root, iproute2, iperf3, python3-torch.
# Usage: bench/tcp_link_compare.sh [BUILD_DIR]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record tcp_link_compare "$@" # its output goes to bench/results/<machine>/tcp_link_compare.md too
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
RATE=${RATE:-none}
REPO=$PWD
# shellcheck source=lib.sh
. bench/lib.sh
two_netns_hosts
R=results
echo "# $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; link: ${RATE}; $(iperf3 --version | head -n1 | cut -d' ' -f1-2); torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')" >"$R"

# one stream, 5 s, each direction (host 2 -> 1, then -R)
ip netns exec "$ns1" iperf3 -s -D -p 5201 --pidfile "$PWD/iperf.pid"
sleep 0.5
for dir in "" -R; do
  ip netns exec "$ns2" iperf3 -c "$a1" -p 5201 -t 5 -O 1 $dir -J >iperf.json
  /usr/bin/python3 -c "import json; d = json.load(open('iperf.json')); print('STREAM', d['end']['sum_received']['bits_per_second'] / 8e9)" >>"$R"
done
ip netns exec "$ns2" iperf3 -c "$a1" -p 5201 -t 5 -O 1 --bidir -J >iperf.json
/usr/bin/python3 -c "import json; e = json.load(open('iperf.json'))['end']; print('BIDIR', e['sum_received']['bits_per_second'] / 8e9, e['sum_received_bidir_reverse']['bits_per_second'] / 8e9)" >>"$R"
kill "$(cat iperf.pid)" 2>/dev/null || true

# ddprun over TCP: 2 hosts x 1 rank (a group across nodes with one rank per node is TCP only),
# meeting at a store on the bridge's address (each rank listens on the interface that reaches it)
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >token)
"$B/ddprun" store --listen "10.213.$SSHD_TAG.1:0" --token-file token >store.out 2>store.err &
store=$!
for _ in $(seq 100); do [ -s store.out ] && break; sleep 0.05; done
[ -s store.out ] || { cat store.err >&2; exit 1; }
for k in 2 1; do
  ip netns exec "$(sshd_ns $k)" env RANK=$((k - 1)) WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
    GROUP_RANK=$((k - 1)) DDPRUN_STORE_ADDR="$(head -n1 store.out)" DDPRUN_TOKEN_FILE="$PWD/token" \
    OMP_NUM_THREADS=1 "$B/bench/allreduce_bench" ddp-tcp >"ddp$k.txt" 2>&1 &
  ranks="${ranks:-} $!"
done
for p in $ranks; do wait "$p" || { cat ddp1.txt ddp2.txt >&2; exit 1; }; done
kill "$store" 2>/dev/null || true
wait "$store" 2>/dev/null || true
store=
grep '^RESULT' ddp1.txt >>"$R"

# Gloo, one process per host
port=$((30000 + RANDOM % 20000))
for k in 2 1; do
  ip netns exec "$(sshd_ns $k)" env OMP_NUM_THREADS=1 /usr/bin/python3 "$REPO/bench/gloo_allreduce.py" 2 "$port" $((k - 1)) "$a1" "vn$SSHD_TAG-$k" >"gloo$k.txt" &
done
wait
grep '^RESULT' gloo1.txt >>"$R"
cp "$R" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
/usr/bin/python3 - "$R" <<'PY'
import statistics, sys
lines = open(sys.argv[1]).read().splitlines()
print(lines[0])
streams = [float(l.split()[1]) for l in lines if l.startswith("STREAM")]
rows = {}
for l in lines:
    if l.startswith("RESULT"):
        _, impl, n, b, us, alg, bus, wrong = l.split()
        rows.setdefault(int(b), {})[impl] = (float(us), float(bus), int(wrong))
bidir = [float(x) for l in lines if l.startswith("BIDIR") for x in l.split()[1:]]
s, sb = min(streams), min(bidir)
print(f"\none iperf3 stream: {streams[0]:.2f} GB/s host 2 -> 1, {streams[1]:.2f} GB/s host 1 -> 2")
print(f"one stream each way at once (--bidir): {bidir[0]:.2f} GB/s host 2 -> 1, {bidir[1]:.2f} GB/s host 1 -> 2\n")
print("2 hosts x 1 rank over TCP. busbw in GB/s (time in us); the streams' columns divide by the")
print("slower direction.\n")
print("| size | ddprun TCP | Gloo | ddprun / Gloo | ddprun / one stream | ddprun / one each way at once | wrong |")
print("|---:|---:|---:|---:|---:|---:|---:|")
fmt = lambda b: f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
for b in sorted(rows):
    r = rows[b]
    g = lambda k: f"{r[k][1]:.2f} ({r[k][0]:.0f})" if k in r else "-"
    ratio = f"{r['ddp-tcp'][1] / r['gloo'][1]:.2f}x" if 'gloo' in r and 'ddp-tcp' in r and r['gloo'][1] else "-"
    st = f"{r['ddp-tcp'][1] / s:.2f}" if 'ddp-tcp' in r else "-"
    sbr = f"{r['ddp-tcp'][1] / sb:.2f}" if 'ddp-tcp' in r else "-"
    print(f"| {fmt(b)} | {g('ddp-tcp')} | {g('gloo')} | {ratio} | {st} | {sbr} | {sum(v[2] for v in r.values())} |")
PY
