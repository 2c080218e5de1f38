"""Fashion-MNIST with PyTorch DDP: an ordinary training script. Nothing in it knows about
ddprun; it reads what torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT through env://).

    ddprun examples/jobs/pytorch-fmnist.yaml            # 2 ranks here, from a job file
    ddprun --nproc_per_node 2 examples/pytorch/fmnist_ddp.py --epochs 1
    ddprun -H n1:4,n2:4 examples/pytorch/fmnist_ddp.py  # 8 ranks on two nodes over SSH

Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), or --data DIR with
the four idx files. Checkpoints: --checkpoint-dir, else $DDPRUN_CHECKPOINT_DIR (checkpoint.dir
of the job); rank 0 writes one atomically after each epoch, and every rank resumes from it,
so an elastic restart (a node lost) goes on from the last epoch with the new world size.
--device cuda trains on GPU LOCAL_RANK with NCCL.
"""
import argparse
import gzip
import os
import struct

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def idx(path):
    """The array in an idx file (gzip or not): images as float32 in [0, 1], labels as int64."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 0x803:  # images: n x rows x cols bytes
        rows, cols = struct.unpack(">II", data[8:16])
        a = np.frombuffer(data, np.uint8, n * rows * cols, 16).reshape(n, rows * cols)
        return torch.from_numpy(a.astype(np.float32) / 255.0)
    if magic == 0x801:  # labels: n bytes
        return torch.from_numpy(np.frombuffer(data, np.uint8, n, 8).astype(np.int64))
    raise SystemExit(f"{path}: not an idx file of images or labels")


def dataset(folder, split):
    def find(name):
        for p in (os.path.join(folder, name + ".gz"), os.path.join(folder, name)):
            if os.path.exists(p):
                return p
        raise SystemExit(f"{folder}: no {name}[.gz] (apt install dataset-fashion-mnist, or --data)")

    return TensorDataset(idx(find(f"{split}-images-idx3-ubyte")), idx(find(f"{split}-labels-idx1-ubyte")))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--checkpoint-dir", default=os.environ.get("DDPRUN_CHECKPOINT_DIR"))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = p.parse_args()

    cuda = a.device == "cuda"
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    train, test = dataset(a.data, "train"), dataset(a.data, "t10k")
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, a.hidden), torch.nn.ReLU(), torch.nn.Linear(a.hidden, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)

    ckpt = os.path.join(a.checkpoint_dir, "fmnist_ddp.pt") if a.checkpoint_dir else None
    first = 0
    if ckpt and os.path.exists(ckpt):
        state = torch.load(ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        first = state["epoch"]
        if rank == 0:
            print(f"resuming from {ckpt} after epoch {first}", flush=True)
    ddp = DDP(model, device_ids=[dev.index] if cuda else None)

    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(train, batch_size=a.batch, sampler=sampler)
    test_sampler = DistributedSampler(test, num_replicas=world, rank=rank, shuffle=False)
    test_loader = DataLoader(test, batch_size=1000, sampler=test_sampler)
    steps = 0
    for epoch in range(first, a.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        loss_sum = torch.zeros(2, dtype=torch.float64, device=dev)  # sum of losses, batches
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            steps += 1
            loss_sum += torch.tensor([loss.item(), 1.0], dtype=torch.float64, device=dev)
        # each rank scores its share of the test set; the counts are summed across ranks
        ddp.eval()
        right = torch.zeros(2, dtype=torch.float64, device=dev)  # correct, seen
        with torch.no_grad():
            for x, y in test_loader:
                x, y = x.to(dev), y.to(dev)
                right += torch.tensor(
                    [(ddp(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float64, device=dev
                )
        dist.all_reduce(loss_sum)
        dist.all_reduce(right)
        if rank == 0:
            print(
                f"epoch {epoch + 1}/{a.epochs}: {world} ranks, train-loss "
                f"{(loss_sum[0] / loss_sum[1]).item():.4f}, test-acc {(right[0] / right[1]).item():.4f}",
                flush=True,
            )
            if ckpt:  # written whole, then renamed: a crash never leaves half a checkpoint
                os.makedirs(a.checkpoint_dir, exist_ok=True)
                tmp = f"{ckpt}.tmp.{os.getpid()}"
                with open(tmp, "wb") as f:
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch + 1}, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, ckpt)
        dist.barrier()  # the checkpoint is complete before any rank goes on
    total = sum(q.detach().double().sum().item() for q in model.parameters())
    print(f"rank {rank} of {world}: params sum {total:.10f} after {steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
