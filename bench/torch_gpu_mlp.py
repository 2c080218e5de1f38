"""PyTorch's side of bench/gpu_reducer.sh: the same MLP as ddprun-fmnist-cuda (784-H...-10, ReLU,
softmax cross-entropy, SGD lr 0.02 momentum 0.9, fp32) on the GPU, trained on device-resident
Fashion-MNIST-sized random batches, compute only or wrapped in PyTorch DDP (NCCL, env://).
Each step ends with a device synchronisation, as the C trainer's --bench steps do. Prints
"bench: median step X ms" like the C trainer. Run it as a rank under ddprun.
Usage: torch_gpu_mlp.py HIDDEN(comma list) BATCH STEPS ddp|compute [BUCKET_MB]"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

hidden = [int(h) for h in sys.argv[1].split(",")]
batch, steps, mode = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
bucket_mb = float(sys.argv[5]) if len(sys.argv) > 5 else 25.0
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
dev = torch.device("cuda")
torch.manual_seed(0)
dims = [784] + hidden + [10]
layers = []
for i in range(len(dims) - 1):
    layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
    if i < len(dims) - 2:
        layers.append(torch.nn.ReLU())
model = torch.nn.Sequential(*layers).to(dev)
if mode == "ddp":
    dist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(
        model, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
world = dist.get_world_size() if mode == "ddp" else 1
b = (batch + world - 1) // world
x = torch.rand(60000, 784, device=dev)
y = torch.randint(0, 10, (60000,), device=dev)
perm = torch.randperm(60000, device=dev)
times = []
for s in range(steps):
    t0 = time.perf_counter()
    idx = perm[(s * b) % (60000 - b):][:b]
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
print(f"bench: median step {statistics.median(times[steps // 10:]) * 1e3:.3f} ms "
      f"({mode}, torch {torch.__version__})", flush=True)
if mode == "ddp":
    dist.destroy_process_group()
