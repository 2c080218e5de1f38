/* Encoding and decoding of launcher <-> agent frames (see agent_proto.h). */
#include "cli/proto/agent_proto.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

size_t ddp__agent_begin(struct ddp_buf *b, uint8_t type)
{
    size_t pos = b->len - b->off; /* as ddp__proto_begin's */
    ddp_buf_put_u32(b, 0);
    ddp_buf_put_u8(b, type);
    return pos;
}

void ddp__agent_end(struct ddp_buf *b, size_t pos)
{
    ddp_buf_patch_u32(b, b->off + pos, (uint32_t)(b->len - b->off - pos - 4));
}

int ddp__agent_next(struct ddp_buf *b, uint8_t *type, const uint8_t **body, size_t *len)
{
    struct ddp_rd r;
    uint32_t flen;
    ddp_rd_init(&r, b->data + b->off, ddp_buf_pending(b));
    if (ddp_rd_u32(&r, &flen) < 0)
        return 0;
    if (flen < 1 || flen > DDP__AGENT_MAX_FRAME)
        return DDP_EPROTO;
    if (ddp_rd_left(&r) < flen)
        return 0;
    const uint8_t *p;
    ddp_rd_raw(&r, flen, &p);
    *type = p[0];
    *body = p + 1;
    *len = flen - 1;
    b->off += 4 + (size_t)flen;
    return 1;
}

static int put_s(struct ddp_buf *b, const char *s)
{
    return ddp_buf_put_str(b, s ? s : "", s ? strlen(s) : 0);
}

int ddp__agent_put_hello(struct ddp_buf *b, uint8_t type, const char *version,
                         const struct ddp__node_counts *counts, uint32_t port)
{
    size_t pos = ddp__agent_begin(b, type);
    int r = ddp_buf_put_u32(b, DDP__AGENT_PROTO);
    r |= put_s(b, version);
    if (counts) {
        r |= ddp_buf_put_u32(b, (uint32_t)counts->slurm_gpus);
        r |= ddp_buf_put_u32(b, (uint32_t)counts->cvd_gpus);
        r |= ddp_buf_put_u32(b, counts->driver_gpus);
        r |= ddp_buf_put_u32(b, counts->cpus);
        r |= ddp_buf_put_u32(b, port);
    }
    ddp__agent_end(b, pos);
    return r ? DDP_ENOMEM : 0;
}

int ddp__agent_get_hello(const uint8_t *body, size_t len, uint32_t *proto, char *version, size_t n)
{
    struct ddp_rd r;
    const uint8_t *p;
    uint32_t vn;
    ddp_rd_init(&r, body, len);
    if (ddp_rd_u32(&r, proto) < 0 || ddp_rd_str(&r, DDP__AGENT_VERSION_MAX, &p, &vn) < 0 ||
        vn == 0 || vn >= n)
        return DDP_EPROTO;
    for (uint32_t i = 0; i < vn; i++) /* it is shown in messages */
        if (p[i] < 0x21 || p[i] > 0x7e)
            return DDP_EPROTO;
    memcpy(version, p, vn);
    version[vn] = '\0';
    return 0;
}

/* A HELLO's reader moved past its node's counts (into c): 0, 1 when it has none, DDP_EPROTO
 * when they are cut short or out of range. */
static int read_counts(struct ddp_rd *r, const uint8_t *body, size_t len,
                       struct ddp__node_counts *c)
{
    const uint8_t *p;
    uint32_t proto, vn, sg, cg;
    ddp_rd_init(r, body, len);
    if (ddp_rd_u32(r, &proto) < 0 || ddp_rd_str(r, DDP__AGENT_VERSION_MAX, &p, &vn) < 0)
        return DDP_EPROTO;
    if (ddp_rd_left(r) == 0)
        return 1;
    if (ddp_rd_u32(r, &sg) < 0 || ddp_rd_u32(r, &cg) < 0 || ddp_rd_u32(r, &c->driver_gpus) < 0 ||
        ddp_rd_u32(r, &c->cpus) < 0)
        return DDP_EPROTO;
    c->slurm_gpus = (int32_t)sg;
    c->cvd_gpus = (int32_t)cg;
    /* as cli/sys/devices.c counts: -1 (unset) or 0..4096 each */
    if (c->slurm_gpus < -1 || c->slurm_gpus > 4096 || c->cvd_gpus < -1 || c->cvd_gpus > 4096 ||
        c->driver_gpus > 4096 || c->cpus > (1u << 20))
        return DDP_EPROTO;
    return 0;
}

