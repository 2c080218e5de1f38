#!/usr/bin/env bats
# Elastic jobs: rendezvous rounds, restarts after a failed worker or a lost node, resume from
# the last complete checkpoint, and the summary when the job cannot go on. The node-loss tests
# run on the SSH test hosts of tests/lib/sshd.bash (a network namespace per node).
load '../lib/common'
load '../lib/sshd'
load '../lib/events'

FMNIST="$BUILD/ddprun-fmnist"

setup() {
  cd "$BATS_TEST_TMPDIR"
}

# No process of any job this test ran is left (ranks and what they started carry the job id).
no_job_left() {
  local d id e left
  for d in "$BATS_TEST_TMPDIR"/logs/*/; do
    [ -d "$d" ] || continue
    id=$(basename "$d")
    for _ in $(seq 50); do
      left=""
      for e in /proc/[0-9]*/environ; do
        if { tr '\0' '\n' <"$e"; } 2>/dev/null | grep -qx "DDPRUN_JOB_ID=$id"; then
          left="$left ${e//[^0-9]/}"
        fi
      done
      [ -z "$left" ] && break
      sleep 0.1
    done
    [ -z "$left" ] || { echo "left of job $id:"; ps -o pid,args -p "$(echo $left | tr ' ' ',')"; return 1; }
  done
}

teardown() {
  local rc=0
  # what a test stopped is continued, then killed, before anything is checked
  if [ -n "${STOPPED:-}" ]; then
    kill -CONT $STOPPED 2>/dev/null || true
    kill -9 $STOPPED 2>/dev/null || true
  fi
  no_job_left || rc=1
  [ -n "${SSH_DIR:-}" ] && sshd_teardown
  return $rc
}

need_sshd() {
  [ "$(id -u)" -eq 0 ] || skip "the sshd test hosts need root"
  [ -x /usr/sbin/sshd ] || fail "openssh-server is not installed (./dev.sh deps installs it)"
  sshd_setup
}

# Every pid of node K: its sshd and all it started (agents, ranks, what they started), and
# with namespaces whatever else runs in the node's namespace.
node_pids() { echo $(sshd_tree "$1") $(sshd_ns_pids "$1"); }

# Nothing of the job is left on node K (besides a running sshd).
nothing_of_job_on() {
  local sshd p left=""
  sshd=$(cat "$SSH_DIR/node$1/sshd.pid" 2>/dev/null || true)
  for _ in $(seq 150); do
    left=""
    for p in $(node_pids "$1"); do [ "$p" = "$sshd" ] || left="$left $p"; done
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  echo "left on node $1:"; ps -o pid,args -p "$(echo $left | tr ' ' ',')"
  return 1
}

# The pid of node K's process whose command line begins with $2 (ddprun agent, ddprun __guard).
node_proc() {
  local p
  for p in $(node_pids "$1"); do
    if tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q "^[^ ]*$2"; then echo "$p"; return; fi
  done
}

# The ranks of node K still there (they run `sh -c ... ranktag`).
node_ranks() {
  local p
  for p in $(node_pids "$1"); do
    if tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q "ranktag"; then echo "$p"; fi
  done
}

# A job of shell ranks on nodes $2...: each writes when it started (round, rank, node, time) to
# starts.txt, and starts a child that outlives it unless killed with it; SIGTERM is ignored
# (unless HUNG_TRAP is set, to another trap or to nothing), so only a SIGKILL (or the end of
# stop_grace, 30 s) ends them.
hung_job() { # file nodes... [-- extra YAML]
  local f=$1; shift
  local nodes=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do nodes+=("$1"); shift; done
  ssh_job "$f" 1 "${nodes[@]}" -- /bin/sh -c "${HUNG_TRAP-trap \"\" TERM;} echo \$TORCHELASTIC_RESTART_COUNT \$RANK \$(hostname -I) \$(date +%s.%N) >>$PWD/starts.txt; sleep 1000 & while :; do sleep 0.1; done # ranktag"
  sed -i 's/^stop_grace: .*/stop_grace: 30s/' "$f"
  [ "${1:-}" = -- ] && shift && printf '%s\n' "$@" >>"$f"
  return 0
}

# A 3-node job of the trainer, elastic between 2 and 3 nodes.
fmnist_job() { # file epochs extra-elastic-keys
  ssh_job "$1" 1 1 2 3 -- "$FMNIST" --epochs "$2" --hidden 64 --checkpoint-every 50 --eval-every 4
  cat >>"$1" <<JOB
checkpoint: {dir: $PWD/ckpt}
elastic: {min_nodes: 2, max_restarts: 3, heartbeat_interval: 500ms, heartbeat_timeout: 2s$3}
rendezvous: {last_call: 3s}
JOB
}

