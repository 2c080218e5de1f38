#!/usr/bin/python3
"""A node agent that answers the launcher (cli/proto/agent_proto.h) with malformed frames.

Run by the launcher over SSH in place of `ddprun agent` (ssh.remote_ddprun). MODE:
  ranks   JOINED, then on START: rank frames whose local rank is out of range (2^32 - 1,
          which is -1 as an int, and the node's slot count), truncated, or of an unknown
          type, and ERROR frames out of range, truncated or with an empty message, each
          to be ignored; then the one rank's real STARTED, OUTPUT and EXITED and DONE, so
          the job succeeds; DONE again for each STOP; exits at EOF.
  length  JOINED, then a frame whose length is over the protocol's 1 MiB limit: the
          launcher must end this node, saying why; the script then waits to be killed.
  old     as ranks, but without the HELLO every agent sends first since protocol 2: an
          agent of an older ddprun; the launcher must refuse it, saying so.
  other   as ranks, after a HELLO of protocol 99 from ddprun 9.9.9: the launcher must refuse
          it, naming both versions.
Every mode but old says HELLO first (protocol 7, version "fake"). Each first reads BOOT on
stdin and dials back, as every agent does (agent_wire.py).
"""
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_wire  # noqa: E402

MODE = os.environ.get("FAKE_AGENT_MODE", "ranks")
_token, _addrs, _node, _ticket = agent_wire.read_boot(sys.stdin.buffer)
LINK = agent_wire.dial(_addrs, _token, _node, _ticket)


def frame(kind, body=b""):
    LINK.frame(kind, body)


def s(text):
    b = text.encode()
    return struct.pack("<I", len(b)) + b


def frames():
    """Yields each frame type the launcher sends, until EOF."""
    for kind, _ in LINK.frames():
        yield kind


JOIN, START, STOP = 3, 1, 2
STARTED, OUTPUT, EXITED, DONE, JOINED, HELLO, ERROR = 0x81, 0x82, 0x83, 0x84, 0x85, 0x88, 0x89
BAD = 0xFFFFFFFF  # a u32 local rank that is -1 as a C int

if MODE == "other":
    frame(HELLO, struct.pack("<I", 99) + s("9.9.9"))
elif MODE != "old":
    frame(HELLO, struct.pack("<I", 7) + s("fake"))

for kind in frames():
    if kind == JOIN:
        frame(JOINED, struct.pack("<Q", 1))
        if MODE == "length":
            LINK.send(struct.pack("<IB", (1 << 20) + 2, OUTPUT))
            while True:
                time.sleep(1)
    elif kind == START:
        pid = os.getpid()
        frame(STARTED, struct.pack("<II", BAD, pid))
        frame(STARTED, struct.pack("<II", 1, pid))  # the node has 1 slot: local rank 1 is none
        frame(OUTPUT, struct.pack("<IB", BAD, 1) + s("EVIL minus one"))
        frame(OUTPUT, struct.pack("<IB", 1, 1) + s("EVIL past the slots"))
        frame(OUTPUT, struct.pack("<IBI", 0, 1, 100) + b"EVIL truncated")
        frame(0x99, b"EVIL unknown type")
        frame(ERROR, struct.pack("<I", BAD) + s("EVIL error of rank -1") + s(""))
        frame(ERROR, struct.pack("<I", 0) + struct.pack("<I", 1 << 30) + b"EVIL")  # truncated
        frame(ERROR, struct.pack("<I", 0) + s("") + s("EVIL empty message"))
        frame(EXITED, struct.pack("<IiQB", BAD, 0, 1, 0))
        frame(EXITED, struct.pack("<IiQB", 1, 0, 1, 0))
        frame(STARTED, struct.pack("<II", 0, pid))
        frame(OUTPUT, struct.pack("<IB", 0, 1) + s("hello from the fake agent"))
        time.sleep(0.5)  # the job must still be running: no bad EXITED counted
        frame(OUTPUT, struct.pack("<IB", 0, 1) + s("still running"))
        frame(EXITED, struct.pack("<IiQB", 0, 0, 500, 0))
        frame(DONE)
    elif kind == STOP:
        frame(DONE)