int ddp__agent_get_hello_counts(const uint8_t *body, size_t len, struct ddp__node_counts *c)
{
    struct ddp_rd r;
    return read_counts(&r, body, len, c);
}

int ddp__agent_get_hello_port(const uint8_t *body, size_t len, uint32_t *port)
{
    struct ddp_rd r;
    struct ddp__node_counts c;
    int e = read_counts(&r, body, len, &c);
    if (e != 0)
        return e;
    if (ddp_rd_left(&r) == 0)
        return 1;
    if (ddp_rd_u32(&r, port) < 0 || *port == 0 || *port > 65535)
        return DDP_EPROTO;
    return 0;
}

static int put_list(struct ddp_buf *b, char *const *v)
{
    uint32_t n = 0;
    for (char *const *p = v; p && *p; p++)
        n++;
    int r = ddp_buf_put_u32(b, n);
    for (uint32_t i = 0; i < n && r == 0; i++)
        r = put_s(b, v[i]);
    return r;
}

int ddp__agent_put_start(struct ddp_buf *b, const struct ddp__agent_start *st)
{
    return ddp__agent_put_start_as(b, DDP__AG_START, st);
}

int ddp__agent_put_start_as(struct ddp_buf *b, uint8_t type, const struct ddp__agent_start *st)
{
    size_t pos = ddp__agent_begin(b, type);
    int r = 0;
    r |= put_s(b, st->token);
    r |= put_s(b, st->store_addr);
    r |= put_s(b, st->job_id);
    r |= put_s(b, st->host_label);
    r |= put_s(b, st->master_addr);
    r |= ddp_buf_put_u32(b, st->master_port);
    r |= ddp_buf_put_u32(b, st->node_rank);
    r |= ddp_buf_put_u32(b, st->nnodes);
    r |= ddp_buf_put_u32(b, st->world_size);
    r |= ddp_buf_put_u32(b, st->rank_offset);
    r |= ddp_buf_put_u32(b, st->nlocal);
    r |= ddp_buf_put_u32(b, st->restart_count);
    r |= ddp_buf_put_u32(b, st->max_restarts);
    r |= ddp_buf_put_u64(b, st->grace_ms);
    r |= put_s(b, st->workdir);
    r |= put_s(b, st->backend);
    r |= put_s(b, st->checkpoint_dir);
    r |= put_s(b, st->shell);
    r |= put_list(b, st->argv);
    r |= put_list(b, st->env);
    r |= put_list(b, st->shell_env);
    r |= ddp_buf_put_u8(b, st->agent_store);
    r |= ddp_buf_put_u8(b, st->bind_to);
    r |= ddp_buf_put_u8(b, st->warm);
    r |= ddp_buf_put_u8(b, st->warm_listed);
    r |= put_list(b, st->warm_imports);
    ddp__agent_end(b, pos);
    return r ? DDP_ENOMEM : 0;
}

static int get_s(struct ddp_rd *r, char **out)
{
    const uint8_t *p;
    uint32_t n;
    if (ddp_rd_str(r, DDP__AGENT_MAX_FRAME, &p, &n) < 0)
        return DDP_EPROTO;
    if (memchr(p, '\0', n))
        return DDP_EPROTO;
    if (!(*out = strndup((const char *)p, n)))
        return DDP_ENOMEM;
    return 0;
}

static int get_list(struct ddp_rd *r, char ***out)
{
    uint32_t n;
    if (ddp_rd_u32(r, &n) < 0 || n > 65536)
        return DDP_EPROTO;
    char **v = calloc((size_t)n + 1, sizeof(char *));
    if (!v)
        return DDP_ENOMEM;
    *out = v;
    for (uint32_t i = 0; i < n; i++) {
        int e = get_s(r, &v[i]);
        if (e < 0)
            return e;
    }
    return 0;
}

