/* The store's wire protocol: frame layout, op codes, limits, request parsing and the HMAC
 * handshake. */
#ifndef DDP_RENDEZVOUS_PROTO_H
#define DDP_RENDEZVOUS_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

/*
 * Every frame: u32 len | u8 op | u32 id | body, little-endian, where len
 * counts the bytes after itself (so len >= 5). Replies carry op | 0x80, the
 * request's id, an i32 status (0 or a DDP_E* code) and, on success, the op's
 * payload. Pushed watch events carry DDP__OP_EVENT and the watch id.
 * man/ddprun-store.7 is the normative description.
 */
#define DDP__PROTO_MAGIC 0x53504444u /* "DDPS" on the wire */
#define DDP__PROTO_VERSION 1
#define DDP__FRAME_HDR 9 /* len + op + id */
#define DDP__NONCE_LEN 16
#define DDP__MAC_LEN 32
#define DDP__REPLY_BIT 0x80

#define DDP__MAX_KEY 4096u
#define DDP__MAX_VALUE (16u << 20)
#define DDP__MAX_FRAME (DDP__MAX_VALUE + 2 * DDP__MAX_KEY + 64) /* any authenticated frame */
#define DDP__MAX_PREAUTH_FRAME 128u                             /* HELLO and AUTH are tiny */
#define DDP__MAX_MULTI 65536u /* keys in one CHECK/WAIT/MULTI_GET */
#define DDP__WAIT_FOREVER 0xffffffffu

enum ddp__op {
    DDP__OP_HELLO = 0x01,
    DDP__OP_AUTH = 0x02,
    DDP__OP_PING = 0x10,
    DDP__OP_SET = 0x11,
    DDP__OP_GET = 0x12,
    DDP__OP_ADD = 0x13,
    DDP__OP_CAS = 0x14,
    DDP__OP_DELETE = 0x15,
    DDP__OP_CHECK = 0x16,
    DDP__OP_NUM_KEYS = 0x17,
    DDP__OP_WAIT = 0x18,
    DDP__OP_MULTI_GET = 0x19,
    DDP__OP_WATCH = 0x1a,
    DDP__OP_UNWATCH = 0x1b,
    DDP__OP_LEASE_GRANT = 0x1c,
    DDP__OP_LEASE_KEEPALIVE = 0x1d,
    DDP__OP_LEASE_REVOKE = 0x1e,
    DDP__OP_EVENT = 0xf0,
};

#define DDP__CAS_EXPECT_ABSENT 0x01
#define DDP__WATCH_PREFIX 0x01

/* A parsed request. Pointers refer into the frame it was parsed from. */
struct ddp__req {
    uint8_t op;
    uint32_t id;
    const uint8_t *key;
    uint32_t klen;
    const uint8_t *val; /* SET value, CAS desired */
    uint32_t vlen;
    const uint8_t *exp; /* CAS expected */
    uint32_t elen;
    int64_t i64;        /* ADD delta */
    uint64_t u64;       /* lease id */
    uint32_t u32;       /* WAIT timeout, LEASE_GRANT ttl, UNWATCH id */
    uint8_t flags;      /* CAS, WATCH */
    uint32_t nkeys;     /* CHECK, WAIT, MULTI_GET */
    struct ddp_rd keys; /* reader positioned at the key list */
    /* HELLO */
    uint32_t magic;
    uint16_t version;
    const uint8_t *nonce;
    /* AUTH */
    const uint8_t *mac;
};

/*
 * Looks at the first avail bytes of a stream. Returns the whole frame's size
 * (header included) once it is complete, 0 if more bytes are needed, or
 * DDP_ETOOBIG / DDP_EPROTO when the declared length is above max or below the
 * minimum; nothing is allocated before this check.
 */
long ddp__proto_frame_size(const uint8_t *p, size_t avail, uint32_t max);

/*
 * Parses one complete request frame (as sized by ddp__proto_frame_size). The
 * whole body is validated, including every key of a multi-key op, so the
 * server can act on it without further checks. Returns 0, DDP_EPROTO
 * (malformed, unknown op, trailing bytes) or DDP_ETOOBIG (a key or value over
 * its limit).
 */
int ddp__proto_parse_req(const uint8_t *frame, size_t len, struct ddp__req *req);

/* Starts a frame in b (op, id) and returns the position of its length field, counted from the
 * buffer's pending bytes (b->off), not its storage: a put that needs room may move the pending
 * bytes to the front of it (ddp_buf_reserve). Nothing may be consumed from b before _end. */
size_t ddp__proto_begin(struct ddp_buf *b, uint8_t op, uint32_t id);
/* Back-patches the length of the frame started at pos. */
void ddp__proto_end(struct ddp_buf *b, size_t pos);

/*
 * HMAC-SHA256(token, label || a || b) into out (32 bytes). label is
 * "ddprun-store-v1 client" or "ddprun-store-v1 server". DDP_EAUTH if OpenSSL fails.
 */
int ddp__proto_mac(const uint8_t *token, size_t toklen, const char *label, const uint8_t *a,
                   const uint8_t *b, uint8_t *out);
/* Constant-time comparison of two MACs. */
bool ddp__proto_mac_equal(const uint8_t *a, const uint8_t *b);

#define DDP__LABEL_CLIENT "ddprun-store-v1 client"
#define DDP__LABEL_SERVER "ddprun-store-v1 server"

/* For ddprun's node agents, which relay their ranks' requests (cli/agent/store_proxy.c): the
 * socket of a store client (ddp_store_connect: connected, the token proved both ways), taken from
 * it and s freed; the fd, or -1 (an etcd store, or one already broken) with s left as it was. */
struct ddp_store;
int ddp__store_take_fd(struct ddp_store *s);

#endif
