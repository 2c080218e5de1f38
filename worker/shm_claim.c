/*
 * The single-copy all-reduce of one node's registered buffers (ddp_pg_mem_alloc), where every
 * local rank maps every local rank's arena and so can write a peer's buffer as well as read
 * it: the buffer is cut into chunks, and whichever thread of whichever local rank is free
 * claims the next one (a shared counter, compare-and-swap), sums it over every rank's buffer
 * in local rank order, in place in local rank 0's, and writes the sum into every other rank's
 * buffer while those lines are still in its cache.
 *
 *   step 1   every buffer published and final (worker/shm_direct.c, the caller)
 *   claim    chunks until none is left: read n, write n per element (the shards and copies of
 *            ddp__shm_direct_allreduce read n + 1: each rank reads its peers' shards again to
 *            copy them), and no step between blocks
 *   step 2   every chunk summed and written: nobody touches our buffer any more
 *
 * A rank that the machine slows (a vCPU that shares its core for a while) claims fewer chunks
 * and the others more, where fixed shards make everyone wait for the slowest. The sum of a
 * chunk does not depend on who claims it: the same arithmetic in the same order, so every
 * element has the bits of the slots' and of fixed shards'.
 */
#include "worker/coll.h"
#include "worker/team.h"

#include <stdatomic.h>
#include <string.h>

#include "common/banned.h"

struct claim {
    struct ddp__shm *sh;
    char *buf;                          /* ours */
    size_t count, esz, per, first, end; /* elements; per chunk; the chunks' numbers [first, end) */
    enum ddp_dtype dt;
    enum ddp_redop op;
    uint64_t done[DDP__TEAM_MAX]; /* chunks each part summed */
};

/* The next chunk's number, or end when none is left. */
static uint64_t claim_next(_Atomic uint64_t *ctr, uint64_t end)
{
    uint64_t x = atomic_load_explicit(ctr, memory_order_relaxed);
    while (x < end && !atomic_compare_exchange_weak_explicit(ctr, &x, x + 1, memory_order_relaxed,
                                                             memory_order_relaxed))
        ;
    return x < end ? x : end;
}

/* Local rank j's buffer as mapped here. */
static char *mem(const struct claim *k, int j)
{
    struct ddp__shm *sh = k->sh;
    return j == sh->me ? k->buf : (char *)sh->peer_arena[j] + ddp__shm_ctrl(sh, j)->arena_off;
}

/* Chunk x: its elements summed over the ranks in rank order into rank 0's buffer (an average
 * divides in the pass that adds the last rank's, as worker/shm_direct.c does), then copied
 * into every other rank's. */
static void sum_chunk(const struct claim *k, uint64_t x)
{
    int n = k->sh->n;
    size_t e0 = (size_t)(x - k->first) * k->per,
           m = k->count - e0 < k->per ? k->count - e0 : k->per;
    size_t o = e0 * k->esz, bytes = m * k->esz;
    char *out = mem(k, 0) + o;
    for (int j = 1; j < n; j++) {
        if (k->op == DDP_AVG && j == n - 1)
            ddp__reduce_avg(out, mem(k, j) + o, m, k->dt, n);
        else
            ddp__reduce(out, mem(k, j) + o, m, k->dt, k->op);
    }
    for (int j = 1; j < n; j++)
        memcpy(mem(k, j) + o, out, bytes);
}

static void claim_part(void *arg, int p, int parts)
{
    (void)parts;
    struct claim *k = arg;
    _Atomic uint64_t *ctr = &ddp__shm_ctrl(k->sh, 0)->claim;
    k->done[p] = 0;
    for (uint64_t x; (x = claim_next(ctr, k->end)) < k->end; k->done[p]++)
        sum_chunk(k, x);
}

int ddp__shm_claim_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                             enum ddp_redop op, struct ddp__team *team)
{
    struct ddp__shm *sh = &c->shm;
    struct claim k = {
        .sh = sh, .buf = buf, .count = count, .esz = ddp_dtype_size(dt), .dt = dt, .op = op};
    k.per = DDP__CLAIM_CHUNK / k.esz;
    uint64_t chunks = (count + k.per - 1) / k.per;
    /* The counter never goes back: every local rank counts the same chunks per all-reduce, so
     * each knows where this one's numbers start. */
    k.first = sh->claim_base;
    k.end = k.first + chunks;
    if (sh->n > 1) { /* alone on the node, the buffer is the sum already */
        if (team)
            ddp__team_run(team, claim_part, &k);
        else
            claim_part(&k, 0, 1);
        sh->claim_base = k.end;
        for (int p = 0; p < ddp__team_size(team); p++)
            sh->claimed += k.done[p];
    }
    int e = ddp__shm_step(c, 2);
    if (e < 0)
        return e;
    sh->seq += 2;
    sh->direct_done++;
    sh->direct_shared += team != NULL;
    return 0;
}
