"""Run as a rank under ddprun (MASTER_ADDR:MASTER_PORT is its agent's TCPStore port, which relays to
the launcher's store).
Mode "ops": torch's own client, every operation. "refused": a connection from an address that
is not a node's is closed at once. "round": what round 0 set, round 1 does not see. "bad":
malformed, truncated and oversized requests close only their connection. "v22": torch >= 2.2's
numbering (VALIDATE, PING, CANCEL_WAIT, MULTI_GET/SET, APPEND) by a raw client written from the
protocol's description; "v20": torch 2.0 and 2.1's (1.13's, extended). Prints "ok: ..." lines;
exits non-zero at the first failure."""
import datetime
import os
import socket
import struct
import sys
import time

import torch.distributed as d

H, P = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
mode = sys.argv[1]


def ok(what):
    print("ok:", what, flush=True)


def client(timeout_s=10):
    return d.TCPStore(H, P, None, False, datetime.timedelta(seconds=timeout_s))


def closed(sock, within=3.0):
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def s_(b):
    return struct.pack("<Q", len(b)) + b


if mode == "ops":
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    s = client()
    s.set("k", "vv")
    assert s.get("k") == b"vv"
    assert s.add("c", 5) == 5 and s.add("c", 2) == 7 and s.get("c") == b"7"
    assert s.compare_set("k", "vv", "ww") == b"ww"
    assert s.compare_set("nokey", "", "zz") == b"zz"
    assert s.compare_set("k", "bad", "xx") == b"ww"
    assert s.compare_set("absent", "x", "y") == b"x"
    s.wait(["k", "c"])
    # CHECK (op 4 in 1.13's numbering): torch 1.13's Python binding has no check(), so a raw
    # client sends it; the Python client's keys go on the wire under "/"
    raw = socket.create_connection((H, P))
    raw.sendall(b"\x04" + struct.pack("<Q", 2) + s_(b"/k") + s_(b"/c"))
    assert raw.recv(1) == b"\x00"  # READY
    raw.sendall(b"\x04" + struct.pack("<Q", 2) + s_(b"/k") + s_(b"/nokey_yet"))
    assert raw.recv(1) == b"\x01"  # NOT_READY
    raw.close()
    assert s.num_keys() == 3, s.num_keys()
    assert s.delete_key("c") is True and s.delete_key("c") is False
    s.set_timeout(datetime.timedelta(milliseconds=300))
    t0 = time.time()
    try:
        s.wait(["never"])
        sys.exit("a wait on a key nobody sets returned")
    except RuntimeError:
        assert time.time() - t0 < 5
    # the same client goes on after its WAIT timed out, even once the key it waited for is set
    # (after its next request: a 1.13 client tells nothing sooner); with time for its next WAIT,
    # which its agent's proxy may have to open a connection to the store for (slow under ASan on
    # a busy machine)
    s.set_timeout(datetime.timedelta(seconds=30))
    assert s.get("k") == b"ww"
    client().set("never", "now")
    assert s.add("c", 1) == 1 and s.get("never") == b"now"
    # clients that set and close at once (1.13's SET asks no answer): no SET is lost where the
    # client's close comes with it (as it does on a busy machine, and here for most of them)
    for i in range(20):
        raw = socket.create_connection((H, P))
        raw.sendall(b"\x00" + s_(b"/fire%d" % i) + s_(b"v%d" % i))  # SET
        raw.close()
    s.wait(["fire%d" % i for i in range(20)], datetime.timedelta(seconds=10))
    assert [s.get("fire%d" % i) for i in range(20)] == [b"v%d" % i for i in range(20)]
    # and a wait that is answered when another client sets the key
    s2 = client()
    import threading
    threading.Timer(0.3, lambda: s2.set("later", "1")).start()
    s3 = client()
    s3.wait(["later"], datetime.timedelta(seconds=5))
    ok("set, get, add, compare_set, wait, check, num_keys, delete_key, wait timeout, set and close")
elif mode == "refused":
    a = socket.socket()
    a.bind(("127.0.0.2", 0))
    a.connect((H, P))
    assert closed(a), "a connection from 127.0.0.2 was served"
    s = client()
    s.set("still", "1")
    ok("a connection from an address that is not a node is refused; a node's is served")
elif mode == "round":
    s = client()
    rc = os.environ["TORCHELASTIC_RESTART_COUNT"]
    if rc == "0":
        s.set("from_round_0", "1")
        s.set("shared", "0")
        print("round 0 set its keys", flush=True)
        sys.exit(3)
    s.set_timeout(datetime.timedelta(milliseconds=300))
    try:
        s.wait(["from_round_0"])
        sys.exit("round 1 sees round 0's key")
    except RuntimeError:
        pass
    # the same connection: 1.13's client sends no CANCEL_WAIT after its timeout, and the server
    # forgets the WAIT when the next request comes
    s.set_timeout(datetime.timedelta(seconds=30))
    n = s.num_keys()
    assert n == 0, n
    s.set("late", "1")
    assert s.get("late") == b"1" and client().num_keys() == 1
    ok("round 1 does not see round 0's keys")
