/*
 * libFuzzer target for the frames between the launcher and a node agent (cli/proto/agent_proto.c):
 * arbitrary bytes are cut into frames as both ends' read paths do (ddp__agent_next, the
 * input fed in pieces as a pipe or an SSH channel delivers it), and each JOIN, START and
 * STATE body is parsed, and each HELLO (with an agent's counts of its node). A frame must lie
 * inside the bytes given; a body that parses must encode back to exactly its bytes (the encoding is
 * canonical: nothing is lost or invented between launcher and agent), and parse again. The
 * replicated checkpoints' frames (cli/proto/ckpt_proto.c) are parsed the same way: every path in
 * one that parses stays under the folder; and the replication port's request parser takes the
 * bytes as they come.
 */
#include "cli/proto/agent_proto.h"
#include "cli/proto/ckpt_proto.h"
#include "common/buf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* The frame re-encoded by put must be 4 length bytes, the type, then exactly body. */
static void same_bytes(const struct ddp_buf *b, uint8_t type, const uint8_t *body, size_t len)
{
    if (b->len != 5 + len || b->data[4] != type || (len && memcmp(b->data + 5, body, len) != 0))
        abort();
}

static void check_join(const uint8_t *body, size_t len)
{
    struct ddp__agent_join j, again;
    if (ddp__agent_get_join(body, len, &j) != 0)
        return;
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (ddp__agent_put_join(&b, &j) != 0)
        abort();
    same_bytes(&b, DDP__AG_JOIN, body, len);
    if (ddp__agent_get_join(b.data + 5, b.len - 5, &again) != 0)
        abort();
    ddp__agent_join_release(&again);
    ddp_buf_release(&b);
    ddp__agent_join_release(&j);
}

static void check_start(const uint8_t *body, size_t len)
{
    struct ddp__agent_start st, again;
    if (ddp__agent_get_start(body, len, &st) != 0)
        return;
    if (!st.argv || !st.env || !st.shell_env || !st.warm_imports || st.nlocal == 0 ||
        st.nlocal > 4096)
        abort();
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (ddp__agent_put_start(&b, &st) != 0)
        abort();
    same_bytes(&b, DDP__AG_START, body, len);
    if (ddp__agent_get_start(b.data + 5, b.len - 5, &again) != 0)
        abort();
    ddp__agent_start_release(&again);
    ddp_buf_release(&b);
    ddp__agent_start_release(&st);
}

static void check_state(const uint8_t *body, size_t len)
{
    struct ddp__agent_state s;
    if (ddp__agent_get_state(body, len, &s) != 0)
        return;
    if (s.nlocal && !s.ranks)
        abort();
    /* Without a round's workers a launcher never sends ranks: put writes none. */
    if (s.have_start || s.nlocal == 0) {
        struct ddp_buf b;
        ddp_buf_init(&b);
        if (ddp__agent_put_state(&b, &s) != 0)
            abort();
        same_bytes(&b, DDP__AG_STATE, body, len);
        ddp_buf_release(&b);
    }
    free(s.ranks);
}

/* A HELLO that parses has a printable version of 1-64 bytes, counts a node can have and a port
 * of 1-65535; put writes its first fields back (a later protocol's fields after them are
 * skipped). */
static void check_hello(uint8_t type, const uint8_t *body, size_t len)
{
    uint32_t proto;
    char ver[DDP__AGENT_VERSION_MAX + 1];
    if (ddp__agent_get_hello(body, len, &proto, ver, sizeof(ver)) != 0)
        return;
    size_t n = strlen(ver);
    if (n == 0 || n > DDP__AGENT_VERSION_MAX)
        abort();
    for (size_t i = 0; i < n; i++)
        if (ver[i] <= ' ' || ver[i] > '~')
            abort();
    struct ddp__node_counts c;
    int has = ddp__agent_get_hello_counts(body, len, &c);
    if (has == 0 && (c.cpus > (1u << 20) || c.driver_gpus > 4096 || c.slurm_gpus < -1 ||
                     c.slurm_gpus > 4096 || c.cvd_gpus < -1 || c.cvd_gpus > 4096))
        abort(); /* what the launcher accepts is what a node can have (cli/sys/devices.h) */
    uint32_t port = 0;
    int hp = ddp__agent_get_hello_port(body, len, &port);
    if (hp == 0 && (port == 0 || port > 65535))
        abort(); /* MASTER_PORT is a port */
    if (proto == DDP__AGENT_PROTO) {
        /* the counts without a port: put writes a port after them, not compared */
        struct ddp_buf b;
        ddp_buf_init(&b);
        if (ddp__agent_put_hello(&b, type, ver, has == 0 ? &c : NULL, port) != 0)
            abort();
        size_t m = b.len - 5 - (has == 0 && hp != 0 ? 4 : 0);
        if (m > len || memcmp(b.data + 5, body, m) != 0)
            abort();
        ddp_buf_release(&b);
    }
}

