/* The replicated checkpoints' frames and the replication port's request (cli/proto/ckpt_proto.h).
 * Every getter takes untrusted bytes: lengths are checked before use, paths are checked to stay
 * under the folder, and a body must be used up exactly (the encoding is canonical). */
#include "cli/proto/ckpt_proto.h"
#include "cli/proto/agent_proto.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define SYNC_MAX_FILES (1u << 16)
#define SYNC_MAX_ADDRS 4096u

bool ddp__ck_rel_ok(const char *rel, size_t n)
{
    if (n == 0 || n > DDP__CK_REL_MAX || rel[0] == '/')
        return false;
    size_t start = 0;
    for (size_t k = 0; k <= n; k++) {
        if (k < n && ((unsigned char)rel[k] < 0x20 || rel[k] == 0x7f))
            return false;
        if (k == n || rel[k] == '/') {
            size_t l = k - start;
            if (l == 0 || (l == 1 && rel[start] == '.') ||
                (l == 2 && rel[start] == '.' && rel[start + 1] == '.'))
                return false;
            start = k + 1;
        }
    }
    return true;
}

static int put_s(struct ddp_buf *b, const char *s)
{
    return ddp_buf_put_str(b, s, strlen(s));
}

/* A string of at most max bytes into out (max + 1 bytes), no NUL in it. */
static int get_s(struct ddp_rd *r, char *out, size_t max)
{
    const uint8_t *p;
    uint32_t l;
    if (ddp_rd_str(r, (uint32_t)max, &p, &l) < 0 || memchr(p, 0, l))
        return DDP_EPROTO;
    memcpy(out, p, l);
    out[l] = '\0';
    return 0;
}

static int get_rel(struct ddp_rd *r, char out[DDP__CK_REL_MAX + 1])
{
    if (get_s(r, out, DDP__CK_REL_MAX) < 0 || !ddp__ck_rel_ok(out, strlen(out)))
        return DDP_EPROTO;
    return 0;
}

static int get_sha(struct ddp_rd *r, uint8_t sha[32])
{
    const uint8_t *p;
    if (ddp_rd_raw(r, 32, &p) < 0)
        return DDP_EPROTO;
    memcpy(sha, p, 32);
    return 0;
}

/* ---- CKPT_FILE ---- */

int ddp__ck_put_file(struct ddp_buf *b, const struct ddp__ck_file *f)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_CKPT_FILE);
    int r = ddp_buf_put_u8(b, f->kind);
    r |= ddp_buf_put_u32(b, f->round);
    r |= put_s(b, f->rel);
    r |= ddp_buf_put_u64(b, f->size);
    r |= ddp_buf_put(b, f->sha, 32);
    ddp__agent_end(b, pos);
    return r ? DDP_ENOMEM : 0;
}

int ddp__ck_get_file(const uint8_t *body, size_t len, struct ddp__ck_file *f)
{
    struct ddp_rd r;
    ddp_rd_init(&r, body, len);
    if (ddp_rd_u8(&r, &f->kind) < 0 ||
        (f->kind != DDP__CK_FINISHED && f->kind != DDP__CK_REMOVED) ||
        ddp_rd_u32(&r, &f->round) < 0 || get_rel(&r, f->rel) < 0 || ddp_rd_u64(&r, &f->size) < 0 ||
        get_sha(&r, f->sha) < 0 || ddp_rd_left(&r) != 0)
        return DDP_EPROTO;
    return 0;
}

/* ---- CKPT_SYNC ---- */

int ddp__ck_put_sync(struct ddp_buf *b, const struct ddp__ck_sync *s)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_CKPT_SYNC);
    int r = ddp_buf_put_u32(b, s->id);
    r |= ddp_buf_put_u8(b, s->flags);
    r |= ddp_buf_put_u32(b, s->naddr);
    for (uint32_t k = 0; k < s->naddr; k++)
        r |= put_s(b, s->addr[k]);
    r |= ddp_buf_put_u32(b, s->n);
    for (uint32_t k = 0; k < s->n; k++) {
        const struct ddp__ck_entry *e = &s->e[k];
        r |= ddp_buf_put_u8(b, e->op);
        r |= put_s(b, e->rel);
        if (e->op != DDP__CK_HAVE)
            continue;
        r |= ddp_buf_put_u64(b, e->size);
        r |= ddp_buf_put(b, e->sha, 32);
        r |= ddp_buf_put_u32(b, e->nh);
        for (uint32_t h = 0; h < e->nh; h++)
            r |= ddp_buf_put_u32(b, e->holder[h]);
    }
    ddp__agent_end(b, pos);
    return r ? DDP_ENOMEM : 0;
}

