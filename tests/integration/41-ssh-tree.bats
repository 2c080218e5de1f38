#!/usr/bin/env bats
# The SSH tree (ssh.fanout): the launcher opens SSH sessions to the first K nodes only, and each
# agent starts up to K nodes below it, on 7 namespace hosts of tests/lib/sshd.bash with K = 2:
#
#   launcher -> node1 -> node3 -> node7
#                     -> node4
#            -> node2 -> node5
#                     -> node6
load '../lib/common'
load '../lib/sshd'
load '../lib/events'

setup() {
  [ "$(id -u)" -eq 0 ] || skip "the sshd test hosts need root"
  [ -x /usr/sbin/sshd ] || fail "openssh-server is not installed (./dev.sh deps installs it)"
  cd "$BATS_TEST_TMPDIR"
  sshd_setup
  [ -n "$SSHD_NETNS" ] || skip "the tree's hosts need network namespaces (their own connections)"
}

teardown() {
  [ -n "${DDP:-}" ] && kill -9 "$DDP" 2>/dev/null
  [ -n "${AGENT_PID:-}" ] && kill "$AGENT_PID" 2>/dev/null
  sshd_teardown
}

# The launching host's own SSH connections (the hosts' connections to each other are in their
# namespaces).
launcher_ssh_conns() { ss -Htn state established "( dport = :$SSH_PORT )" | wc -l; }

# The pid of node K's agent.
agent_in() {
  local p
  for p in $(sshd_ns_pids "$1"); do
    if tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q "^[^ ]*ddprun agent"; then echo "$p"; fi
  done
}

# How many SSH bridges (the sessions to the nodes below) run on node K.
bridges_in() {
  local p n=0
  for p in $(sshd_ns_pids "$1"); do
    tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q "__ssh-bridge" && n=$((n + 1))
  done
  echo "$n"
}

@test "ssh.fanout 2 on 7 hosts: plan shows the tree, the launcher holds 2 SSH sessions, an interior node's SIGKILL costs one node and the job goes on, SIGINT leaves nothing on any host" {
  for k in 1 2 3 4 5 6 7; do sshd_start "$k"; done
  marker="ddprun-tree-$RANDOM$RANDOM"
  ssh_job job.yaml 1 1 2 3 4 5 6 7 -- /bin/sh -c 'echo "up $TORCHELASTIC_RESTART_COUNT $RANK $(hostname -I)"; while :; do sleep 0.2; done' "$marker"
  sed -i "s/^ssh: {\(.*\)}$/ssh: {\1, fanout: 2}/" job.yaml
  echo "elastic: {min_nodes: 4, max_restarts: 3, heartbeat_interval: 500ms, heartbeat_timeout: 2s, cooldown: 60s}" >>job.yaml
  a() { sshd_addr "$1"; }
  run "$DDPRUN" plan job.yaml
  assert_success
  assert_line "  - {host: $(a 1), slots: 1}"
  assert_line "  - {host: $(a 3), slots: 1}   # started over SSH by the agent on $(a 1)"
  assert_line "  - {host: $(a 6), slots: 1}   # started over SSH by the agent on $(a 2)"
  assert_line "  - {host: $(a 7), slots: 1}   # started over SSH by the agent on $(a 3)"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP=$!
  wait_event workers_running 1 60
  for _ in $(seq 100); do [ "$(pgrep -fc "$marker" || true)" -ge 7 ] && break; sleep 0.1; done
  [ "$(pgrep -fc "$marker")" -eq 7 ] || { cat out.txt; return 1; }
  # each rank runs on its own host
  for k in 1 2 3 4 5 6 7; do grep -q "up 0 [0-9] $(a "$k")" out.txt || { cat out.txt; return 1; }; done
  # the launching host holds one SSH session per node of the first level
  [ "$(launcher_ssh_conns)" -eq 2 ] || { ss -tn; return 1; }
  # and the nodes below are started from their parents
  [ "$(bridges_in 1) $(bridges_in 2) $(bridges_in 3) $(bridges_in 4) $(bridges_in 7)" = "2 2 1 0 0" ]
  below=$(for k in 3 4 7; do agent_in "$k"; done)
  [ "$(echo $below | wc -w)" -eq 3 ]
  # node 1, which started nodes 3 and 4 (and through 3, node 7), dies: all of it but its sshd
  # (which is left to serve: node 1 may come back at a later round, as a lost node does)
  kill -9 $(sshd_ns_pids 1 | tr ' ' '\n' | grep -vx "$(cat ssh/node1/sshd.pid)")
  wait_event node_lost 1 20
  # the next round runs on the 6 others, nodes 3, 4 and 7 among them
  for _ in $(seq 150); do [ "$(ev_field membership world_size | tail -n1)" = 6 ] && [ "$(ev_field workers_running round | wc -l)" -ge 2 ] && break; sleep 0.1; done
  [ "$(ev_field membership world_size | tail -n1)" = 6 ] || { events; cat out.txt; return 1; }
  for k in 3 4 7; do
    for _ in $(seq 100); do grep -q "up 1 [0-9] $(a "$k")" out.txt && break; sleep 0.1; done
    grep -q "up 1 [0-9] $(a "$k")" out.txt || { cat out.txt; return 1; }
  done
  sleep 1 # nothing else is lost
  [ "$(events | grep -c '"event": "node_lost"')" -eq 1 ] || { events; cat out.txt; return 1; }
  [ "$(ev_field node_lost node)" = "$(a 1)" ]
  # and the agents of the nodes it had started are the same processes (it cost them nothing)
  for p in $below; do kill -0 "$p" || { echo "agent $p is gone"; cat out.txt; return 1; }; done
  kill -INT "$DDP"
  rc=0; wait "$DDP" || rc=$?
  DDP=
  [ "$rc" -eq 130 ] || { cat out.txt; return 1; }
  ! pgrep -f "$marker" || false
  for k in 1 2 3 4 5 6 7; do only_sshd_in "$k"; done
}

