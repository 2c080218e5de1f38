/*
 * ddprun-fmnist --pipeline SPLIT: the same MLP trained as a pipeline (libddp's stage runtime,
 * ddp_pipe(3)): stage s holds SPLIT[s] consecutive layers, on --replicas R[s] ranks (stage 0's
 * first). 1F1B: every minibatch of --batch samples is one update of each stage (PipeDream);
 * flush: every --batch is cut into --microbatches minibatches whose mean gradient is one update,
 * which is sequential training on --batch (the trainer without --pipeline, to float rounding).
 * The same initial weights, shuffle and SGD with momentum as the data-parallel trainer. After
 * each epoch every stage's first replica sends its weights to rank 0, which evaluates the model
 * on the test set.
 */
#include "examples/fmnist/common.h"

#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAG_WEIGHTS 0xFFFF0000u /* above any minibatch's tags */

struct pstage {
    const struct cfg *c;
    const struct dataset *train;
    struct model m;             /* the whole model's shape */
    int s, l0, l1;              /* this stage and its layers [l0, l1) */
    size_t off[MAX_LAYERS + 1]; /* layer l's W at off[l] of the flat weights, b after it */
    size_t nw;
    float *w, *v; /* weights, momentum */
    int u, M;     /* samples per minibatch, minibatches per --batch */
    int steps_per_epoch;
    int nslots;
    float **Z, **A; /* per slot and layer: Z[slot * L + l], A[slot * (L + 1) + l] */
    float *dZ, *dA; /* scratch */
    int *perm, perm_epoch;
    uint8_t *y;
    double loss, seen;
};

static size_t layer_w(const struct model *m, int l)
{
    return (size_t)m->dim[l] * (size_t)m->dim[l + 1];
}

/* The samples of minibatch mb: its step's --batch from the epoch's shuffle, part mb % M. */
static const int *samples_of(struct pstage *p, int64_t mb)
{
    int64_t step = mb / p->M;
    int epoch = (int)(step / p->steps_per_epoch), s = (int)(step % p->steps_per_epoch);
    if (epoch != p->perm_epoch) {
        shuffle(p->perm, p->train->n, (uint64_t)p->c->seed * 1000003u + (uint64_t)epoch);
        p->perm_epoch = epoch;
    }
    return p->perm + (size_t)s * (size_t)p->c->batch + (size_t)(mb % p->M) * (size_t)p->u;
}

static void layer_fwd(const struct model *m, const float *w, int l, const float *A, float *Z,
                      float *An, int b)
{
    int in = m->dim[l], out = m->dim[l + 1];
    const float *W = w, *bias = w + layer_w(m, l);
    for (int i = 0; i < b; i++)
        memcpy(Z + (size_t)i * (size_t)out, bias, (size_t)out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, out, in, 1.0f, A, in, W, in, 1.0f, Z,
                out);
    size_t n = (size_t)b * (size_t)out;
    if (l < m->L - 1)
        for (size_t i = 0; i < n; i++)
            An[i] = Z[i] > 0 ? Z[i] : 0;
    else if (An != Z)
        memcpy(An, Z, n * sizeof(float));
}

static int cb_forward(void *ctx, const struct ddp_pipe_step *st, const float *w, const void *in,
                      void *out)
{
    struct pstage *p = ctx;
    int L = p->m.L;
    float **Z = p->Z + (size_t)st->slot * (size_t)L,
          **A = p->A + (size_t)st->slot * (size_t)(L + 1);
    if (p->l0 == 0) {
        const int *idx = samples_of(p, st->mb);
        for (int i = 0; i < p->u; i++)
            set_rows(p->train, idx[i], 1, A[0] + (size_t)i * IMG);
    } else {
        memcpy(A[p->l0], in, (size_t)p->u * (size_t)p->m.dim[p->l0] * sizeof(float));
    }
    for (int l = p->l0; l < p->l1; l++)
        layer_fwd(&p->m, w + p->off[l], l, A[l], Z[l], A[l + 1], p->u);
    if (out)
        memcpy(out, A[p->l1], (size_t)p->u * (size_t)p->m.dim[p->l1] * sizeof(float));
    return 0;
}

