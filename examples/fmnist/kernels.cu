// The CUDA trainer's small kernels (see kernels.h).
#include "kernels.h"

#include <cuda_runtime.h>

#define IMG 784
#define CLASSES 10

namespace
{

constexpr int kThreads = 256;

unsigned blocks_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < 65535 ? (b ? b : 1) : 65535);
}

int launched()
{
    return (int)cudaGetLastError();
}

__global__ void gather(float *xb, uint8_t *yb, const float *x, const uint8_t *y, const int *perm,
                       int off, int b)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)b * IMG;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / IMG, col = i % IMG;
        int src = perm[off + row];
        xb[i] = x[(size_t)src * IMG + col];
        if (col == 0)
            yb[row] = y[src];
    }
}

__global__ void bias_rows(float *Z, const float *bias, int rows, int cols)
{
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        Z[i] = bias[i % cols];
}

__global__ void relu(float *A, const float *Z, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        A[i] = Z[i] > 0.0f ? Z[i] : 0.0f;
}

__global__ void relu_backward(float *dA, const float *Z, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (!(Z[i] > 0.0f))
            dA[i] = 0.0f;
}

// One thread per sample; double precision like the host trainer's loss.
__global__ void softmax_xent(const float *logits, const uint8_t *y, int b, float scale, float *dZ,
                             double *acc)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= b)
        return;
    const float *z = logits + (size_t)i * CLASSES;
    float mx = z[0];
    int arg = 0;
    for (int k = 1; k < CLASSES; k++)
        if (z[k] > mx) {
            mx = z[k];
            arg = k;
        }
    double sum = 0;
    for (int k = 0; k < CLASSES; k++)
        sum += exp((double)(z[k] - mx));
    atomicAdd(&acc[0], log(sum) - (double)(z[y[i]] - mx));
    if (arg == y[i])
        atomicAdd(&acc[1], 1.0);
    if (dZ)
        for (int k = 0; k < CLASSES; k++) {
            double p = exp((double)(z[k] - mx)) / sum;
            dZ[(size_t)i * CLASSES + k] = (float)((p - (k == y[i])) * scale);
        }
}

__global__ void sgd(float *p, float *v, const float *g, size_t n, float lr, float mu)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        v[i] = mu * v[i] + g[i];
        p[i] -= lr * v[i];
    }
}

__global__ void fill(float *p, float value, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = value;
}

__global__ void spin(uint64_t ns)
{
    uint64_t t0 = 0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
}

} // namespace

extern "C" int fmk_gather(float *xb, uint8_t *yb, const float *x, const uint8_t *y, const int *perm,
                          int off, int b, void *stream)
{
    gather<<<blocks_for((size_t)b * IMG), kThreads, 0, (cudaStream_t)stream>>>(xb, yb, x, y, perm,
                                                                               off, b);
    return launched();
}

extern "C" int fmk_bias_rows(float *Z, const float *bias, int rows, int cols, void *stream)
{
    bias_rows<<<blocks_for((size_t)rows * cols), kThreads, 0, (cudaStream_t)stream>>>(Z, bias, rows,
                                                                                      cols);
    return launched();
}

extern "C" int fmk_relu(float *A, const float *Z, size_t n, void *stream)
{
    relu<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(A, Z, n);
    return launched();
}

extern "C" int fmk_relu_backward(float *dA, const float *Z, size_t n, void *stream)
{
    relu_backward<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(dA, Z, n);
    return launched();
}

extern "C" int fmk_softmax_xent(const float *logits, const uint8_t *y, int b, float scale,
                                float *dZ, double *acc, void *stream)
{
    softmax_xent<<<blocks_for((size_t)b), kThreads, 0, (cudaStream_t)stream>>>(logits, y, b, scale,
                                                                               dZ, acc);
    return launched();
}

extern "C" int fmk_sgd(float *p, float *v, const float *g, size_t n, float lr, float mu,
                       void *stream)
{
    sgd<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(p, v, g, n, lr, mu);
    return launched();
}

extern "C" int fmk_fill(float *p, float value, size_t n, void *stream)
{
    fill<<<blocks_for(n), kThreads, 0, (cudaStream_t)stream>>>(p, value, n);
    return launched();
}

extern "C" int fmk_spin(uint64_t ns, void *stream)
{
    spin<<<1, 1, 0, (cudaStream_t)stream>>>(ns);
    return launched();
}
