/*
 * The bucketed gradient reducer (see reducer.h): bucket assignment in reverse
 * order with size caps, launch-in-order as buckets fill during backward,
 * finalize, no_sync, unused-parameter detection agreed by an all-reduce,
 * bucket rebuilding from rank 0's observed order, the creation-time shape
 * check and parameter broadcast, and the fp16/bf16 compression hooks.
 */
#include "reducer/reducer.h"
#include "reducer/check.h"
#include "reducer/overlap.h"
#include "reducer/staged.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "worker/coll.h"
#include "worker/devmem.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define DEFAULT_CAP (25u << 20)
#define DEFAULT_FIRST_CAP (1u << 20)

struct rparam {
    struct ddp_param p;
    char *name;
    size_t bucket, off; /* bucket index, element offset in it */
    bool ready;         /* this iteration */
    void *piece;        /* where its gradient is all-reduced from (buckets in pieces) */
    bool used_global;   /* after the last finalize */
};

struct bucket {
    enum ddp_dtype dt;
    size_t count;   /* elements */
    size_t *params; /* into ddp_reducer.bparams */
    size_t nparams, pending;
    void *buf;
    uint16_t *comp; /* the compressed copy, for the fp16/bf16 hooks */
    struct ddp_piece *pcs; /* its parameters' gradients, for an all-reduce in pieces */
    struct ddp_work *work;
};

struct ddp_reducer {
    struct ddp_pg *pg;
    int rank, world;
    struct ddp_reducer_opts o;
    struct rparam *ps;
    size_t np;
    struct bucket *bk;
    size_t nb, next_launch;
    size_t *bparams; /* every bucket's parameter list, back to back */
    size_t *order;   /* the order parameters became ready in this iteration */
    size_t norder;
    int32_t *used;
    bool sync, rebuilt, in_finalize;
    bool posted; /* this iteration's first bucket posted (post_ready) */
    /* Without overlap on a CPU group, buckets [0, nstream) (bucket 0's dtype, not hooked; 0:
     * fewer than 2) go as one all-reduce of pieces (spcs: the buckets with bucket view, else
     * the sparams gradients: stream_len), posted when backward fills its first gradient and told as
     * each next one fills, in bucket order (stream_ready): the first sdone of its sparams
     * parameters (bparams' first), selems elements. */
    struct ddp_piece *spcs;
    size_t nstream, sparams, sdone, selems;
    bool streamed; /* posted this iteration */
    bool overlap; /* buckets start during backward (reducer/overlap.c) */
    bool cuda;    /* an NCCL group: buckets in device memory, copies on the compute stream */
    void *stream; /* the group's compute stream */
    struct ddp_reducer_stats st;
    char err[1024];
};

static _Thread_local char new_err[1024];

const char *ddp_reducer_new_error(void)
{
    return new_err;
}

const char *ddp_reducer_last_error(const struct ddp_reducer *r)
{
    return r->err;
}

static bool is_float(enum ddp_dtype dt)
{
    return dt == DDP_F32 || dt == DDP_F64 || dt == DDP_BF16 || dt == DDP_F16;
}

static size_t pbytes(const struct rparam *p)
{
    return p->p.count * ddp_dtype_size(p->p.dtype);
}

static void *slot_of(const struct ddp_reducer *r, const struct rparam *p)
{
    const struct bucket *b = &r->bk[p->bucket];
    return (char *)b->buf + p->off * ddp_dtype_size(b->dt);
}

static bool hooked(const struct ddp_reducer *r, const struct bucket *b)
{
    return r->o.hook != DDP_HOOK_ALLREDUCE && b->dt == DDP_F32;
}

/*
 * Without gradient-as-bucket-view, a host bucket is all-reduced in pieces: the gradients where
 * the program keeps them, read and averaged in place (ddp_pg_allreduce_pieces_start), with no
 * copy into the bucket and out again. The bucket's memory then only stands in for gradients
 * that are missing (NULL, or not ready: zeros). Device buckets and compressed ones copy.
 */
static bool in_pieces(const struct ddp_reducer *r, const struct bucket *b)
{
    return !r->cuda && !r->o.gradient_as_bucket_view && !hooked(r, b);
}

