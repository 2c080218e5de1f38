#!/usr/bin/env bats
# Which rank, which collective: the hang report, `ddprun status` and `ddprun stacks`, on a
# 4-rank job of 2 nodes x 2 ranks (two local node agents) running tests/helpers/hangtest.c
# (steps of compute and one all-reduce of gradient bucket 3), with one rank made to misbehave.
# The PyTorch cases run Debian's python3-torch, or DDP_TEST_PYTHON's PyTorch (on a GPU too).
load '../lib/common'

HANGTEST="$BUILD/tests/hangtest"
PY=${DDP_TEST_PYTHON:-/usr/bin/python3} # the PyTorch of the PyTorch cases; another: DDP_TEST_PYTHON

setup() {
  cd "$BATS_TEST_TMPDIR"
  # this test's own folder of control sockets: `ddprun status` finds this test's job only
  export XDG_RUNTIME_DIR="$BATS_TEST_TMPDIR/run"
  mkdir -m 700 "$XDG_RUNTIME_DIR"
}

teardown() {
  [ -n "${DDP_PID:-}" ] && kill -9 "$DDP_PID" 2>/dev/null
  true
}

job() { hangtest_job "$@"; } # extra yaml, then hangtest arguments (tests/lib/common.bash)

events() { cat logs/*/events.jsonl; }
has_event() { events 2>/dev/null | grep -q "\"event\": \"$1\""; }
field() { grep -o "\"$1\": \(\"[^\"]*\|[^,}]*\)" | head -n1 | sed 's/^[^:]*: "\{0,1\}//; s/"$//'; }

wait_for() { # seconds, then a command that succeeds once it holds
  local s=$1
  shift
  for _ in $(seq $((s * 10))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  "$@"
}

@test "a rank SIGSTOPped before collective #30 is named, with its node, the collective and its stack, within hang_after + 2 s; on_hang: fail ends the job" {
  job "diagnose: {hang_after: 3s, on_hang: fail}" --steps 400 --compute-ms 20 \
    --stop-rank 2 --stop-at 30 --stamp "$PWD/stamp"
  run timeout 60 "$DDPRUN" job.yaml
  echo "$output"
  assert_failure 1
  assert_output --partial "rank 2 on 127.0.0.1 has not entered allreduce #30 (bucket 3, 4.0 KiB) that the other 3 ranks entered"
  assert_output --regexp "it is stopped \(SIGSTOP or job control\)( at 0% CPU)? \(pid [0-9]+\)"
  # its native stack, as eu-stack (or gdb) saw it
  assert_output --partial "hangtest_stop_self"
  assert_output --regexp "no rank made progress for [0-9]+ s in allreduce #30 \(bucket 3, 4.0 KiB\) \(rank 2 did not enter it\); stopping the job"
  # recorded: the hang, and when
  ev=$(events | grep '"event": "hang"')
  [ "$(field seq <<<"$ev")" = 30 ]
  [ "$(field ranks <<<"$ev")" = 2 ]
  t_hang=$(date -d "$(field time <<<"$ev")" +%s.%N)
  awk -v a="$(cat stamp)" -v b="$t_hang" 'BEGIN { d = b - a; print "reported " d " s after the stop"; exit !(d >= 3 && d <= 3 + 2) }'
  events | grep -q '"event": "hang_stacks".*hangtest_stop_self'
  # the stop resumes the stopped rank (SIGCONT after SIGTERM, as systemd does): it ends on
  # SIGTERM at once, not on SIGKILL when stop_grace is over
  assert_line --regexp "^  2 +127\.0\.0\.1 +stopped \(SIGTERM\) "
}

@test "a rank looping forever outside any collective: the report names it as running; ddprun stacks and status show it" {
  # each rank handles the Python stacks' signal as faulthandler does, and takes 400 ms to return
  job "diagnose: {hang_after: 2s}" --steps 400 --compute-ms 20 --spin-rank 1 --spin-at 25 --stacks-handler-ms 400
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_for 30 grep -q "waiting (diagnose.on_hang: wait)" out.txt
  cat out.txt
  grep -q "rank 1 on localhost has not entered allreduce #25 (bucket 3, 4.0 KiB) that the other 3 ranks entered" out.txt
  grep -Eq "it is running \(on a CPU\)( at [0-9]+% CPU)? \(pid [0-9]+\)" out.txt
  wait_for 20 grep -q "hangtest_spin_forever_outside_collectives" out.txt
  # from another terminal: the stuck rank's stack, and everyone's grouped
  run "$DDPRUN" stacks --rank 1
  assert_success
  assert_output --partial "== rank 1 (1 of 1):"
  assert_output --partial "hangtest_spin_forever_outside_collectives"
  run "$DDPRUN" stacks
  assert_success
  assert_output --partial "hangtest_spin_forever_outside_collectives"
  # the handler's traceback first; the native stacks taken once every handler has returned
  # (its signal no longer blocked), not while a rank was still in it after its last write
  assert_output --partial $'Python threads (faulthandler):\nThread (most recent call first):\n  File "hangtest.py", line 1 in step'
  refute_output --partial "hangtest_in_stacks_handler"
  # every rank is under one heading (identical stacks share one: tests/unit/test_diag.c)
  for r in 0 1 2 3; do
    assert_output --regexp "== ranks? ([0-9],)*$r(,[0-9])* \([1-4] of 4\):"
  done
  run "$DDPRUN" status
  assert_success
  assert_output --regexp "^job job-[0-9]+-[0-9]+-[0-9a-f]+: running, round 0, 4 ranks on 2 nodes"
  assert_output --regexp $'\n''1 +localhost +[0-9]+ +running \(on a CPU\) .*#24 done'
  assert_output --regexp $'\n''0 +localhost +[0-9]+ +sleeping .*in allreduce #25 \(bucket 3, 4.0 KiB\)'
  kill -INT "$DDP_PID"
  rc=0
  wait "$DDP_PID" || rc=$?
  DDP_PID=
  [ "$rc" -eq 130 ]
}

@test "the startup timeline: events, summary.json and ddprun status say when the groups were formed and the first collective finished" {
  # rank 3 starts 1.5 s late: no rank's group is formed before it arrives
  job "" --steps 40 --compute-ms 50 --late-rank 3 --late-ms 1500
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_for 30 has_event first_collective
  run "$DDPRUN" status
  assert_success
  assert_output --regexp $'\n''startup: process groups formed [0-9]+\.[0-9]{2} s after the ranks were started, first collective done at [0-9]+\.[0-9]{2} s'$'\n'
  wait "$DDP_PID"
  DDP_PID=
  formed=$(events | grep '"event": "group_formed"' | field after_start_ms)
  first=$(events | grep '"event": "first_collective"' | field after_start_ms)
  echo "formed after $formed ms, first collective after $first ms"
  [ "$formed" -ge 1500 ] && [ "$formed" -le 30000 ]
  # each rank computes 50 ms after its group is formed before the first all-reduce
  [ "$first" -ge $((formed + 45)) ] && [ "$first" -le 30000 ]
  # once each, and the summary says the same
  [ "$(events | grep -c '"event": "group_formed"')" -eq 1 ]
  grep -q "\"startup\": {\"round\": 0, \"group_formed_s\": $(awk -v m="$formed" 'BEGIN { printf "%.3f", m / 1000 }'), \"first_collective_s\": $(awk -v m="$first" 'BEGIN { printf "%.3f", m / 1000 }')}" logs/*/summary.json
}

