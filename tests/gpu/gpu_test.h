/*
 * What the GPU tests share: CHECK (count a failure, go on), the skip when no CUDA device is
 * visible (exit 77, which ctest reports as skipped) and a store server on a thread, for
 * process groups formed inside the test process.
 */
#ifndef DDP_TESTS_GPU_GPU_TEST_H
#define DDP_TESTS_GPU_GPU_TEST_H

#include "rendezvous/store.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SKIP 77

static int failures;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* Exits 77 with the reason when no CUDA device is visible; else prints device 0's name. */
static inline void gpu_or_skip(void)
{
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (%s): the GPU tests need a GPU\n",
               ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        exit(SKIP);
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("device 0: %s, %d device(s)\n", prop.name, ndev);
}

struct test_store {
    struct ddp_store_server *srv;
    pthread_t th;
    char tok[DDP_STORE_TOKEN_HEX + 1];
};

static inline void *test_store_serve(void *srv)
{
    ddp_store_server_run(srv);
    return NULL;
}

/* Starts a store on 127.0.0.1 (exits 1 if it cannot). */
static inline void test_store_start(struct test_store *t)
{
    ddp_store_token_generate(t->tok);
    struct ddp_store_server_opts so = {
        .host = "127.0.0.1", .port = 0, .token = t->tok, .token_len = strlen(t->tok)};
    if (ddp_store_server_new(&so, &t->srv) < 0 ||
        pthread_create(&t->th, NULL, test_store_serve, t->srv) != 0) {
        fprintf(stderr, "cannot start a store\n");
        exit(1);
    }
}

/* A client of it, or NULL. */
static inline struct ddp_store *test_store_client(struct test_store *t)
{
    struct ddp_store *s = NULL;
    if (ddp_store_connect("127.0.0.1", ddp_store_server_port(t->srv), t->tok, strlen(t->tok), 5000,
                          &s) < 0)
        return NULL;
    return s;
}

static inline void test_store_stop(struct test_store *t)
{
    ddp_store_server_stop(t->srv);
    pthread_join(t->th, NULL);
    ddp_store_server_free(t->srv);
}

#endif
