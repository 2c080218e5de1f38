"""TCPStore driven the way PyTorch users drive it: N client processes using torch's own
TCPStore client (Debian python3-torch, run with /usr/bin/python3). Prints the same RESULT line
as bench/store_bench.c: RESULT ops tcpstore-py <op> <clients> <ops/s> <p50 us> <p99 us>.

usage: tcpstore_pyclients.py PORT OP CLIENTS SECONDS
"""
import multiprocessing as mp
import sys
import time
from datetime import timedelta

import torch.distributed as dist


def client(port, op, i, go, secs, out):
    s = dist.TCPStore("127.0.0.1", port, 1, False, timedelta(seconds=300))
    key = f"py/{i}"
    s.set(key, "0123456789abcdef")
    go.wait()
    lat = []
    n = 0
    end = time.perf_counter() + secs
    while True:
        t0 = time.perf_counter()
        if t0 >= end:
            break
        if op == "get":
            s.get(key)
        elif op == "add":
            s.add("py/ctr", 1)
        else:
            s.set(key, "0123456789abcdef")
        lat.append(time.perf_counter() - t0)
        n += 1
    lat.sort()
    out.put((n, lat[len(lat) // 2] if lat else 0, lat[int(len(lat) * 0.99)] if lat else 0))


def main():
    port, op, clients, secs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=client, args=(port, op, i, go, secs, out)) for i in range(clients)]
    for p in procs:
        p.start()
    time.sleep(1.0 + clients * 0.02)  # let every client connect and set its key
    t0 = time.perf_counter()
    go.set()
    res = [out.get() for _ in procs]
    el = time.perf_counter() - t0
    for p in procs:
        p.join()
    total = sum(r[0] for r in res)
    p50 = sorted(r[1] for r in res)[len(res) // 2] * 1e6
    p99 = max(r[2] for r in res) * 1e6
    print(f"RESULT ops tcpstore-py {op} {clients} {total / el:.0f} {p50:.0f} {p99:.0f}")


if __name__ == "__main__":
    main()
