#!/usr/bin/env bash
# Packs what a lent GPU machine (Ubuntu, its own CUDA, NCCL and PyTorch in a venv; no Debian
# packages, no network) needs to run ddprun's tests and benchmarks, into the ignored folder
# .dev/ of the repository (the device tool's `carry: [".dev"]` sends it; 64 MiB at most):
#   .dev/b            BUILD_DIR (default build/release) without its object files
#   .dev/root.tgz     Debian's libyaml, libssh and Kerberos libraries, bats with its helpers,
#                     iperf3, ip and tc (bench/tcp_link_compare.sh), each kept where the
#                     machine has its own
#   .dev/mpi.tgz      Debian's Open MPI and its libraries (MPI=0 leaves it out)
#   .dev/mpi_allreduce  bench/mpi_allreduce.c built here (bench/allreduce_compare.sh's mpicc)
#   .dev/fm           the Fashion-MNIST files (FM=0 leaves them out)
#   .dev/setup.sh     bench/device/setup.sh, to source there first: `. .dev/setup.sh`
# Usage: [MPI=0] [FM=0] bench/device/bundle.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build/release}
D=.dev
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >>.git/info/exclude
rm -rf "$D/b" && mkdir -p "$D/b"
(cd "$B" && find . \( -type f -o -type l \) ! -name '*.o' ! -name '*.a' ! -path '*/CMakeFiles/*' -print0 |
  tar cf - --null -T -) | tar xf - -C "$D/b"
libs=()
for l in libyaml-0.so.2 libssh.so.4 libgssapi_krb5.so.2 libkrb5.so.3 libk5crypto.so.3 libkrb5support.so.0 \
  libcom_err.so.2 libkeyutils.so.1 libiperf.so.0 libsctp.so.1 libbpf.so.1 libbsd.so.0 libcap.so.2 \
  libelf.so.1 libmd.so.0 libmnl.so.0 libxtables.so.12; do
  p=$(ldconfig -p | sed -n "s|^[[:space:]]*$l (libc6,x86-64) => ||p" | head -n1)
  [ -n "$p" ] && libs+=("$p" "$(readlink -f "$p")")
done
bats=$(dpkg -L bats bats-assert bats-support | while read -r f; do
  [ -f "$f" ] && case "$f" in /usr/bin/* | /usr/lib/* | /usr/libexec/*) echo "$f" ;; esac
done)
# shellcheck disable=SC2086
tar czf "$D/root.tgz" -P "${libs[@]}" $bats /usr/bin/iperf3 "$(readlink -f /usr/sbin/ip)" "$(readlink -f /usr/sbin/tc)"
if [ "${MPI:-1}" != 0 ]; then
  dpkg -L openmpi-bin libopenmpi3 openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7 \
    libevent-pthreads-2.1-7 libfabric1 libucx0 libpsm2-2 libpsm-infinipath1 libibverbs1 \
    ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200 |
    while read -r f; do if [ -f "$f" ] || [ -L "$f" ]; then echo "$f"; fi; done | sort -u >"$D/mpi.list"
  tar czf "$D/mpi.tgz" -P -T "$D/mpi.list"
  mpicc -O2 -o "$D/mpi_allreduce" bench/mpi_allreduce.c
fi
if [ "${FM:-1}" != 0 ]; then
  mkdir -p "$D/fm" && cp /usr/share/datasets/fashion-mnist/*.gz "$D/fm/"
fi
cp bench/device/setup.sh "$D/setup.sh"
du -sh "$D"
