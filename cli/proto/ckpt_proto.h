/*
 * Checkpoints the agents replicate (checkpoint.replicas, cli/supervisor/ckpt.h): the frames on
 * the agent link that carry their records and orders, and the agent-to-agent copy's wire
 * (cli/proto/ckpt_proto.c). docs/internals/agent-protocol.md describes both.
 *
 * On the agent link (agent_proto.h's framing, beside its frames):
 *   launcher -> agent
 *     CKPT_OPEN  str dir: watch dir, serve its files to peers, answer CKPT_PORT
 *     CKPT_SYNC  make dir match a manifest (struct ddp__ck_sync): fetch each listed file from
 *                its holders unless the copy here is that version, remove each dropped one;
 *                answer CKPT_SYNCED. A restore (flag) holds the next START until it is done.
 *   agent -> launcher
 *     CKPT_PORT  str addr ("host:port" peers dial, "" when none), str why (when none)
 *     CKPT_FILE  u8 kind (1 finished, 2 removed), u32 round, str rel, u64 size, sha256[32]
 *     CKPT_SYNCED u32 id, u32 files fetched, u64 bytes fetched, u64 ms, u32 n,
 *                n x (str rel, str why): the files it could not make match
 *
 * Agent to agent (the replication port): the agent link's handshake with the job's token
 * (agent_wire.h: the dialing agent as the agent, the serving one as the launcher), then
 * sealed records both ways: the client sends GET (u32 len | u8 1 | str rel), the server
 * answers u8 status (0 here, 1 no such file, 2 refused) | u64 size, then the file's size
 * bytes, and closes. The client checks the copy's SHA-256 against the record before it puts
 * it in place.
 */
#ifndef DDP_CLI_CKPT_PROTO_H
#define DDP_CLI_CKPT_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

/* (beside agent_proto.h's, agent_wire.h's and agent_tree.h's types) */
enum {
    DDP__AG_CKPT_OPEN = 0x0F,
    DDP__AG_CKPT_SYNC = 0x10,
    DDP__AG_CKPT_PORT = 0x8E,
    DDP__AG_CKPT_FILE = 0x8F,
    DDP__AG_CKPT_SYNCED = 0x90,
};
_Static_assert(DDP__AG_CKPT_FILE == 0x8F, "agent_proto.h's ddp__agent_acked names CKPT_FILE");

#define DDP__CK_REL_MAX 1024    /* a file's path under the folder, bytes */
#define DDP__CK_ADDR_MAX 300    /* a peer's "host:port" */
#define DDP__CK_WHY_MAX 512     /* a failure's text */
#define DDP__CK_SYNC_RESTORE 1u /* CKPT_SYNC's flag: the next START waits for it */
#define DDP__CK_GET 1u          /* the replication port's one request */

enum ddp__ck_op { DDP__CK_HAVE = 1, DDP__CK_DROP = 2 };
enum ddp__ck_file_kind { DDP__CK_FINISHED = 1, DDP__CK_REMOVED = 2 };

/* A file's path under the checkpoint folder that is safe to join to it: 1..REL_MAX bytes, no
 * leading '/', no empty, "." or ".." component, no control byte. */
bool ddp__ck_rel_ok(const char *rel, size_t n);

struct ddp__ck_file {
    uint8_t kind;
    uint32_t round;
    char rel[DDP__CK_REL_MAX + 1];
    uint64_t size;
    uint8_t sha[32];
};
int ddp__ck_put_file(struct ddp_buf *b, const struct ddp__ck_file *f);
int ddp__ck_get_file(const uint8_t *body, size_t len, struct ddp__ck_file *f);

struct ddp__ck_entry {
    uint8_t op; /* enum ddp__ck_op */
    char *rel;
    uint64_t size;    /* HAVE */
    uint8_t sha[32];  /* HAVE */
    uint32_t nh;      /* HAVE: its holders, indexes into the sync's addrs, in the order to try */
    uint32_t *holder; /* nh of them */
};
struct ddp__ck_sync {
    uint32_t id;
    uint8_t flags;
    uint32_t naddr;
    char **addr; /* naddr of them */
    uint32_t n;
    struct ddp__ck_entry *e;
};
int ddp__ck_put_sync(struct ddp_buf *b, const struct ddp__ck_sync *s);
/* 0, or DDP_EPROTO (malformed, a path not ddp__ck_rel_ok, a holder out of range) / ENOMEM. */
int ddp__ck_get_sync(const uint8_t *body, size_t len, struct ddp__ck_sync *s);
void ddp__ck_sync_release(struct ddp__ck_sync *s);

struct ddp__ck_fail {
    char rel[DDP__CK_REL_MAX + 1];
    char why[DDP__CK_WHY_MAX + 1];
};
struct ddp__ck_synced {
    uint32_t id, files;
    uint64_t bytes, ms;
    uint32_t nfail;
    struct ddp__ck_fail *fail; /* nfail of them */
};
int ddp__ck_put_synced(struct ddp_buf *b, const struct ddp__ck_synced *s);
int ddp__ck_get_synced(const uint8_t *body, size_t len, struct ddp__ck_synced *s);

/* CKPT_PORT: addr is "" with why when the agent serves nothing. */
int ddp__ck_put_port(struct ddp_buf *b, const char *addr, const char *why);
int ddp__ck_get_port(const uint8_t *body, size_t len, char addr[DDP__CK_ADDR_MAX + 1],
                     char why[DDP__CK_WHY_MAX + 1]);

/* The replication port's request (the plaintext after the handshake): 1 and rel when a whole
 * GET is in p[0..n) (*used its bytes), 0 when more is needed, DDP_EPROTO when it is not one. */
int ddp__ck_get_request(const uint8_t *p, size_t n, char rel[DDP__CK_REL_MAX + 1], size_t *used);
int ddp__ck_put_request(struct ddp_buf *b, const char *rel);

#endif
