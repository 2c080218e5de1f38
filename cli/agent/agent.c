/*
 * `ddprun agent`: the node agent. It reads a JOIN frame on stdin, joins the
 * job's store and keeps a lease there alive (its heartbeat); then, for each
 * START frame (one per rendezvous round), it starts the node's workers with a
 * torchrun-compatible environment, forwards their output line by line and
 * their exits as frames on stdout, and answers DONE once all are reaped. It
 * stops them on STOP (its signal, SIGTERM after half the grace period when that was SIGINT,
 * SIGKILL after all of it), passes SIGNAL's signal to the workers; on EOF of
 * stdin or on SIGTERM/SIGINT/SIGHUP it stops them and exits, once no process of
 * the job is left. Should its lease be lost or the store stay unreachable for
 * the heartbeat timeout, it does the same on its own (the launcher has counted
 * the node lost by then, and a new round runs without it). With a takeover wait
 * (etcd), an EOF without BYE leaves the workers running for a new launcher
 * (cli/agent/link.h).
 *
 * It is over 800 lines as one loop: the launcher's frames in, the workers' processes, output
 * and exits out, and the stop that ends them share the agent's one state.
 */
#include "cli/agent/rank_env.h"
#include "cli/agent/guard.h"
#include "cli/agent/fanout.h"
#include "cli/agent/link.h"
#include "cli/agent/store_proxy.h"
#include "cli/agent/warm.h"
#include "cli/agent/ckpt_repl.h"
#include "cli/proto/ckpt_proto.h"
#include "cli/proto/agent_proto.h"
#include "cli/agent/agent.h"
#include "cli/sys/sys.h"
#include "cli/sys/cpubind.h"
#include "cli/diag/node.h"
#include "cli/agent/errfile.h"
#include "cli/proto/membership.h"
#include "cli/diag/pystacks.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "common/loop.h"
#include "rendezvous/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <termios.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/banned.h"

struct worker {
    int local_rank;
    pid_t pid;
    int fd[2]; /* stdout, stderr pipes; -1 once at EOF */
    struct ddp_buf line[2];
    bool progress[2]; /* the pending line of the stream began after a '\r' */
    bool exited, reported, exec_failed;
    int spawn_err;                /* the errno of a rank that could not even be forked, else 0 */
    bool sent_started, sent_exit; /* STARTED, EXITED reached the launcher (for STATE) */
    int code;                     /* >= 0 exit status, < 0 minus the signal */
    int64_t t0, t1;
    struct ddp__dn_page page; /* its flight recorder, read for the progress report */
    int pydump;               /* its Python tracebacks (cli/diag/pystacks.h), or -1 */
    int errfd;                /* its TORCHELASTIC_ERROR_FILE (cli/agent/errfile.h), or -1 */
    bool bound;               /* bind_to: its CPUs, and how many local ranks share them */
    cpu_set_t cpus;
    int sharers;
};

struct agent {
    struct ddp_loop *loop;
    struct ddp__agent_join join;
    struct ddp__agent_start st;
    bool have_join, have_start, stopping, exiting;
    bool prepared;  /* st is a PREPARE's (a spare's next START as it would be), no round's */
    bool leaving;   /* exiting once the SSH bridges of the nodes below end (cli/agent/fanout.h) */
    bool hello;     /* the launcher on the link said HELLO (agent_proto.h) */
    bool held;      /* a START waits for its restore (cli/agent/ckpt_repl.h) */
    uint32_t round; /* the round of the last START (a checkpoint file's, once it ended) */
    int64_t fin_since; /* DONE waits for the checkpoint files' reports since (ddp_now_ms) */
    struct ddp__member_lease *lease; /* the node's lease (cli/proto/membership.h), once joined */
    struct ddp__guard *guard;        /* its guard (cli/agent/guard.h), once joined */
    char iface[64];     /* this node's interface toward the store: the ranks' network default */
    char node_addr[64]; /* and its address there */
    char proxy[300];    /* where its ranks reach the store: its proxy (cli/agent/store_proxy.h) */
    cpu_set_t allowed;  /* the agent's own CPUs, which bind_to divides among the ranks */
    struct worker *w;
    int nw, unreported;
    struct ddp_buf in;
    struct ddp_buf last; /* STATE of the last round, once DONE went out (for a new launcher) */
    int sfd;
    sigset_t oldmask;
    struct ddp_timer grace, term, reap, fin;
    int stop_sig; /* the signal a stop began with */
    int rc;
    struct ddp_timer report;    /* the progress report, every heartbeat interval */
    struct ddp__dn_asker asker; /* STACKS (cli/diag/node.h) */
    int pyshim;                 /* the ranks' sitecustomize (cli/diag/pystacks.h), or -1 */
};

static struct agent A;

/* The membership backend (cli/proto/membership.h): the built-in store. */
#define MEMBERSHIP (&ddp__member_store)

/* True when the frame reached the launcher's link (cli/agent/link.h); else it is held for a
 * new launcher, or the node is stopping. */
static bool send_frame(struct ddp_buf *b, bool output)
{
    bool sent = ddp__link_send(b, output);
    b->len = b->off = 0;
    return sent;
}

/* The children a sweep of stragglers leaves: the node's guard, and the SSH bridges of the nodes
 * below (cli/agent/fanout.h), which end by their nodes' links. */
static bool spared(pid_t pid)
{
    if (ddp__warm_owns(pid))
        return true; /* kept through a round's stop, ended with the agent */
    return pid == ddp__guard_pid(A.guard) || ddp__fanout_owns(pid);
}

static void send_tree(struct ddp_buf *b)
{
    send_frame(b, false);
}

static void stop_loop(void)
{
    ddp_loop_stop(A.loop);
}

