/*
 * etcd watches over the JSON gateway (rendezvous/etcd.h): POST /v3/watch keeps the response open
 * and streams one JSON object per message, each on its own line; this thread reads them with its
 * own libcurl handle and hands the events to the callback.
 */
#include "rendezvous/etcd.h"
#include "rendezvous/etcd_priv.h"
#include "rendezvous/curl_dl.h"
#include "common/base64.h"
#include "common/buf.h"
#include "common/err.h"
#include "common/json.h"
#include "common/util.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

struct ddp_etcd_watch {
    pthread_t th;
    atomic_bool stop;
    char **ep;
    size_t nep;
    char *ca, *cert, *key;
    int timeout_ms;
    char *prefix;
    int64_t next_rev; /* the revision to resume from */
    void (*cb)(void *, char, const char *, const char *, size_t, int64_t);
    void *arg;
    struct ddp_buf in;
};

/* One streamed message: {"result":{"header":...,"created":true,"events":[...]}}. */
static void on_message(struct ddp_etcd_watch *w, const char *text, size_t n)
{
    struct ddp_json j;
    if (ddp_json_parse(text, n, &j) < 0)
        return; /* not a watch message: nothing to hand on */
    int res = ddp_json_get(&j, 0, "result");
    int evs = ddp_json_get(&j, res, "events");
    if (w->next_rev == 0) { /* "from now on": now is the revision the watch was created at */
        static const char *const rev_path[] = {"header", "revision", NULL};
        int64_t now;
        if (ddp_json_i64(&j, ddp_json_path(&j, res, rev_path), &now))
            w->next_rev = now + 1;
    }
    for (uint32_t i = 0; evs >= 0 && i < j.tok[evs].count; i++) {
        int ev = ddp_json_at(&j, evs, i), kv = ddp_json_get(&j, ev, "kv");
        int64_t rev = 0;
        char *key, *val;
        size_t vlen;
        if (!ddp_json_i64(&j, ddp_json_get(&j, kv, "mod_revision"), &rev) ||
            ddp__etcd_kv(&j, kv, &key, &val, &vlen) < 0)
            continue;
        /* a delete has type DELETE; a put's type (0) is left out */
        int tt = ddp_json_get(&j, ev, "type");
        bool del = tt >= 0 && j.tok[tt].end - j.tok[tt].start == 6 &&
                   !memcmp(j.text + j.tok[tt].start, "DELETE", 6);
        if (rev >= w->next_rev) {
            w->cb(w->arg, del ? 'D' : 'P', key, val, vlen, rev);
            w->next_rev = rev + 1;
        }
        free(key);
        free(val);
    }
    ddp_json_free(&j);
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *arg)
{
    struct ddp_etcd_watch *w = arg;
    size_t n = size * nmemb;
    if (ddp_buf_put(&w->in, p, n) < 0 || w->in.len > (64u << 20))
        return 0;
    for (;;) {
        uint8_t *start = w->in.data + w->in.off;
        uint8_t *nl = memchr(start, '\n', w->in.len - w->in.off);
        if (!nl)
            break;
        on_message(w, (const char *)start, (size_t)(nl - start));
        w->in.off += (size_t)(nl - start) + 1;
    }
    ddp_buf_compact(&w->in);
    return atomic_load(&w->stop) ? 0 : n;
}

static int on_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)a;
    (void)b;
    (void)c;
    (void)d;
    return atomic_load(&((struct ddp_etcd_watch *)arg)->stop) ? 1 : 0;
}

