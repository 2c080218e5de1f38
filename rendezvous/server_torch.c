/*
 * PyTorch's TCPStore protocol on a port of the store's own (ddp_store_server_torch_listen), so
 * that unmodified PyTorch programs find their store at MASTER_ADDR:MASTER_PORT, as under
 * torchrun's agent store: no free-port race on rank 0's node, no store that dies with rank 0.
 * Requests are parsed by rendezvous/torch_wire.c (both numberings). The keys live in the
 * store's own table under "torch/<round>/", so every restart round starts with an empty key
 * space (a restarted rank never reads an earlier round's NCCL id), and waits are the store's own
 * parked waits.
 */
#include "rendezvous/server.h"
#include "common/err.h"
#include "common/log.h"
#include "rendezvous/torch_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define NS_MAX 32 /* "torch/<round>/" */

/* The keys of a request, prefixed with the connection's round: into a buffer of the caller. */
struct keys {
    uint32_t n;
    const uint8_t **k;
    uint32_t *l;
    uint8_t *mem;
};

static void keys_free(struct keys *ks)
{
    free(ks->k);
    free(ks->l);
    free(ks->mem);
}

static int ns_prefix(const struct conn *c, char *out, size_t n)
{
    return snprintf(out, n, "torch/%d/", c->torch_round);
}

/* One key with the round's prefix, in a malloc'd buffer. */
static uint8_t *ns_key(const struct conn *c, const uint8_t *k, uint32_t kl, uint32_t *outlen)
{
    char pre[NS_MAX];
    int pl = ns_prefix(c, pre, sizeof(pre));
    uint8_t *b = malloc((size_t)pl + kl + 1);
    if (!b)
        return NULL;
    memcpy(b, pre, (size_t)pl);
    memcpy(b + pl, k, kl);
    *outlen = (uint32_t)pl + kl;
    return b;
}

static void put_bytes(struct conn *c, const uint8_t *p, uint32_t n)
{
    ddp_buf_put_u64(&c->out, n);
    ddp_buf_put(&c->out, p, n);
}

static void drop(struct conn *c, const char *why)
{
    DDP__SRV_DROP_WARN(c, "dropping TCPStore connection from '%s': %s", c->peer, why);
    STAT_ADD(c->srv, conns_dropped, 1);
    ddp__srv_close_later(c, why);
}

/* The keys of q's list, each prefixed: 0, or -1 out of memory. */
static int prefixed_keys(const struct conn *c, const struct ddp__treq *q, struct keys *ks)
{
    memset(ks, 0, sizeof(*ks));
    uint32_t n = (uint32_t)q->u64;
    size_t total = 0, off = 0;
    const uint8_t *s;
    uint32_t sl;
    for (uint32_t i = 0; i < n; i++) {
        ddp__torch_list_next(q, &off, &s, &sl);
        total += sl + NS_MAX;
    }
    ks->n = n;
    ks->k = calloc((size_t)n + 1, sizeof(*ks->k));
    ks->l = calloc((size_t)n + 1, sizeof(*ks->l));
    ks->mem = malloc(total + 1);
    if (!ks->k || !ks->l || !ks->mem) {
        keys_free(ks);
        return -1;
    }
    char pre[NS_MAX];
    int pl = ns_prefix(c, pre, sizeof(pre));
    uint8_t *m = ks->mem;
    off = 0;
    for (uint32_t i = 0; i < n; i++) {
        ddp__torch_list_next(q, &off, &s, &sl);
        memcpy(m, pre, (size_t)pl);
        memcpy(m + pl, s, sl);
        ks->k[i] = m;
        ks->l[i] = (uint32_t)pl + sl;
        m += ks->l[i];
    }
    return 0;
}

/*
 * Handles the request at the front of c's input if it is whole: 1 when one was handled, 0 when
 * more bytes are needed, -1 when the connection was dropped.
 */
