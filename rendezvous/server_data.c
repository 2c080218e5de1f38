/*
 * The store's data and the requests on it (rendezvous/server.h): keys in a hash table, each
 * with the waiters parked on it; prefix and key watches; leases whose expiry deletes their
 * keys. Replies go out through server_conn.c.
 */
#include "rendezvous/server.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define MAX_REPLY (64u << 20)
#define MAX_WATCHES_PER_CONN 1024

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
        ddp__srv_want_flush(w->c);
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
        ddp__srv_reply_wait(w->c, w->reqid, 0);
        waiter_free(w);
    }
}

static void waiter_timeout(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    struct waiter *w = DDP_CONTAINER_OF(t, struct waiter, timer);
    ddp__srv_reply_wait(w->c, w->reqid, DDP_ETIMEDOUT);
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

/* kind: what its keys' watchers see (expired, or revoked by its holder). */
static void lease_end(struct server *s, struct lease *l, enum ddp_store_event_kind kind)
{
    struct ddp_list *p, *t;
    ddp_timer_stop(s->loop, &l->timer);
    DDP_LIST_FOREACH_SAFE (p, t, &l->keys) {
        entry_delete(s, DDP_CONTAINER_OF(p, struct entry, lease_link), kind);
    }
    ddp_list_del(&l->held_link);
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
    lease_end(s, l, DDP_STORE_EV_EXPIRE);
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

void ddp__srv_op_set(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    struct lease *l = NULL;
    if (q->u64 && !(l = lease_find(s, q->u64))) {
        ddp__srv_reply(c, q->op, q->id, DDP_ENOLEASE);
        return;
    }
    struct entry *e = entry_get(s, q->key, q->klen);
    uint8_t *v = dup_bytes(q->val, q->vlen);
    if (!e || !v) {
        free(v);
        if (e)
            entry_maybe_free(s, e);
        ddp__srv_reply(c, q->op, q->id, DDP_ENOMEM);
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
    ddp__srv_reply(c, q->op, q->id, 0);
}

void ddp__srv_op_get(struct conn *c, const struct ddp__req *q)
{
    struct entry *e = entry_find(c->srv, q->key, q->klen);
    if (!e || !e->present) {
        ddp__srv_reply(c, q->op, q->id, DDP_ENOKEY);
        return;
    }
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_str(&c->out, e->val, e->vlen);
    ddp__srv_reply_end(c, pos);
}

void ddp__srv_op_add(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    struct entry *e = entry_find(s, q->key, q->klen);
    int64_t cur = 0, res;
    int r;
    if (e && e->present && (r = parse_i64(e->val, e->vlen, &cur)) < 0) {
        ddp__srv_reply(c, q->op, q->id, r);
        return;
    }
    if (__builtin_add_overflow(cur, q->i64, &res)) {
        ddp__srv_reply(c, q->op, q->id, DDP_EINVAL);
        return;
    }
    char tmp[24];
    int n = snprintf(tmp, sizeof(tmp), "%" PRId64, res);
    uint8_t *v = dup_bytes((const uint8_t *)tmp, (uint32_t)n);
    if (!v || (!e && !(e = entry_get(s, q->key, q->klen)))) {
        free(v);
        ddp__srv_reply(c, q->op, q->id, DDP_ENOMEM);
        return;
    }
    entry_set(s, e, v, (uint32_t)n);
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u64(&c->out, (uint64_t)res);
    ddp__srv_reply_end(c, pos);
}

void ddp__srv_op_cas(struct conn *c, const struct ddp__req *q)
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
            ddp__srv_reply(c, q->op, q->id, DDP_ENOMEM);
            return;
        }
        entry_set(s, e, v, q->vlen);
        present = true;
    }
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u8(&c->out, match);
    ddp_buf_put_u8(&c->out, present);
    ddp_buf_put_str(&c->out, present ? e->val : NULL, present ? e->vlen : 0);
    ddp__srv_reply_end(c, pos);
}

void ddp__srv_op_delete(struct conn *c, const struct ddp__req *q)
{
    struct entry *e = entry_find(c->srv, q->key, q->klen);
    bool existed = e && e->present;
    if (existed)
        entry_delete(c->srv, e, DDP_STORE_EV_DELETE);
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u64(&c->out, existed);
    ddp__srv_reply_end(c, pos);
}

