/* What the Fashion-MNIST trainers share (common.c). */
#ifndef DDP_EXAMPLES_FMNIST_COMMON_H
#define DDP_EXAMPLES_FMNIST_COMMON_H

#include "ddp.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MAX_LAYERS 8
#define IMG 784
#define CLASSES 10

struct cfg {
    int epochs, batch, nhidden, hidden[MAX_LAYERS], seed, ckpt_every, eval_every;
    int sim_ranks; /* --simulate-ranks: one process computes the steps of this many ranks */
    long max_steps;
    float lr, momentum;
    const char *data, *ckpt_dir, *dump, *compare;
    const char *profile_graph; /* --profile-graph: write PipeDream's graph.txt and exit */
    double tol;
    bool ddp, view, overlap, bench, paired, find_unused;
    bool view_copy; /* --bench-view-copy: both reducer modes, alternating step by step */
    double bucket_mb, first_mb;
    enum ddp_comm_hook hook;
    /* --pipeline: layers per stage, --replicas per stage, --schedule, --microbatches */
    const char *pipeline_arg;
    int pipe_nstages, pipe_split[MAX_LAYERS], pipe_replicas[MAX_LAYERS];
    bool schedule_flush;
    int microbatches;
};

/* Images as the IDX file holds them, one byte a pixel (47 MB for the training set, where
 * floats would be 188 MB in every rank), normalised a row at a time as batches are built. */
struct dataset {
    int n;
    const uint8_t *px; /* n x 784 pixels */
    uint8_t *y;
    void *raw;       /* the file's bytes, px within them */
    float norm[256]; /* each pixel value normalised */
};

/* The MLP: host or device pointers, as the trainer keeps them. */
struct model {
    int L; /* layers */
    int dim[MAX_LAYERS + 1];
    float *W[MAX_LAYERS], *b[MAX_LAYERS];   /* W[l]: dim[l+1] x dim[l], row-major */
    float *gW[MAX_LAYERS], *gb[MAX_LAYERS]; /* gradients (maybe inside reducer buckets) */
    float *vW[MAX_LAYERS], *vb[MAX_LAYERS]; /* momentum */
    float *own_g[2 * MAX_LAYERS];           /* the gradient buffers we allocated */
};

extern int rank, world;  /* this process's place in the job (0 of 1 alone) */
extern const char *prog; /* for messages */

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
double now_s(void);
/* splitmix64 and the per-epoch shuffle it drives (the same on every rank) */
uint64_t mix(uint64_t *s);
void shuffle(int *perm, int n, uint64_t seed);
/* The IDX files of Debian's dataset-fashion-mnist (their pixels normalised by set_rows). */
void load_set(const char *dir, const char *images, const char *labels, struct dataset *d);
void free_set(struct dataset *d);
/* Images first .. first + count - 1 of d, normalised, one after the other into out. */
void set_rows(const struct dataset *d, int first, int count, float *out);
void usage(FILE *f);
void parse(int argc, char **argv, struct cfg *c);
int cmp_double(const void *x, const void *y);
/* He-uniform weights of an out x in layer from the seeded generator. */
void init_weights(uint64_t *s, float *W, size_t in, size_t out);
/* The layer sizes of c's model in m (L, dim). */
void model_shape(struct model *m, const struct cfg *c);
size_t nparams(const struct model *m);
/* Frees m's tensors with release (free, or a cudaFree wrapper). */
void model_free(struct model *m, void (*release)(void *));
/* --dump / --compare of m's parameters (rank 0), read with copy (memcpy, or a copy from the
 * device): 0, or 1 when the comparison fails. */
int dump_model(const struct model *m, const struct cfg *c,
               void (*copy)(void *dst, const void *src, size_t bytes));
/* Registers m's parameters in forward order (fc1.weight, fc1.bias, ...) and creates the
 * reducer with c's options; dies with the reducer's message on failure. */
struct ddp_reducer *make_reducer(struct ddp_pg *pg, struct model *m, const struct cfg *c);
/* Rank 0's epoch line. */
void print_epoch(const struct cfg *c, int epoch, int64_t step, double loss_sum, double samples,
                 bool eval, double test_loss, double test_acc, double seconds);
/* --bench: the median step and the reducer's statistics. */
void print_bench(double *step_t, long n, struct ddp_reducer *red);
void print_phases(double *const phase_t[3], long n);
double bench_bare_allreduce(struct ddp_pg *pg, float *flat, size_t count, double *skew);
void print_view_copy(double *step_t, double *const phase_t[3], long n);
void print_paired(double *step_t, double *const paired_t[4], long n, size_t bytes, bool one_node);
/* The median of t[] (seconds) in ms, after 5 warm-up steps when there are more than 10. */
double median_ms(double *t, long n, long *used);
/* --dump and --compare of the final parameters (flat, registration order): 0, or 1 when the
 * comparison fails. */
int dump_compare(const float *flat, size_t n, const struct cfg *c);
/* Softmax cross-entropy of b rows of CLASSES logits: returns the summed loss; with dZ, writes
 * d(loss * scale)/dlogits there; with correct, counts the right predictions. */
double softmax_xent(const float *lg, const uint8_t *y, int b, float scale, float *dZ,
                    long *correct);
/* --pipeline: the model trained as a pipeline of stages (fmnist_pipe.c); the exit status. */
int train_pipeline(const struct cfg *c, const struct dataset *train, const struct dataset *test);

#endif