/*
 * Bucket memory and the copies in and out of it: on a CPU group, the group's registered
 * memory (ddp_pg_mem_alloc: with DDP_PG_DIRECT_BYTES the node's other ranks read a bucket in
 * place, so its all-reduce is single-copy; plain zeroed memory otherwise) and memcpy;
 * device memory and copies queued on the compute stream (after the kernels that produced the
 * gradients, never waited for by the host) on an NCCL group.
 */
static int bucket_alloc(const struct ddp_reducer *r, void **p, size_t bytes)
{
    if (r->cuda)
        return ddp__dev_alloc(p, bytes);
    return (*p = ddp_pg_mem_alloc(r->pg, bytes)) ? 0 : DDP_ENOMEM;
}

static int bucket_copy(const struct ddp_reducer *r, void *dst, const void *src, size_t bytes)
{
    if (r->cuda)
        return ddp__dev_copy_async(dst, src, bytes, r->stream);
    memcpy(dst, src, bytes);
    return 0;
}

static int zero(const struct ddp_reducer *r, void *dst, size_t bytes)
{
    if (r->cuda)
        return ddp__dev_zero_async(dst, bytes, r->stream);
    memset(dst, 0, bytes);
    return 0;
}

static void free_buckets(const struct ddp_reducer *r, struct bucket *bk, size_t nb)
{
    for (size_t i = 0; i < nb; i++) {
        ddp_work_free(bk[i].work);
        if (r->cuda)
            ddp__dev_free(bk[i].buf);
        else
            ddp_pg_mem_free(r->pg, bk[i].buf);
        free(bk[i].comp);
        free(bk[i].pcs);
    }
    free(bk);
}

/* The stream's pieces: its buckets with bucket view, else their gradients. */
static size_t stream_len(const struct ddp_reducer *r)
{
    return r->o.gradient_as_bucket_view ? r->nstream : r->sparams;
}

/* The stream's pieces before backward: with bucket view the buckets; else the gradients'
 * slots in their buckets, registered, until backward fills them (stream_ready). */
static void stream_reset(struct ddp_reducer *r)
{
    for (size_t k = 0; k < stream_len(r); k++) {
        if (r->o.gradient_as_bucket_view) {
            r->spcs[k] = (struct ddp_piece){.data = r->bk[k].buf, .count = r->bk[k].count};
        } else {
            const struct rparam *p = &r->ps[r->bparams[k]];
            r->spcs[k] = (struct ddp_piece){.data = slot_of(r, p), .count = p->p.count};
        }
    }
}

/* The buckets that stream (see struct ddp_reducer), if any: the same on every rank (the buckets
 * are, and the group's answer is). */
static int plan_stream(struct ddp_reducer *r)
{
    size_t n = 0, count = 0, np = 0;
    r->nstream = r->sparams = 0;
    if (r->cuda || r->nb < 2)
        return 0;
    for (; n < r->nb && r->bk[n].dt == r->bk[0].dt && !hooked(r, &r->bk[n]); n++) {
        count += r->bk[n].count;
        np += r->bk[n].nparams;
    }
    if (n < 2 || !ddp_pg_can_post_pieces(r->pg, count, r->bk[0].dt))
        return 0;
    size_t len = r->o.gradient_as_bucket_view ? n : np;
    struct ddp_piece *p = realloc(r->spcs, (len ? len : 1) * sizeof(*p));
    if (!p)
        return DDP_ENOMEM; /* not streaming here alone would not match the others' finalize */
    r->spcs = p;
    r->nstream = n;
    r->sparams = np;
    stream_reset(r);
    return 0;
}

/*
 * (Re)builds the buckets for parameters taken in `order` (the order their gradients are
 * expected): each dtype fills its own open bucket until it reaches the cap (the very first
 * bucket has the smaller first cap). With gradient-as-bucket-view, gradients move into the
 * new bucket memory, keeping their values.
 */
