#!/usr/bin/env bats
# Parked waits: timeouts, release by another process, and a waiter that dies mid-wait.
load '../lib/common'

teardown() { stop_store; }

@test "wait with a timeout fails with DDP_ETIMEDOUT after the timeout" {
  start_store
  t0=$(date +%s%N)
  run st wait 400 never-set
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  assert_failure 1
  assert_output --partial DDP_ETIMEDOUT
  [ "$ms" -ge 400 ]
  [ "$ms" -le 3000 ]
}

@test "a wait is released by a set from another process" {
  start_store
  st_bg wait 10000 a b >"$BATS_TEST_TMPDIR/wait.out" 2>&1 &
  w=$!
  sleep 0.3
  st set a 1
  sleep 0.2
  kill -0 "$w"   # still parked: b is missing
  st set b 2
  wait "$w"
  grep -q ready "$BATS_TEST_TMPDIR/wait.out"
}

@test "a client killed mid-wait leaves the store serving" {
  start_store
  st_bg wait 60000 k >/dev/null 2>&1 &
  w=$!
  sleep 0.3
  kill -9 "$w"
  wait "$w" || true
  st set k v
  run st wait 100 k
  assert_success
  store_alive
}

@test "a client written from ddprun-store(7) alone gets what the page says: order, WAIT, n = 0, limits, ADD, events" {
  start_store
  run python3 "$REPO/tests/helpers/store_page_client.py" "$STORE_ADDR" "$TOKFILE"
  echo "$output"
  assert_success
  refute_output --partial "FAIL"
  store_alive
}
