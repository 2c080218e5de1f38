/*
 * The store server: one thread, one epoll loop, whole frames only, replies queued and drained on
 * EPOLLOUT. This file is the loop (accepting, reading, the handshake, dispatch, teardown after
 * each iteration) and the public lifecycle; the data and the requests on it are in
 * server_data.c, a connection's output in server_conn.c (see rendezvous/server.h).
 */
#include "rendezvous/server.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

#define READ_CHUNK (64u << 10)
#define READ_MAX_PER_EVENT (1u << 20)
/* Requests a client may pipeline behind a parked WAIT before it is dropped: two full frames. */
#define PARKED_INPUT_MAX (2u * DDP__MAX_FRAME)

/* Final teardown: runs from the after-hook, never while a callback can still reach c. */
static void conn_destroy(struct conn *c)
{
    struct server *s = c->srv;
    ddp__srv_conn_forget(c);
    ddp_timer_stop(s->loop, &c->auth_timer);
    ddp_loop_del(s->loop, c->fd);
    close(c->fd);
    ddp_list_del(&c->link);
    ddp_list_del(&c->flush_link);
    ddp_list_del(&c->resume_link);
    ddp_buf_release(&c->in);
    ddp_buf_release(&c->out);
    STAT_ADD(s, conns_open, (uint64_t)-1);
    free(c);
}
/* ------------------------------------------------------------------ */
/* Handshake                                                          */
/* ------------------------------------------------------------------ */

static void auth_timeout(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    struct conn *c = DDP_CONTAINER_OF(t, struct conn, auth_timer);
    DDP__SRV_DROP_WARN(c, "dropping connection from '%s': no authentication within %d ms", c->peer,
                       c->srv->auth_timeout_ms);
    STAT_ADD(c->srv, conns_dropped, 1);
    ddp__srv_close_later(c, "authentication timeout");
}

static void on_hello(struct conn *c, const struct ddp__req *q)
{
    if (q->magic != DDP__PROTO_MAGIC) {
        DDP__SRV_DROP_WARN(
            c, "dropping connection from '%s': bad magic 0x%08x (not a ddprun store client)",
            c->peer, q->magic);
        STAT_ADD(c->srv, conns_dropped, 1);
        ddp__srv_close_later(c, "bad magic");
        return;
    }
    if (q->version != DDP__PROTO_VERSION) {
        DDP__SRV_DROP_WARN(c, "refusing client '%s': protocol version %u, server speaks %u",
                           c->peer, q->version, DDP__PROTO_VERSION);
        size_t pos = ddp__srv_reply_begin(c, q->op, q->id, DDP_EVERSION);
        ddp_buf_put_u16(&c->out, DDP__PROTO_VERSION);
        ddp__srv_reply_end(c, pos);
        c->close_after_write = true;
        c->close_reason = "version mismatch";
        STAT_ADD(c->srv, conns_dropped, 1);
        return;
    }
    memcpy(c->cnonce, q->nonce, DDP__NONCE_LEN);
    if (ddp_random_bytes(c->snonce, DDP__NONCE_LEN) < 0) {
        ddp__srv_close_later(c, "no randomness");
        return;
    }
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u32(&c->out, DDP__PROTO_MAGIC);
    ddp_buf_put_u16(&c->out, DDP__PROTO_VERSION);
    ddp_buf_put_u16(&c->out, 0);
    ddp_buf_put(&c->out, c->snonce, DDP__NONCE_LEN);
    ddp__srv_reply_end(c, pos);
    c->state = CONN_AUTH;
}

static void on_auth(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    uint8_t want[DDP__MAC_LEN], mine[DDP__MAC_LEN];
    if (ddp__proto_mac(s->token, s->toklen, DDP__LABEL_CLIENT, c->snonce, c->cnonce, want) < 0 ||
        !ddp__proto_mac_equal(want, q->mac)) {
        DDP__SRV_DROP_WARN(c, "refusing client '%s': authentication failed (wrong job token)",
                           c->peer);
        STAT_ADD(s, conns_refused_auth, 1);
        ddp__srv_reply(c, q->op, q->id, DDP_EAUTH);
        c->close_after_write = true;
        c->close_reason = "authentication failed";
        return;
    }
    if (ddp__proto_mac(s->token, s->toklen, DDP__LABEL_SERVER, c->cnonce, c->snonce, mine) < 0) {
        ddp__srv_close_later(c, "mac failed");
        return;
    }
    ddp_timer_stop(s->loop, &c->auth_timer);
    c->state = CONN_READY;
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    ddp_buf_put(&c->out, mine, DDP__MAC_LEN);
    ddp__srv_reply_end(c, pos);
    DDP_DEBUG(STORE, "client '%s' authenticated (conn %" PRIu64 ")", c->peer, c->id);
}

