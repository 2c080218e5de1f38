#!/usr/bin/env bats
# Leases as a failure detector: a SIGKILLed holder's keys vanish at the TTL and a watcher sees it.
load '../lib/common'

teardown() {
  [ -n "${HOLDER:-}" ] && kill -9 "$HOLDER" 2>/dev/null
  [ -n "${WATCHER:-}" ] && kill -9 "$WATCHER" 2>/dev/null
  stop_store
}

@test "a lease expires when its holder is SIGKILLed, and the watch fires" {
  start_store
  st_bg watch nodes/ 2 10000 >"$BATS_TEST_TMPDIR/watch.out" 2>&1 &
  WATCHER=$!
  wait_for_line "$BATS_TEST_TMPDIR/watch.out" 5 watching
  st_bg lease-hold 1000 nodes/n0 >"$BATS_TEST_TMPDIR/hold.out" 2>&1 &
  HOLDER=$!
  wait_for_line "$BATS_TEST_TMPDIR/hold.out" 5 held
  # renewed: still there after three TTLs
  sleep 3
  run st get nodes/n0
  assert_success
  assert_output alive
  t0=$(date +%s%N)
  kill -9 "$HOLDER"
  wait_for_line "$BATS_TEST_TMPDIR/watch.out" 5 "EXPIRE nodes/n0"
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "expired after ${ms} ms" >&3
  [ "$ms" -le 1600 ]
  run st get nodes/n0
  assert_failure
  assert_output --partial DDP_ENOKEY
  grep -q "expired after 1000 ms without a keepalive" "$BATS_TEST_TMPDIR/store.err"
  HOLDER=
  wait "$WATCHER"
  WATCHER=
  run cat "$BATS_TEST_TMPDIR/watch.out"
  assert_line --index 1 "SET nodes/n0"
  assert_line --index 2 "EXPIRE nodes/n0"
}
