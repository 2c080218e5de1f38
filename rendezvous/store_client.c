/* The store's blocking client: a connection (connect with retries, handshake, framing), one
 * request in flight at a time, pushed events queued on the side. The operations are in
 * store_client_ops.c (see rendezvous/client.h). */
#include "rendezvous/client.h"
#include "common/buf.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/proto.h"
#include "rendezvous/store_etcd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

#define CLIENT_MAX_FRAME ((64u << 20) + 1024)

static int64_t deadline_after(int ms)
{
    return ms < 0 ? INT64_MAX : ddp_now_ms() + ms;
}

static int remaining(int64_t deadline)
{
    if (deadline == INT64_MAX)
        return -1;
    int64_t r = deadline - ddp_now_ms();
    return r < 0 ? 0 : r > INT32_MAX ? INT32_MAX : (int)r;
}

/* After a timeout or IO failure the stream position is unknown: never reuse it. */
static void mark_broken(struct ddp_store *s)
{
    pthread_mutex_lock(&s->fdmu);
    if (s->fd >= 0) {
        close(s->fd);
        s->fd = -1;
    }
    pthread_mutex_unlock(&s->fdmu);
}

void ddp_store_interrupt(struct ddp_store *s)
{
    if (s->etcd) {
        ddp__se_interrupt(s->etcd);
        return;
    }
    atomic_store(&s->interrupted, true);
    pthread_mutex_lock(&s->fdmu);
    if (s->fd >= 0)
        shutdown(s->fd, SHUT_RDWR); /* a blocked recv returns 0; the fd stays its owner's */
    pthread_mutex_unlock(&s->fdmu);
}

static int send_out(struct ddp_store *s, int64_t deadline)
{
    while (ddp_buf_pending(&s->out) > 0) {
        ssize_t w = send(s->fd, s->out.data + s->out.off, ddp_buf_pending(&s->out),
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w >= 0) {
            s->out.off += (size_t)w;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            DDP_ERROR(STORE, "cannot send to store '%s': %s", s->addr, strerror(errno));
            return DDP_ECLOSED;
        }
        struct pollfd p = {.fd = s->fd, .events = POLLOUT};
        int pr = poll(&p, 1, remaining(deadline));
        if (pr == 0)
            return DDP_ETIMEDOUT;
        if (pr < 0 && errno != EINTR)
            return DDP_ESYS;
    }
    s->out.off = s->out.len = 0;
    return 0;
}

/*
 * Bounds the next blocking recv by the time left. The socket is blocking with
 * SO_RCVTIMEO, so a request costs one send and one recv; the option is only
 * changed when the time left leaves [timeout/2, timeout], which for a stream
 * of calls with the same deadline length is never.
 */