static bool send_buf(struct ddp_buf *b)
{
    return send_frame(b, false);
}

static void send_output(struct worker *w, int stream, const uint8_t *p, size_t n)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_OUTPUT);
    ddp_buf_put_u32(&b, (uint32_t)w->local_rank);
    ddp_buf_put_u8(&b, (uint8_t)stream);
    ddp_buf_put_str(&b, p, n);
    ddp__agent_end(&b, pos);
    send_frame(&b, true);
    ddp_buf_release(&b);
}

static void send_note(struct worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void send_note(struct worker *w, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    send_output(w, 2, (const uint8_t *)msg,
                n < 0                     ? 0
                : (size_t)n < sizeof(msg) ? (size_t)n
                                          : sizeof(msg) - 1);
}

static void finish_if_done(void);
static void state_of(struct ddp_buf *out, bool done);
static void start_workers(void);

/* Reports a worker's exit once its status is known and both pipes are drained. */
static void maybe_report(struct worker *w)
{
    if (w->reported || !w->exited || w->fd[0] >= 0 || w->fd[1] >= 0)
        return;
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (w->code != 0 && !w->exec_failed && ddp__ef_frame(w->errfd, (uint32_t)w->local_rank, &b))
        send_frame(&b, true); /* before EXITED, kept as output is: the error names the exit */
    size_t pos = ddp__agent_begin(&b, DDP__AG_EXITED);
    ddp_buf_put_u32(&b, (uint32_t)w->local_rank);
    ddp_buf_put_u32(&b, (uint32_t)w->code);
    ddp_buf_put_u64(&b, (uint64_t)(w->t1 - w->t0));
    ddp_buf_put_u8(&b, w->exec_failed);
    ddp__agent_end(&b, pos);
    w->sent_exit = send_buf(&b);
    ddp_buf_release(&b);
    w->reported = true;
    A.unreported--;
    finish_if_done();
}

static void on_pipe(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    struct worker *w = arg;
    int s = fd == w->fd[0] ? 0 : 1;
    uint8_t tmp[65536];
    ssize_t n = ddp_read_eintr(fd, tmp, sizeof(tmp));
    if (n == -EAGAIN)
        return;
    struct ddp_buf *lb = &w->line[s];
    if (n <= 0) {
        if (ddp_buf_pending(lb))
            send_output(w, s + 1, lb->data + lb->off, ddp_buf_pending(lb));
        ddp_buf_release(lb);
        ddp_loop_del(loop, fd);
        close(fd);
        w->fd[s] = -1;
        maybe_report(w);
        return;
    }
    ddp_buf_put(lb, tmp, (size_t)n);
    /* Whole lines go out one frame each; an over-long line is cut at the limit. A line ends
     * at '\n' (a '\r' just before it is dropped); within a line, a '\r' starts the text over
     * (a progress bar), so only what follows the last one is the line. */
    for (;;) {
        uint8_t *start = lb->data + lb->off;
        size_t pend = ddp_buf_pending(lb);
        uint8_t *nl = memchr(start, '\n', pend);
        if (nl) {
            size_t len = (size_t)(nl - start);
            const uint8_t *from = start;
            if (len && start[len - 1] == '\r')
                len--;
            for (size_t k = len; k-- > 0;)
                if (start[k] == '\r') {
                    from = start + k + 1;
                    break;
                }
            send_output(w, s + 1, from, len - (size_t)(from - start));
            lb->off += (size_t)(nl - start) + 1;
            w->progress[s] = false;
        } else if (pend >= DDP__AGENT_MAX_LINE) {
            send_output(w, (s + 1) | DDP__AG_OUT_CUT, start, DDP__AGENT_MAX_LINE);
            lb->off += DDP__AGENT_MAX_LINE;
        } else {
            break;
        }
    }
    /* A progress bar: text after a '\r' with no newline yet is shown now (in place), and
     * stays pending as the start of the line. A '\r' at the very end may be half of "\r\n". */
    uint8_t *start = lb->data + lb->off;
    size_t pend = ddp_buf_pending(lb), k = pend;
    while (k > 0 && start[k - 1] != '\r')
        k--;
    if (k == 0 || k < pend) { /* no '\r', or text after the last one */
        if (k > 0) {
            lb->off += k;
            w->progress[s] = true;
        }
        if (w->progress[s] && pend > k)
            send_output(w, (s + 1) | DDP__AG_OUT_PROGRESS, start + k, pend - k);
    }
    ddp_buf_compact(lb);
}

static void on_grace(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)t;
    /* SIGKILL cannot be aimed at our own group (we are in it): kill each child, and
     * again as orphans reparent to us, until none is left. */
    if (ddp__kill_children(SIGKILL, spared) > 0)
        ddp_timer_start(loop, &A.grace, 20);
}

/* Half the grace period into a stop that began with another signal: SIGTERM. */
static void on_term(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    if (A.unreported > 0)
        kill(0, SIGTERM);
}

/* Stops the workers: sig (SIGINT or SIGTERM) to their process group now, SIGTERM after half
 * the grace period when sig was SIGINT, SIGKILL after all of it (agent_proto.h, STOP). */
static void start_stop(const char *why, int sig)
{
    if (A.stopping && ddp_timer_armed(&A.grace))
        return;
    A.stopping = true;
    A.stop_sig = sig;
    if (A.held && !ddp__cr_restoring()) { /* a START whose restore failed: never started */
        A.held = false;
        start_workers();
    }
    DDP_DEBUG(SUP, "agent stopping its workers with %s: %s", sigabbrev_np(sig), why);
    if (A.unreported > 0) {
        /* The whole process group: workers and what they started (our own copy, through the
         * signalfd, is ignored); SIGCONT lets a stopped worker act on it, as systemd does. */
        kill(0, sig);
        kill(0, SIGCONT);
        if (sig != SIGTERM)
            ddp_timer_start(A.loop, &A.term, (int64_t)A.st.grace_ms / 2);
        ddp_timer_start(A.loop, &A.grace, (int64_t)A.st.grace_ms);
    }
    finish_if_done();
}

