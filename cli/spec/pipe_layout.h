/*
 * A pipeline job's stages for one round's ranks (the job spec's pipeline section, cli/spec/job.h):
 * the layers and ranks of each stage, taken from the spec, read from a plan file, or planned
 * by PipeDream's planner (pipeline/plan.h) for the round's nodes; the environment that tells
 * the ranks; `ddprun plan`'s view of it.
 */
#ifndef DDP_CLI_PIPE_LAYOUT_H
#define DDP_CLI_PIPE_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct ddp_job_pipeline;

struct ddp__pipe_layout {
    int nstages;
    int *split;         /* layers per stage (a plan's: its non-input layers of each stage) */
    int *replicas;      /* ranks per stage; stage s has ranks first[s] .. first[s]+replicas[s]-1 */
    const char *source; /* "split", "plan" or "auto" */
    double pipeline_ms; /* auto: the planner's time per minibatch (slowest stage) */
    double dp_ms;       /* auto: data parallel over the same ranks */
};

/* The layout for ranks on nnodes nodes of slots[i] each. DDP_EINVAL with the reason in err
 * (replicas that do not add up to the ranks; a plan file or profile that cannot be read or
 * planned, with its file:line:col), DDP_ENOMEM. */
int ddp__pipe_layout(const struct ddp_job_pipeline *p, const int *slots, int nnodes,
                     struct ddp__pipe_layout *out, char *err, size_t errlen);
/* The same for every node of job j (its whole set of ranks: load time, `ddprun plan`). */
struct ddp_job;
int ddp__pipe_layout_job(const struct ddp_job *j, struct ddp__pipe_layout *out, char *err,
                         size_t errlen);
void ddp__pipe_layout_release(struct ddp__pipe_layout *L);

/* The stage and replica of rank r. */
void ddp__pipe_layout_rank(const struct ddp__pipe_layout *L, int r, int *stage, int *replica);

/* "K=V" strings for every rank (NULL-terminated, malloc'd; free each and the array), or NULL:
 * DDPRUN_PIPELINE_STAGES, _SPLIT, _REPLICAS, _SCHEDULE, _MICROBATCHES (flush) and
 * _MICROBATCH_SIZE (when set). Each rank's agent adds DDPRUN_PIPELINE_STAGE and _REPLICA. */
char **ddp__pipe_layout_env(const struct ddp_job_pipeline *p, const struct ddp__pipe_layout *L);

/* The START frame's environment for a round of a pipeline job on nnodes nodes of slots[i]
 * ranks: the layout's variables, then base's strings (borrowed: the job's env wins). NULL
 * with the reason in err. The first *nowned entries are the caller's to free, then the array. */
char **ddp__pipe_round_env(const struct ddp_job_pipeline *p, char *const *base, const int *slots,
                           int nnodes, int *nowned, char *err, size_t errlen);

/* The resolved section, one line of YAML, for `ddprun plan`. */
void ddp__pipe_layout_print(const struct ddp_job_pipeline *p, const struct ddp__pipe_layout *L,
                            FILE *f);

/* From a rank's environment (DDPRUN_PIPELINE_REPLICAS and its rank): its stage and replica;
 * false when the job has no pipeline or rank is past its ranks. */
bool ddp__pipe_env_rank(const char *replicas, int rank, int *stage, int *replica);

#endif
