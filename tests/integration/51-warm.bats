#!/usr/bin/env bats
# Warm ranks (cli/agent/warm.h): a PyTorch rank restarted from the warm interpreter its agent kept
# behaves as one started cold. The reference is the same job with warm: off, in the same test.
load '../lib/common'
load '../lib/events'
load '../lib/sshd'

PY=${DDP_TEST_PYTHON:-/usr/bin/python3}
PROBE="$REPO/tests/integration/py/warm_probe.py"

setup() {
  "$PY" -c 'import torch' 2>/dev/null || skip "python3-torch is not installed (./dev.sh deps installs it)"
  cd "$BATS_TEST_TMPDIR"
  # this test's jobs alone for ddprun stacks and status (another suite may run beside it)
  export XDG_RUNTIME_DIR="$BATS_TEST_TMPDIR/run"
  mkdir -m 700 "$XDG_RUNTIME_DIR"
}

teardown() {
  [ -n "${DDP_PID:-}" ] && kill -9 "$DDP_PID" 2>/dev/null
  [ -n "${SSH_DIR:-}" ] && sshd_teardown
  true
}

# no warm interpreter outlives its job (a zombie of a host's killed agent is init's to reap)
warm_count() { ps -eo stat=,comm= | awk '$2 == "ddprun-warm" && $1 !~ /^Z/' | wc -l; }
no_warm_left() {
  [ "$(warm_count)" -eq 0 ] || { ps -ef | grep -v grep | grep -E "warm_probe|ddprun"; return 1; }
  ! pgrep -f "$PROBE" >/dev/null
}

# run_job DIR WARM: the 3-round job in DIR, its warm key WARM
run_job() {
  mkdir -p "$1/out"
  cat >"$1/job.yaml" <<EOF
command: [$PY, -B, $PROBE, behave, "two words"]
nproc_per_node: 2
elastic: {max_restarts: 2}
logs: {dir: logs}
stop_grace: 5s
warm: $2
env: {OUT: "$BATS_TEST_TMPDIR/$1/out", WAIT_WARM: "$([ "$2" = off ] && echo 0 || echo 1)", WAIT_RECORDED: "1"}
EOF
  local rc=0
  (cd "$1" && "$DDPRUN" job.yaml >out.txt 2>&1) || rc=$?
  echo "$rc" >"$1/rc"
}

