/* A worker's store on etcd (rendezvous/store_etcd.h). */
#include "rendezvous/store_etcd.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/etcd.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/banned.h"

#define SE_MAX_ENDPOINTS 16
#define SE_MAX_WATCHES 8

struct se_watch {
    struct ddp__se *se;
    uint32_t id; /* 0: a free slot */
    char *key;   /* the full key, for a watch of one key */
    struct ddp_etcd_watch *w;
};

struct se_event {
    struct ddp_store_event *ev; /* NULL: the watch ended, etcd unreachable */
    struct se_event *next;
};

struct ddp__se {
    struct ddp_etcd *e;
    char *prefix; /* "<job prefix>kv/" */
    char *eps;    /* the endpoints, cut into list[] */
    const char *list[SE_MAX_ENDPOINTS];
    struct ddp_etcd_opts o; /* for the watches' connections */
    struct se_watch watches[SE_MAX_WATCHES];
    uint32_t next_id;
    pthread_mutex_t mu; /* the event queue, filled by the watches' threads */
    pthread_cond_t cv;
    struct se_event *head, *tail;
    bool interrupted; /* ddp__se_interrupt: next_event returns DDP_ECLOSED from now on */
};

static int fail(struct ddp__se *se, int r, const char *what, const char *key)
{
    if (r == DDP_ENOKEY)
        return r;
    DDP_ERROR(STORE, "%s '%s': %s", what, key, ddp_etcd_error(se->e));
    return r;
}

/* key under the job's prefix (malloc'd), or NULL. */
static char *full(const struct ddp__se *se, const char *key)
{
    if (!key)
        return NULL;
    size_t a = strlen(se->prefix), b = strlen(key);
    if (b > DDP_STORE_MAX_KEY)
        return NULL;
    char *k = malloc(a + b + 1);
    if (k) {
        memcpy(k, se->prefix, a);
        memcpy(k + a, key, b + 1);
    }
    return k;
}

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int ddp__se_open(const char *endpoints, const char *prefix, const char *ca, const char *cert,
                 const char *key, int timeout_ms, struct ddp__se **out)
{
    struct ddp__se *se = calloc(1, sizeof(*se));
    char *save = NULL;
    int r = DDP_ENOMEM;
    if (!se)
        return r;
    pthread_mutex_init(&se->mu, NULL);
    pthread_cond_init(&se->cv, NULL);
    size_t pl = strlen(prefix ? prefix : "") + 4;
    if (!(se->eps = strdup(endpoints ? endpoints : "")) || !(se->prefix = malloc(pl)))
        goto out;
    snprintf(se->prefix, pl, "%skv/", prefix ? prefix : "");
    size_t n = 0;
    for (char *t = strtok_r(se->eps, ",", &save); t && n < SE_MAX_ENDPOINTS;
         t = strtok_r(NULL, ",", &save))
        se->list[n++] = t;
    if (n == 0) {
        DDP_ERROR(STORE, "no etcd endpoints (DDPRUN_ETCD_ENDPOINTS is empty or unset)");
        r = DDP_EINVAL;
        goto out;
    }
    /* Copies: the watches started later read them, after the caller's strings are gone. */
    char *files[3] = {NULL, NULL, NULL};
    const char *given[3] = {ca, cert, key};
    for (int k = 0; k < 3; k++)
        if (given[k] && *given[k] && !(files[k] = strdup(given[k]))) {
            free(files[0]);
            free(files[1]);
            r = DDP_ENOMEM;
            goto out;
        }
    se->o = (struct ddp_etcd_opts){.endpoints = se->list,
                                   .nendpoints = n,
                                   .ca_file = files[0],
                                   .cert_file = files[1],
                                   .key_file = files[2]};
    if ((r = ddp_etcd_new(&se->o, &se->e)) < 0)
        goto out;
    /* The cluster may be electing a leader: ask until it answers or the time is up. */
    int64_t deadline = ddp_now_ms() + (timeout_ms > 0 ? timeout_ms : 300000);
    char ver[64];
    for (int backoff = 10;; backoff = backoff < 1000 ? 2 * backoff : 1000) {
        if ((r = ddp_etcd_version(se->e, ver, sizeof(ver))) == 0)
            break;
        if (r == DDP_EPROTO || ddp_now_ms() + backoff > deadline) {
            DDP_ERROR(STORE, "the job's store: %s", ddp_etcd_error(se->e));
            goto out;
        }
        pause_ms(backoff);
    }
    *out = se;
    return 0;
out:
    ddp__se_close(se);
    return r;
}

