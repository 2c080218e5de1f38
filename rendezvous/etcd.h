/*
 * An etcd v3 client over etcd's JSON gateway (HTTP/1.1 through libcurl): keys and values,
 * create-if-absent (a transaction), prefix listing and deletion, leases. The rendezvous backend
 * for clusters that outgrow one store (issue 19) is built on it.
 *
 * Endpoints are tried in order, starting from the last one that answered: a member that cannot
 * be reached, times out or answers 5xx (no leader) passes the request to the next, so a cluster
 * that keeps its quorum serves on. Every failure leaves a message naming the endpoint and the
 * cause in ddp_etcd_error(). One client is one connection: use it from one thread at a time.
 */
#ifndef DDP_RENDEZVOUS_ETCD_H
#define DDP_RENDEZVOUS_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ddp_etcd;

struct ddp_etcd_opts {
    /* "http://HOST:PORT", "https://HOST:PORT" or "unix:///PATH" (a Unix socket) */
    const char *const *endpoints;
    size_t nendpoints;
    const char *ca_file, *cert_file, *key_file; /* TLS: CA to trust, client certificate and key */
    int timeout_ms;                             /* per request and endpoint; 0: 5000 */
};

int ddp_etcd_new(const struct ddp_etcd_opts *o, struct ddp_etcd **out);
void ddp_etcd_free(struct ddp_etcd *e);
/* What the last failed call met, naming the endpoint ("etcd at URL: ..."). */
const char *ddp_etcd_error(const struct ddp_etcd *e);

/* The request timeout from now on (0: 5000 ms). */
void ddp_etcd_set_timeout(struct ddp_etcd *e, int timeout_ms);
/* The endpoint that answered last (or is tried first). */
const char *ddp_etcd_endpoint(const struct ddp_etcd *e);
/* This end's IP address of the last connection (none for a Unix socket: DDP_ENOKEY). */
int ddp_etcd_local_ip(struct ddp_etcd *e, char *out, size_t n);

/* The server's version ("3.4.23"). */
int ddp_etcd_version(struct ddp_etcd *e, char *out, size_t n);
/* The cluster's current revision. */
int ddp_etcd_revision(struct ddp_etcd *e, int64_t *rev);
/* Puts key = val, bound to lease (0: none). */
int ddp_etcd_put(struct ddp_etcd *e, const char *key, const void *val, size_t vlen, int64_t lease);
/* key's value (malloc'd, NUL-terminated past vlen) and its mod revision; DDP_ENOKEY if absent. */
int ddp_etcd_get(struct ddp_etcd *e, const char *key, char **val, size_t *vlen, int64_t *mod_rev);
/* Puts key = val only if key's mod revision is mod_rev (0: the key does not exist); *swapped
 * says whether it did. */
int ddp_etcd_put_if(struct ddp_etcd *e, const char *key, int64_t mod_rev, const void *val,
                    size_t vlen, int64_t lease, bool *swapped);
/* Puts key = val only if key does not exist; *created says which. */
int ddp_etcd_create(struct ddp_etcd *e, const char *key, const void *val, size_t vlen,
                    int64_t lease, bool *created);
/* Deletes key, or every key under it with prefix; *deleted (may be NULL): how many. */
int ddp_etcd_delete(struct ddp_etcd *e, const char *key, bool prefix, int64_t *deleted);
/* Every key under prefix, in key order, to cb; *revision (may be NULL): the store's revision. */
int ddp_etcd_list(struct ddp_etcd *e, const char *prefix,
                  void (*cb)(void *arg, const char *key, const char *val, size_t vlen), void *arg,
                  int64_t *revision);
/* A lease of ttl_s seconds. */
int ddp_etcd_lease_grant(struct ddp_etcd *e, int64_t ttl_s, int64_t *id);
/* Renews it; *ttl (may be NULL): its new TTL. DDP_ENOLEASE once it expired or was revoked. */
int ddp_etcd_lease_keepalive(struct ddp_etcd *e, int64_t id, int64_t *ttl);
/* Ends it now: its keys go. */
int ddp_etcd_lease_revoke(struct ddp_etcd *e, int64_t id);

/*
 * A watch: every change under prefix from revision start_rev (0: from now on), in order, to cb,
 * from a thread of its own. kind is 'P' (put: val) or 'D' (delete, lease expiry included); rev
 * the change's revision. Should the member it streams from go, the watch goes on from the next
 * endpoint at the revision after the last one seen, so no change is lost or repeated; when no
 * endpoint answers for the timeout, cb gets kind 'E' with the error as key, once, and the watch
 * ends. cb runs on the watch's thread.
 */
struct ddp_etcd_watch;
int ddp_etcd_watch_start(const struct ddp_etcd_opts *o, const char *prefix, int64_t start_rev,
                         void (*cb)(void *arg, char kind, const char *key, const char *val,
                                    size_t vlen, int64_t rev),
                         void *arg, struct ddp_etcd_watch **out);
/* Ends the watch (within a second) and frees it; cb is not called after it returns. */
void ddp_etcd_watch_stop(struct ddp_etcd_watch *w);

#endif
