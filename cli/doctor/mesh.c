/*
 * `ddprun doctor`'s mesh check: whether every node reaches every other on the address its ranks
 * would listen on. A store reached from every node is not enough: the ranks connect to each
 * other (libddp's TCP mesh, Gloo's pairs, NCCL's bootstrap), and a firewall between compute
 * nodes that lets SSH and the login node through leaves a job hanging while its groups form.
 *
 * Each node that passed its own checks runs `ddprun __mesh HOST:PORT INDEX [IFACE]` (over SSH,
 * through srun, or here) at once. It connects to the doctor's listener, the store's stand-in, and
 * listens on its end's address of that connection (the address libddp ranks announce, on the
 * interface Gloo and NCCL are given), or on IFACE's (network.interface). Line protocol:
 *   node -> doctor: "listen INDEX ADDR PORT"
 *   doctor -> node: "peer J ADDR PORT" for each other node, then "go"
 *   node -> doctor: "reach J ok" or "reach J fail WHY" for each peer, then "done"
 * The node accepts (and closes) its peers' connections until the doctor closes its own, then
 * exits. A leaf beside cli/doctor/doctor.c, which calls it.
 */
#include "cli/doctor/doctor.h"
#include "cli/provision/ssh_session.h"
#include "cli/sys/sys.h"
#include "cli/spec/job.h"
#include "cli/provision/ssh_session.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/banned.h"

#define CONNECT_MS 3000 /* a peer that does not answer within it is unreachable */
#define JOIN_MS 30000   /* every node's __mesh connects back within it (SSH, srun) */
#define MAX_LINE 512

/* ---- both sides: lines on a socket ---- */

/* The next line from fd into line (without its newline), waiting up to ms: 0, or -1. buf holds
 * what was read beyond it. */
struct lines {
    char buf[4096];
    size_t len;
};

static int read_line(int fd, struct lines *l, char *line, size_t n, int ms)
{
    int64_t end = ddp_now_ms() + ms;
    for (;;) {
        char *nl = memchr(l->buf, '\n', l->len);
        if (nl) {
            size_t k = (size_t)(nl - l->buf);
            snprintf(line, n, "%.*s", (int)k, l->buf);
            memmove(l->buf, nl + 1, l->len - k - 1);
            l->len -= k + 1;
            return 0;
        }
        int left = (int)(end - ddp_now_ms());
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (l->len == sizeof(l->buf) || left <= 0 || poll(&p, 1, left) != 1)
            return -1;
        ssize_t r = read(fd, l->buf + l->len, sizeof(l->buf) - l->len);
        if (r <= 0)
            return -1;
        l->len += (size_t)r;
    }
}

static int say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int say(int fd, const char *fmt, ...)
{
    char s[MAX_LINE];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(s, sizeof(s), fmt, ap);
    va_end(ap);
    return k > 0 && (size_t)k < sizeof(s) ? ddp_write_all(fd, s, (size_t)k) : -1;
}

/* ---- the node's side ---- */

static socklen_t sa_len(int family)
{
    return family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

/* The address of interface name of family into *out; 0 or -1. */
static int iface_addr(const char *name, int family, struct sockaddr_storage *out)
{
    struct ifaddrs *ifs = NULL;
    int r = -1;
    if (getifaddrs(&ifs) != 0)
        return -1;
    for (struct ifaddrs *f = ifs; f && r < 0; f = f->ifa_next)
        if (f->ifa_addr && f->ifa_addr->sa_family == family && strcmp(f->ifa_name, name) == 0) {
            memcpy(out, f->ifa_addr, sa_len(family));
            r = 0;
        }
    freeifaddrs(ifs);
    return r;
}

/* A non-blocking connect to host:port started; the socket, or -1 with errno. */
static int connect_start(const char *host, int port)
{
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST}, *res;
    if (getaddrinfo(host, ps, &hints, &res) != 0) {
        errno = EINVAL;
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        fd = -1;
        errno = e;
    }
    freeaddrinfo(res);
    return fd;
}

struct peer {
    int index, port, fd;
    char addr[INET6_ADDRSTRLEN];
    int err; /* 0 reached, else errno */
    bool done;
};

