/*
 * pipetest: the pipeline stage runtime (pipeline/stage.h) on a small tanh MLP with a softmax
 * cross-entropy loss, its layers split into stages, on synthetic data that every rank can rebuild
 * from the minibatch's index.
 *
 *   pipetest run DIR [options]    one rank of the pipeline (under ddprun): trains, then writes
 *                                 DIR/rank<R>.bin: every minibatch's version and gradient, the
 *                                 weights after every update, the final weights
 *   pipetest check DIR [options]  offline, one process, from those files:
 *       1f1b: each minibatch's gradient, on every stage, equals the one computed offline with
 *             the weight version its forward used on each stage (bit for bit: the same
 *             functions on the same numbers); the replicas of a stage end equal
 *       flush: the final weights equal sequential training on whole batches to 1e-6
 *
 * Options (alike for run and check):
 *   --split A,B,...      layers per stage (of 5)              default 2,1,1,1
 *   --replicas A,B,...   replicas per stage                   default 1 each
 *   --schedule 1f1b|flush                                      default 1f1b
 *   --microbatches M     flush: minibatches per batch         default 4
 *   --minibatches N      in all                               default 24
 *   --per-run K          minibatches per ddp_pipe_run          default N
 *   --no-stash           1F1B without weight stashing
 *   --die-at MB          (run) the rank that runs MB's forward on the last stage kills itself
 *   --no-p2p             (run) form the group without point-to-point connections
 */
#include "common/err.h"
#include "pipeline/stage.h"
#include "worker/pg.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NL 5
#define B 4 /* samples per minibatch */
static const int D[NL + 1] = {8, 24, 24, 24, 24, 4};
static const float LR = 0.1f;

struct cfg {
    int nstages, split[NL], replicas[NL];
    enum ddp_pipe_schedule schedule;
    int microbatches, die_at;
    int64_t minibatches, per_run;
    bool no_stash, no_p2p;
};

static int first_layer(const struct cfg *c, int s)
{
    int l = 0;
    for (int t = 0; t < s; t++)
        l += c->split[t];
    return l;
}

static size_t layer_params(int l)
{
    return (size_t)D[l + 1] * (size_t)D[l] + (size_t)D[l + 1];
}

static size_t stage_params(const struct cfg *c, int s)
{
    size_t n = 0;
    for (int l = first_layer(c, s); l < first_layer(c, s) + c->split[s]; l++)
        n += layer_params(l);
    return n;
}

static float hashf(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
                 c * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 32;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2 - 1); /* [-1, 1) */
}

/* the minibatch's inputs, and labels from a fixed linear teacher */
static void input_of(int64_t mb, float *x)
{
    for (int i = 0; i < B; i++)
        for (int j = 0; j < D[0]; j++)
            x[i * D[0] + j] = hashf(1, (uint64_t)mb * B + (uint64_t)i, (uint64_t)j);
}

static int label_of(int64_t mb, int i)
{
    float x[B * 8];
    input_of(mb, x);
    int best = 0;
    float bv = -1e30f;
    for (int k = 0; k < D[NL]; k++) {
        float v = 0;
        for (int j = 0; j < D[0]; j++)
            v += hashf(2, (uint64_t)k, (uint64_t)j) * x[i * D[0] + j];
        if (v > bv) {
            bv = v;
            best = k;
        }
    }
    return best;
}

static void init_stage(const struct cfg *c, int s, float *w)
{
    for (int l = first_layer(c, s); l < first_layer(c, s) + c->split[s]; l++) {
        float scale = 1.0f / sqrtf((float)D[l]);
        for (size_t i = 0; i < layer_params(l); i++)
            *w++ = hashf(3, (uint64_t)l, i) * scale;
    }
}

/* y = act(W x + b) for B samples; tanh but on the last layer */
static void layer_fwd(int l, const float *w, const float *x, float *y)
{
    const float *W = w, *b = w + D[l + 1] * D[l];
    for (int i = 0; i < B; i++)
        for (int o = 0; o < D[l + 1]; o++) {
            float z = b[o];
            for (int j = 0; j < D[l]; j++)
                z += W[o * D[l] + j] * x[i * D[l] + j];
            y[i * D[l + 1] + o] = l < NL - 1 ? tanhf(z) : z;
        }
}

