/*
 * A rank's arena: registered memory for its collectives (ddp_pg_mem_alloc). The arena is a
 * memfd (worker/fdshare.h), sparse (ftruncate'd to its full size, no page used until one is
 * allocated), that the rank and every other rank of its node map, so a peer reads a buffer
 * allocated here in place, with no copy through the node's segment and no system call.
 *
 * Allocation is first fit over page-aligned blocks, kept sorted by offset (a process group
 * allocates few, large buffers: gradient buckets). The pages of a block are reserved with
 * posix_fallocate when it is allocated, so memory running out is a NULL from the allocator, not
 * a SIGBUS at first touch; freeing punches them out of the file again.
 */
#include "worker/coll.h"
#include "worker/fdshare.h"
#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/banned.h"

#define PAGE ((size_t)4096)

struct blk {
    size_t off, len;
};

struct ddp__arena {
    pthread_mutex_t mu;
    char *base;
    size_t len;
    int fd;
    struct blk *used; /* sorted by offset */
    size_t nused, cap;
};

int ddp__arena_create(size_t len, struct ddp__arena **out)
{
    *out = NULL;
    len = (len + PAGE - 1) / PAGE * PAGE;
    struct ddp__arena *a = calloc(1, sizeof(*a));
    if (!a)
        return DDP_ENOMEM;
    a->base = MAP_FAILED;
    a->fd = ddp__memfd("ddp-arena", len);
    if (a->fd < 0)
        goto fail;
    a->base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, a->fd, 0);
    if (a->base == MAP_FAILED)
        goto fail;
    a->len = len;
    pthread_mutex_init(&a->mu, NULL);
    *out = a;
    return 0;
fail:
    if (a->fd >= 0)
        close(a->fd);
    free(a);
    return DDP_ESYS;
}

int ddp__arena_fd(const struct ddp__arena *a)
{
    return a ? a->fd : -1;
}

void *ddp__arena_base(const struct ddp__arena *a)
{
    return a ? a->base : NULL;
}

void *ddp__arena_alloc(struct ddp__arena *a, size_t bytes)
{
    if (!a || bytes == 0 || bytes > a->len)
        return NULL;
    size_t len = (bytes + PAGE - 1) / PAGE * PAGE;
    void *p = NULL;
    pthread_mutex_lock(&a->mu);
    size_t at = 0, i = 0;
    for (; i <= a->nused; i++) { /* the gap before block i (or after the last) */
        size_t end = i < a->nused ? a->used[i].off : a->len;
        if (end - at >= len)
            break;
        if (i < a->nused)
            at = a->used[i].off + a->used[i].len;
    }
    if (i > a->nused)
        goto out;
    if (a->nused == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 16;
        struct blk *u = realloc(a->used, cap * sizeof(*u));
        if (!u)
            goto out;
        a->used = u;
        a->cap = cap;
    }
    if (posix_fallocate(a->fd, (off_t)at, (off_t)len) != 0)
        goto out; /* the file system is full: no page that could fault later */
    memmove(a->used + i + 1, a->used + i, (a->nused - i) * sizeof(*a->used));
    a->used[i] = (struct blk){at, len};
    a->nused++;
    p = a->base + at;
out:
    pthread_mutex_unlock(&a->mu);
    return p;
}

int ddp__arena_free(struct ddp__arena *a, void *p)
{
    if (!a || !p)
        return DDP_EINVAL;
    int r = DDP_EINVAL;
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->nused; i++) {
        if (a->base + a->used[i].off != (char *)p)
            continue;
        /* Zero-filled again for the next allocation, and the memory given back. */
        if (fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a->used[i].off,
                      (off_t)a->used[i].len) != 0)
            memset(p, 0, a->used[i].len);
        memmove(a->used + i, a->used + i + 1, (a->nused - i - 1) * sizeof(*a->used));
        a->nused--;
        r = 0;
        break;
    }
    pthread_mutex_unlock(&a->mu);
    return r;
}

uint64_t ddp__arena_offset(const struct ddp__arena *a, const void *p, size_t bytes)
{
    if (!a || (const char *)p < a->base || bytes > a->len ||
        (size_t)((const char *)p - a->base) > a->len - bytes)
        return DDP__NOT_IN_ARENA;
    return (uint64_t)((const char *)p - a->base);
}

void ddp__arena_destroy(struct ddp__arena *a)
{
    if (!a)
        return;
    munmap(a->base, a->len);
    close(a->fd);
    pthread_mutex_destroy(&a->mu);
    free(a->used);
    free(a);
}