static void arm_rcvtimeo(struct ddp_store *s, int rem)
{
    if (rem < 0)
        rem = 0; /* no deadline: block for ever */
    bool fits = rem == 0 ? s->rcvtimeo_ms == 0
                         : s->rcvtimeo_ms > 0 && s->rcvtimeo_ms <= rem && s->rcvtimeo_ms >= rem / 2;
    if (fits)
        return;
    struct timeval tv = {rem / 1000, (rem % 1000) * 1000};
    if (setsockopt(s->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0)
        s->rcvtimeo_ms = rem;
}

/* Returns the next whole frame from the stream, pointing into s->in (valid until the next read). */
static int read_frame(struct ddp_store *s, int64_t deadline, const uint8_t **frame, size_t *len)
{
    for (;;) {
        long fs = ddp__proto_frame_size(s->in.data + s->in.off, ddp_buf_pending(&s->in),
                                        CLIENT_MAX_FRAME);
        if (fs < 0) {
            DDP_ERROR(STORE, "bad frame from store '%s': %s", s->addr, ddp_strerror((int)fs));
            return DDP_EPROTO;
        }
        if (fs > 0) {
            *frame = s->in.data + s->in.off;
            *len = (size_t)fs;
            s->in.off += (size_t)fs;
            return 0;
        }
        ddp_buf_compact(&s->in);
        if (ddp_buf_reserve(&s->in, 64u << 10) < 0)
            return DDP_ENOMEM;
        /* Past the deadline, one non-blocking look still picks up what has arrived. */
        int rem = remaining(deadline), flags = 0;
        if (rem == 0 && deadline != INT64_MAX)
            flags = MSG_DONTWAIT;
        else
            arm_rcvtimeo(s, rem);
        ssize_t n = recv(s->fd, s->in.data + s->in.len, s->in.cap - s->in.len, flags);
        if (n > 0) {
            s->in.len += (size_t)n;
            continue;
        }
        if (n == 0) {
            if (!atomic_load(&s->interrupted))
                DDP_ERROR(STORE, "store '%s' closed the connection", s->addr);
            return DDP_ECLOSED;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            DDP_ERROR(STORE, "cannot read from store '%s': %s", s->addr, strerror(errno));
            return DDP_ECLOSED;
        }
        if (flags & MSG_DONTWAIT)
            return DDP_ETIMEDOUT;
        /* SO_RCVTIMEO expired: loop to re-check the deadline. */
    }
}

static int queue_event(struct ddp_store *s, uint32_t wid, struct ddp_rd *r)
{
    uint8_t kind;
    const uint8_t *k, *v;
    uint32_t kl, vl;
    if (ddp_rd_u8(r, &kind) < 0 || ddp_rd_str(r, DDP__MAX_KEY, &k, &kl) < 0 ||
        ddp_rd_str(r, DDP__MAX_VALUE, &v, &vl) < 0 || kind < 1 || kind > 4)
        return DDP_EPROTO;
    struct ddp_store_event *ev = calloc(1, sizeof(*ev));
    struct evnode *n = malloc(sizeof(*n));
    if (ev) {
        ev->key = malloc((size_t)kl + 1);
        ev->value = malloc((size_t)vl + 1);
    }
    if (!ev || !n || !ev->key || !ev->value) {
        ddp_store_event_free(ev);
        free(n);
        return DDP_ENOMEM;
    }
    ev->kind = (enum ddp_store_event_kind)kind;
    ev->watch_id = wid;
    memcpy(ev->key, k, kl);
    ev->key[kl] = '\0';
    memcpy(ev->value, v, vl);
    ((char *)ev->value)[vl] = '\0';
    ev->value_len = vl;
    n->ev = ev;
    n->next = NULL;
    if (s->ev_tail)
        s->ev_tail->next = n;
    else
        s->ev_head = n;
    s->ev_tail = n;
    return 0;
}

/*
 * Reads frames until the reply to (op, id) arrives, queueing pushed events.
 * Returns 0 with the server's status in *status and *rd covering the payload
 * after it, or a transport error (the stream is then out of sync).
 */
static int await_reply(struct ddp_store *s, uint8_t op, uint32_t id, int64_t deadline,
                       struct ddp_rd *rd, int *status)
{
    for (;;) {
        const uint8_t *f;
        size_t len;
        int r = read_frame(s, deadline, &f, &len);
        if (r < 0)
            return r;
        struct ddp_rd fr;
        uint32_t flen, fid, st;
        uint8_t fop;
        ddp_rd_init(&fr, f, len);
        ddp_rd_u32(&fr, &flen);
        if (ddp_rd_u8(&fr, &fop) < 0 || ddp_rd_u32(&fr, &fid) < 0)
            return DDP_EPROTO;
        if (fop == DDP__OP_EVENT) {
            if ((r = queue_event(s, fid, &fr)) < 0)
                return r;
            continue;
        }
        if (fop != (op | DDP__REPLY_BIT) || fid != id || ddp_rd_u32(&fr, &st) < 0) {
            DDP_ERROR(STORE,
                      "unexpected frame from store '%s' (op 0x%02x id %u, wanted 0x%02x id %u)",
                      s->addr, fop, fid, op | DDP__REPLY_BIT, id);
            return DDP_EPROTO;
        }
        *rd = fr;
        *status = (int32_t)st;
        return 0;
    }
}

/* Starts a request in s->out. */
size_t ddp__cl_req_begin(struct ddp_store *s, uint8_t op, uint32_t *id)
{
    s->out.off = s->out.len = 0;
    *id = ++s->next_id;
    return ddp__proto_begin(&s->out, op, *id);
}

/* Sends the request and waits for its reply; transport failures break the connection. */
int ddp__cl_roundtrip(struct ddp_store *s, size_t pos, uint8_t op, uint32_t id, int64_t deadline,
                      struct ddp_rd *rd)
{
    int r, status = 0;
    if (s->fd < 0)
        return DDP_ECLOSED;
    ddp__proto_end(&s->out, pos);
    if ((r = send_out(s, deadline)) < 0 ||
        (r = await_reply(s, op, id, deadline, rd, &status)) < 0) {
        /* A transport failure leaves the stream position unknown: drop the connection.
         * A status from the server (even DDP_ETIMEDOUT for a WAIT) leaves it in sync. */
        if (r == DDP_ETIMEDOUT)
            DDP_ERROR(STORE, "store '%s' did not answer op 0x%02x in time", s->addr, op);
        mark_broken(s);
        return r;
    }
    return status;
}

/* 0, DDP_EINVAL for a NULL key, or DDP_ETOOBIG past the key limit. */
int ddp__cl_check_key(const char *key, size_t *kl)
{
    if (!key)
        return DDP_EINVAL;
    *kl = strlen(key);
    return *kl <= DDP__MAX_KEY ? 0 : DDP_ETOOBIG;
}

/* Starts a request whose body opens with the key. */
int ddp__cl_req_begin_key(struct ddp_store *s, uint8_t op, const char *key, uint32_t *id,
                          size_t *pos)
{
    size_t kl;
    int r;
    if ((r = ddp__cl_check_key(key, &kl)) < 0)
        return r;
    *pos = ddp__cl_req_begin(s, op, id);
    return ddp_buf_put_str(&s->out, key, kl);
}

/* roundtrip with the client's default deadline. */
int ddp__cl_call(struct ddp_store *s, size_t pos, uint8_t op, uint32_t id, struct ddp_rd *rd)
{
    return ddp__cl_roundtrip(s, pos, op, id, deadline_after(s->timeout_ms), rd);
}

/* ------------------------------------------------------------------ */
/* Connect and handshake                                              */
/* ------------------------------------------------------------------ */

static int connect_once(const struct addrinfo *ai, int64_t deadline, int *out, int *err)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return DDP_ESYS;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            *err = errno;
            close(fd);
            return DDP_ECONNECT;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int rem = remaining(deadline);
        int pr;
        do
            pr = poll(&p, 1, rem < 0 || rem > 2000 ? 2000 : rem);
        while (pr < 0 && errno == EINTR);
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (pr <= 0) {
            *err = ETIMEDOUT;
            close(fd);
            return DDP_ECONNECT;
        }
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr) {
            *err = soerr;
            close(fd);
            return DDP_ECONNECT;
        }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* From here on: blocking reads bounded by SO_RCVTIMEO, sends with MSG_DONTWAIT. */
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *out = fd;
    return 0;
}

