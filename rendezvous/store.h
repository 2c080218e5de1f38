/*
 * The ddprun rendezvous store: a TCP key-value server (one thread, one epoll
 * loop) and its blocking client, plus the helpers ranks use to meet (barrier,
 * all-gather). The store only moves bytes: what they mean (an NCCL unique id, an
 * address) is its users' business. Every connection proves knowledge of
 * the job token with an HMAC-SHA256 challenge-response. The wire protocol is
 * specified in man/ddprun-store.7.
 */
#ifndef DDP_RENDEZVOUS_STORE_H
#define DDP_RENDEZVOUS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Limits (also enforced by the server).                              */
/* ------------------------------------------------------------------ */
#define DDP_STORE_MAX_KEY 4096         /* bytes in a key */
#define DDP_STORE_MAX_VALUE (16 << 20) /* bytes in a value */
#define DDP_STORE_MAX_MULTI 65536      /* keys in one check/wait/multi_get */
#define DDP_STORE_TOKEN_HEX 64         /* ddp_store_token_generate writes 64 hex chars */
#define DDP_STORE_WAIT_FOREVER (-1)

/* ------------------------------------------------------------------ */
/* Server                                                             */
/* ------------------------------------------------------------------ */
struct ddp_store_server;

struct ddp_store_server_opts {
    const char *host;    /* address to bind: "0.0.0.0", "127.0.0.1", "::"; NULL = 0.0.0.0 */
    int port;            /* 0 picks a free port */
    const void *token;   /* job token (borrowed; the server keeps its own copy) */
    size_t token_len;    /* 1..4096 bytes */
    unsigned max_conns;  /* 0 = 65536 */
    int auth_timeout_ms; /* time a new connection has to authenticate; 0 = 10000 */
    size_t max_outbuf;   /* bytes queued to a slow reader before it is dropped; 0 = 256 MiB */
    /* Called on the server's thread when the connection that granted a lease, or last kept it
     * alive, closes while the lease lives: its holder is gone, or has not reconnected yet
     * (the lease itself lives on to its expiry). NULL: not called. */
    void (*lease_orphaned)(void *arg, uint64_t lease);
    void *orphan_arg;
};

/*
 * Binds and listens (SOCK_NONBLOCK|SOCK_CLOEXEC, backlog SOMAXCONN) and raises
 * RLIMIT_NOFILE to its hard limit. Nothing is served until ddp_store_server_run.
 * Returns 0 and *out, or DDP_EINVAL (bad options), DDP_ESYS (bind/listen;
 * logged with the address), DDP_ENOMEM.
 */
int ddp_store_server_new(const struct ddp_store_server_opts *opts, struct ddp_store_server **out);

/* The bound port (the real one when opts.port was 0). */
int ddp_store_server_port(const struct ddp_store_server *srv);

/*
 * Also serves PyTorch's TCPStore protocol (torch 1.13 to 2.1, and 2.2 on) on host:port (port
 * 0 picks a free one, written to *port_out), for unmodified PyTorch programs: MASTER_ADDR and
 * MASTER_PORT point there, as at torchrun's agent store. That protocol has no authentication:
 * only connections from the nallow addresses of allow (numeric IPs: the job's nodes) are served;
 * others are closed at once. Call before ddp_store_server_run. Its keys live in a key space per
 * round (ddp_store_server_torch_round), under "torch/<round>/" in the store. 0 or a DDP_E code.
 */
int ddp_store_server_torch_listen(struct ddp_store_server *srv, const char *host, int port,
                                  const char *const *allow, size_t nallow, int *port_out);
/* The round whose key space TCPStore connections accepted from now on use (thread-safe). */
void ddp_store_server_torch_round(struct ddp_store_server *srv, int round);

/*
 * Serves on the calling thread until ddp_store_server_stop. Returns 0, or
 * DDP_ESYS if the event loop fails.
 */
int ddp_store_server_run(struct ddp_store_server *srv);

/* Asks a running server to return from _run. Thread-safe and async-signal-safe. */
void ddp_store_server_stop(struct ddp_store_server *srv);

/* Closes every connection and frees the server (wiping its token). Call it only after
 * ddp_store_server_run has returned (or was never called). NULL is a no-op. */
void ddp_store_server_free(struct ddp_store_server *srv);

/* Counters, for tests and `ddprun store` statistics. Safe to call from any thread. */
struct ddp_store_server_stats {
    uint64_t conns_accepted, conns_open, conns_refused_auth, conns_dropped;
    uint64_t keys, waiters, watches, leases, leases_expired;
    uint64_t requests; /* requests of the store's protocol served (the handshake's included) */
};
void ddp_store_server_get_stats(const struct ddp_store_server *srv,
                                struct ddp_store_server_stats *st);

/* ------------------------------------------------------------------ */
/* Client                                                             */
/* ------------------------------------------------------------------ */
struct ddp_store;

