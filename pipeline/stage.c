/*
 * The pipeline stage runtime (see stage.h): PipeDream's 1F1B schedule with weight stashing, and
 * the flush schedule, over a process group's point-to-point messages. Each replica walks its own
 * minibatches (every R-th); receives block (the group's engine holds a message that comes
 * early), sends are started and waited for only before their buffer is used again.
 */
#include "pipeline/stage.h"
#include "worker/pg.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* one in-flight minibatch's buffers and state */
struct slot {
    bool busy; /* forwarded, not yet backwarded */
    int64_t mb;
    int64_t version;  /* of the weights its forward used */
    void *in, *out;   /* activations received / sent */
    void *gout, *gin; /* their gradients received / sent */
    struct ddp_work *out_work, *gin_work;
};

/* a stashed version of the weights */
struct stash {
    int64_t version; /* -1: free */
    float *w;
};

struct ddp_pipe {
    struct ddp_pg *pg, *reps; /* the whole group; this stage's replicas (NULL if one) */
    struct ddp_pipe_ops ops;
    void *ctx;
    int nstages, stage, replica;
    int *R;     /* replicas per stage */
    int *first; /* first rank of each stage */
    enum ddp_pipe_schedule schedule;
    int microbatches;
    bool stash_on;
    size_t in_bytes, out_bytes;
    float *w, *grad;
    size_t nw;
    int warmup, nslots;
    struct slot *slots;
    struct stash *stash;
    int64_t version;
    char err[2048];
};

static int fail(struct ddp_pipe *p, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct ddp_pipe *p, int r, const char *fmt, ...)
{
    if (p->err[0]) /* the first failure is the cause; what fails after it follows from it */
        return r;
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(p->err, sizeof(p->err), "stage %d replica %d: ", p->stage, p->replica);
    vsnprintf(p->err + n, sizeof(p->err) - (size_t)n, fmt, ap);
    va_end(ap);
    ddp_pg_abort(p->pg, p->err);
    /* with the first rank's cause, where another rank failed before this one */
    if (strstr(ddp_pg_last_error(p->pg), "; the group had already failed at "))
        snprintf(p->err, sizeof(p->err), "%s", ddp_pg_last_error(p->pg));
    return r;
}

/* The rank of minibatch mb's replica of stage s. */
static int rank_of(const struct ddp_pipe *p, int s, int64_t mb)
{
    return p->first[s] + (int)(mb % p->R[s]);
}

static uint32_t tag_of(int64_t mb, int backward)
{
    return (uint32_t)(((uint64_t)mb << 1) | (uint64_t)backward);
}

static void pipe_free_bufs(struct ddp_pipe *p)
{
    for (int k = 0; p->slots && k < p->nslots; k++) {
        struct slot *s = &p->slots[k];
        ddp_work_free(s->out_work);
        ddp_work_free(s->gin_work);
        free(s->in);
        free(s->out);
        free(s->gout);
        free(s->gin);
    }
    for (int k = 0; p->stash && k < p->nslots; k++)
        free(p->stash[k].w);
    free(p->slots);
    free(p->stash);
    p->slots = NULL;
    p->stash = NULL;
}

void ddp_pipe_free(struct ddp_pipe *p)
{
    if (!p)
        return;
    pipe_free_bufs(p);
    ddp_pg_free(p->reps);
    free(p->grad);
    free(p->R);
    free(p->first);
    free(p);
}

static int einval(struct ddp_pg *pg, const char *why)
{
    ddp_pg_abort(pg, why);
    return DDP_EINVAL;
}

static int check_opts(struct ddp_pg *pg, const struct ddp_pipe_opts *o,
                      const struct ddp_pipe_ops *ops)
{
    if (!o || !ops || !ops->forward || !ops->backward || !ops->update)
        return einval(pg, "pipeline: options and all three callbacks are required");
    if (o->nstages < 1 || o->nstages > ddp_pg_world_size(pg))
        return einval(pg, "pipeline: nstages must be from 1 to the world size");
    if (o->nstages > 1 && !o->act_bytes)
        return einval(pg, "pipeline: act_bytes (the bytes between stages) is required");
    if (o->schedule != DDP_PIPE_1F1B && o->schedule != DDP_PIPE_FLUSH)
        return einval(pg, "pipeline: unknown schedule");
    if (o->schedule == DDP_PIPE_FLUSH && o->microbatches < 1)
        return einval(pg, "pipeline: the flush schedule needs microbatches >= 1");
    if (o->nweights && !o->weights)
        return einval(pg, "pipeline: nweights without weights");
    if (o->nstages > 1 && !ddp_pg_has_p2p(pg)) {
        ddp_pg_abort(pg, "pipeline: the group has no point-to-point connections (form it with "
                         "opts.p2p or DDP_PG_P2P=1)");
        return DDP_ENOTSUP;
    }
    return 0;
}

