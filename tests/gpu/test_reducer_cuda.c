/*
 * GPU tests of the reducer on an NCCL group (ctest label gpu; exit 77, skipped, without a CUDA
 * device). World size 1 (NCCL refuses two ranks on one GPU), one process with its own store:
 *
 *   - overlap timeline: a simulated backward of 4 layers, each a 3 ms kernel on the compute
 *     stream that then writes its gradient, each parameter its own bucket. CUDA events on the
 *     compute stream time the layers; events the communication thread records around each
 *     collective (the trace hook) time the all-reduces. Bucket k's all-reduce must start only
 *     after its layer's gradient was written, and the first bucket's must have run while the
 *     later layers' backward was still running. With no_overlap it must not.
 *   - the host never waits: mark_ready and finalize return long before the 12 ms of kernels
 *     have run; the gradients read after the stream are the reference values (average over one
 *     rank = the gradient), with and without gradient-as-bucket-view.
 *   - stream order of plain collectives: an all-reduce started after a long kernel that writes
 *     its buffer sees what the kernel wrote; ddp_work_stream_wait() orders a later copy after it.
 */
#include "common/err.h"
#include "common/util.h"
#include "examples/fmnist/kernels.h"
#include "reducer/reducer.h"
#include "rendezvous/store.h"
#include "worker/pg_nccl.h"
#include "worker/pg.h"
#include "tests/gpu/gpu_test.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 4
#define ELEMS (2u << 20) /* 8 MiB of float32 per parameter */
#define LAYER_NS 3000000ull

/* The trace hook: timing events around each all-reduce on the communication stream. */
struct timeline {
    atomic_bool on;
    int n;
    cudaEvent_t t[2][16];
};

static void trace(void *arg, const char *what, size_t count, int phase, void *stream)
{
    struct timeline *tl = arg;
    (void)what;
    if (!atomic_load(&tl->on) || count != ELEMS || tl->n >= 16)
        return;
    cudaEventRecord(tl->t[phase][tl->n], (cudaStream_t)stream);
    if (phase == 1)
        tl->n++;
}

static float ms(cudaEvent_t a, cudaEvent_t b)
{
    float x = -1;
    cudaEventElapsedTime(&x, a, b);
    return x;
}

/* One simulated iteration; returns the host time of backward + finalize in ms. */
static double iteration(struct ddp_reducer *r, float **grad, cudaStream_t cs, cudaEvent_t base,
                        cudaEvent_t *ls, cudaEvent_t *le, int iter)
{
    int64_t t0 = ddp_now_ns();
    cudaEventRecord(base, cs);
    for (int l = LAYERS - 1; l >= 0; l--) {
        cudaEventRecord(ls[l], cs);
        fmk_spin(LAYER_NS, cs);
        fmk_fill(grad[l], (float)(l + 1) + 0.5f * (float)iter, ELEMS, cs);
        cudaEventRecord(le[l], cs);
        CHECK(ddp_reducer_mark_ready(r, (size_t)l) == 0, "mark_ready: %s",
              ddp_reducer_last_error(r));
    }
    CHECK(ddp_reducer_finalize(r) == 0, "finalize: %s", ddp_reducer_last_error(r));
    double host = (double)(ddp_now_ns() - t0) / 1e6;
    cudaStreamSynchronize(cs);
    return host;
}

/* compute-sanitizer (NV_SANITIZER_*) or another CUDA tool (CUDA_INJECTION64_PATH) attached:
 * launches run one at a time, the host waiting for each, so host time proves nothing. */
static bool tool_attached(void)
{
    return getenv("NV_SANITIZER_INJECTION_PORT_BASE") || getenv("CUDA_INJECTION64_PATH");
}

