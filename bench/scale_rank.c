/*
 * A rank of bench/scale.sh: connects to the job's store as every ddprun rank can (the address and
 * token its agent gave it), passes one barrier of WORLD_SIZE ranks, and rank 0 prints the wall
 * time it passed (CLOCK_REALTIME, ns); then each waits to be stopped, as a training rank would.
 */
#include "rendezvous/store.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(void)
{
    const char *rs = getenv("RANK"), *ws = getenv("WORLD_SIZE");
    if (!rs || !ws)
        return 2;
    const char *round = getenv("TORCHELASTIC_RESTART_COUNT");
    char name[64];
    snprintf(name, sizeof(name), "scale/start/%s", round ? round : "0"); /* a round's own */
    struct ddp_store *s = NULL;
    if (ddp_store_connect_env(120000, &s) < 0 || ddp_store_barrier(s, name, atoi(ws), 600000) < 0) {
        fprintf(stderr, "scale_rank %s: no barrier\n", rs);
        return 1;
    }
    if (atoi(rs) == 0) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        printf("barrier %lld\n", (long long)t.tv_sec * 1000000000LL + t.tv_nsec);
        fflush(stdout);
    }
    ddp_store_close(s);
    for (;;)
        pause();
}
