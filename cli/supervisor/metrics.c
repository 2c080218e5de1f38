/* /metrics (cli/supervisor/metrics.h). */
#include "cli/supervisor/metrics.h"
#include "cli/diag/metrics.h"
#include "cli/spec/args.h"
#include "cli/supervisor/ckpt.h"
#include "cli/supervisor/recovery.h"
#include "cli/supervisor/supervisor.h"
#include "cli/supervisor/watchdog.h"
#include "cli/sys/http_serve.h"
#include "common/err.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static struct ddp__http *g_srv;
static char g_addr[300]; /* where it is served: "host:port" */

/* The buckets of the recovery histogram, seconds (a warm restart takes under 1 s, a cold one
 * a few, torchrun's 10 to 20). */
static const double g_bounds[] = {0.25, 0.5, 1, 2, 5, 10, 30, 60, 120};
#define NBOUNDS (sizeof(g_bounds) / sizeof(g_bounds[0]))

static void job_labels(struct ddp_buf *l)
{
    ddp_buf_put(l, "job_id=\"", 8);
    ddp__prom_escape(l, ddp__supervisor.job_id);
    ddp_buf_put(l, "\"", 2); /* with its NUL */
}

static void node_labels(struct ddp_buf *l, const char *job, size_t i)
{
    l->len = l->off = 0;
    ddp_buf_put(l, job, strlen(job));
    ddp_buf_put(l, ",node=\"", 7);
    ddp__prom_escape(l, ddp__supervisor.job->nodes[i].host);
    ddp_buf_put(l, "\"", 2);
}

static void job_series(struct ddp_buf *out, const char *job)
{
    char l[600];
    ddp__prom_family(out, "ddprun_job_phase", "gauge",
                     "The job's phase (1 for the phase it is in: launching, rendezvous, running, "
                     "restarting, finishing, ...).");
    snprintf(l, sizeof(l), "%s,phase=\"%s\"", job,
             ddp__supervisor.phase_name ? ddp__supervisor.phase_name : "starting");
    ddp__prom_sample(out, "ddprun_job_phase", l, 1);
    ddp__prom_family(out, "ddprun_job_round", "gauge",
                     "The current round (0, then 1 after the "
                     "first restart, ...).");
    ddp__prom_sample(out, "ddprun_job_round", job,
                     ddp__supervisor.round < 0 ? 0 : ddp__supervisor.round);
    ddp__prom_family(out, "ddprun_job_world_size", "gauge", "Ranks in the current round.");
    ddp__prom_sample(out, "ddprun_job_world_size", job, ddp__supervisor.world);
    ddp__prom_family(out, "ddprun_job_restarts_total", "counter",
                     "Rounds started again after a failure or a node's loss.");
    ddp__prom_sample(out, "ddprun_job_restarts_total", job,
                     ddp__supervisor.round > 0 ? ddp__supervisor.round : 0);
    ddp__prom_family(out, "ddprun_job_nodes_lost_total", "counter",
                     "Nodes counted lost (lease ended, connection or agent gone).");
    ddp__prom_sample(out, "ddprun_job_nodes_lost_total", job, ddp__supervisor.nlosses);
    /* the recoveries that reached their first collective: detection to that point */
    int n = 0, done = 0;
    const struct ddp__recovery_rec *r = ddp__rcv_list(&n);
    unsigned long long count[NBOUNDS] = {0};
    double sum = 0;
    for (int k = 0; k < n; k++) {
        if (r[k].ms[4] < 0)
            continue;
        double s = (double)r[k].ms[4] / 1000;
        sum += s;
        done++;
        for (size_t b = 0; b < NBOUNDS; b++)
            count[b] += s <= g_bounds[b];
    }
    ddp__prom_family(out, "ddprun_job_recovery_duration_seconds", "histogram",
                     "Restarts, from the failure's detection to the new round's first "
                     "collective.");
    for (size_t b = 0; b < NBOUNDS; b++) {
        snprintf(l, sizeof(l), "%s,le=\"%g\"", job, g_bounds[b]);
        ddp__prom_sample(out, "ddprun_job_recovery_duration_seconds_bucket", l, (double)count[b]);
    }
    snprintf(l, sizeof(l), "%s,le=\"+Inf\"", job);
    ddp__prom_sample(out, "ddprun_job_recovery_duration_seconds_bucket", l, done);
    ddp__prom_sample(out, "ddprun_job_recovery_duration_seconds_sum", job, sum);
    ddp__prom_sample(out, "ddprun_job_recovery_duration_seconds_count", job, done);
    long long conns, reqs;
    ddp__sup_store_counts(&conns, &reqs);
    if (reqs >= 0) {
        ddp__prom_family(out, "ddprun_job_store_requests_total", "counter",
                         "Requests the job's own store (rendezvous.backend: store) served.");
        ddp__prom_sample(out, "ddprun_job_store_requests_total", job, (double)reqs);
    }
    double lag = ddp__ck_lag_s(-1);
    if (lag >= 0) {
        ddp__prom_family(out, "ddprun_job_checkpoint_replication_lag_seconds", "gauge",
                         "Since the oldest checkpoint file short of its copies was recorded (0: "
                         "none is short).");
        ddp__prom_sample(out, "ddprun_job_checkpoint_replication_lag_seconds", job, lag);
    }
}

