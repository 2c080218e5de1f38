#!/usr/bin/env bats
# The launcher's agent port (docs/internals/agent-protocol.md, Transport): every node agent
# dials back there and proves the job's token. Whatever else connects is refused, logged at
# most once a second, and the job goes on undisturbed.
load '../lib/common'

setup() {
  cd "$BATS_TEST_TMPDIR"
}

teardown() {
  [ -n "${ddp:-}" ] && kill -9 "$ddp" 2>/dev/null || true
}

@test "the agent port refuses a wrong token, garbage, another version, a stalled half handshake and 1,000 connections at once; the job is undisturbed" {
  [ -x /usr/bin/python3 ] || fail "Debian's python3 is missing"
  # two ranks that wait for the go file, then meet at a store barrier and succeed
  cat >job.yaml <<'JOB'
command: ["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.1; done; echo rank $RANK done"]
nproc_per_node: 2
logs: {dir: logs}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  for _ in $(seq 100); do grep -q workers_running logs/*/events.jsonl 2>/dev/null && break; sleep 0.1; done
  port=$(sed -n 's/.*"event": "job_start".*"agent_port": \([0-9]*\).*/\1/p' logs/*/events.jsonl)
  [ -n "$port" ] && [ "$port" -gt 0 ] || { cat logs/*/events.jsonl; return 1; }
  # the port is the launcher's and no other process listens there
  t0=$SECONDS
  run timeout 120 /usr/bin/python3 "$REPO/tests/integration/py/agent_port_hostile.py" "$port"
  echo "$output"
  assert_success
  assert_line --regexp "^stalled: closed after (9|1[0-4])\.[0-9] s$"
  # the job still runs, and ends well
  kill -0 "$ddp"
  touch go
  rc=0; wait "$ddp" || rc=$?
  ddp=
  cat out.txt
  [ "$rc" -eq 0 ]
  grep -q "^\[localhost:0\] rank 0 done$" out.txt
  grep -q "^\[localhost:1\] rank 1 done$" out.txt
  # each refusal names its peer and its cause; at most one line a second gets through
  grep -Eq "agent port: refusing a connection from 127\.0\.0\.1:[0-9]+: (authentication failed \(wrong job token\)|it does not speak the agent link|another version of the agent link|it closed the connection before proving the job's token|it sent more than the handshake|it said nothing in time|it did not finish proving the job's token in time)" out.txt
  lines=$(grep -c "agent port: " out.txt)
  echo "$lines refusal lines in $((SECONDS - t0)) s"
  [ "$lines" -le $((SECONDS - t0 + 2)) ]
  grep -q "more like it in the last" out.txt
}
