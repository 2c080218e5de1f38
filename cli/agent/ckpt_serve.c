/* The replication port's server (cli/agent/ckpt_serve.h): a thread that accepts, and a thread per
 * connection that proves the token, reads one request and sends the file. */
#include "cli/agent/ckpt_serve.h"
#include "cli/proto/agent_wire.h"
#include "cli/proto/ckpt_proto.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/banned.h"

#define MAX_CONNS 8        /* connections served at once */
#define REQUEST_MS 5000    /* a connection's handshake and request, each */
#define IO_MS 10000        /* a send that makes no progress this long ends */
#define CHUNK (256u << 10) /* bytes read and sealed at a time */

static struct {
    int dirfd, lfd, stopfd;
    char *token;
    pthread_t server;
    bool on;
    atomic_bool stop;
    atomic_int conns;
    pthread_mutex_t logmu;
    struct ddp_log_limit lim;
} R = {.dirfd = -1, .lfd = -1, .stopfd = -1, .logmu = PTHREAD_MUTEX_INITIALIZER};

/* A refused connection, at most a line a second (the rest counted in the next). */
static void refuse(const char *peer, const char *why)
{
    pthread_mutex_lock(&R.logmu);
    DDP_WARN_LIMITED(&R.lim, SUP, "agent: checkpoint replication port: refused %s: %s", peer, why);
    pthread_mutex_unlock(&R.logmu);
}

/* ---- the replication port ---- */

struct conn {
    int fd;
    char peer[INET6_ADDRSTRLEN + 8];
};

/* Answers one request on c (authenticated): the file, sealed. */
static void send_file(struct conn *c, struct ddp__seal *s, const char *rel)
{
    struct open_how how = {.flags = O_RDONLY | O_CLOEXEC,
                           .resolve =
                               RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    int f = (int)syscall(SYS_openat2, R.dirfd, rel, &how, sizeof(how));
    if (f < 0 && errno == ENOSYS) /* (a kernel before 5.6: the path's checks alone) */
        f = openat(R.dirfd, rel, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat sb;
    uint8_t head[9] = {1};
    if (f >= 0 && fstat(f, &sb) == 0 && S_ISREG(sb.st_mode)) {
        head[0] = 0;
        for (int k = 0; k < 8; k++)
            head[1 + k] = (uint8_t)((uint64_t)sb.st_size >> (8 * k));
    }
    if (ddp__aw_write(c->fd, s, head, sizeof(head)) < 0 || head[0] != 0) {
        if (f >= 0)
            close(f);
        return;
    }
    uint8_t *buf = malloc(CHUNK);
    for (uint64_t left = (uint64_t)sb.st_size; buf && left > 0 && !atomic_load(&R.stop);) {
        ssize_t n = ddp_read_eintr(f, buf, left < CHUNK ? (size_t)left : CHUNK);
        if (n <= 0 || ddp__aw_write(c->fd, s, buf, (size_t)n) < 0)
            break; /* (the client sees the copy cut short) */
        left -= (uint64_t)n;
    }
    free(buf);
    close(f);
}

static void serve_one(struct conn *c)
{
    struct timeval tv = {.tv_sec = IO_MS / 1000};
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct ddp__seal s;
    char why[256], rel[DDP__CK_REL_MAX + 1];
    if (ddp__aw_accept(c->fd, R.token, REQUEST_MS, &s, why, sizeof(why)) < 0) {
        refuse(c->peer, why);
        return;
    }
    struct ddp_buf raw, plain;
    ddp_buf_init(&raw);
    ddp_buf_init(&plain);
    int64_t deadline = ddp_now_ms() + REQUEST_MS;
    size_t used = 0;
    int g = 0;
    const char *bad = NULL;
    while (g == 0 && !bad) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int64_t left = deadline - ddp_now_ms();
        if (left <= 0 || poll(&p, 1, (int)left) == 0) {
            bad = "it sent no whole request in time";
            break;
        }
        if (ddp_buf_reserve(&raw, 64 << 10) < 0) {
            bad = "out of memory";
            break;
        }
        ssize_t n = ddp_read_eintr(c->fd, raw.data + raw.len, 64 << 10);
        if (n == -EAGAIN || n == -EINTR)
            continue;
        if (n <= 0)
            break; /* gone: nothing to answer */
        raw.len += (size_t)n;
        int o = ddp__seal_open(&s, &raw, &plain);
        if (o < 0)
            bad = o == DDP_EAUTH ? "a record failed its authentication" : "a malformed record";
        else if ((g = ddp__ck_get_request(plain.data + plain.off, ddp_buf_pending(&plain), rel,
                                          &used)) < 0)
            bad = "a malformed request";
    }
    if (bad)
        refuse(c->peer, bad);
    else if (g == 1)
        send_file(c, &s, rel);
    ddp__seal_wipe(&s);
    ddp_buf_release(&raw);
    ddp_buf_release(&plain);
}

static void *conn_main(void *arg)
{
    struct conn *c = arg;
    serve_one(c);
    close(c->fd);
    free(c);
    atomic_fetch_sub(&R.conns, 1);
    return NULL;
}

static void peer_name(const struct sockaddr_storage *sa, char *out, size_t n)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
        port = ntohs(s6->sin6_port);
    } else if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
        port = ntohs(s4->sin_port);
    }
    snprintf(out, n, strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip, port);
}

