/* CUDA device memory for the reducer's buckets (see devmem.h). */
#include "worker/devmem.h"
#include "common/err.h"

#ifdef DDP_HAVE_NCCL
#include <cuda_runtime_api.h>

static _Thread_local cudaError_t last;

static int ok(cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    last = e;
    return e == cudaErrorMemoryAllocation ? DDP_ENOMEM : DDP_ESYS;
}

int ddp__dev_alloc(void **p, size_t bytes)
{
    *p = NULL;
    int r = ok(cudaMalloc(p, bytes ? bytes : 1));
    /* cudaMemset runs on the legacy stream, which the program's non-blocking streams do not
     * wait for: finish it here. */
    if (r == 0 && ((r = ok(cudaMemset(*p, 0, bytes ? bytes : 1))) < 0 ||
                   (r = ok(cudaDeviceSynchronize())) < 0)) {
        cudaFree(*p);
        *p = NULL;
    }
    return r;
}

void ddp__dev_free(void *p)
{
    if (p) {
        cudaDeviceSynchronize(); /* queued copies or collectives may still use it */
        cudaFree(p);
    }
}

int ddp__dev_copy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    return ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
}

int ddp__dev_zero_async(void *dst, size_t bytes, void *stream)
{
    return ok(cudaMemsetAsync(dst, 0, bytes, (cudaStream_t)stream));
}

int ddp__dev_to_host(void *dst, const void *src, size_t bytes, void *stream)
{
    int r = ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    return r ? r : ok(cudaStreamSynchronize((cudaStream_t)stream));
}

int ddp__dev_from_host(void *dst, const void *src, size_t bytes, void *stream)
{
    int r = ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    return r ? r : ok(cudaStreamSynchronize((cudaStream_t)stream));
}

const char *ddp__dev_error(void)
{
    return cudaGetErrorString(last);
}

#else /* no CUDA in this build: a CUDA group cannot exist either */

int ddp__dev_alloc(void **p, size_t bytes)
{
    (void)bytes;
    *p = NULL;
    return DDP_ENOTSUP;
}

void ddp__dev_free(void *p)
{
    (void)p;
}

int ddp__dev_copy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return DDP_ENOTSUP;
}

int ddp__dev_zero_async(void *dst, size_t bytes, void *stream)
{
    (void)dst, (void)bytes, (void)stream;
    return DDP_ENOTSUP;
}

int ddp__dev_to_host(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return DDP_ENOTSUP;
}

int ddp__dev_from_host(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return DDP_ENOTSUP;
}

const char *ddp__dev_error(void)
{
    return "this libddp was built without CUDA";
}
#endif
