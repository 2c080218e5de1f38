/*
 * PipeDream's planner, as the released optimizer_graph_hierarchical.py computes it, so that the
 * same profile, machines and bandwidths give the same split, replication and times:
 *  - a stage of states i..j replicated on r machines takes (C + 4(r-1)W/(B r) / lower) / r,
 *    compute plus the ring all-reduce of its parameters (added, not overlapped), where lower is
 *    the machine count of the level below;
 *  - A[i][j][m], the best time of the slowest stage for states i..j on m+1 machines, is the
 *    minimum over the last split k (a predecessor of j in the antichain DAG) and the last stage's
 *    machines m' of max(A[i][k][m-m'], last stage), and with an activation compression ratio the
 *    transfers 2a/(B m') into and out of the last stage (without one the released planner leaves
 *    them out);
 *  - levels: the best times with all the machines of one level are the compute times of the
 *    next (machines within a server, then servers).
 * Ties go to the smallest split point and then the fewest machines for the last stage (the
 * released planner iterates a Python set there, whose order is not fixed).
 */
#include "pipeline/plan.h"

#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

struct cell {
    double t;   /* NAN: no plan (Python's None) */
    int32_t k;  /* the split: the last stage starts after state k; -1 none */
    int16_t km; /* the machines index (m) of the part before the split */
    int16_t nm; /* machines of the last stage */
};

struct level {
    struct cell *A;
    size_t rows; /* 1 at the top level, else S + 1 */
    int M;
};

struct ctx {
    const struct ddp_pstates *s;
    const struct ddp_plan_opts *o;
    size_t S;
};

static struct cell *at(const struct level *lv, size_t S, size_t i, size_t j, int m)
{
    return &lv->A[(i * S + j) * (size_t)lv->M + (size_t)m];
}

/* sums over states i..j (i = 0: from the start), as the released planner's prefix differences */
static double range_of(const struct ddp_pstates *s, size_t i, size_t j, int what)
{
    const struct ddp_pstate *a = &s->st[j];
    double vj = what == 0 ? a->compute_s : what == 1 ? a->act_bytes : a->param_bytes;
    if (i == 0)
        return vj;
    const struct ddp_pstate *b = &s->st[i - 1];
    return vj - (what == 0 ? b->compute_s : what == 1 ? b->act_bytes : b->param_bytes);
}

/* compute time of states i..j at this level: profiled at the first, the level below's best
 * time with all its machines above it */
static double compute_of(const struct ctx *c, const struct level *below, size_t i, size_t j)
{
    if (j < i)
        return NAN;
    if (!below)
        return range_of(c->s, i, j, 0);
    return at(below, c->S, i, j, below->M - 1)->t;
}

static void solve(const struct ctx *c, const struct level *below, struct level *lv, double B,
                  double lower)
{
    const struct ddp_plan_opts *o = c->o;
    size_t S = c->S;
    int M = lv->M;
    double mem = o->memory_bytes;
    for (size_t i = 0; i < lv->rows; i++)
        for (size_t j = 0; j < S; j++)
            for (int m = 0; m < M; m++)
                *at(lv, S, i, j, m) = (struct cell){.t = NAN, .k = -1, .km = -1, .nm = -1};
    for (size_t i = 0; i < lv->rows; i++)
        for (size_t j = i; j < S; j++) {
            double C = compute_of(c, below, i, j), Aact = range_of(c->s, i, j, 1),
                   W = range_of(c->s, i, j, 2);
            int max_m = o->straight ? 1 : M;
            for (int m = 0; m < max_m; m++) {
                double stashed = ceil((double)(M - (m + 1)) / (m + 1)) * (Aact + W);
                if (mem > 0 && stashed > mem)
                    continue;
                double dp = (4.0 * m * W) / (B * (m + 1));
                dp /= lower;
                if (isnan(C))
                    continue;
                *at(lv, S, i, j, m) = (struct cell){
                    .t = (C + dp) / (m + 1), .k = -1, .km = -1, .nm = (int16_t)(m + 1)};
            }
        }
    const uint64_t *preds = c->s->preds;
    size_t sw = c->s->swords;
    for (size_t i = 0; i < lv->rows; i++)
        for (int m = 1; m < M; m++)
            for (size_t j = i + 1; j < S; j++) {
                struct cell best = *at(lv, S, i, j, m);
                if (o->fewer_machines) {
                    struct cell fewer = *at(lv, S, i, j, m - 1);
                    if (isnan(best.t) || (!isnan(fewer.t) && fewer.t < best.t))
                        best = fewer;
                }
                const uint64_t *pj = preds + j * sw, *pi = i > 0 ? preds + (i - 1) * sw : NULL;
                for (size_t k = 0; k < j; k++) {
                    if (!ddp__bit(pj, k) || (pi && ddp__bit(pi, k)))
                        continue;
                    int max_mp = o->straight ? 2 : m + 1;
                    for (int mp = 1; mp < max_mp; mp++) {
                        double in = (2.0 * c->s->st[k].out_bytes) / (B * mp), out = NAN;
                        if (j < S - 1)
                            out = (2.0 * c->s->st[j].out_bytes) / (B * mp);
                        double last = compute_of(c, below, k + 1, j);
                        if (isnan(last))
                            continue;
                        double W = range_of(c->s, k + 1, j, 2);
                        double stashed = range_of(c->s, k + 1, j, 1) + W;
                        stashed *= ceil((double)(M - (m + 1)) / mp);
                        if (mem > 0 && stashed > mem)
                            continue;
                        last = (last + (4.0 * (mp - 1) * W) / (B * mp)) / mp;
                        double before = at(lv, S, i, k, m - mp)->t;
                        if (isnan(before))
                            continue;
                        double t = fmax(before, last);
                        if (o->act_ratio > 0) {
                            t = fmax(t, in / o->act_ratio);
                            if (!isnan(out))
                                t = fmax(t, out / o->act_ratio);
                        }
                        if (isnan(best.t) || best.t > t)
                            best = (struct cell){.t = t,
                                                 .k = (int32_t)k,
                                                 .km = (int16_t)(m - mp),
                                                 .nm = (int16_t)mp};
                    }
                }
                *at(lv, S, i, j, m) = best;
            }
}

