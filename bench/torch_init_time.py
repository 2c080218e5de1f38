"""A PyTorch rank that times its gloo init_process_group (env://) and prints
INIT <rank> <entered, unix s> <left, unix s>; then one barrier."""
import os
import time

import torch.distributed as dist

t0 = time.time()
dist.init_process_group("gloo")
t1 = time.time()
print(f"INIT {os.environ['RANK']} {t0:.6f} {t1:.6f}", flush=True)
dist.barrier()
dist.destroy_process_group()
