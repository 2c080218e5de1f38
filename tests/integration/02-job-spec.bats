#!/usr/bin/env bats
# Job-spec errors: each names the file, line and column, says what was expected, exits 2, and
# starts nothing. Also `ddprun plan` and --set overrides.
load '../lib/common'

setup() {
  cd "$BATS_TEST_TMPDIR"
}

# spec_error YAML EXPECTED-MESSAGE [--set ...]
spec_error() {
  printf '%b' "$1" >job.yaml
  shift
  want=$1
  shift
  run "$DDPRUN" job.yaml "$@"
  assert_failure 2
  assert_output "ddprun: error: $want"
  [ ! -e ddprun-logs ]   # nothing started
}

@test "unknown key" {
  spec_error 'command: [true]\nnproc_per_nodes: 2\n' \
    "job.yaml:2:1: unknown key 'nproc_per_nodes' in the job spec (expected one of: name, command, workdir, env, nodes, nproc_per_node, backend, bind_to, rendezvous, elastic, ssh, logs, checkpoint, warm, stop_grace, network, export, diagnose, metrics, launcher, pipeline)"
  spec_error 'command: [true]\nelastic:\n  min_node: 1\n' \
    "job.yaml:3:3: unknown key 'min_node' in elastic (expected one of: min_nodes, max_nodes, max_restarts, heartbeat_interval, heartbeat_timeout, cooldown)"
}

@test "wrong types" {
  spec_error 'command: [true]\nnproc_per_node: two\n' \
    "job.yaml:2:17: nproc_per_node must be a whole number from 1 to 4096, got 'two'"
  spec_error 'command: {a: b}\n' \
    "job.yaml:1:10: command must be a list of arguments or a shell command string"
  spec_error 'command: [true]\nenv: [A, B]\n' \
    "job.yaml:2:6: env must be a mapping of variable names to values"
  spec_error 'command: [true]\nlogs:\n  tag_output: maybe\n' \
    "job.yaml:3:15: logs.tag_output must be true or false, got 'maybe'"
  spec_error 'command: [true]\nbackend: tpu\n' \
    "job.yaml:2:10: backend must be 'cpu' or 'nccl', got 'tpu'"
  spec_error 'command: [true]\nnodes: []\n' \
    "job.yaml:2:8: nodes must be a non-empty list of hosts ('- host: NAME' or '- NAME')"
  spec_error 'command: [true]\nenv: {1X: y}\n' \
    "job.yaml:2:7: env: '1X' is not a valid variable name (letters, digits, _)"
  spec_error 'command: [true]\nwarm: maybe\n' "job.yaml:2:7: warm must be true or false, got 'maybe'"
  spec_error 'command: [true]\nwarm: [torch]\n' \
    "job.yaml:2:7: warm must be on, off or a mapping with imports"
  spec_error 'command: [true]\nwarm: {imports: torch}\n' \
    "job.yaml:2:17: warm.imports must be a list of Python modules ([] for none)"
  spec_error 'command: [true]\nwarm: {imports: [torch, 1x]}\n' \
    "job.yaml:2:25: warm.imports: '1x' is not a module name (such as torch or a.b)"
  spec_error 'command: [true]\nwarm: {import: [torch]}\n' \
    "job.yaml:2:8: unknown key 'import' in warm (expected one of: imports)"
}

@test "bad duration" {
  spec_error 'command: [true]\nrendezvous:\n  timeout: 5x\n' \
    "job.yaml:3:12: rendezvous.timeout: bad duration '5x' (expected a number and a unit: 500ms, 5s, 2m, 1h)"
  spec_error 'command: [true]\nstop_grace: 10\n' \
    "job.yaml:2:13: stop_grace: bad duration '10' (expected a number and a unit: 500ms, 5s, 2m, 1h)"
  # an interval or a timeout of 0 would fail every launch: refused where it is written
  spec_error 'command: [true]\nelastic: {heartbeat_interval: 0s}\n' \
    "job.yaml:2:31: elastic.heartbeat_interval must be longer than 0 (a duration such as 500ms or 5s), got '0s'"
  spec_error 'command: [true]\nelastic:\n  heartbeat_timeout: 0ms\n' \
    "job.yaml:3:22: elastic.heartbeat_timeout must be longer than 0 (a duration such as 500ms or 5s), got '0ms'"
  spec_error 'command: [true]\nrendezvous: {timeout: 0s}\n' \
    "job.yaml:2:23: rendezvous.timeout must be longer than 0 (a duration such as 500ms or 5s), got '0s'"
  spec_error 'command: [true]\n' \
    "--set elastic.heartbeat_interval=0s: elastic.heartbeat_interval must be longer than 0 (a duration such as 500ms or 5s), got '0s'" \
    --set elastic.heartbeat_interval=0s
}