@test "a restarted rank started warm behaves as one started cold: argv, __name__, sys.path[0], cwd, environment, signals, stdio, output, tracebacks, exit statuses" {
  run_job cold off
  run_job warm on
  cat warm/out.txt
  # the job ends as the last round's rank 1 does (KeyboardInterrupt, SIGINT), both times
  [ "$(cat cold/rc)" = "$(cat warm/rc)" ]
  [ "$(cat warm/rc)" -ne 0 ]
  no_warm_left
  "$PY" - <<'PY'
import glob, json, os
def load(d, r, k):
    with open('%s/out/out-%d-%d.json' % (d, r, k)) as f:
        return json.load(f)
hashes = set()
for k in (0, 1):
    ref, cref = load('warm', 0, k), load('cold', 0, k)
    assert ref['pre'] == [], ref['pre']
    for r in (0, 1, 2):
        c, w = load('cold', r, k), load('warm', r, k)
        assert c['pre'] == [], (r, k, c['pre'])
        # rounds 1 and 2 started warm: torch was imported before the program's first line
        assert w['pre'] == ([] if r == 0 else ['numpy', 'torch']), (r, k, w['pre'])
        hashes.add(w['hash'])
        for key in ref:
            if key in ('pre', 'hash'):
                continue
            assert w[key] == ref[key], (r, k, key, w[key], ref[key])
            assert c[key] == cref[key], ('cold', r, k, key, c[key], cref[key])
        assert w['argv'][1:] == ['behave', 'two words'] and w['name'] == '__main__'
        assert w['sigint'].startswith('<built-in function default_int_handler')
        assert w['sigterm'] in ('0', 'Handlers.SIG_DFL') and w['sched'] == [0] * len(w['sched'])
# a fresh hash seed in every process
assert len(hashes) == 6, hashes
PY
  # the same output and tracebacks, rank by rank and round by round
  for f in cold/logs/*/rank-*.log; do
    diff "$f" warm/logs/*/"$(basename "$f")"
  done
  grep -q "ValueError: boom in round 1" warm/logs/*/rank-1.restart-1.log
  grep -Eq "^(\[rank1\]: )?KeyboardInterrupt" warm/logs/*/rank-1.restart-2.log
  grep -q "rank 0: SIGTERM in round 1" warm/logs/*/rank-0.restart-1.log
  # how each round's ranks ended: the same statuses and signals
  for d in cold warm; do
    (cd "$d" && events | grep '"event": "worker_failed"' | grep -o '"rank": [0-9]*.*"stopped_by_ddprun": [a-z]*' >../"$d.failed")
  done
  diff cold.failed warm.failed
  [ "$(wc -l <warm.failed)" -ge 3 ] || { (cd warm && events); false; }
  # the timeline says so: both ranks of both restarts warm; a warm restart's process groups
  # formed and first collective came after its ranks started
  (cd warm && [ "$(ev_field recovery warm_ranks | tr '\n' ' ')" = "2 2 " ])
  (cd cold && [ "$(ev_field recovery warm_ranks | tr '\n' ' ')" = "0 0 " ])
  (cd warm && events | grep '"event": "recovery"' | head -n1 | "$PY" -c '
import json, sys
r = json.loads(sys.stdin.read())
ks = ("stopped_ms", "formed_ms", "started_ms", "group_formed_ms", "first_collective_ms")
assert all(r[k] is not None for k in ks), r
assert 0 <= r["stopped_ms"] <= r["formed_ms"] <= r["started_ms"] < r["group_formed_ms"] <= r["first_collective_ms"], r')
}

@test "ddprun stacks shows a warm rank's Python frames, ddprun status its recovery, and a stop leaves nothing" {
  mkdir out
  printf 'command: [%s, %s, stacks]\nnproc_per_node: 2\nelastic: {max_restarts: 1}\nlogs: {dir: logs}\nstop_grace: 3s\nenv: {OUT: "%s/out", WAIT_WARM: "1"}\n' \
    "$PY" "$PROBE" "$BATS_TEST_TMPDIR" >job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_event workers_running 2
  for _ in $(seq 600); do [ -e out/out-1-0.json ] && [ -e out/out-1-1.json ] && break; sleep 0.1; done
  sleep 0.5 # (in waiting_warm)
  run "$DDPRUN" stacks
  echo "$output"
  assert_success
  assert_output --partial "Python threads (faulthandler):"
  [ "$(grep -c 'in waiting_warm' <<<"$output")" -ge 1 ]
  run "$DDPRUN" status
  assert_output --regexp "last recovery \(rank 1 \(localhost\) exited with status 3 at [0-9.]+ s\):.* ranks started [0-9.]+ s \(2 warm\)"
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  grep -q "stopped (SIGINT)" out.txt
  no_warm_left
}

@test "an import that loads libcuda, or a listed one that fails, is said once and its slots start cold" {
  # a stand-in libcuda.so.1 and a module that loads it, as a CUDA extension would at import
  printf 'int cuInit(unsigned f) { (void)f; return 0; }\n' >cuda.c
  cc -shared -fPIC -o libcuda.so.1 cuda.c
  printf 'import ctypes, os\nctypes.CDLL(os.path.join(os.path.dirname(__file__), "libcuda.so.1"))\n' >warm_cudastub.py
  for imports in "[warm_cudastub]" "[torch, warm_no_such_module]"; do
    rm -rf out logs go && mkdir out
    printf 'command: [%s, %s, behave, x]\nnproc_per_node: 2\nelastic: {max_restarts: 2}\nlogs: {dir: logs}\nwarm: {imports: %s}\nenv: {OUT: "%s/out", WAIT_FILE: "%s/go", PYTHONPATH: "%s"}\n' \
      "$PY" "$PROBE" "$imports" "$BATS_TEST_TMPDIR" "$BATS_TEST_TMPDIR" "$BATS_TEST_TMPDIR" >job.yaml
    "$DDPRUN" job.yaml >out.txt 2>&1 &
    DDP_PID=$!
    case $imports in
    *cudastub*) wait_for_line out.txt 60 "warm.imports initialised CUDA" ;;
    *) wait_for_line out.txt 60 "warm.imports: cannot import warm_no_such_module (ModuleNotFoundError: No module named 'warm_no_such_module')" ;;
    esac
    touch go
    wait "$DDP_PID" || true
    DDP_PID=
    cat out.txt
    # said once for both slots; every round's ranks started cold
    [ "$(grep -c 'warm.imports' out.txt)" -eq 1 ]
    for f in out/out-*.json; do
      grep -A2 '"pre"' "$f" | grep -q '"pre": \[\]' || { cat "$f"; false; }
    done
    [ "$(ev_field recovery warm_ranks | sort -u)" = 0 ]
    no_warm_left
  done
}

@test "a spare keeps warm interpreters ready: taken in for a lost node, its rank starts warm" {
  cat >job.yaml <<EOF
command: [$PY, $REPO/bench/elastic_worker.py]
nodes: [{host: localhost}, {host: 127.0.0.1}, {host: "::1"}]
elastic: {min_nodes: 1, max_nodes: 2, max_restarts: 1, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
logs: {dir: logs}
stop_grace: 2s
EOF
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_for_line out.txt 90 "TRAINING restart=0"
  members=$(ev_field membership nodes)
  victim=$(echo "$members" | cut -d, -f2 | tr -d ' ')
  spare=""
  for h in localhost 127.0.0.1 ::1; do [[ ", $members," == *", $h,"* ]] || spare=$h; done
  [ -n "$spare" ]
  # an interpreter for each member's slot, and the spare's (its agent was sent PREPARE)
  for _ in $(seq 600); do [ "$(warm_count)" -ge 3 ] && break; sleep 0.1; done
  [ "$(warm_count)" -eq 3 ]
  # the second member's agent dies
  agent=$(local_agent_of "$victim")
  [ -n "$agent" ]
  kill -9 "$agent"
  wait_for_line out.txt 60 "TRAINING restart=1"
  wait_event recovery
  ev_field membership nodes | tail -n1 | grep -q "$spare"
  # both ranks of the next round started warm: the survivor's and the spare's
  [ "$(ev_field recovery warm_ranks)" = 2 ] || { events; cat out.txt; false; }
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  no_warm_left
}

@test "on SSH test hosts, a host's agent and ranks SIGKILLed, then all of another host: lost as killed, each next round forms without a drain, and the survivors and the node that came back restart warm" {
  [ "$(id -u)" -eq 0 ] || skip "the sshd test hosts need root"
  sshd_setup
  [ -n "$SSHD_NETNS" ] || skip "needs network namespaces"
  for k in 1 2 3; do sshd_start "$k"; done
  ssh_job job.yaml 1 1 2 3 -- "$PY" "$REPO/bench/elastic_worker.py"
  printf 'elastic: {min_nodes: 1, max_restarts: 2}\n' >>job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_for_line out.txt 90 "TRAINING restart=0"
  # each node's warm interpreter ready
  for _ in $(seq 600); do [ "$(warm_count)" -ge 3 ] && break; sleep 0.1; done
  [ "$(warm_count)" -eq 3 ]
  # node 3: its agent alone; its rank and warm interpreter die with it (their parent-death signal)
  agent=""
  for p in $(sshd_tree 3); do
    tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^[^ ]*ddprun agent" && agent=$p
  done
  [ -n "$agent" ]
  kill -9 "$agent"
  wait_for_line out.txt 60 "TRAINING restart=1"
  # nothing of node 3's rank or warm interpreter lives on in its namespace
  for _ in $(seq 50); do
    left=""
    for p in $(sshd_ns_pids 3); do
      st=$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null || true)
      [ -n "$st" ] && [ "$st" != Z ] && grep -qa -e elastic_worker -e ddprun-warm "/proc/$p/cmdline" "/proc/$p/comm" 2>/dev/null && left="$left $p"
    done
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || { ps -o pid,stat,args -p "$(echo $left | tr ' ' ',')"; false; }
  # sshd said how the agent ended (exit-signal): its ranks went with it (their parent-death
  # signal), so the next round did not wait DDP__SUP_DRAIN_MS (1 s) for them
  grep -q "node '$(sshd_addr 3)' lost: the SSH connection to it ended (its agent was killed by signal 9)" out.txt || { cat out.txt; return 1; }
  # node 3, tried again, joins while round 1 runs and waits for the next: sent PREPARE, its agent
  # keeps a warm interpreter too (beside the members' two)
  for _ in $(seq 600); do
    [ "$(events | grep '"event": "node_joined"' | grep -c "\"$(sshd_addr 3)\"")" -ge 2 ] && break
    sleep 0.1
  done
  for _ in $(seq 600); do [ "$(warm_count)" -ge 3 ] && break; sleep 0.1; done
  [ "$(warm_count)" -eq 3 ] || { ps -ef | grep -e ddprun-warm -e "ddprun agent"; false; }
  # node 2: everything but its listening sshd (the session's sshd too: no exit-signal); the
  # store saw its agent's connection close, so again no drain
  sshd=$(cat "$SSH_DIR/node2/sshd.pid")
  kill -9 $(sshd_tree 2 | tr ' ' '\n' | grep -vx "$sshd")
  wait_for_line out.txt 60 "TRAINING restart=2"
  wait_event recovery 2
  events | grep '"event": "recovery"'
  for n in 1 2; do
    rec=$(events | grep '"event": "recovery"' | sed -n "${n}p")
    formed=$(grep -o '"formed_ms": [0-9]*' <<<"$rec" | cut -d' ' -f2)
    [ "$formed" -lt 1000 ] # (a drain would make it 1000 or more)
  done
  grep -q '"warm_ranks": 2' <<<"$(events | grep '"event": "recovery"' | sed -n 1p)"
  # round 2: nodes 1 and 3, both ranks warm (node 3's from the interpreter PREPARE made)
  ev_field membership nodes | tail -n1 | grep -q "$(sshd_addr 3)"
  grep -q '"warm_ranks": 2' <<<"$(events | grep '"event": "recovery"' | sed -n 2p)"
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  for k in 1 2; do
    sshd=$(cat "$SSH_DIR/node$k/sshd.pid")
    for _ in $(seq 100); do [ -z "$(sshd_tree "$k" | tr ' ' '\n' | grep -vx "$sshd")" ] && break; sleep 0.1; done
    [ -z "$(sshd_tree "$k" | tr ' ' '\n' | grep -vx "$sshd")" ]
  done
  no_warm_left
}
