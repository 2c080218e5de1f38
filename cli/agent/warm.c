/* Warm ranks: each rank slot's waiting interpreter, made and taken (cli/agent/warm.h). */
#include "cli/agent/warm.h"
#include "cli/agent/errfile.h"
#include "cli/diag/pystacks.h"
#include "common/log.h"
#include "common/loop.h"
#include "common/util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/banned.h"

#define WARM_REPLY_MS 5000 /* an interpreter's answer to "go" (it waits for nothing else) */

struct slot {
    pid_t pid; /* 0: none */
    bool ready;
    int ctl;      /* the agent's end of its control socket (in the loop), or -1 */
    int out, err; /* the read ends of the rank's stdout and stderr */
    struct ddp__dn_page page;
    int pydump, errfd;
    bool bound;
    cpu_set_t cpus;
    int sharers;
    char **snap; /* the environment it started with (sorted), before the round's variables */
    size_t nsnap;
    char **argv; /* what it was started as */
    char *workdir, *token;
};

static struct {
    struct ddp_loop *loop;
    void (*say)(int local_rank, const char *line);
    struct slot *s;
    int n;
    bool unable; /* an interpreter could not wait or serve (no sitecustomize, CUDA, a listed
                    import failed): none is made again */
} W;

void ddp__warm_init(struct ddp_loop *loop, void (*say)(int local_rank, const char *line))
{
    W.loop = loop;
    W.say = say;
}

/* python, python3, python3.11 ... */
static bool python_name(const char *p)
{
    const char *b = strrchr(p, '/');
    b = b ? b + 1 : p;
    if (strncmp(b, "python", 6) != 0)
        return false;
    for (b += 6; *b; b++)
        if (!isdigit((unsigned char)*b) && *b != '.')
            return false;
    return true;
}

bool ddp__warm_eligible(const struct ddp__agent_start *st)
{
    if (!st->warm || st->shell[0] || !st->argv || !st->argv[0] || !python_name(st->argv[0]) ||
        W.unable)
        return false;
    /* interpreter options that keep site and PYTHONPATH (not -S, -E, -I) and read no program
     * from the command line or stdin (not -c, -, -i) */
    static const char *const plain[] = {"-u", "-B", "-O", "-OO", "-b", "-bb", "-q", "-s", "-d"};
    for (char **a = st->argv + 1; *a; a++) {
        if ((*a)[0] != '-')
            return true; /* the script */
        if (strcmp(*a, "-m") == 0)
            return a[1] != NULL;
        bool ok = false;
        for (size_t k = 0; k < sizeof(plain) / sizeof(plain[0]) && !ok; k++)
            ok = strcmp(*a, plain[k]) == 0;
        if (!ok && (strcmp(*a, "-X") == 0 || strcmp(*a, "-W") == 0) && a[1])
            ok = (a++, true);
        else if (!ok && (strncmp(*a, "-X", 2) == 0 || strncmp(*a, "-W", 2) == 0))
            ok = true;
        if (!ok)
            return false;
    }
    return false;
}

static struct slot *slot_of(int local_rank, bool grow)
{
    if (local_rank < 0 || local_rank > 4096)
        return NULL;
    if (local_rank >= W.n) {
        if (!grow)
            return NULL;
        struct slot *s = realloc(W.s, (size_t)(local_rank + 1) * sizeof(*s));
        if (!s)
            return NULL;
        for (int i = W.n; i <= local_rank; i++)
            s[i] = (struct slot){.ctl = -1, .out = -1, .err = -1, .pydump = -1, .errfd = -1};
        for (int i = W.n; i <= local_rank; i++)
            s[i].page.fd = -1;
        W.s = s;
        W.n = local_rank + 1;
    }
    return &W.s[local_rank];
}

