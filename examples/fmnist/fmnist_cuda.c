/*
 * ddprun-fmnist-cuda: the Fashion-MNIST trainer of ddprun-fmnist on a GPU.
 *
 * The same model, initialisation, data order and options as the host trainer, and the same
 * reducer calls; tensors live on CUDA device LOCAL_RANK, the matrix products are cuBLAS
 * calls and the rest small kernels (kernels.cu), all queued on one compute stream that the
 * host never waits for inside a step. Under ddprun it joins an NCCL process group (the job's
 * backend must be nccl) and hands each layer's gradients to the reducer the moment their
 * kernels are queued: the reducer's all-reduce of a bucket then runs on the communication
 * stream after them, while the backward of the layers below still runs.
 *
 * Not here (the host trainer has them): checkpoints and the fp16/bf16 hooks.
 */
#include "examples/fmnist/common.h"
#include "examples/fmnist/kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            die("%s: %s", #call, cudaGetErrorString(e_));                                          \
    } while (0)
#define KL(call)                                                                                   \
    do {                                                                                           \
        int e_ = (call);                                                                           \
        if (e_ != 0)                                                                               \
            die("%s: %s", #call, cudaGetErrorString((cudaError_t)e_));                             \
    } while (0)
#define CB(call)                                                                                   \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            die("%s: cuBLAS status %d", #call, (int)s_);                                           \
    } while (0)

/* The model's tensors are device pointers. W[l] is out x in, row-major: to cuBLAS
 * (column-major) it is W^T, in x out. */

struct acts {
    int cap;
    float *Z[MAX_LAYERS], *A[MAX_LAYERS + 1], *dZ, *dA, *ones;
};

struct gpu {
    cudaStream_t s;
    cublasHandle_t h;
};

static float *dalloc(size_t n)
{
    void *p = NULL;
    CK(cudaMalloc(&p, (n ? n : 1) * sizeof(float)));
    CK(cudaMemset(p, 0, (n ? n : 1) * sizeof(float)));
    CK(cudaDeviceSynchronize()); /* the legacy stream's memset, before any stream uses p */
    return p;
}

static void dfree(void *p)
{
    cudaFree(p);
}

static void from_device(void *dst, const void *src, size_t bytes)
{
    CK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

static void *upload(const void *h, size_t bytes)
{
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 1));
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static size_t wcount(const struct model *m, int l)
{
    return (size_t)m->dim[l] * (size_t)m->dim[l + 1];
}

/* The host trainer's initialisation (same seed, same values), uploaded. */
static void model_init(struct model *m, const struct cfg *c)
{
    model_shape(m, c);
    uint64_t s = (uint64_t)c->seed * 7919u + 1;
    for (int l = 0; l < m->L; l++) {
        size_t in = (size_t)m->dim[l], out = (size_t)m->dim[l + 1];
        float *w = malloc(in * out * sizeof(float));
        init_weights(&s, w, in, out);
        m->W[l] = upload(w, in * out * sizeof(float));
        free(w);
        m->b[l] = dalloc(out);
        m->gW[l] = m->own_g[2 * l] = dalloc(in * out);
        m->gb[l] = m->own_g[2 * l + 1] = dalloc(out);
        m->vW[l] = dalloc(in * out);
        m->vb[l] = dalloc(out);
    }
}

static void acts_alloc(struct acts *a, const struct model *m, int batch, cudaStream_t s)
{
    int widest = IMG;
    for (int l = 0; l <= m->L; l++)
        widest = m->dim[l] > widest ? m->dim[l] : widest;
    a->cap = batch;
    for (int l = 0; l < m->L; l++) {
        a->Z[l] = dalloc((size_t)batch * (size_t)m->dim[l + 1]);
        a->A[l + 1] = dalloc((size_t)batch * (size_t)m->dim[l + 1]);
    }
    a->dZ = dalloc((size_t)batch * (size_t)widest);
    a->dA = dalloc((size_t)batch * (size_t)widest);
    a->ones = dalloc((size_t)batch);
    KL(fmk_fill(a->ones, 1.0f, (size_t)batch, s));
}

