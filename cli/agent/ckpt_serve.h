/*
 * The replication port (cli/agent/ckpt_serve.c): where the job's other agents fetch this node's
 * checkpoint files (cli/agent/ckpt_repl.h; the wire: cli/proto/ckpt_proto.h). A thread accepts;
 * each connection gets a thread of its own, at most 8 at once (more are closed at once), 5 s for
 * the agent link's handshake with the job's token and 5 s for its one request, a path under
 * the folder opened beneath it without following links. Refusals (a wrong token, garbage, a
 * stalled half frame, too many at once) are logged at most once a second.
 */
#ifndef DDP_CLI_AGENT_CKPT_SERVE_H
#define DDP_CLI_AGENT_CKPT_SERVE_H

#include <stddef.h>

/* Serves the folder open at dirfd on bind_host (a port the kernel picks): 0 with addr
 * ("host:port"), or -1 with why. */
int ddp__cs_start(int dirfd, const char *token, const char *bind_host, char *addr, size_t addrn,
                  char *why, size_t whyn);
/* Stops accepting (connections being served end within their timeouts). */
void ddp__cs_stop(void);

#endif
