/* The node's store proxy (cli/agent/store_proxy.h). It is over 800 lines as one state: the ranks'
 * connections, the store's, and what combines their requests (ADD batches, WAIT groups, reads
 * followed) point into each other, and each reply or failure touches all of them. */
#include "cli/agent/store_proxy.h"
#include "cli/agent/torch_proxy.h"
#include "common/buf.h"
#include "common/err.h"
#include "common/list.h"
#include "common/log.h"
#include "common/loop.h"
#include "common/util.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

#define CONNECT_MS 10000  /* for a connection to the store and its handshake */
#define AUTH_MS 10000     /* for a rank to prove the token */
#define MAX_WAIT_CONNS 64 /* WAITs for different keys at once, each on a connection */
#define MAX_CONNS 4096    /* ranks' connections (beyond: closed at once) */
#define IDLE_MS 5000      /* a pool connection no WAIT used for this long is closed */
#define HOLD_MS 50        /* an ADD waits this long at most for the same ADD of the node's others */

struct lconn; /* a rank's connection */

/* A connection to the store: the main one (requests answered at once, in order), or one of the
 * pool that carries one WAIT at a time. */
struct up {
    int fd;
    struct ddp_buf in, out;
    struct group *g;       /* the WAIT it carries (pool), NULL when idle */
    struct ddp_timer idle; /* a pool connection idle this long is closed */
};

/* What a reply on the main connection is for, in the order the requests went. A read (GET,
 * MULTI_GET, CHECK) that other ranks ask while it is on its way is theirs too: they follow it. */
struct follower {
    struct ddp_list link;
    struct lconn *c;
    uint32_t lid;
};
struct pend {
    struct ddp_list link;
    struct lconn *c; /* NULL: its rank is gone */
    uint32_t lid;
    struct addk *add; /* an ADD batch: its ranks are in add->batch */
    uint8_t op;
    uint8_t *body; /* a read's op and body, for those that follow it */
    size_t blen;
    struct ddp_list followers;
};

/* ADDs to one key: the batch on its way up, and those that came since. */
struct adder {
    struct ddp_list link;
    struct lconn *c;
    uint32_t lid;
    int64_t delta;
};
struct addk {
    struct ddp_list link; /* P.adds */
    uint8_t *key;
    uint32_t klen;
    struct ddp_list batch, queued;
    int64_t queued_sum;
    unsigned nqueued;
    bool inflight;         /* batch is on its way up */
    bool answering;        /* on_main_reply is answering its batch */
    struct ddp_timer hold; /* the first ADD waits HOLD_MS at most for the node's other ranks' */
};

/* WAITs for one list of keys: one WAIT up, each rank answered by its deadline. */
struct waiter {
    struct ddp_list link;
    struct group *g;
    struct lconn *c;
    uint32_t lid;
    int64_t deadline; /* 0: none */
    struct ddp_timer timer;
};
struct group {
    struct ddp_list link; /* P.groups */
    uint8_t *keys;        /* u32 n, then the keys, as the request carried them */
    uint32_t klen;
    struct ddp_list waiters;
    struct up *u;
    int64_t up_deadline; /* when its WAIT up ends by itself (0: it does not) */
    bool answering;      /* on_wait_reply is answering its ranks: it is not freed under it */
};

struct lconn {
    struct ddp_list link;
    int fd;
    int state;          /* 0 HELLO, 1 AUTH, 2 READY; 3 a TCPStore client's (tp) */
    struct ddp__tp *tp; /* a TCPStore client's: its requests, as the store's, in tin */
    struct ddp_buf tin;
    char peer[INET6_ADDRSTRLEN + 8];
    uint8_t cn[DDP__NONCE_LEN], sn[DDP__NONCE_LEN];
    struct ddp_buf in, out;
    bool busy;       /* a request of its is not answered yet: the next waits */
    bool processing; /* lconn_process is taking its requests */
    bool eof;        /* its client closed its end after requests not taken yet (a 1.13
                        TCPStore client's SET asks no answer): they still are, answered to
                        nobody, and the connection closes once they are */
    struct waiter *w;
    struct ddp_timer auth;
};

static struct {
    struct ddp_loop *loop;
    int lfd, tfd;                  /* the ranks' listening socket; their TCPStore clients' */
    int tport, round;              /* the TCPStore clients' port, and the round they are in */
    char self[INET6_ADDRSTRLEN];   /* the node's address as the kernel writes it */
    struct ddp_log_limit drop_log; /* TCPStore clients refused or dropped */
    char store[300], token[256], listen_host[128], addr[300];
    struct up main;
    struct up pool[MAX_WAIT_CONNS];
    struct ddp_list conns, dead, pends, adds, groups;
    struct ddp_timer reap;
    uint32_t next_id, nconns, nready; /* ranks' connections, and those that proved the token */
    unsigned nlocal;                  /* the round's ranks on this node */
    uint64_t local, upreq;
    bool stopping;
} P = {.lfd = -1, .tfd = -1, .main = {.fd = -1}};

static void lconn_close(struct lconn *c);
static void lconn_process(struct lconn *c);
static void lconn_take(struct lconn *c);
static void torch_drop(struct lconn *c, const char *why);
static void up_failed(struct up *u, const char *why);

/* ---- connections to the store ---- */

/* A connection to the store that proved the token both ways (the store client's own connect and
 * handshake, CONNECT_MS at most): 0 with u->fd set non-blocking, or -1 said. */
