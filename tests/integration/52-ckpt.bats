#!/usr/bin/env bats
# Checkpoints the agents replicate (checkpoint.replicas, cli/supervisor/ckpt.h): SSH test hosts
# with no folder in common, each host's checkpoint folder a private tmpfs in a mount namespace
# of its own (tests/lib/sshd.bash, SSHD_TMPFS). An unmodified PyTorch DDP script saves with
# torch.save into it; the agents copy each file it finishes to another host, and restore the
# newest copies before a round's ranks start.
load '../lib/common'
load '../lib/events'
load '../lib/sshd'
load '../lib/etcd'

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
  [ -n "${SSH_DIR:-}" ] && return 0 # (set up already)
  SSHD_TMPFS=$CK
  sshd_setup
  [ -n "$SSHD_NETNS" ] || skip "needs network namespaces"
}

teardown() {
  [ -n "${DDP_PID:-}" ] && kill -9 "$DDP_PID" 2>/dev/null
  [ -n "${SSH_DIR:-}" ] && sshd_teardown
  [ -n "${ETCD_DIR:-}" ] && etcd_teardown
  true
}

# sha256 of node K's copy of FILE (under the checkpoint folder), or "none"
copy_sha() { node_run "$1" sh -c "sha256sum '$CK/$2' 2>/dev/null | cut -d' ' -f1 || true" | grep . || echo none; }

# The warm interpreters in node K's namespace (cli/agent/warm.h).
warm_in() {
  local p n=0
  for p in $(sshd_ns_pids "$1"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ddprun-warm ] && n=$((n + 1))
  done
  echo $n
}

# Flips a byte of node K's copy of FILE through a shared mapping: as a failing disk would,
# unseen by the agent's watch (inotify reports no write through a mapping).
rot() { node_run "$1" "$PY" -c "import mmap, sys; f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 0); m[200] ^= 0xff; m.flush()" "$CK/$2"; }

# Closes node K's replication port to the others (nftables in its namespace: the table ddptest,
# deleted by open_port K): its packets dropped, or refused ("reject with tcp reset").
close_port() { # k verdict
  local port
  port=$(events | grep '"event": "checkpoint_port"' | grep "\"$(sshd_addr "$1")\"" | grep -o '"addr": "[^"]*' | sed 's/.*://')
  [ -n "$port" ]
  ip netns exec "$(sshd_ns "$1")" nft -f - <<NFT
table inet ddptest {
  chain input {
    type filter hook input priority 0;
    tcp dport $port $2;
  }
}
NFT
}
open_port() { ip netns exec "$(sshd_ns "$1")" nft delete table inet ddptest; }

# Waits until FILE's last recorded version is on nodes K... (60 s at most).
wait_copies() { # file k...
  local f=$1 k want ok
  shift
  for _ in $(seq 600); do
    want=$(events | grep '"event": "checkpoint_file"' | grep "\"path\": \"$f\"" | tail -n1 | grep -o '"sha256": "[0-9a-f]*' | cut -d'"' -f4)
    ok=1
    for k in "$@"; do [ -n "$want" ] && [ "$(copy_sha "$k" "$f")" = "$want" ] || ok=; done
    [ -n "$ok" ] && return 0
    sleep 0.1
  done
  echo "no copy of $f ($want) on nodes $* in time"; events; return 1
}

# The training job on nodes $2..., saving every 10 steps into the node-local folder.
train_job() { # file nodes... -- extra YAML lines
  local f=$1; shift
  local nodes=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do nodes+=("$1"); shift; done
  ssh_job "$f" 1 "${nodes[@]}" -- "$PY" -B "$TRAIN"
  cat >>"$f" <<JOB
env: {CKPT: $CK/model.pt, STEPS: "${STEPS:-160}", STEP_SLEEP: "${STEP_SLEEP:-0.1}", SAVE_UNTIL: "${SAVE_UNTIL:-0}", CKPT_PAD: "${PAD:-0}"}
elastic: {min_nodes: 2, max_restarts: 2, heartbeat_interval: 500ms, heartbeat_timeout: 2s${ELASTIC:-}}
rendezvous: {last_call: 1s}
warm: ${WARM:-off}
JOB
  [ "${1:-}" = -- ] && shift && printf '%s\n' "$@" >>"$f"
  return 0
}

