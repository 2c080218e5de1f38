/*
 * PipeDream's planner (arXiv 1806.03377 section 3.1, as the released
 * optimizer_graph_hierarchical.py computes it): a model's layers become the states of its antichain
 * DAG (for a chain, one state per layer), and a dynamic program over those states splits them into
 * stages, each replicated on some machines, level by level (machines within a server, then
 * servers), minimizing the time of the slowest stage.
 */
#ifndef DDP_PIPELINE_PLAN_H
#define DDP_PIPELINE_PLAN_H

#include "pipeline/profile.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One state: an antichain of layers with everything before it. */
struct ddp_pstate {
    size_t *anti; /* the augmented antichain (graph.py's augment_antichain): layer indices */
    size_t nanti;
    double compute_s;   /* forward + backward of the antichain and all before it, seconds */
    double act_bytes;   /* activations of the same layers */
    double param_bytes; /* parameters of the same layers */
    double out_bytes;   /* the antichain's own activations: what crosses a split after it */
};

/* The states of a profile, in the released planner's topological order. */
struct ddp_pstates {
    struct ddp_pstate *st;
    size_t n;
    size_t swords;     /* 64-bit words of a bitset over states */
    uint64_t *preds;   /* n bitsets: the states before each in the antichain DAG */
    size_t lwords;     /* 64-bit words of a bitset over layers */
    uint64_t *covered; /* n bitsets: the layers at or before each state's antichain */
    bool *input;       /* per layer: an input source left out of the plan (joins stage 0) */
    bool *dropped;     /* per layer: a __getitem__ sink left out (joins its predecessor's stage) */
};

/* Builds the states; DDP_EINVAL with a message in err for a profile it cannot plan. */
int ddp__pipe_states(const struct ddp_profile *p, struct ddp_pstates *s, char *err, size_t errlen);
void ddp__pipe_states_release(struct ddp_pstates *s);

static inline bool ddp__bit(const uint64_t *set, size_t k)
{
    return (set[k / 64] >> (k % 64)) & 1;
}

#define DDP_PLAN_MAX_LEVELS 8
#define DDP_PLAN_MAX_STATES 5000 /* the planner is quadratic in them */

struct ddp_plan_opts {
    int levels;
    int machines[DDP_PLAN_MAX_LEVELS];     /* machines at each level, innermost first */
    double bandwidth[DDP_PLAN_MAX_LEVELS]; /* bytes/s between the machines of each level */
    double memory_bytes;                   /* > 0: a machine's memory, enforced */
    bool straight;                         /* one machine per stage, no replication */
    bool fewer_machines;                   /* may leave machines unused */
    double act_ratio;                      /* activation compression ratio; 0: transfers ignored */
};

struct ddp_plan_stage {
    size_t start, end;                 /* states [start, end) */
    int replicas[DDP_PLAN_MAX_LEVELS]; /* machines per level that run it */
    int workers;                       /* their product */
    double compute_s;                  /* one machine's forward + backward time of the stage */
};

struct ddp_plan {
    struct ddp_plan_stage *stages; /* first to last */
    size_t nstages;
    double pipeline_s; /* the slowest stage's time per minibatch (the planner's objective) */
    double dp_s;       /* data parallelism over all machines, per minibatch */
    double single_s;   /* one machine */
    int unused;        /* machines of the top level left unused (with fewer_machines) */
    int *layer_stage;  /* per profile layer: its stage, or -1 */
};

/* Plans; DDP_EINVAL with a message when no split fits (the memory), DDP_ENOMEM. */
int ddp__pipe_plan(const struct ddp_profile *p, const struct ddp_pstates *s,
                   const struct ddp_plan_opts *o, struct ddp_plan *out, char *err, size_t errlen);
void ddp__pipe_plan_release(struct ddp_plan *pl);

/* "10Gbit", "10Gbit/s", "10Gbps", "1.25GB/s", "800MiB/s" or bytes/s: bytes per second > 0.
 * false if malformed. */
bool ddp__pipe_parse_rate(const char *s, double *bytes_per_s);
/* "16GB", "16GiB", "1.5e10" (bytes): bytes > 0. false if malformed. */
bool ddp__pipe_parse_bytes(const char *s, double *bytes);

#endif
