#!/usr/bin/env bats
# The README's first command, run exactly as written, must run the default job.
load '../lib/common'

@test "README starts with exactly two commands, the first runs the default job" {
  cmds=$(awk '/^```sh$/{f=1;next} /^```$/{if(f){exit}} f' "$REPO/README.md")
  [ "$(printf '%s\n' "$cmds" | grep -c .)" -eq 2 ]
  first=$(printf '%s\n' "$cmds" | sed -n 1p)
  cd "$REPO"
  run bash -c "$first"
  assert_success
  assert_output --partial "[localhost:0] 2 ranks met at the store"
  assert_output --regexp "job default-[0-9-]+-[0-9a-f]{4} succeeded"
}

@test "default job runs N ranks and all of them meet" {
  cd "$BATS_TEST_TMPDIR"
  run "$DDPRUN" --nproc 5
  assert_success
  for r in 0 1 2 3 4; do assert_output --partial "rank $r on"; done
}

@test "default job: bad --nproc is a usage error" {
  run "$DDPRUN" --nproc 0
  assert_failure 2
  assert_output "ddprun: error: --set nproc_per_node=0: nproc_per_node must be a whole number from 1 to 4096, got '0'"
}
