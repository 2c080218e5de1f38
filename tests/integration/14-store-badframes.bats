#!/usr/bin/env bats
# Garbage, truncated, oversized and silent connections: each is dropped with a logged reason, and
# the store keeps serving everyone else.
load '../lib/common'

teardown() { stop_store; }

send_raw() { # bytes (printf format)
  exec 5<>"/dev/tcp/127.0.0.1/$(store_port)"
  # The store may close the socket before the last byte (SIGPIPE, EPIPE): that is fine.
  (trap "" PIPE; printf "$1" >&5) 2>/dev/null || true
  timeout 5 cat <&5 >/dev/null || true
  exec 5<&- 5>&-
}

@test "garbage is dropped as a bad magic" {
  start_store
  send_raw 'GET / HTTP/1.1\r\nHost: x\r\n\r\n'
  grep -q "frame length\|bad magic\|malformed" "$BATS_TEST_TMPDIR/store.err"
  store_alive
}

@test "a frame claiming 2 GiB is refused before any allocation" {
  start_store
  send_raw '\xff\xff\xff\x7f\x01'
  grep -q "frame length over the limit" "$BATS_TEST_TMPDIR/store.err"
  store_alive
}

@test "a truncated frame followed by EOF is logged and dropped" {
  start_store
  exec 5<>"/dev/tcp/127.0.0.1/$(store_port)"
  printf '\x21\x00\x00\x00\x01\x01\x00' >&5   # a HELLO header announcing 33 bytes, then 3
  exec 5<&- 5>&-
  wait_for_line "$BATS_TEST_TMPDIR/store.err" 5 "closed the connection mid-frame"
  store_alive
}

@test "a silent connection does not block other clients" {
  start_store
  exec 6<>"/dev/tcp/127.0.0.1/$(store_port)"
  printf '\x21\x00' >&6   # half a length field, then nothing
  run st stress 20 20
  assert_success
  exec 6<&- 6>&-
  store_alive
}
