"""Hosts PyTorch's TCPStore (Debian's python3-torch) on 127.0.0.1:PORT until killed.

Run with /usr/bin/python3. Prints "ready" once the server listens.
"""
import sys
import time
from datetime import timedelta

import torch.distributed as dist

port = int(sys.argv[1])
store = dist.TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=600), wait_for_workers=False)
print("ready", torch_version := __import__("torch").__version__, flush=True)
while True:
    time.sleep(3600)
