#!/usr/bin/env bats
# `ddprun report` (cli/view/report.h): one self-contained HTML page of a job from its log folder,
# its data embedded as JSON. Checked against events.jsonl by a reference reader
# (tests/integration/py/report_check.py), and rendered by headless Chromium (Debian's
# chromium) with no network, a throwaway profile and its process group killed after.
load '../lib/common'
load '../lib/events'

CHECK="$REPO/tests/integration/py/report_check.py"

setup() {
  cd "$BATS_TEST_TMPDIR"
  export XDG_RUNTIME_DIR="$BATS_TEST_TMPDIR/run"
  mkdir -m 700 "$XDG_RUNTIME_DIR"
}

teardown() {
  [ -n "${DDP_PID:-}" ] && kill -9 "$DDP_PID" 2>/dev/null
  true
}

job() { HANG_ELASTIC="" hangtest_job "$@"; } # (tests/lib/common.bash; elastic in extra)

# Renders PAGE to PNG with headless Chromium, unable to reach any network, and fails on any
# message of the page's console.
render() { # page png
  command -v chromium >/dev/null || fail "chromium is not installed (./dev.sh deps installs it)"
  local prof rc=0
  prof=$(mktemp -d)
  setsid timeout 60 unshare -n chromium --headless --no-sandbox --disable-gpu --no-first-run \
    --disable-background-networking --disable-extensions --user-data-dir="$prof" \
    --enable-logging=stderr --v=0 --window-size=1100,1400 --screenshot="$PWD/$2" \
    "file://$PWD/$1" >chromium.log 2>&1 &
  local pid=$!
  wait "$pid" || rc=$?
  kill -9 -- -"$pid" 2>/dev/null || true # (its process group: every helper it left)
  rm -rf "$prof"
  [ "$rc" -eq 0 ] || { cat chromium.log; return 1; }
  [ "$(head -c 8 "$2" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] # a PNG
  [ "$(stat -c %s "$2")" -gt 10000 ]
  ! grep -i "CONSOLE" chromium.log || false
}

@test "ddprun report of an elastic job that lost a node: the embedded JSON is what events.jsonl says (rounds, losses, recovery phases), an SVG per plot naming every rank, rendered by Chromium without console errors" {
  job "elastic: {min_nodes: 1, max_restarts: 2, heartbeat_interval: 300ms, heartbeat_timeout: 2s}" \
    --steps 250 --compute-ms 30
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_event first_collective
  sleep 1.5
  # a report of the running job: partial by nature, no summary yet
  id=$(basename logs/*/)
  run "$DDPRUN" report "$id" -o running.html
  assert_success
  /usr/bin/python3 "$CHECK" running.html logs/"$id" running
  agent=$(local_agent_of 127.0.0.1)
  [ -n "$agent" ]
  kill -9 "$agent"
  rc=0; wait "$DDP_PID" || rc=$?
  DDP_PID=
  [ "$rc" -eq 0 ] || { cat out.txt; false; }
  run "$DDPRUN" report "$id"
  assert_success
  assert_output "ddprun: report of job $id written to $PWD/logs/$id/report.html"
  # progress.tsv: at most a sample per rank every 10 s, and the rounds' first and last
  wc -l logs/"$id"/progress.tsv
  /usr/bin/python3 "$CHECK" logs/"$id"/report.html logs/"$id" finished 1
  render logs/"$id"/report.html page.png
}

@test "ddprun report of a hung job, and of one whose rank failed: the hang as events.jsonl says, the failed rank's last lines in the exit table" {
  job "diagnose: {hang_after: 2s, on_hang: fail}" --steps 400 --compute-ms 20 --stop-rank 1 --stop-at 30
  run timeout 60 "$DDPRUN" job.yaml
  assert_failure 1
  id=$(basename logs/*/)
  run "$DDPRUN" report logs/"$id" -o hung.html
  assert_success
  /usr/bin/python3 "$CHECK" hung.html logs/"$id" hung
  # a rank that prints and fails: its last lines in the table, and only the last ten
  cat >fail.yaml <<'JOB'
command: /bin/sh -c 'if [ "$RANK" = 1 ]; then for i in $(seq 1 30); do echo "line $i of rank 1"; done; exit 3; fi; sleep 30'
nproc_per_node: 2
logs: {dir: flogs}
stop_grace: 1s
JOB
  run timeout 60 "$DDPRUN" fail.yaml
  assert_failure 1
  fid=$(basename flogs/*/)
  run "$DDPRUN" report flogs/"$fid" -o - # standard output
  assert_success
  echo "$output" >failed.html
  /usr/bin/python3 "$CHECK" failed.html flogs/"$fid" failed
  render failed.html failed.png
}

@test "ddprun report of a log folder cut short or edited by hand: a partial report that says so; without events.jsonl, one clear error" {
  mkdir -p cut
  cat >cut/events.jsonl <<'EV'
{"time": "2026-11-30T00:00:00.000Z", "t": 0.010, "event": "job_start", "round": 0, "job_id": "cut-job"}
{"time": "2026-11-30T00:00:00.100Z", "t": 0.100, "event": "membership", "round": 0, "nodes": "a, b", "world_size": 4}
{"time": "2026-11-30T00:00:00.150Z", "t": 0.150, "event": "workers_running", "round": 0, "world_size": 4}
not json at all
{"event": "node_lost", "t": "soon", "node": 7}
{"time": "2026-11-30T00:00:02.000Z", "t": 2.000, "event": "node_lost", "round": 0, "node": "b", "reason": "its <agent> & \"friends\" died"}
{"time": "2026-11-30T00:00:03.000Z", "t": 3.000, "event": "membership", "round": 1, "nodes": "a", "world_size": 99999999999}
{"time": "2026-11-30T00:00:03.500Z", "t": 3.5, "event": "hang", "round": 1, "seq": 4, "collective": "</script><script>alert(1)</script>", "ranks": "1"
EV
  printf '# ddprun progress 1\n0.5\t0\t0\ta\t10\t0\t0.1\tS\t0\ngarbage\n1.5\t0\t0\ta\t30\t0\t0.2\tS\t0\n-4\t0\t-1\tx\t1\t1\t1\tS\t0\n' >cut/progress.tsv
  printf '{"status": "failed", "ranks": [{"rank": 0, "state": "exited", "exit_code": 1, "log": "/nonexistent"' >cut/summary.json
  run "$DDPRUN" report cut -o cut.html
  assert_success
  assert_output --partial "(partial: some of its records could not be read)"
  grep -q "A partial report: 4 lines of events.jsonl and 2 of progress.tsv could not be read; summary.json could not be read" cut.html
  # the title and the data as they were, escaped: no markup of theirs in the page
  ! grep -q "<script>alert" cut.html || false
  grep -q "its &lt;agent&gt; &amp; &quot;friends&quot; died" cut.html
  /usr/bin/python3 "$CHECK" cut.html cut cut
  render cut.html cut.png
  # no events.jsonl: one clear error, nothing written
  mkdir empty
  touch empty/ddprun.log
  run "$DDPRUN" report empty -o e.html
  assert_failure 2
  assert_output "ddprun: error: report: empty/events.jsonl: No such file or directory (not a ddprun job's log folder?)"
  [ ! -e e.html ]
  run "$DDPRUN" report no-such-job
  assert_failure 2
  assert_output --partial "report: no job 'no-such-job' of yours on this machine"
}