static int alloc_bufs(struct ddp_pipe *p)
{
    p->slots = calloc((size_t)p->nslots, sizeof(*p->slots));
    p->stash = calloc((size_t)p->nslots, sizeof(*p->stash));
    p->grad = calloc(p->nw ? p->nw : 1, sizeof(float));
    if (!p->slots || !p->stash || !p->grad)
        return DDP_ENOMEM;
    for (int k = 0; k < p->nslots; k++) {
        struct slot *s = &p->slots[k];
        p->stash[k].version = -1;
        /* at least a byte, so a stage that exchanges nothing still has buffers to name */
        s->in = calloc(p->in_bytes ? p->in_bytes : 1, 1);
        s->gin = calloc(p->in_bytes ? p->in_bytes : 1, 1);
        s->out = calloc(p->out_bytes ? p->out_bytes : 1, 1);
        s->gout = calloc(p->out_bytes ? p->out_bytes : 1, 1);
        if (!s->in || !s->gin || !s->out || !s->gout)
            return DDP_ENOMEM;
    }
    return 0;
}

int ddp_pipe_new(struct ddp_pg *pg, const struct ddp_pipe_opts *o, const struct ddp_pipe_ops *ops,
                 void *ctx, struct ddp_pipe **out)
{
    *out = NULL;
    int r = check_opts(pg, o, ops);
    if (r < 0)
        return r;
    struct ddp_pipe *p = calloc(1, sizeof(*p));
    if (!p)
        return DDP_ENOMEM;
    p->pg = pg;
    p->ops = *ops;
    p->ctx = ctx;
    p->nstages = o->nstages;
    p->schedule = o->schedule;
    p->microbatches = o->microbatches;
    p->stash_on = !o->no_stash;
    p->w = o->weights;
    p->nw = o->nweights;
    p->R = calloc((size_t)o->nstages, sizeof(int));
    p->first = calloc((size_t)o->nstages, sizeof(int));
    if (!p->R || !p->first) {
        ddp_pipe_free(p);
        return DDP_ENOMEM;
    }
    int world = ddp_pg_world_size(pg), rank = ddp_pg_rank(pg), sum = 0;
    p->stage = -1;
    for (int s = 0; s < o->nstages; s++) {
        p->R[s] = o->replicas ? o->replicas[s] : 1;
        if (p->R[s] < 1 || p->R[s] > world - sum) {
            ddp_pipe_free(p);
            return einval(pg, "pipeline: the stages' replica counts must be >= 1 and add up "
                              "to the world size");
        }
        p->first[s] = sum;
        if (rank >= sum && rank < sum + p->R[s]) {
            p->stage = s;
            p->replica = rank - sum;
        }
        sum += p->R[s];
        if (o->schedule == DDP_PIPE_FLUSH && o->microbatches % p->R[s]) {
            ddp_pipe_free(p);
            return einval(pg, "pipeline: microbatches must be a multiple of every stage's "
                              "replica count");
        }
    }
    if (sum != world) {
        ddp_pipe_free(p);
        return einval(pg, "pipeline: the stages' replica counts must add up to the world size");
    }
    int s = p->stage;
    p->in_bytes = s > 0 ? o->act_bytes[s - 1] : 0;
    p->out_bytes = s < p->nstages - 1 ? o->act_bytes[s] : 0;
    /* PipeDream's depth: the ranks of this and the later stages, less one, per replica */
    p->warmup = (world - p->first[s] - 1) / p->R[s];
    p->nslots = p->warmup + 1;
    r = alloc_bufs(p);
    /* every replicated stage's sub-group, formed by every rank in stage order */
    for (int t = 0; r == 0 && t < p->nstages; t++) {
        if (p->R[t] == 1)
            continue;
        int *ranks = malloc(sizeof(int) * (size_t)p->R[t]);
        if (!ranks) {
            r = DDP_ENOMEM;
            break;
        }
        for (int k = 0; k < p->R[t]; k++)
            ranks[k] = p->first[t] + k;
        char name[32];
        snprintf(name, sizeof(name), "pipe-stage-%d", t);
        struct ddp_pg *g = NULL;
        r = ddp_pg_new_group(pg, ranks, p->R[t], name, &g);
        free(ranks);
        if (g)
            p->reps = g;
    }
    /* a rank outside a replicated stage returns from ddp_pg_new_group at once, while the
     * replicas still form their group: none leaves before every sub-group is formed (a rank
     * that failed its first run at once made the launcher stop the replicas mid-setup) */
    if (r == 0)
        r = ddp_pg_barrier(pg);
    if (r < 0) {
        ddp_pipe_free(p);
        return r;
    }
    *out = p;
    return 0;
}