/* SIGUSR1, SIGUSR2 or SIGHUP for the job: to each worker that runs (the processes ddprun
 * started, as mpirun forwards them; not what they started, such as data loaders). */
static void forward_signal(int sig)
{
    for (int i = 0; i < A.nw; i++)
        if (A.w[i].pid > 0 && !A.w[i].exited)
            kill(A.w[i].pid, sig);
}

/* Called whenever a worker's report went out or a stop began: once every worker of the
 * round is reported, the round is over (DONE), and the agent exits if it was told to. The
 * work is done from the loop, as callers may still hold pointers into the workers. */
static void finish_if_done(void)
{
    if (A.unreported == 0)
        ddp_timer_start(A.loop, &A.fin, 0);
}

static void free_workers(void)
{
    for (int i = 0; i < A.nw; i++) {
        ddp_buf_release(&A.w[i].line[0]);
        ddp_buf_release(&A.w[i].line[1]);
        for (int s = 0; s < 2; s++)
            if (A.w[i].fd[s] >= 0)
                close(A.w[i].fd[s]);
        ddp__dn_page_release(&A.w[i].page);
        if (A.w[i].pydump >= 0)
            close(A.w[i].pydump);
        if (A.w[i].errfd >= 0)
            close(A.w[i].errfd);
    }
    free(A.w);
    A.w = NULL;
    A.nw = 0;
}

static void on_fin(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)t;
    if (A.unreported > 0)
        return;
    /* Stragglers the workers left behind are part of the job too. */
    ddp__sweep_children(spared);
    /* The round's last checkpoint files are reported before DONE (a moment: they settle for
     * 200 ms; at most 5 s), so that the next round's restore, or the job's end, knows them. */
    int64_t now = ddp_now_ms();
    if (A.have_start && !A.exiting && !ddp__cr_quiet() &&
        (!A.fin_since || now - A.fin_since < 5000)) {
        if (!A.fin_since)
            A.fin_since = now;
        ddp_timer_start(loop, &A.fin, 50);
        return;
    }
    A.fin_since = 0;
    if (A.have_start) {
        struct ddp_buf b;
        ddp_buf_init(&b);
        size_t pos = ddp__agent_begin(&b, DDP__AG_DONE);
        ddp__agent_end(&b, pos);
        send_buf(&b);
        ddp_buf_release(&b);
        A.last.len = A.last.off = 0;
        state_of(&A.last, true);
        free_workers();
        ddp__agent_start_release(&A.st);
        A.have_start = false;
    }
    ddp_timer_stop(A.loop, &A.grace);
    ddp_timer_stop(A.loop, &A.term);
    A.stopping = false;
    if (A.exiting) {
        /* A clean exit: the lease goes now rather than at its expiry. */
        MEMBERSHIP->leave(A.lease, true);
        A.lease = NULL;
        /* the nodes this one started over SSH end on their own links first */
        if (!A.leaving && !(A.leaving = ddp__fanout_end(stop_loop)))
            ddp_loop_stop(A.loop);
    }
}

/* Stop the workers and leave. */
static void start_exit(const char *why)
{
    A.exiting = true;
    start_stop(why, SIGTERM);
}

/* The launcher is gone, and no new one came within the takeover wait (or none may). */
static void on_gone(void)
{
    if (!A.have_join)
        A.rc = DDP_EXIT_LAUNCH; /* told nothing */
    if (!A.exiting)
        start_exit("the launcher is gone");
}

/* STATE for a new launcher: what the last one was told (agent_proto.h). */
static void state_of(struct ddp_buf *out, bool done)
{
    struct ddp__agent_state s = {.node_index = A.join.node_index,
                                 .incarnation = A.join.incarnation,
                                 .have_start = A.have_start,
                                 .done = done,
                                 .round = A.st.restart_count,
                                 .rank_offset = A.st.rank_offset,
                                 .nlocal = (uint32_t)A.nw};
    s.ranks = calloc((size_t)A.nw + 1, sizeof(*s.ranks));
    if (!s.ranks)
        s.have_start = 0;
    for (int i = 0; s.ranks && i < A.nw; i++) {
        const struct worker *w = &A.w[i];
        s.ranks[i] = (struct ddp__agent_state_rank){.pid = w->sent_started ? (uint32_t)w->pid : 0,
                                                    .exited = w->sent_exit,
                                                    .exec_failed = w->exec_failed,
                                                    .code = w->code,
                                                    .runtime_ms = (uint64_t)(w->t1 - w->t0)};
    }
    ddp__agent_put_state(out, &s);
    free(s.ranks);
}

/* A new launcher linked (cli/agent/link.h): its frames, HELLO first, start on a clean slate. */
static void linked(void)
{
    A.in.len = A.in.off = 0;
    A.hello = false;
}

static void snapshot(struct ddp_buf *out)
{
    if (!A.have_start && A.last.len)
        ddp_buf_put(out, A.last.data, A.last.len);
    else
        state_of(out, false);
}

/* Closes the pipes spawn made (-1: not made), keeping errno. */
static void close_pipes(const int *a, const int *b, const int *c, const int *d)
{
    int err = errno;
    const int *all[] = {a, b, c, d};
    for (int k = 0; k < 4; k++)
        for (int e = 0; e < 2; e++)
            if (all[k][e] >= 0)
                close(all[k][e]);
    errno = err;
}

