/* The node agent's side of diagnosis (cli/diag/node.h). */
#include "cli/diag/node.h"
#include "cli/proto/agent_proto.h"
#include "cli/diag/proc_stat.h"
#include "cli/diag/pystacks.h"
#include "cli/diag/diag.h"
#include "common/err.h"
#include "common/list.h"
#include "common/util.h"
#include "common/loop.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/banned.h"

#define STACK_MAX (64u << 10) /* bytes of one process's stacks */

int ddp__dn_page_new(struct ddp__dn_page *pg)
{
    pg->fd = memfd_create("ddprun-progress", MFD_CLOEXEC);
    pg->p = NULL;
    pg->seen_state = '\0';
    pg->first_done_ns = 0;
    pg->steps = pg->steps_seq = 0;
    if (pg->fd < 0)
        return DDP_ESYS;
    if (ftruncate(pg->fd, sizeof(struct ddp_progress_page)) != 0) {
        close(pg->fd);
        pg->fd = -1;
        return DDP_ESYS;
    }
    void *m =
        mmap(NULL, sizeof(struct ddp_progress_page), PROT_READ | PROT_WRITE, MAP_SHARED, pg->fd, 0);
    if (m == MAP_FAILED) {
        close(pg->fd);
        pg->fd = -1;
        return DDP_ESYS;
    }
    pg->p = m;
    return 0;
}

void ddp__dn_page_release(struct ddp__dn_page *pg)
{
    if (pg->p)
        munmap(pg->p, sizeof(struct ddp_progress_page));
    if (pg->fd >= 0)
        close(pg->fd);
    pg->p = NULL;
    pg->fd = -1;
}

/* State, CPU time and kernel wait of a rank, from /proc. While the agent's stack collection has
 * it (`ddprun stacks`, the hang report: its Python stacks' signal, its tool's ptrace stop), the
 * state and wait are the last seen before: what the rank was doing, not that ddprun was reading
 * its stack. */
static void proc_state(pid_t pid, bool inspected, struct ddp__dn_page *pg,
                       struct ddp__rank_progress *rp)
{
    struct ddp__proc_stat ps;
    ddp__proc_stat_read(pid, &ps);
    rp->cpu_s = ps.cpu_s;
    if (pg->seen_state &&
        (inspected || ((ps.state == 't' || ps.state == 'T') && ddp__proc_traced_by_child(pid)))) {
        rp->state = pg->seen_state;
        snprintf(rp->wchan, sizeof(rp->wchan), "%s", pg->seen_wchan);
        return;
    }
    rp->state = ps.state;
    snprintf(rp->wchan, sizeof(rp->wchan), "%s", ps.wchan);
    pg->seen_state = ps.state;
    snprintf(pg->seen_wchan, sizeof(pg->seen_wchan), "%s", ps.wchan);
}

