/*
 * PyTorch's TCPStore protocol on a port of the store's own (ddp_store_server_torch_listen), so
 * that unmodified PyTorch programs find their store at MASTER_ADDR:MASTER_PORT, as under
 * torchrun's agent store: no free-port race on rank 0's node, no store that dies with rank 0.
 *
 * The protocol (written from its description in ../shared/reference, read in torch's c10d
 * sources): no framing, no authentication; a request is a 1-byte op and its fields, integers
 * little-endian, strings as a u64 length and the bytes. Two numberings are served: torch 1.13's
 * (SET 0 ... DELETE_KEY 8, which 2.0 and 2.1 extend with APPEND 9 ... CANCEL_WAIT 12) and that of
 * torch 2.2 and later, whose clients begin with VALIDATE (0 and the magic 0x3C85F7CE); the first
 * request tells which. The keys live in the store's own
 * table under "torch/<round>/", so every restart round starts with an empty key space (a
 * restarted rank never reads an earlier round's NCCL id), and waits are the store's own parked
 * waits.
 */
#include "rendezvous/server.h"
#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define TORCH_MAGIC 0x3C85F7CEu
#define TORCH_MAX_KEY 8192u
#define TORCH_MAX_VALUE (16u << 20)
#define TORCH_MAX_KEYS 65536u
/* A whole request: any one SET fits; a request still not whole past it is dropped, so that one
 * connection never holds more than this of the store's memory in its input. */
#define TORCH_MAX_REQUEST (TORCH_MAX_VALUE + (1u << 20))
#define NS_MAX 32 /* "torch/<round>/" */

enum top {
    T_SET,
    T_CAS,
    T_GET,
    T_ADD,
    T_CHECK,
    T_WAIT,
    T_NUMKEYS,
    T_DELETE,
    T_APPEND,
    T_MULTI_GET,
    T_MULTI_SET,
    T_CANCEL_WAIT,
    T_PING,
    T_VALIDATE,
    T_BAD
};

/* The op of wire byte b in the connection's numbering. */
static enum top op_of(const struct conn *c, uint8_t b)
{
    /* 1.13's nine ops; 2.0 and 2.1 added APPEND to CANCEL_WAIT after them */
    static const enum top v113[] = {T_SET,        T_CAS,    T_GET,       T_ADD,
                                    T_CHECK,      T_WAIT,   T_NUMKEYS,   T_BAD /* WATCH_KEY */,
                                    T_DELETE,     T_APPEND, T_MULTI_GET, T_MULTI_SET,
                                    T_CANCEL_WAIT};
    static const enum top v22[] = {T_VALIDATE,  T_SET,       T_CAS,         T_GET,    T_ADD,
                                   T_CHECK,     T_WAIT,      T_NUMKEYS,     T_DELETE, T_APPEND,
                                   T_MULTI_GET, T_MULTI_SET, T_CANCEL_WAIT, T_PING};
    if (c->torch_v22)
        return b < sizeof(v22) / sizeof(v22[0]) ? v22[b] : T_BAD;
    return b < sizeof(v113) / sizeof(v113[0]) ? v113[b] : T_BAD;
}

/* A reader over the buffered bytes: *need grows past what is there when a request is not
 * whole yet (0 returned); -1 for a field over its limit. */
struct rd {
    const uint8_t *p;
    size_t len, off;
};

static int rd_u64(struct rd *r, uint64_t *v)
{
    if (r->len - r->off < 8)
        return 0;
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = x << 8 | r->p[r->off + (size_t)i];
    r->off += 8;
    *v = x;
    return 1;
}

static int rd_u32(struct rd *r, uint32_t *v)
{
    if (r->len - r->off < 4)
        return 0;
    *v = (uint32_t)r->p[r->off] | (uint32_t)r->p[r->off + 1] << 8 |
         (uint32_t)r->p[r->off + 2] << 16 | (uint32_t)r->p[r->off + 3] << 24;
    r->off += 4;
    return 1;
}