/* from dy (of the layer's output) to dx, adding the parameter gradient into g */
static void layer_bwd(int l, const float *w, const float *x, const float *y, const float *dy,
                      float *dx, float *g)
{
    const float *W = w;
    float *gW = g, *gb = g + D[l + 1] * D[l];
    float dz[B * 24];
    for (int i = 0; i < B; i++)
        for (int o = 0; o < D[l + 1]; o++) {
            float v = y[i * D[l + 1] + o];
            dz[i * D[l + 1] + o] =
                l < NL - 1 ? dy[i * D[l + 1] + o] * (1 - v * v) : dy[i * D[l + 1] + o];
        }
    for (int o = 0; o < D[l + 1]; o++) {
        for (int j = 0; j < D[l]; j++) {
            float s = 0;
            for (int i = 0; i < B; i++)
                s += dz[i * D[l + 1] + o] * x[i * D[l] + j];
            gW[o * D[l] + j] += s;
        }
        float s = 0;
        for (int i = 0; i < B; i++)
            s += dz[i * D[l + 1] + o];
        gb[o] += s;
    }
    if (dx)
        for (int i = 0; i < B; i++)
            for (int j = 0; j < D[l]; j++) {
                float s = 0;
                for (int o = 0; o < D[l + 1]; o++)
                    s += W[o * D[l] + j] * dz[i * D[l + 1] + o];
                dx[i * D[l] + j] = s;
            }
}

/* a stage's activations for one minibatch: its input, then each layer's output */
static size_t acts_size(const struct cfg *c, int s)
{
    size_t n = 0;
    for (int l = first_layer(c, s); l <= first_layer(c, s) + c->split[s]; l++)
        n += (size_t)B * D[l];
    return n;
}

/* Forward of stage s from x (NULL: the minibatch's input); acts gets every layer's output. */
static void stage_fwd(const struct cfg *c, int s, int64_t mb, const float *w, const float *x,
                      float *acts)
{
    int l0 = first_layer(c, s);
    if (x)
        memcpy(acts, x, sizeof(float) * B * D[l0]);
    else
        input_of(mb, acts);
    float *in = acts;
    for (int l = l0; l < l0 + c->split[s]; l++) {
        float *out = in + B * D[l];
        layer_fwd(l, w, in, out);
        w += layer_params(l);
        in = out;
    }
}

/* Backward of stage s: dy the gradient of its output (NULL at the last stage: the loss's);
 * dx (NULL at the first stage) and the parameter gradient added into g. */
static void stage_bwd(const struct cfg *c, int s, int64_t mb, const float *w, const float *acts,
                      const float *dy, float *dx, float *g)
{
    int l0 = first_layer(c, s), l1 = l0 + c->split[s];
    const float *a[NL + 1];
    const float *wl[NL];
    float *gl[NL];
    a[l0] = acts;
    for (int l = l0; l < l1; l++) {
        a[l + 1] = a[l] + B * D[l];
        wl[l] = w;
        gl[l] = g;
        w += layer_params(l);
        g += layer_params(l);
    }
    float cur[B * 24], next[B * 24];
    if (dy)
        memcpy(cur, dy, sizeof(float) * B * D[l1]);
    else /* softmax cross-entropy, mean over the minibatch */
        for (int i = 0; i < B; i++) {
            const float *z = a[NL] + i * D[NL];
            float m = z[0], sum = 0;
            for (int k = 1; k < D[NL]; k++)
                m = fmaxf(m, z[k]);
            for (int k = 0; k < D[NL]; k++)
                sum += expf(z[k] - m);
            int y = label_of(mb, i);
            for (int k = 0; k < D[NL]; k++)
                cur[i * D[NL] + k] = (expf(z[k] - m) / sum - (k == y)) / B;
        }
    for (int l = l1 - 1; l >= l0; l--) {
        float *to = l == l0 ? dx : next;
        layer_bwd(l, wl[l], a[l], a[l + 1], cur, to, gl[l]);
        if (l > l0)
            memcpy(cur, next, sizeof(float) * B * D[l]);
    }
}

/* ---- one rank of the pipeline ---- */

struct rec {
    int64_t mb, version;
};

