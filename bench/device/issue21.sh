#!/usr/bin/env bash
# Issue 21's measurements on a lent GPU machine's CPUs, in one device call: after
# bench/device/bundle.sh packed .dev/ here, run on the machine from the repository root as
#   . .dev/setup.sh && bench/device/issue21.sh [PART...]
# PART is any of tcp (bench/tcp_link_compare.sh: two namespace hosts of one rank each, no sshd
# needed; by default, DDP_PG_TCP_CONNS=auto: 2 connections between them, 4 from 8 usable
# CPUs, a thread each; 128 KiB send buffers, the hosts sharing a kernel), tcp0 (the same with
# DDP_PG_TCP_SNDBUF=0: the kernel's autotuned buffers, as between two machines), tcp1 (the same
# with DDP_PG_TCP_CONNS=1), tcp2 (one connection with
# DDP_PG_TCP_THREADS=2: a thread sends while another receives), tcp512 (stripes from 512 KiB,
# DDP_PG_TCP_STRIPE_BYTES: a 1 MiB all-reduce's steps striped), streams (bench/tcp_streams.sh:
# the transport alone over 1, 2 and 4 connections beside iperf3 -P n), reducer
# (bench/reducer_bench.sh, 2 repetitions, no bucket sweep), shm (bench/allreduce_compare.sh,
# REPS=3, Open MPI from the bundle; its "registered" column is single-copy with helper threads
# since 2026-11-27), threads (bench/shm_threads_compare.sh), slots4 (the same at 4 ranks, 5
# rounds, 1 MiB slots against 4 MiB ones, helpers as by default) and stripes (not a benchmark:
# the bats case "over TCP in stripes", whose ranks offer 4 connections on a machine of 8 CPUs
# or more, one under taskset 2); default: tcp tcp0 stripes slots4 tcp512 (the send buffers of
# the eighth session first; on 16 cores tcp took 30 s, stripes 20 s; SECS=110 keeps the five
# within one 10-minute call). Each part runs under its own time limit
# (SECS, default 240 s) so that one that overruns leaves the others their turn; its table goes
# to stdout and, where the device tool gave one, to $OUT/PART.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
if [ -z "${B:-}" ] || [ ! -x "$B/ddprun" ]; then
  echo "issue21.sh: source .dev/setup.sh first (sets B)" >&2
  exit 2
fi
SECS=${SECS:-240}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(tcp tcp0 stripes slots4 tcp512)
rc=0
for p in "${parts[@]}"; do
  case $p in
  tcp) cmd=(bench/tcp_link_compare.sh "$B") ;;
  tcp0) cmd=(env DDP_PG_TCP_SNDBUF=0 bench/tcp_link_compare.sh "$B") ;;
  tcp1) cmd=(env DDP_PG_TCP_CONNS=1 bench/tcp_link_compare.sh "$B") ;;
  tcp2) cmd=(env DDP_PG_TCP_CONNS=1 DDP_PG_TCP_THREADS=2 bench/tcp_link_compare.sh "$B") ;;
  tcp512) cmd=(env DDP_PG_TCP_STRIPE_BYTES=524288 bench/tcp_link_compare.sh "$B") ;;
  streams) cmd=(env REPS=3 bench/tcp_streams.sh "$B") ;;
  reducer) cmd=(env NO_SWEEP=1 PY=python3 bench/reducer_bench.sh "$B" 2) ;;
  shm) cmd=(env REPS=3 bench/allreduce_compare.sh "$B") ;;
  threads) cmd=(bench/shm_threads_compare.sh "$B") ;;
  slots4) cmd=(env NPROC=4 REPS=5 CONFIGS="auto auto/4194304" bench/shm_threads_compare.sh "$B") ;;
  stripes)
    cmd=(env DDP_BUILD_DIR="$B" bats -f "in stripes" tests/integration/20-pg-collectives.bats)
    ;;
  *)
    echo "issue21.sh: unknown part '$p' (tcp, tcp0, tcp1, tcp2, tcp512, streams, reducer, shm," \
      "threads, slots4, stripes)" >&2
    exit 2
    ;;
  esac
  echo "== $p: ${cmd[*]} (at most $SECS s)"
  out=/dev/null
  [ -n "${OUT:-}" ] && out="$OUT/$p.txt"
  SECONDS=0
  timeout --kill-after=10 "$SECS" "${cmd[@]}" 2>&1 | tee "$out"
  r=${PIPESTATUS[0]}
  echo "== $p: exit $r after $SECONDS s"
  [ "$r" -eq 0 ] || rc=1
done
exit $rc