static void path_ok(const char *rel)
{
    if (!ddp__ck_rel_ok(rel, strlen(rel)) || rel[0] == '/' || strstr(rel, "/../") ||
        !strncmp(rel, "../", 3))
        abort();
}

static void check_ckpt(uint8_t type, const uint8_t *body, size_t len)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (type == DDP__AG_CKPT_SYNC) {
        struct ddp__ck_sync s, again;
        if (ddp__ck_get_sync(body, len, &s) != 0)
            return;
        for (uint32_t k = 0; k < s.n; k++) {
            path_ok(s.e[k].rel);
            for (uint32_t h = 0; h < s.e[k].nh; h++)
                if (s.e[k].holder[h] >= s.naddr)
                    abort();
        }
        if (ddp__ck_put_sync(&b, &s) != 0)
            abort();
        same_bytes(&b, type, body, len);
        if (ddp__ck_get_sync(b.data + 5, b.len - 5, &again) != 0)
            abort();
        ddp__ck_sync_release(&again);
        ddp__ck_sync_release(&s);
    } else if (type == DDP__AG_CKPT_FILE) {
        struct ddp__ck_file f;
        if (ddp__ck_get_file(body, len, &f) != 0)
            return;
        path_ok(f.rel);
        if (ddp__ck_put_file(&b, &f) != 0)
            abort();
        same_bytes(&b, type, body, len);
    } else if (type == DDP__AG_CKPT_SYNCED) {
        struct ddp__ck_synced s;
        if (ddp__ck_get_synced(body, len, &s) != 0)
            return;
        for (uint32_t k = 0; k < s.nfail; k++)
            path_ok(s.fail[k].rel);
        if (ddp__ck_put_synced(&b, &s) != 0)
            abort();
        same_bytes(&b, type, body, len);
        free(s.fail);
    } else if (type == DDP__AG_CKPT_PORT) {
        char addr[DDP__CK_ADDR_MAX + 1], why[DDP__CK_WHY_MAX + 1];
        if (ddp__ck_get_port(body, len, addr, why) != 0)
            return;
        if (ddp__ck_put_port(&b, addr, why) != 0)
            abort();
        same_bytes(&b, type, body, len);
    }
    ddp_buf_release(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The first byte sets the piece size the bytes arrive in (1 to 256). */
    if (size == 0)
        return 0;
    size_t piece = (size_t)data[0] + 1, off = 1;
    struct ddp_buf in;
    ddp_buf_init(&in);
    while (off < size) {
        size_t n = size - off < piece ? size - off : piece;
        if (ddp_buf_put(&in, data + off, n) != 0)
            abort();
        off += n;
        uint8_t type;
        const uint8_t *body;
        size_t len;
        int k;
        while ((k = ddp__agent_next(&in, &type, &body, &len)) > 0) {
            if (body < in.data || body + len > in.data + in.off || len + 1 > DDP__AGENT_MAX_FRAME)
                abort();
            /* An exact-size copy, so that ASan sees any read past the body. */
            uint8_t *copy = malloc(len ? len : 1);
            if (!copy)
                abort();
            memcpy(copy, body, len);
            if (type == DDP__AG_JOIN)
                check_join(copy, len);
            else if (type == DDP__AG_START)
                check_start(copy, len);
            else if (type == DDP__AG_STATE)
                check_state(copy, len);
            else if (type == DDP__AG_HELLO || type == DDP__AG_AGENT_HELLO)
                check_hello(type, copy, len);
            else
                check_ckpt(type, copy, len);
            free(copy);
        }
        ddp_buf_compact(&in);
        if (k < 0)
            break; /* both ends drop the peer here */
    }
    ddp_buf_release(&in);
    /* the replication port's request, as a peer's bytes come */
    char rel[DDP__CK_REL_MAX + 1];
    size_t used = 0;
    uint8_t *copy = malloc(size);
    if (!copy)
        abort();
    memcpy(copy, data, size);
    if (ddp__ck_get_request(copy, size, rel, &used) == 1) {
        path_ok(rel);
        if (used > size)
            abort();
    }
    free(copy);
    return 0;
}
