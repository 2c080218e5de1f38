#!/usr/bin/env bats
# README.md is read in two minutes, and its quick starts run as written: on this suite's own test
# hosts where one names nodes (node1, node2, ... are hosts of network namespaces with sshd and a
# slurmd each), with the build's ddprun and ddprun-fmnist first on PATH as an install puts them.
load '../lib/common'
load '../lib/sshd'
load '../lib/slurm'

teardown() {
  slurm_teardown
}

@test "README.md: at most 250 lines and 1000 words outside code blocks, no line over 120 characters, no table cell over 25 words" {
  run awk '
    /^```/ { code = !code; next }
    { if (length($0) > 120) { print "line " NR " has " length($0) " characters"; bad = 1 } }
    !code { words += NF - gsub(/\|/, "|") }
    !code && /^\|/ { n = split($0, c, "|"); for (i = 2; i < n; i++) if (split(c[i], w, " ") > 25) {
      print "line " NR ": a cell of " split(c[i], w, " ") " words"; bad = 1 } }
    END { if (NR > 250) { print NR " lines"; bad = 1 }
          if (words > 1000) { print words " words"; bad = 1 }
          print NR " lines, " words " words"; exit bad }' "$REPO/README.md"
  echo "$output"
  assert_success
}

@test "every file that README.md and docs/ link to or name exists" {
  cd "$REPO"
  run bash -c '
    for d in README.md docs/*/*.md; do
      # markdown links, relative to the document
      grep -oE "\]\([^)#]+\)" "$d" | sed -E "s/^\]\(|\)$//g" | grep -v "^https\?:" |
        while read -r l; do [ -e "$(dirname "$d")/$l" ] || echo "$d links to $l"; done
      # paths in backquotes, from the top of the tree
      grep -oE "\`(cli|common|rendezvous|worker|reducer|pipeline|examples|bench|tests|man|docs)/[A-Za-z0-9_./-]+\`" "$d" |
        tr -d "\`" | sed "s/[.]$//" | grep -v "[*]" |
        while read -r f; do [ -e "$f" ] || echo "$d names $f"; done
    done'
  assert_success
  assert_output ""
}

@test "BENCHMARKS.md and README.md's performance rows are what bench/report renders from bench/results/" {
  run "$REPO/bench/report" --check
  echo "$output"
  assert_success
  # a result changed and not rendered again is found
  d="$BATS_TEST_TMPDIR/r"
  mkdir -p "$d/bench"
  cp -r "$REPO/bench/report" "$REPO/bench/about.md" "$REPO/bench/results" "$d/bench/"
  cp "$REPO/BENCHMARKS.md" "$REPO/README.md" "$d/"
  # every all-reduce result's shm/Gloo at 16 MiB (a claim of the summary and of README) made 99.99x
  for f in "$d"/bench/results/*/allreduce_compare.md; do
    awk -F'|' -v OFS='|' '$2 == " 16 MiB " && !done { $9 = " 99.99x "; done = 1 } 1' "$f" >"$f.new"
    mv "$f.new" "$f"
  done
  run "$d/bench/report" --check
  assert_failure
  assert_output --partial "| all-reduce, 2 ranks of a node, 16 MiB | Gloo | 99.99x |"
}

# The quick starts' blocks, in order: "sh" lines are commands; a "yaml" block is the file its
# first line names (# NAME). Prints "file NAME" then the block, or "run COMMAND".
quick_starts() {
  awk '
    /^## / { on = ($0 == "## Quick starts"); next }
    !on { next }
    /^```sh$/ { blk = "sh"; next }
    /^```yaml$/ { blk = "yaml"; first = 1; next }
    /^```$/ { if (blk == "yaml") print "end"; blk = ""; next }
    blk == "sh" && NF { print "run " $0 }
    blk == "yaml" { if (first) { print "file " $2; first = 0 } print "  " $0 }' "$REPO/README.md"
}

@test "README.md's quick starts run as written" {
  trains
  /usr/bin/python3 -c 'import torch' 2>/dev/null || skip "python3-torch is not installed"
  [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || skip "needs dataset-fashion-mnist"
  cd "$BATS_TEST_TMPDIR"
  slurm_setup 3
  for k in 1 2 3; do sshd_start "$k"; done
  # an install's PATH: ddprun and ddprun-fmnist, and a python3 with torch
  mkdir bin && ln -s "${DDP_TEST_PYTHON:-/usr/bin/python3}" bin/python3
  export PATH="$BUILD:$PWD/bin:$PATH"
  mkdir -p examples && ln -s "$REPO/examples/pytorch" examples/pytorch
  # node K is test host K; ssh's settings for the test hosts follow the command's word
  hosts() { perl -pe "s/\\bnode([1-9])\\b/'10.213.$SSHD_TAG.' . (\$1 + 1)/ge"; }
  sshset="--set ssh.port=$SSH_PORT --set ssh.identity=$SSH_KEY --set ssh.known_hosts=$SSH_KH"
  n=0
  while IFS= read -r line; do
    case "$line" in
    "file "*) f=${line#file }; : >"$f" ;;
    "end") cat "$f" ;;
    "run "*)
      cmd=$(printf '%s\n' "${line#run }" | hosts |
        sed -E "s/(^|[ ])ddprun( plan| doctor)?( |$)/\1ddprun\2 $(printf '%s' "$sshset" | sed 's/[\/&]/\\&/g')\3/")
      echo "# $cmd"
      run slurm_login bash -c "$cmd"
      echo "$output" | tail -n 5
      assert_success
      n=$((n + 1))
      ;;
    *) printf '%s\n' "${line#  }" | hosts >>"$f" ;;
    esac
  done < <(quick_starts)
  [ "$n" -ge 6 ]
}
