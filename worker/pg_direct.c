/*
 * Setting up the single-copy all-reduce of a group with shared memory (worker/shm_direct.c),
 * and the registered memory of ddp_pg_mem_alloc.
 *
 * With DDP_PG_DIRECT_BYTES set (the smallest all-reduce that goes single-copy; off by default)
 * or "auto" (registered memory only, kept if a measurement at group creation says it pays),
 * every rank creates its arena (a sparse memfd, DDP_PG_ARENA_BYTES, default
 * 64 GiB of address space, no memory until allocated) and tries cross-memory attach on its
 * node's ranks: each publishes its pid and the address of a known word, and gives its arena's
 * descriptor to its node's other ranks (worker/fdshare.h); each maps every local peer's arena
 * and reads every local peer's word with process_vm_readv. All
 * ranks of the group then agree (an all-gather) on what works everywhere, so every node runs
 * the same algorithm: the arenas are kept only if every rank mapped every local arena, and
 * cross-memory attach is used only if it worked everywhere (under Yama's ptrace_scope 1 each
 * rank first lets its parent's descendants, its sibling ranks, read it: PR_SET_PTRACER).
 * Nothing is fatal: what fails leaves the slots of worker/shm.c.
 *
 * Auto (one node): whether single-copy pays depends on the CPU (BENCHMARKS.md: registered
 * memory 1.24x the slots at 4 MiB on a 16-core Intel Xeon, 0.98x on a 2-core AMD EPYC), so the
 * group times both on a 4 MiB buffer of the arena once it is formed, takes the slowest rank's
 * times, and keeps single-copy from 4 MiB only where it is faster by a margin; otherwise the
 * arenas are given up, as if it were off. Not the default: on the shared 2-core VM one
 * measurement at the start does not tell (its slow spells slow the slots more; with one
 * warm-up it picked single-copy in 8 of 13 starts where steady runs show the two equal).
 */
#include "worker/group.h"
#include "worker/fdshare.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/banned.h"

#define PROBE_MAGIC 0x64647021636d6121ull
static volatile const uint64_t g_probe = PROBE_MAGIC;

#define DIRECT_BLOCK_DEFAULT ((size_t)1 << 20)
/* Auto's measurement: 2 warm-ups and 3 timed all-reduces of each kind; single-copy kept where
 * its median is DDP_PG_DIRECT_AUTO_MARGIN (default 1.10) times faster (the 2-core VM's
 * medians of 3 drift by ~5%; 0 keeps it always, a large one never). */
#define CAL_BYTES ((size_t)4 << 20)
#define CAL_WARM 2
#define CAL_TIMED 3
#define CAL_MARGIN 1.10
#define ARENA_DEFAULT ((size_t)64 << 30)

static size_t env_size(const char *name, size_t dflt)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return dflt;
    unsigned long long x = strtoull(v, &end, 10);
    return *end ? dflt : (size_t)x;
}

