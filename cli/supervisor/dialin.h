/*
 * The launcher's agent port (cli/supervisor/dialin.c): where every node agent dials back, on
 * the launcher's loop. A connection proves the job's token (cli/proto/agent_wire.h) within
 * DDP__DIALIN_DEADLINE_MS and says who it is (ATTACH); the link then belongs to the nodes
 * (cli/supervisor/nodes.h), or is refused. A connection that does not prove the token, speaks
 * something else or stalls is closed and logged through a rate limit; at most
 * DDP__DIALIN_PENDING wait at once, beyond them new ones are closed at once. No thread or
 * process per connection.
 */
#ifndef DDP_CLI_DIALIN_H
#define DDP_CLI_DIALIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/proto/agent_wire.h"
#include "common/buf.h"

struct ddp_loop;

#define DDP__DIALIN_DEADLINE_MS 10000
#define DDP__DIALIN_PENDING 1024

struct ddp__dialin_cb {
    /* An agent proved the token and said who it is: take the link and return true (fd, its
     * seal, what came after ATTACH: raw records not yet opened and plain bytes; the buffers
     * may be taken over, leaving them empty), or return false with why (the connection is
     * then closed and the refusal logged). */
    bool (*attach)(void *arg, int fd, struct ddp__seal *s, const struct ddp__aw_attach *a,
                   struct ddp_buf *raw, struct ddp_buf *plain, const char *peer, char *why,
                   size_t whyn);
    void *arg;
};

struct ddp__dialin_stats {
    uint64_t accepted, linked, refused_auth, refused_other, dropped_busy, timed_out;
};

/* Listens on host:port (port 0: a free one) for the job with token (borrowed: read at each
 * handshake, so a takeover may restore the job's into it). 0, or DDP_E* said. */
int ddp__dialin_start(struct ddp_loop *loop, const char *host, int port, const char *token,
                      const struct ddp__dialin_cb *cb);
/* The port it listens on, 0 when it does not. */
int ddp__dialin_port(void);
void ddp__dialin_stats(struct ddp__dialin_stats *st);
/* Closes the listener and every connection still proving itself. */
void ddp__dialin_stop(void);

#endif
