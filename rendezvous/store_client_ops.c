/* The store client's operations (rendezvous/store.h): each builds its request, makes the
 * round trip through the connection (rendezvous/client.h) and reads the reply. */
#include "rendezvous/client.h"
#include "common/err.h"
#include "common/util.h"
#include "rendezvous/proto.h"
#include "rendezvous/store_etcd.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static int do_ping(struct ddp_store *s)
{
    struct ddp_rd rd;
    uint32_t id;
    size_t pos = ddp__cl_req_begin(s, DDP__OP_PING, &id);
    return ddp__cl_call(s, pos, DDP__OP_PING, id, &rd);
}

int ddp_store_ping(struct ddp_store *s)
{
    if (s->etcd)
        return 0; /* the etcd client answers or fails each call on its own */
    return LOCKED(s, do_ping(s));
}

static int do_set(struct ddp_store *s, const char *key, const void *val, size_t len, uint64_t lease)
{
    struct ddp_rd rd;
    uint32_t id;
    size_t pos;
    int r;
    if (len && !val)
        return DDP_EINVAL;
    if (len > DDP__MAX_VALUE)
        return DDP_ETOOBIG;
    if ((r = ddp__cl_req_begin_key(s, DDP__OP_SET, key, &id, &pos)) < 0 ||
        (r = ddp_buf_put_str(&s->out, val, len)) < 0 || (r = ddp_buf_put_u64(&s->out, lease)) < 0)
        return r;
    return ddp__cl_call(s, pos, DDP__OP_SET, id, &rd);
}

int ddp_store_set(struct ddp_store *s, const char *key, const void *val, size_t len)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_set(s->etcd, key, val, len));
    return LOCKED(s, do_set(s, key, val, len, 0));
}

int ddp_store_set_leased(struct ddp_store *s, const char *key, const void *val, size_t len,
                         uint64_t lease)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_set_leased(s->etcd, key, val, len, lease));
    if (lease == 0)
        return DDP_EINVAL;
    return LOCKED(s, do_set(s, key, val, len, lease));
}

/* Copies a wire string into a fresh NUL-terminated buffer. */
static int take_str(struct ddp_rd *rd, void **val, size_t *len)
{
    const uint8_t *p;
    uint32_t n;
    if (ddp_rd_str(rd, UINT32_MAX, &p, &n) < 0)
        return DDP_EPROTO;
    char *d = malloc((size_t)n + 1);
    if (!d)
        return DDP_ENOMEM;
    memcpy(d, p, n);
    d[n] = '\0';
    *val = d;
    if (len)
        *len = n;
    return 0;
}

static int do_get(struct ddp_store *s, const char *key, void **val, size_t *len)
{
    struct ddp_rd rd;
    uint32_t id;
    size_t pos;
    int r;
    if (!val)
        return DDP_EINVAL;
    if ((r = ddp__cl_req_begin_key(s, DDP__OP_GET, key, &id, &pos)) < 0 ||
        (r = ddp__cl_call(s, pos, DDP__OP_GET, id, &rd)) < 0)
        return r;
    return take_str(&rd, val, len);
}

int ddp_store_get(struct ddp_store *s, const char *key, void **val, size_t *len)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_get(s->etcd, key, val, len));
    return LOCKED(s, do_get(s, key, val, len));
}

static int do_add(struct ddp_store *s, const char *key, int64_t delta, int64_t *res)
{
    struct ddp_rd rd;
    uint32_t id;
    size_t pos;
    int64_t v;
    int r;
    if ((r = ddp__cl_req_begin_key(s, DDP__OP_ADD, key, &id, &pos)) < 0 ||
        (r = ddp_buf_put_u64(&s->out, (uint64_t)delta)) < 0 ||
        (r = ddp__cl_call(s, pos, DDP__OP_ADD, id, &rd)) < 0)
        return r;
    if (ddp_rd_i64(&rd, &v) < 0)
        return DDP_EPROTO;
    if (res)
        *res = v;
    return 0;
}

int ddp_store_add(struct ddp_store *s, const char *key, int64_t delta, int64_t *result)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_add(s->etcd, key, delta, result));
    return LOCKED(s, do_add(s, key, delta, result));
}

static int do_cas(struct ddp_store *s, const char *key, const void *exp, size_t elen,
                  const void *des, size_t dlen, bool *swapped, void **cur, size_t *curlen)
{
    struct ddp_rd rd;
    uint32_t id;
    size_t pos;
    uint8_t sw, present;
    int r;
    if (dlen && !des)
        return DDP_EINVAL;
    if (elen > DDP__MAX_VALUE || dlen > DDP__MAX_VALUE)
        return DDP_ETOOBIG;
    if ((r = ddp__cl_req_begin_key(s, DDP__OP_CAS, key, &id, &pos)) < 0 ||
        (r = ddp_buf_put_u8(&s->out, exp ? 0 : DDP__CAS_EXPECT_ABSENT)) < 0 ||
        (r = ddp_buf_put_str(&s->out, exp, exp ? elen : 0)) < 0 ||
        (r = ddp_buf_put_str(&s->out, des, dlen)) < 0 ||
        (r = ddp__cl_call(s, pos, DDP__OP_CAS, id, &rd)) < 0)
        return r;
    if (ddp_rd_u8(&rd, &sw) < 0 || ddp_rd_u8(&rd, &present) < 0)
        return DDP_EPROTO;
    void *v = NULL;
    size_t vl = 0;
    if (cur && present && (r = take_str(&rd, &v, &vl)) < 0)
        return r;
    if (swapped)
        *swapped = sw;
    if (cur) {
        *cur = v;
        if (curlen)
            *curlen = vl;
    }
    return 0;
}

