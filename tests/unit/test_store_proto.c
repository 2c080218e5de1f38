/* Unit tests for rendezvous/proto.c and common/buf.c: frame sizing, every op's parser and its error
 * paths. */
#include "common/buf.h"
#include "rendezvous/proto.h"
#include "tests/unit/test.h"

#include "common/banned.h"

/* Builds a request frame with the given body writer. */
static struct ddp_buf frame(uint8_t op, void (*body)(struct ddp_buf *))
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__proto_begin(&b, op, 7);
    if (body)
        body(&b);
    ddp__proto_end(&b, pos);
    return b;
}

static int parse(struct ddp_buf *b, struct ddp__req *q)
{
    return ddp__proto_parse_req(b->data, b->len, q);
}

TEST(buf_roundtrip)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    ASSERT_OK(ddp_buf_put_u8(&b, 0xab));
    ASSERT_OK(ddp_buf_put_u16(&b, 0x1234));
    ASSERT_OK(ddp_buf_put_u32(&b, 0xdeadbeef));
    ASSERT_OK(ddp_buf_put_u64(&b, 0x0102030405060708ull));
    ASSERT_OK(ddp_buf_put_str(&b, "hey", 3));
    /* little-endian on the wire, whatever the host */
    ASSERT_EQ(b.data[1], 0x34);
    ASSERT_EQ(b.data[3], 0xef);
    struct ddp_rd r;
    uint8_t u8;
    uint16_t u16;
    uint32_t u32, n;
    uint64_t u64;
    const uint8_t *p;
    ddp_rd_init(&r, b.data, b.len);
    ASSERT_OK(ddp_rd_u8(&r, &u8));
    ASSERT_OK(ddp_rd_u16(&r, &u16));
    ASSERT_OK(ddp_rd_u32(&r, &u32));
    ASSERT_OK(ddp_rd_u64(&r, &u64));
    ASSERT_OK(ddp_rd_str(&r, 10, &p, &n));
    ASSERT_EQ(u8, 0xab);
    ASSERT_EQ(u16, 0x1234);
    ASSERT_EQ(u32, 0xdeadbeef);
    ASSERT_EQ(u64, 0x0102030405060708ull);
    ASSERT_EQ(n, 3);
    ASSERT_MEMEQ(p, "hey", 3);
    ASSERT_EQ(ddp_rd_left(&r), 0);
    /* short input: error, out-parameter untouched */
    u32 = 99;
    ASSERT_ERR(ddp_rd_u32(&r, &u32), DDP_EPROTO);
    ASSERT_EQ(u32, 99);
    ddp_buf_release(&b);
}

TEST(buf_str_limits)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    ddp_buf_put_u32(&b, 100); /* claims 100 bytes, has 2 */
    ddp_buf_put(&b, "ab", 2);
    struct ddp_rd r;
    const uint8_t *p;
    uint32_t n = 5;
    ddp_rd_init(&r, b.data, b.len);
    ASSERT_ERR(ddp_rd_str(&r, 1000, &p, &n), DDP_EPROTO);
    ASSERT_EQ(r.off, 0); /* cursor restored */
    ASSERT_ERR(ddp_rd_str(&r, 50, &p, &n), DDP_ETOOBIG);
    ASSERT_EQ(n, 5);
    ddp_buf_release(&b);
}

TEST(buf_compact_and_reuse)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    for (int i = 0; i < 1000; i++)
        ASSERT_OK(ddp_buf_put_u32(&b, (uint32_t)i));
    b.off = 3996;
    ddp_buf_compact(&b);
    ASSERT_EQ(b.len, 4);
    struct ddp_rd r;
    uint32_t v;
    ddp_rd_init(&r, b.data, b.len);
    ASSERT_OK(ddp_rd_u32(&r, &v));
    ASSERT_EQ(v, 999);
    ddp_buf_release(&b);
}

TEST(frame_size)
{
    uint8_t hdr[9] = {5, 0, 0, 0, 0x10, 1, 0, 0, 0};
    ASSERT_EQ(ddp__proto_frame_size(hdr, 3, 100), 0); /* no length yet */
    ASSERT_EQ(ddp__proto_frame_size(hdr, 8, 100), 0); /* incomplete */
    ASSERT_EQ(ddp__proto_frame_size(hdr, 9, 100), 9); /* complete */
    uint8_t small[4] = {4, 0, 0, 0};
    ASSERT_ERR((int)ddp__proto_frame_size(small, 4, 100), DDP_EPROTO);
    uint8_t huge[4] = {0xff, 0xff, 0xff, 0x7f};
    ASSERT_ERR((int)ddp__proto_frame_size(huge, 4, DDP__MAX_FRAME), DDP_ETOOBIG);
    uint8_t preauth[4] = {200, 0, 0, 0};
    ASSERT_ERR((int)ddp__proto_frame_size(preauth, 4, DDP__MAX_PREAUTH_FRAME), DDP_ETOOBIG);
}

