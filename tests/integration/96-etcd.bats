#!/usr/bin/env bats
# rendezvous: {backend: etcd} (issue 19, part 2) against a real etcd (tests/lib/etcd.bash): the
# agents' leases, the launcher's watch, the round's resume point and the ranks' bootstrap keys
# live in the job's folder in etcd; no store runs on the login node.
load '../lib/common'
load '../lib/sshd'
load '../lib/etcd'
load '../lib/events'

FMNIST="$BUILD/ddprun-fmnist"

setup() {
  cd "$BATS_TEST_TMPDIR"
  need_etcd
}

# Three sshd test hosts, each a network namespace (else the test is skipped: why needs them).
three_ssh_hosts() { # why
  [ "$(id -u)" -eq 0 ] || skip "the sshd test hosts need root"
  sshd_setup
  [ -n "$SSHD_NETNS" ] || skip "needs network namespaces ($1)"
  for k in 1 2 3; do sshd_start "$k"; done
}

teardown() {
  [ -n "${SSH_DIR:-}" ] && sshd_teardown
  etcd_teardown
}

@test "rendezvous.backend etcd: what is missing or belongs to the other backend is an error at its line" {
  printf 'command: [true]\nrendezvous: {backend: etcd}\n' >a.yaml
  run "$DDPRUN" plan a.yaml
  [ "$status" -eq 2 ]
  assert_output --partial "a.yaml:2:23: rendezvous.backend: etcd needs rendezvous.endpoints"
  printf 'command: [true]\nrendezvous:\n  endpoints: [http://h:2379]\n' >b.yaml
  run "$DDPRUN" plan b.yaml
  assert_output --partial "b.yaml:3:14: rendezvous.endpoints is for backend: etcd"
  printf 'command: [true]\nrendezvous: {backend: etcd, endpoints: [h:2379]}\n' >c.yaml
  run "$DDPRUN" plan c.yaml
  assert_output --partial "'h:2379' is not an etcd endpoint: http://HOST:PORT, https://HOST:PORT or unix:///PATH"
  printf 'command: [true]\nrendezvous: {backend: etcd, endpoints: [http://h:1], port: 29500}\n' >d.yaml
  run "$DDPRUN" plan d.yaml
  assert_output --partial "rendezvous.port is the built-in store's; with backend: etcd no store runs"
  printf 'command: [true]\nrendezvous: {backend: etcd, endpoints: [http://h:1], tls: {ca: ca.pem}}\n' >e.yaml
  run "$DDPRUN" plan e.yaml
  assert_output --partial "rendezvous.tls needs https:// endpoints"
  printf 'command: [true]\nrendezvous: {backend: etcd, endpoints: [https://h:1], tls: {cert: c.pem}}\n' >f.yaml
  run "$DDPRUN" plan f.yaml
  assert_output --partial "rendezvous.tls: cert and key go together"
}

