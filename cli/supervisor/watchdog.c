/* The launcher's watch over its ranks (cli/supervisor/watchdog.h). */
#include "cli/supervisor/watchdog.h"
#include "cli/proto/agent_proto.h"
#include "cli/sys/sys.h"
#include "cli/diag/diagnose.h"
#include "cli/diag/metrics.h"
#include "cli/spec/job.h"
#include "cli/supervisor/nodes.h"
#include "cli/view/record.h"
#include "common/buf.h"
#include "common/list.h"
#include "common/log.h"
#include "common/util.h"
#include "common/loop.h"

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/banned.h"

#define STACKS_TIMEOUT_MS 15000 /* agents answer within their tools' 10 s */
#define CLIENT_LINE 256

/* A stack collection: for the hang report (client -1) or a `ddprun stacks` client. */
struct sreq {
    uint32_t id;
    int client;
    char fail_why[1024]; /* hang: what the policy fails the round with, "" to wait */
    int nmap, *map_node, *map_local, *map_rank; /* the ranks asked for */
    bool *waiting;                              /* [nnodes]: a reply is due */
    int pending;
    int n, *ranks;
    char **texts;
    struct ddp_timer timer;
    struct sreq *next;
};

struct client {
    char line[CLIENT_LINE];
    size_t len;
};

static struct {
    struct ddp__wd_ctx c;
    struct ddp__diag d;
    int world, *node_of, *local_of;
    const char **names;
    bool running;
    struct ddp_timer tick;
    int lfd;
    char sock[PATH_MAX];
    struct sreq *reqs;
    uint32_t next_id;
    /* The round's startup timeline: when its ranks were started, and how long after that the
     * last rank's group was formed [0] and its first collective finished [1] (-1: not yet). */
    int64_t round_start_ms, startup_ms[2];
    int startup_round;
    /* progress.tsv: each rank's progress, sampled for `ddprun report` */
    FILE *samples;
    int64_t *sampled_at; /* [world]: when each rank was last sampled (0: not this round) */
} W = {.lfd = -1, .startup_ms = {-1, -1}, .startup_round = -1};

static void say(const char *msg)
{
    W.c.say("%s", msg);
}

/* Each line of text as a message. */
static void say_lines(const char *text)
{
    for (const char *l = text; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        char line[1024];
        snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) ? len : sizeof(line) - 1), l);
        say(line);
        l = nl ? nl + 1 : NULL;
    }
}

/* Writes all of text to a client and closes it (a client that does not read is cut off). */
static void reply_close(int fd, const char *text, size_t len)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    ddp_write_all(fd, text, len);
    close(fd);
}

/* ------------------------------------------------------------------ */
/* Stack collections                                                  */
/* ------------------------------------------------------------------ */

static void sreq_free(struct sreq *q)
{
    ddp_timer_stop(W.c.loop, &q->timer);
    for (int i = 0; i < q->n; i++)
        free(q->texts[i]);
    free(q->texts);
    free(q->ranks);
    free(q->map_node);
    free(q->map_local);
    free(q->map_rank);
    free(q->waiting);
    if (q->client >= 0)
        close(q->client);
    free(q);
}

static void sreq_unlink(struct sreq *q)
{
    for (struct sreq **p = &W.reqs; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            return;
        }
}

/* Every asked node answered, or the time is up. */
static void sreq_done(struct sreq *q)
{
    sreq_unlink(q);
    struct ddp_buf b;
    ddp_buf_init(&b);
    /* in rank order */
    for (int i = 1; i < q->n; i++)
        for (int k = i; k > 0 && q->ranks[k - 1] > q->ranks[k]; k--) {
            int tr = q->ranks[k];
            char *tt = q->texts[k];
            q->ranks[k] = q->ranks[k - 1];
            q->texts[k] = q->texts[k - 1];
            q->ranks[k - 1] = tr;
            q->texts[k - 1] = tt;
        }
    ddp__diag_group_stacks(&b, q->n, q->ranks, q->texts);
    for (size_t i = 0; W.c.job && i < W.c.job->nnodes; i++)
        if (q->waiting[i]) {
            char line[400];
            int len = snprintf(line, sizeof(line), "(node %s did not answer in %d s)\n", W.names[i],
                               STACKS_TIMEOUT_MS / 1000);
            ddp_buf_put(&b, line, (size_t)len);
        }
    if (q->n == 0 && b.len == 0)
        ddp_buf_put(&b, "(no rank is running)\n", 21);
    ddp_buf_put(&b, "", 1);
    if (q->client >= 0) {
        reply_close(q->client, (const char *)b.data, b.len - 1);
        q->client = -1;
    } else {
        say("ddprun: native stacks of the ranks named above:");
        say_lines((const char *)b.data);
        ddp__rec_event(W.c.rec, *W.c.round, "hang_stacks", "stacks", (const char *)b.data, NULL);
        if (q->fail_why[0] && W.running)
            W.c.fail(q->fail_why);
    }
    ddp_buf_release(&b);
    sreq_free(q);
}