/* A string (u64 length, bytes) of at most max bytes: 1, 0 (incomplete) or -1 (too long). */
static int rd_str(struct rd *r, uint64_t max, const uint8_t **s, uint32_t *n)
{
    uint64_t l;
    int k = rd_u64(r, &l);
    if (k <= 0)
        return k;
    if (l > max)
        return -1;
    if (r->len - r->off < l)
        return 0;
    *s = r->p + r->off;
    *n = (uint32_t)l;
    r->off += (size_t)l;
    return 1;
}

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

static void put_u64(struct conn *c, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    ddp_buf_put(&c->out, b, 8);
}

static void put_bytes(struct conn *c, const uint8_t *p, uint32_t n)
{
    put_u64(c, n);
    ddp_buf_put(&c->out, p, n);
}

static void drop(struct conn *c, const char *why)
{
    DDP__SRV_DROP_WARN(c, "dropping TCPStore connection from '%s': %s", c->peer, why);
    STAT_ADD(c->srv, conns_dropped, 1);
    ddp__srv_close_later(c, why);
}

struct count {
    const char *prefix;
    size_t plen;
    uint64_t n;
};

/* Counts the present keys of one round's key space (NUM_KEYS; rarely asked). */
static void count_cb(struct ddp_hnode *h, void *arg)
{
    const struct entry *e = DDP_CONTAINER_OF(h, struct entry, h);
    struct count *ct = arg;
    if (e->present && e->klen >= ct->plen && memcmp(e->key, ct->prefix, ct->plen) == 0)
        ct->n++;
}

/* Reads a key list (u64 n, n keys) and prefixes every key. 1, 0 (incomplete), -1 (bad). */
static int rd_keys(struct conn *c, struct rd *r, struct keys *ks)
{
    uint64_t n;
    int k = rd_u64(r, &n);
    if (k <= 0)
        return k;
    if (n > TORCH_MAX_KEYS)
        return -1;
    memset(ks, 0, sizeof(*ks));
    const uint8_t **raw = calloc((size_t)n + 1, sizeof(*raw));
    uint32_t *rl = calloc((size_t)n + 1, sizeof(*rl));
    size_t total = 0;
    int rc = -1;
    if (!raw || !rl)
        goto out;
    for (uint64_t i = 0; i < n; i++) {
        if ((k = rd_str(r, TORCH_MAX_KEY, &raw[i], &rl[i])) <= 0) {
            rc = k;
            goto out;
        }
        total += rl[i] + NS_MAX;
    }
    ks->n = (uint32_t)n;
    ks->k = calloc((size_t)n + 1, sizeof(*ks->k));
    ks->l = calloc((size_t)n + 1, sizeof(*ks->l));
    ks->mem = malloc(total + 1);
    if (!ks->k || !ks->l || !ks->mem)
        goto out;
    char pre[NS_MAX];
    int pl = ns_prefix(c, pre, sizeof(pre));
    uint8_t *m = ks->mem;
    for (uint32_t i = 0; i < ks->n; i++) {
        memcpy(m, pre, (size_t)pl);
        memcpy(m + pl, raw[i], rl[i]);
        ks->k[i] = m;
        ks->l[i] = (uint32_t)pl + rl[i];
        m += ks->l[i];
    }
    rc = 1;
out:
    free(raw);
    free(rl);
    if (rc != 1)
        keys_free(ks);
    return rc;
}

/*
 * Handles the request at the front of c's input if it is whole: 1 when one was handled, 0 when
 * more bytes are needed, -1 when the connection was dropped.
 */