/* How a rank of slot w starts: its environment's makings, its CPUs (set in w here); returns
 * how many cores or NUMA nodes bind_to gives the node's ranks. */
static int rank_exec(struct worker *w, struct ddp__rank_exec *x)
{
    int units = 0;
    w->bound = A.st.bind_to != DDP__BIND_NONE &&
               ddp__cpubind_rank(A.st.bind_to, NULL, &A.allowed, (int)A.st.nlocal, w->local_rank,
                                 &w->cpus, &w->sharers, &units) == 0;
    *x = (struct ddp__rank_exec){.st = &A.st,
                                 .join = &A.join,
                                 .iface = A.iface,
                                 .node_addr = A.node_addr,
                                 .store_addr = A.proxy[0] ? A.proxy : NULL,
                                 .mask = &A.oldmask,
                                 .pyshim = A.pyshim,
                                 .local_rank = w->local_rank,
                                 .pydump = w->pydump,
                                 .errfd = w->errfd,
                                 .bound = w->bound,
                                 .cpus = &w->cpus,
                                 .sharers = w->sharers};
    return units;
}

static void send_started(struct worker *w, bool warm)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_STARTED);
    ddp_buf_put_u32(&b, (uint32_t)w->local_rank);
    ddp_buf_put_u32(&b, (uint32_t)w->pid);
    ddp_buf_put_u8(&b, warm);
    ddp__agent_end(&b, pos);
    w->sent_started = send_buf(&b);
    ddp_buf_release(&b);
}

/* Slot w's rank from its warm interpreter (cli/agent/warm.h): true when it started so. */
static bool spawn_warm(struct worker *w)
{
    struct ddp__rank_exec x;
    struct ddp__warm_rank r;
    w->t0 = ddp_now_ms();
    rank_exec(w, &x);
    if (ddp__warm_take(&x, &r) != 1)
        return false;
    w->pid = r.pid;
    w->fd[0] = r.out;
    w->fd[1] = r.err;
    w->page = r.page;
    w->pydump = r.pydump;
    w->errfd = r.errfd;
    send_started(w, true);
    ddp_loop_add(A.loop, w->fd[0], DDP_LOOP_READ, on_pipe, w);
    ddp_loop_add(A.loop, w->fd[1], DDP_LOOP_READ, on_pipe, w);
    return true;
}

static int spawn(struct worker *w)
{
    if (spawn_warm(w))
        return 0;
    int op[2] = {-1, -1}, ep[2] = {-1, -1}, tp[2] = {-1, -1}, xp[2] = {-1, -1};
    if (pipe2(op, O_CLOEXEC) || pipe2(ep, O_CLOEXEC) || pipe2(tp, O_CLOEXEC) ||
        pipe2(xp, O_CLOEXEC)) {
        close_pipes(op, ep, tp, xp);
        return DDP_ESYS;
    }
    pid_t agent = getpid();
    w->t0 = ddp_now_ms();
    if (ddp__dn_page_new(&w->page) < 0)
        DDP_DEBUG(SUP, "agent: no progress page for local rank %d", w->local_rank);
    w->pydump = A.pyshim >= 0 ? ddp__pys_dump_new() : -1;
    w->errfd = ddp__ef_new();
    struct ddp__rank_exec x;
    int units = rank_exec(w, &x);
    pid_t pid = fork();
    if (pid < 0) {
        close_pipes(op, ep, tp, xp);
        return DDP_ESYS;
    }
    if (pid == 0)
        ddp__agent_exec_rank(&x, op[1], ep[1], tp[0], xp[1], w->page.fd, agent);
    close(op[1]);
    close(ep[1]);
    close(tp[0]);
    close(xp[1]);
    w->pid = pid;
    w->fd[0] = op[0];
    w->fd[1] = ep[0];
    fcntl(op[0], F_SETFL, O_NONBLOCK);
    fcntl(ep[0], F_SETFL, O_NONBLOCK);
    ddp_write_all(tp[1], A.st.token, strlen(A.st.token));
    close(tp[1]);
    int msg[2];
    ssize_t got = ddp_read_eintr(xp[0], msg, sizeof(msg));
    close(xp[0]);
    if (got == (ssize_t)sizeof(msg)) {
        w->exec_failed = true;
        char why[PATH_MAX + 512];
        ddp__agent_exec_error(&A.st, msg[0], msg[1], why, sizeof(why));
        send_note(w, "%s", why);
    } else {
        send_started(w, false);
        /* NUMA nodes are shared by design; cores only when ranks outnumber them */
        if (w->bound && w->local_rank == 0 && w->sharers > 1 && A.st.bind_to == DDP__BIND_CORE)
            send_note(w, "ddprun agent: bind_to core: %d ranks share %d core%s here", A.nw, units,
                      units == 1 ? "" : "s");
    }
    ddp_loop_add(A.loop, w->fd[0], DDP_LOOP_READ, on_pipe, w);
    ddp_loop_add(A.loop, w->fd[1], DDP_LOOP_READ, on_pipe, w);
    return 0;
}

/* Says why a rank could not even be forked (its pipes, its pages, fork itself): most often
 * the limit on open files, which a job of many local ranks reaches first. */
static void spawn_failed(struct worker *w, int err)
{
    int same = -1; /* a local rank before it that failed so */
    for (int i = 0; i < w->local_rank && same < 0; i++)
        if (A.w[i].exec_failed && A.w[i].pid == 0 && A.w[i].spawn_err == err)
            same = i;
    w->spawn_err = err;
    char why[512];
    ddp__agent_spawn_error(w->local_rank, err, same, A.nw, why, sizeof(why));
    send_note(w, "%s", why);
}