/*
 * Connects to host:port and authenticates with token (borrowed, copied).
 * Refused or unreachable connects are retried with exponential backoff until
 * timeout_ms passes. The server's identity is checked too (mutual HMAC).
 * Returns 0 and *out, or DDP_ECONNECT (never reachable; logged with the
 * address), DDP_EAUTH (wrong token), DDP_EVERSION, DDP_ETIMEDOUT, DDP_EPROTO.
 */
int ddp_store_connect(const char *host, int port, const void *token, size_t token_len,
                      int timeout_ms, struct ddp_store **out);

/*
 * Connects using the environment ddprun gives workers: DDPRUN_STORE_ADDR
 * ("host:port") and the token from DDPRUN_TOKEN_FD (an inherited pipe, read
 * once and closed) or DDPRUN_TOKEN_FILE (a 0600 file). DDP_EINVAL, logged
 * with the variable's name, when they are missing or malformed.
 */
int ddp_store_connect_env(int timeout_ms, struct ddp_store **out);

/*
 * A store that is a folder of an etcd cluster (rendezvous: {backend: etcd}): keys live under
 * "<prefix>kv/", leases are etcd's (whole seconds) and a watch reports a lease's end as a
 * delete. Every operation but num_keys works; a wait polls. The cluster must answer within
 * timeout_ms. DDPRUN_STORE_ADDR=etcd makes ddp_store_connect_env take this path, with
 * DDPRUN_ETCD_ENDPOINTS, _PREFIX, _CA, _CERT and _KEY.
 */
struct ddp_store_etcd_opts {
    const char *endpoints;       /* comma-separated URLs: http://, https://, unix:///PATH */
    const char *prefix;          /* the job's folder, ending with '/' */
    const char *ca, *cert, *key; /* TLS files, or NULL */
};
int ddp_store_connect_etcd(const struct ddp_store_etcd_opts *o, int timeout_ms,
                           struct ddp_store **out);

/* Closes the connection and frees the client. NULL is a no-op. */
void ddp_store_close(struct ddp_store *s);

/*
 * Writes this end's IP address of the connection to the store (numeric, no
 * port) into buf: the address of the interface that routes to the store,
 * which peers on other nodes can usually reach too. DDP_ECLOSED if the
 * connection is gone.
 */
int ddp_store_local_addr(struct ddp_store *s, char *buf, size_t len);

/*
 * Deadline for each following call, in ms (default: DDP_STORE_TIMEOUT_MS or
 * 300000). When a call times out the connection is closed (a late reply would
 * otherwise be misread) and later calls return DDP_ECLOSED.
 */
void ddp_store_set_timeout(struct ddp_store *s, int timeout_ms);

/*
 * All operations below are blocking and thread-safe (one request at a time
 * per client). They return 0 on success or a negative DDP_E* code:
 * DDP_ETIMEDOUT, DDP_ECLOSED (server gone), DDP_EPROTO, DDP_ETOOBIG (key or
 * value over the limits), plus the per-call codes listed. Keys are
 * NUL-terminated strings; values are bytes.
 */
int ddp_store_ping(struct ddp_store *s);

/* Sets key. Wakes waiters and notifies watchers. */
int ddp_store_set(struct ddp_store *s, const char *key, const void *val, size_t len);

/* Sets key bound to a lease: it is deleted when the lease expires or is revoked.
 * DDP_ENOLEASE if the lease does not exist. */
int ddp_store_set_leased(struct ddp_store *s, const char *key, const void *val, size_t len,
                         uint64_t lease);

/* Gets key into a malloc'd buffer the caller frees (NUL-terminated for
 * convenience, not counted in *len). DDP_ENOKEY if absent (does not wait). */
int ddp_store_get(struct ddp_store *s, const char *key, void **val, size_t *len);

/* Atomically adds delta to the decimal int64 in key (absent = 0), stores and
 * returns the result. DDP_ENOTINT if the value is not a decimal int64;
 * DDP_EINVAL on overflow. */
int ddp_store_add(struct ddp_store *s, const char *key, int64_t delta, int64_t *result);

/*
 * Compare-and-set. expected == NULL means "key absent". If the key's state
 * matches, it becomes desired and *swapped is true. cur and cur_len (optional,
 * malloc'd) receive the value after the operation; *cur is NULL if absent.
 */
int ddp_store_cas(struct ddp_store *s, const char *key, const void *expected, size_t exp_len,
                  const void *desired, size_t des_len, bool *swapped, void **cur, size_t *cur_len);

/* Deletes key; *deleted (optional) tells whether it existed. */
int ddp_store_delete(struct ddp_store *s, const char *key, bool *deleted);

/* *all = every key exists now (does not wait). */
int ddp_store_check(struct ddp_store *s, const char *const *keys, size_t n, bool *all);

int ddp_store_num_keys(struct ddp_store *s, int64_t *n);

/*
 * Waits until every key exists. The wait is parked on the server: no
 * polling. timeout_ms < 0 waits for ever (still bounded by nothing but the
 * server's life). DDP_ETIMEDOUT if the keys did not all appear in time; the
 * connection stays usable in that case.
 */
int ddp_store_wait(struct ddp_store *s, const char *const *keys, size_t n, int timeout_ms);

