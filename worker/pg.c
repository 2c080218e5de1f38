/*
 * The process group's collectives (see pg.h for the contract): work handles, the queue, and
 * the communication thread that runs queued collectives in order (on NCCL groups, enqueues them
 * on the device and watches them). Forming and freeing a group is in pg_setup.c.
 */
#include "worker/group.h"
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
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

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
    for (int i = 0; i < pg->world; i++) {
        if (pg->comm.peers[i].fd >= 0)
            shutdown(pg->comm.peers[i].fd, SHUT_RDWR);
        for (int s = 0; s < DDP__TCP_MAX_CONNS - 1; s++)
            if (pg->comm.peers[i].sfd[s] >= 0)
                shutdown(pg->comm.peers[i].sfd[s], SHUT_RDWR);
        /* point-to-point connections too (closed only when the group is freed), so peers
         * waiting for a message from this rank fail at once */
        if (pg->p2p_fd && pg->p2p_fd[i] >= 0)
            shutdown(pg->p2p_fd[i], SHUT_RDWR);
    }
}

static int run(struct ddp_pg *pg, struct ddp_work *w)
{
    struct ddp__comm *c = &pg->comm;
    size_t esz = ddp_dtype_size(w->dt);
    c->opname = kind_name(w->kind);
    c->deadline_ms = ddp_now_ms() + pg->timeout_ms;
    switch (w->kind) {
    case W_ALLREDUCE:
        if (w->pieces)
            return ddp__cpu_allreduce_pieces(c, w->pieces, w->npieces, w->count, w->dt, w->op);
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
    if (stopping || !pg->alive) {
        ddp__rec_end(pg->rec, w->seq, DDP_EABORTED);
        return DDP_EABORTED;
    }
    ddp__rec_start(pg->rec, w->seq);
    int r = run(pg, w);
    ddp__rec_end(pg->rec, w->seq, r < 0 ? r : 0);
    if (r < 0)
        fail_group(pg, w->kind, r);
    return r;
}

/* The program issued w (under pg->mu): its place in the flight recorder. */
static void record_entry(struct ddp_pg *pg, struct ddp_work *w)
{
    _Static_assert((int)W_BARRIER == (int)DDP_PROG_BARRIER, "work kinds are recorder ops");
    w->seq = ddp__rec_enter(pg->rec, (enum ddp_progress_op)w->kind, (int)w->dt,
                            (uint64_t)w->count * ddp_dtype_size(w->dt), w->bucket);
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
    free(w->pieces);
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
            ddp__rec_end(pg->rec, w->seq, 0);
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
            ddp__rec_end(pg->rec, w->seq, r);
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
                ddp__rec_end(pg->rec, w->seq, r);
                complete(w, r);
                work_release(w);
            } else {
                ddp__rec_start(pg->rec, w->seq);
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
    record_entry(pg, w);
    pthread_mutex_unlock(&pg->mu);
    int r = execute(pg, w, false);
    pthread_mutex_lock(&pg->mu);
    ddp__pg_unbusy(pg);
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
    record_entry(pg, w);
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
    *w = (struct ddp_work){.kind = kind,
                           .send = send,
                           .buf = buf,
                           .count = count,
                           .dt = dt,
                           .op = op,
                           .root = root,
                           .bucket = -1};
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
    for (int64_t end = w->spin ? ddp_now_ns() + DDP__SPIN_NS : 0; !w->done && end;) {
        pthread_mutex_unlock(&w->mu);
        if (ddp_now_ns() > end)
            end = 0;
        else
            sched_yield();
        pthread_mutex_lock(&w->mu);
    }
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
    if (r != 1) {
        free(w.pieces); /* run here: ours to free (a queued work frees its own) */
        return r;
    }
    if ((r = start(pg, desc, &q)) < 0) {
        free(w.pieces);
        return r;
    }
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

int ddp_pg_allreduce_start_bucket(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                                  enum ddp_redop op, int bucket, struct ddp_work **work)
{
    COLLECTIVE(W_ALLREDUCE, NULL, buf, count, dt, op, 0);
    w.bucket = bucket < 0 ? -1 : bucket;
    return start(pg, &w, work);
}

/* The description of an all-reduce in pieces, with its own copy of the array. */
static int describe_pieces(struct ddp_pg *pg, struct ddp_work *w, const struct ddp_piece *pieces,
                           size_t n, enum ddp_dtype dt, enum ddp_redop op, int bucket)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        if (!pieces[i].data && pieces[i].count)
            return DDP_EINVAL;
        count += pieces[i].count;
    }
    /* buf: any non-NULL address (the pieces are the buffer) */
    int r = describe(pg, w, W_ALLREDUCE, NULL, count ? (void *)pieces : NULL, count, dt, op, 0);
    if (r < 0)
        return r;
    if (ddp_pg_is_cuda(pg))
        return DDP_ENOTSUP;
    if (count && !(w->pieces = malloc(n * sizeof(*pieces))))
        return DDP_ENOMEM;
    if (w->pieces)
        memcpy(w->pieces, pieces, n * sizeof(*pieces));
    w->npieces = n;
    w->bucket = bucket < 0 ? -1 : bucket;
    return 0;
}

