/*
 * Point-to-point ping-pong between ranks 0 and 1, run as a ddprun job (the same sizes, counts
 * and RESULT lines as bench/mpi_p2p.c and bench/gloo_p2p.py): rank 0 sends a message, rank 1
 * sends it back; the one-way time is half the median round trip. Prints on rank 0
 *   RESULT <impl> <bytes> <one-way us> <GB/s> <wrong>
 * where <wrong> counts round trips whose bytes came back changed.
 */
#include "common/util.h"
#include "worker/pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *impl = argc > 1 ? argv[1] : "ddp";
    struct ddp_pg_opts o = {.p2p = true};
    struct ddp_pg *pg;
    if (ddp_pg_init_env(&o, &pg) != 0)
        return 1;
    int rank = ddp_pg_rank(pg), peer = 1 - rank;
    size_t maxb = (size_t)64 << 20;
    unsigned char *a = malloc(maxb), *b = malloc(maxb);
    static double t[1000];
    /* P2P_SIZES=a,b,...: those sizes instead (up to the first 0 or one over 64 MiB),
     * P2P_ITERS=n round trips each (at most 1000): for profiling one size */
    const char *sz = getenv("P2P_SIZES"), *its = getenv("P2P_ITERS");
    if (sz && !*sz)
        sz = NULL;
    for (size_t bytes = sz ? strtoull(sz, NULL, 10) : 8; bytes && bytes <= maxb;) {
        int it = bytes >= (16u << 20) ? 10 : bytes >= (1u << 20) ? 30 : 200, wrong = 0;
        if (its && atoi(its) > 0)
            it = atoi(its) < 1000 ? atoi(its) : 1000;
        for (int i = -3; i < it; i++) { /* 3 warm-up round trips */
            if (rank == 0) {
                memset(a, (unsigned char)(i + 7), bytes);
                int64_t t0 = ddp_now_ns();
                if (ddp_pg_send(pg, a, bytes, peer, 1) || ddp_pg_recv(pg, b, bytes, peer, 2))
                    return 1;
                if (i >= 0)
                    t[i] = (double)(ddp_now_ns() - t0) / 2e3;
                wrong += b[0] != (unsigned char)(i + 7) || b[bytes - 1] != (unsigned char)(i + 7);
            } else if (rank == 1) {
                if (ddp_pg_recv(pg, b, bytes, peer, 1) || ddp_pg_send(pg, b, bytes, peer, 2))
                    return 1;
            }
        }
        if (rank == 0) {
            qsort(t, (size_t)it, sizeof(double), cmp_d);
            double us = t[it / 2];
            printf("RESULT %s %zu %.2f %.3f %d\n", impl, bytes, us, (double)bytes / us / 1e3,
                   wrong);
            fflush(stdout);
        }
        if (!sz) {
            bytes *= 8;
            continue;
        }
        sz = strchr(sz, ',');
        bytes = sz ? strtoull(++sz, NULL, 10) : 0;
    }
    ddp_pg_barrier(pg);
    free(a);
    free(b);
    ddp_pg_free(pg);
    return 0;
}
