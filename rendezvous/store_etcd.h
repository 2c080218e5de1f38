/*
 * The store client's operations on etcd (rendezvous/ only): with `rendezvous: {backend: etcd}`
 * a worker's store (DDPRUN_STORE_ADDR=etcd) is a key space under the job's prefix in etcd, and
 * rendezvous/store_client*.c pass the operations workers use here. Keys are the store's keys
 * under "<prefix>kv/"; a wait polls (one range request for any number of keys that share a
 * folder), backing off from 2 to 50 ms. The agents' and launcher's membership (leases and a
 * watch, cli/proto/membership_store.c) goes through the same calls.
 */
#ifndef DDP_RENDEZVOUS_STORE_ETCD_H
#define DDP_RENDEZVOUS_STORE_ETCD_H

#include "rendezvous/store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ddp__se;

/* endpoints: comma-separated; prefix ends with '/'; TLS files may be NULL. The cluster must
 * answer within timeout_ms. Messages go to the log. */
int ddp__se_open(const char *endpoints, const char *prefix, const char *ca, const char *cert,
                 const char *key, int timeout_ms, struct ddp__se **out);
void ddp__se_close(struct ddp__se *se);
void ddp__se_set_timeout(struct ddp__se *se, int timeout_ms);
int ddp__se_local_addr(struct ddp__se *se, char *buf, size_t len);
int ddp__se_set(struct ddp__se *se, const char *key, const void *val, size_t len);
int ddp__se_get(struct ddp__se *se, const char *key, void **val, size_t *len);
int ddp__se_add(struct ddp__se *se, const char *key, int64_t delta, int64_t *result);
int ddp__se_cas(struct ddp__se *se, const char *key, const void *expected, size_t exp_len,
                const void *desired, size_t des_len, bool *swapped, void **cur, size_t *cur_len);
int ddp__se_delete(struct ddp__se *se, const char *key, bool *deleted);
int ddp__se_check(struct ddp__se *se, const char *const *keys, size_t n, bool *all);
int ddp__se_wait(struct ddp__se *se, const char *const *keys, size_t n, int timeout_ms);
int ddp__se_multi_get(struct ddp__se *se, const char *const *keys, size_t n,
                      struct ddp_store_value *vals);
/* Leases are etcd's (TTLs rounded up to whole seconds); watches stream from etcd on threads of
 * their own and report a delete, a lease's end included, as DDP_STORE_EV_DELETE. */
int ddp__se_set_leased(struct ddp__se *se, const char *key, const void *val, size_t len,
                       uint64_t lease);
int ddp__se_lease_grant(struct ddp__se *se, int ttl_ms, uint64_t *lease);
int ddp__se_lease_keepalive(struct ddp__se *se, uint64_t lease, int *ttl_ms);
int ddp__se_lease_revoke(struct ddp__se *se, uint64_t lease);
int ddp__se_watch(struct ddp__se *se, const char *key, bool prefix, uint32_t *id);
int ddp__se_unwatch(struct ddp__se *se, uint32_t id);
/* May be called while another thread makes calls on se. */
int ddp__se_next_event(struct ddp__se *se, int timeout_ms, struct ddp_store_event **ev);
/* ddp__se_next_event (one blocked now, and every later call) returns DDP_ECLOSED. */
void ddp__se_interrupt(struct ddp__se *se);
/* What the last failed call met, naming the endpoint. */
const char *ddp__se_error(const struct ddp__se *se);

#endif
