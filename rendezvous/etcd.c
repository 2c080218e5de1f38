/* An etcd v3 client over its JSON gateway (rendezvous/etcd.h). */
#include "rendezvous/etcd.h"
#include "rendezvous/etcd_priv.h"
#include "rendezvous/curl_dl.h"
#include "common/base64.h"
#include "common/buf.h"
#include "common/err.h"
#include "common/json.h"
#include "common/log.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define ETCD_MAX_REPLY (64u << 20)

struct ddp_etcd {
    CURL *curl;
    char **ep;
    size_t nep, cur;
    int timeout_ms;
    bool client_cert; /* a client certificate is given */
    char err[1024];
    struct ddp_buf reply;
    struct ddp_json json;
    bool have_json;
};

int ddp__etcd_global_init(void)
{
    const char *why = "";
    if (ddp__curl(&why))
        return 0;
    DDP_ERROR(STORE, "etcd needs libcurl, which cannot be loaded: %s (install libcurl4)", why);
    return DDP_ENOTSUP;
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *arg)
{
    struct ddp_etcd *e = arg;
    size_t n = size * nmemb;
    if (e->reply.len + n > ETCD_MAX_REPLY || ddp_buf_put(&e->reply, p, n) < 0)
        return 0; /* curl fails the transfer */
    return n;
}

int ddp_etcd_new(const struct ddp_etcd_opts *o, struct ddp_etcd **out)
{
    if (!o->nendpoints)
        return DDP_EINVAL;
    int r = ddp__etcd_global_init();
    if (r < 0)
        return r;
    struct ddp_etcd *e = calloc(1, sizeof(*e));
    if (!e || !(e->ep = calloc(o->nendpoints, sizeof(char *))) ||
        !(e->curl = ddp__curl(NULL)->easy_init()))
        goto nomem;
    for (size_t i = 0; i < o->nendpoints; i++, e->nep++)
        if (!(e->ep[i] = strdup(o->endpoints[i])))
            goto nomem;
    e->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 5000;
    ddp_buf_init(&e->reply);
    ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
    ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_data);
    ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_WRITEDATA, e);
    ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, (long)e->timeout_ms);
    ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)e->timeout_ms);
    if (o->ca_file)
        ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_CAINFO, o->ca_file);
    if (o->cert_file)
        ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_SSLCERT, o->cert_file);
    e->client_cert = o->cert_file != NULL;
    if (o->key_file)
        ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_SSLKEY, o->key_file);
    *out = e;
    return 0;
nomem:
    ddp_etcd_free(e);
    return DDP_ENOMEM;
}

void ddp_etcd_free(struct ddp_etcd *e)
{
    if (!e)
        return;
    if (e->curl)
        ddp__curl(NULL)->easy_cleanup(e->curl);
    for (size_t i = 0; i < e->nep; i++)
        free(e->ep[i]);
    free(e->ep);
    if (e->have_json)
        ddp_json_free(&e->json);
    ddp_buf_release(&e->reply);
    free(e);
}

const char *ddp_etcd_error(const struct ddp_etcd *e)
{
    return e->err;
}

void ddp_etcd_set_timeout(struct ddp_etcd *e, int timeout_ms)
{
    e->timeout_ms = timeout_ms > 0 ? timeout_ms : 5000;
    ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, (long)e->timeout_ms);
    ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)e->timeout_ms);
}

const char *ddp_etcd_endpoint(const struct ddp_etcd *e)
{
    return e->ep[e->cur];
}

int ddp_etcd_local_ip(struct ddp_etcd *e, char *out, size_t n)
{
    char *ip = NULL;
    if (ddp__curl(NULL)->easy_getinfo(e->curl, CURLINFO_LOCAL_IP, &ip) != CURLE_OK || !ip || !*ip ||
        strlen(ip) >= n)
        return DDP_ENOKEY;
    memcpy(out, ip, strlen(ip) + 1);
    return 0;
}

/* The server's own words on a failure: {"error": ..., "message": ...}. */
static void server_message(struct ddp_etcd *e, char *out, size_t n)
{
    struct ddp_json j;
    out[0] = '\0';
    if (ddp_json_parse((const char *)e->reply.data, e->reply.len, &j) < 0) {
        snprintf(out, n, "%.*s", (int)(e->reply.len < 200 ? e->reply.len : 200),
                 (const char *)e->reply.data);
        return;
    }
    int m = ddp_json_get(&j, 0, "message");
    if (m < 0)
        m = ddp_json_get(&j, 0, "error");
    if (ddp_json_str(&j, m, out, n) < 0)
        out[0] = '\0';
    ddp_json_free(&j);
}

