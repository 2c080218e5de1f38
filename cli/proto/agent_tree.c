/* The SSH tree's frames (cli/proto/agent_tree.h). */
#include "cli/proto/agent_tree.h"
#include "cli/proto/agent_proto.h"
#include "cli/proto/agent_wire.h"
#include "common/err.h"

#include <string.h>

#include "common/banned.h"

static void put_s(struct ddp_buf *b, const char *s)
{
    ddp_buf_put_str(b, s, strlen(s));
}

int ddp__tree_put_spawn(struct ddp_buf *b, const struct ddp__spawn *s)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_SPAWN);
    ddp_buf_put_u32(b, s->node);
    ddp_buf_put_u32(b, s->start);
    put_s(b, s->host);
    ddp_buf_put_u32(b, s->port);
    put_s(b, s->user);
    put_s(b, s->identity);
    put_s(b, s->strict);
    put_s(b, s->remote);
    ddp_buf_put_u64(b, s->grace_ms);
    put_s(b, s->args);
    put_s(b, s->kh_name);
    ddp_buf_put_str(b, s->boot, s->boot_len);
    ddp_buf_put_u8(b, s->flags);
    ddp__agent_end(b, pos);
    return b->data ? 0 : DDP_ENOMEM;
}

int ddp__tree_get_spawn(const uint8_t *body, size_t len, struct ddp__spawn *s)
{
    struct ddp_rd r;
    ddp_rd_init(&r, body, len);
    if (ddp_rd_u32(&r, &s->node) < 0 || ddp_rd_u32(&r, &s->start) < 0 ||
        ddp__aw_get_string(&r, s->host, sizeof(s->host), true) || ddp_rd_u32(&r, &s->port) < 0 ||
        s->port < 1 || s->port > 65535 || ddp__aw_get_string(&r, s->user, sizeof(s->user), true) ||
        ddp__aw_get_string(&r, s->identity, sizeof(s->identity), false) ||
        ddp__aw_get_string(&r, s->strict, sizeof(s->strict), true) ||
        ddp__aw_get_string(&r, s->remote, sizeof(s->remote), false) ||
        ddp_rd_u64(&r, &s->grace_ms) < 0 ||
        ddp__aw_get_string(&r, s->args, sizeof(s->args), false) ||
        ddp__aw_get_string(&r, s->kh_name, sizeof(s->kh_name), false) ||
        ddp_rd_str(&r, DDP__TREE_BOOT_MAX, &s->boot, &s->boot_len) < 0 ||
        ddp_rd_u8(&r, &s->flags) < 0 || (s->flags & ~DDP__SPAWN_FORWARD_AGENT) || ddp_rd_left(&r) ||
        !s->host[0] || !s->remote[0] || !s->args[0] || !s->boot_len)
        return DDP_EPROTO;
    return 0;
}

int ddp__tree_put_node_str(struct ddp_buf *b, uint8_t type, uint32_t node, uint32_t start,
                           const char *s, size_t n)
{
    size_t pos = ddp__agent_begin(b, type);
    ddp_buf_put_u32(b, node);
    ddp_buf_put_u32(b, start);
    ddp_buf_put_str(b, s, n);
    ddp__agent_end(b, pos);
    return b->data ? 0 : DDP_ENOMEM;
}

/* A string of up to max bytes without a NUL, the rest of body. */
static int get_rest(struct ddp_rd *r, uint32_t max, const uint8_t **s, uint32_t *n)
{
    if (ddp_rd_str(r, max, s, n) < 0 || ddp_rd_left(r) || memchr(*s, 0, *n))
        return DDP_EPROTO;
    return 0;
}

int ddp__tree_get_node_str(const uint8_t *body, size_t len, uint32_t *node, uint32_t *start,
                           const uint8_t **s, uint32_t *n)
{
    struct ddp_rd r;
    ddp_rd_init(&r, body, len);
    if (ddp_rd_u32(&r, node) < 0 || ddp_rd_u32(&r, start) < 0)
        return DDP_EPROTO;
    return get_rest(&r, DDP__AGENT_MAX_LINE, s, n);
}

int ddp__tree_put_known_hosts(struct ddp_buf *b, const char *content, size_t n)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_KNOWN_HOSTS);
    ddp_buf_put_str(b, content, n);
    ddp__agent_end(b, pos);
    return b->data ? 0 : DDP_ENOMEM;
}

int ddp__tree_get_known_hosts(const uint8_t *body, size_t len, const uint8_t **s, uint32_t *n)
{
    struct ddp_rd r;
    ddp_rd_init(&r, body, len);
    return get_rest(&r, DDP__TREE_KH_MAX, s, n);
}

int ddp__tree_put_unspawn(struct ddp_buf *b, uint32_t node, uint32_t start, uint8_t level)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_UNSPAWN);
    ddp_buf_put_u32(b, node);
    ddp_buf_put_u32(b, start);
    ddp_buf_put_u8(b, level);
    ddp__agent_end(b, pos);
    return b->data ? 0 : DDP_ENOMEM;
}

int ddp__tree_get_unspawn(const uint8_t *body, size_t len, uint32_t *node, uint32_t *start,
                          uint8_t *level)
{
    struct ddp_rd r;
    ddp_rd_init(&r, body, len);
    if (ddp_rd_u32(&r, node) < 0 || ddp_rd_u32(&r, start) < 0 || ddp_rd_u8(&r, level) < 0 ||
        ddp_rd_left(&r) || *level < 1 || *level > 2)
        return DDP_EPROTO;
    return 0;
}

int ddp__tree_put_child_exit(struct ddp_buf *b, uint32_t node, uint32_t start, int32_t st)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_CHILD_EXIT);
    ddp_buf_put_u32(b, node);
    ddp_buf_put_u32(b, start);
    ddp_buf_put_u32(b, (uint32_t)st);
    ddp__agent_end(b, pos);
    return b->data ? 0 : DDP_ENOMEM;
}

int ddp__tree_get_child_exit(const uint8_t *body, size_t len, uint32_t *node, uint32_t *start,
                             int32_t *st)
{
    struct ddp_rd r;
    uint32_t v;
    ddp_rd_init(&r, body, len);
    if (ddp_rd_u32(&r, node) < 0 || ddp_rd_u32(&r, start) < 0 || ddp_rd_u32(&r, &v) < 0 ||
        ddp_rd_left(&r))
        return DDP_EPROTO;
    *st = (int32_t)v;
    return 0;
}
