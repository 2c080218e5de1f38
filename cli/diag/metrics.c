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

/* A rank's series after its state: one value each, NaN where the rank has none. */
static const struct {
    const char *name, *type, *help;
} g_fams[] = {
    {"ddprun_rank_cpu_seconds_total", "counter",
     "CPU time (user and system) of the rank's process."},
    {"ddprun_rank_cpu_usage_ratio", "gauge",
     "CPU time per second between the rank's last two reports (ddprun status' cpu%, divided by "
     "100)."},
    {"ddprun_rank_collectives_total", "counter",
     "Collectives the rank's process group finished (ranks with a flight recorder: libddp, or "
     "PyTorch under ddprun)."},
    {"ddprun_rank_ddp_steps_total", "counter",
     "DistributedDataParallel steps (a forward and its backward's all-reduces) the rank finished, "
     "as its recorder saw them."},
    {"ddprun_rank_seconds_since_progress", "gauge",
     "Seconds since one of the rank's collectives was issued, began or ended."},
    {"ddprun_rank_collective_age_seconds", "gauge",
     "Seconds since the rank issued the collective it is in (0 when in none)."},
    {"ddprun_rank_last_arrival_ratio", "gauge",
     "Of the recent collectives every rank reported, the share this rank arrived at last."},
    {"ddprun_rank_late_seconds", "gauge",
     "Median of how far behind the first rank to arrive this rank arrived at the recent "
     "collectives."},
    {"ddprun_rank_straggler", "gauge",
     "1 where the rank arrives last most of the time, by a margin over the noise (ddprun status' "
     "STRAGGLER)."},
};

/* Family k's value for rank r (its straggle s), in the order of g_fams. */
static double value(int k, const struct ddp__diag_rank *r, const struct ddp__straggle *s,
                    int64_t now_ms)
{
    bool rec = r->have && r->p.rec;
    double since = (double)(now_ms - r->at_ms);
    switch (k) {
    case 0:
        return r->have ? r->p.cpu_s : NAN;
    case 1:
        return r->have && r->rated ? r->cpu_pct / 100 : NAN;
    case 2:
        return rec ? (double)r->p.completed : NAN;
    case 3:
        return rec ? (double)r->p.steps : NAN;
    case 4:
        return rec ? ((double)r->p.idle_ms + since) / 1000 : NAN;
    case 5:
        return !rec ? NAN : r->p.in_coll ? ((double)r->p.cur_ms + since) / 1000 : 0;
    case 6:
        return s->n > 0 ? s->last_frac : NAN;
    case 7:
        return s->n > 0 ? s->late_ms / 1000 : NAN;
    default:
        return s->n > 0 ? (s->flagged ? 1 : 0) : NAN;
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
    for (size_t k = 0; k < sizeof(g_fams) / sizeof(g_fams[0]); k++) {
        ddp__prom_family(out, g_fams[k].name, g_fams[k].type, g_fams[k].help);
        for (int i = 0; i < d->world; i++) {
            double v = value((int)k, &d->r[i], &st[i], now_ms);
            if (!isnan(v))
                ddp__prom_sample(out, g_fams[k].name, LABELS(i), v);
        }
    }
#undef LABELS
out:
    free(at);
    free(st);
    ddp_buf_release(&lb);
}
