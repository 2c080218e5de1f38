/*
 * The launcher: hosts the job's store, provisions one node agent per node
 * (a local child, or over SSH), and runs the job as a series of rendezvous
 * rounds. Each agent joins the store and keeps a lease alive there; a round
 * closes once at least elastic.min_nodes agents have joined (at most
 * max_nodes), ranks are numbered contiguously over the members in node order,
 * and the workers start with TORCHELASTIC_RESTART_COUNT = the round number.
 *
 * A member node is lost when its lease expires (missed heartbeats), when its
 * agent or SSH connection ends, and a round fails when a worker exits with an
 * error. Then, while elastic.max_restarts allows, the surviving members stop
 * their workers (SIGTERM, SIGKILL after stop_grace) and a new round opens, in
 * which lost and spare nodes may join again; otherwise the job stops with
 * status 1 and a summary of what was lost, when and why. Every transition is
 * said on the console and written to logs.dir/<job id>/events.jsonl.
 *
 * SIGINT/SIGTERM stop the job the same way and a second SIGINT kills at once.
 * Output is tagged on the console, one write per line, and kept per rank under
 * logs.dir/<job id>/.
 */
#include "cli/agent_proto.h"
#include "cli/cli.h"
#include "cli/console.h"
#include "cli/job.h"
#include "cli/record.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/loop.h"
#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

#define TAIL_LINES 10
#define STOP_SLACK_MS 5000 /* beyond stop_grace, for agents to report before they are ended */

struct rank_info {
    int node, local;
    bool started, exited, exec_failed, lost;
    bool stopped; /* it ended after its node was asked to stop it */
    int code;
    int64_t runtime_ms;
    int logfd;
    char logpath[PATH_MAX + 32];
    char *tail[TAIL_LINES];
    int ntail;
};

enum node_state {
    NS_NONE,     /* no agent */
    NS_JOINING,  /* agent started, JOIN sent, JOINED not yet seen */
    NS_READY,    /* joined, no workers: waiting for a round (or a spare) */
    NS_RUNNING,  /* a member of the current round, workers started */
    NS_STOPPING, /* STOP sent, DONE not yet seen */
    NS_GONE,     /* counted lost; its agent is being killed and reaped */
};

struct node_agent {
    pid_t pid;
    int in_fd, out_fd, err_fd; /* its stdin, stdout (frames), stderr (its messages) */
    struct ddp_buf rx, erx;
    enum node_state state;
    unsigned incarnation;
    int rank_offset, member_index;
    int64_t last_fail, cool_until;
    bool was_lost; /* lost before: it rejoins when it can, rounds do not wait for it */
    char why[160]; /* why it was last out, for the rendezvous timeout's message */
};

struct loss {
    int node, round;
    int64_t t_ms;  /* since the job started */
    char when[32]; /* wall clock, UTC */
    char why[300];
};

enum phase { PH_RDZV, PH_RUNNING, PH_RESTARTING, PH_FINISHING };

struct launcher {
    const struct ddp_job *job;
    char job_id[160];
    char logdir[PATH_MAX];
    char token[DDP_STORE_TOKEN_HEX + 1];
    char store_addr[300], store_host[256];
    int store_port;
    bool wildcard;
    const char *first_remote;
    char **env; /* the job's extra environment, "K=V" */
    struct ddp_loop *loop;
    int sfd;
    sigset_t oldmask;
    struct node_agent *ag;
    struct rank_info *rk; /* [0, world) are the current round's ranks */
    int total_slots;
    enum phase ph;
    int round, world, nmembers;
    int ranks_up, ranks_done, ranks_ok;
    bool all_up;
    int first_fail; /* rank in the current round, or -1 */
    char *fatal;    /* why the job stops, when it stops early */
    int fatal_rc;
    bool interrupted, opened;
    int sigints;
    int stop_sig;   /* what a stop sends the ranks first: SIGINT after an interrupt */
    int escalation; /* 0; 1 once agents were told to end; 2 once SIGKILLed */
    struct loss *losses;
    int nlosses;
    struct ddp__rec rec;
    struct ddp__console con;
    char self[PATH_MAX]; /* this ddprun's path: the default path on remote nodes */
    bool tty;
    int64_t t0, t_lost; /* t_lost: when the last member was lost (recovery time) */
    const char *phase_name;
    struct ddp_timer tick, force, stop_deadline, rdzv_deadline, last_call, retry;
    /* the lease watcher: a store client in its own thread, events to the loop through a pipe */
    pthread_t wth;
    bool wth_started;
    atomic_bool wstop;
    int wpipe[2];
    struct ddp_buf wrx;
};

static struct launcher L;

static void rdzv_check(void);
static void rdzv_open(void);
static void finish(const char *why, int rc);
static void maybe_restart(void);

/* ---- console and records ---- */

#define say(...) ddp__con_say(&L.con, __VA_ARGS__)
#define event(...) ddp__rec_event(&L.rec, L.round, __VA_ARGS__)

static void draw_status(void)
{
    if (!L.tty)
        return;
    char buf[256];
    int64_t s = (ddp_now_ms() - L.t0) / 1000;
    snprintf(buf, sizeof(buf), "[ddprun] %s | ranks up %d/%d | restarts %d | %02lld:%02lld:%02lld",
             L.phase_name, L.ranks_up - L.ranks_done, L.world, L.round, (long long)(s / 3600),
             (long long)(s / 60 % 60), (long long)(s % 60));
    ddp__con_status(&L.con, buf);
}

static void set_phase(const char *phase)
{
    L.phase_name = phase;
    if (L.tty)
        draw_status();
    else if (strcmp(phase, "running") == 0 || strcmp(phase, "stopping") == 0)
        say("ddprun: %s", phase); /* the others have their own lines */
}

static void on_tick(struct ddp_loop *loop, struct ddp_timer *t)
{
    draw_status();
    ddp_timer_start(loop, t, 250);
}

/* "SIGINT" for SIGINT. */
static const char *sig_name(int sig)
{
    static char buf[32];
    const char *a = sigabbrev_np(sig);
    snprintf(buf, sizeof(buf), "SIG%s", a ? a : "?");
    return buf;
}

static const char *host_of(int node)
{
    return L.job->nodes[node].host;
}

/* ---- ranks ---- */

static void keep_tail(struct rank_info *r, const uint8_t *line, size_t n)
{
    if (r->ntail == TAIL_LINES) {
        free(r->tail[0]);
        memmove(r->tail, r->tail + 1, (TAIL_LINES - 1) * sizeof(char *));
        r->ntail--;
    }
    r->tail[r->ntail++] = strndup((const char *)line, n > 500 ? 500 : n);
}

/* A line of a rank's output (progress: a line it rewrites in place, kept out of its log). */
static void rank_output(int rank, int stream, const uint8_t *line, size_t n, bool progress)
{
    struct rank_info *r = &L.rk[rank];
    ddp__con_rank(&L.con, rank, host_of(r->node), stream, line, n, progress);
    if (progress)
        return;
    ddp__rec_rank_line(r->logfd, L.job->log_timestamps, line, n);
    keep_tail(r, line, n);
}

