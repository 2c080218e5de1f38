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
  run "$BUILD/tests/test_pg" nccl_unique_id_broadcast
  assert_success
  assert_output --partial "nccl id bytes:"
}

@test "the CUDA trainer refuses to start without a GPU, naming why" {
  [ -e "$BUILD/ddprun-fmnist-cuda" ] || skip "this build has no CUDA trainer (nvcc not found)"
  has_gpu && skip "a CUDA device is present"
  run "$BUILD/ddprun-fmnist-cuda" --max-steps 5
  [ "$status" -eq 1 ]
  assert_output --partial "ddprun-fmnist-cuda rank 0: no CUDA device is visible ("
}

# ---- on a GPU machine (skipped elsewhere). NCCL refuses two ranks on one GPU, so the
# multi-rank cases need as many GPUs; world size 1 runs on one. ----

has_gpu() {
  [ -e "$BUILD/tests/test_nccl" ] && ! { "$BUILD/tests/test_nccl" >/dev/null 2>&1; [ $? -eq 77 ]; }
}

gpu_job() { # ranks, then trainer arguments
  local n=$1
  shift
  {
    printf 'command: [%s' "$BUILD/ddprun-fmnist-cuda"
    for a in "$@"; do printf ', "%s"' "$a"; done
    printf ']\nnproc_per_node: %s\nbackend: nccl\nlogs: {dir: logs}\n' "$n"
  } >job.yaml
}

@test "GPU: the CUDA trainer at world size 1 ends with the same parameters with and without the reducer" {
  has_gpu || skip "no CUDA device"
  [ -e "$BUILD/ddprun-fmnist-cuda" ] || skip "no CUDA trainer in this build"
  run "$BUILD/ddprun-fmnist-cuda" --max-steps 300 --eval-every 0 --dump alone.bin
  assert_success
  assert_output --partial "(no process group)"
  for view in "" --bucket-view; do
    gpu_job 1 --max-steps 300 --eval-every 0 --bucket-mb 0.25 $view --compare alone.bin --tol 1e-6
    run "$DDPRUN" job.yaml
    assert_success
    assert_output --regexp "compare: max \|difference\| from alone.bin = [0-9.e-]+ \(tolerance 1e-06\)"
  done
}

@test "GPU: the CUDA trainer follows the host trainer (same model, data order and steps)" {
  has_gpu || skip "no CUDA device"
  [ -e "$BUILD/ddprun-fmnist-cuda" ] || skip "no CUDA trainer in this build"
  # cuBLAS and OpenBLAS sum in other orders: after many steps rounding flips a ReLU and the
  # runs part, so the parameters are compared after 5 steps (rounding 1e-7, a flipped ReLU
  # under 1e-3, a wrong gradient 1e-1), and the longer run only by what it learns.
  run "$BUILD/ddprun-fmnist" --max-steps 5 --eval-every 0 --dump host.bin
  assert_success
  run "$BUILD/ddprun-fmnist-cuda" --max-steps 5 --eval-every 0 --compare host.bin --tol 2e-3
  assert_success
  run "$BUILD/ddprun-fmnist-cuda" --max-steps 100
  assert_success
  assert_output --regexp "test-acc [6-9][0-9]\.[0-9]+%"
}

@test "GPU: a rank that never joins makes rank 0 fail with the NCCL timeout error, through ddprun" {
  has_gpu || skip "no CUDA device"
  [ -e "$BUILD/ddprun-fmnist-cuda" ] || skip "no CUDA trainer in this build"
  cat >never.sh <<SH
#!/bin/sh
# rank 1 never joins the communicator (it only sleeps); rank 0 trains on GPU 0
[ "\$RANK" = 1 ] && exec sleep 120
export LOCAL_RANK=0
exec $BUILD/ddprun-fmnist-cuda --max-steps 5
SH
  chmod +x never.sh
  cat >job.yaml <<JOB
command: [./never.sh]
nproc_per_node: 2
backend: nccl
env: {DDP_PG_TIMEOUT_MS: "5000"}
logs: {dir: logs}
JOB
  SECONDS=0
  run "$DDPRUN" job.yaml
  [ "$status" -eq 1 ]
  [ "$SECONDS" -lt 60 ]
  assert_output --partial "ncclCommInitRank on rank 0 did not complete in time"
  run pgrep -fx "sleep 120"
  assert_failure
}
