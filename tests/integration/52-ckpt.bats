#!/usr/bin/env bats
# Checkpoints the agents replicate (checkpoint.replicas, cli/supervisor/ckpt.h): SSH test hosts
# with no folder in common, each host's checkpoint folder a private tmpfs in a mount namespace
# of its own (tests/lib/sshd.bash, SSHD_TMPFS). An unmodified PyTorch DDP script saves with
# torch.save into it; the agents copy each file it finishes to another host, and restore the
# newest copies before a round's ranks start.
load '../lib/common'
load '../lib/events'
load '../lib/sshd'

PY=${DDP_TEST_PYTHON:-/usr/bin/python3}
TRAIN="$REPO/tests/integration/py/ddp_train.py"

setup() {
  cd "$BATS_TEST_TMPDIR"
  export XDG_RUNTIME_DIR="$BATS_TEST_TMPDIR/run"
  mkdir -m 700 "$XDG_RUNTIME_DIR"
  CK="$BATS_TEST_TMPDIR/ck"
  mkdir -p "$CK"
}

# SSH test hosts whose checkpoint folder ($CK) is each a private tmpfs.
need_hosts() {
  [ "$(id -u)" -eq 0 ] || skip "the sshd test hosts need root"
  "$PY" -c 'import torch' 2>/dev/null || skip "python3-torch is not installed (./dev.sh deps installs it)"
  SSHD_TMPFS=$CK
  sshd_setup
  [ -n "$SSHD_NETNS" ] || skip "needs network namespaces"
}

teardown() {
  [ -n "${DDP_PID:-}" ] && kill -9 "$DDP_PID" 2>/dev/null
  [ -n "${SSH_DIR:-}" ] && sshd_teardown
  true
}

# sha256 of node K's copy of FILE (under the checkpoint folder), or "none"
copy_sha() { node_run "$1" sh -c "sha256sum '$CK/$2' 2>/dev/null | cut -d' ' -f1 || true" | grep . || echo none; }

