/*
 * The launcher's model of the ranks' progress (cli/diag/diagnose.c): what the node agents last
 * reported of each rank of the current round (cli/diag/diag.h lines), and what follows from it: the
 * hang report (who is behind, in which collective, doing what), stragglers (who arrives last at
 * collectives, by how much) and the `ddprun status` table. No I/O: cli/supervisor/watchdog.c feeds
 * it and shows what it finds.
 */
#ifndef DDP_CLI_DIAGNOSE_H
#define DDP_CLI_DIAGNOSE_H

#include "cli/diag/diag.h"
#include "common/buf.h"

#include <stdbool.h>
#include <stdint.h>

struct ddp__diag_rank {
    bool have; /* a report arrived this round */
    int node;
    struct ddp__rank_progress p;
    int64_t at_ms; /* when it arrived (ddp_now_ms) */
    /* an older report, for rates */
    int64_t prev_at_ms;
    uint64_t prev_completed;
    double prev_cpu_s, coll_per_s, cpu_pct;
    bool rated; /* the two rates are known */
};

struct ddp__diag {
    int world;
    struct ddp__diag_rank *r; /* [world] */
    /* The last stuck point reported: every rank's counters then. */
    bool reported;
    uint64_t reported_sig;
};

/* A new round of world ranks; node_of_rank[r] is each rank's node index. 0 or DDP_ENOMEM. */
int ddp__diag_reset(struct ddp__diag *d, int world, const int *node_of_rank);
void ddp__diag_release(struct ddp__diag *d);
/* A node's progress report (lines of cli/diag/diag.h), received at now_ms. */
void ddp__diag_take(struct ddp__diag *d, int node, const char *report, int64_t now_ms);

struct ddp__hang {
    uint64_t seq;     /* the first collective not every rank has finished */
    char what[160];   /* "allreduce #1234 (bucket 3, 25.0 MiB)", or "collective #1234" */
    int64_t stuck_ms; /* since the last progress of any rank */
    int nbehind;      /* ranks that have not issued it (behind[]), else those still in it */
    int *behind;
    bool entered_by_all; /* every rank issued it: behind[] lists those that did not finish */
    bool mismatch;       /* ranks are in different operations at seq: behind[] lists those in
                          * the less common ones (every one of them on a tie) */
    char text[4096];     /* the report, a line per rank named */
};

/*
 * Whether the ranks that keep a flight recorder have all made no progress for hang_after_ms,
 * at a stuck point not reported yet: then h describes it (release with ddp__diag_hang_release).
 * node_names[i] names node i.
 */
bool ddp__diag_hang(struct ddp__diag *d, int64_t now_ms, int64_t hang_after_ms,
                    const char *const *node_names, struct ddp__hang *h);
void ddp__diag_hang_release(struct ddp__hang *h);

/* Over the collectives every rank reported recently: how often each rank arrived last, and
 * its median lateness behind the first to arrive. */
struct ddp__straggle {
    int n;            /* collectives compared */
    double last_frac; /* of them, the share where this rank arrived last */
    double late_ms;   /* median of (longest run among the ranks - this rank's run) */
    bool flagged;     /* last most of the time, by a margin over the noise */
};
void ddp__diag_stragglers(const struct ddp__diag *d, struct ddp__straggle *out);

/* The round's startup timeline from the ranks' reports: when every rank's process group had
 * been formed (first: false) or its first collective had finished (first: true), in the clock of
 * ddp__diag_take's now_ms (the latest over the ranks; both are collective, so the ranks differ
 * by little). False until every rank has reported it. */
bool ddp__diag_startup(const struct ddp__diag *d, bool first, int64_t *at_ms);

/* The `ddprun status` table, a row per rank. */
void ddp__diag_status(const struct ddp__diag *d, int64_t now_ms, const char *const *node_names,
                      struct ddp_buf *out);

/* Stacks of n ranks (texts as the stack tool printed them), identical ones printed once with
 * the ranks that share them. */
void ddp__diag_group_stacks(struct ddp_buf *out, int n, const int *ranks, char *const *texts);

#endif
