#!/usr/bin/env python3
"""A client of the ddprun store written from man/ddprun-store.7 alone (not from the C code),
checking what the page promises. Usage: store_page_client.py HOST:PORT TOKEN_FILE.
Prints one line per check and exits 1 at the first that fails."""
import hashlib
import hmac
import os
import select
import socket
import struct
import sys
import time

MAGIC = 0x53504444
OPS = dict(HELLO=0x01, AUTH=0x02, PING=0x10, SET=0x11, GET=0x12, ADD=0x13, DELETE=0x15,
           CHECK=0x16, WAIT=0x18, MULTI_GET=0x19, WATCH=0x1A, LEASE_GRANT=0x1C)
EVENT = 0xF0


def s(b):
    """str = u32 length + bytes"""
    return struct.pack("<I", len(b)) + b


class Conn:
    def __init__(self, addr, token):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buf = b""
        self.next_id = 0
        self.events = []
        cn = os.urandom(16)
        st, p = self.call("HELLO", struct.pack("<IHH", MAGIC, 1, 0) + cn)
        assert st == 0, "HELLO status %d" % st
        magic, ver, _ = struct.unpack("<IHH", p[:8])
        assert magic == MAGIC and ver == 1
        sn = p[8:24]
        mac = hmac.new(token, b"ddprun-store-v1 client" + sn + cn, hashlib.sha256).digest()
        st, p = self.call("AUTH", mac)
        assert st == 0, "AUTH status %d" % st
        want = hmac.new(token, b"ddprun-store-v1 server" + cn + sn, hashlib.sha256).digest()
        assert p == want, "the server's MAC does not prove it knows the token"

    def send(self, op, body=b""):
        self.next_id += 1
        self.sock.sendall(struct.pack("<IBI", 5 + len(body), OPS[op], self.next_id) + body)
        return self.next_id

    def frame(self, timeout=10.0):
        """The next frame (op, id, body), or None if none comes within timeout."""
        end = time.time() + timeout
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack("<I", self.buf[:4])[0]
                if len(self.buf) >= 4 + n:
                    f, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    return f[0], struct.unpack("<I", f[1:5])[0], f[5:]
            left = end - time.time()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            d = self.sock.recv(1 << 20)
            if not d:
                raise EOFError("the server closed the connection")
            self.buf += d

    def reply(self, timeout=10.0):
        """The next reply (op, id, status, payload), setting aside events."""
        while True:
            f = self.frame(timeout)
            if f is None:
                return None
            op, rid, body = f
            if op == EVENT:
                self.events.append((rid, body))
                continue
            return op, rid, struct.unpack("<i", body[:4])[0], body[4:]

    def call(self, op, body=b""):
        rid = self.send(op, body)
        r = self.reply()
        assert r is not None, "no reply to %s" % op
        assert r[0] == OPS[op] | 0x80 and r[1] == rid, "reply %r to %s #%d" % (r[:2], op, rid)
        return r[2], r[3]


def keys(*ks):
    return struct.pack("<I", len(ks)) + b"".join(s(k) for k in ks)


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        sys.exit(1)