static void run_case(struct ddp_pg *pg, cudaStream_t cs, bool view, bool overlap)
{
    static struct timeline tl;
    float *own[LAYERS], *grad[LAYERS], *data[LAYERS];
    struct ddp_param ps[LAYERS];
    char names[LAYERS][24]; /* "layer" and any int */
    for (int l = 0; l < LAYERS; l++) {
        cudaMalloc((void **)&data[l], ELEMS * sizeof(float));
        cudaMemset(data[l], 0, ELEMS * sizeof(float));
        cudaMalloc((void **)&own[l], ELEMS * sizeof(float));
        grad[l] = own[l];
        snprintf(names[l], sizeof(names[l]), "layer%d", l);
        ps[l] = (struct ddp_param){.name = names[l],
                                   .data = data[l],
                                   .grad = (void **)&grad[l],
                                   .count = ELEMS,
                                   .dtype = DDP_F32,
                                   .ndim = 1,
                                   .shape = {ELEMS}};
    }
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 16; k++)
            cudaEventCreate(&tl.t[p][k]);
    cudaDeviceSynchronize(); /* the memsets ran on the legacy stream */
    atomic_store(&tl.on, false);
    tl.n = 0;
    ddp__pg_set_trace(pg, trace, &tl);
    struct ddp_reducer_opts o = {.bucket_cap_bytes = 1,
                                 .first_bucket_bytes = 1,
                                 .no_rebuild = true,
                                 .gradient_as_bucket_view = view,
                                 .no_overlap = !overlap};
    struct ddp_reducer *r;
    int rc = ddp_reducer_new(pg, ps, LAYERS, &o, &r);
    CHECK(rc == 0, "reducer: %s", ddp_reducer_new_error());
    if (rc != 0)
        return;
    CHECK(ddp_reducer_num_buckets(r) == LAYERS, "one bucket per parameter");
    cudaEvent_t base, ls[LAYERS], le[LAYERS];
    cudaEventCreate(&base);
    for (int l = 0; l < LAYERS; l++) {
        cudaEventCreate(&ls[l]);
        cudaEventCreate(&le[l]);
    }
    iteration(r, grad, cs, base, ls, le, 0); /* warm-up: NCCL connects, kernels load */
    atomic_store(&tl.on, true);
    double host = iteration(r, grad, cs, base, ls, le, 1);
    atomic_store(&tl.on, false);
    cudaDeviceSynchronize();

    /* the averaged gradients (one rank: the gradient itself), read through *grad */
    float *h = malloc(ELEMS * sizeof(float));
    for (int l = 0; l < LAYERS; l++) {
        cudaMemcpy(h, grad[l], ELEMS * sizeof(float), cudaMemcpyDeviceToHost);
        float want = (float)(l + 1) + 0.5f;
        size_t bad = 0;
        for (size_t i = 0; i < ELEMS; i++)
            bad += h[i] != want;
        CHECK(bad == 0, "%s%s: %zu of %u gradient values are not %g", view ? "view " : "", names[l],
              bad, ELEMS, (double)want);
    }
    free(h);

    printf("\n%s, %s: host time of backward + finalize %.3f ms (kernels: %.1f ms)\n",
           view ? "gradient-as-bucket-view" : "copy-in buckets", overlap ? "overlap" : "no_overlap",
           host, (double)LAYERS * LAYER_NS / 1e6);
    if (!tool_attached())
        CHECK(host < 0.5 * LAYERS * LAYER_NS / 1e6,
              "the host did not wait for the kernels (%.3f ms)", host);
    CHECK(tl.n == LAYERS, "traced %d bucket all-reduces", tl.n);
    printf("  %-8s %12s %12s   %s\n", "", "start (ms)", "end (ms)", "");
    for (int l = LAYERS - 1; l >= 0; l--)
        printf("  %-8s %12.3f %12.3f   backward of the layer (compute stream)\n", names[l],
               ms(base, ls[l]), ms(base, le[l]));
    for (int k = 0; k < tl.n; k++) {
        int l = LAYERS - 1 - k; /* bucket k holds the parameter backward finished k-th */
        float s = ms(base, tl.t[0][k]), e = ms(base, tl.t[1][k]);
        printf("  bucket %d %12.3f %12.3f   all-reduce of %s (communication stream)\n", k, s, e,
               names[l]);
        CHECK(s >= ms(base, le[l]) - 0.01f,
              "bucket %d's all-reduce started at %.3f ms, before its gradient was written (%.3f)",
              k, (double)s, (double)ms(base, le[l]));
    }
    if (tl.n == LAYERS) {
        float first_end = ms(base, tl.t[1][0]), backward_end = ms(base, le[0]);
        if (overlap)
            CHECK(first_end < backward_end - 1.0f,
                  "bucket 0's all-reduce (ended %.3f ms) ran while the backward of earlier "
                  "layers still ran (until %.3f ms)",
                  (double)first_end, (double)backward_end);
        else
            CHECK(ms(base, tl.t[0][0]) >= backward_end - 0.01f,
                  "with no_overlap nothing starts before backward ends");
    }
    ddp__pg_set_trace(pg, NULL, NULL);
    ddp_reducer_free(r);
    for (int l = 0; l < LAYERS; l++) {
        cudaFree(data[l]);
        cudaFree(own[l]);
        cudaEventDestroy(ls[l]);
        cudaEventDestroy(le[l]);
    }
    cudaEventDestroy(base);
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 16; k++)
            cudaEventDestroy(tl.t[p][k]);
}

