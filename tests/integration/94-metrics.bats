#!/usr/bin/env bats
# Prometheus metrics (metrics.listen, --metrics; cli/supervisor/metrics.h): a running job's
# /metrics checked by promtool and scraped by a real Prometheus server (Debian's prometheus,
# run here on a free loopback port with its storage in the test's folder), and the HTTP port's
# answers to hostile clients.
load '../lib/common'
load '../lib/events'

PY=${DDP_TEST_PYTHON:-/usr/bin/python3}

setup() {
  cd "$BATS_TEST_TMPDIR"
  export XDG_RUNTIME_DIR="$BATS_TEST_TMPDIR/run"
  mkdir -m 700 "$XDG_RUNTIME_DIR"
}

teardown() {
  [ -n "${PROM_PID:-}" ] && kill -9 "$PROM_PID" 2>/dev/null
  [ -n "${DDP_PID:-}" ] && kill -9 "$DDP_PID" 2>/dev/null
  true
}

free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The metrics address the launcher printed (its port 0 made a free one).
metrics_url() {
  wait_for_line out.txt 30 "ddprun: metrics at http://"
  grep -o "http://[^ ]*/metrics" out.txt | head -n1
}

# Prometheus' answer to an instant query QUERY: "rank value" lines (or "- value" without a
# rank label), sorted.
promq() {
  curl -s "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" |
    /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["status"] == "success", d
for r in sorted(d["data"]["result"], key=lambda r: int(r["metric"].get("rank", "-1"))):
    print(r["metric"].get("rank", "-"), r["value"][1])'
}

# A PyTorch DDP script of 2 nodes x 1 rank (two local agents), elastic, with /metrics.
ddp_job() {
  "$PY" -c "import torch.distributed" 2>/dev/null || skip "needs PyTorch (Debian's python3-torch, or DDP_TEST_PYTHON's)"
  cat >ddp.py <<'PY'
import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100000):
    loss = model(torch.randn(8, 16)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.02)
PY
  cat >job.yaml <<JOB
command: [$PY, ddp.py]
nodes:
  - {host: localhost, slots: 1}
  - {host: 127.0.0.1, slots: 1}
logs: {dir: logs}
stop_grace: 2s
elastic: {min_nodes: 1, max_restarts: 1, heartbeat_interval: 300ms, heartbeat_timeout: 2s}
JOB
}

@test "a running job's /metrics passes promtool and a Prometheus server scrapes it: with the ranks SIGSTOPped, every rank with the values ddprun status shows, seconds since progress growing; a killed node counted lost" {
  command -v promtool >/dev/null || fail "prometheus is not installed (./dev.sh deps installs it)"
  ddp_job
  "$DDPRUN" --metrics 127.0.0.1:0 job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  url=$(metrics_url)
  ev_field metrics addr | grep -q "^127.0.0.1:[0-9]*$"
  # both ranks past some DDP steps
  for _ in $(seq 600); do
    [ "$(curl -s "$url" | grep -c '^ddprun_rank_ddp_steps_total{.*} [1-9]')" -eq 2 ] && break
    sleep 0.1
  done
  curl -s "$url" >m.txt
  grep -c '^ddprun_rank_ddp_steps_total{.*} [1-9]' m.txt | grep -qx 2
  # Prometheus' own checker finds nothing to say (names, types, units, help)
  run promtool check metrics <m.txt
  echo "$output"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  # nothing of the command line, environment or output in it
  ! grep -q "ddp\.py\|PATH=\|torch" m.txt || false
  # a Prometheus server scraping it every second
  PROM_PORT=$(free_port)
  cat >prom.yml <<YML
global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs:
  - job_name: ddprun
    static_configs: [{targets: ["${url#http://}"]}]
YML
  sed -i 's|/metrics"\]|"]|' prom.yml
  prometheus --config.file=prom.yml --storage.tsdb.path=prom-data \
    --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn >prom.log 2>&1 &
  PROM_PID=$!
  for _ in $(seq 300); do
    [ "$(promq 'ddprun_rank_collectives_total' 2>/dev/null | wc -l)" -eq 2 ] && break
    sleep 0.1
  done
  [ "$(promq 'ddprun_rank_collectives_total' | wc -l)" -eq 2 ] || { cat prom.log; false; }
  # the ranks stopped: their values freeze; once Prometheus saw them stopped, what it holds is
  # what ddprun status shows
  ranks=$("$DDPRUN" status | awk '$1 ~ /^[0-9]+$/ { print $3 }' | tr '\n' ' ')
  [ "$(wc -w <<<"$ranks")" -eq 2 ]
  kill -STOP $ranks
  for _ in $(seq 200); do
    [ "$(promq 'ddprun_rank_state{state="stopped"}' | wc -l)" -eq 2 ] && break
    sleep 0.1
  done
  promq 'ddprun_rank_state{state="stopped"}' >stopped.txt
  [ "$(cat stopped.txt)" = $'0 1\n1 1' ]
  "$DDPRUN" status >status.txt
  cat status.txt
  grep -qx "metrics: $url" status.txt
  promq 'ddprun_rank_collectives_total' >coll.txt
  cat coll.txt
  for r in 0 1; do
    row=$(grep -E "^$r +" status.txt)
    grep -q "stopped (SIGSTOP" <<<"$row"
    # "#N done", or "in OP #N+1 (...)": N collectives finished
    n=$(grep -oE '#[0-9]+' <<<"$row" | head -n1 | tr -d '#')
    grep -q " in [a-z_]* #" <<<"$row" && n=$((n - 1))
    [ "$(grep "^$r " coll.txt | cut -d' ' -f2)" = "$n" ]
  done
  a=$(promq 'ddprun_rank_seconds_since_progress{rank="0"}' | cut -d' ' -f2)
  sleep 2.5
  b=$(promq 'ddprun_rank_seconds_since_progress{rank="0"}' | cut -d' ' -f2)
  echo "seconds since progress: $a, then $b"
  awk -v a="$a" -v b="$b" 'BEGIN { exit !(b >= a + 1.5) }'
  # the second node's agent and rank killed: counted in nodes lost
  kill -CONT $ranks
  agent=$(local_agent_of 127.0.0.1)
  [ -n "$agent" ]
  kill -9 "$agent"
  for _ in $(seq 200); do
    [ "$(promq 'ddprun_job_nodes_lost_total' | cut -d' ' -f2)" = 1 ] && break
    sleep 0.1
  done
  [ "$(promq 'ddprun_job_nodes_lost_total' | cut -d' ' -f2)" = 1 ]
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  kill "$PROM_PID"
  wait "$PROM_PID" || true
  PROM_PID=
}