void ddp__dn_report_rank(struct ddp_buf *b, int rank, pid_t pid, bool exited, bool inspected,
                         struct ddp__dn_page *pg)
{
    struct ddp__rank_progress rp = {.rank = rank, .pid = (int)pid, .state = 'X'};
    const struct ddp_progress_page *p = pg->p;
    if (!exited)
        proc_state(pid, inspected, pg, &rp);
    int64_t now = ddp_now_ns();
    if (p && p->magic == DDP_PROGRESS_MAGIC && p->version == DDP_PROGRESS_VERSION) {
        rp.rec = true;
        rp.completed = atomic_load_explicit(&p->completed, memory_order_acquire);
        rp.started = atomic_load_explicit(&p->started, memory_order_acquire);
        rp.entered = atomic_load_explicit(&p->entered, memory_order_acquire);
        int64_t ch = atomic_load_explicit(&p->changed_ns, memory_order_relaxed);
        rp.idle_ms = ch && now > ch ? (now - ch) / 1000000 : 0;
        struct ddp_progress_ent e;
        /* The startup timeline: when the group formed, when its first collective finished
         * (entry 1's end; if the ring has already dropped it, no later than now). */
        int64_t formed = atomic_load_explicit(&p->attached_ns, memory_order_relaxed);
        rp.formed_ago_ms = formed ? (now > formed ? (now - formed) / 1000000 : 0) : -1;
        if (!pg->first_done_ns && rp.completed >= 1) {
            int64_t end = ddp_progress_read(p, 1, &e) ? atomic_load(&e.t_end) : 0;
            pg->first_done_ns = end > 0 && end <= now ? end : now;
        }
        rp.first_ago_ms = pg->first_done_ns ? (now - pg->first_done_ns) / 1000000 : -1;
        if (rp.entered > rp.completed && ddp_progress_read(p, rp.completed + 1, &e)) {
            int64_t enq = atomic_load(&e.t_enq), st = atomic_load(&e.t_start);
            rp.in_coll = true;
            rp.op = e.op;
            rp.dtype = e.dtype;
            rp.bucket = e.bucket;
            rp.bytes = e.bytes;
            rp.cur_ms = enq && now > enq ? (now - enq) / 1000000 : 0;
            rp.cur_run_ms = st && now > st ? (now - st) / 1000000 : -1;
        }
        /* DDP steps among the entries finished since the last report (those the ring dropped
         * meanwhile, over DDP_PROGRESS_RING in one heartbeat, are not seen) */
        uint64_t from = pg->steps_seq + 1;
        if (rp.completed >= DDP_PROGRESS_RING && from < rp.completed - DDP_PROGRESS_RING + 1)
            from = rp.completed - DDP_PROGRESS_RING + 1;
        for (uint64_t s = from; s <= rp.completed; s++)
            if (ddp_progress_read(p, s, &e) && e.op == DDP_PROG_DDP_STEP)
                pg->steps++;
        pg->steps_seq = rp.completed > pg->steps_seq ? rp.completed : pg->steps_seq;
        rp.steps = pg->steps;
        uint64_t first = rp.completed > DDP__DIAG_WAITS ? rp.completed - DDP__DIAG_WAITS + 1 : 1;
        for (uint64_t s = first; s <= rp.completed && s; s++)
            if (ddp_progress_read(p, s, &e)) {
                int64_t st = atomic_load(&e.t_start), end = atomic_load(&e.t_end);
                if (!st || end < st || atomic_load(&e.result) ||
                    e.op == DDP_PROG_DDP_FORWARD) /* a forward waits for no one */
                    continue;
                int64_t us = (end - st) / 1000;
                rp.wseq[rp.nwaits] = s;
                rp.wus[rp.nwaits++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
            }
    }
    ddp__diag_line_put(b, &rp);
}

/* ------------------------------------------------------------------ */
/* Stacks                                                             */
/* ------------------------------------------------------------------ */

struct stack_job {
    struct ddp__dn_stacks *s;
    pid_t pid, tool;
    int fd;
    struct ddp_buf out;
    bool done;
    /* Python's tracebacks (cli/diag/pystacks.h): asked for, where they start in the dump file, its
     * size at the last look */
    bool py;
    int pydump;
    size_t pyoff, pylast;
    pid_t pytarget; /* the process signalled, and how many of its threads blocked the signal */
    int pyblocked;  /* before (cli/diag/pystacks.h: ddp__pys_blocked) */
    struct ddp_buf pytext;
};

struct ddp__dn_stacks {
    struct ddp_loop *loop;
    struct stack_job *job;
    int n, left;
    struct ddp_timer timer, pytimer;
    int64_t py_until; /* the Python tracebacks are waited for until then */
    int py_still;     /* looks in a row at which no dump file grew */
    const sigset_t *mask;
    void (*done)(void *arg, char *const *texts, int n);
    void *arg;
};

/* The tracebacks faulthandler wrote, with the thread that took the signal (which varies from
 * rank to rank) not told apart, so that ranks at the same lines group together. */
static void python_text(struct stack_job *j)
{
    struct ddp_buf raw;
    ddp_buf_init(&raw);
    ddp__pys_read(j->pydump, j->pyoff, STACK_MAX / 2, &raw);
    bool cut = ddp__pys_size(j->pydump) - j->pyoff > STACK_MAX / 2;
    static const char head[] = "Python threads (faulthandler):\n";
    ddp_buf_put(&j->pytext, head, sizeof(head) - 1);
    if (!raw.len) {
        static const char none[] = "(no answer within 1 s: the rank is stopped, or blocks the "
                                   "signal)\n";
        ddp_buf_put(&j->pytext, none, sizeof(none) - 1);
    }
    static const char cur[] = "Current thread ";
    for (size_t i = 0; i < raw.len;) {
        if ((i == 0 || raw.data[i - 1] == '\n') && raw.len - i >= sizeof(cur) - 1 &&
            memcmp(raw.data + i, cur, sizeof(cur) - 1) == 0) {
            ddp_buf_put(&j->pytext, "Thread ", 7);
            i += sizeof(cur) - 1;
            continue;
        }
        ddp_buf_put_u8(&j->pytext, raw.data[i++]);
    }
    if (cut)
        ddp_buf_put(&j->pytext, "\n(cut at 32 KiB)\n", 17);
    ddp_buf_put(&j->pytext, "native:\n", 8);
    ddp_buf_release(&raw);
}

static void finish(struct ddp__dn_stacks *s)
{
    char **texts = calloc((size_t)s->n, sizeof(char *));
    for (int i = 0; i < s->n && texts; i++) {
        struct stack_job *j = &s->job[i];
        if (!j->done)
            ddp_buf_put(&j->out, "\n(the stack tool did not finish in time)\n", 41);
        ddp_buf_put(&j->out, "", 1);
        if (j->pytext.len) { /* Python's first: the program's own lines */
            ddp_buf_put(&j->pytext, j->out.data, j->out.len);
            texts[i] = (char *)j->pytext.data;
        } else {
            texts[i] = (char *)j->out.data;
        }
    }
    ddp_timer_stop(s->loop, &s->timer);
    ddp_timer_stop(s->loop, &s->pytimer);
    if (texts)
        s->done(s->arg, texts, s->n);
    free(texts);
    ddp__dn_stacks_free(s);
}

static void job_done(struct stack_job *j)
{
    if (j->done)
        return;
    j->done = true;
    if (j->fd >= 0) {
        ddp_loop_del(j->s->loop, j->fd);
        close(j->fd);
        j->fd = -1;
    }
    if (--j->s->left == 0)
        finish(j->s);
}

static void on_tool(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    struct stack_job *j = arg;
    char buf[8192];
    ssize_t n = ddp_read_eintr(fd, buf, sizeof(buf));
    if (n > 0) {
        if (j->out.len + (size_t)n <= STACK_MAX)
            ddp_buf_put(&j->out, buf, (size_t)n);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    job_done(j);
}

static void on_timeout(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    struct ddp__dn_stacks *s = DDP_CONTAINER_OF(t, struct ddp__dn_stacks, timer);
    for (int i = 0; i < s->n; i++)
        if (!s->job[i].done && s->job[i].tool > 0)
            kill(s->job[i].tool, SIGKILL);
    finish(s);
}

/* In the child: eu-stack, else gdb, on pid; output on fd 1 and 2. */
static void exec_tool(pid_t pid, int fd, const sigset_t *mask)
{
    sigprocmask(SIG_SETMASK, mask, NULL);
    dup2(fd, 1);
    dup2(fd, 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0)
        dup2(devnull, 0);
    char p[32];
    snprintf(p, sizeof(p), "%d", (int)pid);
    execlp("eu-stack", "eu-stack", "-p", p, (char *)NULL);
    execlp("gdb", "gdb", "-batch", "-nx", "-p", p, "-ex", "thread apply all bt", (char *)NULL);
    dprintf(1, "(no stack: neither eu-stack (elfutils) nor gdb is installed on this node)\n");
    _exit(127);
}

/* The native stacks: one tool per process, all at once. */
static void start_tools(struct ddp__dn_stacks *s)
{
    for (int i = 0; i < s->n; i++) {
        struct stack_job *j = &s->job[i];
        int pp[2];
        const char *why = NULL;
        if (pipe2(pp, O_CLOEXEC) != 0) {
            why = "(no stack: out of descriptors)\n";
        } else if ((j->tool = fork()) == 0) {
            exec_tool(j->pid, pp[1], s->mask);
        } else {
            close(pp[1]);
            if (j->tool < 0) {
                close(pp[0]);
                why = "(no stack: cannot fork)\n";
            }
        }
        if (why) { /* finished at once; `left` reaching 0 is handled below */
            ddp_buf_put(&j->out, why, strlen(why));
            j->done = true;
            s->left--;
            continue;
        }
        j->fd = pp[0];
        fcntl(j->fd, F_SETFL, O_NONBLOCK);
        ddp_loop_add(s->loop, j->fd, DDP_LOOP_READ, on_tool, j);
    }
    if (s->left == 0)
        finish(s);
}

/* Every 20 ms while Python ranks write their tracebacks: once each has something, no dump file
 * grew for two looks in a row and no rank's handler still runs, or after 1 s, the tools start (a
 * tool attached meanwhile would catch faulthandler in the middle of its work: a rank
 * descheduled after its last write, on a loaded machine, looked done by its dump alone). */
static void on_py_poll(struct ddp_loop *loop, struct ddp_timer *t)
{
    struct ddp__dn_stacks *s = DDP_CONTAINER_OF(t, struct ddp__dn_stacks, pytimer);
    bool settled = true;
    for (int i = 0; i < s->n; i++) {
        struct stack_job *j = &s->job[i];
        if (!j->py)
            continue;
        size_t now = ddp__pys_size(j->pydump);
        if (now == j->pyoff || now != j->pylast) {
            settled = false;
        } else if (settled) {
            int b = ddp__pys_blocked(j->pytarget);
            settled = b >= 0 && b <= j->pyblocked;
        }
        j->pylast = now;
    }
    s->py_still = settled ? s->py_still + 1 : 0;
    if (s->py_still < 2 && ddp_now_ms() < s->py_until) {
        ddp_timer_start(loop, t, 20);
        return;
    }
    for (int i = 0; i < s->n; i++)
        if (s->job[i].py)
            python_text(&s->job[i]);
    start_tools(s);
}

int ddp__dn_stacks_start(struct ddp_loop *loop, const struct ddp__dn_proc *procs, int n,
                         int timeout_ms, const sigset_t *mask,
                         void (*done)(void *arg, char *const *texts, int n), void *arg,
                         struct ddp__dn_stacks **out)
{
    struct ddp__dn_stacks *s = calloc(1, sizeof(*s));
    if (!s || !(s->job = calloc((size_t)(n > 0 ? n : 1), sizeof(*s->job)))) {
        free(s);
        return DDP_ENOMEM;
    }
    s->loop = loop;
    s->n = s->left = n;
    s->mask = mask;
    s->done = done;
    s->arg = arg;
    ddp_timer_init(&s->timer, on_timeout);
    ddp_timer_init(&s->pytimer, on_py_poll);
    int py = 0;
    for (int i = 0; i < n; i++) {
        struct stack_job *j = &s->job[i];
        j->s = s;
        j->pid = procs[i].pid;
        j->fd = -1;
        /* its own descriptor: the rank's may close (its round ends) while this runs */
        j->pydump = procs[i].pydump >= 0 ? fcntl(procs[i].pydump, F_DUPFD_CLOEXEC, 0) : -1;
        ddp_buf_init(&j->out);
        ddp_buf_init(&j->pytext);
        /* Only to a process that handles it: to any other this signal is fatal. */
        pid_t target = j->pydump >= 0 ? ddp__pys_find(j->pid, j->pydump) : 0;
        if (target > 0) {
            j->pyoff = j->pylast = ddp__pys_size(j->pydump);
            j->pytarget = target;
            j->pyblocked = ddp__pys_blocked(target);
            j->py = kill(target, DDP__PYS_SIGNAL) == 0;
            py += j->py;
        }
    }
    *out = s;
    if (n == 0) {
        finish(s);
        return 0;
    }
    ddp_timer_start(loop, &s->timer, timeout_ms);
    if (py) {
        s->py_until = ddp_now_ms() + 1000;
        ddp_timer_start(loop, &s->pytimer, 20);
    } else {
        start_tools(s);
    }
    return 0;
}

void ddp__dn_stacks_free(struct ddp__dn_stacks *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++) {
        struct stack_job *j = &s->job[i];
        if (j->fd >= 0) {
            ddp_loop_del(s->loop, j->fd);
            close(j->fd);
        }
        if (!j->done && j->tool > 0)
            kill(j->tool, SIGKILL);
        ddp_buf_release(&j->out);
        ddp_buf_release(&j->pytext);
        if (j->pydump >= 0)
            close(j->pydump);
    }
    ddp_timer_stop(s->loop, &s->timer);
    ddp_timer_stop(s->loop, &s->pytimer);
    free(s->job);
    free(s);
}

/* ---- STACKS frames ---- */

static void send_reply(struct ddp__dn_asker *a, uint32_t req, const int *local,
                       const struct ddp__dn_proc *procs, char *const *texts, int n)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_STACKS_REPLY);
    ddp_buf_put_u32(&b, req);
    ddp_buf_put_u32(&b, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        /* a frame holds 1 MiB: each text is cut to its share */
        size_t len = strlen(texts[i]), cap = (DDP__AGENT_MAX_FRAME - 64) / (size_t)(n + 1);
        ddp_buf_put_u32(&b, (uint32_t)local[i]);
        ddp_buf_put_u32(&b, (uint32_t)procs[i].pid);
        ddp_buf_put_str(&b, texts[i], len < cap ? len : cap);
    }
    ddp__agent_end(&b, pos);
    a->send(&b);
    ddp_buf_release(&b);
}