void ddp__se_close(struct ddp__se *se)
{
    if (!se)
        return;
    for (size_t i = 0; i < SE_MAX_WATCHES; i++)
        if (se->watches[i].id)
            ddp__se_unwatch(se, se->watches[i].id);
    while (se->head) {
        struct se_event *q = se->head;
        se->head = q->next;
        ddp_store_event_free(q->ev);
        free(q);
    }
    ddp_etcd_free(se->e);
    free((char *)se->o.ca_file);
    free((char *)se->o.cert_file);
    free((char *)se->o.key_file);
    free(se->eps);
    free(se->prefix);
    pthread_mutex_destroy(&se->mu);
    pthread_cond_destroy(&se->cv);
    free(se);
}

void ddp__se_set_timeout(struct ddp__se *se, int timeout_ms)
{
    ddp_etcd_set_timeout(se->e, timeout_ms);
}

int ddp__se_local_addr(struct ddp__se *se, char *buf, size_t len)
{
    if (ddp_etcd_local_ip(se->e, buf, len) == 0)
        return 0;
    /* etcd on a Unix socket: the address the agent found toward the other nodes */
    const char *a = getenv("DDPRUN_NODE_ADDR");
    if (!a || !*a || strlen(a) >= len)
        a = "127.0.0.1";
    memcpy(buf, a, strlen(a) + 1);
    return 0;
}

int ddp__se_set(struct ddp__se *se, const char *key, const void *val, size_t len)
{
    char *k = full(se, key);
    if (!k)
        return key ? DDP_ETOOBIG : DDP_EINVAL;
    int r = ddp_etcd_put(se->e, k, len ? val : "", len, 0);
    free(k);
    return r < 0 ? fail(se, r, "set", key) : 0;
}

static int get_rev(struct ddp__se *se, const char *key, char **val, size_t *len, int64_t *rev)
{
    char *k = full(se, key);
    if (!k)
        return key ? DDP_ETOOBIG : DDP_EINVAL;
    int r = ddp_etcd_get(se->e, k, val, len, rev);
    free(k);
    return r < 0 ? fail(se, r, "get", key) : 0;
}

int ddp__se_get(struct ddp__se *se, const char *key, void **val, size_t *len)
{
    char *v;
    int64_t rev;
    int r = get_rev(se, key, &v, len, &rev);
    if (r == 0)
        *val = v;
    return r;
}

/* Read, then write only if nobody wrote in between (the mod revision still matches). */
int ddp__se_add(struct ddp__se *se, const char *key, int64_t delta, int64_t *result)
{
    char *k = full(se, key);
    if (!k)
        return key ? DDP_ETOOBIG : DDP_EINVAL;
    int r;
    for (;;) {
        char *v = NULL, num[32];
        size_t vl = 0;
        int64_t rev = 0, cur = 0;
        r = ddp_etcd_get(se->e, k, &v, &vl, &rev);
        if (r < 0 && r != DDP_ENOKEY)
            break;
        if (r == 0) {
            char *end;
            errno = 0;
            long long x = strtoll(v, &end, 10);
            bool ok = vl > 0 && *end == '\0' && (size_t)(end - v) == vl && errno == 0;
            free(v);
            if (!ok) {
                r = DDP_ENOTINT;
                break;
            }
            cur = x;
        }
        if ((delta > 0 && cur > INT64_MAX - delta) || (delta < 0 && cur < INT64_MIN - delta)) {
            r = DDP_EINVAL;
            break;
        }
        int nl = snprintf(num, sizeof(num), "%" PRId64, cur + delta);
        bool swapped = false;
        if ((r = ddp_etcd_put_if(se->e, k, rev, num, (size_t)nl, 0, &swapped)) < 0)
            break;
        if (swapped) {
            if (result)
                *result = cur + delta;
            break;
        }
    }
    free(k);
    return r < 0 && r != DDP_ENOTINT && r != DDP_EINVAL ? fail(se, r, "add", key) : r;
}