static void node_series(struct ddp_buf *out, const char *job)
{
    struct ddp_buf l;
    ddp_buf_init(&l);
    int64_t now = ddp_now_ms();
    size_t nn = ddp__supervisor.job->nnodes;
    ddp__prom_family(out, "ddprun_node_heartbeat_age_seconds", "gauge",
                     "Since the node's agent made the progress report its last heartbeat "
                     "carried (nodes running ranks).");
    for (size_t i = 0; i < nn; i++) {
        const struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        if (!a->heard_ms || a->state == DDP__NS_NONE)
            continue;
        node_labels(&l, job, i);
        ddp__prom_sample(out, "ddprun_node_heartbeat_age_seconds", (const char *)l.data,
                         (double)(now - a->heard_ms) / 1000);
    }
    ddp__prom_family(out, "ddprun_node_up", "gauge",
                     "1 where the node's agent is joined (a member or a spare), else 0.");
    for (size_t i = 0; i < nn; i++) {
        enum ddp__node_state st = ddp__supervisor.nd[i].state;
        node_labels(&l, job, i);
        ddp__prom_sample(out, "ddprun_node_up", (const char *)l.data,
                         st == DDP__NS_READY || st == DDP__NS_RUNNING || st == DDP__NS_STOPPING);
    }
    if (ddp__ck_lag_s(-1) >= 0) {
        ddp__prom_family(out, "ddprun_node_checkpoint_replication_lag_seconds", "gauge",
                         "Since the oldest checkpoint file the node is copying now was recorded "
                         "(0: none).");
        for (size_t i = 0; i < nn; i++) {
            node_labels(&l, job, i);
            ddp__prom_sample(out, "ddprun_node_checkpoint_replication_lag_seconds",
                             (const char *)l.data, ddp__ck_lag_s((int)i));
        }
    }
    ddp_buf_release(&l);
}

void ddp__met_render(struct ddp_buf *out)
{
    struct ddp_buf jl;
    ddp_buf_init(&jl);
    job_labels(&jl);
    if (jl.data) {
        job_series(out, (const char *)jl.data);
        node_series(out, (const char *)jl.data);
    }
    ddp__wd_metrics(ddp__supervisor.job_id, out);
    ddp_buf_release(&jl);
}

static int handler(void *arg, const char *path, struct ddp_buf *body, const char **ctype)
{
    (void)arg;
    if (strcmp(path, "/metrics") == 0) {
        ddp__met_render(body);
        *ctype = "text/plain; version=0.0.4; charset=utf-8";
        return 200;
    }
    const char *m = strcmp(path, "/") == 0 ? "ddprun: the job's metrics are at /metrics\n"
                                           : "not found: the job's metrics are at /metrics\n";
    ddp_buf_put(body, m, strlen(m));
    return strcmp(path, "/") == 0 ? 200 : 404;
}

int ddp__met_start(void)
{
    const struct ddp_job *j = ddp__supervisor.job;
    if (!j->metrics_listen)
        return 0;
    char host[256], why[512], addr[300];
    int port, bound = 0;
    if (ddp_parse_hostport(j->metrics_listen, host, sizeof(host), &port) < 0 ||
        ddp__http_open(ddp__supervisor.loop, host, port, j->metrics_allow, j->nmetrics_allow,
                       "metrics", handler, NULL, &bound, &g_srv, why, sizeof(why)) < 0) {
        ddp__cli_error("metrics.listen %s: %s", j->metrics_listen, why);
        return -1;
    }
    snprintf(addr, sizeof(addr), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, bound);
    snprintf(g_addr, sizeof(g_addr), "%s", addr);
    ddp__sup_say("ddprun: metrics at http://%s/metrics", addr);
    ddp__sup_event("metrics", "addr", addr, NULL);
    return 0;
}

void ddp__met_stop(void)
{
    ddp__http_close(g_srv);
    g_srv = NULL;
    g_addr[0] = '\0';
}

int ddp__met_line(char *buf, size_t n)
{
    if (!g_srv || !n)
        return 0;
    int len = snprintf(buf, n, "metrics: http://%s/metrics", g_addr);
    return len < 0 ? 0 : (size_t)len < n ? len : (int)n - 1;
}
