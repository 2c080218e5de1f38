#!/usr/bin/env bats
# The job spec's pipeline section (ddprun-job(5)): ddprun maps the ranks to stages and replicas
# from a split, a plan file or PipeDream's planner, shows the map in `ddprun plan`, checks it
# against the job's ranks and tells every rank; ddprun-fmnist trains from it.
load '../lib/common'
load '../lib/events'

D="$REPO/tests/data/pipedream"

setup() {
  cd "$BATS_TEST_TMPDIR"
}

# The expected "stage replica" of each rank 0.. for replicas "1,2,1": "0 0|1 0|1 1|2 0".
expected_map() {
  local out="" s=0
  IFS=, read -r -a reps <<<"$1"
  for r in "${reps[@]}"; do
    for ((k = 0; k < r; k++)); do out+="${out:+|}$s $k"; done
    s=$((s + 1))
  done
  echo "$out"
}

# The "stage replica" column pairs of `ddprun plan`'s rank map, "|"-joined.
plan_map() {
  awk '/^# rank map/{f=1;next} f&&/^node/{next} f&&NF==0{exit} f{print $5, $6}' | paste -sd'|'
}

@test "split and replicas: ddprun plan shows each rank's stage and replica; every rank gets them and the layout in its environment" {
  cat >job.yaml <<'EOF'
command: "echo $RANK: $DDPRUN_PIPELINE_STAGE/$DDPRUN_PIPELINE_REPLICA $DDPRUN_PIPELINE_STAGES $DDPRUN_PIPELINE_SPLIT $DDPRUN_PIPELINE_REPLICAS $DDPRUN_PIPELINE_SCHEDULE ${DDPRUN_PIPELINE_MICROBATCHES:-none} ${DDPRUN_PIPELINE_MICROBATCH_SIZE:-none}"
nproc_per_node: 4
pipeline:
  split: [2, 1, 1]
  replicas: [1, 2, 1]
  schedule: flush
  microbatches: 8
  microbatch_size: 16
EOF
  run "$DDPRUN" plan job.yaml
  assert_success
  assert_line "pipeline: {split: [2, 1, 1], replicas: [1, 2, 1], schedule: flush, microbatches: 8, microbatch_size: 16}"
  [ "$(plan_map <<<"$output")" = "$(expected_map 1,2,1)" ]
  assert_output --partial "DDPRUN_PIPELINE_STAGES=3 DDPRUN_PIPELINE_SPLIT=2,1,1 DDPRUN_PIPELINE_REPLICAS=1,2,1 DDPRUN_PIPELINE_SCHEDULE=flush DDPRUN_PIPELINE_MICROBATCHES=8 DDPRUN_PIPELINE_MICROBATCH_SIZE=16"
  run "$DDPRUN" job.yaml
  assert_success
  for line in "0: 0/0" "1: 1/0" "2: 1/1" "3: 2/0"; do
    assert_output --partial "] $line 3 2,1,1 1,2,1 flush 8 16"
  done
  # another layout by --set, 1F1B: no microbatch count
  grep -v microbatches: job.yaml >job1f1b.yaml
  run "$DDPRUN" job1f1b.yaml --nproc 5 --set 'pipeline.replicas=[3,1,1]' --set pipeline.schedule=1f1b
  assert_success
  for line in "0: 0/0" "1: 0/1" "2: 0/2" "3: 1/0" "4: 2/0"; do
    assert_output --partial "] $line 3 2,1,1 3,1,1 1f1b none 16"
  done
  # a job without the section: none of it
  printf 'command: "echo x${DDPRUN_PIPELINE_STAGE:-}${DDPRUN_PIPELINE_REPLICAS:-}x"\n' >plain.yaml
  run "$DDPRUN" plain.yaml
  assert_success
  assert_output --partial "] xx"
}