int ddp__se_cas(struct ddp__se *se, const char *key, const void *expected, size_t exp_len,
                const void *desired, size_t des_len, bool *swapped, void **cur, size_t *cur_len)
{
    char *k = full(se, key);
    if (!k)
        return key ? DDP_ETOOBIG : DDP_EINVAL;
    int r;
    for (;;) {
        char *v = NULL;
        size_t vl = 0;
        int64_t rev = 0;
        r = ddp_etcd_get(se->e, k, &v, &vl, &rev);
        if (r < 0 && r != DDP_ENOKEY)
            break;
        bool present = r == 0;
        bool match = expected ? present && vl == exp_len && memcmp(v, expected, vl) == 0 : !present;
        bool done = false;
        if (match &&
            (r = ddp_etcd_put_if(se->e, k, rev, des_len ? desired : "", des_len, 0, &done)) < 0) {
            free(v);
            break;
        }
        if (match && !done) { /* written in between: look again */
            free(v);
            continue;
        }
        r = 0;
        *swapped = done;
        if (done) {
            free(v);
            v = malloc(des_len + 1);
            if (!v) {
                r = DDP_ENOMEM;
                break;
            }
            memcpy(v, desired, des_len);
            v[des_len] = '\0';
            vl = des_len;
            present = true;
        }
        if (cur) {
            *cur = present ? v : NULL;
            if (cur_len)
                *cur_len = present ? vl : 0;
            v = NULL;
        }
        free(v);
        break;
    }
    free(k);
    return r < 0 ? fail(se, r, "compare-and-set", key) : 0;
}

int ddp__se_delete(struct ddp__se *se, const char *key, bool *deleted)
{
    char *k = full(se, key);
    if (!k)
        return key ? DDP_ETOOBIG : DDP_EINVAL;
    int64_t n = 0;
    int r = ddp_etcd_delete(se->e, k, false, &n);
    free(k);
    if (r < 0)
        return fail(se, r, "delete", key);
    if (deleted)
        *deleted = n > 0;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Many keys: one range request over the folder they share            */
/* ------------------------------------------------------------------ */

struct listing {
    char **keys; /* full keys, in etcd's (byte) order */
    struct ddp_store_value *vals;
    size_t n, cap;
    bool nomem;
};

static void on_kv(void *arg, const char *key, const char *val, size_t vlen)
{
    struct listing *l = arg;
    if (l->nomem)
        return;
    if (l->n == l->cap) {
        size_t c = l->cap ? 2 * l->cap : 64;
        char **k = realloc(l->keys, c * sizeof(*k));
        if (k)
            l->keys = k;
        struct ddp_store_value *v = k ? realloc(l->vals, c * sizeof(*v)) : NULL;
        if (v)
            l->vals = v;
        if (!k || !v) {
            l->nomem = true;
            return;
        }
        l->cap = c;
    }
    char *kc = strdup(key), *vc = malloc(vlen + 1);
    if (!kc || !vc) {
        free(kc);
        free(vc);
        l->nomem = true;
        return;
    }
    memcpy(vc, val, vlen);
    vc[vlen] = '\0';
    l->keys[l->n] = kc;
    l->vals[l->n].data = vc;
    l->vals[l->n].len = vlen;
    l->n++;
}

static void listing_free(struct listing *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->keys[i]);
        free(l->vals[i].data);
    }
    free(l->keys);
    free(l->vals);
}

/* The index of full key k in l, or -1 (the listing is sorted as strcmp sorts). */
static long find(const struct listing *l, const char *k)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(l->keys[mid], k);
        if (c == 0)
            return (long)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* Every key under the longest folder ("a/b/") the keys share, into l. */
static int list_common(struct ddp__se *se, const char *const *keys, size_t n, struct listing *l)
{
    size_t cp = strlen(keys[0]);
    for (size_t i = 1; i < n; i++) {
        size_t j = 0;
        while (j < cp && keys[i][j] && keys[i][j] == keys[0][j])
            j++;
        cp = j;
    }
    while (cp > 0 && keys[0][cp - 1] != '/')
        cp--;
    char *folder = malloc(cp + 1);
    if (!folder)
        return DDP_ENOMEM;
    memcpy(folder, keys[0], cp);
    folder[cp] = '\0';
    char *k = full(se, folder);
    free(folder);
    if (!k)
        return DDP_ENOMEM;
    memset(l, 0, sizeof(*l));
    int r = ddp_etcd_list(se->e, k, on_kv, l, NULL);
    free(k);
    if (r == 0 && l->nomem)
        r = DDP_ENOMEM;
    if (r < 0) {
        listing_free(l);
        return r == DDP_ENOMEM ? r : fail(se, r, "list", keys[0]);
    }
    return 0;
}

