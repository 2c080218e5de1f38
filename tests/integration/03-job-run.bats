#!/usr/bin/env bats
# Running local jobs: the rank environment, tagged output, per-rank logs, failures and summaries.
load '../lib/common'
bats_require_minimum_version 1.5.0

setup() {
  cd "$BATS_TEST_TMPDIR"
}

logdir() { # the one job folder under ddprun-logs
  ls -d "$BATS_TEST_TMPDIR"/ddprun-logs/*/ | head -n1
}

@test "a 4-rank job: every rank checks its environment and meets the others at the store" {
  printf 'name: envcheck\ncommand: [%s, env-check]\nnproc_per_node: 4\n' "$STORETOOL" >job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  for r in 0 1 2 3; do
    assert_line "[localhost:$r] env ok rank $r of 4 (local $r of 4, node 0)"
  done
  assert_output --regexp "job envcheck-[0-9]{8}-[0-9]{6}-[0-9a-f]{4} succeeded"
  # the store counted them: the agent's connections (its own, and its store proxy's for the 4
  # ranks: one for their requests, one for each WAIT of different keys at once), fewer than a
  # connection a rank, and their requests (each connection's handshake is two)
  grep -Eq '"store": \{"connections": [2-4], "requests": ([1-9][0-9]|[1-9][0-9]{2,})\}' "$(logdir)/summary.json" ||
    { cat "$(logdir)/summary.json"; return 1; }
}

@test "output is tagged on the console and kept untagged in per-rank logs" {
  printf 'command: "echo out-$RANK; echo err-$RANK >&2"\nnproc_per_node: 2\n' >job.yaml
  run --separate-stderr "$DDPRUN" job.yaml
  assert_success
  assert_line "[localhost:0] out-0"
  assert_line "[localhost:1] out-1"
  [[ "$stderr" == *"[localhost:1] err-1"* ]]
  [[ "$output" != *"err-1"* ]]   # stderr lines stay on stderr
  d=$(logdir)
  grep -qx "out-1" "$d/rank-1.log"
  grep -qx "err-1" "$d/rank-1.log"
  ! grep -q "out-0" "$d/rank-1.log" || false
  grep -q '"status": "succeeded"' "$d/summary.json"
  grep -q '"exit_status": 0' "$d/summary.json"
}

@test "tag_output: false prints lines as they are" {
  printf 'command: "echo plain-$RANK"\nlogs: {tag_output: false}\n' >job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  assert_line "plain-0"
}

@test "lines of busy ranks never interleave within a line" {
  # 4 ranks each write 3000 lines of 200 characters as fast as they can.
  printf 'command: "for i in $(seq 3000); do printf \\"%%s%%0200d\\\\n\\" $RANK 0; done"\nnproc_per_node: 4\n' >job.yaml
  "$DDPRUN" job.yaml >out.txt 2>err.txt
  [ "$(wc -l <out.txt)" -eq 12000 ]
  # every line is exactly one rank's tag followed by that rank's own 201 characters
  bad=$(grep -cvE '^\[localhost:([0-3])\] \10{200}$' out.txt || true)
  [ "$bad" -eq 0 ]
  for r in 0 1 2 3; do [ "$(wc -l <"$(logdir)/rank-$r.log")" -eq 3000 ]; done
}

@test "a failing rank stops the job: status 1 and a summary naming it with its last lines" {
  printf 'name: failing\ncommand: "echo start-$RANK; if [ $RANK = 2 ]; then echo about to fail >&2; exit 3; fi; exec sleep 60"\nnproc_per_node: 4\nstop_grace: 2s\n' >job.yaml
  SECONDS=0
  run "$DDPRUN" job.yaml
  assert_failure 1
  [ "$SECONDS" -lt 10 ]
  assert_output --partial "rank 2 (localhost) exited with status 3; stopping the job"
  assert_output --partial "first failure: rank 2 on 'localhost': exit 3; last lines of"
  assert_output --partial "    about to fail"
  assert_output --regexp "  0 +localhost +stopped \(SIGTERM\)"
  assert_output --regexp "  2 +localhost +exit 3"
  grep -q '"first_failed_rank": 2' "$(logdir)/summary.json"
  grep -q '"status": "failed"' "$(logdir)/summary.json"
}

@test "a rank killed by a signal is reported by signal" {
  printf 'command: "kill -SEGV $$"\n' >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure 1
  assert_output --partial "rank 0 (localhost) was killed by signal 11 (Segmentation fault)"
}

@test "a command that cannot be started is a launch error (status 3)" {
  printf 'command: [/nonexistent/trainer, --x]\nnproc_per_node: 2\n' >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure 3
  assert_output --partial "ddprun agent: cannot run '/nonexistent/trainer': No such file or directory"
  assert_output --partial "launch failed"
  # where a program not found was looked for: a relative path in the workdir, a bare name on
  # the ranks' PATH
  mkdir -p wd
  printf 'command: [bin/trainer]\nworkdir: wd\n' >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure 3
  assert_output --partial "ddprun agent: cannot run 'bin/trainer': No such file or directory (a path relative to the workdir, $PWD/wd)"
  printf 'command: [no-such-trainer]\n' >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure 3
  assert_output --partial "ddprun agent: cannot run 'no-such-trainer': No such file or directory (no such program on the ranks' PATH)"
}

@test "a remote node nobody answers for is a launch error (status 3) naming it; the local node is stopped" {
  printf 'command: [sleep, "30"]\nnodes: [localhost, 127.0.0.9]\nssh: {port: 1}\n' >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure 3
  assert_output --partial "ddprun: error: node '127.0.0.9': cannot connect to 127.0.0.9 port 1"
  assert_output --partial "node '127.0.0.9' could not be provisioned"
  ! pgrep -f "^sleep 30$" || false
}

@test "env, workdir and checkpoint.dir reach the ranks; NCCL async error handling as torchrun sets it; the limit on open files the user gave" {
  mkdir -p work
  printf 'command: "echo $SEED $(pwd) $DDPRUN_CHECKPOINT_DIR $OMP_NUM_THREADS"\nworkdir: work\nenv: {SEED: "42"}\ncheckpoint: {dir: ckpt}\nnproc_per_node: 2\n' >job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  # every relative path of a job is relative to the job file's folder
  assert_line "[localhost:0] 42 $BATS_TEST_TMPDIR/work $BATS_TEST_TMPDIR/ckpt 1"
  # NCCL's async error handling, as torchrun sets it unless the shell or the job does
  printf 'command: "echo async $NCCL_ASYNC_ERROR_HANDLING $TORCH_NCCL_ASYNC_ERROR_HANDLING"\n' >nccl.yaml
  run env -u NCCL_ASYNC_ERROR_HANDLING -u TORCH_NCCL_ASYNC_ERROR_HANDLING "$DDPRUN" nccl.yaml
  assert_line "[localhost:0] async 1 1"
  run env NCCL_ASYNC_ERROR_HANDLING=0 "$DDPRUN" nccl.yaml --set env.TORCH_NCCL_ASYNC_ERROR_HANDLING=3
  assert_line "[localhost:0] async 0 3"
  # one name set: the other takes its value (torch 2.2+ reads the new name first)
  run env NCCL_ASYNC_ERROR_HANDLING=0 "$DDPRUN" nccl.yaml
  assert_line "[localhost:0] async 0 0"
  run env -u NCCL_ASYNC_ERROR_HANDLING "$DDPRUN" nccl.yaml --set env.TORCH_NCCL_ASYNC_ERROR_HANDLING=3
  assert_line "[localhost:0] async 3 3"
  run "$DDPRUN" plan nccl.yaml
  assert_line "NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1   # as torchrun, unless set"
  # the limit on open files the user gave ddprun, as under torchrun, though the launcher's
  # store raises its own to the hard limit
  printf 'command: "echo nofile $(ulimit -Sn)"\n' >nofile.yaml
  run bash -c 'ulimit -Sn 300 && exec "$0" nofile.yaml' "$DDPRUN"
  assert_line "[localhost:0] nofile 300"
}

@test "NCCL_ASYNC_ERROR_HANDLING that ddprun set is dropped in Python ranks once torch >= 2.2 is imported (it warns on every rank); torch 2.1, the user's own, DDPRUN_PYTHON_STACKS=0 keep it" {
  # a stand-in for torch: the version and the module whose import the sitecustomize waits for
  mkdir -p fake/torch/distributed
  : >fake/torch/distributed/__init__.py
  : >fake/torch/distributed/distributed_c10d.py
  cat >show.py <<'PY'
import os
print("before", os.environ.get("NCCL_ASYNC_ERROR_HANDLING"))
import torch.distributed.distributed_c10d
print("torch %s: %s %s %s" % (torch.__version__, os.environ.get("NCCL_ASYNC_ERROR_HANDLING"),
      os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"),
      [k for k in os.environ if k.startswith("DDPRUN_PY_")]))
PY
  printf 'command: [/usr/bin/python3, show.py]\nenv: {PYTHONPATH: %s/fake}\n' "$PWD" >job.yaml
  unset NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_ASYNC_ERROR_HANDLING
  echo '__version__ = "2.11.0+cu130"' >fake/torch/__init__.py
  run "$DDPRUN" job.yaml
  assert_success
  assert_line "[localhost:0] before 1"
  assert_line "[localhost:0] torch 2.11.0+cu130: None 1 []"
  # the finder without the flight recorder
  run "$DDPRUN" job.yaml --set env.DDP_FLIGHT_RECORDER=0
  assert_line "[localhost:0] torch 2.11.0+cu130: None 1 []"
  # set by the user: theirs, as torchrun leaves it
  run env NCCL_ASYNC_ERROR_HANDLING=1 "$DDPRUN" job.yaml
  assert_line "[localhost:0] torch 2.11.0+cu130: 1 1 []"
  # no sitecustomize: nothing drops it, and no marker is left behind
  run "$DDPRUN" job.yaml --set env.DDPRUN_PYTHON_STACKS=0
  assert_line "[localhost:0] torch 2.11.0+cu130: 1 1 []"
  # torch 2.1 reads the old name only
  echo '__version__ = "2.1.2"' >fake/torch/__init__.py
  run "$DDPRUN" job.yaml
  assert_line "[localhost:0] torch 2.1.2: 1 1 []"
}

# The value of "key" in the JSON object on the line of $2 (a file) that has "$1" in it.
jfield() { grep -- "$1" "$3" | grep -o "\"$2\": \(\"[^\"]*\"\|[^,}]*\)" | head -n1 | sed 's/^[^:]*: //'; }

@test "summary.json and events.jsonl tell the same outcome: a segfault, an interrupt, a program that cannot start" {
  # a segfault: the rank's own signal in both, the others stopped by ddprun
  printf 'command: "[ $RANK = 1 ] && kill -SEGV $$; exec sleep 30"\nnproc_per_node: 2\nstop_grace: 2s\nlogs: {dir: logs}\n' >job.yaml
  run "$DDPRUN" job.yaml --set env.SEED=7
  assert_failure 1
  d=$(ls -d logs/*/)
  ev=$d/events.jsonl sm=$d/summary.json
  [ "$(jfield worker_failed signal "$ev")" = '"SIGSEGV"' ]
  [ "$(jfield worker_failed exit_code "$ev")" = null ]
  grep -q '{"rank": 1, "host": "localhost", "state": "signaled", "exit_code": null, "signal": "SIGSEGV", "signal_number": 11, "stopped_by_ddprun": false}' "$sm"
  # only rank 1 failed; rank 0 was stopped by ddprun and says so
  [ "$(grep -A3 '"failed_ranks"' "$sm" | grep -c '"rank"')" -eq 1 ]
  grep -q '"rank": 0, "host": "localhost", "local_rank": 0, "state": "signaled", "exit_code": null, "signal": "SIGTERM", "signal_number": 15, "stopped_by_ddprun": true' "$sm"
  [ "$(jfield job_end status "$ev")" = '"failed"' ] && grep -q '"status": "failed"' "$sm"
  # the run's facts: times, command, overrides, the resolved spec, ddprun's own messages
  grep -Eq '"started": "20[0-9-]+T[0-9:.]+Z", "ended": "20[0-9-]+T[0-9:.]+Z"' "$sm"
  grep -q '"command": "\[ $RANK = 1 \] && kill -SEGV $$; exec sleep 30"' "$sm"
  grep -q '"overrides": \["--set env.SEED=7"\]' "$sm"
  grep -q "^  SEED: 7" "$d/spec.yaml"
  grep -q "ddprun: rank 1 (localhost) was killed by signal 11 (Segmentation fault); stopping the job" "$d/ddprun.log"
  # an interrupt: "interrupted" in both
  rm -rf logs
  printf 'command: [sleep, "30"]\nlogs: {dir: logs}\n' >job.yaml
  "$DDPRUN" job.yaml >out.txt 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q workers_running logs/*/events.jsonl 2>/dev/null && break; sleep 0.05; done
  kill -INT "$pid"
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -eq 130 ]
  d=$(ls -d logs/*/)
  [ "$(jfield job_end status "$d/events.jsonl")" = '"interrupted"' ]
  grep -q '"status": "interrupted", "exit_status": 130' "$d/summary.json"
  # a program that cannot start: "not_started" in both, with the reason
  rm -rf logs
  printf 'command: [/nonexistent/trainer]\nlogs: {dir: logs}\n' >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure 3
  d=$(ls -d logs/*/)
  [ "$(jfield worker_failed state "$d/events.jsonl")" = '"not_started"' ]
  grep -q "\"reason\": \"rank 0 (localhost) did not start: ddprun agent: cannot run '/nonexistent/trainer': No such file or directory\"" "$d/events.jsonl"
  grep -q '"status": "launch_failed", "exit_status": 3' "$d/summary.json"
  grep -q '{"rank": 0, "host": "localhost", "state": "not_started"' "$d/summary.json"
}

@test "rank logs with timestamps; the console shows only the ranks chosen with --ranks, the logs keep all" {
  printf 'command: "echo hello from $RANK"\nnproc_per_node: 3\nlogs: {dir: logs, timestamps: true}\n' >job.yaml
  run "$DDPRUN" job.yaml --ranks 0,2
  assert_success
  assert_line "[localhost:0] hello from 0"
  assert_line "[localhost:2] hello from 2"
  refute_output --partial "hello from 1"
  d=$(ls -d logs/*/)
  grep -Eqx "20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\.[0-9]{3}Z hello from 1" "$d/rank-1.log"
  run "$DDPRUN" plan job.yaml --ranks 1-2
  assert_output --partial "console_ranks: 1-2, jsonl: false}"
  run "$DDPRUN" plan job.yaml --ranks 2-1
  assert_failure 2
  assert_output --partial "--ranks 2-1: logs.console_ranks must be 'all' or ranks and ranges such as 0 or 0,4-7, got '2-1'"
}

