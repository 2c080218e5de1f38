"""Hostile clients of a job's metrics port (cli/sys/http_serve.h), for 94-metrics.bats.

usage: metrics_hostile.py HOST PORT. The port allows 127.0.0.2 only (metrics.allow): this
script's connections from 127.0.0.1 must be refused at accept, those from 127.0.0.2 answered.
Prints one line per case; exits 1 at the first that fails."""
import resource
import socket
import sys
import time

host, port = sys.argv[1], int(sys.argv[2])


def conn(src="127.0.0.2"):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(10)
    s.connect((host, port))
    return s


def answer(s):
    """Everything until the server closes, and how long that took."""
    t, data = time.time(), b""
    while True:
        try:
            b = s.recv(65536)
        except ConnectionResetError:
            break
        if not b:
            break
        data += b
    s.close()
    return data, time.time() - t


def ask(raw, src="127.0.0.2"):
    s = conn(src)
    s.sendall(raw)
    return answer(s)[0]


def status(data):
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None


def case(name, ok):
    print(("ok  " if ok else "FAIL") + " " + name, flush=True)
    if not ok:
        sys.exit(1)


good = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
case("GET /metrics from an allowed address: 200 with the job's series",
     status(good) == 200 and b"\nddprun_job_phase{" in good and b"Content-Type: text/plain; version=0.0.4" in good)
case("HEAD /metrics: the head alone", status(ask(b"HEAD /metrics HTTP/1.1\r\n\r\n")) == 200
     and ask(b"HEAD /metrics HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\n"))
case("from 127.0.0.1 (not in metrics.allow): closed at once, no answer",
     ask(b"GET /metrics HTTP/1.1\r\n\r\n", src="127.0.0.1") == b"")
case("garbage: 400", status(ask(b"\x16\x03\x01\x02\x00garbage\r\n\r\n")) == 400)
case("a NUL byte in the head: 400", status(ask(b"GET /metr\x00ics HTTP/1.1\r\n\r\n")) == 400)
case("POST: 405", status(ask(b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")) == 405)
case("another path: 404", status(ask(b"GET /../../etc/passwd HTTP/1.1\r\n\r\n")) == 404)
case("a head over 8 KiB: 431", status(ask(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n")) == 431)
s = conn()
s.sendall(b"GET /metrics HTTP/1.1\r\nHost:")  # and nothing more
data, took = answer(s)
case("a half request, stalled: dropped after 5 s (took %.1f s)" % took, data == b"" and 4 <= took <= 8)
# 1,000 connections at once, each sending nothing: 64 are kept (for 5 s), the rest closed
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
many = []
for _ in range(1000):
    try:
        many.append(conn())
    except OSError:
        break
time.sleep(1)
closed = 0
for c in many:
    c.setblocking(False)
    try:
        closed += c.recv(1) == b""
    except BlockingIOError:
        pass
    except ConnectionResetError:
        closed += 1
case("1,000 connections: %d opened, %d closed by the server, the rest held" % (len(many), closed),
     len(many) >= 900 and closed >= len(many) - 64)
for c in many:
    c.close()
t = time.time()
while time.time() - t < 8:
    if status(ask(b"GET /metrics HTTP/1.1\r\n\r\n")) == 200:
        break
    time.sleep(0.2)
case("then /metrics answers again (%.1f s)" % (time.time() - t),
     status(ask(b"GET /metrics HTTP/1.1\r\n\r\n")) == 200)
