/* The launcher's agent port (cli/supervisor/dialin.h). */
#include "cli/supervisor/dialin.h"
#include "cli/proto/agent_proto.h"
#include "common/err.h"
#include "common/log.h"
#include "common/loop.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

enum { WAIT_C1, WAIT_C2, WAIT_ATTACH };

struct pend {
    int fd, state;
    size_t slot;
    struct ddp_buf raw, plain;
    uint8_t cn[DDP__AW_NONCE], sn[DDP__AW_NONCE];
    struct ddp__seal seal;
    struct ddp_timer timer;
    char peer[INET6_ADDRSTRLEN + 8];
};

static struct {
    struct ddp_loop *loop;
    int lfd, port;
    const char *token; /* the launcher's (a takeover restores the job's after the start) */
    int spare;         /* a descriptor kept to give up when none is left (on_accept) */
    struct ddp__dialin_cb cb;
    struct pend *p[DDP__DIALIN_PENDING];
    size_t np;
    struct ddp__dialin_stats st;
    struct ddp_log_limit lim;
} D = {.lfd = -1, .spare = -1};

static void drop(struct pend *c, bool close_fd)
{
    ddp_timer_stop(D.loop, &c->timer);
    if (c->fd >= 0) {
        ddp_loop_del(D.loop, c->fd);
        if (close_fd)
            close(c->fd);
    }
    D.p[c->slot] = D.p[--D.np];
    D.p[c->slot]->slot = c->slot;
    ddp_buf_release(&c->raw);
    ddp_buf_release(&c->plain);
    ddp__seal_wipe(&c->seal);
    free(c);
}

static void refuse(struct pend *c, uint64_t *count, const char *why)
{
    (*count)++;
    DDP_WARN_LIMITED(&D.lim, SUP, "agent port: refusing a connection from %s: %s", c->peer, why);
    drop(c, true);
}

static void on_timeout(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    struct pend *c = (struct pend *)((char *)t - offsetof(struct pend, timer));
    refuse(c, &D.st.timed_out,
           c->state == WAIT_C1 ? "it said nothing in time"
                               : "it did not finish proving the job's token in time");
}

/* Runs c's handshake as far as what it sent allows. */
static void advance(struct pend *c)
{
    if (c->state == WAIT_C1 && ddp_buf_pending(&c->raw) >= DDP__AW_C1_LEN) {
        uint8_t s1[DDP__AW_S1_LEN];
        int r = ddp__aw_s1(D.token, c->raw.data + c->raw.off, c->cn, c->sn, s1);
        if (r < 0) {
            refuse(c, &D.st.refused_other,
                   r == DDP_EVERSION ? "another version of the agent link (run the same ddprun "
                                       "on every node)"
                                     : "it does not speak the agent link");
            return;
        }
        c->raw.off += DDP__AW_C1_LEN;
        /* 68 bytes into a fresh socket's empty buffer: written whole, or the peer is gone */
        if (ddp_write_eintr(c->fd, s1, sizeof(s1)) != (ssize_t)sizeof(s1)) {
            refuse(c, &D.st.refused_other, "it went away");
            return;
        }
        c->state = WAIT_C2;
    }
    if (c->state == WAIT_C2 && ddp_buf_pending(&c->raw) >= DDP__AW_C2_LEN) {
        if (ddp__aw_check_c2(D.token, c->cn, c->sn, c->raw.data + c->raw.off) < 0) {
            refuse(c, &D.st.refused_auth, "authentication failed (wrong job token)");
            return;
        }
        c->raw.off += DDP__AW_C2_LEN;
        if (ddp__seal_init(&c->seal, D.token, c->cn, c->sn, false) < 0) {
            refuse(c, &D.st.refused_other, "cannot derive the link's keys");
            return;
        }
        c->state = WAIT_ATTACH;
    }
    if (c->state != WAIT_ATTACH)
        return;
    int r = ddp__seal_open(&c->seal, &c->raw, &c->plain);
    if (r < 0) {
        refuse(c, &D.st.refused_other,
               r == DDP_EAUTH ? "a record failed its authentication" : "a malformed record");
        return;
    }
    uint8_t type;
    const uint8_t *body;
    size_t len;
    int k = ddp__agent_next(&c->plain, &type, &body, &len);
    if (k == 0)
        return;
    struct ddp__aw_attach a;
    if (k < 0 || type != DDP__AG_ATTACH || ddp__aw_get_attach(body, len, &a) < 0) {
        refuse(c, &D.st.refused_other, "its first frame was not a well-formed ATTACH");
        return;
    }
    ddp_buf_compact(&c->plain);
    char why[300] = "";
    ddp_loop_del(D.loop, c->fd);
    int fd = c->fd;
    c->fd = -1;
    if (D.cb.attach(D.cb.arg, fd, &c->seal, &a, &c->raw, &c->plain, c->peer, why, sizeof(why))) {
        D.st.linked++;
        drop(c, false);
        return;
    }
    c->fd = fd;
    refuse(c, &D.st.refused_other, why[0] ? why : "no node of the job waits for it");
}

