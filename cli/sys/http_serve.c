/* A small read-only HTTP server on the loop (cli/sys/http_serve.h). */
#include "cli/sys/http_serve.h"
#include "common/log.h"
#include "common/loop.h"
#include "common/util.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

#define MAX_CONNS 64
#define HEAD_MAX 8192
#define HEAD_MS 5000
#define SWEEP_MS 1000

struct conn {
    struct ddp__http *s;
    int fd;
    int64_t since;
    char head[HEAD_MAX + 1];
    size_t len;
    struct ddp_buf out; /* the answer, being written */
    bool writing;
    struct conn *next, *prev;
};

struct ddp__http {
    struct ddp_loop *loop;
    int lfd;
    struct ddp__cidr *allow;
    int nallow;
    char name[32];
    ddp__http_handler h;
    void *arg;
    struct conn *conns;
    int nconns;
    struct ddp_timer sweep;
    unsigned long long answered, refused;
    struct ddp_log_limit lim; /* refusals: a line a second */
};

/* A refusal, logged at most once a second (the next line counts those held back). */
static void refusal(struct ddp__http *s, const char *what)
{
    s->refused++;
    DDP_WARN_LIMITED(&s->lim, SUP, "%s port: %s", s->name, what);
}

static void conn_close(struct conn *c)
{
    struct ddp__http *s = c->s;
    ddp_loop_del(s->loop, c->fd);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    ddp_buf_release(&c->out);
    free(c);
}

static void on_conn(struct ddp_loop *loop, int fd, unsigned mask, void *arg);

static void answer(struct conn *c, int status, const char *ctype, const struct ddp_buf *body,
                   bool head_only)
{
    const char *reason = status == 200   ? "OK"
                         : status == 400 ? "Bad Request"
                         : status == 404 ? "Not Found"
                         : status == 405 ? "Method Not Allowed"
                         : status == 431 ? "Request Header Fields Too Large"
                                         : "Internal Server Error";
    size_t blen = body ? body->len - body->off : 0;
    char hdr[320];
    int n = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Cache-Control: no-store\r\nConnection: close\r\n%s\r\n",
                     status, reason, ctype ? ctype : "text/plain; charset=utf-8", blen,
                     status == 405 ? "Allow: GET, HEAD\r\n" : "");
    ddp_buf_put(&c->out, hdr, (size_t)n);
    if (body && !head_only)
        ddp_buf_put(&c->out, body->data + body->off, blen);
    c->writing = true;
    ddp_loop_modify(c->s->loop, c->fd, DDP_LOOP_WRITE);
    on_conn(c->s->loop, c->fd, DDP_LOOP_WRITE, c);
}

static void plain(struct conn *c, int status, const char *text)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    ddp_buf_put(&b, text, strlen(text));
    answer(c, status, NULL, &b, false);
    ddp_buf_release(&b);
}

/* The request head is whole (c->head, NUL-terminated): answer it. */
int ddp__http_head(const char *head, size_t len, bool *head_only, char target[1024])
{
    char method[16], version[16];
    if (memchr(head, '\0', len) || head[len] != '\0')
        return 400; /* (a NUL byte in it) */
    if (!strstr(head, "\r\n\r\n") && !strstr(head, "\n\n"))
        return len >= HEAD_MAX ? 431 : 0;
    if (sscanf(head, "%15s %1023s %15s", method, target, version) != 3 ||
        strncmp(version, "HTTP/1.", 7) != 0 || target[0] != '/')
        return 400;
    *head_only = strcmp(method, "HEAD") == 0;
    if (!*head_only && strcmp(method, "GET") != 0)
        return 405;
    char *q = strchr(target, '?'); /* (a query string changes nothing) */
    if (q)
        *q = '\0';
    return 200;
}

static void request(struct conn *c, const char *target, bool head)
{
    struct ddp__http *s = c->s;
    struct ddp_buf body;
    ddp_buf_init(&body);
    const char *ctype = NULL;
    int status = s->h(s->arg, target, &body, &ctype);
    s->answered++;
    answer(c, status, ctype, &body, head);
    ddp_buf_release(&body);
}

