/*
 * Jobs whose launcher can die (rendezvous: {backend: etcd}): the launcher's records in the
 * job's etcd folder, and `ddprun attach --etcd` taking the job over from another process, on
 * this login node or another one that reaches etcd.
 *
 * Under "<prefix><job id>/launcher/" the launcher keeps:
 *   record      how it was started: its folder, its command line, the start time, the token
 *   supervisor  "HOST pid N", bound to a lease it renews every heartbeat_interval: while it is
 *               there the job has a launcher, and no second one can take it
 *   round       the current round: number, ranks, and each node's state, incarnation and
 *               first rank (written as the round's ranks are announced: a view)
 * The agents wait for a new launcher (rendezvous.takeover_timeout, cli/agent/link.h). `ddprun
 * attach --etcd URLS JOB` waits for the supervisor key to go with its lease, then runs the
 * recorded command line again in the recorded folder with DDPRUN_TAKEOVER=JOB: that launcher
 * (cli/supervisor/supervise.c) takes the supervisor key, restores the round from the records, and
 * rejoins each node's agent, which answers with STATE and what it held since.
 */
#include "cli/supervisor/supervisor.h"
#include "cli/proto/agent_proto.h"
#include "cli/spec/args.h"
#include "cli/supervisor/launch.h"
#include "cli/sys/sys.h"
#include "common/err.h"
#include "common/util.h"
#include "rendezvous/etcd.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

#define RECORD_MAGIC "ddprun-launcher 1"

static int g_argc;
static char **g_argv;

void ddp__to_set_argv(int argc, char **argv)
{
    g_argc = argc;
    g_argv = argv;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void key_of(char *out, size_t n, const char *folder, const char *name)
{
    snprintf(out, n, "%slauncher/%s", folder, name);
}

static int64_t lease_ttl_s(void)
{
    int64_t s = (ddp__supervisor.job->heartbeat_timeout_ms + 999) / 1000;
    return s < 2 ? 2 : s;
}

static void on_keepalive(struct ddp_loop *loop, struct ddp_timer *t)
{
    int64_t ttl = 0;
    if (ddp_etcd_lease_keepalive(ddp__supervisor.etcd, ddp__supervisor.sup_lease, &ttl) < 0 ||
        ttl <= 0) {
        if (!ddp__supervisor.sup_lost)
            ddp__sup_say("ddprun: warning: this launcher's lease in etcd could not be renewed "
                         "(%s); another `ddprun attach --etcd` may take the job over",
                         ddp_etcd_error(ddp__supervisor.etcd));
        ddp__supervisor.sup_lost = true;
    } else {
        ddp__supervisor.sup_lost = false;
    }
    ddp_timer_start(loop, t, ddp__supervisor.job->heartbeat_interval_ms);
}

/*
 * The launcher's records (and, taking over, the claim): 0, or -1 after saying why. Called once
 * the etcd client (ddp__supervisor.etcd) and the job id are there.
 */
static bool
    g_keepalive_ready; /* ddp__supervisor.keepalive is initialised (only then may it be stopped) */

int ddp__to_start(void)
{
    ddp_timer_init(&ddp__supervisor.keepalive, on_keepalive);
    g_keepalive_ready = true;
    char key[1024], who[400], host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    int n = snprintf(who, sizeof(who), "%s pid %d", host, (int)getpid());
    int r = ddp_etcd_lease_grant(ddp__supervisor.etcd, lease_ttl_s(), &ddp__supervisor.sup_lease);
    bool created = false;
    key_of(key, sizeof(key), ddp__supervisor.etcd_prefix, "supervisor");
    if (r == 0)
        r = ddp_etcd_create(ddp__supervisor.etcd, key, who, (size_t)n, ddp__supervisor.sup_lease,
                            &created);
    if (r < 0) {
        ddp__cli_error("rendezvous.backend etcd: cannot take the job's launcher lease: %s",
                       ddp_etcd_error(ddp__supervisor.etcd));
        return -1;
    }
    if (!created) {
        ddp__cli_error("job %s has a launcher again (another ddprun attach --etcd was quicker)",
                       ddp__supervisor.job_id);
        ddp_etcd_lease_revoke(ddp__supervisor.etcd, ddp__supervisor.sup_lease);
        ddp__supervisor.sup_lease = 0;
        return -1;
    }
    ddp_timer_start(ddp__supervisor.loop, &ddp__supervisor.keepalive,
                    ddp__supervisor.job->heartbeat_interval_ms);
    if (ddp__supervisor.resuming)
        return 0;
    /* The record: folder, start time, token, lease TTL, then the command line, NUL-separated. */
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof(cwd)) || !g_argv)
        return 0; /* no takeover possible; the job runs on */
    struct ddp_buf b;
    ddp_buf_init(&b);
    char head[PATH_MAX + 400];
    int hn = snprintf(head, sizeof(head), "%s\n%s\n%lld\n%s\n%lld\n%d\n", RECORD_MAGIC, cwd,
                      (long long)(wall_ms() - (ddp_now_ms() - ddp__supervisor.t0)),
                      ddp__supervisor.token, (long long)lease_ttl_s(), g_argc);
    ddp_buf_put(&b, head, (size_t)hn);
    for (int k = 0; k < g_argc; k++)
        ddp_buf_put(&b, g_argv[k], strlen(g_argv[k]) + 1);
    key_of(key, sizeof(key), ddp__supervisor.etcd_prefix, "record");
    r = ddp_etcd_put(ddp__supervisor.etcd, key, b.data, b.len, 0);
    explicit_bzero(b.data, b.len);
    ddp_buf_release(&b);
    if (r < 0)
        ddp__sup_say("ddprun: warning: the job's launcher record could not be written to etcd "
                     "(%s): it cannot be taken over",
                     ddp_etcd_error(ddp__supervisor.etcd));
    return 0;
}

