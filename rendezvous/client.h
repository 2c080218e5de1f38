/*
 * The store client's private parts, shared by its two files (rendezvous/ only):
 *   store_client.c      a connection: connect with retries, the handshake, framing, one
 *                       request in flight, pushed events queued on the side
 *   store_client_ops.c  the operations of rendezvous/store.h, each a request and its reply
 * Calls go from the second to the first only.
 */
#ifndef DDP_RENDEZVOUS_CLIENT_H
#define DDP_RENDEZVOUS_CLIENT_H

#include "common/buf.h"
#include "rendezvous/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* The server times a WAIT; the client's own deadline only guards against a dead server. */
#define DDP__CL_WAIT_SLACK_MS 5000

struct evnode {
    struct ddp_store_event *ev;
    struct evnode *next;
};

struct ddp__se;

struct ddp_store {
    struct ddp__se *etcd; /* non-NULL: the store is a prefix in etcd (rendezvous/store_etcd.h) */
    int fd;
    pthread_mutex_t fdmu;    /* closing fd vs ddp_store_interrupt's shutdown from another thread */
    atomic_bool interrupted; /* ddp_store_interrupt was called: a closed connection is no error */
    int rcvtimeo_ms;         /* SO_RCVTIMEO now on the socket (0: none) */
    pthread_mutex_t mu;
    int timeout_ms;
    uint32_t next_id;
    struct ddp_buf in;
    struct ddp_buf out;
    struct evnode *ev_head, *ev_tail;
    char addr[300];
};

/* A store client whose calls go to se (store_helpers.c's ddp_store_connect_env, for
 * DDPRUN_STORE_ADDR=etcd); it owns se once this succeeds. */
int ddp__store_from_etcd(struct ddp__se *se, struct ddp_store **out);

/* Every public call holds the connection's mutex: one request in flight at a time. */
#define LOCKED(s, expr)                                                                            \
    ({                                                                                             \
        pthread_mutex_lock(&(s)->mu);                                                              \
        int r__ = (expr);                                                                          \
        pthread_mutex_unlock(&(s)->mu);                                                            \
        r__;                                                                                       \
    })

/* Starts a request frame of op in s->out; sets *id; returns the position for the end. */
size_t ddp__cl_req_begin(struct ddp_store *s, uint8_t op, uint32_t *id);
/* The same with a key first; DDP_EINVAL or DDP_ETOOBIG for a bad key. */
int ddp__cl_req_begin_key(struct ddp_store *s, uint8_t op, const char *key, uint32_t *id,
                          size_t *pos);
/* DDP_EINVAL for a NULL key, DDP_ETOOBIG over the limit; else 0 with *kl its length. */
int ddp__cl_check_key(const char *key, size_t *kl);
/* Sends the request and reads its reply within deadline (ms on the monotonic clock): its
 * payload in *rd, or the reply's negative status. */
int ddp__cl_roundtrip(struct ddp_store *s, size_t pos, uint8_t op, uint32_t id, int64_t deadline,
                      struct ddp_rd *rd);
/* ddp__cl_roundtrip within the connection's timeout. */
int ddp__cl_call(struct ddp_store *s, size_t pos, uint8_t op, uint32_t id, struct ddp_rd *rd);

#endif
