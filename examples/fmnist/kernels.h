/*
 * The CUDA trainer's small kernels (kernels.cu); the matrix products are cuBLAS calls in
 * fmnist_cuda.c. Every function queues its kernel on `stream` (a cudaStream_t) and returns
 * 0 or the CUDA error of the launch. Matrices are row-major, rows = samples.
 */
#ifndef DDP_EXAMPLES_FMNIST_KERNELS_H
#define DDP_EXAMPLES_FMNIST_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* xb[i] = x[perm[off + i]] (784 floats each), yb[i] = y[perm[off + i]], for i < b. */
int fmk_gather(float *xb, uint8_t *yb, const float *x, const uint8_t *y, const int *perm, int off,
               int b, void *stream);
/* Every row of Z (rows x cols) = bias. */
int fmk_bias_rows(float *Z, const float *bias, int rows, int cols, void *stream);
/* A = max(Z, 0). */
int fmk_relu(float *A, const float *Z, size_t n, void *stream);
/* dA = Z > 0 ? dA : 0. */
int fmk_relu_backward(float *dA, const float *Z, size_t n, void *stream);
/*
 * Softmax cross-entropy of b rows of 10 logits: acc[0] += summed loss, acc[1] += correct
 * predictions; with dZ, dZ = (softmax - onehot) * scale.
 */
int fmk_softmax_xent(const float *logits, const uint8_t *y, int b, float scale, float *dZ,
                     double *acc, void *stream);
/* SGD with momentum: v = mu v + g; p -= lr v. */
int fmk_sgd(float *p, float *v, const float *g, size_t n, float lr, float mu, void *stream);
/* p[0..n) = value. */
int fmk_fill(float *p, float value, size_t n, void *stream);
/* Keeps one block busy for about `ns` nanoseconds (tests: a backward of known length). */
int fmk_spin(uint64_t ns, void *stream);

#ifdef __cplusplus
}
#endif

#endif
