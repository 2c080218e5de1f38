/*
 * The process group: formation from the environment, the authenticated TCP
 * mesh between ranks, and the communication thread that runs queued
 * collectives in order (see pg.h for the contract).
 */
#include "worker/pg.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"
#include "worker/coll.h"
#ifdef DDP_HAVE_NCCL
#include "worker/pg_nccl.h"
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

#define PEER_MAGIC 0x47504444u /* "DDPG" */
#define SECRET_LEN 16
#define DEFAULT_SMALL_BYTES (64u << 10)

enum work_kind { W_ALLREDUCE, W_BROADCAST, W_ALLGATHER, W_REDUCE_SCATTER, W_BARRIER };

struct ddp_work {
    enum work_kind kind;
    void *buf;
    const void *send;
    size_t count;
    enum ddp_dtype dt;
    enum ddp_redop op;
    int root;
    int result;
    bool done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ddp_work *next; /* queue link, owned by the group while queued or in flight */
    /* NCCL works are handed to the device, not run: `enqueued` once the collective is on the
     * communication stream; the caller and the communication thread (the watchdog, which
     * keeps it in its in-flight list until it completes) each hold a reference. */
    bool nccl, enqueued;
    int refs;
    int64_t deadline;
    void *stream; /* the compute stream at start (stream waits) */
#ifdef DDP_HAVE_NCCL
    struct ddp__nccl_op nop;
#endif
};

struct ddp_pg {
    int rank, world, local_rank, local_world, node_rank;
    int timeout_ms;
    struct ddp__comm comm;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ddp_work *head, *tail;
    bool busy; /* an operation is running, on the comm thread or inline in a caller */
    bool stop;
    _Atomic bool alive;
    char err[1024];
    struct ddp_store *store; /* for the abort record; borrowed, or owned when owns_store */
    bool owns_store;
    char abort_key[300];
    struct ddp__nccl *nccl; /* the NCCL backend, or NULL */
    void *compute_stream;   /* what NCCL collectives wait for (ddp_pg_set_compute_stream) */
};

static const char *kind_name(enum work_kind k)
{
    static const char *const names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                        "barrier"};
    return names[k];
}

/* ------------------------------------------------------------------ */
/* The communication thread                                           */
/* ------------------------------------------------------------------ */

