/*
 * libFuzzer target for the agent link's wire (cli/proto/agent_wire.c), as the launcher's agent
 * port meets it from anyone who connects: the first byte picks a path.
 *   0  the handshake's first message (ddp__aw_s1) and second (ddp__aw_check_c2) from the bytes,
 *      then the rest as records (ddp__seal_open) under the keys those nonces give, and what
 *      opens as frames and ATTACH: nothing may read outside the bytes, and a record not sealed
 *      with the key must never open
 *   1  BOOT and 2 ATTACH bodies: what parses encodes back to exactly its bytes
 *   3  sealing: the bytes sealed by one end open at the other as themselves, in pieces as a
 *      socket delivers them; with any one byte changed they do not open
 *   4  a BOOT_GROUP body, as every agent of an srun step parses it: an entry found is one of
 *      the group's, built again it parses to the same
 *   5  the SSH tree's frames (cli/proto/agent_tree.c), as an agent and the launcher parse them:
 *      SPAWN encodes back to exactly its bytes, the others parse within the bytes
 */
#include "cli/proto/agent_proto.h"
#include "cli/proto/agent_tree.h"
#include "cli/proto/agent_wire.h"
#include "common/buf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static const char *TOKEN = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

static void handshake_and_records(const uint8_t *d, size_t n)
{
    uint8_t cn[DDP__AW_NONCE], sn[DDP__AW_NONCE], s1[DDP__AW_S1_LEN];
    if (n < DDP__AW_C1_LEN || ddp__aw_s1(TOKEN, d, cn, sn, s1) != 0)
        return;
    d += DDP__AW_C1_LEN;
    n -= DDP__AW_C1_LEN;
    if (n < DDP__AW_C2_LEN)
        return;
    if (ddp__aw_check_c2(TOKEN, cn, sn, d) == 0)
        abort(); /* a MAC guessed from random bytes: the check is broken */
    d += DDP__AW_C2_LEN;
    n -= DDP__AW_C2_LEN;
    struct ddp__seal s;
    if (ddp__seal_init(&s, TOKEN, cn, sn, false) != 0)
        abort();
    struct ddp_buf raw, plain;
    ddp_buf_init(&raw);
    ddp_buf_init(&plain);
    ddp_buf_put(&raw, d, n);
    if (ddp__seal_open(&s, &raw, &plain) == 0 && plain.len)
        abort(); /* opened without the key */
    ddp_buf_release(&raw);
    ddp_buf_release(&plain);
}

static void boot(const uint8_t *d, size_t n)
{
    struct ddp__aw_boot *x = calloc(1, sizeof(*x));
    if (x && ddp__aw_get_boot(d, n, x) == 0) {
        struct ddp_buf b;
        ddp_buf_init(&b);
        if (ddp__aw_put_boot(&b, x) != 0 || b.len != 5 + n || memcmp(b.data + 5, d, n) != 0)
            abort();
        ddp_buf_release(&b);
    }
    free(x);
}

static void attach(const uint8_t *d, size_t n)
{
    struct ddp__aw_attach a;
    if (ddp__aw_get_attach(d, n, &a) != 0)
        return;
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (ddp__aw_put_attach(&b, &a) != 0 || b.len != 5 + n || memcmp(b.data + 5, d, n) != 0)
        abort();
    ddp_buf_release(&b);
}

