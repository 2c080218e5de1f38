/*
 * What the flight recorder adds to one collective: the three calls a process group makes per
 * collective (enter under the group's lock, start, end), timed over many collectives, in the
 * private ring and in a shared page as under ddprun (a memfd given as DDPRUN_PROGRESS_FD).
 * Prints "RESULT <where> <ns per collective>", the median of 9 runs of 1,000,000.
 */
#include "common/progress.h"
#include "common/util.h"
#include "worker/recorder.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define N 1000000
#define RUNS 9

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double ns_per_collective(struct ddp__recorder *r)
{
    double t[RUNS];
    for (int k = 0; k < RUNS; k++) {
        int64_t t0 = ddp_now_ns();
        for (int i = 0; i < N; i++) {
            uint64_t s = ddp__rec_enter(r, DDP_PROG_ALLREDUCE, 0, 4096, i & 7);
            ddp__rec_start(r, s);
            ddp__rec_end(r, s, 0);
        }
        t[k] = (double)(ddp_now_ns() - t0) / N;
    }
    qsort(t, RUNS, sizeof(double), cmp_d);
    return t[RUNS / 2];
}

int main(void)
{
    /* the shared page: the first recorder made after DDPRUN_PROGRESS_FD is set claims it, the
     * second keeps a private ring */
    int fd = memfd_create("ddprun-progress", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, sizeof(struct ddp_progress_page)) != 0) {
        perror("memfd");
        return 1;
    }
    char s[16];
    snprintf(s, sizeof(s), "%d", fd);
    setenv("DDPRUN_PROGRESS_FD", s, 1);
    struct ddp__recorder *shared = ddp__rec_new(0, 2), *priv = ddp__rec_new(0, 2);
    if (!shared || !priv) {
        fprintf(stderr, "recorder_cost: no recorder (DDP_FLIGHT_RECORDER=0?)\n");
        return 1;
    }
    printf("RESULT shared %.1f\n", ns_per_collective(shared));
    printf("RESULT private %.1f\n", ns_per_collective(priv));
    ddp__rec_free(priv);
    ddp__rec_free(shared);
    return 0;
}
