/*
 * The launcher: hosts the job's store, starts one node agent per node, and
 * supervises the job through the agents' frames. The first failed rank stops
 * every rank (SIGTERM, SIGKILL after stop_grace); SIGINT/SIGTERM stop the job
 * the same way and a second SIGINT kills at once. Output is tagged on the
 * console, one write per line, and kept per rank under logs.dir/<job id>/.
 */
#include "cli/agent_proto.h"
#include "cli/cli.h"
#include "cli/job.h"
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

#define TAIL_LINES 10

struct rank_info {
    int node, local;
    bool started, exited, exec_failed;
    int code;
    int64_t runtime_ms;
    int logfd;
    char logpath[PATH_MAX + 32];
    char *tail[TAIL_LINES];
    int ntail;
};

struct node_agent {
    pid_t pid;
    int in_fd, out_fd;
    struct ddp_buf rx;
    bool done, eof, reaped;
    int wstatus;
    int rank_offset;
};

struct launcher {
    const struct ddp_job *job;
    char job_id[160];
    char logdir[PATH_MAX];
    struct ddp_loop *loop;
    int sfd;
    sigset_t oldmask;
    struct node_agent *ag;
    struct rank_info *rk;
    int ranks_up, ranks_done;
    int first_fail;      /* rank, or -1 */
    char *agent_fail;    /* message when an agent died on its own */
    char self[PATH_MAX]; /* this ddprun's path: the default path on remote nodes */
    bool stopping, interrupted, launch_error;
    int sigints;
    bool tty, status_shown;
    int64_t t0;
    const char *phase;
    struct ddp_timer tick, force;
};

static struct launcher L;

/* ---- console ---- */

static void clear_status(void)
{
    if (L.status_shown) {
        ddp_write_all(2, "\r\033[K", 4);
        L.status_shown = false;
    }
}

static void draw_status(void)
{
    if (!L.tty)
        return;
    char buf[256];
    int64_t s = (ddp_now_ms() - L.t0) / 1000;
    int n = snprintf(buf, sizeof(buf),
                     "\r\033[K[ddprun] %s | ranks up %d/%d | restarts 0 | %02lld:%02lld:%02lld",
                     L.phase, L.ranks_up - L.ranks_done, L.job->world_size, (long long)(s / 3600),
                     (long long)(s / 60 % 60), (long long)(s % 60));
    ddp_write_all(2, buf, (size_t)n);
    L.status_shown = true;
}

/* One message from ddprun itself: one write, never mixed into the status line. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(buf) - 2)
        n = (int)sizeof(buf) - 2;
    buf[n++] = '\n';
    clear_status();
    ddp_write_all(2, buf, (size_t)n);
}

static void set_phase(const char *phase)
{
    L.phase = phase;
    if (L.tty)
        draw_status();
    else
        say("ddprun: %s", phase);
}

static void on_tick(struct ddp_loop *loop, struct ddp_timer *t)
{
    draw_status();
    ddp_timer_start(loop, t, 250);
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

static void rank_output(int rank, int stream, const uint8_t *line, size_t n)
{
    struct rank_info *r = &L.rk[rank];
    const char *host = L.job->nodes[r->node].host;
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (L.job->tag_output) {
        char tag[300];
        int tl = snprintf(tag, sizeof(tag), "[%s:%d] ", host, rank);
        ddp_buf_put(&b, tag, (size_t)tl);
    }
    ddp_buf_put(&b, line, n);
    ddp_buf_put_u8(&b, '\n');
    /* One write per line: lines from different ranks never mix within a line. */
    clear_status();
    ddp_write_all(stream == 2 ? 2 : 1, b.data, b.len);
    if (r->logfd >= 0) {
        ddp_write_all(r->logfd, line, n);
        ddp_write_all(r->logfd, "\n", 1);
    }
    keep_tail(r, line, n);
    ddp_buf_release(&b);
}

static void send_stop(struct node_agent *a, uint64_t grace_ms)
{
    if (a->in_fd < 0)
        return;
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_STOP);
    ddp_buf_put_u64(&b, grace_ms);
    ddp__agent_end(&b, pos);
    ddp_write_all(a->in_fd, b.data, b.len);
    ddp_buf_release(&b);
}