elif mode == "bad":
    good = client()
    for name, data in [("an unknown op", b"\x7f"),
                       ("a key of 2**40 bytes", b"\x00" + struct.pack("<Q", 1 << 40)),
                       ("WATCH_KEY, not served", b"\x07" + s_(b"/k"))]:
        c = socket.create_connection((H, P))
        c.sendall(data)
        assert closed(c), name + " was not refused"
        ok(name + " closes its connection")
    # a MULTI_SET (2.0/2.1's numbering) of three 8 MiB values: each is allowed, the whole is not
    c = socket.create_connection((H, P))
    try:
        c.sendall(b"\x0b" + struct.pack("<q", 3))
        for i in range(3):
            c.sendall(s_(b"/big%d" % i) + struct.pack("<Q", 8 << 20))
            c.sendall(b"v" * (8 << 20))
        assert closed(c), "a 24 MiB request was served"
    except (ConnectionResetError, BrokenPipeError):
        pass
    ok("a request of 24 MiB closes its connection")
    c = socket.create_connection((H, P))
    c.sendall(b"\x00" + struct.pack("<Q", 10) + b"abc")  # a SET cut short
    c.close()
    good.set("alive", "1")
    assert good.get("alive") == b"1"
    ok("a truncated request closes only its connection; others are served")
elif mode in ("v22", "v20"):
    c = socket.create_connection((H, P))
    def req(b, n=None):
        c.sendall(b)
        if n is None:
            return None
        buf = b""
        while len(buf) < n:
            chunk = c.recv(n - len(buf))
            assert chunk, "closed"
            buf += chunk
        return buf
    def bytes_reply():
        n = struct.unpack("<Q", req(b"", 8))[0]
        return req(b"", n) if n else b""
    if mode == "v20":
        # torch 2.0 and 2.1: 1.13's numbering (no VALIDATE) with APPEND 9, MULTI_GET 10,
        # MULTI_SET 11 and CANCEL_WAIT 12 after it
        req(b"\x00" + s_(b"/a") + s_(b"1"))  # SET
        req(b"\x09" + s_(b"/a") + s_(b"23"))  # APPEND
        req(b"\x02" + s_(b"/a")); assert bytes_reply() == b"123"  # GET
        req(b"\x0b" + struct.pack("<q", 2) + s_(b"/x") + s_(b"X") + s_(b"/y") + s_(b"Y"))
        req(b"\x0a" + struct.pack("<Q", 2) + s_(b"/x") + s_(b"/y"))
        assert bytes_reply() == b"X" and bytes_reply() == b"Y"
        req(b"\x05" + struct.pack("<Q", 1) + s_(b"/no"))  # WAIT, parked
        assert req(b"\x0c", 1) == b"\x01"  # CANCEL_WAIT: WAIT_CANCELED
        assert struct.unpack("<q", req(b"\x06", 8))[0] == 3  # GETNUMKEYS
        assert struct.unpack("<q", req(b"\x08" + s_(b"/x"), 8))[0] == 1  # DELETE_KEY
        w = socket.create_connection((H, P))
        w.sendall(b"\x07" + s_(b"/a"))  # WATCH_KEY
        assert closed(w), "WATCH_KEY was served"
        ok("torch 2.0/2.1: SET, APPEND, GET, MULTI_SET, MULTI_GET, WAIT + CANCEL_WAIT, GETNUMKEYS, DELETE_KEY; WATCH_KEY refused")
        sys.exit(0)
    req(b"\x00" + struct.pack("<I", 0x3C85F7CE))  # VALIDATE
    assert req(b"\x0d" + struct.pack("<I", 4242), 4) == struct.pack("<I", 4242)  # PING
    req(b"\x01" + s_(b"/a") + s_(b"1"))  # SET
    req(b"\x03" + s_(b"/a")); assert bytes_reply() == b"1"  # GET
    req(b"\x09" + s_(b"/a") + s_(b"23"))  # APPEND
    req(b"\x03" + s_(b"/a")); assert bytes_reply() == b"123"
    req(b"\x0b" + struct.pack("<q", 2) + s_(b"/x") + s_(b"X") + s_(b"/y") + s_(b"Y"))  # MULTI_SET
    req(b"\x0a" + struct.pack("<Q", 2) + s_(b"/x") + s_(b"/y"))  # MULTI_GET
    assert bytes_reply() == b"X" and bytes_reply() == b"Y"
    assert req(b"\x05" + struct.pack("<Q", 1) + s_(b"/x"), 1) == b"\x00"  # CHECK: READY
    assert req(b"\x05" + struct.pack("<Q", 1) + s_(b"/no"), 1) == b"\x01"  # NOT_READY
    req(b"\x06" + struct.pack("<Q", 1) + s_(b"/no"))  # WAIT, parked
    assert req(b"\x0c", 1) == b"\x01"  # CANCEL_WAIT: WAIT_CANCELED
    assert struct.unpack("<q", req(b"\x07", 8))[0] == 3  # GETNUMKEYS
    assert struct.unpack("<q", req(b"\x08" + s_(b"/x"), 8))[0] == 1  # DELETE_KEY
    # a request that arrives a byte at a time is served when it is whole
    b = socket.create_connection((H, P))
    b.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for byte in (b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x01" + s_(b"/slow") + s_(b"42") +
                 b"\x03" + s_(b"/slow")):
        b.sendall(bytes([byte]))
        time.sleep(0.001)
    b.settimeout(5)
    got = b""
    while len(got) < 10:
        got += b.recv(10 - len(got))
    assert got == struct.pack("<Q", 2) + b"42", got
    ok("torch >= 2.2: VALIDATE, PING, SET, GET, APPEND, MULTI_SET, MULTI_GET, CHECK, WAIT + CANCEL_WAIT, GETNUMKEYS, DELETE_KEY")
