#!/usr/bin/env bash
# All-reduce busbw side by side on this machine: ddprun's process group (shared memory, and TCP
# forced), Gloo (Debian's
# python3-torch), Open MPI's MPI_Allreduce over shared memory (btl self,vader) and over TCP, and a
# single-thread memcpy as the ceiling. float32 sum in place, 4 KiB to 64 MiB; medians.
# Usage: bench/allreduce_compare.sh [BUILD_DIR]   (needs openmpi-bin, libopenmpi-dev, python3-torch)
set -euo pipefail
cd "$(dirname "$0")/.."
B=$(cd "${1:-build/release}" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mpicc -O2 -o "$T/mpi_allreduce" bench/mpi_allreduce.c
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
R="$T/results"
echo "# $(date -u +%F) $(lscpu | sed -n "s/^Model name: *//p"), $(getconf _NPROCESSORS_ONLN) cores; $(mpirun --version | head -n1); torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')" >"$R"
"$B/bench/allreduce_bench" memcpy >>"$R"
for n in 2 4; do
  for tr in shm tcp; do
    t=$([ $tr = shm ] && echo auto || echo tcp)
    printf 'command: [%s, ddp-%s]\nnproc_per_node: %d\nlogs: {dir: %s/logs}\nenv: {DDP_PG_TRANSPORT: %s}\n' \
      "$B/bench/allreduce_bench" "$tr" "$n" "$T" "$t" >"$T/job.yaml"
    "$B/ddprun" "$T/job.yaml" 2>/dev/null | sed -n 's/^\[localhost:0\] //p' >>"$R"
  done
  /usr/bin/python3 bench/gloo_allreduce.py "$n" $((30000 + RANDOM % 20000)) >>"$R"
  "${MPIRUN[@]}" --mca btl self,vader -np "$n" "$T/mpi_allreduce" mpi-shm >>"$R"
  "${MPIRUN[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo -np "$n" "$T/mpi_allreduce" mpi-tcp >>"$R"
done
cp "$R" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
/usr/bin/python3 - "$R" <<'PY'
import sys
from collections import defaultdict
lines = open(sys.argv[1]).read().splitlines()
print(lines[0])
rows = defaultdict(dict)
for l in lines[1:]:
    if not l.startswith("RESULT"):
        continue
    _, impl, n, b, us, alg, bus, wrong = l.split()
    rows[(int(n), int(b))][impl] = (float(us), float(bus), int(wrong))
def fmt(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
for n in (2, 4):
    print(f"\n{n} ranks on one node. busbw in GB/s (time in us).\n")
    print("| size | ddprun shm | ddprun TCP | Gloo | Open MPI shm | Open MPI TCP | shm/Gloo | shm/MPI-shm | TCP/Gloo | memcpy GB/s | wrong |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (nn, b) in sorted(k for k in rows if k[0] == n):
        r = rows[(nn, b)]
        g = lambda k: f"{r[k][1]:.2f} ({r[k][0]:.0f})" if k in r else "-"
        ratio = lambda a, k: f"{r[a][1] / r[k][1]:.2f}x" if k in r and a in r and r[k][1] else "-"
        mc = rows.get((1, b), {}).get("memcpy")
        wrong = sum(v[2] for v in r.values())
        print(f"| {fmt(b)} | {g('ddp-shm')} | {g('ddp-tcp')} | {g('gloo')} | {g('mpi-shm')} | {g('mpi-tcp')} "
              f"| {ratio('ddp-shm', 'gloo')} | {ratio('ddp-shm', 'mpi-shm')} | {ratio('ddp-tcp', 'gloo')} "
              f"| {mc[1] if mc else 0:.1f} | {wrong} |")
PY