static void stop_all(uint64_t grace_ms)
{
    if (!L.stopping)
        set_phase("stopping");
    L.stopping = true;
    for (size_t i = 0; i < L.job->nnodes; i++)
        send_stop(&L.ag[i], grace_ms);
}

static void rank_exited(int rank, int code, int64_t runtime_ms, bool exec_failed)
{
    struct rank_info *r = &L.rk[rank];
    r->exited = true;
    r->code = code;
    r->runtime_ms = runtime_ms;
    r->exec_failed = exec_failed;
    L.ranks_done++;
    if (code != 0 && !L.stopping && L.first_fail < 0) {
        L.first_fail = rank;
        if (exec_failed)
            L.launch_error = true;
        if (code < 0)
            say("ddprun: rank %d (%s) was killed by signal %d (%s); stopping the job", rank,
                L.job->nodes[r->node].host, -code, strsignal(-code));
        else
            say("ddprun: rank %d (%s) exited with status %d; stopping the job", rank,
                L.job->nodes[r->node].host, code);
        stop_all((uint64_t)L.job->stop_grace_ms);
    }
}

/* ---- agents ---- */

static void agent_frame(struct node_agent *a, uint8_t type, const uint8_t *body, size_t len)
{
    struct ddp_rd rd;
    uint32_t lr, v32;
    uint64_t v64;
    uint8_t u8;
    ddp_rd_init(&rd, body, len);
    int nlocal = L.job->nodes[a - L.ag].slots;
    if (type == DDP__AG_DONE) {
        a->done = true;
        return;
    }
    if (ddp_rd_u32(&rd, &lr) < 0 || (int)lr >= nlocal)
        return;
    int rank = a->rank_offset + (int)lr;
    switch (type) {
    case DDP__AG_STARTED:
        L.rk[rank].started = true;
        if (++L.ranks_up == L.job->world_size && !L.stopping)
            set_phase("running");
        break;
    case DDP__AG_OUTPUT: {
        const uint8_t *p;
        uint32_t n;
        if (ddp_rd_u8(&rd, &u8) == 0 && ddp_rd_str(&rd, DDP__AGENT_MAX_FRAME, &p, &n) == 0)
            rank_output(rank, u8, p, n);
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
        if (!L.ag[i].reaped || !L.ag[i].eof)
            return false;
    return true;
}

/* Reads what the agent wrote and handles its frames: 1 when something was read, 0 when
 * nothing was waiting, -1 at EOF. */
static int agent_read(struct node_agent *a)
{
    if (a->out_fd < 0 || ddp_buf_reserve(&a->rx, 65536) < 0)
        return -1;
    ssize_t n = ddp_read_eintr(a->out_fd, a->rx.data + a->rx.len, a->rx.cap - a->rx.len);
    if (n == -EAGAIN)
        return 0;
    if (n <= 0) {
        a->eof = true;
        ddp_loop_del(L.loop, a->out_fd);
        close(a->out_fd);
        a->out_fd = -1;
        if (all_agents_gone())
            ddp_loop_stop(L.loop);
        return -1;
    }
    a->rx.len += (size_t)n;
    uint8_t type;
    const uint8_t *body;
    size_t len;
    int r;
    while ((r = ddp__agent_next(&a->rx, &type, &body, &len)) > 0)
        agent_frame(a, type, body, len);
    ddp_buf_compact(&a->rx);
    if (r < 0)
        say("ddprun: error: bad frame from the agent on '%s'", L.job->nodes[a - L.ag].host);
    return 1;
}

static void on_agent_out(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)fd;
    (void)mask;
    agent_read(arg);
}

static void on_signal(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    (void)arg;
    struct signalfd_siginfo si;
    while (ddp_read_eintr(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGCHLD) {
            int st;
            pid_t p;
            while ((p = waitpid(-1, &st, WNOHANG)) > 0)
                for (size_t i = 0; i < L.job->nnodes; i++) {
                    struct node_agent *a = &L.ag[i];
                    if (a->pid != p)
                        continue;
                    a->reaped = true;
                    a->wstatus = st;
                    /* What it wrote before exiting may still sit in the pipe (the signal can
                     * be read first): take it before judging how it ended. */
                    while (agent_read(a) > 0) {
                    }
                    if (a->in_fd >= 0) {
                        close(a->in_fd);
                        a->in_fd = -1;
                    }
                    if (!a->done && !L.agent_fail && WIFEXITED(st) &&
                        WEXITSTATUS(st) == DDP_EXIT_LAUNCH &&
                        !ddp__job_host_is_local(L.job->nodes[i].host)) {
                        /* The SSH bridge could not provision the node; it said why. */
                        L.launch_error = true;
                        char msg[512];
                        snprintf(msg, sizeof(msg), "node '%s' could not be provisioned",
                                 L.job->nodes[i].host);
                        L.agent_fail = strdup(msg);
                        say("ddprun: %s; stopping the other nodes", msg);
                        stop_all(0);
                    } else if (!a->done && !L.agent_fail) {
                        char msg[512];
                        snprintf(msg, sizeof(msg), "the agent on node '%s' died (%s %d)",
                                 L.job->nodes[i].host, WIFSIGNALED(st) ? "signal" : "status",
                                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
                        L.agent_fail = strdup(msg);
                        say("ddprun: error: %s; stopping the job", msg);
                        stop_all((uint64_t)L.job->stop_grace_ms);
                    }
                }
        } else {
            L.sigints++;
            L.interrupted = true;
            if (L.sigints == 1) {
                say("ddprun: %s: stopping %d ranks (SIGTERM, SIGKILL after %lld ms; "
                    "interrupt again to kill them now)",
                    strsignal((int)si.ssi_signo), L.ranks_up - L.ranks_done,
                    (long long)L.job->stop_grace_ms);
                stop_all((uint64_t)L.job->stop_grace_ms);
            } else if (L.sigints == 2) {
                say("ddprun: killing every rank now");
                /* The agents SIGKILL their ranks and sweep what the ranks left behind;
                 * should one not be gone in 2 s, its whole process group is killed. */
                stop_all(0);
                ddp_timer_start(loop, &L.force, 2000);
            }
        }
    }
    if (all_agents_gone())
        ddp_loop_stop(loop);
}

static void on_force(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    /* Local agents lead their own process groups: end them outright. */
    for (size_t i = 0; i < L.job->nnodes; i++)
        if (L.ag[i].pid > 0 && !L.ag[i].reaped)
            kill(-L.ag[i].pid, SIGKILL);
}

static int spawn_agent(size_t i, const struct ddp__agent_start *st)
{
    struct node_agent *a = &L.ag[i];
    int in[2], out[2];
    char port[16]; /* formatted before fork: the child only execs */
    snprintf(port, sizeof(port), "%d", L.job->ssh_port);
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        sigprocmask(SIG_SETMASK, &L.oldmask, NULL);
        /* If ddprun is killed outright, its local agents go too (they then stop their
         * workers through EOF on stdin, or die with the process group). */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        const struct ddp_job *j = L.job;
        if (ddp__job_host_is_local(j->nodes[i].host)) {
            execl("/proc/self/exe", "ddprun", "agent", (char *)NULL);
        } else {
            execl("/proc/self/exe", "ddprun", "__ssh-bridge", j->nodes[i].host, port,
                  j->ssh_user ? j->ssh_user : "", j->ssh_identity ? j->ssh_identity : "",
                  j->ssh_known_hosts ? j->ssh_known_hosts : "", j->ssh_strict,
                  j->ssh_remote_ddprun ? j->ssh_remote_ddprun : L.self, (char *)NULL);
        }
        _exit(127);
    }
    setpgid(pid, pid); /* as the agent does itself: no race with a kill(-pid) */
    close(in[0]);
    close(out[1]);
    a->pid = pid;
    a->in_fd = in[1];
    a->out_fd = out[0];
    fcntl(a->out_fd, F_SETFL, O_NONBLOCK);
    ddp_buf_init(&a->rx);
    struct ddp_buf b;
    ddp_buf_init(&b);
    int r = ddp__agent_put_start(&b, st);
    if (r == 0)
        r = ddp_write_all(a->in_fd, b.data, b.len);
    explicit_bzero(b.data, b.len);
    ddp_buf_release(&b);
    if (r < 0)
        return -1;
    return ddp_loop_add(L.loop, a->out_fd, DDP_LOOP_READ, on_agent_out, a);
}

/* ---- setup helpers ---- */

/* The local address the kernel would use to reach host (no packet is sent). */
int ddp__route_source(const char *host, char *out, size_t n)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = -1, r = -1;
    if (getaddrinfo(host, "9", &hints, &res) != 0)
        return -1;
    if ((fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0)) >= 0 &&
        connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)n, NULL, 0, NI_NUMERICHOST) == 0)
        r = 0;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return r;
}

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

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static const char *rank_status(const struct rank_info *r, char *buf, size_t n)
{
    if (!r->exited)
        snprintf(buf, n, "never reported");
    else if (r->exec_failed)
        snprintf(buf, n, "did not start");
    else if (r->code < 0)
        snprintf(buf, n, "signal %d (%s)", -r->code,
                 sigabbrev_np(-r->code) ? sigabbrev_np(-r->code) : "?");
    else
        snprintf(buf, n, "exit %d", r->code);
    return buf;
}