static void body_hello(struct ddp_buf *b)
{
    uint8_t n[16] = {1, 2, 3};
    ddp_buf_put_u32(b, DDP__PROTO_MAGIC);
    ddp_buf_put_u16(b, 1);
    ddp_buf_put_u16(b, 0);
    ddp_buf_put(b, n, 16);
}
static void body_set(struct ddp_buf *b)
{
    ddp_buf_put_str(b, "k", 1);
    ddp_buf_put_str(b, "value", 5);
    ddp_buf_put_u64(b, 42);
}
static void body_add(struct ddp_buf *b)
{
    ddp_buf_put_str(b, "ctr", 3);
    ddp_buf_put_u64(b, (uint64_t)-5);
}
static void body_cas(struct ddp_buf *b)
{
    ddp_buf_put_str(b, "k", 1);
    ddp_buf_put_u8(b, DDP__CAS_EXPECT_ABSENT);
    ddp_buf_put_str(b, "", 0);
    ddp_buf_put_str(b, "new", 3);
}
static void body_wait(struct ddp_buf *b)
{
    ddp_buf_put_u32(b, 1500);
    ddp_buf_put_u32(b, 2);
    ddp_buf_put_str(b, "a", 1);
    ddp_buf_put_str(b, "bb", 2);
}
static void body_watch(struct ddp_buf *b)
{
    ddp_buf_put_u8(b, DDP__WATCH_PREFIX);
    ddp_buf_put_str(b, "nodes/", 6);
}

static void body_prefix(struct ddp_buf *b)
{
    ddp_buf_put_str(b, "torch/3/", 8);
}

TEST(parse_valid_ops)
{
    struct ddp__req q;
    struct ddp_buf b = frame(DDP__OP_HELLO, body_hello);
    ASSERT_OK(parse(&b, &q));
    ASSERT_EQ(q.op, DDP__OP_HELLO);
    ASSERT_EQ(q.id, 7);
    ASSERT_EQ(q.magic, DDP__PROTO_MAGIC);
    ASSERT_EQ(q.version, 1);
    ASSERT_EQ(q.nonce[1], 2);
    ddp_buf_release(&b);

    b = frame(DDP__OP_SET, body_set);
    ASSERT_OK(parse(&b, &q));
    ASSERT_EQ(q.klen, 1);
    ASSERT_EQ(q.vlen, 5);
    ASSERT_MEMEQ(q.val, "value", 5);
    ASSERT_EQ(q.u64, 42);
    ddp_buf_release(&b);

    b = frame(DDP__OP_ADD, body_add);
    ASSERT_OK(parse(&b, &q));
    ASSERT_EQ(q.i64, -5);
    ddp_buf_release(&b);

    b = frame(DDP__OP_CAS, body_cas);
    ASSERT_OK(parse(&b, &q));
    ASSERT_EQ(q.flags, DDP__CAS_EXPECT_ABSENT);
    ASSERT_EQ(q.elen, 0);
    ASSERT_EQ(q.vlen, 3);
    ddp_buf_release(&b);

    b = frame(DDP__OP_WAIT, body_wait);
    ASSERT_OK(parse(&b, &q));
    ASSERT_EQ(q.u32, 1500);
    ASSERT_EQ(q.nkeys, 2);
    {
        struct ddp_rd r = q.keys;
        const uint8_t *k;
        uint32_t kl;
        ASSERT_OK(ddp_rd_str(&r, 100, &k, &kl));
        ASSERT_OK(ddp_rd_str(&r, 100, &k, &kl));
        ASSERT_EQ(kl, 2);
        ASSERT_MEMEQ(k, "bb", 2);
    }
    ddp_buf_release(&b);

    b = frame(DDP__OP_WATCH, body_watch);
    ASSERT_OK(parse(&b, &q));
    ASSERT_EQ(q.flags, DDP__WATCH_PREFIX);
    ASSERT_EQ(q.klen, 6);
    ddp_buf_release(&b);

    b = frame(DDP__OP_PING, NULL);
    ASSERT_OK(parse(&b, &q));
    ddp_buf_release(&b);
    b = frame(DDP__OP_NUM_KEYS, NULL);
    ASSERT_OK(parse(&b, &q));
    ASSERT_TRUE(q.key == NULL);
    ddp_buf_release(&b);
    b = frame(DDP__OP_NUM_KEYS, body_prefix); /* only the keys under a prefix */
    ASSERT_OK(parse(&b, &q));
    ASSERT_EQ(q.klen, 8);
    ASSERT_MEMEQ(q.key, "torch/3/", 8);
    ddp_buf_release(&b);
}

