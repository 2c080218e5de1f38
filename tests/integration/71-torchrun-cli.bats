#!/usr/bin/env bats
# The torchrun-style command line: a program run without a job file, mapped onto the same job
# spec (so plan, doctor and --set work on it), and the host lists and hostfiles users have.
load '../lib/common'
load '../lib/sshd'

setup() {
  cd "$BATS_TEST_TMPDIR"
  command -v python3 >/dev/null || skip "python3 is not installed"
  printf 'import os, sys\nprint("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "args", sys.argv[1:])\n' >hello.py
}

teardown() {
  [ -n "${SSH_DIR:-}" ] && sshd_teardown
  true
}

@test "ddprun --nproc-per-node N train.py ARGS: python3 runs it, the arguments after it are its own" {
  run "$DDPRUN" --nproc-per-node 2 hello.py --lr 0.1 -x --set y
  assert_success
  assert_line "[localhost:0] rank 0 of 2 args ['--lr', '0.1', '-x', '--set', 'y']"
  assert_line "[localhost:1] rank 1 of 2 args ['--lr', '0.1', '-x', '--set', 'y']"
  # -m runs a module, --no-python the program itself; --nproc is the same as --nproc-per-node
  printf 'import sys\nprint("module", sys.argv[1:])\n' >mymod.py
  run "$DDPRUN" --nproc 1 -m mymod a b
  assert_line "[localhost:0] module ['a', 'b']"
  printf '#!/bin/sh\necho "plain $RANK $*"\n' >run.sh
  chmod +x run.sh
  run "$DDPRUN" --no-python ./run.sh "x y"
  assert_line "[localhost:0] plain 0 x y"
  # a failing program fails the job as from a job file
  printf 'import sys\nsys.exit(3)\n' >fail.py
  run "$DDPRUN" fail.py
  assert_failure 1
  assert_output --partial "rank 0 (localhost) exited with status 3"
}

@test "a torchrun command line runs as written: underscores, --standalone, --nnodes, --role, --log-dir, and its no-op flags; per-node options are a clear error" {
  printf 'import os, sys\nprint("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "role", os.environ["ROLE_NAME"], "args", sys.argv[1:])\n' >role.py
  run "$DDPRUN" --standalone --nnodes=1 --nproc_per_node=2 --max_restarts=1 --monitor-interval=1 \
    --tee 3 -r 3 --redirects=3 --run-path --start-method spawn --role trainer --log-dir tlogs \
    role.py --lr 0.1
  assert_success
  assert_line "[localhost:0] rank 0 of 2 role trainer args ['--lr', '0.1']"
  assert_line "[localhost:1] rank 1 of 2 role trainer args ['--lr', '0.1']"
  grep -q "rank 1 of 2 role trainer" tlogs/role-*/rank-1.log
  # --nnodes MIN:MAX is the elastic range over the hosts given
  run "$DDPRUN" plan --nnodes 1:2 -H a,b --nproc_per_node 1 hello.py
  assert_success
  assert_output --partial "elastic: {min_nodes: 1, max_nodes: 2,"
  run "$DDPRUN" plan --nnodes 2 hello.py
  assert_failure 2
  assert_output --partial "--nnodes 2: elastic.max_nodes (2) is above the number of nodes listed (1; -H or --hostfile list them on a command line)"
  run "$DDPRUN" plan --nnodes 2:x hello.py
  assert_failure 2
  assert_output "ddprun: error: --nnodes '2:x': give N or MIN:MAX, as torchrun takes it (2, 1:4)"
  run "$DDPRUN" plan --standalone -H a,b hello.py
  assert_failure 2
  assert_output --partial "--standalone runs the job on this machine alone, but it lists 2 nodes (a, ...)"
  # what torchrun needs on every node, ddprun does from here
  for o in --node-rank=0 --node_rank=0 "--master-addr 10.0.0.1" --master_port=29500 \
    "--rdzv-endpoint h:29400" "--rdzv_backend c10d" "--rdzv-id 7" --local-addr=x; do
    run "$DDPRUN" $o --nproc_per_node 1 hello.py
    assert_failure 2
    assert_output --regexp "^ddprun: error: '--[a-z_-]+' is torchrun's, for a launcher started on every node; ddprun runs once, from here, and starts every node itself: name them with -H h1,h2 or --hostfile FILE"
  done
}

