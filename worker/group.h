/*
 * The process group's state, private to worker/ and shared by pg.c (the collectives and the
 * communication thread) and pg_setup.c (forming and freeing a group), which calls pg.c only to
 * start and stop the communication thread.
 */
#ifndef DDP_WORKER_GROUP_H
#define DDP_WORKER_GROUP_H

#include "worker/coll.h"
#include "worker/pg.h"
#include "worker/recorder.h"
#ifdef DDP_HAVE_NCCL
#include "worker/pg_nccl.h"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* In the flight recorder's order (enum ddp_progress_op). */
enum work_kind { W_ALLREDUCE, W_BROADCAST, W_ALLGATHER, W_REDUCE_SCATTER, W_BARRIER };

struct ddp_work {
    enum work_kind kind;
    void *buf;
    const void *send;
    size_t count;
    enum ddp_dtype dt;
    enum ddp_redop op;
    int root;
    int bucket;   /* the reducer's bucket index, or -1 (flight recorder) */
    struct ddp_piece *pieces; /* an all-reduce of a buffer in pieces (owned), else NULL */
    size_t npieces;
    uint64_t seq; /* the flight recorder's sequence number, 0 before it is entered */
    int result;
    bool done;
    bool spin; /* ddp_work_wait polls `done` for DDP__SPIN_NS before sleeping (point-to-point) */
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
    char name[128];            /* as given (opts->name, or "default"): sub-groups extend it */
    struct ddp__nccl *nccl;    /* the NCCL backend, or NULL */
    void *compute_stream;      /* what NCCL collectives wait for (ddp_pg_set_compute_stream) */
    struct ddp__recorder *rec; /* the flight recorder, or NULL */
    int *p2p_fd;               /* per peer: the point-to-point connection (opts.p2p), or NULL */
    struct ddp__p2p *p2p;      /* their engine (worker/p2p.c), started by the first send/recv */
    struct ddp__p2p_shm *p2p_shm; /* rings to and from the node's ranks (worker/p2p_shm.c) */
};

/* The end of an operation a caller ran itself (pg->busy held, pg->mu taken): busy cleared,
 * the communication thread woken only with work queued behind it or while stopping (waking it
 * for nothing took a core from the next collective, the peer's or ours: one wake-up and a
 * contended mutex per call). Releases pg->mu. */
static inline void ddp__pg_unbusy(struct ddp_pg *pg)
{
    pg->busy = false;
    if (pg->head || pg->stop)
        pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
}

/* Stops the point-to-point engine (what is pending fails with DDP_EABORTED) and frees it;
 * leaves the connections to the group. Called when the group is freed. */
void ddp__p2p_free(struct ddp_pg *pg);

/* After the node's segment is attached on every rank: the arenas and cross-memory attach of
 * the single-copy all-reduce (worker/pg_direct.c). Every rank of the group calls it. */
int ddp__pg_setup_direct(struct ddp_pg *pg, struct ddp_store *store, const char *name);

/* Starts the group's communication thread (the NCCL watchdog on an NCCL group). */
int ddp__pg_comm_start(struct ddp_pg *pg);
/* Stops it once what is queued has run, and joins it. */
void ddp__pg_comm_stop(struct ddp_pg *pg);

#endif