/* ---- weight versions ---- */

static bool version_needed(const struct ddp_pipe *p, int64_t v)
{
    for (int k = 0; k < p->nslots; k++)
        if (p->slots[k].busy && p->slots[k].version == v)
            return true;
    return false;
}

/* Before an update overwrites the latest weights: keep them if a minibatch in flight used them. */
static int stash_latest(struct ddp_pipe *p)
{
    if (!p->stash_on || !version_needed(p, p->version))
        return 0;
    for (int k = 0; k < p->nslots; k++) {
        struct stash *st = &p->stash[k];
        if (st->version >= 0)
            continue;
        if (!st->w && !(st->w = malloc((p->nw ? p->nw : 1) * sizeof(float))))
            return fail(p, DDP_ENOMEM, "out of memory stashing weights");
        if (p->nw)
            memcpy(st->w, p->w, p->nw * sizeof(float));
        st->version = p->version;
        return 0;
    }
    /* more versions in flight than slots: cannot happen with one version per forward */
    return fail(p, DDP_EPROTO, "no free stash for version %lld", (long long)p->version);
}

static const float *weights_for(struct ddp_pipe *p, int64_t v)
{
    if (!p->stash_on || v == p->version)
        return p->w;
    for (int k = 0; k < p->nslots; k++)
        if (p->stash[k].version == v)
            return p->stash[k].w;
    return NULL;
}

static void release_stashes(struct ddp_pipe *p)
{
    for (int k = 0; k < p->nslots; k++)
        if (p->stash[k].version >= 0 && !version_needed(p, p->stash[k].version))
            p->stash[k].version = -1;
}

/* ---- one minibatch's forward and backward ---- */

static int wait_send(struct ddp_pipe *p, struct ddp_work **w, const char *what, int64_t mb)
{
    if (!*w)
        return 0;
    int r = ddp_work_wait(*w);
    ddp_work_free(*w);
    *w = NULL;
    if (r < 0)
        return fail(p, r, "sending the %s of minibatch %lld: %s", what, (long long)mb,
                    ddp_pg_last_error(p->pg));
    return 0;
}

/* Minibatch mb's activations (dir 0) or gradient (dir 1) to or from peer: a send is started
 * (*work), a receive waited for. */
static int exchange(struct ddp_pipe *p, bool send, void *buf, size_t bytes, int peer, int64_t mb,
                    int dir, struct ddp_work **work)
{
    int r = send ? ddp_pg_send_start(p->pg, buf, bytes, peer, tag_of(mb, dir), work)
                 : ddp_pg_recv(p->pg, buf, bytes, peer, tag_of(mb, dir));
    if (r < 0)
        return fail(p, r, "%s the %s of minibatch %lld %s rank %d: %s",
                    send ? "sending" : "receiving", dir ? "gradient" : "activations", (long long)mb,
                    send ? "to" : "from", peer, ddp_pg_last_error(p->pg));
    return 0;
}

static int forward(struct ddp_pipe *p, int64_t mb, int k)
{
    struct slot *s = &p->slots[k];
    int r = wait_send(p, &s->out_work, "activations", s->mb);
    if (r < 0)
        return r;
    if (p->stage > 0 &&
        (r = exchange(p, false, s->in, p->in_bytes, rank_of(p, p->stage - 1, mb), mb, 0, NULL)) < 0)
        return r;
    s->busy = true;
    s->mb = mb;
    s->version = p->version;
    struct ddp_pipe_step st = {.mb = mb, .slot = k, .version = p->version};
    bool last = p->stage == p->nstages - 1;
    r = p->ops.forward(p->ctx, &st, p->w, p->stage > 0 ? s->in : NULL, last ? NULL : s->out);
    if (r < 0)
        return fail(p, r, "forward of minibatch %lld failed (%s)", (long long)mb, ddp_err_name(r));
    if (!last)
        return exchange(p, true, s->out, p->out_bytes, rank_of(p, p->stage + 1, mb), mb, 0,
                        &s->out_work);
    return 0;
}