@test "a restart's recovery timeline: one recovery event, at the new round's first collective, whose phases are the times of the events they name; summary.json lists it and ddprun status shows it" {
  # round 0: rank 3 fails after 1 s (the others wait for it in their first group); round 1 runs
  cat >job.yaml <<JOB
command: [sh, -c, 'if [ "\$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "\$RANK" = 3 ]; then sleep 1; exit 3; fi; exec "\$0" --steps 120 --compute-ms 50', "$HANGTEST"]
nodes:
  - {host: localhost, slots: 2}
  - {host: 127.0.0.1, slots: 2}
elastic: {max_restarts: 1, heartbeat_interval: 2s, heartbeat_timeout: 6s}
logs: {dir: logs}
stop_grace: 2s
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_for 60 has_event recovery
  run "$DDPRUN" status
  assert_success
  assert_output --regexp $'\n''last recovery \(rank 3 \([^)]*\) exited with status 3 at [0-9.]+ s\): old ranks stopped [0-9.]+ s, round formed [0-9.]+ s, ranks started [0-9.]+ s, process groups formed [0-9.]+ s, first collective done [0-9.]+ s'$'\n'
  wait "$DDP_PID"
  DDP_PID=
  # one, in round 1, every phase reached, in order
  [ "$(events | grep -c '"event": "recovery"')" -eq 1 ]
  rec=$(events | grep '"event": "recovery"')
  echo "$rec"
  [ "$(field round <<<"$rec")" -eq 1 ]
  det=$(field detected_ms <<<"$rec")
  prev=0
  for ph in stopped formed started group_formed first_collective; do
    v=$(field "${ph}_ms" <<<"$rec")
    [ "$v" -ge "$prev" ] || { echo "$ph: $v before $prev"; return 1; }
    prev=$v
  done
  # each phase is the time of the event that marks it, seconds since the start (t), less the
  # detection's: the worker_failed event's time
  at() { events | grep "\"event\": \"$1\"" | grep "\"round\": $2" | field t | awk '{ printf "%d", $1 * 1000 }'; }
  near() { [ $(($1 - $2)) -le 20 ] && [ $(($2 - $1)) -le 20 ] || { echo "$3: $1 vs $2"; return 1; }; }
  near "$det" "$(at worker_failed 0)" detected
  near $((det + $(field stopped_ms <<<"$rec"))) "$(at workers_stopped 0)" stopped
  near $((det + $(field formed_ms <<<"$rec"))) "$(at membership 1)" formed
  near $((det + $(field started_ms <<<"$rec"))) "$(at workers_running 1)" started
  # the process groups' times come from the ranks' recorders: as the startup events say, from
  # the round's start, which is its membership
  first=$(events | grep '"event": "first_collective"' | grep '"round": 1' | field after_start_ms)
  near "$(field first_collective_ms <<<"$rec")" $(($(field formed_ms <<<"$rec") + first)) first_collective
  # the groups formed when they did, not when the launcher heard of it: a progress report goes
  # out as it is made, not with the next heartbeat (2 s here); hangtest's group forms at once
  [ $(($(field group_formed_ms <<<"$rec") - $(field started_ms <<<"$rec"))) -lt 1500 ]
  # the summary has it, in seconds (its lines joined)
  tr -d '\n' <logs/*/summary.json | grep -q "\"recoveries\": \[  {\"round\": 1, \"cause\": \"rank 3 ([^)]*) exited with status 3\", \"detected_s\": [0-9.]*, \"stopped_s\": [0-9.]*, \"formed_s\": [0-9.]*, \"started_s\": [0-9.]*, \"group_formed_s\": [0-9.]*, \"first_collective_s\": $(awk -v m="$(field first_collective_ms <<<"$rec")" 'BEGIN { printf "%.3f", m / 1000 }'), \"warm_ranks\": 0}\]" || { cat logs/*/summary.json; return 1; }
}

