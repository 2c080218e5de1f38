/*
 * The store as a membership backend (cli/proto/membership.h): the built-in store, or with
 * rendezvous: {backend: etcd} the job's folder in etcd through the same store calls
 * (rendezvous/store.h; there a lease's end is seen as a delete). An agent incarnation holds
 * the key "ddprun/nodes/<node>.<incarnation>" bound to a lease it renews from a heartbeat
 * thread; the launcher watches the prefix "ddprun/" from a thread of its own and hands each
 * expiry, and each "ddprun/resume/<round>" the workers set, to its loop through a pipe. The
 * store only moves the bytes; the key names are this file's.
 */
#include "cli/proto/membership.h"
#include "cli/proto/agent_proto.h"
#include "common/err.h"
#include "common/util.h"
#include "common/loop.h"
#include "rendezvous/store.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

/* ------------------------------------------------------------------ */
/* Agent side: the lease and its heartbeat                            */
/* ------------------------------------------------------------------ */

struct ddp__member_lease {
    pthread_t th;
    bool started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ddp_store *s;
    char host[256], addr[300], label[256];
    int port;
    char *token;
    struct ddp_store_etcd_opts etcd; /* .endpoints NULL: the built-in store */
    uint64_t lease;
    int64_t interval, timeout;
    int efd;       /* written once when the node must fence itself */
    char why[400]; /* why, for the message */
    struct ddp_loop *loop;
    void (*fenced)(void *arg, const char *why);
    void *arg;
    unsigned node, incarnation;
    _Atomic int64_t *renewed; /* each renewal's time, for the node's guard; or NULL */
    char *report; /* the latest progress report (publish), sent with the next heartbeat */
    size_t report_len;
    bool report_new;
    int64_t report_at; /* when it was published (ddp_now_ms) */
};

/* The job's store as j says: the built-in one at host:port, or the job's folder in etcd. */
static int connect_where(const struct ddp_store_etcd_opts *etcd, const char *host, int port,
                         const char *token, int timeout_ms, struct ddp_store **out)
{
    if (etcd->endpoints)
        return ddp_store_connect_etcd(etcd, timeout_ms, out);
    return ddp_store_connect(host, port, token, strlen(token), timeout_ms, out);
}

static void etcd_opts(const struct ddp__agent_join *j, struct ddp_store_etcd_opts *o)
{
    memset(o, 0, sizeof(*o));
    if (!j->etcd_endpoints || !*j->etcd_endpoints)
        return;
    *o = (struct ddp_store_etcd_opts){.endpoints = j->etcd_endpoints,
                                      .prefix = j->etcd_prefix,
                                      .ca = j->etcd_ca,
                                      .cert = j->etcd_cert,
                                      .key = j->etcd_key};
}

/* The latest progress report, bound to the lease (it goes with the node). A failure is
 * harmless: the next heartbeat sends a newer one. */
static void send_report(struct ddp__member_lease *h)
{
    pthread_mutex_lock(&h->mu);
    char *rep = h->report_new ? h->report : NULL;
    size_t len = h->report_len;
    int64_t at = h->report_at;
    h->report = rep ? NULL : h->report;
    h->report_new = false;
    pthread_mutex_unlock(&h->mu);
    if (!rep)
        return;
    /* Its first line, how long it waited for this heartbeat: the launcher counts the report's
     * ages (a group formed N ms ago) from its arrival, less this. */
    char head[48], key[96];
    int hl = snprintf(head, sizeof(head), "age %lld\n", (long long)(ddp_now_ms() - at));
    char *msg = malloc(len + (size_t)hl + 1);
    if (msg) {
        memcpy(msg, head, (size_t)hl);
        memcpy(msg + hl, rep, len);
        snprintf(key, sizeof(key), "ddprun/progress/%u.%u", h->node, h->incarnation);
        ddp_store_set_leased(h->s, key, msg, len + (size_t)hl, h->lease);
    }
    free(msg);
    free(rep);
}

