"""A worker for bench/elastic_recovery.sh, run the same way under ddprun and torchrun: joins a
gloo process group from the torchrun environment (env://), then all-reduces a small tensor
every 20 ms for ever. Rank 0 prints one line, with the wall time, at the first all-reduce of each
attempt: "TRAINING restart=R world=W t=SECONDS". With CKPT (a path) and CKPT_MB, rank 0 saves a
checkpoint of that many MiB there with torch.save (a temporary name, then renamed) at its first
attempt's first all-reduce and prints "SAVED t=SECONDS", and every rank of a later attempt loads it
(torch.load) before it joins the group: "loaded N bytes" on rank 0."""
import os
import time

import torch
import torch.distributed as dist

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
ckpt = os.environ.get("CKPT")
if ckpt and restart > 0:
    state = torch.load(ckpt)
    if os.environ.get("RANK") == "0":
        print(f"loaded {state['w'].numel() * 4} bytes", flush=True)
dist.init_process_group("gloo")
t = torch.zeros(1024)
first = True
while True:
    dist.all_reduce(t)
    if first and dist.get_rank() == 0:
        print(f"TRAINING restart={restart} world={dist.get_world_size()} t={time.time():.3f}",
              flush=True)
        if ckpt and restart == 0:
            n = int(float(os.environ.get("CKPT_MB", "1")) * (1 << 20)) // 4
            torch.save({"w": torch.arange(n, dtype=torch.float32)}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
            print(f"SAVED t={time.time():.3f}", flush=True)
    if first:
        first = False
    time.sleep(0.02)