@test "logs.jsonl: every rank's lines in output.jsonl, one JSON object each, whatever bytes they hold" {
  cat >job.yaml <<'JOB'
command: ["/bin/sh", "-c", "echo out $RANK; printf 'err \\377 \\t \"q\" \\\\ \\342\\202\\254 \\001\\n' >&2; echo last $RANK"]
nproc_per_node: 2
logs: {dir: logs, jsonl: true}
JOB
  run "$DDPRUN" job.yaml
  assert_success
  d=$(ls -d logs/*/)
  # every line parses; each stream of a rank in its order; invalid UTF-8 as U+FFFD, the rest as
  # written (printed as Python's ascii() of each list)
  run /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in (0, 1):
    for s in ("stdout", "stderr"):
        print(r, s, ascii([(x["round"], x["host"], x["line"]) for x in rows
                           if x["rank"] == r and x["stream"] == s]))
print(all(x["time"].endswith("Z") and x["t"] >= 0 for x in rows), len(rows))' "$d/output.jsonl"
  assert_success
  for r in 0 1; do
    assert_line "$r stdout [(0, 'localhost', 'out $r'), (0, 'localhost', 'last $r')]"
    assert_line "$r stderr [(0, 'localhost', 'err \\ufffd \\t \"q\" \\\\ \\u20ac \\x01')]"
  done
  assert_line "True 6"
  # off by default
  run "$DDPRUN" job.yaml --set logs.jsonl=false --set logs.dir=logs2
  assert_success
  [ ! -e "$(ls -d logs2/*/)output.jsonl" ]
}

