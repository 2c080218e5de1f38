/*
 * Single-copy or the slots, chosen from the group's own all-reduces (DDP_PG_DIRECT_BYTES=auto,
 * the default).
 *
 * Which is faster depends on the CPU (BENCHMARKS.md: registered single-copy 1.07-1.34x the
 * slots on a 16-core Intel Xeon, 0.98-1.00x from 4 MiB on a 2-core AMD EPYC in a loop over one
 * buffer), on the size, on how the program uses its buffers (a bucket just written by the
 * backward pass), and on the machine's moods (the EPYC VM's slow spells of the slots), so a
 * one-node group with arenas times the two on the all-reduces the program runs anyway: those
 * of at least direct_min bytes (1 MiB), for each size class apart (1-4, 4-16, 16-64, 64- MiB),
 * go through trials (single-copy runs only where every local rank's buffer is registered),
 * each
 *
 *   WARM     all-reduces single-copy, untimed (the peers' arena pages mapped here the first time)
 *   PAIRS    pairs of timed all-reduces, one each way (in alternating order, so a drift of the
 *            machine's speed or a warm cache reaches both alike), each timed from a step that
 *            every local rank passed (a rank's wait for a late peer is not the algorithm's); a
 *            single-copy half that could not run (some rank's buffer not registered: the slots
 *            ran) is taken again on the next all-reduce, up to TRIES timed all-reduces in all,
 *            and FAILS such halves in a row end the trial
 *   then     each rank publishes in its control line the median over its pairs of single-copy's
 *            time per byte over the slots' (parts per million; 0: fewer than half the pairs)
 *   one more all-reduce the current way, after which every rank has published: each reads
 *            every local rank's line and takes their mean; single-copy from now on where
 *            mean x DDP_PG_DIRECT_AUTO_MARGIN < 1, the slots where mean > 1 (else unchanged;
 *            the slots where a rank has too few pairs)
 *
 * and then the current way until the class's next trial, DDP_PG_DIRECT_AUTO_EVERY (500)
 * all-reduces of the class later (2, 4, ... 2^BACKOFF_MAX times that after trials in a row with
 * too few pairs: a program that registers none of its buffers pays the extra steps of trials
 * ever more rarely). Every local rank runs the same all-reduces in the same order with the same
 * sizes, and whether single-copy could run is the same on all, so all count alike, run each
 * trial's all-reduces the same way, end it on the same one, and decide from the same published
 * numbers. A rank rewrites its line only at the end of the next trial, which none reaches
 * before every rank has read this one. Both ways reduce in local rank order: the result is
 * the same bit for bit whichever runs. Auto is off across nodes.
 */
#include "worker/coll.h"
#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/banned.h"

#define WARM 2
#define PAIRS DDP__AUTO_PAIRS
#define TRIES (4 * PAIRS) /* timed all-reduces at most in one trial */
#define FAILS 3           /* single-copy halves that could not run in a row: the trial ends */
#define BACKOFF_MAX 6     /* unmeasured trials in a row space the next up to 2^6 times */
#define PPM 1000000ull

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The size class of an all-reduce of bytes (at least direct_min, 1 MiB): 1-4, 4-16, 16-64,
 * 64- MiB. */
static int size_class(uint64_t bytes)
{
    int k = 0;
    for (uint64_t b = bytes >> 22; b && k < DDP__AUTO_CLASSES - 1; b >>= 2)
        k++;
    return k;
}

/* Our median over the trial's pairs (0: too few), into our control line. */
static void publish_ratio(struct ddp__shm *sh, int k)
{
    struct ddp__auto_class *a = &sh->autod.cls[k];
    uint64_t v[PAIRS];
    int nv = a->got / 2;
    for (int p = 0; p < nv; p++) { /* at least 1: 0 means unmeasured */
        v[p] = a->ns_per_mb[p][1] * PPM / a->ns_per_mb[p][0];
        v[p] = v[p] ? v[p] : 1;
    }
    uint64_t med = 0;
    if (nv > PAIRS / 2) {
        qsort(v, (size_t)nv, sizeof(v[0]), cmp_u64);
        med = nv % 2 ? v[nv / 2] : (v[nv / 2 - 1] + v[nv / 2]) / 2;
    }
    ddp__shm_ctrl(sh, sh->me)->auto_ratio[k] = med;
}

/* Every local rank published before it entered the all-reduce just done. False where some
 * rank measured too few pairs. */
