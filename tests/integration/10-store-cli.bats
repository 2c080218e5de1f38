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
  ! tr '\0' ' ' <"/proc/$STORE_PID/cmdline" | grep -q "$tok"
  ! grep -q "$tok" "$BATS_TEST_TMPDIR/store.err"
  ! grep -q "$tok" "$BATS_TEST_TMPDIR/store.out"
}
