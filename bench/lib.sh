# Helpers the bench scripts source (". bench/lib.sh" from the repository root).

# A TCP port free on 127.0.0.1 now: the kernel's pick for a bind to port 0, released at once.
# A random number in 30000-50000 lies in the ephemeral range, where an outgoing connection may
# already hold it (a benchmark died on "Address already in use" that way).
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# What most bench scripts set first: B, the build folder (their first argument, default
# build/release) as an absolute path, and T, a scratch folder removed when the script exits.
bench_dirs() {
  # shellcheck disable=SC2034 # B is the caller's
  B=$(cd "${1:-build/release}" && pwd)
  T=$(mktemp -d)
  trap 'rm -rf "$T"' EXIT
}

# Two test hosts for the TCP benchmarks, run from the repository root: network namespaces 1 and
# 2 on veth through a bridge (tests/lib/sshd.bash), their links limited to RATE (default none:
# the veths' own speed). Moves into a scratch folder; at exit the hosts and the folder go, and
# so does the process in $store where the caller set one. Sets ns1, ns2 and a1 (host 1's address).
two_netns_hosts() {
  BATS_TEST_TMPDIR=$(mktemp -d)
  # shellcheck source=../tests/lib/sshd.bash
  . tests/lib/sshd.bash
  trap '[ -n "${store:-}" ] && kill "$store" 2>/dev/null; sshd_teardown; rm -rf "$BATS_TEST_TMPDIR"' EXIT
  cd "$BATS_TEST_TMPDIR" || exit 1
  netns_setup
  [ -n "$SSHD_NETNS" ] || { echo "needs network namespaces (root, iproute2)" >&2; exit 1; }
  for k in 1 2; do sshd_make_ns "$k"; done
  # shellcheck disable=SC2034 # the caller's
  ns1=$(sshd_ns 1) ns2=$(sshd_ns 2) a1=$(sshd_addr 1)
  for k in 1 2; do sshd_limit "$k" "${RATE:-none}"; done
}