@test "a failed worker is restarted with TORCHELASTIC_RESTART_COUNT + 1 until max_restarts; then status 1 with the reason" {
  cat >job.yaml <<'JOB'
command: "echo attempt $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS; exit 3"
elastic: {max_restarts: 2}
logs: {dir: logs}
JOB
  run "$DDPRUN" job.yaml
  [ "$status" -eq 1 ]
  for a in 0 1 2; do assert_output --partial "[localhost:0] attempt $a of 2"; done
  refute_output --partial "attempt 3"
  assert_output --partial "stopping the other workers for restart 1 of 2"
  assert_output --partial "stopping the other workers for restart 2 of 2"
  assert_output --partial "rank 0 (localhost) exited with status 3; no restarts left (elastic.max_restarts is 2); stopping the job"
  assert_output --partial "the job cannot continue: rank 0 (localhost) exited with status 3, and the 2 restarts of elastic.max_restarts were used"
  [ "$(ev_field membership restart_count | tr '\n' ' ')" = "0 1 2 " ]
  grep -q '"restarts": 2' logs/*/summary.json
  grep -q '"reason": "rank 0 (localhost) exited with status 3, and the 2 restarts' logs/*/summary.json
}

@test "a worker that fails once is restarted and the job succeeds; a program that cannot start is not retried" {
  cat >job.yaml <<'JOB'
command: "[ $TORCHELASTIC_RESTART_COUNT -ge 1 ] || exit 4; echo second try"
nproc_per_node: 2
elastic: {max_restarts: 5}
logs: {dir: logs}
JOB
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "[localhost:1] second try"
  assert_output --partial "after 1 restart"
  cat >bad.yaml <<'JOB'
command: [/nonexistent/trainer]
elastic: {max_restarts: 5}
logs: {dir: badlogs}
JOB
  run "$DDPRUN" bad.yaml
  [ "$status" -eq 3 ]
  [ "$(grep -c '"event": "membership"' badlogs/*/events.jsonl)" -eq 1 ]
}