@test "a NUL in a value (an argument, an environment value) is refused, not cut" {
  spec_error 'command: [echo, "a\\0b"]\n' \
    "job.yaml:1:17: a NUL character (\\0) in a value: ddprun passes values to programs as C strings, which cannot hold one"
  spec_error 'command: [true]\nenv: {X: "x\\0"}\n' \
    "job.yaml:2:10: a NUL character (\\0) in a value: ddprun passes values to programs as C strings, which cannot hold one"
  spec_error 'command: [true]\n' \
    "--set env.X=\"a\\0b\": a NUL character (\\0) in a value: ddprun passes values to programs as C strings, which cannot hold one" \
    --set 'env.X="a\0b"'
}

@test "missing command, empty file, min_nodes above max_nodes, duplicates" {
  spec_error 'name: x\n' "job.yaml:1:1: missing 'command' (the program each rank runs, as a list or a string)"
  spec_error '' "job.yaml: the job file is empty (it needs at least 'command')"
  spec_error 'command: [true]\nnodes: [localhost, 127.0.0.1, "::1"]\nelastic: {min_nodes: 3, max_nodes: 2}\n' \
    "job.yaml:3:22: elastic.min_nodes (3) is above elastic.max_nodes (2)"
  spec_error 'command: [true]\ncommand: [false]\n' \
    "job.yaml:2:1: duplicate key 'command' in the job spec (first given at line 1)"
  spec_error 'command: [true]\nnodes: [localhost, localhost]\n' \
    "job.yaml:2:20: node 'localhost' is listed twice"
}

@test "YAML syntax errors and unreadable files" {
  spec_error 'command: [true\n' \
    "job.yaml:2:1: YAML syntax error: did not find expected ',' or ']' while parsing a flow sequence"
  run "$DDPRUN" "$BATS_TEST_TMPDIR/none.yaml"
  assert_failure 2
  assert_output "ddprun: error: $BATS_TEST_TMPDIR/none.yaml: cannot read the job file: No such file or directory"
  printf 'command: [true]\n' >locked.yaml
  chmod 000 locked.yaml
  if [ "$(id -u)" -ne 0 ]; then
    run "$DDPRUN" locked.yaml
    assert_failure 2
    assert_output --partial "cannot read the job file: Permission denied"
  fi
}

@test "bad --set values are reported as such" {
  spec_error 'command: [true]\n' "--set nproc_per_node: expected KEY=VALUE, with a dotted KEY such as elastic.min_nodes" --set nproc_per_node
  spec_error 'command: [true]\n' "--set nproc_per_node=lots: nproc_per_node must be a whole number from 1 to 4096, got 'lots'" --set nproc_per_node=lots
  spec_error 'command: [true]\n' "--set name.x=1: 'x' is inside a value that is not a mapping or a list" --set name=a --set name.x=1
  spec_error 'command: [true]\nnodes: [localhost]\n' "--set nodes.3.slots=2: '3' is not an index of the list (0 to 0)" --set nodes.3.slots=2
}

@test "plan prints the resolved spec and the rank map, and starts nothing" {
  printf 'name: demo\ncommand: [./train, --lr, "0.1"]\nnodes:\n  - host: localhost\n    slots: 3\nenv: {SEED: "7"}\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_success
  assert_line "name: demo"
  assert_line "command: [./train, --lr, 0.1]"
  assert_line "world_size: 3"
  assert_line --regexp '^0 +localhost +0 +0 *$'
  assert_line --regexp '^0 +localhost +2 +2 *$'
  assert_output --partial "SEED=7"
  assert_output --partial "OMP_NUM_THREADS=1"
  [ ! -e ddprun-logs ]
}

@test "--set overrides keys, nested keys, list items and whole values" {
  printf 'command: [true]\nnodes: [{host: localhost, slots: 2}]\n' >job.yaml
  run "$DDPRUN" plan job.yaml --set nodes.0.slots=5 --set env.FOO=bar --set 'command=[echo, hi]' \
    --set stop_grace=3s --set elastic.max_restarts=2
  assert_success
  assert_line "world_size: 5"
  assert_line "  FOO: bar"
  assert_line "command: [echo, hi]"
  assert_line "stop_grace: 3s"
  assert_output --partial "max_restarts: 2"
  assert_line "warm: {imports: [torch]}   # Python ranks restart from warm interpreters"
  run "$DDPRUN" plan job.yaml --set warm=off
  assert_line "warm: off"
  run "$DDPRUN" plan job.yaml --set 'warm={imports: [numpy, a.b]}'
  assert_line "warm: {imports: [numpy, a.b]}   # Python ranks restart from warm interpreters"
  # later --set wins
  run "$DDPRUN" plan job.yaml --set name=a --set name=b
  assert_line "name: b"
}

