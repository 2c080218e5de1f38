#!/usr/bin/env bash
# `ddprun doctor` wall time on 1, 2, 4 and 16 nodes reached over SSH (real OpenSSH sshd test
# hosts, tests/lib/sshd.bash), a shell-script job; each build's doctor checks with its own
# ddprun on the nodes. Two builds side by side, interleaved run by run (BASE_BUILD_DIR: another
# tree's build, e.g. a git worktree of the commit before), medians of RUNS. Needs root and
# openssh-server.
# Usage: bench/doctor_bench.sh BASE_BUILD_DIR [BUILD_DIR] [RUNS]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record doctor_bench "$@" # its output goes to bench/results/<machine>/doctor_bench.md too
cd "$(dirname "$0")/.."
A=$(cd "$1" && pwd)
B=$(cd "${2:-build/release}" && pwd)
RUNS=${3:-7}
BATS_TEST_TMPDIR=$(mktemp -d)
# shellcheck source=../tests/lib/sshd.bash
. tests/lib/sshd.bash
trap 'sshd_teardown; rm -rf "$BATS_TEST_TMPDIR"' EXIT
cd "$BATS_TEST_TMPDIR"
sshd_setup
for k in $(seq 16); do sshd_start "$k"; done
printf '#!/bin/sh\necho trained\n' >train.sh
chmod +x train.sh

ms() { # build job -> wall milliseconds (the doctor must pass)
  local s e
  s=$(date +%s%N)
  "$1/ddprun" doctor "$2" --set ssh.remote_ddprun="$1/ddprun" >out 2>&1 || { cat out >&2; exit 1; }
  e=$(date +%s%N)
  echo $(((e - s) / 1000000))
}
median() { sort -n | sed -n "$(((RUNS + 1) / 2))p"; }

echo "# $(date -u +%F) $(nproc) CPUs, $(sed -n 's/^model name.*: //p' /proc/cpuinfo | head -n1); RUNS=$RUNS"
echo "# base: $A; this: $B"
echo "| nodes | base ms | this ms | base / this |"
echo "|---:|---:|---:|---:|"
for n in 1 2 4 16; do
  ssh_job "job$n.yaml" 1 $(seq "$n") -- "$PWD/train.sh"
  : >a
  : >b
  for _ in $(seq "$RUNS"); do
    ms "$A" "job$n.yaml" >>a
    ms "$B" "job$n.yaml" >>b
  done
  ma=$(median <a) mb=$(median <b)
  echo "| $n | $ma | $mb | $(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%.2f", a / b }') |"
done