static int up_connect(struct up *u)
{
    char host[256];
    int port, r;
    struct ddp_store *s = NULL;
    if (ddp_parse_hostport(P.store, host, sizeof(host), &port) < 0 ||
        (r = ddp_store_connect(host, port, P.token, strlen(P.token), CONNECT_MS, &s)) < 0 ||
        (u->fd = ddp__store_take_fd(s)) < 0) {
        ddp_store_close(s);
        fprintf(stderr, "ddprun agent: the store proxy cannot reach the store at %s\n", P.store);
        return -1;
    }
    int one = 1;
    setsockopt(u->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(u->fd, F_SETFL, fcntl(u->fd, F_GETFL) | O_NONBLOCK);
    ddp_buf_init(&u->in);
    ddp_buf_init(&u->out);
    P.upreq += 2;
    return 0;
}

/* Sends what of out a non-blocking fd takes now, and watches it for writing while some is left:
 * 0, or -1 (errno) when the connection failed. */
static int flush_out(int fd, struct ddp_buf *out)
{
    while (ddp_buf_pending(out)) {
        ssize_t n = send(fd, out->data + out->off, ddp_buf_pending(out), MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n < 0)
            return -1;
        out->off += (size_t)n;
    }
    ddp_buf_compact(out);
    ddp_loop_modify(P.loop, fd, DDP_LOOP_READ | (ddp_buf_pending(out) ? DDP_LOOP_WRITE : 0));
    return 0;
}

/* Reads what waits on a non-blocking fd into in (at most up to limit bytes pending): 0, or -1
 * at its end (errno 0) or an error. */
static int read_in(int fd, struct ddp_buf *in, size_t limit)
{
    for (;;) {
        if (ddp_buf_reserve(in, 65536) < 0)
            return -1;
        ssize_t n = recv(fd, in->data + in->len, in->cap - in->len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n <= 0) {
            if (n == 0)
                errno = 0;
            return -1;
        }
        in->len += (size_t)n;
        if (ddp_buf_pending(in) > limit) /* the rest waits until these are taken */
            return 0;
    }
}

static void up_flush(struct up *u)
{
    if (flush_out(u->fd, &u->out) < 0)
        up_failed(u, strerror(errno));
}

/* ---- replies to ranks ---- */

static void lconn_flush(struct lconn *c)
{
    if (c->eof) { /* nobody reads it */
        c->out.len = c->out.off = 0;
        return;
    }
    if (flush_out(c->fd, &c->out) < 0)
        lconn_close(c);
}

/* Answers c's request lid (op) with status and payload; its next request may go. */
static void answer(struct lconn *c, uint8_t op, uint32_t lid, int status, const void *p, size_t n)
{
    if (!c || c->fd < 0)
        return;
    if (c->tp) { /* a TCPStore client's: its answer, or the next of the store's requests */
        const char *why = NULL;
        c->busy = false;
        if (ddp__tp_reply(c->tp, status, p, n, &c->tin, &c->out, &why) < 0) {
            torch_drop(c, why);
            return;
        }
        lconn_flush(c);
        if (c->fd >= 0 && !c->processing)
            lconn_process(c);
        return;
    }
    size_t pos = ddp__proto_begin(&c->out, op | DDP__REPLY_BIT, lid);
    ddp_buf_put_u32(&c->out, (uint32_t)status);
    if (n)
        ddp_buf_put(&c->out, p, n);
    ddp__proto_end(&c->out, pos);
    c->busy = false;
    lconn_flush(c);
    if (c->fd >= 0 && !c->processing)
        lconn_process(c);
}

/* ---- the main connection's replies ---- */

static void add_send(struct addk *a);
static void add_free(struct addk *a);

static void on_main_reply(const uint8_t *f, size_t len)
{
    struct ddp_rd rd;
    uint32_t flen, id, st;
    uint8_t op;
    ddp_rd_init(&rd, f, len);
    ddp_rd_u32(&rd, &flen);
    ddp_rd_u8(&rd, &op);
    ddp_rd_u32(&rd, &id);
    if (ddp_rd_u32(&rd, &st) < 0 || ddp_list_empty(&P.pends)) {
        up_failed(&P.main, "a reply that answers nothing");
        return;
    }
    struct pend *pd = DDP_CONTAINER_OF(P.pends.next, struct pend, link);
    ddp_list_del(&pd->link);
    if (!pd->add) {
        /* Answering a rank can send its next request, and a failed send ends the main
         * connection with its buffer: those who follow get a copy of the reply. */
        size_t pn = ddp_rd_left(&rd);
        uint8_t *pl = ddp_list_empty(&pd->followers) ? NULL : malloc(pn ? pn : 1);
        if (pl)
            memcpy(pl, rd.p + rd.off, pn);
        else if (!ddp_list_empty(&pd->followers))
            st = (uint32_t)DDP_ENOMEM;
        answer(pd->c, op & ~DDP__REPLY_BIT, pd->lid, (int)st, pl ? pl : rd.p + rd.off, pn);
        while (!ddp_list_empty(&pd->followers)) {
            struct follower *fw = DDP_CONTAINER_OF(pd->followers.next, struct follower, link);
            ddp_list_del(&fw->link);
            answer(fw->c, op & ~DDP__REPLY_BIT, fw->lid, (int)st, pl, pl ? pn : 0);
            free(fw);
        }
        free(pl);
        free(pd->body);
        free(pd);
        return;
    }
    /* An ADD batch: each rank gets the value its own ADD would have had, in order. */
    struct addk *a = pd->add;
    int64_t v = 0, sum = 0;
    struct ddp_list *it, *nx;
    DDP_LIST_FOREACH_SAFE (it, nx, &a->batch)
        sum += DDP_CONTAINER_OF(it, struct adder, link)->delta;
    bool ok = (int)st == 0 && ddp_rd_i64(&rd, &v) == 0;
    int64_t run = v - sum;
    /* answering a rank can end the main connection, and with it what it carried: this key is
     * kept until its ranks are answered */
    a->answering = true;
    while (!ddp_list_empty(&a->batch)) {
        struct adder *d = DDP_CONTAINER_OF(a->batch.next, struct adder, link);
        ddp_list_del(&d->link);
        run += d->delta;
        uint8_t le[8];
        for (int k = 0; k < 8; k++)
            le[k] = (uint8_t)((uint64_t)run >> (8 * k));
        answer(d->c, DDP__OP_ADD, d->lid, ok ? 0 : (st ? (int)st : DDP_EPROTO), le, ok ? 8 : 0);
        free(d);
    }
    free(pd);
    a->answering = false;
    if (P.main.fd >= 0) {
        add_send(a);
        return;
    }
    add_free(a);
}

/* A key's ADDs let go, answered to nobody. */
static void add_free(struct addk *a)
{
    struct ddp_list *l;
    while (!ddp_list_empty(&a->batch) && (l = a->batch.next)) {
        ddp_list_del(l);
        free(DDP_CONTAINER_OF(l, struct adder, link));
    }
    while (!ddp_list_empty(&a->queued) && (l = a->queued.next)) {
        ddp_list_del(l);
        free(DDP_CONTAINER_OF(l, struct adder, link));
    }
    ddp_timer_stop(P.loop, &a->hold);
    ddp_list_del(&a->link);
    free(a->key);
    free(a);
}

/* The queued ADDs of a key go up as one, or the key is let go. */
static void add_send(struct addk *a)
{
    ddp_timer_stop(P.loop, &a->hold);
    a->inflight = false;
    if (ddp_list_empty(&a->queued)) {
        ddp_list_del(&a->link);
        free(a->key);
        free(a);
        return;
    }
    a->inflight = true;
    a->nqueued = 0;
    struct pend *pd = calloc(1, sizeof(*pd));
    if (!pd) {
        up_failed(&P.main, "out of memory");
        return;
    }
    ddp_list_init(&pd->followers);
    while (!ddp_list_empty(&a->queued)) {
        struct ddp_list *l = a->queued.next;
        ddp_list_del(l);
        ddp_list_add_tail(&a->batch, l);
    }
    size_t pos = ddp__proto_begin(&P.main.out, DDP__OP_ADD, ++P.next_id);
    ddp_buf_put_str(&P.main.out, a->key, a->klen);
    ddp_buf_put_u64(&P.main.out, (uint64_t)a->queued_sum);
    ddp__proto_end(&P.main.out, pos);
    a->queued_sum = 0;
    pd->add = a;
    ddp_list_add_tail(&P.pends, &pd->link);
    P.upreq++;
    up_flush(&P.main);
}

static void on_hold(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    add_send((struct addk *)((char *)t - offsetof(struct addk, hold)));
}

/* ---- WAITs ---- */

static void waiter_done(struct waiter *w, int status)
{
    struct lconn *c = w->c;
    uint32_t lid = w->lid;
    ddp_timer_stop(P.loop, &w->timer);
    ddp_list_del(&w->link);
    if (c)
        c->w = NULL;
    free(w);
    answer(c, DDP__OP_WAIT, lid, status, NULL, 0);
}

static void pool_idle(struct up *u);
static void pool_close(struct up *u);

static void group_free(struct group *g)
{
    if (g->u)
        pool_idle(g->u);
    ddp_list_del(&g->link);
    free(g->keys);
    free(g);
}

/* The group's WAIT up, for the longest deadline of its ranks. */
static void group_send(struct group *g)
{
    int64_t now = ddp_now_ms(), far = 0;
    bool forever = false;
    struct ddp_list *it, *nx;
    DDP_LIST_FOREACH_SAFE (it, nx, &g->waiters) {
        struct waiter *w = DDP_CONTAINER_OF(it, struct waiter, link);
        forever |= w->deadline == 0;
        if (w->deadline > far)
            far = w->deadline;
    }
    uint32_t t = forever ? DDP__WAIT_FOREVER : (uint32_t)(far > now ? far - now : 0);
    g->up_deadline = forever ? 0 : now + t;
    size_t pos = ddp__proto_begin(&g->u->out, DDP__OP_WAIT, ++P.next_id);
    ddp_buf_put_u32(&g->u->out, t);
    ddp_buf_put(&g->u->out, g->keys, g->klen);
    ddp__proto_end(&g->u->out, pos);
    P.upreq++;
    up_flush(g->u);
}

static int pool_take(struct group *g);

/* Every rank of the group answered status (one at a time, as on_wait_reply), the group gone. */
static void group_fail(struct group *g, int status)
{
    struct ddp_list done;
    ddp_list_init(&done);
    while (!ddp_list_empty(&g->waiters)) {
        struct ddp_list *l = g->waiters.next;
        ddp_list_del(l);
        ddp_list_add_tail(&done, l);
    }
    group_free(g);
    while (!ddp_list_empty(&done))
        waiter_done(DDP_CONTAINER_OF(done.next, struct waiter, link), status);
}

static void on_wait_reply(struct up *u, const uint8_t *f, size_t len)
{
    struct ddp_rd rd;
    uint32_t flen, id, st;
    uint8_t op;
    ddp_rd_init(&rd, f, len);
    ddp_rd_u32(&rd, &flen);
    ddp_rd_u8(&rd, &op);
    ddp_rd_u32(&rd, &id);
    struct group *g = u->g;
    if (ddp_rd_u32(&rd, &st) < 0 || !g) {
        up_failed(u, "a reply that answers nothing");
        return;
    }
    /* Those answered now move to a list of their own first: answering one can take its rank's
     * next request, and that can end connections (and their waiters) anywhere. */
    int64_t now = ddp_now_ms();
    struct ddp_list done, *it, *nx;
    ddp_list_init(&done);
    DDP_LIST_FOREACH_SAFE (it, nx, &g->waiters) {
        struct waiter *w = DDP_CONTAINER_OF(it, struct waiter, link);
        if ((int)st != DDP_ETIMEDOUT || (w->deadline && w->deadline <= now)) {
            ddp_list_del(&w->link);
            ddp_list_add_tail(&done, &w->link);
        }
    }
    g->u = NULL; /* its WAIT is answered: a rank that joins it now needs another */
    pool_idle(u);
    g->answering = true;
    while (!ddp_list_empty(&done))
        waiter_done(DDP_CONTAINER_OF(done.next, struct waiter, link), (int)st);
    g->answering = false;
    if (ddp_list_empty(&g->waiters)) {
        group_free(g);
    } else if (!g->u) { /* a rank that came later waits longer, or came since */
        if (pool_take(g) == 0)
            group_send(g);
        else
            group_fail(g, DDP_ECONNECT);
    }
}

/* A group no rank waits in any more: its WAIT up is called off (its connection closed, to be
 * made again when needed), so that the pool is not held by WAITs nobody waits for. */
static void group_drop_if_idle(struct group *g)
{
    if (!ddp_list_empty(&g->waiters) || g->answering)
        return;
    if (g->u && g->up_deadline && g->up_deadline - ddp_now_ms() < 1000)
        return; /* its WAIT ends soon by itself: the connection is kept for the next */
    struct up *u = g->u;
    group_free(g);
    if (u)
        pool_close(u);
}

static void on_waiter_timeout(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    struct waiter *w = (struct waiter *)((char *)t - offsetof(struct waiter, timer));
    struct group *g = w->g;
    waiter_done(w, DDP_ETIMEDOUT); /* its group's WAIT goes on for the others */
    group_drop_if_idle(g);
}

static void on_up(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)fd;
    struct up *u = arg;
    if (mask & DDP_LOOP_WRITE)
        up_flush(u);
    if (!(mask & DDP_LOOP_READ) || u->fd < 0)
        return;
    if (read_in(u->fd, &u->in, SIZE_MAX) < 0) {
        up_failed(u, errno ? strerror(errno) : "the store closed the connection");
        return;
    }
    long sz;
    while ((sz = ddp__proto_frame_size(u->in.data + u->in.off, ddp_buf_pending(&u->in),
                                       DDP__MAX_FRAME)) > 0) {
        const uint8_t *f = u->in.data + u->in.off;
        u->in.off += (size_t)sz;
        if (u == &P.main)
            on_main_reply(f, (size_t)sz);
        else
            on_wait_reply(u, f, (size_t)sz);
        if (u->fd < 0)
            return;
    }
    if (sz < 0)
        up_failed(u, "a malformed reply");
    else
        ddp_buf_compact(&u->in);
}