static int build_buckets(struct ddp_reducer *r, const size_t *order)
{
    size_t np = r->np, nb = 0;
    long open[DDP_I64 + 1];
    for (int d = 0; d <= DDP_I64; d++)
        open[d] = -1;
    size_t *bcount = calloc(np ? np : 1, sizeof(size_t)); /* elements per bucket */
    size_t *bn = calloc(np ? np : 1, sizeof(size_t));     /* parameters per bucket */
    enum ddp_dtype *bdt = calloc(np ? np : 1, sizeof(*bdt));
    size_t *bp = malloc((np ? np : 1) * sizeof(size_t));
    size_t *pb = malloc((np ? np : 1) * sizeof(size_t)),
           *poff = malloc((np ? np : 1) * sizeof(size_t));
    struct bucket *bk = NULL;
    int rc = DDP_ENOMEM;
    if (!bcount || !bn || !bdt || !bp || !pb || !poff)
        goto out;
    for (size_t k = 0; k < np; k++) {
        size_t i = order[k];
        enum ddp_dtype dt = r->ps[i].p.dtype;
        if (open[dt] < 0) {
            open[dt] = (long)nb;
            bdt[nb++] = dt;
        }
        size_t b = (size_t)open[dt];
        size_t cap = b == 0 ? r->o.first_bucket_bytes : r->o.bucket_cap_bytes;
        pb[i] = b;
        poff[i] = bcount[b];
        bcount[b] += r->ps[i].p.count;
        bn[b]++;
        if (bcount[b] * ddp_dtype_size(dt) >= cap)
            open[dt] = -1;
    }
    if (!(bk = calloc(nb ? nb : 1, sizeof(*bk))))
        goto out;
    size_t at = 0;
    for (size_t b = 0; b < nb; b++) {
        bk[b].dt = bdt[b];
        bk[b].count = bcount[b];
        bk[b].params = bp + at;
        at += bn[b];
        if ((rc = bucket_alloc(r, &bk[b].buf, bcount[b] * ddp_dtype_size(bdt[b]))) < 0)
            goto out;
        rc = DDP_ENOMEM;
        if (r->o.hook != DDP_HOOK_ALLREDUCE && bdt[b] == DDP_F32 &&
            !(bk[b].comp = malloc((bcount[b] ? bcount[b] : 1) * sizeof(uint16_t))))
            goto out;
        if (in_pieces(r, &bk[b]) && !(bk[b].pcs = malloc((bn[b] ? bn[b] : 1) * sizeof(*bk[b].pcs))))
            goto out;
    }
    for (size_t k = 0; k < np; k++) {
        size_t i = order[k], b = pb[i];
        bk[b].params[bk[b].nparams++] = i;
    }
    for (size_t b = 0; b < nb; b++)
        bk[b].pending = bk[b].nparams;
    /* Commit: move gradients into their new slots, then drop the old buckets. */
    for (size_t i = 0; i < np; i++) {
        struct rparam *p = &r->ps[i];
        p->bucket = pb[i];
        p->off = poff[i];
        if (r->o.gradient_as_bucket_view) {
            void *slot = (char *)bk[pb[i]].buf + poff[i] * ddp_dtype_size(p->p.dtype);
            if (*p->p.grad && (rc = bucket_copy(r, slot, *p->p.grad, pbytes(p))) < 0)
                goto out;
            *p->p.grad = slot;
        }
    }
    free_buckets(r, r->bk, r->nb);
    free(r->bparams);
    r->bk = bk;
    r->nb = nb;
    r->bparams = bp;
    r->next_launch = 0;
    bk = NULL;
    bp = NULL;
    rc = plan_stream(r);
out:
    if (bk)
        free_buckets(r, bk, nb);
    free(bcount);
    free(bn);
    free(bdt);
    free(bp);
    free(pb);
    free(poff);
    return rc;
}

static int fail(struct ddp_reducer *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct ddp_reducer *r, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof(r->err), fmt, ap);
    va_end(ap);
    DDP_ERROR(REDUCER, "rank %d: %s", r->rank, r->err);
    return code;
}

/*
 * Starts bucket bi's all-reduce on the communication thread, or in finalize on a CPU group
 * (nothing left to overlap it with) runs it in the caller, inline when the group is idle:
 * queued, it cost two thread hand-offs, and with a core per rank the woken thread took the
 * core of the rank that queued it (12 runs: finalize 1.06x a bare all-reduce, inline 1.02x).
 */
