/*
 * A profile's antichain DAG (PipeDream's graph.py: augment_antichain, next_antichains,
 * antichain_dag, topological_sort), the states the planner splits. A state is an antichain of
 * layers; it stands for that antichain and every layer before it, so that a split after a state
 * cuts the model where only the antichain's activations cross. For a chain there is one state
 * per layer. Sets of layers and of states are bitsets.
 */
#include "pipeline/plan.h"

#include "common/err.h"
#include "common/htab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* a list of layers with the bitset of the same layers */
struct lset {
    size_t *v, n;
    uint64_t *bits;
};

struct anti {
    struct ddp_hnode h;
    uint64_t *key;   /* bitset of the (de-augmented) antichain */
    size_t *list, n; /* its layers, in the order graph.py keeps them */
    size_t id;
    bool expanded;
    size_t *next, nnext, capnext; /* antichain-DAG edges, first occurrence order */
};

struct builder {
    const struct ddp_profile *p;
    size_t L, w; /* layers, words per layer bitset */
    bool *alive;
    size_t **out, *nout;   /* alive out-edges per layer, file order */
    uint64_t *pred, *succ; /* transitive, per layer */
    struct ddp_htab tab;
    struct anti **all;
    size_t nall, capall;
};

static uint64_t *row(uint64_t *m, size_t w, size_t k)
{
    return m + k * w;
}

static void set_bit(uint64_t *b, size_t k)
{
    b[k / 64] |= 1ull << (k % 64);
}

static bool meets(const uint64_t *a, const uint64_t *b, size_t w)
{
    for (size_t k = 0; k < w; k++)
        if (a[k] & b[k])
            return true;
    return false;
}

static int push(void **arr, size_t *n, size_t *cap, const void *elem, size_t sz)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        void *q = realloc(*arr, nc * sz);
        if (!q)
            return DDP_ENOMEM;
        *arr = q;
        *cap = nc;
    }
    memcpy((char *)*arr + *n * sz, elem, sz);
    (*n)++;
    return 0;
}

/* Leaves out inputs (sources named Input...) and then __getitem__ sinks, as the planner does. */
static void prune(struct builder *b, struct ddp_pstates *s)
{
    const struct ddp_profile *p = b->p;
    size_t *indeg = calloc(b->L, sizeof(size_t)), *outdeg = calloc(b->L, sizeof(size_t));
    if (!indeg || !outdeg)
        goto out;
    for (size_t e = 0; e < p->nedges; e++)
        indeg[p->edges[e][1]]++;
    for (size_t k = 0; k < b->L; k++)
        if (indeg[k] == 0 && strncmp(p->layers[k].desc, "Input", 5) == 0)
            s->input[k] = true, b->alive[k] = false;
    for (size_t e = 0; e < p->nedges; e++)
        if (b->alive[p->edges[e][0]] && b->alive[p->edges[e][1]])
            outdeg[p->edges[e][0]]++;
    for (size_t k = 0; k < b->L; k++)
        if (b->alive[k] && outdeg[k] == 0 && strncmp(p->layers[k].desc, "__getitem__", 11) == 0)
            s->dropped[k] = true, b->alive[k] = false;
out:
    free(indeg);
    free(outdeg);
}

