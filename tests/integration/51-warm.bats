#!/usr/bin/env bats
# Warm ranks (cli/agent/warm.h): a PyTorch rank restarted from the warm interpreter its agent kept
# behaves as one started cold. The reference is the same job with warm: off, in the same test.
load '../lib/common'
load '../lib/events'

PY=${DDP_TEST_PYTHON:-/usr/bin/python3}
PROBE="$REPO/tests/integration/py/warm_probe.py"

setup() {
  "$PY" -c 'import torch' 2>/dev/null || skip "python3-torch is not installed (./dev.sh deps installs it)"
  cd "$BATS_TEST_TMPDIR"
}

teardown() {
  [ -n "${DDP_PID:-}" ] && kill -9 "$DDP_PID" 2>/dev/null
  true
}

# no warm interpreter outlives its job
no_warm_left() {
  ! pgrep -x ddprun-warm >/dev/null || { ps -ef | grep -v grep | grep -E "warm_probe|ddprun"; return 1; }
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
env: {OUT: "$BATS_TEST_TMPDIR/$1/out", WAIT_WARM: "$([ "$2" = off ] && echo 0 || echo 1)"}
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
  grep -q "^KeyboardInterrupt" warm/logs/*/rank-1.restart-2.log
  grep -q "rank 0: SIGTERM in round 1" warm/logs/*/rank-0.restart-1.log
  # how each round's ranks ended: the same statuses and signals
  for d in cold warm; do
    (cd "$d" && events | grep '"event": "worker_failed"' | grep -o '"rank": [0-9]*.*"stopped_by_ddprun": [a-z]*' >../"$d.failed")
  done
  diff cold.failed warm.failed
  [ "$(wc -l <warm.failed)" -ge 3 ]
  # the timeline says so: both ranks of both restarts warm; a warm restart's process groups
  # formed and first collective came after its ranks started
  (cd warm && [ "$(ev_field recovery warm_ranks | tr '\n' ' ')" = "2 2 " ])
  (cd cold && [ "$(ev_field recovery warm_ranks | tr '\n' ' ')" = "0 0 " ])
  (cd warm && events | grep '"event": "recovery"' | head -n1 | "$PY" -c '
import json, sys
r = json.loads(sys.stdin.read())
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
