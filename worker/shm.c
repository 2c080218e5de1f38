/*
 * Shared-memory all-reduce for the ranks of one node: a POSIX shared-memory
 * segment holds one control line and one slot per local rank. Each round
 * moves up to a slot's worth of the buffer: every rank copies its part into
 * its slot; each rank reduces one shard across all slots (a fixed order, so
 * every rank ends with identical bits) and publishes it in its own slot;
 * every rank copies the other shards out. Ranks meet at per-rank sequence
 * counters (spin, then yield, then sleep on a futex: see wait_all); while
 * waiting they look at their peers' TCP sockets, so a dead peer is still
 * reported by rank and host instead of a timeout. Broadcast, all-gather,
 * reduce-scatter and barrier of a one-node group use the same slots.
 *
 * Across several nodes this is the hierarchical all-reduce of PowerAI DDL: between the local
 * reduction of a shard and its publication, each local rank all-reduces its shard with the
 * same shard of the other nodes over TCP, on a ring of its own (one ring per local rank, all
 * running at once). So the node's reduce-scatter, the cross-node all-reduce and the node's
 * all-gather are the three phases of every round.
 */
#include "worker/coll.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "worker/team.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* Bytes of a shard reduced, then copied into our slot, at a time on one node (L1-sized). */
#define PUBLISH_BYTES ((size_t)16 << 10)

/*
 * Rank j's slot in the current round. Rounds alternate between two sets of slots, so a round
 * needs no closing barrier: a rank writes set A again only in the round after next, after it
 * has passed that next round's first barrier, which every rank publishes only once it has
 * finished reading this round's slots.
 */
static char *slot(struct ddp__shm *sh, int j)
{
    size_t set = (size_t)(sh->round & 1);
    return (char *)sh->base + sh->slots_off + (set * (size_t)sh->n + (size_t)j) * sh->slot_bytes;
}

/*
 * out = the slots' elements [s0, s0 + k) combined in slot order, (..((slot 0 op slot 1) op
 * slot 2)..), and with avg the last step divided by n: the bits of copying slot 0 out and
 * reducing the others into it, in fewer passes over the shard. With own, this rank's elements
 * are read there instead of from its slot (which then need not hold them: nobody else reads a
 * rank's own shard of its slot). own may be out itself only on local ranks 0 and 1, whose
 * elements the first pass reads before it writes out (own_in_place).
 */
static void reduce_slots(struct ddp__shm *sh, void *out, const void *own, size_t s0, size_t k,
                         enum ddp_dtype dt, enum ddp_redop op, bool avg)
{
    size_t esz = ddp_dtype_size(dt), off = s0 * esz;
    int n = sh->n;
    const void *in[2] = {NULL, NULL};
    for (int j = 0; j < 2 && j < n; j++)
        in[j] = own && j == sh->me ? own : slot(sh, j) + off;
    if (n == 1) { /* an average over one rank is the value itself */
        if (in[0] != out)
            memcpy(out, in[0], k * esz);
        return;
    }
    bool last = avg && n == 2;
    if (in[0] == out) /* out op slot 1, in place */
        last ? ddp__reduce_avg(out, in[1], k, dt, n) : ddp__reduce(out, in[1], k, dt, op);
    else if (in[1] == out) /* slot 0 op out, in place on the right */
        last ? ddp__reduce_avg_rev(out, in[0], k, dt, n) : ddp__reduce_rev(out, in[0], k, dt, op);
    else
        last ? ddp__reduce_avg_to(out, in[0], in[1], k, dt, n)
             : ddp__reduce_to(out, in[0], in[1], k, dt, op);
    for (int j = 2; j < n; j++) {
        const void *x = own && j == sh->me ? own : slot(sh, j) + off;
        if (avg && j == n - 1)
            ddp__reduce_avg(out, x, k, dt, n);
        else
            ddp__reduce(out, x, k, dt, op);
    }
}

/*
 * Whether this rank's own elements of its all-reduce shard can stay in its buffer (where the
 * result goes) and the result be written over them as it is reduced: the reduction's first
 * pass reads them there, as the left operand (local rank 0) or the right (local rank 1),
 * before it writes the result over them. A later rank's elements are read after partial
 * results, so on one node such a rank reduces into an L1-sized accumulator and copies it out
 * (reduce_publish); across nodes its elements still go through its slot.
 */
static bool own_in_place(const struct ddp__shm *sh)
{
    return sh->me < 2;
}

