/*
 * ddprun-fmnist: a data-parallel multi-layer perceptron trained on Fashion-MNIST.
 *
 * It links libddp and OpenBLAS. Backward runs layer by layer from the output,
 * and each layer's gradients are handed to the reducer the moment they are
 * computed, so their all-reduce overlaps the backward of the layers below.
 * Data are sharded by rank from a seeded per-epoch shuffle of the whole
 * training set: with a fixed global batch, N ranks see exactly the samples one
 * process would, so the result does not depend on N (to float rounding).
 * Checkpoints are written atomically by rank 0 (temporary file, fsync, rename,
 * fsync of the directory) and resumed from on start.
 *
 * Run alone it trains as one process; under ddprun (RANK etc. set) it joins
 * the process group. See --help.
 */
#include "examples/fmnist/common.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define CKPT_MAGIC "DDPFMN01"

/* ---- model ---- */

/* The gradients in the group's registered memory (zeroed; calloc'd without a group or arena):
 * the reducer without bucket view all-reduces them where they lie, single-copy on one node. */
static void model_init(struct model *m, const struct cfg *c, struct ddp_pg *pg)
{
    model_shape(m, c);
    uint64_t s = (uint64_t)c->seed * 7919u + 1;
    for (int l = 0; l < m->L; l++) {
        size_t in = (size_t)m->dim[l], out = (size_t)m->dim[l + 1];
        m->W[l] = malloc(in * out * sizeof(float));
        m->b[l] = calloc(out, sizeof(float));
        m->gW[l] = m->own_g[2 * l] = ddp_pg_mem_alloc(pg, in * out * sizeof(float));
        m->gb[l] = m->own_g[2 * l + 1] = ddp_pg_mem_alloc(pg, out * sizeof(float));
        m->vW[l] = calloc(in * out, sizeof(float));
        m->vb[l] = calloc(out, sizeof(float));
        init_weights(&s, m->W[l], in, out);
    }
}

/* The gradients model_init allocated, before the group that may hold them goes. */
static void grads_free(struct model *m, struct ddp_pg *pg)
{
    for (int k = 0; k < 2 * m->L; k++) {
        ddp_pg_mem_free(pg, m->own_g[k]);
        m->own_g[k] = NULL;
    }
}

/* Every parameter tensor with its momentum, in registration order (W1, b1, W2, ...). */
struct tensor {
    float *p, *v;
    size_t n;
};

static int tensors(const struct model *m, struct tensor *t)
{
    for (int l = 0; l < m->L; l++) {
        t[2 * l] = (struct tensor){m->W[l], m->vW[l], (size_t)m->dim[l] * (size_t)m->dim[l + 1]};
        t[2 * l + 1] = (struct tensor){m->b[l], m->vb[l], (size_t)m->dim[l + 1]};
    }
    return 2 * m->L;
}

/* Activations for a batch: A[0] = input, A[l+1] = layer l's output (pre-ReLU kept in Z). */
struct acts {
    int cap;
    float *Z[MAX_LAYERS], *A[MAX_LAYERS + 1], *dZ, *dA;
};

static void acts_alloc(struct acts *a, const struct model *m, int batch)
{
    int widest = IMG;
    for (int l = 0; l <= m->L; l++)
        widest = m->dim[l] > widest ? m->dim[l] : widest;
    a->cap = batch;
    for (int l = 0; l < m->L; l++) {
        a->Z[l] = malloc((size_t)batch * (size_t)m->dim[l + 1] * sizeof(float));
        a->A[l + 1] = malloc((size_t)batch * (size_t)m->dim[l + 1] * sizeof(float));
    }
    a->dZ = malloc((size_t)batch * (size_t)widest * sizeof(float));
    a->dA = malloc((size_t)batch * (size_t)widest * sizeof(float));
}

/* Layer l's forward: Z = A[l] W^T + b, A[l+1] = ReLU(Z) (the logits for the last layer). */
static void forward_layer(const struct model *m, struct acts *a, int l, int b)
{
    int in = m->dim[l], out = m->dim[l + 1];
    float *Z = a->Z[l];
    for (int i = 0; i < b; i++)
        memcpy(Z + (size_t)i * (size_t)out, m->b[l], (size_t)out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, out, in, 1.0f, a->A[l], in, m->W[l], in,
                1.0f, Z, out);
    float *A = a->A[l + 1];
    size_t n = (size_t)b * (size_t)out;
    if (l < m->L - 1)
        for (size_t i = 0; i < n; i++)
            A[i] = Z[i] > 0 ? Z[i] : 0;
    else
        memcpy(A, Z, n * sizeof(float));
}

