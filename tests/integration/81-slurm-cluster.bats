#!/usr/bin/env bats
# Slurm (issue 18): ddprun inside salloc and sbatch on a real Slurm of Debian's slurm-wlm
# (tests/lib/slurm.bash: slurmctld here, one slurmd per network-namespace test host). Agents
# start as srun steps; ranks see the torchrun environment, not the agent step's SLURM_*; node
# loss, scancel and SIGINT end in the documented statuses with nothing left running.
load '../lib/common'
load '../lib/sshd'
load '../lib/slurm'

setup() {
  cd "$BATS_TEST_TMPDIR"
  # (the spare's test needs a 4th node)
  case "$BATS_TEST_DESCRIPTION" in *spare*) slurm_setup 4 ;; *) slurm_setup 3 ;; esac
  export PATH="$BUILD:$PATH" # ddprun and ddprun-fmnist, as an installed ddprun would be
}

# The tests that train the model check Slurm's side (steps, node loss), not memory safety: the
# sanitizer builds run the others (the same launcher code, minus minutes of instrumented training).
teardown() {
  local rc=0
  # what a test stopped is continued, then killed, before anything is checked
  if [ -n "${STOPPED:-}" ]; then
    kill -CONT $STOPPED 2>/dev/null || true
    kill -9 $STOPPED 2>/dev/null || true
  fi
  [ -n "${SLURM_DIR:-}" ] && { only_slurmd_left || rc=1; }
  slurm_teardown
  return $rc
}

# Nothing of any job is left on the nodes: in each namespace only its slurmd (give what a
# cancelled step leaves 10 s to go: KillWait is 2 s).
only_slurmd_left() {
  local k p left
  for k in $(seq "$SLURM_NODES"); do
    for _ in $(seq 100); do
      left=""
      for p in $(ip netns pids "$(sshd_ns "$k")" 2>/dev/null); do
        [ "$p" = "$(cat "$SLURM_DIR/slurmd-n$k.pid" 2>/dev/null)" ] || left="$left,$p"
      done
      [ -z "$left" ] && break
      sleep 0.1
    done
    [ -z "$left" ] || { echo "left on n$k:"; ps -o pid,args -p "${left#,}"; return 1; }
  done
  ! pgrep -f "srun .*ddprun-agent" || { echo "an srun is left"; return 1; }
}

# What each rank prints of its environment, then the store smoke worker.
env_job() {
  cat >"$1" <<'JOB'
command: >-
  echo "rank $RANK local $LOCAL_RANK of $WORLD_SIZE on $(hostname) node $GROUP_RANK
  job ${SLURM_JOB_ID:-none} procid ${SLURM_PROCID:-none} localid ${SLURM_LOCALID:-none}
  ntasks ${SLURM_NTASKS:-none} agent-step $(tr '\0' '\n' </proc/$PPID/environ | sed -n 's/^SLURM_STEP_ID=//p')"
  && exec ddprun __smoke-worker
logs: {dir: logs}
stop_grace: 2s
JOB
}

