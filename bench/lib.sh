# Helpers the bench scripts source (". bench/lib.sh" from the repository root).

# A TCP port free on 127.0.0.1 now: the kernel's pick for a bind to port 0, released at once.
# A random number in 30000-50000 lies in the ephemeral range, where an outgoing connection may
# already hold it (a benchmark died on "Address already in use" that way).
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