/* Connects to every peer at once, accepting the peers' own connections on lfd meanwhile. */
static void reach_peers(struct peer *pe, int np, int lfd)
{
    struct pollfd *p = calloc((size_t)np + 1, sizeof(*p));
    if (!p)
        return;
    int64_t end = ddp_now_ms() + CONNECT_MS;
    for (int k = 0; k < np; k++)
        if ((pe[k].fd = connect_start(pe[k].addr, pe[k].port)) < 0)
            pe[k].err = errno, pe[k].done = true;
    for (;;) {
        int n = 0, left = (int)(end - ddp_now_ms());
        p[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int k = 0; k < np; k++)
            if (!pe[k].done)
                p[n++] = (struct pollfd){.fd = pe[k].fd, .events = POLLOUT};
        if (n == 1 || left <= 0)
            break;
        if (poll(p, (nfds_t)n, left) < 0 && errno != EINTR)
            break;
        if (p[0].revents & POLLIN) {
            int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0)
                close(c);
        }
        for (int k = 0, q = 1; k < np; k++) {
            if (pe[k].done)
                continue;
            if (p[q++].revents) {
                int err = 0;
                socklen_t el = sizeof(err);
                getsockopt(pe[k].fd, SOL_SOCKET, SO_ERROR, &err, &el);
                pe[k].err = err;
                pe[k].done = true;
            }
        }
    }
    for (int k = 0; k < np; k++) {
        if (!pe[k].done)
            pe[k].err = ETIMEDOUT;
        if (pe[k].fd >= 0)
            close(pe[k].fd);
    }
    free(p);
}

int ddp__cmd_mesh(int argc, char **argv)
{
    char host[256], line[MAX_LINE];
    int port, index;
    if ((argc != 4 && argc != 5) || ddp_parse_hostport(argv[2], host, sizeof(host), &port) < 0 ||
        (index = atoi(argv[3])) < 0) {
        fprintf(stderr, "ddprun: __mesh is internal to ddprun doctor\n");
        return DDP_EXIT_USAGE;
    }
    int c = connect_start(host, port);
    struct pollfd pc = {.fd = c, .events = POLLOUT};
    int err = 0;
    socklen_t el = sizeof(err);
    if (c < 0 || poll(&pc, 1, CONNECT_MS) != 1 ||
        getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) {
        printf("mesh: cannot connect to %s:%d: %s\n", host, port,
               strerror(c < 0 ? errno
                        : err ? err
                              : ETIMEDOUT));
        return 1;
    }
    fcntl(c, F_SETFL, 0);
    /* where the ranks would listen: this end of the store's path, or the forced interface's */
    struct sockaddr_storage me;
    socklen_t ml = sizeof(me);
    getsockname(c, (struct sockaddr *)&me, &ml);
    if (argc == 5 && iface_addr(argv[4], me.ss_family, &me) < 0) {
        printf("mesh: no address of interface %s here\n", argv[4]);
        return 1;
    }
    char addr[INET6_ADDRSTRLEN];
    ((struct sockaddr_in *)&me)->sin_port = 0; /* the same offset in sockaddr_in6 */
    int lfd = socket(me.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage got;
    socklen_t gl = sizeof(got);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&me, sa_len(me.ss_family)) != 0 ||
        listen(lfd, 256) != 0 || getsockname(lfd, (struct sockaddr *)&got, &gl) != 0 ||
        getnameinfo((struct sockaddr *)&got, gl, addr, sizeof(addr), NULL, 0, NI_NUMERICHOST)) {
        printf("mesh: cannot listen here: %s\n", strerror(errno));
        return 1;
    }
    char *pct = strchr(addr, '%'); /* a link-local address's scope */
    if (pct)
        *pct = '\0';
    say(c, "listen %d %s %d\n", index, addr, ntohs(((struct sockaddr_in *)&got)->sin_port));
    struct lines in = {.len = 0};
    struct peer *pe = NULL;
    int np = 0;
    bool go = false;
    while (!go && read_line(c, &in, line, sizeof(line), JOIN_MS + CONNECT_MS) == 0) {
        if ((go = strcmp(line, "go") == 0))
            break;
        struct peer q = {.fd = -1}, *more = realloc(pe, ((size_t)np + 1) * sizeof(*pe));
        if (!more)
            break;
        pe = more;
        if (sscanf(line, "peer %d %45s %d", &q.index, q.addr, &q.port) != 3)
            break;
        pe[np++] = q;
    }
    if (go) {
        reach_peers(pe, np, lfd);
        for (int k = 0; k < np; k++)
            if (pe[k].err)
                say(c, "reach %d fail %s\n", pe[k].index, strerror(pe[k].err));
            else
                say(c, "reach %d ok\n", pe[k].index);
        say(c, "done\n");
        /* peers still connecting are answered until the doctor is done with everyone */
        struct pollfd p[2] = {{.fd = c, .events = POLLIN}, {.fd = lfd, .events = POLLIN}};
        for (int64_t end = ddp_now_ms() + JOIN_MS; ddp_now_ms() < end;) {
            if (poll(p, 2, 200) < 0 && errno != EINTR)
                break;
            if (p[0].revents) /* the doctor closed (or wrote): done */
                break;
            int a = p[1].revents & POLLIN ? accept4(lfd, NULL, NULL, SOCK_CLOEXEC) : -1;
            if (a >= 0)
                close(a);
        }
    }
    free(pe);
    close(lfd);
    close(c);
    return 0;
}

