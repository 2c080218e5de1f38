/*
 * The agent's part in the SSH tree (ssh.fanout, cli/proto/agent_tree.h): on SPAWN it starts a
 * node below it as the launcher starts one, `ddprun __ssh-bridge` with the node's BOOT on its
 * stdin (cli/provision/ssh_bridge.c), checking host keys against the known_hosts the launcher
 * handed down (KNOWN_HOSTS, kept in a private temporary file while the agent runs). Each line
 * the bridge writes on stderr goes up as CHILD_MSG (a host key accepted under accept-new as
 * HOST_KEY), and its end as CHILD_EXIT. The node below dials back to the launcher itself, and
 * lives by that link: a bridge's end (this agent's death included) does not end it.
 */
#ifndef DDP_CLI_AGENT_FANOUT_H
#define DDP_CLI_AGENT_FANOUT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/buf.h"

struct ddp_loop;

/* send: a frame to the launcher (on the agent's link); mask: the signal mask bridges start
 * with. */
void ddp__fanout_init(struct ddp_loop *loop, void (*send)(struct ddp_buf *b), const sigset_t *mask);
/* A frame from the launcher: 1 when it was one of the tree's (acted on), 0 when not, -1 when
 * it was malformed (said on stderr). */
int ddp__fanout_frame(uint8_t type, const uint8_t *body, size_t len);
/* Whether pid is a bridge (a child the agent's sweeps spare: it ends by its node's link). */
bool ddp__fanout_owns(pid_t pid);
/* A child was reaped: when it was a bridge, its last lines and its end go up. True when so. */
bool ddp__fanout_reaped(pid_t pid, int st);
/* The agent is leaving: the bridges that run are given until their nodes end (the launcher ends
 * them on their own links), stop_grace and 5 s at most, then killed; done is called from the
 * loop once none is left. False when none runs (done is not called). */
bool ddp__fanout_end(void (*done)(void));
/* Kills what is left (at once) and removes the known_hosts copy. */
void ddp__fanout_release(void);

#endif