@test "a rank 30% slower than the others is named as the straggler by ddprun status" {
  job "" --steps 400 --compute-ms 50 --slow-rank 3 --slow-factor 1.3
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  # a few seconds of collectives, then the table (a verdict waits for every rank's report, and
  # comes after 4 collectives; the median lead is asserted over 20 or more, not the first few,
  # which the ranks' start skews under ASan)
  wait_for 60 bash -c "'$DDPRUN' status | grep -qE '^3 +127\.0\.0\.1 .*#([2-9][0-9]|[1-9][0-9]{2}) .*STRAGGLER'"
  run "$DDPRUN" status
  echo "$output"
  assert_success
  # rank 3 arrives last at most collectives, by about 15 ms (30% of 50 ms); the others do not
  assert_output --regexp $'\n''3 +127\.0\.0\.1 .* [0-9]+%, by 1[0-9]\.[0-9] ms  STRAGGLER'
  [ "$(grep -c STRAGGLER <<<"$output")" -eq 1 ]
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
}

@test "status and stacks: no running job, an unknown job, a rank out of range are clear errors" {
  run "$DDPRUN" status
  assert_failure 2
  assert_output --partial "no running job of yours on this machine"
  job "" --steps 400 --compute-ms 20
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  # the round's ranks running (before them, stacks says "between rounds")
  wait_for 20 bash -c "'$DDPRUN' status | grep -q '^rank '"
  run "$DDPRUN" status nosuchjob
  assert_failure 2
  assert_output --partial "no running job 'nosuchjob' of yours on this machine"
  run "$DDPRUN" stacks --rank 9
  assert_failure 2
  assert_output --partial "error: no rank '9' (the round has ranks 0 to 3)"
  # the job by its log folder
  run "$DDPRUN" status "$(ls -d logs/*/)"
  assert_success
  assert_output --partial "4 ranks on 2 nodes"
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  # gone with its job
  [ -z "$(ls "$XDG_RUNTIME_DIR/ddprun" | grep "\.sock$")" ] # (each job leaves its log folder's path, for ddprun logs)
}