@test "ssh keys, remote_ddprun among them, reach the plan, with the defaults of fanout and forward_agent" {
  printf 'command: [true]\nnodes: [n1, n2]\nssh: {strict_host_key_checking: accept-new, remote_ddprun: /opt/ddprun/bin/ddprun, port: 2222}\n' >"$BATS_TEST_TMPDIR/j.yaml"
  run "$DDPRUN" plan "$BATS_TEST_TMPDIR/j.yaml"
  assert_success
  assert_output --partial "port: 2222"
  assert_output --partial "strict_host_key_checking: accept-new, remote_ddprun: /opt/ddprun/bin/ddprun, fanout: 32, forward_agent: false}"
}

@test "one rule for paths: relative to the job file's folder, from the file or --set, wherever ddprun runs; ~/ is home" {
  mkdir -p proj/wd elsewhere
  printf 'command: [./train]\nworkdir: wd\nlogs: {dir: runs}\ncheckpoint: {dir: ckpt}\nnodes: [n1]\nssh: {identity: keys/id, known_hosts: ~/kh}\n' >proj/job.yaml
  cd elsewhere
  run "$DDPRUN" plan ../proj/job.yaml
  assert_success
  p=$(cd .. && pwd)/proj
  assert_output --partial "workdir: $p/wd"
  assert_output --partial "logs: {dir: $p/runs,"
  assert_output --partial "checkpoint: {dir: $p/ckpt, replicas: 0, on_corrupt: fail}"
  assert_output --partial "identity: $p/keys/id, known_hosts: $HOME/kh,"
  run "$DDPRUN" plan ../proj/job.yaml --set logs.dir=other --set checkpoint.dir=/abs/ck
  assert_output --partial "logs: {dir: $p/other,"
  assert_output --partial "checkpoint: {dir: /abs/ck, replicas: 0, on_corrupt: fail}"
  # the default logs folder too
  printf 'command: [true]\n' >../proj/plain.yaml
  run "$DDPRUN" plan ../proj/plain.yaml
  assert_output --partial "logs: {dir: $p/ddprun-logs,"
}

@test "network: interface and family are checked, shown by plan, and reach the ranks" {
  cd "$BATS_TEST_TMPDIR"
  printf 'command: [true]\nnetwork: {interface: "eth0 x"}\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output --regexp "job.yaml:2:[0-9]+: network.interface must be 'auto' or an interface name such as eth0"
  printf 'command: [true]\nnetwork: {family: ipx}\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output --partial "network.family must be auto, ipv4 or ipv6, got 'ipx'"
  printf 'command: "echo $GLOO_SOCKET_IFNAME/$NCCL_SOCKET_IFNAME/$TP_SOCKET_IFNAME/$NCCL_SOCKET_FAMILY"\nlogs: {dir: logs}\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_output --partial "network: {interface: auto, family: auto}"
  assert_line --regexp "^localhost +lo \(routes to the store at 127\.0\.0\.1\)$"
  # auto: the interface that routes to the store (loopback for a local job)
  run "$DDPRUN" job.yaml
  assert_line "[localhost:0] lo/lo/lo/"
  # forced, and a variable the job sets itself is kept
  run "$DDPRUN" job.yaml --set network.interface=eth7 --set network.family=ipv6 --set env.NCCL_SOCKET_IFNAME=mine
  assert_line "[localhost:0] eth7/mine/eth7/AF_INET6"
  # and one from the launching shell (a local node's environment) too
  GLOO_SOCKET_IFNAME=shell run "$DDPRUN" job.yaml
  assert_line "[localhost:0] shell/lo/lo/"
}

@test "export: patterns are checked and plan shows what remote ranks get from this shell" {
  cd "$BATS_TEST_TMPDIR"
  printf 'command: [true]\nexport: NCCL_*\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output --partial "job.yaml:2:9: export must be a list of variable names or patterns"
  printf 'command: [true]\nexport: [NCCL_*, "A=B"]\n' >job.yaml
  run "$DDPRUN" plan job.yaml
  assert_failure 2
  assert_output --partial "export: 'A=B' is not a variable name or pattern"
  printf 'command: [true]\nexport: [MY_*, -OMP_NUM_THREADS]\n' >job.yaml
  MY_VAR=1 OMP_NUM_THREADS=3 OMP_PROC_BIND=close XYZ=2 run "$DDPRUN" plan job.yaml
  assert_success
  assert_line "MY_VAR=1"
  assert_line "OMP_PROC_BIND=close"
  refute_line "OMP_NUM_THREADS=3"
  refute_line "XYZ=2"
}