@test "replicas: 1 on 4 hosts with private folders and a spare: rank 0's host SIGKILLed, the survivors resume from a peer's copy, the spare taken in holds it already and starts warm; the launcher reads none of its bytes" {
  need_hosts
  for k in 1 2 3 4 5; do sshd_start "$k"; done
  # each checkpoint 4 MiB besides the model
  PAD=4194304 ELASTIC=", max_nodes: 4" WARM=on train_job job.yaml 1 2 3 4 5 -- "checkpoint: {dir: $CK, replicas: 1}"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  # what the launcher receives over the network: each of its TCP connections' bytes_received
  # (ss -ti: the kernel's count), sampled to its end
  (while kill -0 "$DDP_PID" 2>/dev/null; do
    ss -Htinp 2>/dev/null | awk -v p="pid=$DDP_PID," '/users:/ { key = index($0, p) ? $4 " " $5 : ""; next }
      key != "" && match($0, /bytes_received:[0-9]+/) { print key, substr($0, RSTART + 15, RLENGTH - 15) } { key = "" }' >>rx.log
    sleep 0.2
  done) &
  wait_event membership
  # the first four nodes to join are round 0's members, the fifth its spare; rank 0 (the one
  # that saves) is on the first member
  members=$(ev_field membership nodes)
  spare="" victim="" others=""
  for k in 1 2 3 4 5; do
    if [[ ", $members," != *", $(sshd_addr "$k"),"* ]]; then spare=$k
    elif [ -z "$victim" ]; then victim=$k
    else others="$others $k"; fi
  done
  next=$((victim + 1)) # the node after the holder: K = 1 copy
  [ -n "$spare" ] && [ -n "$victim" ]
  echo "members: $members; spare $spare, victim $victim, next $next"
  # a checkpoint of step 30 or later, on its holder, the next node and the spare
  wait_event checkpoint_file 3 90
  wait_copies model.pt "$victim" "$next" "$spare"
  # the other members hold none: a new version goes to K other nodes and the spares
  for k in $others; do [ "$k" = "$next" ] || [ "$(copy_sha "$k" model.pt)" = none ]; done
  # the replication's lag in ddprun status
  "$DDPRUN" status >status.txt
  grep -Eq "^checkpoint replication: 1 file, (each with 1 copy|1 short of 1 copy)" status.txt || { cat status.txt; false; }
  # every slot's warm interpreter ready: the members' (after their first collective), the spare's
  for _ in $(seq 600); do
    n=0; for k in $others $spare; do [ "$(warm_in "$k")" -ge 1 ] && n=$((n + 1)); done
    [ "$n" -eq 4 ] && break
    sleep 0.1
  done
  [ "$n" -eq 4 ]
  # the host of rank 0 (the one that saves), everything on it
  kill -9 $(sshd_tree "$victim") $(sshd_ns_pids "$victim")
  rc=0; wait "$DDP_PID" || rc=$?
  DDP_PID=
  [ "$rc" -eq 0 ] || { cat out.txt; false; }
  # round 1 on the other four resumed from the copies, which those without one got before their
  # start (the spare taken in had one already)
  want4="" first=""
  for k in 1 2 3 4 5; do
    [ "$k" = "$victim" ] && continue
    want4="$want4${want4:+, }$(sshd_addr "$k")"
    [ -n "$first" ] || first=$k
  done
  [ "$(ev_field membership nodes | tail -n1)" = "$want4" ]
  grep -q "\[$(sshd_addr "$first"):0\] resumed at step [1-9][0-9]*0" out.txt || { cat out.txt; false; }
  events | grep -q '"event": "checkpoint_restored"'
  rec=$(events | grep '"event": "recovery"' | tail -n1)
  echo "$rec"
  grep -q '"restored_ms": [0-9]' <<<"$rec"
  grep -q '"restored_bytes": [1-9]' <<<"$rec"
  grep -q '"warm_ranks": 4' <<<"$rec"
  grep -q '"restored_s": [0-9]' logs/*/summary.json
  # the last version of the file, the same on its holders: what training ended with
  last=$(events | grep '"event": "checkpoint_file"' | tail -n1 | grep -o '"sha256": "[0-9a-f]*' | cut -d'"' -f4)
  n=0
  for k in $others $spare; do [ "$(copy_sha "$k" model.pt)" = "$last" ] && n=$((n + 1)); done
  [ "$n" -ge 2 ] || { for k in $others $spare; do copy_sha "$k" model.pt; done; echo "want $last"; false; }
  # the launcher's machine holds nothing of it (its folder is not any node's), and the launcher
  # received under 1% of the bytes of the versions it recorded
  [ -z "$(ls -A "$CK")" ]
  total=$(ev_field checkpoint_file size | awk '{ s += $1 } END { print s }')
  read_b=$(awk '{ k = $1 " " $2; if ($3 > m[k]) m[k] = $3 } END { for (k in m) s += m[k]; print s + 0 }' rx.log)
  echo "the launcher received $read_b bytes over $(cut -d' ' -f1,2 rx.log | sort -u | wc -l) connections; the checkpoints recorded: $total bytes"
  [ "$read_b" -gt 0 ] && [ "$total" -gt $((8 * 4194304)) ] && [ $((read_b * 100)) -lt "$total" ]
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

# The training job on NODES with checkpoint.replicas and on_corrupt: the first of HOLDERS saves
# model.pt at steps 10 and 20 (SAVE_UNTIL), the others of HOLDERS get copies; once they have,
# node ROT's copy rots and node LOSE is lost whole. Sets rc (ddprun's status) and want (the
# SHA-256 recorded).
rotten_run() { # replicas on_corrupt "nodes" "holders" rot lose
  local k
  for k in $3; do sshd_start "$k"; done
  rm -rf logs
  # shellcheck disable=SC2086
  STEPS=80 SAVE_UNTIL=20 train_job job.yaml $3 -- "checkpoint: {dir: $CK, replicas: $1, on_corrupt: $2}"
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_event checkpoint_file 2
  # shellcheck disable=SC2086
  wait_copies model.pt $4
  want=$(copy_sha "${4%% *}" model.pt)
  rot "$5" model.pt
  [ "$(copy_sha "$5" model.pt)" != "$want" ]
  kill -9 $(sshd_tree "$6") $(sshd_ns_pids "$6")
  rc=0; wait "$DDP_PID" || rc=$?
  DDP_PID=
  cat out.txt
}

@test "a holder's copy with a byte flipped on its disk is refused, and another holder's used; with no valid copy left the job fails naming the file, or with on_corrupt: restart starts again without it" {
  need_hosts
  # replicas 2: node 1's checkpoint of step 20 (its last) on nodes 2 and 3 too, none on node 4;
  # node 2's rots, node 1 is lost
  rotten_run 2 fail "1 2 3 4" "1 2 3" 2 1
  [ "$rc" -eq 0 ]
  # node 2's copy failed its check (by node 2 itself, or node 4 fetching it): node 3's was used
  grep -Eq "checkpoint model.pt: .*(does not match its record's SHA-256|SHA-256 differs from the record's: refused).*; fetched from $(sshd_addr 3):" out.txt
  grep -q "\[$(sshd_addr 2):0\] resumed at step 20" out.txt
  for k in 2 3 4; do [ "$(copy_sha "$k" model.pt)" = "$want" ]; done
  # again with one copy (replicas 1), rotten: no valid copy is left
  rotten_run 1 fail "5 6 7" "5 6" 6 5
  [ "$rc" -eq 1 ]
  grep -q "^ddprun: checkpoint: no valid copy left of model.pt (" out.txt
  grep -q '"reason": "checkpoint: no valid copy left of model.pt' logs/*/events.jsonl
  # no rank of the round started from it (its START was held, then stopped)
  ! grep -q "resumed at step" out.txt || false
  # the same with on_corrupt: restart: the file is removed everywhere and the next round starts
  # from the beginning
  rotten_run 1 restart "8 9 10" "8 9" 9 8
  [ "$rc" -eq 0 ]
  grep -q "^ddprun: checkpoint: no valid copy left of model.pt (.*); checkpoint.on_corrupt is restart: removed on every node, the round starts again without it" out.txt
  ! grep -q "resumed at step" out.txt || false
  [ "$(ev_field membership restart_count | tail -n1)" = 2 ]
}

