/* The store server: one thread, one epoll loop, whole frames only, replies queued and drained on
 * EPOLLOUT. */
#include "rendezvous/store.h"
#include "common/err.h"
#include "common/htab.h"
#include "common/list.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/loop.h"
#include "rendezvous/proto.h"

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
#define MAX_REPLY (64u << 20)
#define MAX_WATCHES_PER_CONN 1024

enum conn_state { CONN_HELLO, CONN_AUTH, CONN_READY };

/*
 * Counters behind ddp_store_server_get_stats. Only the loop thread writes
 * them, so an update is a relaxed load and store (no locked instruction);
 * other threads read them with relaxed loads.
 */
struct stats {
    _Atomic uint64_t conns_accepted, conns_open, conns_refused_auth, conns_dropped;
    _Atomic uint64_t keys, waiters, watches, leases, leases_expired;
};
#define STAT_ADD(s, field, d)                                                                      \
    atomic_store_explicit(&(s)->st.field,                                                          \
                          atomic_load_explicit(&(s)->st.field, memory_order_relaxed) + (d),        \
                          memory_order_relaxed)
#define STAT_GET(s, field) atomic_load_explicit(&(s)->st.field, memory_order_relaxed)

struct server;

struct conn {
    struct server *srv;
    int fd;
    uint64_t id;
    enum conn_state state;
    char peer[96];
    uint8_t snonce[DDP__NONCE_LEN];
    uint8_t cnonce[DDP__NONCE_LEN];
    struct ddp_buf in;
    struct ddp_buf out;
    struct ddp_timer auth_timer;
    struct ddp_list link;       /* srv->conns, or srv->closing once doomed */
    struct ddp_list flush_link; /* srv->flushq while it has unsent output */
    struct ddp_list waiters;
    struct ddp_list watches;
    unsigned nwatches;
    /* A WAIT of this connection not answered yet: its later requests wait behind it, so that
     * replies come in order (ddprun-store(7)); resumed after the iteration it is answered in. */
    struct waiter *parked;
    struct ddp_list resume_link; /* srv->resumeq */
    bool closing;                /* scheduled for teardown at the end of this iteration */
    bool close_after_write;      /* flush what is queued, then close */
    const char *close_reason;
};

struct entry {
    struct ddp_hnode h;
    uint8_t *key;
    uint32_t klen;
    uint8_t *val;
    uint32_t vlen;
    bool present;
    struct lease *lease;
    struct ddp_list lease_link;
    struct ddp_list waiters; /* struct wlink */
};

/* A WAIT is linked to every key it names, present or not, and counts those absent now: a key
 * deleted or expired after it was set counts as missing again. It is answered when the count
 * reaches 0, that is when every key exists at that moment. */
struct waiter;
struct wlink {
    struct ddp_list node; /* entry.waiters */
    struct waiter *w;
    struct entry *e;
    bool present; /* what this link last counted */
};

struct waiter {
    struct conn *c;
    uint32_t reqid;
    uint32_t missing;
    struct ddp_timer timer;
    struct ddp_list conn_link;
    struct waiter *ready_next; /* while being answered after a SET */
    uint32_t nlinks;
    struct wlink links[];
};

struct watch {
    struct conn *c;
    uint32_t id;
    bool prefix;
    uint8_t *key;
    uint32_t klen;
    struct ddp_list srv_link;
    struct ddp_list conn_link;
};

struct lease {
    struct ddp_hnode h;
    uint64_t id;
    uint8_t idbytes[8];
    uint32_t ttl_ms;
    struct ddp_timer timer;
    struct ddp_list keys; /* struct entry.lease_link */
    struct server *srv;
};

struct server {
    struct ddp_loop *loop;
    int lfd;
    int efd;
    int port;
    uint8_t *token;
    size_t toklen;
    unsigned max_conns;
    int auth_timeout_ms;
    size_t max_outbuf;
    struct ddp_htab keys;
    struct ddp_htab leases;
    struct ddp_list watches;
    struct ddp_list conns;
    struct ddp_list closing;
    struct ddp_list flushq;
    struct ddp_list resumeq; /* connections whose parked WAIT was answered */
    struct ddp_timer accept_pause;
    uint64_t next_conn_id;
    uint32_t next_watch_id;
    int64_t last_refuse_log_ms;
    struct stats st;
};

/* The public name is the opaque struct ddp_store_server. */
struct ddp_store_server {
    struct server s;
};

/* ------------------------------------------------------------------ */
/* Connection output and teardown                                     */
/* ------------------------------------------------------------------ */

static void conn_schedule_close(struct conn *c, const char *reason)
{
    if (c->closing)
        return;
    c->closing = true;
    c->close_reason = reason;
    ddp_list_del(&c->link);
    ddp_list_add_tail(&c->srv->closing, &c->link);
}

