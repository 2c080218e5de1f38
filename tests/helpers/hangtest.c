/*
 * A rank for the diagnosis tests (tests/integration/90-diagnose.bats): steps of "compute" (a
 * sleep) and one all-reduce of a gradient bucket (bucket 3), under ddprun. One rank can be made
 * to misbehave before collective #S: stop itself (SIGSTOP), or spin forever outside any
 * collective; or to compute slower (a straggler); or to start late (before its group forms).
 *
 * usage: hangtest [--steps N] [--compute-ms M] [--count K] [--stop-rank R --stop-at S]
 *                 [--spin-rank R --spin-at S] [--slow-rank R --slow-factor F]
 *                 [--late-rank R --late-ms M] [--stamp FILE] [--stacks-handler-ms M]
 * --stamp: the misbehaving rank writes the wall time (s) at which it misbehaves there.
 * --stacks-handler-ms: every rank handles the Python stacks' signal as faulthandler does
 * (DDPRUN_PY_STACKS_SIG, no SA_NODEFER), writing a traceback to DDPRUN_PY_STACKS_FD, then takes
 * M ms more before it returns: a stack taken before then shows hangtest_in_stacks_handler.
 */
#include "worker/pg.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long spins;

/* Named, and kept out of line, so that a stack shows where the rank is. */
__attribute__((noinline)) void hangtest_spin_forever_outside_collectives(void)
{
    for (;;)
        spins++;
}

__attribute__((noinline)) void hangtest_stop_self(void)
{
    raise(SIGSTOP);
    spins++; /* not a tail call: this frame stays on the stack */
}

static int stacks_fd = -1;
static long stacks_handler_ms;

/* As faulthandler's handler: the traceback at once, then (here) a slow return. */
__attribute__((noinline)) void hangtest_in_stacks_handler(int sig)
{
    (void)sig;
    static const char tb[] = "Current thread 0x0000000000000001 (most recent call first):\n"
                             "  File \"hangtest.py\", line 1 in step\n";
    if (write(stacks_fd, tb, sizeof(tb) - 1) < 0)
        return;
    struct timespec ts = {.tv_sec = stacks_handler_ms / 1000,
                          .tv_nsec = stacks_handler_ms % 1000 * 1000000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void stacks_handler(long ms)
{
    const char *fd = getenv("DDPRUN_PY_STACKS_FD"), *sig = getenv("DDPRUN_PY_STACKS_SIG");
    if (!fd || !sig)
        return;
    stacks_fd = atoi(fd);
    stacks_handler_ms = ms;
    struct sigaction sa = {.sa_handler = hangtest_in_stacks_handler, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(atoi(sig), &sa, NULL);
}

static void stamp(const char *file)
{
    if (!file)
        return;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    FILE *f = fopen(file, "w");
    if (f) {
        fprintf(f, "%ld.%06ld\n", (long)tv.tv_sec, (long)tv.tv_usec);
        fclose(f);
    }
}

static void sleep_ms(double ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                          .tv_nsec = (long)((ms - 1000 * (double)(time_t)(ms / 1000)) * 1e6)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

int main(int argc, char **argv)
{
    int steps = 20, count = 1024, stop_rank = -1, spin_rank = -1, slow_rank = -1, late_rank = -1;
    long stop_at = -1, spin_at = -1;
    double compute_ms = 20, slow = 1.0, late_ms = 0;
    const char *stampfile = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--steps"))
            steps = atoi(v);
        else if (!strcmp(k, "--compute-ms"))
            compute_ms = atof(v);
        else if (!strcmp(k, "--count"))
            count = atoi(v);
        else if (!strcmp(k, "--stop-rank"))
            stop_rank = atoi(v);
        else if (!strcmp(k, "--stop-at"))
            stop_at = atol(v);
        else if (!strcmp(k, "--spin-rank"))
            spin_rank = atoi(v);
        else if (!strcmp(k, "--spin-at"))
            spin_at = atol(v);
        else if (!strcmp(k, "--slow-rank"))
            slow_rank = atoi(v);
        else if (!strcmp(k, "--slow-factor"))
            slow = atof(v);
        else if (!strcmp(k, "--late-rank"))
            late_rank = atoi(v);
        else if (!strcmp(k, "--late-ms"))
            late_ms = atof(v);
        else if (!strcmp(k, "--stamp"))
            stampfile = v;
        else if (!strcmp(k, "--stacks-handler-ms"))
            stacks_handler(atol(v));
        else {
            fprintf(stderr, "hangtest: unknown option %s\n", k);
            return 2;
        }
    }
    const char *r_env = getenv("RANK");
    if (r_env && atoi(r_env) == late_rank)
        sleep_ms(late_ms); /* a rank slow to start: the group forms when it arrives */
    struct ddp_pg *pg;
    if (ddp_pg_init_env(NULL, &pg) != 0) {
        fprintf(stderr, "hangtest: cannot form the group\n");
        return 1;
    }
    int rank = ddp_pg_rank(pg);
    float *g = calloc((size_t)count, sizeof(float));
    for (long s = 1; s <= steps; s++) { /* collective #s */
        sleep_ms(rank == slow_rank ? compute_ms * slow : compute_ms);
        if (rank == stop_rank && s == stop_at) {
            printf("rank %d: stopping itself before collective #%ld\n", rank, s);
            fflush(stdout);
            stamp(stampfile);
            hangtest_stop_self();
        }
        if (rank == spin_rank && s == spin_at) {
            printf("rank %d: spinning before collective #%ld\n", rank, s);
            fflush(stdout);
            stamp(stampfile);
            hangtest_spin_forever_outside_collectives();
        }
        for (int i = 0; i < count; i++)
            g[i] = (float)(rank + i);
        struct ddp_work *w;
        if (ddp_pg_allreduce_start_bucket(pg, g, (size_t)count, DDP_F32, DDP_SUM, 3, &w) != 0 ||
            ddp_work_wait(w) != 0) {
            fprintf(stderr, "rank %d: collective #%ld failed: %s\n", rank, s,
                    ddp_pg_last_error(pg));
            return 1;
        }
        ddp_work_free(w);
    }
    printf("rank %d: %d steps done\n", rank, steps);
    free(g);
    ddp_pg_free(pg);
    return 0;
}