/* ---- the doctor's side ---- */

struct run {
    const struct ddp_job *job;
    const char *self;
    size_t i;
    char target[300];
    int done_w;           /* the runner's end: its index is written there when its command ended */
    struct ddp__ssh *ssh; /* the node's session from its checks, or NULL */
    char out[1024];
};

/* Runs __mesh on node r->i as a launch would reach it: srun, SSH, or here. */
static void *runner(void *arg)
{
    struct run *r = arg;
    const struct ddp_job *j = r->job;
    const char *host = j->nodes[r->i].host;
    char idx[24];
    snprintf(idx, sizeof(idx), "%zu", r->i);
    int st = 0;
    if (j->srun && !ddp__job_host_is_local(host)) {
        char nodelist[300];
        snprintf(nodelist, sizeof(nodelist), "--nodelist=%s", host);
        char *argv[] = {DDP__DOCTOR_SRUN, nodelist, (char *)r->self, "__mesh",
                        r->target,        idx,      j->net_iface,    NULL};
        ddp__run_capture(argv, r->out, sizeof(r->out), JOIN_MS + 2 * CONNECT_MS, &st);
    } else if (ddp__job_host_is_local(host)) {
        char *argv[] = {(char *)r->self, "__mesh", r->target, idx, j->net_iface, NULL};
        ddp__run_capture(argv, r->out, sizeof(r->out), JOIN_MS + 2 * CONNECT_MS, &st);
    } else {
        struct ddp__ssh own, *s = r->ssh; /* the checks' session: no second login */
        if (!s)
            ddp__ssh_for_node(s = &own, j, r->i, r->self);
        char cmd[PATH_MAX + 400];
        snprintf(cmd, sizeof(cmd), "'%s' __mesh '%s' %s%s%s%s", s->remote, r->target, idx,
                 j->net_iface ? " '" : "", j->net_iface ? j->net_iface : "",
                 j->net_iface ? "'" : "");
        if ((s == &own && ddp__ssh_open(s) != 0) ||
            ddp__ssh_run(s, cmd, r->out, sizeof(r->out), &st) < 0)
            snprintf(r->out, sizeof(r->out), "mesh: %.900s", s->err);
        if (s == &own)
            ddp__ssh_close(s);
    }
    uint32_t k = (uint32_t)r->i;
    ssize_t w = write(r->done_w, &k, sizeof(k));
    (void)w;
    return NULL;
}

struct member {
    int fd;
    struct lines in;
    char addr[INET6_ADDRSTRLEN];
    int port;
    bool ended, done;
};

/* Takes a node's first line on a new connection: its index, address and port. */
static void take_conn(int lfd, struct member *m, size_t nn, const bool *part)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    struct lines in = {.len = 0};
    char line[MAX_LINE], addr[INET6_ADDRSTRLEN];
    int i = -1, port = 0;
    if (read_line(fd, &in, line, sizeof(line), CONNECT_MS) == 0 &&
        sscanf(line, "listen %d %45s %d", &i, addr, &port) == 3 && i >= 0 && (size_t)i < nn &&
        part[i] && m[i].fd < 0 && port > 0 && port < 65536) {
        m[i].fd = fd;
        m[i].in = in;
        m[i].port = port;
        snprintf(m[i].addr, sizeof(m[i].addr), "%s", addr);
        return;
    }
    close(fd); /* not a node of this check */
}

/* Appends "'host' (ADDR): WHY" to why. */
static void add_unreached(char *why, size_t n, const char *host, const struct member *to,
                          const char *err)
{
    size_t l = strlen(why);
    if (l < n)
        snprintf(why + l, n - l, "%s'%s' (%s): %s", l ? "; " : "", host, to->addr, err);
}