static void start_workers(void)
{
    A.nw = (int)A.st.nlocal;
    A.w = calloc((size_t)A.nw, sizeof(*A.w));
    A.unreported = A.nw;
    for (int i = 0; i < A.nw; i++) {
        A.w[i].local_rank = i;
        A.w[i].fd[0] = A.w[i].fd[1] = -1;
        A.w[i].page.fd = -1;
        A.w[i].pydump = A.w[i].errfd = -1;
        if (A.stopping || spawn(&A.w[i]) < 0) {
            /* Never started: report it as failed so the launcher's count adds up, with why. */
            if (!A.stopping)
                spawn_failed(&A.w[i], errno);
            A.w[i].exited = true;
            A.w[i].code = 127;
            A.w[i].exec_failed = !A.stopping;
            A.w[i].t0 = A.w[i].t1 = ddp_now_ms();
            maybe_report(&A.w[i]);
        }
    }
}

/* ---- membership: the node's lease ---- */

/* The lease is gone or the backend unreachable for the heartbeat timeout: the launcher has
 * counted this node lost, and a new round may train without it, so its workers must stop
 * writing and computing now, not after a grace period (SIGKILL). */
static void on_fenced(void *arg, const char *why)
{
    (void)arg;
    fprintf(stderr, "ddprun agent on '%s': %s; killing this node's workers\n", A.join.host_label,
            why);
    start_exit("fenced");
    on_grace(A.loop, &A.grace);
}

/*
 * The launcher's stdin ended while this node's ranks run: did the launcher die (SIGKILL, its
 * machine lost: its store is gone with it, and the ranks stop gracefully, as for a stop), or
 * only this node's connection to it (sshd killed, a reset link: the launcher lives, counts this
 * node lost, and a new round may start at once without it, so the ranks must not go on, not
 * even for stop_grace)? Its store, in the launcher's process, tells: a connection to it within
 * a second. With etcd the store outlives the launcher, and this cannot tell.
 */
static bool cut_off(void)
{
    char host[256];
    int port;
    struct ddp_store *s = NULL;
    if (!A.have_start || !A.lease || (A.join.etcd_endpoints && A.join.etcd_endpoints[0]) ||
        ddp_parse_hostport(MEMBERSHIP->store_addr(A.lease), host, sizeof(host), &port) < 0 ||
        ddp_store_connect(host, port, A.join.token, strlen(A.join.token), 1000, &s) < 0)
        return false;
    ddp_store_close(s);
    return true;
}

/* ---- warm ranks (cli/agent/warm.h) ---- */

static void warm_say(int local_rank, const char *line)
{
    if (local_rank >= 0 && local_rank < A.nw)
        send_note(&A.w[local_rank], "%s", line);
}

/* After the round's first collective here (each of its ranks', or 10 s into the round), while
 * they all run, the slots' warm interpreters for the next start, made at idle priority. */
#define WARM_AFTER_MS 10000

static void maybe_warm(void)
{
    if (!A.have_start || A.stopping || A.exiting || A.st.max_restarts == 0 ||
        !ddp__warm_eligible(&A.st))
        return; /* (a job that never restarts needs none) */
    int64_t now = ddp_now_ms();
    for (int i = 0; i < A.nw; i++) {
        const struct worker *w = &A.w[i];
        if (w->pid <= 0 || w->exited || (!w->page.first_done_ns && now - w->t0 < WARM_AFTER_MS))
            return; /* (a round whose ranks end needs none made now) */
    }
    for (int i = 0; i < A.nw; i++) {
        struct worker tmp = A.w[i];
        struct ddp__rank_exec x;
        rank_exec(&tmp, &x);
        ddp__warm_make(&x);
    }
}

/* A spare's (PREPARE): an interpreter per slot at once, as its START would start the slot's
 * rank; a spare runs nothing else meanwhile. */
static void prepare_warm(void)
{
    if (A.st.max_restarts == 0 || !ddp__warm_eligible(&A.st)) {
        ddp__warm_drop_all();
        return;
    }
    for (int i = 0; i < (int)A.st.nlocal; i++) {
        struct worker tmp = {.local_rank = i, .pydump = -1, .errfd = -1};
        struct ddp__rank_exec x;
        rank_exec(&tmp, &x);
        ddp__warm_make(&x);
    }
}

/* ---- diagnosis: the progress report and stacks (cli/diag/node.h) ---- */

/* Every heartbeat interval: a line per rank started (those that exited: their page's last
 * state), sent with the next heartbeat. */
static void on_report(struct ddp_loop *loop, struct ddp_timer *t)
{
    if (A.have_start && A.lease) {
        struct ddp_buf b;
        ddp_buf_init(&b);
        /* the round it is of: the launcher drops a report made before its round began */
        char head[32];
        int hl = snprintf(head, sizeof(head), "round %u\n", (unsigned)A.st.restart_count);
        ddp_buf_put(&b, head, (size_t)hl);
        size_t empty = b.len;
        for (int i = 0; i < A.nw; i++)
            if (A.w[i].pid > 0)
                ddp__dn_report_rank(&b, (int)A.st.rank_offset + i, A.w[i].pid, A.w[i].exited,
                                    ddp__dn_asker_touches(&A.asker, A.w[i].pid), &A.w[i].page);
        if (b.len > empty)
            MEMBERSHIP->publish(A.lease, b.data, b.len);
        ddp_buf_release(&b);
    }
    maybe_warm();
    ddp_timer_start(loop, t, (int64_t)A.join.heartbeat_interval_ms);
}

static void send_stacks(struct ddp_buf *frame)
{
    send_buf(frame);
}

