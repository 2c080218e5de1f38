"""The agent link's wire (cli/proto/agent_wire.h, docs/internals/agent-protocol.md), written
again from its documentation: the bats suite's fake agents and hostile clients speak it, and
a launcher that does not follow the document fails them.

  agent -> launcher   "DDPA" | u32 version 1 | cnonce[16]
  launcher -> agent   "DDPA" | snonce[16] | HMAC-SHA256(token, "ddprun-agent-v1 server" cn sn)
  agent -> launcher   HMAC-SHA256(token, "ddprun-agent-v1 client" sn cn)
  then records        u32 n | AES-256-GCM(n bytes) | tag[16]; aad: the 4 length bytes;
                      nonce: 4 zero bytes | u64 count of records this direction sent before;
                      key agent->launcher HMAC(token, "ddprun-agent-v1 key a2l" cn sn),
                      launcher->agent HMAC(token, "ddprun-agent-v1 key l2a" cn sn)
"""
import hashlib
import hmac
import os
import resource
import socket
import struct
import time

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

BOOT, ATTACH = 0x09, 0x8A


def mac(token, label, a, b):
    return hmac.new(token, label.encode() + a + b, hashlib.sha256).digest()


def read_boot(f):
    """BOOT from the launcher on f (the agent's stdin): (token, [addrs], node, ticket)."""
    head = f.read(5)
    n, kind = struct.unpack("<IB", head)
    body = f.read(n - 1)
    assert kind == BOOT, kind
    out, off = [], 0
    for k in range(4):
        if k == 2:
            out.append(struct.unpack_from("<I", body, off)[0])
            off += 4
            continue
        (m,) = struct.unpack_from("<I", body, off)
        out.append(body[off + 4 : off + 4 + m])
        off += 4 + m
    return out[0], out[1].decode().split(","), out[2], out[3].decode()


class Link:
    """One end of a link (the agent's, or with agent=False the launcher's): frames in and out,
    sealed."""

    def __init__(self, sock, token, cn, sn, agent=True):
        self.sock = sock
        a2l = AESGCM(mac(token, "ddprun-agent-v1 key a2l", cn, sn))
        l2a = AESGCM(mac(token, "ddprun-agent-v1 key l2a", cn, sn))
        self.tx, self.rx = (a2l, l2a) if agent else (l2a, a2l)
        self.ntx = self.nrx = 0
        self.raw = b""
        self.plain = b""

    def send(self, data):
        head = struct.pack("<I", len(data))
        nonce = b"\0" * 4 + struct.pack("<Q", self.ntx)
        self.ntx += 1
        self.sock.sendall(head + self.tx.encrypt(nonce, data, head))

    def frame(self, kind, body=b""):
        self.send(struct.pack("<IB", len(body) + 1, kind) + body)

    def _fill(self):
        while True:
            if len(self.raw) >= 4:
                (n,) = struct.unpack_from("<I", self.raw)
                if len(self.raw) >= 4 + n + 16:
                    nonce = b"\0" * 4 + struct.pack("<Q", self.nrx)
                    self.nrx += 1
                    head, rec = self.raw[:4], self.raw[4 : 4 + n + 16]
                    self.raw = self.raw[4 + n + 16 :]
                    self.plain += self.rx.decrypt(nonce, rec, head)
                    return True
            got = self.sock.recv(65536)
            if not got:
                return False
            self.raw += got

    def frames(self):
        """Yields (type, body) of each frame the launcher sends, until the link ends."""
        while True:
            while len(self.plain) < 4 or len(self.plain) < 4 + struct.unpack_from("<I", self.plain)[0]:
                if not self._fill():
                    return
            (n,) = struct.unpack_from("<I", self.plain)
            kind, body = self.plain[4], self.plain[5 : 4 + n]
            self.plain = self.plain[4 + n :]
            yield kind, body