@test "ssh.fanout 2: a changed host key two levels down fails naming that node and the launcher's known_hosts; under accept-new a new key seen below is recorded there" {
  for k in 1 2 3 4 5 6; do sshd_start "$k"; done
  sshd_start 7 nokh
  a7=$(sshd_addr 7)
  # a key recorded for node 7 that is not its own
  ssh-keygen -q -t ed25519 -N '' -f other_key
  echo "[$a7]:$SSH_PORT $(cut -d' ' -f1,2 other_key.pub)" >>"$SSH_KH"
  ssh_job job.yaml 1 1 2 3 4 5 6 7 -- "$DDPRUN" __smoke-worker
  sed -i "s/^ssh: {\(.*\)}$/ssh: {\1, fanout: 2}/" job.yaml
  run "$DDPRUN" job.yaml
  assert_failure 3
  assert_output --partial "node '$a7': the host key of $a7 port $SSH_PORT has CHANGED from the one recorded in $SSH_KH; refusing to connect"
  for k in 1 2 3 4 5 6 7; do only_sshd_in "$k"; done
  # without it, accept-new: node 3's bridge records the key, and the launcher's file gets it
  grep -v "^\[$a7\]" "$SSH_KH" >kh && cat kh >"$SSH_KH"
  run "$DDPRUN" job.yaml --set ssh.strict_host_key_checking=accept-new
  assert_success
  assert_output --partial "node '$a7': host key of $a7 port $SSH_PORT added to $SSH_KH (seen by the agent on '$(sshd_addr 3)')"
  grep -q "^\[$a7\]:$SSH_PORT $(cut -d' ' -f1,2 ssh/node7/host_ed25519.pub)$" "$SSH_KH"
  run "$DDPRUN" job.yaml # now known: strict checking passes
  assert_success
  for k in 1 2 3 4 5 6 7; do only_sshd_in "$k"; done
}

@test "ssh.forward_agent: without an identity, the launcher's SSH agent logs in at every level of the tree when forwarded; without forwarding the nodes below cannot log in" {
  for k in 1 2 3; do sshd_start "$k"; done
  eval "$(ssh-agent -s)" >/dev/null
  AGENT_PID=$SSH_AGENT_PID
  ssh-add -q "$SSH_KEY"
  # a chain: the launcher reaches node 1, node 1 node 2, node 2 node 3
  ssh_job job.yaml 1 1 2 3 -- /bin/sh -c 'echo "on $(hostname -I)"'
  sed -i "s|^ssh: {port: \([0-9]*\), identity: [^,]*, \(.*\)}$|ssh: {port: \1, \2, fanout: 1, forward_agent: true}|" job.yaml
  grep -q "fanout: 1, forward_agent: true}" job.yaml
  run "$DDPRUN" job.yaml
  kill "$AGENT_PID" 2>/dev/null || true
  assert_success
  for k in 1 2 3; do assert_output --partial "on $(sshd_addr "$k")"; done
  eval "$(ssh-agent -s)" >/dev/null
  AGENT_PID=$SSH_AGENT_PID
  ssh-add -q "$SSH_KEY"
  run "$DDPRUN" job.yaml --set ssh.forward_agent=false
  kill "$AGENT_PID" 2>/dev/null || true
  # (a machine whose root has keys of its own in ~/.ssh would log in with them)
  if ! ls "$(getent passwd root | cut -d: -f6)"/.ssh/id_* >/dev/null 2>&1; then
    assert_failure 3
    assert_output --partial "node '$(sshd_addr 2)': authentication as '(current user)' failed"
  fi
  for k in 1 2 3; do only_sshd_in "$k"; done
}