static void complete(struct ddp_work *w, int result)
{
    pthread_mutex_lock(&w->mu);
    if (!w->done)
        w->result = result;
    w->done = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* After a failure no peer can be trusted to be in step: close everything, so the peers see
 * EOF and abort too instead of waiting out their timeouts. */
static void abort_group(struct ddp_pg *pg)
{
    pg->alive = false;
#ifdef DDP_HAVE_NCCL
    ddp__nccl_request_abort(pg->nccl);
#endif
    for (int i = 0; i < pg->world; i++)
        if (pg->comm.peers[i].fd >= 0)
            shutdown(pg->comm.peers[i].fd, SHUT_RDWR);
}

static int run(struct ddp_pg *pg, struct ddp_work *w)
{
    struct ddp__comm *c = &pg->comm;
    size_t esz = ddp_dtype_size(w->dt);
    c->opname = kind_name(w->kind);
    c->deadline_ms = ddp_now_ms() + pg->timeout_ms;
    switch (w->kind) {
    case W_ALLREDUCE:
        return ddp__cpu_allreduce(c, w->buf, w->count, w->dt, w->op);
    case W_BROADCAST:
        return ddp__cpu_broadcast(c, w->buf, w->count * esz, w->root);
    case W_ALLGATHER:
        return ddp__cpu_allgather(c, w->send, w->buf, w->count * esz);
    case W_REDUCE_SCATTER:
        return ddp__cpu_reduce_scatter(c, w->send, w->buf, w->count, w->dt, w->op);
    case W_BARRIER:
        return ddp__cpu_barrier(c);
    }
    return DDP_EINVAL;
}

/*
 * Records why the group failed, once per group (first writer wins), before this rank shuts its
 * sockets: a rank that fails only because a neighbour aborted then finds the root cause there.
 * Returns the cause another rank recorded first, or NULL (malloc'd).
 */
static char *record_abort(struct ddp_pg *pg, const char *why)
{
    char mine[1200];
    void *cur = NULL;
    bool swapped = false;
    if (!pg->store)
        return NULL;
    snprintf(mine, sizeof(mine), "rank %d: %s", pg->rank, why);
    if (ddp_store_cas(pg->store, pg->abort_key, NULL, 0, mine, strlen(mine), &swapped, &cur, NULL) <
            0 ||
        swapped) {
        free(cur);
        return NULL;
    }
    return cur;
}

/* An operation failed with r (pg->comm.err says why): record the cause, abort the group. */
static void fail_group(struct ddp_pg *pg, enum work_kind kind, int r)
{
    const char *what = pg->comm.err[0] ? pg->comm.err : ddp_strerror(r);
    char *root = record_abort(pg, what);
    if (root)
        snprintf(pg->err, sizeof(pg->err), "%s; the group had already failed at %s", what, root);
    else
        snprintf(pg->err, sizeof(pg->err), "%s", what);
    free(root);
    DDP_ERROR(PG, "rank %d: %s failed: %s; aborting the group", pg->rank, kind_name(kind), pg->err);
    abort_group(pg);
}

/* Runs one operation (with pg->busy held by the caller) and aborts the group if it fails. */
static int execute(struct ddp_pg *pg, struct ddp_work *w, bool stopping)
{
    if (stopping || !pg->alive)
        return DDP_EABORTED;
    int r = run(pg, w);
    if (r < 0)
        fail_group(pg, w->kind, r);
    return r;
}

static void *comm_main(void *arg)
{
    struct ddp_pg *pg = arg;
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        /* Wait for work, and for an inline operation (issued earlier) to finish first. */
        while ((!pg->head || pg->busy) && !pg->stop)
            pthread_cond_wait(&pg->cv, &pg->mu);
        while (pg->busy)
            pthread_cond_wait(&pg->cv, &pg->mu);
        struct ddp_work *w = pg->head;
        if (!w)
            break; /* stopping with nothing queued */
        pg->head = w->next;
        if (!pg->head)
            pg->tail = NULL;
        bool stopping = pg->stop;
        pg->busy = true;
        pthread_mutex_unlock(&pg->mu);
        int r = execute(pg, w, stopping);
        pthread_mutex_lock(&pg->mu);
        pg->busy = false;
        pthread_cond_broadcast(&pg->cv);
        pthread_mutex_unlock(&pg->mu);
        complete(w, r);
        pthread_mutex_lock(&pg->mu);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

static void work_destroy(struct ddp_work *w)
{
#ifdef DDP_HAVE_NCCL
    if (w->nccl)
        ddp__nccl_op_end(&w->nop);
#endif
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

/* Drops one reference to an NCCL work; the last one frees it. */
static void work_release(struct ddp_work *w)
{
    pthread_mutex_lock(&w->mu);
    bool last = --w->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (last)
        work_destroy(w);
}

#ifdef DDP_HAVE_NCCL
static const enum ddp__nccl_kind nccl_kind[] = {[W_ALLREDUCE] = DDP__NCCL_ALLREDUCE,
                                                [W_BROADCAST] = DDP__NCCL_BROADCAST,
                                                [W_ALLGATHER] = DDP__NCCL_ALLGATHER,
                                                [W_REDUCE_SCATTER] = DDP__NCCL_REDUCE_SCATTER,
                                                [W_BARRIER] = DDP__NCCL_BARRIER};

/*
 * The watchdog's sweep over the collectives in flight (oldest first; one stream completes
 * them in order): completed ones are finished and let go; the oldest still running is
 * checked for an asynchronous error, its deadline and an abort request. On a failure every
 * collective in flight fails with it, and the group is aborted.
 */
static void sweep(struct ddp_pg *pg, struct ddp_work **fly)
{
    while (*fly) {
        struct ddp_work *w = *fly;
        int q = ddp__nccl_op_query(&w->nop);
        if (q == 1) {
            *fly = w->next;
            complete(w, 0);
            work_release(w);
            continue;
        }
        int r = q < 0 ? DDP_ESYS
                      : ddp__nccl_check(pg->nccl, kind_name(w->kind), w->deadline, pg->comm.err,
                                        sizeof(pg->comm.err));
        if (r == 0)
            return;
        if (q < 0)
            snprintf(pg->comm.err, sizeof(pg->comm.err),
                     "%s on rank %d: CUDA error while it ran on the device", kind_name(w->kind),
                     pg->rank);
        if (pg->alive)
            fail_group(pg, w->kind, r);
        while (*fly) {
            w = *fly;
            *fly = w->next;
            complete(w, r);
            work_release(w);
        }
    }
}

/*
 * The communication thread of an NCCL group: enqueues each collective as it arrives without
 * waiting for the ones before it (the stream orders them), and between arrivals watches the
 * ones in flight every millisecond. Stopping drains what is in flight.
 */
static void *comm_nccl_main(void *arg)
{
    struct ddp_pg *pg = arg;
    struct ddp_work *fly = NULL, **fly_end = &fly;
    ddp__nccl_bind_thread(pg->nccl);
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        struct ddp_work *w = pg->head;
        if (w) {
            pg->head = w->next;
            if (!pg->head)
                pg->tail = NULL;
            bool stopping = pg->stop;
            pthread_mutex_unlock(&pg->mu);
            int r = DDP_EABORTED;
            w->next = NULL;
            w->deadline = ddp_now_ms() + pg->timeout_ms;
            if (!stopping && pg->alive &&
                (r = ddp__nccl_enqueue(pg->nccl, &w->nop, nccl_kind[w->kind], w->send, w->buf,
                                       w->count, w->dt, w->op, w->root, w->deadline, pg->comm.err,
                                       sizeof(pg->comm.err))) < 0)
                fail_group(pg, w->kind, r);
            if (r < 0) {
                complete(w, r);
                work_release(w);
            } else {
                *fly_end = w;
                fly_end = &w->next;
                pthread_mutex_lock(&w->mu);
                w->enqueued = true;
                pthread_cond_broadcast(&w->cv);
                pthread_mutex_unlock(&w->mu);
            }
            pthread_mutex_lock(&pg->mu);
            continue;
        }
        if (!fly) {
            if (pg->stop)
                break;
            pthread_cond_wait(&pg->cv, &pg->mu);
            continue;
        }
        pthread_mutex_unlock(&pg->mu);
        sweep(pg, &fly);
        if (!fly)
            fly_end = &fly;
        pthread_mutex_lock(&pg->mu);
        if (fly && !pg->head) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&pg->cv, &pg->mu, &ts);
        }
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}
#endif

/* NCCL works: until the collective is on the stream (or failed before). */
static void wait_enqueued(struct ddp_work *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->enqueued && !w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* NCCL works: whether the device has finished it (marking it done). */
static bool nccl_finished(struct ddp_work *w)
{
#ifdef DDP_HAVE_NCCL
    if (ddp__nccl_op_query(&w->nop) == 1) {
        complete(w, 0);
        return true;
    }
#else
    (void)w;
#endif
    return false;
}

/*
 * The blocking forms' fast path: when nothing is queued or running, the caller runs the
 * operation itself, saving two thread hand-offs (each a futex wake-up, tens of microseconds
 * on a busy or virtual machine). Order is kept: the comm thread waits for pg->busy.
 * Returns 1 when it could not take the fast path.
 */
static int run_inline(struct ddp_pg *pg, struct ddp_work *w)
{
    pthread_mutex_lock(&pg->mu);
    if (pg->head || pg->busy || pg->stop) {
        pthread_mutex_unlock(&pg->mu);
        return 1;
    }
    pg->busy = true;
    pthread_mutex_unlock(&pg->mu);
    int r = execute(pg, w, false);
    pthread_mutex_lock(&pg->mu);
    pg->busy = false;
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    return r;
}

static int enqueue(struct ddp_pg *pg, struct ddp_work *w, struct ddp_work **out)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    *out = w;
    pthread_mutex_lock(&pg->mu);
    if (!pg->alive) {
        pthread_mutex_unlock(&pg->mu);
        w->done = true;
        w->result = DDP_EABORTED;
        w->refs = 1; /* the communication thread never sees it */
        return 0;
    }
    if (pg->tail)
        pg->tail->next = w;
    else
        pg->head = w;
    pg->tail = w;
    pthread_cond_signal(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    return 0;
}

static int check_args(const struct ddp_pg *pg, enum ddp_dtype dt, enum ddp_redop op)
{
    if (!pg || ddp_dtype_size(dt) == 0 || (unsigned)op > DDP_MIN)
        return DDP_EINVAL;
    return 0;
}

/*
 * One description per collective, checked once: the _start forms queue a heap copy of it,
 * the blocking forms run it (inline when the group is idle).
 */
static int describe(struct ddp_pg *pg, struct ddp_work *w, enum work_kind kind, const void *send,
                    void *buf, size_t count, enum ddp_dtype dt, enum ddp_redop op, int root)
{
    if (check_args(pg, dt, op) < 0 || root < 0 || root >= pg->world)
        return DDP_EINVAL;
    bool needs_send = kind == W_ALLGATHER || kind == W_REDUCE_SCATTER;
    if (count && (!buf || (needs_send && !send)))
        return DDP_EINVAL;
    *w = (struct ddp_work){
        .kind = kind, .send = send, .buf = buf, .count = count, .dt = dt, .op = op, .root = root};
    return 0;
}

static int start(struct ddp_pg *pg, const struct ddp_work *desc, struct ddp_work **out)
{
    struct ddp_work *w = malloc(sizeof(*w));
    if (!w)
        return DDP_ENOMEM;
    *w = *desc;
    w->refs = 1;
#ifdef DDP_HAVE_NCCL
    if (pg->nccl && pg->alive) {
        /* Ordered after everything the program has queued on its compute stream so far. */
        char err[256];
        int r = ddp__nccl_op_begin(pg->nccl, &w->nop, pg->compute_stream, err, sizeof(err));
        if (r < 0) {
            DDP_ERROR(PG, "%s", err);
            free(w);
            return r;
        }
        w->nccl = true;
        w->refs = 2;
        w->stream = pg->compute_stream;
    }
#endif
    return enqueue(pg, w, out);
}

int ddp_work_wait(struct ddp_work *w)
{
    if (w->nccl) {
        /* Poll the device (the watchdog fails it on an error or its deadline). */
        wait_enqueued(w);
        for (unsigned spins = 0;; spins++) {
            int r;
            if (ddp_work_test(w, &r))
                return r;
            if (spins > 64)
                usleep(spins > 4096 ? 200 : 20);
        }
    }
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    int r = w->result;
    pthread_mutex_unlock(&w->mu);
    return r;
}

bool ddp_work_test(struct ddp_work *w, int *result)
{
    pthread_mutex_lock(&w->mu);
    bool d = w->done, queued = w->enqueued;
    pthread_mutex_unlock(&w->mu);
    if (!d && w->nccl && queued)
        d = nccl_finished(w);
    if (d && result) {
        pthread_mutex_lock(&w->mu);
        *result = w->result;
        pthread_mutex_unlock(&w->mu);
    }
    return d;
}

int ddp_work_stream_wait(struct ddp_work *w)
{
    if (!w->nccl)
        return ddp_work_wait(w);
    wait_enqueued(w);
    pthread_mutex_lock(&w->mu);
    int r = w->done ? w->result : 0;
    pthread_mutex_unlock(&w->mu);
    if (r < 0)
        return r;
#ifdef DDP_HAVE_NCCL
    if (ddp__nccl_op_stream_wait(&w->nop, w->stream) < 0) {
        DDP_ERROR(PG, "cannot make the compute stream wait for a collective");
        return DDP_ESYS;
    }
#endif
    return 0;
}

void ddp_work_free(struct ddp_work *w)
{
    if (!w)
        return;
    if (w->nccl) {
        /* The device owns the buffers from here; the watchdog lets go of it when it is done. */
        wait_enqueued(w);
        work_release(w);
        return;
    }
    ddp_work_wait(w);
    work_destroy(w);
}

/* The blocking forms: inline when the group is idle (CPU groups), else queued behind
 * earlier work. */
static int blocking(struct ddp_pg *pg, const struct ddp_work *desc)
{
    struct ddp_work w = *desc, *q;
    int r = pg->nccl ? 1 : run_inline(pg, &w);
    if (r != 1)
        return r;
    if ((r = start(pg, desc, &q)) < 0)
        return r;
    r = ddp_work_wait(q);
    ddp_work_free(q);
    return r;
}

/* Each collective: describe it once, then queue it (_start) or run it (blocking). */
#define COLLECTIVE(KIND, SEND, BUF, COUNT, DT, OP, ROOT)                                           \
    struct ddp_work w;                                                                             \
    int r = describe(pg, &w, KIND, SEND, BUF, COUNT, DT, OP, ROOT);                                \
    if (r < 0)                                                                                     \
    return r

int ddp_pg_allreduce_start(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                           enum ddp_redop op, struct ddp_work **work)
{
    COLLECTIVE(W_ALLREDUCE, NULL, buf, count, dt, op, 0);
    return start(pg, &w, work);
}

int ddp_pg_allreduce(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                     enum ddp_redop op)
{
    COLLECTIVE(W_ALLREDUCE, NULL, buf, count, dt, op, 0);
    return blocking(pg, &w);
}

int ddp_pg_broadcast_start(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt, int root,
                           struct ddp_work **work)
{
    COLLECTIVE(W_BROADCAST, NULL, buf, count, dt, DDP_SUM, root);
    return start(pg, &w, work);
}

int ddp_pg_broadcast(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt, int root)
{
    COLLECTIVE(W_BROADCAST, NULL, buf, count, dt, DDP_SUM, root);
    return blocking(pg, &w);
}

int ddp_pg_allgather_start(struct ddp_pg *pg, const void *send, void *recv, size_t count,
                           enum ddp_dtype dt, struct ddp_work **work)
{
    COLLECTIVE(W_ALLGATHER, send, recv, count, dt, DDP_SUM, 0);
    return start(pg, &w, work);
}

int ddp_pg_allgather(struct ddp_pg *pg, const void *send, void *recv, size_t count,
                     enum ddp_dtype dt)
{
    COLLECTIVE(W_ALLGATHER, send, recv, count, dt, DDP_SUM, 0);
    return blocking(pg, &w);
}

int ddp_pg_reduce_scatter_start(struct ddp_pg *pg, const void *send, void *recv, size_t count,
                                enum ddp_dtype dt, enum ddp_redop op, struct ddp_work **work)
{
    COLLECTIVE(W_REDUCE_SCATTER, send, recv, count, dt, op, 0);
    return start(pg, &w, work);
}

int ddp_pg_reduce_scatter(struct ddp_pg *pg, const void *send, void *recv, size_t count,
                          enum ddp_dtype dt, enum ddp_redop op)
{
    COLLECTIVE(W_REDUCE_SCATTER, send, recv, count, dt, op, 0);
    return blocking(pg, &w);
}

int ddp_pg_barrier_start(struct ddp_pg *pg, struct ddp_work **work)
{
    COLLECTIVE(W_BARRIER, NULL, NULL, 0, DDP_F32, DDP_SUM, 0);
    return start(pg, &w, work);
}

int ddp_pg_barrier(struct ddp_pg *pg)
{
    COLLECTIVE(W_BARRIER, NULL, NULL, 0, DDP_F32, DDP_SUM, 0);
    return blocking(pg, &w);
}

/* ------------------------------------------------------------------ */
/* Forming the group                                                  */
/* ------------------------------------------------------------------ */

/* The proof a connecting rank sends: HMAC(listener's secret, "ddp-pg" || my rank). */
static void peer_mac(const uint8_t *secret, uint32_t rank, uint8_t out[32])
{
    uint8_t msg[10] = {'d', 'd', 'p', '-', 'p', 'g'};
    unsigned int len = 32;
    for (int i = 0; i < 4; i++)
        msg[6 + i] = (uint8_t)(rank >> (8 * i));
    HMAC(EVP_sha256(), secret, SECRET_LEN, msg, sizeof(msg), out, &len);
}

static int hex_decode(const char *hex, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

static void set_sock(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int connect_peer(struct ddp_pg *pg, int j, const char *ip, int port, const uint8_t *secret,
                        int64_t deadline)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV},
                    *res = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    if (getaddrinfo(ip, ps, &hints, &res) != 0)
        return DDP_EINVAL;
    int fd = -1;
    while (ddp_now_ms() < deadline) {
        fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0)
            break;
        if (fd >= 0)
            close(fd);
        fd = -1;
        usleep(20000);
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(pg->err, sizeof(pg->err), "cannot connect to peer rank %d (%s at %s:%d)", j,
                 pg->comm.peers[j].host, ip, port);
        return DDP_ECONNECT;
    }
    set_sock(fd);
    uint8_t hello[40];
    uint32_t v = PEER_MAGIC, me = (uint32_t)pg->rank;
    memcpy(hello, &v, 4);
    memcpy(hello + 4, &me, 4);
    peer_mac(secret, me, hello + 8);
    if (ddp_write_all(fd, hello, sizeof(hello)) < 0) {
        close(fd);
        return DDP_ECONNECT;
    }
    pg->comm.peers[j].fd = fd;
    return 0;
}

static int accept_peers(struct ddp_pg *pg, int lfd, const uint8_t *my_secret, int64_t deadline)
{
    int want = pg->world - 1 - pg->rank;
    while (want > 0) {
        int64_t rem = deadline - ddp_now_ms();
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (rem <= 0 || poll(&p, 1, (int)(rem > 1000 ? 1000 : rem)) < 0) {
            if (rem > 0 && errno == EINTR)
                continue;
            snprintf(pg->err, sizeof(pg->err),
                     "timed out waiting for %d higher-ranked peers to connect", want);
            return DDP_ETIMEDOUT;
        }
        if (!(p.revents & POLLIN))
            continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        uint8_t hello[40], mac[32];
        struct timeval tv = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        ssize_t n = recv(fd, hello, sizeof(hello), MSG_WAITALL);
        uint32_t magic, who;
        memcpy(&magic, hello, 4);
        memcpy(&who, hello + 4, 4);
        if (n == (ssize_t)sizeof(hello) && magic == PEER_MAGIC && who > (uint32_t)pg->rank &&
            who < (uint32_t)pg->world && pg->comm.peers[who].fd < 0) {
            peer_mac(my_secret, who, mac);
            if (CRYPTO_memcmp(mac, hello + 8, 32) == 0) {
                tv.tv_sec = 0;
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
                set_sock(fd);
                pg->comm.peers[who].fd = fd;
                want--;
                continue;
            }
        }
        DDP_WARN(PG, "rank %d: refused a peer connection that failed the handshake", pg->rank);
        close(fd);
    }
    return 0;
}

/* Where every rank runs, from the addresses they published. */
struct layout {
    bool uniform;  /* every node has local ranks 0..L-1 once each, L the same everywhere */
    int nodes;     /* distinct node ranks */
    int node_idx;  /* ours, counted in ascending node rank */
    int *local_of; /* [local rank] -> group rank, on our node */
    int *cross_of; /* [node index] -> group rank with our local rank on that node */
};

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void layout_free(struct layout *l)
{
    free(l->local_of);
    free(l->cross_of);
}

static int layout_compute(const struct ddp_pg *pg, const int *node_of, const int *local_of,
                          const int *lw_of, struct layout *l)
{
    int W = pg->world, L = pg->local_world;
    memset(l, 0, sizeof(*l));
    int *sorted = malloc((size_t)W * sizeof(int));
    l->local_of = malloc((size_t)L * sizeof(int));
    l->cross_of = malloc((size_t)W * sizeof(int));
    if (!sorted || !l->local_of || !l->cross_of) {
        free(sorted);
        layout_free(l);
        return DDP_ENOMEM;
    }
    memcpy(sorted, node_of, (size_t)W * sizeof(int));
    qsort(sorted, (size_t)W, sizeof(int), cmp_int);
    int n = 0;
    for (int i = 0; i < W; i++)
        if (i == 0 || sorted[i] != sorted[i - 1])
            sorted[n++] = sorted[i];
    l->nodes = n;
    l->uniform = n * L == W;
    for (int k = 0; k < n; k++)
        if (sorted[k] == pg->node_rank)
            l->node_idx = k;
    for (int i = 0; i < L; i++)
        l->local_of[i] = -1;
    for (int k = 0; k < n; k++)
        l->cross_of[k] = -1;
    /* Each (node, local rank) must occur once, with the same local world size everywhere:
     * checked on everyone's data, so every rank reaches the same verdict. */
    char *seen = l->uniform ? calloc((size_t)W, 1) : NULL;
    if (l->uniform && !seen) {
        free(sorted);
        layout_free(l);
        return DDP_ENOMEM;
    }
    for (int j = 0; j < W && l->uniform; j++) {
        int k =
            (int)((int *)bsearch(&node_of[j], sorted, (size_t)n, sizeof(int), cmp_int) - sorted);
        if (lw_of[j] != L || local_of[j] < 0 || local_of[j] >= L || seen[k * L + local_of[j]]++) {
            l->uniform = false;
            break;
        }
        if (node_of[j] == pg->node_rank)
            l->local_of[local_of[j]] = j;
        if (local_of[j] == pg->local_rank)
            l->cross_of[k] = j;
    }
    free(seen);
    free(sorted);
    return 0;
}

/*
 * Maps the node's shared-memory segment when the node has several ranks, every node has the
 * same number (DDP_PG_TRANSPORT=tcp turns it off). Local rank 0 creates it under a random
 * name and publishes the name through the store; every rank maps its node's; all ranks of the
 * group agree through an all-gather whether everyone succeeded (else all keep TCP, so every
 * rank runs the same algorithms); then the names are unlinked, so nothing outlives the group
 * even if it crashes.
 */
static int setup_shm(struct ddp_pg *pg, struct ddp_store *store, const char *name,
                     struct layout *lay)
{
    const char *tr = getenv("DDP_PG_TRANSPORT"), *sl = getenv("DDP_PG_SHM_SLOT_BYTES");
    if ((tr && strcmp(tr, "tcp") == 0) || pg->local_world < 2)
        return 0;
    if (!lay->uniform) {
        if (pg->rank == 0)
            DDP_WARN(PG, "nodes have different numbers of ranks; collectives use TCP only");
        return 0;
    }
    int L = pg->local_world;
    size_t slot = sl && atol(sl) >= 4096 ? (size_t)atol(sl) : (size_t)1 << 20;
    if (slot < (size_t)L * 64)
        slot = (size_t)L * 64; /* a reduce-scatter round moves at least one element per rank */
    slot = (slot + 63) / 64 * 64;
    size_t len = ddp__shm_segment_bytes(L, slot);
    char key[300], shmname[64] = "", prefix[300];
    int r, fd = -1;
    void *base = MAP_FAILED;
    snprintf(key, sizeof(key), "pg/%s/shm/%d", name, pg->node_rank);
    if (pg->local_rank == 0) {
        uint64_t rnd;
        if (ddp_random_bytes(&rnd, sizeof(rnd)) == 0) {
            snprintf(shmname, sizeof(shmname), "/ddp-%016llx", (unsigned long long)rnd);
            fd = shm_open(shmname, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
            if (fd >= 0 && ftruncate(fd, (off_t)len) != 0) {
                close(fd);
                fd = -1;
            }
        }
        if ((r = ddp_store_set(store, key, fd >= 0 ? shmname : "-",
                               fd >= 0 ? strlen(shmname) : 1)) < 0)
            goto out;
    } else {
        const char *keys[1] = {key};
        void *v;
        size_t vl;
        if ((r = ddp_store_wait(store, keys, 1, pg->timeout_ms)) < 0 ||
            (r = ddp_store_get(store, key, &v, &vl)) < 0)
            goto out;
        snprintf(shmname, sizeof(shmname), "%s", (char *)v);
        free(v);
        if (strcmp(shmname, "-") != 0)
            fd = shm_open(shmname, O_RDWR | O_CLOEXEC, 0);
    }
    if (fd >= 0)
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    /* Everyone or no one: agree on whether every rank mapped its node's segment. */
    char ok = base != MAP_FAILED ? '1' : '0';
    struct ddp_store_value *vals = calloc((size_t)pg->world, sizeof(*vals));
    snprintf(prefix, sizeof(prefix), "pg/%s/shm-mapped", name);
    r = vals
            ? ddp_store_all_gather(store, prefix, pg->rank, pg->world, &ok, 1, pg->timeout_ms, vals)
            : DDP_ENOMEM;
    bool all = r == 0;
    for (int i = 0; all && i < pg->world; i++)
        all = vals[i].len == 1 && ((char *)vals[i].data)[0] == '1';
    if (vals)
        ddp_store_values_free(vals, (size_t)pg->world);
    free(vals);
    if (pg->local_rank == 0 && shmname[0] == '/')
        shm_unlink(shmname); /* every rank has it mapped (or gave up): the name is not needed */
    if (r < 0)
        goto out;
    if (all) {
        ddp__shm_attach(&pg->comm.shm, base, L, pg->local_rank, lay->local_of, slot);
        lay->local_of = NULL; /* owned by the segment now */
        base = MAP_FAILED;
        DDP_INFO(PG, "rank %d: shared-memory all-reduce on (%zu-byte slots)", pg->rank, slot);
    } else {
        DDP_WARN(PG, "rank %d: shared memory unavailable on some node; all-reduce uses TCP",
                 pg->rank);
    }
out:
    if (base != MAP_FAILED)
        munmap(base, len);
    if (fd >= 0)
        close(fd);
    return r;
}

/* With shared memory on several nodes: our ring across the nodes, for the hierarchical
 * all-reduce. Its peers are copies of the group's connections (closed by the group). */
static int setup_cross(struct ddp_pg *pg, const struct layout *lay)
{
    if (!pg->comm.shm.base || lay->nodes < 2)
        return 0;
    struct ddp__comm *x = calloc(1, sizeof(*x));
    if (!x || !(x->peers = calloc((size_t)lay->nodes, sizeof(struct ddp__peer)))) {
        free(x);
        return DDP_ENOMEM;
    }
    x->rank = lay->node_idx;
    x->world = lay->nodes;
    x->small_bytes = pg->comm.small_bytes;
    for (int k = 0; k < lay->nodes; k++) {
        x->peers[k] = pg->comm.peers[lay->cross_of[k]];
        if (k == x->rank)
            x->peers[k].fd = -1;
    }
    pg->comm.cross = x;
    if (pg->rank == 0)
        DDP_INFO(PG, "hierarchical all-reduce: %d nodes x %d ranks, %d rings across nodes",
                 lay->nodes, pg->local_world, pg->local_world);
    return 0;
}

static void cross_free(struct ddp__comm *x)
{
    if (!x)
        return;
    free(x->scratch);
    free(x->peers);
    free(x);
}

int ddp_pg_init(struct ddp_store *store, int rank, int world, int local_rank, int local_world,
                int node_rank, const struct ddp_pg_opts *opts, struct ddp_pg **out)
{
    struct ddp_pg *pg = NULL;
    struct ddp_store_value *vals = NULL;
    int lfd = -1, r = DDP_EINVAL, *where = NULL; /* node, local rank, local world of each */
    struct layout lay;
    bool have_lay = false;
    uint8_t secret[SECRET_LEN];
    if (!store || world < 1 || rank < 0 || rank >= world || local_world < 1 || local_rank < 0 ||
        local_rank >= local_world || node_rank < 0)
        return DDP_EINVAL;
    if (!(pg = calloc(1, sizeof(*pg))) ||
        !(pg->comm.peers = calloc((size_t)world, sizeof(struct ddp__peer)))) {
        free(pg);
        return DDP_ENOMEM;
    }
    pg->rank = rank;
    pg->world = world;
    pg->local_rank = local_rank;
    pg->local_world = local_world;
    pg->node_rank = node_rank;
    pg->alive = true;
    const char *env;
    pg->timeout_ms = opts && opts->timeout_ms > 0                           ? opts->timeout_ms
                     : (env = getenv("DDP_PG_TIMEOUT_MS")) && atoi(env) > 0 ? atoi(env)
                                                                            : 300000;
    pg->comm.small_bytes = opts && opts->small_bytes ? opts->small_bytes
                           : (env = getenv("DDP_PG_SMALL_BYTES")) && atol(env) > 0
                               ? (size_t)atol(env)
                               : DEFAULT_SMALL_BYTES;
    pg->comm.rank = rank;
    pg->comm.world = world;
    for (int i = 0; i < world; i++) {
        pg->comm.peers[i].fd = -1;
        pg->comm.peers[i].rank = i;
    }
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    /* Keys of each restart of an elastic job stay apart from the earlier rounds' (whose
     * ranks may have left keys behind in the same store). */
    char scoped[200];
    const char *rc_env = getenv("TORCHELASTIC_RESTART_COUNT");
    snprintf(scoped, sizeof(scoped), "%s%s%s", opts && opts->name ? opts->name : "default",
             rc_env && *rc_env && strcmp(rc_env, "0") != 0 ? "@r" : "",
             rc_env && *rc_env && strcmp(rc_env, "0") != 0 ? rc_env : "");
    const char *name = scoped;
    int64_t deadline = ddp_now_ms() + pg->timeout_ms;
    pg->store = store;
    snprintf(pg->abort_key, sizeof(pg->abort_key), "pg/%s/abort", name);
    if (opts && opts->backend == DDP_PG_BACKEND_NCCL) {
#ifdef DDP_HAVE_NCCL
        char key[300];
        snprintf(key, sizeof(key), "pg/%s/nccl-id", name);
        if ((r = ddp__nccl_init(store, key, rank, world, local_rank, pg->timeout_ms, &pg->nccl,
                                pg->err, sizeof(pg->err))) < 0)
            goto fail;
        if (pthread_create(&pg->thread, NULL, comm_nccl_main, pg) != 0) {
            r = DDP_ESYS;
            goto fail;
        }
        *out = pg;
        return 0;
#else
        snprintf(pg->err, sizeof(pg->err),
                 "backend nccl: this libddp was built without CUDA and NCCL");
        r = DDP_ENOTSUP;
        goto fail;
#endif
    }

    /* Listen on the interface that reaches the store; peers on other nodes can reach it too. */
    char ip[64];
    if ((r = ddp_store_local_addr(store, ip, sizeof(ip))) < 0)
        goto fail;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_PASSIVE},
                    *res = NULL;
    r = DDP_ESYS;
    if (getaddrinfo(ip, "0", &hints, &res) != 0)
        goto fail;
    lfd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, res->ai_addr, res->ai_addrlen) != 0 || listen(lfd, 1024) != 0 ||
        getsockname(lfd, (struct sockaddr *)&ss, &sl) != 0) {
        freeaddrinfo(res);
        snprintf(pg->err, sizeof(pg->err), "cannot listen on %s: %s", ip, strerror(errno));
        goto fail;
    }
    freeaddrinfo(res);
    int port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                        : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if ((r = ddp_random_bytes(secret, sizeof(secret))) < 0)
        goto fail;
    char host[128], blob[512], hex[2 * SECRET_LEN + 1];
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "?");
    host[sizeof(host) - 1] = '\0';
    for (int i = 0; i < SECRET_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", secret[i]);
    int bl = snprintf(blob, sizeof(blob), "%s %d %s %s %d %d %d", ip, port, hex, host, node_rank,
                      local_rank, local_world);
    char prefix[256];
    snprintf(prefix, sizeof(prefix), "pg/%s/addr", name);
    r = DDP_ENOMEM;
    if (!(vals = calloc((size_t)world, sizeof(*vals))) ||
        !(where = malloc(3 * (size_t)world * sizeof(int))))
        goto fail;
    if ((r = ddp_store_all_gather(store, prefix, rank, world, blob, (size_t)bl, pg->timeout_ms,
                                  vals)) < 0) {
        snprintf(pg->err, sizeof(pg->err), "ranks did not all publish their addresses in time");
        goto fail;
    }
    /* Lower ranks are connected to (their backlog accepts even before they call accept);
     * higher ranks connect to us. */
    for (int j = 0; j < world; j++) {
        char pip[64], psec[2 * SECRET_LEN + 1], phost[128];
        int pport;
        if (sscanf(vals[j].data, "%63s %d %32s %127s %d %d %d", pip, &pport, psec, phost, &where[j],
                   &where[world + j], &where[2 * world + j]) != 7) {
            r = DDP_EPROTO;
            snprintf(pg->err, sizeof(pg->err), "rank %d published a malformed address", j);
            goto fail;
        }
        snprintf(pg->comm.peers[j].host, sizeof(pg->comm.peers[j].host), "%s", phost);
        if (j < rank) {
            uint8_t ps2[SECRET_LEN];
            if (hex_decode(psec, ps2, SECRET_LEN) < 0) {
                r = DDP_EPROTO;
                goto fail;
            }
            if ((r = connect_peer(pg, j, pip, pport, ps2, deadline)) < 0)
                goto fail;
        }
    }
    if ((r = accept_peers(pg, lfd, secret, deadline)) < 0)
        goto fail;
    if ((r = layout_compute(pg, where, where + world, where + 2 * world, &lay)) < 0)
        goto fail;
    have_lay = true;
    if ((r = setup_shm(pg, store, name, &lay)) < 0) {
        snprintf(pg->err, sizeof(pg->err), "cannot agree on the shared-memory segment: %s",
                 ddp_strerror(r));
        goto fail;
    }
    if ((r = setup_cross(pg, &lay)) < 0)
        goto fail;
    layout_free(&lay);
    have_lay = false;
    free(where);
    where = NULL;
    close(lfd);
    lfd = -1;
    ddp_store_values_free(vals, (size_t)world);
    free(vals);
    vals = NULL;
    if (pthread_create(&pg->thread, NULL, comm_main, pg) != 0) {
        r = DDP_ESYS;
        goto fail;
    }
    DDP_INFO(PG, "rank %d of %d: process group '%s' formed (%s:%d)", rank, world, name, ip, port);
    *out = pg;
    return 0;
fail:
    DDP_ERROR(PG, "rank %d: cannot form the process group: %s", rank,
              pg->err[0] ? pg->err : ddp_strerror(r));
    if (lfd >= 0)
        close(lfd);
    if (vals) {
        ddp_store_values_free(vals, (size_t)world);
        free(vals);
    }
    for (int i = 0; i < world; i++)
        if (pg->comm.peers[i].fd >= 0)
            close(pg->comm.peers[i].fd);
    ddp__shm_detach(&pg->comm.shm);
    cross_free(pg->comm.cross);
#ifdef DDP_HAVE_NCCL
    ddp__nccl_free(pg->nccl);
#endif
    if (have_lay)
        layout_free(&lay);
    free(where);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    free(pg->comm.peers);
    free(pg);
    return r;
}