static void summarize(int rc, double secs)
{
    const struct ddp_job *j = L.job;
    const char *status = rc == DDP_EXIT_OK            ? "succeeded"
                         : rc == DDP_EXIT_INTERRUPTED ? "interrupted"
                         : rc == DDP_EXIT_LAUNCH      ? "launch failed"
                                                      : "failed";
    char buf[128];
    say("ddprun: job %s %s after %.1f s (%d ranks on %zu node%s)", L.job_id, status, secs,
        j->world_size, j->nnodes, j->nnodes == 1 ? "" : "s");
    if (L.first_fail >= 0) {
        struct rank_info *r = &L.rk[L.first_fail];
        say("ddprun: first failure: rank %d on '%s': %s; last lines of %s:", L.first_fail,
            j->nodes[r->node].host, rank_status(r, buf, sizeof(buf)), r->logpath);
        for (int k = 0; k < r->ntail; k++)
            say("    %s", r->tail[k]);
    } else if (L.agent_fail) {
        say("ddprun: first failure: %s", L.agent_fail);
    }
    say("  %-6s %-20s %-22s %-9s %s", "rank", "host", "status", "runtime", "log");
    for (int i = 0; i < j->world_size; i++) {
        struct rank_info *r = &L.rk[i];
        char rt[32];
        snprintf(rt, sizeof(rt), "%.1fs", (double)r->runtime_ms / 1000);
        say("  %-6d %-20s %-22s %-9s %s", i, j->nodes[r->node].host,
            rank_status(r, buf, sizeof(buf)), rt, r->logpath);
    }
    char path[PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/summary.json", L.logdir);
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "{\"job_id\": ");
    json_str(f, L.job_id);
    fprintf(f, ", \"status\": ");
    json_str(f, status);
    fprintf(f,
            ", \"exit_code\": %d, \"runtime_s\": %.3f, \"world_size\": %d, \"first_failed_rank\": ",
            rc, secs, j->world_size);
    if (L.first_fail >= 0)
        fprintf(f, "%d", L.first_fail);
    else
        fprintf(f, "null");
    fprintf(f, ",\n \"ranks\": [");
    for (int i = 0; i < j->world_size; i++) {
        struct rank_info *r = &L.rk[i];
        fprintf(f, "%s\n  {\"rank\": %d, \"host\": ", i ? "," : "", i);
        json_str(f, j->nodes[r->node].host);
        fprintf(f, ", \"local_rank\": %d, \"exit_code\": ", r->local);
        if (r->exited && r->code >= 0 && !r->exec_failed)
            fprintf(f, "%d", r->code);
        else
            fprintf(f, "null");
        fprintf(f, ", \"signal\": ");
        if (r->exited && r->code < 0)
            fprintf(f, "%d", -r->code);
        else
            fprintf(f, "null");
        fprintf(f,
                ", \"started\": %s, \"runtime_s\": %.3f, \"log\": ", r->started ? "true" : "false",
                (double)r->runtime_ms / 1000);
        json_str(f, r->logpath);
        fprintf(f, "}");
    }
    fprintf(f, "\n]}\n");
    fclose(f);
}