static bool decide(struct ddp__comm *c, int k)
{
    struct ddp__shm *sh = &c->shm;
    struct ddp__auto_class *a = &sh->autod.cls[k];
    double margin = sh->autod.margin;
    uint64_t sum = 0;
    bool all = true;
    for (int j = 0; j < sh->n; j++) {
        uint64_t v = ddp__shm_ctrl(sh, j)->auto_ratio[k];
        all &= v != 0;
        sum += v;
    }
    uint64_t mean = sum / (uint64_t)sh->n;
    bool was = a->direct;
    if (!all)
        a->direct = false;
    else if ((double)mean * margin < (double)PPM)
        a->direct = true;
    else if (mean > PPM)
        a->direct = false;
    a->trials++;
    a->chosen += a->direct;
    /* the first choice and every change told; each trial at debug level */
    if (sh->me == 0) {
        char upto[24] = "";
        if (k < DDP__AUTO_CLASSES - 1)
            snprintf(upto, sizeof(upto), " to %d", 4 << (2 * k));
        DDP__LOG(a->trials == 1 || was != a->direct ? DDP_LOG_INFO : DDP_LOG_DEBUG, PG,
                 "rank %d: single-copy all-reduce of registered memory from %d%s MiB %s (trial "
                 "%llu: its time per byte over the slots' %s%.3f, mean over %d ranks of each "
                 "one's median of %d pairs; margin %.2f)",
                 c->rank, 1 << (2 * k), upto, a->direct ? "on" : "off",
                 (unsigned long long)a->trials, all ? "" : "unmeasured, ", (double)mean / PPM,
                 sh->n, PAIRS, margin);
    }
    return all;
}

bool ddp__shm_auto_would_direct(const struct ddp__shm *sh, uint64_t bytes)
{
    const struct ddp__auto_class *a = &sh->autod.cls[size_class(bytes)];
    bool starts = a->calls == a->trial; /* as ddp__shm_auto_allreduce decides, below */
    if (starts || a->in_trial)
        return (starts ? 0 : a->warm) < WARM; /* a warm-up: single-copy, untimed */
    return a->direct;
}

int ddp__shm_auto_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                            enum ddp_redop op)
{
    struct ddp__shm *sh = &c->shm;
    uint64_t bytes = (uint64_t)count * ddp_dtype_size(dt);
    int k = size_class(bytes);
    struct ddp__auto_class *a = &sh->autod.cls[k];
    if (a->calls == a->trial) {
        a->in_trial = true;
        a->warm = a->got = a->tries = a->fails = 0;
    }
    bool direct = a->direct, timed = false, decide_now = a->decide;
    int e;
    if (a->in_trial && a->warm < WARM) {
        direct = true;
        a->warm++;
    } else if (a->in_trial) {
        /* pair got / 2, its first or second half; pairs alternate which way goes first */
        direct = ((a->got % 2) ^ (a->got / 2 % 2)) != 0;
        timed = true;
        a->tries++;
        /* every local rank here before the clock starts */
        if ((e = ddp__shm_step(c, 1)) < 0)
            return e;
        sh->seq += 1;
    }
    int64_t t0 = ddp_now_ns();
    int r = direct ? ddp__shm_direct_allreduce(c, buf, count, dt, op) : 1;
    bool ran_direct = r == 0;
    if (r == 1)
        r = ddp__shm_allreduce(c, buf, count, dt, op);
    if (r < 0)
        return r;
    a->calls++;
    /* single-copy asked but some rank's buffer not registered (on every rank alike): the
     * half is taken again on the next all-reduce of the class */
    if (timed && direct == ran_direct) {
        uint64_t ns = (uint64_t)(ddp_now_ns() - t0) * PPM / bytes;
        a->ns_per_mb[a->got / 2][direct] = ns ? ns : 1;
        a->got++;
        a->fails = 0;
    } else if (timed) {
        a->fails++;
    }
    if (timed && (a->got == 2 * PAIRS || a->tries == TRIES || a->fails == FAILS)) {
        publish_ratio(sh, k);
        a->in_trial = false;
        a->decide = true;
    } else if (decide_now) {
        /* a program whose buffers are not registered is tried ever more rarely */
        if (decide(c, k))
            a->backoff = 0;
        else if (a->backoff < BACKOFF_MAX)
            a->backoff++;
        a->decide = false;
        a->trial = a->calls + (sh->autod.every << a->backoff);
    }
    return 0;
}
