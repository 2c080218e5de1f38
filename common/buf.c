/* Implementation of common/buf.h. */
#include "common/buf.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

void ddp_buf_init(struct ddp_buf *b)
{
    memset(b, 0, sizeof(*b));
}

void ddp_buf_release(struct ddp_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

int ddp_buf_reserve(struct ddp_buf *b, size_t n)
{
    if (b->cap - b->len >= n)
        return 0;
    /* Reclaim consumed space before growing. */
    if (b->off > 0 && b->cap - (b->len - b->off) >= n && b->off >= b->cap / 2) {
        ddp_buf_compact(b);
        return 0;
    }
    size_t need = b->len + n;
    if (need < b->len)
        return DDP_ENOMEM;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return DDP_ENOMEM;
        cap *= 2;
    }
    uint8_t *d = realloc(b->data, cap);
    if (!d)
        return DDP_ENOMEM;
    b->data = d;
    b->cap = cap;
    return 0;
}

void ddp_buf_compact(struct ddp_buf *b)
{
    if (b->off == 0)
        return;
    size_t pending = b->len - b->off;
    if (pending)
        memmove(b->data, b->data + b->off, pending);
    b->len = pending;
    b->off = 0;
}

int ddp_buf_put(struct ddp_buf *b, const void *p, size_t n)
{
    int r = ddp_buf_reserve(b, n);
    if (r < 0)
        return r;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int ddp_buf_put_u8(struct ddp_buf *b, uint8_t v)
{
    return ddp_buf_put(b, &v, 1);
}

int ddp_buf_put_u16(struct ddp_buf *b, uint16_t v)
{
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    return ddp_buf_put(b, x, 2);
}

int ddp_buf_put_u32(struct ddp_buf *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    return ddp_buf_put(b, x, 4);
}

int ddp_buf_put_u64(struct ddp_buf *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    return ddp_buf_put(b, x, 8);
}

int ddp_buf_put_str(struct ddp_buf *b, const void *p, size_t n)
{
    int r;
    if (n > UINT32_MAX)
        return DDP_ETOOBIG;
    if ((r = ddp_buf_reserve(b, 4 + n)) < 0)
        return r;
    ddp_buf_put_u32(b, (uint32_t)n);
    return ddp_buf_put(b, p, n);
}

void ddp_buf_patch_u32(struct ddp_buf *b, size_t pos, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b->data[pos + (size_t)i] = (uint8_t)(v >> (8 * i));
}

int ddp_rd_raw(struct ddp_rd *r, size_t n, const uint8_t **p)
{
    if (ddp_rd_left(r) < n)
        return DDP_EPROTO;
    *p = r->p + r->off;
    r->off += n;
    return 0;
}

int ddp_rd_u8(struct ddp_rd *r, uint8_t *v)
{
    const uint8_t *p;
    if (ddp_rd_raw(r, 1, &p) < 0)
        return DDP_EPROTO;
    *v = p[0];
    return 0;
}

int ddp_rd_u16(struct ddp_rd *r, uint16_t *v)
{
    const uint8_t *p;
    if (ddp_rd_raw(r, 2, &p) < 0)
        return DDP_EPROTO;
    *v = (uint16_t)(p[0] | (p[1] << 8));
    return 0;
}

int ddp_rd_u32(struct ddp_rd *r, uint32_t *v)
{
    const uint8_t *p;
    if (ddp_rd_raw(r, 4, &p) < 0)
        return DDP_EPROTO;
    *v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return 0;
}

int ddp_rd_u64(struct ddp_rd *r, uint64_t *v)
{
    const uint8_t *p;
    if (ddp_rd_raw(r, 8, &p) < 0)
        return DDP_EPROTO;
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    *v = x;
    return 0;
}

int ddp_rd_i64(struct ddp_rd *r, int64_t *v)
{
    uint64_t u;
    if (ddp_rd_u64(r, &u) < 0)
        return DDP_EPROTO;
    *v = (int64_t)u;
    return 0;
}

int ddp_rd_str(struct ddp_rd *r, uint32_t max, const uint8_t **p, uint32_t *n)
{
    struct ddp_rd save = *r;
    uint32_t len;
    if (ddp_rd_u32(r, &len) < 0)
        return DDP_EPROTO;
    if (len > max) {
        *r = save;
        return DDP_ETOOBIG;
    }
    if (ddp_rd_raw(r, len, p) < 0) {
        *r = save;
        return DDP_EPROTO;
    }
    *n = len;
    return 0;
}
