/*
 * CUDA device memory for the reducer's buckets on NCCL groups (worker/devmem.c). Built against
 * the CUDA runtime when libddp has the NCCL backend; without it every call is DDP_ENOTSUP.
 * Streams are cudaStream_t passed as void * (NULL: the legacy default stream).
 */
#ifndef DDP_WORKER_DEVMEM_H
#define DDP_WORKER_DEVMEM_H

#include <stddef.h>

/* bytes of zeroed device memory on the current device. */
int ddp__dev_alloc(void **p, size_t bytes);
/* Waits for the device (the memory may still be in use by queued work), then frees. */
void ddp__dev_free(void *p);
/* Stream-ordered device-to-device copy and zeroing; the host does not wait. */
int ddp__dev_copy_async(void *dst, const void *src, size_t bytes, void *stream);
int ddp__dev_zero_async(void *dst, size_t bytes, void *stream);
/* Host <-> device copies that wait for the stream first. */
int ddp__dev_to_host(void *dst, const void *src, size_t bytes, void *stream);
int ddp__dev_from_host(void *dst, const void *src, size_t bytes, void *stream);
/* The last CUDA error's text, for messages. */
const char *ddp__dev_error(void);

#endif