@test "a pipeline section that does not fit the job is refused at file:line:col with the reason" {
  printf 'command: [true]\nnproc_per_node: 4\npipeline:\n  split: [2, 1, 1]\n  replicas: [1, 1, 1]\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output "ddprun: error: job.yaml:5:13: the pipeline's stages take 3 ranks (replicas [1, 1, 1]) and the job has 4: each rank runs one stage's replica; pipeline.auto plans for whatever ranks a round has"
  run "$DDPRUN" plan job.yaml --set 'pipeline.replicas=[1,3]'
  assert_failure 2
  assert_output "ddprun: error: --set pipeline.replicas=[1,3]: pipeline.replicas has 2 counts for the 3 stages of split"
  run "$DDPRUN" plan job.yaml --set pipeline.plan=p.txt
  assert_failure 2
  assert_output --partial "job.yaml:4:3: pipeline needs one of split"
  assert_output --partial ", not several"
  run "$DDPRUN" plan job.yaml --set pipeline.microbatches=4
  assert_failure 2
  assert_output "ddprun: error: --set pipeline.microbatches=4: pipeline.microbatches is for schedule: flush (minibatches per update); 1F1B updates after every minibatch"
  run "$DDPRUN" plan job.yaml --set pipeline.schedule=gpipe
  assert_failure 2
  assert_output --partial "pipeline.schedule"
  run "$DDPRUN" plan job.yaml --set pipeline.stages=3
  assert_failure 2
  assert_output --partial "stages"
  # a plan file without stages, with a stage missing, with replicas that disagree
  printf 'command: [true]\nnproc_per_node: 2\npipeline: {plan: p.txt}\n' >job.yaml
  cp "$D/alexnet.txt" p.txt
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output --regexp "^ddprun: error: job.yaml:3:18: $BATS_TEST_TMPDIR/p.txt:[0-9]+: layer node[0-9]+ has no stage_id: pipeline.plan takes a graph.txt with every layer's stage"
  printf 'n0 -- Input0 -- forward_compute_time=0, backward_compute_time=0, activation_size=4, parameter_size=0 -- stage_id=0\nn1 -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=4, parameter_size=4 -- stage_id=0 -- replicas=1\nn2 -- B -- forward_compute_time=1, backward_compute_time=1, activation_size=4, parameter_size=4 -- stage_id=2 -- replicas=1\n\tn0 -- n1\n\tn1 -- n2\n' >p.txt
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output "ddprun: error: job.yaml:3:18: $BATS_TEST_TMPDIR/p.txt: stage 1 has no layer (stage ids are 0 to 2)"
  sed -i 's/stage_id=2 -- replicas=1/stage_id=0 -- replicas=2/' p.txt
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output "ddprun: error: job.yaml:3:18: $BATS_TEST_TMPDIR/p.txt:3: layer n2 of stage 0 has replicas=2, an earlier one 1"
  # auto: a profile that does not parse, a bandwidth that is no rate, nodes of unequal ranks
  printf 'command: [true]\nnproc_per_node: 2\npipeline: {auto: {profile: p.txt, bandwidth: fast}}\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output "ddprun: error: job.yaml:3:46: pipeline.auto.bandwidth: 'fast' is not a link rate (10Gbit, 100Mbit/s, 1.25GB/s, or bytes/s)"
  printf 'n1 -- A -- forward_compute_time=x\n' >p.txt
  run "$DDPRUN" plan job.yaml --set pipeline.auto.bandwidth=1Gbit
  assert_failure 2
  assert_output "ddprun: error: job.yaml:3:18: $BATS_TEST_TMPDIR/p.txt:1:12: expected forward_compute_time=MS, backward_compute_time=MS, activation_size=BYTES, parameter_size=BYTES"
  printf 'command: [true]\nnodes: [{host: localhost, slots: 2}, {host: 127.0.0.1, slots: 1}]\npipeline: {auto: {profile: %s, bandwidth: [100Gbit, 1Gbit]}}\n' "$D/vgg16.txt" >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output --partial "nodes of equal ranks; these have 2 and 1"
}