struct rank_state {
    const struct cfg *c;
    int stage, rank;
    size_t nw;
    float *acts; /* per slot */
    size_t asz;
    float *gmb; /* this minibatch's gradient */
    struct rec *recs;
    float *rgrads; /* per record */
    size_t nrec;
    float *hist; /* weights after each update, version 0 first */
    size_t nhist;
};

static int cb_forward(void *ctx, const struct ddp_pipe_step *st, const float *w, const void *in,
                      void *out)
{
    struct rank_state *r = ctx;
    if (r->stage == r->c->nstages - 1 && st->mb == r->c->die_at)
        raise(SIGKILL);
    float *acts = r->acts + (size_t)st->slot * r->asz;
    stage_fwd(r->c, r->stage, st->mb, w, in, acts);
    if (out) {
        int l1 = first_layer(r->c, r->stage) + r->c->split[r->stage];
        memcpy(out, acts + r->asz - (size_t)B * D[l1], sizeof(float) * B * D[l1]);
    }
    return 0;
}

static int cb_backward(void *ctx, const struct ddp_pipe_step *st, const float *w, const void *gout,
                       void *gin, float *grad)
{
    struct rank_state *r = ctx;
    memset(r->gmb, 0, r->nw * sizeof(float));
    stage_bwd(r->c, r->stage, st->mb, w, r->acts + (size_t)st->slot * r->asz, gout, gin, r->gmb);
    for (size_t i = 0; i < r->nw; i++)
        grad[i] += r->gmb[i];
    r->recs[r->nrec] = (struct rec){st->mb, st->version};
    memcpy(r->rgrads + r->nrec * r->nw, r->gmb, r->nw * sizeof(float));
    r->nrec++;
    return 0;
}

static int cb_update(void *ctx, float *w, const float *grad)
{
    struct rank_state *r = ctx;
    for (size_t i = 0; i < r->nw; i++)
        w[i] -= LR * grad[i];
    memcpy(r->hist + r->nhist * r->nw, w, r->nw * sizeof(float));
    r->nhist++;
    return 0;
}

static void write_all(FILE *f, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, f) != n) {
        perror("pipetest: write");
        exit(1);
    }
}

static int run(const struct cfg *c, const char *dir)
{
    struct ddp_pg_opts po = {.p2p = !c->no_p2p};
    struct ddp_pg *pg;
    int r = ddp_pg_init_env(&po, &pg);
    if (r < 0) {
        fprintf(stderr, "pipetest: forming the group: %s\n", ddp_err_name(r));
        return 1;
    }
    int rank = ddp_pg_rank(pg), stage = 0;
    for (int s = 0, acc = 0; s < c->nstages; acc += c->replicas[s], s++)
        if (rank >= acc)
            stage = s;
    struct rank_state st = {.c = c, .stage = stage, .rank = rank, .nw = stage_params(c, stage)};
    size_t maxrec = (size_t)c->minibatches + 1;
    float *w = malloc(st.nw * sizeof(float));
    st.gmb = malloc(st.nw * sizeof(float));
    st.recs = malloc(maxrec * sizeof(*st.recs));
    st.rgrads = malloc(maxrec * st.nw * sizeof(float));
    st.hist = malloc((maxrec + 1) * st.nw * sizeof(float));
    if (!w || !st.gmb || !st.recs || !st.rgrads || !st.hist)
        return 1;
    init_stage(c, stage, w);
    memcpy(st.hist, w, st.nw * sizeof(float));
    st.nhist = 1;
    size_t act[NL];
    for (int s = 0; s + 1 < c->nstages; s++)
        act[s] = sizeof(float) * B * D[first_layer(c, s + 1)];
    struct ddp_pipe_opts o = {.nstages = c->nstages,
                              .replicas = c->replicas,
                              .schedule = c->schedule,
                              .microbatches = c->microbatches,
                              .no_stash = c->no_stash,
                              .act_bytes = act,
                              .weights = w,
                              .nweights = st.nw};
    struct ddp_pipe_ops ops = {cb_forward, cb_backward, cb_update};
    struct ddp_pipe *p = NULL;
    int rc = 0; /* every way out frees everything: LeakSanitizer would change the status */
    r = ddp_pipe_new(pg, &o, &ops, &st, &p);
    if (r < 0) {
        fprintf(stderr, "pipetest: rank %d: %s (%s)\n", rank, ddp_pg_last_error(pg),
                ddp_err_name(r));
        rc = 1;
        goto out;
    }
    st.asz = acts_size(c, stage);
    st.acts = calloc((size_t)ddp_pipe_slots(p) * st.asz, sizeof(float));
    if (!st.acts) {
        rc = 1;
        goto out;
    }
    for (int64_t at = 0; r == 0 && at < c->minibatches; at += c->per_run)
        r = ddp_pipe_run(p, at, c->per_run);
    if (r < 0) {
        fprintf(stderr, "pipetest: rank %d: %s (%s)\n", rank, ddp_pipe_last_error(p),
                ddp_err_name(r));
        rc = 3;
        goto out;
    }
    printf("rank %d: stage %d replica %d warm-up %d: %zu minibatches, %lld updates\n", rank, stage,
           ddp_pipe_replica(p), ddp_pipe_warmup(p), st.nrec, (long long)ddp_pipe_version(p));
    char path[4096];
    snprintf(path, sizeof(path), "%s/rank%d.bin", dir, rank);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        rc = 1;
        goto out;
    }
    int64_t hdr[5] = {stage, ddp_pipe_replica(p), (int64_t)st.nw, (int64_t)st.nrec,
                      (int64_t)st.nhist};
    write_all(f, hdr, sizeof(hdr));
    write_all(f, st.recs, st.nrec * sizeof(*st.recs));
    write_all(f, st.rgrads, st.nrec * st.nw * sizeof(float));
    write_all(f, st.hist, st.nhist * st.nw * sizeof(float));
    write_all(f, w, st.nw * sizeof(float));
    if (fclose(f) != 0)
        rc = 1;
