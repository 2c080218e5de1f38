#!/usr/bin/env bats
# The pipeline stage runtime (pipeline/stage.h, ddp_pipe(3)): pipetest trains a 5-layer MLP
# split into stages (some replicated) under ddprun, each rank recording every minibatch's weight
# version and gradient; `pipetest check` then recomputes offline in one process.
load '../lib/common'

PIPETEST="$BUILD/tests/pipetest"

setup() {
  cd "$BATS_TEST_TMPDIR"
}

teardown() {
  for p in ${PIDS:-}; do kill -9 "$p" 2>/dev/null || true; done
  stop_store
}

# Runs pipetest on n ranks under ddprun with the options, in a fresh directory d.
pipeline() { # n options...
  local n=$1; shift
  rm -rf d && mkdir d
  { printf 'command: [%s, run, %s' "$PIPETEST" "$PWD/d"
    for a in "$@"; do printf ', "%s"' "$a"; done
    printf ']\nnproc_per_node: %d\n' "$n"; } >job.yaml
  run "$DDPRUN" job.yaml
  [ "$status" -eq 0 ] || { echo "$n ranks, $*:"; echo "$output"; return 1; }
  [ "$(grep -c ' minibatches, ' <<<"$output")" -eq "$n" ]
}

@test "flush: the parameters of sequential training on whole batches, to 1e-6, for straight and replicated pipelines" {
  for layout in "4 --split 2,1,1,1" "2 --split 3,2" "5 --split 1,2,2 --replicas 2,2,1" \
    "5 --split 1,1,3 --replicas 1,3,1 --microbatches 6" "3 --split 2,3 --replicas 1,2 --per-run 8"; do
    read -r -a a <<<"$layout"
    pipeline "${a[0]}" --schedule flush "${a[@]:1}" || return 1
    run "$PIPETEST" check d --schedule flush "${a[@]:1}"
    echo "$layout: $output"
    [ "$status" -eq 0 ] || return 1
    grep -q "max |diff| [0-9.e-]*$" <<<"$output" || return 1
  done
  # the check can fail: 1F1B's weights are not sequential training's
  pipeline 4 --schedule 1f1b
  run "$PIPETEST" check d --schedule flush
  [ "$status" -eq 1 ]
}

@test "1F1B with weight stashing: every minibatch's gradient on every stage equals the offline one with the weight versions its forwards used; without stashing it does not" {
  for layout in "4 --split 2,1,1,1" "5 --split 1,2,2 --replicas 2,2,1" \
    "4 --split 2,3 --replicas 1,3 --per-run 6" "5 --split 1,1,1,1,1 --minibatches 30 --per-run 10"; do
    read -r -a a <<<"$layout"
    pipeline "${a[0]}" "${a[@]:1}" || return 1
    # warm-up depth as PipeDream's: later ranks over this stage's replicas
    run "$PIPETEST" check d "${a[@]:1}"
    echo "$layout: $output"
    [ "$status" -eq 0 ] || return 1
    assert_output --regexp "1f1b: [0-9]+ gradients equal the offline ones"
  done
  pipeline 4 --split 2,1,1,1
  assert_output --partial "rank 0: stage 0 replica 0 warm-up 3: 24 minibatches, 24 updates"
  assert_output --partial "rank 3: stage 3 replica 0 warm-up 0: 24 minibatches, 24 updates"
  pipeline 5 --split 1,2,2 --replicas 2,2,1
  assert_output --partial "rank 1: stage 0 replica 1 warm-up 2: 12 minibatches, 12 updates"
  assert_output --partial "rank 3: stage 1 replica 1 warm-up 1: 12 minibatches, 12 updates"
  # stashing off: the backward of a minibatch in flight uses newer weights
  pipeline 4 --split 2,1,1,1 --no-stash
  run "$PIPETEST" check d --split 2,1,1,1
  [ "$status" -eq 1 ]
  assert_output --regexp "minibatch [0-9]+, stage [0-2]: the gradient differs from the offline one"
}

@test "replicated stages end with bit-identical replicas, and a replica that differs is caught" {
  pipeline 5 --split 1,2,2 --replicas 2,2,1
  run "$PIPETEST" check d --split 1,2,2 --replicas 2,2,1
  assert_success
  assert_output --partial "replicas equal; check passed"
  # flip one bit of rank 1's last weight (its file ends with the final weights)
  size=$(stat -c %s d/rank1.bin)
  printf '\x01' | dd of=d/rank1.bin bs=1 seek=$((size - 1)) conv=notrunc status=none
  run "$PIPETEST" check d --split 1,2,2 --replicas 2,2,1
  assert_failure
  assert_output --partial "ranks 0 and 1, replicas of stage 0, end with different weights"
}