@test "Python workers (no flight recorder): status shows their processes, stacks their Python lines and native stacks" {
  printf 'command: [/usr/bin/python3, -c, "import time\\ndef wait():\\n    while True: time.sleep(0.2)\\nwait()"]\nnproc_per_node: 2\nlogs: {dir: logs}\nstop_grace: 2s\n' >job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  # (both ranks in their loop: on a busy machine Python may still be starting)
  wait_for 20 bash -c "'$DDPRUN' status | grep -Eq '^0 +localhost +[0-9]+ +sleeping .*no flight recorder'"
  run "$DDPRUN" status
  assert_success
  assert_output --regexp $'\n''0 +localhost +[0-9]+ +sleeping .*\(no flight recorder\)'
  run "$DDPRUN" stacks
  assert_success
  # both ranks at the same lines: one group, the Python frames (faulthandler's) first
  assert_output --partial "== ranks 0,1 (2 of 2):"
  assert_output --partial "Python threads (faulthandler):"
  assert_output --partial $'File "<string>", line 3 in wait\n  File "<string>", line 4 in <module>'
  assert_output --partial "PyEval"
  # asked again: one traceback under each heading (what the last collection read is not read
  # again)
  run "$DDPRUN" stacks
  echo "$output"
  [ "$(grep -c 'line 3 in wait' <<<"$output")" -eq "$(grep -c '^== rank' <<<"$output")" ]
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  # the ranks ran to the stop: the signal that asks for Python stacks never ended them
  grep -q "stopped (SIGINT)" out.txt
}

@test "a rank without the Python stacks' handler (python3 -E ignores PYTHONPATH) is never sent its signal: native stacks only, and it runs on" {
  printf 'command: [/usr/bin/python3, -E, -c, "import time\\nwhile True: time.sleep(0.2)"]\nnproc_per_node: 1\nlogs: {dir: logs}\nstop_grace: 2s\n' >job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_for 20 bash -c "'$DDPRUN' status | grep -q 'no flight recorder'"
  run "$DDPRUN" stacks
  assert_success
  assert_output --partial "== rank 0 (1 of 1):"
  assert_output --partial "PyEval"
  refute_output --partial "Python threads"
  sleep 0.5
  run "$DDPRUN" status
  assert_output --regexp $'\n''0 +localhost +[0-9]+ +sleeping'
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  grep -q "stopped (SIGINT)" out.txt
}

@test "a Python that a wrapper script starts (not exec'd): stacks show its Python lines" {
  cat >wrap.sh <<'SH'
#!/bin/sh
/usr/bin/python3 -c 'import time
def spin():
    while True: time.sleep(0.2)
spin()'
echo "python ended"
SH
  chmod +x wrap.sh
  printf 'command: [./wrap.sh]\nnproc_per_node: 1\nlogs: {dir: logs}\nstop_grace: 2s\n' >job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  for _ in $(seq 100); do pgrep -f "^/usr/bin/python3 -c import time" >/dev/null && break; sleep 0.1; done
  sleep 0.5 # its sitecustomize ran
  run "$DDPRUN" stacks
  assert_success
  assert_output --partial $'Python threads (faulthandler):\nThread (most recent call first):\n  File "<string>", line 3 in spin\n  File "<string>", line 4 in <module>'
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
}

@test "an unmodified PyTorch DDP script stuck in all_reduce: ddprun stacks shows the line each rank is at" {
  "$PY" -c "import torch.distributed" 2>/dev/null || skip "needs PyTorch (Debian's python3-torch, or DDP_TEST_PYTHON's)"
  cat >stuck.py <<'PY'
import os, time
import torch
import torch.distributed as dist

def late():
    time.sleep(3600)

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    late()
t = torch.ones(4)
dist.all_reduce(t)
PY
  printf 'command: [%s, stuck.py]\nnproc_per_node: 2\nlogs: {dir: logs}\nstop_grace: 2s\n' "$PY" >job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  # until rank 1 sleeps in late() and rank 0 waits in all_reduce
  for _ in $(seq 120); do
    run "$DDPRUN" stacks
    grep -q 'stuck.py", line 12 in <module>' <<<"$output" && grep -q 'line 6 in late' <<<"$output" && break
    sleep 0.5
  done
  echo "$output"
  # torch's all_reduce (under torch 2's logging wrapper), called through ddprun's flight
  # recorder (cli/diag/torch_rec.py)
  assert_output --regexp $'== rank 0 \(1 of 2\):\nPython threads \(faulthandler\):\n(.*\n)*  File "[^"]*distributed_c10d.py", line [0-9]+ in all_reduce\n(  File "[^"]*/c10d_logger.py", line [0-9]+ in wrapper\n)?  File "[^"]*/_ddprun_torch.py", line [0-9]+ in ddprun_flight_recorder\n  File "[^"]*/stuck.py", line 12 in <module>'
  assert_output --regexp $'== rank 1 \(1 of 2\):\nPython threads \(faulthandler\):\n(.*\n)*  File "[^"]*/stuck.py", line 6 in late\n  File "[^"]*/stuck.py", line 10 in <module>'
  # the recorder: rank 0 in all_reduce #1 (4 floats), rank 1 counted from init_process_group.
  # Status shows the agents' last report (one per heartbeat), which may predate rank 1's sleep
  # or catch it waking to write its Python stack for the loop above: wait until a report has
  # both. After a ptrace detach the kernel may restart the sleep as hrtimer_nanosleep_restart,
  # cut to the column's 30 characters.
  wait_for 30 bash -c "s=\$('$DDPRUN' status) && grep -q 'in allreduce #1' <<<\"\$s\" &&
    grep -Eq '^1 +localhost +[0-9]+ +sleeping in hrtimer_nanosleep' <<<\"\$s\""
  run "$DDPRUN" status
  assert_output --regexp $'\n''0 +localhost +[0-9]+ +sleeping.* in allreduce #1 \(16 bytes\)'
  assert_output --regexp $'\n''1 +localhost +[0-9]+ +sleeping in hrtimer_nanosleep[_ ].* - +[0-9.]+ s ago'
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
}

