#!/usr/bin/env bats
# Jobs that outlive the terminal (issue 19, part 1): ddprun --detach, attach, ps, logs, stop,
# with the built-in store. Each test has its own XDG_RUNTIME_DIR, so only its own jobs are seen.
load '../lib/common'

setup() {
  cd "$BATS_TEST_TMPDIR"
  export XDG_RUNTIME_DIR="$BATS_TEST_TMPDIR/run"
  mkdir -m 700 "$XDG_RUNTIME_DIR"
  cat >job.yaml <<'JOB'
command: for i in 1 2 3 4 5 6 7 8; do echo "rank $RANK line $i"; sleep 0.4; done; echo "rank $RANK done"
nproc_per_node: 2
logs: {dir: logs}
stop_grace: 2s
JOB
}

teardown() {
  [ -z "${theirs:-}" ] || rm -rf "$theirs"
  # nothing of any job is left: no supervisor, no rank
  local left
  for _ in $(seq 50); do
    left=$(pgrep -f "ddprun (--detach )?job.yaml|rank \\\$RANK" || true)
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  echo "left: $left"; ps -o pid,args -p "$(echo $left | tr ' ' ',')"; return 1
}

detach() { # job file -> the job id on stdout
  "$DDPRUN" --detach "$@" 2>detach.err
}

wait_gone() { # job id: its supervisor ends (5 s after its ranks at most)
  for _ in $(seq 150); do
    "$DDPRUN" ps | grep -q "^$1 " || return 0
    sleep 0.1
  done
  echo "job $1 still runs"; return 1
}

@test "--detach returns at once with the job id; the shell that ran it exits; attach shows the rest and the summary" {
  bash -c "'$DDPRUN' --detach job.yaml >id.txt 2>err.txt" # the launching shell exits
  id=$(cat id.txt)
  [[ "$id" == job-* ]]
  grep -q "ddprun: job $id runs detached (pid [0-9]*; logs in $PWD/logs/$id)" err.txt
  # it runs on, without a terminal: ps lists it as detached
  run "$DDPRUN" ps
  assert_output --regexp "$id +[0-9]+ +detached +[a-z ]+ +[0-9]/2 +1 +00:00:0[0-9] +$PWD/logs/$id"
  # attach once the ranks have printed their second lines (in console.log)
  for _ in $(seq 100); do "$DDPRUN" logs "$id" | grep -q "rank 0 line 2" && break; sleep 0.1; done
  run "$DDPRUN" attach "$id"
  assert_success
  assert_output --partial "ddprun: attached to job $id (running"
  # what came after attaching, tagged as on the console, then the summary
  assert_output --partial "[localhost:1] rank 1 done"
  assert_output --partial "[localhost:0] rank 0 line 8"
  refute_output --partial "rank 0 line 1"
  assert_output --regexp "job $id succeeded after [0-9.]+ s \(2 ranks on 1 node\)"
  assert_output --regexp "  1 +localhost +exit 0"
  wait_gone "$id"
  # the whole console was kept: logs shows it from the start
  run "$DDPRUN" logs "$id"
  assert_output --partial "[localhost:0] rank 0 line 1"
  assert_output --partial "succeeded after"
}

@test "attach exits with the job's status; SIGKILL of an attached ddprun leaves the job running; logs -f follows it to the end" {
  printf 'command: sleep 2; exit 3\nlogs: {dir: logs}\n' >fail.yaml
  id=$(detach fail.yaml)
  run "$DDPRUN" attach "$id"
  assert_failure 1
  assert_output --partial "rank 0 (localhost) exited with status 3"
  id=$(detach job.yaml)
  "$DDPRUN" attach "$id" >att.txt 2>&1 &
  att=$!
  for _ in $(seq 100); do grep -q "attached to job" att.txt && break; sleep 0.1; done
  kill -9 "$att"
  wait "$att" || true
  "$DDPRUN" ps | grep -q "^$id .* detached "
  run "$DDPRUN" logs "$id" -f
  assert_success
  assert_output --partial "[localhost:1] rank 1 done"
  assert_output --partial "job $id succeeded after"
  run "$DDPRUN" logs "$id" --rank 1
  assert_output --partial "rank 1 line 8"
  refute_output --partial "rank 0"
}

@test "a Ctrl-C in attach detaches; ddprun stop then stops the job as SIGINT does and waits for its end" {
  sed -i 's/for i in 1 2 3 4 5 6 7 8;/for i in $(seq 50);/' job.yaml
  id=$(detach job.yaml)
  "$DDPRUN" attach "$id" >att.txt 2>&1 &
  att=$!
  # the ranks started (not only the supervisor attached to): stop then has 2 to stop
  for _ in $(seq 100); do grep -q "attached to job" att.txt && grep -q "rank 0 line 1" att.txt && grep -q "rank 1 line 1" att.txt && break; sleep 0.1; done
  kill -INT "$att"
  wait "$att"
  grep -q "ddprun: detached from job $id; it runs on (ddprun stop $id ends it)" att.txt
  "$DDPRUN" ps | grep -q "^$id "
  run "$DDPRUN" stop "$id"
  assert_success
  assert_output --partial "the job has ended"
  ! "$DDPRUN" ps | grep -q "^$id " || false
  run "$DDPRUN" logs "$id"
  assert_output --partial "ddprun: ddprun stop: stopping 2 ranks (SIGINT"
  assert_output --regexp "job $id interrupted after"
  assert_output --regexp "  0 +localhost +stopped \(SIGINT\)"
}

