/* The flight recorder (worker/recorder.h). */
#include "worker/recorder.h"
#include "common/log.h"
#include "common/util.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/banned.h"

struct ddp__recorder {
    struct ddp_progress_page *p;
    bool shared; /* p is the agent's page (mapped), else malloc'd */
};

/* The agent's page, mapped once per process; a group claims it with `attached`. */
static struct ddp_progress_page *agent_page(void)
{
    static _Atomic(struct ddp_progress_page *) page;
    static atomic_flag tried = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&tried)) {
        const char *fd_s = getenv("DDPRUN_PROGRESS_FD");
        char *end;
        long fd = fd_s ? strtol(fd_s, &end, 10) : -1;
        if (fd_s && *end == '\0' && fd >= 0 && fd < 1 << 20) {
            void *m = mmap(NULL, sizeof(struct ddp_progress_page), PROT_READ | PROT_WRITE,
                           MAP_SHARED, (int)fd, 0);
            close((int)fd); /* the mapping keeps the page; children do not need it */
            if (m == MAP_FAILED)
                DDP_WARN(PG,
                         "cannot map the progress page (DDPRUN_PROGRESS_FD=%s); ddprun "
                         "will not see this rank's collectives",
                         fd_s);
            else
                atomic_store(&page, (struct ddp_progress_page *)m);
        }
    }
    return atomic_load(&page);
}

static const char *dtype_name(unsigned dt)
{
    static const char *const names[] = {"f32", "f64", "bf16", "f16", "i32", "i64"};
    return dt < sizeof(names) / sizeof(names[0]) ? names[dt] : "?";
}

struct ddp__recorder *ddp__rec_new(int rank, int world)
{
    const char *on = getenv("DDP_FLIGHT_RECORDER");
    if (on && strcmp(on, "0") == 0)
        return NULL;
    struct ddp__recorder *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    struct ddp_progress_page *p = agent_page();
    uint32_t free_slot = 0;
    if (p && atomic_compare_exchange_strong(&p->attached, &free_slot, 1)) {
        r->p = p;
        r->shared = true;
        /* A page may be reused by a later group of the same process: start it afresh. */
        atomic_store(&p->entered, 0);
        atomic_store(&p->started, 0);
        atomic_store(&p->completed, 0);
        for (unsigned i = 0; i < DDP_PROGRESS_RING; i++)
            atomic_store(&p->ent[i].seq, 0);
        atomic_store(&p->attached_ns, ddp_now_ns());
    } else if (!(r->p = calloc(1, sizeof(*r->p)))) {
        free(r);
        return NULL;
    }
    r->p->magic = DDP_PROGRESS_MAGIC;
    r->p->version = DDP_PROGRESS_VERSION;
    r->p->ring = DDP_PROGRESS_RING;
    r->p->rank = rank;
    r->p->world = world;
    atomic_store(&r->p->changed_ns, ddp_now_ns());
    return r;
}

void ddp__rec_free(struct ddp__recorder *r)
{
    if (!r)
        return;
    if (r->shared)
        atomic_store(&r->p->attached, 0); /* the mapping stays: the agent still reads it */
    else
        free(r->p);
    free(r);
}

uint64_t ddp__rec_enter(struct ddp__recorder *r, enum ddp_progress_op op, int dtype, uint64_t bytes,
                        int bucket)
{
    if (!r)
        return 0;
    struct ddp_progress_page *p = r->p;
    uint64_t seq = atomic_load_explicit(&p->entered, memory_order_relaxed) + 1;
    struct ddp_progress_ent *e = &p->ent[seq % DDP_PROGRESS_RING];
    int64_t t = ddp_now_ns();
    atomic_store_explicit(&e->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    e->op = (uint8_t)op;
    e->dtype = (uint8_t)dtype;
    e->bucket = bucket;
    e->bytes = bytes;
    atomic_store_explicit(&e->t_enq, t, memory_order_relaxed);
    atomic_store_explicit(&e->t_start, 0, memory_order_relaxed);
    atomic_store_explicit(&e->t_end, 0, memory_order_relaxed);
    atomic_store_explicit(&e->result, 0, memory_order_relaxed);
    atomic_store_explicit(&e->seq, seq, memory_order_release);
    atomic_store_explicit(&p->entered, seq, memory_order_release);
    atomic_store_explicit(&p->changed_ns, t, memory_order_relaxed);
    return seq;
}

void ddp__rec_start(struct ddp__recorder *r, uint64_t seq)
{
    if (!r || !seq)
        return;
    int64_t t = ddp_now_ns();
    struct ddp_progress_ent *e = &r->p->ent[seq % DDP_PROGRESS_RING];
    if (atomic_load_explicit(&e->seq, memory_order_relaxed) == seq)
        atomic_store_explicit(&e->t_start, t, memory_order_release);
    atomic_store_explicit(&r->p->started, seq, memory_order_release);
    atomic_store_explicit(&r->p->changed_ns, t, memory_order_relaxed);
}

void ddp__rec_end(struct ddp__recorder *r, uint64_t seq, int result)
{
    if (!r || !seq)
        return;
    int64_t t = ddp_now_ns();
    struct ddp_progress_ent *e = &r->p->ent[seq % DDP_PROGRESS_RING];
    if (atomic_load_explicit(&e->seq, memory_order_relaxed) == seq) {
        atomic_store_explicit(&e->result, result, memory_order_relaxed);
        atomic_store_explicit(&e->t_end, t, memory_order_release);
    }
    atomic_store_explicit(&r->p->completed, seq, memory_order_release);
    atomic_store_explicit(&r->p->changed_ns, t, memory_order_relaxed);
}

void ddp__rec_dump(const struct ddp__recorder *r, FILE *f, unsigned n)
{
    if (!r)
        return;
    const struct ddp_progress_page *p = r->p;
    uint64_t last = atomic_load(&p->entered);
    uint64_t first = last > n ? last - n + 1 : 1;
    int64_t now = ddp_now_ns();
    for (uint64_t s = first; s <= last; s++) {
        struct ddp_progress_ent e;
        if (!ddp_progress_read(p, s, &e))
            continue;
        int64_t enq = atomic_load(&e.t_enq), st = atomic_load(&e.t_start),
                end = atomic_load(&e.t_end);
        fprintf(f, "#%llu %s %s %llu bytes", (unsigned long long)s, ddp_progress_op_name(e.op),
                dtype_name(e.dtype), (unsigned long long)e.bytes);
        if (e.bucket >= 0)
            fprintf(f, " bucket %d", e.bucket);
        if (end)
            fprintf(f, ": %s, waited %.3f ms, ran %.3f ms\n",
                    atomic_load(&e.result) ? "failed" : "done", st ? (double)(st - enq) / 1e6 : 0.0,
                    st ? (double)(end - st) / 1e6 : 0.0);
        else if (st)
            fprintf(f, ": running for %.3f s\n", (double)(now - st) / 1e9);
        else
            fprintf(f, ": queued for %.3f s\n", (double)(now - enq) / 1e9);
    }
}