@test "a local job meets in etcd: the ranks train, the launcher's one TCP port is its agents' on loopback, the job's keys go with it" {
  etcd_start 1
  # the ranks stay until ./go exists, so the listing below sees the agent's lease key however
  # fast this machine trains (an agent revokes its lease as soon as its ranks are done)
  cat >train.sh <<SH
#!/bin/sh
"$FMNIST" "\$@" || exit
until [ -e "$PWD/go" ]; do sleep 0.05; done
SH
  chmod +x train.sh
  cat >job.yaml <<JOB
command: [$PWD/train.sh, --epochs, "1", --hidden, "64", --max-steps, "300"]
nproc_per_node: 2
rendezvous: {backend: etcd, endpoints: $ETCD_EP_LIST, prefix: /jobs/}
logs: {dir: logs}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event resumed
  # while it runs: the agent's lease key and the ranks' addresses are in the job's folder
  keys=$(etcd_keys)
  echo "$keys"
  id=$(basename logs/*/)
  grep -qx "/jobs/$id/kv/ddprun/nodes/0.1" <<<"$keys"
  grep -qx "/jobs/$id/kv/pg/default/addr/1" <<<"$keys"
  # ddprun itself listens on one TCP port, where its agents dial back, on loopback for a local
  # job (no store: its control socket is a Unix one)
  port=$(ev_field job_start agent_port)
  ss -ltnp | grep "pid=$ddp,"
  [ "$(ss -ltnp | grep -c "pid=$ddp,")" -eq 1 ]
  ss -ltnp | grep "pid=$ddp," | grep -q " 127\.0\.0\.1:$port "
  touch go
  wait "$ddp" || { cat out.txt; return 1; }
  grep -qF "rendezvous in etcd ($ETCD_EPS) under /jobs/$id/" out.txt
  grep -q "step 300 .*test-acc" out.txt
  # nothing of the job is left in etcd
  [ -z "$(etcd_keys | grep "^/jobs/")" ]
}

@test "etcd unreachable: one clear error naming the endpoint, status 3, nothing started" {
  printf 'command: [sleep, "30"]\nrendezvous: {backend: etcd, endpoints: ["http://127.0.0.1:1", "unix:///nonexistent/etcd.sock"]}\nlogs: {dir: logs}\n' >job.yaml
  run "$DDPRUN" job.yaml
  [ "$status" -eq 3 ]
  assert_output --partial "rendezvous.backend etcd: etcd at unix:///nonexistent/etcd.sock: "
  ! pgrep -fx "sleep 30" || false   # exactly the job's command: not a "sleep 300" elsewhere
}

@test "libcurl is loaded only for etcd: with it unloadable, an etcd job is one clear error (status 3) and a job without etcd runs" {
  [ "$(id -u)" -eq 0 ] || skip "needs root to hide libcurl in a mount namespace"
  lib=$(ldconfig -p | sed -n 's/.*libcurl\.so\.4 (libc6,x86-64) => //p' | head -n1)
  [ -n "$lib" ] || skip "libcurl.so.4 not found"
  printf 'command: [sleep, "30"]\nrendezvous: {backend: etcd, endpoints: ["http://127.0.0.1:1"]}\n' >etcd.yaml
  printf 'command: [echo, ran]\n' >plain.yaml
  # /dev/null over the library (and what it links to) in a mount namespace of this test's own
  run unshare -m sh -c "mount --bind /dev/null '$(readlink -f "$lib")' && '$DDPRUN' etcd.yaml"
  [ "$status" -eq 3 ]
  assert_output --partial "etcd needs libcurl, which cannot be loaded: "
  assert_output --partial "(install libcurl4)"
  ! pgrep -fx "sleep 30" || false
  run unshare -m sh -c "mount --bind /dev/null '$(readlink -f "$lib")' && '$DDPRUN' plain.yaml"
  assert_success
  assert_output --partial "[localhost:0] ran"
}

@test "3 SSH nodes meet in etcd over TCP and train; a node cut off the network is lost through its etcd lease; the job goes on from its checkpoint" {
  trains
  three_ssh_hosts "a node to cut off"
  etcd_start 1 "10.213.$SSHD_TAG.1"
  ssh_job job.yaml 1 1 2 3 -- "$FMNIST" --epochs 2 --hidden 64 --checkpoint-every 50 --eval-every 2
  cat >>job.yaml <<JOB
checkpoint: {dir: $PWD/ckpt}
elastic: {min_nodes: 2, max_restarts: 3, heartbeat_interval: 500ms, heartbeat_timeout: 2s, cooldown: 60s}
rendezvous: {backend: etcd, endpoints: $ETCD_EP_LIST, last_call: 3s}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event resumed
  for _ in $(seq 200); do [ -e ckpt/fmnist.ckpt ] && break; sleep 0.1; done
  [ -e ckpt/fmnist.ckpt ]
  # each rank listens on its own node's address, learned from its connection to etcd
  for k in 1 2 3; do etcd_keys | grep -q "kv/pg/default/addr/$((k - 1))$"; done
  t_cut=$(date +%s.%N)
  ip link set "vd$SSHD_TAG-3" down
  wait_event membership 2 || { cat out.txt; return 1; }
  t_lost=$(unix_of "$(events | grep '"event": "node_lost"' | head -n1 | grep -o '"time": "[^"]*' | cut -d'"' -f4)")
  # etcd ends a lease within its TTL (2 s) and the half second its leader checks them every
  awk -v a="$t_cut" -v b="$t_lost" 'BEGIN { d = b - a; print "detected after " d " s"; exit !(d > 1.4 && d <= 4) }'
  grep -q "node '$(sshd_addr 3)' lost: no heartbeat for 2.0 s" out.txt
  ip link set "vd$SSHD_TAG-3" up
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 0 ] || { cat out.txt; return 1; }
  [ "$(ev_field membership nodes | tail -n1)" = "$(sshd_addr 1), $(sshd_addr 2)" ]
  grep -q "\[$(sshd_addr 1):0\] resuming from $PWD/ckpt/fmnist.ckpt at step [1-9]" out.txt
  grep -q "\[$(sshd_addr 1):0\] epoch 2/2 step 1874 .*test-acc" out.txt
  acc=$(final_acc out.txt)
  awk -v a="$acc" 'BEGIN { exit !(a > 80) }'
  [ -z "$(etcd_keys | grep "^/ddprun/")" ]
}

@test "a 3-member etcd loses the member every client uses first mid-job: nothing changes, no restart" {
  etcd_start 3
  # heartbeat_timeout covers the failover with room: when the member killed is the leader, the
  # others elect one first (1 s election timeout), and a CI run under TSan on a busy 2-core VM
  # once took over 3 s to reach the store again
  cat >job.yaml <<JOB
command: [$FMNIST, --epochs, "1", --hidden, "64", --max-steps, "900"]
nodes: [{host: localhost, slots: 1}, {host: 127.0.0.1, slots: 1}]
elastic: {min_nodes: 2, max_restarts: 2, heartbeat_interval: 500ms, heartbeat_timeout: 8s}
rendezvous: {backend: etcd, endpoints: $ETCD_EP_LIST}
logs: {dir: logs}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event resumed
  etcd_kill 0
  rc=0; wait "$ddp" || rc=$?
  [ "$rc" -eq 0 ] || { cat out.txt; return 1; }
  grep -q "step 900 .*test-acc" out.txt
  [ "$(events | grep -c '"event": "membership"')" -eq 1 ] || { events; cat out.txt; return 1; }
  [ "$(events | grep -c '"event": "node_lost"')" -eq 0 ]
  [ -z "$(etcd_keys | grep "^/ddprun/")" ]
}

@test "ddprun doctor checks each etcd endpoint and the prefix from here, and each node's reach to etcd over TCP" {
  etcd_start 1 127.0.0.1
  printf 'command: [true]\nnproc_per_node: 2\nrendezvous: {backend: etcd, endpoints: ["%s", "http://127.0.0.1:1"], prefix: /team/}\n' "$ETCD_EPS" >job.yaml
  run "$DDPRUN" doctor job.yaml
  echo "$output"
  [ "$status" -eq 1 ]
  assert_output --regexp "$ETCD_EPS +ok: etcd 3\.[0-9.]+"
  assert_output --partial "http://127.0.0.1:1                       FAIL: etcd at http://127.0.0.1:1: "
  assert_output --partial "prefix /team/                            ok: written, read back and deleted"
  # the node's column: it reached etcd's port
  assert_output --regexp $'\n''node +ssh +host key +ddprun +workdir +command +port +etcd +interface +code +result'
  assert_output --regexp $'\n''localhost +local +local +ok +ok +ok +ok +ok +lo +[0-9a-f]{8} +pass'
  assert_output --partial "etcd: 1 check failed (above)"
  [ -z "$(etcd_keys | grep "^/team/")" ]
  printf 'command: [true]\nrendezvous: {backend: etcd, endpoints: ["%s"]}\n' "$ETCD_EPS" >ok.yaml
  run "$DDPRUN" doctor ok.yaml
  assert_success
}

@test "an unmodified PyTorch DDP script meets through etcd: rank 0 hosts its TCPStore, nothing on the launcher" {
  /usr/bin/python3 -c 'import torch' 2>/dev/null || skip "python3-torch is not installed (./dev.sh deps installs it)"
  etcd_start 1
  printf 'command: [/usr/bin/python3, %s]\nnproc_per_node: 2\nrendezvous: {backend: etcd, endpoints: %s}\nlogs: {dir: logs}\n' \
    "$REPO/tests/integration/py/ddp_train.py" "$ETCD_EP_LIST" >job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  [ "$(grep -o 'params sum [-0-9.]* after [0-9]* steps' <<<"$output" | sort -u | wc -l)" -eq 1 ]
  assert_output --partial "rank 1 of 2: params sum"
  grep -q '^TORCHELASTIC_USE_AGENT_STORE=False' <("$DDPRUN" plan job.yaml | tr ' ' '\n')
}

@test "etcd over TLS with client certificates: the job meets and trains; no client certificate or another CA is a clear error" {
  ETCD_TLS=1 etcd_start 1 127.0.0.1
  t="$ETCD_DIR/tls"
  cat >job.yaml <<JOB
command: [$FMNIST, --epochs, "1", --hidden, "64", --max-steps, "100"]
nproc_per_node: 2
rendezvous: {backend: etcd, endpoints: $ETCD_EP_LIST, tls: {ca: $t/ca.pem, cert: $t/client.pem, key: $t/client.key}}
logs: {dir: logs}
JOB
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "step 100 "
  [ -z "$(etcd_keys | grep "^/ddprun/")" ]
  # the ranks reached etcd with the same files (a rank without them could not have met)
  printf 'command: [true]\nrendezvous: {backend: etcd, endpoints: %s, tls: {ca: %s}}\nlogs: {dir: logs}\n' "$ETCD_EP_LIST" "$t/ca.pem" >nocert.yaml
  run "$DDPRUN" nocert.yaml
  [ "$status" -eq 3 ]
  assert_output --partial "rendezvous.backend etcd: etcd at $ETCD_EPS: "
  assert_output --partial "(the server may require a client certificate: none was given)"
  etcd_certs other
  printf 'command: [true]\nrendezvous: {backend: etcd, endpoints: %s, tls: {ca: other/ca.pem, cert: %s, key: %s}}\nlogs: {dir: logs}\n' "$ETCD_EP_LIST" "$t/client.pem" "$t/client.key" >wrongca.yaml
  run "$DDPRUN" wrongca.yaml
  [ "$status" -eq 3 ]
  assert_output --partial "(its certificate is not signed by the CA given, or does not name this host)"
}

@test "the launcher SIGKILLed mid-training: ddprun attach --etcd takes the job over, its ranks run on, and it sees the job finish with its summary" {
  trains
  etcd_start 1
  cat >job.yaml <<JOB
command: [$FMNIST, --epochs, "3", --hidden, "512,256", --max-steps, "2400"]
nproc_per_node: 2
rendezvous: {backend: etcd, endpoints: $ETCD_EP_LIST, prefix: /jobs/}
elastic: {heartbeat_interval: 500ms, heartbeat_timeout: 2s}
logs: {dir: logs}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event resumed # the ranks met and train
  id=$(basename logs/*/)
  ranks=$(pgrep -d, -f "^$FMNIST")
  [ "$(tr , '\n' <<<"$ranks" | wc -l)" -eq 2 ]
  kill -9 "$ddp"
  wait "$ddp" || true
  # no launcher: the ranks train on, their agent waits for a new one
  sleep 1
  for p in ${ranks//,/ }; do kill -0 "$p"; done
  # a launcher of another agent protocol (its HELLO says 99) takes nothing over: the agent
  # sends its own HELLO, drops the link at once and waits for the next; the ranks run on
  # (the launcher's end of the link played by tests/integration/py/agent_wire.py)
  run timeout 20 /usr/bin/python3 - "$DDPRUN" "$id" "$REPO/tests/integration/py" <<'PY'
import socket, struct, subprocess, sys, time
sys.path.insert(0, sys.argv[3])
import agent_wire
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(1)
tok = b"t" * 64
p = subprocess.Popen([sys.argv[1], "agent", "--rejoin", sys.argv[2], "0"], stdin=subprocess.PIPE)
p.stdin.write(agent_wire.boot_frame(tok, "127.0.0.1:%d" % l.getsockname()[1], 0, "0" * 32))
p.stdin.flush()  # and kept open: only the agent ends this link
link = agent_wire.accept(l, tok)
link.frame(0x08, struct.pack("<I", 99) + struct.pack("<I", 3) + b"9.9")
t = time.time()
kind, body = next(link.frames())
rest = list(link.frames())  # until the agent ends the link
print("hello", (bytes([kind]) + body[:4]).hex(), "rc", p.wait(), "after", round(time.time() - t, 1), "s")
PY
  echo "$output"
  assert_output --regexp "^hello 8807000000 rc 0 after [0-4]\.[0-9] s$"
  for p in ${ranks//,/ }; do kill -0 "$p"; done
  run "$DDPRUN" attach --etcd "$ETCD_EPS" --prefix /jobs/ "$id"
  echo "$output"
  [ "$status" -eq 0 ]
  assert_output --partial "job $id's launcher is "
  assert_output --partial "took over job $id from"
  # the ranks it took over are the ones that were running: they were never restarted
  [ "$(ev_field takeover nodes)" = 1 ]
  [ -z "$(ev_field membership nodes | sed -n 2p)" ]
  for p in ${ranks//,/ }; do ! kill -0 "$p" 2>/dev/null; done
  # their output after the takeover, and the summary: both ranks exited 0
  assert_output --regexp "step 2400 .*test-acc"
  assert_output --regexp "ddprun: job $id succeeded after [0-9.]+ s \(2 ranks on 1 node\)"
  grep -q "step 2400 .*test-acc" logs/"$id"/rank-0.log
  # nothing left: no agent, no rank, no key
  ! pgrep -f "ddprun agent" >/dev/null || false
  [ -z "$(etcd_keys | grep "^/jobs/")" ]
}

# Runs SCRIPT as a local job of 2 ranks meeting in etcd (EXTRA: more job keys, a line), waits
# until each rank printed "rank R MARK" and the launcher acknowledged it, then SIGSTOPs the
# launcher and creates ./stopped. Sets ddp (its pid) and id (the job's).
launcher_stopped_after() { # script mark [extra]
  cat >job.yaml <<JOB
command: [$1]
nproc_per_node: 2
rendezvous: {backend: etcd, endpoints: $ETCD_EP_LIST, prefix: /jobs/}
elastic: {heartbeat_interval: 500ms, heartbeat_timeout: 2s}
${3:-}
logs: {dir: logs}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event workers_running
  id=$(basename logs/*/)
  wait_for_line out.txt 30 "rank 0 $2"
  wait_for_line out.txt 30 "rank 1 $2"
  sleep 1 # its acknowledgement, sent right after, reaches the agent
  kill -STOP "$ddp"
  touch stopped
}

@test "output on its way to the launcher when it died is not lost: the launcher that takes over shows it, once, in order" {
  etcd_start 1
  # each rank prints a line the launcher shows (and acknowledges), a burst of lines while the
  # launcher is stopped (they wait in the agent's pipe to it, unread), then waits for ./go
  cat >burst.sh <<SH
#!/bin/sh
echo "rank \$RANK shown before"
until [ -e "$PWD/stopped" ]; do sleep 0.05; done
i=1
while [ \$i -le 400 ]; do echo "rank \$RANK line \$i"; i=\$((i + 1)); done
touch "$PWD/printed.\$RANK"
until [ -e "$PWD/go" ]; do sleep 0.05; done
echo "rank \$RANK saw go"
SH
  chmod +x burst.sh
  launcher_stopped_after "$PWD/burst.sh" "shown before"
  for _ in $(seq 100); do [ -e printed.0 ] && [ -e printed.1 ] && break; sleep 0.1; done
  [ -e printed.0 ] && [ -e printed.1 ]
  sleep 0.5 # the agent sends them on
  kill -9 "$ddp"
  wait "$ddp" || true
  ! grep -q " line " out.txt || false
  "$DDPRUN" attach --etcd "$ETCD_EPS" --prefix /jobs/ "$id" >att.txt 2>&1 &
  att=$!
  wait_for_line att.txt 30 "took over job $id from"
  touch go
  rc=0; wait "$att" || rc=$?
  cat att.txt
  [ "$rc" -eq 0 ]
  # what the old launcher showed is not shown again; every line of the burst exactly once and
  # in order, before what the ranks printed after
  ! grep -q "shown before" att.txt || false
  for r in 0 1; do
    grep -o "rank $r line [0-9]*" att.txt | cut -d' ' -f4 >lines.$r
    seq 400 | diff - lines.$r
    [ "$(grep -n "rank $r line 400" att.txt | cut -d: -f1)" -lt "$(grep -n "rank $r saw go" att.txt | cut -d: -f1)" ]
    [ "$(grep -c "rank $r line" logs/"$id"/rank-$r.log)" -eq 400 ]
  done
  grep -Eq "ddprun: job $id succeeded after [0-9.]+ s \(2 ranks on 1 node\)" att.txt
  ! pgrep -f "ddprun agent" >/dev/null || false
}

@test "a rank's error (torch's @record) on its way to the launcher when it died is not lost: the launcher that takes over names the failure with it" {
  etcd_start 1
  cat >err.json <<'JSON'
{"message": {"message": "RuntimeError: lost in transit", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 9, in step\nRuntimeError: lost in transit\n"}}}
JSON
  # rank 1 fails, as @record leaves it, while the launcher is stopped: its ERROR and EXITED wait
  # in the agent's pipe to it, unread, when it dies
  cat >err.sh <<SH
#!/bin/sh
echo "rank \$RANK up"
until [ -e "$PWD/stopped" ]; do sleep 0.05; done
[ "\$RANK" = 1 ] || exec sleep 59.17
cat "$PWD/err.json" >"\$TORCHELASTIC_ERROR_FILE"
touch "$PWD/failed"
exit 1
SH
  chmod +x err.sh
  launcher_stopped_after "$PWD/err.sh" up "stop_grace: 2s"
  for _ in $(seq 100); do [ -e failed ] && break; sleep 0.1; done
  [ -e failed ]
  sleep 0.5 # the agent sends ERROR and EXITED on
  kill -9 "$ddp"
  wait "$ddp" || true
  ! grep -q "exited with status" out.txt || false
  run "$DDPRUN" attach --etcd "$ETCD_EPS" --prefix /jobs/ "$id"
  echo "$output"
  assert_failure 1
  assert_line "ddprun: rank 1 (localhost) exited with status 1: RuntimeError: lost in transit; stopping the job"
  assert_output --partial "ddprun: first failure: rank 1 on 'localhost': exit 1: RuntimeError: lost in transit; its traceback (from TORCHELASTIC_ERROR_FILE;"
  assert_line '      File "train.py", line 9, in step'
  ! pgrep -f "sleep 59.17" >/dev/null || false
}

@test "3 SSH nodes, the launcher SIGKILLed: ddprun attach --etcd from a second login node takes the job over; the ranks run on and nothing is left anywhere" {
  trains
  three_ssh_hosts "a second login node"
  sshd_make_ns 4 # the second login node: no sshd; it reaches etcd and the nodes over the bridge
  etcd_start 1 "10.213.$SSHD_TAG.1"
  # each rank trains, prints a burst of lines while the launcher is stopped (they wait on their
  # way to it: the SSH connection, its bridge's pipe), a line once the launcher is dead (held
  # by its agent), then waits for ./go, which comes once the new launcher took over
  cat >train.sh <<SH
#!/bin/sh
"$FMNIST" "\$@" || exit
until [ -e "$PWD/stopped" ]; do sleep 0.05; done
i=1
while [ \$i -le 200 ]; do echo "rank \$RANK line \$i"; i=\$((i + 1)); done
touch "$PWD/printed.\$RANK"
until [ -e "$PWD/killed" ]; do sleep 0.05; done
echo "rank \$RANK printed while the job had no launcher"
until [ -e "$PWD/go" ]; do sleep 0.05; done
echo "rank \$RANK saw go"
SH
  chmod +x train.sh
  ssh_job job.yaml 1 1 2 3 -- "$PWD/train.sh" --epochs 1 --hidden 64 --max-steps 300
  cat >>job.yaml <<JOB
elastic: {heartbeat_interval: 500ms, heartbeat_timeout: 2s}
rendezvous: {backend: etcd, endpoints: $ETCD_EP_LIST}
JOB
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  ddp=$!
  wait_event resumed
  id=$(basename logs/*/)
  ranks=$(pgrep -d' ' -f "^/bin/sh $PWD/train.sh")
  [ "$(wc -w <<<"$ranks")" -eq 3 ]
  wait_for_line out.txt 60 "step 300 .*test-acc"
  kill -STOP "$ddp"
  touch stopped
  for _ in $(seq 100); do [ "$(ls printed.* 2>/dev/null | wc -l)" -eq 3 ] && break; sleep 0.1; done
  [ "$(ls printed.* | wc -l)" -eq 3 ]
  sleep 0.5 # the agents send them on
  kill -9 "$ddp"
  wait "$ddp" || true
  touch killed
  sleep 1
  for p in $ranks; do kill -0 "$p"; done
  ip netns exec "$(sshd_ns 4)" "$DDPRUN" attach --etcd "$ETCD_EPS" "$id" >att.txt 2>&1 &
  att=$!
  wait_for_line att.txt 30 "took over job $id from"
  touch go
  rc=0; wait "$att" || rc=$?
  cat att.txt
  [ "$rc" -eq 0 ]
  # its lease (2 s) ran out while it was stopped, or runs out while attach waits for it
  grep -qE "job $id's launcher is |took over job $id from a launcher already gone" att.txt
  # the three nodes' ranks were taken over, never restarted, and what they printed meanwhile
  # and afterwards reached the new launcher
  [ "$(ev_field takeover nodes)" = 3 ]
  [ -z "$(ev_field membership nodes | sed -n 2p)" ]
  grep -q "\[$(sshd_addr 1):0\] .*step 300 .*test-acc" out.txt
  ! grep -q " line " out.txt || false
  for k in 1 2 3; do
    # the burst on its way at the kill: each line once, in order
    grep -o "\[$(sshd_addr "$k"):$((k - 1))\] rank $((k - 1)) line [0-9]*" att.txt | cut -d' ' -f5 >lines.$k
    seq 200 | diff - lines.$k
    grep -q "\[$(sshd_addr "$k"):$((k - 1))\] rank $((k - 1)) printed while the job had no launcher" att.txt
    grep -q "\[$(sshd_addr "$k"):$((k - 1))\] rank $((k - 1)) saw go" att.txt
  done
  grep -Eq "ddprun: job $id succeeded after [0-9.]+ s \(3 ranks on 3 nodes\)" att.txt
  # nothing left: no rank, no agent on any node (only its sshd), no bridge here, no key in etcd
  for p in $ranks; do ! kill -0 "$p" 2>/dev/null; done
  for k in 1 2 3; do [ "$(sshd_ns_pids "$k")" = "$(cat "$SSH_DIR/node$k/sshd.pid")" ]; done
  [ -z "$(sshd_ns_pids 4)" ]
  ! pgrep -f "__ssh-bridge" >/dev/null || false
  [ -z "$(etcd_keys | grep "^/ddprun/")" ]
}
