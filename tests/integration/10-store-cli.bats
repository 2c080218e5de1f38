#!/usr/bin/env bats
# `ddprun store`: startup, address printing, usage errors, shutdown, and the token staying secret.
load '../lib/common'

teardown() { stop_store; }

@test "store picks a free port, prints it first, and serves" {
  start_store
  [[ "$STORE_ADDR" =~ ^127\.0\.0\.1:[0-9]+$ ]]
  [ "$(store_port)" -gt 0 ]
  st set greeting hello
  run st get greeting
  assert_success
  assert_output hello
  run st add n 41
  run st add n 1
  assert_output 42
}

@test "SIGTERM stops the store with status 0" {
  start_store
  kill -TERM "$STORE_PID"
  rc=0
  wait "$STORE_PID" || rc=$?
  STORE_PID=
  [ "$rc" -eq 0 ]
}

@test "usage errors exit 2 with a clear message" {
  run "$DDPRUN" store --token-file /nonexistent
  assert_failure 2
  assert_output --partial "--listen HOST:PORT is required"
  run "$DDPRUN" store --listen 127.0.0.1:0
  assert_failure 2
  assert_output --partial "--token-file FILE is required"
  run "$DDPRUN" store --listen nonsense --token-file /x
  assert_failure 2
  assert_output --partial "--listen 'nonsense' is not HOST:PORT"
  run "$DDPRUN" store --listen 127.0.0.1:0 --token-file "$BATS_TEST_TMPDIR/missing"
  assert_failure 2
  assert_output --partial "cannot open token file"
  echo secret >"$BATS_TEST_TMPDIR/loose"; chmod 644 "$BATS_TEST_TMPDIR/loose"
  run "$DDPRUN" store --listen 127.0.0.1:0 --token-file "$BATS_TEST_TMPDIR/loose"
  assert_failure 2
  assert_output --partial "accessible by group or others (mode 644); chmod 600 it"
  run "$DDPRUN" store --listen 127.0.0.1:0 --token-file /x --max-conns 0
  assert_failure 2
}

@test "a port already in use is a launch error (status 3)" {
  start_store
  port=$(store_port)
  run "$DDPRUN" store --listen "127.0.0.1:$port" --token-file "$TOKFILE"
  assert_failure 3
  assert_output --partial "cannot listen on '127.0.0.1:$port'"
}

@test "the token is never on a command line or in the log" {
  start_store --log-level trace
  tok=$(cat "$TOKFILE")
  st set k v
  ! tr '\0' ' ' <"/proc/$STORE_PID/cmdline" | grep -q "$tok" || false
  ! grep -q "$tok" "$BATS_TEST_TMPDIR/store.err" || false
  ! grep -q "$tok" "$BATS_TEST_TMPDIR/store.out" || false
}

@test "--torch-listen: PyTorch's TCPStore protocol on a second port, for the allowed addresses only" {
  start_store --torch-listen 127.0.0.1:0
  TADDR=$(sed -n 2p "$BATS_TEST_TMPDIR/store.out")
  [[ "$TADDR" =~ ^127\.0\.0\.1:[0-9]+$ ]]
  # torch >= 2.2's VALIDATE, then PING 7, SET /k v and GET /k, by a raw client
  run python3 - "${TADDR#*:}" <<'PY'
import socket, struct, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s_ = lambda b: struct.pack("<Q", len(b)) + b
c.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 7)
          + b"\x01" + s_(b"/k") + s_(b"v") + b"\x03" + s_(b"/k"))
got = b""
while len(got) < 13:
    got += c.recv(13 - len(got))
print("reply", got.hex())
PY
  assert_success
  assert_output "reply 07000000""0100000000000000""76"
  stop_store
  # 127.0.0.1 is not allowed: the connection is closed at once, and the log says why
  start_store --torch-listen 127.0.0.1:0 --torch-allow 10.0.0.1,::1
  TADDR=$(sed -n 2p "$BATS_TEST_TMPDIR/store.out")
  run python3 -c "import socket,sys; c=socket.create_connection(('127.0.0.1', int(sys.argv[1]))); c.settimeout(5); print('closed' if c.recv(1) == b'' else 'served')" "${TADDR#*:}"
  assert_output closed
  grep -q "refusing a TCPStore connection from '127.0.0.1:[0-9]*': not an address it serves" "$BATS_TEST_TMPDIR/store.err"
  run "$DDPRUN" store --listen 127.0.0.1:0 --token-file "$TOKFILE" --torch-listen 127.0.0.1:0 --torch-allow localhost
  assert_failure 2
  assert_output --partial "--torch-allow 'localhost' is not a numeric IPv4 or IPv6 address"
  run "$DDPRUN" store --listen 127.0.0.1:0 --token-file "$TOKFILE" --torch-allow 127.0.0.1
  assert_failure 2
  assert_output --partial "--torch-allow needs --torch-listen HOST:PORT"
}