/* STACKS: the native stacks of the asked (or all running) local ranks. */
static void gather_stacks(const uint8_t *body, size_t len)
{
    struct ddp__dn_proc *running = calloc((size_t)A.nw + 1, sizeof(*running));
    for (int i = 0; running && i < A.nw; i++)
        running[i] = (struct ddp__dn_proc){.pid = A.w[i].pid > 0 && !A.w[i].exited ? A.w[i].pid : 0,
                                           .pydump = A.w[i].pydump};
    if (running)
        ddp__dn_stacks_frame(&A.asker, body, len, running, A.nw);
    free(running);
}

/*
 * Where the launcher offered several addresses of its store (it knew no route to this node),
 * the ranks get the one the agent reached: DDPRUN_STORE_ADDR, and MASTER_ADDR where that is
 * the launcher's TCPStore port.
 */
static int pick_store_addr(void)
{
    if (!A.lease || !strchr(A.st.store_addr, ','))
        return 0;
    const char *got = MEMBERSHIP->store_addr(A.lease);
    char host[256];
    int port;
    char *s = strdup(got), *m = NULL;
    if (!s)
        return -1;
    free(A.st.store_addr);
    A.st.store_addr = s;
    if (strchr(A.st.master_addr, ',') && ddp_parse_hostport(got, host, sizeof(host), &port) == 0) {
        if (!(m = strdup(host)))
            return -1;
        free(A.st.master_addr);
        A.st.master_addr = m;
    }
    return 0;
}

/* Joins the membership (a lease kept alive by a heartbeat), starts the node's guard, which
 * ends the node's job should the lease go unrenewed while the agent cannot act, and answers
 * JOINED. */
static int join_membership(void)
{
    uint64_t lease = 0;
    if (ddp__guard_new(&A.guard) < 0)
        A.guard = NULL;
    int r = MEMBERSHIP->join(&A.join, A.loop, on_fenced, NULL,
                             A.guard ? ddp__guard_renewal(A.guard) : NULL, &lease, &A.lease);
    if (r < 0)
        return r;
    if (!A.guard ||
        ddp__guard_start(A.guard, (int64_t)A.join.heartbeat_timeout_ms, A.join.host_label) < 0)
        fprintf(stderr,
                "ddprun agent on '%s': cannot start the node's guard (%s); should this agent "
                "hang, its ranks outlive the node's loss\n",
                A.join.host_label, strerror(errno));
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_JOINED);
    ddp_buf_put_u64(&b, lease);
    ddp__agent_end(&b, pos);
    send_buf(&b);
    ddp_buf_release(&b);
    ddp_timer_start(A.loop, &A.report, (int64_t)A.join.heartbeat_interval_ms);
    return 0;
}

static const char *join_at, *join_token; /* --join HOST:PORT --token-file FILE */

/* An agent that joined at HOST:PORT (--join) reaches the job's store there: the launcher, which
 * did not start it, knows no better address of its own for it. 0, or -1 out of memory. */
static int join_store(char **addr)
{
    if (!join_at)
        return 0;
    char *a = strdup(join_at);
    if (!a)
        return -1;
    free(*addr);
    *addr = a;
    return 0;
}

/* ---- replicated checkpoints (cli/agent/ckpt_repl.h) ---- */

static uint32_t ckpt_round(void)
{
    return A.round;
}

static void ckpt_send(struct ddp_buf *b)
{
    /* (a CKPT_FILE is kept until acknowledged, as output is: cli/proto/agent_proto.h) */
    send_frame(b, b->len > 4 && ddp__agent_acked(b->data[4]));
}

/* The restore a START waited for is done: its ranks start (or, stopped meanwhile, are
 * reported as never started). One that failed waits for the launcher's STOP (start_stop). */
static void ckpt_restored(bool ok)
{
    if (!A.held || (!ok && !A.stopping))
        return;
    A.held = false;
    start_workers();
}

/* CKPT_OPEN: the folder's watch and the replication port on this node's address toward the
 * launcher; CKPT_PORT says where (or why not). */
static int ckpt_open(const uint8_t *body, size_t len)
{
    struct ddp_rd rd;
    const uint8_t *p;
    uint32_t n;
    char dir[PATH_MAX], host[256], iface[64], ip[64] = "", addr[DDP__CK_ADDR_MAX + 1] = "";
    char why[DDP__CK_WHY_MAX + 1] = "";
    ddp_rd_init(&rd, body, len);
    if (ddp_rd_str(&rd, sizeof(dir) - 1, &p, &n) < 0 || n == 0 || memchr(p, 0, n) ||
        ddp_rd_left(&rd) != 0)
        return -1;
    memcpy(dir, p, n);
    dir[n] = '\0';
    struct ddp__cr_cb cb = {.round = ckpt_round, .send = ckpt_send, .restored = ckpt_restored};
    if (ddp__store_host(A.join.store_addr, A.join.etcd_endpoints, "127.0.0.1", host, sizeof(host)) <
            0 ||
        ddp__route_iface(host, iface, sizeof(iface), ip, sizeof(ip)) < 0 || !ip[0])
        snprintf(why, sizeof(why), "no route from this node toward the launcher's store");
    else if (ddp__cr_open(A.loop, dir, A.join.token, ip, &cb, addr, sizeof(addr), why,
                          sizeof(why)) < 0)
        addr[0] = '\0';
    struct ddp_buf b;
    ddp_buf_init(&b);
    ddp__ck_put_port(&b, addr, addr[0] ? "" : why);
    send_buf(&b);
    ddp_buf_release(&b);
    return 0;
}

