/* The NCCL backend of the process group (see pg_nccl.h). */
#include "worker/pg_nccl.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/banned.h"

struct ddp__nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    void *scratch; /* one float of device memory: the barrier's all-reduce */
    ddp__nccl_trace_fn *trace;
    void *trace_arg;
    int rank, device;
    bool aborted;
    atomic_bool abort_requested;
};

static const char *kind_name(enum ddp__nccl_kind k)
{
    static const char *const names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                        "barrier"};
    return (unsigned)k < sizeof(names) / sizeof(names[0]) ? names[k] : "collective";
}

static int nccl_dtype(enum ddp_dtype dt, ncclDataType_t *out)
{
    switch (dt) {
    case DDP_F32:
        *out = ncclFloat32;
        return 0;
    case DDP_F64:
        *out = ncclFloat64;
        return 0;
    case DDP_BF16:
        *out = ncclBfloat16;
        return 0;
    case DDP_F16:
        *out = ncclFloat16;
        return 0;
    case DDP_I32:
        *out = ncclInt32;
        return 0;
    case DDP_I64:
        *out = ncclInt64;
        return 0;
    }
    return DDP_EINVAL;
}

static int nccl_op(enum ddp_redop op, ncclRedOp_t *out)
{
    switch (op) {
    case DDP_SUM:
        *out = ncclSum;
        return 0;
    case DDP_AVG:
        *out = ncclAvg;
        return 0;
    case DDP_MAX:
        *out = ncclMax;
        return 0;
    case DDP_MIN:
        *out = ncclMin;
        return 0;
    }
    return DDP_EINVAL;
}

static void abort_comm(struct ddp__nccl *n)
{
    if (!n->aborted && n->comm) {
        ncclCommAbort(n->comm);
        n->comm = NULL;
    }
    n->aborted = true;
}

/*
 * Events are pooled (per device: an event belongs to the device current when it was made), so
 * starting a collective costs two cudaEventRecord calls and no creation. The pool is the
 * process's, so a work handle may outlive its group.
 */
#define POOL_MAX 1024
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    cudaEvent_t ev;
    int dev;
} pool[POOL_MAX];
static int npool;

static cudaError_t event_get(int dev, cudaEvent_t *ev)
{
    pthread_mutex_lock(&pool_mu);
    for (int i = npool; i-- > 0;)
        if (pool[i].dev == dev) {
            *ev = pool[i].ev;
            pool[i] = pool[--npool];
            pthread_mutex_unlock(&pool_mu);
            return cudaSuccess;
        }
    pthread_mutex_unlock(&pool_mu);
    return cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
}

static void event_put(int dev, cudaEvent_t ev)
{
    if (!ev)
        return;
    pthread_mutex_lock(&pool_mu);
    if (npool < POOL_MAX) {
        pool[npool].ev = ev;
        pool[npool++].dev = dev;
        ev = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    if (ev)
        cudaEventDestroy(ev);
}

int ddp__nccl_op_begin(struct ddp__nccl *n, struct ddp__nccl_op *op, void *stream, char *err,
                       size_t errlen)
{
    cudaEvent_t ready = NULL, done = NULL;
    cudaError_t ce;
    *op = (struct ddp__nccl_op){.device = n->device};
    /* The caller's thread may have another device current; events and records are n's. */
    int cur = -1;
    cudaGetDevice(&cur);
    if (cur != n->device)
        cudaSetDevice(n->device);
    if ((ce = event_get(n->device, &ready)) != cudaSuccess ||
        (ce = event_get(n->device, &done)) != cudaSuccess ||
        (ce = cudaEventRecord(ready, (cudaStream_t)stream)) != cudaSuccess) {
        snprintf(err, errlen, "rank %d: cannot order the collective after the compute stream: %s",
                 n->rank, cudaGetErrorString(ce));
        event_put(n->device, ready);
        event_put(n->device, done);
        if (cur >= 0 && cur != n->device)
            cudaSetDevice(cur);
        return DDP_ESYS;
    }
    if (cur >= 0 && cur != n->device)
        cudaSetDevice(cur);
    op->ready = ready;
    op->done = done;
    return 0;
}

void ddp__nccl_op_end(struct ddp__nccl_op *op)
{
    event_put(op->device, op->ready);
    event_put(op->device, op->done);
    op->ready = op->done = NULL;
}

int ddp__nccl_op_query(const struct ddp__nccl_op *op)
{
    cudaError_t ce = cudaEventQuery((cudaEvent_t)op->done);
    return ce == cudaSuccess ? 1 : ce == cudaErrorNotReady ? 0 : DDP_ESYS;
}

int ddp__nccl_op_stream_wait(const struct ddp__nccl_op *op, void *stream)
{
    return cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)op->done, 0) == cudaSuccess
               ? 0
               : DDP_ESYS;
}