static int graph_sets(struct builder *b)
{
    const struct ddp_profile *p = b->p;
    size_t L = b->L, cap;
    b->out = calloc(L, sizeof(size_t *));
    b->nout = calloc(L, sizeof(size_t));
    b->pred = calloc(L * b->w, sizeof(uint64_t));
    b->succ = calloc(L * b->w, sizeof(uint64_t));
    size_t *indeg = calloc(L, sizeof(size_t)), *order = malloc(L * sizeof(size_t));
    size_t *caps = calloc(L, sizeof(size_t));
    int r = DDP_ENOMEM;
    if (!b->out || !b->nout || !b->pred || !b->succ || !indeg || !order || !caps)
        goto out;
    for (size_t e = 0; e < p->nedges; e++) {
        size_t u = p->edges[e][0], v = p->edges[e][1];
        if (!b->alive[u] || !b->alive[v])
            continue;
        cap = caps[u];
        if (push((void **)&b->out[u], &b->nout[u], &cap, &v, sizeof(v)) < 0)
            goto out;
        caps[u] = cap;
        indeg[v]++;
    }
    /* topological order of the layers (the profile was checked acyclic) */
    size_t head = 0, tail = 0;
    for (size_t k = 0; k < L; k++)
        if (b->alive[k] && indeg[k] == 0)
            order[tail++] = k;
    while (head < tail) {
        size_t u = order[head++];
        for (size_t a = 0; a < b->nout[u]; a++)
            if (--indeg[b->out[u][a]] == 0)
                order[tail++] = b->out[u][a];
    }
    for (size_t t = 0; t < tail; t++) {
        size_t u = order[t];
        for (size_t a = 0; a < b->nout[u]; a++) {
            uint64_t *pv = row(b->pred, b->w, b->out[u][a]), *pu = row(b->pred, b->w, u);
            for (size_t k = 0; k < b->w; k++)
                pv[k] |= pu[k];
            set_bit(pv, u);
        }
    }
    for (size_t t = tail; t-- > 0;) {
        size_t u = order[t];
        uint64_t *su = row(b->succ, b->w, u);
        for (size_t a = 0; a < b->nout[u]; a++) {
            uint64_t *sv = row(b->succ, b->w, b->out[u][a]);
            for (size_t k = 0; k < b->w; k++)
                su[k] |= sv[k];
            set_bit(su, b->out[u][a]);
        }
    }
    r = 0;
out:
    free(indeg);
    free(order);
    free(caps);
    return r;
}

/* graph.py's augment_antichain: the antichain plus the layers before it that still feed a layer
 * not before it (their activations are live across the cut). Extras first, in layer order. */
static int augment(struct builder *b, const size_t *a, size_t n, struct lset *out)
{
    uint64_t *extra = calloc(b->w, sizeof(uint64_t));
    out->bits = calloc(b->w, sizeof(uint64_t));
    out->v = malloc((b->L + n) * sizeof(size_t));
    out->n = 0;
    if (!extra || !out->bits || !out->v) {
        free(extra);
        return DDP_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const uint64_t *pa = row(b->pred, b->w, a[i]);
        for (size_t q = 0; q < b->L; q++) {
            if (!ddp__bit(pa, q) || ddp__bit(extra, q))
                continue;
            for (size_t o = 0; o < b->nout[q]; o++) {
                size_t x = b->out[q][o];
                if (!ddp__bit(pa, x) && x != a[i]) {
                    set_bit(extra, q);
                    break;
                }
            }
        }
    }
    for (size_t q = 0; q < b->L; q++)
        if (ddp__bit(extra, q))
            out->v[out->n++] = q, set_bit(out->bits, q);
    for (size_t i = 0; i < n; i++)
        out->v[out->n++] = a[i], set_bit(out->bits, a[i]);
    free(extra);
    return 0;
}

/* The antichain with this key, made (unexpanded) if new. */
static int lookup(struct builder *b, size_t *list, size_t n, struct anti **found)
{
    uint64_t *key = calloc(b->w, sizeof(uint64_t));
    if (!key)
        return DDP_ENOMEM;
    for (size_t i = 0; i < n; i++)
        set_bit(key, list[i]);
    struct ddp_hnode *h = ddp_htab_find(&b->tab, key, b->w * 8);
    if (h) {
        free(key);
        free(list);
        *found = (struct anti *)h;
        return 0;
    }
    struct anti *x = calloc(1, sizeof(*x));
    if (!x || push((void **)&b->all, &b->nall, &b->capall, &x, sizeof(x)) < 0) {
        free(x);
        free(key);
        free(list);
        return DDP_ENOMEM;
    }
    x->key = key;
    x->list = list;
    x->n = n;
    x->id = b->nall - 1;
    x->h.key = (const uint8_t *)key;
    x->h.klen = (uint32_t)(b->w * 8);
    ddp_htab_insert(&b->tab, &x->h);
    *found = x;
    return 0;
}

static int add_edge(struct anti *from, size_t to)
{
    for (size_t k = 0; k < from->nnext; k++)
        if (from->next[k] == to)
            return 0;
    return push((void **)&from->next, &from->nnext, &from->capnext, &to, sizeof(to));
}

/* graph.py's next_antichains: move one layer of the augmented antichain to a successor whose
 * own successors are all outside it, and drop what is then before another member. */