/*
 * Elements per all-reduce round. A round's working set is the user's chunk, this rank's slot
 * and the peers' shards of theirs: with 1 MiB slots, over the EPYC's 512 KiB L2 per core.
 * While the message still sits in the caches that costs nothing and fewer rounds (barriers) win;
 * once it streams from memory, half-slot rounds keep most of each round in the L2, so the
 * output is mostly written into lines just read instead of missing again. Measured on a 2-core EPYC
 * VM (BENCHMARKS.md, "Round size"): half rounds lose at 4 MiB (0.94x), break even at 8 (0.97-1.14x
 * in three runs) and win from 16 (1.24x at 16, 1.08-1.10x at 64); quarter rounds lose. A
 * message of 16 MiB or more goes in rounds of at most STREAM_ROUND whatever the slots (as with
 * 1 MiB slots): on a 2-vCPU Intel Xeon 4 MiB slots' whole rounds ran 0.95x 512 KiB ones at
 * 38 MiB, where they won below 16 MiB (the fifteenth run). (With helper threads, 4 MiB slots'
 * rounds ran 1.11-1.15x at 16 and 64 MiB on 16 cores; but every local rank must cut the same
 * rounds, and whether a rank has helpers is its own: its CPUs, a thread that failed to start.)
 * One node only: across nodes the round's shard is what each TCP ring carries, tuned with the
 * slots as they are.
 */
#define STREAM_BYTES ((size_t)16 << 20)
#define STREAM_ROUND ((size_t)512 << 10)
static size_t round_elems(const struct ddp__comm *c, size_t count, size_t esz)
{
    size_t bytes = c->shm.slot_bytes;
    if (!c->cross && count >= 16 * bytes / esz)
        bytes /= 2;
    if (!c->cross && count >= STREAM_BYTES / esz && bytes > STREAM_ROUND)
        bytes = STREAM_ROUND;
    return bytes / esz;
}

int ddp__shm_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                       enum ddp_redop op)
{
    struct ddp_piece one = {.data = buf, .count = count};
    return ddp__shm_allreduce_pieces(c, &one, 1, count, dt, op);
}

/*
 * A one-node round's three steps, each in parts where the rank has helper threads (worker/
 * team.h): every part moves or reduces its own range of elements, with its own cursor over
 * the pieces, so each element goes through the same arithmetic in the same order whatever
 * the number of parts: the bits do not depend on it.
 */
struct round {
    struct ddp__shm *sh;
    struct ddp__pieces *cur; /* a cursor per part */
    size_t esz, done, m, s0, s1;
    enum ddp_dtype dt;
    enum ddp_redop op;
};

/* Step 1: copy in, all but our shard (read where it lies). */
static void copy_in(void *arg, int p, int n)
{
    struct round *r = arg;
    char *mine = slot(r->sh, r->sh->me);
    size_t a, b;
    ddp__team_split(0, r->s0, p, n, r->esz, &a, &b);
    ddp__pieces_read(&r->cur[p], r->done + a, b - a, mine + a * r->esz);
    ddp__team_split(r->s1, r->m, p, n, r->esz, &a, &b);
    ddp__pieces_read(&r->cur[p], r->done + a, b - a, mine + a * r->esz);
}

/* Step 2: our shard reduced across all slots, in slot order, our own elements read where they
 * lie in the buffer (an average divides in the pass that adds the last slot), 16 KiB or up to a
 * piece's end at a time, and published in our slot while that part is still in the L1 (the
 * others read other shards of our slot meanwhile). Local ranks 0 and 1 reduce in place; a later
 * rank into an accumulator (own_in_place), placed half a page from the buffer (4K aliasing). */
static void reduce_publish(void *arg, int p, int n)
{
    struct round *r = arg;
    size_t esz = r->esz, a, b;
    char *mine = slot(r->sh, r->sh->me);
    bool in_place = own_in_place(r->sh);
    _Alignas(64) char acc_mem[PUBLISH_BYTES + DDP__PAGE];
    ddp__team_split(r->s0, r->s1, p, n, r->esz, &a, &b);
    for (size_t k0 = a, k; k0 < b; k0 += k) {
        k = b - k0 < PUBLISH_BYTES / esz ? b - k0 : PUBLISH_BYTES / esz;
        char *o = ddp__pieces_run(&r->cur[p], r->done + k0, &k);
        char *acc = in_place ? o : ddp__away_from(acc_mem, o);
        reduce_slots(r->sh, acc, o, k0, k, r->dt, r->op, r->op == DDP_AVG);
        if (!in_place)
            memcpy(o, acc, k * esz);
        memcpy(mine + k0 * esz, acc, k * esz);
    }
}

