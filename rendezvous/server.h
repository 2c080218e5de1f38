/*
 * The store server's private model, shared by its three files (rendezvous/ only):
 *   store_server.c  the loop: accepting, reading whole frames, the handshake, dispatch,
 *                   teardown after each iteration, the public lifecycle and statistics
 *   server_data.c   keys, waiters, watches and leases, and the requests on them
 *   server_torch.c  PyTorch's TCPStore protocol on a port of its own, over the same data
 *   server_conn.c   a connection's replies and output (queued, drained on EPOLLOUT), closing
 * Calls go down that list only (server_torch.c calls server_data.c and server_conn.c).
 */
#ifndef DDP_RENDEZVOUS_SERVER_H
#define DDP_RENDEZVOUS_SERVER_H

#include "common/buf.h"
#include "common/htab.h"
#include "common/list.h"
#include "common/log.h"
#include "common/loop.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum ddp__conn_state { CONN_HELLO, CONN_AUTH, CONN_READY };

/*
 * Counters behind ddp_store_server_get_stats. Only the loop thread writes
 * them, so an update is a relaxed load and store (no locked instruction);
 * other threads read them with relaxed loads.
 */
struct stats {
    _Atomic uint64_t conns_accepted, conns_open, conns_refused_auth, conns_dropped;
    _Atomic uint64_t keys, waiters, watches, leases, leases_expired;
    _Atomic uint64_t requests;
};
#define STAT_ADD(s, field, d)                                                                      \
    atomic_store_explicit(&(s)->st.field,                                                          \
                          atomic_load_explicit(&(s)->st.field, memory_order_relaxed) + (d),        \
                          memory_order_relaxed)
#define STAT_GET(s, field) atomic_load_explicit(&(s)->st.field, memory_order_relaxed)

struct server;

struct conn {
    struct server *srv;
    int fd;
    uint64_t id;
    enum ddp__conn_state state;
    char peer[96];
    uint8_t snonce[DDP__NONCE_LEN];
    uint8_t cnonce[DDP__NONCE_LEN];
    struct ddp_buf in;
    struct ddp_buf out;
    struct ddp_timer auth_timer;
    struct ddp_list link;       /* srv->conns, or srv->closing once doomed */
    struct ddp_list flush_link; /* srv->flushq while it has unsent output */
    struct ddp_list waiters;
    struct ddp_list watches;
    struct ddp_list held; /* the leases it granted or last kept alive (struct lease.held_link) */
    unsigned nwatches;
    /* A WAIT of this connection not answered yet: its later requests wait behind it, so that
     * replies come in order (ddprun-store(7)); resumed after the iteration it is answered in. */
    struct waiter *parked;
    struct ddp_list resume_link; /* srv->resumeq */
    bool closing;                /* scheduled for teardown at the end of this iteration */
    bool close_after_write;      /* flush what is queued, then close */
    const char *close_reason;
    /* A connection to the TCPStore port (server_torch.c): PyTorch's protocol, no handshake. */
    bool torch;
    bool torch_known; /* its version is decided (the first request tells) */
    bool torch_v22;   /* torch >= 2.2 numbering (it began with VALIDATE); else 1.13's */
    int torch_round;  /* the restart round whose key space it uses (taken at accept) */
};

struct entry {
    struct ddp_hnode h;
    uint8_t *key;
    uint32_t klen;
    uint8_t *val;
    uint32_t vlen;
    bool present;
    struct lease *lease;
    struct ddp_list lease_link;
    struct ddp_list waiters; /* struct wlink */
};

/* A WAIT is linked to every key it names, present or not, and counts those absent now: a key
 * deleted or expired after it was set counts as missing again. It is answered when the count
 * reaches 0, that is when every key exists at that moment. */
struct waiter;
struct wlink {
    struct ddp_list node; /* entry.waiters */
    struct waiter *w;
    struct entry *e;
    bool present; /* what this link last counted */
};

struct waiter {
    struct conn *c;
    uint32_t reqid;
    uint32_t missing;
    struct ddp_timer timer;
    struct ddp_list conn_link;
    struct waiter *ready_next; /* while being answered after a SET */
    uint32_t nlinks;
    struct wlink links[];
};

struct watch {
    struct conn *c;
    uint32_t id;
    bool prefix;
    uint8_t *key;
    uint32_t klen;
    struct ddp_list srv_link;
    struct ddp_list conn_link;
};

struct lease {
    struct ddp_hnode h;
    uint64_t id;
    uint8_t idbytes[8];
    uint32_t ttl_ms;
    struct ddp_timer timer;
    struct ddp_list keys; /* struct entry.lease_link */
    struct server *srv;
    struct ddp_list held_link; /* its holder's held (self-linked: none) */
};

