/*
 * The bucketed, overlapping gradient reducer of the PyTorch DDP paper
 * (arXiv 2006.15704), over a ddp_pg process group.
 *
 * A training program registers its parameters in forward order. The
 * reducer groups them into buckets in reverse order (the order backward
 * produces gradients), each bucket one dtype and at most a size cap, the
 * first one smaller so that communication starts early. During backward the
 * program calls ddp_reducer_mark_ready() as each gradient is complete; when a
 * bucket's last gradient is ready its all-reduce starts on the group's
 * communication thread while backward goes on. Buckets start strictly in
 * bucket order, so every rank issues the same sequence of collectives.
 * ddp_reducer_finalize() waits for the rest and leaves the gradients averaged
 * over the ranks, in place.
 *
 * Per iteration:
 *
 *     zero the gradients (the program accumulates into them, as PyTorch does)
 *     forward; backward, calling ddp_reducer_mark_ready(r, i) per parameter
 *     ddp_reducer_finalize(r)
 *     optimizer step
 *
 * ddp_reducer_set_sync(r, false) is PyTorch's no_sync(): iterations only
 * accumulate locally; the next synchronised one reduces the sum.
 *
 * After the first synchronised iteration the buckets are rebuilt in the
 * order gradients actually became ready on rank 0 (broadcast, so every rank
 * agrees). The reducer is used from one thread (the training loop's).
 */
#ifndef DDP_REDUCER_REDUCER_H
#define DDP_REDUCER_REDUCER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/pg.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_PARAM_MAX_DIMS 8

struct ddp_param {
    const char *name; /* for error messages */
    void *data;       /* values: overwritten with rank 0's at creation */
    /*
     * Where the program keeps its gradient pointer. Without gradient-as-bucket-view a CPU
     * group averages *grad in place (the bucket all-reduced in pieces, nothing copied; do not
     * write it between mark_ready and finalize); a GPU group, or a compressing hook, copies it
     * into the bucket at mark_ready and the average back at finalize. With it, the reducer
     * points *grad into bucket
     * memory (copying the values it held, or zeros when NULL) and owns that memory; the
     * pointer may change when buckets are rebuilt, so read it through *grad after finalize;
     * ddp_reducer_free() sets it to NULL.
     */
    void **grad;
    size_t count;         /* elements */
    enum ddp_dtype dtype; /* a floating type: F32, F64, BF16, F16 */
    int ndim;             /* 0..DDP_PARAM_MAX_DIMS; shape is checked across ranks */
    int64_t shape[DDP_PARAM_MAX_DIMS];
};

enum ddp_comm_hook {
    DDP_HOOK_ALLREDUCE = 0, /* average each bucket in its own dtype */
    DDP_HOOK_FP16 = 1,      /* float32 buckets travel as float16 (divided by world first) */
    DDP_HOOK_BF16 = 2,      /* float32 buckets travel as bfloat16 */
};

struct ddp_reducer_opts {
    size_t bucket_cap_bytes;   /* 0: DDP_BUCKET_CAP_MB or 25 MiB; 1 = one parameter each */
    size_t first_bucket_bytes; /* 0: DDP_FIRST_BUCKET_CAP_MB or 1 MiB */
    bool gradient_as_bucket_view;
    /* Parameters whose gradient is not ready at finalize count as unused: their slots are
     * zeros, the reduction completes, and ranks agree which were unused everywhere. Without
     * it, such parameters are an error that names them. */
    bool find_unused_parameters;
    bool no_rebuild;   /* keep the registration-order buckets */
    /* Start no all-reduce before finalize. Without it the reducer overlaps, except on a CPU
     * group on one node with fewer than 2 usable cores per rank (DDP_REDUCER_OVERLAP=auto;
     * on or off decide instead): see ddp_reducer(3). */
    bool no_overlap;
    bool no_broadcast; /* do not overwrite the parameters with rank 0's at creation */
    enum ddp_comm_hook hook;
};

struct ddp_reducer;

/*
 * Checks that every rank registers the same number of parameters with the same dtypes and
 * shapes (a mismatch is one error naming the rank and the parameter, on every rank), then
 * broadcasts the parameters from rank 0 and builds the buckets. params is copied.
 * opts may be NULL. Returns 0 or a DDP_E* code; ddp_reducer_new_error() has the message.
 */
int ddp_reducer_new(struct ddp_pg *pg, const struct ddp_param *params, size_t n,
                    const struct ddp_reducer_opts *opts, struct ddp_reducer **out);
/* The message of the last failed ddp_reducer_new() in this thread. */
const char *ddp_reducer_new_error(void);

/* Before ddp_pg_free() of its group (the buckets may be the group's registered memory). */
void ddp_reducer_free(struct ddp_reducer *r);

/* Parameter i's gradient is complete for this iteration (call in the order backward produces
 * them). May start all-reduces. Marking one twice in an iteration is DDP_EINVAL. */
int ddp_reducer_mark_ready(struct ddp_reducer *r, size_t i);

/* Waits for every bucket and leaves the averaged gradients in place. On error the group is
 * aborted and ddp_reducer_last_error() says why (naming parameters or the failed peer). */
int ddp_reducer_finalize(struct ddp_reducer *r);

/* false: following iterations accumulate locally without communicating (no_sync). */
void ddp_reducer_set_sync(struct ddp_reducer *r, bool sync);

/* After a finalize with find_unused_parameters: whether any rank used parameter i. */
bool ddp_reducer_param_used(const struct ddp_reducer *r, size_t i);

size_t ddp_reducer_num_buckets(const struct ddp_reducer *r);
/* The parameters of bucket b, in their order inside it; returns how many (at most max
 * written to idx). */
size_t ddp_reducer_bucket_params(const struct ddp_reducer *r, size_t b, size_t *idx, size_t max);

struct ddp_reducer_stats {
    uint64_t iterations;           /* synchronised ones */
    uint64_t buckets_launched;     /* all-reduces started */
    uint64_t launched_in_backward; /* of which before finalize was called */
    uint64_t launch_host_ns;       /* host time spent starting them (those queued) */
    uint64_t finalize_wait_ns;     /* time finalize waited for (or ran) the all-reduces */
    uint64_t rebuilds;
    uint64_t buckets_posted; /* buckets posted in backward: a streamed all-reduce's (every one
                              * of it: ddp_pg_allreduce_pieces_post), or the first bucket */
    bool overlap; /* buckets start during backward (no_overlap and DDP_REDUCER_OVERLAP) */
};
void ddp_reducer_get_stats(const struct ddp_reducer *r, struct ddp_reducer_stats *st);

const char *ddp_reducer_last_error(const struct ddp_reducer *r);

#ifdef __cplusplus
}
#endif

#endif
