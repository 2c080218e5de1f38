/*
 * The pipeline stage runtime (PipeDream): a model split into stages over the ranks of a process
 * group, each stage possibly replicated. The runtime owns the schedule and the communication;
 * the program gives each stage's forward, backward and optimizer update as callbacks.
 *
 * Ranks: stage 0's replicas are ranks 0..R0-1 of the group, stage 1's the next R1, and so on;
 * the replica counts add up to the world size. Minibatch mb runs on replica mb % R of every
 * stage (round robin), and its backward returns to the replica that ran its forward.
 * Activations and their gradients travel by the group's point-to-point messages (the group is
 * formed with opts.p2p); the replicas of a stage reduce their gradients on a sub-group of their
 * own.
 *
 * Schedules:
 *   DDP_PIPE_1F1B   PipeDream's: each replica runs warm-up forwards (the ranks of this and later
 *                   stages, less one, over this stage's replicas), then one forward and one
 *                   backward in turn, then drains; the update follows every backward (the mean
 *                   of the replicas' gradients). With weight stashing (the default) a
 *                   minibatch's backward uses the weights its forward used: at most warm-up + 1
 *                   versions are kept, a copy made only when an update would overwrite a version
 *                   that a minibatch in flight still needs.
 *   DDP_PIPE_FLUSH  PipeDream-flush (GPipe's semantics, 1F1B's memory): batches of `microbatches`
 *                   minibatches, each batch's gradients summed over its minibatches and
 *                   replicas, divided by their number, and applied in one update after the
 *                   pipeline drains: the updates of sequential training on whole batches.
 */
#ifndef DDP_PIPELINE_STAGE_H
#define DDP_PIPELINE_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ddp_pg;
struct ddp_pipe;

enum ddp_pipe_schedule {
    DDP_PIPE_1F1B = 0,
    DDP_PIPE_FLUSH = 1,
};

/* What a callback is working on. */
struct ddp_pipe_step {
    int64_t mb;      /* the minibatch's index */
    int slot;        /* 0..ddp_pipe_slots()-1: where the stage keeps what mb's backward needs;
                        no other minibatch in flight has it */
    int64_t version; /* the weights' version its forward used (updates applied before it) */
};

struct ddp_pipe_ops {
    /* Forward of step->mb with weights w: reads in (the previous stage's activations; NULL at
     * the first stage, which reads its own input) and writes out (NULL at the last stage, which
     * computes the loss). 0, or a negative code that stops the pipeline. */
    int (*forward)(void *ctx, const struct ddp_pipe_step *step, const float *w, const void *in,
                   void *out);
    /* Backward of step->mb with the weights w of its forward (the latest weights when stashing
     * is off): reads grad_out (NULL at the last stage), writes grad_in (NULL at the first) and
     * adds the minibatch's parameter gradient into grad. */
    int (*backward)(void *ctx, const struct ddp_pipe_step *step, const float *w,
                    const void *grad_out, void *grad_in, float *grad);
    /* The optimizer step on the latest weights w (updated in place) with grad, the mean of the
     * gradients of the minibatches the update covers. */
    int (*update)(void *ctx, float *w, const float *grad);
};

struct ddp_pipe_opts {
    int nstages;
    const int *replicas;             /* [nstages]; NULL: one replica each */
    enum ddp_pipe_schedule schedule; /* DDP_PIPE_1F1B (0) or DDP_PIPE_FLUSH */
    int microbatches;                /* flush: minibatches per batch */
    bool no_stash;                   /* 1F1B: backward on the latest weights (to compare) */
    const size_t *act_bytes;         /* [nstages-1]: bytes stage s sends stage s+1 per minibatch;
                                        the gradient going back is as many */
    float *weights;                  /* this rank's stage's parameters, updated in place */
    size_t nweights;
};

/*
 * Sets the pipeline up on pg (formed with opts.p2p; every rank calls it alike): finds this
 * rank's stage and replica and forms each replicated stage's sub-group. DDP_EINVAL (the reason
 * in ddp_pg_last_error) for counts that do not add up to the world size, a missing callback or
 * size; DDP_ENOTSUP for a group without point-to-point.
 */
int ddp_pipe_new(struct ddp_pg *pg, const struct ddp_pipe_opts *opts,
                 const struct ddp_pipe_ops *ops, void *ctx, struct ddp_pipe **out);

/*
 * Runs minibatches first..first+n-1 through the pipeline and returns when this rank's part is
 * done and its sends have left (1F1B drains at the end of each run). n must be a multiple of
 * every stage's replica count and, for flush, of microbatches (themselves a multiple of every
 * replica count). A failure (a peer gone, a callback's error) aborts the group, so every rank's
 * run fails at once; ddp_pipe_last_error says what and where.
 */
int ddp_pipe_run(struct ddp_pipe *p, int64_t first, int64_t n);

int ddp_pipe_stage(const struct ddp_pipe *p);
int ddp_pipe_replica(const struct ddp_pipe *p);
int ddp_pipe_warmup(const struct ddp_pipe *p);      /* forwards before the first backward */
int ddp_pipe_slots(const struct ddp_pipe *p);       /* minibatches in flight at most: warm-up + 1 */
int64_t ddp_pipe_version(const struct ddp_pipe *p); /* updates applied so far */
/* The replicas' sub-group of this rank's stage, NULL for an unreplicated stage. */
struct ddp_pg *ddp_pipe_replica_group(const struct ddp_pipe *p);
const char *ddp_pipe_last_error(const struct ddp_pipe *p);
void ddp_pipe_free(struct ddp_pipe *p);

#ifdef __cplusplus
}
#endif

#endif
