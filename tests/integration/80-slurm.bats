#!/usr/bin/env bats
# Slurm (issue 18, part 1): a job's nodes from the allocation it runs in. The allocation is
# described as Slurm describes it to a batch script (SLURM_JOB_ID, SLURM_JOB_NODELIST,
# SLURM_TASKS_PER_NODE); `ddprun plan` shows the nodes and slots ddprun takes from it. Host
# lists are compared with Slurm's own expansion, `scontrol show hostnames`.
load '../lib/common'

setup() {
  cd "$BATS_TEST_TMPDIR"
  printf 'command: [true]\nnodes: slurm\n' >slurm.yaml
  printf 'command: [true]\n' >plain.yaml
}

nodes_of() { # plan output -> "host:slots host:slots ..."
  sed -n 's/^  - {host: \([^,]*\), slots: \([0-9]*\)}$/\1:\2/p' | tr '\n' ' ' | sed 's/ $//'
}

@test "host lists expand as scontrol show hostnames expands them" {
  command -v scontrol >/dev/null || skip "scontrol (slurm-client) is not installed"
  # scontrol reads a configuration even to expand a list; a minimal one will do
  printf 'ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n' >slurm.conf
  export SLURM_CONF=$PWD/slurm.conf
  n=0
  for list in 'n1' 'n[1-3]' 'x[8-11],y[009-011],z' 'n[1,3-4,02]' 'n[1-010]' 'n[09-10]' \
    'a[1-2]b[3-4]' 'n[1-2][3-4]' 'gpu[01-02],io5' 'n[007]' 'a,,b' 'n[1-2],n[1-2]' \
    'rack[1-2]-n[01-16]' 'node-[0001-0128]' 'c[1-3]-[1-2]' 'n[98-102]' 'n[0-0]' 'x9,x[10-12]'; do
    want=$(scontrol show hostnames "$list" | sed 's/$/:1/' | tr '\n' ' ' | sed 's/ $//')
    [ -n "$want" ] || { echo "scontrol could not expand $list"; return 1; }
    got=$(SLURM_JOB_ID=7 SLURM_JOB_NODELIST="$list" SLURM_TASKS_PER_NODE="1(x999)" \
      "$DDPRUN" plan slurm.yaml --nproc 1 | nodes_of)
    [ "$got" = "$want" ] || { echo "$list: ddprun [$got], scontrol [$want]"; return 1; }
    n=$((n + 1))
  done
  [ "$n" -eq 18 ]
}

@test "nodes: slurm takes the allocation's nodes, with its tasks per node as slots unless nproc_per_node is given" {
  export SLURM_JOB_ID=7 SLURM_JOB_NODELIST='n[01-03]' SLURM_TASKS_PER_NODE='2(x2),1'
  run "$DDPRUN" plan slurm.yaml
  assert_success
  [ "$(nodes_of <<<"$output")" = "n01:2 n02:2 n03:1" ]
  assert_output --partial "WORLD_SIZE=5"
  run "$DDPRUN" plan slurm.yaml --nproc 4
  [ "$(nodes_of <<<"$output")" = "n01:4 n02:4 n03:4" ]
  # inside an allocation, a job without nodes: runs on the allocation's nodes too
  run "$DDPRUN" plan plain.yaml
  [ "$(nodes_of <<<"$output")" = "n01:2 n02:2 n03:1" ]
  # an explicit list still wins
  printf 'command: [true]\nnodes: [localhost]\n' >listed.yaml
  run "$DDPRUN" plan listed.yaml
  [ "$(nodes_of <<<"$output")" = "localhost:1" ]
}