static void forward(const struct model *m, struct acts *a, const float *x, int b)
{
    a->A[0] = (float *)x;
    for (int l = 0; l < m->L; l++)
        forward_layer(m, a, l, b);
}

/* Softmax cross-entropy of the logits in A[L] (see softmax_xent). */
static double loss_grad(const struct model *m, struct acts *a, const uint8_t *y, int b, float scale,
                        float *dZ, long *correct)
{
    return softmax_xent(a->A[m->L], y, b, scale, dZ, correct);
}

/* Layer l's backward from *dZ (its output's gradient): accumulates its weight and bias
 * gradients, and for l > 0 leaves the gradient of layer l-1's output in *dZ (swapping the two
 * buffers). */
static void backward_layer(struct model *m, struct acts *a, int l, int b, float **dZp, float **dAp)
{
    float *dZ = *dZp, *dA = *dAp;
    int in = m->dim[l], out = m->dim[l + 1];
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, b, 1.0f, dZ, out, a->A[l], in,
                1.0f, m->gW[l], in);
    for (int i = 0; i < b; i++)
        for (int k = 0; k < out; k++)
            m->gb[l][k] += dZ[(size_t)i * (size_t)out + (size_t)k];
    if (l == 0)
        return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, in, out, 1.0f, dZ, out, m->W[l], in,
                0.0f, dA, in);
    const float *Zp = a->Z[l - 1];
    for (size_t i = 0; i < (size_t)b * (size_t)in; i++)
        dA[i] = Zp[i] > 0 ? dA[i] : 0;
    *dZp = dA;
    *dAp = dZ;
}

/* Backward, accumulating into the gradients, handing each layer to the reducer as soon as
 * its gradients are complete (bias then weight: the reverse of registration order). */
static void backward(struct model *m, struct acts *a, int b, struct ddp_reducer *red)
{
    float *dZ = a->dZ, *dA = a->dA;
    for (int l = m->L - 1; l >= 0; l--) {
        backward_layer(m, a, l, b, &dZ, &dA);
        if (red && (ddp_reducer_mark_ready(red, (size_t)(2 * l + 1)) != 0 ||
                    ddp_reducer_mark_ready(red, (size_t)(2 * l)) != 0))
            die("reducer: %s", ddp_reducer_last_error(red));
    }
}

/*
 * --profile-graph FILE: PipeDream's graph.txt of this model at a minibatch of --batch samples
 * (its planner's input: ddprun pipeline plan FILE): an Input node, then a node per layer with
 * the median of 20 timed forward and backward passes (after 3 untimed ones; the loss goes with
 * the last layer's forward), its output's bytes and its parameters' bytes (float32), in a chain.
 */