static void dispatch(struct conn *c, const uint8_t *frame, size_t len)
{
    struct ddp__req q;
    STAT_ADD(c->srv, requests, 1);
    int r = ddp__proto_parse_req(frame, len, &q);
    if (r == DDP_ETOOBIG && c->state == CONN_READY) {
        /* A well-framed request over a limit (a key over 4096 bytes, a value over 16 MiB, more
         * than 65536 keys): answered ETOOBIG, and the connection goes on. The header was
         * read by the parser: u32 len, u8 op, u32 id. */
        struct ddp_rd rd;
        uint32_t flen, id;
        uint8_t op;
        ddp_rd_init(&rd, frame, len);
        ddp_rd_u32(&rd, &flen);
        ddp_rd_u8(&rd, &op);
        ddp_rd_u32(&rd, &id);
        ddp__srv_reply(c, op, id, DDP_ETOOBIG);
        return;
    }
    if (r < 0) {
        DDP__SRV_DROP_WARN(c, "dropping connection from '%s': malformed frame (%s)", c->peer,
                           ddp_strerror(r));
        STAT_ADD(c->srv, conns_dropped, 1);
        ddp__srv_close_later(c, "malformed frame");
        return;
    }
    bool pre = c->state != CONN_READY;
    bool handshake_op = q.op == DDP__OP_HELLO || q.op == DDP__OP_AUTH;
    if ((c->state == CONN_HELLO && q.op != DDP__OP_HELLO) ||
        (c->state == CONN_AUTH && q.op != DDP__OP_AUTH) || (!pre && handshake_op)) {
        DDP__SRV_DROP_WARN(c, "dropping connection from '%s': op 0x%02x out of sequence", c->peer,
                           q.op);
        STAT_ADD(c->srv, conns_dropped, 1);
        ddp__srv_close_later(c, "op out of sequence");
        return;
    }
    switch (q.op) {
    case DDP__OP_HELLO:
        on_hello(c, &q);
        break;
    case DDP__OP_AUTH:
        on_auth(c, &q);
        break;
    case DDP__OP_PING:
        ddp__srv_reply(c, q.op, q.id, 0);
        break;
    case DDP__OP_SET:
        ddp__srv_op_set(c, &q);
        break;
    case DDP__OP_GET:
        ddp__srv_op_get(c, &q);
        break;
    case DDP__OP_ADD:
        ddp__srv_op_add(c, &q);
        break;
    case DDP__OP_CAS:
        ddp__srv_op_cas(c, &q);
        break;
    case DDP__OP_DELETE:
        ddp__srv_op_delete(c, &q);
        break;
    case DDP__OP_CHECK:
        ddp__srv_op_check(c, &q);
        break;
    case DDP__OP_NUM_KEYS: {
        size_t pos = ddp__srv_reply_begin(c, q.op, q.id, 0);
        ddp_buf_put_u64(&c->out, q.key ? ddp__srv_count_prefix(c->srv, q.key, q.klen)
                                       : STAT_GET(c->srv, keys));
        ddp__srv_reply_end(c, pos);
        break;
    }
    case DDP__OP_WAIT:
        ddp__srv_op_wait(c, &q);
        break;
    case DDP__OP_MULTI_GET:
        ddp__srv_op_multi_get(c, &q);
        break;
    case DDP__OP_WATCH:
        ddp__srv_op_watch(c, &q);
        break;
    case DDP__OP_UNWATCH:
        ddp__srv_op_unwatch(c, &q);
        break;
    case DDP__OP_LEASE_GRANT:
        ddp__srv_op_lease_grant(c, &q);
        break;
    case DDP__OP_LEASE_KEEPALIVE:
        ddp__srv_op_lease_keepalive(c, &q);
        break;
    case DDP__OP_LEASE_REVOKE:
        ddp__srv_op_lease_revoke(c, &q);
        break;
    default:
        ddp__srv_close_later(c, "unknown op");
    }
}

