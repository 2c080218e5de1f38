#!/usr/bin/env bash
# All-reduce busbw side by side on this machine: ddprun's process group (shared memory on an
# ordinary buffer, shared memory on the group's registered memory from ddp_pg_mem_alloc, as the
# reducer's buckets are, and TCP forced), Gloo (Debian's python3-torch), Open MPI's MPI_Allreduce over shared memory (btl self,vader) and over TCP, and a
# single-thread memcpy as the ceiling. float32 sum in place, 4 KiB to 64 MiB; medians.
# Also two memcpys at once, one per core: each rank of a 2-rank all-reduce must read its buffer
# and write it once, as a memcpy does, at the same time as the other, so once the message
# streams from memory what each of the two gets is the 2-rank busbw's bound.
# REPS rounds (default 3) run every implementation in turn, so a slow spell of a shared VM hits all
# of them; the table shows each one's median over the rounds and each ratio's median over the
# rounds with its range (the ratio of two runs taken seconds apart).
# BIND=core binds the ranks of ddprun (bind_to: core) and of Open MPI (--bind-to core) to a core
# each (Gloo's spawned ranks stay unbound); by default none is bound.
# Usage: [REPS=N] [BIND=core] bench/allreduce_compare.sh [BUILD_DIR]   (needs openmpi-bin, libopenmpi-dev,
# python3-torch)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
bench_record allreduce_compare "$@" # its output goes to bench/results/<machine>/allreduce_compare.md too
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. bench/lib.sh
bench_dirs "$@"
mpicc -O2 -o "$T/mpi_allreduce" bench/mpi_allreduce.c
BIND=${BIND:-none}
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to "$([ "$BIND" = core ] && echo core:overload-allowed || echo none)")
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
R="$T/results"
REPS=${REPS:-3}
echo "# $(date -u +%F) $(lscpu | sed -n "s/^Model name: *//p"), $(getconf _NPROCESSORS_ONLN) cores; $(mpirun --version | head -n1); torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'); REPS=$REPS BIND=$BIND" >"$R"
for rep in $(seq "$REPS"); do
  {
    "$B/bench/allreduce_bench" memcpy
    # two at once, one per core: what the memory system gives each of 2 ranks
    "$B/bench/allreduce_bench" memcpy | sed 's/^RESULT memcpy /RESULT memcpy2a /' >"$T/m2" &
    "$B/bench/allreduce_bench" memcpy | sed 's/^RESULT memcpy /RESULT memcpy2b /'
    wait
    cat "$T/m2"
    for n in 2 4; do
      for tr in shm shm-reg tcp; do
        t=$([ $tr = tcp ] && echo tcp || echo auto)
        printf 'command: [%s, ddp-%s]\nnproc_per_node: %d\nlogs: {dir: %s/logs}\nenv: {DDP_PG_TRANSPORT: %s}\nbind_to: %s\n' \
          "$B/bench/allreduce_bench" "$tr" "$n" "$T" "$t" "$BIND" >"$T/job.yaml"
        "$B/ddprun" "$T/job.yaml" 2>/dev/null | sed -n 's/^\[localhost:0\] //p'
      done
      /usr/bin/python3 bench/gloo_allreduce.py "$n" "$(free_port)"
      "${MPIRUN[@]}" --mca btl self,vader -np "$n" "$T/mpi_allreduce" mpi-shm
      "${MPIRUN[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo -np "$n" "$T/mpi_allreduce" mpi-tcp
    done
  } | sed -n "s/^RESULT /RESULT $rep /p" >>"$R"
done
cp "$R" "${RESULTS_OUT:-/dev/null}" 2>/dev/null || true
/usr/bin/python3 - "$R" <<'PY'
import sys
from collections import defaultdict
from statistics import median
lines = open(sys.argv[1]).read().splitlines()
print(lines[0])
runs = defaultdict(lambda: defaultdict(dict))  # (n, bytes) -> impl -> rep -> (us, busbw, wrong)
for l in lines[1:]:
    _, rep, impl, n, b, us, alg, bus, wrong = l.split()
    runs[(int(n), int(b))][impl][rep] = (float(us), float(bus), int(wrong))
def fmt(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
for n in (2, 4):
    print(f"\n{n} ranks on one node. busbw in GB/s (time in us), medians over the rounds; ratios: median (min-max) of the rounds' ratios.\n")
    two = n == 2
    print("| size | ddprun shm | ddprun shm, registered | ddprun TCP | Gloo | Open MPI shm | Open MPI TCP | shm/Gloo | registered/Gloo | shm/MPI-shm | registered/MPI-shm | TCP/Gloo | memcpy GB/s | wrong |"
          + (" 2 memcpys at once, each GB/s | shm / memcpy | registered / memcpy | shm / 2 memcpys' each |" if two else ""))
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|---:|" if two else ""))
    for (nn, b) in sorted(k for k in runs if k[0] == n):
        r = runs[(nn, b)]
        def g(k):
            if k not in r:
                return "-"
            v = list(r[k].values())
            return f"{median(x[1] for x in v):.2f} ({median(x[0] for x in v):.0f})"
        def ratio(a, k):
            rs = [r[a][p][1] / r[k][p][1] for p in r.get(a, {}) if p in r.get(k, {}) and r[k][p][1]]
            if not rs:
                return "-"
            return f"{median(rs):.2f}x" + (f" ({min(rs):.2f}-{max(rs):.2f})" if len(rs) > 1 else "")
        m1 = runs.get((1, b), {})
        mc = m1.get("memcpy", {})
        mcbw = median(x[1] for x in mc.values()) if mc else 0
        wrong = sum(x[2] for v in r.values() for x in v.values())
        extra = ""
        if two:
            # per round: the two concurrent copies' mean, and the shares of that round
            a, c, sh = m1.get("memcpy2a", {}), m1.get("memcpy2b", {}), r.get("ddp-shm", {})
            rg = r.get("ddp-shm-reg", {})
            each = {p: (a[p][1] + c[p][1]) / 2 for p in a if p in c}
            s1 = [sh[p][1] / mc[p][1] for p in sh if p in mc and mc[p][1]]
            r1 = [rg[p][1] / mc[p][1] for p in rg if p in mc and mc[p][1]]
            s2 = [sh[p][1] / each[p] for p in sh if p in each and each[p]]
            f = lambda v: f"{median(v):.0%} ({min(v):.0%}-{max(v):.0%})" if v else "-"
            extra = f" {median(each.values()):.1f} | {f(s1)} | {f(r1)} | {f(s2)} |" if each else " - | - | - | - |"
        print(f"| {fmt(b)} | {g('ddp-shm')} | {g('ddp-shm-reg')} | {g('ddp-tcp')} | {g('gloo')} | {g('mpi-shm')} | {g('mpi-tcp')} "
              f"| {ratio('ddp-shm', 'gloo')} | {ratio('ddp-shm-reg', 'gloo')} | {ratio('ddp-shm', 'mpi-shm')} "
              f"| {ratio('ddp-shm-reg', 'mpi-shm')} | {ratio('ddp-tcp', 'gloo')} "
              f"| {mcbw:.1f} | {wrong} |" + extra)
PY
