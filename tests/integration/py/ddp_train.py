"""An ordinary PyTorch DDP training script, as users write it: env:// initialisation,
DistributedSampler, the DDP wrapper, rank 0 saving a checkpoint with torch.save and every rank
resuming from it at start. Nothing in it knows about ddprun. It prints, on rank 0, a checksum of
the parameters, and on every rank the parameters' sum so that replicas can be compared.
DEVICE=cuda trains on GPU LOCAL_RANK with the NCCL backend, as GPU scripts do."""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

steps = int(os.environ.get("STEPS", "40"))
ckpt = os.environ.get("CKPT")  # a checkpoint file, resumed from when present
sleep = float(os.environ.get("STEP_SLEEP", "0"))
save_until = int(os.environ.get("SAVE_UNTIL", "0"))  # no checkpoint after this step (0: none)
pad = int(os.environ.get("CKPT_PAD", "0"))  # bytes of random data the checkpoint carries besides

cuda = os.environ.get("DEVICE") == "cuda"
if cuda:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dev = torch.device("cuda" if cuda else "cpu")
# env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(512, 16, generator=g)
y = (x.sum(dim=1, keepdim=True) > 0).float()
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
start = 0
if ckpt and os.path.exists(ckpt):
    state = torch.load(ckpt, map_location="cpu")
    model.load_state_dict(state["model"])
    start = state["step"]
    if rank == 0:
        print(f"resumed at step {start}", flush=True)
model.to(dev)
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, shuffle=True)
loader = DataLoader(TensorDataset(x, y), batch_size=16, sampler=sampler)
step = start
epoch = 0
while step < steps:
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        if step >= steps:
            break
        opt.zero_grad()
        xb, yb = xb.to(dev), yb.to(dev)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(ddp(xb), yb)
        loss.backward()
        opt.step()
        step += 1
        if rank == 0 and ckpt and step % 10 == 0 and (not save_until or step <= save_until):
            tmp = ckpt + ".tmp"
            extra = torch.randint(0, 256, (pad,), dtype=torch.uint8, generator=torch.Generator().manual_seed(step))
            torch.save({"model": model.state_dict(), "step": step, "pad": extra}, tmp)
            os.replace(tmp, ckpt)
        time.sleep(sleep)
    epoch += 1
total = sum(p.detach().double().sum().item() for p in model.parameters())
print(f"rank {rank} of {world}: params sum {total:.10f} after {step} steps", flush=True)
dist.barrier()
dist.destroy_process_group()
