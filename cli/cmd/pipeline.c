/* `ddprun pipeline plan PROFILE`: PipeDream's planner on a graph.txt profile (pipeline/plan.h),
 * printed as a table of stages with the predicted speedup over data parallelism. */
#include "cli/cmd/cmd.h"
#include "cli/spec/args.h"
#include "cli/sys/sys.h"
#include "common/err.h"
#include "pipeline/plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* "4" or "4,2": count values into out; false if malformed. */
static bool machine_list(const char *s, struct ddp_plan_opts *o)
{
    o->levels = 0;
    const char *q = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(q, &end, 10);
        if (end == q || errno || v < 1 || v > 4096 || o->levels == DDP_PLAN_MAX_LEVELS ||
            (*end && *end != ','))
            return false;
        o->machines[o->levels++] = (int)v;
        if (!*end)
            return true;
        q = end + 1;
    }
}

static int rate_list(const char *s, struct ddp_plan_opts *o)
{
    char buf[512];
    if (strlen(s) >= sizeof(buf))
        return -1;
    snprintf(buf, sizeof(buf), "%s", s);
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == DDP_PLAN_MAX_LEVELS || !ddp__pipe_parse_rate(t, &o->bandwidth[n]))
            return -1;
        n++;
    }
    return n;
}

static void human_rate(double bps, char *out, size_t n)
{
    double bits = bps * 8;
    if (bits >= 1e9)
        snprintf(out, n, "%g Gbit/s", bits / 1e9);
    else if (bits >= 1e6)
        snprintf(out, n, "%g Mbit/s", bits / 1e6);
    else
        snprintf(out, n, "%g kbit/s", bits / 1e3);
}

static int parse_opts(const struct ddp_cli_opts *c, struct ddp_plan_opts *o)
{
    const char *const *v = c->vals;
    if (!v[DDP_OPT_MACHINES] || !v[DDP_OPT_BANDWIDTH]) {
        ddp__cli_error("pipeline plan: --machines and --bandwidth are required (ddprun pipeline "
                       "plan PROFILE --machines 4 --bandwidth 10Gbit)");
        return -1;
    }
    if (!machine_list(v[DDP_OPT_MACHINES], o)) {
        ddp__cli_error("pipeline plan: --machines '%s' is not a list of counts 1..4096, one per "
                       "level (4, or 4,2), at most %d levels",
                       v[DDP_OPT_MACHINES], DDP_PLAN_MAX_LEVELS);
        return -1;
    }
    int nb = rate_list(v[DDP_OPT_BANDWIDTH], o);
    if (nb < 0) {
        ddp__cli_error("pipeline plan: --bandwidth '%s' is not a list of link rates (10Gbit, "
                       "100Mbit/s, 1.25GB/s, or bytes/s)",
                       v[DDP_OPT_BANDWIDTH]);
        return -1;
    }
    if (nb != o->levels) {
        ddp__cli_error("pipeline plan: --machines has %d level%s and --bandwidth %d: give a rate "
                       "for each level",
                       o->levels, o->levels == 1 ? "" : "s", nb);
        return -1;
    }
    if (v[DDP_OPT_MEMORY] && !ddp__pipe_parse_bytes(v[DDP_OPT_MEMORY], &o->memory_bytes)) {
        ddp__cli_error("pipeline plan: --memory '%s' is not a size (16GB, 16GiB, bytes)",
                       v[DDP_OPT_MEMORY]);
        return -1;
    }
    o->straight = v[DDP_OPT_STRAIGHT] != NULL;
    o->fewer_machines = v[DDP_OPT_FEWER_MACHINES] != NULL;
    o->act_ratio = 1;
    const char *ac = v[DDP_OPT_ACTIVATION_COMPRESSION];
    if (ac && strcmp(ac, "none") == 0)
        o->act_ratio = 0;
    else if (ac) {
        char *end;
        errno = 0;
        o->act_ratio = strtod(ac, &end);
        if (end == ac || *end || errno || !(o->act_ratio > 0) || o->act_ratio > 1e12) {
            ddp__cli_error("pipeline plan: --activation-compression '%s' is not a ratio > 0 or "
                           "'none'",
                           ac);
            return -1;
        }
    }
    return 0;
}

/* the ids of a stage's last state's antichain: where the stage ends */
static void ends_at(const struct ddp_profile *p, const struct ddp_pstate *st, char *out, size_t n)
{
    size_t o = 0;
    out[0] = '\0';
    for (size_t k = 0; k < st->nanti && o < n; k++) {
        if (k == 3) {
            snprintf(out + o, n - o, ",+%zu", st->nanti - 3);
            return;
        }
        int w = snprintf(out + o, n - o, "%s%s", k ? "," : "", p->layers[st->anti[k]].id);
        o += w > 0 ? (size_t)w : 0;
    }
}

