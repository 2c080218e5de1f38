/*
 * The single-copy all-reduce of one node's ranks, for large buffers: nothing goes through the
 * node's segment. Each local rank publishes where its buffer is; each reduces its shard of the
 * buffer across all ranks' buffers read in place (in local rank order, so every element is
 * reduced in the same order as by the shared-memory slots) and writes it into its own buffer;
 * then each copies the other shards straight out of their owners' buffers. A peer's buffer is
 * read through its arena when it was allocated with ddp_pg_mem_alloc (every local rank maps
 * every arena: a plain load), else with cross-memory attach (process_vm_readv: one copy by
 * the kernel), so each byte crosses between processes once where the slots copy it in and out.
 *
 *   step 1   every buffer published: all readable?  (else every rank returns 1 alike)
 *   then, block by block (direct_block bytes; across nodes the whole buffer is one block):
 *     reduce our shard of the block, chunk by chunk: in place in our buffer on local ranks 0
 *            and 1, in a cache-sized accumulator on the others (reduce_shard); across nodes,
 *            the shard is then all-reduced on our own TCP ring (ddp__shm_shard_done)
 *     step   every shard of the block final
 *     copy   the block's other shards, from their owners' buffers into ours (the next block's
 *            reduce needs no step before it: it reads and writes other bytes)
 *   last step: nobody reads our buffer any more, the caller may reuse it
 * On one node with every buffer registered, the reduction and the copies of each block are
 * shared out over the rank's helper threads (DDP_PG_SHM_THREADS).
 */
#include "worker/coll.h"
#include "common/err.h"
#include "worker/team.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "common/banned.h"

#define CHUNK ((size_t)64 << 10) /* bytes reduced at a time: the accumulator stays in cache */

