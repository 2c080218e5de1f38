/*
 * The NCCL backend of the process group (worker/pg_nccl.c, built when CUDA and NCCL are found):
 * a communicator per group, created non-blocking, and collectives enqueued on a dedicated
 * CUDA stream without waiting for them.
 *
 * One collective in flight is a struct ddp__nccl_op: at start, in the caller's thread, an
 * event is recorded on the caller's compute stream (`ready`); the communication thread makes
 * the communication stream wait for it, enqueues the collective and records `done` after it.
 * Nobody has to wait on the host: another stream can wait for `done` on the device. The
 * communication thread is also the watchdog: it polls ncclCommGetAsyncError and the oldest
 * collective's deadline, and on an asynchronous error, a timeout or an abort request aborts
 * the communicator (ncclCommAbort) with an error naming the collective, the rank and the cause.
 * Only the communication thread calls NCCL on the communicator (it is not thread-safe);
 * ddp__nccl_request_abort() and the ddp__nccl_op_* calls are safe from any thread.
 */
#ifndef DDP_WORKER_PG_NCCL_H
#define DDP_WORKER_PG_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/pg.h"

struct ddp__nccl;
struct ddp_store;

/* The size of an NCCL unique id (ncclUniqueId). */
#define DDP__NCCL_ID_BYTES 128

/*
 * The unique-id exchange through the store (worker/pg_nccl_id.c, built with or without NCCL):
 * rank 0 calls ncclGetUniqueId and sets the id's bytes under key; the other ranks wait up to
 * timeout_ms for the key and read them. The id (DDP__NCCL_ID_BYTES) goes to *id. 0, a store
 * error, DDP_EPROTO for a value of another size, DDP_ENOTSUP without NCCL.
 */
int ddp__pg_nccl_id(struct ddp_store *s, const char *key, int rank, int timeout_ms, void *id);

enum ddp__nccl_kind {
    DDP__NCCL_ALLREDUCE,
    DDP__NCCL_BROADCAST,
    DDP__NCCL_ALLGATHER,
    DDP__NCCL_REDUCE_SCATTER,
    DDP__NCCL_BARRIER
};

struct ddp__nccl_op {
    void *ready; /* cudaEvent_t on the caller's stream at start */
    void *done;  /* cudaEvent_t on the communication stream after the collective */
    int device;
};

/*
 * Rank 0 creates the NCCL unique id (it hosts NCCL's bootstrap listener from then on) and
 * shares it through the store under key; every rank selects CUDA device `device` and joins
 * the communicator, waiting at most timeout_ms for all ranks. On failure err says why.
 * DDP_ENOTSUP without a visible device.
 */
int ddp__nccl_init(struct ddp_store *store, const char *key, int rank, int world, int device,
                   int timeout_ms, struct ddp__nccl **out, char *err, size_t errlen);

/* Makes the communicator's device the calling thread's current one (the communication
 * thread calls it first). */
void ddp__nccl_bind_thread(struct ddp__nccl *n);

/* Caller's thread: takes two events (pooled) and records op->ready on `stream` (a
 * cudaStream_t; NULL is the legacy default stream). 0 or DDP_ESYS with err set. */
int ddp__nccl_op_begin(struct ddp__nccl *n, struct ddp__nccl_op *op, void *stream, char *err,
                       size_t errlen);
/* Gives the op's events back to the pool. */
void ddp__nccl_op_end(struct ddp__nccl_op *op);
/* 1 once the collective has completed on the device, 0 while it runs, <0 on a CUDA error. */
int ddp__nccl_op_query(const struct ddp__nccl_op *op);
/* Makes `stream` wait on the device for the collective; the host does not wait. */
int ddp__nccl_op_stream_wait(const struct ddp__nccl_op *op, void *stream);

/* Communication thread: the stream waits for op->ready, the collective is enqueued and
 * op->done recorded after it. Returns once the enqueue has settled (not the collective);
 * on failure the communicator is aborted and err names the collective and the rank. */
int ddp__nccl_enqueue(struct ddp__nccl *n, const struct ddp__nccl_op *op, enum ddp__nccl_kind kind,
                      const void *send, void *buf, size_t count, enum ddp_dtype dt,
                      enum ddp_redop redop, int root, int64_t deadline_ms, char *err,
                      size_t errlen);

/* Communication thread, the watchdog's check while `what` is the oldest collective in flight:
 * 0, or (communicator aborted, err set) DDP_ECLOSED on an asynchronous NCCL error,
 * DDP_ETIMEDOUT past deadline_ms, DDP_EABORTED on an abort request. */
int ddp__nccl_check(struct ddp__nccl *n, const char *what, int64_t deadline_ms, char *err,
                    size_t errlen);

/* Tests and tools: called on the communication thread for each collective, with phase 0 after
 * the stream waits for the caller's event and before the collective, and phase 1 after it,
 * so that events recorded on `stream` time the collective on the device. */
typedef void ddp__nccl_trace_fn(void *arg, const char *what, size_t count, int phase, void *stream);
void ddp__nccl_set_trace(struct ddp__nccl *n, ddp__nccl_trace_fn *fn, void *arg);
/* The same for a group (no-op on a CPU group). */
void ddp__pg_set_trace(struct ddp_pg *pg, ddp__nccl_trace_fn *fn, void *arg);

/* Asks the watchdog to abort the communicator (thread-safe). */
void ddp__nccl_request_abort(struct ddp__nccl *n);

/* The communication stream (a cudaStream_t). */
void *ddp__nccl_stream(struct ddp__nccl *n);

/* Destroys the communicator (aborts it if it failed) and frees everything. NULL is a no-op. */
void ddp__nccl_free(struct ddp__nccl *n);

#endif
