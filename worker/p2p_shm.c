/*
 * The shared-memory rings of point-to-point inside a node (see worker/p2p_shm.h).
 *
 * A ring is single-writer single-reader: head counts the bytes ever written, tail the bytes
 * ever read, each moved only by its side. Sleeping is Dekker's handshake on sequentially
 * consistent atomics: the reader stores reader_sleeps = 1 and then reads head again; the
 * writer stores head and then reads reader_sleeps. At least one of them sees the other's
 * store, so either the reader finds the bytes or the writer rings. The same holds for a
 * writer waiting for room. A spurious ring costs a wake-up, nothing else.
 */
#include "worker/p2p_shm.h"
#include "worker/group.h"
#include "worker/fdshare.h"
#include "common/err.h"
#include "common/log.h"
#include "rendezvous/store.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/banned.h"

struct ddp__ring_ctl {
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) _Atomic uint32_t reader_sleeps;
    _Alignas(64) _Atomic uint32_t writer_sleeps;
};

#define CTL_BYTES DDP__RING_CTL_BYTES
#define HEADER_BYTES ((size_t)4096)
#define SEG_MAGIC 0x6d68735032506464ull /* "ddP2Pshm" */
#define RING_DEFAULT ((size_t)1 << 20)
#define RING_MIN ((size_t)4096)
#define NODE_BUDGET ((size_t)256 << 20) /* rings shrink (to 64 KiB) to keep a node under this */

_Static_assert(sizeof(struct ddp__ring_ctl) <= CTL_BYTES, "ring control block");

/* The segment's first page, written by its creator before it publishes the name. */
struct seg_header {
    uint64_t magic;
    uint64_t cap;
    uint64_t nlocal;
};

/* Copies n bytes into the ring at stream position pos (room checked by the caller). */
static void copy_in(const struct ddp__ring *r, uint64_t pos, const void *buf, size_t n)
{
    size_t off = (size_t)pos & (r->cap - 1), first = n < r->cap - off ? n : r->cap - off;
    memcpy(r->data + off, buf, first);
    memcpy(r->data, (const char *)buf + first, n - first);
}

/* Bytes written before head moves: the reader copies a piece out while the next goes in. */
#define PUBLISH_BYTES ((size_t)64 << 10)

/* Copies n bytes in at head h (room checked), moving head after each piece; the new head. */
static uint64_t copy_publish(const struct ddp__ring *r, uint64_t h, const char *buf, size_t n)
{
    for (size_t done = 0; done < n;) {
        size_t k = n - done < PUBLISH_BYTES ? n - done : PUBLISH_BYTES;
        copy_in(r, h, buf + done, k);
        h += k;
        done += k;
        atomic_store_explicit(&r->c->head, h, memory_order_release);
    }
    return h;
}

size_t ddp__ring_put(const struct ddp__ring *r, const void *buf, size_t n, bool *bell)
{
    struct ddp__ring_ctl *c = r->c;
    *bell = false;
    uint64_t h = atomic_load_explicit(&c->head, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&c->tail, memory_order_acquire);
    size_t room = r->cap - (size_t)(h - t);
    if (room == 0) {
        atomic_store(&c->writer_sleeps, 1);
        t = atomic_load(&c->tail);
        if ((room = r->cap - (size_t)(h - t)) == 0)
            return 0;
        atomic_store(&c->writer_sleeps, 0);
    }
    size_t k = n < room ? n : room;
    copy_publish(r, h, buf, k);
    atomic_thread_fence(memory_order_seq_cst); /* head before reader_sleeps (Dekker) */
    *bell = atomic_load(&c->reader_sleeps) && atomic_exchange(&c->reader_sleeps, 0);
    return k;
}

