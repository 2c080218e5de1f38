/*
 * The node segment's synchronisation, shared by the shared-memory collectives (worker/shm.c)
 * and the single-copy all-reduce (worker/shm_direct.c): each local rank's control line, and
 * the step where every local rank publishes how far it got and waits for the others. Ranks
 * meet at per-rank sequence counters (spin, then yield, then sleep on a futex: see wait_all);
 * while waiting they look at their peers' TCP sockets, so a dead peer is still reported by
 * rank and host instead of a timeout.
 */
#include "worker/coll.h"
#include "worker/team.h"
#include "common/cpus.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
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

#define SPIN_YIELD_NS 1000000

_Static_assert(sizeof(struct ddp__shm_ctrl) <= DDP__SHM_CTRL_LINE, "a control line holds it");

/*
 * The slots start SLOTS_PAGE_OFFSET bytes into a page, after the control lines: half a page
 * from where a large malloc'd buffer starts (glibc mmaps it, 16 bytes into a page), so that a
 * copy into or out of a slot does not load from page offsets it has just stored to (4K aliasing:
 * the CPU takes the load for a store's and waits). `allreduce_bench alias` on the 2-vCPU EPYC:
 * copies into memory at this offset ran 1.07-1.49x those at 128 (the offset before) from 64 KiB
 * to 4 MiB in three runs, out of it 0.96-1.37x; even from 16 MiB (BENCHMARKS.md).
 */
#define SLOTS_PAGE_OFFSET ((size_t)2048 + 16)
size_t ddp__shm_slots_offset(int nlocal)
{
    size_t lines = (size_t)nlocal * DDP__SHM_CTRL_LINE;
    if (lines <= SLOTS_PAGE_OFFSET)
        return SLOTS_PAGE_OFFSET;
    return (lines - SLOTS_PAGE_OFFSET + DDP__PAGE - 1) / DDP__PAGE * DDP__PAGE + SLOTS_PAGE_OFFSET;
}

size_t ddp__shm_segment_bytes(int nlocal, size_t slot_bytes)
{
    return ddp__shm_slots_offset(nlocal) + 2 * (size_t)nlocal * slot_bytes + DDP__SHM_CTRL_LINE;
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
    sh->slots_off = ddp__shm_slots_offset(nlocal);
    sh->seq = 0;
    sh->threads = ddp__shm_threads(nlocal);
    return 0;
}

void ddp__shm_detach(struct ddp__shm *sh)
{
    if (sh->base)
        munmap(sh->base, sh->len);
    sh->base = NULL;
    free(sh->grank);
    sh->grank = NULL;
    free(sh->pid);
    sh->pid = NULL;
    ddp__shm_unmap_arenas(sh);
    ddp__arena_destroy(sh->arena);
    sh->arena = NULL;
    ddp__team_free(sh->team);
    sh->team = NULL;
    free(sh->post.pcs);
    sh->post.pcs = NULL;
    sh->post.pcs_cap = 0;
}

void ddp__shm_unmap_arenas(struct ddp__shm *sh)
{
    if (sh->peer_arena)
        for (int j = 0; j < sh->n; j++)
            if (sh->peer_arena[j] && j != sh->me)
                munmap(sh->peer_arena[j], sh->arena_len);
    free(sh->peer_arena);
    sh->peer_arena = NULL;
    sh->arena_len = 0;
}

struct ddp__shm_ctrl *ddp__shm_ctrl(struct ddp__shm *sh, int j)
{
    return (struct ddp__shm_ctrl *)((char *)sh->base + (size_t)j * DDP__SHM_CTRL_LINE);
}

_Atomic uint64_t *ddp__shm_claim_counter(struct ddp__shm *sh)
{
    return (_Atomic uint64_t *)((char *)sh->base + sh->len - DDP__SHM_CTRL_LINE);
}

static bool reached(struct ddp__shm_ctrl *l, uint64_t target)
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

/* Local rank j dead (DDP_ECLOSED), or the collective's deadline past (DDP_ETIMEDOUT); else 0. */
static int peer_gone(struct ddp__comm *c, int j)
{
    if (peer_dead(&c->peers[c->shm.grank[j]]))
        return DDP_ECLOSED;
    return ddp_now_ms() > c->deadline_ms ? DDP_ETIMEDOUT : 0;
}

void ddp__shm_wait_error(struct ddp__comm *c, int j, int e)
{
    const struct ddp__peer *p = &c->peers[c->shm.grank[j]];
    if (!c->err[0])
        snprintf(c->err, sizeof(c->err), "%s peer rank %d (%s) during %s",
                 e == DDP_ECLOSED ? "connection closed by" : "timed out waiting for", p->rank,
                 p->host, c->opname);
}

