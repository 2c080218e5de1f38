#!/usr/bin/env bats
# backend: nccl where no GPU is present (CI): the NCCL code is built, rank 0 creates the unique
# id and shares it through the store for real, and every rank then fails at once with one clear
# message instead of hanging. The GPU tests themselves are ctest's label gpu (tests/gpu/).
load '../lib/common'

setup() {
  cd "$BATS_TEST_TMPDIR"
}

@test "backend nccl without a GPU: each rank says no CUDA device is visible, at once" {
  [ -e "$BUILD/tests/test_nccl" ] || skip "this build has no NCCL (CUDA or NCCL not found)"
  if "$BUILD/tests/test_nccl" >/dev/null 2>&1; [ $? -ne 77 ]; then
    skip "a CUDA device is present: the gpu-labelled ctest covers this machine"
  fi
  cat >job.yaml <<JOB
command: [$BUILD/ddprun-fmnist, --max-steps, "5"]
nproc_per_node: 2
backend: nccl
logs: {dir: logs}
JOB
  SECONDS=0
  run "$DDPRUN" job.yaml
  [ "$status" -eq 1 ]
  [ "$SECONDS" -lt 30 ]
  # the first rank to fail stops the other: either may be the one that says it
  assert_output --regexp "cannot form the process group: backend nccl: no CUDA device is visible to rank [01] \("
  refute_output --partial "cannot share the NCCL unique id"
}

@test "the NCCL unique id goes from rank 0 to every rank through the store" {
  [ -e "$BUILD/tests/test_nccl" ] || skip "this build has no NCCL (CUDA or NCCL not found)"
  run "$BUILD/tests/test_store" nccl_unique_id_broadcast
  assert_success
  assert_output --partial "nccl id bytes:"
}
