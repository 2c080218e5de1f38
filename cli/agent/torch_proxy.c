/* PyTorch's TCPStore requests put into the store's own (cli/agent/torch_proxy.h). */
#include "cli/agent/torch_proxy.h"
#include "common/err.h"
#include "rendezvous/proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define TOO_LONG "a key over the store's 4 KiB (with the round's prefix)"

void ddp__tp_init(struct ddp__tp *t, int round)
{
    memset(t, 0, sizeof(*t));
    t->plen = (uint32_t)snprintf(t->prefix, sizeof(t->prefix), "torch/%d/", round);
}

static void done(struct ddp__tp *t)
{
    free(t->key);
    free(t->a);
    free(t->b);
    t->key = t->a = t->b = NULL;
    t->active = false;
}

void ddp__tp_free(struct ddp__tp *t)
{
    done(t);
}

/* p[0, n) then q[0, m) in one malloc'd buffer. */
static uint8_t *concat(const uint8_t *p, uint32_t n, const uint8_t *q, uint32_t m)
{
    uint8_t *d = malloc((size_t)n + m + 1);
    if (d) {
        if (n)
            memcpy(d, p, n);
        if (m)
            memcpy(d + n, q, m);
    }
    return d;
}

/* ---- the store's requests ---- */

/* A key with the round's prefix, as the store's str. */
static int put_key(struct ddp_buf *f, const struct ddp__tp *t, const uint8_t *k, uint32_t kl)
{
    return ddp_buf_put_u32(f, t->plen + kl) | ddp_buf_put(f, t->prefix, t->plen) |
           ddp_buf_put(f, k, kl);
}

/* The keys of q's list, prefixed, as the store's u32 n and strs. */
static int put_keys(struct ddp_buf *f, const struct ddp__tp *t, const struct ddp__treq *q,
                    const char **why)
{
    int r = ddp_buf_put_u32(f, (uint32_t)q->u64);
    size_t off = 0;
    for (uint64_t i = 0; i < q->u64; i++) {
        const uint8_t *k;
        uint32_t kl;
        ddp__torch_list_next(q, &off, &k, &kl);
        if (t->plen + kl > DDP__MAX_KEY) {
            *why = TOO_LONG;
            return -1;
        }
        r |= put_key(f, t, k, kl);
    }
    return r;
}

/* A CAS of the (prefixed) key in hand: expected absent, or expected e; desired d. */
static int put_cas(struct ddp_buf *f, const struct ddp__tp *t, bool absent, const uint8_t *e,
                   uint32_t el, const uint8_t *d, uint32_t dl)
{
    size_t pos = ddp__proto_begin(f, DDP__OP_CAS, 0);
    int r = ddp_buf_put_str(f, t->key, t->kl) |
            ddp_buf_put_u8(f, absent ? DDP__CAS_EXPECT_ABSENT : 0) | ddp_buf_put_str(f, e, el) |
            ddp_buf_put_str(f, d, dl);
    ddp__proto_end(f, pos);
    return r;
}

static int put_get(struct ddp_buf *f, const struct ddp__tp *t)
{
    size_t pos = ddp__proto_begin(f, DDP__OP_GET, 0);
    int r = ddp_buf_put_str(f, t->key, t->kl);
    ddp__proto_end(f, pos);
    return r;
}

