# One rank's side of bench/torch_recorder_cost.sh: the median time of a torch.distributed call
# (a 4-float all_reduce, a barrier) and of a DDP training step of a small model, over Gloo; with
# DDP_BENCH_DEVICE=cuda, over NCCL on this rank's GPU, each call timed to the device's end of it
# (torch.cuda.synchronize), as the recorder's own completion waits for it.
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)
cuda = os.environ.get("DDP_BENCH_DEVICE") == "cuda"
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)
dist.init_process_group("nccl" if cuda else "gloo")
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
sync = torch.cuda.synchronize if cuda else (lambda: None)


def timed(fn, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


x = torch.ones(4, device=dev)
for _ in range(200):
    dist.all_reduce(x)
ar = timed(lambda: dist.all_reduce(x), reps)
br = timed(dist.barrier, reps)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(dev)
model = DDP(net, device_ids=[dev] if cuda else None)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(16, 64, device=dev)


def step():
    opt.zero_grad()
    model(data).sum().backward()
    opt.step()


for _ in range(50):
    step()
st = timed(step, reps // 4)
if dist.get_rank() == 0:
    print("bench: all_reduce %.2f us, barrier %.2f us, ddp step %.2f us" % (ar, br, st))
# in the same process, torch's all_reduce through the recorder's wrapper and called directly,
# in alternating blocks of 100 calls (the runs' own noise set aside)
raw = getattr(dist.all_reduce, "__wrapped__", None)
if raw is not None:
    wr, un = [], []
    for b in range(30):
        pair = ((dist.all_reduce, wr), (raw, un))
        for fn, out in pair if b % 2 == 0 else pair[::-1]:
            out.append(timed(lambda: fn(x), 100))
    if dist.get_rank() == 0:
        print("bench: in one process, all_reduce through the wrapper %.2f us, direct %.2f us" %
              (statistics.median(wr), statistics.median(un)))
# in the same processes, DDP steps through the recorder's forward (an entry, the gradient hook,
# two final callbacks) and through DDP's own forward (the instance's attribute; the hook on the
# first parameter then finds no step), alternating blocks of 25 steps
fwd = getattr(type(model).forward, "__wrapped__", None)
if fwd is not None:
    rs, ds = [], []
    for b in range(30):
        for bypass, out in ((False, rs), (True, ds)) if b % 2 == 0 else ((True, ds), (False, rs)):
            if bypass:
                model.forward = fwd.__get__(model)
            out.append(timed(step, 25))
            if bypass:
                del model.forward
    if dist.get_rank() == 0:
        print("bench: in one process, ddp step through the recorder %.2f us, direct %.2f us" %
              (statistics.median(rs), statistics.median(ds)))
# the recorder's own work per collective (what its wrapper adds to a call), without torch's:
# the entry written and finished 100,000 times, median of 5
rec = sys.modules.get("_ddprun_torch")
if dist.get_rank() == 0 and rec is not None and rec._R.q is not None:
    R, op, per = rec._R, rec._L["ops"]["allreduce"], []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(100000):
            R.end(R.coll(op, 2, 0, "tensor", (x,), {}), 0)
        per.append((time.perf_counter() - t) / 100000 * 1e6)
    print("bench: recorder alone %.2f us" % statistics.median(per))