out:
    ddp_pipe_free(p);
    ddp_pg_free(pg);
    free(st.acts);
    free(st.gmb);
    free(st.recs);
    free(st.rgrads);
    free(st.hist);
    free(w);
    return rc;
}

/* ---- offline ---- */

struct rankfile {
    int64_t stage, replica, nw, nrec, nhist;
    struct rec *recs;
    float *grads, *hist, *final;
};

static void read_all(FILE *f, void *p, size_t n, const char *path)
{
    if (n && fread(p, 1, n, f) != n) {
        fprintf(stderr, "pipetest: %s is short\n", path);
        exit(1);
    }
}

static struct rankfile *load(const char *dir, int world)
{
    struct rankfile *rf = calloc((size_t)world, sizeof(*rf));
    for (int k = 0; k < world; k++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/rank%d.bin", dir, k);
        FILE *f = fopen(path, "rb");
        if (!f) {
            perror(path);
            exit(1);
        }
        struct rankfile *q = &rf[k];
        read_all(f, q, 5 * sizeof(int64_t), path);
        q->recs = malloc((size_t)q->nrec * sizeof(struct rec) + 1);
        q->grads = malloc((size_t)(q->nrec * q->nw) * sizeof(float) + 1);
        q->hist = malloc((size_t)(q->nhist * q->nw) * sizeof(float) + 1);
        q->final = malloc((size_t)q->nw * sizeof(float) + 1);
        read_all(f, q->recs, (size_t)q->nrec * sizeof(struct rec), path);
        read_all(f, q->grads, (size_t)(q->nrec * q->nw) * sizeof(float), path);
        read_all(f, q->hist, (size_t)(q->nhist * q->nw) * sizeof(float), path);
        read_all(f, q->final, (size_t)q->nw * sizeof(float), path);
        fclose(f);
    }
    return rf;
}

static int rank_of(const struct cfg *c, int s, int64_t mb)
{
    int first = 0;
    for (int t = 0; t < s; t++)
        first += c->replicas[t];
    return first + (int)(mb % c->replicas[s]);
}

static const struct rec *find_rec(const struct rankfile *q, int64_t mb, size_t *idx)
{
    for (int64_t k = 0; k < q->nrec; k++)
        if (q->recs[k].mb == mb) {
            *idx = (size_t)k;
            return &q->recs[k];
        }
    return NULL;
}

