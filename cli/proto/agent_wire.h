/*
 * The agent link's transport (cli/proto/agent_wire.c): however an agent is started, it dials
 * back to its launcher over TCP, both ends prove the job's token (mutual HMAC-SHA256, as the
 * store's handshake), and every byte after that travels sealed, AES-256-GCM with a key per
 * direction derived from the token and both nonces. The agent frames (cli/proto/agent_proto.h)
 * run inside, unchanged. docs/internals/agent-protocol.md describes the wire.
 *
 *   agent -> launcher   "DDPA" | u32 version | cnonce[16]             (DDP__AW_C1_LEN)
 *   launcher -> agent   "DDPA" | snonce[16] | HMAC(token, server, cn, sn)  (DDP__AW_S1_LEN)
 *   agent -> launcher   HMAC(token, client, sn, cn)                   (DDP__AW_C2_LEN)
 *   then both ways      records: u32 n | ciphertext[n] | tag[16], n in 1..DDP__AW_MAX_RECORD,
 *                       the 4 length bytes authenticated, the nonce a per-direction counter
 *
 * The agent's first sealed frame is ATTACH (who it is); the launcher's first is HELLO.
 * The launcher tells an agent it provisions where to dial, with which token, in BOOT, the one
 * frame it writes on the agent's stdin (over SSH, in the encrypted channel).
 */
#ifndef DDP_CLI_AGENT_WIRE_H
#define DDP_CLI_AGENT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

#define DDP__AW_VERSION 1u
#define DDP__AW_NONCE 16
#define DDP__AW_MAC 32
#define DDP__AW_C1_LEN (4 + 4 + DDP__AW_NONCE)
#define DDP__AW_S1_LEN (4 + DDP__AW_NONCE + DDP__AW_MAC)
#define DDP__AW_C2_LEN DDP__AW_MAC
#define DDP__AW_TAG 16
#define DDP__AW_MAX_RECORD (1u << 20)
#define DDP__AW_TICKET 32 /* a provisioned agent's ticket: hex of 16 random bytes */
#define DDP__AW_ADDRS_MAX 4096
/* launcher: external: the agent port, in the job's store, where `ddprun agent --join` reads it */
#define DDP__AGENT_PORT_KEY "ddprun/agent_port"

/* BOOT (stdin, plain) and ATTACH (the agent's first sealed frame): frame types beside
 * agent_proto.h's. */
enum {
    DDP__AG_BOOT = 0x09, /* str token, str addrs ("host:port,..."), u32 node, str ticket
                            [, u8 flags (DDP__AW_BOOT_*, not 0)] */
    /* the BOOT of the agents of one srun step, who all read it: str token, u32 n, then n x
     * (str host, u32 node, str ticket, str addrs); each agent takes its host's entry */
    DDP__AG_BOOT_GROUP = 0x0A,
    DDP__AG_ATTACH = 0x8A, /* u8 kind, u32 node, str ticket (kind 1) or the host's name (2) */
};
enum ddp__aw_kind {
    DDP__AW_PROVISIONED = 1, /* started by the launcher for node `node`, with its ticket */
    DDP__AW_EXTERNAL = 2,    /* started by someone else (`ddprun agent --join`) */
};

/* BOOT's flags: the agent was started by another agent (ssh.fanout, cli/proto/agent_tree.h),
 * whose death must not end it: the end of its session (its stdin) leaves its link alone. */
#define DDP__AW_BOOT_BELOW 1u

struct ddp__aw_boot {
    char token[256];
    char addrs[DDP__AW_ADDRS_MAX];
    uint32_t node;
    char ticket[DDP__AW_TICKET + 1];
    uint8_t flags;
};
int ddp__aw_put_boot(struct ddp_buf *b, const struct ddp__aw_boot *x);
/* BOOT_GROUP: begun with the token, then one entry per agent, then ended (its count patched). */
size_t ddp__aw_group_begin(struct ddp_buf *b, const char *token);
void ddp__aw_group_add(struct ddp_buf *b, const char *host, uint32_t node, const char *ticket,
                       const char *addrs);
void ddp__aw_group_end(struct ddp_buf *b, size_t pos, uint32_t n);
/* host's entry of a BOOT_GROUP body into x: 0, 1 when the group has no entry for host, or
 * DDP_EPROTO. */
int ddp__aw_get_boot_group(const uint8_t *body, size_t len, const char *host,
                           struct ddp__aw_boot *x);