static int handshake(struct ddp_store *s, const uint8_t *token, size_t toklen, int64_t deadline)
{
    uint8_t cn[DDP__NONCE_LEN], mac[DDP__MAC_LEN], want[DDP__MAC_LEN];
    const uint8_t *sn, *smac;
    struct ddp_rd rd;
    uint32_t id, magic;
    uint16_t ver, resv;
    int r;
    if ((r = ddp_random_bytes(cn, sizeof(cn))) < 0)
        return r;
    size_t pos = ddp__cl_req_begin(s, DDP__OP_HELLO, &id);
    ddp_buf_put_u32(&s->out, DDP__PROTO_MAGIC);
    ddp_buf_put_u16(&s->out, DDP__PROTO_VERSION);
    ddp_buf_put_u16(&s->out, 0);
    ddp_buf_put(&s->out, cn, sizeof(cn));
    r = ddp__cl_roundtrip(s, pos, DDP__OP_HELLO, id, deadline, &rd);
    if (r == DDP_EVERSION) {
        uint16_t sv = 0;
        ddp_rd_u16(&rd, &sv);
        DDP_ERROR(STORE, "store '%s' speaks protocol version %u, this client speaks %u", s->addr,
                  sv, DDP__PROTO_VERSION);
        return r;
    }
    if (r < 0)
        return r;
    if (ddp_rd_u32(&rd, &magic) < 0 || ddp_rd_u16(&rd, &ver) < 0 || ddp_rd_u16(&rd, &resv) < 0 ||
        ddp_rd_raw(&rd, DDP__NONCE_LEN, &sn) < 0 || magic != DDP__PROTO_MAGIC) {
        DDP_ERROR(STORE, "'%s' is not a ddprun store (bad handshake reply)", s->addr);
        return DDP_EPROTO;
    }
    uint8_t snonce[DDP__NONCE_LEN];
    memcpy(snonce, sn, sizeof(snonce));
    if ((r = ddp__proto_mac(token, toklen, DDP__LABEL_CLIENT, snonce, cn, mac)) < 0)
        return r;
    pos = ddp__cl_req_begin(s, DDP__OP_AUTH, &id);
    ddp_buf_put(&s->out, mac, sizeof(mac));
    r = ddp__cl_roundtrip(s, pos, DDP__OP_AUTH, id, deadline, &rd);
    if (r == DDP_EAUTH) {
        DDP_ERROR(STORE, "store '%s' refused the job token", s->addr);
        return r;
    }
    if (r < 0)
        return r;
    if (ddp_rd_raw(&rd, DDP__MAC_LEN, &smac) < 0 ||
        (r = ddp__proto_mac(token, toklen, DDP__LABEL_SERVER, cn, snonce, want)) < 0 ||
        !ddp__proto_mac_equal(want, smac)) {
        DDP_ERROR(STORE, "store '%s' could not prove it holds the job token", s->addr);
        return DDP_EAUTH;
    }
    return 0;
}