/* Closes a connection of the pool (what it carried is the caller's). */
static void pool_close(struct up *u)
{
    ddp_timer_stop(P.loop, &u->idle);
    if (u->fd < 0)
        return;
    ddp_loop_del(P.loop, u->fd);
    close(u->fd);
    u->fd = -1;
    ddp_buf_release(&u->in);
    ddp_buf_release(&u->out);
}

static void on_idle(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    struct up *u = (struct up *)((char *)t - offsetof(struct up, idle));
    if (!u->g)
        pool_close(u);
}

/* u carries no WAIT now: kept IDLE_MS for the next, then closed (the store's socket with it). */
static void pool_idle(struct up *u)
{
    u->g = NULL;
    if (u->fd >= 0)
        ddp_timer_start(P.loop, &u->idle, IDLE_MS);
}

/* A connection of the pool for group g: an idle one, or a new one. 0, or -1 said. */
static int pool_take(struct group *g)
{
    struct up *free_slot = NULL;
    for (int k = 0; k < MAX_WAIT_CONNS; k++) {
        struct up *u = &P.pool[k];
        if (u->fd >= 0 && !u->g) {
            ddp_timer_stop(P.loop, &u->idle);
            u->g = g;
            g->u = u;
            return 0;
        }
        if (u->fd < 0 && !free_slot)
            free_slot = u;
    }
    if (!free_slot || up_connect(free_slot) < 0)
        return -1;
    if (ddp_loop_add(P.loop, free_slot->fd, DDP_LOOP_READ, on_up, free_slot) < 0) {
        close(free_slot->fd);
        free_slot->fd = -1;
        return -1;
    }
    free_slot->g = g;
    g->u = free_slot;
    return 0;
}

