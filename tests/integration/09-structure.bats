#!/usr/bin/env bats
# The shape of the tree (../shared/STYLE.md, "Structure as the project grows"): no cycle of
# includes or of calls between files, no file over 800 lines without a reason in its opening
# comment. Calls are read from the build's object files (tests/helpers/check_structure.py).
load '../lib/common'

@test "no include cycle, no call cycle between files, no file over 800 lines without a reason" {
  run python3 "$REPO/tests/helpers/check_structure.py" "$REPO" "$BUILD"
  echo "$output"
  assert_success
  assert_output --regexp "[0-9]+ files, [0-9]+ with calls between them checked, 10 rooms: 0 problems"
}

@test "the check sees a cycle when there is one" {
  # two files that call each other, and two headers that include each other
  d="$BATS_TEST_TMPDIR/tree"
  mkdir -p "$d/cli" "$d/build/CMakeFiles/x.dir/cli"
  printf '#include "cli/b.h"\n' >"$d/cli/a.h"
  printf '#include "cli/a.h"\n' >"$d/cli/b.h"
  printf 'int b(void);\nint a(void) { return b(); }\n' >"$d/cli/a.c"
  printf 'int a(void);\nint b(void) { return a() + 1; }\n' >"$d/cli/b.c"
  for f in a b; do cc -c -o "$d/build/CMakeFiles/x.dir/cli/$f.c.o" "$d/cli/$f.c"; done
  run python3 "$REPO/tests/helpers/check_structure.py" "$d" "$d/build"
  assert_failure
  assert_output --partial "include cycle: cli/a.h -> cli/b.h"
  assert_output --partial "call cycle between files: cli/a.c, cli/b.c"
}

@test "the check fails on an include or a call that cli/CMakeLists.txt's rooms do not allow" {
  # a scratch copy of cli/ and of its object files, then one forbidden edge of each kind
  d="$BATS_TEST_TMPDIR/tree"
  mkdir -p "$d/build"
  cp -r "$REPO/cli" "$d/cli"
  (cd "$BUILD" && find cli -name '*.c.o' -path '*/CMakeFiles/ddprun_*' -exec cp --parents {} "$d/build/" \;)
  run python3 "$REPO/tests/helpers/check_structure.py" "$d" "$d/build"
  assert_success
  # sys is the lowest room: it may include nothing of the supervisor's
  printf '#include "cli/supervisor/supervisor.h"\n' >>"$d/cli/sys/hostlist.h"
  # spec may not call into the supervisor
  printf 'struct ddp_job;\nint ddp__launch(const struct ddp_job *job, int ready_fd);\nint ddp__evil(void) { return ddp__launch(0, -1); }\n' >"$d/cli/spec/evil.c"
  cc -c -o "$d/build/cli/CMakeFiles/ddprun_spec.dir/spec/evil.c.o" "$d/cli/spec/evil.c"
  # a file in no room
  cp "$d/cli/sys/sys.c" "$d/cli/loose.c"
  run python3 "$REPO/tests/helpers/check_structure.py" "$d" "$d/build"
  assert_failure
  assert_output --partial "cli/sys/hostlist.h uses cli/supervisor/supervisor.h: room sys may not use supervisor"
  assert_output --partial "cli/spec/evil.c uses cli/supervisor/supervise.c: room spec may not use supervisor"
  assert_output --partial "cli/loose.c: in no room"
  # the table is what allows, and it has no circle: spec may use the supervisor only from above it
  sed -i 's/^ddp_room(spec       USES sys)/ddp_room(spec USES sys supervisor)/' "$d/cli/CMakeLists.txt"
  run python3 "$REPO/tests/helpers/check_structure.py" "$d" "$d/build"
  refute_output --partial "room spec may not use supervisor"
  assert_output --partial "room spec uses supervisor, which is not before it in the table"
}

@test "the architecture tour (docs/internals/architecture.md) names every .c file, and each file it names exists" {
  tour="$REPO/docs/internals/architecture.md"
  missing=$(cd "$REPO" && find common rendezvous worker reducer pipeline cli examples -name '*.c' -o -name '*.cu' |
    while read -r f; do grep -qF "\`$f\`" "$tour" || echo "$f"; done)
  [ -z "$missing" ] || { echo "not in the tour: $missing"; return 1; }
  gone=$(grep -oE '`[a-z_]+/[a-zA-Z0-9_./-]+\.(c|h|cu|py|def|txt|sbatch)`' "$tour" | tr -d '`' | sort -u |
    while read -r f; do [ -e "$REPO/$f" ] || echo "$f"; done)
  [ -z "$gone" ] || { echo "named in the tour, not in the tree: $gone"; return 1; }
}

# The names an enum of header H declares (its enumerators), from the line "enum NAME {" on.
enumerators() { # header enum-name
  awk -v e="enum $2 {" 'index($0, e) { on = 1 } on { print } on && /}/ { exit }' "$1" |
    grep -oE '\bDDP__[A-Z0-9_]+\b' | grep -v "^DDP__[A-Z_]*_H$"
}

@test "the protocol and state machine documents name every frame, phase and node state of the code" {
  doc="$REPO/docs/internals/agent-protocol.md"
  n=0
  while read -r name value; do
    grep -qE "^\| $value \| \`$name\` \|" "$doc" || { echo "frame $name ($value) not in $doc"; return 1; }
    n=$((n + 1))
  done < <(sed -n '/^enum ddp__agent_msg {/,/^};/p' "$REPO/cli/proto/agent_proto.h" |
    sed -nE 's/^ *(DDP__AG_[A-Z_]+) = (0x[0-9a-f]+|[0-9]+),.*/\1 \2/p' |
    while read -r a b; do printf '%s 0x%02x\n' "$a" "$((b))"; done)
  [ "$n" -ge 17 ]
  doc="$REPO/docs/internals/supervisor.md"
  states=$(enumerators "$REPO/cli/supervisor/supervisor.h" ddp__sup_phase
    enumerators "$REPO/cli/supervisor/supervisor.h" ddp__node_state)
  [ "$(echo "$states" | wc -l)" -ge 10 ]
  for s in $states; do grep -qF "\`$s\`" "$doc" || { echo "$s not in $doc"; return 1; }; done
}

# Bash does not stop on a negated command (`! cmd`) that succeeds unless it is the last one, so
# in a test body `! grep -q x f` alone asserts nothing; such a line must end in `|| false`.
negations_that_assert_nothing() { # files...
  awk '
    /^@test/ { t = 1; prev = ""; next }
    t && /^}/ { t = 0; next }
    t && !/^[ \t]*$/ && !/^[ \t]*#/ {
      if (prev ~ /^[ \t]*! / && prev !~ /\|\| (false|return 1)/) print FILENAME ":" pn ": " prev
      prev = $0; pn = FNR
    }' "$@"
}

@test "every negated command in a test asserts something (is the test's last or ends in || false)" {
  run negations_that_assert_nothing "$REPO"/tests/integration/*.bats
  assert_success
  assert_output ""
  # the check finds one
  printf '@test "x" {\n  ! grep -q a f\n  true\n}\n' >"$BATS_TEST_TMPDIR/t.bats"
  run negations_that_assert_nothing "$BATS_TEST_TMPDIR/t.bats"
  assert_output --partial "t.bats:2:   ! grep -q a f"
}
