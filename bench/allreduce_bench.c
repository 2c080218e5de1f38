/*
 * All-reduce benchmark in the style of nccl-tests, run as a ddprun job:
 * float32 sum, in place, sizes 4 KiB to 64 MiB (x4), warm-up then timed
 * iterations, median per size. Rank 0 prints
 *   RESULT <impl> <ranks> <bytes> <median us> <algbw GB/s> <busbw GB/s> <wrong>
 * with busbw = algbw * 2(n-1)/n (nccl-tests doc/PERFORMANCE.md) and <wrong>
 * the number of ranks whose result differed from the reference afterwards.
 * With "memcpy" instead of running under ddprun, prints the single-thread
 * memcpy bandwidth per size (the physical ceiling) as impl "memcpy".
 * With "xcore", the rate of a memcpy out of a buffer another process (on another core) has just
 * written, as impl "xcore": what each rank of a shared-memory all-reduce does to its peers' data,
 * so the cache-to-cache transfer's own bound, apart from any algorithm.
 * With "alias", memcpy into and out of memory at the page offsets a slot of the node's segment
 * had (128) and has (2064), from and to a malloc'd buffer, as impl "alias-in-128" etc.
 * With AR_TRACE set, every rank prints each timed call to stderr after the size's calls: "TRACE
 * rank i us cpu A->B vcs V ivcs I" (the CPU it ran on before and after, its voluntary and
 * involuntary context switches during the call), to tell a slow run's cause (a rank sleeping,
 * two ranks on one CPU, or neither).
 * With AR_COLOCATE set, every rank starts its calls on the first CPU of its affinity mask, the
 * mask then restored: two ranks together on one CPU, as the scheduler sometimes leaves them
 * after a program's start, to time what that costs and how soon they part.
 * An impl ending in "-rs" (ddp-tcp-rs) times reduce-scatter instead: each rank's input is the
 * size, its output a world-th of it; busbw = algbw * (n-1)/n (nccl-tests' reduce_scatter).
 * An impl ending in "-pc" all-reduces the buffer as pieces (ddp_pg_allreduce_pieces, the
 * reducer's copy mode) of AR_PIECE_BYTES each (default 100000, the last one shorter).
 */
#include "common/util.h"
#include "worker/pg.h"

#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int iters_for(size_t bytes)
{
    return bytes >= (16u << 20) ? 10 : bytes >= (1u << 20) ? 20 : 50;
}

/* Two processes take turns on a shared buffer: the child writes all of it, the parent copies
 * it out, timed. A turn counter in the shared page orders them (both spin). */
static int xcore(size_t maxb, double *t)
{
    char *m = mmap(NULL, maxb + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char *priv = malloc(maxb);
    if (m == MAP_FAILED || !priv)
        return 1;
    _Atomic long *turn = (_Atomic long *)m;
    char *buf = m + 4096;
    memset(priv, 0, maxb);
    memset(buf, 0, maxb);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0)
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never left spinning after its parent */
    long k = 0;
    for (size_t bytes = 4096; bytes <= maxb; bytes *= 4) {
        int it = iters_for(bytes) + 3;
        for (int i = 0; i < it; i++, k += 2) {
            if (pid == 0) { /* the writer */
                while (atomic_load(turn) != k)
                    ;
                memset(buf, (int)(k & 0x7f), bytes);
                atomic_store(turn, k + 1);
                continue;
            }
            while (atomic_load(turn) != k + 1)
                ;
            int64_t t0 = ddp_now_ns();
            memcpy(priv, buf, bytes);
            if (i >= 3)
                t[i - 3] = (double)(ddp_now_ns() - t0) / 1e3;
            if (priv[bytes - 1] != (char)(k & 0x7f)) {
                fprintf(stderr, "xcore: the copy did not see the writer's bytes\n");
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                return 1;
            }
            atomic_store(turn, k + 2);
        }
        if (pid == 0)
            continue;
        it -= 3;
        qsort(t, (size_t)it, sizeof(double), cmp_d);
        double us = t[it / 2], bw = (double)bytes / us / 1e3;
        printf("RESULT xcore 1 %zu %.1f %.2f %.2f 0\n", bytes, us, bw, bw);
        fflush(stdout);
    }
    if (pid == 0)
        _exit(0);
    int st;
    waitpid(pid, &st, 0);
    return 0;
}

/* memcpy between a large malloc'd buffer (glibc mmaps it: 16 bytes into a page) and memory at
 * page offset off, into it ("in") and out of it ("out"): the copies into and out of a slot of
 * the node's segment, whose page offset decides how far the loads run behind stores to the
 * same page offsets (4K aliasing). Best of the timed copies, each size. */
