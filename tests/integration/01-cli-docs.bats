#!/usr/bin/env bats
# --help, --version and the man pages agree with cli/spec/options.def.
load '../lib/common'

@test "every option in cli/spec/options.def is in --help and in man/ddprun.1" {
  run "$DDPRUN" --help
  assert_success
  help=$output
  opts=$(grep -o '^DDP_OPT([a-z]*, [A-Z_]*, "[a-z-]*"' "$REPO/cli/spec/options.def" | sed 's/.*"\(.*\)"/\1/')
  [ -n "$opts" ]
  for o in $opts; do
    [[ "$help" == *"--$o"* ]] || { echo "--$o missing from --help"; return 1; }
    sed 's/\\-/-/g' "$REPO/man/ddprun.1" | grep -q -- "--$o" || { echo "--$o missing from man/ddprun.1"; return 1; }
  done
}

# The keys of the key table (its file $1) that man page $2 does not document, a line each.
undocumented_keys() {
  local k keys
  # the one list of them (cli/spec/keys.def): each key by its name in its section
  keys=$(sed -nE 's/^DDP_[A-Z]+\([A-Z0-9_]+, "([a-z_.]+)".*/\1/p' "$1" | sed 's/.*\.//' | sort -u)
  [ "$(echo "$keys" | wc -l)" -ge 25 ] || echo "only $(echo "$keys" | wc -l) keys in $1"
  for k in $keys; do
    sed 's/\\-/-/g' "$2" | grep -qE "^\.B $k\b|\.B $k\$|\.BR $k |^\.B $k$" || echo "key '$k' missing from $2"
  done
}

@test "every job-spec key the parser accepts is documented in man/ddprun-job.5" {
  run undocumented_keys "$REPO/cli/spec/keys.def" "$REPO/man/ddprun-job.5"
  assert_output ""
  # a key added to the table alone is required there
  cp "$REPO/cli/spec/keys.def" "$BATS_TEST_TMPDIR/keys.def"
  echo 'DDP_VAL(LOGS_COLOR, "logs.color", BOOL, tag_output, 0, 0, "false", NULL)' >>"$BATS_TEST_TMPDIR/keys.def"
  run undocumented_keys "$BATS_TEST_TMPDIR/keys.def" "$REPO/man/ddprun-job.5"
  assert_output "key 'color' missing from $REPO/man/ddprun-job.5"
}

@test "no job-file key is named in cli/spec/ outside its table, cli/spec/keys.def" {
  run python3 "$REPO/tests/helpers/key_strings.py" "$REPO"
  assert_success
  assert_output ""
  # a key looked up by its name, or named in a message, is found
  mkdir -p "$BATS_TEST_TMPDIR/r/cli/spec"
  cp "$REPO"/cli/spec/*.c "$REPO/cli/spec/keys.def" "$BATS_TEST_TMPDIR/r/cli/spec/"
  printf 'static const char *a = "elastic";\nstatic const char *b = "got elastic.min_nodes wrong";\n' \
    >>"$BATS_TEST_TMPDIR/r/cli/spec/load.c"
  run python3 "$REPO/tests/helpers/key_strings.py" "$BATS_TEST_TMPDIR/r"
  assert_failure
  assert_output --partial 'cli/spec/load.c:'
  assert_output --partial '"elastic" names a key outside cli/spec/keys.def'
  assert_output --partial '"got elastic.min_nodes wrong" names a key'
}

@test "--version prints the CMake project version" {
  want=$(sed -n 's/^project(ddprun VERSION \([0-9.]*\).*/\1/p' "$REPO/CMakeLists.txt")
  run "$DDPRUN" --version
  assert_success
  assert_output "ddprun $want"
}

@test "unknown options and commands are usage errors" {
  run "$DDPRUN" --frobnicate
  assert_failure 2
  assert_output --partial "unknown option '--frobnicate'"
  run "$DDPRUN" launch-the-rockets.yaml
  assert_failure 2
  assert_output "ddprun: error: launch-the-rockets.yaml: cannot read the job file: No such file or directory"
  run "$DDPRUN" plan
  assert_failure 2
  assert_output "ddprun: error: plan: which job file? (ddprun plan JOB.yaml)"
}

