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
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

#define CTRL_LINE 64
#define SPIN_YIELD_NS 1000000

size_t ddp__shm_segment_bytes(int nlocal, size_t slot_bytes)
{
    return (size_t)nlocal * CTRL_LINE + 2 * (size_t)nlocal * slot_bytes;
}

int ddp__shm_attach(struct ddp__shm *sh, void *base, int nlocal, int me, int *grank,
                    size_t slot_bytes)
{
    memset(sh, 0, sizeof(*sh));
    sh->base = base;
    sh->grank = grank;
    sh->len = ddp__shm_segment_bytes(nlocal, slot_bytes);
    sh->n = nlocal;
    sh->me = me;
    sh->slot_bytes = slot_bytes;
    sh->seq = 0;
    return 0;
}

void ddp__shm_detach(struct ddp__shm *sh)
{
    if (sh->base)
        munmap(sh->base, sh->len);
    sh->base = NULL;
    free(sh->grank);
    sh->grank = NULL;
}

/* Each local rank's control line: how far it got (the low 32 bits of its sequence number;
 * compared with wrap-around), and how many peers sleep on that word. */
struct ctrl_line {
    _Atomic uint32_t seq;
    _Atomic uint32_t sleepers;
};

static struct ctrl_line *ctrl(struct ddp__shm *sh, int j)
{
    return (struct ctrl_line *)((char *)sh->base + (size_t)j * CTRL_LINE);
}

/*
 * Rank j's slot in the current round. Rounds alternate between two sets of slots, so a round
 * needs no closing barrier: a rank writes set A again only in the round after next, after it
 * has passed that next round's first barrier, which every rank publishes only once it has
 * finished reading this round's slots.
 */