static void on_sreq_timeout(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    sreq_done(DDP_CONTAINER_OF(t, struct sreq, timer));
}

/* Asks the nodes of ranks[0..n) (all of the round when n < 0) for their stacks; the answer
 * goes to client (which this takes), or to the views when it is -1. NULL when it was answered
 * at once or could not be asked. */
static struct sreq *sreq_start(const int *ranks, int n, int client)
{
    struct sreq *q = calloc(1, sizeof(*q));
    size_t nn = W.c.job->nnodes;
    int cnt = n < 0 ? W.world : n;
    if (!q) {
        if (client >= 0)
            close(client);
        return NULL;
    }
    q->client = client;
    q->id = ++W.next_id;
    q->map_node = calloc((size_t)cnt + 1, sizeof(int));
    q->map_local = calloc((size_t)cnt + 1, sizeof(int));
    q->map_rank = calloc((size_t)cnt + 1, sizeof(int));
    q->waiting = calloc(nn, sizeof(bool));
    q->ranks = calloc((size_t)cnt + 1, sizeof(int));
    q->texts = calloc((size_t)cnt + 1, sizeof(char *));
    int *local = calloc((size_t)cnt + 1, sizeof(int));
    if (!q->map_node || !q->map_local || !q->map_rank || !q->waiting || !q->ranks || !q->texts ||
        !local) {
        free(local);
        sreq_free(q); /* closes the client */
        return NULL;
    }
    for (int k = 0; k < cnt; k++) {
        int r = n < 0 ? k : ranks[k];
        if (r < 0 || r >= W.world)
            continue;
        q->map_node[q->nmap] = W.node_of[r];
        q->map_local[q->nmap] = W.local_of[r];
        q->map_rank[q->nmap++] = r;
    }
    for (size_t i = 0; i < nn; i++) {
        int nl = 0;
        for (int k = 0; k < q->nmap; k++)
            if (q->map_node[k] == (int)i)
                local[nl++] = q->map_local[k];
        if (nl == 0)
            continue;
        q->waiting[i] = true;
        q->pending++;
        ddp__nodes_stacks(W.c.nodes, (int)i, q->id, local, nl);
    }
    free(local);
    q->next = W.reqs;
    W.reqs = q;
    ddp_timer_init(&q->timer, on_sreq_timeout);
    if (q->pending == 0) {
        sreq_done(q);
        return NULL;
    }
    ddp_timer_start(W.c.loop, &q->timer, STACKS_TIMEOUT_MS);
    return q;
}

void ddp__wd_stacks_reply(int node, const uint8_t *body, size_t len)
{
    struct ddp_rd rd;
    uint32_t id, n;
    ddp_rd_init(&rd, body, len);
    if (ddp_rd_u32(&rd, &id) < 0 || ddp_rd_u32(&rd, &n) < 0)
        return;
    struct sreq *q = W.reqs;
    while (q && q->id != id)
        q = q->next;
    if (!q || node < 0 || (size_t)node >= W.c.job->nnodes || !q->waiting[node])
        return;
    for (uint32_t e = 0; e < n; e++) {
        uint32_t lr, pid, tl;
        const uint8_t *t;
        if (ddp_rd_u32(&rd, &lr) < 0 || ddp_rd_u32(&rd, &pid) < 0 ||
            ddp_rd_str(&rd, DDP__AGENT_MAX_FRAME, &t, &tl) < 0)
            break;
        int rank = -1;
        for (int k = 0; k < q->nmap; k++)
            if (q->map_node[k] == node && q->map_local[k] == (int)lr)
                rank = q->map_rank[k];
        if (rank < 0 || q->n >= q->nmap)
            continue;
        char *text = malloc((size_t)tl + 1);
        if (!text)
            continue;
        memcpy(text, t, tl);
        text[tl] = '\0';
        q->ranks[q->n] = rank;
        q->texts[q->n++] = text;
    }
    q->waiting[node] = false;
    if (--q->pending == 0)
        sreq_done(q);
}

/* ------------------------------------------------------------------ */
/* The hang report                                                    */
/* ------------------------------------------------------------------ */