# The training job on nodes $2..., saving every 10 steps into the node-local folder.
train_job() { # file nodes... -- extra YAML lines
  local f=$1; shift
  local nodes=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do nodes+=("$1"); shift; done
  ssh_job "$f" 1 "${nodes[@]}" -- "$PY" -B "$TRAIN"
  cat >>"$f" <<JOB
env: {CKPT: $CK/model.pt, STEPS: "${STEPS:-160}", STEP_SLEEP: "${STEP_SLEEP:-0.1}"}
elastic: {min_nodes: 2, max_restarts: 2, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
rendezvous: {last_call: 1s}
warm: off
JOB
  [ "${1:-}" = -- ] && shift && printf '%s\n' "$@" >>"$f"
  return 0
}

@test "replicas: 1 on 4 hosts with private folders: rank 0's host SIGKILLed, the survivors resume from a peer's copy; the launcher reads none of its bytes" {
  need_hosts
  for k in 1 2 3 4; do sshd_start "$k"; done
  train_job job.yaml 1 2 3 4 -- "checkpoint: {dir: $CK, replicas: 1}"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  # a checkpoint of step 30 or later, copied to node 2 (the next after its holder, node 1)
  for _ in $(seq 900); do
    [ "$(ev_field checkpoint_file path 2>/dev/null | wc -l)" -ge 3 ] && break
    sleep 0.1
  done
  want=$(events | grep '"event": "checkpoint_file"' | tail -n1 | grep -o '"sha256": "[0-9a-f]*' | cut -d'"' -f4)
  for _ in $(seq 100); do [ "$(copy_sha 2 model.pt)" = "$want" ] && break; sleep 0.1; done
  [ "$(copy_sha 1 model.pt)" = "$want" ] || [ "$(events | grep -c checkpoint_file)" -gt 3 ] || { events; cat out.txt; copy_sha 1 model.pt; node_run 1 ls -la $CK; false; }
  [ "$(copy_sha 2 model.pt)" != none ]
  # nodes 3 and 4 hold none: a copy each goes to one other node
  [ "$(copy_sha 3 model.pt)" = none ]
  [ "$(copy_sha 4 model.pt)" = none ]
  # the replication's lag in ddprun status
  "$DDPRUN" status >status.txt
  grep -q "checkpoint replication: 1 file" status.txt || { cat status.txt; false; }
  # the host of rank 0 (the one that saves), everything on it
  kill -9 $(sshd_tree 1) $(sshd_ns_pids 1)
  rc=0; wait "$DDP_PID" || rc=$?
  DDP_PID=
  [ "$rc" -eq 0 ] || { cat out.txt; false; }
  # round 1 on nodes 2-4 resumed from node 2's copy, which nodes 3 and 4 got before their start
  grep -q "\[$(sshd_addr 2):0\] resumed at step [1-9][0-9]*0" out.txt || { cat out.txt; false; }
  events | grep -q '"event": "checkpoint_restored"'
  rec=$(events | grep '"event": "recovery"' | tail -n1)
  grep -q '"restored_ms": [0-9]' <<<"$rec" || { echo "$rec"; false; }
  grep -q '"restored_bytes": [1-9]' <<<"$rec"
  grep -q '"restored_s": [0-9]' logs/*/summary.json
  # the last version of the file, the same on its holders: what training ended with
  last=$(events | grep '"event": "checkpoint_file"' | tail -n1 | grep -o '"sha256": "[0-9a-f]*' | cut -d'"' -f4)
  n=0
  for k in 2 3 4; do [ "$(copy_sha "$k" model.pt)" = "$last" ] && n=$((n + 1)); done
  [ "$n" -ge 2 ] || { for k in 2 3 4; do copy_sha "$k" model.pt; done; echo "want $last"; false; }
  # the launcher's machine holds nothing of it (its folder is not any node's)
  [ -z "$(ls -A "$CK")" ]
  # every replica of the model trained on: the parameters' sums agree across ranks
  [ "$(grep -o 'params sum [-0-9.]*' out.txt | sort -u | wc -l)" -eq 1 ]
}

@test "the replication port serves a peer that proves the token; refuses a wrong token, garbage, paths outside the folder, a forged record, a stalled half frame and 1,000 connections; the job is undisturbed" {
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >token
  chmod 600 token
  cat >job.yaml <<JOB
command: ["/bin/sh", "-c", "head -c 300000 /dev/urandom >$CK/r\$RANK.bin; while [ ! -e go ]; do sleep 0.1; done; echo rank \$RANK done"]
nodes: [{host: localhost, slots: 1}, {host: 127.0.0.1, slots: 1}]
checkpoint: {dir: $CK, replicas: 1}
rendezvous: {token_file: $PWD/token}
logs: {dir: logs}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_event checkpoint_file 2
  addr=$(ev_field checkpoint_port addr | head -n1)
  [ -n "$addr" ] || { events; cat out.txt; false; }
  sha=$(sha256sum "$CK/r0.bin" | cut -d' ' -f1)
  t0=$SECONDS
  run timeout 150 /usr/bin/python3 "$REPO/tests/integration/py/ckpt_port_hostile.py" "$addr" token r0.bin "$sha"
  echo "$output"
  assert_success
  assert_line --regexp "^stalled: closed after [4-9]\.[0-9] s$"
  kill -0 "$DDP_PID"
  touch go
  rc=0; wait "$DDP_PID" || rc=$?
  DDP_PID=
  cat out.txt
  [ "$rc" -eq 0 ]
  grep -q "rank 0 done" out.txt
  # each refusal names its peer and its cause; at most one line a second gets through
  grep -Eq "checkpoint replication port: refused 127\.0\.0\.1:[0-9]+: (it did not prove the job's token|it did not begin a ddprun handshake|a malformed request|a record failed its authentication|it sent no whole request in time|too many connections at once)" out.txt
  lines=$(grep -c "replication port: " out.txt)
  echo "$lines refusal lines in $((SECONDS - t0)) s"
  [ "$lines" -le $((SECONDS - t0 + 2)) ]
  grep -q "more like it in the last" out.txt
}
