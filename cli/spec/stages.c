/*
 * The job spec's pipeline section (cli/spec/values.h): the stages' split (layers per stage),
 * from the spec, a plan file or PipeDream's planner on a profile, the ranks of each stage, the
 * schedule and its microbatches. What it means for a round's ranks is cli/spec/pipe_layout.c's.
 */
#include "cli/spec/job.h"
#include "cli/spec/values.h"
#include "cli/spec/pipe_layout.h"
#include "cli/spec/keys.h"
#include "pipeline/plan.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define MAX_STAGES 4096

/* A list of whole numbers 1..hi: *out (malloc'd), *n. */
static int int_list(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what, long hi,
                    int **out, int *count)
{
    if (n->type != DDP_Y_SEQ || n->n == 0 || n->n > MAX_STAGES) {
        ddp__jv_err(c, n, "%s must be a list of 1 to %d whole numbers, one per stage ([2, 1, 1])",
                    what, MAX_STAGES);
        return -1;
    }
    if (!(*out = calloc(n->n, sizeof(int))))
        return -1;
    *count = (int)n->n;
    for (size_t k = 0; k < n->n; k++)
        if (ddp__jv_int(c, n->kids[k], what, 1, hi, &(*out)[k]) < 0)
            return -1;
    return 0;
}

/* A path value: *out (freed first) the path resolved against basedir. */
static int path_value(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what,
                      const char *basedir, char **out)
{
    if (ddp__jv_str(c, n, what, out) < 0)
        return -1;
    char *abs = ddp__jv_path(basedir, *out);
    free(*out);
    *out = abs;
    return abs ? 0 : -1;
}

static int load_auto(const struct ddp__jctx *c, const struct ddp_ynode *a, const char *basedir,
                     struct ddp_job_pipeline *p)
{
    const struct ddp_ynode *n;
    if (a->type != DDP_Y_MAP) {
        ddp__jv_err(c, a, "%s must be a mapping: {profile: graph.txt, bandwidth: 1Gbit}",
                    DDP_KEY(PIPELINE_AUTO));
        return -1;
    }
    if (ddp__key_check(c, a, DDP_K_PIPELINE_AUTO) < 0)
        return -1;
    if (!(n = ddp__key_get(a, DDP_K_PIPELINE_AUTO_PROFILE)) ||
        !ddp__key_get(a, DDP_K_PIPELINE_AUTO_BANDWIDTH)) {
        ddp__jv_err(c, a,
                    "%s needs profile (a PipeDream graph.txt, as ddprun-fmnist "
                    "--profile-graph writes) and bandwidth (between nodes: 1Gbit; or within a "
                    "node and between nodes: [100Gbit, 1Gbit])",
                    DDP_KEY(PIPELINE_AUTO));
        return -1;
    }
    if (path_value(c, n, DDP_KEY(PIPELINE_AUTO_PROFILE), basedir, &p->profile) < 0)
        return -1;
    n = ddp__key_get(a, DDP_K_PIPELINE_AUTO_BANDWIDTH);
    size_t cnt = n->type == DDP_Y_SEQ ? n->n : 1;
    if (n->type == DDP_Y_MAP || cnt < 1 || cnt > 2) {
        ddp__jv_err(c, n,
                    "%s is a link rate (1Gbit: between all ranks) or two "
                    "([100Gbit, 1Gbit]: within a node, between nodes)",
                    DDP_KEY(PIPELINE_AUTO_BANDWIDTH));
        return -1;
    }
    size_t len = 0;
    for (size_t k = 0; k < cnt; k++) {
        const struct ddp_ynode *e = n->type == DDP_Y_SEQ ? n->kids[k] : n;
        double bps;
        if (ddp__jv_scalar(c, e, DDP_KEY(PIPELINE_AUTO_BANDWIDTH)) < 0)
            return -1;
        if (!ddp__pipe_parse_rate(e->str, &bps)) {
            ddp__jv_err(c, e,
                        "%s: '%s' is not a link rate (10Gbit, 100Mbit/s, 1.25GB/s, or bytes/s)",
                        DDP_KEY(PIPELINE_AUTO_BANDWIDTH), e->str);
            return -1;
        }
        len += strlen(e->str) + 1;
    }
    if (!(p->bandwidth = calloc(len + 1, 1)))
        return -1;
    size_t o = 0;
    for (size_t k = 0; k < cnt; k++) {
        const struct ddp_ynode *e = n->type == DDP_Y_SEQ ? n->kids[k] : n;
        o += (size_t)snprintf(p->bandwidth + o, len + 1 - o, "%s%s", k ? "," : "", e->str);
    }
    if ((n = ddp__key_get(a, DDP_K_PIPELINE_AUTO_MEMORY))) {
        double b;
        if (ddp__jv_str(c, n, DDP_KEY(PIPELINE_AUTO_MEMORY), &p->memory) < 0)
            return -1;
        if (!ddp__pipe_parse_bytes(p->memory, &b)) {
            ddp__jv_err(c, n, "%s: '%s' is not a size (16GB, 16GiB, bytes)",
                        DDP_KEY(PIPELINE_AUTO_MEMORY), p->memory);
            return -1;
        }
    }
    if ((n = ddp__key_get(a, DDP_K_PIPELINE_AUTO_STRAIGHT)) &&
        ddp__jv_bool(c, n, DDP_KEY(PIPELINE_AUTO_STRAIGHT), &p->straight) < 0)
        return -1;
    return 0;
}

