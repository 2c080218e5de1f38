#!/usr/bin/python3
"""PyTorch DDP (gloo) step time on the MLP shapes of ddprun-fmnist, for bench/reducer_bench.sh.

Two processes on this machine, one thread each, synthetic data of the same shapes (the step
time does not depend on the pixel values). --mode compute trains each rank's shard without
DDP (the same two processes at once, so contention is the same); --mode ddp wraps the model
in DistributedDataParallel over gloo.
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, a, q):
    torch.set_num_threads(1)
    torch.manual_seed(1)
    dims = [784] + [int(h) for h in a.hidden.split(",")] + [10]
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    if a.mode == "ddp":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    b = a.batch // world
    x = torch.randn(b, 784)
    y = torch.randint(0, 10, (b,))
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if a.mode == "ddp":
        dist.barrier()
        dist.destroy_process_group()
    q.put((rank, statistics.median(times[5:])))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", default="2048,2048,2048")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--mode", choices=["compute", "ddp"], default="ddp")
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--world", type=int, default=2)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    ps = [ctx.Process(target=worker, args=(r, a.world, port, a, q)) for r in range(a.world)]
    for pr in ps:
        pr.start()
    res = dict(q.get() for _ in ps)
    for pr in ps:
        pr.join()
    print(f"torch {a.mode}: median step {res[0] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
