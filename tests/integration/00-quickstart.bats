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
  assert_output --partial "2 ranks met at the store"
  assert_output --partial "default job finished: 2 ranks exited 0"
}

@test "default job runs N ranks and all of them meet" {
  run "$DDPRUN" --nproc 5
  assert_success
  for r in 0 1 2 3 4; do assert_output --partial "rank $r on"; done
}

@test "default job: bad --nproc is a usage error" {
  run "$DDPRUN" --nproc 0
  assert_failure 2
  assert_output --partial "--nproc '0' is not a number from 1 to 256"
}
