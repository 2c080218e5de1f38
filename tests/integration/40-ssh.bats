#!/usr/bin/env bats
# Remote nodes over SSH (libssh), against real OpenSSH sshd test hosts on 127.0.0.x
# (tests/lib/sshd.bash): provisioning, host-key policy, provisioning failures, teardown.
load '../lib/common'
load '../lib/sshd'

FMNIST="$BUILD/ddprun-fmnist"

setup() {
  [ "$(id -u)" -eq 0 ] || skip "the sshd test hosts need root"
  [ -x /usr/sbin/sshd ] || fail "openssh-server is not installed (./dev.sh deps installs it)"
  cd "$BATS_TEST_TMPDIR"
  sshd_setup
}

teardown() {
  sshd_teardown
}

@test "3 nodes x 2 ranks over SSH: the Fashion-MNIST example trains across them" {
  for k in 1 2 3; do sshd_start "$k"; done
  ssh_job job.yaml 2 1 2 3 -- "$FMNIST" --max-steps 60 --eval-every 1
  run "$DDPRUN" job.yaml
  [ "$status" -eq 0 ] || { echo "$output"; cat ssh/node*/sshd.log; return 1; }
  assert_output --partial "[127.0.0.2:0] ddprun-fmnist: 6 ranks"
  assert_output --partial "test-acc"
  # every node's ranks ran, with their node rank, and logs came back to this machine
  for r in 0 1 2 3 4 5; do [ -e "$(ls -d logs/*)/rank-$r.log" ]; done
  grep -q "test-acc" "$(ls -d logs/*)/rank-0.log"
  run "$DDPRUN" plan job.yaml
  assert_output --partial "127.0.0.4"
}

@test "a store barrier job across 2 nodes reports each rank's node" {
  for k in 1 2; do sshd_start "$k"; done
  ssh_job job.yaml 2 1 2 -- "$DDPRUN" __smoke-worker
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "4 ranks met at the store"
  assert_output --regexp "  2 +127\.0\.0\.3 +exit 0"
  assert_output --regexp "  3 +127\.0\.0\.3 +exit 0"
}

@test "an unknown host key is refused under strict checking and accepted (and recorded) with accept-new" {
  sshd_start 1 nokh
  ssh_job job.yaml 1 1 -- "$DDPRUN" __smoke-worker
  run "$DDPRUN" job.yaml
  assert_failure 3
  assert_output --partial "node '127.0.0.2': the host key of 127.0.0.2 port $SSH_PORT is not in $SSH_KH (strict_host_key_checking: yes)"
  [ ! -s "$SSH_KH" ]
  run "$DDPRUN" job.yaml --set ssh.strict_host_key_checking=accept-new
  assert_success
  grep -q "127.0.0.2" "$SSH_KH"
  run "$DDPRUN" job.yaml   # now known: strict checking passes
  assert_success
}

@test "a changed host key is refused, naming the host and the known_hosts file, even with accept-new" {
  sshd_start 1
  sshd_stop 1
  rm ssh/node1/host_ed25519 ssh/node1/host_ed25519.pub
  sshd_start 1 nokh   # same address, new key
  ssh_job job.yaml 1 1 -- "$DDPRUN" __smoke-worker
  for mode in yes accept-new; do
    run "$DDPRUN" job.yaml --set ssh.strict_host_key_checking=$mode
    assert_failure 3
    assert_output --partial "node '127.0.0.2': the host key of 127.0.0.2 port $SSH_PORT has CHANGED from the one recorded in $SSH_KH; refusing to connect"
  done
}

@test "a node without sshd, a wrong user key, and a missing remote ddprun: status 3 naming the node and cause, the good node cleaned up" {
  sshd_start 1
  # 127.0.0.9: nothing listens there
  ssh_job job.yaml 1 1 8 -- sleep 30
  SECONDS=0
  run "$DDPRUN" job.yaml
  assert_failure 3
  assert_output --partial "node '127.0.0.9': cannot connect to 127.0.0.9 port $SSH_PORT"
  [ "$SECONDS" -lt 20 ]
  ! pgrep -f "^sleep 30" >/dev/null
  # a key the nodes do not accept
  ssh-keygen -q -t ed25519 -N '' -f other_key
  ssh_job job.yaml 1 1 -- "$DDPRUN" __smoke-worker
  run "$DDPRUN" job.yaml --set ssh.identity="$PWD/other_key"
  assert_failure 3
  assert_output --partial "node '127.0.0.2': the server refused the key $PWD/other_key"
  # ddprun missing on the node
  run "$DDPRUN" job.yaml --set ssh.remote_ddprun=/nonexistent/ddprun
  assert_failure 3
  assert_output --partial "node '127.0.0.2': '/nonexistent/ddprun' was not found there"
}