int ddp_store_cas(struct ddp_store *s, const char *key, const void *expected, size_t exp_len,
                  const void *desired, size_t des_len, bool *swapped, void **cur, size_t *cur_len)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_cas(s->etcd, key, expected, exp_len, desired, des_len, swapped,
                                     cur, cur_len));
    return LOCKED(s, do_cas(s, key, expected, exp_len, desired, des_len, swapped, cur, cur_len));
}

static int do_delete(struct ddp_store *s, const char *key, bool *deleted)
{
    struct ddp_rd rd;
    uint32_t id;
    size_t pos;
    uint64_t v;
    int r;
    if ((r = ddp__cl_req_begin_key(s, DDP__OP_DELETE, key, &id, &pos)) < 0 ||
        (r = ddp__cl_call(s, pos, DDP__OP_DELETE, id, &rd)) < 0)
        return r;
    if (ddp_rd_u64(&rd, &v) < 0)
        return DDP_EPROTO;
    if (deleted)
        *deleted = v != 0;
    return 0;
}

int ddp_store_delete(struct ddp_store *s, const char *key, bool *deleted)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_delete(s->etcd, key, deleted));
    return LOCKED(s, do_delete(s, key, deleted));
}

static int put_keys(struct ddp_store *s, const char *const *keys, size_t n)
{
    if (!keys || n == 0 || n > DDP__MAX_MULTI)
        return DDP_EINVAL;
    ddp_buf_put_u32(&s->out, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        size_t kl;
        int r;
        if ((r = ddp__cl_check_key(keys[i], &kl)) < 0 ||
            (r = ddp_buf_put_str(&s->out, keys[i], kl)) < 0)
            return r;
    }
    return 0;
}

static int do_check(struct ddp_store *s, const char *const *keys, size_t n, bool *all)
{
    struct ddp_rd rd;
    uint32_t id;
    uint8_t v;
    int r;
    size_t pos = ddp__cl_req_begin(s, DDP__OP_CHECK, &id);
    if ((r = put_keys(s, keys, n)) < 0)
        return r;
    if ((r = ddp__cl_call(s, pos, DDP__OP_CHECK, id, &rd)) < 0)
        return r;
    if (ddp_rd_u8(&rd, &v) < 0)
        return DDP_EPROTO;
    *all = v != 0;
    return 0;
}

int ddp_store_check(struct ddp_store *s, const char *const *keys, size_t n, bool *all)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_check(s->etcd, keys, n, all));
    return LOCKED(s, do_check(s, keys, n, all));
}

static int do_num_keys(struct ddp_store *s, int64_t *n)
{
    struct ddp_rd rd;
    uint32_t id;
    int r;
    size_t pos = ddp__cl_req_begin(s, DDP__OP_NUM_KEYS, &id);
    if ((r = ddp__cl_call(s, pos, DDP__OP_NUM_KEYS, id, &rd)) < 0)
        return r;
    return ddp_rd_i64(&rd, n) < 0 ? DDP_EPROTO : 0;
}

int ddp_store_num_keys(struct ddp_store *s, int64_t *n)
{
    if (s->etcd)
        return DDP_ENOTSUP; /* etcd counts every job's keys */
    return LOCKED(s, do_num_keys(s, n));
}

static int do_wait(struct ddp_store *s, const char *const *keys, size_t n, int timeout_ms)
{
    struct ddp_rd rd;
    uint32_t id;
    int r;
    size_t pos = ddp__cl_req_begin(s, DDP__OP_WAIT, &id);
    ddp_buf_put_u32(&s->out, timeout_ms < 0 ? DDP__WAIT_FOREVER : (uint32_t)timeout_ms);
    if ((r = put_keys(s, keys, n)) < 0)
        return r;
    /* The server times the wait; our own deadline only guards against a dead server. */
    int64_t deadline =
        timeout_ms < 0 ? INT64_MAX : ddp_now_ms() + timeout_ms + DDP__CL_WAIT_SLACK_MS;
    return ddp__cl_roundtrip(s, pos, DDP__OP_WAIT, id, deadline, &rd);
}

int ddp_store_wait(struct ddp_store *s, const char *const *keys, size_t n, int timeout_ms)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_wait(s->etcd, keys, n, timeout_ms));
    return LOCKED(s, do_wait(s, keys, n, timeout_ms));
}

