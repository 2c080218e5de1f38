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

@test "an agent that hangs while stopping (SIGSTOPped with its ranks) is ended after stop_grace + 5 s, and nothing is left" {
  # the launcher's bound alone: the node's guard would end them at heartbeat_timeout + 1 s,
  # 6 s by default, as soon as the launcher does
  printf 'elastic: {heartbeat_timeout: 30s}\n' >>job.yaml
  start_job
  kill -STOP -- "-$AGENT"   # the agent and its ranks: a node hung (D state, a frozen VM)
  t0=$(date +%s.%N)
  kill -INT "$DDP"
  rc=0; wait "$DDP" || rc=$?
  t1=$(date +%s.%N)
  cat out.txt
  [ "$rc" -eq 130 ]
  grep -q "ddprun: 1 node agent did not stop within stop_grace + 5 s; ending them" out.txt
  # stop_grace 1 s + 5 s for the agent to report, then its process group is ended
  awk -v a="$t0" -v e="$t1" 'BEGIN { printf "ended after %.2f s\n", e - a; exit !(e - a > 5.5 && e - a < 20) }'
  assert_nothing_left
}

# A rank that logs each signal it gets, with the time, and keeps running.
logging_rank() { # file grace
  cat >sig.sh <<'SH'
#!/bin/bash
log=$PWD/sig-$RANK.txt
for s in INT TERM USR1 USR2 HUP; do trap "echo $s \$(date +%s.%N) >>$log" $s; done
echo up
while :; do sleep 0.05; done
SH
  chmod +x sig.sh
  printf 'command: [./sig.sh]\nnproc_per_node: 2\nstop_grace: %s\nlogs: {dir: logs}\n' "$2" >"$1"
}

@test "the first SIGINT reaches the ranks as SIGINT, then SIGTERM halfway through stop_grace, SIGKILL at its end (as torchrun)" {
  logging_rank job.yaml 4s
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP=$!
  for _ in $(seq 100); do [ "$(grep -c '] up' out.txt)" -eq 2 ] && break; sleep 0.05; done
  JOB_ID=$(basename "$(ls -d logs/*/)")
  t0=$(date +%s.%N)
  kill -INT "$DDP"
  rc=0; wait "$DDP" || rc=$?
  t1=$(date +%s.%N)
  cat out.txt
  [ "$rc" -eq 130 ]
  for r in 0 1; do
    cat "sig-$r.txt"
    [ "$(cut -d' ' -f1 "sig-$r.txt" | tr '\n' ' ')" = "INT TERM " ]
    ti=$(grep INT "sig-$r.txt" | cut -d' ' -f2) tt=$(grep TERM "sig-$r.txt" | cut -d' ' -f2)
    # SIGINT at once, SIGTERM at 2 s (half of 4 s), SIGKILL at 4 s: windows far wider than
    # a busy machine's delays, narrow enough to tell the three apart
    awk -v a="$t0" -v i="$ti" -v t="$tt" -v e="$t1" 'BEGIN {
      printf "INT after %.2f s, TERM after %.2f s, ddprun done after %.2f s\n", i - a, t - a, e - a
      exit !(i - a < 1.5 && t - a > 1.5 && t - a < 3.5 && e - a > 3.5 && e - a < 9) }'
  done
  grep -q "ranks (SIGINT, SIGTERM halfway, SIGKILL after 4000 ms" out.txt
  [ -z "$(job_pids "$JOB_ID")" ]
}

@test "Python ranks see KeyboardInterrupt on the first SIGINT and their finally blocks run" {
  [ -x /usr/bin/python3 ] || fail "Debian's python3 is missing"
  cat >train.py <<'PY'
import time
try:
    print("up", flush=True)
    time.sleep(100)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
finally:
    print("finally ran", flush=True)
PY
  printf 'command: [/usr/bin/python3, train.py]\nnproc_per_node: 2\nstop_grace: 20s\nlogs: {dir: logs}\n' >job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP=$!
  for _ in $(seq 200); do [ "$(grep -c '] up' out.txt)" -eq 2 ] && break; sleep 0.05; done
  JOB_ID=$(basename "$(ls -d logs/*/)")
  SECONDS=0
  kill -INT "$DDP"
  rc=0; wait "$DDP" || rc=$?
  cat out.txt
  [ "$rc" -eq 130 ]
  [ "$SECONDS" -lt 10 ]   # the ranks ended on SIGINT, long before the 20 s grace
  for r in 0 1; do
    grep -q "^\[localhost:$r\] KeyboardInterrupt" out.txt
    grep -q "^\[localhost:$r\] finally ran" out.txt
  done
}