@test "inside salloc: 3 nodes x 2 ranks, one srun step for the three agents, ranks on their nodes with the torchrun environment" {
  env_job job.yaml
  run slurm_login salloc -N3 --ntasks-per-node=2 --quiet ddprun job.yaml
  [ "$status" -eq 0 ] || { echo "$output"; tail -n 20 "$SLURM_DIR"/*.log; return 1; }
  assert_output --partial "6 ranks met at the store"
  jobid=$(grep -o 'job [0-9]* procid' <<<"$output" | head -n1 | cut -d' ' -f2)
  [ -n "$jobid" ]
  for r in 0 1 2 3 4 5; do
    k=$((r / 2 + 1))
    # on its own node (host name n$k), its rank and node rank; the allocation's job id; not
    # the SLURM_PROCID/LOCALID/NTASKS of its agent's step, which is a Slurm step of its own
    assert_output --regexp "\[n$k:$r\] rank $r local $((r % 2)) of 6 on n$k node $((k - 1)) job $jobid procid none localid none ntasks none agent-step [0-9]+"
  done
  assert_output --regexp "  5 +n3 +exit 0"
  # the three agents were one step (Slurm's tree launch), not a step each
  [ "$(grep -o 'agent-step [0-9]*' <<<"$output" | sort -u | wc -l)" -eq 1 ]
  # the ranks really ran in the nodes' namespaces: they met at addresses of the test network
  assert_output --regexp "rank 4 on n3"
  grep -q "launcher: srun" <(slurm_login salloc -N3 --quiet ddprun plan job.yaml)
}

@test "sbatch: the example batch script trains Fashion-MNIST on 3 nodes x 2 ranks to 85%" {
  trains
  mkdir -p examples && cp -r "$REPO/examples/slurm" examples/
  run slurm_login sbatch --wait --quiet "$REPO/examples/slurm/fmnist.sbatch"
  out=$(ls fmnist-*.out)
  [ "$status" -eq 0 ] || { cat "$out"; tail -n 20 "$SLURM_DIR"/*.log; return 1; }
  grep -q "\[n1:0\] ddprun-fmnist: 6 ranks" "$out"
  grep -q "round 0: 3 nodes (n1, n2, n3), 6 ranks" "$out"
  acc=$(grep -o 'epoch 2/2 .*test-acc [0-9.]*' "$out" | grep -o '[0-9.]*$')
  echo "accuracy: $acc"
  awk -v a="$acc" 'BEGIN { exit !(a >= 85) }'
  grep -q "succeeded" "$out"
}

events() { cat logs/*/events.jsonl 2>/dev/null; }
ev_field() { events | grep "\"event\": \"$1\"" | grep -o "\"$2\": \"[^\"]*" | sed 's/^[^:]*: "//'; }
wait_event() { # event [seconds]
  for _ in $(seq $((${2:-60} * 10))); do
    events | grep -q "\"event\": \"$1\"" && return 0
    sleep 0.1
  done
  echo "no '$1' event in time:"; events; return 1
}

# The example job, elastic with a short lease, its logs here.
fmnist_job() {
  sed 's/max_restarts: 3}/max_restarts: 3, heartbeat_interval: 500ms, heartbeat_timeout: 2s}/' \
    "$REPO/examples/slurm/fmnist.yaml" >job.yaml
  printf 'logs: {dir: logs}\nstop_grace: 2s\nrendezvous: {last_call: 3s}\n' >>job.yaml
}

# Node 3 of the job in salloc ($pid) dies: the job goes on with n1 and n2 and succeeds.
lose_n3_go_on() {
  slurm_kill_node 3
  # Slurm learns it (at once, rather than SlurmdTimeout later): the allocation goes on
  scontrol update NodeName=n3 State=DOWN Reason=killed-by-the-test
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -eq 0 ] || { cat out.txt; return 1; }
  grep -q "node 'n3' lost: " out.txt
  grep -q "round 1: 2 nodes (n1, n2), 4 ranks" out.txt
}

# The job in salloc (with the options given first) in the background, as $pid, once training runs.
salloc_job() {
  slurm_login salloc "$@" -N3 --ntasks-per-node=2 --quiet ddprun job.yaml >out.txt 2>&1 &
  pid=$!
  wait_event resumed
}

final_acc() { grep -o 'test-acc [0-9.]*' "$1" | tail -n1 | cut -d' ' -f2; }

@test "a node's slurmd and processes SIGKILLed mid-training: the job goes on from its checkpoint on the other two" {
  trains
  fmnist_job
  # --no-kill: else Slurm ends the whole allocation once it declares the node down (NODE_FAIL)
  salloc_job --no-kill
  for _ in $(seq 300); do [ -e checkpoints/fmnist.ckpt ] && break; sleep 0.1; done
  [ -e checkpoints/fmnist.ckpt ]
  lose_n3_go_on
  grep -q "\[n1:0\] resuming from $PWD/checkpoints/fmnist.ckpt at step [1-9]" out.txt
  grep -q "\[n1:0\] epoch 2/2 " out.txt
  acc=$(final_acc out.txt)
  echo "accuracy: $acc"
  awk -v a="$acc" 'BEGIN { exit !(a >= 85) }'
  grep -q "succeeded" out.txt
}

@test "scancel inside salloc: ddprun names the cancelled allocation, stops and exits 130; nothing is left" {
  fmnist_job
  salloc_job
  scancel "$(squeue -h -o %i | head -n1)"
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -eq 130 ] || { cat out.txt; return 1; }
  grep -q "the Slurm allocation [0-9]* ended (CANCELLED); stopping the job" out.txt
  grep -q "interrupted after" out.txt
  ! grep -q "round 1" out.txt || false
}

