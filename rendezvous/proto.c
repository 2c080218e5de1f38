/* Frame sizing, request parsing and handshake MACs for the store protocol (see proto.h). */
#include "rendezvous/proto.h"
#include "common/err.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>

#include "common/banned.h"

long ddp__proto_frame_size(const uint8_t *p, size_t avail, uint32_t max)
{
    struct ddp_rd r;
    uint32_t len;
    if (avail < 4)
        return 0;
    ddp_rd_init(&r, p, avail);
    ddp_rd_u32(&r, &len);
    if (len < DDP__FRAME_HDR - 4)
        return DDP_EPROTO;
    if (len > max)
        return DDP_ETOOBIG;
    if (avail - 4 < len)
        return 0;
    return (long)len + 4;
}

/* Checks a list of n keys without keeping them; the server re-reads them later. */
static int check_keys(struct ddp_rd *r, uint32_t n)
{
    const uint8_t *k;
    uint32_t kl;
    int e;
    for (uint32_t i = 0; i < n; i++)
        if ((e = ddp_rd_str(r, DDP__MAX_KEY, &k, &kl)) < 0)
            return e;
    return 0;
}

int ddp__proto_parse_req(const uint8_t *frame, size_t len, struct ddp__req *out)
{
    struct ddp_rd r;
    struct ddp__req q;
    uint32_t flen;
    int e = DDP_EPROTO;

    memset(&q, 0, sizeof(q));
    ddp_rd_init(&r, frame, len);
    if (ddp_rd_u32(&r, &flen) < 0 || flen != len - 4 || ddp_rd_u8(&r, &q.op) < 0 ||
        ddp_rd_u32(&r, &q.id) < 0)
        return DDP_EPROTO;

    switch (q.op) {
    case DDP__OP_HELLO: {
        uint16_t resv;
        if (ddp_rd_u32(&r, &q.magic) < 0 || ddp_rd_u16(&r, &q.version) < 0 ||
            ddp_rd_u16(&r, &resv) < 0 || ddp_rd_raw(&r, DDP__NONCE_LEN, &q.nonce) < 0)
            return DDP_EPROTO;
        break;
    }
    case DDP__OP_AUTH:
        if (ddp_rd_raw(&r, DDP__MAC_LEN, &q.mac) < 0)
            return DDP_EPROTO;
        break;
    case DDP__OP_PING:
        break;
    case DDP__OP_NUM_KEYS: /* nothing, or a prefix: only the keys under it count */
        if (ddp_rd_left(&r) && (e = ddp_rd_str(&r, DDP__MAX_KEY, &q.key, &q.klen)) < 0)
            return e;
        break;
    case DDP__OP_SET:
        if ((e = ddp_rd_str(&r, DDP__MAX_KEY, &q.key, &q.klen)) < 0 ||
            (e = ddp_rd_str(&r, DDP__MAX_VALUE, &q.val, &q.vlen)) < 0 ||
            (e = ddp_rd_u64(&r, &q.u64)) < 0)
            return e;
        break;
    case DDP__OP_GET:
    case DDP__OP_DELETE:
        if ((e = ddp_rd_str(&r, DDP__MAX_KEY, &q.key, &q.klen)) < 0)
            return e;
        break;
    case DDP__OP_ADD:
        if ((e = ddp_rd_str(&r, DDP__MAX_KEY, &q.key, &q.klen)) < 0 ||
            (e = ddp_rd_i64(&r, &q.i64)) < 0)
            return e;
        break;
    case DDP__OP_CAS:
        if ((e = ddp_rd_str(&r, DDP__MAX_KEY, &q.key, &q.klen)) < 0 ||
            (e = ddp_rd_u8(&r, &q.flags)) < 0 ||
            (e = ddp_rd_str(&r, DDP__MAX_VALUE, &q.exp, &q.elen)) < 0 ||
            (e = ddp_rd_str(&r, DDP__MAX_VALUE, &q.val, &q.vlen)) < 0)
            return e;
        if (q.flags & ~DDP__CAS_EXPECT_ABSENT)
            return DDP_EPROTO;
        break;
    case DDP__OP_WAIT:
        if ((e = ddp_rd_u32(&r, &q.u32)) < 0)
            return e;
        /* Then a key list, as for CHECK. */
        __attribute__((fallthrough));
    case DDP__OP_CHECK:
    case DDP__OP_MULTI_GET:
        if ((e = ddp_rd_u32(&r, &q.nkeys)) < 0)
            return e;
        /* n = 0 is an empty list (CHECK and WAIT: true at once; MULTI_GET: no values). */
        if (q.nkeys > DDP__MAX_MULTI)
            return DDP_ETOOBIG;
        q.keys = r;
        if ((e = check_keys(&r, q.nkeys)) < 0)
            return e;
        break;
    case DDP__OP_WATCH:
        if ((e = ddp_rd_u8(&r, &q.flags)) < 0 ||
            (e = ddp_rd_str(&r, DDP__MAX_KEY, &q.key, &q.klen)) < 0)
            return e;
        if (q.flags & ~DDP__WATCH_PREFIX)
            return DDP_EPROTO;
        break;
    case DDP__OP_UNWATCH:
    case DDP__OP_LEASE_GRANT:
        if ((e = ddp_rd_u32(&r, &q.u32)) < 0)
            return e;
        break;
    case DDP__OP_LEASE_KEEPALIVE:
    case DDP__OP_LEASE_REVOKE:
        if ((e = ddp_rd_u64(&r, &q.u64)) < 0)
            return e;
        break;
    default:
        return DDP_EPROTO;
    }
    if (ddp_rd_left(&r) != 0)
        return DDP_EPROTO;
    *out = q;
    return 0;
}

size_t ddp__proto_begin(struct ddp_buf *b, uint8_t op, uint32_t id)
{
    size_t pos = b->len - b->off; /* from the pending bytes' start, which a put may move */
    ddp_buf_put_u32(b, 0);
    ddp_buf_put_u8(b, op);
    ddp_buf_put_u32(b, id);
    return pos;
}

void ddp__proto_end(struct ddp_buf *b, size_t pos)
{
    ddp_buf_patch_u32(b, b->off + pos, (uint32_t)(b->len - b->off - pos - 4));
}

int ddp__proto_mac(const uint8_t *token, size_t toklen, const char *label, const uint8_t *a,
                   const uint8_t *b, uint8_t *out)
{
    uint8_t msg[64];
    size_t ll = strlen(label);
    unsigned int outlen = 0;
    if (ll + 2 * DDP__NONCE_LEN > sizeof(msg))
        return DDP_EINVAL;
    memcpy(msg, label, ll);
    memcpy(msg + ll, a, DDP__NONCE_LEN);
    memcpy(msg + ll + DDP__NONCE_LEN, b, DDP__NONCE_LEN);
    if (!HMAC(EVP_sha256(), token, (int)toklen, msg, ll + 2 * DDP__NONCE_LEN, out, &outlen) ||
        outlen != DDP__MAC_LEN)
        return DDP_EAUTH;
    return 0;
}

bool ddp__proto_mac_equal(const uint8_t *a, const uint8_t *b)
{
    return CRYPTO_memcmp(a, b, DDP__MAC_LEN) == 0;
}
