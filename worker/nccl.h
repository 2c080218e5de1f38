/*
 * The NCCL backend of the process group (worker/nccl.c, built when CUDA and NCCL are found):
 * a communicator per group, created non-blocking, and collectives enqueued on a dedicated
 * CUDA stream. The group's communication thread waits for each one by polling its completion
 * event and ncclCommGetAsyncError against the group's deadline: on an asynchronous error or a
 * timeout the communicator is aborted (ncclCommAbort) and the error names the collective, the
 * rank and the cause, instead of hanging.
 */
#ifndef DDP_WORKER_NCCL_H
#define DDP_WORKER_NCCL_H

#include <stdbool.h>
#include <stddef.h>

#include "worker/pg.h"

struct ddp__nccl;
struct ddp_store;

enum ddp__nccl_kind {
    DDP__NCCL_ALLREDUCE,
    DDP__NCCL_BROADCAST,
    DDP__NCCL_ALLGATHER,
    DDP__NCCL_REDUCE_SCATTER,
    DDP__NCCL_BARRIER
};

/*
 * Rank 0 creates the NCCL unique id (it hosts NCCL's bootstrap listener from then on) and
 * shares it through the store under key; every rank selects CUDA device `device` and joins
 * the communicator, waiting at most timeout_ms for all ranks. On failure err says why.
 * DDP_ENOTSUP without CUDA/NCCL in this build or without a visible device.
 */
int ddp__nccl_init(struct ddp_store *store, const char *key, int rank, int world, int device,
                   int timeout_ms, struct ddp__nccl **out, char *err, size_t errlen);

/* Enqueues one collective on the communication stream and waits for it (see above).
 * Buffers are device memory. 0, or a DDP_E* code with err set. */
int ddp__nccl_run(struct ddp__nccl *n, enum ddp__nccl_kind kind, const void *send, void *buf,
                  size_t count, enum ddp_dtype dt, enum ddp_redop op, int root, int timeout_ms,
                  char *err, size_t errlen);

/* Asks a running or later ddp__nccl_run to abort the communicator (thread-safe). */
void ddp__nccl_request_abort(struct ddp__nccl *n);

/* The communication stream (a cudaStream_t). */
void *ddp__nccl_stream(struct ddp__nccl *n);

/* Destroys the communicator (aborts it if it failed) and frees everything. NULL is a no-op. */
void ddp__nccl_free(struct ddp__nccl *n);

#endif