struct server {
    struct ddp_loop *loop;
    int lfd;
    int efd;
    int port;
    uint8_t *token;
    size_t toklen;
    unsigned max_conns;
    int auth_timeout_ms;
    size_t max_outbuf;
    void (*lease_orphaned)(void *arg, uint64_t lease);
    void *orphan_arg;
    struct ddp_htab keys;
    struct ddp_htab leases;
    struct ddp_list watches;
    struct ddp_list conns;
    struct ddp_list closing;
    struct ddp_list flushq;
    struct ddp_list resumeq; /* connections whose parked WAIT was answered */
    struct ddp_timer accept_pause;
    uint64_t next_conn_id;
    uint32_t next_watch_id;
    /* The lines about refused and dropped connections, a limit per port: [0] the store's,
     * [1] the TCPStore port's (DDP__SRV_DROP_WARN). */
    struct ddp_log_limit drop_log[2];
    struct stats st;
    /* The TCPStore port (ddp_store_server_torch_listen): its socket, the peer addresses it
     * accepts, and the round whose key space new connections get. */
    int tfd;
    char **torch_allow;
    size_t ntorch_allow;
    _Atomic int torch_round;
};

/* The public name is the opaque struct ddp_store_server. */
struct ddp_store_server {
    struct server s;
};

/* ---- server_conn.c ---- */

/* Marks c for teardown after this loop iteration (reason is logged). */
void ddp__srv_close_later(struct conn *c, const char *reason);
/* A dropped or refused connection's warning, through its port's limit (a line a second). */
#define DDP__SRV_DROP_WARN(c, ...)                                                                 \
    DDP_WARN_LIMITED(&(c)->srv->drop_log[(c)->torch ? 1 : 0], STORE, __VA_ARGS__)
/* c has output queued: the after-hook writes it; a client that does not read is dropped. */
void ddp__srv_want_flush(struct conn *c);
/* Starts a reply to (op, id) with status in c's output; returns the position for _end. */
size_t ddp__srv_reply_begin(struct conn *c, uint8_t op, uint32_t id, int status);
void ddp__srv_reply_end(struct conn *c, size_t pos);
/* A reply with a status and no payload. */
void ddp__srv_reply(struct conn *c, uint8_t op, uint32_t id, int status);
/* The answer to a parked WAIT: a WAIT reply, or on a TCPStore connection its one byte
 * (STOP_WAITING 0 when the keys exist). */
void ddp__srv_reply_wait(struct conn *c, uint32_t id, int status);
/* Writes as much queued output as the socket takes; arms EPOLLOUT for the rest. */
void ddp__srv_flush(struct conn *c);

/* ---- server_torch.c ---- */

/* Handles every whole TCPStore request buffered on c (see ddp__srv_process); -1 when c is
 * closing. */
int ddp__srv_torch_process(struct conn *c);

/* ---- server_data.c ---- */

void ddp__srv_op_set(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_get(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_add(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_cas(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_delete(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_check(struct conn *c, const struct ddp__req *q);
/* A WAIT not answered at once parks c (its later requests wait: c->parked). */
void ddp__srv_op_wait(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_multi_get(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_watch(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_unwatch(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_lease_grant(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_lease_keepalive(struct conn *c, const struct ddp__req *q);
void ddp__srv_op_lease_revoke(struct conn *c, const struct ddp__req *q);
/* For the TCPStore protocol (server_torch.c): the data without ddprun's request framing. */
struct entry *ddp__srv_find(struct server *s, const uint8_t *key, uint32_t klen);
/* The entry of key, made (absent) if there is none; NULL when out of memory. */
struct entry *ddp__srv_get(struct server *s, const uint8_t *key, uint32_t klen);
/* Stores a value (taking ownership of val), waking waiters and sending SET events. */
void ddp__srv_set(struct server *s, struct entry *e, uint8_t *val, uint32_t vlen);
/* Deletes a present key (DELETE events); frees the entry when nothing refers to it. */
void ddp__srv_delete(struct server *s, struct entry *e);
/* The keys present whose names begin with prefix (NUM_KEYS with a prefix; rarely asked). */
uint64_t ddp__srv_count_prefix(struct server *s, const uint8_t *prefix, uint32_t plen);
/* A copy of n bytes (NULL when out of memory; a 0-length copy is not NULL). */
uint8_t *ddp__srv_dup(const uint8_t *p, uint32_t n);
/* The decimal integer ADD accepts (an optional '-' and digits): 0 or DDP_ENOTINT. */
int ddp__srv_parse_i64(const uint8_t *p, uint32_t n, int64_t *out);
/* Parks c on the n keys (until all exist at once; timeout_ms, DDP__WAIT_FOREVER for none):
 * 0 when parked, 1 when they all exist now (nothing parked), DDP_ENOMEM. */
int ddp__srv_park(struct conn *c, uint32_t reqid, const uint8_t *const *keys, const uint32_t *klens,
                  uint32_t n, uint32_t timeout_ms);
/* Drops c's parked WAIT without answering it (TCPStore's CANCEL_WAIT). */
void ddp__srv_unpark(struct conn *c);

/* Drops what connection c holds (its waiters and watches) before it is freed. */
void ddp__srv_conn_forget(struct conn *c);
/* Frees every key and lease (the server is being freed). */
void ddp__srv_data_free(struct server *s);

#endif
