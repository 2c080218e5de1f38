"""Gloo all-reduce with the same sizes, iterations and RESULT lines as bench/allreduce_bench.c.

usage: /usr/bin/python3 gloo_allreduce.py NRANKS PORT   (spawns NRANKS processes on 127.0.0.1)
       /usr/bin/python3 gloo_allreduce.py NRANKS PORT RANK ADDR IFNAME
           (one rank of a group across hosts: rank 0 listens on ADDR:PORT; Gloo uses IFNAME)
AR_DTYPE=bf16|f16 all-reduces 16-bit floats instead of float32, the same bytes, as
allreduce_bench does.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def iters_for(b):
    return 10 if b >= 16 << 20 else 20 if b >= 1 << 20 else 50


def run(rank, n, port, addr="127.0.0.1", ifname="lo"):
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=n)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[os.environ.get("AR_DTYPE", "f32")]
    esz = torch.tensor([], dtype=dt).element_size()
    b = int(os.environ.get("AR_FROM", 4096))
    while b <= 64 << 20:
        t = torch.ones(b // esz, dtype=dt)
        for _ in range(3):
            dist.all_reduce(t)
        times = []
        for _ in range(iters_for(b)):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append((time.perf_counter() - t0) * 1e6)
        t.fill_(1.0)
        dist.all_reduce(t)
        wrong = torch.tensor([0 if bool((t == n).all()) else 1], dtype=torch.int32)
        dist.all_reduce(wrong)
        times.sort()
        med = torch.tensor([times[len(times) // 2]], dtype=torch.float64)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        us = med.item()
        algbw = b / us / 1e3
        if rank == 0:
            print(f"RESULT gloo {n} {b} {us:.1f} {algbw:.3f} {algbw * 2 * (n - 1) / n:.3f} {wrong.item()}",
                  flush=True)
        b *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    n, port = int(sys.argv[1]), int(sys.argv[2])
    if len(sys.argv) > 3:
        run(int(sys.argv[3]), n, port, sys.argv[4], sys.argv[5])
    else:
        mp.spawn(run, args=(n, port), nprocs=n, join=True)