static char *slot(struct ddp__shm *sh, int j)
{
    size_t set = (size_t)(sh->round & 1);
    return (char *)sh->base + (size_t)sh->n * CTRL_LINE +
           (set * (size_t)sh->n + (size_t)j) * sh->slot_bytes;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static bool reached(struct ctrl_line *l, uint64_t target)
{
    uint32_t cur = atomic_load_explicit(&l->seq, memory_order_acquire);
    return (int32_t)(cur - (uint32_t)target) >= 0;
}

/* A peer whose TCP socket reads EOF has died: nothing else is in flight on it now. */
static bool peer_dead(const struct ddp__peer *p)
{
    char c;
    struct pollfd pf = {.fd = p->fd, .events = POLLIN};
    if (p->fd < 0 || poll(&pf, 1, 0) <= 0)
        return false;
    ssize_t n = recv(p->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

/*
 * Waits for every local rank to reach target: a short spin (the peer is usually a few
 * microseconds away), then sleeping on the peer's word with a futex, so that a waiting
 * communication thread gives its core to the computation running beside it (the reducer
 * overlaps the two) instead of burning it. Every 20 ms asleep it checks for a dead peer
 * and the deadline.
 */
static int wait_all(struct ddp__comm *c, uint64_t target)
{
    struct ddp__shm *sh = &c->shm;
    for (int j = 0; j < sh->n; j++) {
        struct ctrl_line *l = ctrl(sh, j);
        /* Spin briefly, then yield the core for up to a millisecond (a peer a round behind
         * is usually that close: its wake-up from a futex would cost more), then sleep. */
        int64_t t0 = 0;
        for (unsigned spins = 0; !reached(l, target); spins++) {
            if (spins < 256) {
                cpu_relax();
                continue;
            }
            if (!t0)
                t0 = ddp_now_ns();
            else if (ddp_now_ns() - t0 > SPIN_YIELD_NS)
                break;
            sched_yield();
        }
        while (!reached(l, target)) {
            uint32_t seen = atomic_load_explicit(&l->seq, memory_order_seq_cst);
            atomic_fetch_add_explicit(&l->sleepers, 1, memory_order_seq_cst);
            if (!reached(l, target)) {
                struct timespec ts = {0, 20 * 1000 * 1000};
                syscall(SYS_futex, &l->seq, FUTEX_WAIT, seen, &ts, NULL, 0);
            }
            atomic_fetch_sub_explicit(&l->sleepers, 1, memory_order_seq_cst);
            if (reached(l, target))
                break;
            struct ddp__peer *p = &c->peers[sh->grank[j]];
            if (peer_dead(p)) {
                if (!c->err[0])
                    snprintf(c->err, sizeof(c->err),
                             "connection closed by peer rank %d (%s) during %s", p->rank, p->host,
                             c->opname);
                return DDP_ECLOSED;
            }
            if (ddp_now_ms() > c->deadline_ms) {
                if (!c->err[0])
                    snprintf(c->err, sizeof(c->err),
                             "timed out waiting for peer rank %d (%s) during %s", p->rank, p->host,
                             c->opname);
                return DDP_ETIMEDOUT;
            }
        }
    }
    return 0;
}

static void publish(struct ddp__shm *sh, uint64_t v)
{
    struct ctrl_line *l = ctrl(sh, sh->me);
    atomic_store_explicit(&l->seq, (uint32_t)v, memory_order_seq_cst);
    /* Paired with the sleepers' increment-then-recheck: a sleeper either sees the new value
     * or is counted here and woken. */
    if (atomic_load_explicit(&l->sleepers, memory_order_seq_cst))
        syscall(SYS_futex, &l->seq, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* One step of a round: publish that this rank reached it, wait for every local rank. */
static int step(struct ddp__comm *c, uint64_t k)
{
    publish(&c->shm, c->shm.seq + k);
    return wait_all(c, c->shm.seq + k);
}

int ddp__shm_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                       enum ddp_redop op)
{
    struct ddp__shm *sh = &c->shm;
    int n = sh->n, me = sh->me, e;
    size_t esz = ddp_dtype_size(dt);
    size_t per_round = sh->slot_bytes / esz; /* elements per round */
    char *b = buf;
    for (size_t done = 0; done < count; done += per_round) {
        size_t m = count - done < per_round ? count - done : per_round;
        /* This rank's shard of the round: elements [s0, s1). */
        size_t s0 = m * (size_t)me / (size_t)n, s1 = m * (size_t)(me + 1) / (size_t)n;
        char *mine = slot(sh, me);
        /* Phase 1: copy in. */
        memcpy(mine, b + done * esz, m * esz);
        if ((e = step(c, 1)) < 0)
            return e;
        /* Phase 2: reduce the shard across all slots, in slot order, into our buffer, and publish
         * it in our slot (the others read other shards of our slot meanwhile). */
        if (s1 > s0) {
            char *out = b + (done + s0) * esz;
            memcpy(out, slot(sh, 0) + s0 * esz, (s1 - s0) * esz);
            for (int j = 1; j < n; j++)
                ddp__reduce(out, slot(sh, j) + s0 * esz, s1 - s0, dt, op);
            int total = n;
            if (c->cross) {
                /* Our shard's node sum, all-reduced with the same shard of every other node
                 * on our own ring, while the other local ranks run theirs. */
                struct ddp__comm *x = c->cross;
                x->deadline_ms = c->deadline_ms;
                x->opname = c->opname;
                e = ddp__tcp_allreduce(x, out, s1 - s0, dt, op == DDP_AVG ? DDP_SUM : op);
                if (e < 0) {
                    if (!c->err[0])
                        snprintf(c->err, sizeof(c->err), "%s", x->err);
                    return e;
                }
                total *= x->world;
            }
            if (op == DDP_AVG)
                ddp__scale_avg(out, s1 - s0, dt, total);
            memcpy(mine + s0 * esz, out, (s1 - s0) * esz);
        }
        if ((e = step(c, 2)) < 0)
            return e;
        /* Phase 3: copy the other shards out. */
        for (int j = 0; j < n; j++) {
            if (j == me)
                continue;
            size_t j0 = m * (size_t)j / (size_t)n, j1 = m * (size_t)(j + 1) / (size_t)n;
            memcpy(b + (done + j0) * esz, slot(sh, j) + j0 * esz, (j1 - j0) * esz);
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
        if ((e = step(c, 1)) < 0)
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
        if ((e = step(c, 1)) < 0)
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
        size_t m = count - done < per_round ? count - done : per_round;
        char *mine = slot(sh, me);
        for (int i = 0; i < n; i++)
            memcpy(mine + (size_t)i * m * esz, s + ((size_t)i * count + done) * esz, m * esz);
        if ((e = step(c, 1)) < 0)
            return e;
        /* Block me, summed over the slots in slot order (the same order on every rank). */
        char *o = out + done * esz;
        memcpy(o, slot(sh, 0) + (size_t)c->rank * m * esz, m * esz);
        for (int j = 1; j < n; j++)
            ddp__reduce(o, slot(sh, j) + (size_t)c->rank * m * esz, m, dt, op);
        if (op == DDP_AVG)
            ddp__scale_avg(o, m, dt, n);
        sh->seq += 1;
        sh->round++;
    }
    return 0;
}

int ddp__shm_barrier(struct ddp__comm *c)
{
    int e = step(c, 1);
    if (e == 0)
        c->shm.seq += 1;
    return e;
}
