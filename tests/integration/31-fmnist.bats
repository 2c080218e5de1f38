#!/usr/bin/env bats
# The Fashion-MNIST trainer (examples/fmnist) on the real dataset from Debian's
# dataset-fashion-mnist: data-parallel training equals, bit for bit, one process doing the same
# arithmetic (--simulate-ranks), and one process with the same global batch to rounding; checkpoints resume exactly and survive a write interrupted midway, and it learns.
load '../lib/common'

FMNIST="$BUILD/ddprun-fmnist"

setup() {
  cd "$BATS_TEST_TMPDIR"
  [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    fail "Debian's dataset-fashion-mnist is not installed (./dev.sh deps installs it)"
}

fjob() { # nproc args... : a job running the trainer
  local n=$1; shift
  local a="$FMNIST" x
  for x in "$@"; do a="$a, \"$x\""; done
  printf 'command: [%s]\nnproc_per_node: %d\nlogs: {dir: logs}\n' "$a" "$n" >job.yaml
}

@test "N ranks with batch B/N each end with the parameters of the N-rank simulation, bit for bit (N = 1..4, with and without bucket view, and with buckets or gradients in registered memory all-reduced single-copy)" {
  # --simulate-ranks N does in one process the arithmetic of N ranks, in the same order
  # (each shard's gradients, summed in rank order by the shared-memory all-reduce, divided
  # by N): any difference at all is a bug, on any CPU. (Against one process with the whole
  # batch the sums run in another order; after a few hundred steps the rounding flips a ReLU
  # somewhere and the runs part visibly, by 0.05 on some CPUs.)
  for n in 1 2 3 4; do   # 64 is not divisible by 3: uneven shards must match too
    OMP_NUM_THREADS=1 "$FMNIST" --simulate-ranks "$n" --max-steps 30 --eval-every 0 --batch 64 --dump "sim$n.bin" >/dev/null
    for view in "" --bucket-view direct copy-direct; do
      # direct: buckets in the group's registered memory, all-reduced single-copy; copy-direct:
      # without bucket view, the gradients (registered too) all-reduced where they lie in
      # claimed chunks (worker/shm_claim.c)
      local va=()
      [ -z "$view" ] || [ "$view" = copy-direct ] || va=(--bucket-view)
      fjob "$n" --max-steps 30 --eval-every 0 --batch 64 --compare "sim$n.bin" --tol 0 "${va[@]}"
      [ "$view" = "" ] || [ "$view" = --bucket-view ] || echo 'env: {DDP_PG_DIRECT_BYTES: "4096", DDP_LOG_LEVEL: info, DDP_LOG_SUBSYS: pg}' >>job.yaml
      run "$DDPRUN" job.yaml
      [ "$status" -eq 0 ] || { echo "n=$n $view"; echo "$output"; return 1; }
      assert_output --partial "compare: max |difference| from sim$n.bin = 0 (tolerance 0)"
      if [ "$view" != "" ] && [ "$view" != --bucket-view ] && [ "$n" -gt 1 ]; then
        assert_output --partial "single-copy all-reduce from 4096 bytes: registered memory on"
      fi
    done
  done
}

@test "--bench-view-copy: two reducers, bucket view and copy, on alternate steps, end with the 2-rank simulation's parameters bit for bit and print both modes' medians" {
  # Both modes average the same gradients in the same order, so switching between them step
  # by step changes no bit; a copy step that read the view buckets' stale gradients, or a view
  # step the copy buffers', would (the gradients move every step).
  OMP_NUM_THREADS=1 "$FMNIST" --simulate-ranks 2 --max-steps 30 --eval-every 0 --batch 64 --dump sim2.bin >/dev/null
  fjob 2 --max-steps 30 --eval-every 0 --batch 64 --compare sim2.bin --tol 0 --bench-view-copy
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "compare: max |difference| from sim2.bin = 0 (tolerance 0)"
  assert_output --regexp "bench: view-copy over 10 pairs \(medians, ms\): step view [0-9.]+ copy [0-9.]+, forward\+backward"
  assert_output --regexp "copy / view step, pair by pair: median [0-9]+\.[0-9]{3} \(quartiles"
  fjob 2 --max-steps 30 --bench-view-copy --bench-paired
  run "$DDPRUN" job.yaml
  assert_failure
  assert_output --partial "--bench-view-copy runs alone (no --bench-paired"
}

@test "--bench-paired: each step beside a compute-only step and a bare all-reduce of every gradient's bytes, and the wait for the last rank's gradients" {
  fjob 2 --max-steps 20 --eval-every 0 --bench-paired
  run "$DDPRUN" job.yaml
  assert_success
  # 784x256 + 256 + 256x128 + 128 + 128x10 + 10 = 235146 float32 parameters
  assert_output --regexp "bench: paired over 15 steps: step [0-9.]+ ms, compute-only [0-9.]+ ms, bare all-reduce of 940584 bytes [0-9.]+ ms; added by the reducer -?[0-9.]+ ms"
  # one node: the ranks share a clock, and the wait is never negative
  assert_output --regexp "the last rank's gradients were ready [0-9]+\.[0-9]{3} ms after rank 0's; added beyond that wait -?[0-9.]+ ms = -?[0-9.]+ x bare"
  # where the step's time goes, beside the compute-only step's (medians of the same steps):
  # the reducer's step has a finalize, its all-reduces, which take time
  assert_output --regexp "bench: paired phases \(medians\): the reducer's step forward\+backward [0-9]+\.[0-9]{3} ms, finalize [0-9]+\.[0-9]{3} ms, optimizer [0-9]+\.[0-9]{3} ms; the compute-only step forward\+backward [0-9]+\.[0-9]{3} ms, optimizer [0-9]+\.[0-9]{3} ms"
  fin=$(sed -n 's/.*paired phases.*, finalize \([0-9.]*\) ms,.*/\1/p' <<<"$output")
  awk -v f="$fin" 'BEGIN { exit !(f > 0) }'
}

@test "N ranks with batch B/N take the step one process takes with batch B (one step: only the summation order differs)" {
  # After one step from the same parameters the runs differ by lr times the rounding of one
  # gradient (1.5e-8 here). Even a ReLU input that rounds to the other side of zero changes
  # one sample's term of a gradient, lr x |delta| x |x| / B = 0.02 x 0.2 x 2.6 / 64 < 2e-4.
  # A doubled gradient (what a sum instead of an average gives) moves the parameters by 0.0117,
  # so 2e-3 is safe on any CPU and still sharp.
  run "$FMNIST" --max-steps 1 --eval-every 0 --batch 64 --dump one.bin
  assert_success
  for n in 2 3 4; do
    fjob "$n" --max-steps 1 --eval-every 0 --batch 64 --compare one.bin --tol 2e-3
    run "$DDPRUN" job.yaml
    [ "$status" -eq 0 ] || { echo "n=$n"; echo "$output"; return 1; }
  done
  fjob 2 --max-steps 1 --eval-every 0 --batch 64 --compare one.bin --tol 2e-3 --lr 0.04
  run "$DDPRUN" job.yaml
  assert_failure
  assert_output --regexp "compare: max \|difference\| from one.bin = 0\.01[0-9]* \(tolerance 0\.002\)"
}

@test "a checkpoint interrupted mid-write is never resumed from; resuming on another world size continues the same run" {
  # The reference does the same arithmetic: 2 simulated ranks up to the step-200 checkpoint,
  # then 3 from it.
  run "$FMNIST" --simulate-ranks 2 --max-steps 200 --eval-every 0 --checkpoint-dir refck --checkpoint-every 100
  assert_success
  run "$FMNIST" --simulate-ranks 3 --max-steps 400 --eval-every 0 --checkpoint-dir refck --checkpoint-every 100 --dump ref.bin
  assert_success
  assert_output --partial "resuming from refck/fmnist.ckpt at step 200"
  # Rank 0 dies in the middle of writing the step-300 checkpoint.
  fjob 2 --max-steps 400 --eval-every 0 --checkpoint-dir ck --checkpoint-every 100
  FMNIST_CRASH_AT_STEP=300 run "$DDPRUN" job.yaml
  assert_failure
  ls -a ck | grep -q '^\.fmnist\.ckpt\.tmp\.'   # the torn write is there, under its temporary name
  # Three ranks pick up from step 200, the last complete checkpoint, and end where the
  # uninterrupted single-process run ended.
  fjob 3 --max-steps 400 --eval-every 0 --checkpoint-dir ck --checkpoint-every 100 --compare ref.bin --tol 0
  run "$DDPRUN" job.yaml
  assert_success
  assert_output --partial "resuming from ck/fmnist.ckpt at step 200"
  assert_output --partial "compare: max |difference| from ref.bin = 0 (tolerance 0)"
  # A corrupted checkpoint is refused, not trained from.
  printf 'x' | dd of=ck/fmnist.ckpt bs=1 seek=1000 conv=notrunc 2>/dev/null
  run "$FMNIST" --max-steps 500 --checkpoint-dir ck
  assert_failure
  assert_output --partial "ck/fmnist.ckpt is corrupt (checksum mismatch); refusing to resume from it"
}

@test "checkpoint.dir in the job spec reaches the trainer as DDPRUN_CHECKPOINT_DIR" {
  printf 'command: [%s, --max-steps, "50", --eval-every, "0", --checkpoint-every, "50"]\nnproc_per_node: 2\ncheckpoint: {dir: ckpt}\n' "$FMNIST" >job.yaml
  run "$DDPRUN" job.yaml
  assert_success
  [ -s ckpt/fmnist.ckpt ]
  run "$DDPRUN" job.yaml --set 'command=['"$FMNIST"', --max-steps, "60", --eval-every, "0"]'
  assert_success
  assert_output --regexp "resuming from [^ ]*/ckpt/fmnist.ckpt at step 50 "
}

@test "training learns: above 80% test accuracy after 400 steps on 2 ranks, fp16 compression included" {
  fjob 2 --max-steps 400 --hook fp16
  run "$DDPRUN" job.yaml
  assert_success
  acc=$(grep -o 'test-acc [0-9.]*' <<<"$output" | tail -1 | cut -d' ' -f2)
  echo "accuracy: $acc"
  awk -v a="$acc" 'BEGIN { exit !(a >= 80) }'
}

@test "a dataset folder that is missing, truncated or not IDX: one clear error naming the file, status 1" {
  local d=/usr/share/datasets/fashion-mnist
  mkdir bad
  cp "$d"/*labels* "$d"/t10k-images-idx3-ubyte.gz bad/
  run "$FMNIST" --data "$PWD/none" --max-steps 1
  assert_failure 1
  assert_output --partial "cannot open $PWD/none/train-images-idx3-ubyte.gz: No such file or directory"
  # the first MB of the gzip: its trailer (the size hint) is whatever bytes end there
  head -c 1000000 "$d/train-images-idx3-ubyte.gz" >bad/train-images-idx3-ubyte.gz
  run "$FMNIST" --data "$PWD/bad" --max-steps 1
  assert_failure 1
  assert_output --regexp "$PWD/bad(: train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz disagree or are truncated|/train-images-idx3-ubyte.gz is not a readable gzip file)"
  echo garbage >bad/train-images-idx3-ubyte.gz
  run "$FMNIST" --data "$PWD/bad" --max-steps 1
  assert_failure 1
  assert_output --partial "$PWD/bad/train-images-idx3-ubyte.gz is not an IDX file of 28x28 images"
}