@test "the Python stacks' sitecustomize is invisible to the rank: PYTHONPATH, sys.path and the user's sitecustomize as without it; DDPRUN_PYTHON_STACKS=0 leaves Python alone" {
  mkdir mine
  echo 'import os; os.environ["MINE_RAN"] = "yes"' >mine/sitecustomize.py
  cat >show.py <<'PY'
import os, sys
try:
    import sitecustomize
    where = sitecustomize.__file__
except Exception:  # none, or one that raises (imported again here)
    where = None
print("PYTHONPATH=%s" % os.environ.get("PYTHONPATH"))
print("shim on sys.path: %s" % any("/proc/self/fd" in p for p in sys.path))
print("DDPRUN_PY vars: %s" % sorted(k for k in os.environ if k.startswith("DDPRUN_PY")))
print("sitecustomize: %s, ran: %s" % (where, os.environ.get("MINE_RAN")))
PY
  printf 'command: [/usr/bin/python3, show.py]\nnproc_per_node: 1\nlogs: {dir: logs}\n' >job.yaml
  # the user's own PYTHONPATH and sitecustomize
  PYTHONPATH="$PWD/mine:/nonexistent" run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "PYTHONPATH=$PWD/mine:/nonexistent"
  assert_output --partial "shim on sys.path: False"
  assert_output --partial "DDPRUN_PY vars: []"
  assert_output --partial "sitecustomize: $PWD/mine/sitecustomize.py, ran: yes"
  # none: the system's own sitecustomize (Debian's) still runs, PYTHONPATH stays unset
  system=$(env -u PYTHONPATH /usr/bin/python3 -c 'try:
    import sitecustomize; print(sitecustomize.__file__)
except ImportError: print(None)')
  run env -u PYTHONPATH "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "PYTHONPATH=None"
  assert_output --partial "sitecustomize: $system, ran: None"
  # a sitecustomize that raises: Python's own message, as without ddprun, and the rank runs
  mkdir bad
  echo 'raise ValueError("boom")' >bad/sitecustomize.py
  PYTHONPATH="$PWD/bad" run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "Error in sitecustomize; set PYTHONVERBOSE for traceback:"
  assert_output --partial "ValueError: boom"
  assert_output --partial "PYTHONPATH=$PWD/bad"
  # the archive itself, as a rank's shell passes it on (a Python that ignores PYTHONPATH
  # reads it): one member, whose CRC-32 checks
  cat >zipcheck.sh <<'SH'
#!/bin/sh
exec /usr/bin/python3 -E -c 'import os, zipfile
z = zipfile.ZipFile(os.environ["DDPRUN_PY_SHIM"])
print("members %s, bad %s" % (z.namelist(), z.testzip()))'
SH
  chmod +x zipcheck.sh
  run "$DDPRUN" job.yaml --set 'command=[./zipcheck.sh]'
  assert_success
  assert_output --partial "members ['sitecustomize.py', '_ddprun_torch.py', '_ddprun_warm.py'], bad None"
  # plan says so, and stops saying it once it is turned off in the job's env
  run "$DDPRUN" plan job.yaml
  assert_output --partial "PYTHONPATH=/proc/self/fd/<ddprun's sitecustomize>:<its own>"
  printf 'env: {DDPRUN_PYTHON_STACKS: "0"}\n' >>job.yaml
  run "$DDPRUN" plan job.yaml
  refute_output --partial "sitecustomize"
  PYTHONPATH="$PWD/mine" run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "PYTHONPATH=$PWD/mine"
  assert_output --partial "DDPRUN_PY vars: ['DDPRUN_PYTHON_STACKS']"
}

# diagnose.hang_after for a PyTorch job: no rank counts a collective before its
# init_process_group returns, and importing torch can take longer than the 3 s the tests
# wait (torch 2.11 from a cold page cache took 4-5 s on a 16-core VM): 3 s, or 2 x the
# import's time, + 1 s, rounded up.
torch_hang_after() {
  local t0 t1
  t0=$(date +%s%N)
  "$PY" -c 'import torch.distributed, torch.nn.parallel' 2>/dev/null
  t1=$(date +%s%N)
  awk -v ns=$((t1 - t0)) 'BEGIN { h = int(2 * ns / 1e9 + 1.999); print (h > 3 ? h : 3) }'
}

# A DDP training loop (Gloo, 2 ranks): a barrier, then steps of Linear(16, 4) (272 bytes of
# gradients); STALL_AT makes rank 1 sleep before that step, STEPS1 gives rank 1 fewer steps
# (uneven inputs), END=barrier a barrier after the loop, SLOW1_MS slows rank 1's every step.
ddp_script() {
  cat >ddp.py <<'PY'
import os, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def load(step):
    if dist.get_rank() == 1 and step == int(os.environ.get("STALL_AT", "-1")):
        time.sleep(3600)
    return torch.randn(8, 16)

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
dist.barrier()
steps = int(os.environ.get("STEPS1" if dist.get_rank() == 1 else "STEPS", "1000"))
for step in range(steps):
    x = load(step)
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.02 + (int(os.environ.get("SLOW1_MS", "0")) / 1000 if dist.get_rank() == 1 else 0))
if os.environ.get("END") == "barrier":
    dist.barrier()
PY
  cat >job.yaml <<JOB
command: [$PY, ddp.py]
nproc_per_node: 2
logs: {dir: logs}
stop_grace: 2s
elastic: {heartbeat_interval: 500ms}
JOB
}