/* Records each step of the round's startup once every rank has reported it. */
static void startup(void)
{
    static const char *const ev[2] = {"group_formed", "first_collective"};
    for (int k = 0; k < 2; k++) {
        int64_t at;
        if (W.startup_ms[k] >= 0 || !ddp__diag_startup(&W.d, k == 1, &at))
            continue;
        W.startup_ms[k] = at > W.round_start_ms ? at - W.round_start_ms : 0;
        ddp__rec_event(W.c.rec, *W.c.round, ev[k], "#after_start_ms", (long long)W.startup_ms[k],
                       NULL);
        if (W.c.startup)
            W.c.startup(k == 1, at);
    }
}

/* ------------------------------------------------------------------ */
/* progress.tsv: what `ddprun report` plots (cli/view/report.h)       */
/* ------------------------------------------------------------------ */

/* Each rank's first report of a round, then one each DDP__WD_SAMPLE_MS at most, and at the
 * round's end (all): t round rank node collectives steps cpu_s state straggler. About 50 bytes
 * a sample: 18 KiB per rank per hour. */
/* Rank i has a report this round, and its sample is due (all: at the round's end). */
static bool sample_due(int i, int64_t now, bool all)
{
    return W.d.r[i].have && (all || !W.sampled_at[i] || now - W.sampled_at[i] >= DDP__WD_SAMPLE_MS);
}

static void sample(bool all)
{
    if (!W.running || !W.c.rec || !W.c.rec->dir[0] || !W.sampled_at)
        return;
    int64_t now = ddp_now_ms();
    bool due = false;
    for (int i = 0; i < W.world && !due; i++)
        due = sample_due(i, now, all);
    if (!due)
        return;
    if (!W.samples) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/progress.tsv", W.c.rec->dir);
        if (!(W.samples = fopen(path, "ae")))
            return;
        if (ftell(W.samples) == 0)
            fprintf(W.samples, "# ddprun progress 1: t round rank node collectives steps cpu_s "
                               "state straggler\n");
    }
    struct ddp__straggle *st = calloc((size_t)W.world, sizeof(*st));
    if (st)
        ddp__diag_stragglers(&W.d, st);
    double t = (double)(now - W.c.rec->t0_ms) / 1000;
    for (int i = 0; i < W.world; i++) {
        const struct ddp__diag_rank *r = &W.d.r[i];
        if (!sample_due(i, now, all))
            continue;
        fprintf(W.samples, "%.3f\t%d\t%d\t%s\t%" PRIu64 "\t%" PRIu64 "\t%.2f\t%c\t%d\n", t,
                *W.c.round, i, W.names[r->node], r->p.rec ? r->p.completed : 0,
                r->p.rec ? r->p.steps : 0, r->p.cpu_s, r->p.state ? r->p.state : '?',
                st && st[i].flagged);
        W.sampled_at[i] = now;
    }
    free(st);
    fflush(W.samples);
}

static void on_tick(struct ddp_loop *loop, struct ddp_timer *t)
{
    sample(false);
    struct ddp__hang h;
    if (W.running && W.c.job->hang_after_ms > 0 &&
        ddp__diag_hang(&W.d, ddp_now_ms(), W.c.job->hang_after_ms, W.names, &h)) {
        say_lines(h.text);
        char list[512] = "";
        for (int k = 0; k < h.nbehind; k++) {
            size_t l = strlen(list);
            snprintf(list + l, sizeof(list) - l, "%s%d", k ? "," : "", h.behind[k]);
        }
        ddp__rec_event(W.c.rec, *W.c.round, "hang", "#seq", (long long)h.seq, "collective", h.what,
                       "#stuck_ms", (long long)h.stuck_ms, "ranks", list, "report", h.text, NULL);
        char why[1024] = "";
        if (W.c.job->hang_fail) {
            if (h.mismatch)
                snprintf(why, sizeof(why), "no rank made progress for %.0f s: the ranks are in %s",
                         (double)h.stuck_ms / 1000, h.what);
            else
                snprintf(why, sizeof(why), "no rank made progress for %.0f s in %s (rank%s %s %s)",
                         (double)h.stuck_ms / 1000, h.what, h.nbehind == 1 ? "" : "s", list,
                         h.entered_by_all ? "did not finish it" : "did not enter it");
            say("ddprun: diagnose.on_hang is fail: gathering stacks, then the round fails");
        } else {
            say("ddprun: waiting (diagnose.on_hang: wait); `ddprun status` and `ddprun stacks` "
                "show more");
        }
        struct sreq *q = h.nbehind ? sreq_start(h.behind, h.nbehind < 8 ? h.nbehind : 8, -1) : NULL;
        if (q)
            snprintf(q->fail_why, sizeof(q->fail_why), "%s", why);
        else if (why[0])
            W.c.fail(why);
        ddp__diag_hang_release(&h);
    }
    ddp_timer_start(loop, t, 1000);
}