static void on_conn(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    struct pend *c = arg;
    /* Before it proves the token a connection sends 24 bytes, then 32 once answered: any more
     * before the answer is not an agent. After, records may follow ATTACH at once (a rejoined
     * agent's held output): they wait for the node, up to a record beyond ATTACH's. */
    size_t cap = c->state == WAIT_C1 ? DDP__AW_C1_LEN : 2 * (4 + DDP__AW_MAX_RECORD + DDP__AW_TAG);
    if (ddp_buf_reserve(&c->raw, 4096) < 0) {
        refuse(c, &D.st.refused_other, "out of memory");
        return;
    }
    ssize_t r = ddp_read_eintr(fd, c->raw.data + c->raw.len, c->raw.cap - c->raw.len);
    if (r == -EAGAIN)
        return;
    if (r <= 0) {
        refuse(c, &D.st.refused_other,
               c->state == WAIT_ATTACH ? "it closed the connection before saying who it is"
                                       : "it closed the connection before proving the job's token");
        return;
    }
    c->raw.len += (size_t)r;
    if (ddp_buf_pending(&c->raw) > cap) {
        refuse(c, &D.st.refused_other, "it sent more than the handshake");
        return;
    }
    advance(c);
}

static void on_accept(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    (void)arg;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int c = accept4(fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0 && (errno == EMFILE || errno == ENFILE) && D.spare >= 0) {
            /* Out of descriptors: the connection would stay queued and the listener readable,
             * the loop spinning. The spare descriptor lets it be taken and closed at once. */
            close(D.spare);
            c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0)
                close(c);
            D.spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
            D.st.dropped_busy++;
            DDP_WARN_LIMITED(&D.lim, SUP,
                             "agent port: out of file descriptors; closing a connection at once");
            if (c >= 0)
                continue;
        }
        if (c < 0)
            return; /* EAGAIN: the next one comes with the next event */
        D.st.accepted++;
        char ip[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        if (ss.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, ip, sizeof(ip));
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        } else if (ss.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip, sizeof(ip));
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
        struct pend *p = D.np < DDP__DIALIN_PENDING ? calloc(1, sizeof(*p)) : NULL;
        if (!p) {
            close(c);
            D.st.dropped_busy++;
            DDP_WARN_LIMITED(&D.lim, SUP,
                             "agent port: %d connections are proving themselves already; closing "
                             "the one from %s",
                             DDP__DIALIN_PENDING, ip);
            continue;
        }
        p->fd = c;
        p->state = WAIT_C1;
        snprintf(p->peer, sizeof(p->peer), strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip, port);
        ddp_buf_init(&p->raw);
        ddp_buf_init(&p->plain);
        ddp_timer_init(&p->timer, on_timeout);
        p->slot = D.np;
        D.p[D.np++] = p;
        int one = 1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (ddp_loop_add(loop, c, DDP_LOOP_READ, on_conn, p) < 0) {
            p->fd = -1;
            close(c);
            drop(p, false);
            continue;
        }
        ddp_timer_start(loop, &p->timer, DDP__DIALIN_DEADLINE_MS);
    }
}

int ddp__dialin_start(struct ddp_loop *loop, const char *host, int port, const char *token,
                      const struct ddp__dialin_cb *cb)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        fprintf(stderr, "ddprun: error: cannot listen for agents on '%s': %s\n", host,
                gai_strerror(g));
        return DDP_EINVAL;
    }
    int err = 0;
    for (struct addrinfo *ai = res; ai && D.lfd < 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
            bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof(ss);
            getsockname(fd, (struct sockaddr *)&ss, &sl);
            D.port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                              : ntohs(((struct sockaddr_in *)&ss)->sin_port);
            D.lfd = fd;
            break;
        }
        err = errno;
        if (fd >= 0)
            close(fd);
    }
    freeaddrinfo(res);
    if (D.lfd < 0) {
        fprintf(stderr, "ddprun: error: cannot listen for agents on '%s:%d': %s\n", host, port,
                strerror(err));
        return DDP_ESYS;
    }
    D.loop = loop;
    D.cb = *cb;
    D.spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    D.token = token;
    if (ddp_loop_add(loop, D.lfd, DDP_LOOP_READ, on_accept, NULL) < 0) {
        ddp__dialin_stop();
        return DDP_ESYS;
    }
    return 0;
}

int ddp__dialin_port(void)
{
    return D.lfd >= 0 ? D.port : 0;
}

void ddp__dialin_stats(struct ddp__dialin_stats *st)
{
    *st = D.st;
}

void ddp__dialin_stop(void)
{
    while (D.np)
        drop(D.p[D.np - 1], true);
    if (D.lfd >= 0) {
        if (D.loop)
            ddp_loop_del(D.loop, D.lfd);
        close(D.lfd);
    }
    D.lfd = -1;
    D.port = 0;
    D.token = NULL;
    if (D.spare >= 0)
        close(D.spare);
    D.spare = -1;
}