/* Each key's value or NULL (vals may be NULL: *all only). */
static int lookup(struct ddp__se *se, const char *const *keys, size_t n,
                  struct ddp_store_value *vals, bool *all)
{
    for (size_t i = 0; i < n; i++)
        if (!keys[i] || strlen(keys[i]) > DDP_STORE_MAX_KEY)
            return keys[i] ? DDP_ETOOBIG : DDP_EINVAL;
    *all = true;
    if (vals)
        memset(vals, 0, n * sizeof(*vals));
    if (n == 0)
        return 0;
    struct listing l;
    int r = list_common(se, keys, n, &l);
    if (r < 0)
        return r;
    for (size_t i = 0; i < n; i++) {
        char *k = full(se, keys[i]);
        if (!k) {
            r = DDP_ENOMEM;
            break;
        }
        long at = find(&l, k);
        free(k);
        if (at < 0)
            *all = false;
        else if (vals) {
            vals[i] = l.vals[at];
            l.vals[at].data = NULL;
        }
    }
    listing_free(&l);
    if (r < 0 && vals)
        ddp_store_values_free(vals, n);
    return r;
}

int ddp__se_check(struct ddp__se *se, const char *const *keys, size_t n, bool *all)
{
    return lookup(se, keys, n, NULL, all);
}

int ddp__se_multi_get(struct ddp__se *se, const char *const *keys, size_t n,
                      struct ddp_store_value *vals)
{
    bool all;
    return lookup(se, keys, n, vals, &all);
}

int ddp__se_wait(struct ddp__se *se, const char *const *keys, size_t n, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : ddp_now_ms() + timeout_ms;
    for (int backoff = 2;; backoff = backoff < 50 ? backoff * 2 : 50) {
        bool all;
        int r = lookup(se, keys, n, NULL, &all);
        if (r < 0 || all)
            return r;
        int64_t left = deadline - ddp_now_ms();
        if (left <= 0)
            return DDP_ETIMEDOUT;
        pause_ms(left < backoff ? (int)left : backoff);
    }
}

/* ------------------------------------------------------------------ */
/* Leases and watches: the launcher's and agents' membership keys     */
/* ------------------------------------------------------------------ */

int ddp__se_set_leased(struct ddp__se *se, const char *key, const void *val, size_t len,
                       uint64_t lease)
{
    char *k = full(se, key);
    if (!k)
        return key ? DDP_ETOOBIG : DDP_EINVAL;
    int r = ddp_etcd_put(se->e, k, len ? val : "", len, (int64_t)lease);
    free(k);
    if (r == DDP_EPROTO && strstr(ddp_etcd_error(se->e), "lease not found"))
        return DDP_ENOLEASE;
    return r < 0 ? fail(se, r, "set", key) : 0;
}

/* etcd counts leases in whole seconds: a TTL of ttl_ms rounded up. */
int ddp__se_lease_grant(struct ddp__se *se, int ttl_ms, uint64_t *lease)
{
    int64_t id;
    int r = ddp_etcd_lease_grant(se->e, ((int64_t)ttl_ms + 999) / 1000, &id);
    if (r < 0)
        return fail(se, r, "lease", "grant");
    *lease = (uint64_t)id;
    return 0;
}

int ddp__se_lease_keepalive(struct ddp__se *se, uint64_t lease, int *ttl_ms)
{
    int64_t ttl;
    int r = ddp_etcd_lease_keepalive(se->e, (int64_t)lease, &ttl);
    if (r == 0 && ttl_ms)
        *ttl_ms = ttl > INT32_MAX / 1000 ? INT32_MAX : (int)ttl * 1000;
    return r;
}

int ddp__se_lease_revoke(struct ddp__se *se, uint64_t lease)
{
    return ddp_etcd_lease_revoke(se->e, (int64_t)lease);
}

const char *ddp__se_error(const struct ddp__se *se)
{
    return ddp_etcd_error(se->e);
}

