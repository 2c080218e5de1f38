/* PyTorch's TCPStore requests, parsed (rendezvous/torch_wire.h). */
#include "rendezvous/torch_wire.h"

#include <string.h>

#include "common/banned.h"

/* The op of wire byte b in the connection's numbering; -1 for one not served. */
static int op_of(const struct ddp__tconn *t, uint8_t b)
{
    /* 1.13's nine ops (WATCH_KEY, 7, is not served); 2.0 and 2.1 added APPEND to CANCEL_WAIT */
    static const int v113[] = {DDP__T_SET,        DDP__T_CAS,    DDP__T_GET,       DDP__T_ADD,
                               DDP__T_CHECK,      DDP__T_WAIT,   DDP__T_NUMKEYS,   -1,
                               DDP__T_DELETE,     DDP__T_APPEND, DDP__T_MULTI_GET, DDP__T_MULTI_SET,
                               DDP__T_CANCEL_WAIT};
    static const int v22[] = {DDP__T_VALIDATE,    DDP__T_SET,    DDP__T_CAS,       DDP__T_GET,
                              DDP__T_ADD,         DDP__T_CHECK,  DDP__T_WAIT,      DDP__T_NUMKEYS,
                              DDP__T_DELETE,      DDP__T_APPEND, DDP__T_MULTI_GET, DDP__T_MULTI_SET,
                              DDP__T_CANCEL_WAIT, DDP__T_PING};
    if (t->v22)
        return b < sizeof(v22) / sizeof(v22[0]) ? v22[b] : -1;
    return b < sizeof(v113) / sizeof(v113[0]) ? v113[b] : -1;
}

/* A reader over the buffered bytes: 0 when a field is not whole yet, -1 when over its limit. */
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

/* A string (u64 length, bytes) of at most max bytes. */
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

/* A count (u64, at most DDP__TORCH_MAX_KEYS) and that many strings, or pairs of them. */
static int rd_list(struct rd *r, bool pairs, struct ddp__treq *q)
{
    int k = rd_u64(r, &q->u64);
    if (k <= 0)
        return k;
    if (q->u64 > DDP__TORCH_MAX_KEYS)
        return -1;
    q->list = r->p + r->off;
    const uint8_t *s;
    uint32_t n;
    for (uint64_t i = 0; i < q->u64; i++) {
        if ((k = rd_str(r, DDP__TORCH_MAX_KEY, &s, &n)) <= 0)
            return k;
        if (pairs && (k = rd_str(r, DDP__TORCH_MAX_VALUE, &s, &n)) <= 0)
            return k;
    }
    return 1;
}

int ddp__torch_parse(struct ddp__tconn *t, const uint8_t *p, size_t len, struct ddp__treq *q,
                     const char **why)
{
    if (len == 0)
        return 0;
    struct rd r = {.p = p, .len = len};
    if (!t->known) {
        /* VALIDATE (0 + the magic) opens torch >= 2.2's connections; a 1.13 SET also starts
         * with 0, but its u64 key length would then be about 1 GiB: not a key. */
        if (len < 5 && p[0] == 0)
            return 0;
        uint32_t m = 0;
        t->v22 = p[0] == 0 && (r.off = 1, rd_u32(&r, &m)) && m == DDP__TORCH_MAGIC;
        t->known = true;
    }
    memset(q, 0, sizeof(*q));
    int op = op_of(t, p[0]);
    if (op < 0) {
        *why = "an operation this store does not serve (a client of another torch version?)";
        return -1;
    }
    q->op = (enum ddp__top)op;
    r.off = 1;
    int need = 1;
    switch (q->op) {
    case DDP__T_VALIDATE:
    case DDP__T_PING:
        need = rd_u32(&r, &q->u32);
        break;
    case DDP__T_SET:
    case DDP__T_APPEND:
        if ((need = rd_str(&r, DDP__TORCH_MAX_KEY, &q->k, &q->kl)) > 0)
            need = rd_str(&r, DDP__TORCH_MAX_VALUE, &q->v, &q->vl);
        break;
    case DDP__T_CAS:
        if ((need = rd_str(&r, DDP__TORCH_MAX_KEY, &q->k, &q->kl)) > 0 &&
            (need = rd_str(&r, DDP__TORCH_MAX_VALUE, &q->v, &q->vl)) > 0)
            need = rd_str(&r, DDP__TORCH_MAX_VALUE, &q->v2, &q->v2l);
        break;
    case DDP__T_GET:
    case DDP__T_DELETE:
        need = rd_str(&r, DDP__TORCH_MAX_KEY, &q->k, &q->kl);
        break;
    case DDP__T_ADD:
        if ((need = rd_str(&r, DDP__TORCH_MAX_KEY, &q->k, &q->kl)) > 0)
            need = rd_u64(&r, &q->u64);
        break;
    case DDP__T_CHECK:
    case DDP__T_WAIT:
    case DDP__T_MULTI_GET:
        need = rd_list(&r, false, q);
        break;
    case DDP__T_MULTI_SET:
        need = rd_list(&r, true, q);
        break;
    case DDP__T_NUMKEYS:
    case DDP__T_CANCEL_WAIT:
        break;
    }
    if (need < 0) {
        *why = "a key, value or key count over the limit";
        return -1;
    }
    /* whole or not: however much of it one read brought */
    if ((need == 0 && len > DDP__TORCH_MAX_REQUEST) || r.off > DDP__TORCH_MAX_REQUEST) {
        *why = "a request over 17 MiB";
        return -1;
    }
    if (need == 0)
        return 0; /* not whole yet: the opcode often comes in a segment of its own */
    if (q->op == DDP__T_VALIDATE && q->u32 != DDP__TORCH_MAGIC) {
        *why = "VALIDATE with a wrong magic number";
        return -1;
    }
    q->len = r.off;
    return 1;
}

void ddp__torch_list_next(const struct ddp__treq *q, size_t *off, const uint8_t **s, uint32_t *n)
{
    uint64_t l = 0;
    for (int i = 7; i >= 0; i--)
        l = l << 8 | q->list[*off + (size_t)i];
    *s = q->list + *off + 8;
    *n = (uint32_t)l;
    *off += 8 + (size_t)l;
}