static int one_request(struct conn *c)
{
    struct server *s = c->srv;
    struct ddp__treq q;
    const char *why = NULL;
    struct ddp__tconn tc = {.known = c->torch_known, .v22 = c->torch_v22};
    int pr = ddp__torch_parse(&tc, c->in.data + c->in.off, ddp_buf_pending(&c->in), &q, &why);
    c->torch_known = tc.known;
    c->torch_v22 = tc.v22;
    if (pr < 0) {
        drop(c, why);
        return -1;
    }
    if (pr == 0)
        return 0;
    if (c->parked && q.op != DDP__T_CANCEL_WAIT) {
        /* A client blocks in WAIT until it is answered or gives up; a request after one means
         * it gave up (1.13's clients send no CANCEL_WAIT), so its WAIT is forgotten rather than
         * answered later into the middle of other replies (where PyTorch's own server would
         * desynchronise the connection). */
        DDP_DEBUG(STORE, "TCPStore client '%s' gave up a WAIT", c->peer);
        ddp__srv_unpark(c);
    }
    struct keys ks = {0};
    if ((q.op == DDP__T_CHECK || q.op == DDP__T_WAIT || q.op == DDP__T_MULTI_GET) &&
        prefixed_keys(c, &q, &ks) < 0) {
        drop(c, "out of memory");
        return -1;
    }
    uint32_t nkl;
    uint8_t *nk = NULL;
    struct entry *e;
    switch (q.op) {
    case DDP__T_VALIDATE:
        break;
    case DDP__T_PING:
        ddp_buf_put_u32(&c->out, q.u32); /* the nonce back */
        break;
    case DDP__T_SET:
    case DDP__T_APPEND: {
        if (!(nk = ns_key(c, q.k, q.kl, &nkl)) || !(e = ddp__srv_get(s, nk, nkl)))
            goto oom;
        uint32_t old = q.op == DDP__T_APPEND && e->present ? e->vlen : 0;
        uint8_t *nv = malloc((size_t)old + q.vl + 1);
        if (!nv)
            goto oom;
        if (old)
            memcpy(nv, e->val, old);
        memcpy(nv + old, q.v, q.vl);
        ddp__srv_set(s, e, nv, old + q.vl);
        break;
    }
    case DDP__T_CAS:
        /* absent: an empty expected creates it with desired (and answers desired), any other
         * answers expected; present: replaced when equal to expected; answers the value now */
        if (!(nk = ns_key(c, q.k, q.kl, &nkl)) || !(e = ddp__srv_get(s, nk, nkl)))
            goto oom;
        if ((!e->present && q.vl == 0) ||
            (e->present && e->vlen == q.vl && memcmp(e->val, q.v, q.vl) == 0)) {
            uint8_t *nv = ddp__srv_dup(q.v2, q.v2l);
            if (!nv)
                goto oom;
            ddp__srv_set(s, e, nv, q.v2l);
        }
        if (e->present)
            put_bytes(c, e->val, e->vlen);
        else
            put_bytes(c, q.v, q.vl);
        break;
    case DDP__T_GET:
        if (!(nk = ns_key(c, q.k, q.kl, &nkl)))
            goto oom;
        e = ddp__srv_find(s, nk, nkl);
        if (!e || !e->present) {
            if (!c->torch_v22) { /* 1.13's server closes; clients WAIT before a GET */
                free(nk);
                drop(c, "GET of a key that does not exist");
                return -1;
            }
            put_bytes(c, NULL, 0);
        } else {
            put_bytes(c, e->val, e->vlen);
        }
        break;
    case DDP__T_ADD: {
        if (!(nk = ns_key(c, q.k, q.kl, &nkl)) || !(e = ddp__srv_get(s, nk, nkl)))
            goto oom;
        int64_t cur = 0, delta = (int64_t)q.u64, sum;
        if (e->present && ddp__srv_parse_i64(e->val, e->vlen, &cur) < 0) {
            free(nk);
            drop(c, "ADD to a value that is not a decimal number");
            return -1;
        }
        if (__builtin_add_overflow(cur, delta, &sum)) {
            free(nk);
            drop(c, "ADD overflows int64");
            return -1;
        }
        char num[24];
        int n = snprintf(num, sizeof(num), "%lld", (long long)sum);
        uint8_t *nv = ddp__srv_dup((const uint8_t *)num, (uint32_t)n);
        if (!nv)
            goto oom;
        ddp__srv_set(s, e, nv, (uint32_t)n);
        ddp_buf_put_u64(&c->out, (uint64_t)sum);
        break;
    }
    case DDP__T_CHECK: {
        bool all = true;
        for (uint32_t i = 0; i < ks.n && all; i++) {
            e = ddp__srv_find(s, ks.k[i], ks.l[i]);
            all = e && e->present;
        }
        ddp_buf_put_u8(&c->out, all ? 0 : 1); /* READY 0, NOT_READY 1 */
        break;
    }
    case DDP__T_WAIT: {
        int r = ddp__srv_park(c, 0, ks.k, ks.l, ks.n, DDP__WAIT_FOREVER);
        if (r < 0)
            goto oom;
        if (r == 1)
            ddp_buf_put_u8(&c->out, 0); /* STOP_WAITING at once */
        break;
    }
    case DDP__T_MULTI_GET:
        for (uint32_t i = 0; i < ks.n; i++) {
            e = ddp__srv_find(s, ks.k[i], ks.l[i]);
            if (e && e->present)
                put_bytes(c, e->val, e->vlen);
            else
                put_bytes(c, NULL, 0);
        }
        break;
    case DDP__T_MULTI_SET: {
        size_t off = 0;
        for (uint64_t i = 0; i < q.u64; i++) {
            const uint8_t *k, *v;
            uint32_t kl, vl;
            ddp__torch_list_next(&q, &off, &k, &kl);
            ddp__torch_list_next(&q, &off, &v, &vl);
            uint8_t *key = ns_key(c, k, kl, &nkl), *nv = ddp__srv_dup(v, vl);
            if (!key || !nv || !(e = ddp__srv_get(s, key, nkl))) {
                free(key);
                free(nv);
                goto oom;
            }
            ddp__srv_set(s, e, nv, vl);
            free(key);
        }
        break;
    }
    case DDP__T_NUMKEYS: {
        char pre[NS_MAX];
        int pl = ns_prefix(c, pre, sizeof(pre));
        ddp_buf_put_u64(&c->out, ddp__srv_count_prefix(s, (const uint8_t *)pre, (uint32_t)pl));
        break;
    }
    case DDP__T_DELETE:
        if (!(nk = ns_key(c, q.k, q.kl, &nkl)))
            goto oom;
        e = ddp__srv_find(s, nk, nkl);
        ddp_buf_put_u64(&c->out, e && e->present ? 1 : 0);
        if (e && e->present)
            ddp__srv_delete(s, e);
        break;
    case DDP__T_CANCEL_WAIT:
        /* A STOP_WAITING already sent precedes this answer; none follows it. */
        ddp__srv_unpark(c);
        ddp_buf_put_u8(&c->out, 1); /* WAIT_CANCELED */
        break;
    }
    free(nk);
    keys_free(&ks);
    c->in.off += q.len;
    if (ddp_buf_pending(&c->out))
        ddp__srv_want_flush(c);
    return 1;
oom:
    free(nk);
    keys_free(&ks);
    drop(c, "out of memory");
    return -1;
}

int ddp__srv_torch_process(struct conn *c)
{
    int r;
    while (!c->closing && (r = one_request(c)) > 0) {
    }
    if (c->closing)
        return -1;
    ddp_buf_compact(&c->in);
    return 0;
}