struct ddp_store_value {
    void *data; /* malloc'd, NULL when the key is absent */
    size_t len;
};
/* Gets n keys in one round trip into vals[0..n). Free with ddp_store_values_free. */
int ddp_store_multi_get(struct ddp_store *s, const char *const *keys, size_t n,
                        struct ddp_store_value *vals);
void ddp_store_values_free(struct ddp_store_value *vals, size_t n);

/* ------------------------------------------------------------------ */
/* Watches and leases                                                 */
/* ------------------------------------------------------------------ */
enum ddp_store_event_kind {
    DDP_STORE_EV_SET = 1,    /* key set (value attached) */
    DDP_STORE_EV_DELETE = 2, /* key deleted by a client */
    DDP_STORE_EV_EXPIRE = 3, /* key deleted because its lease expired */
    DDP_STORE_EV_REVOKE = 4, /* key deleted because its holder revoked its lease */
};

struct ddp_store_event {
    enum ddp_store_event_kind kind;
    uint32_t watch_id;
    char *key;   /* NUL-terminated */
    void *value; /* NUL-terminated, for SET */
    size_t value_len;
};

/*
 * Watches one key, or every key starting with key when prefix is true. The
 * server pushes an event for every later change; read them with
 * ddp_store_next_event. *id identifies the watch in events and unwatch.
 */
int ddp_store_watch(struct ddp_store *s, const char *key, bool prefix, uint32_t *id);
int ddp_store_unwatch(struct ddp_store *s, uint32_t id);

/*
 * Returns the next pushed event (in server order), waiting up to timeout_ms
 * (0 polls, < 0 waits for ever). DDP_ETIMEDOUT if none came. Free *ev with
 * ddp_store_event_free.
 */
int ddp_store_next_event(struct ddp_store *s, int timeout_ms, struct ddp_store_event **ev);
void ddp_store_event_free(struct ddp_store_event *ev);

/*
 * From another thread: a ddp_store_next_event blocked on s returns DDP_ECLOSED at once, and so
 * does every later one (on the built-in store the connection is shut down: every later call
 * fails). For a thread that waits for events until told to stop; close s with ddp_store_close
 * once that thread has returned.
 */
void ddp_store_interrupt(struct ddp_store *s);

/* Grants a lease living ttl_ms (1 .. 2^31-1) unless renewed. */
int ddp_store_lease_grant(struct ddp_store *s, int ttl_ms, uint64_t *lease);
/* Renews a lease for another full TTL; *ttl_ms (optional) receives it. DDP_ENOLEASE if it expired.
 */
int ddp_store_lease_keepalive(struct ddp_store *s, uint64_t lease, int *ttl_ms);
/* Ends a lease now, deleting its keys (watchers see DDP_STORE_EV_REVOKE; through etcd, whose
 * watches tell neither end from a delete, DDP_STORE_EV_DELETE). */
int ddp_store_lease_revoke(struct ddp_store *s, uint64_t lease);

/* ------------------------------------------------------------------ */
/* Rendezvous helpers                                                 */
/* ------------------------------------------------------------------ */

/*
 * Blocks until n callers have entered the barrier called name (use a fresh
 * name for each barrier). Costs one ADD and one parked WAIT per caller.
 * DDP_EINVAL if more than n callers arrive.
 */
int ddp_store_barrier(struct ddp_store *s, const char *name, int n, int timeout_ms);

/*
 * Rank `rank` of n publishes blob under "<prefix>/<rank>" and receives every
 * rank's blob in out[0..n) (free with ddp_store_values_free).
 */
int ddp_store_all_gather(struct ddp_store *s, const char *prefix, int rank, int n, const void *blob,
                         size_t len, int timeout_ms, struct ddp_store_value *out);

/* Everyone or no one: an all-gather of each rank's ok under prefix; *all is true when every
 * one of the n ranks said ok (false when the all-gather failed, whose code is returned). */
int ddp_store_all_agree(struct ddp_store *s, const char *prefix, int rank, int n, bool ok,
                        int timeout_ms, bool *all);

/* ------------------------------------------------------------------ */
/* Tokens                                                             */
/* ------------------------------------------------------------------ */

/* Writes a fresh random token as 64 lowercase hex chars plus NUL into hex[65]. */
int ddp_store_token_generate(char hex[DDP_STORE_TOKEN_HEX + 1]);

/*
 * Reads a token file: the file must be a regular file not readable by group
 * or others; a trailing newline is stripped. *tok is malloc'd; release it
 * with ddp_store_token_free. DDP_EINVAL (logged, with the path) otherwise.
 */
int ddp_store_token_read_file(const char *path, uint8_t **tok, size_t *len);

/* Reads the token ddprun handed over: DDPRUN_TOKEN_FD, else DDPRUN_TOKEN_FILE. */
int ddp_store_token_from_env(uint8_t **tok, size_t *len);

/* Wipes and frees a token. NULL is a no-op. */
void ddp_store_token_free(uint8_t *tok, size_t len);

#ifdef __cplusplus
}
#endif

#endif