/* What a TLS failure most likely means, for the message. */
static const char *tls_hint(const struct ddp_etcd *e, const char *ep, CURLcode cr)
{
    if (strncmp(ep, "https://", 8) != 0)
        return "";
    if (cr == CURLE_PEER_FAILED_VERIFICATION)
        return " (its certificate is not signed by the CA given, or does not name this host)";
    if (!e->client_cert &&
        (cr == CURLE_SEND_ERROR || cr == CURLE_RECV_ERROR || cr == CURLE_SSL_CONNECT_ERROR))
        return " (the server may require a client certificate: none was given)";
    return "";
}

/*
 * POSTs body to path (GET with body NULL) on the endpoints, starting from the current one, and
 * parses the answer into e->json. 0, DDP_ECONNECT when no endpoint answered, DDP_EPROTO for a
 * refusal or an answer that is not JSON.
 */
static int request(struct ddp_etcd *e, const char *path, const char *body)
{
    if (e->have_json) {
        ddp_json_free(&e->json);
        e->have_json = false;
    }
    int rc = DDP_ECONNECT;
    for (size_t k = 0; k < e->nep; k++) {
        size_t i = (e->cur + k) % e->nep;
        const char *ep = e->ep[i];
        char url[2048];
        e->reply.len = e->reply.off = 0;
        if (strncmp(ep, "unix://", 7) == 0) {
            ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_UNIX_SOCKET_PATH, ep + 7);
            snprintf(url, sizeof(url), "http://localhost%s", path);
        } else {
            ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_UNIX_SOCKET_PATH, NULL);
            snprintf(url, sizeof(url), "%s%s", ep, path);
        }
        ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_URL, url);
        if (body) {
            ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_POSTFIELDS, body);
            ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
        } else {
            ddp__curl(NULL)->easy_setopt(e->curl, CURLOPT_HTTPGET, 1L);
        }
        CURLcode cr = ddp__curl(NULL)->easy_perform(e->curl);
        long status = 0;
        ddp__curl(NULL)->easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &status);
        if (cr != CURLE_OK) {
            snprintf(e->err, sizeof(e->err), "etcd at %s: %s%s", ep,
                     ddp__curl(NULL)->easy_strerror(cr), tls_hint(e, ep, cr));
            rc = cr == CURLE_OPERATION_TIMEDOUT ? DDP_ETIMEDOUT : DDP_ECONNECT;
            continue; /* the next member */
        }
        if (status != 200) {
            char msg[512];
            server_message(e, msg, sizeof(msg));
            snprintf(e->err, sizeof(e->err), "etcd at %s: HTTP %ld%s%s", ep, status,
                     msg[0] ? ": " : "", msg);
            if (status >= 500) { /* no leader, shutting down: another member may serve */
                rc = DDP_ECONNECT;
                continue;
            }
            return DDP_EPROTO;
        }
        e->cur = i;
        if (ddp_json_parse((const char *)e->reply.data, e->reply.len, &e->json) < 0) {
            snprintf(e->err, sizeof(e->err), "etcd at %s: the answer to %s is not JSON", ep, path);
            return DDP_EPROTO;
        }
        e->have_json = true;
        return 0;
    }
    return rc;
}

/* A key (or value) as a JSON string of its base64. */
char *ddp__etcd_b64(const void *p, size_t n)
{
    char *s = malloc(ddp_b64_size(n));
    if (s)
        ddp_b64_encode(p, n, s);
    return s;
}

/* The end of the range of keys under prefix: the prefix with its last byte incremented ("\0"
 * when every byte is 0xff: the whole keyspace after it). */
char *ddp__etcd_prefix_end(const char *prefix)
{
    size_t n = strlen(prefix);
    unsigned char *end = malloc(n + 1);
    if (!end)
        return NULL;
    memcpy(end, prefix, n);
    while (n > 0 && end[n - 1] == 0xff)
        n--;
    if (n == 0) {
        free(end);
        return ddp__etcd_b64("", 1);
    }
    end[n - 1]++;
    char *s = ddp__etcd_b64(end, n);
    free(end);
    return s;
}

int ddp_etcd_version(struct ddp_etcd *e, char *out, size_t n)
{
    int r = request(e, "/version", NULL);
    if (r < 0)
        return r;
    if (ddp_json_str(&e->json, ddp_json_get(&e->json, 0, "etcdserver"), out, n) < 0) {
        snprintf(e->err, sizeof(e->err), "etcd at %s: /version has no etcdserver", e->ep[e->cur]);
        return DDP_EPROTO;
    }
    return 0;
}

