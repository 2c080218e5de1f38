"""A worker for bench/elastic_recovery.sh, run the same way under ddprun and torchrun: joins a
gloo process group from the torchrun environment (env://), then all-reduces a small tensor
every 20 ms for ever. Rank 0 prints one line, with the wall time, at the first all-reduce of each
attempt: "TRAINING restart=R world=W t=SECONDS"."""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
t = torch.zeros(1024)
first = True
while True:
    dist.all_reduce(t)
    if first and dist.get_rank() == 0:
        print(f"TRAINING restart={restart} world={dist.get_world_size()} t={time.time():.3f}",
              flush=True)
        first = False
    time.sleep(0.02)