static int env_int(const char *name, int lo, int *out)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v) {
        DDP_ERROR(PG, "%s is not set (is this process running under ddprun or torchrun?)", name);
        return DDP_EINVAL;
    }
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > 1 << 24) {
        DDP_ERROR(PG, "%s='%s' is not a whole number of at least %d", name, v, lo);
        return DDP_EINVAL;
    }
    *out = (int)x;
    return 0;
}

int ddp_pg_init_env(const struct ddp_pg_opts *opts, struct ddp_pg **out)
{
    int rank, world, lr, lw, node, r;
    if ((r = env_int("RANK", 0, &rank)) < 0 || (r = env_int("WORLD_SIZE", 1, &world)) < 0 ||
        (r = env_int("LOCAL_RANK", 0, &lr)) < 0 || (r = env_int("LOCAL_WORLD_SIZE", 1, &lw)) < 0 ||
        (r = env_int("GROUP_RANK", 0, &node)) < 0)
        return r;
    if (rank >= world || lr >= lw || lw > world) {
        DDP_ERROR(PG, "inconsistent ranks: RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d",
                  rank, world, lr, lw);
        return DDP_EINVAL;
    }
    ddp_log_set_rank(rank);
    struct ddp_pg_opts o = opts ? *opts : (struct ddp_pg_opts){0};
    if (o.backend == DDP_PG_BACKEND_DEFAULT) {
        const char *b = getenv("DDPRUN_BACKEND");
        if (b && strcmp(b, "nccl") == 0)
            o.backend = DDP_PG_BACKEND_NCCL;
        else if (!b || !*b || strcmp(b, "cpu") == 0)
            o.backend = DDP_PG_BACKEND_CPU;
        else {
            DDP_ERROR(PG, "DDPRUN_BACKEND='%s' is neither 'cpu' nor 'nccl'", b);
            return DDP_EINVAL;
        }
    }
    opts = &o;
    struct ddp_store *s;
    int timeout = opts->timeout_ms > 0 ? opts->timeout_ms : 300000;
    if ((r = ddp_store_connect_env(timeout, &s)) < 0)
        return r;
    if ((r = ddp_pg_init(s, rank, world, lr, lw, node, opts, out)) < 0) {
        ddp_store_close(s);
        return r;
    }
    /* Kept for the abort record, which must not hang on a dead store. */
    (*out)->owns_store = true;
    ddp_store_set_timeout(s, 2000);
    return 0;
}