struct range {
    size_t start, end;
    int reps[DDP_PLAN_MAX_LEVELS];
};

/* The stages of states [start, end) at one level, first to last, appended to out. */
static int unfold(const struct ctx *c, const struct level *lv, int l, const struct range *in,
                  struct range **out, size_t *nout, int *unused, char *err, size_t errlen)
{
    size_t S = c->S, cap = 16, n = 0;
    struct range *tmp = malloc(cap * sizeof(*tmp));
    if (!tmp)
        return DDP_ENOMEM;
    struct cell cl = *at(lv, S, in->start, in->end - 1, lv->M - 1);
    if (isnan(cl.t)) {
        free(tmp);
        if (c->o->memory_bytes > 0)
            snprintf(err, errlen,
                     "no plan fits: every split of states %zu..%zu on %d machines stashes more "
                     "weights and activations per machine than --memory allows",
                     in->start, in->end - 1, lv->M);
        else
            snprintf(err, errlen,
                     "no plan fits: a straight pipeline of states %zu..%zu on %d machines needs "
                     "at least as many states as machines (or --fewer-machines)",
                     in->start, in->end - 1, lv->M);
        return DDP_EINVAL;
    }
    size_t end = in->end;
    int left = lv->M;
    for (;;) {
        if (n == cap) {
            struct range *q = realloc(tmp, (cap *= 2) * sizeof(*tmp));
            if (!q) {
                free(tmp);
                return DDP_ENOMEM;
            }
            tmp = q;
        }
        size_t st = cl.k >= 0 ? (size_t)cl.k + 1 : in->start;
        tmp[n] = *in;
        tmp[n].start = st;
        tmp[n].end = end;
        tmp[n].reps[l] = cl.nm;
        n++;
        left -= cl.nm;
        if (cl.k < 0)
            break;
        end = st;
        cl = *at(lv, S, in->start, (size_t)cl.k, cl.km);
    }
    *unused += left;
    struct range *q = realloc(*out, (*nout + n) * sizeof(**out));
    if (!q) {
        free(tmp);
        return DDP_ENOMEM;
    }
    *out = q;
    for (size_t k = 0; k < n; k++)
        (*out)[(*nout)++] = tmp[n - 1 - k];
    free(tmp);
    return 0;
}

static int assign_layers(const struct ddp_profile *p, const struct ddp_pstates *s,
                         struct ddp_plan *pl)
{
    pl->layer_stage = malloc((p->nlayers ? p->nlayers : 1) * sizeof(int));
    if (!pl->layer_stage)
        return DDP_ENOMEM;
    for (size_t q = 0; q < p->nlayers; q++)
        pl->layer_stage[q] = s->input[q] ? 0 : -1;
    for (size_t g = 0; g < pl->nstages; g++) {
        const uint64_t *cov = s->covered + (pl->stages[g].end - 1) * s->lwords;
        for (size_t q = 0; q < p->nlayers; q++)
            if (ddp__bit(cov, q) && pl->layer_stage[q] < 0)
                pl->layer_stage[q] = (int)g;
    }
    /* a dropped __getitem__ sink goes with what feeds it */
    for (size_t e = 0; e < p->nedges; e++) {
        size_t u = p->edges[e][0], v = p->edges[e][1];
        if (s->dropped[v] && pl->layer_stage[v] < 0)
            pl->layer_stage[v] = pl->layer_stage[u];
    }
    return 0;
}

