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