int ddp__launch(const struct ddp_job *job)
{
    int rc = DDP_EXIT_LAUNCH;
    char token[DDP_STORE_TOKEN_HEX + 1];
    struct ddp_store_server *srv = NULL;
    pthread_t th;
    bool th_started = false;

    memset(&L, 0, sizeof(L));
    L.job = job;
    L.first_fail = -1;
    L.t0 = ddp_now_ms();
    L.tty = isatty(2);
    L.sfd = -1;
    make_job_id(job->name, L.job_id, sizeof(L.job_id));
    const char *first_remote = ddp__job_first_remote(job);
    ssize_t sl = readlink("/proc/self/exe", L.self, sizeof(L.self) - 1);
    L.self[sl > 0 ? sl : 0] = '\0';
    if (job->max_restarts > 0)
        say("ddprun: warning: elastic restarts are not implemented yet; the job stops at the "
            "first failure (elastic.max_restarts=%d is ignored)",
            job->max_restarts);
    snprintf(L.logdir, sizeof(L.logdir), "%s/%s", job->logs_dir, L.job_id);
    if (mkdir_p(L.logdir) < 0) {
        ddp__cli_error("cannot create the log folder '%s': %s", L.logdir, strerror(errno));
        return DDP_EXIT_LAUNCH;
    }
    L.rk = calloc((size_t)job->world_size, sizeof(*L.rk));
    L.ag = calloc(job->nnodes, sizeof(*L.ag));
    int rank = 0;
    for (size_t i = 0; i < job->nnodes; i++) {
        L.ag[i].rank_offset = rank;
        L.ag[i].in_fd = L.ag[i].out_fd = -1;
        for (int l = 0; l < job->nodes[i].slots; l++, rank++) {
            struct rank_info *r = &L.rk[rank];
            r->node = (int)i;
            r->local = l;
            snprintf(r->logpath, sizeof(r->logpath), "%s/rank-%d.log", L.logdir, rank);
            r->logfd = open(r->logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        }
    }

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
    if (ddp_store_token_generate(token) < 0)
        goto out;
    const char *listen = ddp__job_store_listen(job);
    struct ddp_store_server_opts o = {
        .host = listen, .port = job->rdzv_port, .token = token, .token_len = strlen(token)};
    int r = ddp_store_server_new(&o, &srv);
    if (r < 0) {
        ddp__cli_error("cannot start the rendezvous store on '%s:%d': %s", listen, job->rdzv_port,
                       ddp_strerror(r));
        goto out;
    }
    if (pthread_create(&th, NULL, serve, srv) != 0)
        goto out;
    th_started = true;
    char store_addr[300];
    int store_port = ddp_store_server_port(srv);
    bool wildcard = strcmp(listen, "0.0.0.0") == 0 || strcmp(listen, "::") == 0;
    snprintf(store_addr, sizeof(store_addr), strchr(listen, ':') ? "[%s]:%d" : "%s:%d",
             wildcard ? "127.0.0.1" : listen, store_port);

    if (ddp_loop_new(&L.loop) < 0 || (L.sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0 ||
        ddp_loop_add(L.loop, L.sfd, DDP_LOOP_READ, on_signal, NULL) < 0)
        goto out;
    ddp_timer_init(&L.tick, on_tick);
    ddp_timer_init(&L.force, on_force);
    /* Should an agent die abnormally, what its ranks leave behind is reparented to us
     * instead of init, and swept at the end. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (L.tty)
        ddp_timer_start(L.loop, &L.tick, 250);

    set_phase("launching");
    if (!L.tty)
        say("ddprun: job %s: %d ranks on %zu node%s, store on %s:%d, logs in %s", L.job_id,
            job->world_size, job->nnodes, job->nnodes == 1 ? "" : "s", listen, store_port,
            L.logdir);
    int master_port = free_port();
    size_t nenv = job->nenv + 1;
    char **env = calloc(nenv + 1, sizeof(char *));
    size_t e = 0;
    if (ddp__job_omp_default(job))
        env[e++] = strdup("OMP_NUM_THREADS=1");
    for (size_t k = 0; k < job->nenv; k++) {
        size_t len = strlen(job->env[k].key) + strlen(job->env[k].value) + 2;
        env[e] = malloc(len);
        snprintf(env[e++], len, "%s=%s", job->env[k].key, job->env[k].value);
    }
    /* With remote nodes, every node (the local ones too) must use addresses the others can
     * reach: the store's, and MASTER_ADDR, node 0's. */
    char master[256] = "127.0.0.1";
    if (first_remote) {
        const char *n0 = job->nodes[0].host;
        if (!ddp__job_host_is_local(n0))
            snprintf(master, sizeof(master), "%s", n0);
        else if (ddp__route_source(first_remote, master, sizeof(master)) < 0)
            snprintf(master, sizeof(master), "127.0.0.1");
    }
    bool spawned_all = true;
    for (size_t i = 0; i < job->nnodes && spawned_all; i++) {
        char node_store[300];
        snprintf(node_store, sizeof(node_store), "%s", store_addr);
        if (first_remote && wildcard) {
            char ip[INET6_ADDRSTRLEN];
            const char *toward =
                ddp__job_host_is_local(job->nodes[i].host) ? first_remote : job->nodes[i].host;
            if (ddp__route_source(toward, ip, sizeof(ip)) == 0)
                snprintf(node_store, sizeof(node_store), strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip,
                         store_port);
        }
        struct ddp__agent_start st = {.token = token,
                                      .store_addr = node_store,
                                      .job_id = L.job_id,
                                      .host_label = job->nodes[i].host,
                                      .master_addr = master,
                                      .master_port = (uint32_t)master_port,
                                      .node_rank = (uint32_t)i,
                                      .nnodes = (uint32_t)job->nnodes,
                                      .world_size = (uint32_t)job->world_size,
                                      .rank_offset = (uint32_t)L.ag[i].rank_offset,
                                      .nlocal = (uint32_t)job->nodes[i].slots,
                                      .restart_count = 0,
                                      .max_restarts = (uint32_t)job->max_restarts,
                                      .grace_ms = (uint64_t)job->stop_grace_ms,
                                      .workdir = job->workdir,
                                      .backend = job->backend,
                                      .checkpoint_dir =
                                          job->checkpoint_dir ? job->checkpoint_dir : "",
                                      .shell = job->shell ? job->shell : "",
                                      .argv = job->argv,
                                      .env = env};
        if (spawn_agent(i, &st) < 0) {
            ddp__cli_error("cannot start the node agent for '%s': %s", job->nodes[i].host,
                           strerror(errno));
            spawned_all = false;
            L.launch_error = true;
            stop_all(0);
        }
    }
    for (size_t k = 0; k < e; k++)
        free(env[k]);
    free(env);
    explicit_bzero(token, sizeof(token));
    for (size_t i = 0; i < job->nnodes; i++)
        if (!L.ag[i].pid) /* never forked: nothing to wait for */
            L.ag[i].reaped = L.ag[i].eof = true;
    if (!all_agents_gone())
        ddp_loop_run(L.loop);

    rc = L.launch_error                      ? DDP_EXIT_LAUNCH
         : L.interrupted                     ? DDP_EXIT_INTERRUPTED
         : L.first_fail >= 0 || L.agent_fail ? DDP_EXIT_JOB_FAILED
                                             : DDP_EXIT_OK;
    for (int i = 0; i < job->world_size && rc == DDP_EXIT_OK; i++)
        if (!L.rk[i].exited || L.rk[i].code != 0)
            rc = DDP_EXIT_JOB_FAILED;
    /* Anything still parented to us is an orphan of the job. */
    while (ddp__kill_children(SIGKILL) > 0) {
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        usleep(1000);
    }
    clear_status();
    summarize(rc, (double)(ddp_now_ms() - L.t0) / 1000);
out:
    explicit_bzero(token, sizeof(token));
    if (th_started) {
        ddp_store_server_stop(srv);
        pthread_join(th, NULL);
    }
    ddp_store_server_free(srv);
    if (L.loop)
        ddp_loop_free(L.loop);
    if (L.sfd >= 0)
        close(L.sfd);
    pthread_sigmask(SIG_SETMASK, &L.oldmask, NULL);
    for (int i = 0; L.rk && i < job->world_size; i++) {
        if (L.rk[i].logfd >= 0)
            close(L.rk[i].logfd);
        for (int k = 0; k < L.rk[i].ntail; k++)
            free(L.rk[i].tail[k]);
    }
    for (size_t i = 0; L.ag && i < job->nnodes; i++) {
        if (L.ag[i].in_fd >= 0)
            close(L.ag[i].in_fd);
        if (L.ag[i].out_fd >= 0)
            close(L.ag[i].out_fd);
        ddp_buf_release(&L.ag[i].rx);
    }
    free(L.rk);
    free(L.ag);
    free(L.agent_fail);
    return rc;
}