@test "a node fails inside salloc (Slurm ends the allocation: NODE_FAIL): ddprun names it and exits 75, worth requeueing" {
  fmnist_job
  salloc_job
  slurm_kill_node 3
  scontrol update NodeName=n3 State=DOWN Reason=killed-by-the-test
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -eq 75 ] || { cat out.txt; return 1; }
  # (ddprun may see the node lost and open round 1 before Slurm ends the allocation, as it would
  # on a cluster, where Slurm declares a node down only after SlurmdTimeout)
  grep -q "the Slurm allocation [0-9]* ended (NODE_FAIL); stopping the job" out.txt
}

@test "scancel of a batch job: ddprun stops on Slurm's SIGTERM (status 130); nothing is left" {
  fmnist_job
  printf '#!/bin/sh\nexec ddprun job.yaml\n' >job.sbatch
  id=$(slurm_login sbatch --parsable -N3 --ntasks-per-node=2 -o batch.out job.sbatch)
  wait_event resumed
  scancel "$id"
  for _ in $(seq 200); do grep -q "interrupted after\|failed after\|succeeded after" batch.out && break; sleep 0.1; done
  cat batch.out
  grep -q "Terminated: stopping [0-9] ranks\{0,1\} (" batch.out # (the ranks Slurm ended first are not counted)
  grep -q "interrupted after" batch.out
}

@test "SIGINT to ddprun inside salloc stops every node's ranks: status 130, nothing left" {
  fmnist_job
  salloc_job
  kill -INT "$(pgrep -f "^ddprun job.yaml")"
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -eq 130 ] || { cat out.txt; return 1; }
  grep -q "Interrupt: stopping 6 ranks" out.txt
  grep -q "interrupted after" out.txt
}

@test "SIGKILL of ddprun inside salloc: the agents see their stdin close and stop their ranks; nothing is left" {
  fmnist_job
  salloc_job
  kill -9 "$(pgrep -f "^ddprun job.yaml")"
  wait "$pid" || true # (salloc's own status does not tell)
  ! grep -q "succeeded" out.txt || false
  # teardown: within 10 s nothing of the job is left on any node, and no srun
}

@test "Slurm's signals (scancel --signal, as --signal=[B:]USR1@T sends them) reach every rank" {
  cat >job.yaml <<'JOB'
command: trap 'echo "rank $RANK got USR1"; exit 0' USR1; echo "rank $RANK up"; while :; do sleep 0.1; done
logs: {dir: logs}
stop_grace: 2s
JOB
  printf '#!/bin/sh\nexec ddprun job.yaml\n' >job.sbatch
  # to the batch step only (B:): ddprun passes it on to every rank
  id=$(slurm_login sbatch --parsable -N3 --ntasks-per-node=2 -o batch.out job.sbatch)
  for _ in $(seq 300); do [ "$(grep -c " up" batch.out 2>/dev/null)" -eq 6 ] && break; sleep 0.1; done
  scancel --batch --signal=USR1 "$id"
  for _ in $(seq 200); do grep -q "succeeded after" batch.out && break; sleep 0.1; done
  cat batch.out
  for r in 0 1 2 3 4 5; do grep -q "rank $r got USR1" batch.out; done
  grep -q "succeeded after" batch.out
  # to every step: each node's agent passes it on to its ranks
  rm -rf logs
  id=$(slurm_login sbatch --parsable -N3 --ntasks-per-node=2 -o batch2.out job.sbatch)
  for _ in $(seq 300); do [ "$(grep -c " up" batch2.out 2>/dev/null)" -eq 6 ] && break; sleep 0.1; done
  scancel --signal=USR1 "$id"
  for _ in $(seq 200); do grep -q "after" batch2.out && break; sleep 0.1; done
  cat batch2.out
  for r in 0 1 2 3 4 5; do grep -q "rank $r got USR1" batch2.out; done
}