static int cb_backward(void *ctx, const struct ddp_pipe_step *st, const float *w, const void *gout,
                       void *gin, float *grad)
{
    struct pstage *p = ctx;
    const struct model *m = &p->m;
    int L = m->L, b = p->u;
    float **Z = p->Z + (size_t)st->slot * (size_t)L,
          **A = p->A + (size_t)st->slot * (size_t)(L + 1);
    float *dZ = p->dZ, *dA = p->dA;
    if (p->l1 == L) {
        const int *idx = samples_of(p, st->mb);
        for (int i = 0; i < b; i++)
            p->y[i] = p->train->y[idx[i]];
        p->loss += softmax_xent(A[L], p->y, b, 1.0f / (float)b, dZ, NULL);
        p->seen += b;
    } else { /* the gradient of this stage's output, masked by its ReLU */
        const float *g = gout, *Zl = Z[p->l1 - 1];
        for (size_t i = 0; i < (size_t)b * (size_t)m->dim[p->l1]; i++)
            dZ[i] = Zl[i] > 0 ? g[i] : 0;
    }
    for (int l = p->l1 - 1; l >= p->l0; l--) {
        int in = m->dim[l], out = m->dim[l + 1];
        float *gW = grad + p->off[l], *gb = gW + layer_w(m, l);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, b, 1.0f, dZ, out, A[l], in,
                    1.0f, gW, in);
        for (int i = 0; i < b; i++)
            for (int k = 0; k < out; k++)
                gb[k] += dZ[(size_t)i * (size_t)out + (size_t)k];
        if (l == 0)
            break;
        float *to = l == p->l0 ? gin : dA;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, in, out, 1.0f, dZ, out,
                    w + p->off[l], in, 0.0f, to, in);
        if (l > p->l0) {
            for (size_t i = 0; i < (size_t)b * (size_t)in; i++)
                dA[i] = Z[l - 1][i] > 0 ? dA[i] : 0;
            float *t = dZ;
            dZ = dA;
            dA = t;
        }
    }
    return 0;
}

static int cb_update(void *ctx, float *w, const float *grad)
{
    struct pstage *p = ctx;
    float lr = p->c->lr, mu = p->c->momentum;
    for (size_t i = 0; i < p->nw; i++) {
        p->v[i] = mu * p->v[i] + grad[i];
        w[i] -= lr * p->v[i];
    }
    return 0;
}

/* The model's initial weights as model_init makes them (one generator through every layer),
 * this stage's part kept. */
static void init_stage(struct pstage *p)
{
    uint64_t s = (uint64_t)p->c->seed * 7919u + 1;
    for (int l = 0; l < p->l1; l++) {
        size_t n = layer_w(&p->m, l);
        float *W = l >= p->l0 ? p->w + p->off[l] : malloc(n * sizeof(float));
        init_weights(&s, W, (size_t)p->m.dim[l], (size_t)p->m.dim[l + 1]);
        if (l < p->l0)
            free(W);
    }
}

/* Rank 0: the whole model from every stage's first replica, evaluated on the test set. */
static int gather_eval(struct ddp_pg *pg, struct pstage *p, const int *first, float *all,
                       const struct dataset *t, double *loss, double *acc)
{
    const struct cfg *c = p->c;
    int nst = c->pipe_nstages;
    size_t at = 0;
    for (int s = 0, l = 0; s < nst; s++) {
        size_t n = 0;
        for (int k = 0; k < c->pipe_split[s]; k++, l++)
            n += layer_w(&p->m, l) + (size_t)p->m.dim[l + 1];
        if (s == 0)
            memcpy(all, p->w, n * sizeof(float));
        else if (ddp_pg_recv(pg, all + at, n * sizeof(float), first[s], TAG_WEIGHTS + (uint32_t)s))
            return -1;
        at += n;
    }
    if (!t)
        return 0;
    const struct model *m = &p->m;
    size_t off = 0, offs[MAX_LAYERS];
    for (int l = 0; l < m->L; l++) {
        offs[l] = off;
        off += layer_w(m, l) + (size_t)m->dim[l + 1];
    }
    int cap = 500, widest = IMG;
    for (int l = 0; l <= m->L; l++)
        widest = m->dim[l] > widest ? m->dim[l] : widest;
    float *a = malloc((size_t)cap * (size_t)widest * sizeof(float));
    float *z = malloc((size_t)cap * (size_t)widest * sizeof(float));
    double sum = 0;
    long correct = 0;
    for (int i = 0; i < t->n; i += cap) {
        int b = t->n - i < cap ? t->n - i : cap;
        set_rows(t, i, b, a);
        for (int l = 0; l < m->L; l++) {
            layer_fwd(m, all + offs[l], l, a, z, z, b); /* in place: Z then A */
            float *tmp = a;
            a = z;
            z = tmp;
        }
        sum += softmax_xent(a, t->y + i, b, 0, NULL, &correct);
    }
    free(a);
    free(z);
    *loss = sum / t->n;
    *acc = 100.0 * (double)correct / t->n;
    return 0;
}

