/*
 * pgtest post: ddp_pg_allreduce_post. Every rank fills a buffer of 4 MiB (registered); the ranks
 * other than 0 post its all-reduce and sleep 300 ms before they call it, so rank 0, which calls
 * it at once, sums every chunk alone in the meantime where it goes single-copy
 * (worker/shm_claim.c): each rank prints the chunks it claimed. Then every rank posts again and
 * calls a barrier first: the posted all-reduce runs before the barrier, and the call after it
 * returns at once with the same result. Both checked bit for bit against the sum in rank order.
 *
 * pgtest stream [--die]: ddp_pg_allreduce_pieces_post, an all-reduce of 4 registered pieces
 * (4 MiB in all, cut unevenly) posted before its data is complete. Ranks other than 0 fill
 * pieces 0 and 1, post with those ready, and fill pieces 2 and 3 with a sentinel; rank 0 calls
 * the all-reduce at once. Each posting rank then waits (20 s at most) until pieces 0 and 1 hold
 * the sum, written there by rank 0 while it has not called the all-reduce, and checks that
 * pieces 2 and 3 still hold the sentinel (nobody summed past what was ready); then it fills
 * piece 2, says so (ddp_pg_post_ready), fills piece 3 and calls the all-reduce. With --die rank 1
 * posts nothing ready and SIGKILLs itself: rank 0's all-reduce must fail naming it.
 */
#include "tests/helpers/pgtest.h"
#include "common/err.h"
#include "worker/coll.h"
#include "worker/group.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
        w[i] = ordered_sum(i);
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

#define STREAM_PIECES 4
#define SENTINEL 12345.5f

/* Whether f[0..n) all hold v. */
static bool all_are(const float *f, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        if (f[i] != v)
            return false;
    return true;
}

int pgtest_stream(struct ddp_pg *pg, bool die)
{
    const size_t q = (size_t)1 << 18;                              /* 1 MiB of float32 */
    const size_t cnt[STREAM_PIECES] = {q + 37, q - 20, q, q - 17}; /* 0-1 end mid-chunk */
    struct ddp_piece pc[STREAM_PIECES];
    size_t at[STREAM_PIECES + 1] = {0}, n;
    for (int k = 0; k < STREAM_PIECES; k++)
        at[k + 1] = at[k] + cnt[k];
    n = at[STREAM_PIECES];
    float *w = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        w[i] = ordered_sum(i);
    }
    for (int k = 0; k < STREAM_PIECES; k++) {
        pc[k] = (struct ddp_piece){.data = ddp_pg_mem_alloc(pg, cnt[k] * 4), .count = cnt[k]};
        float *f = pc[k].data;
        for (size_t i = 0; i < cnt[k]; i++)
            f[i] = rank == 0 || k < 2 ? ordered(rank, at[k] + i) : SENTINEL;
    }
    const struct ddp__shm *sh = &pg->comm.shm;
    uint64_t c0 = sh->claimed;
    int bad = 0, r = 1;
    if (rank != 0) {
        r = ddp_pg_allreduce_pieces_post(pg, pc, STREAM_PIECES, DDP_F32, DDP_SUM, die ? 0 : at[2]);
        must(pg, r < 0 ? r : 0, "post");
        if (die && rank == 1) {
            printf("pgtest rank 1: posted, now dying\n");
            fflush(stdout);
            raise(SIGKILL);
        }
        bool summed = r != 0;
        for (int t = 0; !summed && t < 20000; t++) {
            summed = memcmp(pc[0].data, w, cnt[0] * 4) == 0 &&
                     memcmp(pc[1].data, w + at[1], cnt[1] * 4) == 0;
            if (!summed)
                usleep(1000);
        }
        bool untouched =
            all_are(pc[2].data, cnt[2], SENTINEL) && all_are(pc[3].data, cnt[3], SENTINEL);
        if (r == 0)
            printf("pgtest rank %d: stream: pieces 0-1 %s while posted, pieces 2-3 %s\n", rank,
                   summed ? "summed" : "NOT summed", untouched ? "untouched" : "TOUCHED");
        bad |= !summed || !untouched;
        for (int k = 2; k < STREAM_PIECES; k++) {
            float *f = pc[k].data;
            for (size_t i = 0; i < cnt[k]; i++)
                f[i] = ordered(rank, at[k] + i);
            if (k == 2)
                must(pg, ddp_pg_post_ready(pg, at[3]) < 0, "post_ready");
        }
    }
    must(pg, ddp_pg_allreduce_pieces(pg, pc, STREAM_PIECES, DDP_F32, DDP_SUM, -1),
         "allreduce of posted pieces");
    for (int k = 0; k < STREAM_PIECES; k++) {
        bad |= compare(pc[k].data, w + at[k], cnt[k], DDP_F32, "posted pieces");
        ddp_pg_mem_free(pg, pc[k].data);
    }
    printf("pgtest rank %d: stream: %s, %llu of %zu chunks claimed here\n", rank,
           rank ? posted(r) : "called at once", (unsigned long long)(sh->claimed - c0),
           n * 4 / DDP__CLAIM_CHUNK);
    free(w);
    return bad;
}