@test "ddprun doctor inside an allocation checks every node through srun" {
  printf 'command: [ddprun-fmnist]\n' >job.yaml
  run slurm_login salloc -N3 --quiet ddprun doctor job.yaml
  [ "$status" -eq 0 ] || { echo "$output"; return 1; }
  fm=$(sha256sum "$(command -v ddprun-fmnist)" | cut -c1-8)
  for k in 1 2 3; do
    assert_output --regexp "n$k +srun +n/a +ok +ok +ok +ok +ok +vn[0-9]+-$k +ok +$fm +pass"
  done
  assert_output --partial "3 nodes checked: 3 passed, 0 failed"
  printf 'command: [no-such-program]\n' >bad.yaml
  run slurm_login salloc -N3 --quiet ddprun doctor bad.yaml
  assert_failure 1
  assert_output --partial "FAIL: 'no-such-program' is not an executable program there"
  # a Python job: each node's interpreter reports its version (and torch's, or none) through
  # the same step
  want=$(/usr/bin/python3 -c 'import sys; print(sys.version.split()[0])')
  printf 'command: [/usr/bin/python3, train.py]\n' >py.yaml
  printf 'print(1)\n' >train.py
  ht=$(sha256sum train.py | cut -c1-8)
  run slurm_login salloc -N3 --quiet ddprun doctor py.yaml
  [ "$status" -eq 0 ] || { echo "$output"; return 1; }
  for k in 1 2 3; do
    assert_output --regexp "n$k +srun +n/a +ok +ok +ok +ok +ok +vn[0-9]+-$k +ok +${want//./\\.} +[^ ]+ +$ht +pass"
  done
}

@test "a hung agent (SIGSTOP) on a Slurm host: ddprun ends its step, so nothing of the job is left there once ddprun has exited" {
  cat >job.yaml <<'JOB'
command: sleep 1000 & while :; do sleep 0.1; done
elastic: {heartbeat_interval: 500ms, heartbeat_timeout: 2s}
logs: {dir: logs}
stop_grace: 2s
JOB
  slurm_login salloc -N3 --ntasks-per-node=1 --quiet ddprun job.yaml >out.txt 2>&1 &
  pid=$!
  wait_event workers_running
  agent=""
  for _ in $(seq 50); do
    for p in $(ip netns pids "$(sshd_ns 3)"); do
      tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q '^[^ ]*ddprun agent' && agent=$p
    done
    [ -n "$agent" ] && break
    sleep 0.1
  done
  [ -n "$agent" ]
  STOPPED=$agent
  kill -STOP "$agent"
  rc=0; wait "$pid" || rc=$?
  grep -q "node 'n3' lost: no heartbeat for 2.0 s" out.txt || { cat out.txt; return 1; }
  # ddprun has exited: of the job on n3, at most what is a moment from its end (the guard
  # leaves as its agent dies), never the stopped agent or its rank (Slurm's slurmstepd may
  # still be closing the step); the node's guard would end them 1 s after the loss, later
  for _ in $(seq 3); do
    left=""
    for p in $(ip netns pids "$(sshd_ns 3)"); do
      [ "$p" = "$(cat "$SLURM_DIR/slurmd-n3.pid")" ] && continue
      tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q '^slurmstepd' && continue
      left="$left,$p"
    done
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || { echo "left on n3:"; ps -o pid,stat,args -p "${left#,}"; cat out.txt; return 1; }
}