static int expand(struct builder *b, struct anti *x, size_t **queue, size_t *nq, size_t *capq)
{
    struct lset aa;
    int r = augment(b, x->list, x->n, &aa);
    if (r < 0)
        return r;
    uint64_t *nb = malloc(b->w * sizeof(uint64_t));
    if (!nb) {
        r = DDP_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < aa.n && r == 0; i++) {
        size_t u = aa.v[i];
        for (size_t o = 0; o < b->nout[u] && r == 0; o++) {
            size_t v = b->out[u][o];
            if (ddp__bit(x->key, v) || meets(row(b->succ, b->w, v), aa.bits, b->w))
                continue;
            memcpy(nb, aa.bits, b->w * sizeof(uint64_t));
            nb[u / 64] &= ~(1ull << (u % 64));
            set_bit(nb, v);
            size_t *list = malloc(aa.n * sizeof(size_t)), n = 0;
            if (!list) {
                r = DDP_ENOMEM;
                break;
            }
            for (size_t k = 0; k < aa.n; k++) {
                size_t y = aa.v[k] == u ? v : aa.v[k];
                bool keep = !meets(row(b->succ, b->w, y), nb, b->w);
                for (size_t z = 0; z < n && keep; z++)
                    keep = list[z] != y;
                if (keep)
                    list[n++] = y;
            }
            struct anti *y;
            if ((r = lookup(b, list, n, &y)) < 0)
                break;
            if ((r = add_edge(x, y->id)) < 0)
                break;
            r = push((void **)queue, nq, capq, &y->id, sizeof(y->id));
        }
    }
out:
    free(nb);
    free(aa.v);
    free(aa.bits);
    return r;
}

/* graph.py's topological_sort: depth-first from each antichain in the order they were found,
 * successors in edge order, each finished one put in front. */
static int topo(struct builder *b, size_t *order)
{
    size_t N = b->nall, pos = N;
    char *mark = calloc(N, 1);
    size_t *stack = malloc(N * sizeof(size_t)), *it = calloc(N, sizeof(size_t));
    if (!mark || !stack || !it) {
        free(mark);
        free(stack);
        free(it);
        return DDP_ENOMEM;
    }
    for (size_t root = 0; root < N; root++) {
        if (mark[root])
            continue;
        size_t sp = 0;
        stack[sp++] = root;
        mark[root] = 1;
        while (sp) {
            struct anti *x = b->all[stack[sp - 1]];
            if (it[x->id] < x->nnext) {
                size_t y = x->next[it[x->id]++];
                if (!mark[y]) {
                    mark[y] = 1;
                    stack[sp++] = y;
                }
            } else {
                order[--pos] = x->id;
                sp--;
            }
        }
    }
    free(mark);
    free(stack);
    free(it);
    return 0;
}

static int fill_states(struct builder *b, const size_t *order, struct ddp_pstates *s)
{
    size_t N = b->nall;
    s->n = N;
    s->swords = (N + 63) / 64;
    s->lwords = b->w;
    s->st = calloc(N, sizeof(*s->st));
    s->preds = calloc(N * s->swords, sizeof(uint64_t));
    s->covered = calloc(N * b->w, sizeof(uint64_t));
    size_t *pos = malloc(N * sizeof(size_t));
    int r = DDP_ENOMEM;
    if (!s->st || !s->preds || !s->covered || !pos)
        goto out;
    for (size_t k = 0; k < N; k++)
        pos[order[k]] = k;
    for (size_t k = 0; k < N; k++) {
        struct anti *x = b->all[order[k]];
        struct lset aa;
        if (augment(b, x->list, x->n, &aa) < 0)
            goto out;
        struct ddp_pstate *st = &s->st[k];
        st->anti = aa.v;
        st->nanti = aa.n;
        uint64_t *cov = row(s->covered, b->w, k);
        for (size_t i = 0; i < aa.n; i++) {
            const uint64_t *pa = row(b->pred, b->w, aa.v[i]);
            for (size_t q = 0; q < b->w; q++)
                cov[q] |= pa[q];
            st->out_bytes += b->p->layers[aa.v[i]].act_bytes;
        }
        free(aa.bits);
        for (size_t i = 0; i < aa.n; i++)
            set_bit(cov, aa.v[i]);
        for (size_t q = 0; q < b->L; q++)
            if (ddp__bit(cov, q)) {
                const struct ddp_layer *ly = &b->p->layers[q];
                st->compute_s += (ly->fwd_ms + ly->bwd_ms) / 1000.0;
                st->act_bytes += ly->act_bytes;
                st->param_bytes += ly->param_bytes;
            }
    }
    /* antichain-DAG predecessors, pushed along the edges in topological order */
    for (size_t k = 0; k < N; k++) {
        struct anti *x = b->all[order[k]];
        uint64_t *pk = row(s->preds, s->swords, k);
        for (size_t e = 0; e < x->nnext; e++) {
            uint64_t *py = row(s->preds, s->swords, pos[x->next[e]]);
            for (size_t q = 0; q < s->swords; q++)
                py[q] |= pk[q];
            set_bit(py, k);
        }
    }
    r = 0;
out:
    free(pos);
    return r;
}

