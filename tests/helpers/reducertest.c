/*
 * reducertest: the gradient reducer on a real process group, checked against values computed
 * here from the formula every rank used (not against the reducer's own output).
 *
 *   reducertest basic [--view] [--hook fp16|bf16] [--cap B] [--first B] [--iters N]
 *   reducertest nosync K [--view]     K no_sync iterations then one synchronised
 *   reducertest unused [--find] [--only-rank0]
 *                                     a parameter no rank uses, one only rank 0 skips
 *   reducertest rebuild [--view]      ready order differs from registration; rank 0's wins
 *   reducertest mismatch              rank 1 registers a different shape
 *   reducertest overlap               buckets start during backward, not at finalize
 *   reducertest stream                float32 only, bucket view, no overlap: ranks other than 0
 *                                     wait, before they fill the last gradient, until rank 0 (in
 *                                     finalize) has averaged every other one into their memory
 *                                     (the buckets streamed: ddp_pg_allreduce_pieces_post), the
 *                                     last bucket's other gradient too; --copy without bucket
 *                                     view (the gradients streamed where they lie, or through
 *                                     their slots), --registered gradients (watched then too)
 *   --f32 (any mode)                  every parameter float32: without overlap, the buckets
 *                                     stream
 *
 * Exits 0 when every check passed, 1 on a wrong value, 3 when an operation failed.
 */
#include "ddp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/coll.h" /* bf16 conversions for the mixed-dtype parameter */

#define NP 9
static const size_t counts[NP] = {1000, 7, 300000, 13, 65536, 1, 250001, 3, 4099};
static enum ddp_dtype dts[NP] = {DDP_F32, DDP_F32, DDP_F32,  DDP_F64, DDP_F32,
                                 DDP_F32, DDP_F32, DDP_BF16, DDP_F32};
static int rank, world;
static void *data[NP], *grads[NP], *orig[NP]; /* orig: the buffers grads started as */
static struct ddp_pg *reg_pg; /* stream --registered: gradients from ddp_pg_mem_alloc */
static struct ddp_param params[NP];
static char names[NP][32];

/* The gradient rank r produces for element j of parameter i in iteration it. */
static double gval(int r, size_t i, size_t j, int it)
{
    return (r + 1) * 0.5 + (double)i * 0.25 + (double)(j % 97) * 0.01 + it * 0.125;
}

static double get(const void *p, enum ddp_dtype dt, size_t j)
{
    switch (dt) {
    case DDP_F32:
        return ((const float *)p)[j];
    case DDP_F64:
        return ((const double *)p)[j];
    case DDP_BF16:
        return ddp__bf16_to_f32(((const uint16_t *)p)[j]);
    default:
        return NAN;
    }
}

static void put(void *p, enum ddp_dtype dt, size_t j, double v, bool add)
{
    switch (dt) {
    case DDP_F32:
        ((float *)p)[j] = (float)(add ? ((float *)p)[j] + v : v);
        break;
    case DDP_F64:
        ((double *)p)[j] = add ? ((double *)p)[j] + v : v;
        break;
    case DDP_BF16:
        ((uint16_t *)p)[j] = ddp__f32_to_bf16((float)(add ? get(p, dt, j) + v : v));
        break;
    default:
        break;
    }
}

static void setup_params(bool mismatch)
{
    for (size_t i = 0; i < NP; i++) {
        size_t esz = ddp_dtype_size(dts[i]);
        data[i] = malloc(counts[i] * esz);
        grads[i] = orig[i] =
            reg_pg ? ddp_pg_mem_alloc(reg_pg, counts[i] * esz) : calloc(counts[i], esz);
        for (size_t j = 0; j < counts[i]; j++)
            put(data[i], dts[i], j, rank * 1000.0 + (double)i + (double)(j % 13), false);
        snprintf(names[i], sizeof(names[i]), "layer%zu.%s", i / 2, i % 2 ? "bias" : "weight");
        params[i] = (struct ddp_param){.name = names[i],
                                       .data = data[i],
                                       .grad = &grads[i],
                                       .count = counts[i],
                                       .dtype = dts[i],
                                       .ndim = 1,
                                       .shape = {(int64_t)counts[i]}};
    }
    /* the same element count, a different shape: only the shape check can tell */
    params[4].ndim = 2;
    params[4].shape[0] = 256;
    params[4].shape[1] = 256;
    if (mismatch && rank == 1) {
        params[4].shape[0] = 128;
        params[4].shape[1] = 512;
    }
}

