/*
 * Point-to-point inside a node through shared memory (worker/p2p_shm.c): one byte ring per
 * ordered pair of a node's ranks, in a segment the node's ranks map, carrying the same byte
 * stream (headers and payloads) that a pair on two nodes sends over TCP. The pair's TCP
 * connection stays, as the doorbell: a side that finds its ring empty (reader) or full
 * (writer) marks itself asleep and waits in poll(2) on the connection; the other side, after
 * moving the ring's counter, writes one byte to wake it. A reader still polling between
 * messages does not mark itself (ddp__ring.awake), so the next message costs no doorbell.
 * The connection's end still tells that a peer exited or died.
 */
#ifndef DDP_WORKER_P2P_SHM_H
#define DDP_WORKER_P2P_SHM_H

#include <stdbool.h>
#include <stddef.h>

struct ddp_pg;
struct ddp_store;
struct ddp__ring_ctl;

/* Bytes of a ring's control block (its data follows, 64-byte aligned). */
#define DDP__RING_CTL_BYTES ((size_t)256)

/* One direction of a pair: its control block and data in the node's segment. */
struct ddp__ring {
    struct ddp__ring_ctl *c;
    char *data; /* NULL: this pair uses TCP */
    size_t cap; /* a power of two */
    /* Reading side only: set while this side polls without sleeping and waits for the start
     * of a message. An empty ring then does not mark it asleep, so a writer starting the
     * next message does not ring for nothing. Clear it before sleeping and look once more
     * (ddp__ring_get then marks it). A side waiting in the middle of a message (the rest of
     * a body, room for a send) always marks itself, and is rung for. */
    bool awake;
};

struct ddp__p2p_shm {
    void *base;
    size_t len;
    struct ddp__ring *out, *in; /* per group rank: to it and from it */
    int nlocal;
};

/*
 * With point-to-point on, maps the rings of this rank's node: its lowest group rank creates
 * the segment (a memfd, DDP_PG_P2P_SHM_BYTES per ring, default 1 MiB, its pages reserved so
 * that no write can fault for want of memory) and gives its descriptor to the node's others
 * (worker/fdshare.h), which map it, and every rank of the group agrees (an all-gather) whether
 * all did; if not, or with DDP_PG_TRANSPORT=tcp or DDP_PG_P2P_SHM_BYTES=0, every pair keeps
 * TCP. No name is ever left behind. node_of[world]: each rank's node. Sets pg->p2p_shm (or
 * leaves it NULL). 0, or a DDP_E* code when the store failed.
 */
int ddp__p2p_setup_shm(struct ddp_pg *pg, struct ddp_store *store, const char *name,
                       const int *node_of);
void ddp__p2p_shm_free(struct ddp_pg *pg);

/* Copies up to n bytes into the ring; returns how many, 0 when it is full (the reader then
 * rings once it has made room). Head moves after each 64 KiB, so the reader copies a piece
 * out while the next goes in. *bell: the reader was asleep; wake it. */
size_t ddp__ring_put(const struct ddp__ring *r, const void *buf, size_t n, bool *bell);
/* Copies a (na bytes) and then b (nb) into the ring if both fit now, else nothing; never
 * marks the writer asleep (the caller's fast path, worker/p2p.c). *bell as above. */
bool ddp__ring_put_whole(const struct ddp__ring *r, const void *a, size_t na, const void *b,
                         size_t nb, bool *bell);
/* Copies up to n bytes out of the ring; returns how many, 0 when it is empty (the writer then
 * rings once it has written, unless r->awake). *bell: the writer was asleep, waiting for
 * room; wake it. */
size_t ddp__ring_get(const struct ddp__ring *r, void *buf, size_t n, bool *bell);

#endif