/* Marks the connection as having output; the after-hook writes it. */
static void conn_want_flush(struct conn *c)
{
    if (ddp_list_empty(&c->flush_link))
        ddp_list_add_tail(&c->srv->flushq, &c->flush_link);
    if (ddp_buf_pending(&c->out) > c->srv->max_outbuf && !c->closing) {
        DDP_WARN(STORE, "dropping connection from '%s': %zu bytes of replies unread (slow client)",
                 c->peer, ddp_buf_pending(&c->out));
        STAT_ADD(c->srv, conns_dropped, 1);
        conn_schedule_close(c, "slow client: output backlog over the limit");
    }
}

static size_t reply_begin(struct conn *c, uint8_t op, uint32_t id, int status)
{
    size_t pos = ddp__proto_begin(&c->out, (uint8_t)(op | DDP__REPLY_BIT), id);
    ddp_buf_put_u32(&c->out, (uint32_t)status);
    return pos;
}

static void reply_end(struct conn *c, size_t pos)
{
    ddp__proto_end(&c->out, pos);
    conn_want_flush(c);
}

static void reply_status(struct conn *c, uint8_t op, uint32_t id, int status)
{
    reply_end(c, reply_begin(c, op, id, status));
}

static void conn_io(struct ddp_loop *loop, int fd, unsigned mask, void *arg);

/* Writes as much queued output as the socket takes; arms EPOLLOUT for the rest. */
static void conn_flush(struct conn *c)
{
    while (ddp_buf_pending(&c->out) > 0) {
        ssize_t w = send(c->fd, c->out.data + c->out.off, ddp_buf_pending(&c->out), MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            conn_schedule_close(c, "write failed");
            return;
        }
        c->out.off += (size_t)w;
    }
    if (ddp_buf_pending(&c->out) == 0) {
        c->out.off = c->out.len = 0;
        /* Give back a large buffer once it drains (a big GET reply, say). */
        if (c->out.cap > (4u << 20))
            ddp_buf_release(&c->out);
        ddp_loop_modify(c->srv->loop, c->fd, DDP_LOOP_READ);
        if (c->close_after_write)
            conn_schedule_close(c, c->close_reason);
    } else {
        ddp_buf_compact(&c->out);
        /* A connection on its way out reads nothing more. */
        ddp_loop_modify(c->srv->loop, c->fd,
                        c->close_after_write ? DDP_LOOP_WRITE : DDP_LOOP_READ | DDP_LOOP_WRITE);
    }
}

static void entry_maybe_free(struct server *s, struct entry *e);
static void waiter_free(struct waiter *w);

static void watch_free(struct watch *w)
{
    STAT_ADD(w->c->srv, watches, (uint64_t)-1);
    w->c->nwatches--;
    ddp_list_del(&w->srv_link);
    ddp_list_del(&w->conn_link);
    free(w->key);
    free(w);
}