static void produce(size_t i, int it, bool add)
{
    for (size_t j = 0; j < counts[i]; j++)
        put(grads[i], dts[i], j, gval(rank, i, j, it), add);
}

static void zero_grads(void)
{
    for (size_t i = 0; i < NP; i++)
        memset(grads[i], 0, counts[i] * ddp_dtype_size(dts[i]));
}

static int bad;

static void expect(size_t i, size_t j, double got, double want, double tol, const char *what)
{
    if (fabs(got - want) <= tol * (1 + fabs(want)))
        return;
    if (bad++ < 5)
        fprintf(stderr, "reducertest rank %d: %s: param %zu [%zu] = %.9g, want %.9g\n", rank, what,
                i, j, got, want);
}

/* Whether parameter i holds the mean over ranks of gval for iteration it. */
static bool averaged(size_t i, int it)
{
    for (size_t j = 0; j < counts[i]; j++) {
        double want = 0;
        for (int r = 0; r < world; r++)
            want += gval(r, i, j, it);
        want /= world;
        if (fabs(get(grads[i], dts[i], j) - want) > 1e-6 * (1 + fabs(want)))
            return false;
    }
    return true;
}

/* Waits (20 s at most) until every parameter but `last` holds iteration it's average; false if
 * one never does. */
static bool others_averaged(size_t last, int it)
{
    for (int t = 0; t < 2000; t++) {
        bool all = true;
        for (size_t i = 0; i < NP && all; i++)
            all = i == last || averaged(i, it);
        if (all)
            return true;
        usleep(10000);
    }
    return false;
}

/* Checks every gradient against the mean over ranks of sum_{it in its} gval. */
static void check_grads(const int *its, int nits, double tol, const char *what)
{
    for (size_t i = 0; i < NP; i++) {
        double t = dts[i] == DDP_BF16 ? 2e-2 : tol;
        for (size_t j = 0; j < counts[i]; j++) {
            double want = 0;
            for (int r = 0; r < world; r++)
                for (int k = 0; k < nits; k++)
                    want += gval(r, i, j, its[k]);
            expect(i, j, get(grads[i], dts[i], j), want / world, t, what);
        }
    }
}

static void must(struct ddp_reducer *red, int rc, const char *what)
{
    if (rc == 0)
        return;
    fprintf(stderr, "reducertest rank %d: %s failed: %s\n", rank, what,
            red ? ddp_reducer_last_error(red) : ddp_reducer_new_error());
    exit(3);
}

/* Buckets: each holds one dtype, in reverse registration order within the dtype; all but the
 * last of each dtype reach their cap. */