/* Step 3: the other shards copied out of their owners' slots. */
static void copy_out(void *arg, int p, int n)
{
    struct round *r = arg;
    struct ddp__shm *sh = r->sh;
    for (int j = 0; j < sh->n; j++) {
        if (j == sh->me)
            continue;
        size_t j0 = r->m * (size_t)j / (size_t)sh->n, j1 = r->m * (size_t)(j + 1) / (size_t)sh->n;
        size_t a, b;
        ddp__team_split(j0, j1, p, n, r->esz, &a, &b);
        ddp__pieces_write(&r->cur[p], r->done + a, b - a, slot(sh, j) + a * r->esz);
    }
}

static void in_parts(struct ddp__team *t, ddp__team_fn fn, struct round *r)
{
    if (t)
        ddp__team_run(t, fn, r);
    else
        fn(r, 0, 1);
}

struct ddp__team *ddp__shm_team(struct ddp__shm *sh, size_t bytes)
{
    if (sh->threads < 2 || bytes < DDP__TEAM_MIN_BYTES)
        return NULL;
    if (!sh->team) {
        if (!(sh->team = ddp__team_new(sh->threads))) {
            DDP_WARN(PG,
                     "cannot start %d helper threads for the shared-memory "
                     "all-reduce; it runs on one thread",
                     sh->threads - 1);
            sh->threads = 1;
        } else {
            DDP_INFO(PG, "shared-memory all-reduces from %zu KiB on %d threads",
                     (size_t)DDP__TEAM_MIN_BYTES >> 10, sh->threads);
        }
    }
    return sh->team;
}

/*
 * The buffer may be in pieces (a reducer's gradients where they lie): copied into the slot
 * and out of the others' slots piece by piece, and a shard reduced in place where one piece
 * holds it, else in scratch memory and then written out, with the same arithmetic.
 */
int ddp__shm_allreduce_pieces(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc,
                              size_t count, enum ddp_dtype dt, enum ddp_redop op)
{
    struct ddp__shm *sh = &c->shm;
    int n = sh->n, me = sh->me, e;
    size_t esz = ddp_dtype_size(dt);
    size_t per_round = round_elems(c, count, esz);
    struct ddp__team *team = c->cross ? NULL : ddp__shm_team(sh, count * esz);
    struct ddp__pieces cur[DDP__TEAM_MAX], *v = &cur[0];
    for (int p = 0; p < ddp__team_size(team); p++)
        ddp__pieces_init(&cur[p], pc, npc, esz);
    struct round r = {.sh = sh, .cur = cur, .esz = esz, .dt = dt, .op = op};
    /* Across nodes a shard that straddles pieces is gathered in scratch memory for its ring
     * (one node reduces it piece by piece where it lies). Failing here fails the group
     * (aborted: the other ranks see it at their next step). */
    size_t shard_max = (per_round + (size_t)n - 1) / (size_t)n * esz;
    if (npc > 1 && c->cross && c->scratch_len < shard_max) {
        void *p = realloc(c->scratch, shard_max);
        if (!p)
            return DDP_ENOMEM;
        c->scratch = p;
        c->scratch_len = shard_max;
    }
    for (size_t done = 0; done < count; done += per_round) {
        size_t m = count - done < per_round ? count - done : per_round;
        /* This rank's shard of the round: elements [s0, s1). */
        size_t s0 = m * (size_t)me / (size_t)n, s1 = m * (size_t)(me + 1) / (size_t)n;
        char *mine = slot(sh, me);
        if (!c->cross) {
            r.done = done;
            r.m = m;
            r.s0 = s0;
            r.s1 = s1;
            in_parts(team, copy_in, &r);
            if ((e = ddp__shm_step(c, 1)) < 0)
                return e;
            in_parts(team, reduce_publish, &r);
            if ((e = ddp__shm_step(c, 2)) < 0)
                return e;
            in_parts(team, copy_out, &r);
            sh->seq += 2;
            sh->round++;
            continue;
        }
        /* Across nodes. Phase 1: copy in (only the other ranks' shards where ours is read in
         * place, which needs it in one piece), moving forward through the pieces. */
        ddp__pieces_read(v, done, s0, mine);
        char *whole = s1 > s0 ? ddp__pieces_span(v, done + s0, s1 - s0) : NULL;
        bool own = own_in_place(sh) && whole;
        size_t from = own ? s1 : s0;
        ddp__pieces_read(v, done + from, m - from, mine + from * esz);
        if ((e = ddp__shm_step(c, 1)) < 0)
            return e;
        /* Phase 2: the node's sum of our shard all-reduced with the other nodes' on our ring,
         * then published in our slot. */
        if (s1 > s0) {
            char *out = whole ? whole : c->scratch;
            reduce_slots(sh, out, own ? out : NULL, s0, s1 - s0, dt, op, false);
            if ((e = ddp__shm_shard_done(c, out, s1 - s0, dt, op)) < 0)
                return e;
            memcpy(mine + s0 * esz, out, (s1 - s0) * esz);
            if (!whole)
                ddp__pieces_write(v, done + s0, s1 - s0, out);
        }
        if ((e = ddp__shm_step(c, 2)) < 0)
            return e;
        /* Phase 3: copy the other shards out. */
        for (int j = 0; j < n; j++) {
            if (j == me)
                continue;
            size_t j0 = m * (size_t)j / (size_t)n, j1 = m * (size_t)(j + 1) / (size_t)n;
            ddp__pieces_write(v, done + j0, j1 - j0, slot(sh, j) + j0 * esz);
        }
        sh->seq += 2;
        sh->round++;
    }
    return 0;
}