/* A rank's WAIT: with the group of its keys, or a new one. */
static void local_wait(struct lconn *c, const struct ddp__req *q, const uint8_t *keys, size_t klen)
{
    struct group *g = NULL;
    struct ddp_list *it, *nx;
    DDP_LIST_FOREACH_SAFE (it, nx, &P.groups) {
        struct group *x = DDP_CONTAINER_OF(it, struct group, link);
        if (x->klen == klen && !memcmp(x->keys, keys, klen)) {
            g = x;
            break;
        }
    }
    struct waiter *w = calloc(1, sizeof(*w));
    bool fresh = !g;
    if (w && fresh && (g = calloc(1, sizeof(*g))) && !(g->keys = malloc(klen))) {
        free(g);
        g = NULL;
    }
    if (!w || !g) {
        free(w);
        answer(c, q->op, q->id, DDP_ENOMEM, NULL, 0);
        return;
    }
    if (fresh) {
        memcpy(g->keys, keys, klen);
        g->klen = (uint32_t)klen;
        ddp_list_init(&g->waiters);
        ddp_list_add_tail(&P.groups, &g->link);
    }
    w->g = g;
    w->c = c;
    w->lid = q->id;
    w->deadline = q->u32 == DDP__WAIT_FOREVER ? 0 : ddp_now_ms() + q->u32;
    ddp_timer_init(&w->timer, on_waiter_timeout);
    if (w->deadline)
        ddp_timer_start(P.loop, &w->timer, q->u32);
    ddp_list_add_tail(&g->waiters, &w->link);
    c->w = w;
    if (!fresh && g->u)
        return; /* its WAIT is on its way, long enough (or sent again for this one) */
    if (!fresh)
        return; /* its WAIT was just answered: sent again once those answered are */
    if (pool_take(g) < 0) {
        waiter_done(w, DDP_ECONNECT);
        group_free(g);
        return;
    }
    group_send(g);
}