@test "an unmodified PyTorch DDP script whose rank 1 stalls before a step: the hang report names rank 1, the DDP step rank 0 entered, and rank 1's Python line, once" {
  "$PY" -c "import torch.distributed" 2>/dev/null || skip "needs PyTorch (Debian's python3-torch, or DDP_TEST_PYTHON's)"
  ddp_script
  printf 'diagnose: {hang_after: %ss}\nenv: {STALL_AT: "5"}\n' "$(torch_hang_after)" >>job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_for 90 grep -q "waiting (diagnose.on_hang: wait)" out.txt
  # barrier #1, steps 0-4 are #2-#6: rank 0 entered #7, rank 1 sleeps in load(5)
  grep -q "^ddprun: no rank has made progress for [0-9]* s:$" out.txt
  grep -q "^  rank 1 on localhost has not entered ddp_step #7 (272 bytes) that the other 1 rank entered [0-9]* s ago; it is sleeping in hrtimer_nanosleep" out.txt
  wait_for 20 grep -q 'ddp.py", line 8 in load' out.txt
  run "$DDPRUN" status
  assert_output --regexp $'\n''0 +localhost .* in ddp_step #7 \(272 bytes\)'
  # rank 1's step #6 ended with its backward; rank 0 waits in #7's all-reduce, gradients ready
  assert_output --regexp $'\n''1 +localhost .* #6 done'
  [ "$(events | grep '"event": "hang"' | field collective)" = "ddp_step #7 (272 bytes)" ]
  # the startup timeline from torch's ranks: init_process_group returned, then the barrier
  formed=$(events | grep '"event": "group_formed"' | field after_start_ms)
  first=$(events | grep '"event": "first_collective"' | field after_start_ms)
  [ "$formed" -gt 0 ] && [ "$first" -ge "$formed" ]
  # reported once: the reports that keep arriving carry the same counters
  sleep 4
  [ "$(grep -c "no rank has made progress" out.txt)" -eq 1 ]
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
}

