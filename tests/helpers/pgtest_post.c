/*
 * pgtest post: ddp_pg_allreduce_post. Every rank fills a buffer of 4 MiB (registered); the ranks
 * other than 0 post its all-reduce and sleep 300 ms before they call it, so rank 0, which calls
 * it at once, sums every chunk alone in the meantime where it goes single-copy
 * (worker/shm_claim.c): each rank prints the chunks it claimed. Then every rank posts again and
 * calls a barrier first: the posted all-reduce runs before the barrier, and the call after it
 * returns at once with the same result. Both checked bit for bit against the sum in rank order.
 */
#include "tests/helpers/pgtest.h"
#include "common/err.h"
#include "worker/coll.h"
#include "worker/group.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void fill(float *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        f[i] = ordered(rank, i);
}

static const char *posted(int r)
{
    return r == 0 ? "posted" : r == 1 ? "not posted" : ddp_err_name(r);
}

int pgtest_post(struct ddp_pg *pg)
{
    size_t n = ((size_t)4 << 20) / 4;
    float *f = ddp_pg_mem_alloc(pg, n * 4), *w = malloc(n * 4);
    const struct ddp__shm *sh = &pg->comm.shm;
    int bad = 0, r = 1;
    for (size_t i = 0; i < n; i++) {
        float acc = ordered(0, i);
        for (int k = 1; k < world; k++)
            acc += ordered(k, i);
        w[i] = acc;
    }
    fill(f, n);
    uint64_t c0 = sh->claimed;
    if (rank != 0) {
        r = ddp_pg_allreduce_post(pg, f, n, DDP_F32, DDP_SUM);
        must(pg, r < 0 ? r : 0, "post");
        usleep(300 * 1000);
    }
    must(pg, ddp_pg_allreduce(pg, f, n, DDP_F32, DDP_SUM), "allreduce");
    bad |= compare(f, w, n, DDP_F32, "posted all-reduce");
    printf("pgtest rank %d: post: %s, %llu of %zu chunks claimed here\n", rank,
           rank ? posted(r) : "called at once", (unsigned long long)(sh->claimed - c0),
           n * 4 / DDP__CLAIM_CHUNK);
    /* posted, then another collective called first */
    fill(f, n);
    r = ddp_pg_allreduce_post(pg, f, n, DDP_F32, DDP_SUM);
    must(pg, r < 0 ? r : 0, "post");
    must(pg, ddp_pg_barrier(pg), "barrier");
    bad |= r == 0 && compare(f, w, n, DDP_F32, "posted all-reduce, run before a barrier");
    uint64_t d0 = sh->direct_done;
    must(pg, ddp_pg_allreduce(pg, f, n, DDP_F32, DDP_SUM), "allreduce");
    bad |= compare(f, w, n, DDP_F32, "posted all-reduce, called after a barrier");
    printf("pgtest rank %d: post before a barrier: %s, %llu single-copy in the call\n", rank,
           posted(r), (unsigned long long)(sh->direct_done - d0));
    ddp_pg_mem_free(pg, f);
    free(w);
    return bad;
}