static int alias(size_t maxb, double *t)
{
    static const size_t offs[] = {128, 2064};
    char *user = malloc(maxb),
         *seg = mmap(NULL, maxb + 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!user || seg == MAP_FAILED)
        return 1;
    memset(user, 1, maxb);
    memset(seg, 2, maxb + 8192);
    for (size_t bytes = 4096; bytes <= maxb; bytes *= 4)
        for (int dir = 0; dir < 2; dir++)
            for (size_t k = 0; k < sizeof(offs) / sizeof(offs[0]); k++) {
                char *slot = seg + offs[k];
                int it = iters_for(bytes);
                for (int i = 0; i < it; i++) {
                    int64_t t0 = ddp_now_ns();
                    memcpy(dir ? user : slot, dir ? slot : user, bytes);
                    t[i] = (double)(ddp_now_ns() - t0) / 1e3;
                }
                qsort(t, (size_t)it, sizeof(double), cmp_d);
                double bw = (double)bytes / t[0] / 1e3;
                printf("RESULT alias-%s-%zu 1 %zu %.1f %.2f %.2f 0\n", dir ? "out" : "in", offs[k],
                       bytes, t[0], bw, bw);
            }
    return 0;
}

/* The bits of the small integer v (up to 256) as a 16-bit float: exact in both types. */
static uint16_t half_of(int v, enum ddp_dtype dt)
{
    int e = 0;
    while ((v >> (e + 1)) != 0)
        e++;
    uint32_t frac = (uint32_t)v - (1u << e); /* below the leading bit */
    return dt == DDP_BF16 ? (uint16_t)((uint32_t)(e + 127) << 7 | frac << (7 - e))
                          : (uint16_t)((uint32_t)(e + 15) << 10 | frac << (10 - e));
}

/* count elements of dt, each 1 */
static void fill_ones(void *buf, size_t count, enum ddp_dtype dt)
{
    for (size_t i = 0; i < count; i++)
        if (dt == DDP_F32)
            ((float *)buf)[i] = 1.0f;
        else
            ((uint16_t *)buf)[i] = half_of(1, dt);
}