static int launch(struct ddp_reducer *r, size_t bi)
{
    struct bucket *b = &r->bk[bi];
    bool now = r->in_finalize && !ddp_pg_is_cuda(r->pg);
    int64_t t0 = ddp_now_ns();
    int rc;
    if (hooked(r, b)) {
        /* Divide first, so the half-precision sum cannot overflow where the average would not. */
        const float *f = b->buf;
        float inv = 1.0f / (float)r->world;
        enum ddp_dtype h = r->o.hook == DDP_HOOK_FP16 ? DDP_F16 : DDP_BF16;
        ddp__f32_to_half(b->comp, f, b->count, h, inv);
        rc = now ? ddp_pg_allreduce_bucket(r->pg, b->comp, b->count, h, DDP_SUM, (int)bi)
                 : ddp_pg_allreduce_start_bucket(r->pg, b->comp, b->count, h, DDP_SUM, (int)bi,
                                                 &b->work);
    } else if (in_pieces(r, b)) {
        for (size_t k = 0; k < b->nparams; k++) {
            const struct rparam *p = &r->ps[b->params[k]];
            b->pcs[k] = (struct ddp_piece){.data = p->piece, .count = p->p.count};
        }
        rc = now ? ddp_pg_allreduce_pieces(r->pg, b->pcs, b->nparams, b->dt, DDP_AVG, (int)bi)
                 : ddp_pg_allreduce_pieces_start(r->pg, b->pcs, b->nparams, b->dt, DDP_AVG, (int)bi,
                                                 &b->work);
    } else {
        rc = now ? ddp_pg_allreduce_bucket(r->pg, b->buf, b->count, b->dt, DDP_AVG, (int)bi)
                 : ddp_pg_allreduce_start_bucket(r->pg, b->buf, b->count, b->dt, DDP_AVG, (int)bi,
                                                 &b->work);
    }
    uint64_t took = (uint64_t)(ddp_now_ns() - t0);
    if (now)
        r->st.finalize_wait_ns += took; /* the all-reduce itself, waited for here */
    else
        r->st.launch_host_ns += took;
    r->st.buckets_launched++;
    if (!r->in_finalize)
        r->st.launched_in_backward++;
    if (rc < 0 && now)
        return fail(r, rc, "all-reduce of bucket %zu failed: %s", bi, ddp_pg_last_error(r->pg));
    if (rc < 0)
        return fail(r, rc, "cannot start the all-reduce of bucket %zu: %s", bi, ddp_strerror(rc));
    return 0;
}

/* Without bucket view, the stream's piece k once its gradient is final: where it lies if peers
 * read it there, else copied into its slot (the average copied back out in finalize, as for a
 * missing gradient). */
static void stream_piece(struct ddp_reducer *r, size_t k)
{
    struct rparam *p = &r->ps[r->bparams[k]];
    if (p->piece != slot_of(r, p) && !ddp_pg_mem_registered(r->pg, p->piece, pbytes(p))) {
        memcpy(slot_of(r, p), p->piece, pbytes(p));
        p->piece = slot_of(r, p);
    }
    r->spcs[k] = (struct ddp_piece){.data = p->piece, .count = p->p.count};
}

/* The stream's gradients filled so far, in bucket order (ddp_pg_allreduce_pieces_post, then
 * ddp_pg_post_ready): a rank in finalize sums each as soon as every rank has filled it, while
 * the others still compute (per gradient: one bucket may hold most of a model). Finalize calls
 * the stream's all-reduce on every rank, posted or not (a rank may have filled none of it). */
static int stream_ready(struct ddp_reducer *r)
{
    size_t k = r->sdone, el = r->selems;
    for (; k < r->sparams && r->ps[r->bparams[k]].ready; k++) {
        el += r->ps[r->bparams[k]].p.count;
        if (!r->o.gradient_as_bucket_view)
            stream_piece(r, k);
    }
    if (k == r->sdone)
        return 0;
    r->sdone = k;
    r->selems = el;
    int rc = r->streamed ? ddp_pg_post_ready(r->pg, el)
                         : ddp_pg_allreduce_pieces_post(r->pg, r->spcs, stream_len(r), r->bk[0].dt,
                                                        DDP_AVG, el);
    if (rc < 0)
        return fail(r, rc, "cannot post the all-reduce of buckets 0-%zu: %s", r->nstream - 1,
                    ddp_strerror(rc));
    r->streamed = r->streamed || rc == 0;
    return 0;
}