@test "the metrics port refuses what it does not serve: another address, garbage, a NUL, POST, another path, an 8 KiB head, a stalled half request, 1,000 connections; logs are rate-limited and the job is undisturbed" {
  cat >job.yaml <<JOB
command: ["$BUILD/tests/hangtest", --steps, "300", --compute-ms, "50"]
nproc_per_node: 2
logs: {dir: logs}
metrics: {listen: "127.0.0.1:0", allow: [127.0.0.2]}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  url=$(metrics_url)
  port=${url##*:}
  port=${port%/metrics}
  run timeout 60 /usr/bin/python3 "$REPO/tests/integration/py/metrics_hostile.py" 127.0.0.1 "$port"
  echo "$output"
  [ "$status" -eq 0 ]
  # the job ran on, and ends well
  rc=0; wait "$DDP_PID" || rc=$?
  DDP_PID=
  [ "$rc" -eq 0 ] || { cat out.txt; false; }
  grep -q "job .* succeeded" out.txt
  # about a thousand refusals, told in a line a second at most
  n=$(grep -c "metrics port:" out.txt)
  echo "$n lines of refusals"; grep "metrics port:" out.txt | head -5
  [ "$n" -ge 1 ] && [ "$n" -le 40 ]
}

@test "metrics keys: a listen address other machines reach needs metrics.allow; a malformed address or range, allow without listen: errors at their line" {
  printf 'command: [true]\nmetrics: {listen: "0.0.0.0:9400"}\n' >a.yaml
  run "$DDPRUN" plan a.yaml
  assert_failure 2
  assert_output --partial "a.yaml:2:"
  assert_output --partial "metrics.listen: 0.0.0.0 is not a loopback address; say who may read the metrics with metrics.allow"
  printf 'command: [true]\nmetrics: {listen: "0.0.0.0:9400", allow: [10.0.0.0/33]}\n' >b.yaml
  run "$DDPRUN" plan b.yaml
  assert_failure 2
  assert_output --partial "metrics.allow: '10.0.0.0/33' is not a numeric address or range"
  printf 'command: [true]\nmetrics: {allow: [10.0.0.0/8]}\n' >c.yaml
  run "$DDPRUN" plan c.yaml
  assert_failure 2
  assert_output --partial "metrics.allow needs metrics.listen"
  run "$DDPRUN" plan --metrics nohost c.yaml
  assert_failure 2
  printf 'command: [true]\nmetrics: {listen: "[::]:0", allow: [10.0.0.0/8, "fd00::/8"]}\n' >d.yaml
  run "$DDPRUN" plan d.yaml
  assert_success
  assert_output --partial "metrics: {listen: [::]:0, allow: [10.0.0.0/8, fd00::/8]}"
}
