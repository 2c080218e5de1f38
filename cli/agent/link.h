/*
 * The node agent's link to its launcher (cli/agent/link.c): the frames it sends, and what
 * happens when the launcher goes away without saying goodbye (BYE). Without a takeover wait
 * that stops the node, as always. With one (rendezvous: {backend: etcd}, JOIN's takeover_ms),
 * the workers run on: the agent holds what it would have sent behind the output the dead
 * launcher had not acknowledged (ACK: it may have been lost on the way) and a STATE frame of
 * what that launcher had been told, listens on an abstract Unix socket of its user, job and
 * node, and a new launcher (`ddprun attach --etcd`) reaches it there through
 * `ddprun agent --rejoin JOB NODE` started as any agent is (locally, over SSH). Should none
 * come within takeover_ms, the node stops.
 */
#ifndef DDP_CLI_AGENT_LINK_H
#define DDP_CLI_AGENT_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/buf.h"

struct ddp_loop;

struct ddp__link_cb {
    void (*readable)(int fd);              /* the launcher's frames wait on fd */
    void (*snapshot)(struct ddp_buf *out); /* appends the STATE frame of now */
    void (*gone)(void);   /* the launcher is gone and none came in time: stop the node */
    void (*linked)(void); /* a new launcher linked: its frames start afresh (HELLO first) */
};

/* The first launcher: the agent reads BOOT on stdin, dials back to the launcher and proves the
 * job's token (cli/proto/agent_wire.h); the frames travel sealed on that connection. version is
 * ours, said in the HELLO that goes first on every link. 0, or -1 said on stderr (the agent
 * ends with status 3). */
int ddp__link_init(struct ddp_loop *loop, const struct ddp__link_cb *cb, const char *version);
/* `ddprun agent --join HOST:PORT --token-file FILE` (launcher: external): as ddp__link_init, but
 * the agent finds the launcher at HOST:PORT (its store, which gives the agent port) with the
 * file's token, and says it is started by someone else, under this host's name. */
int ddp__link_init_join(struct ddp_loop *loop, const struct ddp__link_cb *cb, const char *version,
                        const char *hostport, const char *token_file);
/* Dials one of addrs ("host:port,...") with token and says who this agent is: the connected
 * fd (the link's seal set), or -1 with every address tried named on stderr. */
struct ddp__aw_attach;
int ddp__link_dial(const char *addrs, const char *token, const struct ddp__aw_attach *att);
/* Makes fd (from ddp__link_dial) the link: says HELLO and watches it. 0 or -1. */
int ddp__link_attach(int fd, const char *version);
/* Reads what the launcher sent on fd into in, opening its records: > 0 when frames' bytes came,
 * -EAGAIN when none (yet), 0 at EOF, another negative errno on an error (-EBADMSG: a record
 * that failed its authentication, said on stderr). */
ssize_t ddp__link_read(int fd, struct ddp_buf *in);
/* After JOIN: the agent's job, node, and how long it waits for a new launcher (0: never). */
void ddp__link_configure(const char *job_id, unsigned node, uint64_t takeover_ms);
/* Sends a frame (output: a worker's line, which may be dropped while held beyond a bound).
 * True when it went out; false when it is held (or, with no takeover, lost). */
bool ddp__link_send(const struct ddp_buf *b, bool output);
/* ACK's body (cli/proto/agent_proto.h): the launcher has shown that many OUTPUT frames of this
 * link. 0, or -1 when malformed (or more than were sent). */
int ddp__link_ack(const uint8_t *body, size_t len);
/* The launcher is gone (EOF on its frames; a failed write calls this itself). With a takeover
 * wait: waits for a new one and returns 0; else -1, and the caller stops the node. */
int ddp__link_lost(void);
void ddp__link_release(void);

/* The launcher's first frame on a link: true when it is its HELLO, of our protocol. Else
 * false, said on stderr where a launcher that said HELLO would not say it itself (to one of
 * another protocol, our HELLO tells the mismatch). */
bool ddp__link_hello(uint8_t type, const uint8_t *body, size_t len);

/* `ddprun agent --rejoin JOB NODE`: relays stdin and stdout to that agent's socket. */
int ddp__cmd_agent_rejoin(const char *job_id, const char *node);

#endif