static void on_conn(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    struct conn *c = arg;
    if (c->writing) {
        while (c->out.off < c->out.len) {
            ssize_t w = send(fd, c->out.data + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL);
            if (w < 0 && (errno == EAGAIN || errno == EINTR))
                return;
            if (w <= 0) {
                conn_close(c);
                return;
            }
            c->out.off += (size_t)w;
        }
        shutdown(fd, SHUT_WR);
        conn_close(c);
        return;
    }
    ssize_t r = recv(fd, c->head + c->len, HEAD_MAX - c->len, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (r <= 0) {
        conn_close(c);
        return;
    }
    c->len += (size_t)r;
    c->head[c->len] = '\0';
    char target[1024];
    bool head = false;
    switch (ddp__http_head(c->head, c->len, &head, target)) {
    case 0: /* more to come */
        break;
    case 200:
        request(c, target, head);
        break;
    case 405:
        plain(c, 405, "only GET and HEAD\n");
        break;
    case 431:
        refusal(c->s, "a request head over 8 KiB");
        plain(c, 431, "request head too large\n");
        break;
    default:
        refusal(c->s, "a malformed request (not HTTP/1.x)");
        plain(c, 400, "bad request\n");
    }
}

static void on_accept(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    struct ddp__http *s = arg;
    for (int k = 0; k < 64; k++) {
        struct sockaddr_storage peer;
        socklen_t pl = sizeof(peer);
        int c = accept4(fd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0)
            return;
        char who[64] = "?";
        if (getnameinfo((struct sockaddr *)&peer, pl, who, sizeof(who), NULL, 0, NI_NUMERICHOST) !=
            0)
            snprintf(who, sizeof(who), "?");
        static const struct ddp__cidr loopback[] = {
            {.family = AF_INET, .addr = {127}, .bits = 8},
            {.family = AF_INET6, .addr = {[15] = 1}, .bits = 128}};
        bool ok = s->nallow ? ddp__cidr_match(s->allow, s->nallow, &peer)
                            : ddp__cidr_match(loopback, 2, &peer);
        if (!ok) {
            char m[160];
            snprintf(m, sizeof(m), "refused %s: not in %s.allow", who, s->name);
            refusal(s, m);
            close(c);
            continue;
        }
        struct conn *n = s->nconns < MAX_CONNS ? calloc(1, sizeof(*n)) : NULL;
        if (!n) {
            char m[160];
            snprintf(m, sizeof(m), "refused %s: 64 connections are open", who);
            refusal(s, m);
            close(c);
            continue;
        }
        n->s = s;
        n->fd = c;
        n->since = ddp_now_ms();
        ddp_buf_init(&n->out);
        if (ddp_loop_add(loop, c, DDP_LOOP_READ, on_conn, n) < 0) {
            close(c);
            free(n);
            continue;
        }
        n->next = s->conns;
        if (s->conns)
            s->conns->prev = n;
        s->conns = n;
        s->nconns++;
    }
}

/* Connections that did not send their request in time, or do not read their answer, go. */
static void on_sweep(struct ddp_loop *loop, struct ddp_timer *t)
{
    struct ddp__http *s = (struct ddp__http *)((char *)t - offsetof(struct ddp__http, sweep));
    int64_t now = ddp_now_ms();
    for (struct conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (now - c->since >= (c->writing ? 2 * HEAD_MS : HEAD_MS)) {
            if (!c->writing)
                refusal(s, "a connection that sent no whole request in 5 s was dropped");
            conn_close(c);
        }
    }
    ddp_timer_start(loop, t, SWEEP_MS);
}

int ddp__http_open(struct ddp_loop *loop, const char *host, int port, const struct ddp__cidr *allow,
                   int nallow, const char *name, ddp__http_handler h, void *arg, int *bound,
                   struct ddp__http **out, char *why, size_t whyn)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0) {
        snprintf(why, whyn, "%s: %s", host, gai_strerror(g));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
        snprintf(why, whyn, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *bound = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                            : ((struct sockaddr_in *)&sa)->sin_port);
    struct ddp__http *s = calloc(1, sizeof(*s));
    if (!s || (nallow && !(s->allow = calloc((size_t)nallow, sizeof(*allow))))) {
        free(s);
        close(fd);
        snprintf(why, whyn, "out of memory");
        return -1;
    }
    if (nallow)
        memcpy(s->allow, allow, (size_t)nallow * sizeof(*allow));
    s->nallow = nallow;
    s->loop = loop;
    s->lfd = fd;
    s->h = h;
    s->arg = arg;
    snprintf(s->name, sizeof(s->name), "%s", name);
    ddp_timer_init(&s->sweep, on_sweep);
    if (ddp_loop_add(loop, fd, DDP_LOOP_READ, on_accept, s) < 0) {
        snprintf(why, whyn, "cannot watch its socket");
        close(fd);
        free(s->allow);
        free(s);
        return -1;
    }
    ddp_timer_start(loop, &s->sweep, SWEEP_MS);
    *out = s;
    return 0;
}

void ddp__http_close(struct ddp__http *s)
{
    if (!s)
        return;
    while (s->conns)
        conn_close(s->conns);
    ddp_timer_stop(s->loop, &s->sweep);
    ddp_loop_del(s->loop, s->lfd);
    close(s->lfd);
    free(s->allow);
    free(s);
}

void ddp__http_counts(const struct ddp__http *s, unsigned long long *answered,
                      unsigned long long *refused)
{
    *answered = s ? s->answered : 0;
    *refused = s ? s->refused : 0;
}
