/*
 * A small read-only HTTP/1.1 server on the caller's event loop (common/loop.h), for what the
 * launcher shows to other programs (metrics.listen: Prometheus' /metrics). GET and HEAD only;
 * every answer closes its connection. Bounds: 64 connections at once (more are closed at
 * accept), 8 KiB of request head, 5 s to send it; a peer outside the allowed ranges is closed
 * at accept. Refusals and malformed requests are logged at most once a second, with a count of
 * those not logged. The handler runs on the loop; its answer is written without blocking.
 */
#ifndef DDP_CLI_SYS_HTTP_SERVE_H
#define DDP_CLI_SYS_HTTP_SERVE_H

#include "cli/sys/cidr.h"
#include "common/buf.h"

#include <stdbool.h>
#include <stddef.h>

struct ddp_loop;
struct ddp__http;

/* Fills body (and *ctype, a static string) for path; returns the HTTP status (200, 404). */
typedef int (*ddp__http_handler)(void *arg, const char *path, struct ddp_buf *body,
                                 const char **ctype);

/*
 * Listens on host:port (port 0: a free one; *bound the port taken) for peers in allow[0..nallow)
 * (nallow 0: loopback peers only). name says what it serves in log lines ("metrics"). 0, or -1
 * with why.
 */
int ddp__http_open(struct ddp_loop *loop, const char *host, int port, const struct ddp__cidr *allow,
                   int nallow, const char *name, ddp__http_handler h, void *arg, int *bound,
                   struct ddp__http **out, char *why, size_t whyn);
/* A request head, head[0..len) and a NUL after it: 0 while it is not whole (and under 8 KiB);
 * else 200 with *head_only (HEAD) and target (the path, its query cut), or the status of its
 * refusal: 400 (not HTTP/1.x, a NUL byte), 405 (not GET or HEAD), 431 (over 8 KiB). */
int ddp__http_head(const char *head, size_t len, bool *head_only, char target[1024]);
/* Closes the port and every connection. NULL is a no-op. */
void ddp__http_close(struct ddp__http *s);
/* Requests answered, and connections refused or dropped (for tests and metrics). */
void ddp__http_counts(const struct ddp__http *s, unsigned long long *answered,
                      unsigned long long *refused);

#endif
