/* Growable byte buffers for building frames, and bounds-checked readers for parsing them. */
#ifndef DDP_COMMON_BUF_H
#define DDP_COMMON_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * A growable buffer. Bytes [off, len) are pending (unread or unsent); writers
 * append at len. Integers are encoded little-endian. Embedded: _init/_release.
 */
struct ddp_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
    size_t off;
};

void ddp_buf_init(struct ddp_buf *b);
/* Frees the storage; the buffer is left empty and reusable. */
void ddp_buf_release(struct ddp_buf *b);
/* Ensures room for n more bytes after len. DDP_ENOMEM on failure. */
int ddp_buf_reserve(struct ddp_buf *b, size_t n);
/* Drops consumed bytes [0, off) by moving the pending ones to the front. */
void ddp_buf_compact(struct ddp_buf *b);
/* Number of pending bytes. */
static inline size_t ddp_buf_pending(const struct ddp_buf *b)
{
    return b->len - b->off;
}

int ddp_buf_put(struct ddp_buf *b, const void *p, size_t n);
int ddp_buf_put_u8(struct ddp_buf *b, uint8_t v);
int ddp_buf_put_u16(struct ddp_buf *b, uint16_t v);
int ddp_buf_put_u32(struct ddp_buf *b, uint32_t v);
int ddp_buf_put_u64(struct ddp_buf *b, uint64_t v);
/* u32 length then the bytes. DDP_ETOOBIG if n does not fit in 32 bits. */
int ddp_buf_put_str(struct ddp_buf *b, const void *p, size_t n);
/* Overwrites 4 bytes at absolute position pos (for back-patching a length). */
void ddp_buf_patch_u32(struct ddp_buf *b, size_t pos, uint32_t v);

/*
 * A read cursor over borrowed bytes. Every getter checks the remaining length
 * first and returns DDP_EPROTO, leaving the out-parameter untouched, when the
 * input is short: callers never index untrusted bytes themselves.
 */
struct ddp_rd {
    const uint8_t *p;
    size_t len;
    size_t off;
};

static inline void ddp_rd_init(struct ddp_rd *r, const void *p, size_t len)
{
    r->p = (const uint8_t *)p;
    r->len = len;
    r->off = 0;
}
static inline size_t ddp_rd_left(const struct ddp_rd *r)
{
    return r->len - r->off;
}

int ddp_rd_u8(struct ddp_rd *r, uint8_t *v);
int ddp_rd_u16(struct ddp_rd *r, uint16_t *v);
int ddp_rd_u32(struct ddp_rd *r, uint32_t *v);
int ddp_rd_u64(struct ddp_rd *r, uint64_t *v);
int ddp_rd_i64(struct ddp_rd *r, int64_t *v);
/* Exactly n raw bytes; *p points into the reader's buffer. */
int ddp_rd_raw(struct ddp_rd *r, size_t n, const uint8_t **p);
/* u32 length then bytes; the length must be <= max. *p points into the buffer. */
int ddp_rd_str(struct ddp_rd *r, uint32_t max, const uint8_t **p, uint32_t *n);

#endif
