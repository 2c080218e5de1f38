/*
 * A rank of bench/metrics_scrape.sh: it keeps a flight recorder as a training rank's does
 * (the progress page its agent gave it, DDPRUN_PROGRESS_FD; common/progress.h) and records an
 * all-reduce every 100 ms without any network, so that a job of many such ranks gives the
 * launcher's /metrics every series a real job gives, at no cost to the machine.
 */
#include "common/progress.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int main(void)
{
    const char *fd_s = getenv("DDPRUN_PROGRESS_FD"), *rs = getenv("RANK"),
               *ws = getenv("WORLD_SIZE");
    if (!fd_s || !rs || !ws)
        return 2;
    struct ddp_progress_page *p =
        mmap(NULL, sizeof(*p), PROT_READ | PROT_WRITE, MAP_SHARED, atoi(fd_s), 0);
    if (p == MAP_FAILED)
        return 1;
    p->magic = DDP_PROGRESS_MAGIC;
    p->version = DDP_PROGRESS_VERSION;
    p->ring = DDP_PROGRESS_RING;
    p->rank = atoi(rs);
    p->world = atoi(ws);
    atomic_store(&p->attached_ns, now_ns());
    atomic_store(&p->attached, 1);
    for (uint64_t seq = 1;; seq++) {
        struct ddp_progress_ent *e = &p->ent[seq % DDP_PROGRESS_RING];
        atomic_store(&e->seq, 0);
        e->op = DDP_PROG_ALLREDUCE;
        e->dtype = 0;
        e->bucket = (int32_t)(seq % 4);
        e->bytes = 25u << 20;
        int64_t t = now_ns();
        atomic_store(&e->t_enq, t);
        atomic_store(&e->t_start, t + 1000);
        atomic_store(&e->t_end, t + 2000000 + (int64_t)(p->rank % 7) * 100000);
        atomic_store(&e->result, 0);
        atomic_store(&e->seq, seq);
        atomic_store(&p->entered, seq);
        atomic_store(&p->started, seq);
        atomic_store(&p->completed, seq);
        atomic_store(&p->changed_ns, now_ns());
        usleep(100000);
    }
}