@test "ps lists attached jobs too; logs --rank gives every restart's log in order" {
  cat >restart.yaml <<'JOB'
command: echo "rank $RANK round $TORCHELASTIC_RESTART_COUNT"; sleep 1; [ "$TORCHELASTIC_RESTART_COUNT" -gt 0 ] || exit 1
nproc_per_node: 2
elastic: {max_restarts: 1}
logs: {dir: logs}
JOB
  "$DDPRUN" restart.yaml >out.txt 2>&1 &
  pid=$!
  for _ in $(seq 100); do "$DDPRUN" ps | grep -q " $pid " && break; sleep 0.1; done
  run "$DDPRUN" ps
  assert_output --regexp "restart-[0-9-]+-[0-9a-f]{4} +$pid +attached "
  wait "$pid"
  id=$(ls logs | grep ^restart)
  run "$DDPRUN" logs "$id" --rank 1
  assert_success
  [ "${lines[0]}" = "rank 1 round 0" ]
  [ "${lines[1]}" = "rank 1 round 1" ]
  # a job that ran on a terminal kept no console.log: logs says where its logs are
  run "$DDPRUN" logs "$id"
  assert_failure 2
  assert_output --partial "ran on a terminal"
  run "$DDPRUN" logs "logs/$id" --rank 0
  assert_output --partial "rank 0 round 1"
  run "$DDPRUN" logs nosuchjob
  assert_failure 2
  assert_output --partial "logs: no job 'nosuchjob' of yours on this machine"
}

@test "a detached job that cannot start says why, with the status it would have had" {
  printf 'command: [true]\nrendezvous: {listen: 203.0.113.7}\nlogs: {dir: logs}\n' >bad.yaml
  run "$DDPRUN" --detach bad.yaml
  assert_failure 3
  assert_output --partial "cannot start the rendezvous store on '203.0.113.7:0'"
  run "$DDPRUN" ps
  [ "${#lines[@]}" -eq 1 ]
  run "$DDPRUN" --detach plan bad.yaml
  assert_failure 2
  assert_output --partial "plan: --detach is for running a job"
  run "$DDPRUN" plan bad.yaml --detach
  assert_failure 2
  assert_output --partial "unknown option '--detach'"
}

@test "another user can neither see, attach to nor stop the job" {
  [ "$(id -u)" -eq 0 ] || skip "needs root to act as another user"
  command -v setpriv >/dev/null || skip "setpriv (util-linux) is not installed"
  id=$(detach job.yaml)
  # The other user runs a copy of ddprun (and of any library of the build it loads) in a fresh
  # 0755 folder of its own: the build may lie in a folder they cannot enter (a clone under /root,
  # or in a mktemp -d folder), and no mode outside that folder changes.
  theirs=$(mktemp -d /tmp/ddprun-other-user.XXXXXX)
  chmod 755 "$theirs"
  cp "$DDPRUN" "$theirs/"
  ldd "$DDPRUN" | awk -v b="$BUILD" 'index($3, b) == 1 {print $3}' | xargs -r cp -t "$theirs"
  as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups env LD_LIBRARY_PATH="$theirs" "$@"; }
  as_nobody "$theirs/ddprun" --version >/dev/null # they can run it at all
  DDPRUN_THEIRS="$theirs/ddprun"
  # the owner's runtime folder is closed to them: they find no job of theirs
  run as_nobody env XDG_RUNTIME_DIR="$XDG_RUNTIME_DIR" "$DDPRUN_THEIRS" attach "$id"
  assert_failure 2
  assert_output --partial "no running job of yours on this machine"
  # with their own: no such job
  run as_nobody env -u XDG_RUNTIME_DIR "$DDPRUN_THEIRS" stop "$id"
  assert_failure 2
  assert_output --partial "no running job of yours on this machine"
  run as_nobody env -u XDG_RUNTIME_DIR "$DDPRUN_THEIRS" ps
  assert_success
  refute_output --partial "$id"
  # the socket itself is out of reach (Debian's python, which they can run)
  as_nobody /usr/bin/python3 -c pass
  run as_nobody /usr/bin/python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])" "$XDG_RUNTIME_DIR/ddprun/$id.sock"
  assert_failure
  assert_output --partial "Permission denied"
  "$DDPRUN" ps | grep -q "^$id "
  "$DDPRUN" stop "$id" >/dev/null 2>&1
}

@test "the newest 200 jobs' log folders are remembered for ddprun logs; an older job's says to pass its folder" {
  mkdir -p "$XDG_RUNTIME_DIR/ddprun"
  chmod 700 "$XDG_RUNTIME_DIR/ddprun"
  # 205 jobs of the past, the oldest first
  for i in $(seq 1 205); do
    f="$XDG_RUNTIME_DIR/ddprun/old-$(printf %03d "$i").logdir"
    echo "$PWD/gone/old-$i" >"$f"
    touch -d "@$((1700000000 + i))" "$f"
  done
  cat >quick.yaml <<'JOB'
command: echo done
logs: {dir: logs}
JOB
  "$DDPRUN" quick.yaml >out.txt 2>&1
  id=$(basename logs/*/)
  # this job and the 199 newest of the others
  [ "$(ls "$XDG_RUNTIME_DIR/ddprun/" | grep -c '\.logdir$')" -eq 200 ]
  [ -e "$XDG_RUNTIME_DIR/ddprun/$id.logdir" ]
  [ -e "$XDG_RUNTIME_DIR/ddprun/old-007.logdir" ]
  [ ! -e "$XDG_RUNTIME_DIR/ddprun/old-006.logdir" ]
  ! ls -a "$XDG_RUNTIME_DIR/ddprun/" | grep -q '\.tmp$' || false
  run "$DDPRUN" logs "$id" --rank 0
  assert_success
  assert_output "done"
  run "$DDPRUN" logs old-006
  assert_failure 2
  assert_output --partial "no job 'old-006' of yours on this machine (only the newest 200 jobs are remembered here: for an older one, pass its log folder, LOGS_DIR/JOB_ID)"
}