/* ---- ranks ---- */

/* c's WAIT answered to nobody: its group goes on for the others, or is called off. */
static void waiter_forget(struct lconn *c)
{
    if (!c->w)
        return;
    struct waiter *w = c->w;
    struct group *g = w->g;
    w->c = NULL;
    c->w = NULL;
    waiter_done(w, 0);
    group_drop_if_idle(g);
}

static void on_reap(struct ddp_loop *loop, struct ddp_timer *t);

/* Closes a rank's connection; it is freed from the loop (callers up the stack may hold it). */
static void lconn_close(struct lconn *c)
{
    if (c->fd < 0)
        return;
    ddp_loop_del(P.loop, c->fd);
    close(c->fd);
    c->fd = -1;
    ddp_timer_stop(P.loop, &c->auth);
    /* what it asked is answered to nobody */
    struct ddp_list *it, *nx, *j, *jx;
    DDP_LIST_FOREACH_SAFE (it, nx, &P.pends) {
        struct pend *pd = DDP_CONTAINER_OF(it, struct pend, link);
        if (pd->c == c)
            pd->c = NULL;
        DDP_LIST_FOREACH_SAFE (j, jx, &pd->followers) {
            struct follower *fw = DDP_CONTAINER_OF(j, struct follower, link);
            if (fw->c == c)
                fw->c = NULL;
        }
    }
    DDP_LIST_FOREACH_SAFE (it, nx, &P.adds) {
        struct addk *a = DDP_CONTAINER_OF(it, struct addk, link);
        DDP_LIST_FOREACH_SAFE (j, jx, &a->batch) {
            struct adder *d = DDP_CONTAINER_OF(j, struct adder, link);
            if (d->c == c)
                d->c = NULL;
        }
        DDP_LIST_FOREACH_SAFE (j, jx, &a->queued) {
            struct adder *d = DDP_CONTAINER_OF(j, struct adder, link);
            if (d->c == c)
                d->c = NULL;
        }
    }
    waiter_forget(c);
    ddp_list_del(&c->link);
    ddp_list_add_tail(&P.dead, &c->link);
    P.nconns--;
    P.nready -= c->state == 2;
    ddp_timer_start(P.loop, &P.reap, 0);
}

static void on_reap(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    while (!ddp_list_empty(&P.dead)) {
        struct lconn *c = DDP_CONTAINER_OF(P.dead.next, struct lconn, link);
        ddp_list_del(&c->link);
        ddp_buf_release(&c->in);
        ddp_buf_release(&c->out);
        ddp_buf_release(&c->tin);
        if (c->tp)
            ddp__tp_free(c->tp);
        free(c->tp);
        free(c);
    }
}

/* The store's own handshake, its side (rendezvous/store_server.c). */
static bool handshake(struct lconn *c, const struct ddp__req *q)
{
    if (c->state == 0 && q->op == DDP__OP_HELLO && q->magic == DDP__PROTO_MAGIC &&
        q->version == DDP__PROTO_VERSION) {
        memcpy(c->cn, q->nonce, DDP__NONCE_LEN);
        ddp_random_bytes(c->sn, DDP__NONCE_LEN);
        size_t pos = ddp__proto_begin(&c->out, q->op | DDP__REPLY_BIT, q->id);
        ddp_buf_put_u32(&c->out, 0);
        ddp_buf_put_u32(&c->out, DDP__PROTO_MAGIC);
        ddp_buf_put_u16(&c->out, DDP__PROTO_VERSION);
        ddp_buf_put_u16(&c->out, 0);
        ddp_buf_put(&c->out, c->sn, DDP__NONCE_LEN);
        ddp__proto_end(&c->out, pos);
        c->state = 1;
        return true;
    }
    uint8_t want[DDP__MAC_LEN], mine[DDP__MAC_LEN];
    const uint8_t *tok = (const uint8_t *)P.token;
    if (c->state == 1 && q->op == DDP__OP_AUTH &&
        ddp__proto_mac(tok, strlen(P.token), DDP__LABEL_CLIENT, c->sn, c->cn, want) == 0 &&
        ddp__proto_mac_equal(want, q->mac) &&
        ddp__proto_mac(tok, strlen(P.token), DDP__LABEL_SERVER, c->cn, c->sn, mine) == 0) {
        size_t pos = ddp__proto_begin(&c->out, q->op | DDP__REPLY_BIT, q->id);
        ddp_buf_put_u32(&c->out, 0);
        ddp_buf_put(&c->out, mine, sizeof(mine));
        ddp__proto_end(&c->out, pos);
        c->state = 2;
        P.nready++;
        ddp_timer_stop(P.loop, &c->auth);
        return true;
    }
    if (c->state == 1 && q->op == DDP__OP_AUTH) { /* the wrong token: told so, as the store does */
        size_t pos = ddp__proto_begin(&c->out, q->op | DDP__REPLY_BIT, q->id);
        ddp_buf_put_u32(&c->out, (uint32_t)DDP_EAUTH);
        ddp__proto_end(&c->out, pos);
        lconn_flush(c);
    }
    return false; /* anything else before the token is proved: the connection ends */
}

