#!/usr/bin/python3
"""Clients of an agent's checkpoint replication port (cli/agent/ckpt_serve.h; the wire in
cli/proto/ckpt_proto.h: the agent link's handshake, then sealed records, one GET per connection).

Usage: ckpt_port_hostile.py HOST:PORT TOKEN_FILE FILE SHA256. First a peer that proves the job's
token fetches FILE (a path under the folder) and checks its SHA-256; then each hostile case must
end with the agent closing the connection, having sent none of the folder's bytes. One line per
case; exit 1 at the first that does not hold:
  wrong-token  the handshake with a token the job does not hold
  garbage      an HTTP request
  traversal    a proven peer asking for ../ and an absolute path
  forged       a proven peer whose record fails its tag
  stalled      half the handshake, then nothing: closed within the 5 s deadline
  half-frame   a proven peer that sends half its request's record, then nothing
  flood        1,000 connections at once, saying nothing: all closed (beyond the 8 served at
               once at once, the others at the deadline)
"""
import hashlib
import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_wire  # noqa: E402

HOST, PORT = sys.argv[1].rsplit(":", 1)
PORT = int(PORT)
TOKEN = open(sys.argv[2], "rb").read().strip()
FILE, SHA = sys.argv[3], sys.argv[4]
failed = []


def conn():
    s = socket.create_connection((HOST, PORT), timeout=5)
    s.settimeout(15)
    return s


def proven():
    s = conn()
    cn, sn = agent_wire.handshake(s, TOKEN)
    return s, agent_wire.Link(s, TOKEN, cn, sn)


def get(link, rel):
    r = rel.encode()
    link.send(struct.pack("<IB", 1 + 4 + len(r), 1) + struct.pack("<I", len(r)) + r)


def closed_by_peer(s, limit=15.0, link=None):
    """True when the agent closes s within limit seconds, having sent nothing, or (with link, a
    proven peer's) records that open to a refusal, never a file."""
    got = agent_wire.drained(s, limit)
    if got is None:
        return False
    if link and got:
        link.raw = got
        while link._fill():
            pass
        return not link.plain or link.plain[0] != 0
    return not got or link is not None


def case(name, fn):
    agent_wire.case(name, fn, failed, ("ok", "FAILED"))


def fetch():
    s, link = proven()
    get(link, FILE)
    while len(link.plain) < 9:
        assert link._fill()
    status, size = struct.unpack_from("<BQ", link.plain)
    link.plain = link.plain[9:]
    while len(link.plain) < size and link._fill():
        pass
    s.close()
    return status == 0 and hashlib.sha256(link.plain[:size]).hexdigest() == SHA


def wrong_token():
    s = conn()
    try:
        agent_wire.handshake(s, b"not the job's token")
    except ConnectionError:
        s.sendall(b"\0" * 32)
    return closed_by_peer(s)


def garbage():
    s = conn()
    s.sendall(b"GET /" + FILE.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    return closed_by_peer(s)


def traversal():
    ok = True
    for rel in ["../" * 8 + "etc/passwd", "/etc/passwd", "a/../../x", "."]:
        s, link = proven()
        get(link, rel)
        ok = closed_by_peer(s, link=link) and ok
    return ok


def forged():
    s, link = proven()
    s.sendall(struct.pack("<I", 12) + os.urandom(28))
    return closed_by_peer(s, link=link)


def stalled():
    return agent_wire.stalled(HOST, PORT)


def half_frame():
    s, link = proven()
    s.sendall(struct.pack("<I", 100) + os.urandom(20))
    return closed_by_peer(s, 20, link=link)


def flood():
    return agent_wire.flood(HOST, PORT)


case("fetch", fetch)
slow = [threading.Thread(target=case, args=(n, f)) for n, f in [("stalled", stalled),
                                                                 ("half-frame", half_frame)]]
for t in slow:
    t.start()
for name, fn in [("wrong-token", wrong_token), ("garbage", garbage), ("traversal", traversal),
                 ("forged", forged)]:
    case(name, fn)
for t in slow:
    t.join()
case("flood", flood)
case("fetch again", fetch)
sys.exit(1 if failed else 0)
