#!/usr/bin/env bats
# The agent's store proxy (cli/agent/store_proxy.c): a node's ranks reach the job's store through
# their agent, which combines their ADDs, WAITs and reads; the launcher's store sees a few
# connections per node, not one per rank.
load '../lib/common'

setup() {
  cd "$BATS_TEST_TMPDIR"
}

logdir() { ls -d "$BATS_TEST_TMPDIR"/ddprun-logs/*/ | head -n1; }

# Starts job.yaml in the background (pid in $ddp) and waits for its ranks' WAITs, with their
# proxy's address in $addr.
start_ranks() {
  timeout 60 "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  for _ in $(seq 100); do grep -q '^\[localhost:1\] wait ' out.txt && break; sleep 0.1; done
  addr=$(grep -o 'addr [0-9.:]*' out.txt | head -n1 | cut -d' ' -f2)
  [ -n "$addr" ] || { cat out.txt; return 1; }
}

@test "8 ranks through their agent's proxy: ADDs made at once return the values of one order of them, a rank's WAIT times out alone, the store sees the agent's few connections" {
  printf 'command: [%s, proxy-rank, "0"]\nnproc_per_node: 8\n' "$STORETOOL" >job.yaml
  run timeout 60 "$DDPRUN" job.yaml
  assert_success
  # every rank reached the store at its agent's address, not the store's own
  store=$(grep -o 'store on [^,]*' "$(logdir)/ddprun.log" | cut -d' ' -f3)
  addrs=$(grep -ho '^addr .*' "$(logdir)"/rank-*.log | sort -u)
  [ "$(echo "$addrs" | wc -l)" -eq 1 ] && [ "$addrs" != "addr $store" ] || { echo "store $store, ranks: $addrs"; return 1; }
  # the counter's ADDs returned 1..8, each once
  [ "$(grep -ho '^counter [0-9]*' "$(logdir)"/rank-*.log | cut -d' ' -f2 | sort -n | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 " ]
  # the sum's (RANK + 1 each): sorted by value, each is the one before plus its own delta
  grep -ho 'sum [0-9]* delta [0-9]*' "$(logdir)"/rank-*.log | sort -k2,2n |
    awk '{ if ($2 != prev + $4) bad = 1; prev = $2 } END { exit !(NR == 8 && prev == 36 && !bad) }'
  # each rank's WAIT timed out by its own deadline
  [ "$(cat "$(logdir)"/rank-*.log | grep -c '^wait DDP_ETIMEDOUT after its timeout')" -eq 8 ]
  # the store: the agent's connection and its proxy's (one for requests, one for each WAIT of
  # other keys at once), fewer than the 9 a connection a rank would make
  grep -Eq '"store": \{"connections": [2-5],' "$(logdir)/summary.json" || { cat "$(logdir)/summary.json"; return 1; }
}

@test "the proxy's port refuses a wrong token, garbage, a stalled half handshake and 300 connections at once; the ranks' job is undisturbed" {
  printf 'command: [%s, proxy-rank, "3"]\nnproc_per_node: 2\n' "$STORETOOL" >job.yaml
  start_ranks
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >wrong.tok)
  run "$STORETOOL" --addr "$addr" --token-file wrong.tok get x
  assert_failure
  assert_output --partial "DDP_EAUTH"
  /usr/bin/python3 - "$addr" <<'PY'
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
port = int(port)
g = socket.create_connection((host, port)); g.sendall(b"\xff" * 64 + b"GET / HTTP/1.0\r\n\r\n")
half = socket.create_connection((host, port)); half.sendall(b"\x20\x00\x00\x00\x01")  # a frame begun
many = []
for _ in range(300):
    try:
        many.append(socket.create_connection((host, port), timeout=5))
    except OSError:
        break
g.settimeout(5)
assert g.recv(64) == b"", "garbage was answered"
print("held", len(many))
time.sleep(0.5)
PY
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 0 ] || { cat out.txt; return 1; }
  [ "$(grep -c 'counter [12] ' out.txt)" -eq 2 ]
}

@test "through the proxy as the store page says: a SET read back, ADD values, a WAIT that does not wait, a 50,000-request burst answered in order without harm" {
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >job.tok)
  printf 'command: [%s, proxy-rank, "4"]\nnproc_per_node: 2\nrendezvous: {token_file: job.tok}\n' "$STORETOOL" >job.yaml
  start_ranks
  run /usr/bin/python3 - "$addr" "$REPO/tests/helpers" <<'PY'
import struct, sys
sys.path.insert(0, sys.argv[2])
from store_page_client import Conn, s, keys
c = Conn(sys.argv[1], open("job.tok", "rb").read())
st, _ = c.call("SET", s(b"t/k") + s(b"v1") + struct.pack("<Q", 0))
assert st == 0, st
st, p = c.call("GET", s(b"t/k"))
assert st == 0 and p == s(b"v1"), (st, p)
st, p = c.call("ADD", s(b"t/n") + struct.pack("<q", 5))
assert st == 0 and struct.unpack("<q", p)[0] == 5, (st, p)
st, p = c.call("ADD", s(b"t/n") + struct.pack("<q", -2))
assert st == 0 and struct.unpack("<q", p)[0] == 3, (st, p)
st, _ = c.call("WAIT", struct.pack("<I", 0) + keys(b"t/absent"))
assert st == -4, st  # DDP_ETIMEDOUT at once
st, _ = c.call("WAIT", struct.pack("<I", 0) + keys(b"t/k"))
assert st == 0, st
# a burst of requests the proxy answers itself (watches are the agents', not the ranks'),
# then one it relays: every reply comes, in order
n = 50000
burst = b"".join(struct.pack("<IBI", 5 + 1 + 4 + 3, 0x1A, 1000 + i) + b"\x00" + s(b"t/w")
                 for i in range(n))
c.sock.sendall(burst)
for i in range(n):
    r = c.reply()
    assert r is not None and r[1] == 1000 + i and r[2] == -15, r  # DDP_ENOTSUP
st, _ = c.call("PING")
assert st == 0, st
print("proxy ok")
PY
  assert_success
  assert_output "proxy ok"
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 0 ] || { cat out.txt; return 1; }
}