/* A collective started after a long kernel that writes its buffer sees the kernel's values,
 * and the host gets control back at once; a stream-waited copy sees the collective's. */
static void stream_order(struct ddp_pg *pg, cudaStream_t cs)
{
    size_t n = 1 << 20;
    float *d, *out, *h = malloc(n * sizeof(float));
    cudaMalloc((void **)&d, n * sizeof(float));
    cudaMalloc((void **)&out, n * sizeof(float));
    cudaMemset(d, 0, n * sizeof(float));
    cudaDeviceSynchronize();
    int64_t t0 = ddp_now_ns();
    fmk_spin(50000000ull, cs); /* 50 ms */
    fmk_fill(d, 3.25f, n, cs);
    struct ddp_work *w;
    CHECK(ddp_pg_allreduce_start(pg, d, n, DDP_F32, DDP_SUM, &w) == 0, "start");
    CHECK(ddp_work_stream_wait(w) == 0, "stream wait");
    cudaMemcpyAsync(out, d, n * sizeof(float), cudaMemcpyDeviceToDevice, cs);
    double host = (double)(ddp_now_ns() - t0) / 1e6;
    ddp_work_free(w);
    cudaStreamSynchronize(cs);
    printf("\nstream order: start + stream wait took %.3f ms of host time behind a 50 ms kernel\n",
           host);
    if (tool_attached())
        printf("a CUDA tool is attached (it serializes launches): host time not checked\n");
    else
        CHECK(host < 20, "the host did not wait for the device (%.3f ms)", host);
    cudaMemcpy(h, out, n * sizeof(float), cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != 3.25f;
    CHECK(bad == 0, "%zu values were not the kernel's (collective ran before it)", bad);
    cudaFree(d);
    cudaFree(out);
    free(h);
}

int main(void)
{
    gpu_or_skip();
    struct test_store ts;
    test_store_start(&ts);
    struct ddp_store *s = test_store_client(&ts);
    if (!s)
        return 1;
    struct ddp_pg_opts o = {.backend = DDP_PG_BACKEND_NCCL, .timeout_ms = 30000};
    struct ddp_pg *pg;
    int r = ddp_pg_init(s, 0, 1, 0, 1, 0, &o, &pg);
    CHECK(r == 0, "init: %s", ddp_strerror(r));
    if (r == 0) {
        cudaStream_t cs;
        cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
        ddp_pg_set_compute_stream(pg, cs);
        stream_order(pg, cs);
        run_case(pg, cs, false, true);
        run_case(pg, cs, true, true);
        run_case(pg, cs, false, false);
        ddp_pg_free(pg);
        cudaStreamDestroy(cs);
    }
    ddp_store_close(s);
    test_store_stop(&ts);
    if (failures)
        return 1;
    printf("all reducer GPU checks passed\n");
    return 0;
}