/* Every minibatch through the whole model offline, with each stage's recorded version. */
static int check_1f1b(const struct cfg *c, struct rankfile *rf)
{
    long checked = 0;
    int bad = 0;
    float *acts[NL], *grads[NL];
    for (int s = 0; s < c->nstages; s++) {
        acts[s] = malloc(acts_size(c, s) * sizeof(float));
        grads[s] = malloc(stage_params(c, s) * sizeof(float));
    }
    for (int64_t mb = 0; !bad && mb < c->minibatches; mb++) {
        const float *w[NL], *got[NL];
        float io[2][B * 24];
        for (int s = 0; !bad && s < c->nstages; s++) {
            struct rankfile *q = &rf[rank_of(c, s, mb)];
            size_t idx = 0;
            const struct rec *e = find_rec(q, mb, &idx);
            if (!e || e->version >= q->nhist) {
                printf("minibatch %lld: no record on stage %d\n", (long long)mb, s);
                bad = 1;
                break;
            }
            w[s] = q->hist + e->version * q->nw;
            got[s] = q->grads + idx * (size_t)q->nw;
            stage_fwd(c, s, mb, w[s],
                      s ? acts[s - 1] + acts_size(c, s - 1) - B * D[first_layer(c, s)] : NULL,
                      acts[s]);
        }
        for (int s = c->nstages - 1; !bad && s >= 0; s--) {
            size_t n = stage_params(c, s);
            memset(grads[s], 0, n * sizeof(float));
            stage_bwd(c, s, mb, w[s], acts[s], s < c->nstages - 1 ? io[(s + 1) % 2] : NULL,
                      s ? io[s % 2] : NULL, grads[s]);
            double maxd = 0;
            for (size_t i = 0; i < n; i++)
                maxd = fmax(maxd, fabs((double)got[s][i] - grads[s][i]));
            if (memcmp(got[s], grads[s], n * sizeof(float)) != 0) {
                printf("minibatch %lld, stage %d: the gradient differs from the offline one "
                       "with the versions its forwards used (max |diff| %.3g)\n",
                       (long long)mb, s, maxd);
                bad = 1;
            }
            checked++;
        }
    }
    for (int s = 0; s < c->nstages; s++) {
        free(acts[s]);
        free(grads[s]);
    }
    if (!bad)
        printf("1f1b: %ld gradients equal the offline ones with their forwards' weight "
               "versions\n",
               checked);
    return bad;
}

/* Sequential training on whole batches, every stage's final weights compared. */
static int check_flush(const struct cfg *c, struct rankfile *rf)
{
    float *w[NL], *g[NL], *acts[NL], *gm[NL];
    for (int s = 0; s < c->nstages; s++) {
        size_t n = stage_params(c, s);
        w[s] = malloc(n * sizeof(float));
        g[s] = malloc(n * sizeof(float));
        gm[s] = malloc(n * sizeof(float));
        acts[s] = malloc(acts_size(c, s) * sizeof(float));
        init_stage(c, s, w[s]);
    }
    float io[2][B * 24];
    for (int64_t b0 = 0; b0 < c->minibatches; b0 += c->microbatches) {
        for (int s = 0; s < c->nstages; s++)
            memset(g[s], 0, stage_params(c, s) * sizeof(float));
        for (int64_t mb = b0; mb < b0 + c->microbatches; mb++) {
            for (int s = 0; s < c->nstages; s++)
                stage_fwd(c, s, mb, w[s],
                          s ? acts[s - 1] + acts_size(c, s - 1) - B * D[first_layer(c, s)] : NULL,
                          acts[s]);
            for (int s = c->nstages - 1; s >= 0; s--) {
                memset(gm[s], 0, stage_params(c, s) * sizeof(float));
                stage_bwd(c, s, mb, w[s], acts[s], s < c->nstages - 1 ? io[(s + 1) % 2] : NULL,
                          s ? io[s % 2] : NULL, gm[s]);
                for (size_t i = 0; i < stage_params(c, s); i++)
                    g[s][i] += gm[s][i];
            }
        }
        for (int s = 0; s < c->nstages; s++)
            for (size_t i = 0; i < stage_params(c, s); i++)
                w[s][i] -= LR * (g[s][i] / (float)c->microbatches);
    }
    int world = 0;
    for (int s = 0; s < c->nstages; s++)
        world += c->replicas[s];
    double maxd = 0;
    for (int k = 0; k < world; k++)
        for (int64_t i = 0; i < rf[k].nw; i++)
            maxd = fmax(maxd, fabs((double)rf[k].final[i] - w[rf[k].stage][i]));
    printf("flush: final weights vs sequential training: max |diff| %.3g\n", maxd);
    for (int s = 0; s < c->nstages; s++) {
        free(w[s]);
        free(g[s]);
        free(gm[s]);
        free(acts[s]);
    }
    return maxd <= 1e-6 ? 0 : 1;
}

