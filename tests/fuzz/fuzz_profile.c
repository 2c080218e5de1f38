/*
 * libFuzzer target for PipeDream's profile format and the planner (pipeline/): arbitrary bytes
 * must parse or be refused with a message at file:line:col, never crash; a parsed profile is
 * written and read back to the same layers, and planned on a few machines: the stages cover
 * the states in order and use every machine, and the predicted times are finite.
 */
#include "pipeline/plan.h"
#include "pipeline/profile.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ddp_profile p, q;
    char err[1024];
    if (ddp__profile_parse((const char *)data, size, "f.txt", &p, err, sizeof(err)) != 0) {
        if (strncmp(err, "f.txt:", 6) != 0 && strstr(err, "out of memory") == NULL)
            abort();
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f || ddp__profile_write(&p, f) != 0)
        abort();
    fclose(f);
    if (ddp__profile_parse(text, len, "w.txt", &q, err, sizeof(err)) != 0 ||
        q.nlayers != p.nlayers || q.nedges != p.nedges)
        abort();
    for (size_t k = 0; k < p.nlayers; k++)
        if (strcmp(p.layers[k].id, q.layers[k].id) != 0 ||
            p.layers[k].act_bytes != q.layers[k].act_bytes)
            abort();
    free(text);
    ddp__profile_release(&q);
    struct ddp_pstates s;
    /* planned only up to 64 states: a branching profile of 22 layers has 326, whose plan
     * takes 0.5 s in a release build and over 10 s (libFuzzer's timeout) instrumented; the
     * planner on big state sets is the unit and bats tests' job */
    if (ddp__pipe_states(&p, &s, err, sizeof(err)) == 0) {
        if (s.n > 64)
            goto skip;
        int M = 1 + (int)(size % 5);
        struct ddp_plan_opts o = {.levels = size % 3 == 0 ? 2 : 1,
                                  .machines = {M, 2},
                                  .bandwidth = {1.25e9, 1.25e8},
                                  .act_ratio = size % 2};
        struct ddp_plan pl;
        if (ddp__pipe_plan(&p, &s, &o, &pl, err, sizeof(err)) == 0) {
            int used = 0;
            for (size_t g = 0; g < pl.nstages; g++) {
                if (pl.stages[g].start != (g ? pl.stages[g - 1].end : 0) ||
                    pl.stages[g].end <= pl.stages[g].start)
                    abort();
                used += pl.stages[g].workers;
            }
            if (pl.stages[pl.nstages - 1].end != s.n || used != M * (o.levels == 2 ? 2 : 1) ||
                !isfinite(pl.pipeline_s) || !isfinite(pl.dp_s))
                abort();
            ddp__pipe_plan_release(&pl);
        }
    skip:
        ddp__pipe_states_release(&s);
    }
    ddp__profile_release(&p);
    return 0;
}
