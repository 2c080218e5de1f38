#!/usr/bin/env bats
# Hostile job files: whatever a file holds, `ddprun plan` (the loader every command uses)
# answers with status 2 and one message naming the cause, quickly, without crashing. Times are
# bounded at 5 s, far above the 0.1-0.3 s these take and far below what the quadratic or
# recursive loader they guard against took (66 s for 200,000 keys; a crash for 60,000 '[').
load '../lib/common'

setup() {
  cd "$BATS_TEST_TMPDIR"
}

# plan FILE MESSAGE: status 2, MESSAGE on stderr, within 5 s.
refused() {
  local t0 t1
  t0=$(date +%s%N)
  run timeout 20 "$DDPRUN" plan "$1"
  t1=$(date +%s%N)
  echo "status $status after $(((t1 - t0) / 1000000)) ms: ${output:0:300}"
  [ "$status" -eq 2 ]
  assert_output --partial "$2"
  [ $(((t1 - t0) / 1000000)) -lt 5000 ]
  [ "$(echo "$output" | wc -l)" -eq 1 ]
}

@test "60,000 nested '[' or '{': refused at the depth limit, not a stack overflow" {
  python3 -c "print('command: ' + '[' * 60000)" >seq.yaml
  refused seq.yaml "seq.yaml:1:73: lists and mappings nested more than 64 deep (a job spec needs 4)"
  python3 -c "print('command: [true]\nenv: ' + '{a: ' * 60000)" >map.yaml
  refused map.yaml "lists and mappings nested more than 64 deep"
  # block style: each level indented two more spaces
  python3 -c "print('command: [true]\n' + ''.join('  ' * i + 'a:\n' for i in range(3000)))" >block.yaml
  refused block.yaml "lists and mappings nested more than 64 deep"
  # 64 levels are still fine where the schema allows them (an env value must be a scalar)
  python3 -c "print('command: [true]\nenv: {A: ' + '[' * 62 + ']' * 62 + '}')" >ok.yaml
  refused ok.yaml "ok.yaml:2:10: an env value must be a single value, not a list"
}

@test "many keys are handled in linear time: 200,000 env keys, unknown keys, duplicates" {
  python3 -c "
print('command: [true]\nenv:')
for i in range(200000): print(f'  K{i}: v')" >env.yaml
  refused env.yaml "env.yaml:3:3: command and env take 3408 KiB (200000 variables); a rank's command line and environment are limited to 512 KiB"
  python3 -c "
print('command: [true]\nenv:')
for i in range(200000): print(f'  K{i}: v')
print('  K7: again')" >dup.yaml
  refused dup.yaml "dup.yaml:200003:3: duplicate key 'K7' in env (first given at line 10)"
  python3 -c "
print('command: [true]')
for i in range(200000): print(f'k{i}: v')" >top.yaml
  refused top.yaml "top.yaml:2:1: unknown key 'k0' in the job spec"
  python3 -c "
print('command: [true]\nnodes:')
for i in range(100000): print(f'  - n{i}')
print('  - n5')" >nodes.yaml
  refused nodes.yaml "nodes.yaml:100003:5: node 'n5' is listed twice"
  # and a large valid job loads as fast: 20,000 variables of a real size
  python3 -c "
print('command: [true]\nenv:')
for i in range(20000): print(f'  K{i}: v{i}')" >big.yaml
  run timeout 20 "$DDPRUN" plan big.yaml
  assert_success
  assert_output --partial "K19999=v19999"
}

@test "tabs: 'tabs cannot indent YAML' with the line and column of the tab" {
  printf 'command: [true]\nenv:\n\tA: b\n' >tab.yaml
  refused tab.yaml "tab.yaml:3:1: tabs cannot indent YAML: indent with spaces"
  printf 'command:\n  - true\n\t- false\n' >tab2.yaml
  refused tab2.yaml "tab2.yaml:3:1: tabs cannot indent YAML"
  # a tab after a key's colon separates, as YAML allows
  printf 'command:\t[true]\n' >ok.yaml
  run "$DDPRUN" plan ok.yaml
  assert_success
}

@test "binary files, NUL bytes, bad UTF-8, an empty file, a folder, a missing file" {
  head -c 4096 /dev/urandom >garbage.bin
  # random bytes: whatever libyaml trips on first, it is named with a place and is not a crash
  run timeout 20 "$DDPRUN" plan garbage.bin
  [ "$status" -eq 2 ]
  assert_output --regexp "^ddprun: error: garbage.bin(:[0-9]+:[0-9]+)?: "
  printf 'command: [true]\nname: a\0b\n' >nul.yaml
  refused nul.yaml "nul.yaml:2:8: a NUL byte: a job file is YAML text (is it one?)"
  printf 'command: [\xc3\x28]\n' >utf.yaml
  refused utf.yaml "utf.yaml:1:12: not UTF-8 text (byte 0x28): a job file is YAML text (is it one?)"
  : >empty.yaml
  refused empty.yaml "empty.yaml: the job file is empty (it needs at least 'command')"
  printf '# only a comment\n' >comment.yaml
  refused comment.yaml "the job file is empty"
  mkdir folder
  refused folder "folder: is a folder, not a job file"
  refused missing.yaml "missing.yaml: cannot read the job file: No such file or directory"
  cp /bin/true prog
  refused prog "prog:"
}

@test "a 20 MB scalar is refused by size; a 200 KB one by the exec limit it would break" {
  python3 -c "print('command: [true, ' + 'x' * 20000000 + ']')" >huge.yaml
  refused huge.yaml "huge.yaml: the job file is larger than 16 MiB"
  python3 -c "print('command: [true, ' + 'x' * 200000 + ']')" >big.yaml
  refused big.yaml "big.yaml:1:17: command argument 1 is 200000 bytes; exec takes at most 131071"
  python3 -c "print('command: [true]\nenv: {A: ' + 'x' * 200000 + '}')" >bigenv.yaml
  refused bigenv.yaml "bigenv.yaml:2:7: env: A=... is 200002 bytes; a variable holds at most 131071"
}

@test "alias bombs are refused at the first alias" {
  {
    echo 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]'
    for k in b c d e f g h i; do
      p=$(printf '%s' "$k" | tr 'b-i' 'a-h')
      echo "$k: &$k [*$p, *$p, *$p, *$p, *$p, *$p, *$p, *$p, *$p]"
    done
    echo 'command: *i'
  } >bomb.yaml
  refused bomb.yaml "bomb.yaml:2:8: YAML aliases (*name) are not supported in job files"
}

@test "a program given instead of a job file gets a hint" {
  printf '#!/bin/sh\necho hi\n' >train.sh
  run "$DDPRUN" train.sh
  [ "$status" -eq 2 ]
  assert_output --partial "train.sh: this is a program, not a job file: a job file is a YAML mapping of keys to values (see ddprun-job(5)); to run a program without one, as torchrun does: ddprun [--nproc-per-node N] --no-python PROGRAM ARGS... (a .py script: ddprun train.py)"
  printf -- '- a\n- b\n' >list.yaml
  refused list.yaml "list.yaml:1:1: this is a YAML list, not a job file"
}