static void allow_siblings(void)
{
    char c = 0;
    int fd = open("/proc/sys/kernel/yama/ptrace_scope", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    if (read(fd, &c, 1) == 1 && c == '1')
        prctl(PR_SET_PTRACER, (unsigned long)getppid(), 0, 0, 0);
    close(fd);
}

static bool probe(pid_t pid, uint64_t addr)
{
    uint64_t v = 0;
    struct iovec l = {.iov_base = &v, .iov_len = sizeof(v)};
    struct iovec r = {.iov_base = (void *)(uintptr_t)addr, .iov_len = sizeof(v)};
    return process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof(v) && v == PROBE_MAGIC;
}

int ddp__pg_setup_direct(struct ddp_pg *pg, struct ddp_store *store, const char *name)
{
    struct ddp__shm *sh = &pg->comm.shm;
    /* Like DDP_PG_TRANSPORT, the same on every rank of a job (ddprun gives all one env). */
    const char *dv = getenv("DDP_PG_DIRECT_BYTES");
    bool autom = dv && strcmp(dv, "auto") == 0;
    size_t dmin = autom ? CAL_BYTES : env_size("DDP_PG_DIRECT_BYTES", 0);
    size_t dblock = env_size("DDP_PG_DIRECT_BLOCK", DIRECT_BLOCK_DEFAULT);
    if (dmin == 0)
        return 0;
    size_t arena_len = env_size("DDP_PG_ARENA_BYTES", ARENA_DEFAULT);
    const char *cma_env = getenv("DDP_PG_CMA");
    /* auto: registered memory only (cross-memory attach was slower on every CPU measured) */
    bool want_cma = !autom && !(cma_env && strcmp(cma_env, "0") == 0);
    char blob[160], prefix[300];
    struct ddp__arena *arena = NULL;
    if (arena_len && ddp__arena_create(arena_len, &arena) < 0) /* auto asked for nothing */
        DDP__LOG(autom ? DDP_LOG_INFO : DDP_LOG_WARN, PG,
                 "rank %d: no arena for registered memory (%s)", pg->rank, strerror(errno));
    if (want_cma)
        allow_siblings();
    snprintf(blob, sizeof(blob), "%d %llu", (int)getpid(), (unsigned long long)(uintptr_t)&g_probe);
    int n = sh->n, r, world = pg->world;
    struct ddp_store_value *vals = calloc((size_t)world, sizeof(*vals));
    int *fds = malloc((size_t)n * sizeof(int));
    for (int j = 0; fds && j < n; j++)
        fds[j] = -1;
    sh->pid = calloc((size_t)n, sizeof(int));
    sh->peer_arena = calloc((size_t)n, sizeof(void *));
    if (!vals || !fds || !sh->pid || !sh->peer_arena) {
        r = DDP_ENOMEM;
        goto out;
    }
    /* every local rank's arena descriptor (none if it has no arena) */
    snprintf(prefix, sizeof(prefix), "pg/%s/direct-arena/%d", name, pg->node_rank);
    if ((r = ddp__fd_exchange(store, prefix, sh->me, n, ddp__arena_fd(arena), pg->timeout_ms,
                              fds)) < 0)
        goto out;
    snprintf(prefix, sizeof(prefix), "pg/%s/direct-where", name);
    if ((r = ddp_store_all_gather(store, prefix, pg->rank, world, blob, strlen(blob) + 1,
                                  pg->timeout_ms, vals)) < 0)
        goto out;
    bool cma_ok = want_cma, arena_ok = arena != NULL;
    sh->arena_len = arena ? arena_len : 0;
    for (int j = 0; j < n; j++) {
        struct ddp_store_value *v = &vals[sh->grank[j]];
        int pid = 0;
        unsigned long long addr = 0;
        if (!v->data || v->len == 0 || ((char *)v->data)[v->len - 1] != '\0' ||
            sscanf(v->data, "%d %llu", &pid, &addr) != 2) {
            cma_ok = arena_ok = false;
            continue;
        }
        sh->pid[j] = pid;
        if (j == sh->me) {
            sh->peer_arena[j] = ddp__arena_base(arena);
            continue;
        }
        if (cma_ok && !probe(pid, addr)) {
            DDP_INFO(PG, "rank %d: cross-memory attach to rank %d refused (%s)", pg->rank,
                     sh->grank[j], strerror(errno));
            cma_ok = false;
        }
        if (arena_ok) {
            /* a peer's arena of another size (DDP_PG_ARENA_BYTES differs) is not mapped */
            struct stat st;
            bool fits = fds[j] >= 0 && fstat(fds[j], &st) == 0 && (size_t)st.st_size >= arena_len;
            void *m = fits ? mmap(NULL, arena_len, PROT_READ | PROT_WRITE,
                                  MAP_SHARED | MAP_NORESERVE, fds[j], 0)
                           : MAP_FAILED;
            if (m == MAP_FAILED)
                arena_ok = false;
            else
                sh->peer_arena[j] = m;
        }
    }
    ddp_store_values_free(vals, (size_t)world);
    /* What works everywhere, and the same threshold and blocks everywhere. */
    snprintf(blob, sizeof(blob), "%d %d %d %zu %zu", cma_ok, arena_ok, autom, dmin, dblock);
    snprintf(prefix, sizeof(prefix), "pg/%s/direct-ok", name);
    if ((r = ddp_store_all_gather(store, prefix, pg->rank, world, blob, strlen(blob) + 1,
                                  pg->timeout_ms, vals)) < 0)
        goto out;
    bool all_cma = true, all_arena = true;
    size_t agreed = dmin;
    for (int i = 0; i < world; i++) {
        int c = 0, a = 0, au = 0;
        size_t d = 0, bl = 0;
        if (!vals[i].data || sscanf(vals[i].data, "%d %d %d %zu %zu", &c, &a, &au, &d, &bl) != 5)
            c = a = 0, d = 0;
        all_cma &= c == 1;
        all_arena &= a == 1;
        if (d != agreed || bl != dblock || au != autom)
            agreed = 0; /* ranks disagree on DDP_PG_DIRECT_*: none of it */
    }
    sh->cma = all_cma;
    sh->direct_min = agreed;
    sh->direct_block = dblock;
    sh->direct_auto = autom && agreed;
    if (all_arena) {
        sh->arena = arena;
        arena = NULL;
    }
    if (sh->direct_auto && !(all_arena && pg->local_world == pg->world)) {
        /* auto single-copy is registered memory on one node: nothing to measure */
        sh->direct_auto = false;
        sh->direct_min = 0;
        ddp__shm_drop_arenas(sh);
    } else if (sh->direct_auto) {
        DDP_INFO(PG, "rank %d: single-copy all-reduce of registered memory: measured next",
                 pg->rank);
    } else {
        DDP_INFO(PG,
                 "rank %d: single-copy all-reduce from %zu bytes: registered memory %s, "
                 "cross-memory attach %s",
                 pg->rank, agreed, all_arena ? "on" : "off", all_cma ? "on" : "off");
    }
out:
    for (int j = 0; fds && j < n; j++)
        if (fds[j] >= 0)
            close(fds[j]); /* a mapping keeps its arena */
    free(fds);
    if (!sh->arena)
        ddp__shm_unmap_arenas(sh);
    if (vals)
        ddp_store_values_free(vals, (size_t)world);
    free(vals);
    ddp__arena_destroy(arena);
    return r;
}

static double median3(double *t)
{
    double a = t[0], b = t[1], c = t[2];
    return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

/* One all-reduce of the calibration buffer, slots or single-copy, timed on this rank. */
static int timed(struct ddp_pg *pg, float *buf, size_t count, bool direct, double *us)
{
    struct ddp__comm *c = &pg->comm;
    for (size_t i = 0; i < count; i++)
        buf[i] = 1.0f;
    c->shm.direct_min = direct ? 1 : 0;
    c->deadline_ms = ddp_now_ms() + pg->timeout_ms;
    int64_t t0 = ddp_now_ns();
    int r = ddp__cpu_allreduce(c, buf, count, DDP_F32, DDP_SUM);
    *us = (double)(ddp_now_ns() - t0) / 1e3;
    return r;
}

int ddp__pg_calibrate_direct(struct ddp_pg *pg)
{
    struct ddp__shm *sh = &pg->comm.shm;
    if (!sh->direct_auto)
        return 0;
    sh->direct_auto = false;
    size_t count = CAL_BYTES / sizeof(float);
    float *buf = ddp__arena_alloc(sh->arena, CAL_BYTES);
    double t[2][CAL_TIMED], agree[2] = {buf ? 0 : 1, 0};
    /* every rank has its buffer, or none measures (each collective below is the whole group's) */
    sh->direct_min = 0;
    pg->comm.opname = "all-reduce (measuring single-copy)";
    pg->comm.deadline_ms = ddp_now_ms() + pg->timeout_ms;
    int r = ddp__cpu_allreduce(&pg->comm, agree, 1, DDP_F64, DDP_MAX);
    bool measure = r == 0 && agree[0] == 0;
    /* alternating, so a drift of the machine's speed reaches both alike */
    for (int i = -CAL_WARM; measure && i < CAL_TIMED && r == 0; i++)
        for (int d = 0; d < 2 && r == 0; d++) {
            double us;
            r = timed(pg, buf, count, d == 1, &us);
            if (i >= 0)
                t[d][i] = us;
        }
    if (buf)
        ddp__arena_free(sh->arena, buf);
    sh->direct_min = 0;
    if (measure && r == 0) {
        /* the slowest rank's medians decide, the same on every rank */
        agree[0] = median3(t[0]);
        agree[1] = median3(t[1]);
        pg->comm.deadline_ms = ddp_now_ms() + pg->timeout_ms;
        r = ddp__cpu_allreduce(&pg->comm, agree, 2, DDP_F64, DDP_MAX);
    }
    if (r < 0) {
        snprintf(pg->err, sizeof(pg->err), "measuring the single-copy all-reduce: %s",
                 pg->comm.err[0] ? pg->comm.err : ddp_strerror(r));
        return r;
    }
    const char *mv = getenv("DDP_PG_DIRECT_AUTO_MARGIN");
    char *end = NULL;
    double margin = mv ? strtod(mv, &end) : CAL_MARGIN;
    if (!mv || end == mv || *end || margin < 0)
        margin = CAL_MARGIN;
    bool pays = measure && agree[1] * margin < agree[0];
    if (pg->rank == 0 && measure)
        DDP_INFO(PG,
                 "single-copy all-reduce of registered memory %s (%zu MiB, slowest rank's "
                 "median: slots %.0f us, single-copy %.0f us; DDP_PG_DIRECT_BYTES sets it)",
                 pays ? "from 4 MiB" : "off", CAL_BYTES >> 20, agree[0], agree[1]);
    else if (pg->rank == 0)
        DDP_INFO(PG,
                 "single-copy all-reduce of registered memory off (no %zu MiB to measure in "
                 "some rank's arena)",
                 CAL_BYTES >> 20);
    if (pays) {
        sh->direct_min = CAL_BYTES;
        return 0;
    }
    ddp__shm_drop_arenas(sh);
    return 0;
}

void *ddp_pg_mem_alloc(struct ddp_pg *pg, size_t bytes)
{
    void *p = pg ? ddp__arena_alloc(pg->comm.shm.arena, bytes) : NULL;
    if (!p)
        p = calloc(bytes ? bytes : 1, 1);
    return p;
}

void ddp_pg_mem_free(struct ddp_pg *pg, void *p)
{
    if (!p)
        return;
    if (pg && ddp__arena_offset(pg->comm.shm.arena, p, 1) != DDP__NOT_IN_ARENA)
        ddp__arena_free(pg->comm.shm.arena, p);
    else
        free(p);
}