/* ------------------------------------------------------------------ */
/* Socket events                                                      */
/* ------------------------------------------------------------------ */

/*
 * Handles every whole frame buffered, in order, until one parks the connection (a WAIT not
 * answered yet: the rest wait behind it) or closes it. -1 when the connection is closing.
 */
static int conn_process(struct conn *c)
{
    struct server *s = c->srv;
    if (c->torch)
        return ddp__srv_torch_process(c);
    for (;;) {
        if (c->closing || c->close_after_write)
            return -1;
        if (c->parked)
            break;
        uint32_t max = c->state == CONN_READY ? DDP__MAX_FRAME : DDP__MAX_PREAUTH_FRAME;
        long fs = ddp__proto_frame_size(c->in.data + c->in.off, ddp_buf_pending(&c->in), max);
        if (fs < 0) {
            /* Checked before anything is allocated for the frame. */
            DDP__SRV_DROP_WARN(c, "dropping connection from '%s': frame length %s", c->peer,
                               fs == DDP_ETOOBIG ? "over the limit" : "below the minimum");
            STAT_ADD(s, conns_dropped, 1);
            ddp__srv_close_later(c, "bad frame length");
            return -1;
        }
        if (fs == 0)
            break;
        const uint8_t *frame = c->in.data + c->in.off;
        c->in.off += (size_t)fs;
        dispatch(c, frame, (size_t)fs);
    }
    ddp_buf_compact(&c->in);
    return 0;
}

static void conn_read(struct conn *c)
{
    struct server *s = c->srv;
    size_t budget = READ_MAX_PER_EVENT;
    while (budget > 0 && !c->closing && !c->close_after_write) {
        uint32_t max = c->state == CONN_READY ? DDP__MAX_FRAME : DDP__MAX_PREAUTH_FRAME;
        /* Size the read to the frame in progress; its header was checked when it arrived. */
        size_t want = READ_CHUNK;
        if (!c->torch && ddp_buf_pending(&c->in) >= 4 &&
            ddp__proto_frame_size(c->in.data + c->in.off, ddp_buf_pending(&c->in), max) == 0) {
            struct ddp_rd r;
            uint32_t flen;
            ddp_rd_init(&r, c->in.data + c->in.off, 4);
            ddp_rd_u32(&r, &flen);
            size_t rest = (size_t)flen + 4 - ddp_buf_pending(&c->in);
            if (rest > want)
                want = rest;
        }
        if (want > budget)
            want = budget;
        if (ddp_buf_reserve(&c->in, want) < 0) {
            ddp__srv_close_later(c, "out of memory");
            return;
        }
        ssize_t n = recv(c->fd, c->in.data + c->in.len, c->in.cap - c->in.len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            DDP_INFO(STORE, "connection from '%s' failed: %s", c->peer, strerror(errno));
            ddp__srv_close_later(c, "read error");
            return;
        }
        if (n == 0) {
            if (ddp_buf_pending(&c->in) > 0)
                DDP_INFO(STORE, "client '%s' closed the connection mid-frame (%zu bytes pending)",
                         c->peer, ddp_buf_pending(&c->in));
            else
                DDP_DEBUG(STORE, "client '%s' closed the connection", c->peer);
            ddp__srv_close_later(c, "eof");
            return;
        }
        size_t asked = c->in.cap - c->in.len;
        c->in.len += (size_t)n;
        budget -= (size_t)n < budget ? (size_t)n : budget;
        if (conn_process(c) < 0)
            return;
        if (c->parked && ddp_buf_pending(&c->in) > PARKED_INPUT_MAX) {
            DDP__SRV_DROP_WARN(
                c,
                "dropping connection from '%s': more than %u bytes of requests behind a "
                "WAIT that is not answered yet",
                c->peer, PARKED_INPUT_MAX);
            STAT_ADD(s, conns_dropped, 1);
            ddp__srv_close_later(c, "too much pipelined behind a parked WAIT");
            return;
        }
        if (c->in.cap > (4u << 20) && ddp_buf_pending(&c->in) == 0)
            ddp_buf_release(&c->in);
        /* A short read drained the socket: epoll is level-triggered and will report more,
         * so another recv now would only return EAGAIN (one wasted syscall per request). */
        if ((size_t)n < asked)
            break;
    }
}

