/* The ranks' series for /metrics (cli/diag/metrics.h). */
#include "cli/diag/metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

void ddp__prom_family(struct ddp_buf *out, const char *name, const char *type, const char *help)
{
    char l[512];
    int n = snprintf(l, sizeof(l), "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    ddp_buf_put(out, l, (size_t)(n < (int)sizeof(l) ? n : (int)sizeof(l) - 1));
}

void ddp__prom_escape(struct ddp_buf *out, const char *v)
{
    for (const char *c = v; *c; c++) {
        if (*c == '\\' || *c == '"')
            ddp_buf_put(out, "\\", 1);
        if (*c == '\n')
            ddp_buf_put(out, "\\n", 2);
        else
            ddp_buf_put(out, c, 1);
    }
}

void ddp__prom_sample(struct ddp_buf *out, const char *name, const char *labels, double v)
{
    char l[96];
    int n;
    if (isnan(v))
        n = snprintf(l, sizeof(l), " NaN\n");
    else if (v == floor(v) && fabs(v) < 1e15)
        n = snprintf(l, sizeof(l), " %.0f\n", v);
    else
        n = snprintf(l, sizeof(l), " %.6g\n", v);
    ddp_buf_put(out, name, strlen(name));
    if (labels[0]) {
        ddp_buf_put(out, "{", 1);
        ddp_buf_put(out, labels, strlen(labels));
        ddp_buf_put(out, "}", 1);
    }
    ddp_buf_put(out, l, (size_t)n);
}

/* /proc's state letter as the series' state label. */
static const char *state_label(const struct ddp__diag_rank *r)
{
    if (!r->have)
        return "no_report";
    switch (r->p.state) {
    case 'R':
        return "running";
    case 'S':
    case 'I':
        return "sleeping";
    case 'D':
        return "disk_wait";
    case 'T':
    case 't':
        return "stopped";
    case 'Z':
    case 'X':
        return "exited";
    default:
        return "unknown";
    }
}

void ddp__diag_metrics(const struct ddp__diag *d, int64_t now_ms, const char *const *node_names,
                       const char *job_id, struct ddp_buf *out)
{
    if (d->world <= 0)
        return;
    /* each rank's labels, escaped once */
    struct ddp_buf lb;
    ddp_buf_init(&lb);
    size_t *at = calloc((size_t)d->world + 1, sizeof(*at));
    struct ddp__straggle *st = calloc((size_t)d->world, sizeof(*st));
    if (!at || !st)
        goto out;
    ddp__diag_stragglers(d, st);
    for (int i = 0; i < d->world; i++) {
        char rk[32];
        at[i] = lb.len;
        ddp_buf_put(&lb, "job_id=\"", 8);
        ddp__prom_escape(&lb, job_id);
        ddp_buf_put(&lb, "\",node=\"", 8);
        ddp__prom_escape(&lb, node_names ? node_names[d->r[i].node] : "?");
        int n = snprintf(rk, sizeof(rk), "\",rank=\"%d\"", i);
        ddp_buf_put(&lb, rk, (size_t)n + 1); /* with its NUL */
    }
    if (!lb.data)
        goto out;
#define LABELS(i) ((const char *)lb.data + at[i])
    char with_state[600];
    ddp__prom_family(out, "ddprun_rank_state", "gauge",
                     "The rank's process state (1 for the state it is in; no_report before "
                     "its node's first report of the round).");
    for (int i = 0; i < d->world; i++) {
        snprintf(with_state, sizeof(with_state), "%s,state=\"%s\"", LABELS(i),
                 state_label(&d->r[i]));
        ddp__prom_sample(out, "ddprun_rank_state", with_state, 1);
    }
    ddp__prom_family(out, "ddprun_rank_cpu_seconds_total", "counter",
                     "CPU time (user and system) of the rank's process.");
    for (int i = 0; i < d->world; i++)
        if (d->r[i].have)
            ddp__prom_sample(out, "ddprun_rank_cpu_seconds_total", LABELS(i), d->r[i].p.cpu_s);
    ddp__prom_family(out, "ddprun_rank_cpu_usage_ratio", "gauge",
                     "CPU time per second between the rank's last two reports (ddprun status' "
                     "cpu%, divided by 100).");
    for (int i = 0; i < d->world; i++)
        if (d->r[i].have && d->r[i].rated)
            ddp__prom_sample(out, "ddprun_rank_cpu_usage_ratio", LABELS(i), d->r[i].cpu_pct / 100);
    ddp__prom_family(out, "ddprun_rank_collectives_total", "counter",
                     "Collectives the rank's process group finished (ranks with a flight "
                     "recorder: libddp, or PyTorch under ddprun).");
    for (int i = 0; i < d->world; i++)
        if (d->r[i].have && d->r[i].p.rec)
            ddp__prom_sample(out, "ddprun_rank_collectives_total", LABELS(i),
                             (double)d->r[i].p.completed);
    ddp__prom_family(out, "ddprun_rank_ddp_steps_total", "counter",
                     "DistributedDataParallel steps (a forward and its backward's all-reduces) "
                     "the rank finished, as its recorder saw them.");
    for (int i = 0; i < d->world; i++)
        if (d->r[i].have && d->r[i].p.rec)
            ddp__prom_sample(out, "ddprun_rank_ddp_steps_total", LABELS(i),
                             (double)d->r[i].p.steps);
    ddp__prom_family(out, "ddprun_rank_seconds_since_progress", "gauge",
                     "Seconds since one of the rank's collectives was issued, began or ended.");
    for (int i = 0; i < d->world; i++)
        if (d->r[i].have && d->r[i].p.rec)
            ddp__prom_sample(out, "ddprun_rank_seconds_since_progress", LABELS(i),
                             (double)(d->r[i].p.idle_ms + (now_ms - d->r[i].at_ms)) / 1000);
    ddp__prom_family(out, "ddprun_rank_collective_age_seconds", "gauge",
                     "Seconds since the rank issued the collective it is in (0 when in none).");
    for (int i = 0; i < d->world; i++)
        if (d->r[i].have && d->r[i].p.rec)
            ddp__prom_sample(out, "ddprun_rank_collective_age_seconds", LABELS(i),
                             d->r[i].p.in_coll
                                 ? (double)(d->r[i].p.cur_ms + (now_ms - d->r[i].at_ms)) / 1000
                                 : 0);
    ddp__prom_family(out, "ddprun_rank_last_arrival_ratio", "gauge",
                     "Of the recent collectives every rank reported, the share this rank "
                     "arrived at last.");
    for (int i = 0; i < d->world; i++)
        if (st[i].n > 0)
            ddp__prom_sample(out, "ddprun_rank_last_arrival_ratio", LABELS(i), st[i].last_frac);
    ddp__prom_family(out, "ddprun_rank_late_seconds", "gauge",
                     "Median of how far behind the first rank to arrive this rank arrived at "
                     "the recent collectives.");
    for (int i = 0; i < d->world; i++)
        if (st[i].n > 0)
            ddp__prom_sample(out, "ddprun_rank_late_seconds", LABELS(i), st[i].late_ms / 1000);
    ddp__prom_family(out, "ddprun_rank_straggler", "gauge",
                     "1 where the rank arrives last most of the time, by a margin over the "
                     "noise (ddprun status' STRAGGLER).");
    for (int i = 0; i < d->world; i++)
        if (st[i].n > 0)
            ddp__prom_sample(out, "ddprun_rank_straggler", LABELS(i), st[i].flagged ? 1 : 0);
#undef LABELS
out:
    free(at);
    free(st);
    ddp_buf_release(&lb);
}