static int gcd(int a, int b)
{
    return b ? gcd(b, a % b) : a;
}

int train_pipeline(const struct cfg *c, const struct dataset *train, const struct dataset *test)
{
    struct ddp_pg_opts po = {.p2p = true};
    struct ddp_pg *pg;
    if (ddp_pg_init_env(&po, &pg) != 0)
        die("cannot join the process group");
    rank = ddp_pg_rank(pg);
    world = ddp_pg_world_size(pg);
    struct pstage p = {.c = c, .train = train, .perm_epoch = -1};
    model_shape(&p.m, c);
    int nst = c->pipe_nstages, first[MAX_LAYERS + 1], lcm = 1, layers = 0;
    for (int s = 0, acc = 0; s < nst; s++) {
        first[s] = acc;
        if (rank >= acc && rank < acc + c->pipe_replicas[s]) {
            p.s = s;
            p.l0 = layers;
            p.l1 = layers + c->pipe_split[s];
        }
        acc += c->pipe_replicas[s];
        layers += c->pipe_split[s];
        lcm = lcm / gcd(lcm, c->pipe_replicas[s]) * c->pipe_replicas[s];
    }
    if (layers != p.m.L)
        die("--pipeline %d layers in all, but the model has %d (--hidden plus the output)", layers,
            p.m.L);
    p.M = c->schedule_flush ? c->microbatches : 1;
    if (c->batch % p.M)
        die("--batch %d is not a multiple of --microbatches %d", c->batch, p.M);
    p.u = c->batch / p.M;
    for (int l = p.l0; l < p.l1; l++) { /* offsets within the stage's flat weights */
        p.off[l] = p.nw;
        p.nw += layer_w(&p.m, l) + (size_t)p.m.dim[l + 1];
    }
    p.w = calloc(p.nw, sizeof(float));
    p.v = calloc(p.nw, sizeof(float));
    init_stage(&p);
    size_t act[MAX_LAYERS];
    for (int s = 0, l = 0; s + 1 < nst; s++) {
        l += c->pipe_split[s];
        act[s] = (size_t)p.u * (size_t)p.m.dim[l] * sizeof(float);
    }
    struct ddp_pipe_opts o = {.nstages = nst,
                              .replicas = c->pipe_replicas,
                              .schedule = c->schedule_flush ? DDP_PIPE_FLUSH : DDP_PIPE_1F1B,
                              .microbatches = p.M,
                              .act_bytes = act,
                              .weights = p.w,
                              .nweights = p.nw};
    struct ddp_pipe_ops ops = {cb_forward, cb_backward, cb_update};
    struct ddp_pipe *pp;
    if (ddp_pipe_new(pg, &o, &ops, &p, &pp) != 0)
        die("pipeline: %s", ddp_pg_last_error(pg));
    p.nslots = ddp_pipe_slots(pp);
    int L = p.m.L, widest = IMG;
    for (int l = 0; l <= L; l++)
        widest = p.m.dim[l] > widest ? p.m.dim[l] : widest;
    p.Z = calloc((size_t)p.nslots * (size_t)L, sizeof(float *));
    p.A = calloc((size_t)p.nslots * (size_t)(L + 1), sizeof(float *));
    for (int k = 0; k < p.nslots; k++)
        for (int l = p.l0; l <= p.l1; l++) {
            p.A[k * (L + 1) + l] = malloc((size_t)p.u * (size_t)p.m.dim[l] * sizeof(float));
            if (l < p.l1)
                p.Z[k * L + l] = malloc((size_t)p.u * (size_t)p.m.dim[l + 1] * sizeof(float));
        }
    p.dZ = malloc((size_t)p.u * (size_t)widest * sizeof(float));
    p.dA = malloc((size_t)p.u * (size_t)widest * sizeof(float));
    p.perm = malloc((size_t)train->n * sizeof(int));
    p.y = malloc((size_t)p.u);
    p.steps_per_epoch = train->n / c->batch;
    /* each epoch's minibatches, a multiple of every replica count (the rest are left out) */
    int64_t per_epoch = (int64_t)p.steps_per_epoch * p.M;
    int64_t unit = c->schedule_flush ? (int64_t)p.M : (int64_t)lcm;
    int64_t run_n = per_epoch / unit * unit;
    if (rank == 0)
        printf("ddprun-fmnist: pipeline of %d stages (%s), %s, minibatch %d, %lld minibatches "
               "per epoch%s\n",
               nst, c->pipeline_arg, c->schedule_flush ? "flush" : "1F1B", p.u, (long long)run_n,
               run_n < per_epoch ? " (the rest left out)" : "");
    printf("rank %d: stage %d replica %d, layers %d-%d, warm-up %d\n", rank, p.s,
           ddp_pipe_replica(pp), p.l0 + 1, p.l1, ddp_pipe_warmup(pp));
    float *all = rank == 0 ? malloc(nparams(&p.m) * sizeof(float)) : NULL;
    int64_t total = (int64_t)c->epochs * run_n;
    if (c->max_steps && c->max_steps * p.M < total)
        total = c->max_steps * p.M / unit * unit;
    if (total == 0)
        die("--max-steps %lld runs no minibatch: 1F1B runs minibatches in multiples of %lld, the "
            "least common multiple of the replica counts",
            (long long)c->max_steps, (long long)unit);
    int rc = 0;
    for (int epoch = 0; (int64_t)epoch * run_n < total; epoch++) {
        double t0 = now_s();
        int64_t n = total - epoch * run_n < run_n ? total - epoch * run_n : run_n;
        if (ddp_pipe_run(pp, (int64_t)epoch * per_epoch, n) != 0)
            die("pipeline: %s", ddp_pipe_last_error(pp));
        double sums[2] = {p.loss, p.seen};
        p.loss = p.seen = 0;
        if (ddp_pg_allreduce(pg, sums, 2, DDP_F64, DDP_SUM) != 0)
            die("all-reduce failed: %s", ddp_pg_last_error(pg));
        double dt = now_s() - t0, tl = 0, ta = 0;
        bool last = (epoch + 1) * run_n >= total;
        bool eval = c->eval_every && (last || (epoch + 1) % c->eval_every == 0);
        if ((eval || last) && rank != 0 && ddp_pipe_replica(pp) == 0 && p.s > 0 &&
            ddp_pg_send(pg, p.w, p.nw * sizeof(float), 0, TAG_WEIGHTS + (uint32_t)p.s) != 0)
            die("sending the weights to rank 0: %s", ddp_pg_last_error(pg));
        if ((eval || last) && rank == 0 &&
            gather_eval(pg, &p, first, all, eval ? test : NULL, &tl, &ta) != 0)
            die("gathering the weights: %s", ddp_pg_last_error(pg));
        print_epoch(c, epoch, (epoch * run_n + n) / p.M, sums[0], sums[1], eval, tl, ta, dt);
    }
    if (rank == 0)
        rc = dump_compare(all, nparams(&p.m), c);
    ddp_pipe_free(pp);
    ddp_pg_free(pg);
    for (int k = 0; k < p.nslots * (L + 1); k++)
        free(p.A[k]);
    for (int k = 0; k < p.nslots * L; k++)
        free(p.Z[k]);
    free(p.A);
    free(p.Z);
    free(p.dZ);
    free(p.dA);
    free(p.perm);
    free(p.y);
    free(p.w);
    free(p.v);
    free(all);
    return rc;
}