static void *serve(void *arg)
{
    (void)arg;
    struct pollfd p[2] = {{.fd = R.lfd, .events = POLLIN}, {.fd = R.stopfd, .events = POLLIN}};
    while (!atomic_load(&R.stop)) {
        if (poll(p, 2, -1) < 0)
            continue;
        if (p[1].revents)
            break;
        struct sockaddr_storage sa;
        socklen_t sl = sizeof(sa);
        int fd = accept4(R.lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        struct conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        peer_name(&sa, c->peer, sizeof(c->peer));
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (atomic_fetch_add(&R.conns, 1) >= MAX_CONNS || pthread_create(&t, &at, conn_main, c)) {
            atomic_fetch_sub(&R.conns, 1);
            refuse(c->peer, "too many connections at once");
            close(fd);
            free(c);
        }
        pthread_attr_destroy(&at);
    }
    return NULL;
}

static int listen_on(const char *host, char *addr, size_t addrn, char *why, size_t whyn)
{
    struct sockaddr_storage sa = {0};
    socklen_t sl;
    bool v6 = strchr(host, ':') != NULL;
    if (v6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&sa;
        s6->sin6_family = AF_INET6;
        sl = sizeof(*s6);
        if (inet_pton(AF_INET6, host, &s6->sin6_addr) != 1)
            goto badhost;
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&sa;
        s4->sin_family = AF_INET;
        sl = sizeof(*s4);
        if (inet_pton(AF_INET, host, &s4->sin_addr) != 1)
            goto badhost;
    }
    R.lfd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (R.lfd < 0 || bind(R.lfd, (struct sockaddr *)&sa, sl) != 0 || listen(R.lfd, 64) != 0 ||
        getsockname(R.lfd, (struct sockaddr *)&sa, &sl) != 0) {
        snprintf(why, whyn, "cannot listen on %s: %s", host, strerror(errno));
        return -1;
    }
    int port =
        ntohs(v6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
    snprintf(addr, addrn, v6 ? "[%s]:%d" : "%s:%d", host, port);
    return 0;
badhost:
    snprintf(why, whyn, "'%s' is not an address of this node", host);
    return -1;
}

int ddp__cs_start(int dirfd, const char *token, const char *bind_host, char *addr, size_t addrn,
                  char *why, size_t whyn)
{
    R.dirfd = dirfd;
    if (!(R.token = strdup(token))) {
        snprintf(why, whyn, "out of memory");
        return -1;
    }
    if (listen_on(bind_host, addr, addrn, why, whyn) < 0)
        return -1;
    if ((R.stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        pthread_create(&R.server, NULL, serve, NULL) != 0) {
        snprintf(why, whyn, "cannot start a thread");
        return -1;
    }
    R.on = true;
    return 0;
}

void ddp__cs_stop(void)
{
    if (!R.on)
        return;
    R.on = false;
    atomic_store(&R.stop, true);
    uint64_t one = 1;
    if (write(R.stopfd, &one, sizeof(one)) < 0) {
        /* (an eventfd's write fails only on overflow) */
    }
    pthread_join(R.server, NULL);
    close(R.lfd);
    /* (dirfd and the token stay: a connection's thread may still be ending) */
}