static void on_stacks(void *arg, char *const *texts, int n)
{
    struct ddp__dn_asker *a = arg;
    a->stacks = NULL;
    a->touched_until_ms = ddp_now_ms() + 200;
    send_reply(a, a->req, a->local, a->procs, texts, n);
    free(a->local);
    a->local = NULL;
}

void ddp__dn_stacks_frame(struct ddp__dn_asker *a, const uint8_t *body, size_t len,
                          const struct ddp__dn_proc *running, int nw)
{
    struct ddp_rd rd;
    uint32_t req, n;
    ddp_rd_init(&rd, body, len);
    if (ddp_rd_u32(&rd, &req) < 0 || ddp_rd_u32(&rd, &n) < 0 || n > 65536)
        return;
    if (a->stacks) {
        char busy[] = "(no stack: another collection is under way on this node)";
        char *texts[] = {busy};
        int none = -1;
        struct ddp__dn_proc zero = {.pid = 0, .pydump = -1};
        send_reply(a, req, &none, &zero, texts, 1);
        return;
    }
    int *local = calloc((size_t)nw + 1, sizeof(int));
    struct ddp__dn_proc *procs = calloc((size_t)nw + 1, sizeof(*procs));
    int k = 0;
    for (uint32_t i = 0; i < (n ? n : (uint32_t)nw) && local && procs; i++) {
        uint32_t lr = i;
        if (n && ddp_rd_u32(&rd, &lr) < 0)
            break;
        if (lr < (uint32_t)nw && running[lr].pid > 0 && k < nw) {
            local[k] = (int)lr;
            procs[k++] = running[lr];
        }
    }
    if (!local || !procs) {
        free(local);
        free(procs);
        return;
    }
    free(a->procs); /* the last collection's */
    a->req = req;
    a->local = local;
    a->procs = procs;
    a->nprocs = k;
    a->touched_until_ms = INT64_MAX; /* until on_stacks */
    if (ddp__dn_stacks_start(a->loop, procs, k, 10000, a->mask, on_stacks, a, &a->stacks) < 0) {
        free(local);
        free(procs);
        a->local = NULL;
        a->procs = NULL;
        a->nprocs = 0;
        a->stacks = NULL;
    }
}

void ddp__dn_asker_release(struct ddp__dn_asker *a)
{
    ddp__dn_stacks_free(a->stacks);
    free(a->local);
    free(a->procs);
    a->stacks = NULL;
    a->local = NULL;
    a->procs = NULL;
    a->nprocs = 0;
}

bool ddp__dn_asker_touches(const struct ddp__dn_asker *a, pid_t pid)
{
    if (ddp_now_ms() >= a->touched_until_ms)
        return false;
    for (int i = 0; i < a->nprocs; i++)
        if (a->procs[i].pid == pid)
            return true;
    return false;
}