/* Final teardown: runs from the after-hook, never while a callback can still reach c. */
static void conn_destroy(struct conn *c)
{
    struct server *s = c->srv;
    struct ddp_list *p, *t;
    DDP_LIST_FOREACH_SAFE (p, t, &c->waiters) {
        waiter_free(DDP_CONTAINER_OF(p, struct waiter, conn_link));
    }
    DDP_LIST_FOREACH_SAFE (p, t, &c->watches) {
        watch_free(DDP_CONTAINER_OF(p, struct watch, conn_link));
    }
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
/* Keys, waiters, watchers                                            */
/* ------------------------------------------------------------------ */

static struct entry *entry_find(struct server *s, const uint8_t *key, uint32_t klen)
{
    struct ddp_hnode *n = ddp_htab_find(&s->keys, key, klen);
    return n ? DDP_CONTAINER_OF(n, struct entry, h) : NULL;
}

static struct entry *entry_get(struct server *s, const uint8_t *key, uint32_t klen)
{
    struct entry *e = entry_find(s, key, klen);
    if (e)
        return e;
    if (!(e = calloc(1, sizeof(*e))) || !(e->key = malloc(klen ? klen : 1))) {
        free(e);
        return NULL;
    }
    memcpy(e->key, key, klen);
    e->klen = klen;
    e->h.key = e->key;
    e->h.klen = klen;
    ddp_list_init(&e->lease_link);
    ddp_list_init(&e->waiters);
    ddp_htab_insert(&s->keys, &e->h);
    return e;
}

static void entry_maybe_free(struct server *s, struct entry *e)
{
    if (e->present || !ddp_list_empty(&e->waiters))
        return;
    ddp_htab_remove(&s->keys, &e->h);
    free(e->key);
    free(e->val);
    free(e);
}

static void notify(struct server *s, enum ddp_store_event_kind kind, const struct entry *e)
{
    struct ddp_list *p;
    for (p = s->watches.next; p != &s->watches; p = p->next) {
        struct watch *w = DDP_CONTAINER_OF(p, struct watch, srv_link);
        if (w->c->closing)
            continue;
        if (w->prefix ? (e->klen < w->klen || memcmp(e->key, w->key, w->klen) != 0)
                      : (e->klen != w->klen || memcmp(e->key, w->key, w->klen) != 0))
            continue;
        size_t pos = ddp__proto_begin(&w->c->out, DDP__OP_EVENT, w->id);
        ddp_buf_put_u8(&w->c->out, (uint8_t)kind);
        ddp_buf_put_str(&w->c->out, e->key, e->klen);
        if (kind == DDP_STORE_EV_SET)
            ddp_buf_put_str(&w->c->out, e->val, e->vlen);
        else
            ddp_buf_put_str(&w->c->out, "", 0);
        ddp__proto_end(&w->c->out, pos);
        /* Closing is deferred to the after-hook, so this list stays intact. */
        conn_want_flush(w->c);
    }
}

static void waiter_free(struct waiter *w)
{
    struct conn *c = w->c;
    struct server *s = c->srv;
    ddp_timer_stop(s->loop, &w->timer);
    ddp_list_del(&w->conn_link);
    for (uint32_t i = 0; i < w->nlinks; i++) {
        struct entry *e = w->links[i].e;
        ddp_list_del(&w->links[i].node);
        w->links[i].e = NULL;
        entry_maybe_free(s, e);
    }
    if (c->parked == w) {
        /* Its later requests go on, after this iteration (we may be deep in another
         * connection's request here). */
        c->parked = NULL;
        if (!c->closing && c->resume_link.next == &c->resume_link)
            ddp_list_add_tail(&s->resumeq, &c->resume_link);
    }
    STAT_ADD(s, waiters, (uint64_t)-1);
    free(w);
}

/* Key e's presence changed: recount its waiters, and answer those with nothing missing. The
 * ready ones are collected first, so that no waiter is freed while the list is walked. */
static void key_presence_changed(struct entry *e)
{
    struct waiter *ready = NULL;
    struct ddp_list *p;
    for (p = e->waiters.next; p != &e->waiters; p = p->next) {
        struct wlink *l = DDP_CONTAINER_OF(p, struct wlink, node);
        struct waiter *w = l->w;
        if (l->present == e->present)
            continue;
        l->present = e->present;
        if (!e->present) {
            w->missing++;
        } else if (--w->missing == 0) {
            w->ready_next = ready;
            ready = w;
        }
    }
    while (ready) {
        struct waiter *w = ready;
        ready = w->ready_next;
        reply_status(w->c, DDP__OP_WAIT, w->reqid, 0);
        waiter_free(w);
    }
}

static void waiter_timeout(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    struct waiter *w = DDP_CONTAINER_OF(t, struct waiter, timer);
    reply_status(w->c, DDP__OP_WAIT, w->reqid, DDP_ETIMEDOUT);
    waiter_free(w);
}

static void lease_unbind(struct entry *e)
{
    ddp_list_del(&e->lease_link);
    e->lease = NULL;
}

/* Stores a value; takes ownership of val. */
static void entry_set(struct server *s, struct entry *e, uint8_t *val, uint32_t vlen)
{
    free(e->val);
    e->val = val;
    e->vlen = vlen;
    bool appeared = !e->present;
    if (appeared) {
        e->present = true;
        STAT_ADD(s, keys, 1);
    }
    notify(s, DDP_STORE_EV_SET, e);
    if (appeared)
        key_presence_changed(e);
}

static void entry_delete(struct server *s, struct entry *e, enum ddp_store_event_kind why)
{
    if (!e->present)
        return;
    if (e->lease)
        lease_unbind(e);
    e->present = false;
    STAT_ADD(s, keys, (uint64_t)-1);
    notify(s, why, e);
    key_presence_changed(e); /* its waiters count it missing again */
    free(e->val);
    e->val = NULL;
    e->vlen = 0;
    entry_maybe_free(s, e);
}

static uint8_t *dup_bytes(const uint8_t *p, uint32_t n)
{
    uint8_t *d = malloc(n ? n : 1);
    if (d && n)
        memcpy(d, p, n);
    return d;
}

/* ------------------------------------------------------------------ */
/* Leases                                                             */
/* ------------------------------------------------------------------ */

static struct lease *lease_find(struct server *s, uint64_t id)
{
    uint8_t k[8];
    for (int i = 0; i < 8; i++)
        k[i] = (uint8_t)(id >> (8 * i));
    struct ddp_hnode *n = ddp_htab_find(&s->leases, k, 8);
    return n ? DDP_CONTAINER_OF(n, struct lease, h) : NULL;
}

static void lease_end(struct server *s, struct lease *l)
{
    struct ddp_list *p, *t;
    ddp_timer_stop(s->loop, &l->timer);
    DDP_LIST_FOREACH_SAFE (p, t, &l->keys) {
        entry_delete(s, DDP_CONTAINER_OF(p, struct entry, lease_link), DDP_STORE_EV_EXPIRE);
    }
    ddp_htab_remove(&s->leases, &l->h);
    STAT_ADD(s, leases, (uint64_t)-1);
    free(l);
}

static void lease_expired(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    struct lease *l = DDP_CONTAINER_OF(t, struct lease, timer);
    struct server *s = l->srv;
    STAT_ADD(s, leases_expired, 1);
    DDP_INFO(STORE, "lease %016" PRIx64 " expired after %u ms without a keepalive", l->id,
             l->ttl_ms);
    lease_end(s, l);
}

/* ------------------------------------------------------------------ */
/* Requests                                                           */
/* ------------------------------------------------------------------ */

/* A stored value ADD accepts: an optional '-' and 1 to 19 decimal digits (leading zeros
 * allowed), nothing else (no '+', no spaces), within int64. */
static int parse_i64(const uint8_t *p, uint32_t n, int64_t *out)
{
    char tmp[24];
    uint32_t d = n && p[0] == '-';
    if (n <= d || n - d > 19 || n >= sizeof(tmp))
        return DDP_ENOTINT;
    for (uint32_t i = d; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return DDP_ENOTINT;
    memcpy(tmp, p, n);
    tmp[n] = '\0';
    errno = 0;
    long long v = strtoll(tmp, NULL, 10);
    if (errno)
        return DDP_ENOTINT;
    *out = v;
    return 0;
}

static void op_set(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    struct lease *l = NULL;
    if (q->u64 && !(l = lease_find(s, q->u64))) {
        reply_status(c, q->op, q->id, DDP_ENOLEASE);
        return;
    }
    struct entry *e = entry_get(s, q->key, q->klen);
    uint8_t *v = dup_bytes(q->val, q->vlen);
    if (!e || !v) {
        free(v);
        if (e)
            entry_maybe_free(s, e);
        reply_status(c, q->op, q->id, DDP_ENOMEM);
        return;
    }
    if (e->lease != l) {
        if (e->lease)
            lease_unbind(e);
        if (l) {
            e->lease = l;
            ddp_list_add_tail(&l->keys, &e->lease_link);
        }
    }
    entry_set(s, e, v, q->vlen);
    reply_status(c, q->op, q->id, 0);
}

static void op_get(struct conn *c, const struct ddp__req *q)
{
    struct entry *e = entry_find(c->srv, q->key, q->klen);
    if (!e || !e->present) {
        reply_status(c, q->op, q->id, DDP_ENOKEY);
        return;
    }
    size_t pos = reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_str(&c->out, e->val, e->vlen);
    reply_end(c, pos);
}

static void op_add(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    struct entry *e = entry_find(s, q->key, q->klen);
    int64_t cur = 0, res;
    int r;
    if (e && e->present && (r = parse_i64(e->val, e->vlen, &cur)) < 0) {
        reply_status(c, q->op, q->id, r);
        return;
    }
    if (__builtin_add_overflow(cur, q->i64, &res)) {
        reply_status(c, q->op, q->id, DDP_EINVAL);
        return;
    }
    char tmp[24];
    int n = snprintf(tmp, sizeof(tmp), "%" PRId64, res);
    uint8_t *v = dup_bytes((const uint8_t *)tmp, (uint32_t)n);
    if (!v || (!e && !(e = entry_get(s, q->key, q->klen)))) {
        free(v);
        reply_status(c, q->op, q->id, DDP_ENOMEM);
        return;
    }
    entry_set(s, e, v, (uint32_t)n);
    size_t pos = reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u64(&c->out, (uint64_t)res);
    reply_end(c, pos);
}

static void op_cas(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    struct entry *e = entry_find(s, q->key, q->klen);
    bool present = e && e->present;
    bool match = (q->flags & DDP__CAS_EXPECT_ABSENT)
                     ? !present
                     : present && e->vlen == q->elen && memcmp(e->val, q->exp, q->elen) == 0;
    if (match) {
        uint8_t *v = dup_bytes(q->val, q->vlen);
        if (!v || (!e && !(e = entry_get(s, q->key, q->klen)))) {
            free(v);
            reply_status(c, q->op, q->id, DDP_ENOMEM);
            return;
        }
        entry_set(s, e, v, q->vlen);
        present = true;
    }
    size_t pos = reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u8(&c->out, match);
    ddp_buf_put_u8(&c->out, present);
    ddp_buf_put_str(&c->out, present ? e->val : NULL, present ? e->vlen : 0);
    reply_end(c, pos);
}

static void op_delete(struct conn *c, const struct ddp__req *q)
{
    struct entry *e = entry_find(c->srv, q->key, q->klen);
    bool existed = e && e->present;
    if (existed)
        entry_delete(c->srv, e, DDP_STORE_EV_DELETE);
    size_t pos = reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u64(&c->out, existed);
    reply_end(c, pos);
}

static int next_key(struct ddp_rd *r, const uint8_t **k, uint32_t *kl)
{
    /* The list was fully validated by ddp__proto_parse_req. */
    return ddp_rd_str(r, DDP__MAX_KEY, k, kl);
}

static void op_check(struct conn *c, const struct ddp__req *q)
{
    struct ddp_rd r = q->keys;
    bool all = true;
    for (uint32_t i = 0; i < q->nkeys && all; i++) {
        const uint8_t *k;
        uint32_t kl;
        next_key(&r, &k, &kl);
        struct entry *e = entry_find(c->srv, k, kl);
        all = e && e->present;
    }
    size_t pos = reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u8(&c->out, all);
    reply_end(c, pos);
}

static void op_wait(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    struct ddp_rd r = q->keys;
    uint32_t missing = 0;
    for (uint32_t i = 0; i < q->nkeys; i++) {
        const uint8_t *k;
        uint32_t kl;
        next_key(&r, &k, &kl);
        struct entry *e = entry_find(s, k, kl);
        if (!e || !e->present)
            missing++;
    }
    if (missing == 0) { /* n = 0 included */
        reply_status(c, q->op, q->id, 0);
        return;
    }
    if (q->u32 == 0) {
        reply_status(c, q->op, q->id, DDP_ETIMEDOUT);
        return;
    }
    struct waiter *w = calloc(1, sizeof(*w) + q->nkeys * sizeof(struct wlink));
    if (!w) {
        reply_status(c, q->op, q->id, DDP_ENOMEM);
        return;
    }
    w->c = c;
    w->reqid = q->id;
    ddp_timer_init(&w->timer, waiter_timeout);
    ddp_list_add_tail(&c->waiters, &w->conn_link);
    STAT_ADD(s, waiters, 1);
    r = q->keys;
    for (uint32_t i = 0; i < q->nkeys; i++) {
        const uint8_t *k;
        uint32_t kl;
        next_key(&r, &k, &kl);
        struct entry *e = entry_get(s, k, kl);
        if (!e) {
            waiter_free(w);
            reply_status(c, q->op, q->id, DDP_ENOMEM);
            return;
        }
        struct wlink *l = &w->links[w->nlinks++];
        l->w = w;
        l->e = e;
        l->present = e->present;
        ddp_list_add_tail(&e->waiters, &l->node);
        w->missing += !e->present;
    }
    c->parked = w;
    if (q->u32 != DDP__WAIT_FOREVER)
        ddp_timer_start(s->loop, &w->timer, q->u32);
}

static void op_multi_get(struct conn *c, const struct ddp__req *q)
{
    struct ddp_rd r = q->keys;
    size_t total = 0;
    for (uint32_t i = 0; i < q->nkeys; i++) {
        const uint8_t *k;
        uint32_t kl;
        next_key(&r, &k, &kl);
        struct entry *e = entry_find(c->srv, k, kl);
        total += 5 + (e && e->present ? e->vlen : 0);
    }
    if (total > MAX_REPLY) {
        reply_status(c, q->op, q->id, DDP_ETOOBIG);
        return;
    }
    size_t pos = reply_begin(c, q->op, q->id, 0);
    if (ddp_buf_reserve(&c->out, total) < 0) {
        c->out.len = pos;
        reply_status(c, q->op, q->id, DDP_ENOMEM);
        return;
    }
    r = q->keys;
    for (uint32_t i = 0; i < q->nkeys; i++) {
        const uint8_t *k;
        uint32_t kl;
        next_key(&r, &k, &kl);
        struct entry *e = entry_find(c->srv, k, kl);
        bool present = e && e->present;
        ddp_buf_put_u8(&c->out, present);
        ddp_buf_put_str(&c->out, present ? e->val : NULL, present ? e->vlen : 0);
    }
    reply_end(c, pos);
}

static void op_watch(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    if (c->nwatches >= MAX_WATCHES_PER_CONN) {
        reply_status(c, q->op, q->id, DDP_ELIMIT);
        return;
    }
    struct watch *w = calloc(1, sizeof(*w));
    if (!w || !(w->key = dup_bytes(q->key, q->klen))) {
        free(w);
        reply_status(c, q->op, q->id, DDP_ENOMEM);
        return;
    }
    w->c = c;
    w->klen = q->klen;
    w->prefix = q->flags & DDP__WATCH_PREFIX;
    if (++s->next_watch_id == 0)
        s->next_watch_id = 1;
    w->id = s->next_watch_id;
    ddp_list_add_tail(&s->watches, &w->srv_link);
    ddp_list_add_tail(&c->watches, &w->conn_link);
    c->nwatches++;
    STAT_ADD(s, watches, 1);
    size_t pos = reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u32(&c->out, w->id);
    reply_end(c, pos);
}

static void op_unwatch(struct conn *c, const struct ddp__req *q)
{
    struct ddp_list *p, *t;
    DDP_LIST_FOREACH_SAFE (p, t, &c->watches) {
        struct watch *w = DDP_CONTAINER_OF(p, struct watch, conn_link);
        if (w->id == q->u32) {
            watch_free(w);
            reply_status(c, q->op, q->id, 0);
            return;
        }
    }
    reply_status(c, q->op, q->id, DDP_EINVAL);
}

static void op_lease_grant(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    if (q->u32 == 0 || q->u32 > INT32_MAX) {
        reply_status(c, q->op, q->id, DDP_EINVAL);
        return;
    }
    struct lease *l = calloc(1, sizeof(*l));
    if (!l) {
        reply_status(c, q->op, q->id, DDP_ENOMEM);
        return;
    }
    do {
        if (ddp_random_bytes(&l->id, sizeof(l->id)) < 0)
            l->id = (uint64_t)ddp_now_ns() ^ s->next_conn_id;
    } while (l->id == 0 || lease_find(s, l->id));
    for (int i = 0; i < 8; i++)
        l->idbytes[i] = (uint8_t)(l->id >> (8 * i));
    l->h.key = l->idbytes;
    l->h.klen = 8;
    l->ttl_ms = q->u32;
    l->srv = s;
    ddp_list_init(&l->keys);
    ddp_timer_init(&l->timer, lease_expired);
    ddp_htab_insert(&s->leases, &l->h);
    ddp_timer_start(s->loop, &l->timer, l->ttl_ms);
    STAT_ADD(s, leases, 1);
    size_t pos = reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u64(&c->out, l->id);
    reply_end(c, pos);
}

static void op_lease_keepalive(struct conn *c, const struct ddp__req *q)
{
    struct lease *l = lease_find(c->srv, q->u64);
    if (!l) {
        reply_status(c, q->op, q->id, DDP_ENOLEASE);
        return;
    }
    ddp_timer_start(c->srv->loop, &l->timer, l->ttl_ms);
    size_t pos = reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u32(&c->out, l->ttl_ms);
    reply_end(c, pos);
}

static void op_lease_revoke(struct conn *c, const struct ddp__req *q)
{
    struct lease *l = lease_find(c->srv, q->u64);
    if (!l) {
        reply_status(c, q->op, q->id, DDP_ENOLEASE);
        return;
    }
    lease_end(c->srv, l);
    reply_status(c, q->op, q->id, 0);
}

/* ------------------------------------------------------------------ */
/* Handshake                                                          */
/* ------------------------------------------------------------------ */

static void auth_timeout(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    struct conn *c = DDP_CONTAINER_OF(t, struct conn, auth_timer);
    DDP_WARN(STORE, "dropping connection from '%s': no authentication within %d ms", c->peer,
             c->srv->auth_timeout_ms);
    STAT_ADD(c->srv, conns_dropped, 1);
    conn_schedule_close(c, "authentication timeout");
}

static void on_hello(struct conn *c, const struct ddp__req *q)
{
    if (q->magic != DDP__PROTO_MAGIC) {
        DDP_WARN(STORE,
                 "dropping connection from '%s': bad magic 0x%08x (not a ddprun store client)",
                 c->peer, q->magic);
        STAT_ADD(c->srv, conns_dropped, 1);
        conn_schedule_close(c, "bad magic");
        return;
    }
    if (q->version != DDP__PROTO_VERSION) {
        DDP_WARN(STORE, "refusing client '%s': protocol version %u, server speaks %u", c->peer,
                 q->version, DDP__PROTO_VERSION);
        size_t pos = reply_begin(c, q->op, q->id, DDP_EVERSION);
        ddp_buf_put_u16(&c->out, DDP__PROTO_VERSION);
        reply_end(c, pos);
        c->close_after_write = true;
        c->close_reason = "version mismatch";
        STAT_ADD(c->srv, conns_dropped, 1);
        return;
    }
    memcpy(c->cnonce, q->nonce, DDP__NONCE_LEN);
    if (ddp_random_bytes(c->snonce, DDP__NONCE_LEN) < 0) {
        conn_schedule_close(c, "no randomness");
        return;
    }
    size_t pos = reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u32(&c->out, DDP__PROTO_MAGIC);
    ddp_buf_put_u16(&c->out, DDP__PROTO_VERSION);
    ddp_buf_put_u16(&c->out, 0);
    ddp_buf_put(&c->out, c->snonce, DDP__NONCE_LEN);
    reply_end(c, pos);
    c->state = CONN_AUTH;
}

static void on_auth(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    uint8_t want[DDP__MAC_LEN], mine[DDP__MAC_LEN];
    if (ddp__proto_mac(s->token, s->toklen, DDP__LABEL_CLIENT, c->snonce, c->cnonce, want) < 0 ||
        !ddp__proto_mac_equal(want, q->mac)) {
        DDP_WARN(STORE, "refusing client '%s': authentication failed (wrong job token)", c->peer);
        STAT_ADD(s, conns_refused_auth, 1);
        reply_status(c, q->op, q->id, DDP_EAUTH);
        c->close_after_write = true;
        c->close_reason = "authentication failed";
        return;
    }
    if (ddp__proto_mac(s->token, s->toklen, DDP__LABEL_SERVER, c->cnonce, c->snonce, mine) < 0) {
        conn_schedule_close(c, "mac failed");
        return;
    }
    ddp_timer_stop(s->loop, &c->auth_timer);
    c->state = CONN_READY;
    size_t pos = reply_begin(c, q->op, q->id, 0);
    ddp_buf_put(&c->out, mine, DDP__MAC_LEN);
    reply_end(c, pos);
    DDP_DEBUG(STORE, "client '%s' authenticated (conn %" PRIu64 ")", c->peer, c->id);
}

static void dispatch(struct conn *c, const uint8_t *frame, size_t len)
{
    struct ddp__req q;
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
        reply_status(c, op, id, DDP_ETOOBIG);
        return;
    }
    if (r < 0) {
        DDP_WARN(STORE, "dropping connection from '%s': malformed frame (%s)", c->peer,
                 ddp_strerror(r));
        STAT_ADD(c->srv, conns_dropped, 1);
        conn_schedule_close(c, "malformed frame");
        return;
    }
    bool pre = c->state != CONN_READY;
    bool handshake_op = q.op == DDP__OP_HELLO || q.op == DDP__OP_AUTH;
    if ((c->state == CONN_HELLO && q.op != DDP__OP_HELLO) ||
        (c->state == CONN_AUTH && q.op != DDP__OP_AUTH) || (!pre && handshake_op)) {
        DDP_WARN(STORE, "dropping connection from '%s': op 0x%02x out of sequence", c->peer, q.op);
        STAT_ADD(c->srv, conns_dropped, 1);
        conn_schedule_close(c, "op out of sequence");
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
        reply_status(c, q.op, q.id, 0);
        break;
    case DDP__OP_SET:
        op_set(c, &q);
        break;
    case DDP__OP_GET:
        op_get(c, &q);
        break;
    case DDP__OP_ADD:
        op_add(c, &q);
        break;
    case DDP__OP_CAS:
        op_cas(c, &q);
        break;
    case DDP__OP_DELETE:
        op_delete(c, &q);
        break;
    case DDP__OP_CHECK:
        op_check(c, &q);
        break;
    case DDP__OP_NUM_KEYS: {
        size_t pos = reply_begin(c, q.op, q.id, 0);
        ddp_buf_put_u64(&c->out, STAT_GET(c->srv, keys));
        reply_end(c, pos);
        break;
    }
    case DDP__OP_WAIT:
        op_wait(c, &q);
        break;
    case DDP__OP_MULTI_GET:
        op_multi_get(c, &q);
        break;
    case DDP__OP_WATCH:
        op_watch(c, &q);
        break;
    case DDP__OP_UNWATCH:
        op_unwatch(c, &q);
        break;
    case DDP__OP_LEASE_GRANT:
        op_lease_grant(c, &q);
        break;
    case DDP__OP_LEASE_KEEPALIVE:
        op_lease_keepalive(c, &q);
        break;
    case DDP__OP_LEASE_REVOKE:
        op_lease_revoke(c, &q);
        break;
    default:
        conn_schedule_close(c, "unknown op");
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
    for (;;) {
        if (c->closing || c->close_after_write)
            return -1;
        if (c->parked)
            break;
        uint32_t max = c->state == CONN_READY ? DDP__MAX_FRAME : DDP__MAX_PREAUTH_FRAME;
        long fs = ddp__proto_frame_size(c->in.data + c->in.off, ddp_buf_pending(&c->in), max);
        if (fs < 0) {
            /* Checked before anything is allocated for the frame. */
            DDP_WARN(STORE, "dropping connection from '%s': frame length %s", c->peer,
                     fs == DDP_ETOOBIG ? "over the limit" : "below the minimum");
            STAT_ADD(s, conns_dropped, 1);
            conn_schedule_close(c, "bad frame length");
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
        long fs = ddp__proto_frame_size(c->in.data + c->in.off, ddp_buf_pending(&c->in), max);
        if (ddp_buf_pending(&c->in) >= 4 && fs == 0) {
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
            conn_schedule_close(c, "out of memory");
            return;
        }
        ssize_t n = recv(c->fd, c->in.data + c->in.len, c->in.cap - c->in.len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            DDP_INFO(STORE, "connection from '%s' failed: %s", c->peer, strerror(errno));
            conn_schedule_close(c, "read error");
            return;
        }
        if (n == 0) {
            if (ddp_buf_pending(&c->in) > 0)
                DDP_INFO(STORE, "client '%s' closed the connection mid-frame (%zu bytes pending)",
                         c->peer, ddp_buf_pending(&c->in));
            else
                DDP_DEBUG(STORE, "client '%s' closed the connection", c->peer);
            conn_schedule_close(c, "eof");
            return;
        }
        size_t asked = c->in.cap - c->in.len;
        c->in.len += (size_t)n;
        budget -= (size_t)n < budget ? (size_t)n : budget;
        if (conn_process(c) < 0)
            return;
        if (c->parked && ddp_buf_pending(&c->in) > PARKED_INPUT_MAX) {
            DDP_WARN(STORE,
                     "dropping connection from '%s': more than %u bytes of requests behind a "
                     "WAIT that is not answered yet",
                     c->peer, PARKED_INPUT_MAX);
            STAT_ADD(s, conns_dropped, 1);
            conn_schedule_close(c, "too much pipelined behind a parked WAIT");
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
        conn_flush(c);
    if ((mask & DDP_LOOP_READ) && c->close_after_write) {
        /* Hang-up or more input while the final reply is pending: just close. */
        conn_schedule_close(c, c->close_reason);
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

static void on_accept(struct ddp_loop *loop, int lfd, unsigned mask, void *arg)
{
    (void)mask;
    struct server *s = arg;
    for (int i = 0; i < 256; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of fds: stop accepting briefly rather than spin on a readable listener. */
                DDP_WARN(STORE, "cannot accept a connection: %s; pausing accepts for 100 ms",
                         strerror(errno));
                ddp_loop_modify(loop, lfd, 0);
                ddp_timer_start(loop, &s->accept_pause, 100);
            }
            return;
        }
        if (STAT_GET(s, conns_open) >= s->max_conns) {
            int64_t now = ddp_now_ms();
            if (now - s->last_refuse_log_ms >= 1000) {
                DDP_WARN(STORE, "refusing connection: %u connections open (the limit)",
                         s->max_conns);
                s->last_refuse_log_ms = now;
            }
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
        ddp_list_init(&c->flush_link);
        ddp_list_init(&c->resume_link);
        ddp_timer_init(&c->auth_timer, auth_timeout);
        if (ddp_loop_add(loop, fd, DDP_LOOP_READ, conn_io, c) < 0) {
            close(fd);
            free(c);
            continue;
        }
        ddp_list_add_tail(&s->conns, &c->link);
        ddp_timer_start(loop, &c->auth_timer, s->auth_timeout_ms);
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
            conn_flush(c);
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

static int listen_on(struct server *s, const char *host, int port)
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
            s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                               : ntohs(((struct sockaddr_in *)&ss)->sin_port);
            s->lfd = fd;
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
    s->lfd = s->efd = -1;
    ddp_list_init(&s->watches);
    ddp_list_init(&s->conns);
    ddp_list_init(&s->closing);
    ddp_list_init(&s->resumeq);
    ddp_list_init(&s->flushq);
    ddp_timer_init(&s->accept_pause, accept_resume);
    s->max_conns = o->max_conns ? o->max_conns : 65536;
    s->auth_timeout_ms = o->auth_timeout_ms > 0 ? o->auth_timeout_ms : 10000;
    s->max_outbuf = o->max_outbuf ? o->max_outbuf : (256u << 20);
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

static void free_entry_cb(struct ddp_hnode *n, void *arg)
{
    (void)arg;
    struct entry *e = DDP_CONTAINER_OF(n, struct entry, h);
    free(e->key);
    free(e->val);
    free(e);
}

static void free_lease_cb(struct ddp_hnode *n, void *arg)
{
    (void)arg;
    free(DDP_CONTAINER_OF(n, struct lease, h));
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
    if (s->keys.slots)
        ddp_htab_foreach(&s->keys, free_entry_cb, NULL);
    if (s->leases.slots)
        ddp_htab_foreach(&s->leases, free_lease_cb, NULL);
    ddp_htab_release(&s->keys);
    ddp_htab_release(&s->leases);
    if (s->lfd >= 0)
        close(s->lfd);
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
}