static void print_plan(const char *path, const struct ddp_profile *p, const struct ddp_pstates *s,
                       const struct ddp_plan_opts *o, const struct ddp_plan *pl)
{
    size_t planned = 0;
    for (size_t q = 0; q < p->nlayers; q++)
        planned += !s->input[q] && !s->dropped[q];
    printf("profile %s: %zu layers, %zu planned as %zu states\n", path, p->nlayers, planned, s->n);
    int total = 1;
    for (int l = 0; l < o->levels; l++) {
        char r[64];
        human_rate(o->bandwidth[l], r, sizeof(r));
        printf("level %d: %d machines at %s (%.6g bytes/s)\n", l + 1, o->machines[l], r,
               o->bandwidth[l]);
        total *= o->machines[l];
    }
    if (o->act_ratio > 0)
        printf("activations between stages: counted, compression ratio %g\n", o->act_ratio);
    else
        printf("activations between stages: not counted\n");
    printf("\n%-6s %-11s %-7s %-9s %-11s %-12s %s\n", "stage", "states", "layers", "replicas",
           "compute_ms", "per_level", "ends_at");
    for (size_t g = 0; g < pl->nstages; g++) {
        const struct ddp_plan_stage *st = &pl->stages[g];
        size_t layers = 0;
        for (size_t q = 0; q < p->nlayers; q++)
            layers += pl->layer_stage[q] == (int)g;
        char range[32], per[64], end[256];
        snprintf(range, sizeof(range), "%zu-%zu", st->start, st->end - 1);
        size_t w = 0;
        per[0] = '\0';
        for (int l = 0; l < o->levels && w < sizeof(per); l++) {
            int k = snprintf(per + w, sizeof(per) - w, "%s%d", l ? "x" : "", st->replicas[l]);
            w += k > 0 ? (size_t)k : 0;
        }
        ends_at(p, &s->st[st->end - 1], end, sizeof(end));
        printf("%-6zu %-11s %-7zu %-9d %-11.3f %-12s %s\n", g, range, layers, st->workers,
               st->compute_s * 1e3, per, end);
    }
    printf("\nconfiguration: ");
    for (size_t g = 0; g < pl->nstages; g++)
        printf("%s%d", g ? "-" : "", pl->stages[g].workers);
    printf(" (workers per stage, first to last)%s\n",
           o->levels > 1 ? ", replicas per level innermost first in per_level" : "");
    if (pl->unused)
        printf("machines of the top level left unused: %d\n", pl->unused);
    printf("time per minibatch: pipeline %.9g ms (slowest stage), data parallel on %d machines "
           "%.9g ms, one machine %.9g ms\n",
           pl->pipeline_s * 1e3, total, pl->dp_s * 1e3, pl->single_s * 1e3);
    printf("predicted speedup over data parallel: %.4fx (over one machine: %.4fx)\n",
           pl->dp_s / pl->pipeline_s, pl->single_s / pl->pipeline_s);
}

static int write_stages(const char *path, struct ddp_profile *p, const struct ddp_plan *pl)
{
    for (size_t q = 0; q < p->nlayers; q++) {
        int g = pl->layer_stage[q];
        p->layers[q].stage = g;
        p->layers[q].replicas = g >= 0 ? pl->stages[g].workers : 0;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        ddp__cli_error("pipeline plan: cannot write '%s': %s", path, strerror(errno));
        return -1;
    }
    int r = ddp__profile_write(p, f);
    if (fclose(f) != 0)
        r = DDP_ESYS;
    if (r < 0) {
        ddp__cli_error("pipeline plan: cannot write '%s': %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int ddp__cmd_pipeline(const struct ddp_cli_opts *c)
{
    if (c->npos < 1 || strcmp(c->pos[0], "plan") != 0) {
        ddp__cli_error("pipeline: expected 'plan' (ddprun pipeline plan PROFILE --machines N "
                       "--bandwidth RATE)");
        return DDP_EXIT_USAGE;
    }
    if (c->npos < 2) {
        ddp__cli_error("pipeline plan: which profile? (a PipeDream graph.txt)");
        return DDP_EXIT_USAGE;
    }
    struct ddp_plan_opts o = {0};
    if (parse_opts(c, &o) < 0)
        return DDP_EXIT_USAGE;
    const char *path = c->pos[1];
    char err[1024];
    struct ddp_profile p;
    struct ddp_pstates s;
    struct ddp_plan pl;
    if (ddp__profile_load(path, &p, err, sizeof(err)) < 0) {
        ddp__cli_error("%s", err);
        return DDP_EXIT_USAGE;
    }
    int rc = DDP_EXIT_USAGE;
    if (ddp__pipe_states(&p, &s, err, sizeof(err)) < 0) {
        ddp__cli_error("%s: %s", path, err);
        goto out_profile;
    }
    if (ddp__pipe_plan(&p, &s, &o, &pl, err, sizeof(err)) < 0) {
        ddp__cli_error("%s: %s", path, err);
        goto out_states;
    }
    print_plan(path, &p, &s, &o, &pl);
    rc = DDP_EXIT_OK;
    if (c->vals[DDP_OPT_OUTPUT] && write_stages(c->vals[DDP_OPT_OUTPUT], &p, &pl) < 0)
        rc = DDP_EXIT_LAUNCH;
    ddp__pipe_plan_release(&pl);
out_states:
    ddp__pipe_states_release(&s);
out_profile:
    ddp__profile_release(&p);
    return rc;
}
