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
    long max_steps;
    float lr, momentum;
    const char *data, *ckpt_dir, *dump, *compare;
    double tol;
    bool ddp, view, overlap, bench, find_unused;
    double bucket_mb, first_mb;
    enum ddp_comm_hook hook;
};

struct dataset {
    int n;
    float *x; /* n x 784, normalised */
    uint8_t *y;
};

extern int rank, world; /* this process's place in the job (0 of 1 alone) */
extern const char *prog; /* for messages */

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
double now_s(void);
/* splitmix64 and the per-epoch shuffle it drives (the same on every rank) */
uint64_t mix(uint64_t *s);
void shuffle(int *perm, int n, uint64_t seed);
/* The IDX files of Debian's dataset-fashion-mnist, normalised. */
void load_set(const char *dir, const char *images, const char *labels, struct dataset *d);
void usage(FILE *f);
void parse(int argc, char **argv, struct cfg *c);
int cmp_double(const void *x, const void *y);
/* He-uniform weights of an out x in layer from the seeded generator. */
void init_weights(uint64_t *s, float *W, size_t in, size_t out);
/* The median of t[] (seconds) in ms, after 5 warm-up steps when there are more than 10. */
double median_ms(double *t, long n, long *used);
/* --dump and --compare of the final parameters (flat, registration order): 0, or 1 when the
 * comparison fails. */
int dump_compare(const float *flat, size_t n, const struct cfg *c);

#endif
