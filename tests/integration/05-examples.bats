#!/usr/bin/env bats
# Every example job file is valid, and the local ones run.
load '../lib/common'

@test "every example job file passes ddprun plan" {
  n=0
  for f in "$REPO"/examples/jobs/*.yaml; do
    run "$DDPRUN" plan "$f"
    [ "$status" -eq 0 ] || { echo "$f: $output"; return 1; }
    n=$((n + 1))
  done
  [ "$n" -ge 8 ]
}

@test "the local examples run and succeed" {
  cd "$BATS_TEST_TMPDIR"
  run "$DDPRUN" "$REPO/examples/jobs/basic.yaml" --set logs.dir="$BATS_TEST_TMPDIR/l"
  assert_success
  assert_output --partial "[localhost:1] rank 1 of 2 on"
  run "$DDPRUN" "$REPO/examples/jobs/shell-command.yaml" --set logs.dir="$BATS_TEST_TMPDIR/l"
  assert_success
  assert_output --partial "[localhost:2] rank 2 done"
  run "$DDPRUN" "$REPO/examples/jobs/env-and-workdir.yaml" --set logs.dir="$BATS_TEST_TMPDIR/l"
  assert_success
  assert_output --partial "[localhost:0] rank 0: SEED=1234 in $REPO/examples/jobs"
  run "$DDPRUN" "$REPO/examples/jobs/logs-and-checkpoints.yaml" --set logs.dir="$BATS_TEST_TMPDIR/l"
  assert_success
  assert_line "checkpoints go to $REPO/examples/jobs/checkpoints"
  grep -q '"rank": 1, "host": "localhost", "stream": "stdout", "line": "checkpoints go to ' "$BATS_TEST_TMPDIR"/l/logs-*/output.jsonl
  # ddprun-fmnist is found beside ddprun (here the build tree), though not on PATH, as its
  # comment says: the ranks' PATH ends with ddprun's folder
  ! command -v ddprun-fmnist || false
  run "$DDPRUN" "$REPO/examples/jobs/pipeline.yaml" --set logs.dir="$BATS_TEST_TMPDIR/l"
  assert_success
  assert_output --partial "pipeline of 3 stages (1,1,1), 1F1B, minibatch 64, 936 minibatches per epoch"
  assert_output --partial "[localhost:2] rank 2: stage 1 replica 1, layers 2-2, warm-up 1"
}

@test "on a terminal a status line shows the phase, ranks up and elapsed time" {
  cd "$BATS_TEST_TMPDIR"
  printf 'command: "sleep 1"\nnproc_per_node: 2\n' >job.yaml
  run script -qec "$DDPRUN job.yaml" /dev/null
  assert_success
  [[ "$output" == *$'\r\e[K[ddprun] running | ranks up 2/2 | restarts 0 | 00:00:0'* ]]
  # and off a terminal, plain lines instead
  run "$DDPRUN" job.yaml
  [[ "$output" != *$'\e['* ]]
  assert_line "ddprun: running"
}
