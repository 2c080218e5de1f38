/*
 * The CPU collectives of a process group: each picks its transport. A group on one node goes
 * through the node's shared memory (worker/shm.c); across nodes, all-reduce is hierarchical
 * (shared memory inside each node, TCP rings between them, also in worker/shm.c) and the other
 * collectives run over TCP (worker/coll_tcp.c). This file is the only one that calls both.
 */
#include "worker/coll.h"
#include "common/err.h"

#include <stdlib.h>

#include "common/banned.h"

/* Shared memory carries everything when the group is one node. */
static bool shm_only(const struct ddp__comm *c)
{
    return c->shm.base && !c->cross;
}

static bool is_posted(const struct ddp__shm *sh, const void *buf, size_t count, enum ddp_dtype dt,
                      enum ddp_redop op)
{
    return !sh->post.pieces && sh->post.buf == buf && sh->post.count == count &&
           sh->post.dt == dt && sh->post.op == op;
}

/* The same pieces as posted: the same counts, and where those made final lie (the program's
 * array may be a copy: pieces_start copies it; the others may still move). */
static bool is_posted_pieces(const struct ddp__shm *sh, const struct ddp_piece *pc, size_t npc,
                             size_t count, enum ddp_dtype dt, enum ddp_redop op)
{
    if (!sh->post.pieces || sh->post.npc != npc || sh->post.count != count || sh->post.dt != dt ||
        sh->post.op != op)
        return false;
    for (size_t q = 0; q < npc; q++)
        if ((q < sh->post.qfinal && sh->post.pcs[q].data != pc[q].data) ||
            sh->post.pcs[q].count != pc[q].count)
            return false;
    return true;
}

/* Pieces of bytes on this group go in claimed chunks (worker/shm_claim.c) if every local rank's
 * are registered: the same on every rank (agreed at setup). */
static bool claims_pieces(const struct ddp__comm *c, uint64_t bytes)
{
    const struct ddp__shm *sh = &c->shm;
    return shm_only(c) && sh->arena && sh->direct_min && !sh->claim_off && bytes >= sh->direct_min;
}

/*
 * A posted all-reduce is the group's next collective: one called before it (not the program's
 * way: the reducer calls what it posted next) runs after it, so that every rank meets the same
 * sequence of steps (a posted all-reduce is one every rank posts), and the program's call of
 * the posted one then returns at once. 0, or the posted all-reduce's error.
 */
static int posted_first(struct ddp__comm *c, const void *buf, size_t count, enum ddp_dtype dt,
                        enum ddp_redop op)
{
    struct ddp__shm *sh = &c->shm;
    if (!sh->post.on || is_posted(sh, buf, count, dt, op))
        return 0;
    int e = sh->post.pieces
                ? ddp__cpu_allreduce_pieces(c, sh->post.user, sh->post.npc, sh->post.count,
                                            sh->post.dt, sh->post.op)
                : ddp__cpu_allreduce(c, sh->post.buf, sh->post.count, sh->post.dt, sh->post.op);
    sh->post.done = e == 0;
    return e;
}

int ddp__cpu_allreduce_post(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                            enum ddp_redop op)
{
    struct ddp__shm *sh = &c->shm;
    uint64_t bytes = (uint64_t)count * ddp_dtype_size(dt);
    if (c->world == 1 || count == 0 || !shm_only(c) || sh->post.on || !sh->direct_min ||
        bytes < sh->direct_min)
        return 1;
    sh->post.done = false;
    bool direct = sh->autod.on ? ddp__shm_auto_would_direct(sh, bytes) : sh->cma || sh->arena;
    if (!direct)
        return 1;
    ddp__shm_direct_post(c, buf, count, dt, op);
    return 0;
}

int ddp__cpu_allreduce_pieces_post(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc,
                                   size_t count, enum ddp_dtype dt, enum ddp_redop op, size_t ready)
{
    struct ddp__shm *sh = &c->shm;
    if (npc < 2 || sh->post.on || !ddp__cpu_can_post_pieces(c, count, dt))
        return 1; /* one piece: ddp_pg_allreduce_post */
    sh->post.done = false;
    return ddp__shm_claim_post(c, pc, npc, count, dt, op, ready);
}

bool ddp__cpu_can_post_pieces(const struct ddp__comm *c, size_t count, enum ddp_dtype dt)
{
    return c->world > 1 && count > 0 && c->shm.n <= DDP__CLAIM_MAX_LOCAL &&
           claims_pieces(c, (uint64_t)count * ddp_dtype_size(dt));
}

int ddp__cpu_post_ready(struct ddp__comm *c, size_t ready)
{
    struct ddp__shm *sh = &c->shm;
    if (!sh->post.on || !sh->post.pieces)
        return 1;
    return ddp__shm_claim_ready(c, sh->post.user, ready);
}