bool ddp__ring_put_whole(const struct ddp__ring *r, const void *a, size_t na, const void *b,
                         size_t nb, bool *bell)
{
    struct ddp__ring_ctl *c = r->c;
    *bell = false;
    uint64_t h = atomic_load_explicit(&c->head, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&c->tail, memory_order_acquire);
    if (r->cap - (size_t)(h - t) < na + nb)
        return false;
    copy_in(r, h, a, na);
    if (nb)
        copy_publish(r, h + na, b, nb);
    else
        atomic_store_explicit(&c->head, h + na, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst); /* head before reader_sleeps (Dekker) */
    *bell = atomic_load(&c->reader_sleeps) && atomic_exchange(&c->reader_sleeps, 0);
    return true;
}

size_t ddp__ring_get(const struct ddp__ring *r, void *buf, size_t n, bool *bell)
{
    struct ddp__ring_ctl *c = r->c;
    *bell = false;
    uint64_t t = atomic_load_explicit(&c->tail, memory_order_relaxed);
    uint64_t h = atomic_load_explicit(&c->head, memory_order_acquire);
    if (h == t) {
        if (r->awake)
            return 0;
        atomic_store(&c->reader_sleeps, 1);
        if ((h = atomic_load(&c->head)) == t)
            return 0;
        atomic_store(&c->reader_sleeps, 0);
    }
    size_t avail = (size_t)(h - t);
    size_t k = n < avail ? n : avail;
    size_t off = (size_t)t & (r->cap - 1), first = k < r->cap - off ? k : r->cap - off;
    memcpy(buf, r->data + off, first);
    memcpy((char *)buf + first, r->data, k - first);
    atomic_store(&c->tail, t + k);
    *bell = atomic_load(&c->writer_sleeps) && atomic_exchange(&c->writer_sleeps, 0);
    return k;
}

/* Ring bytes from the environment: a power of two of at least 4 KiB (rounded down), 0 = off,
 * shrunk so that the node's pairs fit its budget. */
static size_t ring_bytes(int nlocal)
{
    const char *v = getenv("DDP_PG_P2P_SHM_BYTES");
    size_t want = RING_DEFAULT;
    if (v && *v) {
        char *end;
        unsigned long long x = strtoull(v, &end, 10);
        want = *end ? RING_DEFAULT : (size_t)x;
    }
    if (want == 0)
        return 0;
    size_t cap = RING_MIN;
    while (cap * 2 <= want && cap < ((size_t)1 << 30))
        cap *= 2;
    size_t pairs = (size_t)nlocal * (size_t)(nlocal - 1);
    while (cap > ((size_t)64 << 10) && pairs * (CTL_BYTES + cap) > NODE_BUDGET)
        cap /= 2;
    return cap;
}

/* The ring from local index a to local index b (a != b). */
static struct ddp__ring ring_at(void *base, size_t cap, int nlocal, int a, int b)
{
    size_t idx = (size_t)a * (size_t)(nlocal - 1) + (size_t)(b < a ? b : b - 1);
    char *p = (char *)base + HEADER_BYTES + idx * (CTL_BYTES + cap);
    return (struct ddp__ring){.c = (struct ddp__ring_ctl *)p, .data = p + CTL_BYTES, .cap = cap};
}

static size_t seg_bytes(size_t cap, int nlocal)
{
    return HEADER_BYTES + (size_t)nlocal * (size_t)(nlocal - 1) * (CTL_BYTES + cap);
}

/* The node's lowest rank: a new segment (a memfd), its pages reserved, the header written;
 * -1 when any step fails. */
static int create_segment(size_t cap, int nlocal)
{
    size_t len = seg_bytes(cap, nlocal);
    int fd = ddp__memfd("ddp-p2p", len);
    void *base = MAP_FAILED;
    int e = fd < 0 ? -1 : posix_fallocate(fd, 0, (off_t)len);
    if (e == 0)
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        DDP_WARN(PG, "cannot reserve %zu bytes of shared memory for point-to-point rings%s", len,
                 e > 0 ? " (out of memory?)" : "");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    struct seg_header *hd = base;
    *hd = (struct seg_header){.magic = SEG_MAGIC, .cap = cap, .nlocal = (uint64_t)nlocal};
    munmap(base, len);
    return fd;
}