/* The watchdog's check; *state (optional) says whether a call is still in progress. */
static int check(struct ddp__nccl *n, const char *what, int64_t deadline_ms, char *err,
                 size_t errlen, ncclResult_t *state)
{
    if (n->aborted || !n->comm) {
        snprintf(err, errlen, "%s on rank %d: the NCCL communicator was aborted", what, n->rank);
        return DDP_EABORTED;
    }
    ncclResult_t st = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(n->comm, &st);
    if (state)
        *state = st;
    if (r != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
        snprintf(err, errlen, "%s failed on rank %d: %s (%s); communicator aborted", what, n->rank,
                 ncclGetErrorString(r != ncclSuccess ? r : st), ncclGetLastError(n->comm));
        abort_comm(n);
        return DDP_ECLOSED;
    }
    bool asked = atomic_load(&n->abort_requested);
    if (asked || ddp_now_ms() > deadline_ms) {
        snprintf(err, errlen, "%s on rank %d %s; communicator aborted", what, n->rank,
                 asked ? "was aborted"
                       : "did not complete in time (a rank never joined, died or stopped)");
        abort_comm(n);
        return asked ? DDP_EABORTED : DDP_ETIMEDOUT;
    }
    return 0;
}

int ddp__nccl_check(struct ddp__nccl *n, const char *what, int64_t deadline_ms, char *err,
                    size_t errlen)
{
    return check(n, what, deadline_ms, err, errlen, NULL);
}

/* Waits (polling, against the deadline) until the communicator has no call in progress. */
static int settle(struct ddp__nccl *n, const char *what, int64_t deadline, char *err, size_t errlen)
{
    for (unsigned spins = 0;; spins++) {
        ncclResult_t st = ncclInProgress;
        int r = check(n, what, deadline, err, errlen, &st);
        if (r < 0)
            return r;
        if (st == ncclSuccess)
            return 0;
        if (spins > 64)
            usleep(spins > 1000 ? 200 : 10);
    }
}

