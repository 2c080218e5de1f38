"""A worker for bench/device/warm_gpu.sh, run the same way under ddprun and torchrun: joins an
NCCL process group from the torchrun environment (env://) on cuda:LOCAL_RANK, then all-reduces
a 4 MiB tensor after a 1024x1024 matmul every 20 ms. Rank 0 prints, with the wall time, the
first all-reduce of each attempt ("FIRST restart=R t=SECONDS cuda_before=B"; B: libcuda was
mapped before the program's first line) and, in attempts before LAST, exits with status 1 after
SECS seconds of training ("FAIL restart=R t=SECONDS")."""
import os
import sys
import time

CUDA_BEFORE = 'libcuda' in open('/proc/self/maps').read()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

restart = int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0'))
last, secs = int(sys.argv[1]), float(sys.argv[2])
local = int(os.environ.get('LOCAL_RANK', '0'))
dev = 'cuda' if torch.cuda.is_available() else 'cpu'  # cpu: to try the benchmark's script
if dev == 'cuda':
    torch.cuda.set_device(local % torch.cuda.device_count())
dist.init_process_group('nccl' if dev == 'cuda' else 'gloo')
a = torch.randn(1024, 1024, device=dev)
t = torch.zeros(1 << 20, device=dev)
t0, first = time.time(), True
while True:
    b = a @ a
    t += b[0, 0]
    dist.all_reduce(t)
    if dev == 'cuda':
        torch.cuda.synchronize()
    now = time.time()
    if first and dist.get_rank() == 0:
        print('FIRST restart=%d t=%.3f cuda_before=%d' % (restart, now, CUDA_BEFORE), flush=True)
        first = False
    if restart < last and now - t0 > secs:
        if dist.get_rank() == 0:
            print('FAIL restart=%d t=%.3f' % (restart, now), flush=True)
            os._exit(1)
    if restart >= last and now - t0 > secs:
        break
    time.sleep(0.02)
dist.destroy_process_group()