static int do_multi_get(struct ddp_store *s, const char *const *keys, size_t n,
                        struct ddp_store_value *vals)
{
    struct ddp_rd rd;
    uint32_t id;
    int r;
    size_t pos = ddp__cl_req_begin(s, DDP__OP_MULTI_GET, &id);
    if ((r = put_keys(s, keys, n)) < 0)
        return r;
    if ((r = ddp__cl_call(s, pos, DDP__OP_MULTI_GET, id, &rd)) < 0)
        return r;
    memset(vals, 0, n * sizeof(*vals));
    for (size_t i = 0; i < n; i++) {
        uint8_t present;
        if (ddp_rd_u8(&rd, &present) < 0) {
            r = DDP_EPROTO;
            break;
        }
        if (present) {
            if ((r = take_str(&rd, &vals[i].data, &vals[i].len)) < 0)
                break;
        } else {
            const uint8_t *p;
            uint32_t l;
            if (ddp_rd_str(&rd, 0, &p, &l) < 0) {
                r = DDP_EPROTO;
                break;
            }
        }
    }
    if (r < 0)
        ddp_store_values_free(vals, n);
    return r;
}

int ddp_store_multi_get(struct ddp_store *s, const char *const *keys, size_t n,
                        struct ddp_store_value *vals)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_multi_get(s->etcd, keys, n, vals));
    return LOCKED(s, do_multi_get(s, keys, n, vals));
}

static int do_watch(struct ddp_store *s, const char *key, bool prefix, uint32_t *wid)
{
    struct ddp_rd rd;
    uint32_t id;
    size_t kl;
    int r;
    if ((r = ddp__cl_check_key(key, &kl)) < 0)
        return r;
    size_t pos = ddp__cl_req_begin(s, DDP__OP_WATCH, &id);
    ddp_buf_put_u8(&s->out, prefix ? DDP__WATCH_PREFIX : 0);
    ddp_buf_put_str(&s->out, key, kl);
    if ((r = ddp__cl_call(s, pos, DDP__OP_WATCH, id, &rd)) < 0)
        return r;
    return ddp_rd_u32(&rd, wid) < 0 ? DDP_EPROTO : 0;
}

int ddp_store_watch(struct ddp_store *s, const char *key, bool prefix, uint32_t *id)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_watch(s->etcd, key, prefix, id));
    return LOCKED(s, do_watch(s, key, prefix, id));
}

static int do_u32_op(struct ddp_store *s, uint8_t op, uint32_t arg, uint32_t *out)
{
    struct ddp_rd rd;
    uint32_t id;
    int r;
    size_t pos = ddp__cl_req_begin(s, op, &id);
    ddp_buf_put_u32(&s->out, arg);
    if ((r = ddp__cl_call(s, pos, op, id, &rd)) < 0)
        return r;
    return out && ddp_rd_u32(&rd, out) < 0 ? DDP_EPROTO : 0;
}

int ddp_store_unwatch(struct ddp_store *s, uint32_t wid)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_unwatch(s->etcd, wid));
    return LOCKED(s, do_u32_op(s, DDP__OP_UNWATCH, wid, NULL));
}

static int do_lease_grant(struct ddp_store *s, int ttl_ms, uint64_t *lease)
{
    struct ddp_rd rd;
    uint32_t id;
    int r;
    if (ttl_ms <= 0)
        return DDP_EINVAL;
    size_t pos = ddp__cl_req_begin(s, DDP__OP_LEASE_GRANT, &id);
    ddp_buf_put_u32(&s->out, (uint32_t)ttl_ms);
    if ((r = ddp__cl_call(s, pos, DDP__OP_LEASE_GRANT, id, &rd)) < 0)
        return r;
    return ddp_rd_u64(&rd, lease) < 0 ? DDP_EPROTO : 0;
}

int ddp_store_lease_grant(struct ddp_store *s, int ttl_ms, uint64_t *lease)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_lease_grant(s->etcd, ttl_ms, lease));
    return LOCKED(s, do_lease_grant(s, ttl_ms, lease));
}

static int do_lease_u64(struct ddp_store *s, uint8_t op, uint64_t lease, int *ttl)
{
    struct ddp_rd rd;
    uint32_t id, t;
    int r;
    size_t pos = ddp__cl_req_begin(s, op, &id);
    ddp_buf_put_u64(&s->out, lease);
    if ((r = ddp__cl_call(s, pos, op, id, &rd)) < 0)
        return r;
    if (ttl) {
        if (ddp_rd_u32(&rd, &t) < 0)
            return DDP_EPROTO;
        *ttl = (int)t;
    }
    return 0;
}

int ddp_store_lease_keepalive(struct ddp_store *s, uint64_t lease, int *ttl_ms)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_lease_keepalive(s->etcd, lease, ttl_ms));
    return LOCKED(s, do_lease_u64(s, DDP__OP_LEASE_KEEPALIVE, lease, ttl_ms));
}

int ddp_store_lease_revoke(struct ddp_store *s, uint64_t lease)
{
    if (s->etcd)
        return LOCKED(s, ddp__se_lease_revoke(s->etcd, lease));
    return LOCKED(s, do_lease_u64(s, DDP__OP_LEASE_REVOKE, lease, NULL));
}