int main(int argc, char **argv)
{
    const char *impl = argc > 1 ? argv[1] : "ddp-tcp";
    size_t maxb = (size_t)64 << 20;
    static double t[4096];
    static struct trace {
        int cpu0, cpu1;
        long vcs, ivcs;
    } tr[4096];
    if (strcmp(impl, "memcpy") == 0) {
        char *a = malloc(maxb), *b = malloc(maxb);
        memset(a, 1, maxb);
        memset(b, 2, maxb);
        for (size_t bytes = 4096; bytes <= maxb; bytes *= 4) {
            int it = iters_for(bytes);
            for (int i = 0; i < it; i++) {
                int64_t t0 = ddp_now_ns();
                memcpy(b, a, bytes);
                t[i] = (double)(ddp_now_ns() - t0) / 1e3;
                a[i % 64]++;
            }
            qsort(t, (size_t)it, sizeof(double), cmp_d);
            double us = t[it / 2], bw = (double)bytes / us / 1e3;
            printf("RESULT memcpy 1 %zu %.1f %.2f %.2f 0\n", bytes, us, bw, bw);
        }
        return 0;
    }
    if (strcmp(impl, "xcore") == 0)
        return xcore(maxb, t);
    if (strcmp(impl, "alias") == 0)
        return alias(maxb, t);
    struct ddp_pg *pg;
    if (ddp_pg_init_env(NULL, &pg) != 0)
        return 1;
    int rank = ddp_pg_rank(pg), n = ddp_pg_world_size(pg);
    bool trace = getenv("AR_TRACE") != NULL;
    cpu_set_t whole, first;
    if (getenv("AR_COLOCATE") && sched_getaffinity(0, sizeof(whole), &whole) == 0) {
        CPU_ZERO(&first);
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
            if (CPU_ISSET(cpu, &whole)) {
                CPU_SET(cpu, &first);
                break;
            }
        sched_setaffinity(0, sizeof(first), &first);
        sched_setaffinity(0, sizeof(whole), &whole);
    }
    /* ddp-*-reg: the buffer in the group's registered memory (ddp_pg_mem_alloc) */
    bool reg = strstr(impl, "-reg") != NULL;
    float *buf = reg ? ddp_pg_mem_alloc(pg, maxb) : malloc(maxb);
    size_t rl = strlen(impl);
    bool rs = rl > 3 && strcmp(impl + rl - 3, "-rs") == 0;
    float *out = rs ? malloc(maxb / (size_t)n + 4) : NULL;
    bool pcs = rl > 3 && strcmp(impl + rl - 3, "-pc") == 0;
    /* AR_DTYPE=bf16|f16: the all-reduce (not -rs nor -pc) of 16-bit floats, the same bytes */
    const char *dn = getenv("AR_DTYPE");
    enum ddp_dtype dt = DDP_F32;
    if (dn && strcmp(dn, "bf16") == 0) {
        dt = DDP_BF16;
    } else if (dn && strcmp(dn, "f16") == 0) {
        dt = DDP_F16;
    } else if (dn && strcmp(dn, "f32") != 0) {
        fprintf(stderr, "AR_DTYPE='%s' is not f32, bf16 or f16\n", dn);
        return 2;
    }
    if (dt != DDP_F32 && (rs || pcs)) {
        fprintf(stderr, "AR_DTYPE=%s: the plain all-reduce only\n", dn);
        return 2;
    }
    size_t esz = ddp_dtype_size(dt);
    size_t piece = getenv("AR_PIECE_BYTES") ? (size_t)atol(getenv("AR_PIECE_BYTES")) / 4 : 25000;
    if (piece == 0)
        piece = 1;
    struct ddp_piece *pc = pcs ? malloc((maxb / 4 / piece + 1) * sizeof(*pc)) : NULL;
    /* optional: one size only (argv[2] bytes), argv[3] times (profiling) */
    size_t only = argc > 2 ? (size_t)atol(argv[2]) : 0;
    int only_it = argc > 3 ? atoi(argv[3]) : 0;
    if (only_it > 4096)
        only_it = 4096;
    for (size_t bytes = only ? only : 4096; bytes <= maxb; bytes *= 4) {
        size_t count = bytes / esz;
        int it = only_it > 0 ? only_it : iters_for(bytes);
        fill_ones(buf, count, dt);
        size_t part = count / (size_t)n; /* reduce-scatter: elements per rank */
        size_t npc = 0;
        for (size_t off = 0; pcs && off < count; off += piece, npc++)
            pc[npc] = (struct ddp_piece){buf + off, count - off < piece ? count - off : piece};
        /* Warm-up calls, untimed: 3, and for registered memory 16, which take the default
         * (DDP_PG_DIRECT_BYTES=auto) through its first trial of single-copy against the slots
         * (13 all-reduces of the size class: worker/shm_auto.c), so the timed calls run the
         * way it chose. */
        int warm = reg ? 16 : 3;
        for (int i = -warm; i < it; i++) {
            if (i >= 0)
                ddp_pg_barrier(pg);
            int cpu0 = trace ? sched_getcpu() : 0;
            struct rusage ru0 = {0}, ru1;
            if (trace)
                getrusage(RUSAGE_THREAD, &ru0);
            int64_t t0 = ddp_now_ns();
            if ((rs    ? ddp_pg_reduce_scatter(pg, buf, out, part, DDP_F32, DDP_SUM)
                 : pcs ? ddp_pg_allreduce_pieces(pg, pc, npc, DDP_F32, DDP_SUM, -1)
                       : ddp_pg_allreduce(pg, buf, count, dt, DDP_SUM)) != 0)
                return 1;
            if (i >= 0)
                t[i] = (double)(ddp_now_ns() - t0) / 1e3;
            if (trace && i >= 0 && getrusage(RUSAGE_THREAD, &ru1) == 0)
                tr[i] = (struct trace){cpu0, sched_getcpu(), ru1.ru_nvcsw - ru0.ru_nvcsw,
                                       ru1.ru_nivcsw - ru0.ru_nivcsw};
        }
        /* printed after the timed calls: a line written to the agent's pipe during them wakes
         * the agent, which then runs on this rank's CPU */
        for (int i = 0; trace && i < it; i++)
            fprintf(stderr, "TRACE %d %d %.1f cpu %d->%d vcs %ld ivcs %ld\n", rank, i, t[i],
                    tr[i].cpu0, tr[i].cpu1, tr[i].vcs, tr[i].ivcs);
        /* Check a fresh reduction: every element must be n. */
        fill_ones(buf, count, dt);
        if (rs)
            ddp_pg_reduce_scatter(pg, buf, out, part, DDP_F32, DDP_SUM);
        else if (pcs)
            ddp_pg_allreduce_pieces(pg, pc, npc, DDP_F32, DDP_SUM, -1);
        else
            ddp_pg_allreduce(pg, buf, count, dt, DDP_SUM);
        int wrong = 0;
        for (size_t i = 0; i < (rs ? part : count) && !wrong; i++)
            wrong = dt == DDP_F32 ? (rs ? out : buf)[i] != (float)n
                                  : ((uint16_t *)buf)[i] != half_of(n, dt);
        ddp_pg_allreduce(pg, &wrong, 1, DDP_I32, DDP_SUM);
        /* Each rank's median; the slowest rank's median is the operation's time. */
        qsort(t, (size_t)it, sizeof(double), cmp_d);
        double med = t[it / 2];
        ddp_pg_allreduce(pg, &med, 1, DDP_F64, DDP_MAX);
        double algbw = (double)bytes / med / 1e3, busbw = algbw * (rs ? 1.0 : 2.0) * (n - 1) / n;
        if (rank == 0)
            printf("RESULT %s %d %zu %.1f %.3f %.3f %d\n", impl, n, bytes, med, algbw, busbw,
                   wrong);
        fflush(stdout);
        if (only)
            break;
    }
    ddp_pg_mem_free(pg, buf); /* either kind */
    free(out);
    free(pc);
    ddp_pg_free(pg);
    return 0;
}