void ddp__to_end(void)
{
    if (ddp__supervisor.sup_lease && ddp__supervisor.etcd)
        ddp_etcd_lease_revoke(ddp__supervisor.etcd, ddp__supervisor.sup_lease);
    ddp__supervisor.sup_lease = 0;
    if (ddp__supervisor.loop && g_keepalive_ready)
        ddp_timer_stop(ddp__supervisor.loop, &ddp__supervisor.keepalive);
    g_keepalive_ready = false;
}

/* ---- the round record: a view ---- */

static void tv_round(void *self, int round, int world, const char *const *hosts)
{
    (void)self;
    (void)hosts;
    if (!ddp__supervisor.etcd || !ddp__supervisor.sup_lease)
        return;
    struct ddp_buf b;
    ddp_buf_init(&b);
    char line[200];
    int n = snprintf(line, sizeof(line), "%d %d %d\n", round, world, ddp__supervisor.nmembers);
    ddp_buf_put(&b, line, (size_t)n);
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++) {
        const struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        n = snprintf(line, sizeof(line), "%d %u %d %d %d\n", (int)a->state, a->incarnation,
                     a->rank_offset, a->member_index, a->was_lost);
        ddp_buf_put(&b, line, (size_t)n);
    }
    char key[1024];
    key_of(key, sizeof(key), ddp__supervisor.etcd_prefix, "round");
    if (ddp_etcd_put(ddp__supervisor.etcd, key, b.data, b.len, 0) < 0)
        ddp__sup_say("ddprun: warning: the round record could not be written to etcd (%s)",
                     ddp_etcd_error(ddp__supervisor.etcd));
    ddp_buf_release(&b);
}

struct ddp__view ddp__to_view(void)
{
    static const struct ddp__view_ops ops = {.round = tv_round};
    return (struct ddp__view){.ops = &ops, .self = NULL};
}

/* ---- taking over ---- */

/* The launcher's record, parsed in place (its lines are cut at their newlines). */
struct to_record {
    const char *cwd, *token;
    int64_t start_ms, ttl_s;
    int argc;
    char **argv; /* argc words and a NULL, pointing into the record; to free */
};

/* record: magic, cwd, start (ms since the epoch), token, lease TTL (s), argc, then argv
 * NUL-separated. 0, or -1 with what is wrong in *why. */
static int record_parse(char *rec, size_t len, struct to_record *r, const char **why)
{
    char *lines[6], *p = rec;
    memset(r, 0, sizeof(*r));
    *why = "is malformed";
    for (int i = 0; i < 6; i++) {
        char *nl = memchr(p, '\n', len - (size_t)(p - rec));
        if (!nl)
            return -1;
        *nl = '\0';
        lines[i] = p;
        p = nl + 1;
    }
    r->cwd = lines[1];
    r->start_ms = atoll(lines[2]);
    r->token = lines[3];
    r->ttl_s = atoll(lines[4]);
    r->argc = atoi(lines[5]);
    if (strcmp(lines[0], RECORD_MAGIC) != 0 || r->argc < 1 || r->argc > 4096) {
        *why = "is not one this ddprun reads";
        return -1;
    }
    r->argv = calloc((size_t)r->argc + 1, sizeof(char *));
    if (!r->argv) {
        *why = "cannot be read (out of memory)";
        return -1;
    }
    for (int i = 0; i < r->argc; i++) {
        if (p >= rec + len || !memchr(p, '\0', len - (size_t)(p - rec))) {
            free(r->argv);
            r->argv = NULL;
            return -1;
        }
        r->argv[i] = p;
        p += strlen(p) + 1;
    }
    return 0;
}