static int backward(struct ddp_pipe *p, int k)
{
    struct slot *s = &p->slots[k];
    int64_t mb = s->mb;
    int r = wait_send(p, &s->gin_work, "gradient", mb);
    if (r < 0)
        return r;
    bool last = p->stage == p->nstages - 1;
    if (!last && (r = exchange(p, false, s->gout, p->out_bytes, rank_of(p, p->stage + 1, mb), mb, 1,
                               NULL)) < 0)
        return r;
    const float *w = weights_for(p, s->version);
    if (!w)
        return fail(p, DDP_EPROTO, "version %lld of the weights was not kept",
                    (long long)s->version);
    struct ddp_pipe_step st = {.mb = mb, .slot = k, .version = s->version};
    r = p->ops.backward(p->ctx, &st, w, last ? NULL : s->gout, p->stage > 0 ? s->gin : NULL,
                        p->grad);
    if (r < 0)
        return fail(p, r, "backward of minibatch %lld failed (%s)", (long long)mb, ddp_err_name(r));
    s->busy = false;
    release_stashes(p);
    if (p->stage > 0)
        return exchange(p, true, s->gin, p->in_bytes, rank_of(p, p->stage - 1, mb), mb, 1,
                        &s->gin_work);
    return 0;
}

/* The mean of the gradients of `count` minibatches (summed here and over the replicas), then
 * the optimizer's step on the latest weights. */
static int update(struct ddp_pipe *p, int count)
{
    int r;
    if (p->reps && p->nw) {
        r = ddp_pg_allreduce(p->reps, p->grad, p->nw, DDP_F32, DDP_SUM);
        if (r < 0)
            return fail(p, r, "reducing the gradients of the stage's replicas: %s",
                        ddp_pg_last_error(p->reps));
    }
    if (count > 1)
        for (size_t i = 0; i < p->nw; i++)
            p->grad[i] /= (float)count;
    if ((r = stash_latest(p)) < 0)
        return r;
    r = p->ops.update(p->ctx, p->w, p->grad);
    if (r < 0)
        return fail(p, r, "update %lld failed (%s)", (long long)p->version + 1, ddp_err_name(r));
    p->version++;
    memset(p->grad, 0, p->nw * sizeof(float));
    return 0;
}

/* This replica's share of minibatches first..first+n-1: c of them, one warm-up. */
static int run_segment(struct ddp_pipe *p, int64_t first, int64_t n)
{
    int R = p->R[p->stage];
    int64_t c = n / R, nf = 0, nb = 0;
    int64_t w = p->warmup < c ? p->warmup : c;
    bool per_backward = p->schedule == DDP_PIPE_1F1B;
    int r = 0;
    /* the first minibatch of the segment that is this replica's */
    int64_t base = first + ((p->replica - first % R) % R + R) % R;
    for (; r == 0 && nf < w; nf++)
        r = forward(p, base + nf * R, (int)(nf % p->nslots));
    while (r == 0 && nb < c) {
        if (nf < c) {
            r = forward(p, base + nf * R, (int)(nf % p->nslots));
            nf++;
        }
        if (r == 0)
            r = backward(p, (int)(nb % p->nslots));
        nb++;
        if (r == 0 && per_backward)
            r = update(p, R);
    }
    if (r == 0 && !per_backward)
        r = update(p, (int)n);
    return r;
}

int ddp_pipe_run(struct ddp_pipe *p, int64_t first, int64_t n)
{
    if (first < 0 || n < 0)
        return fail(p, DDP_EINVAL, "minibatches from %lld, %lld of them: not a range",
                    (long long)first, (long long)n);
    for (int s = 0; s < p->nstages; s++)
        if (n % p->R[s])
            return fail(p, DDP_EINVAL,
                        "%lld minibatches are not a multiple of stage %d's %d replicas",
                        (long long)n, s, p->R[s]);
    int64_t seg = p->schedule == DDP_PIPE_FLUSH ? p->microbatches : n;
    if (seg > 0 && n % seg)
        return fail(p, DDP_EINVAL, "%lld minibatches are not a multiple of %d microbatches",
                    (long long)n, p->microbatches);
    int r = 0;
    for (int64_t at = 0; r == 0 && at < n; at += seg)
        r = run_segment(p, first + at, seg);
    for (int k = 0; k < p->nslots; k++) {
        int r2 = wait_send(p, &p->slots[k].out_work, "activations", p->slots[k].mb);
        int r3 = wait_send(p, &p->slots[k].gin_work, "gradient", p->slots[k].mb);
        if (r == 0)
            r = r2 < 0 ? r2 : r3;
    }
    return r;
}

int ddp_pipe_stage(const struct ddp_pipe *p)
{
    return p->stage;
}

int ddp_pipe_replica(const struct ddp_pipe *p)
{
    return p->replica;
}

int ddp_pipe_warmup(const struct ddp_pipe *p)
{
    return p->warmup;
}

int ddp_pipe_slots(const struct ddp_pipe *p)
{
    return p->nslots;
}

int64_t ddp_pipe_version(const struct ddp_pipe *p)
{
    return p->version;
}

struct ddp_pg *ddp_pipe_replica_group(const struct ddp_pipe *p)
{
    return p->reps;
}

const char *ddp_pipe_last_error(const struct ddp_pipe *p)
{
    return p->err[0] ? p->err : "no error";
}