@test "nproc_per_node gpu, cpu, auto (torchrun's): GPUs from Slurm, CUDA_VISIBLE_DEVICES or the driver, CPUs by affinity; counted here for this machine, by each agent for other machines" {
  printf 'command: [true]\nnproc_per_node: auto\n' >auto.yaml
  [ "$(SLURM_GPUS_ON_NODE=4 CUDA_VISIBLE_DEVICES=0 "$DDPRUN" plan auto.yaml | nodes_of)" = "localhost:4" ]
  [ "$(env -u SLURM_GPUS_ON_NODE CUDA_VISIBLE_DEVICES=0,1,3 "$DDPRUN" plan auto.yaml | nodes_of)" = "localhost:3" ]
  # no GPU (CUDA_VISIBLE_DEVICES empty: none, whatever the driver has): auto is the CPUs ddprun
  # may run on, as torchrun's auto is os.cpu_count() then
  [ "$(env -u SLURM_GPUS_ON_NODE CUDA_VISIBLE_DEVICES= "$DDPRUN" plan auto.yaml | nodes_of)" = "localhost:$(nproc)" ]
  [ "$(env -u SLURM_GPUS_ON_NODE CUDA_VISIBLE_DEVICES= taskset -c "$(first_cpu)" "$DDPRUN" plan auto.yaml | nodes_of)" = "localhost:1" ]
  # torchrun's command line: --nproc-per-node gpu / cpu
  [ "$(env -u SLURM_GPUS_ON_NODE CUDA_VISIBLE_DEVICES=0,1 "$DDPRUN" plan --nproc-per-node gpu --no-python /bin/true | nodes_of)" = "localhost:2" ]
  [ "$(env CUDA_VISIBLE_DEVICES=0,1 taskset -c "$(first_cpu)" "$DDPRUN" plan --nproc-per-node cpu --no-python /bin/true | nodes_of)" = "localhost:1" ]
  # gpu where none is visible
  run env -u SLURM_GPUS_ON_NODE CUDA_VISIBLE_DEVICES=-1 "$DDPRUN" plan --nproc-per-node gpu --no-python /bin/true
  assert_failure 2
  assert_output --partial "nproc_per_node: gpu is counted on this machine, and no GPU is visible here (SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus): give the number of ranks per node"
  # nodes that are other machines count their own, each by its agent, as torchrun counts on
  # its node (tests/integration/40-ssh.bats runs them): what this machine has does not matter
  printf 'command: [true]\nnodes: [n1, {host: n2, slots: 2}]\nnproc_per_node: cpu\n' >remote.yaml
  for k in cpu gpu auto; do
    run env -u SLURM_GPUS_ON_NODE CUDA_VISIBLE_DEVICES= "$DDPRUN" plan remote.yaml --set nproc_per_node=$k
    assert_success
    assert_line "  - {host: n1, slots: $k}   # counted there by its agent"
    assert_line "  - {host: n2, slots: 2}"
    assert_line "nproc_per_node: $k   # counted on each node by its agent, as torchrun counts"
    assert_line --regexp "^1     n2                   1          \? +$"
  done
  [ "$(SLURM_GPUS_ON_NODE=8 "$DDPRUN" plan remote.yaml --set nproc_per_node=gpu | nodes_of)" = "n2:2" ]
  # a pipeline needs every node's ranks before they start
  printf 'pipeline: {split: [1]}\n' >>remote.yaml
  run "$DDPRUN" plan remote.yaml
  assert_failure 2
  assert_output --partial "remote.yaml:3:17: nproc_per_node: cpu is counted on each node when its agent starts, and a pipeline's stages need the ranks of every node: give the number of ranks per node"
  run "$DDPRUN" plan auto.yaml --set nproc_per_node=xpu
  assert_failure 2
  assert_output --partial "nproc_per_node: xpu (Intel GPUs) is not supported: give a number"
}

@test "Slurm's variables wrong or missing: one clear error at the job file's nodes key" {
  run env -u SLURM_JOB_ID -u SLURM_JOB_NODELIST "$DDPRUN" plan slurm.yaml
  assert_failure 2
  assert_output "ddprun: error: slurm.yaml:2:8: nodes: slurm needs a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are not set): run ddprun inside salloc or an sbatch script"
  run env SLURM_JOB_ID=7 SLURM_JOB_NODELIST='n[01-03' "$DDPRUN" plan slurm.yaml
  assert_failure 2
  assert_output "ddprun: error: slurm.yaml:2:8: SLURM_JOB_NODELIST: '[' without ']' in 'n[01-03'"
  run env SLURM_JOB_ID=7 SLURM_JOB_NODELIST='n[1-2]' SLURM_TASKS_PER_NODE='2(x3)' "$DDPRUN" plan slurm.yaml
  assert_failure 2
  assert_output "ddprun: error: slurm.yaml:2:8: SLURM_TASKS_PER_NODE: '2(x3)' gives more than the 2 nodes of the host list"
  run env SLURM_JOB_ID=7 SLURM_JOB_NODELIST='n[0-99999]' "$DDPRUN" plan slurm.yaml
  assert_failure 2
  assert_output --partial "names more than 65536 hosts"
}

@test "launcher: srun inside an allocation on its nodes (auto), ssh for listed nodes; srun outside one is an error" {
  command -v srun >/dev/null || skip "srun (slurm-client) is not installed"
  export SLURM_JOB_ID=7 SLURM_JOB_NODELIST='n[1-2]' SLURM_TASKS_PER_NODE='1(x2)'
  run "$DDPRUN" plan slurm.yaml
  assert_output --partial "launcher: srun"
  printf 'command: [true]\nnodes: [a, b]\n' >listed.yaml
  run "$DDPRUN" plan listed.yaml
  assert_output --partial "launcher: ssh"
  run "$DDPRUN" plan listed.yaml --set launcher=srun
  assert_output --partial "launcher: srun"
  run "$DDPRUN" plan slurm.yaml --set launcher=ssh
  assert_output --partial "launcher: ssh"
  run "$DDPRUN" plan slurm.yaml --set launcher=rsh
  assert_failure 2
  assert_output --partial "launcher must be auto, ssh, srun or external, got 'rsh'"
  # without srun in PATH, auto falls back to SSH and srun is an error naming it
  PATH=/nonexistent run "$DDPRUN" plan slurm.yaml
  assert_output --partial "launcher: ssh"
  unset SLURM_JOB_ID SLURM_JOB_NODELIST
  printf 'command: [true]\nnodes: [a]\nlauncher: srun\n' >srun.yaml
  run "$DDPRUN" plan srun.yaml
  assert_failure 2
  assert_output --partial "srun.yaml:3:11: launcher: srun needs a Slurm allocation"
}
