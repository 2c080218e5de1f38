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
 *
 * A buffer in pieces (a program's gradients where they lie, from ddp_pg_mem_alloc) goes the
 * same way when every piece of every local rank is registered: each rank publishes a table of
 * its pieces (where each starts in the whole, and its offset in the rank's arena), in its arena,
 * and a chunk is summed in ranges that lie within one piece of every rank (each rank may cut
 * its buffer its own way).
 *
 * Up to DDP__CLAIM_MAX_LOCAL local ranks (64): more go in fixed shards (one buffer) or through
 * the slots (pieces), alike on every rank.
 */
#include "worker/coll.h"
#include "common/err.h"
#include "worker/team.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

struct claim {
    struct ddp__comm *c;
    struct ddp__shm *sh;
    char *buf; /* ours, one buffer; NULL: in pieces, every rank's through its table */
    size_t count, esz, per, first, end; /* elements; per chunk; the chunks' numbers [first, end) */
    enum ddp_dtype dt;
    enum ddp_redop op;
    uint64_t done[DDP__TEAM_MAX]; /* chunks each part summed */
    int err[DDP__TEAM_MAX], errj[DDP__TEAM_MAX]; /* each part's failure, and the peer waited for */
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

/* m elements at p[0..n): summed in rank order into p[0] (an average divides in the pass that
 * adds the last rank's, as worker/shm_direct.c does), then copied into every other. */
static void sum_at(const struct claim *k, char *const *p, size_t m)
{
    int n = k->sh->n;
    for (int j = 1; j < n; j++) {
        if (k->op == DDP_AVG && j == n - 1)
            ddp__reduce_avg(p[0], p[j], m, k->dt, n);
        else
            ddp__reduce(p[0], p[j], m, k->dt, k->op);
    }
    for (int j = 1; j < n; j++)
        memcpy(p[j], p[0], m * k->esz);
}

/* Local rank j's table of pieces: [2q] where piece q starts in the whole, [2q + 1] its offset
 * in j's arena; [2 * npc] the element count; [2 * npc + 1] how many of them, from the start,
 * are final (the count, but while a posted all-reduce's data is still being computed:
 * ddp__shm_claim_post). */
static const uint64_t *table(struct ddp__shm *sh, int j)
{
    return (const uint64_t *)((const char *)sh->peer_arena[j] + ddp__shm_ctrl(sh, j)->arena_off);
}

/* The piece of a table of npc holding element e (< the count): the last that starts at or
 * before it. */
static size_t piece_at(const uint64_t *t, size_t npc, size_t e)
{
    size_t lo = 0, hi = npc;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (t[2 * mid] <= e)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Elements [e, end) of a buffer in pieces, in ranges within one piece of every rank, each as
 * soon as every rank's data there is final (a posted all-reduce's may not be yet: a chunk
 * across the edge of what is ready is summed up to it, then waits). 0, or the error of the
 * wait for local rank *who. */
static int sum_pieces(const struct claim *k, size_t e, size_t end, int *who)
{
    struct ddp__shm *sh = k->sh;
    int n = sh->n;
    const uint64_t *t[DDP__CLAIM_MAX_LOCAL];
    size_t q[DDP__CLAIM_MAX_LOCAL], npc[DDP__CLAIM_MAX_LOCAL], ready = e;
    char *p[DDP__CLAIM_MAX_LOCAL] = {NULL};
    for (int j = 0; j < n; j++) {
        t[j] = table(sh, j);
        npc[j] = ddp__shm_ctrl(sh, j)->addr;
        q[j] = piece_at(t[j], npc[j], e);
    }
    while (e < end) {
        for (int j = 0; ready <= e && j < n; j++) { /* every rank's final past e: up to where? */
            const uint64_t *w = &t[j][2 * npc[j] + 1];
            int err = ddp__shm_wait_word(k->c, j, w, e + 1);
            if (err < 0) {
                *who = j;
                return err;
            }
        }
        if (ready <= e) {
            ready = end;
            for (int j = 0; j < n; j++) {
                size_t r = (size_t)__atomic_load_n(&t[j][2 * npc[j] + 1], __ATOMIC_ACQUIRE);
                ready = r < ready ? r : ready;
            }
        }
        size_t stop = ready;
        for (int j = 0; j < n; j++)
            if (t[j][2 * (q[j] + 1)] < stop)
                stop = t[j][2 * (q[j] + 1)];
        for (int j = 0; j < n; j++)
            p[j] = (char *)sh->peer_arena[j] + t[j][2 * q[j] + 1] + (e - t[j][2 * q[j]]) * k->esz;
        sum_at(k, p, stop - e);
        e = stop;
        for (int j = 0; j < n; j++) /* past the pieces that end here (empty ones too) */
            while (q[j] + 1 < npc[j] && t[j][2 * (q[j] + 1)] <= e)
                q[j]++;
    }
    return 0;
}

/* Chunk x: 0, or the error of a wait for local rank *who. */
static int sum_chunk(const struct claim *k, uint64_t x, int *who)
{
    size_t e = (size_t)(x - k->first) * k->per, end = k->count - e < k->per ? k->count : e + k->per;
    if (!k->buf)
        return sum_pieces(k, e, end, who);
    struct ddp__shm *sh = k->sh;
    char *p[DDP__CLAIM_MAX_LOCAL] = {NULL};
    for (int j = 0; j < sh->n; j++)
        p[j] =
            (j == sh->me ? k->buf : (char *)sh->peer_arena[j] + ddp__shm_ctrl(sh, j)->arena_off) +
            e * k->esz;
    sum_at(k, p, end - e);
    return 0;
}

/* Chunks until none is left; on a failed wait (a peer gone, the deadline past) it stops: the
 * chunk it claimed stays unsummed, and the all-reduce fails on every rank. */
static void claim_part(void *arg, int p, int parts)
{
    (void)parts;
    struct claim *k = arg;
    _Atomic uint64_t *ctr = ddp__shm_claim_counter(k->sh);
    k->done[p] = 0;
    k->err[p] = 0;
    for (uint64_t x; (x = claim_next(ctr, k->end)) < k->end; k->done[p]++)
        if ((k->err[p] = sum_chunk(k, x, &k->errj[p])) < 0)
            return;
}

/* The chunks claimed and summed, then the last step. */
static int run_claims(struct ddp__comm *c, struct claim *k, struct ddp__team *team)
{
    struct ddp__shm *sh = &c->shm;
    k->esz = ddp_dtype_size(k->dt);
    k->per = DDP__CLAIM_CHUNK / k->esz;
    uint64_t chunks = (k->count + k->per - 1) / k->per;
    /* The counter never goes back: every local rank counts the same chunks per all-reduce, so
     * each knows where this one's numbers start. */
    k->first = sh->claim_base;
    k->end = k->first + chunks;
    if (sh->n > 1) { /* alone on the node, the buffer is the sum already */
        if (team)
            ddp__team_run(team, claim_part, k);
        else
            claim_part(k, 0, 1);
        sh->claim_base = k->end;
        for (int p = 0; p < ddp__team_size(team); p++) {
            sh->claimed += k->done[p];
            if (k->err[p] < 0) {
                ddp__shm_wait_error(c, k->errj[p], k->err[p]);
                return k->err[p];
            }
        }
    }
    int e = ddp__shm_step(c, 2);
    if (e < 0)
        return e;
    sh->seq += 2;
    sh->direct_done++;
    sh->direct_shared += team != NULL;
    return 0;
}

int ddp__shm_claim_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                             enum ddp_redop op, struct ddp__team *team)
{
    struct claim k = {.c = c, .sh = &c->shm, .buf = buf, .count = count, .dt = dt, .op = op};
    return run_claims(c, &k, team);
}

/* Our table (see table()), in our arena so that peers read it in place, with ready of its
 * elements final; false where a piece lies elsewhere or there is no room for the table. */
static bool fill_table(struct ddp__shm *sh, const struct ddp_piece *pc, size_t npc, size_t esz,
                       size_t ready)
{
    size_t words = 2 * npc + 2;
    if (sh->ptab_cap < words) {
        if (sh->ptab)
            ddp__arena_free(sh->arena, sh->ptab);
        size_t cap = words < 512 ? 512 : words;
        sh->ptab = ddp__arena_alloc(sh->arena, cap * sizeof(uint64_t));
        sh->ptab_cap = sh->ptab ? cap : 0;
        if (!sh->ptab)
            return false;
    }
    uint64_t at = 0;
    for (size_t q = 0; q < npc; q++) {
        sh->ptab[2 * q] = at;
        sh->ptab[2 * q + 1] = ddp__arena_offset(sh->arena, pc[q].data, pc[q].count * esz);
        if (sh->ptab[2 * q + 1] == DDP__NOT_IN_ARENA)
            return false;
        at += pc[q].count;
    }
    sh->ptab[2 * npc] = at;
    sh->ptab[2 * npc + 1] = ready; /* published by the step that follows */
    return true;
}

/* Our table in our control line: where peers find it (or that they cannot). */
static void show_table(struct ddp__shm *sh, size_t npc, bool reg)
{
    struct ddp__shm_ctrl *mine = ddp__shm_ctrl(sh, sh->me);
    mine->addr = npc;
    mine->arena_off = reg ? ddp__arena_offset(sh->arena, sh->ptab, sh->ptab_cap * sizeof(uint64_t))
                          : DDP__NOT_IN_ARENA;
}

int ddp__shm_claim_pieces(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc, size_t count,
                          enum ddp_dtype dt, enum ddp_redop op)
{
    struct ddp__shm *sh = &c->shm;
    int e;
    if (sh->n > DDP__CLAIM_MAX_LOCAL)
        return 1; /* alike on every local rank, before any step */
    if (sh->post.on && sh->post.pieces) {
        /* posted (these pieces: worker/coll_cpu.c): the table and first step are out; the
         * caller's data is all final now, where pc says */
        if ((e = ddp__shm_claim_ready(c, pc, count)) < 0) {
            snprintf(c->err, sizeof(c->err),
                     "a piece of the posted all-reduce was made final outside registered memory "
                     "(ddp_pg_mem_alloc)");
            return e; /* peers may have summed what was ready in place: no way back */
        }
        sh->post.on = false;
        e = ddp__shm_step_wait(c, 1);
    } else {
        show_table(sh, npc, npc > 0 && fill_table(sh, pc, npc, ddp_dtype_size(dt), count));
        e = ddp__shm_step(c, 1);
    }
    /* every rank decides the same from the same lines: every piece of every rank registered */
    for (int j = 0; e == 0 && j < sh->n; j++)
        if (ddp__shm_ctrl(sh, j)->arena_off == DDP__NOT_IN_ARENA || !sh->peer_arena[j])
            e = 1;
    if (e != 0) {
        sh->seq += e == 1;
        return e;
    }
    struct claim k = {.c = c, .sh = sh, .count = count, .dt = dt, .op = op};
    return run_claims(c, &k, ddp__shm_team(sh, count * ddp_dtype_size(dt)));
}

int ddp__shm_claim_post(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc, size_t count,
                        enum ddp_dtype dt, enum ddp_redop op, size_t ready)
{
    struct ddp__shm *sh = &c->shm;
    if (sh->post.pcs_cap < npc) {
        struct ddp_piece *p = realloc(sh->post.pcs, npc * sizeof(*p));
        if (!p)
            return DDP_ENOMEM;
        sh->post.pcs = p;
        sh->post.pcs_cap = npc;
    }
    /* A piece not registered: posted all the same (the post is the same on every rank), and
     * after the first step every rank goes to the slots. */
    bool reg = fill_table(sh, pc, npc, ddp_dtype_size(dt), ready < count ? ready : count);
    show_table(sh, npc, reg);
    ddp__shm_step_publish(c, 1);
    memcpy(sh->post.pcs, pc, npc * sizeof(*pc));
    sh->post.user = pc;
    sh->post.npc = npc;
    size_t q = 0, at = 0; /* the pieces final already: those that start below ready */
    for (; q < npc && (at < ready || ready >= count); q++)
        at += pc[q].count;
    sh->post.qfinal = q;
    sh->post.qat = at;
    sh->post.pieces = true;
    sh->post.ready = reg ? &sh->ptab[2 * npc + 1] : &sh->post.unread;
    sh->post.on = true;
    sh->post.buf = NULL;
    sh->post.count = count;
    sh->post.dt = dt;
    sh->post.op = op;
    return 0;
}

int ddp__shm_claim_ready(struct ddp__comm *c, const struct ddp_piece *pc, size_t ready)
{
    struct ddp__shm *sh = &c->shm;
    size_t q = sh->post.qfinal, at = sh->post.qat, esz = ddp_dtype_size(sh->post.dt);
    bool reg = sh->post.ready != &sh->post.unread, all = ready >= sh->post.count;
    /* the pieces that start below ready (all of them once all is final): where they are now,
     * in our table before peers may read them */
    for (; q < sh->post.npc && (at < ready || all); at += pc[q].count, q++) {
        if (pc[q].count != sh->post.pcs[q].count)
            return DDP_EINVAL;
        if (reg) { /* else every rank goes to the slots: nothing is read before all call */
            uint64_t off = ddp__arena_offset(sh->arena, pc[q].data, pc[q].count * esz);
            if (off == DDP__NOT_IN_ARENA)
                return DDP_EINVAL;
            sh->ptab[2 * q + 1] = off;
        }
        sh->post.pcs[q] = pc[q];
    }
    sh->post.qfinal = q;
    sh->post.qat = at;
    __atomic_store_n(sh->post.ready, (uint64_t)(all ? sh->post.count : ready), __ATOMIC_RELEASE);
    return 0;
}