@test "interrupting ddprun leaves no process of the job on any node" {
  for k in 1 2; do sshd_start "$k"; done
  marker="ddprun-ssh-test-$RANDOM$RANDOM"
  ssh_job job.yaml 2 1 2 -- /bin/sh -c 'while :; do sleep 0.2; done' "$marker"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ "$(pgrep -fc "$marker" || true)" -ge 4 ] && break; sleep 0.1; done
  [ "$(pgrep -fc "$marker")" -ge 4 ]
  kill -INT "$pid"
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -eq 130 ]
  for _ in $(seq 50); do pgrep -f "$marker" >/dev/null || break; sleep 0.1; done
  ! pgrep -f "$marker"
  ! pgrep -f "ddprun agent" -P "$(cat ssh/node1/sshd.pid)"
}

@test "SIGKILL of ddprun: the remote agents see the connection close and stop their ranks" {
  sshd_start 1
  marker="ddprun-ssh-kill-$RANDOM$RANDOM"
  ssh_job job.yaml 2 1 -- /bin/sh -c 'while :; do sleep 0.2; done' "$marker"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ "$(pgrep -fc "$marker" || true)" -ge 2 ] && break; sleep 0.1; done
  [ "$(pgrep -fc "$marker")" -ge 2 ]
  kill -9 "$pid"
  wait "$pid" || true
  for _ in $(seq 100); do pgrep -f "$marker" >/dev/null || break; sleep 0.1; done
  ! pgrep -f "$marker"
}

@test "ddprun doctor: passing nodes pass, a node without sshd and one with an unknown key fail with the reason" {
  sshd_start 1
  sshd_start 2
  sshd_start 3 nokh
  ssh_job job.yaml 1 1 2 3 8 -- "$FMNIST" --epochs 1
  run "$DDPRUN" doctor job.yaml
  assert_failure 1
  assert_line --regexp "^127\.0\.0\.2 +ok +ok +ok +ok +ok +ok +pass$"
  assert_line --regexp "^127\.0\.0\.3 +ok +ok +ok +ok +ok +ok +pass$"
  assert_line --regexp "^127\.0\.0\.4 +ok +FAIL .*FAIL: the host key of 127\.0\.0\.4 port $SSH_PORT is not in $SSH_KH"
  assert_line --regexp "^127\.0\.0\.9 +FAIL .*FAIL: cannot connect to 127\.0\.0\.9 port $SSH_PORT"
  assert_output --partial "4 nodes checked: 2 passed, 2 failed"
  # accept-new: the unknown key is reported as new, and nothing is written
  run "$DDPRUN" doctor job.yaml --set ssh.strict_host_key_checking=accept-new --set "nodes=[$(sshd_addr 3)]"
  assert_success
  assert_line --regexp "^127\.0\.0\.4 +ok +new +ok +ok +ok +ok +pass$"
  ! grep -q "127.0.0.4" "$SSH_KH"
  # a command missing on the node, and a ddprun of another version
  run "$DDPRUN" doctor job.yaml --set "command=[/nonexistent/trainer]" --set "nodes=[$(sshd_addr 1)]"
  assert_failure 1
  assert_output --partial "FAIL: '/nonexistent/trainer' is not an executable program there"
  printf '#!/bin/sh\necho "ddprun 0.0.1"\n' >old-ddprun
  chmod +x old-ddprun
  run "$DDPRUN" doctor job.yaml --set ssh.remote_ddprun="$PWD/old-ddprun" --set "nodes=[$(sshd_addr 1)]"
  assert_failure 1
  assert_output --partial "there is 'ddprun 0.0.1', this is ddprun"
}

@test "ddprun doctor on a local job checks the command and the store address" {
  printf 'command: [/nonexistent/x]\n' >job.yaml
  run "$DDPRUN" doctor job.yaml
  assert_failure 1
  assert_line --regexp "^localhost +local +local +ok +FAIL"
  printf 'command: [sleep, "1"]\n' >job.yaml
  run "$DDPRUN" doctor job.yaml
  assert_success
  assert_line --regexp "^localhost +local +local +ok +ok +ok +ok +pass$"
}