/* One request of a rank that proved the token. */
static void local_request(struct lconn *c, const uint8_t *f, size_t len, const struct ddp__req *q)
{
    P.local++;
    c->busy = true;
    if (P.main.fd < 0) { /* the store's connection is gone: so is the store, for the ranks */
        answer(c, q->op, q->id, DDP_ECONNECT, NULL, 0);
        return;
    }
    switch (q->op) {
    case DDP__OP_ADD: {
        struct addk *a = NULL;
        struct ddp_list *it, *nx;
        DDP_LIST_FOREACH_SAFE (it, nx, &P.adds) {
            struct addk *x = DDP_CONTAINER_OF(it, struct addk, link);
            if (x->klen == q->klen && !memcmp(x->key, q->key, q->klen)) {
                a = x;
                break;
            }
        }
        struct adder *d = calloc(1, sizeof(*d));
        bool fresh = !a;
        if (d && fresh && (a = calloc(1, sizeof(*a))) &&
            !(a->key = malloc(q->klen ? q->klen : 1))) {
            free(a);
            a = NULL;
        }
        if (!d || !a) {
            free(d);
            answer(c, q->op, q->id, DDP_ENOMEM, NULL, 0);
            return;
        }
        if (fresh) {
            ddp_timer_init(&a->hold, on_hold);
            memcpy(a->key, q->key, q->klen);
            a->klen = q->klen;
            ddp_list_init(&a->batch);
            ddp_list_init(&a->queued);
            ddp_list_add_tail(&P.adds, &a->link);
        }
        d->c = c;
        d->lid = q->id;
        d->delta = q->i64;
        ddp_list_add_tail(&a->queued, &d->link);
        a->queued_sum += q->i64;
        a->nqueued++;
        /* The node's ranks ADD to a key together (a barrier's arrivals): the first waits a
         * moment for the others', or for all of this node's ranks that proved the token; one
         * that comes while an ADD is on its way goes with the next. */
        if (a->inflight)
            return;
        unsigned ranks = P.nready > P.nlocal ? P.nready : P.nlocal;
        if (a->nqueued >= ranks || ranks <= 1 || c->tp)
            add_send(a);
        else if (fresh)
            ddp_timer_start(P.loop, &a->hold, HOLD_MS);
        return;
    }
    case DDP__OP_WAIT:
        if (q->u32 != 0) { /* the key list: after the u32 timeout, to the frame's end */
            size_t off = DDP__FRAME_HDR + 4;
            local_wait(c, q, f + off, len - off);
            return;
        }
        /* a WAIT that does not wait is answered at once, as CHECK is */
        __attribute__((fallthrough));
    case DDP__OP_SET:
    case DDP__OP_GET:
    case DDP__OP_CAS:
    case DDP__OP_DELETE:
    case DDP__OP_CHECK:
    case DDP__OP_NUM_KEYS:
    case DDP__OP_MULTI_GET:
    case DDP__OP_PING: {
        bool read = q->op == DDP__OP_GET || q->op == DDP__OP_MULTI_GET || q->op == DDP__OP_CHECK;
        const uint8_t *body = f + DDP__FRAME_HDR;
        size_t blen = len - DDP__FRAME_HDR;
        struct ddp_list *it, *nx;
        DDP_LIST_FOREACH_SAFE (it, nx, &P.pends) {
            struct pend *x = DDP_CONTAINER_OF(it, struct pend, link);
            if (read && x->body && x->op == q->op && x->blen == blen &&
                !memcmp(x->body, body, blen)) {
                struct follower *fw = calloc(1, sizeof(*fw));
                if (!fw)
                    break;
                fw->c = c;
                fw->lid = q->id;
                ddp_list_add_tail(&x->followers, &fw->link);
                return; /* answered with it */
            }
        }
        struct pend *pd = calloc(1, sizeof(*pd));
        if (!pd) {
            answer(c, q->op, q->id, DDP_ENOMEM, NULL, 0);
            return;
        }
        ddp_list_init(&pd->followers);
        pd->op = q->op;
        if (read && (pd->body = malloc(blen ? blen : 1))) {
            memcpy(pd->body, body, blen);
            pd->blen = blen;
        }
        pd->c = c;
        pd->lid = q->id;
        ddp_buf_put(&P.main.out, f, len); /* the frame as it came, under the proxy's id */
        uint32_t id = ++P.next_id;
        for (int k = 0; k < 4; k++)
            P.main.out.data[P.main.out.len - len + 5 + (size_t)k] = (uint8_t)(id >> (8 * k));
        ddp_list_add_tail(&P.pends, &pd->link);
        P.upreq++;
        up_flush(&P.main);
        return;
    }
    default: /* watches and leases are the agents' own, not the ranks' */
        answer(c, q->op, q->id, DDP_ENOTSUP, NULL, 0);
        return;
    }
}

/* A TCPStore client's requests: each as the store's (tin), taken one at a time as a rank's. */
static void torch_process(struct lconn *c)
{
    while (c->fd >= 0) {
        if (c->busy) {
            if (!c->w || !ddp__tp_waiting(c->tp) || !ddp_buf_pending(&c->in))
                break;
            /* A request after a WAIT not answered yet, whether it came before the WAIT was
             * taken or since: its client gave the WAIT up (1.13's clients send no
             * CANCEL_WAIT), so it is answered to nobody, not later into the middle of other
             * answers (as the store's TCPStore port does). */
            waiter_forget(c);
            ddp__tp_give_up(c->tp);
            c->busy = false;
        }
        long sz = ddp__proto_frame_size(c->tin.data + c->tin.off, ddp_buf_pending(&c->tin),
                                        DDP__MAX_FRAME);
        if (sz != 0) {
            struct ddp__req q;
            const uint8_t *f = c->tin.data + c->tin.off;
            if (sz < 0 || ddp__proto_parse_req(f, (size_t)sz, &q) < 0) {
                torch_drop(c, "a request the store would refuse");
                return;
            }
            c->tin.off += (size_t)sz;
            c->processing = true;
            local_request(c, f, (size_t)sz, &q);
            c->processing = false;
            continue;
        }
        c->tin.len = c->tin.off = 0;
        size_t used = 0;
        const char *why = NULL;
        int r = ddp__tp_request(c->tp, c->in.data + c->in.off, ddp_buf_pending(&c->in), &used,
                                &c->tin, &c->out, &why);
        if (r < 0) {
            torch_drop(c, why);
            return;
        }
        if (r == 0)
            break;
        c->in.off += used;
        if (ddp_buf_pending(&c->out))
            lconn_flush(c);
    }
    if (c->fd >= 0)
        ddp_buf_compact(&c->in);
}