/* How rank r ended, in the records' one model. */
static struct ddp__outcome outcome(const struct rank_info *r)
{
    if (r->lost)
        return (struct ddp__outcome){.state = DDP__RS_LOST};
    if (!r->exited)
        return (struct ddp__outcome){.state = DDP__RS_RUNNING};
    struct ddp__outcome o = ddp__outcome_of(r->code, r->exec_failed);
    o.stopped = r->stopped;
    return o;
}

static void release_ranks(void)
{
    for (int i = 0; L.rk && i < L.total_slots; i++) {
        struct rank_info *r = &L.rk[i];
        if (r->logfd >= 0)
            close(r->logfd);
        for (int k = 0; k < r->ntail; k++)
            free(r->tail[k]);
        memset(r, 0, sizeof(*r));
        r->logfd = -1;
    }
}

static void send_frame(struct node_agent *a, struct ddp_buf *b)
{
    if (a->in_fd >= 0 && ddp_write_all(a->in_fd, b->data, b->len) < 0) {
        /* The agent is gone; its exit is handled when it is reaped. */
        close(a->in_fd);
        a->in_fd = -1;
    }
}

/* Asks an agent to stop its workers: sig first (SIGINT or SIGTERM), SIGKILL after grace_ms
 * (see agent_proto.h). */
static void send_stop(struct node_agent *a, uint64_t grace_ms, int sig)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_STOP);
    ddp_buf_put_u64(&b, grace_ms);
    ddp_buf_put_u8(&b, (uint8_t)sig);
    ddp__agent_end(&b, pos);
    send_frame(a, &b);
    ddp_buf_release(&b);
}

static void send_signal(struct node_agent *a, int sig)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_SIGNAL);
    ddp_buf_put_u8(&b, (uint8_t)sig);
    ddp__agent_end(&b, pos);
    send_frame(a, &b);
    ddp_buf_release(&b);
}

/* Ends an agent: EOF on its stdin makes it stop what runs and exit. */
static void release_agent(struct node_agent *a)
{
    if (a->in_fd >= 0) {
        close(a->in_fd);
        a->in_fd = -1;
    }
}

static void describe_exit(int code, char *buf, size_t n)
{
    if (code < 0)
        snprintf(buf, n, "was killed by signal %d (%s)", -code, strsignal(-code));
    else
        snprintf(buf, n, "exited with status %d", code);
}

/* A round failed (a worker failed or a member node was lost): restart or stop. */
static void round_failed(const char *what)
{
    if (L.ph != PH_RUNNING)
        return;
    const struct ddp_job *j = L.job;
    if (L.round >= j->max_restarts) {
        char why[600];
        if (j->max_restarts == 0) {
            say("ddprun: %s; stopping the job", what);
            snprintf(why, sizeof(why), "%s", what);
        } else {
            say("ddprun: %s; no restarts left (elastic.max_restarts is %d); stopping the job", what,
                j->max_restarts);
            snprintf(why, sizeof(why), "%s, and the %d restarts of elastic.max_restarts were used",
                     what, j->max_restarts);
        }
        finish(why, DDP_EXIT_JOB_FAILED);
        return;
    }
    say("ddprun: %s; stopping the other workers for restart %d of %d", what, L.round + 1,
        j->max_restarts);
    L.ph = PH_RESTARTING;
    set_phase("restarting");
    for (size_t i = 0; i < j->nnodes; i++) {
        struct node_agent *a = &L.ag[i];
        if (a->state == NS_RUNNING) {
            send_stop(a, (uint64_t)j->stop_grace_ms, SIGTERM);
            a->state = NS_STOPPING;
        }
    }
    maybe_restart();
}

static void rank_exited(int rank, int code, int64_t runtime_ms, bool exec_failed)
{
    struct rank_info *r = &L.rk[rank];
    r->exited = true;
    r->stopped = L.ag[r->node].state == NS_STOPPING;
    r->code = code;
    r->runtime_ms = runtime_ms;
    r->exec_failed = exec_failed;
    L.ranks_done++;
    if (code == 0 && ++L.ranks_ok == L.world && L.ph == PH_RUNNING) {
        finish(NULL, DDP_EXIT_OK);
        return;
    }
    if (code == 0 || L.ph != PH_RUNNING)
        return;
    if (L.first_fail < 0)
        L.first_fail = rank;
    char what[700], how[160];
    describe_exit(code, how, sizeof(how));
    if (exec_failed && r->ntail) /* the agent's note: cannot run 'x': why */
        snprintf(what, sizeof(what), "rank %d (%s) did not start: %s", rank, host_of(r->node),
                 r->tail[r->ntail - 1]);
    else
        snprintf(what, sizeof(what), "rank %d (%s) %s", rank, host_of(r->node), how);
    struct ddp__outcome o = outcome(r);
    event("worker_failed", "node", host_of(r->node), "#rank", (long long)rank, "@outcome", &o,
          "reason", what, NULL);
    if (exec_failed) {
        /* The program cannot even start: another round would fail the same way. */
        say("ddprun: %s; stopping the job", what);
        finish(what, DDP_EXIT_LAUNCH);
        return;
    }
    round_failed(what);
}

/* ---- nodes and agents ---- */

static bool can_rejoin(int i);

/* Records that node i is out: the cooldown count and, when listed, the event log and the
 * summary. */
static void record_loss(int i, const char *why, bool listed)
{
    struct node_agent *a = &L.ag[i];
    int64_t now = ddp_now_ms();
    a->was_lost = true;
    if (a->last_fail && now - a->last_fail <= L.job->cooldown_ms && L.job->max_restarts > 0) {
        a->cool_until = now + L.job->cooldown_ms;
        say("ddprun: node '%s' failed twice within %.0f s; leaving it out of rounds for %.0f s",
            host_of(i), (double)L.job->cooldown_ms / 1000, (double)L.job->cooldown_ms / 1000);
        event("node_cooldown", "node", host_of(i), "#until_ms", (long long)(a->cool_until - L.t0),
              NULL);
    }
    a->last_fail = now;
    snprintf(a->why, sizeof(a->why), "%s", why);
    if (!listed)
        return;
    L.losses = realloc(L.losses, (size_t)(L.nlosses + 1) * sizeof(*L.losses));
    struct loss *l = &L.losses[L.nlosses++];
    l->node = i;
    l->round = L.round;
    l->t_ms = now - L.t0;
    ddp__rec_wall_clock(l->when, sizeof(l->when));
    snprintf(l->why, sizeof(l->why), "%s", why);
    event("node_lost", "node", host_of(i), "reason", why, NULL);
}

/*
 * Node i is out (its agent exited, or its lease expired). prev is the state it was in.
 * Members end the round; a node that was joining or waiting may leave a round short.
 */
static void node_out(int i, enum node_state prev, const char *why)
{
    if (L.ph == PH_FINISHING)
        return;
    if (prev == NS_JOINING) {
        /* Joining a round (or the first one) failed; a lost node's retries while the job
         * runs fail quietly. */
        bool listed = L.ph == PH_RDZV || !L.ag[i].was_lost;
        if (listed)
            say("ddprun: node '%s' %s", host_of(i), why);
        record_loss(i, why, listed);
        rdzv_check();
        return;
    }
    char what[512];
    snprintf(what, sizeof(what), "node '%s' lost: %s", host_of(i), why);
    record_loss(i, why, true);
    if (prev == NS_RUNNING || prev == NS_STOPPING) {
        for (int r = 0; r < L.world; r++)
            if (L.rk[r].node == i && !L.rk[r].exited)
                L.rk[r].lost = true;
        L.t_lost = ddp_now_ms();
    }
    if (prev == NS_RUNNING && L.ph == PH_RUNNING) {
        round_failed(what);
    } else {
        say("ddprun: %s", what);
        if (L.ph == PH_RESTARTING)
            maybe_restart();
        else if (L.ph == PH_RDZV)
            rdzv_check();
    }
}