int ddp_etcd_revision(struct ddp_etcd *e, int64_t *rev)
{
    /* a count of the keys named "\0" (none): the answer's header has the revision */
    int r = request(e, "/v3/kv/range", "{\"key\":\"AA==\",\"count_only\":true}");
    static const char *const rev_path[] = {"header", "revision", NULL};
    if (r == 0 && !ddp_json_i64(&e->json, ddp_json_path(&e->json, 0, rev_path), rev)) {
        snprintf(e->err, sizeof(e->err), "etcd at %s: an answer without a revision", e->ep[e->cur]);
        return DDP_EPROTO;
    }
    return r;
}

int ddp_etcd_put(struct ddp_etcd *e, const char *key, const void *val, size_t vlen, int64_t lease)
{
    char *k = ddp__etcd_b64(key, strlen(key)), *v = ddp__etcd_b64(val, vlen);
    size_t n = (k ? strlen(k) : 0) + (v ? strlen(v) : 0) + 96;
    char *body = malloc(n);
    int r = DDP_ENOMEM;
    if (k && v && body) {
        snprintf(body, n, "{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%" PRId64 "\"}", k, v,
                 lease);
        r = request(e, "/v3/kv/put", body);
    }
    free(k);
    free(v);
    free(body);
    return r;
}

/* kvs[i]'s key and value (decoded, malloc'd, NUL-terminated). */
int ddp__etcd_kv(const struct ddp_json *j, int kv, char **key, char **val, size_t *vlen)
{
    int kt = ddp_json_get(j, kv, "key"), vt = ddp_json_get(j, kv, "value");
    if (kt < 0)
        return -1;
    size_t kn = j->tok[kt].end - j->tok[kt].start;
    size_t vn = vt >= 0 ? j->tok[vt].end - j->tok[vt].start : 0; /* an empty value is left out */
    char *kb = malloc(kn + 1), *vb = malloc(vn + 1);
    long kl = kb ? ddp_b64_decode(j->text + j->tok[kt].start, kn, kb) : -1;
    long vl = vb ? ddp_b64_decode(vt >= 0 ? j->text + j->tok[vt].start : "", vn, vb) : -1;
    if (kl < 0 || vl < 0) {
        free(kb);
        free(vb);
        return -1;
    }
    kb[kl] = '\0';
    vb[vl] = '\0';
    *key = kb;
    *val = vb;
    *vlen = (size_t)vl;
    return 0;
}

static int decode_kv(struct ddp_etcd *e, int kv, char **key, char **val, size_t *vlen)
{
    if (ddp__etcd_kv(&e->json, kv, key, val, vlen) == 0)
        return 0;
    snprintf(e->err, sizeof(e->err), "etcd at %s: a key or value is not base64", e->ep[e->cur]);
    return DDP_EPROTO;
}

int ddp_etcd_get(struct ddp_etcd *e, const char *key, char **val, size_t *vlen, int64_t *mod_rev)
{
    char *k = ddp__etcd_b64(key, strlen(key)), body[8192];
    if (!k)
        return DDP_ENOMEM;
    if (strlen(k) > sizeof(body) - 32) {
        free(k);
        return DDP_ETOOBIG;
    }
    snprintf(body, sizeof(body), "{\"key\":\"%s\"}", k);
    free(k);
    int r = request(e, "/v3/kv/range", body);
    if (r < 0)
        return r;
    int kv = ddp_json_at(&e->json, ddp_json_get(&e->json, 0, "kvs"), 0);
    if (kv < 0)
        return DDP_ENOKEY;
    char *kk;
    if ((r = decode_kv(e, kv, &kk, val, vlen)) < 0)
        return r;
    free(kk);
    if (mod_rev && !ddp_json_i64(&e->json, ddp_json_get(&e->json, kv, "mod_revision"), mod_rev))
        *mod_rev = 0;
    return 0;
}

int ddp_etcd_put_if(struct ddp_etcd *e, const char *key, int64_t mod_rev, const void *val,
                    size_t vlen, int64_t lease, bool *swapped)
{
    char *k = ddp__etcd_b64(key, strlen(key)), *v = ddp__etcd_b64(val, vlen);
    size_t n = (k ? 2 * strlen(k) : 0) + (v ? strlen(v) : 0) + 256;
    char *body = malloc(n);
    int r = DDP_ENOMEM;
    if (k && v && body) {
        /* etcd compares an absent key's revisions as 0 */
        snprintf(body, n,
                 "{\"compare\":[{\"key\":\"%s\",\"target\":\"MOD\",\"mod_revision\":\"%" PRId64
                 "\"}],\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\","
                 "\"lease\":\"%" PRId64 "\"}}]}",
                 k, mod_rev, k, v, lease);
        if ((r = request(e, "/v3/kv/txn", body)) == 0)
            *swapped = ddp_json_bool(&e->json, ddp_json_get(&e->json, 0, "succeeded"));
    }
    free(k);
    free(v);
    free(body);
    return r;
}