@test "a login node that cannot resolve the nodes' names (Slurm alone knows them): 3 x 2 ranks meet at the store, and a node lost goes on elastically" {
  # the login node's own /etc/hosts, without the nodes, and a resolver that fails at once (a
  # name server on loopback where nothing listens): no query leaves the machine
  grep -v ' n[0-9]*$' /etc/hosts >hosts.login
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >resolv.login
  login_noname() {
    unshare --mount sh -c 'mount --bind "$0" /etc/hosts && mount --bind "$1" /etc/resolv.conf && shift && exec "$@"' \
      "$PWD/hosts.login" "$PWD/resolv.login" "$@"
  }
  run login_noname getent hosts n1
  assert_failure
  cat >job.yaml <<'JOB'
command: if [ "$TORCHELASTIC_RESTART_COUNT" -ge 1 ]; then echo "round 1 rank $RANK of $WORLD_SIZE"; else ddprun __smoke-worker && exec sleep 600; fi
elastic: {min_nodes: 2, max_restarts: 1, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
logs: {dir: logs}
stop_grace: 2s
JOB
  login_noname salloc --no-kill -N3 --ntasks-per-node=2 --quiet ddprun job.yaml >out.txt 2>&1 &
  pid=$!
  for _ in $(seq 300); do grep -q "6 ranks met at the store" out.txt && break; sleep 0.1; done
  grep -q "6 ranks met at the store" out.txt || { cat out.txt; return 1; }
  lose_n3_go_on
  for r in 0 1 2 3; do grep -q "round 1 rank $r of 4" out.txt; done
  # never loopback for a node reached at another address
  ! grep -q "cannot reach the store" out.txt || false
}

@test "one srun step starts 4 agents, a spare among them; a node's agent killed: the others run on, the spare takes its place, and the node returns through a step of its own" {
  cat >job.yaml <<'JOB'
command: echo "round $TORCHELASTIC_RESTART_COUNT rank $RANK of $WORLD_SIZE on $(hostname)"; until [ -e go ]; do sleep 0.1; done
elastic: {min_nodes: 2, max_nodes: 3, max_restarts: 3, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
logs: {dir: logs}
stop_grace: 2s
JOB
  slurm_login salloc -N4 --ntasks-per-node=1 --quiet ddprun job.yaml >out.txt 2>&1 &
  pid=$!
  wait_event workers_running
  # the launching host holds one srun for the four agents (a step: ddprun's one child srun, with
  # the helper srun forks itself)
  ddp=$(pgrep -f "^ddprun job.yaml")
  pgrep -af "srun .*ddprun-agent"
  [ "$(pgrep -c -P "$ddp" -f "srun .*ddprun-agent")" -eq 1 ]
  [ "$(pgrep -fc "srun .*ddprun-agent")" -le 2 ]
  pgrep -af "srun .*ddprun-agent" | grep -q -- "--nodes=4 --ntasks=4 --ntasks-per-node=1 --nodelist=n1,n2,n3,n4"
  agent_of() { # K: the pid of node K's agent
    local p
    for p in $(ip netns pids "$(sshd_ns "$1")"); do
      if tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q '^[^ ]*ddprun agent'; then echo "$p"; fi
    done
  }
  for k in 1 2 3 4; do eval "a$k=\$(agent_of $k)"; eval "[ -n \"\$a$k\" ]"; done
  # the first three to join make round 0; the fourth waits as a spare
  for _ in $(seq 50); do grep -q "round 0: 3 nodes (" out.txt && break; sleep 0.1; done
  r0=$(sed -n 's/.*round 0: 3 nodes (\(.*\)), 3 ranks/\1/p' out.txt)
  [ -n "$r0" ] || { cat out.txt; return 1; }
  spare=$(for k in 1 2 3 4; do grep -qw "n$k" <<<"$r0" || echo "$k"; done)
  victim=$(cut -c2 <<<"$r0")
  echo "round 0: $r0; spare n$spare; killing n$victim's agent"
  [ -n "$spare" ] && [ "$spare" != "$victim" ]
  r1=$(for k in 1 2 3 4; do [ "$k" = "$victim" ] || printf 'n%s, ' "$k"; done)
  r1=${r1%, }
  # its agent dies: the node is lost, the spare takes its place; the step goes on for the others
  eval "kill -9 \$a$victim"
  for _ in $(seq 100); do grep -q "round 1: 3 nodes ($r1), 3 ranks" out.txt && break; sleep 0.1; done
  grep -q "node 'n$victim' lost: " out.txt || { cat out.txt; return 1; }
  grep -q "round 1: 3 nodes ($r1), 3 ranks" out.txt || { cat out.txt; return 1; }
  for k in 1 2 3 4; do [ "$k" = "$victim" ] || eval "[ \"\$(agent_of $k)\" = \"\$a$k\" ]"; done
  # the lost node is tried again while the job runs, through an srun step of its own, and
  # waits as a spare
  for _ in $(seq 150); do [ "$(ev_field node_joined node | grep -c "^n$victim\$")" -ge 2 ] && break; sleep 0.1; done
  [ "$(ev_field node_joined node | grep -c "^n$victim\$")" -ge 2 ] || { events; return 1; }
  pgrep -af "srun .*ddprun-agent" | grep -q -- "--nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist=n$victim "
  [ "$(pgrep -c -P "$ddp" -f "srun .*ddprun-agent")" -eq 2 ]
  touch go
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -eq 0 ] || { cat out.txt; return 1; }
  grep -q "round 1 rank [0-2] of 3 on n$spare" out.txt
}
