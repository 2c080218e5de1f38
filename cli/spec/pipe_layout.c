/* A pipeline job's stages for a round's ranks (cli/spec/pipe_layout.h). */
#include "cli/spec/pipe_layout.h"
#include "cli/spec/job.h"
#include "cli/spec/keys.h"
#include "common/err.h"
#include "pipeline/plan.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return DDP_EINVAL;
}

static int alloc_stages(struct ddp__pipe_layout *L, int n)
{
    L->nstages = n;
    L->split = calloc((size_t)n, sizeof(int));
    L->replicas = calloc((size_t)n, sizeof(int));
    return L->split && L->replicas ? 0 : DDP_ENOMEM;
}

/* A profile's input sources (no incoming edge, described "Input..."), which no stage counts, as
 * the planner leaves them out (pipeline/states.c). */
static bool *input_layers(const struct ddp_profile *p)
{
    bool *in = calloc(p->nlayers ? p->nlayers : 1, sizeof(bool));
    if (!in)
        return NULL;
    for (size_t k = 0; k < p->nlayers; k++)
        in[k] = strncmp(p->layers[k].desc, "Input", 5) == 0;
    for (size_t e = 0; e < p->nedges; e++)
        in[p->edges[e][1]] = false;
    return in;
}

/* pipeline.plan: stage_id of every layer, replicas from the file, the spec or 1 each. */
static int from_plan_file(const struct ddp_job_pipeline *jp, struct ddp__pipe_layout *L, char *err,
                          size_t errlen)
{
    struct ddp_profile p;
    int r = ddp__profile_load(jp->plan_file, &p, err, errlen);
    if (r < 0)
        return r;
    bool *in = input_layers(&p);
    r = DDP_ENOMEM;
    if (!in)
        goto out;
    int nst = 0, with_rep = 0;
    for (size_t k = 0; k < p.nlayers; k++) {
        const struct ddp_layer *y = &p.layers[k];
        if (y->stage < 0 && !in[k]) {
            r = fail(err, errlen,
                     "%s:%d: layer %s has no stage_id: %s takes a graph.txt with every layer's "
                     "stage (ddprun pipeline plan PROFILE --output FILE)",
                     jp->plan_file, y->line, y->id, DDP_KEY(PIPELINE_PLAN));
            goto out;
        }
        nst = y->stage + 1 > nst ? y->stage + 1 : nst;
        with_rep += y->replicas > 0;
    }
    if (nst == 0) {
        r = fail(err, errlen, "%s: no layer has a stage_id", jp->plan_file);
        goto out;
    }
    if ((r = alloc_stages(L, nst)) < 0)
        goto out;
    for (size_t k = 0; k < p.nlayers; k++) {
        const struct ddp_layer *y = &p.layers[k];
        if (in[k])
            continue;
        L->split[y->stage]++;
        if (y->replicas > 0 && L->replicas[y->stage] && L->replicas[y->stage] != y->replicas) {
            r = fail(err, errlen, "%s:%d: layer %s of stage %d has replicas=%d, an earlier one %d",
                     jp->plan_file, y->line, y->id, y->stage, y->replicas, L->replicas[y->stage]);
            goto out;
        }
        if (y->replicas > 0)
            L->replicas[y->stage] = y->replicas;
    }
    for (int s = 0; s < nst; s++)
        if (!L->split[s]) {
            r = fail(err, errlen, "%s: stage %d has no layer (stage ids are 0 to %d)",
                     jp->plan_file, s, nst - 1);
            goto out;
        }
    if (jp->replicas) {
        if (with_rep) {
            r = fail(err, errlen,
                     "%s gives each stage's replicas (replicas=R): %s would contradict it; leave "
                     "one out",
                     jp->plan_file, DDP_KEY(PIPELINE_REPLICAS));
            goto out;
        }
        if (jp->nreplicas != nst) {
            r = fail(err, errlen, "%s has %d count%s for the %d stage%s of %s",
                     DDP_KEY(PIPELINE_REPLICAS), jp->nreplicas, jp->nreplicas == 1 ? "" : "s", nst,
                     nst == 1 ? "" : "s", jp->plan_file);
            goto out;
        }
        memcpy(L->replicas, jp->replicas, (size_t)nst * sizeof(int));
    }
    for (int s = 0; s < nst; s++)
        if (!L->replicas[s])
            L->replicas[s] = 1;
    r = 0;
out:
    free(in);
    ddp__profile_release(&p);
    return r;
}