/* In finalize: the stream's all-reduce, called (it returns once every chunk is summed). */
static int run_stream(struct ddp_reducer *r)
{
    /* past a gradient backward did not fill (unused: in its slot, zeros), the rest */
    for (size_t k = r->sdone; k < r->sparams && !r->o.gradient_as_bucket_view; k++)
        stream_piece(r, k);
    int64_t t0 = ddp_now_ns();
    int rc = ddp_pg_allreduce_pieces(r->pg, r->spcs, stream_len(r), r->bk[0].dt, DDP_AVG, 0);
    r->st.finalize_wait_ns += (uint64_t)(ddp_now_ns() - t0);
    r->st.buckets_launched += r->nstream;
    r->st.buckets_posted += r->streamed ? r->nstream : 0;
    r->next_launch = r->nstream;
    if (rc < 0)
        return fail(r, rc, "all-reduce of buckets 0-%zu failed: %s", r->nstream - 1,
                    ddp_pg_last_error(r->pg));
    return 0;
}

/* Without overlap and no stream, the first bucket is posted once backward has filled it
 * (ddp_pg_allreduce_post): where it goes single-copy, a rank whose backward ended first sums
 * it for all while the late rank still computes. Only the first: a posted all-reduce is the
 * group's next one. */
static int post_ready(struct ddp_reducer *r)
{
    if (r->nstream)
        return stream_ready(r);
    struct bucket *b = r->nb ? &r->bk[0] : NULL;
    if (r->posted || !b || b->pending || r->cuda || hooked(r, b) || in_pieces(r, b))
        return 0;
    r->posted = true;
    int rc = ddp_pg_allreduce_post(r->pg, b->buf, b->count, b->dt, DDP_AVG);
    if (rc < 0)
        return fail(r, rc, "cannot post the all-reduce of bucket 0: %s", ddp_strerror(rc));
    r->st.buckets_posted += rc == 0;
    return 0;
}

/* Starts every bucket that is full, in bucket order: bucket k never before bucket k-1. */
static int launch_ready(struct ddp_reducer *r)
{
    while (r->next_launch < r->nb && r->bk[r->next_launch].pending == 0) {
        int rc = launch(r, r->next_launch);
        r->next_launch++;
        if (rc < 0)
            return rc;
    }
    return 0;
}