bool ddp__doctor_mesh(const struct ddp_job *job, const char *self, int lfd, int port,
                      const bool *part, struct ddp__ssh *const *ssh, char *why, size_t whyn)
{
    size_t nn = job->nnodes, np = 0;
    const char *first_remote = NULL;
    for (size_t i = 0; i < nn; i++) {
        np += part[i];
        if (!first_remote && !ddp__job_host_is_local(job->nodes[i].host))
            first_remote = job->nodes[i].host;
        why[i * whyn] = '\0';
    }
    int pp[2];
    struct member *m = calloc(nn, sizeof(*m));
    struct run *r = calloc(nn, sizeof(*r));
    pthread_t *th = calloc(nn, sizeof(*th));
    if (np < 2 || !first_remote || !m || !r || !th || pipe2(pp, O_CLOEXEC) != 0) {
        free(m);
        free(r);
        free(th);
        return false;
    }
    for (size_t i = 0; i < nn; i++) {
        m[i].fd = -1;
        if (!part[i])
            continue;
        /* the store's stand-in as the node reaches it (a local node: toward the others) */
        const char *host = job->nodes[i].host;
        char ip[INET6_ADDRSTRLEN];
        if (ddp__route_source(ddp__job_host_is_local(host) ? first_remote : host, ip, sizeof(ip)) <
            0)
            snprintf(ip, sizeof(ip), "127.0.0.1");
        r[i] = (struct run){.job = job, .self = self, .i = i, .done_w = pp[1], .ssh = ssh[i]};
        snprintf(r[i].target, sizeof(r[i].target), strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip, port);
        pthread_create(&th[i], NULL, runner, &r[i]);
    }
    /* every node that takes part connects back, or its runner ends first (it could not) */
    size_t joined = 0, ended = 0;
    for (int64_t end = ddp_now_ms() + JOIN_MS; joined + ended < np && ddp_now_ms() < end;) {
        struct pollfd p[2] = {{.fd = lfd, .events = POLLIN}, {.fd = pp[0], .events = POLLIN}};
        int64_t left = end - ddp_now_ms();
        if (poll(p, 2, left > 0 ? (int)left : 0) <= 0)
            continue;
        if (p[0].revents & POLLIN) {
            take_conn(lfd, m, nn, part);
            joined = 0;
            for (size_t i = 0; i < nn; i++)
                joined += m[i].fd >= 0;
        }
        uint32_t k;
        if ((p[1].revents & POLLIN) && read(pp[0], &k, sizeof(k)) == sizeof(k) && k < nn &&
            !m[k].ended) {
            m[k].ended = true;
            ended += m[k].fd < 0;
        }
    }
    /* each is told the others', and says what it reached */
    for (size_t i = 0; i < nn; i++) {
        if (m[i].fd < 0)
            continue;
        for (size_t k = 0; k < nn; k++)
            if (k != i && m[k].fd >= 0)
                say(m[i].fd, "peer %zu %s %d\n", k, m[k].addr, m[k].port);
        say(m[i].fd, "go\n");
    }
    for (size_t i = 0; i < nn; i++) {
        char line[MAX_LINE], *w = why + i * whyn, list[600] = "";
        if (!part[i])
            continue;
        if (m[i].fd < 0) {
            snprintf(w, whyn, "%s", "its mesh check did not answer");
            continue;
        }
        int unreached = 0, k;
        while (!m[i].done &&
               read_line(m[i].fd, &m[i].in, line, sizeof(line), 2 * CONNECT_MS) == 0) {
            int off = 0;
            if ((m[i].done = strcmp(line, "done") == 0))
                break;
            if (sscanf(line, "reach %d fail %n", &k, &off) == 1 && off > 0 && k >= 0 &&
                (size_t)k < nn && m[k].fd >= 0) {
                unreached++;
                add_unreached(list, sizeof(list), job->nodes[k].host, &m[k], line + off);
            }
        }
        if (unreached)
            snprintf(w, whyn,
                     "cannot reach %s, where its ranks would listen (a firewall between the "
                     "nodes? ranks connect to each other on any port)",
                     list);
        else if (!m[i].done)
            snprintf(w, whyn, "%s", "its mesh check did not finish");
    }
    for (size_t i = 0; i < nn; i++)
        if (m[i].fd >= 0)
            close(m[i].fd);
    for (size_t i = 0; i < nn; i++)
        if (part[i])
            pthread_join(th[i], NULL);
    for (size_t i = 0; i < nn; i++) { /* a runner that could not start it says why */
        char *w = why + i * whyn, *o = r[i].out;
        if (part[i] && m[i].fd < 0 && o[0])
            snprintf(w, whyn, "its mesh check could not run: %.*s", (int)strcspn(o, "\n"),
                     strncmp(o, "mesh: ", 6) ? o : o + 6);
    }
    close(pp[0]);
    close(pp[1]);
    free(m);
    free(r);
    free(th);
    return true;
}
