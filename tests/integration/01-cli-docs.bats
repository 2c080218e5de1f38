#!/usr/bin/env bats
# --help, --version and the man pages agree with cli/options.def.
load '../lib/common'

@test "every option in cli/options.def is in --help and in man/ddprun.1" {
  run "$DDPRUN" --help
  assert_success
  help=$output
  opts=$(grep -o '^DDP_OPT([a-z]*, [A-Z_]*, "[a-z-]*"' "$REPO/cli/options.def" | sed 's/.*"\(.*\)"/\1/')
  [ -n "$opts" ]
  for o in $opts; do
    [[ "$help" == *"--$o"* ]] || { echo "--$o missing from --help"; return 1; }
    sed 's/\\-/-/g' "$REPO/man/ddprun.1" | grep -q -- "--$o" || { echo "--$o missing from man/ddprun.1"; return 1; }
  done
}

@test "every job-spec key the parser accepts is documented in man/ddprun-job.5" {
  keys=$(awk '/_keys\[\] = \{/{f=1} f{print} /NULL\};/{f=0}' "$REPO/cli/job.c" |
    grep -o '"[a-z_]*"' | tr -d '"' | sort -u)
  [ "$(echo "$keys" | wc -l)" -ge 25 ]
  for k in $keys; do
    sed 's/\\-/-/g' "$REPO/man/ddprun-job.5" | grep -qE "^\.B $k\b|\.B $k\$|\.BR $k |^\.B $k$" ||
      { echo "key '$k' missing from man/ddprun-job.5"; return 1; }
  done
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
  for p in "$REPO/man/ddprun.1" "$REPO/man/ddprun-store.7" "$REPO/man/ddprun-job.5" "$REPO/man/ddp_pg.3"; do
    run bash -c "LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l '$p' 2>&1 >/dev/null"
    assert_success
    assert_output ""
  done
  run bash -c "MANWIDTH=80 man -l '$REPO/man/ddprun-store.7' | col -b"
  assert_output --partial "LEASE_GRANT"
}

@test "every public function of the process group and the reducer is in its man page" {
  for pair in worker/pg.h:ddp_pg.3 reducer/reducer.h:ddp_reducer.3; do
    h=${pair%%:*} m=${pair##*:}
    fns=$(grep -oE '\bddp_(pg|work|reducer)_[a-z_]+\(' "$REPO/$h" | tr -d '(' | sort -u)
    [ -n "$fns" ]
    for f in $fns; do
      sed 's/\\-/-/g' "$REPO/man/$m" | grep -q "$f" || { echo "$f missing from man/$m"; return 1; }
    done
  done
}