static void publish(struct ddp__member_lease *h, const void *report, size_t len)
{
    if (!h)
        return;
    char *c = malloc(len + 1);
    if (!c)
        return;
    memcpy(c, report, len);
    c[len] = '\0';
    pthread_mutex_lock(&h->mu);
    free(h->report);
    h->report = c;
    h->report_len = len;
    h->report_new = true;
    h->report_at = ddp_now_ms();
    pthread_mutex_unlock(&h->mu);
}

static void *hb_main(void *arg)
{
    struct ddp__member_lease *h = arg;
    int64_t last_ok = ddp_now_ms();
    char why[sizeof(h->why)] = "";
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += h->interval / 1000;
        ts.tv_nsec += (h->interval % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        while (!h->stop && pthread_cond_timedwait(&h->cv, &h->mu, &ts) == 0) {
        }
        if (h->stop)
            break;
        pthread_mutex_unlock(&h->mu);
        int r = DDP_ECLOSED;
        int64_t quiet = ddp_now_ms() - last_ok;
        if (quiet >= h->timeout + h->interval) {
            /* This thread did not run for longer than the lease lives (the agent was stopped,
             * or the machine suspended): the launcher has counted the node lost by now,
             * whatever the store would answer; its ranks must stop at once. */
            snprintf(why, sizeof(why),
                     "no heartbeat sent for %.1f s (was this agent stopped?): the launcher "
                     "counts this node lost",
                     (double)quiet / 1000);
            pthread_mutex_lock(&h->mu);
            memcpy(h->why, why, sizeof(why));
            uint64_t one = 1;
            ssize_t w = write(h->efd, &one, sizeof(one));
            (void)w;
            break;
        }
        if (!h->s) {
            /* The connection broke: a new one may still renew the lease in time. */
            int left = (int)(h->timeout - (ddp_now_ms() - last_ok));
            if (left > 0 && connect_where(&h->etcd, h->host, h->port, h->token, left, &h->s) < 0)
                h->s = NULL;
        }
        if (h->s) {
            ddp_store_set_timeout(h->s, (int)h->interval);
            r = ddp_store_lease_keepalive(h->s, h->lease, NULL);
        }
        if (r == 0)
            send_report(h);
        if (r == 0) {
            last_ok = ddp_now_ms();
            if (h->renewed)
                atomic_store(h->renewed, last_ok);
        } else if (r == DDP_ENOLEASE) {
            snprintf(why, sizeof(why),
                     "its lease in the store expired: the launcher counts this node lost");
        } else {
            ddp_store_close(h->s);
            h->s = NULL;
            if (ddp_now_ms() - last_ok >= h->timeout)
                snprintf(why, sizeof(why), "no contact with the store at %.300s for %.1f s",
                         h->addr, (double)(ddp_now_ms() - last_ok) / 1000);
        }
        pthread_mutex_lock(&h->mu);
        if (why[0]) {
            memcpy(h->why, why, sizeof(why));
            uint64_t one = 1;
            ssize_t w = write(h->efd, &one, sizeof(one));
            (void)w;
            break;
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void on_fence(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    struct ddp__member_lease *h = arg;
    uint64_t v;
    if (read(fd, &v, sizeof(v)) < 0)
        return;
    ddp_loop_del(loop, fd);
    char why[sizeof(h->why)];
    pthread_mutex_lock(&h->mu);
    memcpy(why, h->why, sizeof(why));
    pthread_mutex_unlock(&h->mu);
    h->fenced(h->arg, why);
}

static void lease_free(struct ddp__member_lease *h)
{
    if (h->efd >= 0) {
        ddp_loop_del(h->loop, h->efd);
        close(h->efd);
    }
    ddp_store_close(h->s);
    free(h->report);
    if (h->token)
        ddp_freezero(h->token, strlen(h->token));
    free((char *)h->etcd.endpoints);
    free((char *)h->etcd.prefix);
    free((char *)h->etcd.ca);
    free((char *)h->etcd.cert);
    free((char *)h->etcd.key);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

/*
 * Connects to the store at addr: "host:port", or where the launcher did not know which of its
 * addresses reaches this node, several ("ip:port,ip:port,..."), tried in turn (the time split
 * among them, 2 s each at least). The one that answers is the node's store from then on
 * (h->host, h->port, h->addr). Each failure is named in the one message when none answers.
 */
static int connect_any(struct ddp__member_lease *h, const char *addr, int timeout)
{
    size_t k = 1;
    for (const char *p = addr; *p; p++)
        k += *p == ',';
    int each = k > 1 ? (int)((size_t)timeout / k) : timeout;
    if (each < 2000)
        each = 2000;
    char tried[1200] = "";
    size_t tl = 0;
    int r = DDP_EINVAL;
    for (const char *p = addr; *p;) {
        size_t len = strcspn(p, ",");
        char one[300];
        snprintf(one, sizeof(one), "%.*s", (int)(len < sizeof(one) ? len : sizeof(one) - 1), p);
        p += len + (p[len] == ',');
        if (ddp_parse_hostport(one, h->host, sizeof(h->host), &h->port) < 0) {
            r = DDP_EINVAL;
        } else if ((r = connect_where(&h->etcd, h->host, h->port, h->token, each, &h->s)) == 0) {
            snprintf(h->addr, sizeof(h->addr), "%s", one);
            return 0;
        }
        int w = snprintf(tried + tl, sizeof(tried) - tl, "%s%s (%s)", tl ? ", " : "", one,
                         r == DDP_EINVAL ? "not HOST:PORT" : ddp_strerror(r));
        if (w > 0 && tl + (size_t)w < sizeof(tried))
            tl += (size_t)w;
    }
    if (k > 1)
        fprintf(stderr,
                "ddprun agent on '%s': cannot reach the store at any of the launcher's %zu "
                "addresses: %s\n",
                h->label, k, tried);
    else
        fprintf(stderr, "ddprun agent on '%s': cannot reach the store at %s\n", h->label, tried);
    return r;
}

static const char *store_addr(const struct ddp__member_lease *h)
{
    return h->addr;
}

static int join(const struct ddp__agent_join *j, struct ddp_loop *loop,
                void (*fenced)(void *arg, const char *why), void *arg, _Atomic int64_t *renewed,
                uint64_t *lease_id, struct ddp__member_lease **out)
{
    struct ddp__member_lease *h = calloc(1, sizeof(*h));
    int r;
    if (!h)
        return DDP_ENOMEM;
    h->efd = -1;
    h->loop = loop;
    h->fenced = fenced;
    h->arg = arg;
    h->renewed = renewed;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&h->mu, NULL);
    snprintf(h->label, sizeof(h->label), "%s", j->host_label);
    h->node = j->node_index;
    h->incarnation = j->incarnation;
    snprintf(h->addr, sizeof(h->addr), "%s", j->store_addr);
    struct ddp_store_etcd_opts eo;
    etcd_opts(j, &eo);
    if (!(h->token = strdup(j->token)) ||
        (eo.endpoints &&
         (!(h->etcd.endpoints = strdup(eo.endpoints)) || !(h->etcd.prefix = strdup(eo.prefix)) ||
          (*eo.ca && !(h->etcd.ca = strdup(eo.ca))) ||
          (*eo.cert && !(h->etcd.cert = strdup(eo.cert))) ||
          (*eo.key && !(h->etcd.key = strdup(eo.key)))))) {
        lease_free(h);
        return DDP_ENOMEM;
    }
    int timeout = j->heartbeat_timeout_ms > 10000 ? (int)j->heartbeat_timeout_ms : 10000;
    if (eo.endpoints) {
        snprintf(h->addr, sizeof(h->addr), "etcd (%s)", eo.endpoints);
        if ((r = connect_where(&h->etcd, h->host, h->port, h->token, timeout, &h->s)) < 0) {
            fprintf(stderr, "ddprun agent on '%s': cannot reach the store at %s: %s\n", h->label,
                    h->addr, ddp_strerror(r));
            lease_free(h);
            return r;
        }
    } else if ((r = connect_any(h, j->store_addr, timeout)) < 0) {
        lease_free(h);
        return r;
    }
    char key[128], val[300];
    snprintf(key, sizeof(key), "ddprun/nodes/%u.%u", j->node_index, j->incarnation);
    int n = snprintf(val, sizeof(val), "%s %d", h->label, (int)getpid());
    ddp_store_set_timeout(h->s, timeout);
    if ((r = ddp_store_lease_grant(h->s, (int)j->heartbeat_timeout_ms, &h->lease)) < 0 ||
        (r = ddp_store_set_leased(h->s, key, val, (size_t)n, h->lease)) < 0) {
        fprintf(stderr, "ddprun agent on '%s': cannot take a lease in the store: %s\n", h->label,
                ddp_strerror(r));
        lease_free(h);
        return r;
    }
    h->interval = (int64_t)j->heartbeat_interval_ms;
    h->timeout = (int64_t)j->heartbeat_timeout_ms;
    if (h->renewed)
        atomic_store(h->renewed, ddp_now_ms());
    if ((h->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
        ddp_loop_add(loop, h->efd, DDP_LOOP_READ, on_fence, h) < 0) {
        lease_free(h);
        return DDP_ESYS;
    }
    /* It inherits this thread's mask: the job's signals stay blocked there too. */
    if (pthread_create(&h->th, NULL, hb_main, h) != 0) {
        lease_free(h);
        return DDP_ESYS;
    }
    h->started = true;
    *lease_id = h->lease;
    *out = h;
    return 0;
}

static void leave(struct ddp__member_lease *h, bool revoke)
{
    if (!h)
        return;
    if (h->started) {
        pthread_mutex_lock(&h->mu);
        h->stop = true;
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->th, NULL);
    }
    if (revoke && h->s) {
        /* A clean exit: the lease goes now rather than at its expiry. */
        ddp_store_set_timeout(h->s, 1000);
        ddp_store_lease_revoke(h->s, h->lease);
    }
    lease_free(h);
}

/* ------------------------------------------------------------------ */
/* Launcher side: the watch                                           */
/* ------------------------------------------------------------------ */

struct ddp__member_watch {
    pthread_t th;
    bool started;
    atomic_bool stop;
    struct ddp_store *s;
    struct ddp_loop *loop;
    int pipe[2];
    void (*cb)(void *arg, const struct ddp__member_ev *ev);
    void *arg;
};

/* A store event as a membership event, or false when it is not one. */
static bool parse_event(const struct ddp_store_event *e, struct ddp__member_ev *ev)
{
    char tail;
    memset(ev, 0, sizeof(*ev));
    /* (on etcd a lease's end, expired or revoked, is a delete; nobody else deletes these
     * keys) */
    if ((e->kind == DDP_STORE_EV_EXPIRE || e->kind == DDP_STORE_EV_DELETE ||
         e->kind == DDP_STORE_EV_REVOKE) &&
        sscanf(e->key, "ddprun/nodes/%u.%u%c", &ev->node, &ev->incarnation, &tail) == 2) {
        ev->kind = e->kind == DDP_STORE_EV_REVOKE ? DDP__MEV_LEASE_LEFT : DDP__MEV_LEASE_ENDED;
        return true;
    }
    if (e->kind == DDP_STORE_EV_SET && e->value &&
        sscanf(e->key, "ddprun/progress/%u.%u%c", &ev->node, &ev->incarnation, &tail) == 2) {
        if (!(ev->report = malloc(e->value_len + 1)))
            return false;
        memcpy(ev->report, e->value, e->value_len);
        ev->report[e->value_len] = '\0';
        ev->kind = DDP__MEV_PROGRESS;
        return true;
    }
    if (e->kind == DDP_STORE_EV_SET && e->value && e->value_len < 32 &&
        sscanf(e->key, "ddprun/resume/%d%c", &ev->round, &tail) == 1) {
        char v[32];
        memcpy(v, e->value, e->value_len);
        v[e->value_len] = '\0';
        if (sscanf(v, "%lld", &ev->step) == 1) {
            ev->kind = DDP__MEV_RESUMED;
            return true;
        }
    }
    return false;
}

/* The watch's own thread: a store client blocked on its events; each membership event goes
 * to the loop as one record through the pipe (a write of at most PIPE_BUF is atomic). */
static void *watch_main(void *arg)
{
    struct ddp__member_watch *w = arg;
    while (!atomic_load(&w->stop)) {
        struct ddp_store_event *e;
        int r = ddp_store_next_event(w->s, -1, &e); /* unwatch interrupts it */
        if (r < 0)
            break;
        struct ddp__member_ev ev;
        if (parse_event(e, &ev))
            ddp_write_all(w->pipe[1], &ev, sizeof(ev));
        ddp_store_event_free(e);
    }
    return NULL;
}

static void on_watch(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    struct ddp__member_watch *w = arg;
    struct ddp__member_ev ev;
    ssize_t n;
    while ((n = ddp_read_eintr(fd, &ev, sizeof(ev))) == (ssize_t)sizeof(ev))
        w->cb(w->arg, &ev);
    if (n == 0 || (n < 0 && n != -EAGAIN))
        ddp_loop_del(loop, fd);
}

static void unwatch(struct ddp__member_watch *w)
{
    if (!w)
        return;
    if (w->started) {
        atomic_store(&w->stop, true);
        ddp_store_interrupt(w->s); /* at once, not at the wait's next timeout */
        pthread_join(w->th, NULL);
    }
    if (w->pipe[0] >= 0) {
        ddp_loop_del(w->loop, w->pipe[0]);
        struct ddp__member_ev ev; /* reports nobody will read */
        fcntl(w->pipe[0], F_SETFL, O_NONBLOCK);
        while (ddp_read_eintr(w->pipe[0], &ev, sizeof(ev)) == (ssize_t)sizeof(ev))
            free(ev.report);
        close(w->pipe[0]);
    }
    if (w->pipe[1] >= 0)
        close(w->pipe[1]);
    ddp_store_close(w->s);
    free(w);
}

static int watch(const struct ddp__agent_join *where, struct ddp_loop *loop,
                 void (*cb)(void *arg, const struct ddp__member_ev *ev), void *arg,
                 struct ddp__member_watch **out)
{
    struct ddp_store_etcd_opts eo;
    char host[256];
    int port = 0;
    etcd_opts(where, &eo);
    if (!eo.endpoints && ddp_parse_hostport(where->store_addr, host, sizeof(host), &port) < 0)
        return DDP_EINVAL;
    struct ddp__member_watch *w = calloc(1, sizeof(*w));
    uint32_t id;
    int r;
    if (!w)
        return DDP_ENOMEM;
    w->pipe[0] = w->pipe[1] = -1;
    w->loop = loop;
    w->cb = cb;
    w->arg = arg;
    if ((r = connect_where(&eo, host, port, where->token, 10000, &w->s)) < 0 ||
        (r = ddp_store_watch(w->s, "ddprun/", true, &id)) < 0)
        goto fail;
    r = DDP_ESYS;
    if (pipe2(w->pipe, O_CLOEXEC) != 0)
        goto fail;
    fcntl(w->pipe[0], F_SETFL, O_NONBLOCK);
    if (ddp_loop_add(loop, w->pipe[0], DDP_LOOP_READ, on_watch, w) < 0)
        goto fail;
    if (pthread_create(&w->th, NULL, watch_main, w) != 0)
        goto fail;
    w->started = true;
    *out = w;
    return 0;
fail:
    unwatch(w);
    return r;
}

const struct ddp__member_ops ddp__member_store = {.name = "store",
                                                  .join = join,
                                                  .leave = leave,
                                                  .publish = publish,
                                                  .store_addr = store_addr,
                                                  .watch = watch,
                                                  .unwatch = unwatch};