static void agent_frame(int i, uint8_t type, const uint8_t *body, size_t len)
{
    struct node_agent *a = &L.ag[i];
    struct ddp_rd rd;
    uint32_t lr, v32;
    uint64_t v64;
    uint8_t u8;
    ddp_rd_init(&rd, body, len);
    if (type == DDP__AG_JOINED) {
        if (a->state != NS_JOINING)
            return;
        a->state = NS_READY;
        event("node_joined", "node", host_of(i), "#incarnation", (long long)a->incarnation, NULL);
        if (L.ph == PH_FINISHING)
            release_agent(a);
        else
            rdzv_check();
        return;
    }
    if (type == DDP__AG_DONE) {
        if (a->state != NS_RUNNING && a->state != NS_STOPPING)
            return;
        a->state = NS_READY;
        if (L.ph == PH_FINISHING)
            release_agent(a);
        else if (L.ph == PH_RESTARTING)
            maybe_restart();
        return;
    }
    /* Rank frames count only from the current round's members. */
    if ((a->state != NS_RUNNING && a->state != NS_STOPPING) || ddp_rd_u32(&rd, &lr) < 0 ||
        (int)lr >= L.job->nodes[i].slots)
        return;
    int rank = a->rank_offset + (int)lr;
    switch (type) {
    case DDP__AG_STARTED:
        L.rk[rank].started = true;
        if (++L.ranks_up == L.world && L.ph == PH_RUNNING) {
            set_phase("running");
            event("workers_running", "#world_size", (long long)L.world, NULL);
        }
        break;
    case DDP__AG_OUTPUT: {
        const uint8_t *p;
        uint32_t n;
        if (ddp_rd_u8(&rd, &u8) == 0 && ddp_rd_str(&rd, DDP__AGENT_MAX_FRAME, &p, &n) == 0)
            rank_output(rank, u8 & 0x0f, p, n, u8 & DDP__AG_OUT_PROGRESS);
        break;
    }
    case DDP__AG_EXITED:
        if (ddp_rd_u32(&rd, &v32) == 0 && ddp_rd_u64(&rd, &v64) == 0 && ddp_rd_u8(&rd, &u8) == 0)
            rank_exited(rank, (int32_t)v32, (int64_t)v64, u8 != 0);
        break;
    default:
        break;
    }
}

static bool all_agents_gone(void)
{
    for (size_t i = 0; i < L.job->nnodes; i++)
        if (L.ag[i].pid)
            return false;
    return true;
}

/* Reads what the agent wrote and handles its frames: 1 when something was read, 0 when
 * nothing was waiting, -1 at EOF. */
static int agent_read(int i)
{
    struct node_agent *a = &L.ag[i];
    if (a->out_fd < 0 || ddp_buf_reserve(&a->rx, 65536) < 0)
        return -1;
    ssize_t n = ddp_read_eintr(a->out_fd, a->rx.data + a->rx.len, a->rx.cap - a->rx.len);
    if (n == -EAGAIN)
        return 0;
    if (n <= 0) {
        ddp_loop_del(L.loop, a->out_fd);
        close(a->out_fd);
        a->out_fd = -1;
        return -1;
    }
    a->rx.len += (size_t)n;
    uint8_t type;
    const uint8_t *body;
    size_t len;
    int r;
    while ((r = ddp__agent_next(&a->rx, &type, &body, &len)) > 0)
        agent_frame(i, type, body, len);
    ddp_buf_compact(&a->rx);
    if (r < 0) {
        say("ddprun: error: bad frame from the agent on '%s'; ending it", host_of(i));
        a->rx.len = a->rx.off = 0;
        kill(-a->pid, SIGKILL);
    }
    return 1;
}

/* Reads agent i's stderr (its own messages and, over SSH, the bridge's and the remote
 * agent's): each line is said as ddprun's. At EOF the rest goes out and the pipe closes. */
static void agent_err_read(int i)
{
    struct node_agent *a = &L.ag[i];
    for (;;) {
        if (a->err_fd < 0 || ddp_buf_reserve(&a->erx, 4096) < 0)
            return;
        ssize_t n = ddp_read_eintr(a->err_fd, a->erx.data + a->erx.len, a->erx.cap - a->erx.len);
        if (n == -EAGAIN)
            return;
        if (n > 0)
            a->erx.len += (size_t)n;
        char *p, *nl;
        while ((p = (char *)a->erx.data + a->erx.off),
               (nl = memchr(p, '\n', ddp_buf_pending(&a->erx)))) {
            say("%.*s", (int)(nl - p), p);
            a->erx.off += (size_t)(nl - p) + 1;
        }
        if (n <= 0 || ddp_buf_pending(&a->erx) > 4000) { /* EOF, or a line without end */
            if (ddp_buf_pending(&a->erx))
                say("%.*s", (int)ddp_buf_pending(&a->erx), (char *)a->erx.data + a->erx.off);
            a->erx.off = a->erx.len;
        }
        ddp_buf_compact(&a->erx);
        if (n <= 0) {
            ddp_loop_del(L.loop, a->err_fd);
            close(a->err_fd);
            a->err_fd = -1;
            ddp_buf_release(&a->erx);
            return;
        }
    }
}

static void on_agent_err(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)fd;
    (void)mask;
    agent_err_read((int)(intptr_t)arg);
}

static void on_agent_out(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)fd;
    (void)mask;
    agent_read((int)(intptr_t)arg);
}