/* Restores the token, the start time and the round from the records (ddp__supervisor.resuming). */
int ddp__to_restore(void)
{
    char key[1024], *rec = NULL, *rnd = NULL;
    size_t len = 0, len_rec = 0;
    key_of(key, sizeof(key), ddp__supervisor.etcd_prefix, "record");
    int r = ddp_etcd_get(ddp__supervisor.etcd, key, &rec, &len_rec, NULL);
    if (r == 0) {
        key_of(key, sizeof(key), ddp__supervisor.etcd_prefix, "round");
        r = ddp_etcd_get(ddp__supervisor.etcd, key, &rnd, &len, NULL);
    }
    if (r < 0) {
        ddp__cli_error("cannot take job %s over: %s", ddp__supervisor.job_id,
                       r == DDP_ENOKEY ? "its records are not in etcd (it has not started a "
                                         "round yet, or it ended)"
                                       : ddp_etcd_error(ddp__supervisor.etcd));
        free(rec);
        return -1;
    }
    struct to_record tr;
    const char *why;
    if (record_parse(rec, len_rec, &tr, &why) < 0) {
        ddp__cli_error("cannot take job %s over: its launcher record %s", ddp__supervisor.job_id,
                       why);
        explicit_bzero(rec, len_rec);
        free(rec);
        free(rnd);
        return -1;
    }
    snprintf(ddp__supervisor.token, sizeof(ddp__supervisor.token), "%s", tr.token);
    ddp__supervisor.t0 = ddp_now_ms() - (wall_ms() - tr.start_ms);
    free(tr.argv);
    explicit_bzero(rec, len_rec);
    free(rec);
    /* round: "round world members", then per node "state incarnation offset member lost" */
    int round = -1, world = 0, members = 0, off = 0;
    char *p = rnd;
    if (sscanf(p, "%d %d %d\n%n", &round, &world, &members, &off) < 3 || world < 0 ||
        world > (1 << 24) || ddp__sup_ranks_reserve(world) < 0) {
        ddp__cli_error("cannot take job %s over: its round record in etcd is malformed",
                       ddp__supervisor.job_id);
        free(rnd);
        return -1;
    }
    p += off;
    ddp__supervisor.round = round;
    ddp__supervisor.world = world;
    ddp__supervisor.nmembers = members;
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++) {
        int st = 0, offset = 0, member = 0, lost = 0;
        unsigned inc = 0;
        if (sscanf(p, "%d %u %d %d %d\n%n", &st, &inc, &offset, &member, &lost, &off) < 5)
            break;
        p += off;
        struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        a->state =
            st == DDP__NS_RUNNING || st == DDP__NS_READY ? (enum ddp__node_state)st : DDP__NS_NONE;
        a->incarnation = inc;
        a->rank_offset = offset;
        a->member_index = member;
        a->was_lost = lost;
    }
    int next = world; /* members are numbered in node order: a member's ranks end at the next's */
    for (size_t i = ddp__supervisor.job->nnodes; i-- > 0;) {
        struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        if (a->state != DDP__NS_RUNNING)
            continue;
        if (ddp__supervisor.job->nodes[i].counted &&
            next > a->rank_offset) /* counted there (HELLO) */
            ddp__supervisor.job->nodes[i].slots = next - a->rank_offset;
        for (int k = 0; k < ddp__supervisor.job->nodes[i].slots; k++)
            if (a->rank_offset + k >= 0 && a->rank_offset + k < world)
                ddp__supervisor.rk[a->rank_offset + k] =
                    (struct ddp__sup_rank){.node = (int)i, .local = k};
        next = a->rank_offset;
    }
    free(rnd);
    return 0;
}

/* After ddp__to_restore: the round runs on; every node that had an agent is rejoined. */
void ddp__to_resume(const char *from)
{
    ddp__supervisor.opened = true;
    ddp__supervisor.ph = DDP__PH_RUNNING;
    ddp__supervisor.first_fail = -1;
    ddp__sup_announce_round();
    int n = 0;
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++) {
        struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        if (a->state == DDP__NS_NONE)
            continue;
        /* A node whose agent is not there any more ends its relay at once: it is lost. */
        if (ddp__nodes_start(&ddp__supervisor.nodes, (int)i, NULL) < 0)
            a->state = DDP__NS_NONE;
        else
            n++;
    }
    ddp__sup_say("ddprun: took over job %s from %s: round %d, %d rank%s; rejoining %d node "
                 "agent%s",
                 ddp__supervisor.job_id, from, ddp__supervisor.round, ddp__supervisor.world,
                 ddp__supervisor.world == 1 ? "" : "s", n, n == 1 ? "" : "s");
    ddp__sup_event("takeover", "from", from, "#nodes", (long long)n, NULL);
    ddp__sup_set_phase("taking over");
    if (n == 0)
        ddp__sup_finish("no node agent of the job was left to rejoin", DDP_EXIT_JOB_FAILED);
}