int ddp_store_connect(const char *host, int port, const void *token, size_t toklen, int timeout_ms,
                      struct ddp_store **out)
{
    struct ddp_store *s = NULL;
    struct addrinfo *res = NULL;
    int r, err = 0;
    if (!host || port <= 0 || port > 65535 || !token || toklen == 0 || !out)
        return DDP_EINVAL;
    int64_t deadline = deadline_after(timeout_ms);
    if (!(s = calloc(1, sizeof(*s))))
        return DDP_ENOMEM;
    s->fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->fdmu, NULL);
    ddp_buf_init(&s->in);
    ddp_buf_init(&s->out);
    const char *env = getenv("DDP_STORE_TIMEOUT_MS");
    s->timeout_ms = env && atoi(env) > 0 ? atoi(env) : 300000;
    if (strchr(host, ':'))
        snprintf(s->addr, sizeof(s->addr), "[%s]:%d", host, port);
    else
        snprintf(s->addr, sizeof(s->addr), "%s:%d", host, port);

    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int gai = getaddrinfo(host, ps, &hints, &res);
    if (gai != 0) {
        DDP_ERROR(STORE, "cannot resolve store host '%s': %s", host, gai_strerror(gai));
        r = DDP_ECONNECT;
        goto fail;
    }
    /* Refused or unreachable: the store may not be up yet. Back off and retry. */
    int backoff = 10;
    for (;;) {
        r = DDP_ECONNECT;
        for (struct addrinfo *ai = res; ai && r < 0; ai = ai->ai_next)
            r = connect_once(ai, deadline, &s->fd, &err);
        if (r == 0)
            break;
        int rem = remaining(deadline);
        if (rem == 0) {
            DDP_ERROR(STORE, "cannot connect to store '%s': %s", s->addr, strerror(err));
            r = DDP_ECONNECT;
            goto fail;
        }
        unsigned jitter;
        ddp_random_bytes(&jitter, sizeof(jitter));
        int sleep_ms = backoff / 2 + (int)(jitter % (unsigned)(backoff / 2 + 1));
        if (rem >= 0 && sleep_ms > rem)
            sleep_ms = rem;
        struct timespec ts = {sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (backoff < 1000)
            backoff *= 2;
    }
    if ((r = handshake(s, token, toklen, deadline)) < 0)
        goto fail;
    freeaddrinfo(res);
    *out = s;
    return 0;
fail:
    if (res)
        freeaddrinfo(res);
    ddp_store_close(s);
    return r;
}

