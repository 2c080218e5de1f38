/* What the etcd client's two files share (rendezvous/etcd.c defines them; etcd_watch.c uses
 * them). Not for other files. */
#ifndef DDP_RENDEZVOUS_ETCD_PRIV_H
#define DDP_RENDEZVOUS_ETCD_PRIV_H

#include <stddef.h>

struct ddp_json;

/* libcurl loaded and set up, once per process (rendezvous/curl_dl.h): 0, or DDP_ENOTSUP
 * (logged, naming why) when it cannot be loaded. */
int ddp__etcd_global_init(void);
/* p[0..n) as base64 (malloc'd), or NULL. */
char *ddp__etcd_b64(const void *p, size_t n);
/* The base64 of the end of the range of keys under prefix (malloc'd), or NULL. */
char *ddp__etcd_prefix_end(const char *prefix);
/* The key and value of key-value object kv (decoded, malloc'd, NUL-terminated): 0, or -1 when
 * it has no key or they are not base64. */
int ddp__etcd_kv(const struct ddp_json *j, int kv, char **key, char **val, size_t *vlen);

#endif