/* 0, or DDP_EPROTO (malformed, a string too long or with a NUL). */
int ddp__aw_get_boot(const uint8_t *body, size_t len, struct ddp__aw_boot *x);

/* A string field of a frame into out (n bytes with its NUL): 0, or DDP_EPROTO (too long, a NUL
 * in it, or with printable a byte outside '!'..'~'). */
struct ddp_rd;
int ddp__aw_get_string(struct ddp_rd *r, char *out, size_t n, bool printable);

struct ddp__aw_attach {
    uint8_t kind;
    uint32_t node;
    char name[256]; /* the ticket (kind 1) or the host's name (kind 2), printable */
};
int ddp__aw_put_attach(struct ddp_buf *b, const struct ddp__aw_attach *x);
int ddp__aw_get_attach(const uint8_t *body, size_t len, struct ddp__aw_attach *x);

/* The handshake's messages. Each returns 0, or DDP_EAUTH (a MAC that does not match, OpenSSL
 * failing) / DDP_EPROTO (not our magic or version). */
int ddp__aw_c1(uint8_t out[DDP__AW_C1_LEN], uint8_t cnonce[DDP__AW_NONCE]);
int ddp__aw_s1(const char *token, const uint8_t c1[DDP__AW_C1_LEN], uint8_t cnonce[DDP__AW_NONCE],
               uint8_t snonce[DDP__AW_NONCE], uint8_t out[DDP__AW_S1_LEN]);
/* The agent checks S1 and writes C2. */
int ddp__aw_c2(const char *token, const uint8_t cnonce[DDP__AW_NONCE],
               const uint8_t s1[DDP__AW_S1_LEN], uint8_t snonce[DDP__AW_NONCE],
               uint8_t out[DDP__AW_C2_LEN]);
/* The launcher checks C2. */
int ddp__aw_check_c2(const char *token, const uint8_t cnonce[DDP__AW_NONCE],
                     const uint8_t snonce[DDP__AW_NONCE], const uint8_t c2[DDP__AW_C2_LEN]);

/* One end's sealing state. */
struct ddp__seal {
    uint8_t ktx[32], krx[32];
    uint64_t ntx, nrx;
    bool on;
};
/* Derives both directions' keys; agent says which end this is. 0 or DDP_EAUTH. */
int ddp__seal_init(struct ddp__seal *s, const char *token, const uint8_t cnonce[DDP__AW_NONCE],
                   const uint8_t snonce[DDP__AW_NONCE], bool agent);
void ddp__seal_wipe(struct ddp__seal *s);
/* Appends p[0..n) to out as records. 0, or DDP_ENOMEM / DDP_EAUTH. */
int ddp__seal_put(struct ddp__seal *s, const void *p, size_t n, struct ddp_buf *out);
/* Opens the whole records pending in raw (consumed) and appends their plaintext to plain.
 * 0 (a partial record stays), or DDP_EPROTO (a length out of range) / DDP_EAUTH (a record that
 * fails its tag: forged, replayed, reordered, or the wrong key) / DDP_ENOMEM. */
int ddp__seal_open(struct ddp__seal *s, struct ddp_buf *raw, struct ddp_buf *plain);

/* Agent side: connects to the first of addrs ("host:port,...") that answers and proves the
 * token, within timeout_ms for each, and sends ATTACH sealed. 0 with *fd (blocking) and *s set;
 * else -1 with why naming every address tried and what each did. */
int ddp__aw_dial(const char *addrs, const char *token, const struct ddp__aw_attach *att,
                 int timeout_ms, int *fd, struct ddp__seal *s, char *why, size_t whyn);

/* One address's dial and handshake, nothing sent after it (the replication port's client,
 * cli/agent/ckpt_repl.c): the blocking fd with *s set, or -1 with why. */
int ddp__aw_dial_one(const char *addr, const char *token, int timeout_ms, struct ddp__seal *s,
                     char *why, size_t whyn);
/* The serving end's handshake on a connected fd whose reads poll (blocking or not), within
 * timeout_ms: 0 with *s set, or -1 with why (its peer's fault, in words). */
int ddp__aw_accept(int fd, const char *token, int timeout_ms, struct ddp__seal *s, char *why,
                   size_t whyn);

/* Seals b and writes it all to fd (blocking), or writes it plain where s is NULL or off. */
int ddp__aw_write(int fd, struct ddp__seal *s, const void *p, size_t n);

#endif