static int one_request(struct conn *c)
{
    struct server *s = c->srv;
    if (ddp_buf_pending(&c->in) == 0)
        return 0;
    struct rd r = {.p = c->in.data + c->in.off, .len = ddp_buf_pending(&c->in)};
    if (!c->torch_known) {
        /* VALIDATE (0 + the magic) opens torch >= 2.2's connections; a 1.13 SET also starts
         * with 0, but its u64 key length would then be about 1 GiB: not a key. */
        if (r.len < 5 && r.p[0] == 0)
            return 0;
        uint32_t m = 0;
        c->torch_v22 = r.p[0] == 0 && (r.off = 1, rd_u32(&r, &m)) && m == TORCH_MAGIC;
        c->torch_known = true;
        r.off = 0;
    }
    enum top op = op_of(c, r.p[0]);
    r.off = 1;
    if (c->parked && op != T_CANCEL_WAIT) {
        /* A client blocks in WAIT until it is answered or gives up; a request after one means
         * it gave up (1.13's clients send no CANCEL_WAIT), so its WAIT is forgotten rather than
         * answered later into the middle of other replies (where PyTorch's own server would
         * desynchronise the connection). */
        DDP_DEBUG(STORE, "TCPStore client '%s' gave up a WAIT", c->peer);
        ddp__srv_unpark(c);
    }
    const uint8_t *k = NULL, *v = NULL, *v2 = NULL;
    uint32_t kl = 0, vl = 0, v2l = 0, u32 = 0;
    uint64_t u64 = 0;
    struct keys ks = {0};
    int need = 1;
    switch (op) {
    case T_VALIDATE:
    case T_PING:
        need = rd_u32(&r, &u32);
        break;
    case T_SET:
    case T_APPEND:
        if ((need = rd_str(&r, TORCH_MAX_KEY, &k, &kl)) > 0)
            need = rd_str(&r, TORCH_MAX_VALUE, &v, &vl);
        break;
    case T_CAS:
        if ((need = rd_str(&r, TORCH_MAX_KEY, &k, &kl)) > 0 &&
            (need = rd_str(&r, TORCH_MAX_VALUE, &v, &vl)) > 0)
            need = rd_str(&r, TORCH_MAX_VALUE, &v2, &v2l);
        break;
    case T_GET:
    case T_DELETE:
        need = rd_str(&r, TORCH_MAX_KEY, &k, &kl);
        break;
    case T_ADD:
        if ((need = rd_str(&r, TORCH_MAX_KEY, &k, &kl)) > 0)
            need = rd_u64(&r, &u64);
        break;
    case T_CHECK:
    case T_WAIT:
    case T_MULTI_GET:
        need = rd_keys(c, &r, &ks);
        break;
    case T_MULTI_SET:
        /* i64 n, then n (key, value): read through once to know it is whole */
        if ((need = rd_u64(&r, &u64)) > 0 && u64 > TORCH_MAX_KEYS)
            need = -1;
        for (uint64_t i = 0; need > 0 && i < u64; i++)
            if ((need = rd_str(&r, TORCH_MAX_KEY, &k, &kl)) > 0)
                need = rd_str(&r, TORCH_MAX_VALUE, &v, &vl);
        break;
    case T_NUMKEYS:
    case T_CANCEL_WAIT:
        break;
    case T_BAD:
        drop(c, "an operation this store does not serve (a client of another torch version?)");
        return -1;
    }
    if (need < 0) {
        drop(c, "a key, value or key count over the limit");
        return -1;
    }
    if (need == 0 && r.len > TORCH_MAX_REQUEST) {
        drop(c, "a request over 17 MiB");
        return -1;
    }
    if (need == 0)
        return 0; /* not whole yet: the opcode often comes in a segment of its own */
    size_t used = r.off;
    uint32_t nkl;
    uint8_t *nk = NULL;
    struct entry *e;
    switch (op) {
    case T_VALIDATE:
        if (u32 != TORCH_MAGIC) {
            drop(c, "VALIDATE with a wrong magic number");
            return -1;
        }
        break;
    case T_PING:
        ddp_buf_put(&c->out, r.p + 1, 4); /* the nonce back */
        break;
    case T_SET:
    case T_APPEND: {
        if (!(nk = ns_key(c, k, kl, &nkl)) || !(e = ddp__srv_get(s, nk, nkl)))
            goto oom;
        uint32_t old = op == T_APPEND && e->present ? e->vlen : 0;
        uint8_t *nv = malloc((size_t)old + vl + 1);
        if (!nv)
            goto oom;
        if (old)
            memcpy(nv, e->val, old);
        memcpy(nv + old, v, vl);
        ddp__srv_set(s, e, nv, old + vl);
        break;
    }
    case T_CAS:
        /* absent: an empty expected creates it with desired (and answers desired), any other
         * answers expected; present: replaced when equal to expected; answers the value now */
        if (!(nk = ns_key(c, k, kl, &nkl)) || !(e = ddp__srv_get(s, nk, nkl)))
            goto oom;
        if (!e->present && vl == 0) {
            uint8_t *nv = ddp__srv_dup(v2, v2l);
            if (!nv)
                goto oom;
            ddp__srv_set(s, e, nv, v2l);
        } else if (e->present && e->vlen == vl && memcmp(e->val, v, vl) == 0) {
            uint8_t *nv = ddp__srv_dup(v2, v2l);
            if (!nv)
                goto oom;
            ddp__srv_set(s, e, nv, v2l);
        }
        if (e->present)
            put_bytes(c, e->val, e->vlen);
        else
            put_bytes(c, v, vl);
        break;
    case T_GET:
        if (!(nk = ns_key(c, k, kl, &nkl)))
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
    case T_ADD: {
        if (!(nk = ns_key(c, k, kl, &nkl)) || !(e = ddp__srv_get(s, nk, nkl)))
            goto oom;
        int64_t cur = 0, delta = (int64_t)u64, sum;
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
        put_u64(c, (uint64_t)sum);
        break;
    }
    case T_CHECK: {
        bool all = true;
        for (uint32_t i = 0; i < ks.n && all; i++) {
            e = ddp__srv_find(s, ks.k[i], ks.l[i]);
            all = e && e->present;
        }
        ddp_buf_put_u8(&c->out, all ? 0 : 1); /* READY 0, NOT_READY 1 */
        break;
    }
    case T_WAIT: {
        int pr = ddp__srv_park(c, 0, ks.k, ks.l, ks.n, DDP__WAIT_FOREVER);
        if (pr < 0)
            goto oom;
        if (pr == 1)
            ddp_buf_put_u8(&c->out, 0); /* STOP_WAITING at once */
        break;
    }
    case T_MULTI_GET:
        for (uint32_t i = 0; i < ks.n; i++) {
            e = ddp__srv_find(s, ks.k[i], ks.l[i]);
            if (e && e->present)
                put_bytes(c, e->val, e->vlen);
            else
                put_bytes(c, NULL, 0);
        }
        break;
    case T_MULTI_SET: {
        struct rd rr = {.p = r.p, .len = r.len, .off = 1};
        rd_u64(&rr, &u64);
        for (uint64_t i = 0; i < u64; i++) {
            rd_str(&rr, TORCH_MAX_KEY, &k, &kl);
            rd_str(&rr, TORCH_MAX_VALUE, &v, &vl);
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
    case T_NUMKEYS: {
        char pre[NS_MAX];
        struct count ct = {.prefix = pre, .plen = (size_t)ns_prefix(c, pre, sizeof(pre))};
        ddp_htab_foreach(&s->keys, count_cb, &ct);
        put_u64(c, ct.n);
        break;
    }
    case T_DELETE:
        if (!(nk = ns_key(c, k, kl, &nkl)))
            goto oom;
        e = ddp__srv_find(s, nk, nkl);
        put_u64(c, e && e->present ? 1 : 0);
        if (e && e->present)
            ddp__srv_delete(s, e);
        break;
    case T_CANCEL_WAIT:
        /* A STOP_WAITING already sent precedes this answer; none follows it. */
        ddp__srv_unpark(c);
        ddp_buf_put_u8(&c->out, 1); /* WAIT_CANCELED */
        break;
    case T_BAD:
        break;
    }
    free(nk);
    keys_free(&ks);
    c->in.off += used;
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
