/*
 * A buffer in pieces (ddp_pg_allreduce_pieces_start): element ranges of the concatenation read
 * out of it, written into it, or handed out in place when they lie inside one piece. Accesses
 * move forward through the buffer, so a cursor remembers the piece the last one ended in.
 */
#include "worker/coll.h"

#include <string.h>

#include "common/banned.h"

void ddp__pieces_init(struct ddp__pieces *v, const struct ddp_piece *p, size_t n, size_t esz)
{
    *v = (struct ddp__pieces){.p = p, .n = n, .esz = esz};
}

/* Moves the cursor to the piece holding element off (or the end). */
static void seek(struct ddp__pieces *v, size_t off)
{
    if (off < v->at_off) {
        v->at = 0;
        v->at_off = 0;
    }
    while (v->at < v->n && off >= v->at_off + v->p[v->at].count) {
        v->at_off += v->p[v->at].count;
        v->at++;
    }
}

/* Copies elements [off, off + count) between the pieces and flat: out of them when to_flat. */
static void move(struct ddp__pieces *v, size_t off, size_t count, char *flat, bool to_flat)
{
    while (count) {
        seek(v, off);
        if (v->at >= v->n)
            return; /* past the end: callers stay inside the total */
        const struct ddp_piece *pc = &v->p[v->at];
        size_t in = off - v->at_off, k = pc->count - in < count ? pc->count - in : count;
        char *at = (char *)pc->data + in * v->esz;
        if (to_flat)
            memcpy(flat, at, k * v->esz);
        else
            memcpy(at, flat, k * v->esz);
        flat += k * v->esz;
        off += k;
        count -= k;
    }
}

void ddp__pieces_read(struct ddp__pieces *v, size_t off, size_t count, void *dst)
{
    move(v, off, count, dst, true);
}

void ddp__pieces_write(struct ddp__pieces *v, size_t off, size_t count, const void *src)
{
    move(v, off, count, (char *)src, false);
}

void *ddp__pieces_span(struct ddp__pieces *v, size_t off, size_t count)
{
    seek(v, off);
    if (v->at >= v->n || off + count > v->at_off + v->p[v->at].count)
        return NULL;
    return (char *)v->p[v->at].data + (off - v->at_off) * v->esz;
}

void *ddp__pieces_run(struct ddp__pieces *v, size_t off, size_t *count)
{
    seek(v, off);
    if (v->at >= v->n)
        return NULL;
    size_t left = v->at_off + v->p[v->at].count - off;
    if (*count > left)
        *count = left;
    return (char *)v->p[v->at].data + (off - v->at_off) * v->esz;
}

void *ddp__pieces_bytes(struct ddp__pieces *v, size_t off, size_t *len)
{
    seek(v, off / v->esz);
    if (v->at >= v->n)
        return NULL;
    size_t end = (v->at_off + v->p[v->at].count) * v->esz;
    if (*len > end - off)
        *len = end - off;
    return (char *)v->p[v->at].data + (off - v->at_off * v->esz);
}