static void torch_drop(struct lconn *c, const char *why)
{
    DDP_WARN_LIMITED(&P.drop_log, STORE, "dropping TCPStore connection from '%s': %s", c->peer,
                     why);
    lconn_close(c);
}

static void lconn_process(struct lconn *c)
{
    lconn_take(c);
    /* a closed client's: once its requests are taken (a WAIT of its is answered to nobody) */
    if (c->fd >= 0 && c->eof && (!c->busy || c->w))
        lconn_close(c);
}

static void lconn_take(struct lconn *c)
{
    if (c->tp) {
        torch_process(c);
        return;
    }
    long sz;
    while (c->fd >= 0 && !c->busy &&
           (sz = ddp__proto_frame_size(c->in.data + c->in.off, ddp_buf_pending(&c->in),
                                       c->state == 2 ? DDP__MAX_FRAME : DDP__MAX_PREAUTH_FRAME)) !=
               0) {
        struct ddp__req q;
        const uint8_t *f = c->in.data + c->in.off;
        bool hs = c->state < 2; /* a frame of the handshake */
        if (sz < 0 || ddp__proto_parse_req(f, (size_t)sz, &q) < 0 || (hs && !handshake(c, &q))) {
            lconn_close(c);
            break;
        }
        c->in.off += (size_t)sz;
        /* Requests answered at once are taken in this loop, not by answer() in turn: a rank's
         * burst of them costs no stack. */
        c->processing = true;
        if (hs)
            lconn_flush(c);
        else
            local_request(c, f, (size_t)sz, &q);
        c->processing = false;
    }
    if (c->fd >= 0)
        ddp_buf_compact(&c->in);
}

/* ---- the proxy itself ---- */

/* A connection to the store failed: what waited on it is answered with an error, and with the
 * main one every rank's connection ends (its ranks find the store gone, as they would). */
static void up_failed(struct up *u, const char *why)
{
    if (u != &P.main)
        ddp_timer_stop(P.loop, &u->idle);
    if (u->fd < 0)
        return;
    if (!P.stopping)
        fprintf(stderr, "ddprun agent: the store proxy's connection to %s ended: %s\n", P.store,
                why);
    ddp_loop_del(P.loop, u->fd);
    close(u->fd);
    u->fd = -1;
    ddp_buf_release(&u->in);
    ddp_buf_release(&u->out);
    struct ddp_list *it, *nx;
    if (u->g)
        group_fail(u->g, DDP_ECONNECT);
    if (u != &P.main)
        return;
    DDP_LIST_FOREACH_SAFE (it, nx, &P.conns)
        lconn_close(DDP_CONTAINER_OF(it, struct lconn, link));
    while (!ddp_list_empty(&P.pends)) {
        struct pend *pd = DDP_CONTAINER_OF(P.pends.next, struct pend, link);
        ddp_list_del(&pd->link);
        while (!ddp_list_empty(&pd->followers)) {
            struct ddp_list *l = pd->followers.next;
            ddp_list_del(l);
            free(DDP_CONTAINER_OF(l, struct follower, link));
        }
        free(pd->body);
        free(pd);
    }
    DDP_LIST_FOREACH_SAFE (it, nx, &P.adds) {
        struct addk *a = DDP_CONTAINER_OF(it, struct addk, link);
        if (!a->answering) /* (one being answered is let go by on_main_reply) */
            add_free(a);
    }
}

static void on_lconn(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)fd;
    struct lconn *c = arg;
    if (mask & DDP_LOOP_WRITE)
        lconn_flush(c);
    if (c->fd < 0 || !(mask & DDP_LOOP_READ))
        return;
    /* a rank far ahead of its answers (more than two frames of the largest size behind one) is
     * dropped, as the store drops such a client */
    int r = read_in(c->fd, &c->in, 2 * (size_t)DDP__MAX_FRAME);
    if (ddp_buf_pending(&c->in) > 2 * (size_t)DDP__MAX_FRAME) {
        lconn_close(c);
        return;
    }
    if (r < 0 && errno == 0 && ddp_buf_pending(&c->in)) {
        /* its end came with requests read with it (on a busy machine a client's last request
         * and its close arrive together): they are taken first */
        c->eof = true;
        ddp_loop_del(P.loop, c->fd);
        c->out.len = c->out.off = 0;
    } else if (r < 0) {
        lconn_close(c);
        return;
    }
    lconn_process(c);
}

static void on_auth_timeout(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    lconn_close((struct lconn *)((char *)t - offsetof(struct lconn, auth)));
}