@test "SIGUSR1, SIGUSR2 and SIGHUP to ddprun are passed to every rank and do not stop the job" {
  cat >usr.sh <<'SH'
#!/bin/bash
n=0
for s in USR1 USR2 HUP; do trap "echo got $s; n=\$((n + 1))" $s; done
echo up
while [ $n -lt 3 ]; do sleep 0.05; done
echo all three
SH
  chmod +x usr.sh
  printf 'command: [./usr.sh]\nnproc_per_node: 3\nlogs: {dir: logs}\n' >job.yaml
  # SIGHUP at its default whatever this shell inherited (run under nohup, it is ignored)
  env --default-signal=HUP "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP=$!
  for _ in $(seq 100); do [ "$(grep -c '] up' out.txt)" -eq 3 ] && break; sleep 0.05; done
  JOB_ID=$(basename "$(ls -d logs/*/)")
  for s in USR1 USR2 HUP; do
    kill -"$s" "$DDP"
    for _ in $(seq 100); do [ "$(grep -c "got $s" out.txt)" -eq 3 ] && break; sleep 0.05; done
    # ddprun is still there (after HUP, the last, the ranks end and so does the job, at once)
    [ "$s" = HUP ] || kill -0 "$DDP"
  done
  for _ in $(seq 100); do kill -0 "$DDP" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$DDP" 2>/dev/null && { cat out.txt; kill -INT "$DDP"; return 1; }
  rc=0; wait "$DDP" || rc=$?
  cat out.txt
  [ "$rc" -eq 0 ]
  for r in 0 1 2; do
    for s in USR1 USR2 HUP; do grep -q "^\[localhost:$r\] got $s" out.txt; done
    grep -q "^\[localhost:$r\] all three" out.txt
  done
  grep -q "ddprun: SIGUSR1: passed to the 3 ranks running" out.txt
  [ "$(grep -c '"event": "signal"' logs/*/events.jsonl)" -eq 3 ]
}

@test "under nohup a SIGHUP to ddprun stays ignored: not passed to the ranks, which inherit it ignored" {
  # A rank that would see SIGHUP (Python may handle a signal it inherited ignored) and ends on
  # SIGUSR1.
  cat >hup.py <<'PY'
import os, signal, sys
ign = open("/proc/self/status").read().split("SigIgn:")[1].split()[0]
print("SIGHUP ignored" if int(ign, 16) & (1 << (signal.SIGHUP - 1)) else "SIGHUP default", flush=True)
signal.signal(signal.SIGHUP, lambda *_: print("got HUP", flush=True))
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))
print("up", flush=True)
while True:
    signal.pause()
PY
  printf 'command: [/usr/bin/python3, hup.py]\nnproc_per_node: 2\nlogs: {dir: logs}\n' >job.yaml
  nohup "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP=$!
  for _ in $(seq 200); do [ "$(grep -c '] up' out.txt)" -eq 2 ] && break; sleep 0.05; done
  JOB_ID=$(basename "$(ls -d logs/*/)")
  [ "$(grep -c '] SIGHUP ignored' out.txt)" -eq 2 ] || { cat out.txt; return 1; }
  kill -HUP "$DDP"
  for _ in $(seq 100); do grep -q 'ddprun: SIGHUP: ignored' out.txt && break; sleep 0.05; done
  kill -USR1 "$DDP"
  for _ in $(seq 200); do kill -0 "$DDP" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$DDP" 2>/dev/null && { cat out.txt; kill -INT "$DDP"; return 1; }
  rc=0; wait "$DDP" || rc=$?
  cat out.txt
  [ "$rc" -eq 0 ]
  grep -qx "ddprun: SIGHUP: ignored, as it was when ddprun started (nohup, --detach)" out.txt
  ! grep -q "got HUP" out.txt || false
  [ "$(grep -c '"event": "signal"' logs/*/events.jsonl)" -eq 1 ] # SIGUSR1's
}

@test "a launcher stopped for longer than heartbeat_timeout: the ranks its agents stopped are recorded as stopped for that reason" {
  cat >job.yaml <<'JOB'
command: while :; do sleep 0.1; done
nproc_per_node: 2
elastic: {heartbeat_interval: 250ms, heartbeat_timeout: 1s}
stop_grace: 1s
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP=$!
  for _ in $(seq 100); do grep -q "ddprun: running" out.txt && break; sleep 0.05; done
  JOB_ID=$(basename "$(ls -d ddprun-logs/*/)")
  kill -STOP "$DDP"
  sleep 3
  kill -CONT "$DDP"
  rc=0; wait "$DDP" || rc=$?
  cat out.txt
  [ "$rc" -eq 1 ]
  d=ddprun-logs/$JOB_ID
  grep -q "ddprun: this launcher did not run for [3-9].[0-9] s (it was stopped, or starved of CPU)" out.txt
  /usr/bin/python3 - "$d" <<'PY'
import json, sys
d = sys.argv[1]
s = json.load(open(d + "/summary.json"))
assert s["reason"].startswith("this launcher did not run for "), s["reason"]
assert "stopped their ranks" in s["reason"], s["reason"]
assert all(r["stopped_by_ddprun"] for r in s["ranks"]), s["ranks"]
events = [json.loads(l) for l in open(d + "/events.jsonl")]
stall = [e for e in events if e["event"] == "launcher_stalled"]
assert len(stall) == 1 and stall[0]["ms"] >= 2500, stall
end = [e for e in events if e["event"] == "job_end"][0]
assert end["reason"] == s["reason"], (end, s["reason"])
PY
}