int ddp_pg_allreduce_pieces_start(struct ddp_pg *pg, const struct ddp_piece *pieces, size_t n,
                                  enum ddp_dtype dt, enum ddp_redop op, int bucket,
                                  struct ddp_work **work)
{
    struct ddp_work w;
    int r = describe_pieces(pg, &w, pieces, n, dt, op, bucket);
    if (r == 0 && (r = start(pg, &w, work)) < 0)
        free(w.pieces);
    return r;
}

int ddp_pg_allreduce_pieces(struct ddp_pg *pg, const struct ddp_piece *pieces, size_t n,
                            enum ddp_dtype dt, enum ddp_redop op, int bucket)
{
    struct ddp_work w;
    int r = describe_pieces(pg, &w, pieces, n, dt, op, bucket);
    return r < 0 ? r : blocking(pg, &w);
}

void ddp_pg_dump_recorder(const struct ddp_pg *pg, FILE *f, unsigned n)
{
    if (pg && f)
        ddp__rec_dump(pg->rec, f, n);
}

int ddp_pg_allreduce(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                     enum ddp_redop op)
{
    COLLECTIVE(W_ALLREDUCE, NULL, buf, count, dt, op, 0);
    return blocking(pg, &w);
}

int ddp_pg_allreduce_bucket(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                            enum ddp_redop op, int bucket)
{
    COLLECTIVE(W_ALLREDUCE, NULL, buf, count, dt, op, 0);
    w.bucket = bucket < 0 ? -1 : bucket;
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

int ddp_pg_local_world_size(const struct ddp_pg *pg)
{
    return pg->local_world;
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
    const char *what = why ? why : "aborted by the program";
    char *root = record_abort(pg, what);
    pthread_mutex_lock(&pg->mu);
    if (root) /* another rank failed first: that is the cause to report */
        snprintf(pg->err, sizeof(pg->err), "%s; the group had already failed at %s", what, root);
    else
        snprintf(pg->err, sizeof(pg->err), "%s", what);
    pthread_mutex_unlock(&pg->mu);
    free(root);
    DDP_ERROR(PG, "rank %d: aborting the group: %s", pg->rank, why ? why : "by the program");
    abort_group(pg);
}

int ddp__pg_comm_start(struct ddp_pg *pg)
{
#ifdef DDP_HAVE_NCCL
    if (pg->nccl)
        return pthread_create(&pg->thread, NULL, comm_nccl_main, pg) != 0 ? DDP_ESYS : 0;
#endif
    return pthread_create(&pg->thread, NULL, comm_main, pg) != 0 ? DDP_ESYS : 0;
}

void ddp__pg_comm_stop(struct ddp_pg *pg)
{
    pthread_mutex_lock(&pg->mu);
    pg->stop = true;
    pthread_cond_signal(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    pthread_join(pg->thread, NULL);
}