static void free_list(char **v)
{
    for (char **p = v; p && *p; p++)
        free(*p);
    free(v);
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* Ends pid and reaps it, waiting 100 ms at most (else the agent's reaper will). */
static void end_pid(pid_t pid)
{
    kill(pid, SIGKILL);
    for (int k = 0; k < 50 && waitpid(pid, NULL, WNOHANG) == 0; k++)
        usleep(2000);
}

/* Forgets the slot's interpreter, whose resources were not handed over (kill: end it too). */
static void clear(struct slot *s, bool kill_it)
{
    if (s->pid > 0 && kill_it)
        end_pid(s->pid);
    if (s->ctl >= 0)
        ddp_loop_del(W.loop, s->ctl);
    close_fd(&s->ctl);
    close_fd(&s->out);
    close_fd(&s->err);
    ddp__dn_page_release(&s->page);
    s->page.fd = -1;
    close_fd(&s->pydump);
    close_fd(&s->errfd);
    free_list(s->snap);
    free_list(s->argv);
    free(s->workdir);
    if (s->token)
        explicit_bzero(s->token, strlen(s->token));
    free(s->token);
    *s = (struct slot){.ctl = -1, .out = -1, .err = -1, .pydump = -1, .errfd = -1};
    s->page.fd = -1;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The snapshot a warm child wrote: NUL-terminated "K=V" strings up to EOF, sorted. */
static void read_snapshot(struct slot *s, int fd)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    char chunk[8192];
    ssize_t got;
    while ((got = ddp_read_eintr(fd, chunk, sizeof(chunk))) > 0)
        if (ddp_buf_put(&b, chunk, (size_t)got) < 0)
            break;
    size_t n = 0;
    for (size_t i = 0; i < b.len; i++)
        n += b.data[i] == '\0';
    s->snap = calloc(n + 1, sizeof(char *));
    for (size_t i = 0, at = 0; s->snap && i < b.len; i++)
        if (b.data[i] == '\0') {
            s->snap[s->nsnap++] = strdup((const char *)b.data + at);
            at = i + 1;
        }
    if (s->snap)
        qsort(s->snap, s->nsnap, sizeof(char *), cmp_str);
    ddp_buf_release(&b);
}

static void on_ctl(struct ddp_loop *loop, int fd, unsigned mask, void *arg);

static char *join_imports(char *const *m)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    for (; m && *m; m++) {
        if (b.len)
            ddp_buf_put_u8(&b, ',');
        ddp_buf_put(&b, *m, strlen(*m));
    }
    ddp_buf_put_u8(&b, '\0');
    return (char *)b.data; /* the buffer's bytes are the string (NULL when out of memory) */
}

static char **copy_list(char *const *v)
{
    size_t n = 0;
    while (v && v[n])
        n++;
    char **c = calloc(n + 1, sizeof(char *));
    for (size_t i = 0; c && i < n; i++)
        if (!(c[i] = strdup(v[i]))) {
            free_list(c);
            return NULL;
        }
    return c;
}

void ddp__warm_make(const struct ddp__rank_exec *x)
{
    struct slot *s = slot_of(x->local_rank, true);
    if (!s || s->pid || W.unable || x->pyshim < 0)
        return;
    int op[2] = {-1, -1}, ep[2] = {-1, -1}, tp[2] = {-1, -1}, xp[2] = {-1, -1}, sp[2] = {-1, -1},
        cs[2] = {-1, -1};
    char *imports = join_imports(x->st->warm_imports);
    if (!imports || pipe2(op, O_CLOEXEC) || pipe2(ep, O_CLOEXEC) || pipe2(tp, O_CLOEXEC) ||
        pipe2(xp, O_CLOEXEC) || pipe2(sp, O_CLOEXEC) ||
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, cs) || ddp__dn_page_new(&s->page) < 0)
        goto fail;
    s->pydump = ddp__pys_dump_new();
    s->errfd = ddp__ef_new();
    pid_t agent = getpid(), pid = fork();
    if (pid < 0)
        goto fail;
    if (pid == 0) {
        struct ddp__rank_warm w = {.ctl = cs[1],
                                   .out = op[1],
                                   .err = ep[1],
                                   .snap = sp[1],
                                   .imports = imports,
                                   .listed = x->st->warm_listed};
        struct ddp__rank_exec y = *x;
        y.warm = &w;
        y.pydump = s->pydump;
        y.errfd = s->errfd;
        ddp__agent_exec_rank(&y, -1, -1, tp[0], xp[1], s->page.fd, agent);
    }
    close_fd(&op[1]);
    close_fd(&ep[1]);
    close_fd(&tp[0]);
    close_fd(&xp[1]);
    close_fd(&sp[1]);
    close_fd(&cs[1]);
    s->pid = pid;
    ddp_write_all(tp[1], x->st->token, strlen(x->st->token));
    close_fd(&tp[1]);
    read_snapshot(s, sp[0]);
    close_fd(&sp[0]);
    int msg[2];
    ssize_t got = ddp_read_eintr(xp[0], msg, sizeof(msg));
    close_fd(&xp[0]);
    s->ctl = cs[0];
    s->out = op[0];
    s->err = ep[0];
    fcntl(s->out, F_SETFL, O_NONBLOCK);
    fcntl(s->err, F_SETFL, O_NONBLOCK);
    fcntl(s->ctl, F_SETFL, O_NONBLOCK);
    s->bound = x->bound;
    s->cpus = *x->cpus;
    s->sharers = x->sharers;
    s->argv = copy_list(x->st->argv);
    s->workdir = strdup(x->st->workdir);
    s->token = strdup(x->st->token);
    free(imports);
    if (got == (ssize_t)sizeof(msg) || !s->snap || !s->argv || !s->workdir || !s->token ||
        ddp_loop_add(W.loop, s->ctl, DDP_LOOP_READ, on_ctl, (void *)(intptr_t)x->local_rank) < 0) {
        if (got == (ssize_t)sizeof(msg)) {
            /* no sitecustomize (DDPRUN_PYTHON_STACKS=0), or Python could not be run */
            W.unable = true;
            DDP_INFO(SUP, "agent: no warm interpreters for this job (%s)",
                     msg[0] == 3 ? "DDPRUN_PYTHON_STACKS=0" : strerror(msg[1]));
        }
        clear(s, true);
        return;
    }
    DDP_DEBUG(SUP, "agent: warm interpreter %d for local rank %d", (int)pid, x->local_rank);
    return;
fail:
    free(imports);
    int fds[] = {op[0], op[1], ep[0], ep[1], tp[0], tp[1],
                 xp[0], xp[1], sp[0], sp[1], cs[0], cs[1]};
    for (size_t k = 0; k < sizeof(fds) / sizeof(fds[0]); k++)
        close_fd(&fds[k]);
    clear(s, false);
}

