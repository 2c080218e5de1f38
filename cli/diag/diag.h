/*
 * Rank progress as node agents report it to the launcher (issue: which rank, which collective).
 * Each agent reads its ranks' progress pages (common/progress.h) and their processes (/proc)
 * on every heartbeat and publishes one line per rank with its lease (cli/diag/node.c); the
 * launcher parses them (cli/diag/diagnose.c) for the hang report, `ddprun status` and stragglers.
 * This file's functions are the line format, shared by both sides (cli/diag/line.c, a leaf).
 */
#ifndef DDP_CLI_DIAG_H
#define DDP_CLI_DIAG_H

#include "common/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DDP__DIAG_WAITS 32 /* recent collectives per rank, for stragglers */

struct ddp__rank_progress {
    int rank, pid;
    char state;     /* /proc state: R running, S sleeping, D disk, T stopped, Z, ... */
    double cpu_s;   /* user + system time of the process */
    char wchan[48]; /* the kernel function it sleeps in ("" when running or unknown) */
    bool rec;       /* a libddp group keeps its flight recorder in the page */
    uint64_t entered, started, completed;
    uint64_t steps;  /* DDP steps finished (a PyTorch rank's recorder: DDP_PROG_DDP_STEP) */
    int64_t idle_ms; /* since one of the three last moved */
    /* The startup timeline: since the rank's group was formed (its page attached) and since
     * its first collective finished; -1 for not yet (or unknown). */
    int64_t formed_ago_ms, first_ago_ms;
    /* The oldest collective not finished (completed + 1), when entered > completed. */
    bool in_coll;
    int op, dtype, bucket;
    uint64_t bytes;
    int64_t cur_ms;     /* since the rank issued it */
    int64_t cur_run_ms; /* since it began to run, or -1 */
    /* The last collectives that finished: seq and how long each ran (begin to end) on this
     * rank. The rank that arrives last at a collective runs it shortest. */
    int nwaits;
    uint64_t wseq[DDP__DIAG_WAITS];
    uint32_t wus[DDP__DIAG_WAITS];
};

/* Appends one rank's line (ending in '\n'). */
void ddp__diag_line_put(struct ddp_buf *b, const struct ddp__rank_progress *p);
/* Parses one line (without its '\n'): 0, or -1 when it is not one. */
int ddp__diag_line_parse(const char *line, struct ddp__rank_progress *p);

/* "allreduce #1234 (bucket 3, 25.0 MiB)" for a collective, into out. */
void ddp__diag_coll_name(char *out, size_t n, int op, uint64_t seq, int bucket, uint64_t bytes);
/* "stopped (SIGSTOP or a debugger)", "sleeping in futex_wait_queue", "running", ... */
void ddp__diag_state_name(char *out, size_t n, char state, const char *wchan);

#endif