int ddp__job_pipeline(const struct ddp__jctx *c, const struct ddp_ynode *sub, const char *basedir,
                      struct ddp_job *j)
{
    struct ddp_job_pipeline *p = &j->pipe;
    const struct ddp_ynode *n, *split, *plan, *au;
    if (sub->type != DDP_Y_MAP) {
        ddp__jv_err(c, sub,
                    "pipeline must be a mapping: {split: [2, 1, 1], replicas: [1, 2, 1]}, "
                    "{plan: FILE} or {auto: {profile: FILE, bandwidth: RATE}}");
        return -1;
    }
    if (ddp__key_check(c, sub, DDP_K_PIPELINE) < 0)
        return -1;
    p->on = true;
    p->microbatches = 4;
    split = ddp__key_get(sub, DDP_K_PIPELINE_SPLIT);
    plan = ddp__key_get(sub, DDP_K_PIPELINE_PLAN);
    au = ddp__key_get(sub, DDP_K_PIPELINE_AUTO);
    if ((split != NULL) + (plan != NULL) + (au != NULL) != 1) {
        ddp__jv_err(c, sub,
                    "pipeline needs one of split (layers per stage: [2, 1, 1]), plan (a "
                    "graph.txt with stage_id, as ddprun pipeline plan --output writes) or auto "
                    "({profile: FILE, bandwidth: RATE}: planned for the job's ranks)%s",
                    split || plan || au ? ", not several" : "");
        return -1;
    }
    if (split && int_list(c, split, DDP_KEY(PIPELINE_SPLIT), 1000000, &p->split, &p->nsplit) < 0)
        return -1;
    if (plan && path_value(c, plan, DDP_KEY(PIPELINE_PLAN), basedir, &p->plan_file) < 0)
        return -1;
    if (au && load_auto(c, au, basedir, p) < 0)
        return -1;
    if ((n = ddp__key_get(sub, DDP_K_PIPELINE_REPLICAS))) {
        if (au) {
            ddp__jv_err(c, n,
                        "%s goes with split or plan; with auto the planner chooses each stage's "
                        "replicas",
                        DDP_KEY(PIPELINE_REPLICAS));
            return -1;
        }
        if (int_list(c, n, DDP_KEY(PIPELINE_REPLICAS), 1000000, &p->replicas, &p->nreplicas) < 0)
            return -1;
        if (split && p->nreplicas != p->nsplit) {
            ddp__jv_err(c, n, "%s has %d count%s for the %d stage%s of split",
                        DDP_KEY(PIPELINE_REPLICAS), p->nreplicas, p->nreplicas == 1 ? "" : "s",
                        p->nsplit, p->nsplit == 1 ? "" : "s");
            return -1;
        }
    }
    if ((n = ddp__key_get(sub, DDP_K_PIPELINE_SCHEDULE)) &&
        ddp__jv_enum(c, n, DDP_KEY(PIPELINE_SCHEDULE), "1f1b", "flush", &p->flush) < 0)
        return -1;
    if ((n = ddp__key_get(sub, DDP_K_PIPELINE_MICROBATCHES))) {
        if (!p->flush) {
            ddp__jv_err(c, n,
                        "%s is for schedule: flush (minibatches per update); 1F1B updates after "
                        "every minibatch",
                        DDP_KEY(PIPELINE_MICROBATCHES));
            return -1;
        }
        if (ddp__jv_int(c, n, DDP_KEY(PIPELINE_MICROBATCHES), 1, 1000000, &p->microbatches) < 0)
            return -1;
    }
    if ((n = ddp__key_get(sub, DDP_K_PIPELINE_MICROBATCH_SIZE)) &&
        ddp__jv_int(c, n, DDP_KEY(PIPELINE_MICROBATCH_SIZE), 1, 1000000000, &p->microbatch_size) <
            0)
        return -1;
    /* What the job's whole set of ranks makes of it, now: a bad plan file or profile, or
     * replicas that do not add up to the ranks, is an error at load time. */
    struct ddp__pipe_layout L;
    char err[1024];
    int r = ddp__pipe_layout_job(j, &L, err, sizeof(err));
    if (r < 0) {
        const struct ddp_ynode *rep = ddp__key_get(sub, DDP_K_PIPELINE_REPLICAS);
        ddp__jv_err(c,
                    rep && strstr(err, "ranks") ? rep
                    : split                     ? split
                    : plan                      ? plan
                                                : au,
                    "%s", err);
        return -1;
    }
    ddp__pipe_layout_release(&L);
    return 0;
}

void ddp__job_pipeline_free(struct ddp_job_pipeline *p)
{
    free(p->split);
    free(p->replicas);
    free(p->plan_file);
    free(p->profile);
    free(p->bandwidth);
    free(p->memory);
    memset(p, 0, sizeof(*p));
}