/* `ddprun attach --etcd URLS [--prefix P] JOB` */
int ddp__cmd_takeover(const struct ddp_cli_opts *o)
{
    const char *prefix = o->vals[DDP_OPT_PREFIX] ? o->vals[DDP_OPT_PREFIX] : "/ddprun/";
    if (o->npos != 1) {
        ddp__cli_error("attach --etcd: which job? (ddprun attach --etcd URLS JOB)");
        return DDP_EXIT_USAGE;
    }
    const char *job = o->pos[0];
    for (const char *c = job; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '_')) {
            ddp__cli_error("attach --etcd: '%s' is not a job id", job);
            return DDP_EXIT_USAGE;
        }
    if (!*prefix || prefix[strlen(prefix) - 1] != '/') {
        ddp__cli_error("attach --etcd: --prefix must end with '/', got '%s'", prefix);
        return DDP_EXIT_USAGE;
    }
    char *eps = strdup(o->vals[DDP_OPT_ETCD]);
    const char *list[64];
    size_t n = 0;
    for (char *s = eps, *save = NULL, *t; eps && (t = strtok_r(s, ",", &save)) && n < 64; s = NULL)
        list[n++] = t;
    const char *ca = getenv("DDPRUN_ETCD_CA"), *cert = getenv("DDPRUN_ETCD_CERT"),
               *key = getenv("DDPRUN_ETCD_KEY");
    struct ddp_etcd_opts eo = {.endpoints = list,
                               .nendpoints = n,
                               .ca_file = ca && *ca ? ca : NULL,
                               .cert_file = cert && *cert ? cert : NULL,
                               .key_file = key && *key ? key : NULL};
    struct ddp_etcd *e = NULL;
    int rc = DDP_EXIT_LAUNCH;
    char k[1024], folder[900], *rec = NULL, *who = NULL, from[300] = "a launcher already gone";
    struct to_record tr = {0};
    size_t len = 0, wlen;
    snprintf(folder, sizeof(folder), "%s%s/", prefix, job);
    if (!n || ddp_etcd_new(&eo, &e) < 0) {
        ddp__cli_error("attach --etcd: '%s' names no etcd endpoint", o->vals[DDP_OPT_ETCD]);
        rc = DDP_EXIT_USAGE;
        goto out;
    }
    key_of(k, sizeof(k), folder, "record");
    int r = ddp_etcd_get(e, k, &rec, &len, NULL);
    if (r < 0) {
        if (r == DDP_ENOKEY)
            ddp__cli_error("attach --etcd: no job %s under %s in etcd (%s)", job, prefix,
                           o->vals[DDP_OPT_ETCD]);
        else
            ddp__cli_error("attach --etcd: %s", ddp_etcd_error(e));
        goto out;
    }
    const char *why;
    if (record_parse(rec, len, &tr, &why) < 0) {
        ddp__cli_error("attach --etcd: job %s's launcher record %s", job, why);
        goto out;
    }
    /* The launcher's lease ends heartbeat_timeout after it died: wait that long (twice). */
    key_of(k, sizeof(k), folder, "supervisor");
    int64_t deadline = ddp_now_ms() + 2 * tr.ttl_s * 1000 + 3000;
    bool said = false;
    while ((r = ddp_etcd_get(e, k, &who, &wlen, NULL)) == 0) {
        if (ddp_now_ms() > deadline) {
            ddp__cli_error("job %s still has its launcher (%s): attach there with "
                           "'ddprun attach %s'",
                           job, who, job);
            free(who);
            rc = DDP_EXIT_USAGE;
            goto out;
        }
        if (!said)
            fprintf(stderr,
                    "ddprun: job %s's launcher is %s; waiting for its lease in etcd to end\n", job,
                    who);
        if (!said)
            snprintf(from, sizeof(from), "%s", who);
        said = true;
        free(who);
        who = NULL;
        usleep(200000);
    }
    if (r != DDP_ENOKEY) {
        ddp__cli_error("attach --etcd: %s", ddp_etcd_error(e));
        goto out;
    }
    if (chdir(tr.cwd) != 0) {
        ddp__cli_error("cannot take job %s over: it was started in '%s', which is not on this "
                       "machine (%s)",
                       job, tr.cwd, strerror(errno));
        goto out;
    }
    setenv("DDPRUN_TAKEOVER", job, 1);
    setenv("DDPRUN_TAKEOVER_PREFIX", prefix, 1);
    setenv("DDPRUN_TAKEOVER_FROM", from, 1);
    ddp_etcd_free(e);
    e = NULL;
    execv("/proc/self/exe", tr.argv);
    ddp__cli_error("cannot run ddprun again to take the job over: %s", strerror(errno));
out:
    free(tr.argv);
    if (rec)
        explicit_bzero(rec, len);
    free(rec);
    free(eps);
    ddp_etcd_free(e);
    return rc;
}
