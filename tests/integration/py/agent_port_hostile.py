#!/usr/bin/python3
"""Hostile clients of a launcher's agent port (docs/internals/agent-protocol.md, Transport).

Usage: agent_port_hostile.py PORT. Each case must end with the launcher closing the
connection; the script prints one line per case and exits 1 at the first that does not:
  wrong-token  the handshake with a token the launcher does not hold
  garbage      an HTTP request
  version      our magic, another version of the wire
  silent       connects and closes at once
  oversize     the magic, then more bytes than a handshake has
  forged       a valid-looking record after a handshake whose client MAC is wrong
  stalled      half the first message, then nothing: closed within the 10 s deadline
  flood        1,000 connections at once, each saying nothing: all closed (at once beyond
               the 1,024 the port lets prove themselves, or at the deadline)
"""
import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_wire  # noqa: E402

PORT = int(sys.argv[1])
failed = []


def conn():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
    s.settimeout(15)
    return s


def closed_by_peer(s, limit=15.0):
    """True when the launcher closes s (EOF or reset) within limit seconds."""
    return agent_wire.drained(s, limit) is not None


def case(name, fn):
    agent_wire.case(name, fn, failed)


def wrong_token():
    s = conn()
    try:
        agent_wire.handshake(s, b"not the job's token")
    except ConnectionError:  # we cannot check its MAC: send ours anyway
        s.sendall(b"\0" * 32)
    return closed_by_peer(s)


def garbage():
    s = conn()
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    return closed_by_peer(s)


def version():
    s = conn()
    s.sendall(b"DDPA" + struct.pack("<I", 99) + os.urandom(16))
    return closed_by_peer(s)


def silent():
    s = conn()
    s.close()
    return True


def oversize():
    s = conn()
    try:
        s.sendall(b"DDPA" + struct.pack("<I", 1) + os.urandom(16) + os.urandom(4000))
    except (BrokenPipeError, ConnectionResetError):
        return True
    return closed_by_peer(s)


def forged():
    s = conn()
    cn = os.urandom(16)
    s.sendall(b"DDPA" + struct.pack("<I", 1) + cn)
    s.recv(52)
    s.sendall(os.urandom(32) + struct.pack("<I", 8) + os.urandom(24))
    return closed_by_peer(s)


def stalled():
    return agent_wire.stalled("127.0.0.1", PORT)


def flood():
    return agent_wire.flood("127.0.0.1", PORT)


# the stalled one waits out the deadline beside the others
t = threading.Thread(target=case, args=("stalled", stalled))
t.start()
for name, fn in [("wrong-token", wrong_token), ("garbage", garbage), ("version", version),
                 ("silent", silent), ("oversize", oversize), ("forged", forged),
                 ("flood", flood)]:
    case(name, fn)
t.join()
sys.exit(1 if failed else 0)
