/*
 * Setting up the single-copy all-reduce of a group with shared memory (worker/shm_direct.c),
 * and the registered memory of ddp_pg_mem_alloc.
 *
 * With DDP_PG_DIRECT_BYTES set (the smallest all-reduce that goes single-copy; 0: none) or
 * "auto", the default (registered memory on one node, from 1 MiB, for each size where trials
 * on the program's own all-reduces say it pays: worker/shm_auto.c),
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
 */
#include "worker/group.h"
#include "worker/fdshare.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
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

/* Bytes of the buffer per step of single-copy, by default per local rank: each rank reduces
 * 2 MiB of its shard, then copies the others' out. On the 2-vCPU Intel Xeon VM (2026-11-27,
 * BENCHMARKS.md) 4 MiB steps at 2 ranks ran 1.64x 1 MiB steps at 4 and 16 MiB and 1.23x at 64,
 * 2 MiB steps between the two; 8 MiB like 4; at 4 ranks 8 MiB ahead of 4 and 1 (on 2 cores). */
#define DIRECT_BLOCK_PER_RANK ((size_t)2 << 20)
/* Auto (worker/shm_auto.c): all-reduces of registered memory from 1 MiB, single-copy taken
 * for a size class where its trials say it is DDP_PG_DIRECT_AUTO_MARGIN (default 1.05) times
 * faster than the slots (0 takes it whatever they say, a large margin never). */
#define AUTO_BYTES ((size_t)1 << 20)
#define AUTO_MARGIN 1.05
#define AUTO_EVERY 500 /* all-reduces from one trial's decision to the next trial */
#define ARENA_DEFAULT ((size_t)64 << 30)