/*
 * A local peer published its step from our CPU: the two take turns on it (each step a context
 * switch, 3-9 us for a 4 KiB all-reduce against 1 us apart) while another CPU may idle. The
 * kernel parts two such ranks only after a hundred milliseconds or more (both are always
 * runnable and cache-hot, so its idle balancing leaves them be); a program's first
 * collectives, and a benchmark's small sizes, run in that time. So the rank moves itself: to
 * the CPUs of its affinity mask on which no local rank published its last step, if any, and
 * back to its whole mask at once (the kernel moves a thread off a CPU its new mask lacks
 * before the call returns; restoring the mask leaves it where it is). A mask of one CPU, or
 * every CPU of it used by a local rank (more ranks than CPUs), is left alone; at most once
 * every DDP__SHM_PART_EVERY_NS, so a rank never fights the scheduler over a busy machine.
 */
bool ddp__shm_part(struct ddp__shm *sh, const struct ddp__shm_ctrl *peer)
{
    int64_t now = ddp_now_ns();
    if (sh->parted_ns && now - sh->parted_ns < DDP__SHM_PART_EVERY_NS)
        return false;
    /* still there, both of us (we may have been moved since our last step) */
    int here = sched_getcpu();
    if (here < 0 || here != atomic_load_explicit(&peer->cpu, memory_order_relaxed))
        return false;
    sh->parted_ns = now;
    cpu_set_t mask, to;
    if (sched_getaffinity(0, sizeof(mask), &mask) != 0 || CPU_COUNT(&mask) < 2)
        return false;
    to = mask;
    for (int j = 0; j < sh->n; j++) {
        int32_t cpu = atomic_load_explicit(&ddp__shm_ctrl(sh, j)->cpu, memory_order_relaxed);
        if (cpu >= 0 && cpu < CPU_SETSIZE)
            CPU_CLR(cpu, &to);
    }
    if (CPU_COUNT(&to) == 0)
        return false;
    /* Ours unknown before we move: the peer left behind, running the moment we go, must not
     * take us for still there and move too. */
    struct ddp__shm_ctrl *l = ddp__shm_ctrl(sh, sh->me);
    atomic_store_explicit(&l->cpu, -1, memory_order_seq_cst);
    if (sched_setaffinity(0, sizeof(to), &to) != 0) {
        atomic_store_explicit(&l->cpu, sh->cpu, memory_order_relaxed);
        return false;
    }
    if (sched_setaffinity(0, sizeof(mask), &mask) != 0) /* its cpuset changed meanwhile */
        DDP_WARN(PG,
                 "could not restore this thread's CPU affinity after moving it off a CPU "
                 "shared with a local peer: %s; it stays on %d of its %d CPUs",
                 strerror(errno), CPU_COUNT(&to), CPU_COUNT(&mask));
    sh->parts++;
    /* where we are now, for the peers' same test */
    sh->cpu = sched_getcpu();
    atomic_store_explicit(&l->cpu, sh->cpu, memory_order_relaxed);
    return true;
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
        struct ddp__shm_ctrl *l = ddp__shm_ctrl(sh, j);
        /* Spin briefly, then yield the core for up to a millisecond (a peer a round behind
         * is usually that close: its wake-up from a futex would cost more), then sleep. */
        int64_t t0 = 0;
        /* A peer on our CPU cannot arrive while we spin: yield to it at once. Two ranks of a
         * 2-core machine sharing one CPU (the scheduler puts them together after wake-ups,
         * for milliseconds) spent 256 pauses per step, 16 us per small all-reduce. */
        bool shared = j != sh->me && atomic_load_explicit(&l->cpu, memory_order_relaxed) == sh->cpu;
        if (shared && !reached(l, target) && ddp__shm_part(sh, l))
            shared = false;
        unsigned spin_max = shared ? 0 : 256;
        for (unsigned spins = 0; !reached(l, target); spins++) {
            if (spins < spin_max) {
                ddp_cpu_relax();
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
            int e = peer_gone(c, j);
            if (e < 0) {
                ddp__shm_wait_error(c, j, e);
                return e;
            }
        }
    }
    return 0;
}

/*
 * Waits until local rank j's word (in memory every local rank maps) reaches target, the peer
 * still computing what the word counts: a spin, then yielding for a millisecond, then naps of
 * 50 us (the word is not a futex's: a peer advances it from its backward, where a wake-up call
 * per bucket would cost it). Safe on helper threads: it writes no error message.
 */