/* The store's requests for q (ids 0, one at a time). */
static int translate(struct ddp__tp *t, const struct ddp__treq *q, struct ddp_buf *f,
                     struct ddp_buf *out, const char **why)
{
    if ((q->op == DDP__T_SET || q->op == DDP__T_APPEND || q->op == DDP__T_CAS ||
         q->op == DDP__T_GET || q->op == DDP__T_ADD || q->op == DDP__T_DELETE) &&
        t->plen + q->kl > DDP__MAX_KEY) {
        *why = TOO_LONG;
        return -1;
    }
    size_t start = f->len - f->off, pos; /* relative, as ddp__proto_begin's */
    int r = 0;
    *why = NULL;
    t->op = q->op;
    t->stage = 0;
    t->active = true;
    switch (q->op) {
    case DDP__T_VALIDATE:
        t->active = false;
        return 0;
    case DDP__T_PING:
        t->active = false;
        return ddp_buf_put_u32(out, q->u32) ? -1 : 0; /* the nonce back */
    case DDP__T_CANCEL_WAIT:
        t->active = false; /* a STOP_WAITING already sent precedes this; none follows */
        return ddp_buf_put_u8(out, 1) ? -1 : 0; /* WAIT_CANCELED */
    case DDP__T_SET:
        pos = ddp__proto_begin(f, DDP__OP_SET, 0);
        r = put_key(f, t, q->k, q->kl) | ddp_buf_put_str(f, q->v, q->vl) | ddp_buf_put_u64(f, 0);
        ddp__proto_end(f, pos);
        break;
    case DDP__T_GET:
    case DDP__T_DELETE:
        pos = ddp__proto_begin(f, q->op == DDP__T_GET ? DDP__OP_GET : DDP__OP_DELETE, 0);
        r = put_key(f, t, q->k, q->kl);
        ddp__proto_end(f, pos);
        break;
    case DDP__T_ADD:
        pos = ddp__proto_begin(f, DDP__OP_ADD, 0);
        r = put_key(f, t, q->k, q->kl) | ddp_buf_put_u64(f, q->u64);
        ddp__proto_end(f, pos);
        break;
    case DDP__T_NUMKEYS: /* the round's keys, as the launcher's TCPStore port counts them */
        pos = ddp__proto_begin(f, DDP__OP_NUM_KEYS, 0);
        r = ddp_buf_put_str(f, t->prefix, t->plen);
        ddp__proto_end(f, pos);
        break;
    case DDP__T_CHECK:
    case DDP__T_MULTI_GET:
    case DDP__T_WAIT:
        pos = ddp__proto_begin(f,
                               q->op == DDP__T_CHECK       ? DDP__OP_CHECK
                               : q->op == DDP__T_MULTI_GET ? DDP__OP_MULTI_GET
                                                           : DDP__OP_WAIT,
                               0);
        if (q->op == DDP__T_WAIT)
            r = ddp_buf_put_u32(f, DDP__WAIT_FOREVER);
        r |= put_keys(f, t, q, why);
        ddp__proto_end(f, pos);
        t->left = q->u64;
        break;
    case DDP__T_MULTI_SET: {
        size_t off = 0;
        t->left = q->u64;
        for (uint64_t i = 0; i < q->u64 && !r; i++) {
            const uint8_t *k, *v;
            uint32_t kl, vl;
            ddp__torch_list_next(q, &off, &k, &kl);
            ddp__torch_list_next(q, &off, &v, &vl);
            if (t->plen + kl > DDP__MAX_KEY) {
                *why = TOO_LONG;
                r = -1;
                break;
            }
            pos = ddp__proto_begin(f, DDP__OP_SET, 0);
            r = put_key(f, t, k, kl) | ddp_buf_put_str(f, v, vl) | ddp_buf_put_u64(f, 0);
            ddp__proto_end(f, pos);
        }
        if (!q->u64)
            t->active = false;
        break;
    }
    case DDP__T_CAS:
    case DDP__T_APPEND:
        /* several of the store's requests on one key: it is kept, with the values */
        t->kl = t->plen + q->kl;
        if (!(t->key = concat((const uint8_t *)t->prefix, t->plen, q->k, q->kl)) ||
            !(t->a = concat(q->v, q->vl, NULL, 0)) ||
            (q->op == DDP__T_CAS && !(t->b = concat(q->v2, q->v2l, NULL, 0)))) {
            r = -1;
            break;
        }
        t->al = q->vl;
        t->bl = q->v2l;
        if (q->op == DDP__T_APPEND)
            r = put_get(f, t);
        else /* an empty expected value: absent first (TCPStore creates the key then) */
            r = put_cas(f, t, t->al == 0, t->a, t->al, t->b, t->bl);
        t->stage = q->op == DDP__T_CAS && t->al ? 1 : 0;
        break;
    }
    if (r == 0 && q->op != DDP__T_MULTI_SET && f->len - f->off - start > DDP__MAX_FRAME) {
        *why = "a request over the store's frame size";
        r = -1;
    }
    if (r) {
        if (!*why)
            *why = "out of memory";
        f->len = f->off + start;
        done(t);
        return -1;
    }
    return 0;
}

int ddp__tp_request(struct ddp__tp *t, const uint8_t *in, size_t len, size_t *used,
                    struct ddp_buf *frames, struct ddp_buf *out, const char **why)
{
    struct ddp__treq q;
    if (t->active)
        return 0;
    int r = ddp__torch_parse(&t->w, in, len, &q, why);
    if (r <= 0)
        return r;
    *used = q.len;
    return translate(t, &q, frames, out, why) < 0 ? -1 : 1;
}

/* ---- the store's answers ---- */

static int put_bytes(struct ddp_buf *out, const uint8_t *p, uint32_t n)
{
    return ddp_buf_put_u64(out, n) | ddp_buf_put(out, p, n);
}

static int fail(const char **why, const char *what)
{
    *why = what;
    return -1;
}