static void profile_graph(struct model *m, const struct dataset *train, const struct cfg *c)
{
    enum { WARM = 3, REPS = 20 };
    int b = c->batch < train->n ? c->batch : train->n;
    struct acts a;
    acts_alloc(&a, m, b);
    double *t = malloc(sizeof(double) * 2 * MAX_LAYERS * REPS);
    float *x = malloc((size_t)b * IMG * sizeof(float));
    if (!t || !x)
        die("out of memory");
    set_rows(train, 0, b, x);
    for (int r = 0; r < WARM + REPS; r++) {
        a.A[0] = x;
        for (int l = 0; l < m->L; l++) {
            double t0 = now_s();
            forward_layer(m, &a, l, b);
            if (l == m->L - 1)
                loss_grad(m, &a, train->y, b, 1.0f / (float)b, a.dZ, NULL);
            if (r >= WARM)
                t[(2 * l) * REPS + r - WARM] = now_s() - t0;
        }
        float *dZ = a.dZ, *dA = a.dA;
        for (int l = m->L - 1; l >= 0; l--) {
            double t0 = now_s();
            backward_layer(m, &a, l, b, &dZ, &dA);
            if (r >= WARM)
                t[(2 * l + 1) * REPS + r - WARM] = now_s() - t0;
        }
        for (int l = 0; l < m->L; l++) {
            memset(m->gW[l], 0, (size_t)m->dim[l] * (size_t)m->dim[l + 1] * sizeof(float));
            memset(m->gb[l], 0, (size_t)m->dim[l + 1] * sizeof(float));
        }
    }
    FILE *f = fopen(c->profile_graph, "w");
    if (!f)
        die("cannot write %s: %s", c->profile_graph, strerror(errno));
    fprintf(f,
            "node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
            "activation_size=%.1f, parameter_size=0.000\n",
            (double)b * IMG * sizeof(float));
    for (int l = 0; l < m->L; l++) {
        for (int k = 0; k < 2; k++)
            qsort(t + (2 * l + k) * REPS, REPS, sizeof(double), cmp_double);
        int in = m->dim[l], out = m->dim[l + 1];
        fprintf(f,
                "node%d -- Linear(in_features=%d, out_features=%d)%s -- forward_compute_time=%.3f, "
                "backward_compute_time=%.3f, activation_size=%.1f, parameter_size=%.3f\n",
                l + 2, in, out, l < m->L - 1 ? "+ReLU" : "+CrossEntropyLoss",
                t[(2 * l) * REPS + REPS / 2] * 1e3, t[(2 * l + 1) * REPS + REPS / 2] * 1e3,
                (double)b * out * sizeof(float), ((double)in * out + out) * sizeof(float));
    }
    for (int l = 0; l < m->L; l++)
        fprintf(f, "\tnode%d -- node%d\n", l + 1, l + 2);
    if (fclose(f) != 0)
        die("cannot write %s: %s", c->profile_graph, strerror(errno));
    printf("ddprun-fmnist: wrote %s: %d layers at a minibatch of %d\n", c->profile_graph, m->L, b);
    free(t);
    free(x);
    for (int l = 0; l < m->L; l++) {
        free(a.Z[l]);
        free(a.A[l + 1]);
    }
    free(a.dZ);
    free(a.dA);
}

/*
 * --simulate-ranks: the gradients of one step as nsh ranks on one node compute them, each on
 * its shard, then averaged the way libddp's shared-memory all-reduce does it (rank 0's
 * gradient, plus rank 1's, plus rank 2's ..., in that order, then divided by (float)nsh).
 * The arithmetic is the data-parallel run's, operation for operation, so its parameters must
 * equal this run's bit for bit; a tolerance could hide a real difference or fail on a CPU
 * whose rounding sends the two runs apart (a ReLU that flips grows into a visible change).
 */
struct sim {
    int n;
    float *gW[MAX_LAYERS], *gb[MAX_LAYERS]; /* ranks 1..n-1 in turn */
};

static void sim_alloc(struct sim *sm, const struct model *m, int n)
{
    sm->n = n;
    for (int l = 0; l < m->L && n > 1; l++) {
        sm->gW[l] = calloc((size_t)m->dim[l] * (size_t)m->dim[l + 1], sizeof(float));
        sm->gb[l] = calloc((size_t)m->dim[l + 1], sizeof(float));
        if (!sm->gW[l] || !sm->gb[l])
            die("out of memory");
    }
}

static void sim_free(struct sim *sm, const struct model *m)
{
    for (int l = 0; l < m->L && sm->n > 1; l++) {
        free(sm->gW[l]);
        free(sm->gb[l]);
    }
}

/* Points the model's gradients at the scratch buffers (zeroed) or back at its own. */
static void sim_swap(struct sim *sm, struct model *m)
{
    for (int l = 0; l < m->L; l++) {
        float *t = m->gW[l];
        m->gW[l] = sm->gW[l];
        sm->gW[l] = t;
        t = m->gb[l];
        m->gb[l] = sm->gb[l];
        sm->gb[l] = t;
    }
}

/* After rank r's gradients are in the scratch buffers: the model's += them, scratch zeroed. */
static void sim_add(struct sim *sm, struct model *m)
{
    for (int l = 0; l < m->L; l++) {
        size_t nw = (size_t)m->dim[l] * (size_t)m->dim[l + 1], nb = (size_t)m->dim[l + 1];
        for (size_t i = 0; i < nw; i++)
            m->gW[l][i] += sm->gW[l][i];
        for (size_t i = 0; i < nb; i++)
            m->gb[l][i] += sm->gb[l][i];
        memset(sm->gW[l], 0, nw * sizeof(float));
        memset(sm->gb[l], 0, nb * sizeof(float));
    }
}