struct count {
    const uint8_t *prefix;
    uint32_t plen;
    uint64_t n;
};

static void count_cb(struct ddp_hnode *h, void *arg)
{
    const struct entry *e = DDP_CONTAINER_OF(h, struct entry, h);
    struct count *ct = arg;
    if (e->present && e->klen >= ct->plen && memcmp(e->key, ct->prefix, ct->plen) == 0)
        ct->n++;
}

uint64_t ddp__srv_count_prefix(struct server *s, const uint8_t *prefix, uint32_t plen)
{
    struct count ct = {.prefix = prefix, .plen = plen};
    ddp_htab_foreach(&s->keys, count_cb, &ct);
    return ct.n;
}

static int next_key(struct ddp_rd *r, const uint8_t **k, uint32_t *kl)
{
    /* The list was fully validated by ddp__proto_parse_req. */
    return ddp_rd_str(r, DDP__MAX_KEY, k, kl);
}

void ddp__srv_op_check(struct conn *c, const struct ddp__req *q)
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
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u8(&c->out, all);
    ddp__srv_reply_end(c, pos);
}

void ddp__srv_op_wait(struct conn *c, const struct ddp__req *q)
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
        ddp__srv_reply(c, q->op, q->id, 0);
        return;
    }
    if (q->u32 == 0) {
        ddp__srv_reply(c, q->op, q->id, DDP_ETIMEDOUT);
        return;
    }
    struct waiter *w = calloc(1, sizeof(*w) + q->nkeys * sizeof(struct wlink));
    if (!w) {
        ddp__srv_reply(c, q->op, q->id, DDP_ENOMEM);
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
            ddp__srv_reply(c, q->op, q->id, DDP_ENOMEM);
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

void ddp__srv_op_multi_get(struct conn *c, const struct ddp__req *q)
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
        ddp__srv_reply(c, q->op, q->id, DDP_ETOOBIG);
        return;
    }
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    if (ddp_buf_reserve(&c->out, total) < 0) {
        c->out.len = c->out.off + pos;
        ddp__srv_reply(c, q->op, q->id, DDP_ENOMEM);
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
    ddp__srv_reply_end(c, pos);
}

