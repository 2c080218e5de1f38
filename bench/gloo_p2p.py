"""Gloo's ping-pong (torch.distributed send/recv) with bench/p2p_bench.c's sizes, counts and
RESULT lines.

usage: /usr/bin/python3 gloo_p2p.py PORT   (spawns 2 processes on 127.0.0.1)
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, port):
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    peer = 1 - rank
    b = 8
    while b <= 64 << 20:
        it = 10 if b >= 16 << 20 else 30 if b >= 1 << 20 else 200
        a = torch.empty(b, dtype=torch.uint8)
        r = torch.empty(b, dtype=torch.uint8)
        times, wrong = [], 0
        for i in range(-3, it):
            if rank == 0:
                a.fill_((i + 7) % 256)
                t0 = time.perf_counter()
                dist.send(a, peer, tag=1)
                dist.recv(r, peer, tag=2)
                if i >= 0:
                    times.append((time.perf_counter() - t0) * 1e6 / 2)
                wrong += int(r[0]) != (i + 7) % 256 or int(r[-1]) != (i + 7) % 256
            else:
                dist.recv(r, peer, tag=1)
                dist.send(r, peer, tag=2)
        if rank == 0:
            times.sort()
            us = times[len(times) // 2]
            print(f"RESULT gloo {b} {us:.2f} {b / us / 1e3:.3f} {wrong}", flush=True)
        b *= 8
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]),), nprocs=2)