/* The numeric host of a socket address, and with its port (for messages). */
static void addr_str(const struct sockaddr_storage *ss, socklen_t sl, char *host, size_t hn,
                     char *both, size_t bn)
{
    char port[16];
    if (getnameinfo((const struct sockaddr *)ss, sl, host, (socklen_t)hn, port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(host, hn, "?");
        snprintf(port, sizeof(port), "?");
    }
    snprintf(both, bn, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
}

/* arg non-NULL: the TCPStore clients' socket, served to this node's own address only (a rank
 * reaching the node's address from the node has it as its source). */
static void on_accept(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int cfd = accept4(fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0)
            return;
        char host[INET6_ADDRSTRLEN], peer[INET6_ADDRSTRLEN + 8];
        addr_str(&ss, sl, host, sizeof(host), peer, sizeof(peer));
        if (arg && strcmp(host, P.self) != 0) {
            DDP_WARN_LIMITED(&P.drop_log, STORE,
                             "refusing a TCPStore connection from '%s': not this node's address "
                             "(%s), whose ranks its agent serves",
                             peer, P.self);
            close(cfd);
            continue;
        }
        struct lconn *c = P.nconns < MAX_CONNS ? calloc(1, sizeof(*c)) : NULL;
        if (c && arg && (c->tp = malloc(sizeof(*c->tp))))
            ddp__tp_init(c->tp, P.round);
        if (!c || (arg && !c->tp) || ddp_loop_add(loop, cfd, DDP_LOOP_READ, on_lconn, c) < 0) {
            if (c)
                free(c->tp);
            free(c);
            close(cfd);
            continue;
        }
        int one = 1;
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->fd = cfd;
        snprintf(c->peer, sizeof(c->peer), "%s", peer);
        ddp_buf_init(&c->in);
        ddp_buf_init(&c->out);
        ddp_buf_init(&c->tin);
        ddp_timer_init(&c->auth, on_auth_timeout);
        if (arg)
            c->state = 3; /* TCPStore has no token: the address is the check */
        else
            ddp_timer_start(loop, &c->auth, AUTH_MS);
        ddp_list_add_tail(&P.conns, &c->link);
        P.nconns++;
    }
}

/* A listening socket on host's free port: the fd (its port in *port), or -1. */
static int listen_on(const char *host, int *port)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_PASSIVE},
                    *res = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char ps[16], both[INET6_ADDRSTRLEN + 24];
    if (getaddrinfo(host, "0", &hints, &res) != 0)
        return -1;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    bool ok = fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 1024) == 0 &&
              getsockname(fd, (struct sockaddr *)&ss, &sl) == 0;
    freeaddrinfo(res);
    if (!ok) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    addr_str(&ss, sl, P.self, sizeof(P.self), both, sizeof(both));
    snprintf(ps, sizeof(ps), "%s", strrchr(both, ':') + 1);
    *port = atoi(ps);
    return fd;
}

int ddp__proxy_start(struct ddp_loop *loop, const char *listen_host, const char *store_addr,
                     const char *token, char *addr, size_t n, int *torch_port)
{
    if (P.lfd >= 0 && P.main.fd >= 0 && !strcmp(P.store, store_addr) &&
        !strcmp(P.listen_host, listen_host) && !strcmp(P.token, token)) {
        snprintf(addr, n, "%s", P.addr);
        *torch_port = P.tfd >= 0 ? P.tport : 0;
        return 0;
    }
    ddp__proxy_stop();
    if (strlen(store_addr) >= sizeof(P.store) || strlen(token) >= sizeof(P.token) ||
        strlen(listen_host) >= sizeof(P.listen_host))
        return -1;
    snprintf(P.store, sizeof(P.store), "%s", store_addr);
    snprintf(P.token, sizeof(P.token), "%s", token);
    snprintf(P.listen_host, sizeof(P.listen_host), "%s", listen_host);
    ddp_list_init(&P.conns);
    ddp_list_init(&P.dead);
    P.nconns = P.nready = 0;
    ddp_list_init(&P.pends);
    ddp_list_init(&P.adds);
    ddp_list_init(&P.groups);
    ddp_timer_init(&P.reap, on_reap);
    P.loop = loop;
    for (int k = 0; k < MAX_WAIT_CONNS; k++) {
        P.pool[k] = (struct up){.fd = -1};
        ddp_timer_init(&P.pool[k].idle, on_idle);
    }
    P.main.fd = -1;
    int port = 0;
    *torch_port = 0;
    P.lfd = listen_on(listen_host, &port);
    if (P.lfd < 0 || up_connect(&P.main) < 0 ||
        ddp_loop_add(loop, P.main.fd, DDP_LOOP_READ, on_up, &P.main) < 0 ||
        ddp_loop_add(loop, P.lfd, DDP_LOOP_READ, on_accept, NULL) < 0) {
        if (P.lfd < 0)
            fprintf(stderr, "ddprun agent: the store proxy cannot listen on %s: %s\n", listen_host,
                    strerror(errno));
        ddp__proxy_stop();
        return -1;
    }
    snprintf(P.addr, sizeof(P.addr), strchr(listen_host, ':') ? "[%s]:%d" : "%s:%d", listen_host,
             port);
    snprintf(addr, n, "%s", P.addr);
    /* PyTorch's TCPStore clients: where this fails, the ranks use the launcher's port */
    if ((P.tfd = listen_on(listen_host, &P.tport)) >= 0 &&
        ddp_loop_add(loop, P.tfd, DDP_LOOP_READ, on_accept, &P) < 0) {
        close(P.tfd);
        P.tfd = -1;
    }
    *torch_port = P.tfd >= 0 ? P.tport : 0;
    return 0;
}

void ddp__proxy_ranks(unsigned nlocal, int round)
{
    P.nlocal = nlocal;
    P.round = round;
}

void ddp__proxy_stop(void)
{
    if (!P.loop)
        return;
    DDP_DEBUG(SUP, "store proxy: %llu requests of the ranks, %llu went to the store",
              (unsigned long long)P.local, (unsigned long long)P.upreq);
    P.stopping = true;
    if (P.lfd >= 0) {
        ddp_loop_del(P.loop, P.lfd);
        close(P.lfd);
        P.lfd = -1;
    }
    if (P.tfd >= 0) {
        ddp_loop_del(P.loop, P.tfd);
        close(P.tfd);
        P.tfd = -1;
    }
    for (int k = 0; k < MAX_WAIT_CONNS; k++)
        up_failed(&P.pool[k], "the proxy ends");
    up_failed(&P.main, "the proxy ends"); /* and every rank's connection with it */
    on_reap(P.loop, &P.reap);
    ddp_timer_stop(P.loop, &P.reap);
    explicit_bzero(P.token, sizeof(P.token));
    P.stopping = false;
    P.loop = NULL;
}