int ddp_etcd_create(struct ddp_etcd *e, const char *key, const void *val, size_t vlen,
                    int64_t lease, bool *created)
{
    return ddp_etcd_put_if(e, key, 0, val, vlen, lease, created);
}

int ddp_etcd_delete(struct ddp_etcd *e, const char *key, bool prefix, int64_t *deleted)
{
    char *k = ddp__etcd_b64(key, strlen(key)), *end = prefix ? ddp__etcd_prefix_end(key) : NULL;
    size_t n = (k ? strlen(k) : 0) + (end ? strlen(end) : 0) + 64;
    char *body = malloc(n);
    int r = DDP_ENOMEM;
    if (k && (end || !prefix) && body) {
        if (prefix)
            snprintf(body, n, "{\"key\":\"%s\",\"range_end\":\"%s\"}", k, end);
        else
            snprintf(body, n, "{\"key\":\"%s\"}", k);
        r = request(e, "/v3/kv/deleterange", body);
        if (r == 0 && deleted &&
            !ddp_json_i64(&e->json, ddp_json_get(&e->json, 0, "deleted"), deleted))
            *deleted = 0; /* zero is left out */
    }
    free(k);
    free(end);
    free(body);
    return r;
}

int ddp_etcd_list(struct ddp_etcd *e, const char *prefix,
                  void (*cb)(void *arg, const char *key, const char *val, size_t vlen), void *arg,
                  int64_t *revision)
{
    char *k = ddp__etcd_b64(prefix, strlen(prefix)), *end = ddp__etcd_prefix_end(prefix);
    size_t n = (k ? strlen(k) : 0) + (end ? strlen(end) : 0) + 64;
    char *body = malloc(n);
    int r = DDP_ENOMEM;
    if (k && end && body) {
        snprintf(body, n, "{\"key\":\"%s\",\"range_end\":\"%s\"}", k, end);
        r = request(e, "/v3/kv/range", body);
    }
    free(k);
    free(end);
    free(body);
    if (r < 0)
        return r;
    static const char *const rev_path[] = {"header", "revision", NULL};
    if (revision && !ddp_json_i64(&e->json, ddp_json_path(&e->json, 0, rev_path), revision))
        *revision = 0;
    int kvs = ddp_json_get(&e->json, 0, "kvs");
    for (uint32_t i = 0; kvs >= 0 && i < e->json.tok[kvs].count; i++) {
        char *key, *val;
        size_t vlen;
        if ((r = decode_kv(e, ddp_json_at(&e->json, kvs, i), &key, &val, &vlen)) < 0)
            return r;
        cb(arg, key, val, vlen);
        free(key);
        free(val);
    }
    return 0;
}

int ddp_etcd_lease_grant(struct ddp_etcd *e, int64_t ttl_s, int64_t *id)
{
    char body[64];
    snprintf(body, sizeof(body), "{\"TTL\":\"%" PRId64 "\"}", ttl_s);
    int r = request(e, "/v3/lease/grant", body);
    if (r == 0 && !ddp_json_i64(&e->json, ddp_json_get(&e->json, 0, "ID"), id)) {
        snprintf(e->err, sizeof(e->err), "etcd at %s: lease grant without an ID", e->ep[e->cur]);
        return DDP_EPROTO;
    }
    return r;
}

int ddp_etcd_lease_keepalive(struct ddp_etcd *e, int64_t id, int64_t *ttl)
{
    char body[64];
    snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", id);
    int r = request(e, "/v3/lease/keepalive", body);
    if (r < 0)
        return r;
    /* A gone lease answers without a TTL (zero is left out). */
    static const char *const ttl_path[] = {"result", "TTL", NULL};
    int64_t t = 0;
    if (!ddp_json_i64(&e->json, ddp_json_path(&e->json, 0, ttl_path), &t) || t <= 0) {
        snprintf(e->err, sizeof(e->err), "etcd at %s: lease %" PRId64 " has expired or was revoked",
                 e->ep[e->cur], id);
        return DDP_ENOLEASE;
    }
    if (ttl)
        *ttl = t;
    return 0;
}

int ddp_etcd_lease_revoke(struct ddp_etcd *e, int64_t id)
{
    char body[64];
    snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", id);
    int r = request(e, "/v3/lease/revoke", body);
    if (r == DDP_EPROTO && strstr(e->err, "not found"))
        return DDP_ENOLEASE;
    return r;
}