@test "a hung node (its agent and ranks stopped) is lost by its lease within heartbeat_timeout + interval; the job goes on" {
  # Three local "nodes" (localhost, 127.0.0.1, ::1): the lease path without SSH.
  cat >job.yaml <<JOB
command: [$FMNIST, --epochs, "3", --hidden, "64", --checkpoint-every, "50", --eval-every, "3"]
nodes: [{host: localhost}, {host: 127.0.0.1}, {host: "::1"}]
elastic: {min_nodes: 2, max_restarts: 2, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
checkpoint: {dir: $PWD/ckpt}
logs: {dir: logs}
stop_grace: 2s
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event resumed
  for _ in $(seq 100); do [ -e ckpt/fmnist.ckpt ] && break; sleep 0.1; done
  agent=$(pgrep -f '^ddprun agent' -P "$ddp" | tail -n1)
  t_stop=$(date +%s.%N)
  kill -STOP -- "-$agent"
  wait_for_line out.txt 60 "training resumed at step [1-9]"
  # Under TSan the remaining epochs would take half a minute: once training has resumed on
  # the other two nodes, that build's run is stopped (SIGINT, status 130); the others finish.
  want=0
  case "$BUILD" in */tsan) want=130 && kill -INT "$ddp" ;; esac
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq "$want" ] || { cat out.txt; return 1; }
  grep -q "node '::1' lost: no heartbeat for 2.0 s" out.txt
  t_lost=$(unix_of "$(events | grep '"event": "node_lost"' | grep -o '"time": "[^"]*' | cut -d'"' -f4)")
  # lost within the timeout (2 s) plus one interval of the stop; never before it
  awk -v a="$t_stop" -v b="$t_lost" 'BEGIN { d = b - a; print "detected after " d " s"; exit !(d > 1.4 && d <= 2.5) }'
  [ "$(ev_field membership restart_count | tr '\n' ' ')" = "0 1 " ]
  grep -q "training resumed at step [1-9]" out.txt
  ! pgrep -g "$agent" || false
}

@test "3 SSH nodes, min 2: a node SIGKILLed mid-training; the job finishes on 2 nodes, as accurate as without the failure" {
  trains
  need_sshd
  for k in 1 2 3; do sshd_start "$k"; done
  # the reference: the same job without a failure
  fmnist_job job.yaml 4 ", cooldown: 60s"
  "$DDPRUN" job.yaml >ref.txt 2>&1 || { cat ref.txt; return 1; }
  ref=$(final_acc ref.txt)
  rm -rf ckpt logs
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event resumed
  for _ in $(seq 200); do [ -e ckpt/fmnist.ckpt ] && break; sleep 0.1; done
  [ -e ckpt/fmnist.ckpt ]
  t_kill=$(date +%s.%N)
  kill -9 $(node_pids 3)
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 0 ] || { cat out.txt; return 1; }
  # (the agent, killed after its sshd, may first read EOF, stop and revoke its lease: before
  # 2026-11-28 that was reported as "no heartbeat" at once, in 2 of 24 CI runs and 1 in 4 here
  # beside two busy loops; now its process's end says why: "an agent that leaves on its own")
  grep -q "node '$(sshd_addr 3)' lost: the SSH connection to it ended" out.txt || { cat out.txt; return 1; }
  t_lost=$(unix_of "$(events | grep '"event": "node_lost"' | head -n1 | grep -o '"time": "[^"]*' | cut -d'"' -f4)")
  awk -v a="$t_kill" -v b="$t_lost" 'BEGIN { d = b - a; print "detected after " d " s"; exit !(d >= 0 && d <= 2.5) }'
  # the next round went on with the other two at once, training again within
  # heartbeat_timeout + 2 s of the kill
  t_resumed=$(unix_of "$(events | grep '"event": "resumed"' | tail -n1 | grep -o '"time": "[^"]*' | cut -d'"' -f4)")
  awk -v a="$t_kill" -v b="$t_resumed" 'BEGIN { d = b - a; print "training again after " d " s"; exit !(d <= 4) }'
  [ "$(ev_field membership nodes | tail -n1)" = "$(sshd_addr 1), $(sshd_addr 2)" ]
  [ "$(ev_field membership world_size | tail -n1)" = 2 ]
  grep -q "\[$(sshd_addr 1):0\] resuming from $PWD/ckpt/fmnist.ckpt at step [1-9]" out.txt
  grep -q "\[$(sshd_addr 1):0\] epoch 4/4 step 3748 " out.txt
  # The two runs see the same data in the same order and differ only in rounding (3 ranks,
  # then 2, from the checkpoint on): such runs end within 0.4 points of each other (1 to 6
  # simulated ranks, 4 epochs), and even 8 other seeds stay within 1.2; a run that lost its
  # progress or resumed wrong parameters would not.
  acc=$(final_acc out.txt)
  echo "accuracy: $acc with the failure, $ref without"
  awk -v a="$acc" -v r="$ref" 'BEGIN { d = a - r; exit !(d < 1.5 && d > -1.5) }'
  for k in 1 2; do nothing_of_job_on "$k"; done
}

@test "a node cut off the network is lost by its lease, fences itself, and rejoins at the next round once back" {
  trains
  need_sshd
  for k in 1 2 3; do sshd_start "$k"; done
  # without namespaces the node is stopped instead of cut off, and an SSH attempt to its stopped
  # sshd waits out libssh's 10 s connect timeout: train longer so the retry after it still counts
  epochs=10; [ -n "$SSHD_NETNS" ] || epochs=24
  fmnist_job job.yaml "$epochs" ", cooldown: 1s"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event resumed
  for _ in $(seq 200); do [ -e ckpt/fmnist.ckpt ] && break; sleep 0.1; done
  sshd3=$(cat "$SSH_DIR/node3/sshd.pid")
  old=$(for p in $(node_pids 3); do [ "$p" = "$sshd3" ] || echo "$p"; done) # its agent and rank
  [ -n "$old" ]
  t_cut=$(date +%s.%N)
  if [ -n "$SSHD_NETNS" ]; then
    ip link set "vd$SSHD_TAG-3" down
  else
    kill -STOP $(node_pids 3)   # no namespaces: a hung node instead
  fi
  wait_event membership 2
  t_lost=$(unix_of "$(events | grep '"event": "node_lost"' | head -n1 | grep -o '"time": "[^"]*' | cut -d'"' -f4)")
  awk -v a="$t_cut" -v b="$t_lost" 'BEGIN { d = b - a; print "detected after " d " s"; exit !(d > 1.4 && d <= 2.5) }'
  grep -q "node '$(sshd_addr 3)' lost: no heartbeat for 2.0 s" out.txt
  [ "$(ev_field membership nodes | tail -n1)" = "$(sshd_addr 1), $(sshd_addr 2)" ]
  # back on the network: its agent found its lease gone and stopped its rank on its own (a new
  # agent may be there already: the launcher tries lost nodes again)
  if [ -n "$SSHD_NETNS" ]; then ip link set "vd$SSHD_TAG-3" up; else kill -CONT $(node_pids 3); fi
  for _ in $(seq 150); do
    left=$(for p in $old; do if kill -0 "$p" 2>/dev/null; then echo "$p"; fi; done)
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || { echo "still on node 3:"; ps -o pid,args -p "$(echo $left | tr ' ' ',')"; return 1; }
  wait_event resumed 2
  # tried again while the job runs, it joins as a spare
  for _ in $(seq 300); do
    events | grep '"event": "node_joined"' | grep -q "\"node\": \"$(sshd_addr 3)\", \"incarnation\": [2-9]" && break
    sleep 0.1
  done
  events | grep '"event": "node_joined"' | grep -q "\"node\": \"$(sshd_addr 3)\", \"incarnation\": [2-9]"
  # the next failure (a rank on node 2 killed) opens a round that node 3 joins again
  victim=$(for p in $(node_pids 2); do
    tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q '^[^ ]*ddprun-fmnist' && echo "$p"
  done | head -n1)
  [ -n "$victim" ] || { echo "no rank on node 2 (the job ended too soon?)"; cat out.txt; return 1; }
  kill -9 "$victim"
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 0 ] || { cat out.txt; return 1; }
  [ "$(ev_field membership nodes | tail -n1)" = "$(sshd_addr 1), $(sshd_addr 2), $(sshd_addr 3)" ]
  [ "$(ev_field membership world_size | tr '\n' ' ')" = "3 2 3 " ]
  grep -q "epoch $epochs/$epochs step $((937 * epochs)) " out.txt || { cat out.txt; return 1; }
  for k in 1 2 3; do nothing_of_job_on "$k"; done
}

@test "below min_nodes: status 75 (worth requeueing), and the summary says which node was lost, when and why" {
  need_sshd
  for k in 1 2; do sshd_start "$k"; done
  ssh_job job.yaml 1 1 2 -- /bin/sh -c 'while :; do sleep 0.2; done' elastic-min
  cat >>job.yaml <<JOB
elastic: {min_nodes: 2, max_restarts: 3, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event workers_running
  kill -9 $(node_pids 2)
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 75 ] || { cat out.txt; return 1; }
  grep -q "the job cannot continue: only 1 node can take part, and elastic.min_nodes is 2" out.txt
  # lost, then unreachable at once: a node that keeps failing is left out for elastic.cooldown
  grep -q "node '$(sshd_addr 2)' failed twice within 60 s; leaving it out of rounds for 60 s" out.txt
  [ "$(ev_field node_cooldown node)" = "$(sshd_addr 2)" ] || { events; return 1; }
  grep -q "nodes lost:" out.txt
  # round 0's loss: the SSH connection's end (the agent, which revokes its lease as it exits on
  # losing that connection, may be seen leaving first: its process's end still says why)
  grep -Eq "^    '$(sshd_addr 2)' at 20[0-9-]+T[0-9:.]+Z \(\+[0-9.]+ s, round 0\): the SSH connection to it ended" out.txt ||
    { cat out.txt; return 1; }
  grep -Eq "^    '$(sshd_addr 2)' at .* \(\+[0-9.]+ s, round 1\): could not be provisioned" out.txt
  grep -q '"lost_nodes": \[' logs/*/summary.json
  grep -q '"reason": "only 1 node can take part' logs/*/summary.json
  ! pgrep -f elastic-min || false
  nothing_of_job_on 1
}

@test "an agent that leaves on its own (its SSH session killed) revokes its lease: the node is lost by its connection's end, or by the lease's timeout if its process outlives it" {
  need_sshd
  for k in 1 2 3; do sshd_start "$k"; done
  ssh_job job.yaml 1 1 2 3 -- /bin/sh -c 'while :; do sleep 0.2; done' elastic-left
  cat >>job.yaml <<JOB
elastic: {min_nodes: 1, max_restarts: 1, heartbeat_interval: 500ms, heartbeat_timeout: 4s}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event workers_running
  # Nodes 2 and 3: the launcher's SSH bridge stopped (it cannot say the connection ended),
  # then the node's sshd killed: the agent reads EOF, stops its rank, revokes its lease, exits.
  local k p sessions="" others="" bridge2 bridge3
  bridge2=$(pgrep -P "$ddp" -f "__ssh-bridge $(sshd_addr 2) ")
  bridge3=$(pgrep -P "$ddp" -f "__ssh-bridge $(sshd_addr 3) ")
  kill -STOP "$bridge2" "$bridge3"
  for k in 2 3; do
    for p in $(sshd_tree "$k"); do
      if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = sshd ]; then sessions="$sessions $p"; else others="$others $p"; fi
    done
  done
  [ -n "$others" ] || { ps -ef; return 1; }
  kill -9 $sessions
  for _ in $(seq 100); do kill -0 $others 2>/dev/null || break; sleep 0.1; done
  if kill -0 $others 2>/dev/null; then ps -o pid,args -p "$(echo $others | tr ' ' ',')"; return 1; fi
  # gone, leases revoked: nothing says either node is lost while their bridges cannot speak
  sleep 0.5
  if grep -q "lost" out.txt; then cat out.txt; return 1; fi
  # node 2's bridge resumes: it finds its connection ended, and that is the reason
  kill -CONT "$bridge2"
  wait_for_line out.txt 10 "node '$(sshd_addr 2)' lost: the SSH connection to it ended"
  # node 3's stays stopped: its process outlived the revoked lease's timeout
  wait_for_line out.txt 10 "node '$(sshd_addr 3)' lost: its agent left the job (it revoked its lease) but its process did not end within 4.0 s (elastic.heartbeat_timeout)"
  if grep -q "no heartbeat" out.txt; then cat out.txt; return 1; fi
  wait_for_line out.txt 20 "round 1: 1 node ($(sshd_addr 1)), 1 rank"
  kill -INT "$ddp"
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 130 ] || { cat out.txt; return 1; }
  ! kill -0 "$bridge3" 2>/dev/null || false
  nothing_of_job_on 1
}

@test "a checkpoint interrupted mid-write never becomes the resume point" {
  # rank 0 dies in the middle of writing step 150's checkpoint (first attempt only)
  cat >job.yaml <<JOB
command: '[ "\$TORCHELASTIC_RESTART_COUNT" = 0 ] && export FMNIST_CRASH_AT_STEP=150; exec $FMNIST --max-steps 300 --hidden 64 --checkpoint-every 50 --eval-every 0 --dump final.bin'
nproc_per_node: 2
elastic: {max_restarts: 1}
checkpoint: {dir: $PWD/ckpt}
logs: {dir: logs}
JOB
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "rank 0 (localhost) exited with status 9"
  assert_output --partial "resuming from $PWD/ckpt/fmnist.ckpt at step 100 "
  [ "$(ev_field resumed step | tr '\n' ' ')" = "0 100 " ]
  # and the result is the uninterrupted 2-rank run's, bit for bit: the reference does the same
  # arithmetic in the same order (a 1-process run would part from it by rounding)
  run "$FMNIST" --simulate-ranks 2 --max-steps 300 --hidden 64 --eval-every 0 --compare final.bin --tol 0
  assert_success
  assert_output --partial "compare: max |difference| from final.bin = 0 (tolerance 0)"
}

@test "a node listed beyond max_nodes is a spare: it takes a lost node's place at the next round" {
  cat >job.yaml <<'JOB'
command: "echo up on $DDPRUN_NODE world $WORLD_SIZE; sleep 4"
nodes: [{host: localhost}, {host: 127.0.0.1}, {host: "::1"}]
elastic: {min_nodes: 1, max_nodes: 2, max_restarts: 1, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
logs: {dir: logs}
stop_grace: 2s
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event workers_running
  # the first two to join are the members; the third waits as a spare
  members=$(ev_field membership nodes)
  [ "$(echo "$members" | tr ',' '\n' | wc -l)" -eq 2 ]
  victim=$(echo "$members" | cut -d, -f2 | tr -d ' ')
  spare=""
  for h in localhost 127.0.0.1 ::1; do [[ ", $members," == *", $h,"* ]] || spare=$h; done
  [ -n "$spare" ]
  # the agent of the second member (the parent of the rank that runs there) dies
  agent=$(local_agent_of "$victim")
  [ -n "$agent" ]
  kill -9 "$agent"
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 0 ] || { cat out.txt; return 1; }
  grep -q "node '$victim' lost: its agent died (signal 9)" out.txt
  # the spare, already joined, is in the next round: no waiting for the lost node
  ev_field membership nodes | tail -n1 | grep -q "$spare"
  ! ev_field membership nodes | tail -n1 | grep -q "$victim" || false
  grep -q "up on $spare world 2" out.txt
}

@test "a hung agent (SIGSTOP) on an SSH host: ddprun ends it with its ranks and their children there before it exits" {
  need_sshd
  for k in 1 2; do sshd_start "$k"; done
  # node 1's rank stops at once (SIGTERM), so ddprun exits right after the loss
  HUNG_TRAP="" hung_job job.yaml 1 2 -- "elastic: {heartbeat_interval: 500ms, heartbeat_timeout: 2s}"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event workers_running
  for _ in $(seq 50); do [ "$(node_ranks 2 | wc -w)" -ge 1 ] && break; sleep 0.1; done
  agent=$(node_proc 2 'ddprun agent')
  [ -n "$agent" ]
  STOPPED=$agent
  kill -STOP "$agent"
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 1 ] || { cat out.txt; return 1; }
  grep -q "node '$(sshd_addr 2)' lost: no heartbeat for 2.0 s" out.txt
  # once ddprun has exited, nothing of the job is on the node: the stopped agent, its guard, the
  # rank and the rank's child were ended through the SSH session
  left=""
  for p in $(node_pids 2); do [ "$p" = "$(cat "$SSH_DIR/node2/sshd.pid")" ] || left="$left $p"; done
  [ -z "$left" ] || { echo "left on node 2:"; ps -o pid,stat,args -p "$(echo $left | tr ' ' ',')"; cat out.txt; return 1; }
  nothing_of_job_on 1
  # the lost node's rank ran until the loss (its lease's 2 s, less one heartbeat at most), not 0 s
  /usr/bin/python3 -c '
import glob, json
s = json.load(open(glob.glob("logs/*/summary.json")[0]))
lost = [r for r in s["ranks"] if r["state"] == "lost"]
assert len(lost) == 1 and lost[0]["runtime_s"] >= 1.0, s["ranks"]'
}

@test "a hung agent cut off the network: its guard ends it with its ranks within heartbeat_timeout + 1 s; the next round starts only after" {
  need_sshd
  [ -n "$SSHD_NETNS" ] || skip "cutting a link needs the network namespaces"
  for k in 1 2 3; do sshd_start "$k"; done
  # the other nodes' ranks stop at once (SIGTERM): the next round waits for node 3 alone
  HUNG_TRAP="" hung_job job.yaml 1 2 3 -- "elastic: {min_nodes: 2, max_restarts: 1, heartbeat_interval: 500ms, heartbeat_timeout: 2s}"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event workers_running
  for _ in $(seq 50); do [ "$(wc -l <starts.txt)" -ge 3 ] && break; sleep 0.1; done
  agent=$(node_proc 3 'ddprun agent')
  old=$(for p in $(node_pids 3); do
    tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q '^sshd' || echo "$p"
  done | tr '\n' ' ')
  [ -n "$agent" ] && [ "$(echo $old | wc -w)" -ge 4 ] # agent, guard, rank, its sleeps
  STOPPED=$agent
  t_cut=$(date +%s.%N)
  ip link set "vd$SSHD_TAG-3" down
  kill -STOP "$agent"
  # the old processes' end, seen every 50 ms: the last time one was still there
  t_seen=$t_cut
  for _ in $(seq 200); do
    alive=$(for p in $old; do if kill -0 "$p" 2>/dev/null && [ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" != Z ]; then echo "$p"; fi; done)
    [ -z "$alive" ] && break
    t_seen=$(date +%s.%N)
    sleep 0.05
  done
  [ -z "$alive" ] || { echo "still on node 3 after 10 s:"; ps -o pid,stat,args -p "$(echo $alive | tr ' ' ',')"; return 1; }
  # the guard acts heartbeat_timeout + 1 s after the last renewal (at most one interval before
  # the cut), never before the lease expired
  awk -v a="$t_cut" -v b="$t_seen" 'BEGIN { d = b - a; print "node 3 ended after " d " s"; exit !(d > 1.4 && d <= 4.5) }'
  wait_event membership 2
  kill -INT "$ddp"; sleep 0.3; kill -INT "$ddp" # a second signal: no stop_grace
  rc=0; wait "$ddp" || rc=$?
  grep -q "node '$(sshd_addr 3)' lost: no heartbeat for 2.0 s" out.txt || { cat out.txt; return 1; }
  # round 1's first rank started after every old process of node 3 had ended
  first=$(awk '$1 == 1 {print $NF}' starts.txt | sort -n | head -n1)
  [ -n "$first" ] || { cat starts.txt out.txt; return 1; }
  awk -v a="$t_seen" -v b="$first" 'BEGIN { print "round 1 began " b - a " s after node 3 was last seen"; exit !(b > a) }'
  ip link set "vd$SSHD_TAG-3" up
}

@test "an agent that resumes after its node was declared lost kills its ranks at once" {
  need_sshd
  [ -n "$SSHD_NETNS" ] || skip "cutting a link needs the network namespaces"
  for k in 1 2; do sshd_start "$k"; done
  hung_job job.yaml 1 2 -- "elastic: {min_nodes: 1, max_restarts: 1, heartbeat_interval: 500ms, heartbeat_timeout: 2s}"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event workers_running
  for _ in $(seq 50); do [ "$(node_ranks 2 | wc -w)" -ge 1 ] && break; sleep 0.1; done
  agent=$(node_proc 2 'ddprun agent')
  guard=$(node_proc 2 'ddprun __guard')
  [ -n "$agent" ] && [ -n "$guard" ]
  # the node cut off, its agent and its guard stopped: only the agent can act once resumed
  STOPPED="$agent $guard"
  ip link set "vd$SSHD_TAG-2" down
  kill -STOP "$agent" "$guard"
  wait_event node_lost 1 20
  sleep 1.5 # past the guard's time: nothing has ended the ranks
  ranks=$(node_ranks 2)
  [ -n "$ranks" ]
  kill -CONT "$agent"
  # within a heartbeat interval and the noise of a busy machine; they ignore SIGTERM, and
  # stop_grace is 30 s
  for _ in $(seq 20); do
    alive=$(for p in $ranks; do if kill -0 "$p" 2>/dev/null && [ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" != Z ]; then echo "$p"; fi; done)
    [ -z "$alive" ] && break
    sleep 0.1
  done
  [ -z "$alive" ] || { echo "the resumed agent left its ranks:"; ps -o pid,stat,args -p "$(echo $alive | tr ' ' ',')"; return 1; }
  kill -INT "$ddp"; sleep 0.3; kill -INT "$ddp" # a second signal: no stop_grace
  wait "$ddp" || true
  ip link set "vd$SSHD_TAG-2" up
}

@test "two nodes lost a moment apart cost one restart: a round lost before its ranks started is not counted" {
  need_sshd
  [ -n "$SSHD_NETNS" ] || skip "delaying a link needs the network namespaces"
  for k in 1 2 3; do sshd_start "$k"; done
  # round 2 succeeds; before it, ranks run until stopped
  ssh_job job.yaml 1 1 2 3 -- /bin/sh -c 'if [ "$TORCHELASTIC_RESTART_COUNT" -ge 2 ]; then echo "round $TORCHELASTIC_RESTART_COUNT done"; exit 0; fi; while :; do sleep 0.1; done'
  printf 'elastic: {min_nodes: 1, max_restarts: 1, heartbeat_interval: 500ms, heartbeat_timeout: 2s}\n' >>job.yaml
  # a START of 480 KB (the ranks' environment)
  big=$(head -c 120000 /dev/zero | tr '\0' x)
  printf 'env: {B1: "%s", B2: "%s", B3: "%s", B4: "%s"}\n' "$big" "$big" "$big" "$big" >>job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event workers_running
  # node 2's link at 64 KB/s (256 KB at once): round 1's START takes seconds to get there, what
  # else goes either way (frames, heartbeats) a moment
  sshd_limit 2 512kbit
  # node 3 dies; once round 1 began (with node 2), node 2 dies too, before its START arrived
  kill -9 $(node_pids 3)
  for _ in $(seq 200); do grep -q "round 1: " out.txt && break; sleep 0.02; done
  kill -9 $(node_pids 2)
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 0 ] || { cat out.txt; return 1; }
  grep -q "round 1: 2 nodes ($(sshd_addr 1), $(sshd_addr 2)), 2 ranks" out.txt || { cat out.txt; return 1; }
  grep -q "node '$(sshd_addr 2)' lost: " out.txt
  grep -q "round 1 lost a node before all its ranks had started: its restart is not counted against elastic.max_restarts" out.txt
  grep -q "round 2 done" out.txt
  [ "$(ev_field membership restart_count | tr '\n' ' ')" = "0 1 2 " ]
}

@test "a node cut off from a launcher that still runs (its SSH session killed, its agent alive) kills its ranks at once, not after stop_grace" {
  need_sshd
  for k in 1 2; do sshd_start "$k"; done
  # ranks that ignore SIGTERM, stop_grace 30 s: only a SIGKILL ends them soon
  hung_job job.yaml 1 2 -- "elastic: {min_nodes: 1, max_restarts: 1, heartbeat_interval: 500ms, heartbeat_timeout: 2s}"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event workers_running
  for _ in $(seq 50); do [ -n "$(node_ranks 2)" ] && break; sleep 0.1; done
  ranks=$(node_ranks 2)
  [ -n "$ranks" ]
  # node 2's SSH session (the listener's children), not its agent
  kill -9 $(pgrep -P "$(cat "$SSH_DIR/node2/sshd.pid")")
  for _ in $(seq 30); do
    alive=$(for p in $ranks; do if kill -0 "$p" 2>/dev/null && [ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" != Z ]; then echo "$p"; fi; done)
    [ -z "$alive" ] && break
    sleep 0.1
  done
  lost=0
  [ -n "$alive" ] || wait_for_line out.txt 20 "node '$(sshd_addr 2)' lost: the SSH connection to it ended" || lost=1
  kill -INT "$ddp"; sleep 0.3; kill -INT "$ddp" # a second signal: no stop_grace
  wait "$ddp" || true
  [ -z "$alive" ] || { echo "node 2's ranks outlived its loss:"; ps -o pid,stat,args -p "$(echo $alive | tr ' ' ',')"; cat out.txt; return 1; }
  # (the bridge's exit, which tells the launcher, may come after the ranks' end: an ASan
  # build's exit checks for leaks first)
  [ "$lost" -eq 0 ] || { cat out.txt; return 1; }
}

@test "launcher: external: agents started by hand on 3 namespace hosts join in arrival order; one killed, the job goes on with the others; a 4th finds no slot" {
  [ "$(id -u)" -eq 0 ] || skip "the test hosts need root"
  SSH_DIR="$BATS_TEST_TMPDIR/ssh" # (for the teardown's sshd_teardown: no sshd runs)
  netns_setup
  [ -n "$SSHD_NETNS" ] || skip "needs network namespaces"
  for k in 1 2 3 4; do sshd_make_ns "$k"; done
  openssl rand -hex 32 >tok
  chmod 600 tok
  port=$((20000 + RANDOM % 20000))
  cat >job.yaml <<JOB
command: [/bin/sh, -c, 'echo "rank \$RANK of \$WORLD_SIZE on \$(hostname)"; until [ -e $PWD/go ]; do sleep 0.1; done', elastic-ext]
launcher: external
nodes: 3
nproc_per_node: 1
rendezvous: {listen: 10.213.$SSHD_TAG.1, port: $port, token_file: tok}
elastic: {min_nodes: 2, max_restarts: 3, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
logs: {dir: logs}
JOB
  run "$DDPRUN" plan job.yaml
  assert_success
  assert_line "launcher: external   # each node runs: ddprun agent --join 10.213.$SSHD_TAG.1:$port --token-file $PWD/tok"
  refute_output --partial "$(cat tok)"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  STOPPED=$ddp # (killed by the teardown should the test fail)
  # node K's agent, as a site's script would start it: its own host name, nothing from ddprun
  agent() {
    ip netns exec "$(sshd_ns "$1")" unshare --uts /bin/sh -c \
      "hostname node$1 && exec '$DDPRUN' agent --join 10.213.$SSHD_TAG.1:$port --token-file '$PWD/tok'" \
      </dev/null >"agent$1.log" 2>&1 &
    eval "agent$1=\$!"
  }
  for _ in $(seq 100); do [ -e logs ] && break; sleep 0.05; done
  agent 1
  wait_event node_joined
  agent 2
  wait_event workers_running
  [ "$(ev_field membership nodes | head -1)" = "node1, node2" ] || { events; return 1; }
  agent 3
  wait_event node_joined 3
  # an agent with another token is refused by the job's store at once, and says so
  openssl rand -hex 32 >other
  chmod 600 other
  run timeout 20 ip netns exec "$(sshd_ns 4)" "$DDPRUN" agent --join "10.213.$SSHD_TAG.1:$port" --token-file other
  assert_failure 3
  assert_output --partial "ddprun agent: cannot join the job at 10.213.$SSHD_TAG.1:$port: authentication failed (is ddprun running there with launcher: external, and is this its token file?)"
  # every slot is held: a 4th agent is refused, and says the launcher ended its link
  agent 4
  rc=0; wait "$agent4" || rc=$?
  [ "$rc" -eq 3 ] || { cat agent4.log; return 1; }
  grep -q "agent port: refusing a connection from 10.213.$SSHD_TAG.5:[0-9]*: an agent started elsewhere (node4), and every slot of the job is taken (nodes: 3)" out.txt ||
    { cat out.txt; return 1; }
  # node 2's agent killed outright: its node is lost, and the job goes on without it
  kill -9 "$agent2"
  wait_event node_lost
  [ "$(ev_field node_lost node)" = node2 ] || { events; return 1; }
  for _ in $(seq 100); do [ "$(ev_field membership nodes | tail -1)" = "node1, node3" ] && break; sleep 0.1; done
  [ "$(ev_field membership nodes | tail -1)" = "node1, node3" ] || { events; return 1; }
  wait_event workers_running 2
  touch go
  rc=0; wait "$ddp" || rc=$?
  cat out.txt
  [ "$rc" -eq 0 ]
  grep -q "^\[node1:0\] rank 0 of 2 on node1$" out.txt
  grep -q "^\[node3:1\] rank 1 of 2 on node3$" out.txt
  # the agents end with the job; nothing of it is left
  for k in 1 3; do eval "wait \$agent$k"; done
  ! pgrep -f elastic-ext || false
}
