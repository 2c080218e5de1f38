#!/usr/bin/env bats
# The gradient reducer on real process groups: values checked against the formula every rank
# used to produce its gradients (tests/helpers/reducertest.c), not against the reducer itself.
load '../lib/common'

RT="$BUILD/tests/reducertest"

setup() {
  cd "$BATS_TEST_TMPDIR"
}

job() { # nproc args...
  local n=$1; shift
  local a="$RT" x
  for x in "$@"; do a="$a, $x"; done
  printf 'command: [%s]\nnproc_per_node: %d\nlogs: {dir: logs}\n' "$a" "$n" >job.yaml
  run "$DDPRUN" job.yaml
}

@test "buckets in reverse order within caps; gradients averaged over 1 to 4 ranks, with and without gradient-as-bucket-view" {
  for n in 1 2 3 4; do
    for view in "" --view; do
      job "$n" basic $view
      [ "$status" -eq 0 ] || { echo "n=$n $view: $output"; return 1; }
      [ "$(grep -c 'basic passed' <<<"$output")" -eq "$n" ]
    done
  done
  # One parameter per bucket (cap of one byte), and everything in one bucket.
  job 3 basic --cap 1 --first 1
  assert_success
  assert_output --partial "reducertest: 9 buckets"
  job 2 basic --cap 1000000000 --first 1000000000
  assert_success
  assert_output --partial "reducertest: 3 buckets"   # one per dtype: f32, f64, bf16
}

@test "buckets start during backward, in order, while the rest of backward runs" {
  export DDP_REDUCER_OVERLAP=on
  job 2 overlap
  assert_success
  # 3 iterations: 5 buckets in the first, and as many after the rebuild
  assert_output --regexp "reducertest: ([0-9]+) of \1 bucket all-reduces started during backward"
  assert_output --partial "reducertest: overlap on, 0 buckets posted"
  job 2 overlap --no-overlap
  assert_success
  assert_output --regexp "reducertest: 0 of [1-9][0-9]* bucket all-reduces started during backward"
  DDP_REDUCER_OVERLAP=off job 2 overlap
  assert_success
  assert_output --regexp "reducertest: 0 of [1-9][0-9]* bucket all-reduces started during backward"
  # without overlap, the first bucket is posted when backward fills it, where it goes
  # single-copy (registered buckets: bucket view): every iteration's, values checked all the same
  DDP_PG_DIRECT_BYTES=4096 job 2 overlap --no-overlap --view
  assert_success
  assert_output --partial "reducertest: overlap off, 3 buckets posted"
  DDP_PG_DIRECT_BYTES=4096 job 3 overlap --no-overlap
  assert_success
  assert_output --partial "reducertest: overlap off, 0 buckets posted" # in pieces, not registered
  # float32 only: every bucket goes in one all-reduce posted when the first gradient fills,
  # each next gradient made ready as it fills; rank 0, in finalize, averages each one into the
  # others' memory while they still compute (they wait for it before filling the last gradient,
  # whose bucket holds another)
  # Without bucket view the stream is the gradients where they lie (--registered: from
  # ddp_pg_mem_alloc, averaged in place and watched the same way), or copied into their slots
  # as they fill where peers cannot read them (values checked, the average copied back out).
  for n in 2 3; do
    for opts in "" "--copy --registered"; do
      job "$n" stream $opts
      assert_success
      assert_output --partial "reducertest: overlap off, 9 buckets posted" # 3 iterations x 3
      [ "$(grep -c 'iterations: the other gradients averaged before the last one filled' <<<"$output")" -eq $((n - 1)) ]
      [ "$(grep -c '3 of 3 iterations: the other gradients averaged before the last one filled' <<<"$output")" -eq $((n - 1)) ]
    done
  done
  job 2 stream --copy
  assert_success
  assert_output --partial "reducertest: overlap off, 9 buckets posted"
  [ "$(grep -c 'stream passed' <<<"$output")" -eq 2 ]
}

@test "overlap by default only with a core per rank to spare: 2 ranks pinned to one core wait for finalize, and say why" {
  # The rule itself on other machines' shapes is in test_reducer_policy (unit).
  command -v taskset >/dev/null || skip "taskset (util-linux) is not installed"
  printf 'command: [%s, overlap]\nnproc_per_node: 2\nlogs: {dir: logs}\nenv: {DDP_LOG_LEVEL: info, DDP_LOG_SUBSYS: reducer}\n' "$RT" >job.yaml
  run taskset -c "$(first_cpu)" "$DDPRUN" job.yaml
  assert_success
  assert_output --regexp "reducertest: 0 of [1-9][0-9]* bucket all-reduces started during backward"
  assert_output --partial "reducertest: overlap off"
  assert_output --partial "no overlap: 1 usable core for 2 ranks on this node"
  DDP_REDUCER_OVERLAP=on run taskset -c "$(first_cpu)" "$DDPRUN" job.yaml
  assert_success
  assert_output --regexp "reducertest: ([0-9]+) of \1 bucket all-reduces started during backward"
  # bound (--bind-to core) to two CPUs: the rule counts the ranks bound to a rank's CPUs
  # (DDPRUN_CPU_SHARERS), not all of the node's
  read -r a b _ <<<"$(taskset -cp $$ | sed 's/.*: //; s/,/ /g; s/-/ /')"
  [ -n "$b" ] || return 0
  run taskset -c "$a,$b" "$DDPRUN" --bind-to core job.yaml
  assert_success
  assert_output --regexp "no overlap: (1 usable core for 1 rank|2 usable cores for 2 ranks) bound to them"
}