@test "plan, doctor and --set work on a command line" {
  run "$DDPRUN" plan --nproc-per-node 3 --set env.SEED=7 --max-restarts 2 hello.py "a b"
  assert_success
  assert_output --partial "name: hello"
  assert_output --partial "command: [python3, hello.py, a b]"
  assert_output --partial "world_size: 3"
  assert_output --partial "max_restarts: 2"
  assert_output --partial "SEED: 7"
  run "$DDPRUN" doctor hello.py
  assert_success
  assert_line --regexp "^localhost +local +local +ok +ok +ok"
}

@test "host lists and hostfiles in the forms users have: h1,h2; Horovod's h:4; DeepSpeed/Open MPI slots=N" {
  run "$DDPRUN" plan --nodes n1,n2 hello.py
  assert_output --partial $'nodes:\n  - {host: n1, slots: 1}\n  - {host: n2, slots: 1}'
  run "$DDPRUN" plan -H n1:4,n2:2,[fe80::1]:3 hello.py
  assert_output --partial $'  - {host: n1, slots: 4}\n  - {host: n2, slots: 2}\n  - {host: fe80::1, slots: 3}'
  printf '# DeepSpeed / Open MPI\nn1 slots=8\nn2 slots=4 max_slots=4\n\nn3\nn4:2   # a comment\n' >hostfile
  run "$DDPRUN" plan --hostfile hostfile hello.py
  assert_output --partial $'  - {host: n1, slots: 8}\n  - {host: n2, slots: 4}\n  - {host: n3, slots: 1}\n  - {host: n4, slots: 2}'
  # an explicit --nproc-per-node (or --set nproc_per_node) wins over the hosts' slots, as
  # over Slurm's tasks per node; a bad slots value is still an error
  run "$DDPRUN" plan --nproc-per-node 2 --hostfile hostfile hello.py
  assert_output --partial $'  - {host: n1, slots: 2}\n  - {host: n2, slots: 2}\n  - {host: n3, slots: 2}\n  - {host: n4, slots: 2}'
  assert_output --partial $'nproc_per_node: 2\n'
  assert_output --partial $'world_size: 8\n'
  run "$DDPRUN" plan -H n1:4,n2 --set nproc_per_node=3 hello.py
  assert_output --partial $'  - {host: n1, slots: 3}\n  - {host: n2, slots: 3}'
  run "$DDPRUN" plan -H n1:x --nproc-per-node 2 hello.py
  assert_failure 2
  printf 'n1 slot=4\n' >bad
  run "$DDPRUN" plan --hostfile bad hello.py
  assert_failure 2
  assert_output --partial "bad:1: 'slot=4' is not slots=N"
  run "$DDPRUN" plan -H n1:0 hello.py
  assert_failure 2
  assert_output --partial "'0' is not a number of slots from 1 to 4096"
  run "$DDPRUN" plan --nodes n1 --hostfile hostfile hello.py
  assert_failure 2
  assert_output --partial "give the hosts with --nodes or with --hostfile, not both"
  printf 'command: [true]\n' >job.yaml
  run "$DDPRUN" plan job.yaml --nodes n1
  assert_failure 2
  assert_output --partial "are for a program run without a job file"
}

@test "other tools' host syntax in a job file's nodes is an error naming the right form" {
  printf 'command: [true]\nnodes: ["gpu1:4"]\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output --partial "node 'gpu1:4' looks like Horovod's host:slots; in a job file write {host: gpu1, slots: 4}"
  printf 'command: [true]\nnodes: ["gpu1 slots=4"]\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output --partial "node 'gpu1 slots=4' is a hostfile line; in a job file write {host: gpu1, slots: 4}"
  printf 'command: [true]\nnodes: ["::1", "fe80::2"]\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_success
}

@test "a PyTorch DDP script across SSH hosts from the command line alone" {
  /usr/bin/python3 -c 'import torch' 2>/dev/null || skip "python3-torch is not installed"
  [ "$(id -u)" -eq 0 ] || skip "the sshd test hosts need root"
  sshd_setup
  for k in 1 2; do sshd_start "$k"; done
  printf '%s slots=1\n%s slots=1\n' "$(sshd_addr 1)" "$(sshd_addr 2)" >hosts
  # python3 is the first in PATH, which the remote ranks get from this shell (the export
  # rule): Debian's, where torch is
  PATH="/usr/bin:$PATH" run "$DDPRUN" --hostfile hosts --set ssh.port="$SSH_PORT" --set ssh.identity="$SSH_KEY" \
    --set ssh.known_hosts="$SSH_KH" "$REPO/tests/integration/py/ddp_train.py"
  echo "$output"
  assert_success
  [ "$(grep -o 'params sum [-0-9.]* after' <<<"$output" | sort -u | wc -l)" -eq 1 ]
  assert_output --partial "rank 1 of 2: params sum"
}
