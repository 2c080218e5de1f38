#!/usr/bin/env bats
# Stopping a job from outside: no process of the job may survive, whatever the ranks do.
load '../lib/common'

setup() {
  cd "$BATS_TEST_TMPDIR"
  # Ranks that ignore SIGTERM and leave a background child and a setsid'd grandchild behind.
  printf 'name: stubborn\ncommand: "trap \\"\\" TERM; sleep 1000 & setsid sleep 1001 & echo up; wait"\nnproc_per_node: 3\nstop_grace: %s\n' \
    "${GRACE:-1s}" >job.yaml
}

teardown() {
  [ -n "${JOB_ID:-}" ] && for p in $(job_pids "$JOB_ID"); do kill -9 "$p"; done
  true
}

# pids whose environment carries this job id
job_pids() {
  for e in /proc/[0-9]*/environ; do
    if { tr '\0' '\n' <"$e"; } 2>/dev/null | grep -qx "DDPRUN_JOB_ID=$1"; then
      p=${e#/proc/}; echo "${p%/environ}"
    fi
  done
}

start_job() {
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP=$!
  for _ in $(seq 100); do [ "$(grep -c '] up' out.txt)" -eq 3 ] && break; sleep 0.05; done
  [ "$(grep -c '] up' out.txt)" -eq 3 ]
  JOB_ID=$(basename "$(ls -d ddprun-logs/*/)")
  AGENT=$(pgrep -f '^ddprun agent' -P "$DDP")
  [ -n "$AGENT" ]
  [ "$(job_pids "$JOB_ID" | wc -l)" -ge 9 ]   # 3 shells, 3 sleeps, 3 setsid sleeps
}

assert_nothing_left() {
  for _ in $(seq 60); do
    [ -z "$(job_pids "$JOB_ID")" ] && [ -z "$(pgrep -g "$AGENT")" ] && return 0
    sleep 0.1
  done
  echo "left behind:"; for p in $(job_pids "$JOB_ID"); do ps -o pid,pgid,sid,cmd -p "$p"; done
  return 1
}

@test "SIGINT stops every rank and everything they started; status 130" {
  start_job
  kill -INT "$DDP"
  rc=0; wait "$DDP" || rc=$?
  [ "$rc" -eq 130 ]
  assert_nothing_left
  grep -q "stopping 3 ranks" out.txt
  grep -q '"status": "interrupted"' ddprun-logs/*/summary.json
}

@test "SIGTERM does the same" {
  start_job
  kill -TERM "$DDP"
  rc=0; wait "$DDP" || rc=$?
  [ "$rc" -eq 130 ]
  assert_nothing_left
}

@test "a second SIGINT kills at once instead of waiting out the grace period" {
  GRACE=60s setup
  start_job
  kill -INT "$DDP"
  sleep 1
  kill -0 "$DDP"   # still in its 60 s grace period
  SECONDS=0
  kill -INT "$DDP"
  rc=0; wait "$DDP" || rc=$?
  [ "$rc" -eq 130 ]
  [ "$SECONDS" -lt 5 ]
  assert_nothing_left
}

@test "SIGKILL of ddprun itself still leaves no process of the job" {
  start_job
  kill -KILL "$DDP"
  wait "$DDP" || true
  assert_nothing_left
}

@test "a node agent killed outright takes its ranks with it, and the job fails naming it" {
  start_job
  kill -KILL "$AGENT"
  rc=0; wait "$DDP" || rc=$?
  [ "$rc" -eq 1 ]
  grep -q "node 'localhost' lost: its agent died (signal 9); stopping the job" out.txt
  assert_nothing_left
}