@test "PyTorch DDP: a rank 30 ms late to every step is named the straggler by ddprun status (it waits shortest in the gradient all-reduce)" {
  "$PY" -c "import torch.distributed" 2>/dev/null || skip "needs PyTorch (Debian's python3-torch, or DDP_TEST_PYTHON's)"
  ddp_script
  printf 'env: {SLOW1_MS: "30"}\n' >>job.yaml
  sed -i 's/heartbeat_interval: 500ms/heartbeat_interval: 300ms/' job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_for 60 bash -c "'$DDPRUN' status | grep -q STRAGGLER"
  run "$DDPRUN" status
  echo "$output"
  assert_output --regexp $'\n''1 +localhost .*  [0-9]+%, by [0-9.]+ ms  STRAGGLER'
  [ -z "$(grep -E '^0 +localhost .*STRAGGLER' <<<"$output")" ]
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
}

@test "PyTorch DDP with uneven inputs (rank 1 runs out of data and waits in a barrier): the ranks named in different operations; on_hang: fail ends the job saying so" {
  "$PY" -c "import torch.distributed" 2>/dev/null || skip "needs PyTorch (Debian's python3-torch, or DDP_TEST_PYTHON's)"
  ddp_script
  printf 'diagnose: {hang_after: %ss, on_hang: fail}\nenv: {STEPS: "9", STEPS1: "8", END: barrier}\n' "$(torch_hang_after)" >>job.yaml
  run timeout 120 "$DDPRUN" job.yaml
  [ "$status" -eq 1 ]
  # barrier #1, steps #2-#9 on both; then rank 0's ninth step, rank 1's barrier, both #10
  assert_output --partial "the ranks are not in the same operation at #10 (a rank skipped a collective or ran more steps than the others)"
  assert_output --regexp $'\n''  rank 0 on localhost is in ddp_step #10 \(272 bytes\), entered [0-9]+ s ago; it is sleeping'
  assert_output --regexp $'\n''  rank 1 on localhost is in barrier #10 \(0 bytes\), entered [0-9]+ s ago; it is sleeping'
  assert_output --regexp 'File "[^"]*/ddp.py", line 21 in <module>'
  assert_output --regexp 'File "[^"]*/ddp.py", line 25 in <module>'
  assert_output --regexp "no rank made progress for [0-9]+ s: the ranks are in different operations at #10 \(barrier: rank 1; ddp_step: rank 0\); stopping the job"
}

@test "the PyTorch recorder changes nothing torch computes, leaves no finder behind, counts only whole-world groups; DDP_FLIGHT_RECORDER=0 leaves torch unwrapped" {
  "$PY" -c "import torch.distributed" 2>/dev/null || skip "needs PyTorch (Debian's python3-torch, or DDP_TEST_PYTHON's)"
  cat >rec.py <<'PY'
import mmap, os, struct, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
r, w = dist.get_rank(), dist.get_world_size()
print("finders left: %s" % [type(f).__name__ for f in sys.meta_path if "Ddprun" in type(f).__name__])
print("wrapped: %s" % (dist.all_reduce.__code__.co_name == "ddprun_flight_recorder"))
t = torch.arange(5, dtype=torch.float64) * (r + 1) / 3
dist.all_reduce(t)
ref = sum(torch.arange(5, dtype=torch.float64) * (k + 1) / 3 for k in range(w))
print("all_reduce exact: %s" % bool(torch.equal(t, ref)))
objs = [None] * w
dist.all_gather_object(objs, {"rank": r})
print("objects: %s" % objs)
sub = dist.new_group([0])
if r == 0:
    dist.all_reduce(torch.ones(3), group=sub)   # not every rank: not in the sequence
work = dist.all_reduce(torch.ones(1024), async_op=True)
work.wait()
try:
    dist.broadcast(torch.ones(2), src=w + 5)
except Exception as e:
    print("bad src: %s" % type(e).__name__)
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(torch.nn.Linear(4, 2))   # 10 floats of gradients
model(torch.ones(1, 4)).sum().backward()
with torch.no_grad():
    model(torch.ones(1, 4))
dist.barrier()
# the rank's progress page as the recorder wrote it (common/progress.h, the layout it was given)
L = getattr(sys.modules.get("_ddprun_torch"), "_L", None)
if L:
    fd = int(os.environ["DDPRUN_PROGRESS_FD"])
    m = mmap.mmap(fd, L["size"], prot=mmap.PROT_READ)
    u64 = lambda off: struct.unpack_from("<Q", m, off)[0]
    names = {v: k for k, v in L["ops"].items()}
    ents = []
    for s in range(1, u64(L["entered"]) + 1):
        e = L["ent"] + (s % L["ring"]) * L["esz"]
        assert u64(e) == s
        ents.append("%s:%d:%d" % (names[m[e + L["e_op"]]], u64(e + L["e_bytes"]),
                                  struct.unpack_from("<i", m, e + L["e_result"])[0]))
    print("page: rank %d world %d entered %d completed %d: %s" % (
        struct.unpack_from("<i", m, L["rank"])[0], struct.unpack_from("<i", m, L["world"])[0],
        u64(L["entered"]), u64(L["completed"]), " ".join(ents)))
PY
  printf 'command: [%s, rec.py]\nnproc_per_node: 2\nlogs: {dir: logs}\nelastic: {heartbeat_interval: 300ms}\n' "$PY" >job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "[localhost:0] finders left: []"
  assert_output --partial "[localhost:0] wrapped: True"
  assert_output --partial "[localhost:1] all_reduce exact: True"
  assert_output --partial "[localhost:0] objects: [{'rank': 0}, {'rank': 1}]"
  assert_output --partial "[localhost:1] bad src: RuntimeError"
  # one entry per call on every rank (all_gather_object's own all_gathers inside it), not the
  # subgroup's all_reduce; the broadcast that raised failed; a DDP step with its gradients'
  # bytes, a forward without gradients, each finished by the next entry
  for r in 0 1; do
    assert_output --partial "[localhost:$r] page: rank $r world 2 entered 7 completed 7: allreduce:40:0 allgather:0:0 allreduce:4096:0 broadcast:8:1 ddp_step:40:0 ddp_forward:40:0 barrier:0:0"
  done
  run "$DDPRUN" job.yaml --set 'env={DDP_FLIGHT_RECORDER: "0"}'
  assert_success
  assert_output --partial "[localhost:0] wrapped: False"
  assert_output --partial "[localhost:0] all_reduce exact: True"
}