int ddp_reducer_new(struct ddp_pg *pg, const struct ddp_param *params, size_t n,
                    const struct ddp_reducer_opts *opts, struct ddp_reducer **out)
{
    struct ddp_reducer *r = NULL;
    int rc;
    new_err[0] = '\0';
    if (!pg || (n && !params) || !out) {
        snprintf(new_err, sizeof(new_err), "invalid arguments");
        return DDP_EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if (!params[i].grad || (params[i].count && !params[i].data) || params[i].ndim < 0 ||
            params[i].ndim > DDP_PARAM_MAX_DIMS) {
            snprintf(new_err, sizeof(new_err),
                     "parameter %zu ('%s'): data and grad are required and ndim must be 0..%d", i,
                     params[i].name ? params[i].name : "?", DDP_PARAM_MAX_DIMS);
            return DDP_EINVAL;
        }
    if ((rc = ddp__reducer_check_params(pg, params, n, new_err, sizeof(new_err))) < 0)
        goto fail;
    for (size_t i = 0; i < n; i++)
        if (!is_float(params[i].dtype)) {
            snprintf(new_err, sizeof(new_err),
                     "parameter %zu ('%s') is not floating point; gradients are averaged", i,
                     params[i].name ? params[i].name : "?");
            rc = DDP_EINVAL;
            goto fail;
        }
    if (ddp_pg_is_cuda(pg) && opts && opts->hook != DDP_HOOK_ALLREDUCE) {
        snprintf(new_err, sizeof(new_err),
                 "the fp16/bf16 compression hooks work on host buckets only, not on a CUDA "
                 "(NCCL) group");
        rc = DDP_ENOTSUP;
        goto fail;
    }
    rc = DDP_ENOMEM;
    if (!(r = calloc(1, sizeof(*r))))
        goto fail;
    r->pg = pg;
    r->rank = ddp_pg_rank(pg);
    r->world = ddp_pg_world_size(pg);
    r->sync = true;
    r->cuda = ddp_pg_is_cuda(pg);
    r->stream = ddp_pg_compute_stream(pg);
    if (opts)
        r->o = *opts;
    if (!r->o.bucket_cap_bytes)
        r->o.bucket_cap_bytes = ddp__reducer_env_mib("DDP_BUCKET_CAP_MB", DEFAULT_CAP);
    if (!r->o.first_bucket_bytes)
        r->o.first_bucket_bytes =
            ddp__reducer_env_mib("DDP_FIRST_BUCKET_CAP_MB", DEFAULT_FIRST_CAP);
    char why[300] = "no_overlap";
    r->overlap = !r->o.no_overlap && ddp__reducer_overlap(pg, why, sizeof(why));
    r->st.overlap = r->overlap;
    if (!r->overlap && !r->o.no_overlap && r->rank == 0)
        DDP_INFO(REDUCER, "rank 0: no overlap: %s", why);
    r->np = n;
    size_t *order = NULL;
    if (!(r->ps = calloc(n ? n : 1, sizeof(*r->ps))) ||
        !(r->order = malloc((n ? n : 1) * sizeof(size_t))) ||
        !(r->used = calloc(n ? n : 1, sizeof(int32_t))) ||
        !(order = malloc((n ? n : 1) * sizeof(size_t))))
        goto fail_r;
    for (size_t i = 0; i < n; i++) {
        r->ps[i].p = params[i];
        r->ps[i].used_global = true;
        if (!(r->ps[i].name = strdup(params[i].name ? params[i].name : "?")))
            goto fail_r;
        r->ps[i].p.name = r->ps[i].name;
    }
    /* Rank 0's values everywhere, so every replica starts identical. */
    if (!r->o.no_broadcast)
        for (size_t i = 0; i < n; i++)
            if ((rc = ddp_pg_broadcast(pg, params[i].data, params[i].count, params[i].dtype, 0)) <
                0) {
                snprintf(new_err, sizeof(new_err), "broadcasting the parameters failed: %s",
                         ddp_pg_last_error(pg));
                goto fail_r;
            }
    for (size_t i = 0; i < n; i++)
        order[i] = n - 1 - i; /* backward produces gradients in reverse */
    rc = build_buckets(r, order);
    free(order);
    order = NULL;
    if (rc < 0)
        goto fail_r;
    DDP_INFO(REDUCER, "rank %d: %zu parameters in %zu buckets (cap %zu bytes, first %zu)", r->rank,
             n, r->nb, r->o.bucket_cap_bytes, r->o.first_bucket_bytes);
    *out = r;
    return 0;
fail_r:
    free(order);
    ddp_reducer_free(r);
fail:
    if (!new_err[0])
        snprintf(new_err, sizeof(new_err), "%s", ddp_strerror(rc));
    DDP_ERROR(REDUCER, "cannot create the reducer: %s", new_err);
    return rc;
}

void ddp_reducer_free(struct ddp_reducer *r)
{
    if (!r)
        return;
    /* With gradient-as-bucket-view the program's gradient pointers point into the buckets. */
    if (r->o.gradient_as_bucket_view)
        for (size_t i = 0; i < r->np; i++)
            if (r->ps[i].p.grad)
                *r->ps[i].p.grad = NULL;
    free_buckets(r, r->bk, r->nb);
    for (size_t i = 0; i < r->np && r->ps; i++)
        free(r->ps[i].name);
    free(r->ps);
    free(r->bparams);
    free(r->spcs);
    free(r->order);
    free(r->used);
    free(r);
}

void ddp_reducer_set_sync(struct ddp_reducer *r, bool sync)
{
    r->sync = sync;
}

int ddp_reducer_mark_ready(struct ddp_reducer *r, size_t i)
{
    if (i >= r->np)
        return fail(r, DDP_EINVAL, "parameter index %zu is out of range (%zu parameters)", i,
                    r->np);
    struct rparam *p = &r->ps[i];
    if (p->ready)
        return fail(r, DDP_EINVAL, "parameter %zu ('%s') marked ready twice in one iteration", i,
                    p->name);
    p->ready = true;
    r->order[r->norder++] = i;
    r->used[i] = 1;
    if (!r->sync)
        return 0;
    if (in_pieces(r, &r->bk[p->bucket])) {
        p->piece = *p->p.grad ? *p->p.grad : slot_of(r, p);
        if (!*p->p.grad)
            memset(p->piece, 0, pbytes(p));
    } else if (!r->o.gradient_as_bucket_view) {
        int rc = *p->p.grad ? bucket_copy(r, slot_of(r, p), *p->p.grad, pbytes(p))
                            : zero(r, slot_of(r, p), pbytes(p));
        if (rc < 0)
            return fail(r, rc, "cannot copy the gradient of '%s' into its bucket: %s", p->name,
                        ddp__dev_error());
    }
    r->bk[p->bucket].pending--;
    return r->overlap ? launch_ready(r) : post_ready(r);
}

static void reset_iteration(struct ddp_reducer *r)
{
    for (size_t i = 0; i < r->np; i++) {
        r->ps[i].ready = false;
        r->used[i] = 0;
    }
    r->norder = 0;
    r->posted = r->streamed = false;
    r->sdone = r->selems = 0;
    stream_reset(r);
    for (size_t b = 0; b < r->nb; b++) {
        ddp_work_free(r->bk[b].work);
        r->bk[b].work = NULL;
        r->bk[b].pending = r->bk[b].nparams;
    }
    r->next_launch = 0;
}

/* Rank 0's ready order, with the parameters it never saw ready appended in reverse
 * registration order, becomes everyone's bucket order. */
static int rebuild(struct ddp_reducer *r)
{
    size_t n = r->np, k = 0;
    int64_t *ord = malloc((n ? n : 1) * sizeof(int64_t));
    size_t *order = malloc((n ? n : 1) * sizeof(size_t));
    char *seen = calloc(n ? n : 1, 1);
    int rc = DDP_ENOMEM;
    if (!ord || !order || !seen)
        goto out;
    for (size_t j = 0; j < r->norder; j++)
        ord[k++] = (int64_t)r->order[j];
    for (size_t j = n; j-- > 0;)
        if (!r->ps[j].ready)
            ord[k++] = (int64_t)j;
    if ((rc = ddp__reducer_staged(r->pg, STAGED_BROADCAST, ord, ord, n, DDP_I64, DDP_SUM)) < 0) {
        fail(r, rc, "broadcasting the bucket order failed: %s", ddp_pg_last_error(r->pg));
        goto out;
    }
    for (size_t j = 0; j < n; j++) {
        if (ord[j] < 0 || (size_t)ord[j] >= n || seen[ord[j]]++) {
            rc = fail(r, DDP_EPROTO, "rank 0's bucket order is not a permutation");
            goto out;
        }
        order[j] = (size_t)ord[j];
    }
    if ((rc = build_buckets(r, order)) < 0)
        goto out;
    r->st.rebuilds++;
    DDP_INFO(REDUCER, "rank %d: buckets rebuilt in rank 0's gradient order: %zu buckets", r->rank,
             r->nb);
out:
    free(ord);
    free(order);
    free(seen);
    return rc;
}

int ddp_reducer_finalize(struct ddp_reducer *r)
{
    int rc = 0;
    if (!r->sync) {
        reset_iteration(r);
        return 0;
    }
    r->in_finalize = true;
    size_t missing = 0;
    for (size_t i = 0; i < r->np; i++)
        missing += !r->ps[i].ready;
    if (missing && !r->o.find_unused_parameters) {
        char names[700] = "";
        size_t at = 0, listed = 0;
        for (size_t i = 0; i < r->np && listed < 8; i++)
            if (!r->ps[i].ready) {
                at += (size_t)snprintf(names + at, sizeof(names) - at, "%s'%s'", listed ? ", " : "",
                                       r->ps[i].name);
                listed++;
                if (at >= sizeof(names))
                    break;
            }
        fail(r, DDP_EINVAL,
             "%zu parameter(s) never had their gradient marked ready in this iteration: %s%s "
             "(parameters not used in the loss need find_unused_parameters)",
             missing, names, missing > listed ? ", ..." : "");
        char why[1200];
        snprintf(why, sizeof(why), "reducer: %s", r->err);
        ddp_pg_abort(r->pg, why);
        rc = DDP_EINVAL;
        goto done;
    }
    /* Unused here: zeros in the bucket, so the reduction can complete. */
    for (size_t i = 0; i < r->np; i++) {
        struct rparam *p = &r->ps[i];
        if (p->ready)
            continue;
        if ((rc = zero(r, slot_of(r, p), pbytes(p))) < 0) {
            fail(r, rc, "cannot zero the slot of '%s': %s", p->name, ddp__dev_error());
            goto done;
        }
        p->piece = slot_of(r, p);
        r->bk[p->bucket].pending--;
    }
    if (!r->overlap && r->nstream && (rc = run_stream(r)) < 0)
        goto done;
    if ((rc = launch_ready(r)) < 0)
        goto done;
    if (r->o.find_unused_parameters &&
        (rc = ddp__reducer_staged(r->pg, STAGED_ALLREDUCE, r->used, r->used, r->np, DDP_I32,
                                  DDP_MAX)) < 0) {
        fail(r, rc, "agreeing on unused parameters failed: %s", ddp_pg_last_error(r->pg));
        goto done;
    }
    /* CUDA: the compute stream waits for each bucket on the device; the host goes on. */
    int64_t t0 = ddp_now_ns();
    for (size_t b = 0; b < r->nb; b++) {
        struct ddp_work *w = r->bk[b].work;
        int e = w ? ddp_work_stream_wait(w) : 0; /* a host wait on CPU groups */
        if (e < 0 && rc == 0)
            rc = fail(r, e, "all-reduce of bucket %zu failed: %s", b, ddp_pg_last_error(r->pg));
    }
    r->st.finalize_wait_ns += (uint64_t)(ddp_now_ns() - t0);
    if (rc < 0)
        goto done;
    for (size_t i = 0; i < r->np; i++)
        r->ps[i].used_global = !r->o.find_unused_parameters || r->used[i];
    for (size_t bi = 0; bi < r->nb; bi++) {
        struct bucket *b = &r->bk[bi];
        if (hooked(r, b)) {
            ddp__half_to_f32(b->buf, b->comp, b->count,
                             r->o.hook == DDP_HOOK_FP16 ? DDP_F16 : DDP_BF16);
        }
        if (r->o.gradient_as_bucket_view)
            continue;
        for (size_t k = 0; k < b->nparams; k++) {
            struct rparam *p = &r->ps[b->params[k]];
            /* in pieces, only the gradients the bucket stood in for */
            if (in_pieces(r, b) && p->piece != slot_of(r, p))
                continue;
            if (p->used_global && *p->p.grad &&
                (rc = bucket_copy(r, *p->p.grad, slot_of(r, p), pbytes(p))) < 0) {
                fail(r, rc, "cannot copy the average of '%s' out of its bucket: %s", p->name,
                     ddp__dev_error());
                goto done;
            }
        }
    }
    r->st.iterations++;
    if (!r->rebuilt && !r->o.no_rebuild) {
        r->rebuilt = true;
        rc = rebuild(r);
    }
done:
    r->in_finalize = false;
    reset_iteration(r);
    return rc;
}

bool ddp_reducer_param_used(const struct ddp_reducer *r, size_t i)
{
    return i < r->np && r->ps[i].used_global;
}

size_t ddp_reducer_num_buckets(const struct ddp_reducer *r)
{
    return r->nb;
}

size_t ddp_reducer_bucket_params(const struct ddp_reducer *r, size_t b, size_t *idx, size_t max)
{
    if (b >= r->nb)
        return 0;
    for (size_t k = 0; k < r->bk[b].nparams && k < max; k++)
        idx[k] = r->bk[b].params[k];
    return r->bk[b].nparams;
}

void ddp_reducer_get_stats(const struct ddp_reducer *r, struct ddp_reducer_stats *st)
{
    *st = r->st;
}