int ddp__nccl_init(struct ddp_store *store, const char *key, int rank, int world, int device,
                   int timeout_ms, struct ddp__nccl **out, char *err, size_t errlen)
{
    int64_t deadline = ddp_now_ms() + timeout_ms;
    uint8_t idbuf[DDP__NCCL_ID_BYTES];
    ncclUniqueId id;
    _Static_assert(sizeof(id) == DDP__NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");
    int ndev = 0;
    /* Rank 0's process creates the id and hosts NCCL's bootstrap root from now on; the
     * launcher never does (it would have to outlive every rank's init). */
    int r = ddp__pg_nccl_id(store, key, rank, timeout_ms, idbuf);
    if (r < 0) {
        snprintf(err, errlen, "cannot share the NCCL unique id through the store: %s",
                 ddp_strerror(r));
        return r;
    }
    memcpy(&id, idbuf, sizeof(id));
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        snprintf(err, errlen, "backend nccl: no CUDA device is visible to rank %d (%s)", rank,
                 ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        return DDP_ENOTSUP;
    }
    if (device < 0 || device >= ndev) {
        snprintf(err, errlen,
                 "backend nccl: rank %d wants CUDA device %d (its LOCAL_RANK) but %d are visible; "
                 "run at most one rank per GPU",
                 rank, device, ndev);
        return DDP_EINVAL;
    }
    struct ddp__nccl *n = calloc(1, sizeof(*n));
    if (!n)
        return DDP_ENOMEM;
    n->rank = rank;
    n->device = device;
    if ((ce = cudaSetDevice(device)) != cudaSuccess ||
        (ce = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaMalloc(&n->scratch, sizeof(float))) != cudaSuccess ||
        (ce = cudaMemset(n->scratch, 0, sizeof(float))) != cudaSuccess) {
        snprintf(err, errlen, "backend nccl: rank %d cannot set up CUDA device %d: %s", rank,
                 device, cudaGetErrorString(ce));
        ddp__nccl_free(n);
        return DDP_ESYS;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* every call returns at once; settle() waits with a deadline */
    ncclResult_t nr = ncclCommInitRankConfig(&n->comm, world, id, rank, &cfg);
    if (nr != ncclSuccess && nr != ncclInProgress) {
        snprintf(err, errlen, "ncclCommInitRankConfig failed on rank %d: %s", rank,
                 ncclGetErrorString(nr));
        n->comm = NULL;
        ddp__nccl_free(n);
        return DDP_ESYS;
    }
    if ((r = settle(n, "ncclCommInitRank", deadline, err, errlen)) < 0) {
        ddp__nccl_free(n);
        return r;
    }
    DDP_INFO(PG, "rank %d of %d: NCCL %d.%d communicator on CUDA device %d", rank, world,
             NCCL_MAJOR, NCCL_MINOR, device);
    *out = n;
    return 0;
}

int ddp__nccl_enqueue(struct ddp__nccl *n, const struct ddp__nccl_op *op, enum ddp__nccl_kind kind,
                      const void *send, void *buf, size_t count, enum ddp_dtype dt,
                      enum ddp_redop redop, int root, int64_t deadline_ms, char *err, size_t errlen)
{
    ncclDataType_t ndt;
    ncclRedOp_t nop;
    const char *what = kind_name(kind);
    int r = check(n, what, deadline_ms, err, errlen, NULL);
    if (r < 0)
        return r;
    if (nccl_dtype(dt, &ndt) < 0 || nccl_op(redop, &nop) < 0)
        return DDP_EINVAL;
    if (redop == DDP_AVG && (dt == DDP_I32 || dt == DDP_I64)) {
        snprintf(err, errlen, "%s: NCCL averages floating-point types only", what);
        return DDP_EINVAL;
    }
    cudaError_t ce = cudaStreamWaitEvent(n->stream, (cudaEvent_t)op->ready, 0);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "%s on rank %d: CUDA error %s", what, n->rank,
                 cudaGetErrorString(ce));
        abort_comm(n);
        return DDP_ESYS;
    }
    if (n->trace)
        n->trace(n->trace_arg, what, count, 0, n->stream);
    ncclResult_t nr;
    switch (kind) {
    case DDP__NCCL_ALLREDUCE:
        nr = ncclAllReduce(buf, buf, count, ndt, nop, n->comm, n->stream);
        break;
    case DDP__NCCL_BROADCAST:
        nr = ncclBroadcast(buf, buf, count, ndt, root, n->comm, n->stream);
        break;
    case DDP__NCCL_ALLGATHER:
        nr = ncclAllGather(send, buf, count, ndt, n->comm, n->stream);
        break;
    case DDP__NCCL_REDUCE_SCATTER:
        nr = ncclReduceScatter(send, buf, count, ndt, nop, n->comm, n->stream);
        break;
    case DDP__NCCL_BARRIER:
        nr = ncclAllReduce(n->scratch, n->scratch, 1, ncclFloat32, ncclSum, n->comm, n->stream);
        break;
    default:
        return DDP_EINVAL;
    }
    if (nr != ncclSuccess && nr != ncclInProgress) {
        snprintf(err, errlen, "%s failed on rank %d: %s (%s)", what, n->rank,
                 ncclGetErrorString(nr), ncclGetLastError(n->comm));
        abort_comm(n);
        return DDP_ESYS;
    }
    /* A non-blocking communicator may still be setting up connections for this call. */
    if (nr == ncclInProgress && (r = settle(n, what, deadline_ms, err, errlen)) < 0)
        return r;
    if (n->trace)
        n->trace(n->trace_arg, what, count, 1, n->stream);
    if ((ce = cudaEventRecord((cudaEvent_t)op->done, n->stream)) != cudaSuccess) {
        snprintf(err, errlen, "%s on rank %d: CUDA error %s", what, n->rank,
                 cudaGetErrorString(ce));
        abort_comm(n);
        return DDP_ESYS;
    }
    return 0;
}

void ddp__nccl_bind_thread(struct ddp__nccl *n)
{
    cudaSetDevice(n->device);
}

void ddp__nccl_set_trace(struct ddp__nccl *n, ddp__nccl_trace_fn *fn, void *arg)
{
    n->trace = fn;
    n->trace_arg = arg;
}

void ddp__nccl_request_abort(struct ddp__nccl *n)
{
    if (n)
        atomic_store(&n->abort_requested, true);
}

void *ddp__nccl_stream(struct ddp__nccl *n)
{
    return n ? (void *)n->stream : NULL;
}

void ddp__nccl_free(struct ddp__nccl *n)
{
    if (!n)
        return;
    if (n->comm) {
        if (n->aborted || atomic_load(&n->abort_requested))
            ncclCommAbort(n->comm);
        else
            ncclCommDestroy(n->comm);
    }
    if (n->scratch)
        cudaFree(n->scratch);
    if (n->stream)
        cudaStreamDestroy(n->stream);
    free(n);
}