@test "rendezvous.timeout a job does not give grows with its nodes: twice their provisioning (87 ms per SSH node, 15 ms per srun step) beyond 60 s" {
  timeout_of() { sed -n 's/^rendezvous: .*timeout: \([0-9a-z]*\), last_call.*/\1/p'; }
  { printf 'command: [true]\nnodes:\n'; for i in $(seq 1000); do echo "  - n$i"; done; } >big.yaml
  [ "$("$DDPRUN" plan big.yaml | timeout_of)" = 174s ] # 2 x 1,000 x 87 ms
  # given, it is what is given
  [ "$("$DDPRUN" plan big.yaml --set rendezvous.timeout=90s | timeout_of)" = 90s ]
  # few nodes, or local ones: 60 s
  [ "$("$DDPRUN" plan big.yaml --set 'nodes=[n1, n2, n3]' | timeout_of)" = 60s ]
  [ "$("$DDPRUN" plan big.yaml --set 'nodes=[localhost]' --set nproc_per_node=4 | timeout_of)" = 60s ]
  # 10,000 nodes of a Slurm allocation through srun steps: 2 x 10,000 x 15 ms
  if command -v srun >/dev/null; then
    [ "$(SLURM_JOB_ID=7 SLURM_JOB_NODELIST='n[00001-10000]' "$DDPRUN" plan big.yaml --set nodes=slurm | timeout_of)" = 300s ]
  fi
}

@test "launcher: external needs a number of nodes, a token file of mode 0600, a fixed port and an address the nodes reach" {
  X='command: [true]\nlauncher: external\n'
  spec_error "$X" "job.yaml:2:11: launcher: external needs nodes: N, how many agents may join (the agents started elsewhere run \`ddprun agent --join\`)"
  spec_error "${X}nodes: [a, b]\n" "job.yaml:3:8: with launcher: external, nodes is how many agents may join (a number): the agents say who they are"
  spec_error "${X}nodes: 2\n" "job.yaml:2:11: launcher: external needs rendezvous.token_file (a file of mode 0600 holding the job's token, which each agent is given too)"
  spec_error "${X}nodes: 2\nrendezvous: {token_file: tok}\n" "job.yaml:4:13: launcher: external needs a fixed rendezvous.port (where the agents join)"
  spec_error "${X}nodes: 2\nrendezvous: {token_file: tok, port: 29500}\n" "job.yaml:4:13: launcher: external needs a rendezvous.listen the agents' nodes reach (0.0.0.0, or an address of this machine), not 'auto'"
  spec_error "${X}nodes: 2\nrendezvous: {token_file: tok, port: 29500, listen: 127.0.0.1}\n" "job.yaml:4:13: launcher: external needs a rendezvous.listen the agents' nodes reach (0.0.0.0, or an address of this machine), not '127.0.0.1'"
  spec_error "${X}nodes: 2\nrendezvous: {token_file: tok, port: 29500, listen: 0.0.0.0, torch_store: launcher}\n" "job.yaml:4:74: rendezvous.torch_store: launcher serves only the nodes it knows at the start; with launcher: external it is rank0 (rank 0 hosts PyTorch's TCPStore, as under torchrun)"
  # a token file open to others is refused when the job starts, naming it; nothing runs
  printf 'command: [true]\nlauncher: external\nnodes: 1\nrendezvous: {token_file: tok, port: %d, listen: 0.0.0.0}\nlogs: {dir: logs}\n' $((20000 + RANDOM % 20000)) >job.yaml
  openssl rand -hex 32 >tok
  chmod 644 tok
  run timeout 20 "$DDPRUN" job.yaml
  assert_failure 3
  assert_output --partial "token file '$PWD/tok' is accessible by group or others (mode 644); chmod 600 it"
  assert_output --partial "ddprun: error: cannot use rendezvous.token_file '$PWD/tok' (said above)"
  run "$DDPRUN" agent --join 127.0.0.1:1
  assert_failure 2
  assert_output "ddprun: error: agent: --join HOST:PORT and --token-file FILE go together (see 'ddprun agent --help')"
}