@test "progress bars (lines rewritten after a carriage return) update in place on a terminal; logs keep the final line" {
  cat >bar.sh <<'SH'
#!/bin/bash
for i in 1 2 3; do printf '\rstep %d/3' "$i"; sleep 0.3; done
printf '\rstep 3/3 done\n'
printf 'a windows line\r\n'
SH
  chmod +x bar.sh
  printf 'command: [./bar.sh]\nlogs: {dir: logs}\n' >job.yaml
  # on a terminal (script gives ddprun one): each state is drawn over the last line
  run script -qec "$DDPRUN job.yaml" /dev/null
  assert_success
  [[ "$output" == *$'\r\e[K[localhost:0] step 1/3'* ]]
  [[ "$output" == *$'\r\e[K[localhost:0] step 2/3'* ]]
  [[ "$output" == *"[localhost:0] step 3/3 done"* ]]
  d=$(ls -d logs/*/ | tail -n1)
  [ "$(cat "$d/rank-0.log")" = "step 3/3 done
a windows line" ]
  # not on a terminal: only whole lines
  run "$DDPRUN" job.yaml
  assert_success
  refute_output --partial "step 1/3"
  assert_line "[localhost:0] step 3/3 done"
  assert_line "[localhost:0] a windows line"
}

# CPUs of a cpulist ("0-2,5" -> "0 1 2 5").
cpus_of() {
  local r out=()
  for r in ${1//,/ }; do
    if [[ $r == *-* ]]; then out+=($(seq "${r%-*}" "${r#*-}")); else out+=("$r"); fi
  done
  echo "${out[@]}"
}

bind_job() { # MODE NPROC: each rank prints its CPUs and what ddprun said of them
  printf 'command: "echo cpus $(sed -n \\"s/^Cpus_allowed_list:[[:space:]]*//p\\" /proc/self/status) bind ${DDPRUN_CPU_BIND:-unset} sharers ${DDPRUN_CPU_SHARERS:-unset}"\nnproc_per_node: %d\nbind_to: %s\n' \
    "$2" "$1" >job.yaml
}

@test "bind_to core: each rank gets a core of the agent's CPUs; hardware threads of one core stay together" {
  command -v taskset >/dev/null || skip "taskset (util-linux) is not installed"
  read -r a b _ <<<"$(cpus_of "$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)")"
  [ -n "$b" ] || skip "one CPU only"
  # the reference: are a and b two threads of one core?
  sib=$(cat "/sys/devices/system/cpu/cpu$a/topology/thread_siblings_list" 2>/dev/null || echo "$a")
  bind_job core 2
  run taskset -c "$a,$b" "$DDPRUN" job.yaml
  assert_success
  if [[ " $(cpus_of "$sib") " == *" $b "* ]]; then
    both=$([ "$b" -eq $((a + 1)) ] && echo "$a-$b" || echo "$a,$b")
    assert_line "[localhost:0] cpus $both bind core sharers 2"
    assert_line "[localhost:1] cpus $both bind core sharers 2"
  else
    assert_line "[localhost:0] cpus $a bind core sharers 1"
    assert_line "[localhost:1] cpus $b bind core sharers 1"
  fi
  # more ranks than cores: they share, and rank 0's output says so once
  bind_job core 3
  run taskset -c "$a" "$DDPRUN" job.yaml
  assert_success
  for r in 0 1 2; do assert_line "[localhost:$r] cpus $a bind core sharers 3"; done
  assert_line "[localhost:0] ddprun agent: bind_to core: 3 ranks share 1 core here"
  [ "$(grep -c 'share 1 core here' <<<"$output")" -eq 1 ]
  # none (the default): every CPU, no variables
  bind_job none 2
  run taskset -c "$a,$b" "$DDPRUN" job.yaml
  assert_success
  both=$([ "$b" -eq $((a + 1)) ] && echo "$a-$b" || echo "$a,$b")
  assert_line "[localhost:1] cpus $both bind unset sharers unset"
}