# Ranks that only wait, on nodes 1-3 (replicas 1, min_nodes 2), running: their folders are the
# tests' to write.
idle_job() { # [extra YAML line]
  need_hosts
  for k in 1 2 3; do sshd_start "$k"; done
  ssh_job job.yaml 1 1 2 3 -- /bin/sh -c "while :; do sleep 0.1; done"
  cat >>job.yaml <<JOB
checkpoint: {dir: $CK, replicas: 1}
elastic: {min_nodes: 2, max_restarts: 1, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
${1:-}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_event checkpoint_port 3
  wait_event workers_running
}

@test "a file finished on a node after it was counted lost is neither copied nor restored; the next round's members get the version recorded before" {
  idle_job
  # node 3 finishes a file: recorded, and copied to the next node (node 1)
  node_run 3 sh -c "echo before >$CK/early.pt"
  wait_copies early.pt 3 1
  want=$(copy_sha 3 early.pt)
  # node 3's agent hangs; once it is counted lost, a file is finished there and early.pt written
  # again; then the agent goes on
  agent=$(for p in $(sshd_tree 3); do tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "^[^ ]*ddprun agent" && echo "$p"; done | head -n1)
  [ -n "$agent" ]
  kill -STOP "$agent"
  wait_event node_lost
  node_run 3 sh -c "echo after >$CK/late.pt; echo after >$CK/early.pt"
  kill -CONT "$agent" 2>/dev/null || true
  wait_event membership 2
  sleep 2 # (what node 3's agent had to say has come by now)
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  cat out.txt
  # neither late.pt nor early.pt's new version was recorded, copied or restored
  [ "$(ev_field checkpoint_file path | sort | uniq -c | tr -s ' ')" = " 1 early.pt" ]
  for k in 1 2; do
    [ "$(copy_sha "$k" late.pt)" = none ]
    [ "$(copy_sha "$k" early.pt)" = "$want" ]
  done
}

@test "ddprun-fmnist on 2 hosts with private folders: the host of rank 0 lost mid-write; the survivor resumes from its copy and ends bit for bit where the reference does" {
  trains
  need_hosts
  [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    fail "Debian's dataset-fashion-mnist is not installed (./dev.sh deps installs it)"
  FMNIST="$BUILD/ddprun-fmnist"
  for k in 1 2; do sshd_start "$k"; done
  # the reference does the same arithmetic: 2 simulated ranks up to the step-200 checkpoint, then
  # 1 from it (2 ranks on 2 hosts sum as on one: a sum of two is the same in either order)
  "$FMNIST" --simulate-ranks 2 --max-steps 200 --eval-every 0 --checkpoint-dir refck --checkpoint-every 100 >/dev/null
  "$FMNIST" --simulate-ranks 1 --max-steps 400 --eval-every 0 --checkpoint-dir refck --checkpoint-every 100 --dump "$PWD/ref.bin" >ref.txt
  grep -q "resuming from refck/fmnist.ckpt at step 200" ref.txt
  # round 0's rank 0 (node 1) dies in the middle of writing its step-300 checkpoint, and waits
  # there; node 1 is then lost whole. Round 1's rank compares its end with the reference.
  ssh_job job.yaml 1 1 2 -- /bin/sh -c "[ \$TORCHELASTIC_RESTART_COUNT = 0 ] && export FMNIST_CRASH_AT_STEP=300; $FMNIST --max-steps 400 --eval-every 0 --checkpoint-every 100 --compare $PWD/ref.bin --tol 0 || { [ \$TORCHELASTIC_RESTART_COUNT = 0 ] && echo CRASHED && sleep 1000; }"
  cat >>job.yaml <<JOB
checkpoint: {dir: $CK, replicas: 1}
elastic: {min_nodes: 1, max_restarts: 1, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  DDP_PID=$!
  wait_for_line out.txt 120 "$(sshd_addr 1):0\] CRASHED"
  # the step-200 checkpoint, on node 1 and copied to node 2
  wait_copies fmnist.ckpt 1 2
  kill -9 $(sshd_tree 1) $(sshd_ns_pids 1)
  rc=0; wait "$DDP_PID" || rc=$?
  DDP_PID=
  [ "$rc" -eq 0 ] || { cat out.txt; false; }
  grep -q "\[$(sshd_addr 2):0\] resuming from $CK/fmnist.ckpt at step 200" out.txt || { cat out.txt; false; }
  grep -q "compare: max |difference| from $PWD/ref.bin = 0 (tolerance 0)" out.txt
  [ "$(ev_field membership world_size | tail -n1)" = 1 ]
  # the launcher's machine holds none of it
  [ -z "$(ls -A "$CK")" ]
}

@test "a node that cannot keep copies (no checkpoint.dir there) stops the job with one message naming it and why" {
  cat >job.yaml <<JOB
command: ["/bin/sh", "-c", "sleep 30"]
nodes: [{host: localhost, slots: 1}, {host: 127.0.0.1, slots: 1}]
checkpoint: {dir: $PWD/no-such-folder, replicas: 1}
logs: {dir: logs}
stop_grace: 1s
JOB
  run timeout 60 "$DDPRUN" job.yaml
  echo "$output"
  [ "$status" -eq 1 ]
  assert_output --regexp "ddprun: checkpoint: node '(localhost|127\.0\.0\.1)' cannot keep copies of checkpoint.dir: checkpoint.dir $PWD/no-such-folder: No such file or directory"
}

@test "a version lost with its node before any copy was made: the version before it is restored; a file with no copy at all is removed everywhere" {
  idle_job
  node_run 1 sh -c "echo v1 >$CK/a.pt"
  wait_copies a.pt 1 2
  v1=$(copy_sha 1 a.pt)
  # node 1's replication port closed to the others (nftables in its namespace): its records still
  # reach the launcher, no copy leaves it
  close_port 1 drop
  node_run 1 sh -c "echo v2 >$CK/a.tmp && mv $CK/a.tmp $CK/a.pt; echo only >$CK/b.pt"
  for _ in $(seq 300); do [ "$(ev_field checkpoint_file path | grep -c .)" -ge 3 ] && break; sleep 0.1; done
  [ "$(ev_field checkpoint_file path | grep -c .)" -ge 3 ] || { events; false; }
  kill -9 $(sshd_tree 1) $(sshd_ns_pids 1)
  wait_event membership 2
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  cat out.txt
  grep -q "^ddprun: checkpoint: a.pt's newest version was lost with node '$(sshd_addr 1)' before it was copied; the version before it is restored" out.txt
  grep -q "^ddprun: checkpoint: b.pt was lost with node '$(sshd_addr 1)' before any copy of it was made; it is removed on every node" out.txt
  for k in 2 3; do
    [ "$(copy_sha "$k" a.pt)" = "$v1" ]
    [ "$(copy_sha "$k" b.pt)" = none ]
  done
}

@test "the launcher SIGKILLed with a record on its way: ddprun attach --etcd goes on from the records in etcd and the record in flight; a node lost after it is restored from them" {
  need_etcd
  need_hosts
  etcd_start 1 "10.213.$SSHD_TAG.1"
  idle_job "rendezvous: {backend: etcd, endpoints: $ETCD_EP_LIST}"
  id=$(basename logs/*/)
  # node 1 finishes a.pt: recorded (in etcd too) and copied to node 2
  node_run 1 sh -c "head -c 300000 /dev/urandom >$CK/a.pt"
  wait_copies a.pt 1 2
  a=$(copy_sha 1 a.pt)
  etcd_keys | grep -qx "/ddprun/$id/ckpt/a.pt"
  # the launcher stops reading; node 3 finishes b.pt, whose record waits on its way; the
  # launcher dies without having read it
  kill -STOP "$DDP_PID"
  node_run 3 sh -c "head -c 200000 /dev/urandom >$CK/b.pt"
  b=$(copy_sha 3 b.pt)
  sleep 1.5 # settled, hashed and sent
  kill -9 "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  # a record someone edited by hand: left out with one warning
  etcd_curl 0 /v3/kv/put -d "{\"key\": \"$(printf '%s' "/ddprun/$id/ckpt/junk.pt" | base64 -w0)\", \"value\": \"$(printf 'ddprun-ckpt 1\nv 1 x' | base64 -w0)\"}" | grep -q revision
  "$DDPRUN" attach --etcd "$ETCD_EPS" "$id" >att.txt 2>&1 &
  DDP_PID=$!
  wait_for_line att.txt 30 "took over job $id from"
  grep -q "ddprun: warning: 1 checkpoint record in etcd is malformed (/ddprun/$id/ckpt/junk.pt): left out" att.txt
  # b.pt's record reached the new launcher: recorded, and copied to the node after node 3
  wait_copies b.pt 3 1
  etcd_keys | grep -qx "/ddprun/$id/ckpt/b.pt"
  # node 1 (a.pt's first holder, b.pt's copy) lost: node 3 gets a.pt and node 2 b.pt (copied
  # again at the loss, or by the restore of the round on nodes 2 and 3), from what this launcher
  # was told and what the last one recorded
  kill -9 $(sshd_tree 1) $(sshd_ns_pids 1)
  wait_event node_lost
  wait_event checkpoint_restored 1 60
  for k in 2 3; do
    [ "$(copy_sha "$k" a.pt)" = "$a" ]
    [ "$(copy_sha "$k" b.pt)" = "$b" ]
  done
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  cat att.txt
  # the job's keys went with it
  [ -z "$(etcd_keys | grep "^/ddprun/$id/")" ]
}

@test "a copy that fails is asked for again: the holder's port refused, the file is short of its copy in ddprun status; once open again, the copy is made" {
  idle_job
  close_port 3 "reject with tcp reset"
  node_run 3 sh -c "echo c >$CK/c.pt"
  wait_for_line out.txt 30 "ddprun: checkpoint: node '$(sshd_addr 1)' could not copy c.pt: .*; trying again every 5 s"
  "$DDPRUN" status >status.txt
  grep -Eq "^checkpoint replication: 1 file, 1 short of 1 copy, lag [0-9.]+ s" status.txt || { cat status.txt; false; }
  [ "$(copy_sha 1 c.pt)" = none ]
  sleep 5.5 # (tried again, and failed again)
  open_port 3
  wait_copies c.pt 3 1
  "$DDPRUN" status >status.txt
  grep -q "^checkpoint replication: 1 file, each with 1 copy" status.txt || { cat status.txt; false; }
  kill -INT "$DDP_PID"
  wait "$DDP_PID" || true
  DDP_PID=
  # said once, not at each try
  [ "$(grep -c "could not copy c.pt" out.txt)" -eq 1 ]
}