/* Maps the segment of fd if it is what this rank expects; MAP_FAILED if not. */
static void *map_segment(int fd, size_t cap, int nlocal)
{
    size_t len = seg_bytes(cap, nlocal);
    struct stat st;
    void *base = MAP_FAILED;
    if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size == len)
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return MAP_FAILED;
    const struct seg_header *hd = base;
    if (hd->magic != SEG_MAGIC || hd->cap != cap || hd->nlocal != (uint64_t)nlocal) {
        munmap(base, len);
        return MAP_FAILED;
    }
    return base;
}

int ddp__p2p_setup_shm(struct ddp_pg *pg, struct ddp_store *store, const char *name,
                       const int *node_of)
{
    int W = pg->world, nlocal = 0, me = -1, r;
    int *local = malloc((size_t)W * sizeof(int)); /* local index -> group rank */
    if (!local)
        return DDP_ENOMEM;
    for (int j = 0; j < W; j++) {
        if (node_of[j] != node_of[pg->rank])
            continue;
        if (j == pg->rank)
            me = nlocal;
        local[nlocal++] = j;
    }
    const char *tr = getenv("DDP_PG_TRANSPORT");
    size_t cap = nlocal >= 2 ? ring_bytes(nlocal) : 0;
    bool want = nlocal >= 2 && cap > 0 && !(tr && strcmp(tr, "tcp") == 0);
    char key[300];
    void *base = MAP_FAILED;
    if (want) {
        int fd = me == 0 ? create_segment(cap, nlocal) : -1;
        snprintf(key, sizeof(key), "pg/%s/p2p-shm/%d", name, node_of[pg->rank]);
        r = ddp__fd_from_first(store, key, me, nlocal, fd, pg->timeout_ms, &fd);
        base = r < 0 ? MAP_FAILED : map_segment(fd, cap, nlocal);
        if (fd >= 0)
            close(fd); /* the mapping keeps the segment */
        if (r < 0)
            goto out;
    }
    /* everyone or no one (a rank alone on its node has nothing to map) */
    bool all;
    snprintf(key, sizeof(key), "pg/%s/p2p-shm-mapped", name);
    r = ddp_store_all_agree(store, key, pg->rank, pg->world, !want || base != MAP_FAILED,
                            pg->timeout_ms, &all);
    if (r < 0 || base == MAP_FAILED)
        goto out;
    if (!all) {
        DDP_WARN(PG,
                 "rank %d: shared memory for point-to-point is unavailable on some node; "
                 "point-to-point messages inside nodes go over TCP",
                 pg->rank);
        goto out;
    }
    struct ddp__p2p_shm *s = calloc(1, sizeof(*s));
    struct ddp__ring *rings = calloc(2 * (size_t)W, sizeof(*rings));
    if (!s || !rings) {
        free(s);
        free(rings);
        r = DDP_ENOMEM;
        goto out;
    }
    *s = (struct ddp__p2p_shm){.base = base,
                               .len = seg_bytes(cap, nlocal),
                               .out = rings,
                               .in = rings + W,
                               .nlocal = nlocal};
    for (int b = 0; b < nlocal; b++) {
        if (b == me)
            continue;
        s->out[local[b]] = ring_at(base, cap, nlocal, me, b);
        s->in[local[b]] = ring_at(base, cap, nlocal, b, me);
    }
    base = MAP_FAILED;
    pg->p2p_shm = s;
    DDP_INFO(PG,
             "rank %d: point-to-point through shared memory with %d local ranks (%zu-byte rings)",
             pg->rank, nlocal - 1, cap);
out:
    if (base != MAP_FAILED)
        munmap(base, seg_bytes(cap, nlocal));
    free(local);
    return r;
}

void ddp__p2p_shm_free(struct ddp_pg *pg)
{
    struct ddp__p2p_shm *s = pg->p2p_shm;
    if (!s)
        return;
    munmap(s->base, s->len);
    free(s->out); /* out and in are one allocation */
    free(s);
    pg->p2p_shm = NULL;
}