static void push(struct ddp__se *se, struct ddp_store_event *ev)
{
    struct se_event *q = malloc(sizeof(*q));
    if (!q) {
        ddp_store_event_free(ev);
        return;
    }
    q->ev = ev;
    q->next = NULL;
    pthread_mutex_lock(&se->mu);
    if (se->tail)
        se->tail->next = q;
    else
        se->head = q;
    se->tail = q;
    pthread_cond_signal(&se->cv);
    pthread_mutex_unlock(&se->mu);
}

/* On a watch's thread: a change as a store event (a delete, lease ends included, as DELETE:
 * etcd does not tell them apart), its key without the job's prefix. */
static void on_change(void *arg, char kind, const char *key, const char *val, size_t vlen,
                      int64_t rev)
{
    (void)rev;
    struct se_watch *sw = arg;
    struct ddp__se *se = sw->se;
    if (kind == 'E') {
        DDP_ERROR(STORE, "watch: %s", key);
        push(se, NULL);
        return;
    }
    size_t pl = strlen(se->prefix);
    if (strncmp(key, se->prefix, pl) != 0 || (sw->key && strcmp(key, sw->key) != 0))
        return;
    struct ddp_store_event *ev = calloc(1, sizeof(*ev));
    if (!ev || !(ev->key = strdup(key + pl)) || (kind == 'P' && !(ev->value = malloc(vlen + 1)))) {
        ddp_store_event_free(ev);
        return;
    }
    ev->watch_id = sw->id;
    ev->kind = kind == 'P' ? DDP_STORE_EV_SET : DDP_STORE_EV_DELETE;
    if (kind == 'P') {
        memcpy(ev->value, val, vlen);
        ((char *)ev->value)[vlen] = '\0';
        ev->value_len = vlen;
    }
    push(se, ev);
}

int ddp__se_watch(struct ddp__se *se, const char *key, bool prefix, uint32_t *id)
{
    struct se_watch *sw = NULL;
    for (size_t i = 0; i < SE_MAX_WATCHES && !sw; i++)
        if (!se->watches[i].id)
            sw = &se->watches[i];
    if (!sw)
        return DDP_ETOOBIG;
    char *k = full(se, key);
    if (!k)
        return key ? DDP_ETOOBIG : DDP_EINVAL;
    /* From the revision after now: nothing set once this returns is missed. */
    int64_t rev;
    int r = ddp_etcd_revision(se->e, &rev);
    if (r < 0) {
        free(k);
        return fail(se, r, "watch", key);
    }
    sw->se = se;
    sw->key = prefix ? NULL : k;
    sw->id = ++se->next_id ? se->next_id : ++se->next_id;
    if ((r = ddp_etcd_watch_start(&se->o, k, rev + 1, on_change, sw, &sw->w)) < 0) {
        sw->id = 0;
        sw->key = NULL;
        free(k);
        return r;
    }
    if (prefix)
        free(k);
    *id = sw->id;
    return 0;
}

int ddp__se_unwatch(struct ddp__se *se, uint32_t id)
{
    for (size_t i = 0; i < SE_MAX_WATCHES; i++) {
        struct se_watch *sw = &se->watches[i];
        if (sw->id == id) {
            ddp_etcd_watch_stop(sw->w);
            free(sw->key);
            memset(sw, 0, sizeof(*sw));
            return 0;
        }
    }
    return DDP_EINVAL;
}

void ddp__se_interrupt(struct ddp__se *se)
{
    pthread_mutex_lock(&se->mu);
    se->interrupted = true;
    pthread_cond_broadcast(&se->cv);
    pthread_mutex_unlock(&se->mu);
}

int ddp__se_next_event(struct ddp__se *se, int timeout_ms, struct ddp_store_event **ev)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&se->mu);
    while (!se->head && !se->interrupted && timeout_ms != 0)
        if (timeout_ms > 0 ? pthread_cond_timedwait(&se->cv, &se->mu, &ts) != 0
                           : pthread_cond_wait(&se->cv, &se->mu) != 0)
            break;
    struct se_event *q = se->interrupted ? NULL : se->head;
    bool closed = se->interrupted;
    if (q) {
        se->head = q->next;
        if (!se->head)
            se->tail = NULL;
    }
    pthread_mutex_unlock(&se->mu);
    if (!q)
        return closed ? DDP_ECLOSED : DDP_ETIMEDOUT;
    *ev = q->ev;
    free(q);
    return *ev ? 0 : DDP_ECLOSED;
}