@test "bind_to numa: the ranks of one NUMA node share its CPUs; a bad mode is an error naming it" {
  command -v taskset >/dev/null || skip "taskset (util-linux) is not installed"
  [ "$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)" -le 1 ] || skip "several NUMA nodes"
  mine=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
  bind_job numa 2
  run "$DDPRUN" job.yaml
  assert_success
  assert_line "[localhost:0] cpus $mine bind numa sharers 2"
  assert_line "[localhost:1] cpus $mine bind numa sharers 2"
  refute_output --partial "ranks share"
  run "$DDPRUN" plan job.yaml
  assert_success
  assert_line "bind_to: numa"
  run "$DDPRUN" --nproc 2 --bind-to socket --no-python true
  assert_failure 2
  assert_output --partial "--bind-to socket: bind_to must be 'none', 'core' or 'numa', got 'socket'"
  printf 'command: [true]\nbind_to: [core]\n' >bad.yaml
  run "$DDPRUN" bad.yaml
  assert_failure 2
  assert_output --partial "bad.yaml:2:10:"
}

@test "a full log disk: whole lines and whole-file records, one message naming ENOSPC per file, the ranks' status, 'records incomplete' last" {
  [ "$(id -u)" -eq 0 ] || skip "mounting a tmpfs needs root"
  command -v unshare >/dev/null || skip "unshare (util-linux) is not installed"
  # two ranks print about 1.5 MB each into a 1 MiB logs.dir (a tmpfs of this test's own mount
  # namespace); what was written there is copied out before the namespace goes
  cat >job.yaml <<'JOB'
command: awk -v r=$RANK 'BEGIN { for (i = 1; i <= 20000; i++) printf "rank %d line %d %058d\n", r, i, 0 }'
nproc_per_node: 2
logs: {dir: logs, jsonl: true}
JOB
  mkdir logs saved
  unshare --mount --propagation private sh -c '
    mount -t tmpfs -o size=1m tmpfs logs || exit 99
    "$0" job.yaml >out.txt 2>&1; echo $? >rc.txt
    cp -r logs/. saved/' "$DDPRUN"
  [ "$(cat rc.txt)" -eq 0 ] || { tail -n 20 out.txt; return 1; } # the ranks' status
  d=$(ls -d saved/*/ | head -n1)
  # each file that could not be written is said once, naming the error
  grep "cannot write the job's record" out.txt | sort | uniq -d | { ! grep . || false; }
  grep -q "cannot write the job's record $PWD/logs/.*/rank-[01].log: No space left on device; the job goes on" out.txt
  # the last line names every incomplete record
  tail -n1 out.txt | grep -q "^ddprun: records incomplete: .*rank-[01].log (No space left on device)"
  # whole-file records are whole or absent
  if [ -e "$d/summary.json" ]; then
    /usr/bin/python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); assert s["records_incomplete"], s' "$d/summary.json"
  fi
  if [ -e "$d/spec.yaml" ]; then grep -q "^command:" "$d/spec.yaml"; fi
  # append-only logs hold whole lines only: every rank log line as the rank printed it, in order
  for r in 0 1; do
    [ -e "$d/rank-$r.log" ] || continue
    awk -v r="$r" '$0 != sprintf("rank %d line %d %058d", r, NR, 0) { print "line " NR ": " $0; exit 1 }' "$d/rank-$r.log"
    [ -z "$(tail -c1 "$d/rank-$r.log")" ] # ends with a newline (or is empty)
  done
  for f in events.jsonl output.jsonl; do
    [ -e "$d/$f" ] || continue
    /usr/bin/python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$d/$f"
    [ -z "$(tail -c1 "$d/$f")" ]
  done
  [ -z "$(tail -c1 "$d/ddprun.log")" ]
}