int ddp__shm_broadcast(struct ddp__comm *c, void *buf, size_t bytes, int root)
{
    struct ddp__shm *sh = &c->shm;
    int e, lroot = 0;
    char *b = buf;
    for (int j = 0; j < sh->n; j++)
        if (sh->grank[j] == root)
            lroot = j;
    root = lroot; /* from here on, a local rank */
    for (size_t done = 0; done < bytes; done += sh->slot_bytes) {
        size_t m = bytes - done < sh->slot_bytes ? bytes - done : sh->slot_bytes;
        if (sh->me == root)
            memcpy(slot(sh, root), b + done, m);
        if ((e = ddp__shm_step(c, 1)) < 0)
            return e;
        if (sh->me != root)
            memcpy(b + done, slot(sh, root), m);
        sh->seq += 1;
        sh->round++;
    }
    return 0;
}

int ddp__shm_allgather(struct ddp__comm *c, const void *send, void *recv, size_t bytes)
{
    struct ddp__shm *sh = &c->shm;
    int e;
    char *out = recv;
    for (size_t done = 0; done < bytes; done += sh->slot_bytes) {
        size_t m = bytes - done < sh->slot_bytes ? bytes - done : sh->slot_bytes;
        memcpy(slot(sh, sh->me), (const char *)send + done, m);
        if ((e = ddp__shm_step(c, 1)) < 0)
            return e;
        for (int j = 0; j < sh->n; j++) /* memmove: send may be our own block of recv */
            memmove(out + (size_t)sh->grank[j] * bytes + done, slot(sh, j), m);
        sh->seq += 1;
        sh->round++;
    }
    return 0;
}

int ddp__shm_reduce_scatter(struct ddp__comm *c, const void *send, void *recv, size_t count,
                            enum ddp_dtype dt, enum ddp_redop op)
{
    struct ddp__shm *sh = &c->shm;
    int n = sh->n, me = sh->me, e;
    size_t esz = ddp_dtype_size(dt);
    /* Each round moves m elements of every block: they sit side by side in each slot. */
    size_t per_round = sh->slot_bytes / esz / (size_t)n;
    if (per_round == 0)
        return DDP_EINVAL; /* slots smaller than one element per rank: setup prevents it */
    const char *s = send;
    char *out = recv;
    for (size_t done = 0; done < count; done += per_round) {
        size_t m = count - done < per_round ? count - done : per_round, len = m * esz;
        char *mine = slot(sh, me), *o = out + done * esz;
        /* Our own block is read where it is, unless the output overlaps it other than exactly
         * (in place on a rank past local rank 1: see own_in_place). */
        const char *own = s + ((size_t)c->rank * count + done) * esz;
        uintptr_t a = (uintptr_t)own, b = (uintptr_t)o;
        bool apart = a + len <= b || b + len <= a;
        if (!apart && !(own == o && own_in_place(sh)))
            own = NULL;
        for (int i = 0; i < n; i++)
            if (!own || i != c->rank)
                memcpy(mine + (size_t)i * len, s + ((size_t)i * count + done) * esz, len);
        if ((e = ddp__shm_step(c, 1)) < 0)
            return e;
        /* Block me, summed over the slots in slot order (the same order on every rank). */
        reduce_slots(sh, o, own, (size_t)c->rank * m, m, dt, op, op == DDP_AVG);
        sh->seq += 1;
        sh->round++;
    }
    return 0;
}