int ddp__agent_get_start(const uint8_t *body, size_t len, struct ddp__agent_start *st)
{
    struct ddp_rd r;
    int e;
    memset(st, 0, sizeof(*st));
    ddp_rd_init(&r, body, len);
    if ((e = get_s(&r, &st->token)) < 0 || (e = get_s(&r, &st->store_addr)) < 0 ||
        (e = get_s(&r, &st->job_id)) < 0 || (e = get_s(&r, &st->host_label)) < 0 ||
        (e = get_s(&r, &st->master_addr)) < 0)
        goto fail;
    e = DDP_EPROTO;
    if (ddp_rd_u32(&r, &st->master_port) < 0 || ddp_rd_u32(&r, &st->node_rank) < 0 ||
        ddp_rd_u32(&r, &st->nnodes) < 0 || ddp_rd_u32(&r, &st->world_size) < 0 ||
        ddp_rd_u32(&r, &st->rank_offset) < 0 || ddp_rd_u32(&r, &st->nlocal) < 0 ||
        ddp_rd_u32(&r, &st->restart_count) < 0 || ddp_rd_u32(&r, &st->max_restarts) < 0 ||
        ddp_rd_u64(&r, &st->grace_ms) < 0)
        goto fail;
    if ((e = get_s(&r, &st->workdir)) < 0 || (e = get_s(&r, &st->backend)) < 0 ||
        (e = get_s(&r, &st->checkpoint_dir)) < 0 || (e = get_s(&r, &st->shell)) < 0 ||
        (e = get_list(&r, &st->argv)) < 0 || (e = get_list(&r, &st->env)) < 0 ||
        (e = get_list(&r, &st->shell_env)) < 0)
        goto fail;
    e = DDP_EPROTO;
    if (ddp_rd_u8(&r, &st->agent_store) < 0 || ddp_rd_u8(&r, &st->bind_to) < 0 || st->bind_to > 2 ||
        ddp_rd_u8(&r, &st->warm) < 0 || ddp_rd_u8(&r, &st->warm_listed) < 0)
        goto fail;
    if ((e = get_list(&r, &st->warm_imports)) < 0)
        goto fail;
    e = DDP_EPROTO;
    if (ddp_rd_left(&r) != 0 || st->nlocal == 0 || st->nlocal > 4096 ||
        (!st->shell[0] && !st->argv[0]))
        goto fail;
    return 0;
fail:
    ddp__agent_start_release(st);
    return e;
}

static void free_list(char **v)
{
    for (char **p = v; p && *p; p++)
        free(*p);
    free(v);
}

void ddp__agent_start_release(struct ddp__agent_start *st)
{
    if (st->token)
        explicit_bzero(st->token, strlen(st->token));
    free(st->token);
    free(st->store_addr);
    free(st->job_id);
    free(st->host_label);
    free(st->master_addr);
    free(st->workdir);
    free(st->backend);
    free(st->checkpoint_dir);
    free(st->shell);
    free_list(st->argv);
    free_list(st->env);
    free_list(st->shell_env);
    free_list(st->warm_imports);
    memset(st, 0, sizeof(*st));
}

int ddp__agent_put_join(struct ddp_buf *b, const struct ddp__agent_join *j)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_JOIN);
    int r = 0;
    r |= put_s(b, j->token);
    r |= put_s(b, j->store_addr);
    r |= put_s(b, j->job_id);
    r |= put_s(b, j->host_label);
    r |= ddp_buf_put_u32(b, j->node_index);
    r |= ddp_buf_put_u32(b, j->incarnation);
    r |= ddp_buf_put_u64(b, j->heartbeat_interval_ms);
    r |= ddp_buf_put_u64(b, j->heartbeat_timeout_ms);
    r |= ddp_buf_put_u64(b, j->grace_ms);
    r |= put_s(b, j->etcd_endpoints ? j->etcd_endpoints : "");
    r |= put_s(b, j->etcd_prefix ? j->etcd_prefix : "");
    r |= put_s(b, j->etcd_ca ? j->etcd_ca : "");
    r |= put_s(b, j->etcd_cert ? j->etcd_cert : "");
    r |= put_s(b, j->etcd_key ? j->etcd_key : "");
    r |= ddp_buf_put_u64(b, j->takeover_ms);
    ddp__agent_end(b, pos);
    return r ? DDP_ENOMEM : 0;
}