/* Agent i's process ended with wait status st. */
static void agent_reaped(int i, int st)
{
    struct node_agent *a = &L.ag[i];
    /* What it wrote before exiting may still sit in the pipe (the signal can be read
     * first): take it before judging how it ended. */
    while (agent_read(i) > 0) {
    }
    agent_err_read(i);
    if (a->err_fd >= 0) { /* a child of its may still hold the pipe: what it said is in */
        ddp_loop_del(L.loop, a->err_fd);
        close(a->err_fd);
        a->err_fd = -1;
        ddp_buf_release(&a->erx);
    }
    if (a->out_fd >= 0) {
        ddp_loop_del(L.loop, a->out_fd);
        close(a->out_fd);
        a->out_fd = -1;
    }
    release_agent(a);
    ddp_buf_release(&a->rx);
    a->pid = 0;
    enum node_state prev = a->state;
    a->state = NS_NONE;
    if (prev == NS_GONE && L.ph == PH_RESTARTING)
        maybe_restart();
    if (prev == NS_GONE || L.ph == PH_FINISHING)
        return;
    bool remote = !ddp__job_host_is_local(host_of(i));
    char why[300];
    if (prev == NS_JOINING && remote && WIFEXITED(st) && WEXITSTATUS(st) == DDP_EXIT_LAUNCH)
        snprintf(why, sizeof(why), "could not be provisioned");
    else if (prev == NS_JOINING)
        snprintf(why, sizeof(why), "could not join the store (its agent %s %d)",
                 WIFSIGNALED(st) ? "died of signal" : "exited with status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    else if (remote)
        snprintf(why, sizeof(why), "the SSH connection to it ended (%s %d)",
                 WIFSIGNALED(st) ? "signal" : "status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    else
        snprintf(why, sizeof(why), "its agent died (%s %d)", WIFSIGNALED(st) ? "signal" : "status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    node_out(i, prev, why);
}

/* The lease of agent incarnation inc of node i expired: the node missed its heartbeats. */
static void lease_expired(int i, unsigned inc)
{
    struct node_agent *a = &L.ag[i];
    if (a->incarnation != inc || !a->pid || a->state == NS_GONE || a->state == NS_NONE ||
        L.ph == PH_FINISHING)
        return;
    enum node_state prev = a->state;
    a->state = NS_GONE;
    /* Whatever is left of it here goes: the bridge (its SSH connection), or a local agent
     * and its workers (one process group). */
    kill(-a->pid, SIGKILL);
    char why[200];
    snprintf(why, sizeof(why), "no heartbeat for %.1f s (elastic.heartbeat_timeout)",
             (double)L.job->heartbeat_timeout_ms / 1000);
    node_out(i, prev, why);
}

static void node_store_addr(int i, char *out, size_t n)
{
    snprintf(out, n, "%s", L.store_addr);
    if (L.first_remote && L.wildcard) {
        char ip[INET6_ADDRSTRLEN];
        const char *toward = ddp__job_host_is_local(host_of(i)) ? L.first_remote : host_of(i);
        if (ddp__route_source(toward, ip, sizeof(ip)) == 0)
            snprintf(out, n, strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip, L.store_port);
    }
}

/* Starts node i's agent (a local child, or the SSH bridge) and sends it JOIN. */
static int provision(int i)
{
    struct node_agent *a = &L.ag[i];
    const struct ddp_job *j = L.job;
    int in[2], out[2], err[2];
    char port[16], grace[24]; /* formatted before fork: the child only execs */
    snprintf(port, sizeof(port), "%d", j->ssh_port);
    snprintf(grace, sizeof(grace), "%lld", (long long)j->stop_grace_ms);
    bool local = ddp__job_host_is_local(j->nodes[i].host);
    if (pipe2(in, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(out, O_CLOEXEC) != 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        close(err[0]);
        close(err[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(err[1], 2); /* its messages come back as lines, to the console and ddprun.log */
        sigprocmask(SIG_SETMASK, &L.oldmask, NULL);
        /* If ddprun is killed outright, its local agents stop their workers (SIGTERM) and
         * exit; a bridge ignores its SIGHUP, and the EOF on its stdin that follows stops the
         * remote node the same way (see cli/ssh_bridge.c). */
        prctl(PR_SET_PDEATHSIG, local ? SIGTERM : SIGHUP);
        if (local) {
            execl("/proc/self/exe", "ddprun", "agent", (char *)NULL);
        } else {
            execl("/proc/self/exe", "ddprun", "__ssh-bridge", j->nodes[i].host, port,
                  j->ssh_user ? j->ssh_user : "", j->ssh_identity ? j->ssh_identity : "",
                  j->ssh_known_hosts ? j->ssh_known_hosts : "", j->ssh_strict,
                  j->ssh_remote_ddprun ? j->ssh_remote_ddprun : L.self, grace, (char *)NULL);
        }
        _exit(127);
    }
    setpgid(pid, pid); /* as the agent does itself: no race with a kill(-pid) */
    close(in[0]);
    close(out[1]);
    close(err[1]);
    a->pid = pid;
    a->in_fd = in[1];
    a->out_fd = out[0];
    a->err_fd = err[0];
    fcntl(a->err_fd, F_SETFL, O_NONBLOCK);
    ddp_buf_init(&a->erx);
    ddp_loop_add(L.loop, a->err_fd, DDP_LOOP_READ, on_agent_err, (void *)(intptr_t)i);
    a->state = NS_JOINING;
    a->incarnation++;
    fcntl(a->out_fd, F_SETFL, O_NONBLOCK);
    ddp_buf_init(&a->rx);
    char node_store[300];
    node_store_addr(i, node_store, sizeof(node_store));
    struct ddp__agent_join jf = {.token = L.token,
                                 .store_addr = node_store,
                                 .job_id = L.job_id,
                                 .host_label = j->nodes[i].host,
                                 .node_index = (uint32_t)i,
                                 .incarnation = a->incarnation,
                                 .heartbeat_interval_ms = (uint64_t)j->heartbeat_interval_ms,
                                 .heartbeat_timeout_ms = (uint64_t)j->heartbeat_timeout_ms,
                                 .grace_ms = (uint64_t)j->stop_grace_ms};
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (ddp__agent_put_join(&b, &jf) == 0)
        send_frame(a, &b);
    explicit_bzero(b.data, b.len);
    ddp_buf_release(&b);
    return ddp_loop_add(L.loop, a->out_fd, DDP_LOOP_READ, on_agent_out, (void *)(intptr_t)i);
}

static bool can_rejoin(int i)
{
    return L.ag[i].state == NS_NONE && ddp_now_ms() >= L.ag[i].cool_until;
}

/* ---- rendezvous rounds ---- */

/* Nodes ready for a round, nodes on their way, and of those the ones a round waits for
 * (not the ones lost before: they join when they can, and the next round takes them). */
static void count_nodes(int *ready, int *joining, int *awaited)
{
    *ready = *joining = *awaited = 0;
    for (size_t i = 0; i < L.job->nnodes; i++) {
        *ready += L.ag[i].state == NS_READY;
        *joining += L.ag[i].state == NS_JOINING;
        *awaited += L.ag[i].state == NS_JOINING && !L.ag[i].was_lost;
    }
}

static int free_port(void);

/* Closes the round with the nodes that joined: numbers the ranks and starts the workers. */
static void rdzv_close(void)
{
    const struct ddp_job *j = L.job;
    ddp_timer_stop(L.loop, &L.rdzv_deadline);
    ddp_timer_stop(L.loop, &L.last_call);
    release_ranks();
    L.world = L.nmembers = 0;
    L.ranks_up = L.ranks_done = L.ranks_ok = 0;
    L.first_fail = -1;
    char names[2048] = "";
    size_t nl = 0;
    int first = -1;
    for (size_t i = 0; i < j->nnodes && L.nmembers < j->max_nodes; i++) {
        struct node_agent *a = &L.ag[i];
        if (a->state != NS_READY)
            continue;
        if (first < 0)
            first = (int)i;
        a->state = NS_RUNNING; /* a member: its START follows */
        a->member_index = L.nmembers++;
        a->rank_offset = L.world;
        for (int l = 0; l < j->nodes[i].slots; l++) {
            struct rank_info *r = &L.rk[L.world];
            r->node = (int)i;
            r->local = l;
            if (L.round == 0)
                snprintf(r->logpath, sizeof(r->logpath), "%s/rank-%d.log", L.logdir, L.world);
            else
                snprintf(r->logpath, sizeof(r->logpath), "%s/rank-%d.restart-%d.log", L.logdir,
                         L.world, L.round);
            r->logfd = open(r->logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            L.world++;
        }
        int w = snprintf(names + nl, sizeof(names) - nl, "%s%s", nl ? ", " : "", host_of((int)i));
        if (w > 0 && nl + (size_t)w < sizeof(names))
            nl += (size_t)w;
    }
    /* With remote nodes, every node (the local ones too) must use addresses the others can
     * reach: MASTER_ADDR is the first member's, or this machine's routable address. */
    char master[256] = "127.0.0.1";
    if (L.first_remote) {
        if (!ddp__job_host_is_local(host_of(first)))
            snprintf(master, sizeof(master), "%s", host_of(first));
        else if (ddp__route_source(L.first_remote, master, sizeof(master)) < 0)
            snprintf(master, sizeof(master), "127.0.0.1");
    }
    int master_port = free_port();
    say("ddprun: round %d: %d node%s (%s), %d ranks%s", L.round, L.nmembers,
        L.nmembers == 1 ? "" : "s", names, L.world,
        !L.round            ? ""
        : j->checkpoint_dir ? "; workers restart from the last checkpoint"
                            : "; workers restart");
    event("membership", "nodes", names, "#world_size", (long long)L.world, "#restart_count",
          (long long)L.round, NULL);
    L.ph = PH_RUNNING;
    set_phase(L.round ? "restarting workers" : "starting workers");
    for (size_t i = 0; i < j->nnodes; i++) {
        struct node_agent *a = &L.ag[i];
        if (a->state != NS_RUNNING)
            continue;
        char node_store[300];
        node_store_addr((int)i, node_store, sizeof(node_store));
        struct ddp__agent_start st = {.token = L.token,
                                      .store_addr = node_store,
                                      .job_id = L.job_id,
                                      .host_label = j->nodes[i].host,
                                      .master_addr = master,
                                      .master_port = (uint32_t)master_port,
                                      .node_rank = (uint32_t)a->member_index,
                                      .nnodes = (uint32_t)L.nmembers,
                                      .world_size = (uint32_t)L.world,
                                      .rank_offset = (uint32_t)a->rank_offset,
                                      .nlocal = (uint32_t)j->nodes[i].slots,
                                      .restart_count = (uint32_t)L.round,
                                      .max_restarts = (uint32_t)j->max_restarts,
                                      .grace_ms = (uint64_t)j->stop_grace_ms,
                                      .workdir = j->workdir,
                                      .backend = j->backend,
                                      .checkpoint_dir = j->checkpoint_dir ? j->checkpoint_dir : "",
                                      .shell = j->shell ? j->shell : "",
                                      .argv = j->argv,
                                      .env = L.env};
        struct ddp_buf b;
        ddp_buf_init(&b);
        if (ddp__agent_put_start(&b, &st) == 0)
            send_frame(a, &b);
        explicit_bzero(b.data, b.len);
        ddp_buf_release(&b);
    }
}

static void rdzv_fail(const char *why)
{
    say("ddprun: round %d cannot start: %s", L.round, why);
    finish(why, L.round == 0 ? DDP_EXIT_LAUNCH : DDP_EXIT_JOB_FAILED);
}

/* Decides whether the open round can close now, must fail, or waits. */
static void rdzv_check(void)
{
    if (L.ph != PH_RDZV)
        return;
    const struct ddp_job *j = L.job;
    int ready, joining, awaited;
    count_nodes(&ready, &joining, &awaited);
    if (ready >= j->max_nodes || (ready >= j->min_nodes && awaited == 0)) {
        rdzv_close();
    } else if (ready + joining < j->min_nodes) {
        char why[300];
        snprintf(why, sizeof(why), "only %d node%s can take part, and elastic.min_nodes is %d",
                 ready + joining, ready + joining == 1 ? "" : "s", j->min_nodes);
        rdzv_fail(why);
    } else if (ready >= j->min_nodes && !ddp_timer_armed(&L.last_call)) {
        /* Enough to train: late nodes get a short last call. */
        ddp_timer_start(L.loop, &L.last_call, j->rdzv_last_call_ms);
    }
}

static void on_last_call(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    if (L.ph == PH_RDZV)
        rdzv_close();
}

static void on_rdzv_deadline(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    if (L.ph != PH_RDZV)
        return;
    int ready, joining, awaited;
    count_nodes(&ready, &joining, &awaited);
    if (ready >= L.job->min_nodes) {
        rdzv_close();
        return;
    }
    /* Name the nodes that are not there, and what is known of each. */
    char why[1400], missing[1024] = "";
    size_t ml = 0;
    int nmissing = 0;
    for (size_t i = 0; i < L.job->nnodes; i++) {
        const struct node_agent *a = &L.ag[i];
        if (a->state == NS_READY)
            continue;
        nmissing++;
        const char *what = a->state == NS_JOINING ? "started, no answer"
                           : a->why[0]            ? a->why
                                                  : "not started";
        int w = snprintf(missing + ml, sizeof(missing) - ml, "%s'%s' (%s)", ml ? ", " : "",
                         host_of((int)i), what);
        if (w > 0 && ml + (size_t)w < sizeof(missing))
            ml += (size_t)w;
    }
    snprintf(why, sizeof(why),
             "only %d of the %d nodes elastic.min_nodes needs joined within %.0f s "
             "(rendezvous.timeout); not joined: %s",
             ready, L.job->min_nodes, (double)L.job->rdzv_timeout_ms / 1000,
             nmissing ? missing : "none");
    rdzv_fail(why);
}

/* Opens the next round: survivors are waiting already; lost and spare nodes are started. */
static void rdzv_open(void)
{
    const struct ddp_job *j = L.job;
    if (L.opened) /* round 0 is the first */
        L.round++;
    L.opened = true;
    L.ph = PH_RDZV;
    int64_t soonest = 0;
    for (size_t i = 0; i < j->nnodes; i++) {
        if (can_rejoin((int)i)) {
            if (provision((int)i) < 0)
                say("ddprun: cannot start the node agent for '%s': %s", host_of((int)i),
                    strerror(errno));
        } else if (L.ag[i].state == NS_NONE) {
            soonest = !soonest || L.ag[i].cool_until < soonest ? L.ag[i].cool_until : soonest;
        }
    }
    int ready, joining, awaited;
    count_nodes(&ready, &joining, &awaited);
    say("ddprun: round %d: rendezvous of %d..%d nodes (%d ready, %d joining)", L.round,
        j->min_nodes, j->max_nodes, ready, joining);
    event("round_open", "#ready", (long long)ready, "#joining", (long long)joining, NULL);
    set_phase("rendezvous");
    ddp_timer_start(L.loop, &L.rdzv_deadline, j->rdzv_timeout_ms);
    rdzv_check();
}

/* While the job runs, lost nodes are tried again now and then: one that is back joins
 * and waits, as a spare, for the next round. */
static void on_retry(struct ddp_loop *loop, struct ddp_timer *t)
{
    if (L.ph == PH_FINISHING)
        return;
    if (L.ph == PH_RUNNING)
        for (size_t i = 0; i < L.job->nnodes; i++)
            if (L.ag[i].was_lost && can_rejoin((int)i) && provision((int)i) < 0)
                DDP_DEBUG(SUP, "cannot start an agent for %s: %s", host_of((int)i),
                          strerror(errno));
    ddp_timer_start(loop, t,
                    L.job->heartbeat_timeout_ms > 1000 ? L.job->heartbeat_timeout_ms : 1000);
}

/* After a failure: once no member still runs workers, the next round opens. */
static void maybe_restart(void)
{
    if (L.ph != PH_RESTARTING)
        return;
    /* A node being ended (NS_GONE: SIGKILLed, its reaping a moment away) must be reaped
     * first, or the round would open without trying it again. */
    for (size_t i = 0; i < L.job->nnodes; i++)
        if (L.ag[i].state == NS_RUNNING || L.ag[i].state == NS_STOPPING ||
            L.ag[i].state == NS_GONE)
            return;
    event("workers_stopped", NULL);
    rdzv_open();
}

/* The job ends: why is NULL on success. Members stop their workers; agents then exit. */
static void finish(const char *why, int rc)
{
    if (L.ph == PH_FINISHING)
        return;
    L.ph = PH_FINISHING;
    if (why && !L.fatal) {
        L.fatal = strdup(why);
        L.fatal_rc = rc;
    }
    ddp_timer_stop(L.loop, &L.rdzv_deadline);
    ddp_timer_stop(L.loop, &L.last_call);
    if (why)
        set_phase("stopping");
    for (size_t i = 0; i < L.job->nnodes; i++) {
        struct node_agent *a = &L.ag[i];
        if (a->state == NS_RUNNING || a->state == NS_STOPPING) {
            send_stop(a, (uint64_t)L.job->stop_grace_ms, L.stop_sig ? L.stop_sig : SIGTERM);
            a->state = NS_STOPPING;
        } else {
            release_agent(a);
        }
    }
    /* Whatever the nodes do (a hung node never answers), the stop ends: the workers have
     * stop_grace, their agents a few seconds more to report; then the agents are ended. */
    ddp_timer_start(L.loop, &L.stop_deadline, L.job->stop_grace_ms + STOP_SLACK_MS);
    if (all_agents_gone())
        ddp_loop_stop(L.loop);
}

/*
 * Ends every agent process still there: a local agent with its process group (its workers
 * too); an SSH bridge with SIGTERM, on which it has the remote session killed (an SSH
 * "signal KILL" request: the remote agent and its workers) and closes. Two seconds later,
 * whatever is left is SIGKILLed.
 */
static void escalate(void)
{
    if (L.escalation >= 2)
        return;
    L.escalation++;
    for (size_t i = 0; i < L.job->nnodes; i++) {
        pid_t p = L.ag[i].pid;
        if (p <= 0)
            continue;
        if (L.escalation == 1 && !ddp__job_host_is_local(host_of((int)i)))
            kill(p, SIGTERM);
        else
            kill(-p, SIGKILL);
    }
    if (L.escalation == 1)
        ddp_timer_start(L.loop, &L.force, 2000);
}

static void on_stop_deadline(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    int left = 0;
    for (size_t i = 0; i < L.job->nnodes; i++)
        left += L.ag[i].pid > 0;
    if (!left)
        return;
    say("ddprun: %d node agent%s did not stop within stop_grace + %d s; ending them", left,
        left == 1 ? "" : "s", STOP_SLACK_MS / 1000);
    escalate();
}

/* ---- the lease watcher ---- */

/* Runs in its own thread: a store client watching "ddprun/", each event sent to the loop
 * as one line "KIND KEY VALUE\n" (kind 'S' set, 'E' expired). */
static void *watch_main(void *arg)
{
    struct ddp_store *s = arg;
    while (!atomic_load(&L.wstop)) {
        struct ddp_store_event *ev;
        int r = ddp_store_next_event(s, 200, &ev);
        if (r == DDP_ETIMEDOUT)
            continue;
        if (r < 0)
            break;
        char line[600];
        int n =
            snprintf(line, sizeof(line), "%c %s %.64s\n", ev->kind == DDP_STORE_EV_SET ? 'S' : 'E',
                     ev->key, ev->kind == DDP_STORE_EV_SET && ev->value ? (char *)ev->value : "-");
        if (n > 0 && (size_t)n < sizeof(line) && !strchr(ev->key, ' ') && !strchr(ev->key, '\n'))
            ddp_write_all(L.wpipe[1], line, (size_t)n);
        ddp_store_event_free(ev);
    }
    ddp_store_close(s);
    return NULL;
}

static void watch_event(char kind, const char *key, const char *val)
{
    unsigned node, inc;
    long long step;
    int round;
    char tail;
    if (kind == 'E' && sscanf(key, "ddprun/nodes/%u.%u%c", &node, &inc, &tail) == 2 &&
        node < L.job->nnodes) {
        lease_expired((int)node, inc);
    } else if (kind == 'S' && sscanf(key, "ddprun/resume/%d%c", &round, &tail) == 1 &&
               round == L.round && sscanf(val, "%lld", &step) == 1) {
        char extra[96] = "";
        if (L.t_lost && round > 0)
            snprintf(extra, sizeof(extra), " (%.1f s after the node was lost)",
                     (double)(ddp_now_ms() - L.t_lost) / 1000);
        say("ddprun: round %d: training resumed at step %lld%s", round, step, extra);
        event("resumed", "#step", step, "#since_loss_ms",
              (long long)(L.t_lost ? ddp_now_ms() - L.t_lost : -1), NULL);
    }
}

static void on_watch(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    (void)arg;
    if (ddp_buf_reserve(&L.wrx, 4096) < 0)
        return;
    ssize_t n = ddp_read_eintr(fd, L.wrx.data + L.wrx.len, L.wrx.cap - L.wrx.len);
    if (n <= 0) {
        ddp_loop_del(loop, fd);
        return;
    }
    L.wrx.len += (size_t)n;
    char *p, *nl;
    while ((p = (char *)L.wrx.data + L.wrx.off), (nl = memchr(p, '\n', ddp_buf_pending(&L.wrx)))) {
        *nl = '\0';
        L.wrx.off += (size_t)(nl - p) + 1;
        char *sp1 = strchr(p, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
        if (!sp2)
            continue;
        *sp1 = *sp2 = '\0';
        watch_event(p[0], sp1 + 1, sp2 + 1);
    }
    ddp_buf_compact(&L.wrx);
}

static int start_watcher(void)
{
    struct ddp_store *s;
    uint32_t id;
    int r;
    if ((r = ddp_store_connect(L.store_host, L.store_port, L.token, strlen(L.token), 10000, &s)) <
        0)
        return r;
    if ((r = ddp_store_watch(s, "ddprun/", true, &id)) < 0) {
        ddp_store_close(s);
        return r;
    }
    if (pipe2(L.wpipe, O_CLOEXEC) != 0) {
        ddp_store_close(s);
        return DDP_ESYS;
    }
    fcntl(L.wpipe[0], F_SETFL, O_NONBLOCK);
    ddp_buf_init(&L.wrx);
    if (pthread_create(&L.wth, NULL, watch_main, s) != 0) {
        ddp_store_close(s);
        return DDP_ESYS;
    }
    L.wth_started = true;
    return ddp_loop_add(L.loop, L.wpipe[0], DDP_LOOP_READ, on_watch, NULL);
}

/* ---- signals ---- */

static void on_signal(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    (void)arg;
    struct signalfd_siginfo si;
    while (ddp_read_eintr(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGCHLD) {
            int st;
            pid_t p;
            /* Orphans of the job reparented to us are reaped here too, and ignored. */
            while ((p = waitpid(-1, &st, WNOHANG)) > 0)
                for (size_t i = 0; i < L.job->nnodes; i++)
                    if (L.ag[i].pid == p)
                        agent_reaped((int)i, st);
        } else if (si.ssi_signo == SIGUSR1 || si.ssi_signo == SIGUSR2 || si.ssi_signo == SIGHUP) {
            /* For the job, not for ddprun (Slurm's --signal=USR1@T checkpoint pattern). */
            int n = 0;
            for (size_t i = 0; i < L.job->nnodes; i++)
                if (L.ag[i].state == NS_RUNNING || L.ag[i].state == NS_STOPPING) {
                    send_signal(&L.ag[i], (int)si.ssi_signo);
                    n += L.job->nodes[i].slots;
                }
            say("ddprun: %s: passed to the %d rank%s running", sig_name((int)si.ssi_signo), n,
                n == 1 ? "" : "s");
            event("signal", "signal", sig_name((int)si.ssi_signo), "#ranks", (long long)n, NULL);
        } else {
            L.sigints++;
            if (L.sigints == 1) {
                bool stopping = L.ph == PH_FINISHING;
                if (!stopping) {
                    L.interrupted = true;
                    L.stop_sig = si.ssi_signo == SIGINT ? SIGINT : SIGTERM;
                }
                say("ddprun: %s: stopping %d rank%s (%s, %sSIGKILL after %lld ms; "
                    "interrupt again to end them now)",
                    strsignal((int)si.ssi_signo), L.ranks_up - L.ranks_done,
                    L.ranks_up - L.ranks_done == 1 ? "" : "s",
                    stopping ? "stopping already" : sig_name(L.stop_sig),
                    L.stop_sig == SIGINT ? "SIGTERM halfway, " : "",
                    (long long)L.job->stop_grace_ms);
                if (!stopping)
                    finish("interrupted", DDP_EXIT_INTERRUPTED);
            } else if (L.sigints == 2) {
                say("ddprun: ending every rank now");
                /* The agents SIGKILL their ranks and sweep what the ranks left behind;
                 * should one not be gone in 2 s, it is ended (escalate). */
                for (size_t i = 0; i < L.job->nnodes; i++)
                    if (L.ag[i].state == NS_STOPPING)
                        send_stop(&L.ag[i], 0, SIGKILL);
                ddp_timer_stop(loop, &L.stop_deadline);
                ddp_timer_start(loop, &L.force, 2000);
            } else {
                escalate();
            }
        }
    }
    if (L.ph == PH_FINISHING && all_agents_gone())
        ddp_loop_stop(loop);
}

static void on_force(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    escalate();
}

/* ---- setup helpers ---- */

static int mkdir_p(const char *path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &sl) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void make_job_id(const char *name, char *out, size_t n)
{
    char stamp[32], clean[64];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
    size_t k = 0;
    for (const char *p = name; *p && k + 1 < sizeof(clean); p++)
        clean[k++] = (char)((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                                    (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'
                                ? *p
                                : '-');
    clean[k] = '\0';
    uint16_t rnd = 0;
    ddp_random_bytes(&rnd, sizeof(rnd));
    snprintf(out, n, "%s-%s-%04x", clean[0] ? clean : "job", stamp, rnd);
}

static void *serve(void *srv)
{
    ddp_store_server_run(srv);
    return NULL;
}

static void summarize(int rc, double secs)
{
    char buf[128];
    say("ddprun: job %s %s after %.1f s (%d ranks on %d node%s%s%.0d%s)", L.job_id,
        rc == DDP_EXIT_LAUNCH ? "launch failed" : ddp__job_status(rc), secs, L.world, L.nmembers,
        L.nmembers == 1 ? "" : "s", L.round ? ", after " : "", L.round,
        L.round == 1 ? " restart"
        : L.round    ? " restarts"
                     : "");
    if (L.fatal && rc != DDP_EXIT_OK && rc != DDP_EXIT_INTERRUPTED &&
        (L.job->max_restarts > 0 || L.nlosses > 0))
        say("ddprun: the job cannot continue: %s", L.fatal);
    for (int k = 0; k < L.nlosses; k++) {
        const struct loss *l = &L.losses[k];
        if (k == 0)
            say("ddprun: nodes lost:");
        say("    '%s' at %s (+%.1f s, round %d): %s", host_of(l->node), l->when,
            (double)l->t_ms / 1000, l->round, l->why);
    }
    if (L.first_fail >= 0) {
        struct rank_info *r = &L.rk[L.first_fail];
        struct ddp__outcome o = outcome(r);
        say("ddprun: first failure: rank %d on '%s': %s; last lines of %s:", L.first_fail,
            host_of(r->node), ddp__outcome_text(&o, buf, sizeof(buf)), r->logpath);
        for (int k = 0; k < r->ntail; k++)
            say("    %s", r->tail[k]);
    }
    if (L.world)
        say("  %-6s %-20s %-22s %-9s %s", "rank", "host", "status", "runtime", "log");
    struct ddp__rank_rec *rr = calloc((size_t)L.world + 1, sizeof(*rr));
    struct ddp__loss_rec *lr = calloc((size_t)L.nlosses + 1, sizeof(*lr));
    for (int i = 0; i < L.world; i++) {
        struct rank_info *r = &L.rk[i];
        char rt[32];
        struct ddp__outcome o = outcome(r);
        snprintf(rt, sizeof(rt), "%.1fs", (double)r->runtime_ms / 1000);
        say("  %-6d %-20s %-22s %-9s %s", i, host_of(r->node),
            ddp__outcome_text(&o, buf, sizeof(buf)), rt, r->logpath);
        if (rr)
            rr[i] = (struct ddp__rank_rec){.rank = i,
                                           .local = r->local,
                                           .host = host_of(r->node),
                                           .log = r->logpath,
                                           .out = o,
                                           .started = r->started,
                                           .runtime_s = (double)r->runtime_ms / 1000};
    }
    for (int k = 0; lr && k < L.nlosses; k++)
        lr[k] = (struct ddp__loss_rec){.host = host_of(L.losses[k].node),
                                       .when = L.losses[k].when,
                                       .why = L.losses[k].why,
                                       .t = (double)L.losses[k].t_ms / 1000,
                                       .round = L.losses[k].round};
    if (rr && lr) {
        struct ddp__summary sm = {.exit_status = rc,
                                  .reason = L.fatal,
                                  .world = L.world,
                                  .nodes = L.nmembers,
                                  .restarts = L.round,
                                  .first_fail = L.first_fail,
                                  .ranks = rr,
                                  .losses = lr,
                                  .nlosses = L.nlosses};
        ddp__rec_summary(&L.rec, &sm);
    }
    free(rr);
    free(lr);
}

int ddp__launch(const struct ddp_job *job)
{
    int rc = DDP_EXIT_LAUNCH;
    struct ddp_store_server *srv = NULL;
    pthread_t th;
    bool th_started = false;

    memset(&L, 0, sizeof(L));
    L.job = job;
    L.first_fail = -1;
    L.t0 = ddp_now_ms();
    L.tty = isatty(2);
    L.sfd = -1;
    L.wpipe[0] = L.wpipe[1] = -1;
    L.phase_name = "starting";
    make_job_id(job->name, L.job_id, sizeof(L.job_id));
    L.first_remote = ddp__job_first_remote(job);
    ssize_t sl = readlink("/proc/self/exe", L.self, sizeof(L.self) - 1);
    L.self[sl > 0 ? sl : 0] = '\0';
    snprintf(L.logdir, sizeof(L.logdir), "%s/%s", job->logs_dir, L.job_id);
    if (mkdir_p(L.logdir) < 0) {
        ddp__cli_error("cannot create the log folder '%s': %s", L.logdir, strerror(errno));
        return DDP_EXIT_LAUNCH;
    }
    ddp__rec_open(&L.rec, L.logdir, job, L.job_id);
    ddp__con_init(&L.con, L.tty, job->tag_output, job->console_ranks, &L.rec);
    for (size_t i = 0; i < job->nnodes; i++)
        L.total_slots += job->nodes[i].slots;
    L.rk = calloc((size_t)L.total_slots, sizeof(*L.rk));
    L.ag = calloc(job->nnodes, sizeof(*L.ag));
    for (int i = 0; i < L.total_slots; i++)
        L.rk[i].logfd = -1;
    for (size_t i = 0; i < job->nnodes; i++)
        L.ag[i].in_fd = L.ag[i].out_fd = L.ag[i].err_fd = -1;

    /*
     * Signals are read from a signalfd, so they must be blocked in every thread, and that
     * before the store thread exists (it inherits the mask; otherwise the kernel may hand
     * SIGTERM to it, and the default action ends the process). A shell starts background
     * jobs with SIGINT ignored, and an ignored signal never reaches a signalfd: take
     * SIGINT and SIGTERM back. An ignored SIGHUP (nohup) is respected.
     */
    sigset_t set;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    ddp__block_job_signals(&set, &L.oldmask);

    set_phase("starting store");
    if (ddp_store_token_generate(L.token) < 0)
        goto out;
    const char *listen = ddp__job_store_listen(job);
    struct ddp_store_server_opts o = {
        .host = listen, .port = job->rdzv_port, .token = L.token, .token_len = strlen(L.token)};
    int r = ddp_store_server_new(&o, &srv);
    if (r < 0) {
        ddp__cli_error("cannot start the rendezvous store on '%s:%d': %s", listen, job->rdzv_port,
                       ddp_strerror(r));
        goto out;
    }
    if (pthread_create(&th, NULL, serve, srv) != 0)
        goto out;
    th_started = true;
    L.store_port = ddp_store_server_port(srv);
    L.wildcard = strcmp(listen, "0.0.0.0") == 0 || strcmp(listen, "::") == 0;
    snprintf(L.store_host, sizeof(L.store_host), "%s", L.wildcard ? "127.0.0.1" : listen);
    snprintf(L.store_addr, sizeof(L.store_addr), strchr(L.store_host, ':') ? "[%s]:%d" : "%s:%d",
             L.store_host, L.store_port);

    if (ddp_loop_new(&L.loop) < 0 || (L.sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0 ||
        ddp_loop_add(L.loop, L.sfd, DDP_LOOP_READ, on_signal, NULL) < 0)
        goto out;
    ddp_timer_init(&L.tick, on_tick);
    ddp_timer_init(&L.force, on_force);
    ddp_timer_init(&L.stop_deadline, on_stop_deadline);
    ddp_timer_init(&L.rdzv_deadline, on_rdzv_deadline);
    ddp_timer_init(&L.last_call, on_last_call);
    ddp_timer_init(&L.retry, on_retry);
    if ((r = start_watcher()) < 0) {
        ddp__cli_error("cannot watch the job's own store at %s: %s", L.store_addr, ddp_strerror(r));
        goto out;
    }
    /* Should an agent die abnormally, what its ranks leave behind is reparented to us
     * instead of init, and swept at the end. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (L.tty)
        ddp_timer_start(L.loop, &L.tick, 250);

    if (!L.tty)
        say("ddprun: job %s: %d ranks on %zu node%s, store on %s:%d, logs in %s", L.job_id,
            job->world_size, job->nnodes, job->nnodes == 1 ? "" : "s", listen, L.store_port,
            L.logdir);
    event("job_start", "job_id", L.job_id, "#nodes", (long long)job->nnodes, "#min_nodes",
          (long long)job->min_nodes, "#max_nodes", (long long)job->max_nodes, "#max_restarts",
          (long long)job->max_restarts, NULL);
    size_t e = 0;
    L.env = calloc(job->nenv + 2, sizeof(char *));
    if (ddp__job_omp_default(job))
        L.env[e++] = strdup("OMP_NUM_THREADS=1");
    for (size_t k = 0; k < job->nenv; k++) {
        size_t len = strlen(job->env[k].key) + strlen(job->env[k].value) + 2;
        L.env[e] = malloc(len);
        snprintf(L.env[e++], len, "%s=%s", job->env[k].key, job->env[k].value);
    }
    set_phase("launching");
    if (job->max_restarts > 0)
        ddp_timer_start(L.loop, &L.retry, 1000);
    rdzv_open();
    if (!(L.ph == PH_FINISHING && all_agents_gone()))
        ddp_loop_run(L.loop);

    rc = L.interrupted ? DDP_EXIT_INTERRUPTED : L.fatal ? L.fatal_rc : DDP_EXIT_OK;
    for (int i = 0; i < L.world && rc == DDP_EXIT_OK; i++)
        if (!L.rk[i].exited || L.rk[i].code != 0)
            rc = DDP_EXIT_JOB_FAILED;
    if (L.world == 0 && rc == DDP_EXIT_OK)
        rc = DDP_EXIT_LAUNCH;
    /* Anything still parented to us is an orphan of the job. */
    ddp__sweep_children();
    ddp__con_clear(&L.con);
    event("job_end", "status", ddp__job_status(rc), "#exit_status", (long long)rc, "reason",
          rc ? L.fatal : NULL, NULL);
    summarize(rc, (double)(ddp_now_ms() - L.t0) / 1000);
out:
    explicit_bzero(L.token, sizeof(L.token));
    if (L.wth_started) {
        atomic_store(&L.wstop, true);
        pthread_join(L.wth, NULL);
    }
    if (th_started) {
        ddp_store_server_stop(srv);
        pthread_join(th, NULL);
    }
    ddp_store_server_free(srv);
    if (L.loop)
        ddp_loop_free(L.loop);
    if (L.sfd >= 0)
        close(L.sfd);
    for (int k = 0; k < 2; k++)
        if (L.wpipe[k] >= 0)
            close(L.wpipe[k]);
    ddp_buf_release(&L.wrx);
    pthread_sigmask(SIG_SETMASK, &L.oldmask, NULL);
    release_ranks();
    for (size_t i = 0; L.ag && i < job->nnodes; i++) {
        if (L.ag[i].in_fd >= 0)
            close(L.ag[i].in_fd);
        if (L.ag[i].out_fd >= 0)
            close(L.ag[i].out_fd);
        if (L.ag[i].err_fd >= 0)
            close(L.ag[i].err_fd);
        ddp_buf_release(&L.ag[i].rx);
        ddp_buf_release(&L.ag[i].erx);
    }
    for (char **p = L.env; p && *p; p++)
        free(*p);
    free(L.env);
    ddp__rec_close(&L.rec);
    free(L.rk);
    free(L.ag);
    free(L.losses);
    free(L.fatal);
    return rc;
}