void ddp__wd_init(const struct ddp__wd_ctx *ctx)
{
    W.c = *ctx;
    W.lfd = -1;
    ddp_timer_init(&W.tick, on_tick);
    W.names = calloc(ctx->job->nnodes + 1, sizeof(char *));
    for (size_t i = 0; W.names && i < ctx->job->nnodes; i++)
        W.names[i] = ctx->job->nodes[i].host;
}

void ddp__wd_round(int world, const int *node_of_rank, const int *local_of_rank)
{
    free(W.node_of);
    free(W.local_of);
    W.node_of = calloc((size_t)world + 1, sizeof(int));
    W.local_of = calloc((size_t)world + 1, sizeof(int));
    if (!W.node_of || !W.local_of || ddp__diag_reset(&W.d, world, node_of_rank) < 0) {
        W.world = 0;
        return;
    }
    memcpy(W.node_of, node_of_rank, (size_t)world * sizeof(int));
    memcpy(W.local_of, local_of_rank, (size_t)world * sizeof(int));
    W.world = world;
    free(W.sampled_at);
    W.sampled_at = calloc((size_t)world + 1, sizeof(int64_t));
    W.running = true;
    W.round_start_ms = ddp_now_ms();
    W.startup_ms[0] = W.startup_ms[1] = -1;
    W.startup_round = *W.c.round;
    ddp_timer_start(W.c.loop, &W.tick, 1000);
}

void ddp__wd_startup(int *round, double *formed_s, double *first_s)
{
    *round = W.startup_round;
    *formed_s = W.startup_ms[0] >= 0 ? (double)W.startup_ms[0] / 1000 : -1;
    *first_s = W.startup_ms[1] >= 0 ? (double)W.startup_ms[1] / 1000 : -1;
}

void ddp__wd_round_end(void)
{
    sample(true); /* (where each rank's round ended) */
    W.running = false;
    ddp_timer_stop(W.c.loop, &W.tick);
}

void ddp__wd_metrics(const char *job_id, struct ddp_buf *out)
{
    if (W.running)
        ddp__diag_metrics(&W.d, ddp_now_ms(), W.names, job_id, out);
}

void ddp__wd_progress(int node, char *report)
{
    if (W.running) {
        /* "age N": the report waited N ms on its node for a heartbeat to carry it
         * (cli/proto/membership_store.c); its ages count from when it was made */
        long long age = 0;
        const char *lines = report;
        if (strncmp(report, "age ", 4) == 0) {
            age = strtoll(report + 4, NULL, 10);
            lines += strcspn(lines, "\n");
            lines += *lines == '\n';
        }
        /* "round R": the round its node's ranks were of when it was made; a report of the
         * round before, carried after this one began, is not this round's */
        bool stale = false;
        if (strncmp(lines, "round ", 6) == 0) {
            stale = strtoll(lines + 6, NULL, 10) != *W.c.round;
            lines += strcspn(lines, "\n");
            lines += *lines == '\n';
        }
        if (!stale) {
            ddp__diag_take(&W.d, node, lines, ddp_now_ms() - (age > 0 && age < 3600000 ? age : 0));
            startup();
        }
    }
    free(report);
}

/* ------------------------------------------------------------------ */
/* The control socket: `ddprun status`, `ddprun stacks`              */
/* ------------------------------------------------------------------ */

static void on_client(struct ddp_loop *loop, int fd, unsigned mask, void *arg);