static void sim_average(struct sim *sm, struct model *m)
{
    for (int l = 0; l < m->L && sm->n > 1; l++) {
        size_t nw = (size_t)m->dim[l] * (size_t)m->dim[l + 1], nb = (size_t)m->dim[l + 1];
        for (size_t i = 0; i < nw; i++)
            m->gW[l][i] /= (float)sm->n;
        for (size_t i = 0; i < nb; i++)
            m->gb[l][i] /= (float)sm->n;
    }
}

static void sgd(struct model *m, float lr, float mu)
{
    for (int l = 0; l < m->L; l++) {
        size_t nw = (size_t)m->dim[l] * (size_t)m->dim[l + 1], nb = (size_t)m->dim[l + 1];
        for (size_t i = 0; i < nw; i++) {
            m->vW[l][i] = mu * m->vW[l][i] + m->gW[l][i];
            m->W[l][i] -= lr * m->vW[l][i];
        }
        for (size_t i = 0; i < nb; i++) {
            m->vb[l][i] = mu * m->vb[l][i] + m->gb[l][i];
            m->b[l][i] -= lr * m->vb[l][i];
        }
        memset(m->gW[l], 0, nw * sizeof(float));
        memset(m->gb[l], 0, nb * sizeof(float));
    }
}

/* --bench-paired: one step of this rank's shard without the reducer; its seconds, and in
 * fb and opt those of its forward+backward and of its optimizer step. */
static double compute_only(struct model *m, struct acts *a, const float *xb, const uint8_t *yb,
                           int b, float scale, const struct cfg *c, double *fb, double *opt)
{
    double p0 = now_s();
    forward(m, a, xb, b);
    loss_grad(m, a, yb, b, scale, a->dZ, NULL);
    backward(m, a, b, NULL);
    double p1 = now_s();
    sgd(m, c->lr, c->momentum);
    double p2 = now_s();
    *fb = p1 - p0;
    *opt = p2 - p1;
    return p2 - p0;
}

/* --bench-paired: where the reducer's step spends its time beside the compute-only step's
 * (medians over the same steps): forward+backward, finalize (the all-reduce, beside the bare
 * one) and the optimizer. */
static void print_paired_phases(double *const phase_t[3], double *const co_t[2], long n)
{
    if (rank != 0 || n <= 0)
        return;
    long used;
    double f = median_ms(phase_t[0], n, &used), w = median_ms(phase_t[1], n, &used),
           o = median_ms(phase_t[2], n, &used), cf = median_ms(co_t[0], n, &used),
           co = median_ms(co_t[1], n, &used);
    printf("bench: paired phases (medians): the reducer's step forward+backward %.3f ms, finalize "
           "%.3f ms, optimizer %.3f ms; the compute-only step forward+backward %.3f ms, optimizer "
           "%.3f ms\n",
           f, w, o, cf, co);
}

/* ---- checkpoints: written atomically by rank 0, read by rank 0 and broadcast ---- */

struct ckpt_head {
    char magic[8];
    uint32_t L, dim[MAX_LAYERS + 1];
    int64_t step; /* global steps done */
    uint32_t batch;
};

