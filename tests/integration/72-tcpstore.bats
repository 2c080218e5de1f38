#!/usr/bin/env bats
# PyTorch's TCPStore protocol: PyTorch programs find their store at MASTER_ADDR:MASTER_PORT
# (TORCHELASTIC_USE_AGENT_STORE=True), their node's agent, which relays to the job's store (as the
# launcher's TCPStore port serves it) with a key space per restart round, to the node's own
# address only.
load '../lib/common'

PY=${DDP_TEST_PYTHON:-/usr/bin/python3} # another PyTorch: DDP_TEST_PYTHON
CHECKS="$REPO/tests/integration/py/tcpstore_checks.py"

setup() {
  "$PY" -c 'import torch' 2>/dev/null || skip "python3-torch is not installed (./dev.sh deps installs it)"
  cd "$BATS_TEST_TMPDIR"
}

checks() { # mode [extra yaml]
  printf 'command: [%s, %s, %s]\nlogs: {dir: logs}\nstop_grace: 2s\n%s' "$PY" "$CHECKS" "$1" "${2:-}" >job.yaml
  run timeout 120 "$DDPRUN" job.yaml
  echo "$output"
}

@test "torch's own TCPStore client: set, get, add, compare_set, wait (and its timeout), check, num_keys, delete_key" {
  checks ops
  assert_success
  assert_output --partial "ok: set, get, add, compare_set, wait, check, num_keys, delete_key, wait timeout, set and close"
  run "$DDPRUN" plan job.yaml
  assert_output --partial "MASTER_PORT=<its agent's TCPStore port, which relays to the launcher's> TORCHELASTIC_USE_AGENT_STORE=True"
}

@test "a PyTorch DDP job's ranks reach the TCPStore through their agent: the launcher's store holds the agent's few connections, not two a rank" {
  printf 'command: [%s, %s]\nnproc_per_node: 4\nlogs: {dir: logs}\n' "$PY" "$REPO/tests/integration/py/ddp_train.py" >job.yaml
  run timeout 120 "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "rank 3 of 4: params sum"
  # 4 ranks' TCPStore clients (2 each, torch 1.13's client and its callback client) straight to
  # the launcher would be 8 more than the agent's own and its proxy's
  d=$(ls -d logs/*/ | head -n1)
  grep -Eq '"store": \{"connections": [2-6],' "$d/summary.json" || { cat "$d/summary.json"; return 1; }
}

@test "a connection from an address that is not one of the job's nodes is refused" {
  checks refused
  assert_success
  assert_output --partial "ok: a connection from an address that is not a node is refused"
  assert_output --partial "refusing a TCPStore connection from '127.0.0.2:"
}

@test "a restart round starts with an empty key space: round 1 does not see round 0's keys" {
  checks round "elastic: {max_restarts: 1}"$'\n'
  assert_success
  assert_output --partial "round 0 set its keys"
  assert_output --partial "ok: round 1 does not see round 0's keys"
}

@test "malformed, truncated and oversized TCPStore requests close only their connection" {
  checks bad
  assert_success
  assert_output --partial "ok: an unknown op closes its connection"
  assert_output --partial "ok: a key of 2**40 bytes closes its connection"
  assert_output --partial "ok: a request of 24 MiB closes its connection"
  assert_output --partial "ok: a truncated request closes only its connection; others are served"
}

@test "torch >= 2.2's numbering: VALIDATE and PING first, CANCEL_WAIT answers a parked WAIT" {
  checks v22
  assert_success
  assert_output --partial "ok: torch >= 2.2"
}

@test "rendezvous.torch_store: rank0 keeps rank 0's own TCPStore (USE_AGENT_STORE=False)" {
  printf 'command: [%s, %s]\nnproc_per_node: 2\nrendezvous: {torch_store: rank0}\nlogs: {dir: logs}\n' "$PY" "$REPO/tests/integration/py/ddp_train.py" >job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "rank 1 of 2: params sum"
  run "$DDPRUN" plan job.yaml
  assert_output --partial "TORCHELASTIC_USE_AGENT_STORE=False"
  # MASTER_PORT lies outside the kernel's range for outgoing connections, which any process's
  # connect could take before rank 0 binds it
  printf 'command: [sh, -c, "echo port=$MASTER_PORT"]\nnproc_per_node: 1\nrendezvous: {torch_store: rank0}\nlogs: {dir: logs}\n' >job.yaml
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range
  for _ in 1 2 3; do
    run "$DDPRUN" job.yaml
    assert_success
    port=$(sed -n 's/.*port=\([0-9]*\)$/\1/p' <<<"$output")
    [ -n "$port" ] && { [ "$port" -lt "$lo" ] || [ "$port" -gt "$hi" ]; }
  done
}

@test "torch 2.0 and 2.1's numbering: 1.13's with APPEND, MULTI_GET, MULTI_SET and CANCEL_WAIT after it" {
  checks v20
  assert_success
  assert_output --partial "ok: torch 2.0/2.1"
}