int ddp__cpu_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                       enum ddp_redop op)
{
    int e;
    if (c->world == 1 || count == 0)
        return 0; /* AVG over one rank is the value itself */
    if (c->shm.post.done && is_posted(&c->shm, buf, count, dt, op)) {
        c->shm.post.done = false; /* run already, before another collective */
        return 0;
    }
    if ((e = posted_first(c, buf, count, dt, op)) < 0)
        return e;
    if (c->shm.base) {
        /* Large buffers single-copy where every local buffer can be read in place; across
         * nodes only with cross-memory attach (on every node alike, so every node cuts the
         * buffer into the same shards for the rings). */
        const struct ddp__shm *sh = &c->shm;
        if (sh->autod.on && count * ddp_dtype_size(dt) >= sh->direct_min)
            return ddp__shm_auto_allreduce(c, buf, count, dt, op);
        if (sh->direct_min && count * ddp_dtype_size(dt) >= sh->direct_min &&
            (sh->cma || (sh->arena && !c->cross))) {
            int r = ddp__shm_direct_allreduce(c, buf, count, dt, op);
            if (r <= 0)
                return r;
        }
        return ddp__shm_allreduce(c, buf, count, dt, op);
    }
    return ddp__tcp_allreduce(c, buf, count, dt, op);
}

/*
 * A buffer in pieces: in place through the node's shared memory (one node, or the hierarchical
 * all-reduce across nodes); over TCP alone, in place by the ring (sent from the pieces, reduced
 * and received into them), or for recursive doubling's small sizes gathered into one staging
 * buffer and scattered back (on the communication thread, not in the program's).
 */
int ddp__cpu_allreduce_pieces(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc,
                              size_t count, enum ddp_dtype dt, enum ddp_redop op)
{
    int e;
    if (c->world == 1 || count == 0)
        return 0;
    struct ddp__shm *sh = &c->shm;
    bool mine = is_posted_pieces(sh, pc, npc, count, dt, op);
    if (mine && sh->post.done) {
        sh->post.done = false; /* run already, before another collective */
        return 0;
    }
    if (!mine && npc == 1)
        return ddp__cpu_allreduce(c, pc[0].data, count, dt, op);
    if (!mine && (e = posted_first(c, NULL, 0, dt, op)) < 0)
        return e;
    if (c->shm.base) {
        /* one node, pieces in registered memory (a program's gradients from ddp_pg_mem_alloc):
         * claimed chunks, single-copy; the same decision on every rank (agreed at setup) */
        if (claims_pieces(c, (uint64_t)count * ddp_dtype_size(dt)) &&
            (e = ddp__shm_claim_pieces(c, pc, npc, count, dt, op)) <= 0)
            return e;
        return ddp__shm_allreduce_pieces(c, pc, npc, count, dt, op);
    }
    /* over TCP: the ring sends from the pieces and reduces into them; recursive doubling's
     * small messages are gathered into one staging buffer and scattered back */
    if ((e = ddp__tcp_allreduce_pieces(c, pc, npc, count, dt, op)) <= 0)
        return e;
    size_t esz = ddp_dtype_size(dt);
    if (c->stage_len < count * esz) {
        void *p = realloc(c->stage, count * esz);
        if (!p)
            return DDP_ENOMEM;
        c->stage = p;
        c->stage_len = count * esz;
    }
    struct ddp__pieces v;
    ddp__pieces_init(&v, pc, npc, esz);
    ddp__pieces_read(&v, 0, count, c->stage);
    int r = ddp__tcp_allreduce(c, c->stage, count, dt, op);
    if (r == 0)
        ddp__pieces_write(&v, 0, count, c->stage);
    return r;
}

int ddp__cpu_broadcast(struct ddp__comm *c, void *buf, size_t bytes, int root)
{
    int e;
    if (c->world == 1 || bytes == 0)
        return 0;
    if ((e = posted_first(c, NULL, 0, DDP_F32, DDP_SUM)) < 0)
        return e;
    return shm_only(c) ? ddp__shm_broadcast(c, buf, bytes, root)
                       : ddp__tcp_broadcast(c, buf, bytes, root);
}

int ddp__cpu_allgather(struct ddp__comm *c, const void *send, void *recv, size_t bytes)
{
    int e = posted_first(c, NULL, 0, DDP_F32, DDP_SUM);
    if (e < 0)
        return e;
    if (shm_only(c) && bytes)
        return ddp__shm_allgather(c, send, recv, bytes);
    return ddp__tcp_allgather(c, send, recv, bytes);
}

int ddp__cpu_reduce_scatter(struct ddp__comm *c, const void *send, void *recv, size_t count,
                            enum ddp_dtype dt, enum ddp_redop op)
{
    int e;
    if (count == 0)
        return 0;
    if ((e = posted_first(c, NULL, 0, dt, op)) < 0)
        return e;
    return shm_only(c) ? ddp__shm_reduce_scatter(c, send, recv, count, dt, op)
                       : ddp__tcp_reduce_scatter(c, send, recv, count, dt, op);
}

int ddp__cpu_barrier(struct ddp__comm *c)
{
    int e = posted_first(c, NULL, 0, DDP_F32, DDP_SUM);
    if (e < 0)
        return e;
    return shm_only(c) ? ddp__shm_barrier(c) : ddp__tcp_barrier(c);
}