int ddp__agent_get_join(const uint8_t *body, size_t len, struct ddp__agent_join *j)
{
    struct ddp_rd r;
    int e;
    memset(j, 0, sizeof(*j));
    ddp_rd_init(&r, body, len);
    if ((e = get_s(&r, &j->token)) < 0 || (e = get_s(&r, &j->store_addr)) < 0 ||
        (e = get_s(&r, &j->job_id)) < 0 || (e = get_s(&r, &j->host_label)) < 0)
        goto fail;
    e = DDP_EPROTO;
    if (ddp_rd_u32(&r, &j->node_index) < 0 || ddp_rd_u32(&r, &j->incarnation) < 0 ||
        ddp_rd_u64(&r, &j->heartbeat_interval_ms) < 0 ||
        ddp_rd_u64(&r, &j->heartbeat_timeout_ms) < 0 || ddp_rd_u64(&r, &j->grace_ms) < 0)
        goto fail;
    if ((e = get_s(&r, &j->etcd_endpoints)) < 0 || (e = get_s(&r, &j->etcd_prefix)) < 0 ||
        (e = get_s(&r, &j->etcd_ca)) < 0 || (e = get_s(&r, &j->etcd_cert)) < 0 ||
        (e = get_s(&r, &j->etcd_key)) < 0)
        goto fail;
    e = DDP_EPROTO;
    if (ddp_rd_u64(&r, &j->takeover_ms) < 0 || ddp_rd_left(&r) != 0 ||
        j->heartbeat_interval_ms == 0 || j->heartbeat_timeout_ms <= j->heartbeat_interval_ms ||
        j->heartbeat_timeout_ms > INT32_MAX)
        goto fail;
    return 0;
fail:
    ddp__agent_join_release(j);
    return e;
}

void ddp__agent_join_release(struct ddp__agent_join *j)
{
    if (j->token)
        explicit_bzero(j->token, strlen(j->token));
    free(j->token);
    free(j->store_addr);
    free(j->job_id);
    free(j->host_label);
    free(j->etcd_endpoints);
    free(j->etcd_prefix);
    free(j->etcd_ca);
    free(j->etcd_cert);
    free(j->etcd_key);
    memset(j, 0, sizeof(*j));
}

int ddp__agent_put_state(struct ddp_buf *b, const struct ddp__agent_state *s)
{
    size_t pos = ddp__agent_begin(b, DDP__AG_STATE);
    int r = 0;
    r |= ddp_buf_put_u32(b, s->node_index);
    r |= ddp_buf_put_u32(b, s->incarnation);
    r |= ddp_buf_put_u8(b, s->have_start);
    r |= ddp_buf_put_u8(b, s->done);
    r |= ddp_buf_put_u32(b, s->round);
    r |= ddp_buf_put_u32(b, s->rank_offset);
    r |= ddp_buf_put_u32(b, s->have_start ? s->nlocal : 0);
    for (uint32_t i = 0; s->have_start && i < s->nlocal; i++) {
        const struct ddp__agent_state_rank *k = &s->ranks[i];
        r |= ddp_buf_put_u32(b, k->pid);
        r |= ddp_buf_put_u8(b, k->exited);
        r |= ddp_buf_put_u8(b, k->exec_failed);
        r |= ddp_buf_put_u32(b, (uint32_t)k->code);
        r |= ddp_buf_put_u64(b, k->runtime_ms);
    }
    r |= ddp_buf_put_u64(b, s->dropped);
    ddp__agent_end(b, pos);
    return r ? DDP_ENOMEM : 0;
}

int ddp__agent_get_state(const uint8_t *body, size_t len, struct ddp__agent_state *s)
{
    struct ddp_rd r;
    uint32_t code;
    memset(s, 0, sizeof(*s));
    ddp_rd_init(&r, body, len);
    if (ddp_rd_u32(&r, &s->node_index) < 0 || ddp_rd_u32(&r, &s->incarnation) < 0 ||
        ddp_rd_u8(&r, &s->have_start) < 0 || ddp_rd_u8(&r, &s->done) < 0 ||
        ddp_rd_u32(&r, &s->round) < 0 || ddp_rd_u32(&r, &s->rank_offset) < 0 ||
        ddp_rd_u32(&r, &s->nlocal) < 0 || s->nlocal > ddp_rd_left(&r) / 18)
        return DDP_EPROTO;
    if (s->nlocal && !(s->ranks = calloc(s->nlocal, sizeof(*s->ranks))))
        return DDP_ENOMEM;
    for (uint32_t i = 0; i < s->nlocal; i++) {
        struct ddp__agent_state_rank *k = &s->ranks[i];
        if (ddp_rd_u32(&r, &k->pid) < 0 || ddp_rd_u8(&r, &k->exited) < 0 ||
            ddp_rd_u8(&r, &k->exec_failed) < 0 || ddp_rd_u32(&r, &code) < 0 ||
            ddp_rd_u64(&r, &k->runtime_ms) < 0)
            goto fail;
        k->code = (int32_t)code;
    }
    if (ddp_rd_u64(&r, &s->dropped) < 0 || ddp_rd_left(&r) != 0)
        goto fail;
    return 0;
fail:
    free(s->ranks);
    s->ranks = NULL;
    return DDP_EPROTO;
}