static int check(const struct cfg *c, const char *dir)
{
    int world = 0;
    for (int s = 0; s < c->nstages; s++)
        world += c->replicas[s];
    struct rankfile *rf = load(dir, world);
    int bad = c->schedule == DDP_PIPE_FLUSH ? check_flush(c, rf) : check_1f1b(c, rf);
    /* replicas of a stage end bit-identical */
    for (int k = 1; k < world; k++)
        if (rf[k].stage == rf[k - 1].stage &&
            memcmp(rf[k].final, rf[k - 1].final, (size_t)rf[k].nw * sizeof(float)) != 0) {
            printf("ranks %d and %d, replicas of stage %lld, end with different weights\n", k - 1,
                   k, (long long)rf[k].stage);
            bad = 1;
        }
    if (!bad)
        printf("replicas equal; check passed\n");
    for (int k = 0; k < world; k++) {
        free(rf[k].recs);
        free(rf[k].grads);
        free(rf[k].hist);
        free(rf[k].final);
    }
    free(rf);
    return bad;
}

static int parse_list(const char *s, int *out)
{
    int n = 0;
    for (char *e; *s && n < NL; s = *e ? e + 1 : e) {
        long v = strtol(s, &e, 10);
        if (e == s || v < 1 || (*e && *e != ','))
            return -1;
        out[n++] = (int)v;
    }
    return n;
}

int main(int argc, char **argv)
{
    struct cfg c = {
        .nstages = 4, .split = {2, 1, 1, 1}, .microbatches = 4, .minibatches = 24, .die_at = -1};
    int nrep = 0;
    if (argc < 3) {
        fprintf(stderr, "usage: pipetest run|check DIR [options]\n");
        return 2;
    }
    for (int k = 3; k < argc; k++) {
        const char *a = argv[k], *v = k + 1 < argc ? argv[k + 1] : "";
        if (!strcmp(a, "--split") && ++k)
            c.nstages = parse_list(v, c.split);
        else if (!strcmp(a, "--replicas") && ++k)
            nrep = parse_list(v, c.replicas);
        else if (!strcmp(a, "--schedule") && ++k)
            c.schedule = !strcmp(v, "flush") ? DDP_PIPE_FLUSH : DDP_PIPE_1F1B;
        else if (!strcmp(a, "--microbatches") && ++k)
            c.microbatches = atoi(v);
        else if (!strcmp(a, "--minibatches") && ++k)
            c.minibatches = atoll(v);
        else if (!strcmp(a, "--per-run") && ++k)
            c.per_run = atoll(v);
        else if (!strcmp(a, "--die-at") && ++k)
            c.die_at = atoi(v);
        else if (!strcmp(a, "--no-stash"))
            c.no_stash = true;
        else if (!strcmp(a, "--no-p2p"))
            c.no_p2p = true;
        else {
            fprintf(stderr, "pipetest: unknown option %s\n", a);
            return 2;
        }
    }
    int layers = 0;
    for (int s = 0; s < c.nstages; s++)
        layers += c.split[s];
    if (c.nstages < 1 || layers != NL || (nrep && nrep != c.nstages)) {
        fprintf(stderr, "pipetest: --split must cover the %d layers, --replicas each stage\n", NL);
        return 2;
    }
    for (int s = 0; !nrep && s < c.nstages; s++)
        c.replicas[s] = 1;
    if (!c.per_run)
        c.per_run = c.minibatches;
    if (!strcmp(argv[1], "run"))
        return run(&c, argv[2]);
    if (!strcmp(argv[1], "check"))
        return check(&c, argv[2]);
    fprintf(stderr, "pipetest: run or check\n");
    return 2;
}
