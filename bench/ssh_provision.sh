#!/usr/bin/env bash
# Time from `ddprun job.yaml` to every rank past one store barrier and the job finished, with
# nodes reached over SSH: 1, 2, 4 and 16 test hosts (real OpenSSH sshd processes on
# 127.0.0.2..17, from tests/lib/sshd.bash), one rank each; a local single-node job for scale.
# Medians of RUNS runs. Needs root and openssh-server.
# Usage: bench/ssh_provision.sh [BUILD_DIR] [RUNS]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record ssh_provision "$@" # its output goes to bench/results/<machine>/ssh_provision.md too
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
RUNS=${2:-7}
BATS_TEST_TMPDIR=$(mktemp -d)
# shellcheck source=../tests/lib/sshd.bash
. tests/lib/sshd.bash
trap 'sshd_teardown; rm -rf "$BATS_TEST_TMPDIR"' EXIT
cd "$BATS_TEST_TMPDIR"
sshd_setup
for k in $(seq 16); do sshd_start "$k"; done

median_ms() { # job file
  local t=()
  for _ in $(seq "$RUNS"); do
    local s e
    s=$(date +%s%N)
    "$B/ddprun" "$1" >/dev/null 2>&1 || { echo "job failed: $1" >&2; "$B/ddprun" "$1" >&2; exit 1; }
    e=$(date +%s%N)
    t+=($(((e - s) / 1000000)))
  done
  printf '%s\n' "${t[@]}" | sort -n | sed -n "$(((RUNS + 1) / 2))p"
}

printf 'command: [%s, __smoke-worker]\nnproc_per_node: 1\nlogs: {dir: logs}\n' "$B/ddprun" >local.yaml
echo "# $(date -u +%F) $(nproc) cores; $(sshd -V 2>&1 | head -n1 || true); libssh $(dpkg-query -W -f='${Version}' libssh-4 2>/dev/null)"
echo "| nodes | median ms (launch to all ranks past a barrier and exited) |"
echo "|---:|---:|"
echo "| 1 (local, no SSH) | $(median_ms local.yaml) |"
for n in 1 2 4 16; do
  ssh_job "ssh$n.yaml" 1 $(seq "$n") -- "$B/ddprun" __smoke-worker
  echo "| $n over SSH | $(median_ms "ssh$n.yaml") |"
done