@test "man pages render without warnings" {
  for p in "$REPO/man/ddprun.1" "$REPO/man/ddprun-store.7" "$REPO/man/ddprun-job.5" "$REPO/man/ddp_pg.3" "$REPO/man/ddp_pipe.3"; do
    run bash -c "LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l '$p' 2>&1 >/dev/null"
    assert_success
    assert_output ""
  done
  run bash -c "MANWIDTH=80 man -l '$REPO/man/ddprun-store.7' | col -b"
  assert_output --partial "LEASE_GRANT"
}

@test "every public function of the process group, the reducer and the pipeline is in its man page" {
  for pair in worker/pg.h:ddp_pg.3 reducer/reducer.h:ddp_reducer.3 pipeline/stage.h:ddp_pipe.3; do
    h=${pair%%:*} m=${pair##*:}
    fns=$(grep -oE '\bddp_(pg|work|reducer|pipe)_[a-z_]+\(' "$REPO/$h" | tr -d '(' | sort -u)
    [ -n "$fns" ]
    for f in $fns; do
      sed 's/\\-/-/g' "$REPO/man/$m" | grep -q "$f" || { echo "$f missing from man/$m"; return 1; }
    done
  done
}

@test "every command has help: COMMAND --help, -h, help COMMAND; version as a command" {
  for c in plan doctor store agent help version; do
    run "$DDPRUN" "$c" --help
    assert_success
    assert_output --partial "usage: ddprun $c"
    run "$DDPRUN" help "$c"
    assert_success
    assert_output --partial "usage: ddprun $c"
  done
  run "$DDPRUN" plan --help
  assert_output --partial "--set KEY=VALUE"
  assert_output --partial "--nproc N"
  run "$DDPRUN" -h
  assert_success
  assert_output --partial "usage: ddprun [OPTIONS] JOB.yaml"
  run "$DDPRUN" version
  assert_success
  assert_output --regexp "^ddprun [0-9]+\.[0-9]+\.[0-9]+$"
  run "$DDPRUN" help frobnicate
  assert_failure 2
  assert_output --partial "help: no command 'frobnicate'"
  # the agent's frames never come from a terminal: refused at once instead of waiting forever
  run timeout 5 script -qec "$DDPRUN agent" /dev/null
  assert_failure 2
  assert_output --partial "agent: the node agent takes its orders from ddprun on stdin, not from a terminal"
}

@test "options stand anywhere: before or after the job file, --nproc overrides nproc_per_node" {
  cd "$BATS_TEST_TMPDIR"
  printf 'command: "echo rank $RANK of $WORLD_SIZE"\nlogs: {dir: logs}\n' >job.yaml
  run "$DDPRUN" plan --set nproc_per_node=3 job.yaml
  assert_success
  assert_output --partial "world_size: 3"
  run "$DDPRUN" plan job.yaml --nproc 4 --log-level warn
  assert_success
  assert_output --partial "world_size: 4"
  # later ones win, whichever form
  run "$DDPRUN" plan --nproc 4 job.yaml --set nproc_per_node=2
  assert_output --partial "world_size: 2"
  run "$DDPRUN" job.yaml --nproc 3
  assert_success
  assert_output --partial "rank 2 of 3"
  run "$DDPRUN" plan job.yaml --nproc 0
  assert_failure 2
  assert_output "ddprun: error: --nproc 0: nproc_per_node must be a whole number from 1 to 4096, got '0'"
  run "$DDPRUN" plan job.yaml other.yaml
  assert_failure 2
  assert_output --partial "plan: unexpected argument 'other.yaml'"
  run "$DDPRUN" job.yaml python3 train.py
  assert_failure 2
  assert_output --partial "unexpected argument 'python3' after the job file 'job.yaml'"
  run "$DDPRUN" plan job.yaml --frobnicate
  assert_failure 2
  assert_output --partial "unknown option '--frobnicate' (see 'ddprun plan --help')"
}

@test "the --set examples of --help work, nodes.0.slots even on a job without nodes" {
  cd "$BATS_TEST_TMPDIR"
  printf 'command: [true]\nnodes: [localhost, 127.0.0.1]\n' >job.yaml
  help=$("$DDPRUN" --help | grep -- '--set KEY=VALUE')
  kvs=$(echo "$help" | grep -oE '[a-z_]+\.[a-z_.0-9]+=[0-9]+')
  [ "$(echo "$kvs" | wc -l)" -ge 2 ]
  for kv in $kvs; do
    run "$DDPRUN" plan job.yaml --set "$kv"
    [ "$status" -eq 0 ] || { echo "--set $kv: $output"; return 1; }
  done
  printf 'command: [true]\n' >job.yaml
  run "$DDPRUN" plan job.yaml --set nodes.0.slots=4
  assert_output --partial "  - {host: localhost, slots: 4}"
}

# The EXAMPLES of a man page: each .nf/.fi block, unescaped, blocks separated by a line "@@".
examples_of() {
  awk '/^\.SH EXAMPLES?/{e=1;next} /^\.SH/{e=0} e&&/^\.nf/{b=1;next} e&&/^\.fi/{b=0;print "@@";next} e&&b' "$1" |
    sed 's/\\-/-/g; s/\\e/\\/g'
}

@test "every EXAMPLES line of the man pages works as written" {
  cd "$BATS_TEST_TMPDIR"
  cp "$REPO/tests/data/pipedream/vgg16.txt" .   # the profile of the pipeline examples
  export PATH="$BUILD:$PATH"                      # ddprun-fmnist, as installed beside ddprun
  n=0
  for page in "$REPO"/man/*.[0-9]; do
    # a job.yaml the commands can run: a YAML block of the page if it has one
    printf 'command: "echo rank $RANK of $WORLD_SIZE"\nlogs: {dir: logs}\n' >job.yaml
    block=""
    while IFS= read -r line; do
      if [ "$line" != "@@" ]; then block+="$line"$'\n'; continue; fi
      if [[ "$block" == ddprun* || "$block" == \(* ]]; then
        while IFS= read -r cmd; do
          [ -n "$cmd" ] || continue
          n=$((n + 1))
          cmd=${cmd//ddprun /$DDPRUN }
          if [[ "$cmd" == *" status"* || "$cmd" == *" stacks"* ]] && [ -z "${job_pid:-}" ]; then
            # these ask a running job: 6 ranks asleep, until the block's end; its control socket
            # in this test's folder, so that another job of this user is not "the" running job
            export XDG_RUNTIME_DIR="$BATS_TEST_TMPDIR/run"
            mkdir -p -m 700 "$XDG_RUNTIME_DIR"
            "$DDPRUN" --nproc 6 --no-python sleep 120 >job.out 2>&1 &
            job_pid=$!
            for _ in $(seq 100); do "$DDPRUN" status >/dev/null 2>&1 && break; sleep 0.1; done
          fi
          if [[ "$cmd" == *" store "* ]]; then   # a store serves until stopped
            rm -f store.out   # an earlier store command of this page left its address there
            bash -c "$cmd" >store.out 2>&1 &
            store_pid=$!   # not %1: an earlier job of this shell may still hold that number
            for _ in $(seq 50); do [ -s store.out ] && break; sleep 0.1; done
            kill "$store_pid"; wait "$store_pid" || true
            grep -Eq '^0\.0\.0\.0:[0-9]+$' store.out || { echo "$page: $cmd"; cat store.out; return 1; }
          else
            run timeout 120 bash -c "$cmd"
            [ "$status" -eq 0 ] || { echo "$page: $cmd"; echo "$output"; return 1; }
          fi
        done <<<"$block"
        if [ -n "${job_pid:-}" ]; then
          kill -INT "$job_pid"
          wait "$job_pid" || true
          job_pid=""
        fi
      else
        printf '%s' "$block" >job.yaml   # a job file: the commands below use it
        run "$DDPRUN" plan job.yaml
        [ "$status" -eq 0 ] || { echo "$page: this job file does not load:"; cat job.yaml; echo "$output"; return 1; }
      fi
      block=""
    done < <(examples_of "$page")
  done
  [ "$n" -ge 4 ]
}
