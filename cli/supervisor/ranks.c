/*
 * The supervisor's state (ddp__supervisor, a leaf: this file calls none of the files that use it)
 * and its book of the current round's ranks: each rank's output to the views, its last lines, how
 * it ended.
 */
#include "cli/supervisor/supervisor.h"
#include "rendezvous/store.h"
#include "cli/supervisor/watchdog.h"
#include "common/buf.h"
#include "common/util.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

struct ddp__sup ddp__supervisor;

static void keep_tail(struct ddp__sup_rank *r, const uint8_t *line, size_t n)
{
    if (r->ntail == DDP__SUP_TAIL_LINES) {
        free(r->tail[0]);
        memmove(r->tail, r->tail + 1, (DDP__SUP_TAIL_LINES - 1) * sizeof(char *));
        r->ntail--;
    }
    r->tail[r->ntail++] = strndup((const char *)line, n > 500 ? 500 : n);
}

/* A line of a rank's output (progress: a line it rewrites in place, kept out of its log). */
void ddp__sup_rank_output(int rank, int stream, const uint8_t *line, size_t n, unsigned flags)
{
    struct ddp__sup_rank *r = &ddp__supervisor.rk[rank];
    bool *cut = &r->cut[stream == 2];
    if (*cut && !(flags & DDP__LINE_PROGRESS))
        flags |= DDP__LINE_REST;
    for (int v = 0; v < ddp__supervisor.nviews; v++)
        if (ddp__supervisor.views[v].ops->rank_line)
            ddp__supervisor.views[v].ops->rank_line(ddp__supervisor.views[v].self, rank,
                                                    ddp__supervisor.job->nodes[r->node].host,
                                                    stream, line, n, flags);
    if (!(flags & DDP__LINE_PROGRESS)) {
        *cut = flags & DDP__LINE_CUT;
        keep_tail(r, line, n);
    }
}

/* How rank r ended, in the records' one model. */
struct ddp__outcome ddp__sup_outcome(int rank)
{
    const struct ddp__sup_rank *r = &ddp__supervisor.rk[rank];
    if (r->lost)
        return (struct ddp__outcome){.state = DDP__RS_LOST};
    if (!r->exited)
        return (struct ddp__outcome){.state = DDP__RS_RUNNING};
    struct ddp__outcome o = ddp__outcome_of(r->code, r->exec_failed);
    o.stopped = r->stopped;
    return o;
}

void ddp__sup_rank_error(int rank, const uint8_t *body, size_t len)
{
    struct ddp__sup_rank *r = &ddp__supervisor.rk[rank];
    struct ddp_rd rd;
    const uint8_t *m, *t;
    uint32_t mn, tn;
    ddp_rd_init(&rd, body, len);
    if (r->error || ddp_rd_str(&rd, 4096, &m, &mn) < 0 || mn == 0 ||
        ddp_rd_str(&rd, 65536, &t, &tn) < 0 || ddp_rd_left(&rd))
        return; /* one per rank; a malformed one is ignored, as other rank frames are */
    r->error = strndup((const char *)m, mn);
    r->traceback = tn ? strndup((const char *)t, tn) : NULL;
    for (char *p = r->error; p && *p; p++) /* one line in messages and the event log */
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

void ddp__sup_release_ranks(void)
{
    for (int i = 0; ddp__supervisor.rk && i < ddp__supervisor.total_slots; i++) {
        struct ddp__sup_rank *r = &ddp__supervisor.rk[i];
        for (int k = 0; k < r->ntail; k++)
            free(r->tail[k]);
        free(r->error);
        free(r->traceback);
        memset(r, 0, sizeof(*r));
    }
}

int ddp__sup_ranks_reserve(int n)
{
    if (n <= ddp__supervisor.total_slots && ddp__supervisor.rk)
        return 0;
    n = n < 1 ? 1 : n;
    struct ddp__sup_rank *rk = realloc(ddp__supervisor.rk, (size_t)n * sizeof(*rk));
    if (!rk)
        return -1;
    int had = ddp__supervisor.rk ? ddp__supervisor.total_slots : 0;
    memset(rk + had, 0, (size_t)(n - had) * sizeof(*rk));
    ddp__supervisor.rk = rk;
    ddp__supervisor.total_slots = n;
    return 0;
}

void ddp__sup_describe_exit(int code, char *buf, size_t n)
{
    if (code < 0)
        snprintf(buf, n, "was killed by signal %d (%s)", -code, strsignal(-code));
    else
        snprintf(buf, n, "exited with status %d", code);
}

/* The views and the watchdog learn the round's ranks (the records open the rank logs). */
void ddp__sup_announce_round(void)
{
    const char **hosts = calloc((size_t)ddp__supervisor.world + 1, sizeof(*hosts));
    for (int r = 0; hosts && r < ddp__supervisor.world; r++)
        hosts[r] = ddp__supervisor.job->nodes[ddp__supervisor.rk[r].node].host;
    for (int v = 0; v < ddp__supervisor.nviews; v++)
        if (ddp__supervisor.views[v].ops->round)
            ddp__supervisor.views[v].ops->round(
                ddp__supervisor.views[v].self, ddp__supervisor.round, ddp__supervisor.world, hosts);
    free(hosts);
    int *node_of = calloc((size_t)ddp__supervisor.world + 1, sizeof(int)),
        *local_of = calloc((size_t)ddp__supervisor.world + 1, sizeof(int));
    for (int r = 0; node_of && local_of && r < ddp__supervisor.world; r++) {
        node_of[r] = ddp__supervisor.rk[r].node;
        local_of[r] = ddp__supervisor.rk[r].local;
    }
    if (node_of && local_of)
        ddp__wd_round(ddp__supervisor.world, node_of, local_of);
    free(node_of);
    free(local_of);
}

void ddp__sup_say(const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1;
    for (int v = 0; v < ddp__supervisor.nviews; v++)
        if (ddp__supervisor.views[v].ops->message)
            ddp__supervisor.views[v].ops->message(ddp__supervisor.views[v].self, buf, len);
}

void ddp__sup_draw_status(void)
{
    struct ddp__status st = {.phase = ddp__supervisor.phase_name,
                             .ranks_up = ddp__supervisor.ranks_up - ddp__supervisor.ranks_done,
                             .world = ddp__supervisor.world,
                             .restarts = ddp__supervisor.round,
                             .elapsed_ms = ddp_now_ms() - ddp__supervisor.t0};
    for (int v = 0; v < ddp__supervisor.nviews; v++)
        if (ddp__supervisor.views[v].ops->status)
            ddp__supervisor.views[v].ops->status(ddp__supervisor.views[v].self, &st);
}
void ddp__sup_set_phase(const char *phase)
{
    ddp__supervisor.phase_name = phase;
    if (ddp__supervisor.tty)
        ddp__sup_draw_status();
    else if (strcmp(phase, "running") == 0 || strcmp(phase, "stopping") == 0)
        ddp__sup_say("ddprun: %s", phase); /* the others have their own lines */
}

const char *ddp__sup_node_addr(int i)
{
    return ddp__supervisor.node_addr && ddp__supervisor.node_addr[i]
               ? ddp__supervisor.node_addr[i]
               : ddp__supervisor.job->nodes[i].host;
}

void ddp__sup_store_counts(long long *conns, long long *requests)
{
    struct ddp_store_server_stats st;
    *conns = *requests = -1;
    if (!ddp__supervisor.srv)
        return;
    ddp_store_server_get_stats(ddp__supervisor.srv, &st);
    *conns = (long long)st.conns_accepted;
    *requests = (long long)st.requests;
}