void ddp_pg_free(struct ddp_pg *pg)
{
    if (!pg)
        return;
    pthread_mutex_lock(&pg->mu);
    pg->stop = true;
    pthread_cond_signal(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    pthread_join(pg->thread, NULL);
    for (int i = 0; i < pg->world; i++)
        if (pg->comm.peers[i].fd >= 0)
            close(pg->comm.peers[i].fd);
    ddp__shm_detach(&pg->comm.shm);
    cross_free(pg->comm.cross);
#ifdef DDP_HAVE_NCCL
    ddp__nccl_free(pg->nccl);
#endif
    if (pg->owns_store)
        ddp_store_close(pg->store);
    free(pg->comm.scratch);
    free(pg->comm.peers);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    free(pg);
}

#ifdef DDP_HAVE_NCCL
void ddp__pg_set_trace(struct ddp_pg *pg, ddp__nccl_trace_fn *fn, void *arg)
{
    if (pg && pg->nccl)
        ddp__nccl_set_trace(pg->nccl, fn, arg);
}
#endif

void ddp_pg_set_compute_stream(struct ddp_pg *pg, void *stream)
{
    if (pg)
        pg->compute_stream = stream;
}

void *ddp_pg_compute_stream(const struct ddp_pg *pg)
{
    return pg ? pg->compute_stream : NULL;
}

void *ddp_pg_comm_stream(struct ddp_pg *pg)
{
#ifdef DDP_HAVE_NCCL
    return pg ? ddp__nccl_stream(pg->nccl) : NULL;
#else
    (void)pg;
    return NULL;
#endif
}

bool ddp_pg_is_cuda(const struct ddp_pg *pg)
{
    return pg && pg->nccl;
}

int ddp_pg_rank(const struct ddp_pg *pg)
{
    return pg->rank;
}

int ddp_pg_world_size(const struct ddp_pg *pg)
{
    return pg->world;
}

bool ddp_pg_is_alive(const struct ddp_pg *pg)
{
    return pg->alive;
}

const char *ddp_pg_last_error(const struct ddp_pg *pg)
{
    return pg->err;
}

int ddp_pg_report_resume(struct ddp_pg *pg, int64_t step)
{
    const char *rc_env = getenv("TORCHELASTIC_RESTART_COUNT");
    if (!pg || !pg->store || !getenv("DDPRUN_JOB_ID") || !rc_env || !*rc_env)
        return 0;
    char key[96], val[32];
    snprintf(key, sizeof(key), "ddprun/resume/%d", atoi(rc_env));
    int n = snprintf(val, sizeof(val), "%lld", (long long)step);
    return ddp_store_set(pg->store, key, val, (size_t)n);
}

void ddp_pg_abort(struct ddp_pg *pg, const char *why)
{
    if (!pg || !pg->alive)
        return;
    free(record_abort(pg, why ? why : "aborted by the program"));
    DDP_ERROR(PG, "rank %d: aborting the group: %s", pg->rank, why ? why : "by the program");
    abort_group(pg);
}
