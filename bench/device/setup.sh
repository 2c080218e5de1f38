# shellcheck shell=bash
# Sourced on a lent GPU machine from the repository root (`. .dev/setup.sh`), after
# bench/device/bundle.sh packed .dev/ here: installs what the bundle holds where Debian's
# paths are expected, adds the build, NCCL's and the CUDA runtime's folders to the loader's
# path, makes /usr/bin/python3 run the machine's PyTorch (the venv's python3 first on PATH:
# the suites and benchmarks call /usr/bin/python3, as Debian's python3-torch lives there), and
# sets B, DDP_BUILD_DIR and DDP_TEST_PYTHON. Prints what the machine is. The same steps ran by
# hand on the lent H100 machine of 2026-11-26 (Ubuntu 24.04, torch 2.11 in /opt/torch/.venv);
# this packaged form has not run there yet.
if ! command -v nvidia-smi >/dev/null || [ ! -d .dev/b ]; then
  # it rewrites /usr/bin/python3: never on a development machine
  echo "setup.sh: for a lent GPU machine, from the repository root with .dev/ carried" >&2
  # shellcheck disable=SC2317 # exit: when run instead of sourced
  return 1 2>/dev/null || exit 1
fi
R=$PWD
B=$R/.dev/b
tar xzf .dev/root.tgz -P --skip-old-files
[ -f .dev/mpi.tgz ] && tar xzf .dev/mpi.tgz -P --skip-old-files
if [ -f .dev/mpi_allreduce ]; then # allreduce_compare.sh's mpicc: the binary built at home
  # shellcheck disable=SC2016 # the $ are the wrapper's own
  printf '#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && { cp %s/.dev/mpi_allreduce "$2"; exit; }; shift; done\n' \
    "$R" >/usr/local/bin/mpicc
  chmod +x /usr/local/bin/mpicc
fi
nccl=$(find /opt /usr/local /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -n1)
cudart=$(find /usr/local /opt /usr/lib -name 'libcudart.so.13' 2>/dev/null | head -n1)
{
  echo "$B"
  [ -n "$nccl" ] && dirname "$nccl"
  [ -n "$cudart" ] && dirname "$cudart"
} >/etc/ld.so.conf.d/zz-ddp.conf
ldconfig
if [ -d .dev/fm ]; then
  mkdir -p /usr/share/datasets/fashion-mnist && cp .dev/fm/* /usr/share/datasets/fashion-mnist/
fi
py=$(command -v python3)
if [ "$py" != /usr/bin/python3 ]; then
  [ -e /usr/bin/python3.sys ] || mv /usr/bin/python3 /usr/bin/python3.sys 2>/dev/null
  printf '#!/bin/sh\nexec %s "$@"\n' "$py" >/usr/bin/python3
  chmod +x /usr/bin/python3
fi
export B DDP_BUILD_DIR=$B DDP_TEST_PYTHON=$py
ldd "$B/ddprun" | grep 'not found'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
lscpu | grep 'Model name'
nproc