void ddp__srv_op_watch(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    if (c->nwatches >= MAX_WATCHES_PER_CONN) {
        ddp__srv_reply(c, q->op, q->id, DDP_ELIMIT);
        return;
    }
    struct watch *w = calloc(1, sizeof(*w));
    if (!w || !(w->key = dup_bytes(q->key, q->klen))) {
        free(w);
        ddp__srv_reply(c, q->op, q->id, DDP_ENOMEM);
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
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u32(&c->out, w->id);
    ddp__srv_reply_end(c, pos);
}

void ddp__srv_op_unwatch(struct conn *c, const struct ddp__req *q)
{
    struct ddp_list *p, *t;
    DDP_LIST_FOREACH_SAFE (p, t, &c->watches) {
        struct watch *w = DDP_CONTAINER_OF(p, struct watch, conn_link);
        if (w->id == q->u32) {
            watch_free(w);
            ddp__srv_reply(c, q->op, q->id, 0);
            return;
        }
    }
    ddp__srv_reply(c, q->op, q->id, DDP_EINVAL);
}

void ddp__srv_op_lease_grant(struct conn *c, const struct ddp__req *q)
{
    struct server *s = c->srv;
    if (q->u32 == 0 || q->u32 > INT32_MAX) {
        ddp__srv_reply(c, q->op, q->id, DDP_EINVAL);
        return;
    }
    struct lease *l = calloc(1, sizeof(*l));
    if (!l) {
        ddp__srv_reply(c, q->op, q->id, DDP_ENOMEM);
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
    ddp_list_init(&l->held_link);
    ddp_list_add_tail(&c->held, &l->held_link);
    ddp_timer_init(&l->timer, lease_expired);
    ddp_htab_insert(&s->leases, &l->h);
    ddp_timer_start(s->loop, &l->timer, l->ttl_ms);
    STAT_ADD(s, leases, 1);
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u64(&c->out, l->id);
    ddp__srv_reply_end(c, pos);
}

void ddp__srv_op_lease_keepalive(struct conn *c, const struct ddp__req *q)
{
    struct lease *l = lease_find(c->srv, q->u64);
    if (!l) {
        ddp__srv_reply(c, q->op, q->id, DDP_ENOLEASE);
        return;
    }
    ddp_timer_start(c->srv->loop, &l->timer, l->ttl_ms);
    ddp_list_del(&l->held_link); /* this connection holds it now */
    ddp_list_add_tail(&c->held, &l->held_link);
    size_t pos = ddp__srv_reply_begin(c, q->op, q->id, 0);
    ddp_buf_put_u32(&c->out, l->ttl_ms);
    ddp__srv_reply_end(c, pos);
}

void ddp__srv_op_lease_revoke(struct conn *c, const struct ddp__req *q)
{
    struct lease *l = lease_find(c->srv, q->u64);
    if (!l) {
        ddp__srv_reply(c, q->op, q->id, DDP_ENOLEASE);
        return;
    }
    lease_end(c->srv, l, DDP_STORE_EV_REVOKE);
    ddp__srv_reply(c, q->op, q->id, 0);
}

void ddp__srv_conn_forget(struct conn *c)
{
    struct ddp_list *p, *t;
    DDP_LIST_FOREACH_SAFE (p, t, &c->waiters) {
        waiter_free(DDP_CONTAINER_OF(p, struct waiter, conn_link));
    }
    DDP_LIST_FOREACH_SAFE (p, t, &c->watches) {
        watch_free(DDP_CONTAINER_OF(p, struct watch, conn_link));
    }
    DDP_LIST_FOREACH_SAFE (p, t, &c->held) {
        struct lease *l = DDP_CONTAINER_OF(p, struct lease, held_link);
        ddp_list_del(&l->held_link);
        if (c->srv->lease_orphaned)
            c->srv->lease_orphaned(c->srv->orphan_arg, l->id);
    }
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

void ddp__srv_data_free(struct server *s)
{
    if (s->keys.slots)
        ddp_htab_foreach(&s->keys, free_entry_cb, NULL);
    if (s->leases.slots)
        ddp_htab_foreach(&s->leases, free_lease_cb, NULL);
}

/* ---- the data for the TCPStore protocol (server_torch.c) ---- */

struct entry *ddp__srv_find(struct server *s, const uint8_t *key, uint32_t klen)
{
    return entry_find(s, key, klen);
}

struct entry *ddp__srv_get(struct server *s, const uint8_t *key, uint32_t klen)
{
    return entry_get(s, key, klen);
}

void ddp__srv_set(struct server *s, struct entry *e, uint8_t *val, uint32_t vlen)
{
    entry_set(s, e, val, vlen);
}

void ddp__srv_delete(struct server *s, struct entry *e)
{
    entry_delete(s, e, DDP_STORE_EV_DELETE);
}

uint8_t *ddp__srv_dup(const uint8_t *p, uint32_t n)
{
    return dup_bytes(p, n);
}

int ddp__srv_parse_i64(const uint8_t *p, uint32_t n, int64_t *out)
{
    return parse_i64(p, n, out);
}

int ddp__srv_park(struct conn *c, uint32_t reqid, const uint8_t *const *keys, const uint32_t *klens,
                  uint32_t n, uint32_t timeout_ms)
{
    struct server *s = c->srv;
    uint32_t missing = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct entry *e = entry_find(s, keys[i], klens[i]);
        missing += !e || !e->present;
    }
    if (missing == 0)
        return 1;
    struct waiter *w = calloc(1, sizeof(*w) + n * sizeof(struct wlink));
    if (!w)
        return DDP_ENOMEM;
    w->c = c;
    w->reqid = reqid;
    ddp_timer_init(&w->timer, waiter_timeout);
    ddp_list_add_tail(&c->waiters, &w->conn_link);
    STAT_ADD(s, waiters, 1);
    for (uint32_t i = 0; i < n; i++) {
        struct entry *e = entry_get(s, keys[i], klens[i]);
        if (!e) {
            waiter_free(w);
            return DDP_ENOMEM;
        }
        struct wlink *l = &w->links[w->nlinks++];
        l->w = w;
        l->e = e;
        l->present = e->present;
        ddp_list_add_tail(&e->waiters, &l->node);
        w->missing += !e->present;
    }
    c->parked = w;
    if (timeout_ms != DDP__WAIT_FOREVER)
        ddp_timer_start(s->loop, &w->timer, timeout_ms);
    return 0;
}

void ddp__srv_unpark(struct conn *c)
{
    if (c->parked)
        waiter_free(c->parked);
}