/* A line of what the interpreter found once its imports were done: whether it may serve. The
 * first that may not is said (or logged); after it the job's ranks all start cold. */
static bool fit(struct slot *s, char *line)
{
    int lr = (int)(s - W.s);
    char msg[1400];
    if (strncmp(line, "failed ", 7) == 0) {
        char *name = line + 7, *colon = strstr(name, ": ");
        if (colon)
            *colon = '\0';
        snprintf(msg, sizeof(msg),
                 "ddprun agent: warm.imports: cannot import %s (%s); ranks start cold", name,
                 colon ? colon + 2 : "?");
        if (!W.unable)
            W.say(lr, msg);
        return false;
    }
    if (strcmp(line, "cuda") == 0) {
        if (!W.unable)
            W.say(lr, "ddprun agent: warm.imports initialised CUDA in the warm interpreter (or "
                      "loaded libcuda, torch not a CUDA build); ranks start cold: leave modules "
                      "that touch the GPU at import out of warm.imports");
        return false;
    }
    if (strcmp(line, "idle") == 0) {
        DDP_INFO(SUP, "agent: a warm interpreter's threads could not leave idle priority");
        return false;
    }
    return true;
}

static void on_ctl(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    struct slot *s = slot_of((int)(intptr_t)arg, false); /* (the slots may move) */
    if (!s)
        return;
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0 || s->ready) { /* it ended, or says what it must not */
        clear(s, true);
        return;
    }
    buf[n] = '\0';
    if (strncmp(buf, "ready\n", 6) != 0) {
        clear(s, true);
        return;
    }
    for (char *line = buf + 6, *nl; *line; line = nl + 1) {
        if (!(nl = strchr(line, '\n')))
            break;
        *nl = '\0';
        if (!fit(s, line)) {
            W.unable = true; /* the next would find the same: no more for this job */
            clear(s, true);
            return;
        }
    }
    s->ready = true;
}