static void forward(const struct model *m, struct acts *a, const float *x, int b, struct gpu *g)
{
    const float one = 1.0f;
    a->A[0] = (float *)x;
    for (int l = 0; l < m->L; l++) {
        int in = m->dim[l], out = m->dim[l + 1];
        /* Z (b x out) = bias rows + A (b x in) W^T; column-major: Z^T = W A^T. */
        KL(fmk_bias_rows(a->Z[l], m->b[l], b, out, g->s));
        CB(cublasSgemm(g->h, CUBLAS_OP_T, CUBLAS_OP_N, out, b, in, &one, m->W[l], in, a->A[l], in,
                       &one, a->Z[l], out));
        size_t n = (size_t)b * (size_t)out;
        if (l < m->L - 1)
            KL(fmk_relu(a->A[l + 1], a->Z[l], n, g->s));
        else
            CK(cudaMemcpyAsync(a->A[l + 1], a->Z[l], n * sizeof(float), cudaMemcpyDeviceToDevice,
                               g->s));
    }
}

/* Backward, accumulating into the gradients; each layer goes to the reducer as soon as its
 * gradient kernels are queued (bias then weight: the reverse of registration order). */
static void backward(struct model *m, struct acts *a, int b, struct ddp_reducer *red, struct gpu *g)
{
    const float one = 1.0f, zero = 0.0f;
    float *dZ = a->dZ, *dA = a->dA;
    for (int l = m->L - 1; l >= 0; l--) {
        int in = m->dim[l], out = m->dim[l + 1];
        /* gW (out x in) += dZ^T A; column-major: gW^T (in x out) += A^T dZ. */
        CB(cublasSgemm(g->h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, &one, a->A[l], in, dZ, out, &one,
                       m->gW[l], in));
        /* gb += column sums of dZ: dZ^T (out x b) times ones. */
        CB(cublasSgemv(g->h, CUBLAS_OP_N, out, b, &one, dZ, out, a->ones, 1, &one, m->gb[l], 1));
        if (red && (ddp_reducer_mark_ready(red, (size_t)(2 * l + 1)) != 0 ||
                    ddp_reducer_mark_ready(red, (size_t)(2 * l)) != 0))
            die("reducer: %s", ddp_reducer_last_error(red));
        if (l == 0)
            break;
        /* dA (b x in) = dZ W; column-major: dA^T = W^T dZ^T. */
        CB(cublasSgemm(g->h, CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, &one, m->W[l], in, dZ, out,
                       &zero, dA, in));
        KL(fmk_relu_backward(dA, a->Z[l - 1], (size_t)b * (size_t)in, g->s));
        float *t = dZ;
        dZ = dA;
        dA = t;
    }
}

static void sgd(struct model *m, float lr, float mu, struct gpu *g)
{
    for (int l = 0; l < m->L; l++) {
        size_t nw = wcount(m, l), nb = (size_t)m->dim[l + 1];
        KL(fmk_sgd(m->W[l], m->vW[l], m->gW[l], nw, lr, mu, g->s));
        KL(fmk_sgd(m->b[l], m->vb[l], m->gb[l], nb, lr, mu, g->s));
        CK(cudaMemsetAsync(m->gW[l], 0, nw * sizeof(float), g->s));
        CK(cudaMemsetAsync(m->gb[l], 0, nb * sizeof(float), g->s));
    }
}