/* pipeline.auto: the planner on the profile, for these nodes. */
static int from_planner(const struct ddp_job_pipeline *jp, const int *slots, int nnodes, int world,
                        struct ddp__pipe_layout *L, char *err, size_t errlen)
{
    struct ddp_plan_opts o = {.act_ratio = 1, .straight = jp->straight};
    char rates[256];
    snprintf(rates, sizeof(rates), "%s", jp->bandwidth);
    char *comma = strchr(rates, ',');
    if (comma)
        *comma = '\0';
    if (!ddp__pipe_parse_rate(rates, &o.bandwidth[0]) ||
        (comma && !ddp__pipe_parse_rate(comma + 1, &o.bandwidth[1])))
        return fail(err, errlen, "%s '%s' is not a link rate", DDP_KEY(PIPELINE_AUTO_BANDWIDTH),
                    jp->bandwidth);
    if (jp->memory && !ddp__pipe_parse_bytes(jp->memory, &o.memory_bytes))
        return fail(err, errlen, "%s '%s' is not a size", DDP_KEY(PIPELINE_AUTO_MEMORY),
                    jp->memory);
    if (comma) {
        /* two levels: the ranks of a node, then the nodes */
        for (int i = 1; i < nnodes; i++)
            if (slots[i] != slots[0])
                return fail(err, errlen,
                            "%s has a rate within a node and one between nodes, which plans "
                            "nodes of equal ranks; these have %d and %d (give one rate to plan "
                            "the ranks as equals)",
                            DDP_KEY(PIPELINE_AUTO_BANDWIDTH), slots[0], slots[i]);
        o.levels = 2;
        o.machines[0] = slots[0];
        o.machines[1] = nnodes;
    } else {
        o.levels = 1;
        o.machines[0] = world;
    }
    struct ddp_profile p;
    struct ddp_pstates st;
    struct ddp_plan pl;
    char why[1024];
    int r = ddp__profile_load(jp->profile, &p, err, errlen);
    if (r < 0)
        return r;
    if ((r = ddp__pipe_states(&p, &st, why, sizeof(why))) < 0) {
        fail(err, errlen, "%s: %s", jp->profile, why);
        goto out_profile;
    }
    if ((r = ddp__pipe_plan(&p, &st, &o, &pl, why, sizeof(why))) < 0) {
        fail(err, errlen, "%s: %s", jp->profile, why);
        goto out_states;
    }
    bool *in = input_layers(&p);
    r = DDP_ENOMEM;
    if (in && alloc_stages(L, (int)pl.nstages) == 0) {
        for (size_t g = 0; g < pl.nstages; g++)
            L->replicas[g] = pl.stages[g].workers;
        for (size_t k = 0; k < p.nlayers; k++)
            if (!in[k] && pl.layer_stage[k] >= 0)
                L->split[pl.layer_stage[k]]++;
        L->pipeline_ms = pl.pipeline_s * 1e3;
        L->dp_ms = pl.dp_s * 1e3;
        r = 0;
        for (size_t g = 0; g < pl.nstages && r == 0; g++)
            if (!L->split[g])
                r = fail(err, errlen, "%s: the planner's stage %zu has only input layers",
                         jp->profile, g);
    }
    free(in);
    ddp__pipe_plan_release(&pl);
out_states:
    ddp__pipe_states_release(&st);
out_profile:
    ddp__profile_release(&p);
    return r;
}

