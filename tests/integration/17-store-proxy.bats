#!/usr/bin/env bats
# The agent's store proxy (cli/agent/store_proxy.c): a node's ranks reach the job's store through
# their agent, which combines their ADDs, WAITs and reads; the launcher's store sees a few
# connections per node, not one per rank.
load '../lib/common'

setup() {
  cd "$BATS_TEST_TMPDIR"
}

logdir() { ls -d "$BATS_TEST_TMPDIR"/ddprun-logs/*/ | head -n1; }

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
  timeout 60 "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  for _ in $(seq 100); do grep -q '^\[localhost:1\] wait ' out.txt && break; sleep 0.1; done
  addr=$(grep -o 'addr [0-9.:]*' out.txt | head -n1 | cut -d' ' -f2)
  [ -n "$addr" ] || { cat out.txt; return 1; }
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
