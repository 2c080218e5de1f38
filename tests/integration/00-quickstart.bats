#!/usr/bin/env bats
# The README's first command, run exactly as written, must run the default job.
load '../lib/common'

@test "README starts with exactly two commands, the first runs the default job" {
  trains # the release build's job, the same under every preset
  cmds=$(awk '/^```sh$/{f=1;next} /^```$/{if(f){exit}} f' "$REPO/README.md")
  [ "$(printf '%s\n' "$cmds" | grep -c .)" -eq 2 ]
  first=$(printf '%s\n' "$cmds" | sed -n 1p)
  cd "$REPO"
  run bash -c "$first"
  assert_success
  # The Fashion-MNIST example on 2 local ranks: 3 epochs, at least 85% test accuracy.
  assert_output --partial "[localhost:0] ddprun-fmnist: 2 ranks"
  assert_output --partial "[localhost:0] epoch 3/3"
  acc=$(grep -o 'epoch 3/3 .*test-acc [0-9.]*' <<<"$output" | grep -o '[0-9.]*$')
  awk -v a="$acc" 'BEGIN { exit !(a >= 85) }' || { echo "test accuracy $acc% < 85%"; return 1; }
  assert_output --regexp "job default-[0-9-]+-[0-9a-f]{4} succeeded"
}

@test "default job's command overridden with the store smoke worker: N ranks all meet" {
  cd "$BATS_TEST_TMPDIR"
  run "$DDPRUN" --nproc 5 --set "command=[$DDPRUN, __smoke-worker]"
  assert_success
  assert_output --partial "[localhost:0] 5 ranks met at the store"
  for r in 0 1 2 3 4; do assert_output --partial "rank $r on"; done
}

@test "default job runs N ranks of the example" {
  cd "$BATS_TEST_TMPDIR"
  run "$DDPRUN" --nproc 3 --set "command=[$BUILD/ddprun-fmnist, --max-steps, '20', --eval-every, '0']"
  assert_success
  assert_output --partial "[localhost:0] ddprun-fmnist: 3 ranks"
}

@test "default job, when the example is not next to ddprun: the store smoke worker" {
  cd "$BATS_TEST_TMPDIR"
  cp "$DDPRUN" ./ddprun
  run ./ddprun --nproc 5
  assert_success
  for r in 0 1 2 3 4; do assert_output --partial "rank $r on"; done
}

@test "default job: bad --nproc is a usage error" {
  run "$DDPRUN" --nproc 0
  assert_failure 2
  assert_output "ddprun: error: --nproc 0: nproc_per_node must be a whole number from 1 to 4096, got '0'"
}