/* Reads len bytes at peer j's address addr into dst (cross-memory attach). */
static int cma_read(struct ddp__comm *c, int j, void *dst, uint64_t addr, size_t len)
{
    struct ddp__shm *sh = &c->shm;
    sh->cma_reads++;
    while (len) {
        struct iovec l = {.iov_base = dst, .iov_len = len};
        struct iovec r = {.iov_base = (void *)(uintptr_t)addr, .iov_len = len};
        ssize_t n = process_vm_readv(sh->pid[j], &l, 1, &r, 1, 0);
        if (n <= 0) {
            int err = n < 0 ? errno : 0; /* before snprintf, which may change errno */
            if (err == EINTR)
                continue;
            struct ddp__peer *p = &c->peers[sh->grank[j]];
            if (!c->err[0])
                snprintf(c->err, sizeof(c->err),
                         "cannot read the buffer of peer rank %d (%s) during %s: %s", p->rank,
                         p->host, c->opname,
                         err == ESRCH ? "its process is gone"
                         : err        ? strerror(err)
                                      : "nothing read");
            return err == ESRCH ? DDP_ECLOSED : DDP_ESYS;
        }
        dst = (char *)dst + n;
        addr += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

/* Where peer j's buffer's byte at offset off can be read in place, or NULL (CMA needed). */
static const char *peer_mem(struct ddp__shm *sh, int j, const struct ddp__shm_ctrl *l, size_t off)
{
    if (l->arena_off == DDP__NOT_IN_ARENA || !sh->peer_arena || !sh->peer_arena[j])
        return NULL;
    return (const char *)sh->peer_arena[j] + l->arena_off + off;
}

/* Local rank j's bytes [o, o + m) of the buffer: ours or a registered peer's where they lie,
 * else copied into spare by cross-memory attach. */
static int chunk_of(struct ddp__comm *c, int j, char *buf, size_t o, size_t m, char *spare,
                    const char **src)
{
    struct ddp__shm *sh = &c->shm;
    const struct ddp__shm_ctrl *l = ddp__shm_ctrl(sh, j);
    *src = j == sh->me ? buf + o : peer_mem(sh, j, l, o);
    if (*src)
        return 0;
    *src = spare;
    return cma_read(c, j, spare, l->addr + o, m);
}

/*
 * Our shard [b0, b0 + len) (bytes), reduced over every local rank's buffer in rank order,
 * CHUNK bytes at a time. The first pass combines local ranks 0 and 1 into the output; local
 * ranks 0 and 1, whose own elements that pass reads before it writes them, reduce in place in
 * their buffer (as the slots do: worker/shm.c's own_in_place); a later rank reduces into an
 * accumulator in scratch (2 * CHUNK + 2 * DDP__PAGE bytes), half a page from the shard modulo
 * the page size (ddp__away_from: the peers' buffers are usually at our buffer's offset within
 * a page), and copies it out. A peer read with cross-memory attach is copied half a page from
 * the accumulator first (local rank 0's, as the left operand, into the accumulator itself).
 * With avg, the pass that adds the last rank's elements divides by the number of ranks: the
 * same bits as the sum divided after it (worker/reduce.c), one pass over the shard fewer.
 */
static int reduce_shard(struct ddp__comm *c, char *buf, size_t b0, size_t len, enum ddp_dtype dt,
                        enum ddp_redop op, bool avg, char *scratch)
{
    struct ddp__shm *sh = &c->shm;
    size_t esz = ddp_dtype_size(dt);
    char *acc = ddp__away_from(scratch, buf + b0), *tmp = acc + CHUNK + DDP__PAGE / 2;
    bool in_place = sh->me < 2;
    int e;
    if (sh->n == 1) /* alone on the node: the shard is the node's sum already */
        return 0;
    for (size_t o = b0; o < b0 + len; o += CHUNK) {
        size_t m = b0 + len - o < CHUNK ? b0 + len - o : CHUNK, k = m / esz;
        char *out = in_place ? buf + o : acc;
        const char *a, *b;
        if ((e = chunk_of(c, 0, buf, o, m, acc, &a)) < 0 ||
            (e = chunk_of(c, 1, buf, o, m, tmp, &b)) < 0)
            return e;
        bool last = avg && sh->n == 2;
        if (a == out) /* rank 0's elements lie where the output goes */
            last ? ddp__reduce_avg(out, b, k, dt, sh->n) : ddp__reduce(out, b, k, dt, op);
        else if (b == out) /* rank 1's (ours) do: in place on the right */
            last ? ddp__reduce_avg_rev(out, a, k, dt, sh->n) : ddp__reduce_rev(out, a, k, dt, op);
        else
            last ? ddp__reduce_avg_to(out, a, b, k, dt, sh->n)
                 : ddp__reduce_to(out, a, b, k, dt, op);
        for (int j = 2; j < sh->n; j++) {
            if ((e = chunk_of(c, j, buf, o, m, tmp, &b)) < 0)
                return e;
            if (avg && j == sh->n - 1)
                ddp__reduce_avg(out, b, k, dt, sh->n);
            else
                ddp__reduce(out, b, k, dt, op);
        }
        if (out != buf + o)
            memcpy(buf + o, out, m);
    }
    return 0;
}

/* Scratch memory of one part: reduce_shard's accumulator and its copy of a peer's chunk. */
#define PART_SCRATCH (2 * CHUNK + 2 * DDP__PAGE)

/*
 * One block's two steps, each in parts where the rank has helper threads (worker/team.h):
 * every part reduces, or copies out, its own range of elements with the same arithmetic in
 * the same order, so the bits do not depend on the number of parts. Helpers only where every
 * buffer is registered: cross-memory attach, whose failure names the peer in the group's one
 * error message, runs on the collective's own thread alone.
 */
struct block {
    struct ddp__comm *c;
    char *buf;
    size_t esz, done, m; /* the block: elements [done, done + m) */
    enum ddp_dtype dt;
    enum ddp_redop op;
    bool avg;
    int err[DDP__TEAM_MAX]; /* each part's result */
};

/* Part p of n of local rank j's shard of the block: elements [*a, *b), split at cache lines. */
static void shard_part(const struct block *k, int j, int p, int n, size_t *a, size_t *b)
{
    size_t nl = (size_t)k->c->shm.n;
    ddp__team_split(k->done + k->m * (size_t)j / nl, k->done + k->m * (size_t)(j + 1) / nl, p, n,
                    k->esz, a, b);
}

static void reduce_part(void *arg, int p, int n)
{
    struct block *k = arg;
    size_t a, b;
    shard_part(k, k->c->shm.me, p, n, &a, &b);
    k->err[p] = b > a ? reduce_shard(k->c, k->buf, a * k->esz, (b - a) * k->esz, k->dt, k->op,
                                     k->avg, (char *)k->c->scratch + (size_t)p * PART_SCRATCH)
                      : 0;
}

/* The block's other shards, from their owners' buffers into ours. */
static void copy_part(void *arg, int p, int n)
{
    struct block *k = arg;
    struct ddp__shm *sh = &k->c->shm;
    k->err[p] = 0;
    for (int j = 0; j < sh->n && !k->err[p]; j++) {
        size_t a, b;
        shard_part(k, j, p, n, &a, &b);
        if (j == sh->me || b == a)
            continue;
        const struct ddp__shm_ctrl *l = ddp__shm_ctrl(sh, j);
        const char *src = peer_mem(sh, j, l, a * k->esz);
        char *dst = k->buf + a * k->esz;
        if (src)
            memcpy(dst, src, (b - a) * k->esz);
        else
            k->err[p] = cma_read(k->c, j, dst, l->addr + a * k->esz, (b - a) * k->esz);
    }
}

/* fn over every part, on the team where there is one; the first part's error, else 0. */
static int in_parts(struct ddp__team *t, ddp__team_fn fn, struct block *k)
{
    if (t)
        ddp__team_run(t, fn, k);
    else
        fn(k, 0, 1);
    for (int p = 0; p < ddp__team_size(t); p++)
        if (k->err[p] < 0)
            return k->err[p];
    return 0;
}

void ddp__shm_direct_post(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                          enum ddp_redop op)
{
    struct ddp__shm *sh = &c->shm;
    struct ddp__shm_ctrl *mine = ddp__shm_ctrl(sh, sh->me);
    mine->addr = (uint64_t)(uintptr_t)buf;
    mine->arena_off = ddp__arena_offset(sh->arena, buf, count * ddp_dtype_size(dt));
    ddp__shm_step_publish(c, 1);
    sh->post.on = true;
    sh->post.pieces = false;
    sh->post.buf = buf;
    sh->post.count = count;
    sh->post.dt = dt;
    sh->post.op = op;
}

int ddp__shm_direct_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                              enum ddp_redop op)
{
    struct ddp__shm *sh = &c->shm;
    int n = sh->n, me = sh->me, e;
    size_t esz = ddp_dtype_size(dt);
    if (sh->post.on && sh->post.buf == buf && sh->post.count == count && sh->post.dt == dt &&
        sh->post.op == op) {
        sh->post.on = false; /* the first step is out already */
        e = ddp__shm_step_wait(c, 1);
    } else {
        struct ddp__shm_ctrl *mine = ddp__shm_ctrl(sh, me);
        mine->addr = (uint64_t)(uintptr_t)buf;
        mine->arena_off = ddp__arena_offset(sh->arena, buf, count * esz);
        e = ddp__shm_step(c, 1);
    }
    if (e < 0)
        return e;
    /* Every rank decides the same from the same lines: in place only if every buffer can be
     * read (its arena is mapped here, or cross-memory attach works on this node). */
    bool ok = true, registered = true;
    for (int j = 0; j < n; j++) { /* ours too: the others read it */
        bool reg = peer_mem(sh, j, ddp__shm_ctrl(sh, j), 0) != NULL;
        ok = ok && (sh->cma || reg);
        registered = registered && reg;
    }
    if (!ok) {
        sh->seq += 1;
        return 1;
    }
    struct ddp__team *team = registered && !c->cross ? ddp__shm_team(sh, count * esz) : NULL;
    if (registered && !c->cross && !sh->claim_off && n <= DDP__CLAIM_MAX_LOCAL)
        return ddp__shm_claim_allreduce(c, buf, count, dt, op, team);
    size_t scratch = (size_t)ddp__team_size(team) * PART_SCRATCH;
    if (c->scratch_len < scratch) {
        void *s = realloc(c->scratch, scratch);
        if (!s)
            return DDP_ENOMEM; /* a peer waits out its deadline; not expected */
        c->scratch = s;
        c->scratch_len = scratch;
    }
    /* One node: an average divides in the pass that adds the last rank's elements (the same
     * bits as the sum divided after it); across nodes, once the rings have summed the shard. */
    struct block k = {
        .c = c, .buf = buf, .esz = esz, .dt = dt, .op = op, .avg = op == DDP_AVG && !c->cross};
    /* Blocks of the buffer, one step each (direct_block bytes: by default 2 MiB per local
     * rank, worker/pg_direct.c). Across nodes one block, so each ring moves one shard. */
    size_t per_block = c->cross ? count : (sh->direct_block / esz / (size_t)n) * (size_t)n;
    if (per_block == 0)
        per_block = count;
    uint64_t step = 1;
    for (k.done = 0; k.done < count; k.done += per_block, step++) {
        k.m = count - k.done < per_block ? count - k.done : per_block;
        if ((e = in_parts(team, reduce_part, &k)) < 0)
            return e;
        size_t s0 = k.done + k.m * (size_t)me / (size_t)n,
               s1 = k.done + k.m * (size_t)(me + 1) / (size_t)n;
        if (s1 > s0 &&
            (e = ddp__shm_shard_done(c, k.buf + s0 * esz, s1 - s0, dt, k.avg ? DDP_SUM : op)) < 0)
            return e;
        if ((e = ddp__shm_step(c, step + 1)) < 0)
            return e;
        if ((e = in_parts(team, copy_part, &k)) < 0)
            return e;
    }
    if ((e = ddp__shm_step(c, step + 1)) < 0)
        return e;
    sh->seq += step + 1;
    sh->direct_done++;
    sh->direct_shared += team != NULL;
    return 0;
}