/* In the helper: whether the environment made now equals the snapshot but for the round's
 * variables and the descriptors' numbers (the slot's own either way); else the first that
 * differs, in why. */
static bool skipped(const char *kv)
{
    static const char *const fds[] = {"DDPRUN_TOKEN_FD", "DDPRUN_PROGRESS_FD", NULL};
    size_t kl = strcspn(kv, "=");
    for (int k = 0; ddp__rank_round_vars[k]; k++)
        if (strlen(ddp__rank_round_vars[k]) == kl && strncmp(kv, ddp__rank_round_vars[k], kl) == 0)
            return true;
    for (int k = 0; fds[k]; k++)
        if (strlen(fds[k]) == kl && strncmp(kv, fds[k], kl) == 0)
            return true;
    return false;
}

static bool same_env(const struct slot *s, char *why, size_t n)
{
    extern char **environ;
    size_t ne = 0;
    while (environ[ne])
        ne++;
    char **e = calloc(ne + 1, sizeof(char *));
    if (!e)
        return false;
    memcpy(e, environ, ne * sizeof(char *));
    qsort(e, ne, sizeof(char *), cmp_str);
    size_t i = 0, j = 0;
    bool same = true;
    while (same && (i < ne || j < s->nsnap)) {
        if (i < ne && skipped(e[i])) {
            i++;
        } else if (j < s->nsnap && skipped(s->snap[j])) {
            j++;
        } else if (i < ne && j < s->nsnap && strcmp(e[i], s->snap[j]) == 0) {
            i++;
            j++;
        } else {
            const char *d =
                i < ne && (j >= s->nsnap || strcmp(e[i], s->snap[j]) < 0) ? e[i] : s->snap[j];
            snprintf(why, n, "%.*s", (int)strcspn(d, "="), d);
            same = false;
        }
    }
    free(e);
    return same;
}

/* The helper's part: the rank's environment as a cold start makes it, compared; then "go", the
 * workdir and the round's variables to the interpreter. */
static void helper(const struct ddp__rank_exec *x, const struct slot *s, int rfd)
{
    char ef[64] = "";
    if (s->errfd >= 0)
        ddp__ef_path(s->errfd, getppid(), ef, sizeof(ef));
    ddp__agent_rank_env(x->st, x->join, x->local_rank, x->iface, x->node_addr, x->store_addr, -1,
                        -1, ef);
    char why[128];
    if (!same_env(s, why, sizeof(why))) {
        ddp_write_all(rfd, why, strlen(why));
        _exit(3);
    }
    struct ddp_buf b;
    ddp_buf_init(&b);
    ddp_buf_put(&b, "go\0@", 4);
    ddp_buf_put(&b, x->st->workdir, strlen(x->st->workdir) + 1);
    for (int k = 0; ddp__rank_round_vars[k]; k++) {
        const char *k1 = ddp__rank_round_vars[k], *v = getenv(k1);
        if (!v)
            ddp_buf_put_u8(&b, '-');
        ddp_buf_put(&b, k1, strlen(k1));
        if (v) {
            ddp_buf_put_u8(&b, '=');
            ddp_buf_put(&b, v, strlen(v));
        }
        ddp_buf_put_u8(&b, '\0');
    }
    if (b.len > 200000 || send(s->ctl, b.data, b.len - 1, MSG_NOSIGNAL) != (ssize_t)(b.len - 1))
        _exit(4);
    _exit(0);
}

