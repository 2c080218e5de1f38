#!/usr/bin/env bats
# Unmodified PyTorch DDP programs under ddprun (Debian's python3-torch, under /usr/bin/python3,
# or DDP_TEST_PYTHON's): on local ranks, on GPUs with NCCL where PyTorch sees one, and across SSH
# test hosts whose host name resolves to a loopback address, where Gloo must be told which
# interface reaches the other nodes (the agents choose it).
load '../lib/common'
load '../lib/sshd'

PY=${DDP_TEST_PYTHON:-/usr/bin/python3} # another PyTorch: DDP_TEST_PYTHON
TRAIN="$REPO/tests/integration/py/ddp_train.py"

setup() {
  "$PY" -c 'import torch' 2>/dev/null || skip "python3-torch is not installed (./dev.sh deps installs it)"
  cd "$BATS_TEST_TMPDIR"
}

teardown() {
  [ -n "${SSH_DIR:-}" ] && sshd_teardown
  true
}

# Every rank's "params sum" line is the same: the replicas agree.
replicas_equal() { # output n
  local sums
  sums=$(grep -o 'params sum [-0-9.]* after [0-9]* steps' <<<"$1" | sort -u)
  [ "$(grep -c 'params sum' <<<"$1")" -eq "$2" ] || { echo "expected $2 ranks' lines"; return 1; }
  [ "$(echo "$sums" | wc -l)" -eq 1 ] || { echo "replicas differ: $sums"; return 1; }
}

@test "an ordinary PyTorch DDP script (env://, DistributedSampler, DDP) runs on 2 local ranks" {
  printf 'command: [%s, %s]\nnproc_per_node: 2\nlogs: {dir: logs}\n' "$PY" "$TRAIN" >job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  replicas_equal "$output" 2
  assert_output --partial "rank 1 of 2: params sum"
}