static double auto_margin(void)
{
    const char *mv = getenv("DDP_PG_DIRECT_AUTO_MARGIN");
    char *end = NULL;
    double m = mv ? strtod(mv, &end) : AUTO_MARGIN;
    return !mv || end == mv || *end || !(m >= 0) ? AUTO_MARGIN : m;
}

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
    bool autom = !dv || !*dv || strcmp(dv, "auto") == 0; /* the default */
    size_t dmin = autom ? AUTO_BYTES : env_size("DDP_PG_DIRECT_BYTES", 0);
    size_t dblock = env_size("DDP_PG_DIRECT_BLOCK", 0); /* 0: the default, by local ranks */
    /* auto chooses on groups of one node only (the layout is the same on every rank) */
    if (dmin == 0 || (autom && pg->local_world != pg->world))
        return 0;
    size_t arena_len = env_size("DDP_PG_ARENA_BYTES", ARENA_DEFAULT);
    const char *cma_env = getenv("DDP_PG_CMA");
    /* auto: registered memory only (cross-memory attach was slower on every CPU measured) */
    bool want_cma = !autom && !(cma_env && strcmp(cma_env, "0") == 0);
    char blob[160], prefix[300];
    struct ddp__arena *arena = NULL;
    if (arena_len && ddp__arena_create(arena_len, &arena) < 0) /* auto asked for nothing */
        DDP__LOG(autom ? DDP_LOG_INFO : DDP_LOG_WARN, PG,
                 "rank %d: no arena for registered memory (%zu bytes of address space, "
                 "DDP_PG_ARENA_BYTES: %s)",
                 pg->rank, arena_len, strerror(errno));
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
    double margin = autom ? auto_margin() : 0;
    size_t every = autom ? env_size("DDP_PG_DIRECT_AUTO_EVERY", AUTO_EVERY) : 0;
    if (every > ((size_t)1 << 40))
        every = (size_t)1 << 40; /* times the trials' back-off (64) stays far from overflow */
    /* DDP_PG_DIRECT_CLAIM=0: registered memory in fixed shards and blocks, as the other kinds */
    const char *cv = getenv("DDP_PG_DIRECT_CLAIM");
    int claim = !(cv && strcmp(cv, "0") == 0);
    snprintf(blob, sizeof(blob), "%d %d %d %zu %zu %a %zu %d", cma_ok, arena_ok, autom, dmin,
             dblock, margin, every, claim);
    snprintf(prefix, sizeof(prefix), "pg/%s/direct-ok", name);
    if ((r = ddp_store_all_gather(store, prefix, pg->rank, world, blob, strlen(blob) + 1,
                                  pg->timeout_ms, vals)) < 0)
        goto out;
    bool all_cma = true, all_arena = true;
    size_t agreed = dmin;
    for (int i = 0; i < world; i++) {
        int c = 0, a = 0, au = 0, cl = -1;
        size_t d = 0, bl = 0, ev = 0;
        double m = -1;
        if (!vals[i].data || sscanf(vals[i].data, "%d %d %d %zu %zu %la %zu %d", &c, &a, &au, &d,
                                    &bl, &m, &ev, &cl) != 8)
            c = a = 0, d = 0;
        all_cma &= c == 1;
        all_arena &= a == 1;
        if (d != agreed || bl != dblock || au != autom || m != margin || ev != every || cl != claim)
            agreed = 0; /* ranks disagree on DDP_PG_DIRECT_*: none of it */
    }
    sh->cma = all_cma;
    sh->direct_min = agreed;
    sh->direct_block = dblock ? dblock : DIRECT_BLOCK_PER_RANK * (size_t)sh->n;
    sh->claim_off = !claim;
    bool autod = autom && agreed;
    if (all_arena) {
        sh->arena = arena;
        arena = NULL;
    }
    if (autod && !all_arena) {
        sh->direct_min = 0; /* auto single-copy is registered memory: nothing to choose */
    } else if (autod) {
        sh->autod = (struct ddp__direct_auto){.on = true, .margin = margin, .every = every};
        DDP_INFO(PG,
                 "rank %d: single-copy all-reduce of registered memory from %zu MiB: chosen by "
                 "trials against the slots for each size",
                 pg->rank, agreed >> 20);
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

/* The group to ourselves for a post: nothing queued or running (the program's own earlier work
 * finishes first; the reducer has none). false: the group is stopping or failed. */
static bool post_begin(struct ddp_pg *pg)
{
    pthread_mutex_lock(&pg->mu);
    while ((pg->head || pg->busy) && !pg->stop && pg->alive) {
        pthread_mutex_unlock(&pg->mu);
        sched_yield();
        pthread_mutex_lock(&pg->mu);
    }
    bool ok = !pg->stop && pg->alive;
    pg->busy = ok;
    pthread_mutex_unlock(&pg->mu);
    return ok;
}

static int post_end(struct ddp_pg *pg, int r)
{
    pthread_mutex_lock(&pg->mu);
    ddp__pg_unbusy(pg);
    return r;
}

int ddp_pg_allreduce_post(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                          enum ddp_redop op)
{
    if (!pg || !buf || ddp_dtype_size(dt) == 0 || (unsigned)op > DDP_MIN)
        return DDP_EINVAL;
    if (pg->nccl)
        return 1;
    if (!post_begin(pg))
        return DDP_EABORTED;
    return post_end(pg, ddp__cpu_allreduce_post(&pg->comm, buf, count, dt, op));
}

int ddp_pg_allreduce_pieces_post(struct ddp_pg *pg, const struct ddp_piece *pieces, size_t n,
                                 enum ddp_dtype dt, enum ddp_redop op, size_t ready)
{
    if (!pg || (!pieces && n) || ddp_dtype_size(dt) == 0 || (unsigned)op > DDP_MIN)
        return DDP_EINVAL;
    size_t count = 0;
    for (size_t q = 0; q < n; q++) {
        if (!pieces[q].data && pieces[q].count)
            return DDP_EINVAL;
        count += pieces[q].count;
    }
    if (pg->nccl)
        return 1;
    if (!post_begin(pg))
        return DDP_EABORTED;
    return post_end(pg, ddp__cpu_allreduce_pieces_post(&pg->comm, pieces, n, count, dt, op, ready));
}

bool ddp_pg_can_post_pieces(struct ddp_pg *pg, size_t count, enum ddp_dtype dt)
{
    return pg && !pg->nccl && ddp_dtype_size(dt) && ddp__cpu_can_post_pieces(&pg->comm, count, dt);
}

int ddp_pg_post_ready(struct ddp_pg *pg, size_t ready)
{
    if (!pg)
        return DDP_EINVAL;
    return pg->nccl ? 1 : ddp__cpu_post_ready(&pg->comm, ready);
}

void *ddp_pg_mem_alloc(struct ddp_pg *pg, size_t bytes)
{
    void *p = pg ? ddp__arena_alloc(pg->comm.shm.arena, bytes) : NULL;
    if (!p)
        p = calloc(bytes ? bytes : 1, 1);
    return p;
}

bool ddp_pg_mem_registered(struct ddp_pg *pg, const void *p, size_t bytes)
{
    return pg && p && ddp__arena_offset(pg->comm.shm.arena, p, bytes) != DDP__NOT_IN_ARENA;
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