static void check_buckets(struct ddp_reducer *red, size_t cap, size_t first)
{
    size_t nb = ddp_reducer_num_buckets(red), idx[NP], seen = 0;
    long last_of[8];
    for (int d = 0; d < 8; d++)
        last_of[d] = NP;
    for (size_t b = 0; b < nb; b++) {
        size_t n = ddp_reducer_bucket_params(red, b, idx, NP), bytes = 0;
        enum ddp_dtype dt = dts[idx[0]];
        for (size_t k = 0; k < n; k++) {
            if (dts[idx[k]] != dt || (long)idx[k] >= last_of[dt]) {
                fprintf(stderr, "reducertest: bucket %zu breaks reverse dtype order\n", b);
                bad++;
            }
            last_of[dt] = (long)idx[k];
            bytes += counts[idx[k]] * ddp_dtype_size(dt);
            seen++;
        }
        bool last_of_dtype = true;
        for (size_t b2 = b + 1; b2 < nb; b2++) {
            size_t i2[NP];
            ddp_reducer_bucket_params(red, b2, i2, NP);
            if (dts[i2[0]] == dt)
                last_of_dtype = false;
        }
        size_t c = b == 0 ? first : cap;
        /* full buckets reach the cap, and hold no more than one parameter past it */
        size_t last_bytes = counts[idx[n - 1]] * ddp_dtype_size(dt);
        if ((!last_of_dtype && bytes < c) || bytes - last_bytes >= c) {
            fprintf(stderr, "reducertest: bucket %zu has %zu bytes against a cap of %zu\n", b,
                    bytes, c);
            bad++;
        }
    }
    if (seen != NP) {
        fprintf(stderr, "reducertest: buckets hold %zu parameters, not %d\n", seen, NP);
        bad++;
    }
    if (rank == 0)
        printf("reducertest: %zu buckets\n", nb);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr,
                "usage: reducertest basic|nosync K|unused|rebuild|mismatch|overlap [opts]\n");
        return 2;
    }
    const char *mode = argv[1];
    struct ddp_reducer_opts o = {0};
    int iters = 3, k = 0;
    bool copy = false, registered = false; /* stream: without bucket view; gradients registered */
    bool f32 = false; /* every parameter float32 (stream mode's), so the buckets stream */
    bool only_rank0 = false;
    for (int a = 2; a < argc; a++) {
        if (strcmp(argv[a], "--view") == 0)
            o.gradient_as_bucket_view = true;
        else if (strcmp(argv[a], "--only-rank0") == 0)
            only_rank0 = true; /* unused: only rank 0 skips a parameter */
        else if (strcmp(argv[a], "--no-overlap") == 0)
            o.no_overlap = true;
        else if (strcmp(argv[a], "--copy") == 0)
            copy = true;
        else if (strcmp(argv[a], "--registered") == 0)
            registered = true;
        else if (strcmp(argv[a], "--f32") == 0)
            f32 = true;
        else if (strcmp(argv[a], "--find") == 0)
            o.find_unused_parameters = true;
        else if (strcmp(argv[a], "--hook") == 0 && a + 1 < argc)
            o.hook = strcmp(argv[++a], "fp16") == 0 ? DDP_HOOK_FP16 : DDP_HOOK_BF16;
        else if (strcmp(argv[a], "--cap") == 0 && a + 1 < argc)
            o.bucket_cap_bytes = (size_t)atol(argv[++a]);
        else if (strcmp(argv[a], "--first") == 0 && a + 1 < argc)
            o.first_bucket_bytes = (size_t)atol(argv[++a]);
        else if (strcmp(argv[a], "--iters") == 0 && a + 1 < argc)
            iters = atoi(argv[++a]);
        else if (argv[a][0] != '-')
            k = atoi(argv[a]);
    }
    struct ddp_pg *pg;
    if (ddp_pg_init_env(NULL, &pg) != 0) {
        fprintf(stderr, "reducertest: cannot form the group\n");
        return 3;
    }
    rank = ddp_pg_rank(pg);
    world = ddp_pg_world_size(pg);
    bool stream = strcmp(mode, "stream") == 0;
    for (size_t i = 0; i < NP && (stream || f32); i++)
        dts[i] = DDP_F32;
    if (stream) {
        o.gradient_as_bucket_view = !copy;
        o.no_overlap = true;
        reg_pg = registered ? pg : NULL;
    }
    /* where peers average the gradients in place, a rank can watch them arrive */
    bool watch = stream && rank > 0 && (!copy || registered);
    setup_params(strcmp(mode, "mismatch") == 0);
    if (strcmp(mode, "rebuild") != 0 && !o.bucket_cap_bytes) {
        o.bucket_cap_bytes = 512 << 10; /* several buckets from these sizes */
        o.first_bucket_bytes = 64 << 10;
    }
    struct ddp_reducer *red = NULL;
    int rc = ddp_reducer_new(pg, params, NP, &o, &red);
    if (strcmp(mode, "mismatch") == 0) {
        printf("reducertest rank %d: %s\n", rank, rc ? ddp_reducer_new_error() : "no error");
        ddp_pg_free(pg);
        return rc == DDP_EINVAL ? 0 : 1;
    }
    must(NULL, rc, "creating the reducer");
    /* Every rank now holds rank 0's parameters. */
    for (size_t i = 0; i < NP; i++)
        for (size_t j = 0; j < counts[i]; j++)
            expect(i, j, get(data[i], dts[i], j), (double)i + (double)(j % 13), 0,
                   "initial broadcast");
    double tol = o.hook == DDP_HOOK_FP16 ? 2e-3 : o.hook == DDP_HOOK_BF16 ? 2e-2 : 1e-6;

    if (strcmp(mode, "basic") == 0 || strcmp(mode, "overlap") == 0 || stream) {
        check_buckets(red, o.bucket_cap_bytes, o.first_bucket_bytes);
        int early = 0;
        for (int it = 0; it < iters; it++) {
            zero_grads();
            for (size_t i = NP; i-- > 0;) {
                if (watch && i == 0) /* the last gradient to fill */
                    early += others_averaged(0, it);
                produce(i, it, true);
                must(red, ddp_reducer_mark_ready(red, i), "mark_ready");
                if (strcmp(mode, "overlap") == 0)
                    usleep(20000); /* "backward" of the earlier layers */
            }
            must(red, ddp_reducer_finalize(red), "finalize");
            check_grads(&it, 1, tol, "averaged gradient");
        }
        struct ddp_reducer_stats st;
        ddp_reducer_get_stats(red, &st);
        if (rank == 0)
            printf("reducertest: %llu of %llu bucket all-reduces started during backward\n",
                   (unsigned long long)st.launched_in_backward,
                   (unsigned long long)st.buckets_launched);
        /* Every bucket fills during backward, so with overlap every one starts there (whether
         * the reducer overlaps depends on DDP_REDUCER_OVERLAP and the cores: 30-reducer). */
        if (rank == 0)
            printf("reducertest: overlap %s, %llu buckets posted\n", st.overlap ? "on" : "off",
                   (unsigned long long)st.buckets_posted);
        if (watch)
            printf("reducertest rank %d: %d of %d iterations: the other gradients averaged "
                   "before the last one filled\n",
                   rank, early, iters);
        bad += watch && early != iters;
        if ((o.no_overlap && st.overlap) ||
            st.launched_in_backward != (st.overlap ? st.buckets_launched : 0)) {
            fprintf(stderr, "reducertest: %llu buckets started during backward\n",
                    (unsigned long long)st.launched_in_backward);
            bad++;
        }
    } else if (strcmp(mode, "nosync") == 0) {
        int its[64];
        zero_grads();
        ddp_reducer_set_sync(red, false);
        for (int it = 0; it < k; it++) {
            for (size_t i = NP; i-- > 0;) {
                produce(i, it, true);
                must(red, ddp_reducer_mark_ready(red, i), "mark_ready");
            }
            must(red, ddp_reducer_finalize(red), "finalize (no_sync)");
            its[it] = it;
        }
        /* Nothing was communicated: the gradients are still this rank's own sums. */
        for (size_t j = 0; j < counts[0]; j++) {
            double want = 0;
            for (int it = 0; it < k; it++)
                want += gval(rank, 0, j, it);
            expect(0, j, get(grads[0], dts[0], j), want, 1e-6, "local accumulation");
        }
        ddp_reducer_set_sync(red, true);
        for (size_t i = NP; i-- > 0;) {
            produce(i, k, true);
            must(red, ddp_reducer_mark_ready(red, i), "mark_ready");
        }
        must(red, ddp_reducer_finalize(red), "finalize");
        its[k] = k;
        check_grads(its, k + 1, 1e-6, "no_sync sum");
    } else if (strcmp(mode, "unused") == 0) {
        /* parameter 2: no rank uses it; parameter 5: rank 0 does not */
        for (int it = 0; it < 2; it++) {
            zero_grads();
            for (size_t i = NP; i-- > 0;) {
                if ((i == 2 && !only_rank0) || (i == 5 && rank == 0))
                    continue;
                produce(i, it, true);
                must(red, ddp_reducer_mark_ready(red, i), "mark_ready");
            }
            rc = ddp_reducer_finalize(red);
            if (!o.find_unused_parameters) {
                printf("reducertest rank %d: finalize: %s\n", rank,
                       rc ? ddp_reducer_last_error(red) : "no error");
                ddp_reducer_free(red);
                ddp_pg_free(pg);
                return rc ? 0 : 1;
            }
            must(red, rc, "finalize");
            if (ddp_reducer_param_used(red, 2) || !ddp_reducer_param_used(red, 5) ||
                !ddp_reducer_param_used(red, 0)) {
                fprintf(stderr, "reducertest rank %d: wrong unused-parameter verdict\n", rank);
                bad++;
            }
            for (size_t j = 0; j < counts[5]; j++) {
                double want = 0;
                for (int r = 1; r < world; r++)
                    want += gval(r, 5, j, it);
                expect(5, j, get(grads[5], dts[5], j), want / world, 1e-6, "partly used parameter");
            }
            for (size_t j = 0; j < counts[2]; j++)
                expect(2, j, get(grads[2], dts[2], j), 0, 0, "unused parameter");
            for (size_t j = 0; j < counts[0]; j++) {
                double want = 0;
                for (int r = 0; r < world; r++)
                    want += gval(r, 0, j, it);
                expect(0, j, get(grads[0], dts[0], j), want / world, 1e-6, "used parameter");
            }
        }
        if (rank == 0)
            printf("reducertest: parameter 2 unused everywhere, 5 used by some ranks\n");
    } else if (strcmp(mode, "rebuild") == 0) {
        /* Each rank marks in its own order; rank 0's: 0, 2, 4, ... then odd ones. */
        size_t order[NP], n = 0;
        for (size_t i = 0; i < NP; i += 2)
            order[n++] = i;
        for (size_t i = 1; i < NP; i += 2)
            order[n++] = i;
        if (rank != 0)
            for (size_t a = 0; a < NP / 2; a++) { /* reversed elsewhere */
                size_t t = order[a];
                order[a] = order[NP - 1 - a];
                order[NP - 1 - a] = t;
            }
        size_t nb0 = ddp_reducer_num_buckets(red);
        for (int it = 0; it < iters; it++) {
            zero_grads();
            for (size_t a = 0; a < NP; a++) {
                produce(order[a], it, true);
                must(red, ddp_reducer_mark_ready(red, order[a]), "mark_ready");
            }
            must(red, ddp_reducer_finalize(red), "finalize");
            check_grads(&it, 1, 1e-6, "after rebuild");
            if (it == 0) {
                /* The rebuilt buckets follow rank 0's order (within each dtype). */
                size_t idx[NP], pos = 0, nb = ddp_reducer_num_buckets(red);
                size_t flat[NP];
                for (size_t b = 0; b < nb; b++) {
                    size_t c = ddp_reducer_bucket_params(red, b, idx, NP);
                    for (size_t q = 0; q < c; q++)
                        flat[pos++] = idx[q];
                }
                size_t want[NP], w = 0;
                for (size_t i = 0; i < NP; i += 2)
                    want[w++] = i;
                for (size_t i = 1; i < NP; i += 2)
                    want[w++] = i;
                /* buckets split by dtype and cap: compare each dtype's sequence */
                for (int d = 0; d <= DDP_BF16; d++) {
                    size_t a = 0, b2 = 0;
                    for (;;) {
                        while (a < NP && dts[flat[a]] != (enum ddp_dtype)d)
                            a++;
                        while (b2 < NP && dts[want[b2]] != (enum ddp_dtype)d)
                            b2++;
                        if (a >= NP || b2 >= NP)
                            break;
                        if (flat[a] != want[b2]) {
                            fprintf(stderr, "reducertest rank %d: rebuilt order differs\n", rank);
                            bad++;
                            break;
                        }
                        a++;
                        b2++;
                    }
                }
                if (rank == 0)
                    printf("reducertest: buckets rebuilt (%zu before, %zu after)\n", nb0, nb);
            }
        }
    } else {
        fprintf(stderr, "reducertest: unknown mode %s\n", mode);
        return 2;
    }
    ddp_reducer_free(red);
    for (size_t i = 0; i < NP; i++) {
        free(data[i]);
        ddp_pg_mem_free(reg_pg, orig[i]); /* free() where reg_pg is NULL */
    }
    ddp_pg_free(pg);
    if (bad) {
        fprintf(stderr, "reducertest rank %d: %d checks failed\n", rank, bad);
        return 1;
    }
    printf("reducertest rank %d: %s passed\n", rank, mode);
    return 0;
}