int ddp__store_from_etcd(struct ddp__se *se, struct ddp_store **out)
{
    struct ddp_store *s = calloc(1, sizeof(*s));
    if (!s)
        return DDP_ENOMEM;
    s->fd = -1;
    s->etcd = se;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->fdmu, NULL);
    ddp_buf_init(&s->in);
    ddp_buf_init(&s->out);
    snprintf(s->addr, sizeof(s->addr), "etcd");
    *out = s;
    return 0;
}

void ddp_store_close(struct ddp_store *s)
{
    if (!s)
        return;
    ddp__se_close(s->etcd);
    mark_broken(s);
    while (s->ev_head) {
        struct evnode *n = s->ev_head;
        s->ev_head = n->next;
        ddp_store_event_free(n->ev);
        free(n);
    }
    ddp_buf_release(&s->in);
    ddp_buf_release(&s->out);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->fdmu);
    free(s);
}

int ddp__store_take_fd(struct ddp_store *s)
{
    if (!s || s->etcd || s->fd < 0)
        return -1;
    int fd = s->fd;
    s->fd = -1;
    ddp_store_close(s);
    return fd;
}

int ddp_store_local_addr(struct ddp_store *s, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int r = DDP_ECLOSED;
    if (s->etcd)
        return LOCKED(s, ddp__se_local_addr(s->etcd, buf, len));
    pthread_mutex_lock(&s->mu);
    if (s->fd >= 0 && getsockname(s->fd, (struct sockaddr *)&ss, &sl) == 0 &&
        getnameinfo((struct sockaddr *)&ss, sl, buf, (socklen_t)len, NULL, 0, NI_NUMERICHOST) == 0)
        r = 0;
    pthread_mutex_unlock(&s->mu);
    return r;
}

void ddp_store_set_timeout(struct ddp_store *s, int timeout_ms)
{
    pthread_mutex_lock(&s->mu);
    s->timeout_ms = timeout_ms;
    if (s->etcd)
        ddp__se_set_timeout(s->etcd, timeout_ms);
    pthread_mutex_unlock(&s->mu);
}

static int do_next_event(struct ddp_store *s, int timeout_ms, struct ddp_store_event **ev)
{
    int64_t deadline = deadline_after(timeout_ms);
    while (!s->ev_head) {
        if (s->fd < 0)
            return DDP_ECLOSED;
        const uint8_t *f;
        size_t len;
        int r = read_frame(s, deadline, &f, &len);
        if (r == DDP_ETIMEDOUT)
            return r; /* no partial frame was consumed: the stream is still in sync */
        if (r < 0) {
            mark_broken(s);
            return r;
        }
        struct ddp_rd fr;
        uint32_t flen, fid;
        uint8_t fop;
        ddp_rd_init(&fr, f, len);
        ddp_rd_u32(&fr, &flen);
        if (ddp_rd_u8(&fr, &fop) < 0 || ddp_rd_u32(&fr, &fid) < 0 || fop != DDP__OP_EVENT ||
            (r = queue_event(s, fid, &fr)) < 0) {
            mark_broken(s);
            return DDP_EPROTO;
        }
    }
    struct evnode *n = s->ev_head;
    s->ev_head = n->next;
    if (!s->ev_head)
        s->ev_tail = NULL;
    *ev = n->ev;
    free(n);
    return 0;
}

int ddp_store_next_event(struct ddp_store *s, int timeout_ms, struct ddp_store_event **ev)
{
    if (s->etcd)
        return ddp__se_next_event(s->etcd, timeout_ms, ev);
    return LOCKED(s, do_next_event(s, timeout_ms, ev));
}
