/*
 * A rank's helper threads for the memory work of a collective. One thread of a rank copies
 * and sums at the rate of one core's memory traffic (6.5 GB/s for a 64 MiB memcpy on a 16-core
 * Xeon VM, where the node's memory gives several times that), so where cores are spare, the
 * shared-memory all-reduce hands each step's copies and sums out in parts (worker/shm.c).
 *
 * A step is a generation: the caller sets the work, bumps gen and runs part 0; each helper
 * runs its part once it sees the new gen and counts itself out of left; the caller returns
 * once left is 0. The steps of one all-reduce follow each other within microseconds, so a
 * helper spins for TEAM_SPIN_NS after its part before it sleeps on gen (a futex), and a
 * caller wakes sleepers only when there are any. Ordering: gen's increment publishes the work
 * (fn, arg, and what the caller wrote before), left's decrements publish the helpers' writes.
 */
#include "worker/team.h"
#include "common/util.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/banned.h"

/* How long a helper polls for the next step before it sleeps: a step of a large all-reduce is
 * tens to hundreds of microseconds, the barrier between two a few. */
#define TEAM_SPIN_NS ((int64_t)100000)

struct member {
    struct ddp__team *t;
    int part;
};

struct ddp__team {
    int n; /* threads in all, the caller's included */
    pthread_t *tid;
    struct member *m;
    ddp__team_fn fn;
    void *arg;
    _Atomic uint32_t gen;      /* steps handed out; helpers wait on it */
    _Atomic int left;          /* helpers still in the current step */
    _Atomic uint32_t sleepers; /* helpers asleep on gen */
    _Atomic bool stop;
};

/* Waits until gen is no longer seen: polls, then sleeps. Returns the new gen. */
static uint32_t await_gen(struct ddp__team *t, uint32_t seen)
{
    uint32_t g;
    int64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        if ((g = atomic_load_explicit(&t->gen, memory_order_acquire)) != seen)
            return g;
        if (i < 64 || (i & 63)) {
            ddp_cpu_relax();
            continue;
        }
        int64_t now = ddp_now_ns();
        if (!t0)
            t0 = now;
        if (now - t0 < TEAM_SPIN_NS) {
            ddp_cpu_relax();
            continue;
        }
        /* sleepers before the check of gen in the kernel: a caller that bumps gen after our
         * increment sees it and wakes us; one that bumped it before makes FUTEX_WAIT return */
        atomic_fetch_add(&t->sleepers, 1);
        syscall(SYS_futex, &t->gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        atomic_fetch_sub(&t->sleepers, 1);
        t0 = 0;
        i = 0;
    }
}

static void *helper(void *p)
{
    struct member *me = p;
    struct ddp__team *t = me->t;
    uint32_t seen = 0;
    for (;;) {
        seen = await_gen(t, seen);
        if (atomic_load_explicit(&t->stop, memory_order_acquire))
            return NULL;
        t->fn(t->arg, me->part, t->n);
        atomic_fetch_sub_explicit(&t->left, 1, memory_order_release);
    }
}

static void bump(struct ddp__team *t)
{
    atomic_fetch_add(&t->gen, 1); /* seq_cst: ordered before the load of sleepers */
    if (atomic_load(&t->sleepers))
        syscall(SYS_futex, &t->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

struct ddp__team *ddp__team_new(int threads)
{
    if (threads < 2)
        return NULL;
    struct ddp__team *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->tid = calloc((size_t)threads, sizeof(*t->tid));
    t->m = calloc((size_t)threads, sizeof(*t->m));
    if (!t->tid || !t->m) {
        free(t->tid);
        free(t->m);
        free(t);
        return NULL;
    }
    for (int i = 1; i < threads; i++) {
        t->m[i] = (struct member){.t = t, .part = i};
        if (pthread_create(&t->tid[i], NULL, helper, &t->m[i]) != 0) {
            t->n = i; /* the ones started so far, stopped and joined below */
            ddp__team_free(t);
            return NULL;
        }
        t->n = i + 1;
    }
    return t;
}

int ddp__team_size(const struct ddp__team *t)
{
    return t ? t->n : 1;
}

void ddp__team_run(struct ddp__team *t, ddp__team_fn fn, void *arg)
{
    t->fn = fn;
    t->arg = arg;
    atomic_store_explicit(&t->left, t->n - 1, memory_order_relaxed);
    bump(t);
    fn(arg, 0, t->n);
    for (unsigned i = 0; atomic_load_explicit(&t->left, memory_order_acquire) > 0; i++) {
        if (i < 4096)
            ddp_cpu_relax();
        else
            sched_yield(); /* a helper is not running: more threads than free cores */
    }
}

void ddp__team_free(struct ddp__team *t)
{
    if (!t)
        return;
    atomic_store_explicit(&t->stop, true, memory_order_release);
    bump(t);
    for (int i = 1; i < t->n; i++)
        pthread_join(t->tid[i], NULL);
    free(t->tid);
    free(t->m);
    free(t);
}

void ddp__team_split(size_t lo, size_t hi, int p, int n, size_t esz, size_t *a, size_t *b)
{
    size_t align = esz < 64 ? 64 / esz : 1;
    size_t len = hi - lo, blocks = (len + align - 1) / align;
    size_t b0 = blocks * (size_t)p / (size_t)n, b1 = blocks * (size_t)(p + 1) / (size_t)n;
    *a = lo + b0 * align < hi ? lo + b0 * align : hi;
    *b = lo + b1 * align < hi ? lo + b1 * align : hi;
}