static void *watch_main(void *arg)
{
    struct ddp_etcd_watch *w = arg;
    CURL *c = ddp__curl(NULL)->easy_init();
    char err[1024] = "out of memory";
    int64_t last_ok = ddp_now_ms();
    size_t i = 0;
    char *k = ddp__etcd_b64(w->prefix, strlen(w->prefix));
    char *end = ddp__etcd_prefix_end(w->prefix);
    while (c && k && end && !atomic_load(&w->stop)) {
        const char *ep = w->ep[i % w->nep];
        char url[2048], body[8192];
        if (strncmp(ep, "unix://", 7) == 0) {
            ddp__curl(NULL)->easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, ep + 7);
            snprintf(url, sizeof(url), "http://localhost/v3/watch");
        } else {
            ddp__curl(NULL)->easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, NULL);
            snprintf(url, sizeof(url), "%s/v3/watch", ep);
        }
        snprintf(body, sizeof(body),
                 "{\"create_request\":{\"key\":\"%s\",\"range_end\":\"%s\","
                 "\"start_revision\":\"%" PRId64 "\"}}",
                 k, end, w->next_rev);
        w->in.len = w->in.off = 0;
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_URL, url);
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_POSTFIELDS, body);
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)w->timeout_ms);
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_WRITEDATA, w);
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_XFERINFODATA, w);
        /* a member that vanishes without a word: TCP keepalive notices */
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_TCP_KEEPIDLE, 2L);
        ddp__curl(NULL)->easy_setopt(c, CURLOPT_TCP_KEEPINTVL, 1L);
        if (w->ca)
            ddp__curl(NULL)->easy_setopt(c, CURLOPT_CAINFO, w->ca);
        if (w->cert)
            ddp__curl(NULL)->easy_setopt(c, CURLOPT_SSLCERT, w->cert);
        if (w->key)
            ddp__curl(NULL)->easy_setopt(c, CURLOPT_SSLKEY, w->key);
        int64_t before = w->next_rev;
        CURLcode cr = ddp__curl(NULL)->easy_perform(c);
        if (atomic_load(&w->stop))
            break;
        long status = 0;
        ddp__curl(NULL)->easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (status == 200 || w->next_rev != before)
            last_ok = ddp_now_ms(); /* it served: the stream ended, resume from next_rev */
        snprintf(err, sizeof(err), "etcd at %s: the watch of %s ended: %s", ep, w->prefix,
                 cr != CURLE_OK  ? ddp__curl(NULL)->easy_strerror(cr)
                 : status != 200 ? "HTTP error"
                                 : "closed");
        if (ddp_now_ms() - last_ok > w->timeout_ms) {
            w->cb(w->arg, 'E', err, NULL, 0, 0);
            break;
        }
        i++; /* the next member */
        if (i % w->nep == 0)
            usleep(100 * 1000);
    }
    if (!c || !k || !end)
        w->cb(w->arg, 'E', err, NULL, 0, 0);
    free(k);
    free(end);
    if (c)
        ddp__curl(NULL)->easy_cleanup(c);
    return NULL;
}

static void watch_free(struct ddp_etcd_watch *w)
{
    for (size_t i = 0; i < w->nep; i++)
        free(w->ep[i]);
    free(w->ep);
    free(w->ca);
    free(w->cert);
    free(w->key);
    free(w->prefix);
    ddp_buf_release(&w->in);
    free(w);
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

int ddp_etcd_watch_start(const struct ddp_etcd_opts *o, const char *prefix, int64_t start_rev,
                         void (*cb)(void *arg, char kind, const char *key, const char *val,
                                    size_t vlen, int64_t rev),
                         void *arg, struct ddp_etcd_watch **out)
{
    if (!o->nendpoints)
        return DDP_EINVAL;
    int r = ddp__etcd_global_init();
    if (r < 0)
        return r;
    struct ddp_etcd_watch *w = calloc(1, sizeof(*w));
    if (!w || !(w->ep = calloc(o->nendpoints, sizeof(char *))) || !(w->prefix = strdup(prefix)))
        goto nomem;
    for (; w->nep < o->nendpoints; w->nep++)
        if (!(w->ep[w->nep] = strdup(o->endpoints[w->nep])))
            goto nomem;
    w->ca = dup_or_null(o->ca_file);
    w->cert = dup_or_null(o->cert_file);
    w->key = dup_or_null(o->key_file);
    w->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 5000;
    w->next_rev = start_rev;
    w->cb = cb;
    w->arg = arg;
    ddp_buf_init(&w->in);
    if (pthread_create(&w->th, NULL, watch_main, w) != 0)
        goto nomem;
    *out = w;
    return 0;
nomem:
    if (w)
        watch_free(w);
    return DDP_ENOMEM;
}

void ddp_etcd_watch_stop(struct ddp_etcd_watch *w)
{
    if (!w)
        return;
    atomic_store(&w->stop, true);
    pthread_join(w->th, NULL);
    watch_free(w);
}
