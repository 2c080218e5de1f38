#!/usr/bin/env bats
# Many real clients at once: concurrency, a 1024-client barrier, and a wrong token refused mid-load.
load '../lib/common'

teardown() { stop_store; }

@test "300 concurrent clients: every value reads back and the shared counter is exact" {
  start_store
  run st stress 300 50
  assert_success
  assert_output --partial "clients=300 ops=50 failed=0 counter=15000"
}

@test "a barrier of 1024 clients completes" {
  start_store
  run st barrier 1024 big-barrier
  assert_success
  assert_output --partial "barrier clients=1024 failed=0"
  run st get big-barrier/arrived
  assert_output 1024
}

@test "a client with the wrong token is refused while the others keep working" {
  start_store
  st stress 50 200 >"$BATS_TEST_TMPDIR/stress.out" 2>&1 &
  stress=$!
  (umask 077 && echo wrong-token >"$BATS_TEST_TMPDIR/bad")
  run "$STORETOOL" --addr "$STORE_ADDR" --token-file "$BATS_TEST_TMPDIR/bad" get x
  assert_failure 1
  assert_output --partial "DDP_EAUTH"
  assert_output --partial "refused the job token"
  wait "$stress"
  grep -q "failed=0 counter=10000" "$BATS_TEST_TMPDIR/stress.out"
  grep -q "authentication failed (wrong job token)" "$BATS_TEST_TMPDIR/store.err"
  store_alive
}