static void conn_io(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)fd;
    struct conn *c = arg;
    if (c->closing)
        return;
    if (mask & DDP_LOOP_WRITE)
        ddp__srv_flush(c);
    if ((mask & DDP_LOOP_READ) && c->close_after_write) {
        /* Hang-up or more input while the final reply is pending: just close. */
        ddp__srv_close_later(c, c->close_reason);
        return;
    }
    if ((mask & DDP_LOOP_READ) && !c->closing)
        conn_read(c);
}

static void format_peer(const struct sockaddr_storage *ss, socklen_t len, char *out, size_t n)
{
    char h[64], p[16];
    if (getnameinfo((const struct sockaddr *)ss, len, h, sizeof(h), p, sizeof(p),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        snprintf(out, n, "?");
    else if (ss->ss_family == AF_INET6)
        snprintf(out, n, "[%s]:%s", h, p);
    else
        snprintf(out, n, "%s:%s", h, p);
}

static void accept_resume(struct ddp_loop *loop, struct ddp_timer *t)
{
    struct server *s = DDP_CONTAINER_OF(t, struct server, accept_pause);
    ddp_loop_modify(loop, s->lfd, DDP_LOOP_READ);
}

/* Whether a TCPStore peer is one of the job's node addresses (an IPv4 address mapped into
 * IPv6 counts as the IPv4 one). */
static bool torch_peer_allowed(const struct server *s, const struct sockaddr_storage *ss,
                               socklen_t sl)
{
    char ip[INET6_ADDRSTRLEN];
    if (getnameinfo((const struct sockaddr *)ss, sl, ip, sizeof(ip), NULL, 0, NI_NUMERICHOST) != 0)
        return false;
    const char *a = strncmp(ip, "::ffff:", 7) == 0 && strchr(ip, '.') ? ip + 7 : ip;
    for (size_t i = 0; i < s->ntorch_allow; i++)
        if (strcmp(a, s->torch_allow[i]) == 0)
            return true;
    return false;
}

static void on_accept(struct ddp_loop *loop, int lfd, unsigned mask, void *arg)
{
    (void)mask;
    struct server *s = arg;
    struct ddp_log_limit *lim = &s->drop_log[lfd == s->tfd ? 1 : 0];
    for (int i = 0; i < 256; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of fds: stop accepting briefly rather than spin on a readable listener. */
                DDP_WARN_LIMITED(lim, STORE,
                                 "cannot accept a connection: %s; pausing accepts for 100 ms",
                                 strerror(errno));
                ddp_loop_modify(loop, lfd, 0);
                ddp_timer_start(loop, &s->accept_pause, 100);
            }
            return;
        }
        if (STAT_GET(s, conns_open) >= s->max_conns) {
            DDP_WARN_LIMITED(lim, STORE, "refusing connection: %u connections open (the limit)",
                             s->max_conns);
            STAT_ADD(s, conns_dropped, 1);
            close(fd);
            continue;
        }
        bool torch = lfd == s->tfd;
        if (torch && !torch_peer_allowed(s, &ss, sl)) {
            char peer[96];
            format_peer(&ss, sl, peer, sizeof(peer));
            DDP_WARN_LIMITED(lim, STORE,
                             "refusing a TCPStore connection from '%s': not an address it serves "
                             "(the job's nodes)",
                             peer);
            STAT_ADD(s, conns_dropped, 1);
            close(fd);
            continue;
        }
        struct conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->srv = s;
        c->fd = fd;
        c->id = ++s->next_conn_id;
        format_peer(&ss, sl, c->peer, sizeof(c->peer));
        ddp_buf_init(&c->in);
        ddp_buf_init(&c->out);
        ddp_list_init(&c->waiters);
        ddp_list_init(&c->watches);
        ddp_list_init(&c->held);
        ddp_list_init(&c->flush_link);
        ddp_list_init(&c->resume_link);
        ddp_timer_init(&c->auth_timer, auth_timeout);
        if (ddp_loop_add(loop, fd, DDP_LOOP_READ, conn_io, c) < 0) {
            close(fd);
            free(c);
            continue;
        }
        ddp_list_add_tail(&s->conns, &c->link);
        if (torch) { /* no handshake in PyTorch's protocol: the peer check above is all */
            c->torch = true;
            c->state = CONN_READY;
            c->torch_round = atomic_load(&s->torch_round);
        } else {
            ddp_timer_start(loop, &c->auth_timer, s->auth_timeout_ms);
        }
        STAT_ADD(s, conns_accepted, 1);
        STAT_ADD(s, conns_open, 1);
    }
}