@test "too low a limit on open files: the ranks that cannot start say so, naming the limit" {
  printf 'command: sleep 1\nnproc_per_node: 16\n' >job.yaml
  run bash -c 'ulimit -n 64 && exec "$0" job.yaml' "$DDPRUN"
  assert_failure 3
  assert_output --regexp "ddprun: rank [0-9]+ \(localhost\) did not start: ddprun agent: cannot start local rank [0-9]+: Too many open files \(the limit on open files here is 64, and the agent holds about 6 for each of its 16 ranks: raise it with ulimit -n; ddprun doctor checks it\); stopping the job"
  assert_output --regexp "cannot start local rank [0-9]+: Too many open files \(as local rank [0-9]+\)"
}

@test "a line over 64 KiB: whole in the rank's log; on the console and in output.jsonl in pieces, marked" {
  # 150000 bytes in one line (pieces of 65536, 65536 and 18928), then a short line
  cat >job.yaml <<'JOB'
command: awk 'BEGIN { s = ""; for (i = 0; i < 150000; i++) s = s sprintf("%d", i % 10); print s; print "after" }'
logs: {dir: logs, jsonl: true, timestamps: true}
JOB
  "$DDPRUN" job.yaml >out.txt 2>err.txt
  want=$(awk 'BEGIN { s = ""; for (i = 0; i < 150000; i++) s = s sprintf("%d", i % 10); print s }')
  d=$(ls -d logs/*/)
  # the log: the whole line after one time stamp, then the next line
  [ "$(sed -n 1p "$d/rank-0.log" | cut -d' ' -f2-)" = "$want" ]
  sed -n 1p "$d/rank-0.log" | grep -q '^20[0-9-]*T[0-9:.]*Z [0-9]'
  [ "$(sed -n 2p "$d/rank-0.log" | cut -d' ' -f2-)" = after ]
  [ "$(wc -l <"$d/rank-0.log")" -eq 2 ]
  # the console: three lines, marked where cut, that make the line again
  [ "$(grep -c '^\[localhost:0\] ' out.txt)" -eq 4 ]
  grep '^\[localhost:0\] ' out.txt | sed -n 1p | grep -q ' \[\.\.\.\]$'
  grep '^\[localhost:0\] ' out.txt | sed -n 2p | grep -q '^\[localhost:0\] \[\.\.\.\] .* \[\.\.\.\]$'
  grep '^\[localhost:0\] ' out.txt | sed -n 3p | grep -q '^\[localhost:0\] \[\.\.\.\] [0-9]*$'
  got=$(grep '^\[localhost:0\] ' out.txt | head -n3 | sed 's/^\[localhost:0\] //; s/^\[\.\.\.\] //; s/ \[\.\.\.\]$//' | tr -d '\n')
  [ "$got" = "$want" ]
  # output.jsonl: the cut pieces say the line continues; joined, they are the line
  /usr/bin/python3 - "$d/output.jsonl" <<'PY'
import json, sys
objs = [json.loads(l) for l in open(sys.argv[1])]
assert [len(o["line"]) for o in objs] == [65536, 65536, 18928, 5], [len(o["line"]) for o in objs]
assert [o.get("continues", False) for o in objs] == [True, True, False, False], objs
assert "".join(o["line"] for o in objs[:3]) == "".join(str(i % 10) for i in range(150000))
PY
}