int ddp__pipe_states(const struct ddp_profile *p, struct ddp_pstates *s, char *err, size_t errlen)
{
    *s = (struct ddp_pstates){0};
    struct builder b = {.p = p, .L = p->nlayers, .w = (p->nlayers + 63) / 64};
    size_t *queue = NULL, nq = 0, capq = 0, *order = NULL;
    int r = DDP_ENOMEM;
    b.alive = malloc(b.L * sizeof(bool));
    s->input = calloc(b.L, sizeof(bool));
    s->dropped = calloc(b.L, sizeof(bool));
    if (!b.alive || !s->input || !s->dropped || ddp_htab_init(&b.tab) < 0)
        goto out;
    for (size_t k = 0; k < b.L; k++)
        b.alive[k] = true;
    prune(&b, s);
    if ((r = graph_sets(&b)) < 0)
        goto out;
    /* graph.py starts from the first source in file order */
    size_t first = b.L;
    for (size_t k = 0; k < b.L && first == b.L; k++) {
        bool source = b.alive[k];
        for (size_t q = 0; q < b.w && source; q++)
            source = row(b.pred, b.w, k)[q] == 0;
        if (source)
            first = k;
    }
    if (first == b.L) {
        snprintf(err, errlen, "the profile has no layer besides its inputs to plan");
        r = DDP_EINVAL;
        goto out;
    }
    size_t *start = malloc(sizeof(size_t));
    struct anti *x;
    r = DDP_ENOMEM;
    if (!start)
        goto out;
    *start = first;
    if ((r = lookup(&b, start, 1, &x)) < 0)
        goto out;
    if ((r = push((void **)&queue, &nq, &capq, &x->id, sizeof(x->id))) < 0)
        goto out;
    for (size_t h = 0; h < nq; h++) {
        x = b.all[queue[h]];
        if (x->expanded)
            continue;
        x->expanded = true;
        if ((r = expand(&b, x, &queue, &nq, &capq)) < 0)
            goto out;
        if (b.nall > DDP_PLAN_MAX_STATES) {
            snprintf(err, errlen,
                     "the profile's antichain DAG has over %d states (branches with many layers "
                     "multiply them): merge chains of layers inside each branch first, as the "
                     "released optimizer/scripts/compress_graph_branches.py does",
                     DDP_PLAN_MAX_STATES);
            r = DDP_EINVAL;
            goto out;
        }
    }
    r = DDP_ENOMEM;
    order = malloc(b.nall * sizeof(size_t));
    if (!order || topo(&b, order) < 0)
        goto out;
    r = fill_states(&b, order, s);
out:
    if (r == DDP_ENOMEM)
        snprintf(err, errlen, "out of memory building the profile's antichain DAG");
    for (size_t k = 0; k < b.nall; k++) {
        free(b.all[k]->key);
        free(b.all[k]->list);
        free(b.all[k]->next);
        free(b.all[k]);
    }
    free(b.all);
    ddp_htab_release(&b.tab);
    for (size_t k = 0; b.out && k < b.L; k++)
        free(b.out[k]);
    free(b.out);
    free(b.nout);
    free(b.pred);
    free(b.succ);
    free(b.alive);
    free(queue);
    free(order);
    if (r < 0)
        ddp__pipe_states_release(s);
    return r;
}

void ddp__pipe_states_release(struct ddp_pstates *s)
{
    for (size_t k = 0; s->st && k < s->n; k++)
        free(s->st[k].anti);
    free(s->st);
    free(s->preds);
    free(s->covered);
    free(s->input);
    free(s->dropped);
    *s = (struct ddp_pstates){0};
}