/* End of every loop iteration: write queued replies, then tear down doomed connections. */
static void after_iteration(struct ddp_loop *loop, void *arg)
{
    (void)loop;
    struct server *s = arg;
    struct ddp_list *p, *t;
    /* Connections whose parked WAIT was answered go on with what they sent behind it. */
    while (!ddp_list_empty(&s->resumeq)) {
        struct conn *c = DDP_CONTAINER_OF(s->resumeq.next, struct conn, resume_link);
        ddp_list_del(&c->resume_link);
        if (!c->closing)
            conn_process(c);
    }
    DDP_LIST_FOREACH_SAFE (p, t, &s->flushq) {
        struct conn *c = DDP_CONTAINER_OF(p, struct conn, flush_link);
        ddp_list_del(&c->flush_link);
        if (!c->closing)
            ddp__srv_flush(c);
    }
    while (!ddp_list_empty(&s->closing)) {
        struct conn *c = DDP_CONTAINER_OF(s->closing.next, struct conn, link);
        DDP_DEBUG(STORE, "closing connection from '%s': %s", c->peer,
                  c->close_reason ? c->close_reason : "closed");
        conn_destroy(c);
    }
}

static void on_stop(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    (void)arg;
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof(v));
    (void)r;
    ddp_loop_stop(loop);
}

/* ------------------------------------------------------------------ */
/* Public API                                                         */
/* ------------------------------------------------------------------ */

