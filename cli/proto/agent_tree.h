/*
 * The SSH tree's frames (ssh.fanout, cli/proto/agent_tree.c), on the agent link beside
 * agent_proto.h's. Where a job has more SSH nodes than ssh.fanout, the launcher starts the first
 * level itself and has each agent start up to ssh.fanout nodes below it: SPAWN asks an agent to
 * run `ddprun __ssh-bridge` for a node, with the BOOT the launcher made for it, and what that
 * bridge says comes back as CHILD_MSG, its end as CHILD_EXIT. The agent below dials back to the
 * launcher itself: only its start goes through its parent.
 *
 *   launcher -> agent
 *     KNOWN_HOSTS  str content: the launcher's known_hosts, which the bridges below check host
 *                  keys against (sent before the first SPAWN to an agent, again when it changed)
 *     SPAWN        u32 node, u32 start (the launcher's count of the node's starts below another:
 *                  the frames about this start carry both), str host, u32 port, str user, str
 * identity, str strict, str remote_ddprun, u64 grace_ms, str agent_args, str known_hosts_name (the
 *                  launcher's file, for messages), str boot (the whole BOOT frame), u8 flags
 *                  (DDP__SPAWN_*)
 *     UNSPAWN      u32 node, u32 start, u8 level: end that node's bridge (1: SIGTERM, which kills
 * the remote session; 2: SIGKILL) agent -> launcher CHILD_MSG    u32 node, u32 start, str line: a
 * line its bridge (or the agent below, before its link) wrote on stderr CHILD_EXIT   u32 node, u32
 * start, i32 wait status: its bridge ended HOST_KEY     u32 node, u32 start, str line: a host key
 * the bridge accepted under accept-new, as a known_hosts line, for the launcher's known_hosts
 */
#ifndef DDP_CLI_AGENT_TREE_H
#define DDP_CLI_AGENT_TREE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

enum {
    DDP__AG_KNOWN_HOSTS = 0x0B,
    DDP__AG_SPAWN = 0x0C,
    DDP__AG_UNSPAWN = 0x0D,
    DDP__AG_CHILD_MSG = 0x8B,
    DDP__AG_CHILD_EXIT = 0x8C,
    DDP__AG_HOST_KEY = 0x8D,
};

#define DDP__TREE_KH_MAX (960u << 10) /* a known_hosts handed down: within one frame */
#define DDP__TREE_BOOT_MAX 8192
#define DDP__SPAWN_FORWARD_AGENT 1u /* ssh.forward_agent: the bridge forwards the SSH agent */

struct ddp__spawn {
    uint32_t node, start, port;
    uint64_t grace_ms;
    uint8_t flags; /* DDP__SPAWN_FORWARD_AGENT */
    char host[256], user[256], identity[4096], strict[16], remote[4096], args[256];
    char kh_name[4096];
    const uint8_t *boot; /* into the frame's body (get) */
    uint32_t boot_len;
};
int ddp__tree_put_spawn(struct ddp_buf *b, const struct ddp__spawn *s);
/* 0, or DDP_EPROTO (malformed, a string too long or with a NUL, host or strict not printable,
 * boot empty or over DDP__TREE_BOOT_MAX). */
int ddp__tree_get_spawn(const uint8_t *body, size_t len, struct ddp__spawn *s);

/* A frame of u32 node, u32 start and one string (CHILD_MSG, HOST_KEY; KNOWN_HOSTS is a string
 * alone). */
int ddp__tree_put_node_str(struct ddp_buf *b, uint8_t type, uint32_t node, uint32_t start,
                           const char *s, size_t n);
/* 0 (*s points into body, n bytes, no NUL in them), or DDP_EPROTO. */
int ddp__tree_get_node_str(const uint8_t *body, size_t len, uint32_t *node, uint32_t *start,
                           const uint8_t **s, uint32_t *n);
int ddp__tree_put_known_hosts(struct ddp_buf *b, const char *content, size_t n);
int ddp__tree_get_known_hosts(const uint8_t *body, size_t len, const uint8_t **s, uint32_t *n);
/* UNSPAWN (u32, u32, u8) and CHILD_EXIT (u32, u32, i32) */
int ddp__tree_put_unspawn(struct ddp_buf *b, uint32_t node, uint32_t start, uint8_t level);
int ddp__tree_get_unspawn(const uint8_t *body, size_t len, uint32_t *node, uint32_t *start,
                          uint8_t *level);
int ddp__tree_put_child_exit(struct ddp_buf *b, uint32_t node, uint32_t start, int32_t st);
int ddp__tree_get_child_exit(const uint8_t *body, size_t len, uint32_t *node, uint32_t *start,
                             int32_t *st);

#endif