static void on_frames(int fd)
{
    struct ddp_loop *loop = A.loop;
    ssize_t n = ddp__link_read(fd, &A.in);
    if (n == -EAGAIN || n == -ENOMEM)
        return;
    if (n <= 0) {
        if (!A.have_join)
            A.rc = DDP_EXIT_LAUNCH;         /* told nothing */
        A.in.len = A.in.off = 0;            /* a frame the launcher did not finish */
        bool waits = ddp__link_lost() == 0; /* for a new launcher (a takeover wait) */
        if (!waits && cut_off())
            on_fenced(NULL, "this node's connection to the launcher ended while the launcher "
                            "still runs (its store answers): it counts this node lost");
        else if (!waits)
            start_exit("the launcher closed our link");
        else
            DDP_INFO(SUP,
                     "agent: the launcher is gone; the workers run on, waiting %llu ms "
                     "for a new one",
                     (unsigned long long)A.join.takeover_ms);
        return;
    }
    uint8_t type;
    const uint8_t *body;
    size_t len;
    int r;
    while ((r = ddp__agent_next(&A.in, &type, &body, &len)) > 0) {
        if (!A.hello) {
            if ((A.hello = ddp__link_hello(type, body, len)))
                continue;
            if (!A.have_join)
                goto protocol_error;
            /* A new launcher of another version: not one to take over; wait for the next. */
            A.in.len = A.in.off = 0;
            if (ddp__link_lost() < 0)
                start_exit("the launcher is gone");
            return;
        } else if (type == DDP__AG_JOIN && !A.have_join) {
            if (ddp__agent_get_join(body, len, &A.join) < 0) {
                fprintf(stderr, "ddprun agent: malformed JOIN from the launcher\n");
                A.rc = DDP_EXIT_LAUNCH;
                ddp_loop_stop(loop);
                return;
            }
            A.have_join = true;
            if (join_store(&A.join.store_addr) < 0)
                goto protocol_error;
            ddp__link_configure(A.join.job_id, A.join.node_index, A.join.takeover_ms);
            if (join_membership() < 0) {
                A.rc = DDP_EXIT_LAUNCH;
                ddp_loop_stop(loop);
                return;
            }
        } else if ((type == DDP__AG_START || type == DDP__AG_PREPARE) && A.have_join &&
                   !A.have_start && !A.exiting) {
            if (A.prepared)
                ddp__agent_start_release(&A.st);
            A.prepared = false;
            if (ddp__agent_get_start(body, len, &A.st) < 0) {
                fprintf(stderr, "ddprun agent: malformed %s from the launcher\n",
                        type == DDP__AG_START ? "START" : "PREPARE");
                goto protocol_error;
            }
            if (join_store(&A.st.store_addr) < 0 || pick_store_addr() < 0) {
                fprintf(stderr, "ddprun agent: out of memory\n");
                goto protocol_error;
            }
            char host[256];
            A.iface[0] = A.node_addr[0] = '\0';
            if (ddp__store_host(A.st.store_addr, A.join.etcd_endpoints, A.st.master_addr, host,
                                sizeof(host)) == 0 &&
                ddp__route_iface(host, A.iface, sizeof(A.iface), A.node_addr, sizeof(A.node_addr)) <
                    0)
                A.iface[0] = A.node_addr[0] = '\0';
            if (type == DDP__AG_PREPARE) {
                A.prepared = true;
                prepare_warm();
                continue;
            }
            A.have_start = true;
            A.stopping = false;
            /* The ranks reach the built-in store through this agent (not an etcd job's) */
            A.proxy[0] = '\0';
            int tport = 0;
            if (strcmp(A.st.store_addr, "etcd") != 0 && !strchr(A.st.store_addr, ',') &&
                A.node_addr[0] &&
                ddp__proxy_start(A.loop, A.node_addr, A.st.store_addr, A.st.token, A.proxy,
                                 sizeof(A.proxy), &tport) < 0)
                A.proxy[0] = '\0'; /* said: they reach it themselves */
            /* and PyTorch's ranks their TCPStore: the launcher's port's keys, through the
             * agent on this node's own address */
            char *mine;
            if (A.proxy[0] && tport && A.st.agent_store && (mine = strdup(A.node_addr))) {
                free(A.st.master_addr);
                A.st.master_addr = mine;
                A.st.master_port = (uint32_t)tport;
            }
            ddp__proxy_ranks(A.st.nlocal, (int)A.st.restart_count);
            if (!ddp__warm_eligible(&A.st))
                ddp__warm_drop_all();
            ddp_log_set_rank(-1);
            A.round = A.st.restart_count;
            if (ddp__cr_restoring()) { /* its ranks start once the folder is restored */
                A.held = true;
                A.unreported = (int)A.st.nlocal;
            } else {
                start_workers();
            }
        } else if (type == DDP__AG_CKPT_OPEN && A.have_join) {
            if (ckpt_open(body, len) < 0) {
                fprintf(stderr, "ddprun agent: malformed CKPT_OPEN from the launcher\n");
                goto protocol_error;
            }
        } else if (type == DDP__AG_CKPT_SYNC && A.have_join) {
            if (ddp__cr_sync(body, len) < 0) {
                fprintf(stderr, "ddprun agent: malformed CKPT_SYNC from the launcher\n");
                goto protocol_error;
            }
        } else if (type == DDP__AG_STOP) {
            struct ddp_rd rd;
            uint64_t g = 0;
            uint8_t sig = SIGTERM;
            ddp_rd_init(&rd, body, len);
            if (ddp_rd_u64(&rd, &g) == 0 && A.have_start)
                A.st.grace_ms = g;
            if (ddp_rd_u8(&rd, &sig) < 0 || (sig != SIGINT && sig != SIGTERM))
                sig = SIGTERM;
            if (A.stopping && g == 0)
                on_grace(loop, &A.grace); /* a second, forceful stop */
            else
                start_stop("the launcher asked", sig);
        } else if (type == DDP__AG_BYE) {
            ddp__link_configure(A.have_join ? A.join.job_id : "", 0, 0);
        } else if (type == DDP__AG_ACK) {
            if (ddp__link_ack(body, len) < 0) {
                fprintf(stderr, "ddprun agent: malformed ACK from the launcher\n");
                goto protocol_error;
            }
        } else if (type == DDP__AG_STACKS) {
            gather_stacks(body, len);
        } else if (type == DDP__AG_SIGNAL) {
            struct ddp_rd rd;
            uint8_t sig;
            ddp_rd_init(&rd, body, len);
            if (ddp_rd_u8(&rd, &sig) == 0 && (sig == SIGUSR1 || sig == SIGUSR2 || sig == SIGHUP))
                forward_signal(sig);
        } else {
            int t = ddp__fanout_frame(type, body, len); /* the SSH tree's, cli/agent/fanout.h */
            if (t == 0)
                fprintf(stderr, "ddprun agent: unexpected frame %u from the launcher\n", type);
            if (t <= 0)
                goto protocol_error;
        }
    }
    ddp_buf_compact(&A.in);
    if (r >= 0)
        return;
    fprintf(stderr, "ddprun agent: bad frame from the launcher\n");
protocol_error: /* what a launcher never sends: this node stops, status 3 */
    A.rc = DDP_EXIT_LAUNCH;
    start_exit("protocol error");
}