@test "a rank's exception recorded by torch's @record (TORCHELASTIC_ERROR_FILE) names the failure: the line saying so, the summary with its traceback, summary.json" {
  cat >rec.py <<'PY'
import os, sys, time
MODE = sys.argv[1]
if MODE in ("raise", "long"):  # torch's own @record writes the file
    from torch.distributed.elastic.multiprocessing.errors import record
else:  # no @record (plain), or the rank writes the file itself: no torch to import (2-4 s)
    def record(f):
        return f
ef = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
print("error file", ef, flush=True)

def deep(n):  # a traceback of more than 30 lines (frames that alternate, so none is elided)
    if n:
        other(n - 1)
    raise ValueError("boom on rank 1\nsecond line")

def other(n):
    deep(n)

@record
def main():
    if os.environ["RANK"] == "1":
        if MODE == "garbage":
            open(ef, "w").write("not JSON")
            sys.exit(1)
        if MODE == "ok":
            open(ef, "w").write('{"message": "an old error"}')
            return
        if MODE == "long":  # 6,001 bytes, two to a character after "x": 2 KiB ends inside one
            raise ValueError("x" + "\u00e9" * 3000)
        deep(20)
    if MODE != "ok":
        time.sleep(30)

main()
PY
  # the rank is a shell's child: it reaches the file by the agent's /proc path
  job() { printf 'command: [/bin/sh, -c, "%s rec.py %s; exit $?"]\nnproc_per_node: 2\nlogs: {dir: logs}\n' "$PY" "$1" >job.yaml; }
  job raise
  run "$DDPRUN" job.yaml
  echo "$output"
  assert_failure 1
  assert_output --regexp "\[localhost:1\] error file /proc/[0-9]+/fd/[0-9]+"
  assert_line "ddprun: rank 1 (localhost) exited with status 1: ValueError: boom on rank 1 second line; stopping the job"
  assert_output --regexp "ddprun: first failure: rank 1 on 'localhost': exit 1: ValueError: boom on rank 1 second line; its traceback \(from TORCHELASTIC_ERROR_FILE; log .*/rank-1.log\):"
  assert_line '        raise ValueError("boom on rank 1\nsecond line")'
  assert_line "    second line"
  # its last 30 lines, after a line that says there were more
  tb=$(sed -n '/its traceback (from TORCHELASTIC_ERROR_FILE/,/^  rank /p' <<<"$output")
  [ "$(sed -n 2p <<<"$tb")" = "    ..." ]
  [ "$(grep -c '^    ' <<<"$tb")" -eq 31 ]
  refute_output --partial "last lines of"
  d=$(ls -d logs/*/)
  /usr/bin/python3 - "$d/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
f = s["failed_ranks"][0]
assert f["rank"] == 1 and f["error"] == "ValueError: boom on rank 1 second line", f
assert f["traceback"].startswith("Traceback (most recent call last):"), f
assert f["traceback"].endswith("ValueError: boom on rank 1\nsecond line\n"), f
PY
  grep -q '"reason": "rank 1 (localhost) exited with status 1: ValueError: boom on rank 1 second line"' "$d/events.jsonl"
  # not recorded (no @record), or not JSON: the exit and the log's last lines, as before
  for mode in plain garbage; do
    rm -rf logs
    job "$mode"
    run "$DDPRUN" job.yaml
    echo "$output"
    assert_failure 1
    assert_line "ddprun: rank 1 (localhost) exited with status 1; stopping the job"
    assert_output --regexp "ddprun: first failure: rank 1 on 'localhost': exit 1; last lines of"
    ! grep -q '"error"' logs/*/summary.json || false
    [ "$mode" = garbage ] || assert_output --partial "    ValueError: boom on rank 1" # the log's
  done
  # a long message: its first 2 KiB, cut between characters (summary.json stays UTF-8)
  rm -rf logs
  job long
  run "$DDPRUN" job.yaml
  assert_failure 1
  /usr/bin/python3 - logs/*/summary.json logs/*/events.jsonl <<'PY'
import json, sys
s = json.load(open(sys.argv[1], encoding="utf-8"))
e = s["failed_ranks"][0]["error"].encode()
assert e.startswith(b"ValueError: x\xc3\xa9") and len(e) == 2047, len(e)
# the reason (and the line that says it) holds the message's first 400 bytes, whole characters
assert s["reason"].endswith(": ValueError: x" + "\u00e9" * 193), s["reason"][-20:]
for line in open(sys.argv[2], encoding="utf-8"):
    json.loads(line)
PY
  # a rank that succeeds has no error, whatever its file holds
  job ok
  run "$DDPRUN" job.yaml
  assert_success
  # the job's env names its own file: torch writes there, ddprun reads nothing
  rm -rf logs
  job raise
  run "$DDPRUN" job.yaml --set "env.TORCHELASTIC_ERROR_FILE=$PWD/mine.json"
  assert_failure 1
  assert_line "[localhost:1] error file $PWD/mine.json"
  assert_line "ddprun: rank 1 (localhost) exited with status 1; stopping the job"
  grep -q '"message": "ValueError: boom on rank 1' mine.json
}

@test "the PyTorch example (examples/jobs/pytorch-fmnist.yaml) trains Fashion-MNIST above 80% in one epoch on 2 ranks; run again it resumes from its checkpoint" {
  trains
  [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || skip "needs dataset-fashion-mnist"
  job="$REPO/examples/jobs/pytorch-fmnist.yaml"
  ex="$REPO/examples/pytorch/fmnist_ddp.py"
  run "$DDPRUN" "$job" --set logs.dir="$PWD/logs" --set checkpoint.dir="$PWD/ck" \
    --set "command=[$PY, $ex, --epochs, '1']"
  assert_success
  replicas_equal "$output" 2
  acc=$(grep -o 'epoch 1/1: 2 ranks, train-loss [0-9.]*, test-acc [0-9.]*' <<<"$output" | grep -o '[0-9.]*$')
  echo "test accuracy after one epoch: $acc"
  awk -v a="$acc" 'BEGIN { exit !(a > 0.80) }'
  [ -s ck/fmnist_ddp.pt ]
  ! ls ck | grep -q tmp || false
  # run again for two epochs: it goes on from the first one's checkpoint
  run "$DDPRUN" "$job" --set logs.dir="$PWD/logs" --set checkpoint.dir="$PWD/ck" \
    --set "command=[$PY, $ex, --epochs, '2']"
  assert_success
  assert_output --partial "resuming from $PWD/ck/fmnist_ddp.pt after epoch 1"
  assert_output --regexp "epoch 2/2: 2 ranks, train-loss [0-9.]+, test-acc 0\.[89]"
  refute_output --partial "epoch 1/2"
  replicas_equal "$output" 2
}

@test "GPU: the same script on NCCL (DEVICE=cuda, a rank per GPU) ends where the CPU run ends" {
  ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) || ngpu=0
  [ "${ngpu:-0}" -ge 1 ] || skip "no CUDA device visible to this PyTorch"
  printf 'command: [%s, %s]\nnproc_per_node: %s\nlogs: {dir: logs}\n' "$PY" "$TRAIN" "$ngpu" >job.yaml
  run "$DDPRUN" job.yaml --set env.DEVICE=cuda
  assert_success
  replicas_equal "$output" "$ngpu"
  gpu=$(grep -o 'params sum [-0-9.]*' <<<"$output" | head -n1 | cut -d' ' -f3)
  run "$DDPRUN" job.yaml
  assert_success
  cpu=$(grep -o 'params sum [-0-9.]*' <<<"$output" | head -n1 | cut -d' ' -f3)
  echo "params sum: GPU $gpu, CPU $cpu"
  # Same data, order, initial weights and steps; only the devices' rounding differs (fp32,
  # TF32 off by default): a few 1e-6 over 40 steps. A step whose gradient is lost, doubled
  # or not averaged moves the sum by more than 1e-2.
  awk -v g="$gpu" -v c="$cpu" 'BEGIN { d = g - c; exit !(d < 1e-3 && d > -1e-3) }'
}

@test "across 3 SSH hosts whose host name resolves to loopback: Gloo uses the interface each agent chose" {
  [ "$(id -u)" -eq 0 ] || skip "the sshd test hosts need root"
  sshd_setup
  [ -n "$SSHD_NETNS" ] || skip "needs network namespaces (a host name resolving to loopback only matters across hosts)"
  for k in 1 2 3; do sshd_start "$k"; done
  # the host name these "nodes" share resolves to a loopback address, as Debian's default does
  getent hosts "$(hostname)" | grep -Eq '^127\.' || skip "this machine's host name does not resolve to loopback"
  ssh_job job.yaml 1 1 2 3 -- "$PY" "$TRAIN"
  run "$DDPRUN" job.yaml --log-level info
  echo "$output"
  assert_success
  replicas_equal "$output" 3
  # the TCPStore port is bound to the job's interface, the address the nodes reach the store at
  assert_output --regexp "serving PyTorch's TCPStore protocol on '10\.[0-9.]+'"
  # each node's ranks were given that node's own interface
  ssh_job env.yaml 1 1 2 3 -- /bin/sh -c 'echo "iface $GLOO_SOCKET_IFNAME $NCCL_SOCKET_IFNAME $TP_SOCKET_IFNAME"'
  run "$DDPRUN" env.yaml
  assert_success
  for k in 1 2 3; do
    assert_output --regexp "\\[$(sshd_addr $k | sed 's/\./\\./g'):$((k - 1))\\] iface (vn[0-9]+-$k) \\1 \\1"
  done
  # The control: told to use the loopback interface, as a host name resolving to 127.0.0.1
  # makes it, Gloo cannot reach the other nodes.
  SECONDS=0
  run "$DDPRUN" job.yaml --set env.GLOO_SOCKET_IFNAME=lo --set stop_grace=2s
  assert_failure 1
  assert_output --regexp "Connection refused|Connection reset|timed out|connect"
  [ "$SECONDS" -lt 120 ]
}

@test "elastically across 3 SSH hosts: one SIGKILLed mid-run, the survivors resume from the script's checkpoint" {
  [ "$(id -u)" -eq 0 ] || skip "the sshd test hosts need root"
  sshd_setup
  for k in 1 2 3; do sshd_start "$k"; done
  mkdir ckpt
  ssh_job job.yaml 1 1 2 3 -- "$PY" "$TRAIN"
  cat >>job.yaml <<JOB
env: {CKPT: $PWD/ckpt/model.pt, STEPS: "100", STEP_SLEEP: "0.05"}
elastic: {min_nodes: 2, max_restarts: 2, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
rendezvous: {last_call: 3s}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  # rank 0 has saved a checkpoint (step 10): the job is training on all three
  for _ in $(seq 600); do [ -e ckpt/model.pt ] && break; sleep 0.1; done
  [ -e ckpt/model.pt ] || { kill "$ddp"; cat out.txt; return 1; }
  kill -9 $(sshd_tree 3) $(sshd_ns_pids 3)
  rc=0; wait "$ddp" || rc=$?
  cat out.txt
  [ "$rc" -eq 0 ]
  grep -q "node '$(sshd_addr 3)' lost" out.txt
  # round 1 ran on the two others, from the checkpoint rank 0 wrote in round 0, to the end
  grep -Eq "^\[$(sshd_addr 1):0\] resumed at step [1-9][0-9]*0$" out.txt
  out=$(grep 'params sum' out.txt)
  replicas_equal "$out" 2
  grep -q "rank 1 of 2: params sum [-0-9.]* after 100 steps" out.txt
  grep -q '"event": "membership".*"world_size": 2' logs/*/events.jsonl
}