int ddp__pipe_layout(const struct ddp_job_pipeline *p, const int *slots, int nnodes,
                     struct ddp__pipe_layout *L, char *err, size_t errlen)
{
    memset(L, 0, sizeof(*L));
    int world = 0, r;
    for (int i = 0; i < nnodes; i++)
        world += slots[i];
    if (p->split) {
        L->source = "split";
        if ((r = alloc_stages(L, p->nsplit)) < 0)
            goto fail;
        for (int s = 0; s < p->nsplit; s++) {
            L->split[s] = p->split[s];
            L->replicas[s] = p->replicas ? p->replicas[s] : 1;
        }
    } else if (p->plan_file) {
        L->source = "plan";
        if ((r = from_plan_file(p, L, err, errlen)) < 0)
            goto fail;
    } else {
        L->source = "auto";
        if ((r = from_planner(p, slots, nnodes, world, L, err, errlen)) < 0)
            goto fail;
    }
    long sum = 0;
    for (int s = 0; s < L->nstages; s++)
        sum += L->replicas[s];
    if (sum != world) {
        char list[256];
        size_t o = 0;
        for (int s = 0; s < L->nstages && o < sizeof(list) - 16; s++)
            o +=
                (size_t)snprintf(list + o, sizeof(list) - o, "%s%d", s ? ", " : "", L->replicas[s]);
        r = fail(err, errlen,
                 "the pipeline's stages take %ld rank%s (replicas [%s]%s%s%s) and the job has "
                 "%d: each rank runs one stage's replica%s%s%s",
                 sum, sum == 1 ? "" : "s", list,
                 p->replicas    ? ""
                 : p->plan_file ? (p->nreplicas ? "" : ", from the plan file or 1 each")
                                : ", 1 each unless ",
                 p->replicas || p->plan_file ? "" : DDP_KEY(PIPELINE_REPLICAS),
                 p->replicas || p->plan_file ? "" : " says", world, p->profile ? "" : "; ",
                 p->profile ? "" : DDP_KEY(PIPELINE_AUTO),
                 p->profile ? "" : " plans for whatever ranks a round has");
        goto fail;
    }
    return 0;
fail:
    if (r == DDP_ENOMEM)
        snprintf(err, errlen, "out of memory");
    ddp__pipe_layout_release(L);
    return r;
}

int ddp__pipe_layout_job(const struct ddp_job *j, struct ddp__pipe_layout *L, char *err,
                         size_t errlen)
{
    int *slots = calloc(j->nnodes ? j->nnodes : 1, sizeof(int));
    if (!slots) {
        memset(L, 0, sizeof(*L));
        snprintf(err, errlen, "out of memory");
        return DDP_ENOMEM;
    }
    for (size_t i = 0; i < j->nnodes; i++)
        slots[i] = j->nodes[i].slots;
    int r = ddp__pipe_layout(&j->pipe, slots, (int)j->nnodes, L, err, errlen);
    free(slots);
    return r;
}

void ddp__pipe_layout_release(struct ddp__pipe_layout *L)
{
    free(L->split);
    free(L->replicas);
    L->split = L->replicas = NULL;
    L->nstages = 0;
}

void ddp__pipe_layout_rank(const struct ddp__pipe_layout *L, int r, int *stage, int *replica)
{
    int first = 0;
    for (int s = 0; s < L->nstages; s++) {
        if (r < first + L->replicas[s]) {
            *stage = s;
            *replica = r - first;
            return;
        }
        first += L->replicas[s];
    }
    *stage = *replica = -1;
}

static void join(char *out, size_t n, const int *v, int cnt)
{
    size_t o = 0;
    out[0] = '\0';
    for (int k = 0; k < cnt && o < n; k++) {
        int w = snprintf(out + o, n - o, "%s%d", k ? "," : "", v[k]);
        o += w > 0 ? (size_t)w : 0;
    }
}

/* env[*e] = "key=value" */
static int put(char **env, int *e, const char *key, const char *value)
{
    size_t len = strlen(key) + strlen(value) + 2;
    if (!(env[*e] = malloc(len)))
        return -1;
    snprintf(env[(*e)++], len, "%s=%s", key, value);
    return 0;
}