static int write_all(int fd, const void *p, size_t n, uLong *crc)
{
    const char *c = p;
    *crc = crc32(*crc, p, (uInt)n);
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static void ckpt_save(const struct model *m, const char *dir, int64_t step, int batch)
{
    char tmp[4096], fin[4096];
    snprintf(fin, sizeof(fin), "%s/fmnist.ckpt", dir);
    snprintf(tmp, sizeof(tmp), "%s/.fmnist.ckpt.tmp.%d", dir, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        die("cannot write checkpoint %s: %s", tmp, strerror(errno));
    struct ckpt_head h = {.L = (uint32_t)m->L, .step = step, .batch = (uint32_t)batch};
    memcpy(h.magic, CKPT_MAGIC, 8);
    for (int l = 0; l <= m->L; l++)
        h.dim[l] = (uint32_t)m->dim[l];
    uLong crc = crc32(0, Z_NULL, 0);
    int bad = write_all(fd, &h, sizeof(h), &crc);
    const char *crash = getenv("FMNIST_CRASH_AT_STEP"); /* tests: die in the middle of a write */
    struct tensor t[2 * MAX_LAYERS];
    for (int k = 0, nt = tensors(m, t); k < nt; k++) {
        bad |= write_all(fd, t[k].p, t[k].n * sizeof(float), &crc);
        if (crash && atoll(crash) == step)
            _exit(9);
        bad |= write_all(fd, t[k].v, t[k].n * sizeof(float), &crc);
    }
    uint32_t c32 = (uint32_t)crc;
    uLong dummy = 0;
    bad |= write_all(fd, &c32, sizeof(c32), &dummy);
    if (bad || fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        die("cannot write checkpoint %s: %s", tmp, strerror(errno));
    }
    if (rename(tmp, fin) != 0)
        die("cannot rename %s to %s: %s", tmp, fin, strerror(errno));
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

/* Returns the step to resume from (0 when there is no checkpoint). A file that is not a
 * complete checkpoint of this model is refused, loudly: never resumed from. */
static int64_t ckpt_load(struct model *m, const char *dir, int batch)
{
    char fin[4096];
    snprintf(fin, sizeof(fin), "%s/fmnist.ckpt", dir);
    FILE *f = fopen(fin, "rb");
    if (!f) {
        if (errno == ENOENT)
            return 0;
        die("cannot read checkpoint %s: %s", fin, strerror(errno));
    }
    struct ckpt_head h;
    uLong crc = crc32(0, Z_NULL, 0);
    if (fread(&h, sizeof(h), 1, f) != 1 || memcmp(h.magic, CKPT_MAGIC, 8) != 0)
        die("%s is not a checkpoint of this trainer", fin);
    if (h.L != (uint32_t)m->L || h.batch != (uint32_t)batch)
        die("%s was written for another model or global batch size", fin);
    for (int l = 0; l <= m->L; l++)
        if (h.dim[l] != (uint32_t)m->dim[l])
            die("%s was written for another model (layer sizes differ)", fin);
    crc = crc32(crc, (const Bytef *)&h, sizeof(h));
    struct tensor t[2 * MAX_LAYERS];
    for (int k = 0, nt = tensors(m, t); k < nt; k++) {
        if (fread(t[k].p, sizeof(float), t[k].n, f) != t[k].n ||
            fread(t[k].v, sizeof(float), t[k].n, f) != t[k].n)
            die("%s is truncated", fin);
        crc = crc32(crc, (const Bytef *)t[k].p, (uInt)(t[k].n * sizeof(float)));
        crc = crc32(crc, (const Bytef *)t[k].v, (uInt)(t[k].n * sizeof(float)));
    }
    uint32_t c32;
    if (fread(&c32, sizeof(c32), 1, f) != 1 || c32 != (uint32_t)crc)
        die("%s is corrupt (checksum mismatch); refusing to resume from it", fin);
    fclose(f);
    return h.step;
}

static void host_copy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

/* ---- evaluation: test set sharded by rank, counts summed ---- */

static void evaluate(const struct model *m, struct acts *a, const struct dataset *t,
                     struct ddp_pg *pg, double *loss, double *acc)
{
    int lo = (int)((long)t->n * rank / world), hi = (int)((long)t->n * (rank + 1) / world);
    double sums[2] = {0, 0}; /* loss, correct */
    float *x = malloc((size_t)a->cap * IMG * sizeof(float));
    if (!x)
        die("out of memory");
    for (int i = lo; i < hi; i += a->cap) {
        int b = hi - i < a->cap ? hi - i : a->cap;
        long correct = 0;
        set_rows(t, i, b, x);
        forward(m, a, x, b);
        sums[0] += loss_grad(m, a, t->y + i, b, 0, NULL, &correct);
        sums[1] += (double)correct;
    }
    free(x);
    if (pg && ddp_pg_allreduce(pg, sums, 2, DDP_F64, DDP_SUM) != 0)
        die("evaluation all-reduce failed: %s", ddp_pg_last_error(pg));
    *loss = sums[0] / t->n;
    *acc = 100.0 * sums[1] / t->n;
}

int main(int argc, char **argv)
{
    struct cfg c;
    parse(argc, argv, &c);
    openblas_set_num_threads(1); /* one core per rank: ranks share the node */
    struct ddp_pg *pg = NULL;
    if (c.pipe_nstages && !getenv("WORLD_SIZE"))
        die("--pipeline runs under ddprun (one rank per stage replica)");
    if (c.ddp && getenv("WORLD_SIZE") && !c.pipe_nstages) {
        if (ddp_pg_init_env(NULL, &pg) != 0)
            die("cannot join the process group");
        if (ddp_pg_is_cuda(pg))
            die("this trainer keeps its tensors in host memory; the job's backend must be cpu");
        rank = ddp_pg_rank(pg);
        world = ddp_pg_world_size(pg);
    } else if (getenv("RANK") && getenv("WORLD_SIZE")) {
        /* --no-ddp under a launcher: the same shard of each batch as with the process group,
         * with no communication at all (the compute-only baseline of the benchmark) */
        rank = atoi(getenv("RANK"));
        world = atoi(getenv("WORLD_SIZE"));
        if (world < 1 || rank < 0 || rank >= world)
            die("inconsistent RANK and WORLD_SIZE");
    }
    if (c.batch < world)
        die("global batch %d is smaller than the world size %d", c.batch, world);

    struct dataset train, test;
    load_set(c.data, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", &train);
    load_set(c.data, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", &test);
    if (c.pipe_nstages) {
        int rc = train_pipeline(&c, &train, &test);
        free_set(&train);
        free_set(&test);
        return rc;
    }
    struct model m;
    model_init(&m, &c, pg);
    if (c.profile_graph) {
        profile_graph(&m, &train, &c);
        grads_free(&m, pg);
        model_free(&m, free);
        free_set(&train);
        free_set(&test);
        return 0;
    }
    int steps_per_epoch = train.n / c.batch;
    int64_t step = 0;
    if (c.ckpt_dir && rank == 0) {
        if (mkdir(c.ckpt_dir, 0755) != 0 && errno != EEXIST)
            die("cannot create %s: %s", c.ckpt_dir, strerror(errno));
        step = ckpt_load(&m, c.ckpt_dir, c.batch);
        if (step)
            printf("resuming from %s/fmnist.ckpt at step %lld (epoch %lld, sample %lld)\n",
                   c.ckpt_dir, (long long)step, (long long)(step / steps_per_epoch + 1),
                   (long long)(step % steps_per_epoch * c.batch));
    }

    /* The reducer: parameters registered in forward order; rank 0's values (fresh or
     * resumed) go to every rank. The momentum and the position follow. */
    struct ddp_reducer *red = NULL, *red_copy = NULL;
    /* --bench-view-copy: mc shares m's weights and momentum but keeps the gradient buffers
     * this process allocated, for the copy-mode reducer, made first; m's gradients then move
     * into the bucket-view reducer's buckets. Odd steps train through mc and red_copy. */
    struct model mc = m;
    if (pg && c.view_copy) {
        if (c.paired || c.sim_ranks || c.hook != DDP_HOOK_ALLREDUCE)
            die("--bench-view-copy runs alone (no --bench-paired, --simulate-ranks or --hook)");
        struct cfg cc = c;
        cc.view = false;
        red_copy = make_reducer(pg, &mc, &cc);
        c.view = true;
    }
    if (pg) {
        red = make_reducer(pg, &m, &c);
        int rc = ddp_pg_broadcast(pg, &step, 1, DDP_I64, 0);
        struct tensor t[2 * MAX_LAYERS];
        for (int k = 0, nt = tensors(&m, t); k < nt; k++)
            rc |= ddp_pg_broadcast(pg, t[k].v, t[k].n, DDP_F32, 0);
        if (rc)
            die("broadcasting the resume state failed: %s", ddp_pg_last_error(pg));
        /* Elastic jobs: ddprun logs where this restart picked up. */
        if (rank == 0)
            ddp_pg_report_resume(pg, step);
    }
    if (rank == 0)
        printf("ddprun-fmnist: %d ranks, %zu parameters, global batch %d, %d steps per epoch%s\n",
               world, nparams(&m), c.batch, steps_per_epoch,
               red ? "" : (pg ? "" : " (no process group)"));

    /* The shards this process computes each step: its own, or with --simulate-ranks all of
     * them (shard r of nsh in turn). */
    int nsh = c.sim_ranks ? c.sim_ranks : world;
    int r_first = c.sim_ranks ? 0 : rank, r_last = c.sim_ranks ? nsh : rank + 1;
    if (c.batch < nsh)
        die("global batch %d is smaller than the number of ranks %d", c.batch, nsh);
    struct sim sm;
    sim_alloc(&sm, &m, c.sim_ranks);
    if (c.sim_ranks && rank == 0)
        printf("ddprun-fmnist: simulating %d ranks in one process\n", nsh);

    struct acts a;
    int local_max = (c.batch + nsh - 1) / nsh;
    acts_alloc(&a, &m, local_max > 1000 ? local_max : 1000);
    int *perm = malloc((size_t)train.n * sizeof(int));
    float *xb = malloc((size_t)local_max * IMG * sizeof(float));
    uint8_t *yb = malloc((size_t)local_max);
    /* Local gradients are sum/B*N, so that the average over ranks is the global batch mean. */
    float scale = (float)nsh / (float)c.batch;
    int64_t total_steps = (int64_t)c.epochs * steps_per_epoch;
    if (c.max_steps && c.max_steps < total_steps)
        total_steps = c.max_steps;
    double *step_t = malloc((size_t)(total_steps + 1) * sizeof(double));
    /* forward+backward, finalize, optimizer: where a step's time goes (--bench) */
    double *phase_t[3];
    for (int k = 0; k < 3; k++)
        phase_t[k] = malloc((size_t)(total_steps + 1) * sizeof(double));
    /* --bench-paired: compute-only steps and bare all-reduces beside the steps */
    /* compute-only, bare all-reduce, skew, how long after this rank's the last rank's
     * gradients were ready (one node only: the ranks share CLOCK_MONOTONIC); and the
     * compute-only step's forward+backward and optimizer, to set beside phase_t's */
    double *paired_t[4] = {NULL, NULL, NULL, NULL}, *co_t[2] = {NULL, NULL};
    float *flat = NULL;
    if (c.paired) {
        if (!red || c.sim_ranks)
            die("--bench-paired measures the reducer: it needs a process group (no --no-ddp, "
                "no --simulate-ranks)");
        for (int k = 0; k < 4; k++)
            paired_t[k] = calloc((size_t)(total_steps + 1), sizeof(double));
        for (int k = 0; k < 2; k++)
            co_t[k] = calloc((size_t)(total_steps + 1), sizeof(double));
        /* the bare all-reduce's buffer registered as the buckets and gradients are: the
         * fastest all-reduce of those bytes the group has (single-copy on one node) */
        flat = ddp_pg_mem_alloc(pg, nparams(&m) * sizeof(float));
        if (!paired_t[0] || !paired_t[1] || !paired_t[2] || !paired_t[3] || !co_t[0] || !co_t[1] ||
            !flat)
            die("out of memory");
    }
    long nstep_t = 0;
    double ep_loss = 0, ep_n = 0, t_ep = now_s();
    int cur_epoch = -1;
    while (step < total_steps) {
        int epoch = (int)(step / steps_per_epoch), s = (int)(step % steps_per_epoch);
        if (epoch != cur_epoch) {
            shuffle(perm, train.n, (uint64_t)c.seed * 1000003u + (uint64_t)epoch);
            cur_epoch = epoch;
        }
        /* --bench-paired: on odd steps the compute-only step runs first (on the previous
         * step's batch, the same size), so each of the pair follows the other's optimizer
         * step as often as it follows the bare all-reduce, which evicts the weights: always
         * after the all-reduce, the reducer's forward+backward took 0-2.4 ms longer (median 0.3).
         * A barrier then starts the step with the ranks together, as the all-reduce does. */
        int pb = c.batch * (rank + 1) / nsh - c.batch * rank / nsh;
        bool pair_first = c.paired && (nstep_t & 1);
        if (pair_first) {
            paired_t[0][nstep_t] =
                compute_only(&m, &a, xb, yb, pb, scale, &c, &co_t[0][nstep_t], &co_t[1][nstep_t]);
            if (ddp_pg_barrier(pg) != 0)
                die("barrier failed: %s", ddp_pg_last_error(pg));
        }
        bool copy_step = red_copy && (nstep_t & 1);
        struct model *cur = copy_step ? &mc : &m;
        struct ddp_reducer *cur_red = copy_step ? red_copy : red;
        double t0 = now_s();
        for (int r = r_first; r < r_last; r++) {
            int lo = c.batch * r / nsh, hi = c.batch * (r + 1) / nsh, b = hi - lo;
            for (int i = 0; i < b; i++) {
                int idx = perm[s * c.batch + lo + i];
                set_rows(&train, idx, 1, xb + (size_t)i * IMG);
                yb[i] = train.y[idx];
            }
            if (r > r_first)
                sim_swap(&sm, &m);
            forward(&m, &a, xb, b);
            ep_loss += loss_grad(&m, &a, yb, b, scale, a.dZ, NULL);
            ep_n += b;
            backward(cur, &a, b, cur_red);
            if (r > r_first) {
                sim_swap(&sm, &m);
                sim_add(&sm, &m);
            }
        }
        sim_average(&sm, &m);
        double t1 = now_s();
        if (cur_red && ddp_reducer_finalize(cur_red) != 0)
            die("gradient reduction failed: %s", ddp_reducer_last_error(cur_red));
        double t2 = now_s();
        sgd(cur, c.lr, c.momentum);
        phase_t[0][nstep_t] = t1 - t0;
        phase_t[1][nstep_t] = t2 - t1;
        phase_t[2][nstep_t] = now_s() - t2;
        step_t[nstep_t] = now_s() - t0;
        if (c.paired) {
            /* the same shard again without the reducer (even steps); then the bare
             * all-reduce */
            if (!pair_first)
                paired_t[0][nstep_t] = compute_only(&m, &a, xb, yb, pb, scale, &c,
                                                    &co_t[0][nstep_t], &co_t[1][nstep_t]);
            paired_t[1][nstep_t] =
                bench_bare_allreduce(pg, flat, nparams(&m), &paired_t[2][nstep_t]);
            /* no all-reduce of this step could end before the last rank's gradients existed */
            double last = t1;
            if (ddp_pg_local_world_size(pg) == world &&
                ddp_pg_allreduce(pg, &last, 1, DDP_F64, DDP_MAX) != 0)
                die("all-reduce failed: %s", ddp_pg_last_error(pg));
            paired_t[3][nstep_t] = last - t1;
        }
        nstep_t++;
        step++;
        bool epoch_end = step % steps_per_epoch == 0;
        if (c.ckpt_dir && (epoch_end || (c.ckpt_every && step % c.ckpt_every == 0)) && rank == 0)
            ckpt_save(&m, c.ckpt_dir, step, c.batch);
        if (epoch_end || step == total_steps) {
            double sums[2] = {ep_loss, ep_n};
            if (pg && ddp_pg_allreduce(pg, sums, 2, DDP_F64, DDP_SUM) != 0)
                die("all-reduce failed: %s", ddp_pg_last_error(pg));
            double dt = now_s() - t_ep, tl = 0, ta = 0;
            bool eval = c.eval_every &&
                        (step == total_steps || ((epoch + 1) % c.eval_every == 0 && epoch_end));
            if (eval)
                evaluate(&m, &a, &test, pg, &tl, &ta);
            print_epoch(&c, epoch, step, sums[0], sums[1], eval, tl, ta, dt);
            ep_loss = ep_n = 0;
            t_ep = now_s();
        }
    }
    if (paired_t[0]) { /* first: the medians below sort step_t in place */
        print_paired(step_t, paired_t, nstep_t, nparams(&m) * sizeof(float),
                     ddp_pg_local_world_size(pg) == world);
        print_paired_phases(phase_t, co_t, nstep_t);
    }
    if (red_copy)
        print_view_copy(step_t, phase_t, nstep_t);
    if (c.bench) {
        print_bench(step_t, nstep_t, red);
        print_phases(phase_t, nstep_t);
    }
    for (int k = 0; k < 3; k++)
        free(phase_t[k]);
    for (int k = 0; k < 4; k++)
        free(paired_t[k]);
    for (int k = 0; k < 2; k++)
        free(co_t[k]);
    ddp_pg_mem_free(pg, flat);
    int rc = dump_model(&m, &c, host_copy);
    ddp_reducer_free(red);
    ddp_reducer_free(red_copy);
    grads_free(&m, pg);
    ddp_pg_free(pg);
    sim_free(&sm, &m);
    model_free(&m, free);
    for (int l = 0; l < m.L; l++) {
        free(a.Z[l]);
        free(a.A[l + 1]);
    }
    free(a.dZ);
    free(a.dA);
    free(perm);
    free(xb);
    free(yb);
    free(step_t);
    free_set(&train);
    free_set(&test);
    return rc;
}