# Runs "$@" in a cgroup of its own given one CPU's time (cgroup v2's cpu.max, else v1's CFS
# quota), as a container's CPU limit does; 77 where no such cgroup can be made here.
in_one_cpu_cgroup() {
  local cg="" name rc=0
  name="ddptest-$(basename "$BATS_RUN_TMPDIR")-$BATS_TEST_NUMBER"
  if [ -f /sys/fs/cgroup/cgroup.controllers ] && mkdir "/sys/fs/cgroup/$name" 2>/dev/null; then
    cg=/sys/fs/cgroup/$name
    echo "100000 100000" >"$cg/cpu.max" 2>/dev/null || { rmdir "$cg"; cg=""; }
  elif [ -d /sys/fs/cgroup/cpu ] && mkdir "/sys/fs/cgroup/cpu/$name" 2>/dev/null; then
    cg=/sys/fs/cgroup/cpu/$name
    { echo 100000 >"$cg/cpu.cfs_period_us" && echo 100000 >"$cg/cpu.cfs_quota_us"; } 2>/dev/null ||
      { rmdir "$cg"; cg=""; }
  fi
  [ -n "$cg" ] || return 77
  sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" "$@" || rc=$?
  for _ in $(seq 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
  return "$rc"
}

@test "a cgroup's CPU quota counts as the affinity does: 2 ranks of a container given one CPU do not overlap, and say so" {
  printf 'command: [%s, overlap]\nnproc_per_node: 2\nenv: {DDP_LOG_LEVEL: info, DDP_LOG_SUBSYS: reducer}\n' "$RT" >job.yaml
  run in_one_cpu_cgroup "$DDPRUN" job.yaml
  [ "$status" -ne 77 ] || skip "no cgroup with a CPU quota can be made here"
  assert_success
  assert_output --partial "no overlap: 1 usable core for 2 ranks on this node"
  assert_output --regexp "reducertest: 0 of [1-9][0-9]* bucket all-reduces started during backward"
}

@test "fp16 and bf16 compression hooks average within their precision" {
  for hook in fp16 bf16; do
    job 3 basic --hook "$hook"
    [ "$status" -eq 0 ] || { echo "$hook: $output"; return 1; }
  done
  job 2 basic --hook fp16 --view
  assert_success
}

@test "no_sync: k local steps then one synchronised step reduce the sum of all k+1 gradients" {
  for view in "" --view "--f32 --no-overlap" "--f32 --no-overlap --view"; do # streamed: --f32
    job 3 nosync 3 $view
    [ "$status" -eq 0 ] || { echo "$view: $output"; return 1; }
    [ "$(grep -c 'nosync passed' <<<"$output")" -eq 3 ]
  done
}

@test "find_unused_parameters: a parameter no rank used and one some ranks used, agreed by all" {
  job 3 unused --find
  assert_success
  assert_output --partial "parameter 2 unused everywhere, 5 used by some ranks"
  [ "$(grep -c 'unused passed' <<<"$output")" -eq 3 ]
  # float32 only, no overlap: the buckets stream, stalled at the first gradient not filled
  for view in "" --view; do
    job 3 unused --find --f32 --no-overlap $view
    [ "$status" -eq 0 ] || { echo "$view: $output"; return 1; }
    [ "$(grep -c 'unused passed' <<<"$output")" -eq 3 ]
  done
}

@test "without find_unused_parameters, a gradient never marked ready is one error naming it, on every rank, fast" {
  SECONDS=0
  job 3 unused --only-rank0
  assert_success   # reducertest exits 0 once it saw the error
  [ "$SECONDS" -lt 10 ]
  for r in 0 1 2; do
    grep "reducertest rank $r: finalize:" <<<"$output" | grep -q "never had their gradient marked ready in this iteration: 'layer2.bias'"
  done
  # streamed (float32 only, no overlap): ranks 1 and 2 posted and wait in finalize for rank
  # 0's data; its abort reaches them fast
  SECONDS=0
  job 3 unused --only-rank0 --f32 --no-overlap --view
  assert_success
  [ "$SECONDS" -lt 10 ]
  for r in 0 1 2; do
    grep "reducertest rank $r: finalize:" <<<"$output" | grep -q "never had their gradient marked ready in this iteration: 'layer2.bias'"
  done
}

@test "buckets are rebuilt in rank 0's gradient order after the first iteration, and results stay right" {
  for view in "" --view "--f32 --no-overlap" "--f32 --no-overlap --view"; do # streamed: --f32
    job 3 rebuild $view
    [ "$status" -eq 0 ] || { echo "$view: $output"; return 1; }
    assert_output --partial "buckets rebuilt"
    [ "$(grep -c 'rebuild passed' <<<"$output")" -eq 3 ]
  done
}

@test "mismatched parameter shapes across ranks: one error naming the rank and the parameter, on every rank" {
  job 3 mismatch
  assert_success
  for r in 0 1 2; do
    assert_output --partial "reducertest rank $r: rank 1's parameter 4 ('layer2.weight') is float32 [128, 512] but rank 0's is float32 [256, 256]"
  done
}