static void seal_both_ways(const uint8_t *d, size_t n)
{
    uint8_t cn[DDP__AW_NONCE] = {1}, sn[DDP__AW_NONCE] = {2};
    struct ddp__seal ag, la;
    if (ddp__seal_init(&ag, TOKEN, cn, sn, true) != 0 ||
        ddp__seal_init(&la, TOKEN, cn, sn, false) != 0)
        abort();
    struct ddp_buf wire, raw, plain;
    ddp_buf_init(&wire);
    ddp_buf_init(&raw);
    ddp_buf_init(&plain);
    /* two sends: the second's nonce differs */
    size_t half = n / 2;
    if (ddp__seal_put(&ag, d, half, &wire) != 0 || ddp__seal_put(&ag, d + half, n - half, &wire))
        abort();
    /* delivered in pieces of 1 + d[0] % 61 bytes */
    size_t step = n ? 1 + d[0] % 61 : 1;
    for (size_t off = 0; off < wire.len; off += step) {
        size_t m = wire.len - off < step ? wire.len - off : step;
        ddp_buf_put(&raw, wire.data + off, m);
        if (ddp__seal_open(&la, &raw, &plain) != 0)
            abort();
    }
    if (plain.len != n || (n && memcmp(plain.data, d, n) != 0) || ddp_buf_pending(&raw))
        abort();
    if (wire.len) { /* one byte changed: it must not open */
        struct ddp__seal la2;
        ddp__seal_init(&la2, TOKEN, cn, sn, false);
        wire.data[(size_t)d[0] * 7919 % wire.len] ^= 0x01;
        raw.len = raw.off = 0;
        plain.len = plain.off = 0;
        ddp_buf_put(&raw, wire.data, wire.len);
        int r = ddp__seal_open(&la2, &raw, &plain);
        if (r == 0 && !ddp_buf_pending(&raw) && plain.len == n)
            abort();
    }
    ddp_buf_release(&wire);
    ddp_buf_release(&raw);
    ddp_buf_release(&plain);
}

static void boot_group(const uint8_t *d, size_t n)
{
    struct ddp__aw_boot *x = calloc(1, sizeof(*x)), *y = calloc(1, sizeof(*y));
    if (x && y && ddp__aw_get_boot_group(d, n, "n1", x) == 0) {
        struct ddp_buf b;
        ddp_buf_init(&b);
        size_t pos = ddp__aw_group_begin(&b, x->token);
        ddp__aw_group_add(&b, "n1", x->node, x->ticket, x->addrs);
        ddp__aw_group_end(&b, pos, 1);
        if (ddp__aw_get_boot_group(b.data + 5, b.len - 5, "n1", y) != 0 || y->node != x->node ||
            strcmp(y->ticket, x->ticket) != 0 || strcmp(y->addrs, x->addrs) != 0 ||
            strcmp(y->token, x->token) != 0)
            abort();
        ddp_buf_release(&b);
    }
    free(x);
    free(y);
}

static void tree(const uint8_t *d, size_t n)
{
    struct ddp__spawn *sp = calloc(1, sizeof(*sp));
    if (sp && ddp__tree_get_spawn(d, n, sp) == 0) {
        struct ddp_buf b;
        ddp_buf_init(&b);
        if (ddp__tree_put_spawn(&b, sp) != 0 || b.len != n + 5 || memcmp(b.data + 5, d, n) != 0)
            abort();
        ddp_buf_release(&b);
    }
    free(sp);
    uint32_t node, start, sl;
    const uint8_t *s;
    uint8_t level;
    int32_t st;
    if (ddp__tree_get_node_str(d, n, &node, &start, &s, &sl) == 0 &&
        (s + sl > d + n || memchr(s, 0, sl)))
        abort();
    if (ddp__tree_get_known_hosts(d, n, &s, &sl) == 0 && s + sl > d + n)
        abort();
    if (ddp__tree_get_unspawn(d, n, &node, &start, &level) == 0 && (level < 1 || level > 2))
        abort();
    ddp__tree_get_child_exit(d, n, &node, &start, &st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    switch (data[0] % 6) {
    case 0:
        handshake_and_records(data + 1, size - 1);
        break;
    case 1:
        boot(data + 1, size - 1);
        break;
    case 2:
        attach(data + 1, size - 1);
        break;
    case 3:
        seal_both_ways(data + 1, size - 1);
        break;
    case 4:
        boot_group(data + 1, size - 1);
        break;
    default:
        tree(data + 1, size - 1);
        break;
    }
    return 0;
}