int ddp__shm_wait_word(struct ddp__comm *c, int j, const uint64_t *word, uint64_t target)
{
    int64_t t0 = 0, checked = 0;
    for (unsigned spins = 0; __atomic_load_n(word, __ATOMIC_ACQUIRE) < target; spins++) {
        if (spins < 256) {
            ddp_cpu_relax();
            continue;
        }
        int64_t now = ddp_now_ns();
        if (!t0)
            t0 = checked = now;
        if (now - t0 < SPIN_YIELD_NS) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, 50 * 1000};
        nanosleep(&ts, NULL);
        if (now - checked > 20 * 1000 * 1000) {
            checked = now;
            int e = peer_gone(c, j);
            if (e < 0)
                return e;
        }
    }
    return 0;
}

static void publish(struct ddp__shm *sh, uint64_t v)
{
    struct ddp__shm_ctrl *l = ddp__shm_ctrl(sh, sh->me);
    sh->cpu = sched_getcpu();
    atomic_store_explicit(&l->cpu, sh->cpu, memory_order_relaxed);
    atomic_store_explicit(&l->seq, (uint32_t)v, memory_order_seq_cst);
    /* Paired with the sleepers' increment-then-recheck: a sleeper either sees the new value
     * or is counted here and woken. */
    if (atomic_load_explicit(&l->sleepers, memory_order_seq_cst))
        syscall(SYS_futex, &l->seq, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

int ddp__shm_step(struct ddp__comm *c, uint64_t k)
{
    publish(&c->shm, c->shm.seq + k);
    return wait_all(c, c->shm.seq + k);
}

void ddp__shm_step_publish(struct ddp__comm *c, uint64_t k)
{
    publish(&c->shm, c->shm.seq + k);
}

int ddp__shm_step_wait(struct ddp__comm *c, uint64_t k)
{
    return wait_all(c, c->shm.seq + k);
}

int ddp__shm_shard_done(struct ddp__comm *c, void *shard, size_t count, enum ddp_dtype dt,
                        enum ddp_redop op)
{
    int total = c->shm.n;
    if (c->cross) {
        /* Our shard's node sum, all-reduced with the same shard of every other node on our own
         * ring, while the other local ranks run theirs. */
        struct ddp__comm *x = c->cross;
        x->deadline_ms = c->deadline_ms;
        x->opname = c->opname;
        int e = ddp__tcp_allreduce(x, shard, count, dt, op == DDP_AVG ? DDP_SUM : op);
        if (e < 0) {
            if (!c->err[0])
                snprintf(c->err, sizeof(c->err), "%s", x->err);
            return e;
        }
        total *= x->world;
    }
    if (op == DDP_AVG)
        ddp__scale_avg(shard, count, dt, total);
    return 0;
}

int ddp__shm_barrier(struct ddp__comm *c)
{
    int e = ddp__shm_step(c, 1);
    if (e == 0)
        c->shm.seq += 1;
    return e;
}

/*
 * Threads in all for the one-node all-reduces of a rank of nlocal on this node: by default
 * the CPUs this process can keep busy (its affinity, and its cgroup's CPU quota: a rank bound
 * to a core, or in a container given 2 CPUs, gets 1 or 2), shared among the node's ranks that
 * run on them (all of them, unless ddprun's bind_to gave each its own: DDPRUN_CPU_SHARERS),
 * less one for each rank's own computation (the reducer all-reduces while the backward runs),
 * at most DDP__TEAM_AUTO_MAX. So 2 ranks get 4 threads each on 16 cores, 3 on 8, none but
 * their own on 4 or 2.
 */
int ddp__shm_threads(int nlocal)
{
    const char *v = getenv("DDP_PG_SHM_THREADS");
    if (v && *v && strcmp(v, "auto") != 0) {
        char *end;
        long x = strtol(v, &end, 10);
        if (!*end && x >= 1)
            return x > DDP__TEAM_MAX ? DDP__TEAM_MAX : (int)x;
        DDP_WARN(PG,
                 "DDP_PG_SHM_THREADS='%s' is neither a number of threads (1-%d) nor auto; "
                 "using auto",
                 v, DDP__TEAM_MAX);
    }
    const char *sh = getenv("DDPRUN_CPU_SHARERS");
    int sharers = sh ? atoi(sh) : nlocal;
    if (sharers < 1 || sharers > nlocal)
        sharers = nlocal > 0 ? nlocal : 1;
    int t = ddp_usable_cpus() / sharers - 1;
    return t < 1 ? 1 : t > DDP__TEAM_AUTO_MAX ? DDP__TEAM_AUTO_MAX : t;
}