void ddp__ck_sync_release(struct ddp__ck_sync *s)
{
    for (uint32_t k = 0; s->addr && k < s->naddr; k++)
        free(s->addr[k]);
    for (uint32_t k = 0; s->e && k < s->n; k++) {
        free(s->e[k].rel);
        free(s->e[k].holder);
    }
    free(s->addr);
    free(s->e);
    memset(s, 0, sizeof(*s));
}

static int get_entry(struct ddp_rd *r, uint32_t naddr, struct ddp__ck_entry *e)
{
    char rel[DDP__CK_REL_MAX + 1];
    if (ddp_rd_u8(r, &e->op) < 0 || (e->op != DDP__CK_HAVE && e->op != DDP__CK_DROP) ||
        get_rel(r, rel) < 0)
        return DDP_EPROTO;
    if (!(e->rel = strdup(rel)))
        return DDP_ENOMEM;
    if (e->op != DDP__CK_HAVE)
        return 0;
    if (ddp_rd_u64(r, &e->size) < 0 || get_sha(r, e->sha) < 0 || ddp_rd_u32(r, &e->nh) < 0 ||
        e->nh > naddr || (size_t)e->nh * 4 > ddp_rd_left(r))
        return DDP_EPROTO;
    if (e->nh && !(e->holder = calloc(e->nh, sizeof(*e->holder))))
        return DDP_ENOMEM;
    for (uint32_t h = 0; h < e->nh; h++)
        if (ddp_rd_u32(r, &e->holder[h]) < 0 || e->holder[h] >= naddr)
            return DDP_EPROTO;
    return 0;
}

int ddp__ck_get_sync(const uint8_t *body, size_t len, struct ddp__ck_sync *s)
{
    struct ddp_rd r;
    memset(s, 0, sizeof(*s));
    ddp_rd_init(&r, body, len);
    uint32_t naddr, n;
    int rc = DDP_EPROTO;
    /* (each address takes at least 4 bytes, each entry 9: counts beyond what is left are lies) */
    if (ddp_rd_u32(&r, &s->id) < 0 || ddp_rd_u8(&r, &s->flags) < 0 || s->flags > 1 ||
        ddp_rd_u32(&r, &naddr) < 0 || naddr > SYNC_MAX_ADDRS || (size_t)naddr * 4 > ddp_rd_left(&r))
        goto fail;
    if (naddr && !(s->addr = calloc(naddr, sizeof(*s->addr)))) {
        rc = DDP_ENOMEM;
        goto fail;
    }
    s->naddr = naddr;
    for (uint32_t k = 0; k < naddr; k++) {
        char a[DDP__CK_ADDR_MAX + 1];
        if (get_s(&r, a, DDP__CK_ADDR_MAX) < 0 || !a[0])
            goto fail;
        if (!(s->addr[k] = strdup(a))) {
            rc = DDP_ENOMEM;
            goto fail;
        }
    }
    if (ddp_rd_u32(&r, &n) < 0 || n > SYNC_MAX_FILES || (size_t)n * 9 > ddp_rd_left(&r))
        goto fail;
    if (n && !(s->e = calloc(n, sizeof(*s->e)))) {
        rc = DDP_ENOMEM;
        goto fail;
    }
    s->n = n;
    for (uint32_t k = 0; k < n; k++)
        if ((rc = get_entry(&r, naddr, &s->e[k])) < 0)
            goto fail;
    if (ddp_rd_left(&r) == 0)
        return 0;
    rc = DDP_EPROTO;
fail:
    ddp__ck_sync_release(s);
    return rc;
}