static void answer(int fd, const char *req)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (strcmp(req, "status") == 0) {
        char head[512];
        W.c.headline(head, sizeof(head));
        ddp_buf_put(&b, head, strlen(head));
        ddp_buf_put(&b, "\n", 1);
        if (W.running && W.startup_ms[0] >= 0) {
            int n = snprintf(head, sizeof(head),
                             "startup: process groups formed %.2f s after "
                             "the ranks were started",
                             (double)W.startup_ms[0] / 1000);
            if (W.startup_ms[1] >= 0)
                n += snprintf(head + n, sizeof(head) - (size_t)n,
                              ", first collective done at %.2f s", (double)W.startup_ms[1] / 1000);
            ddp_buf_put(&b, head, (size_t)n);
            ddp_buf_put(&b, "\n", 1);
        }
        int n = W.c.recovery ? W.c.recovery(head, sizeof(head)) : 0;
        if (n > 0) {
            ddp_buf_put(&b, head, (size_t)n);
            ddp_buf_put(&b, "\n", 1);
        }
        if (W.running)
            ddp__diag_status(&W.d, ddp_now_ms(), W.names, &b);
        reply_close(fd, (const char *)b.data, b.len);
    } else if (strncmp(req, "stacks", 6) == 0 && (req[6] == '\0' || req[6] == ' ')) {
        char *end;
        long r = req[6] ? strtol(req + 7, &end, 10) : -1;
        if (!W.running) {
            const char *m = "no ranks are running now (between rounds)\n";
            reply_close(fd, m, strlen(m));
        } else if (req[6] && (*end || r < 0 || r >= W.world)) {
            char m[128];
            int len = snprintf(m, sizeof(m), "error: no rank '%s' (the round has ranks 0 to %d)\n",
                               req + 7, W.world - 1);
            reply_close(fd, m, (size_t)len);
        } else {
            int one = (int)r;
            sreq_start(r >= 0 ? &one : NULL, r >= 0 ? 1 : -1, fd);
        }
    } else if (!W.c.request || !W.c.request(req, fd)) {
        const char *m = "error: unknown request (status, stacks [RANK], attach, info, stop)\n";
        reply_close(fd, m, strlen(m));
    }
    ddp_buf_release(&b);
}

static void on_client(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    struct client *cl = arg;
    ssize_t n = read(fd, cl->line + cl->len, sizeof(cl->line) - 1 - cl->len);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n > 0)
        cl->len += (size_t)n;
    cl->line[cl->len] = '\0';
    char *nl = strchr(cl->line, '\n');
    if (!nl && n > 0 && cl->len < sizeof(cl->line) - 1)
        return;
    ddp_loop_del(loop, fd);
    if (nl)
        *nl = '\0';
    char req[CLIENT_LINE];
    snprintf(req, sizeof(req), "%s", cl->line);
    free(cl);
    if (!nl) {
        close(fd);
        return;
    }
    answer(fd, req);
}

static void on_accept(struct ddp_loop *loop, int lfd, unsigned mask, void *arg)
{
    (void)mask;
    (void)arg;
    int fd;
    while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        struct ucred cr;
        socklen_t cl = sizeof(cr);
        struct client *c = NULL;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != geteuid() ||
            !(c = calloc(1, sizeof(*c))) ||
            ddp_loop_add(loop, fd, DDP_LOOP_READ, on_client, c) < 0) {
            free(c);
            close(fd);
        }
    }
}

int ddp__wd_listen(void)
{
    char dir[PATH_MAX - 128], why[PATH_MAX + 64];
    if (ddp__control_dir(dir, sizeof(dir), true, why, sizeof(why)) < 0) {
        DDP_WARN(SUP, "no control socket (ddprun status and stacks will not reach this job): %s",
                 why);
        return -1;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int n = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s.sock", dir, W.c.job_id);
    if (n < 0 || (size_t)n >= sizeof(sa.sun_path)) {
        DDP_WARN(SUP, "no control socket: the path %s/%s.sock is too long", dir, W.c.job_id);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    unlink(sa.sun_path);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || chmod(sa.sun_path, 0600) ||
        listen(fd, 16) != 0 || ddp_loop_add(W.c.loop, fd, DDP_LOOP_READ, on_accept, NULL) < 0) {
        DDP_WARN(SUP, "no control socket at %s: %s", sa.sun_path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    snprintf(W.sock, sizeof(W.sock), "%s", sa.sun_path);
    W.lfd = fd;
    return 0;
}

void ddp__wd_release(void)
{
    ddp__wd_round_end();
    while (W.reqs) {
        struct sreq *q = W.reqs;
        W.reqs = q->next;
        if (q->client >= 0) {
            const char *m = "the job ended before the stacks came\n";
            reply_close(q->client, m, strlen(m));
            q->client = -1;
        }
        sreq_free(q);
    }
    if (W.lfd >= 0) {
        ddp_loop_del(W.c.loop, W.lfd);
        close(W.lfd);
        unlink(W.sock);
        W.lfd = -1;
    }
    ddp__diag_release(&W.d);
    if (W.samples)
        fclose(W.samples);
    W.samples = NULL;
    free(W.sampled_at);
    W.sampled_at = NULL;
    free(W.node_of);
    free(W.local_of);
    free(W.names);
    W.node_of = W.local_of = NULL;
    W.names = NULL;
}