/* A listening socket on host:port (port 0: a free one): *fd and the port chosen. */
static int open_listener(const char *host, int port, int *fd_out, int *port_out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL, *ai;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int gai = getaddrinfo(host, ps, &hints, &res);
    if (gai != 0) {
        DDP_ERROR(STORE, "cannot resolve listen address '%s': %s", host, gai_strerror(gai));
        return DDP_EINVAL;
    }
    int err = 0;
    for (ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof(ss);
            getsockname(fd, (struct sockaddr *)&ss, &sl);
            *port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                                 : ntohs(((struct sockaddr_in *)&ss)->sin_port);
            *fd_out = fd;
            freeaddrinfo(res);
            return 0;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    DDP_ERROR(STORE, "cannot listen on '%s:%d': %s", host, port, strerror(err));
    return DDP_ESYS;
}

static int listen_on(struct server *s, const char *host, int port)
{
    return open_listener(host, port, &s->lfd, &s->port);
}

int ddp_store_server_new(const struct ddp_store_server_opts *o, struct ddp_store_server **out)
{
    int r;
    if (!o || !o->token || o->token_len == 0 || o->token_len > 4096 || o->port < 0 ||
        o->port > 65535)
        return DDP_EINVAL;
    struct ddp_store_server *ss = calloc(1, sizeof(*ss));
    if (!ss)
        return DDP_ENOMEM;
    struct server *s = &ss->s;
    s->lfd = s->efd = s->tfd = -1;
    ddp_list_init(&s->watches);
    ddp_list_init(&s->conns);
    ddp_list_init(&s->closing);
    ddp_list_init(&s->resumeq);
    ddp_list_init(&s->flushq);
    ddp_timer_init(&s->accept_pause, accept_resume);
    s->max_conns = o->max_conns ? o->max_conns : 65536;
    s->auth_timeout_ms = o->auth_timeout_ms > 0 ? o->auth_timeout_ms : 10000;
    s->max_outbuf = o->max_outbuf ? o->max_outbuf : (256u << 20);
    s->lease_orphaned = o->lease_orphaned;
    s->orphan_arg = o->orphan_arg;
    r = DDP_ENOMEM;
    if (!(s->token = malloc(o->token_len)))
        goto fail;
    memcpy(s->token, o->token, o->token_len);
    s->toklen = o->token_len;
    if ((r = ddp_htab_init(&s->keys)) < 0 || (r = ddp_htab_init(&s->leases)) < 0)
        goto fail;
    if ((r = ddp_loop_new(&s->loop)) < 0)
        goto fail;
    ddp_raise_nofile();
    if ((r = listen_on(s, o->host ? o->host : "0.0.0.0", o->port)) < 0)
        goto fail;
    r = DDP_ESYS;
    if ((s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        goto fail;
    if ((r = ddp_loop_add(s->loop, s->lfd, DDP_LOOP_READ, on_accept, s)) < 0 ||
        (r = ddp_loop_add(s->loop, s->efd, DDP_LOOP_READ, on_stop, s)) < 0)
        goto fail;
    ddp_loop_set_after(s->loop, after_iteration, s);
    *out = ss;
    return 0;
fail:
    ddp_store_server_free(ss);
    return r;
}

int ddp_store_server_port(const struct ddp_store_server *srv)
{
    return srv->s.port;
}

int ddp_store_server_run(struct ddp_store_server *srv)
{
    return ddp_loop_run(srv->s.loop);
}

void ddp_store_server_stop(struct ddp_store_server *srv)
{
    uint64_t one = 1;
    ssize_t r = write(srv->s.efd, &one, sizeof(one));
    (void)r;
}

void ddp_store_server_free(struct ddp_store_server *srv)
{
    if (!srv)
        return;
    struct server *s = &srv->s;
    struct ddp_list *p, *t;
    if (s->loop) {
        DDP_LIST_FOREACH_SAFE (p, t, &s->conns) {
            conn_destroy(DDP_CONTAINER_OF(p, struct conn, link));
        }
        DDP_LIST_FOREACH_SAFE (p, t, &s->closing) {
            conn_destroy(DDP_CONTAINER_OF(p, struct conn, link));
        }
    }
    ddp__srv_data_free(s);
    ddp_htab_release(&s->keys);
    ddp_htab_release(&s->leases);
    if (s->lfd >= 0)
        close(s->lfd);
    if (s->tfd >= 0)
        close(s->tfd);
    for (size_t i = 0; i < s->ntorch_allow; i++)
        free(s->torch_allow[i]);
    free(s->torch_allow);
    if (s->efd >= 0)
        close(s->efd);
    ddp_loop_free(s->loop);
    ddp_freezero(s->token, s->toklen);
    free(srv);
}

void ddp_store_server_get_stats(const struct ddp_store_server *srv,
                                struct ddp_store_server_stats *st)
{
    const struct server *s = &srv->s;
    st->conns_accepted = STAT_GET(s, conns_accepted);
    st->conns_open = STAT_GET(s, conns_open);
    st->conns_refused_auth = STAT_GET(s, conns_refused_auth);
    st->conns_dropped = STAT_GET(s, conns_dropped);
    st->keys = STAT_GET(s, keys);
    st->waiters = STAT_GET(s, waiters);
    st->watches = STAT_GET(s, watches);
    st->leases = STAT_GET(s, leases);
    st->leases_expired = STAT_GET(s, leases_expired);
    st->requests = STAT_GET(s, requests);
}

int ddp_store_server_torch_listen(struct ddp_store_server *srv, const char *host, int port,
                                  const char *const *allow, size_t nallow, int *port_out)
{
    struct server *s = &srv->s;
    int r, tport = 0;
    if (s->tfd >= 0 || !allow || !port_out)
        return DDP_EINVAL;
    if (!(s->torch_allow = calloc(nallow + 1, sizeof(char *))))
        return DDP_ENOMEM;
    for (size_t i = 0; i < nallow; i++) {
        if (!(s->torch_allow[i] = strdup(allow[i])))
            return DDP_ENOMEM;
        s->ntorch_allow = i + 1;
    }
    if ((r = open_listener(host ? host : "0.0.0.0", port, &s->tfd, &tport)) < 0)
        return r;
    if ((r = ddp_loop_add(s->loop, s->tfd, DDP_LOOP_READ, on_accept, s)) < 0)
        return r;
    *port_out = tport;
    return 0;
}

void ddp_store_server_torch_round(struct ddp_store_server *srv, int round)
{
    atomic_store(&srv->s.torch_round, round);
}