@test "GPU: an NCCL collective and a DDP step on a GPU count as finished when the device has run them, not when their call returns" {
  ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) || ngpu=0
  [ "${ngpu:-0}" -ge 1 ] || skip "no CUDA device visible to this PyTorch"
  cat >gpu.py <<'PY'
import mmap, os, struct, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.cuda.set_device(0)
dist.init_process_group("nccl")
L = sys.modules["_ddprun_torch"]._L
m = mmap.mmap(int(os.environ["DDPRUN_PROGRESS_FD"]), L["size"], prot=mmap.PROT_READ)
u64 = lambda off: struct.unpack_from("<Q", m, off)[0]
entered = lambda: u64(L["entered"])
# entries entered and completed since n
since = lambda n: "%d %d" % (u64(L["entered"]) - n, u64(L["completed"]) - n)
def ran(n):   # the recorder's thread looks every 10 ms
    for _ in range(500):
        if u64(L["completed"]) >= n:
            return True
        time.sleep(0.01)
    return False
def gpu_busy():   # about a second of the GPU's clock before what is queued next
    torch.cuda._sleep(1 << 31)
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t)                      # NCCL's first
torch.cuda.synchronize()
print("warm: %s" % ran(entered()))
n = entered()
gpu_busy()
dist.all_reduce(t)                      # queued behind the sleep
print("queued: %s" % since(n))
torch.cuda.synchronize()
print("ran: %s %s" % (ran(n + 1), since(n)))
model = DDP(torch.nn.Linear(256, 256).cuda(), device_ids=[0])
x = torch.randn(8, 256, device="cuda")
for _ in range(2):   # DDP's second forward rebuilds its buckets, waiting for the device
    model(x).sum().backward()
torch.cuda.synchronize()
print("step warm: %s" % ran(entered()))
n = entered()
gpu_busy()
model(x).sum().backward()               # its backward and all-reduce behind the sleep
print("step queued: %s" % since(n))
torch.cuda.synchronize()
print("step ran: %s %s" % (ran(n + 1), since(n)))
n = entered()
gpu_busy()
w = dist.all_reduce(t, async_op=True)
print("async queued: %s" % since(n))
w.wait()
torch.cuda.synchronize()
print("async ran: %s %s" % (ran(n + 1), since(n)))
print("values: %s" % bool(torch.equal(t, torch.ones_like(t))))
dist.destroy_process_group()
PY
  printf 'command: [%s, gpu.py]\nnproc_per_node: 1\nlogs: {dir: logs}\n' "$PY" >job.yaml
  run timeout 120 "$DDPRUN" job.yaml
  echo "$output"
  assert_success
  assert_output --partial "warm: True"
  assert_output --partial "queued: 1 0"
  assert_output --partial "ran: True 1 1"
  assert_output --partial "step warm: True"
  assert_output --partial "step queued: 1 0"
  assert_output --partial "step ran: True 1 1"
  assert_output --partial "async queued: 1 0"
  assert_output --partial "async ran: True 1 1"
  assert_output --partial "values: True"
}