static void reap(void)
{
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        if (p == ddp__guard_pid(A.guard))
            ddp__guard_reaped(A.guard);
        if (ddp__fanout_reaped(p, st) || ddp__warm_reaped(p))
            continue;
        for (int i = 0; i < A.nw; i++) {
            struct worker *w = &A.w[i];
            if (w->pid != p || w->exited)
                continue;
            w->exited = true;
            w->t1 = ddp_now_ms();
            w->code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
            maybe_report(w);
        }
    }
}

static void on_signal(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    (void)arg;
    struct signalfd_siginfo si;
    while (ddp_read_eintr(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGCHLD)
            reap();
        else if ((pid_t)si.ssi_pid == getpid())
            continue; /* our own stop signal to the process group */
        else if (si.ssi_signo == SIGUSR1 || si.ssi_signo == SIGUSR2)
            forward_signal((int)si.ssi_signo); /* to this node's job (Slurm's --signal) */
        else if (!A.exiting)
            start_exit("signal");
    }
}

static void on_reap_tick(struct ddp_loop *loop, struct ddp_timer *t)
{
    /* A safety net for a missed SIGCHLD coalescing: reap every 200 ms. */
    reap();
    ddp_timer_start(loop, t, 200);
}

int ddp__cmd_agent_join(const char *hostport, const char *token_file)
{
    join_at = hostport;
    join_token = token_file;
    return ddp__cmd_agent();
}

int ddp__cmd_agent(void)
{
    sigset_t set;
    ddp__block_job_signals(&set, &A.oldmask);
    /* Our own process group, so the launcher (or we) can signal the whole node's job. */
    setpgid(0, 0);
    /* Orphans of the workers come back to us, to be killed at the end. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (sched_getaffinity(0, sizeof(A.allowed), &A.allowed) != 0)
        CPU_ZERO(&A.allowed); /* bind_to then leaves the ranks unbound */
    A.sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    ddp__path_add_self(); /* the ranks find programs installed or built beside ddprun */
    A.pyshim = ddp__pys_shim_new("_ddprun_warm.py", ddp__warm_py, ddp__warm_py_len);
    ddp_buf_init(&A.in);
    ddp_buf_init(&A.last);
    if (ddp_loop_new(&A.loop) < 0 || A.sfd < 0)
        return DDP_EXIT_LAUNCH;
    if (!join_at) /* (a terminal's flags belong to the shell too) */
        fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
    ddp_timer_init(&A.grace, on_grace);
    ddp_timer_init(&A.term, on_term);
    ddp_timer_init(&A.reap, on_reap_tick);
    ddp_timer_init(&A.fin, on_fin);
    ddp_timer_init(&A.report, on_report);
    ddp_timer_start(A.loop, &A.reap, 200);
    ddp__warm_init(A.loop, warm_say);
    struct ddp__link_cb lcb = {
        .readable = on_frames, .snapshot = snapshot, .gone = on_gone, .linked = linked};
    if ((join_at ? ddp__link_init_join(A.loop, &lcb, DDP_VERSION, join_at, join_token)
                 : ddp__link_init(A.loop, &lcb, DDP_VERSION)) < 0) {
        ddp__link_release();
        ddp_buf_release(&A.in);
        ddp_buf_release(&A.last);
        ddp_loop_free(A.loop);
        close(A.sfd);
        return DDP_EXIT_LAUNCH;
    }
    A.asker = (struct ddp__dn_asker){.loop = A.loop, .mask = &A.oldmask, .send = send_stacks};
    ddp__fanout_init(A.loop, send_tree, &A.oldmask);
    ddp_loop_add(A.loop, A.sfd, DDP_LOOP_READ, on_signal, NULL);
    A.rc = 0;
    ddp_loop_run(A.loop);
    int rc = A.rc;
    ddp__cr_close();
    ddp__proxy_stop();
    ddp__warm_drop_all();
    ddp__fanout_release();
    if (A.nw > 0) /* left without a clean round end (launch error) */
        ddp__sweep_children(spared);
    MEMBERSHIP->leave(A.lease, false);
    ddp__guard_free(A.guard); /* after the heartbeat, which writes to its page */
    ddp__dn_asker_release(&A.asker);
    if (A.pyshim >= 0)
        close(A.pyshim);
    free_workers();
    ddp__agent_start_release(&A.st);
    ddp__agent_join_release(&A.join);
    ddp_buf_release(&A.in);
    ddp_buf_release(&A.last);
    ddp__link_release();
    ddp_loop_free(A.loop);
    close(A.sfd);
    return rc;
}