def handshake(sock, token):
    """Runs the agent's side; returns (cn, sn). Raises when the launcher does not prove token."""
    cn = os.urandom(16)
    sock.sendall(b"DDPA" + struct.pack("<I", 1) + cn)
    s1 = b""
    while len(s1) < 52:
        got = sock.recv(52 - len(s1))
        if not got:
            raise ConnectionError("the launcher closed the connection")
        s1 += got
    assert s1[:4] == b"DDPA"
    sn = s1[4:20]
    if not hmac.compare_digest(s1[20:52], mac(token, "ddprun-agent-v1 server", cn, sn)):
        raise ConnectionError("the launcher did not prove the token")
    sock.sendall(mac(token, "ddprun-agent-v1 client", sn, cn))
    return cn, sn


def dial(addrs, token, node, ticket):
    """Dials back as a provisioned agent (ATTACH kind 1) and returns its Link."""
    host, port = addrs[0].rsplit(":", 1)
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=30)
    sock.settimeout(None)
    cn, sn = handshake(sock, token)
    link = Link(sock, token, cn, sn)
    t = ticket.encode()
    link.frame(ATTACH, struct.pack("<BI", 1, node) + struct.pack("<I", len(t)) + t)
    return link


def boot_frame(token, addrs, node, ticket):
    """BOOT as a launcher writes it on an agent's stdin."""
    def st(b):
        return struct.pack("<I", len(b)) + b
    body = st(token) + st(addrs.encode()) + struct.pack("<I", node) + st(ticket.encode())
    return struct.pack("<IB", len(body) + 1, BOOT) + body


def _recv_exact(sock, n):
    b = b""
    while len(b) < n:
        got = sock.recv(n - len(b))
        if not got:
            raise ConnectionError("closed")
        b += got
    return b


def accept(listener, token):
    """The launcher's side: accepts one agent, checks its proof, reads its ATTACH; its Link."""
    sock, _ = listener.accept()
    c1 = _recv_exact(sock, 24)
    assert c1[:4] == b"DDPA" and struct.unpack_from("<I", c1, 4)[0] == 1
    cn, sn = c1[8:24], os.urandom(16)
    sock.sendall(b"DDPA" + sn + mac(token, "ddprun-agent-v1 server", cn, sn))
    if not hmac.compare_digest(_recv_exact(sock, 32), mac(token, "ddprun-agent-v1 client", sn, cn)):
        raise ConnectionError("the agent did not prove the token")
    link = Link(sock, token, cn, sn, agent=False)
    kind, _ = next(link.frames())
    assert kind == ATTACH, kind
    return link


def drained(sock, limit=15.0):
    """What the peer sent on sock until it closed it (EOF or reset) within limit seconds, or None
    when it did not close it in time: the hostile clients' check that they were refused."""
    t0 = time.monotonic()
    got = b""
    try:
        while time.monotonic() - t0 < limit:
            sock.settimeout(max(0.01, limit - (time.monotonic() - t0)))
            b = sock.recv(65536)
            if not b:
                return got
            got += b
    except ConnectionResetError:
        return got
    except socket.timeout:
        pass
    return None


def case(name, fn, failed, words=("closed", "NOT CLOSED")):
    """Runs one hostile case: prints its name and outcome, adds it to failed when it did not hold."""
    try:
        ok = fn()
    except Exception as e:  # noqa: BLE001
        ok, name = False, f"{name} ({e!r})"
    print(f"{name}: {words[0] if ok else words[1]}", flush=True)
    if not ok:
        failed.append(name)


def stalled(host, port):
    """Half a handshake, then nothing: True when the peer closes within 20 s (the time said)."""
    sock = socket.create_connection((host, port), timeout=5)
    sock.sendall(b"DDPA" + struct.pack("<I", 1) + b"12345")
    t0 = time.monotonic()
    ok = drained(sock, 20) is not None
    print(f"stalled: closed after {time.monotonic() - t0:.1f} s", flush=True)
    return ok


def flood(host, port, n=1000):
    """n connections at once, each saying nothing: True when the peer closes them all."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    socks = [socket.create_connection((host, port), timeout=5) for _ in range(n)]
    ok = all(drained(x, 20) is not None for x in socks)
    for x in socks:
        x.close()
    return ok

