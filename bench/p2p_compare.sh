#!/usr/bin/env bash
# Point-to-point ping-pong between 2 ranks on this machine, side by side: ddprun's
# ddp_pg_send/recv through the node's shared-memory rings and over TCP (loopback,
# DDP_PG_P2P_SHM_BYTES=0), Gloo's send/recv (Debian's python3-torch) and Open MPI's
# MPI_Send/Recv over shared memory (btl self,vader) and TCP. 8 B to 16 MiB; one-way time is
# half the median round trip. Repeats the whole set REPEAT times (default 3) and reports the
# median of the runs' medians.
# Usage: bench/p2p_compare.sh [BUILD_DIR]   (needs openmpi-bin, libopenmpi-dev, python3-torch)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record p2p_compare "$@" # its output goes to bench/results/<machine>/p2p_compare.md too
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. bench/lib.sh
bench_dirs "$@"
mpicc -O2 -o "$T/mpi_p2p" bench/mpi_p2p.c
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
R="$T/results"
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(getconf _NPROCESSORS_ONLN) cores; $(mpirun --version | head -n1); torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')" >"$R"
for _ in $(seq "${REPEAT:-3}"); do
  for tr in shm tcp; do
    bytes=$([ $tr = shm ] && echo 1048576 || echo 0)
    printf 'command: [%s, ddp-%s]\nnproc_per_node: 2\nlogs: {dir: %s/logs}\nenv: {DDP_PG_P2P_SHM_BYTES: "%s"}\n' \
      "$B/bench/p2p_bench" "$tr" "$T" "$bytes" >"$T/job.yaml"
    "$B/ddprun" "$T/job.yaml" 2>/dev/null | sed -n 's/^\[localhost:0\] //p' >>"$R"
  done
  /usr/bin/python3 bench/gloo_p2p.py "$(free_port)" >>"$R"
  "${MPIRUN[@]}" --mca btl self,vader "$T/mpi_p2p" mpi-shm >>"$R"
  "${MPIRUN[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo "$T/mpi_p2p" mpi-tcp >>"$R"
done
cp "$R" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
/usr/bin/python3 - "$R" <<'PY'
import statistics
import sys
from collections import defaultdict
lines = open(sys.argv[1]).read().splitlines()
print(lines[0])
runs = defaultdict(list)
wrong = defaultdict(int)
for l in lines[1:]:
    if not l.startswith("RESULT"):
        continue
    _, impl, b, us, gbs, w = l.split()
    runs[(int(b), impl)].append(float(us))
    wrong[int(b)] += int(w)
def fmt(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"
impls = ["ddp-shm", "ddp-tcp", "gloo", "mpi-shm", "mpi-tcp"]
print("\n2 ranks on one node, ping-pong: one-way time in us (GB/s), median of the runs' medians.\n")
print("| size | ddprun rings | ddprun TCP | Gloo | Open MPI vader | Open MPI TCP | rings/Gloo | rings/vader | rings/ddprun TCP | wrong |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for b in sorted({k[0] for k in runs}):
    med = {i: statistics.median(runs[(b, i)]) for i in impls if (b, i) in runs}
    cell = lambda i: f"{med[i]:.1f} ({b / med[i] / 1e3:.2f})" if i in med else "-"
    ratio = lambda i: f"{med[i] / med['ddp-shm']:.2f}x" if i in med and "ddp-shm" in med else "-"
    print(f"| {fmt(b)} | " + " | ".join(cell(i) for i in impls) +
          f" | {ratio('gloo')} | {ratio('mpi-shm')} | {ratio('ddp-tcp')} | {wrong[b]} |")
print("\nratios: the other's time over the rings' (above 1: the rings are faster).")
PY
