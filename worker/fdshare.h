/*
 * Shared memory between the ranks of a node that has no name on any file system: a segment is
 * a memfd, gone with its last descriptor and mapping however its ranks end (SIGKILL included),
 * and its descriptor reaches the node's other ranks over Unix sockets in the abstract namespace
 * (SCM_RIGHTS), whose names (random, published through the store) go with the sockets too.
 * Nothing is left in /dev/shm, and /dev/shm's size (64 MiB in a default container) is no limit.
 */
#ifndef DDP_WORKER_FDSHARE_H
#define DDP_WORKER_FDSHARE_H

#include <stddef.h>

struct ddp_store;

/* A new memfd of len bytes (sparse: ftruncate'd, no page used). -1 with errno on failure. */
int ddp__memfd(const char *tag, size_t len);

/*
 * The n ranks of a node (this one is number me) give each other descriptors: each gives fd_in
 * (-1: none) to every other, and fds[j] (n entries) receives rank j's, -1 where j gave none or
 * it could not come (fds[me] = -1). Every rank of the node calls it with the same prefix,
 * unique to the node and the exchange. A connecting or connected process of another user is
 * ignored. Two all-gathers under prefix; the only error is the store's code (fds all -1 then),
 * so a caller that misses a descriptor agrees with the others through the store as before.
 */
int ddp__fd_exchange(struct ddp_store *store, const char *prefix, int me, int n, int fd_in,
                     int timeout_ms, int *fds);

/*
 * The same for one giver, the node's number 0 (a segment it created): rank 0 passes its
 * descriptor as fd_in and gets it back in *out; the others pass -1 and get rank 0's (-1 where
 * it could not come). Errors as for ddp__fd_exchange.
 */
int ddp__fd_from_first(struct ddp_store *store, const char *prefix, int me, int n, int fd_in,
                       int timeout_ms, int *out);

#endif
