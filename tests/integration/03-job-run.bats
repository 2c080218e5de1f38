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
  ! grep -q "out-0" "$d/rank-1.log"
  grep -q '"status": "succeeded"' "$d/summary.json"
  grep -q '"exit_code": 0' "$d/summary.json"
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
  assert_output --regexp "  0 +localhost +signal 15 \(TERM\)"
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
}

@test "a remote node nobody answers for is a launch error (status 3) naming it; the local node is stopped" {
  printf 'command: [sleep, "30"]\nnodes: [localhost, 127.0.0.9]\nssh: {port: 1}\n' >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure 3
  assert_output --partial "ddprun: error: node '127.0.0.9': cannot connect to 127.0.0.9 port 1"
  assert_output --partial "node '127.0.0.9' could not be provisioned"
  ! pgrep -f "^sleep 30$"
}

@test "env, workdir and checkpoint.dir reach the ranks" {
  mkdir -p work
  printf 'command: "echo $SEED $(pwd) $DDPRUN_CHECKPOINT_DIR $OMP_NUM_THREADS"\nworkdir: work\nenv: {SEED: "42"}\ncheckpoint: {dir: ckpt}\nnproc_per_node: 2\n' >job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  # every relative path of a job is relative to the job file's folder
  assert_line "[localhost:0] 42 $BATS_TEST_TMPDIR/work $BATS_TEST_TMPDIR/ckpt 1"
}