int ddp__tp_reply(struct ddp__tp *t, int status, const uint8_t *p, size_t n, struct ddp_buf *frames,
                  struct ddp_buf *out, const char **why)
{
    struct ddp_rd rd;
    ddp_rd_init(&rd, p, n);
    const uint8_t *s;
    uint32_t sl;
    uint64_t u;
    uint8_t swapped, present;
    int r = 0;
    if (!t->active)
        return fail(why, "an answer of the store that answers nothing");
    if (status == DDP_ENOKEY && t->op == DDP__T_GET) {
        if (!t->w.v22) /* 1.13's server closes; clients WAIT before a GET */
            return fail(why, "GET of a key that does not exist");
        done(t);
        return put_bytes(out, NULL, 0) ? fail(why, "out of memory") : 0;
    }
    if (status == DDP_ENOTINT && t->op == DDP__T_ADD)
        return fail(why, "ADD to a value that is not a decimal number");
    if (status == DDP_EINVAL && t->op == DDP__T_ADD)
        return fail(why, "ADD overflows int64");
    if (!(status == DDP_ENOKEY && t->op == DDP__T_APPEND) && status != 0) {
        *why = ddp_strerror(status); /* the store's, or the proxy's connection to it */
        return -1;
    }
    switch (t->op) {
    case DDP__T_SET:
        break;
    case DDP__T_GET:
        if (ddp_rd_str(&rd, DDP__MAX_VALUE, &s, &sl) < 0)
            return fail(why, "a malformed answer of the store");
        r = put_bytes(out, s, sl);
        break;
    case DDP__T_ADD:
    case DDP__T_DELETE:
    case DDP__T_NUMKEYS:
        if (ddp_rd_u64(&rd, &u) < 0)
            return fail(why, "a malformed answer of the store");
        r = ddp_buf_put_u64(out, u);
        break;
    case DDP__T_CHECK:
        if (ddp_rd_u8(&rd, &present) < 0)
            return fail(why, "a malformed answer of the store");
        r = ddp_buf_put_u8(out, present ? 0 : 1); /* READY 0, NOT_READY 1 */
        break;
    case DDP__T_WAIT:
        r = ddp_buf_put_u8(out, 0); /* STOP_WAITING */
        break;
    case DDP__T_MULTI_GET:
        for (uint64_t i = 0; i < t->left && !r; i++) {
            if (ddp_rd_u8(&rd, &present) < 0 || ddp_rd_str(&rd, DDP__MAX_VALUE, &s, &sl) < 0)
                return fail(why, "a malformed answer of the store");
            r = put_bytes(out, present ? s : NULL, present ? sl : 0);
        }
        break;
    case DDP__T_MULTI_SET:
        if (--t->left)
            return 0; /* its next SET is already in frames */
        break;
    case DDP__T_CAS:
        if (ddp_rd_u8(&rd, &swapped) < 0 || ddp_rd_u8(&rd, &present) < 0 ||
            ddp_rd_str(&rd, DDP__MAX_VALUE, &s, &sl) < 0)
            return fail(why, "a malformed answer of the store");
        if (t->stage == 0 && !swapped && present && sl == 0) {
            /* an empty expected value meets a present empty one: equal, so replaced */
            t->stage = 1;
            return put_cas(frames, t, false, NULL, 0, t->b, t->bl) ? fail(why, "out of memory") : 0;
        }
        /* the value now; where there is none, the expected one (as TCPStore answers) */
        r = present ? put_bytes(out, s, sl) : put_bytes(out, t->a, t->al);
        break;
    case DDP__T_APPEND:
        if (t->stage == 1) {
            if (ddp_rd_u8(&rd, &swapped) < 0)
                return fail(why, "a malformed answer of the store");
            if (swapped)
                break;
            t->stage = 0; /* another client's change came between: again */
            return put_get(frames, t) ? fail(why, "out of memory") : 0;
        }
        t->stage = 1;
        if (status == DDP_ENOKEY)
            return put_cas(frames, t, true, NULL, 0, t->a, t->al) ? fail(why, "out of memory") : 0;
        if (ddp_rd_str(&rd, DDP__MAX_VALUE, &s, &sl) < 0)
            return fail(why, "a malformed answer of the store");
        if ((uint64_t)sl + t->al > DDP__MAX_VALUE)
            return fail(why, "APPEND past the store's 16 MiB value");
        uint8_t *nv = concat(s, sl, t->a, t->al);
        if (!nv)
            return fail(why, "out of memory");
        r = put_cas(frames, t, false, s, sl, nv, sl + t->al);
        free(nv);
        return r ? fail(why, "out of memory") : 0;
    default:
        return fail(why, "an answer of the store that answers nothing");
    }
    done(t);
    return r ? fail(why, "out of memory") : 0;
}

bool ddp__tp_waiting(const struct ddp__tp *t)
{
    return t->active && t->op == DDP__T_WAIT;
}

void ddp__tp_give_up(struct ddp__tp *t)
{
    done(t);
}