char **ddp__pipe_layout_env(const struct ddp_job_pipeline *p, const struct ddp__pipe_layout *L)
{
    size_t cap = (size_t)L->nstages * 12 + 64;
    char **env = calloc(7, sizeof(char *));
    char *list = malloc(cap), num[32];
    int e = 0;
    if (!env || !list)
        goto oom;
    snprintf(num, sizeof(num), "%d", L->nstages);
    if (put(env, &e, "DDPRUN_PIPELINE_STAGES", num) < 0)
        goto oom;
    join(list, cap, L->split, L->nstages);
    if (put(env, &e, "DDPRUN_PIPELINE_SPLIT", list) < 0)
        goto oom;
    join(list, cap, L->replicas, L->nstages);
    if (put(env, &e, "DDPRUN_PIPELINE_REPLICAS", list) < 0 ||
        put(env, &e, "DDPRUN_PIPELINE_SCHEDULE", p->flush ? "flush" : "1f1b") < 0)
        goto oom;
    snprintf(num, sizeof(num), "%d", p->microbatches);
    if (p->flush && put(env, &e, "DDPRUN_PIPELINE_MICROBATCHES", num) < 0)
        goto oom;
    snprintf(num, sizeof(num), "%d", p->microbatch_size);
    if (p->microbatch_size && put(env, &e, "DDPRUN_PIPELINE_MICROBATCH_SIZE", num) < 0)
        goto oom;
    free(list);
    return env;
oom:
    for (int k = 0; env && k < e; k++)
        free(env[k]);
    free(env);
    free(list);
    return NULL;
}

void ddp__pipe_layout_print(const struct ddp_job_pipeline *p, const struct ddp__pipe_layout *L,
                            FILE *f)
{
    fprintf(f, "%s: {%s: [", DDP_KEY(PIPELINE), ddp__key_name(DDP_K_PIPELINE_SPLIT));
    for (int s = 0; s < L->nstages; s++)
        fprintf(f, "%s%d", s ? ", " : "", L->split[s]);
    fprintf(f, "], %s: [", ddp__key_name(DDP_K_PIPELINE_REPLICAS));
    for (int s = 0; s < L->nstages; s++)
        fprintf(f, "%s%d", s ? ", " : "", L->replicas[s]);
    fprintf(f, "], %s: %s", ddp__key_name(DDP_K_PIPELINE_SCHEDULE), p->flush ? "flush" : "1f1b");
    if (p->flush)
        fprintf(f, ", %s: %d", ddp__key_name(DDP_K_PIPELINE_MICROBATCHES), p->microbatches);
    if (p->microbatch_size)
        fprintf(f, ", %s: %d", ddp__key_name(DDP_K_PIPELINE_MICROBATCH_SIZE), p->microbatch_size);
    if (p->plan_file)
        fprintf(f, "}   # from %s\n", p->plan_file);
    else if (p->profile)
        fprintf(f,
                "}   # planned on %s for bandwidth %s%s: %.4g ms per minibatch, data parallel "
                "%.4g ms (%.2fx)\n",
                p->profile, p->bandwidth, p->straight ? ", straight" : "", L->pipeline_ms, L->dp_ms,
                L->pipeline_ms > 0 ? L->dp_ms / L->pipeline_ms : 0.0);
    else
        fprintf(f, "}\n");
}

bool ddp__pipe_env_rank(const char *replicas, int rank, int *stage, int *replica)
{
    int first = 0, s = 0;
    for (const char *q = replicas; q && *q; s++) {
        char *end;
        errno = 0;
        long v = strtol(q, &end, 10);
        if (end == q || errno || v < 1 || v > 1000000 || (*end && *end != ','))
            return false;
        if (rank >= first && rank < first + v) {
            *stage = s;
            *replica = rank - first;
            return true;
        }
        first += (int)v;
        q = *end ? end + 1 : end;
    }
    return false;
}

char **ddp__pipe_round_env(const struct ddp_job_pipeline *p, char *const *base, const int *slots,
                           int nnodes, int *nowned, char *err, size_t errlen)
{
    struct ddp__pipe_layout L;
    if (ddp__pipe_layout(p, slots, nnodes, &L, err, errlen) < 0)
        return NULL;
    char **pe = ddp__pipe_layout_env(p, &L), **env = NULL;
    ddp__pipe_layout_release(&L);
    size_t np = 0, nb = 0;
    while (pe && pe[np])
        np++;
    while (base && base[nb])
        nb++;
    if (pe && (env = calloc(np + nb + 1, sizeof(char *)))) {
        memcpy(env, pe, np * sizeof(char *));
        if (nb)
            memcpy(env + np, base, nb * sizeof(char *));
        *nowned = (int)np;
    } else {
        for (size_t k = 0; k < np; k++)
            free(pe[k]);
        snprintf(err, errlen, "out of memory");
    }
    free(pe);
    return env;
}