int ddp__pipe_plan(const struct ddp_profile *p, const struct ddp_pstates *s,
                   const struct ddp_plan_opts *o, struct ddp_plan *out, char *err, size_t errlen)
{
    *out = (struct ddp_plan){0};
    struct ctx c = {.s = s, .o = o, .S = s->n};
    struct level lv[DDP_PLAN_MAX_LEVELS] = {0};
    struct range *cur = NULL, *next = NULL;
    size_t ncur = 0, nnext = 0;
    int r = DDP_ENOMEM;
    if (o->levels < 1 || o->levels > DDP_PLAN_MAX_LEVELS) {
        snprintf(err, errlen, "between 1 and %d levels of machines", DDP_PLAN_MAX_LEVELS);
        return DDP_EINVAL;
    }
    double lower = 1;
    for (int l = 0; l < o->levels; l++) {
        bool top = l == o->levels - 1;
        lv[l].M = o->machines[l];
        lv[l].rows = top ? 1 : c.S + 1;
        double cells = (double)lv[l].rows * (double)c.S * lv[l].M;
        /* rows x states x predecessors x m x m' / 4 steps of 2-3 ns: 5e9 is over ten seconds */
        double work = (double)lv[l].rows * (double)c.S * (double)c.S * lv[l].M * lv[l].M / 4;
        if (work > 5e9) {
            snprintf(err, errlen,
                     "planning level %d (%zu states, %d machines%s) would take over ten seconds: "
                     "fewer machines per level, or a profile with fewer layers",
                     l + 1, c.S, lv[l].M, top ? "" : ", every start state for the next level");
            r = DDP_EINVAL;
            goto out;
        }
        if (cells > 2e8) {
            snprintf(err, errlen,
                     "the plan's table for level %d has %.0f entries (%zu states, %d machines): "
                     "too large",
                     l + 1, cells, c.S, lv[l].M);
            r = DDP_EINVAL;
            goto out;
        }
        lv[l].A = malloc((size_t)cells * sizeof(struct cell));
        if (!lv[l].A)
            goto out;
        solve(&c, l ? &lv[l - 1] : NULL, &lv[l], o->bandwidth[l], lower);
        lower = lv[l].M;
    }
    /* unfold from the top level down: each stage of a level is split by the level below */
    cur = malloc(sizeof(*cur));
    if (!cur)
        goto out;
    cur[0] = (struct range){.start = 0, .end = c.S};
    ncur = 1;
    for (int l = o->levels - 1; l >= 0; l--) {
        int unused = 0;
        for (size_t g = 0; g < ncur; g++)
            if ((r = unfold(&c, &lv[l], l, &cur[g], &next, &nnext, &unused, err, errlen)) < 0)
                goto out;
        if (l == o->levels - 1)
            out->unused = unused;
        free(cur);
        cur = next;
        ncur = nnext;
        next = NULL;
        nnext = 0;
    }
    r = DDP_ENOMEM;
    out->stages = calloc(ncur, sizeof(*out->stages));
    if (!out->stages)
        goto out;
    out->nstages = ncur;
    for (size_t g = 0; g < ncur; g++) {
        struct ddp_plan_stage *st = &out->stages[g];
        st->start = cur[g].start;
        st->end = cur[g].end;
        st->workers = 1;
        for (int l = 0; l < o->levels; l++) {
            st->replicas[l] = cur[g].reps[l];
            st->workers *= cur[g].reps[l];
        }
        st->compute_s = range_of(s, st->start, st->end - 1, 0);
    }
    out->pipeline_s = at(&lv[o->levels - 1], c.S, 0, c.S - 1, lv[o->levels - 1].M - 1)->t;
    out->single_s = s->st[c.S - 1].compute_s;
    double P = s->st[c.S - 1].param_bytes, dp = out->single_s;
    lower = 1;
    for (int l = 0; l < o->levels; l++) {
        int M = o->machines[l];
        double comm = ((4.0 * (M - 1) * P) / (o->bandwidth[l] * M)) / lower;
        dp = (dp + comm) / M;
        lower = M;
    }
    out->dp_s = dp;
    if (!isfinite(out->pipeline_s) || !isfinite(out->dp_s)) {
        /* the profile's bounds make this unreachable; kept so no caller prints inf or nan */
        r = DDP_EINVAL;
        snprintf(err, errlen, "the profile's times and sizes over these links overflow");
        goto out;
    }
    r = assign_layers(p, s, out);
out:
    for (int l = 0; l < DDP_PLAN_MAX_LEVELS; l++)
        free(lv[l].A);
    free(cur);
    free(next);
    if (r < 0) {
        if (r == DDP_ENOMEM)
            snprintf(err, errlen, "out of memory planning");
        ddp__pipe_plan_release(out);
    }
    return r;
}

void ddp__pipe_plan_release(struct ddp_plan *pl)
{
    free(pl->stages);
    free(pl->layer_stage);
    *pl = (struct ddp_plan){0};
}
