/*
 * A node's share of the checkpoints the agents replicate (checkpoint.replicas; the launcher's
 * share: cli/supervisor/ckpt.h; the frames and the wire: cli/proto/ckpt_proto.h). On CKPT_OPEN
 * the agent watches the node-local checkpoint folder (cli/agent/ckpt_watch.h), reports each file
 * the ranks finish there with its size and SHA-256 (CKPT_FILE, with the round the agent is in)
 * and each reported file removed; serves the folder's files to the job's other agents on a port
 * of its own (the agent link's handshake and sealing, the job's token; at most 8 connections at
 * once, each given 5 s for its handshake and request; refusals logged at most once a second);
 * and makes the folder match each CKPT_SYNC: a listed file whose copy here is not that version is
 * fetched from its holders in turn into a hidden temporary name and renamed into place only
 * when its SHA-256 matches the record. Hashing and copying run on the agent's own threads, never
 * in its loop, so the ranks' output and the heartbeat go on meanwhile. A restore (a SYNC sent
 * before a round's START) holds that START until it is done, and where a file could not be
 * made to match, until the launcher stops the round.
 */
#ifndef DDP_CLI_AGENT_CKPT_REPL_H
#define DDP_CLI_AGENT_CKPT_REPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

struct ddp_loop;

struct ddp__cr_cb {
    uint32_t (*round)(void);         /* the round the agent is in now */
    void (*send)(struct ddp_buf *b); /* a frame for the launcher (the loop's thread) */
    /* the last restore is done: ok, a held START goes on; else it waits for the launcher's
     * verdict (its STOP) */
    void (*restored)(bool ok);
};

/* Starts the watch of dir and the replication port on bind_host (the node's address toward
 * the launcher). 0 with addr ("host:port" for the peers), or -1 with why. Once per agent. */
int ddp__cr_open(struct ddp_loop *loop, const char *dir, const char *token, const char *bind_host,
                 const struct ddp__cr_cb *cb, char *addr, size_t addrn, char *why, size_t whyn);
/* CKPT_SYNC's body: queued for the copying thread. 0; 1 when the folder could not be opened
 * (ignored: CKPT_PORT said why); or DDP_EPROTO (malformed). */
int ddp__cr_sync(const uint8_t *body, size_t len);
/* Every file the ranks finished here so far is reported (or found unchanged): nothing waits in
 * the watch or the copying thread. The agent waits for it before DONE (a round's last
 * checkpoint is recorded before the next round's restore, or the job's end). */
bool ddp__cr_quiet(void);
/* A restore is queued or running. */
bool ddp__cr_restoring(void);
/* Ends the watch, the port and the threads (an operation in flight is cut short). */
void ddp__cr_close(void);

#endif