/* Sums two doubles over the ranks (on the device: the group is an NCCL one). */
static void sum_over_ranks(struct ddp_pg *pg, double *dev2, double *host2, cudaStream_t s)
{
    if (pg && ddp_pg_allreduce(pg, dev2, 2, DDP_F64, DDP_SUM) != 0)
        die("all-reduce failed: %s", ddp_pg_last_error(pg));
    CK(cudaMemcpyAsync(host2, dev2, 2 * sizeof(double), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
}

static void evaluate(const struct model *m, struct acts *a, const float *tx, const uint8_t *ty,
                     int n, struct ddp_pg *pg, double *acc, struct gpu *g, double *loss,
                     double *accuracy)
{
    int lo = (int)((long)n * rank / world), hi = (int)((long)n * (rank + 1) / world);
    CK(cudaMemsetAsync(acc, 0, 2 * sizeof(double), g->s));
    for (int i = lo; i < hi; i += a->cap) {
        int b = hi - i < a->cap ? hi - i : a->cap;
        forward(m, a, tx + (size_t)i * IMG, b, g);
        KL(fmk_softmax_xent(a->A[m->L], ty + i, b, 0, NULL, acc, g->s));
    }
    double h[2];
    sum_over_ranks(pg, acc, h, g->s);
    *loss = h[0] / n;
    *accuracy = 100.0 * h[1] / n;
}

int main(int argc, char **argv)
{
    struct cfg c;
    prog = "ddprun-fmnist-cuda";
    parse(argc, argv, &c);
    if (c.hook != DDP_HOOK_ALLREDUCE)
        die("--hook: the compression hooks work on host buckets; ddprun-fmnist has them");
    if (c.sim_ranks)
        die("--simulate-ranks is the host trainer's reference; ddprun-fmnist has it");
    if (c.profile_graph)
        die("--profile-graph profiles the host trainer; ddprun-fmnist has it");
    if (c.pipe_nstages)
        die("--pipeline runs the host trainer's stages; ddprun-fmnist has it");
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0)
        die("no CUDA device is visible (%s); ddprun-fmnist trains on the CPU",
            ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
    const char *lr_env = getenv("LOCAL_RANK");
    int dev = lr_env ? atoi(lr_env) : 0;
    if (dev < 0 || dev >= ndev)
        die("LOCAL_RANK %d has no CUDA device (%d visible): run at most one rank per GPU", dev,
            ndev);
    CK(cudaSetDevice(dev));

    struct ddp_pg *pg = NULL;
    if (c.ddp && getenv("WORLD_SIZE")) {
        struct ddp_pg_opts po = {.backend = DDP_PG_BACKEND_NCCL};
        const char *be = getenv("DDPRUN_BACKEND");
        if (be && strcmp(be, "nccl") != 0)
            die("the job's backend is '%s'; this trainer needs backend: nccl", be);
        if (ddp_pg_init_env(&po, &pg) != 0)
            die("cannot join the NCCL process group");
        rank = ddp_pg_rank(pg);
        world = ddp_pg_world_size(pg);
    } else if (getenv("RANK") && getenv("WORLD_SIZE")) {
        rank = atoi(getenv("RANK"));
        world = atoi(getenv("WORLD_SIZE"));
        if (world < 1 || rank < 0 || rank >= world)
            die("inconsistent RANK and WORLD_SIZE");
    }
    if (c.batch < world)
        die("global batch %d is smaller than the world size %d", c.batch, world);
    if (c.ckpt_dir && rank == 0)
        fprintf(stderr, "%s: note: no checkpoints are written (ddprun-fmnist writes them)\n", prog);

    struct gpu g;
    CK(cudaStreamCreateWithFlags(&g.s, cudaStreamNonBlocking));
    CB(cublasCreate(&g.h));
    CB(cublasSetStream(g.h, g.s));
    /* Collectives (and the reducer's bucket copies) are ordered after this stream. */
    ddp_pg_set_compute_stream(pg, g.s);

    struct dataset train, test;
    load_set(c.data, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", &train);
    load_set(c.data, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", &test);
    /* the whole sets normalised on the device, as the host trainer normalises its batches */
    float *hx = malloc((size_t)train.n * IMG * sizeof(float));
    if (!hx)
        die("out of memory");
    set_rows(&train, 0, train.n, hx);
    float *dtrx = upload(hx, (size_t)train.n * IMG * sizeof(float));
    uint8_t *dtry = upload(train.y, (size_t)train.n);
    set_rows(&test, 0, test.n, hx);
    float *dtex = upload(hx, (size_t)test.n * IMG * sizeof(float));
    free(hx);
    uint8_t *dtey = upload(test.y, (size_t)test.n);
    struct model m;
    model_init(&m, &c);
    int steps_per_epoch = train.n / c.batch;
    /* The uploads and cudaMemset above ran on the legacy stream, which the non-blocking
     * compute and communication streams do not wait for. */
    CK(cudaDeviceSynchronize());

    struct ddp_reducer *red = pg ? make_reducer(pg, &m, &c) : NULL;
    size_t np = nparams(&m);
    if (rank == 0) {
        struct cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, dev));
        printf("ddprun-fmnist-cuda: %d ranks on %s, %zu parameters, global batch %d, %d steps per "
               "epoch%s\n",
               world, prop.name, np, c.batch, steps_per_epoch, red ? "" : " (no process group)");
    }

    struct acts a;
    int local_max = (c.batch + world - 1) / world;
    acts_alloc(&a, &m, local_max > 1000 ? local_max : 1000, g.s);
    int *perm = malloc((size_t)train.n * sizeof(int)), *dperm = NULL;
    CK(cudaMalloc((void **)&dperm, (size_t)train.n * sizeof(int)));
    float *xb = dalloc((size_t)local_max * IMG);
    uint8_t *yb = NULL;
    CK(cudaMalloc((void **)&yb, (size_t)local_max));
    double *acc = NULL; /* this epoch's loss sum and sample count, then the evaluation's */
    CK(cudaMalloc((void **)&acc, 4 * sizeof(double)));
    CK(cudaMemset(acc, 0, 4 * sizeof(double)));
    CK(cudaDeviceSynchronize()); /* the memset and uploads before the compute stream */
    float scale = (float)world / (float)c.batch;
    int64_t total_steps = (int64_t)c.epochs * steps_per_epoch, step = 0;
    if (c.max_steps && c.max_steps < total_steps)
        total_steps = c.max_steps;
    double *step_t = malloc((size_t)(total_steps + 1) * sizeof(double));
    long nstep_t = 0;
    double ep_n = 0, t_ep = now_s();
    int cur_epoch = -1;
    while (step < total_steps) {
        int epoch = (int)(step / steps_per_epoch), s = (int)(step % steps_per_epoch);
        if (epoch != cur_epoch) {
            shuffle(perm, train.n, (uint64_t)c.seed * 1000003u + (uint64_t)epoch);
            CK(cudaMemcpyAsync(dperm, perm, (size_t)train.n * sizeof(int), cudaMemcpyHostToDevice,
                               g.s));
            CK(cudaStreamSynchronize(g.s)); /* perm is overwritten next epoch */
            cur_epoch = epoch;
        }
        int lo = c.batch * rank / world, hi = c.batch * (rank + 1) / world, b = hi - lo;
        double t0 = now_s();
        KL(fmk_gather(xb, yb, dtrx, dtry, dperm, s * c.batch + lo, b, g.s));
        forward(&m, &a, xb, b, &g);
        KL(fmk_softmax_xent(a.A[m.L], yb, b, scale, a.dZ, acc, g.s));
        ep_n += b;
        backward(&m, &a, b, red, &g);
        if (red && ddp_reducer_finalize(red) != 0)
            die("gradient reduction failed: %s", ddp_reducer_last_error(red));
        sgd(&m, c.lr, c.momentum, &g);
        if (c.bench) /* a step's time includes its device work */
            CK(cudaStreamSynchronize(g.s));
        step_t[nstep_t++] = now_s() - t0;
        step++;
        bool epoch_end = step % steps_per_epoch == 0;
        if (epoch_end || step == total_steps) {
            double h[2];
            CK(cudaMemcpyAsync(acc + 1, &ep_n, sizeof(double), cudaMemcpyHostToDevice, g.s));
            sum_over_ranks(pg, acc, h, g.s); /* [0] loss sum, [1] samples */
            CK(cudaMemsetAsync(acc, 0, 2 * sizeof(double), g.s));
            double dt = now_s() - t_ep, tl = 0, ta = 0;
            bool eval = c.eval_every &&
                        (step == total_steps || ((epoch + 1) % c.eval_every == 0 && epoch_end));
            if (eval)
                evaluate(&m, &a, dtex, dtey, test.n, pg, acc + 2, &g, &tl, &ta);
            print_epoch(&c, epoch, step, h[0], h[1], eval, tl, ta, dt);
            ep_n = 0;
            t_ep = now_s();
        }
    }
    CK(cudaStreamSynchronize(g.s));
    if (c.bench)
        print_bench(step_t, nstep_t, red);
    int rc = dump_model(&m, &c, from_device);
    ddp_reducer_free(red);
    ddp_pg_free(pg);
    model_free(&m, dfree);
    for (int l = 0; l < m.L; l++) {
        cudaFree(a.Z[l]);
        cudaFree(a.A[l + 1]);
    }
    cudaFree(a.dZ);
    cudaFree(a.dA);
    cudaFree(a.ones);
    cudaFree(dperm);
    cudaFree(xb);
    cudaFree(yb);
    cudaFree(acc);
    cudaFree(dtrx);
    cudaFree(dtry);
    cudaFree(dtex);
    cudaFree(dtey);
    cublasDestroy(g.h);
    cudaStreamDestroy(g.s);
    free(perm);
    free(step_t);
    free_set(&train);
    free_set(&test);
    return rc;
}
