/*
 * The launcher's watch over its ranks (cli/supervisor/watchdog.c): it takes the node agents'
 * progress reports into the model of cli/diag/diagnose.h, reports a hang (who is behind, in which
 * collective, doing what, with native stacks) after diagnose.hang_after, applies diagnose.on_hang,
 * and serves `ddprun status` and `ddprun stacks` on the job's control socket. The supervisor
 * (cli/supervisor/rounds.c, cli/supervisor/supervise.c) calls it; it talks to the nodes
 * (cli/supervisor/nodes.h) and the records, and reaches back only through its callbacks (say, fail,
 * headline).
 */
#ifndef DDP_CLI_WATCHDOG_H
#define DDP_CLI_WATCHDOG_H

#include "common/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ddp_loop;
struct ddp_job;
struct ddp__nodes;
struct ddp__rec;

struct ddp__wd_ctx {
    struct ddp_loop *loop;
    const struct ddp_job *job;
    const char *job_id;
    struct ddp__nodes *nodes;
    /* Prints a message to the job's views (the console and ddprun.log). */
    void (*say)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
    struct ddp__rec *rec;
    const int *round;
    /* The hang policy says fail: the round fails with why (as a failed worker would). */
    void (*fail)(const char *why);
    /* One line for `ddprun status`: the job's phase and counts. */
    void (*headline)(char *out, size_t n);
    /* Any other request on the control socket (cli/view/attached.h): true when it took fd. */
    bool (*request)(const char *req, int fd);
    /* Every rank's process group was formed (first false), or its first collective done (true),
     * at at_ms (ddp_now_ms's clock); and a line for `ddprun status` about the last restart (its
     * length, 0 for none). cli/supervisor/recovery.h. */
    void (*startup)(bool first, int64_t at_ms);
    int (*recovery)(char *out, size_t n);
};

/* progress.tsv in the log folder (what `ddprun report` plots): a rank is sampled at its first
 * report of a round, then at most this often, and at the round's end. */
#define DDP__WD_SAMPLE_MS 10000

void ddp__wd_init(const struct ddp__wd_ctx *ctx);
/* Opens the control socket; 0 or -1 (logged: status and stacks are then unavailable). */
int ddp__wd_listen(void);
/* Closes it and forgets everything. */
void ddp__wd_release(void);

/* A round of world ranks starts: node and local index of each. */
void ddp__wd_round(int world, const int *node_of_rank, const int *local_of_rank);
/* The startup timeline of the last round that ran (its number, -1 for none): seconds after its
 * ranks were started until every rank's process group was formed and its first collective
 * finished, each -1 where not every rank reported it (events group_formed, first_collective). */
void ddp__wd_startup(int *round, double *formed_s, double *first_s);
/* The round's workers are stopping: no hang reports until the next round. */
void ddp__wd_round_end(void);
/* The current round's ranks as Prometheus series (cli/diag/metrics.h), from the model
 * `ddprun status` shows; nothing between rounds. */
void ddp__wd_metrics(const char *job_id, struct ddp_buf *out);
/* Node node's progress report (cli/diag/diag.h lines); takes report (malloc'd). */
void ddp__wd_progress(int node, char *report);
/* Node node's STACKS_REPLY. */
void ddp__wd_stacks_reply(int node, const uint8_t *body, size_t len);

#endif