static void body_trailing(struct ddp_buf *b)
{
    ddp_buf_put_u8(b, 0);
}
static void body_bigkey(struct ddp_buf *b)
{
    static uint8_t k[DDP__MAX_KEY + 1];
    ddp_buf_put_str(b, k, sizeof(k));
}
static void body_zero_keys(struct ddp_buf *b)
{
    ddp_buf_put_u32(b, 0);
}
static void body_many_keys(struct ddp_buf *b)
{
    ddp_buf_put_u32(b, DDP__MAX_MULTI + 1);
}
static void body_short_keylist(struct ddp_buf *b)
{
    ddp_buf_put_u32(b, 3);
    ddp_buf_put_str(b, "a", 1);
}
static void body_bad_cas_flags(struct ddp_buf *b)
{
    ddp_buf_put_str(b, "k", 1);
    ddp_buf_put_u8(b, 0x80);
    ddp_buf_put_str(b, "", 0);
    ddp_buf_put_str(b, "", 0);
}
static void body_bad_watch_flags(struct ddp_buf *b)
{
    ddp_buf_put_u8(b, 0x02);
    ddp_buf_put_str(b, "k", 1);
}
static void body_short_set(struct ddp_buf *b)
{
    ddp_buf_put_str(b, "k", 1);
    ddp_buf_put_str(b, "v", 1); /* lease id missing */
}

TEST(parse_errors)
{
    struct ddp__req q;
    q.op = 0xee;
    struct ddp_buf b = frame(0x77, NULL); /* unknown op */
    ASSERT_ERR(parse(&b, &q), DDP_EPROTO);
    ASSERT_EQ(q.op, 0xee); /* untouched on failure */
    ddp_buf_release(&b);
    b = frame(DDP__OP_PING, body_trailing);
    ASSERT_ERR(parse(&b, &q), DDP_EPROTO);
    ddp_buf_release(&b);
    b = frame(DDP__OP_GET, body_bigkey);
    ASSERT_ERR(parse(&b, &q), DDP_ETOOBIG);
    ddp_buf_release(&b);
    b = frame(DDP__OP_CHECK, body_zero_keys); /* an empty list is a list */
    ASSERT_OK(parse(&b, &q));
    ASSERT_EQ(q.nkeys, 0);
    ddp_buf_release(&b);
    b = frame(DDP__OP_MULTI_GET, body_many_keys); /* over the limit: answered ETOOBIG */
    ASSERT_ERR(parse(&b, &q), DDP_ETOOBIG);
    ddp_buf_release(&b);
    q.op = 0xee;
    b = frame(DDP__OP_CHECK, body_short_keylist);
    ASSERT_ERR(parse(&b, &q), DDP_EPROTO);
    ddp_buf_release(&b);
    b = frame(DDP__OP_CAS, body_bad_cas_flags);
    ASSERT_ERR(parse(&b, &q), DDP_EPROTO);
    ddp_buf_release(&b);
    b = frame(DDP__OP_WATCH, body_bad_watch_flags);
    ASSERT_ERR(parse(&b, &q), DDP_EPROTO);
    ddp_buf_release(&b);
    b = frame(DDP__OP_SET, body_short_set);
    ASSERT_ERR(parse(&b, &q), DDP_EPROTO);
    ddp_buf_release(&b);
    b = frame(DDP__OP_HELLO, NULL); /* hello without a body */
    ASSERT_ERR(parse(&b, &q), DDP_EPROTO);
    ddp_buf_release(&b);
    /* a length field that disagrees with the buffer */
    b = frame(DDP__OP_PING, NULL);
    b.data[0] = 9;
    ASSERT_ERR(parse(&b, &q), DDP_EPROTO);
    ddp_buf_release(&b);
}

TEST(mac_binds_token_and_nonces)
{
    uint8_t a[16] = {1}, bn[16] = {2}, m1[32], m2[32], m3[32], m4[32];
    ASSERT_OK(ddp__proto_mac((const uint8_t *)"tok", 3, DDP__LABEL_CLIENT, a, bn, m1));
    ASSERT_OK(ddp__proto_mac((const uint8_t *)"tok", 3, DDP__LABEL_CLIENT, a, bn, m2));
    ASSERT_TRUE(ddp__proto_mac_equal(m1, m2));
    ASSERT_OK(ddp__proto_mac((const uint8_t *)"tok2", 4, DDP__LABEL_CLIENT, a, bn, m3));
    ASSERT_TRUE(!ddp__proto_mac_equal(m1, m3));
    ASSERT_OK(ddp__proto_mac((const uint8_t *)"tok", 3, DDP__LABEL_SERVER, a, bn, m4));
    ASSERT_TRUE(
        !ddp__proto_mac_equal(m1, m4)); /* a client MAC cannot be replayed as the server's */
    /* Reference value from Python's hmac module, so a client in another language can check
     * itself: HMAC-SHA256("tok", "ddprun-store-v1 client" || 01 00*15 || 02 00*15). */
    static const char want[] = "b2aefb245562b529fbfed8fdd5a567973935adb608663d5f94dd16c7f263c0df";
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", m1[i]);
    ASSERT_STREQ(hex, want);
}

TEST(err_strings)
{
    ASSERT_STREQ(ddp_err_name(DDP_ETIMEDOUT), "DDP_ETIMEDOUT");
    ASSERT_STREQ(ddp_strerror(DDP_EAUTH), "authentication failed");
    ASSERT_STREQ(ddp_strerror(12345), "unknown error");
}