static bool same_list(char *const *a, char *const *b)
{
    for (; *a && *b; a++, b++)
        if (strcmp(*a, *b) != 0)
            return false;
    return !*a && !*b;
}

int ddp__warm_take(const struct ddp__rank_exec *x, struct ddp__warm_rank *r)
{
    struct slot *s = slot_of(x->local_rank, false);
    if (!s || !s->pid)
        return 0;
    if (!s->ready || !ddp__warm_eligible(x->st) || !same_list(s->argv, x->st->argv) ||
        strcmp(s->workdir, x->st->workdir) != 0 || strcmp(s->token, x->st->token) != 0 ||
        s->bound != x->bound ||
        (x->bound && (!CPU_EQUAL(&s->cpus, x->cpus) || s->sharers != x->sharers))) {
        DDP_INFO(SUP, "agent: local rank %d starts cold (%s)", x->local_rank,
                 !s->ready ? "its warm interpreter is not ready" : "the command or CPUs changed");
        clear(s, true);
        return 0;
    }
    int rp[2];
    if (pipe2(rp, O_CLOEXEC) < 0)
        return 0;
    pid_t h = fork();
    if (h == 0) {
        close(rp[0]);
        helper(x, s, rp[1]);
    }
    close(rp[1]);
    int st = 0;
    while (h > 0 && waitpid(h, &st, 0) < 0 && errno == EINTR)
        ;
    char why[128] = "";
    ssize_t got = ddp_read_eintr(rp[0], why, sizeof(why) - 1);
    close(rp[0]);
    if (h < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        why[got > 0 ? got : 0] = '\0';
        DDP_INFO(SUP, "agent: local rank %d starts cold (%s%s)", x->local_rank,
                 why[0] ? why : "its warm interpreter could not be told",
                 why[0] ? " is not what it was when its warm interpreter started" : "");
        clear(s, true);
        return 0;
    }
    /* its answer: "ok" once it runs the program, or why it cannot ("err 1 errno": the workdir) */
    struct pollfd p = {.fd = s->ctl, .events = POLLIN};
    char ans[64] = "";
    ssize_t n = -1;
    if (poll(&p, 1, WARM_REPLY_MS) == 1)
        n = recv(s->ctl, ans, sizeof(ans) - 1, 0);
    if (n != 2 || memcmp(ans, "ok", 2) != 0) {
        DDP_INFO(SUP, "agent: local rank %d starts cold (its warm interpreter %s)", x->local_rank,
                 n > 4 && strncmp(ans, "err 1", 5) == 0 ? "cannot enter the workdir"
                                                        : "did not answer");
        clear(s, true);
        return 0;
    }
    *r = (struct ddp__warm_rank){.pid = s->pid,
                                 .out = s->out,
                                 .err = s->err,
                                 .page = s->page,
                                 .pydump = s->pydump,
                                 .errfd = s->errfd};
    s->pid = 0;
    s->out = s->err = s->pydump = s->errfd = -1;
    s->page.fd = -1;
    s->page.p = NULL;
    clear(s, false);
    return 1;
}

bool ddp__warm_owns(pid_t pid)
{
    for (int i = 0; i < W.n; i++)
        if (W.s[i].pid == pid && pid > 0)
            return true;
    return false;
}

bool ddp__warm_reaped(pid_t pid)
{
    for (int i = 0; i < W.n; i++)
        if (W.s[i].pid == pid && pid > 0) {
            W.s[i].pid = 0;
            clear(&W.s[i], false);
            return true;
        }
    return false;
}

void ddp__warm_drop_all(void)
{
    for (int i = 0; i < W.n; i++)
        clear(&W.s[i], true);
    free(W.s);
    W.s = NULL;
    W.n = 0;
}