@test "a stage worker killed mid-run: under ddprun the job fails naming it, nothing left; by hand every other stage fails fast, naming the lost peer" {
  rm -rf d && mkdir d
  printf 'command: [%s, run, %s, --die-at, "10"]\nnproc_per_node: 4\n' "$PIPETEST" "$PWD/d" >job.yaml
  run timeout 60 "$DDPRUN" job.yaml
  assert_failure
  # the launcher may reap a neighbour's exit 3 (rank 2 lost rank 3, rank 1 then lost rank 2)
  # before rank 3's death, when they come in one tick; either way the console names rank 3
  assert_output --regexp "rank 3 \(localhost\) was killed by signal 9|receiving the gradient of minibatch [0-9]+ from rank 3: receive of [0-9]+ bytes with tag [0-9]+ from rank 3 failed"
  [ -z "$(pgrep -f "$PIPETEST run $PWD/d" || true)" ]
  # without the launcher to stop them: the runtime's own errors
  start_store
  PIDS=
  for r in 0 1 2 3; do
    RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r LOCAL_WORLD_SIZE=4 GROUP_RANK=0 \
      DDPRUN_STORE_ADDR="$STORE_ADDR" DDPRUN_TOKEN_FILE="$TOKFILE" DDP_PG_TIMEOUT_MS=60000 \
      "$PIPETEST" run "$PWD/d" --die-at 10 >"rank$r.out" 2>&1 &
    PIDS="$PIDS $!"
  done
  SECONDS=0
  for r in 0 1 2 3; do
    rc=0; wait "$(echo $PIDS | cut -d' ' -f$((r + 1)))" || rc=$?
    echo "rank $r: rc $rc: $(cat "rank$r.out")"
    if [ "$r" -eq 3 ]; then [ "$rc" -eq 137 ] || return 1; else [ "$rc" -eq 3 ] || return 1; fi
  done
  PIDS=
  [ "$SECONDS" -lt 30 ]
  grep -q "stage 2 replica 0: receiving the gradient of minibatch [0-9]* from rank 3: .*rank 3" rank2.out
  # the others report the first failure, rank 2's, as the cause
  for r in 0 1; do
    grep -q "pipetest: rank $r: stage $r replica 0: .*; the group had already failed at rank 2: stage 2 replica 0: receiving the gradient of minibatch [0-9]* from rank 3" "rank$r.out" || return 1
  done
}

@test "bad layouts are refused on every rank with the reason" {
  rm -rf d && mkdir d
  # three ranks, stages asking for four
  printf 'command: [%s, run, %s, --split, "3,2", --replicas, "2,2"]\nnproc_per_node: 3\n' "$PIPETEST" "$PWD/d" >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure
  assert_output --partial "pipeline: the stages' replica counts must be >= 1 and add up to the world size"
  # 2 replicas of the first stage and 9 minibatches
  printf 'command: [%s, run, %s, --split, "3,2", --replicas, "2,1", --minibatches, "9"]\nnproc_per_node: 3\n' "$PIPETEST" "$PWD/d" >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure
  assert_output --partial "9 minibatches are not a multiple of stage 0's 2 replicas"
  # a group without point-to-point connections
  printf 'command: [%s, run, %s, --split, "3,2", --no-p2p]\nnproc_per_node: 2\n' "$PIPETEST" "$PWD/d" >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure
  assert_output --partial "pipeline: the group has no point-to-point connections (form it with opts.p2p or DDP_PG_P2P=1) (DDP_ENOTSUP)"
}

@test "ddprun-fmnist --pipeline on Fashion-MNIST: flush equals sequential training to 1e-6 (straight and replicated); 1F1B over a replicated stage learns" {
  F="$BUILD/ddprun-fmnist"
  run "$F" --hidden 256,128 --epochs 1 --max-steps 30 --eval-every 0 --dump seq.bin
  assert_success
  for layout in "2 2,1 1,1" "3 1,2 2,1" "3 1,1,1 1,1,1"; do
    read -r n split reps <<<"$layout"
    printf 'command: [%s, --hidden, "256,128", --epochs, "1", --max-steps, "30", --pipeline, "%s", --replicas, "%s", --schedule, flush, --microbatches, "4", --compare, seq.bin, --tol, "1e-6"]\nnproc_per_node: %d\n' \
      "$F" "$split" "$reps" "$n" >job.yaml
    run "$DDPRUN" job.yaml
    echo "$layout: $output"
    [ "$status" -eq 0 ] || return 1
    assert_output --regexp "compare: max \|difference\| from seq.bin = [0-9.e+-]+ \(tolerance 1e-06\)"
  done
  # the check can fail: 1F1B updates after every minibatch
  printf 'command: [%s, --hidden, "256,128", --epochs, "1", --max-steps, "30", --pipeline, "2,1", --compare, seq.bin, --tol, "1e-6"]\nnproc_per_node: 2\n' "$F" >job.yaml
  run "$DDPRUN" job.yaml
  assert_failure
  # one epoch of 1F1B, the middle stage on two ranks
  printf 'command: [%s, --hidden, "256,128", --epochs, "1", --pipeline, "1,1,1", --replicas, "1,2,1", --lr, "0.01"]\nnproc_per_node: 4\n' "$F" >job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "pipeline of 3 stages (1,1,1), 1F1B, minibatch 64, 936 minibatches per epoch"
  assert_output --partial "rank 2: stage 1 replica 1, layers 2-2, warm-up 1"
  acc=$(grep -o 'test-acc [0-9.]*' <<<"$output" | tail -n1 | cut -d' ' -f2)
  echo "test accuracy $acc"
  awk -v a="$acc" 'BEGIN { exit !(a >= 80) }'
}