def main():
    addr, tokfile = sys.argv[1], sys.argv[2]
    raw = open(tokfile, "rb").read()
    # The page: the token is the file's bytes without one trailing newline.
    token = raw[:-1] if raw.endswith(b"\n") else raw
    a, b = Conn(addr, token), Conn(addr, token)
    check(True, "HELLO and AUTH with the file's bytes (one trailing newline dropped) as the key")

    # Replies come in order: a PING pipelined behind a parked WAIT is answered after it.
    w = a.send("WAIT", struct.pack("<I", 0xFFFFFFFF) + keys(b"io/k"))
    p = a.send("PING")
    check(a.reply(0.5) is None, "nothing answered while the WAIT is parked (not even the PING)")
    b.call("SET", s(b"io/k") + s(b"v") + struct.pack("<Q", 0))
    r1, r2 = a.reply(), a.reply()
    check(r1[:3] == (OPS["WAIT"] | 0x80, w, 0) and r2[:3] == (OPS["PING"] | 0x80, p, 0),
          "then the WAIT's reply, then the PING's: in order")

    # A WAIT is answered when every key exists at that moment.
    w = a.send("WAIT", struct.pack("<I", 0xFFFFFFFF) + keys(b"ab/a", b"ab/b"))
    b.call("SET", s(b"ab/a") + s(b"1") + struct.pack("<Q", 0))
    b.call("DELETE", s(b"ab/a"))
    b.call("SET", s(b"ab/b") + s(b"1") + struct.pack("<Q", 0))
    check(a.reply(0.5) is None, "WAIT a,b not answered after a set, a deleted, b set (a absent)")
    b.call("SET", s(b"ab/a") + s(b"2") + struct.pack("<Q", 0))
    r = a.reply()
    check(r[:3] == (OPS["WAIT"] | 0x80, w, 0), "answered once a is set again")

    # n = 0: an empty list.
    st, pl = a.call("CHECK", keys())
    check(st == 0 and pl == b"\x01", "CHECK with n = 0: status 0, u8 1")
    st, pl = a.call("WAIT", struct.pack("<I", 1000) + keys())
    check(st == 0, "WAIT with n = 0: status 0 at once")
    st, pl = a.call("MULTI_GET", keys())
    check(st == 0 and pl == b"", "MULTI_GET with n = 0: status 0, no values")

    # Over a limit in a well-formed frame: ETOOBIG, and the connection goes on.
    st, _ = a.call("SET", s(b"k" * 4097) + s(b"v") + struct.pack("<Q", 0))
    check(st == -10, "a 4097-byte key: status -10 (ETOOBIG)")
    st, _ = a.call("CHECK", struct.pack("<I", 65537) + s(b"x") * 65537)
    check(st == -10, "65537 keys: status -10 (ETOOBIG)")
    st, _ = a.call("PING")
    check(st == 0, "the connection stays usable")

    # ADD's integer syntax: an optional '-' and decimal digits, nothing else.
    for val, want in [(b"007", 8), (b"-3", -2), (b"+5", None), (b" 5", None), (b"\n5", None),
                      (b"5 ", None), (b"", None), (b"-", None), (b"0x10", None)]:
        a.call("SET", s(b"n") + s(val) + struct.pack("<Q", 0))
        st, pl = a.call("ADD", s(b"n") + struct.pack("<q", 1))
        got = struct.unpack("<q", pl)[0] if st == 0 else None
        check((st == 0 and got == want) if want is not None else st == -12,
              "ADD 1 to %r: %s" % (val, want if want is not None else "status -12 (ENOTINT)"))
    a.call("SET", s(b"n") + s(b"9223372036854775807") + struct.pack("<Q", 0))
    st, _ = a.call("ADD", s(b"n") + struct.pack("<q", 1))
    check(st == -1, "ADD past int64: status -1 (EINVAL)")

    # DELETE and EXPIRE events carry an empty value.
    st, pl = a.call("WATCH", struct.pack("<B", 1) + s(b"ev/"))
    wid = struct.unpack("<I", pl)[0]
    st, pl = b.call("LEASE_GRANT", struct.pack("<I", 300))
    lease = struct.unpack("<Q", pl)[0]
    b.call("SET", s(b"ev/d") + s(b"x") + struct.pack("<Q", 0))
    b.call("DELETE", s(b"ev/d"))
    b.call("SET", s(b"ev/e") + s(b"y") + struct.pack("<Q", lease))
    end = time.time() + 5
    while len(a.events) < 4 and time.time() < end:
        f = a.frame(0.2)
        if f and f[0] == EVENT:
            a.events.append((f[1], f[2]))
    kinds = []
    for rid, body in a.events:
        kind = body[0]
        kl = struct.unpack("<I", body[1:5])[0]
        key = body[5:5 + kl]
        vl = struct.unpack("<I", body[5 + kl:9 + kl])[0]
        kinds.append((rid == wid, kind, key, body[9 + kl:9 + kl + vl]))
    check(kinds == [(True, 1, b"ev/d", b"x"), (True, 2, b"ev/d", b""), (True, 1, b"ev/e", b"y"),
                    (True, 3, b"ev/e", b"")],
          "events: SET with the value, DELETE and EXPIRE with an empty value, in order")


if __name__ == "__main__":
    main()
