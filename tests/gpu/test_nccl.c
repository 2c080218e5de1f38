/*
 * GPU tests of the NCCL backend (ctest label gpu). Without a CUDA device they print why and
 * exit 77, which ctest reports as skipped. On a GPU machine, in one process with its own store:
 *   - every collective on device memory at world size 1 (NCCL refuses two ranks on one GPU;
 *     with several GPUs run the bats GPU job instead) against a host reference;
 *   - the abort path: a 2-rank group whose rank 1 never joins makes rank 0 fail within its
 *     timeout, with an error naming the operation and the rank, instead of hanging.
 */
#include "common/err.h"
#include "common/util.h"
#include "rendezvous/store.h"
#include "worker/pg.h"
#include "tests/gpu/gpu_test.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *dev_from(const float *h, size_t n)
{
    void *d = NULL;
    if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess ||
        cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
        return NULL;
    return d;
}

static void to_host(float *h, const float *d, size_t n)
{
    cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
}

int main(void)
{
    gpu_or_skip();
    struct test_store ts;
    test_store_start(&ts);

    /* world size 1: every collective against the host reference */
    struct ddp_store *s;
    if (!(s = test_store_client(&ts)))
        return 1;
    struct ddp_pg_opts o = {.backend = DDP_PG_BACKEND_NCCL, .timeout_ms = 30000, .name = "w1"};
    struct ddp_pg *pg;
    int r = ddp_pg_init(s, 0, 1, 0, 1, 0, &o, &pg);
    CHECK(r == 0, "init: %s", ddp_strerror(r));
    if (r == 0) {
        CHECK(ddp_pg_is_cuda(pg) && ddp_pg_comm_stream(pg), "a CUDA group with its own stream");
        size_t n = 1 << 20;
        float *h = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            h[i] = (float)(i % 1000) * 0.25f - 7.0f;
        float *d = dev_from(h, n);
        CHECK(ddp_pg_allreduce(pg, d, n, DDP_F32, DDP_SUM) == 0, "allreduce sum");
        to_host(g, d, n);
        CHECK(memcmp(g, h, n * sizeof(float)) == 0, "sum over one rank is the input");
        CHECK(ddp_pg_allreduce(pg, d, n, DDP_F32, DDP_AVG) == 0, "allreduce avg");
        to_host(g, d, n);
        CHECK(memcmp(g, h, n * sizeof(float)) == 0, "avg over one rank is the input");
        CHECK(ddp_pg_broadcast(pg, d, n, DDP_F32, 0) == 0, "broadcast");
        float *d2 = dev_from(h, n);
        CHECK(ddp_pg_allgather(pg, d, d2, n, DDP_F32) == 0, "allgather");
        to_host(g, d2, n);
        CHECK(memcmp(g, h, n * sizeof(float)) == 0, "allgather of one rank is its input");
        CHECK(ddp_pg_reduce_scatter(pg, d, d2, n, DDP_F32, DDP_MAX) == 0, "reduce_scatter");
        CHECK(ddp_pg_barrier(pg) == 0, "barrier");
        struct ddp_work *w;
        CHECK(ddp_pg_allreduce_start(pg, d, n, DDP_F32, DDP_SUM, &w) == 0, "start");
        CHECK(ddp_work_wait(w) == 0, "wait");
        ddp_work_free(w);
        cudaFree(d);
        cudaFree(d2);
        free(h);
        free(g);
        ddp_pg_free(pg);
    }
    ddp_store_close(s);

    /* abort path: rank 1 never joins; rank 0 must fail within its 3 s timeout */
    if (!(s = test_store_client(&ts)))
        return 1;
    o = (struct ddp_pg_opts){.backend = DDP_PG_BACKEND_NCCL, .timeout_ms = 3000, .name = "lonely"};
    int64_t t0 = ddp_now_ms();
    r = ddp_pg_init(s, 0, 2, 0, 1, 0, &o, &pg);
    int64_t dt = ddp_now_ms() - t0;
    printf("a rank that never joins: init returned %s after %lld ms\n", ddp_strerror(r),
           (long long)dt);
    CHECK(r == DDP_ETIMEDOUT, "init with a missing rank times out (got %s)", ddp_strerror(r));
    CHECK(dt >= 2500 && dt < 10000, "within the timeout, not hanging (%lld ms)", (long long)dt);
    if (r == 0)
        ddp_pg_free(pg);
    ddp_store_close(s);

    test_store_stop(&ts);
    if (failures)
        return 1;
    printf("all NCCL checks passed\n");
    return 0;
}