/* ---- CKPT_SYNCED ---- */

int ddp__ck_put_synced(struct ddp_buf *b, const struct ddp__ck_synced *s)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_CKPT_SYNCED);
    int r = ddp_buf_put_u32(b, s->id);
    r |= ddp_buf_put_u32(b, s->files);
    r |= ddp_buf_put_u64(b, s->bytes);
    r |= ddp_buf_put_u64(b, s->ms);
    r |= ddp_buf_put_u32(b, s->nfail);
    for (uint32_t k = 0; k < s->nfail; k++) {
        r |= put_s(b, s->fail[k].rel);
        r |= put_s(b, s->fail[k].why);
    }
    ddp__agent_end(b, pos);
    return r ? DDP_ENOMEM : 0;
}

int ddp__ck_get_synced(const uint8_t *body, size_t len, struct ddp__ck_synced *s)
{
    struct ddp_rd r;
    memset(s, 0, sizeof(*s));
    ddp_rd_init(&r, body, len);
    uint32_t n;
    if (ddp_rd_u32(&r, &s->id) < 0 || ddp_rd_u32(&r, &s->files) < 0 ||
        ddp_rd_u64(&r, &s->bytes) < 0 || ddp_rd_u64(&r, &s->ms) < 0 || ddp_rd_u32(&r, &n) < 0 ||
        n > SYNC_MAX_FILES || (size_t)n * 8 > ddp_rd_left(&r))
        return DDP_EPROTO;
    if (n && !(s->fail = calloc(n, sizeof(*s->fail))))
        return DDP_ENOMEM;
    s->nfail = n;
    for (uint32_t k = 0; k < n; k++)
        if (get_rel(&r, s->fail[k].rel) < 0 || get_s(&r, s->fail[k].why, DDP__CK_WHY_MAX) < 0)
            goto bad;
    if (ddp_rd_left(&r) == 0)
        return 0;
bad:
    free(s->fail);
    s->fail = NULL;
    s->nfail = 0;
    return DDP_EPROTO;
}

/* ---- CKPT_PORT ---- */

int ddp__ck_put_port(struct ddp_buf *b, const char *addr, const char *why)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_CKPT_PORT);
    int r = put_s(b, addr);
    r |= put_s(b, why);
    ddp__agent_end(b, pos);
    return r ? DDP_ENOMEM : 0;
}

int ddp__ck_get_port(const uint8_t *body, size_t len, char addr[DDP__CK_ADDR_MAX + 1],
                     char why[DDP__CK_WHY_MAX + 1])
{
    struct ddp_rd r;
    ddp_rd_init(&r, body, len);
    if (get_s(&r, addr, DDP__CK_ADDR_MAX) < 0 || get_s(&r, why, DDP__CK_WHY_MAX) < 0 ||
        ddp_rd_left(&r) != 0)
        return DDP_EPROTO;
    for (const char *p = addr; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            return DDP_EPROTO;
    return 0;
}

/* ---- the replication port's request ---- */

int ddp__ck_put_request(struct ddp_buf *b, const char *rel)
{
    size_t pos = ddp__agent_begin(b, DDP__CK_GET);
    int r = put_s(b, rel);
    ddp__agent_end(b, pos);
    return r ? DDP_ENOMEM : 0;
}

int ddp__ck_get_request(const uint8_t *p, size_t n, char rel[DDP__CK_REL_MAX + 1], size_t *used)
{
    struct ddp_rd r;
    uint32_t flen;
    uint8_t type;
    ddp_rd_init(&r, p, n);
    if (ddp_rd_u32(&r, &flen) < 0)
        return 0;
    if (flen < 5 || flen > 5 + 4 + DDP__CK_REL_MAX)
        return DDP_EPROTO;
    if (n - 4 < flen)
        return 0;
    struct ddp_rd body;
    ddp_rd_init(&body, p + 4, flen);
    if (ddp_rd_u8(&body, &type) < 0 || type != DDP__CK_GET || get_rel(&body, rel) < 0 ||
        ddp_rd_left(&body) != 0)
        return DDP_EPROTO;
    *used = 4 + flen;
    return 1;
}