@test "auto: the split and replicas of PipeDream's planner (ddprun pipeline plan) for the job's ranks; its --output file as pipeline.plan maps the same" {
  for case in "vgg16 4 1Gbit 4" "vgg16 4 100Gbit,1Gbit 4,1" "alexnet 3 10Gbit 3" "resnet50 4 100Mbit 4"; do
    read -r prof n bw machines <<<"$case"
    run "$DDPRUN" pipeline plan "$D/$prof.txt" --machines "$machines" --bandwidth "$bw" --output "$prof.plan.txt"
    assert_success
    conf=$(sed -n 's/^configuration: \([0-9-]*\) .*/\1/p' <<<"$output")
    [ -n "$conf" ]
    reps=${conf//-/,}
    yaml_bw="$bw"
    [[ "$bw" == *,* ]] && yaml_bw="[${bw}]"
    printf 'command: [true]\nnproc_per_node: %d\npipeline: {auto: {profile: %s, bandwidth: %s}}\n' "$n" "$D/$prof.txt" "$yaml_bw" >job.yaml
    run "$DDPRUN" plan job.yaml
    echo "$case: $conf"
    echo "$output" | grep '^pipeline'
    assert_success
    assert_line --regexp "^pipeline: \{split: \[[0-9, ]+\], replicas: \[${reps//,/, }\], schedule: 1f1b\}   # planned on $D/$prof.txt for bandwidth $bw"
    [ "$(plan_map <<<"$output")" = "$(expected_map "$reps")" ]
    # the split covers every layer but the inputs, and agrees with the stage ids of --output
    split=$(sed -n 's/^pipeline: {split: \[\([0-9, ]*\)\].*/\1/p' <<<"$output")
    counted=$(grep -v $'^\t' "$prof.plan.txt" | grep -v ' -- Input' |
      sed 's/.* -- stage_id=\([0-9]*\).*/\1/' | sort -n | uniq -c | awk '{print $1}' | paste -sd,)
    [ "${split// /}" = "$counted" ]
    # the plan file: the same split and replicas
    printf 'command: [true]\nnproc_per_node: %d\npipeline: {plan: %s}\n' "$n" "$prof.plan.txt" >job2.yaml
    run "$DDPRUN" plan job2.yaml
    assert_success
    assert_output --partial "pipeline: {split: [$split], replicas: [${reps//,/, }], schedule: 1f1b}   # from $BATS_TEST_TMPDIR/$prof.plan.txt"
  done
}

@test "ddprun-fmnist under a pipeline section trains exactly as with the same --pipeline flags" {
  F="$BUILD/ddprun-fmnist"
  printf 'command: [%s, --hidden, "256,128", --epochs, "1", --max-steps, "24", --eval-every, "0", --dump, flags.bin, --pipeline, "2,1", --replicas, "1,2", --schedule, flush, --microbatches, "4", --batch, "64"]\nnproc_per_node: 3\n' "$F" >flags.yaml
  run "$DDPRUN" flags.yaml
  assert_success
  printf 'command: [%s, --hidden, "256,128", --epochs, "1", --max-steps, "24", --eval-every, "0", --dump, spec.bin]\nnproc_per_node: 3\npipeline:\n  split: [2, 1]\n  replicas: [1, 2]\n  schedule: flush\n  microbatches: 4\n  microbatch_size: 16\n' "$F" >spec.yaml
  run "$DDPRUN" spec.yaml
  assert_success
  assert_output --partial "pipeline of 2 stages (2,1), flush, minibatch 16, 3748 minibatches per epoch"
  assert_output --partial "rank 2: stage 1 replica 1"
  cmp flags.bin spec.bin
  # and the section changes the training: 1F1B gives other weights
  grep -v microbatches: spec.yaml >spec1f1b.yaml
  run "$DDPRUN" spec1f1b.yaml --set pipeline.schedule=1f1b
  assert_success
  ! cmp -s flags.bin spec.bin || false
  # 1F1B runs minibatches in multiples of the replica counts' lcm: fewer is refused, not run
  run "$DDPRUN" spec1f1b.yaml --set pipeline.schedule=1f1b --set 'pipeline.replicas=[2,1]' \
    --set 'command=['"$F"', --max-steps, "1"]'
  assert_failure 1
  assert_output --partial ": --max-steps 1 runs no minibatch: 1F1B runs minibatches in multiples of 2, the least common multiple of the replica counts"
}

# pgrep and kill of a hung node, as 50-elastic does: the last local node's agent is stopped
stop_last_agent() { # ddprun's pid
  local agent
  agent=$(pgrep -f '^ddprun agent' -P "$1" | tail -n1)
  kill -STOP -- "-$agent"
}

@test "elastic: a lost node's round is planned anew with pipeline.auto; with fixed replicas it cannot start, saying why" {
  # three local "nodes" of a rank each; round 0 waits, a later round prints its layout and ends
  for fixed in no yes; do
    rm -rf logs
    if [ $fixed = no ]; then layout="auto: {profile: $D/vgg16.txt, bandwidth: 1Gbit}"; else layout="split: [10, 20, 11]"; fi
    cat >job.yaml <<JOB
command: 'echo "round \$TORCHELASTIC_RESTART_COUNT: rank \$RANK of \$WORLD_SIZE in stage \$DDPRUN_PIPELINE_STAGE of \$DDPRUN_PIPELINE_REPLICAS"; [ \$TORCHELASTIC_RESTART_COUNT -ge 1 ] || exec sleep 61.93'
nodes: [{host: localhost}, {host: 127.0.0.1}, {host: "::1"}]
elastic: {min_nodes: 2, max_restarts: 2, heartbeat_interval: 500ms, heartbeat_timeout: 2s}
logs: {dir: logs}
stop_grace: 2s
pipeline: {$layout}
JOB
    "$DDPRUN" job.yaml >out.txt 2>&1 &
    ddp=$!
    wait_event workers_running
    for _ in $(seq 50); do [ "$(grep -c 'round 0: rank' out.txt)" -eq 3 ] && break; sleep 0.1; done
    stop_last_agent "$ddp"
    rc=0; wait "$ddp" || rc=$?
    cat out.txt
    grep -q "round 0: rank 2 of 3 in stage 2 of 1,1,1" out.txt
    if [ $fixed = no ]; then
      [ "$rc" -eq 0 ]
      grep -q "round 1: rank 0 of 2 in stage 0 of 1,1" out.txt
      grep -q "round 1: rank 1 of 2 in stage 1 of 1,1" out.txt
    else
      [ "$rc" -eq 1 ]
      grep -q "ddprun: round 1 cannot start: pipeline: the pipeline's stages take 3 ranks (replicas \[1, 1, 1\], 1 each unless pipeline.replicas says) and the job has 2: each rank runs one stage's replica; pipeline.auto plans for whatever ranks a round has" out.txt
      ! grep -q "round 1: rank" out.txt || false
      # no member of round 1 ever started: the agents leave at once (not after stop_grace +
      # 5 s), and the summary counts no ranks
      ! grep -q "did not stop within stop_grace" out.txt || false
      grep -Eq "failed after [0-9.]+ s \(0 ranks on 0 nodes, after 1 restart\)" out.txt
    fi
    # the hung node's rank is gone too
    for _ in $(seq 50); do pgrep -f "sleep 61.93" >/dev/null || break; sleep 0.1; done
    ! pgrep -f "sleep 61.93" || false
  done
}
