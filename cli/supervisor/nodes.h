/*
 * The launcher's node agents as processes: one per node, started through its provisioner
 * (cli/provision/provision.h), told on its stdin where to dial back (BOOT), and sent the agent
 * frames (cli/proto/agent_proto.h) on the link it dials (cli/proto/agent_wire.h). What
 * comes back is handed to the supervisor through callbacks on the launcher's loop: each whole
 * frame, each line the agent (or its SSH bridge) writes on stderr, and its end once the launcher
 * has reaped it (ddp__nodes_reaped) and read the last of its output.
 */
#ifndef DDP_CLI_NODES_H
#define DDP_CLI_NODES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cli/proto/agent_wire.h"
#include "cli/sys/devices.h"
#include "cli/provision/provision.h"
#include "common/buf.h"
#include "common/loop.h"

struct ddp_loop;
struct ddp_job;
struct ddp__agent_join;
struct ddp__agent_start;

struct ddp__nodes_cb {
    void (*frame)(void *arg, int node, uint8_t type, const uint8_t *body, size_t len);
    void (*message)(void *arg, int node, const char *line, size_t n);
    /* The agent process ended with wait status st (its last frames were delivered first). */
    void (*ended)(void *arg, int node, int st);
    /* Where node i's agent dials back (its BOOT): "host:port,...". */
    void (*dial_addrs)(void *arg, int node, char *out, size_t n);
    /* An agent started elsewhere took slot i (launcher: external), from peer's address. */
    void (*taken)(void *arg, int node, const char *peer_ip);
    void *arg;
    const char *token; /* the job's: the agents prove it when they dial back */
};

struct ddp__nodes;

struct ddp__node_proc {
    struct ddp__nodes *owner; /* for the loop's callbacks */
    int index;
    const struct ddp__prov_ops *prov;
    struct ddp__child ch; /* pid 0 when none runs */
    /* The agent's link: it dials back (cli/supervisor/dialin.h) with the ticket its BOOT gave
     * it; until then what is sent waits in txq. link is -1 before and after. */
    int link;
    bool linked; /* it dialled back, this start */
    struct ddp__seal seal;
    struct ddp_buf lraw, txq;
    char ticket[DDP__AW_TICKET + 1];
    /* launcher: external: no process; the slot is held from start until its agent's link ends
     * (or it is ended before one came), then fin tells cb.ended. JOIN waits in join for the
     * agent's name. */
    bool external, slot_held;
    /* Its provisioner starts many agents as one process (srun: one step): pending until
     * ddp__nodes_flush starts them, then a member of steps[step], held as a slot is. via_link:
     * it ended by its link's end, not its step's. */
    bool grouped, pending, via_link;
    int step;
    /* Started by the agent of node parent over SSH (ssh.fanout, cli/supervisor/node_tree.c),
     * held as a slot is; fin_st: how it ended (its bridge's status there, 0 by its link).
     * kh_sent: the known_hosts generation its agent has, to hand down to the nodes below it. */
    bool below;
    int tree_up; /* its parent in the SSH tree (ddp__job_ssh_tree), -1: the launcher */
    int parent, fin_st;
    unsigned kh_sent;
    uint32_t tree_start; /* its starts below another: the tree's frames about one carry it */
    struct ddp_buf join;
    struct ddp_timer fin;
    struct ddp_buf rx, erx;
    uint64_t outputs, acked; /* OUTPUT, ERROR frames handed over on this link, and acknowledged */
    bool hello;              /* its HELLO came, of our protocol (cli/proto/agent_proto.h) */
    bool has_counts;         /* and said what its node gives ranks (an older agent does not) */
    struct ddp__node_counts counts;
    uint32_t port;     /* a port it found free on its node (its HELLO), 0: none said */
    char refused[320]; /* why its link was refused (another ddprun), for describe */
    bool holding;      /* rejoined: its OUTPUT, ERROR frames are held until STATE */
    struct ddp_buf held;
    uint64_t held_dropped; /* and those beyond the bound, counted once the others are */
};

/* One process that started the agents of several nodes (an srun step: cli/supervisor/
 * node_steps.c). */
struct ddp__node_step {
    struct ddp__nodes *owner;
    struct ddp__child ch; /* pid 0 once reaped */
    struct ddp_buf erx;
    int first; /* the node its messages are told under */
};

struct ddp__nodes {
    struct ddp_loop *loop;
    const struct ddp_job *job;
    struct ddp__prov_ctx ctx;
    struct ddp__nodes_cb cb;
    struct ddp__node_proc *p; /* one per node of the job */
    struct ddp__node_step *steps;
    size_t nsteps;
    unsigned kh_gen; /* of the launcher's known_hosts: 1, and one more per key added below */
};

int ddp__nodes_init(struct ddp__nodes *n, struct ddp_loop *loop, const struct ddp_job *job,
                    const struct ddp__prov_ctx *ctx, const struct ddp__nodes_cb *cb);
/* Closes what is left (the processes must have been reaped). */
void ddp__nodes_release(struct ddp__nodes *n);

/* Starts node i's agent and sends it HELLO and JOIN; 0, or -1 with errno. join NULL: rejoins a
 * waiting agent (ctx.rejoin), whose first frame after HELLO other than the acknowledged ones
 * (OUTPUT, ERROR, CKPT_FILE) is STATE:
 * those before it (which the last launcher may not have shown, of a round STATE names) are held
 * until ddp__nodes_flush_held. With ctx.detach, those frames handed over (or dropped) are
 * acknowledged (ACK) after each read. */
int ddp__nodes_start(struct ddp__nodes *n, int i, const struct ddp__agent_join *join);
/* A rejoined agent's OUTPUT and ERROR frames held until its STATE: handed over to cb.frame
 * (deliver) or dropped (its CKPT_FILE records are handed over either way); from now on its
 * frames are handed over as they come. */
void ddp__nodes_flush_held(struct ddp__nodes *n, int i, bool deliver);
/* Starts the agents ddp__nodes_start left pending as their provisioner's groups (one srun step
 * for the nodes of one CPU count): call it after starting a round's nodes. 0, or -1 said. */
int ddp__nodes_flush(struct ddp__nodes *n);
/* START for a round (type DDP__AG_START), or a spare's PREPARE (DDP__AG_PREPARE). */
void ddp__nodes_start_round(struct ddp__nodes *n, int i, uint8_t type,
                            const struct ddp__agent_start *st);
/* STOP: sig first (SIGINT or SIGTERM), SIGKILL after grace_ms; grace_ms 0 kills at once. */
void ddp__nodes_stop(struct ddp__nodes *n, int i, uint64_t grace_ms, int sig);
/* A frame built elsewhere (the checkpoints' CKPT_OPEN and CKPT_SYNC, cli/supervisor/ckpt.h). */
void ddp__nodes_frame(struct ddp__nodes *n, int i, const struct ddp_buf *b);
/* SIGNAL: sig to each running worker. */
void ddp__nodes_signal(struct ddp__nodes *n, int i, int sig);
/* STACKS: the native stacks of these local ranks (nlocal 0: all), answered by STACKS_REPLY
 * with req. */
void ddp__nodes_stacks(struct ddp__nodes *n, int i, uint32_t req, const int *local, int nlocal);
/* BYE and the end of the agent's link: it stops what runs and exits. */
void ddp__nodes_close(struct ddp__nodes *n, int i);
/* Ends node i's agent process at once (level 1, then 2: see ddp__prov_ops.end). */
void ddp__nodes_end(struct ddp__nodes *n, int i, int level);

/* What node i's agent said its node gives ranks (its HELLO); false when it said nothing. */
bool ddp__nodes_counts(const struct ddp__nodes *n, int i, struct ddp__node_counts *c);
/* A port node i's agent found free on its node when it started (its HELLO), 0 when it said
 * none: MASTER_PORT where it is node 0 and rank 0 hosts the TCPStore. */
uint32_t ddp__nodes_free_port(const struct ddp__nodes *n, int i);
/* Refuses node i's agent for why (the message names the node; describe says it): it is
 * ended. */
void ddp__nodes_refuse(struct ddp__nodes *n, int i, const char *why);

/* Opens the agent port (cli/supervisor/dialin.h) on host:want (0: a free port), its port in
 * *port, for the job's token; the links that prove it come to ddp__nodes_attach. 0, or -1
 * said. Closed by ddp__nodes_release. */
int ddp__nodes_listen(struct ddp__nodes *n, const char *host, int want, int *port);
/* The agent port's callback (cli/supervisor/dialin.h): an agent that proved the token says it
 * is node a->node's, with its ticket; true when that node's agent waits for its link. */
bool ddp__nodes_attach(struct ddp__nodes *n, int fd, struct ddp__seal *s,
                       const struct ddp__aw_attach *a, struct ddp_buf *raw, struct ddp_buf *plain,
                       const char *peer, char *why, size_t whyn);

/* Whether node i's agent runs: its process (or, for a slot of launcher: external, the slot is
 * held for an agent or by one). */
bool ddp__nodes_running(const struct ddp__nodes *n, int i);
bool ddp__nodes_all_gone(const struct ddp__nodes *n);
/* Why node i's agent that ended with st is gone ("the SSH connection to it ended", ...). */
/* The signal that killed node i's agent itself, from its process's wait status st, or 0 where
 * that is not known (cli/provision/provision.h, agent_signal). */
int ddp__nodes_agent_signal(const struct ddp__nodes *n, int i, int st);
void ddp__nodes_describe(const struct ddp__nodes *n, int i, int st, bool joining, char *buf,
                         size_t len);
/* A child was reaped: when it was an agent, its output is read to the end and cb.ended is
 * called. True when pid was one. */
bool ddp__nodes_reaped(struct ddp__nodes *n, pid_t pid, int st);

/* cli/supervisor/node_steps.c, for nodes.c (which it never calls): starts the pending members of
 * nodes of cpus CPUs as one step (0, or -1 with errno); the step of pid reaped (its index, -1
 * when pid is none); step s ended at level when none of its members is left; whether some step
 * still runs; the steps let go. */
int ddp__nodes_steps_start(struct ddp__nodes *n, int cpus);
/* cli/supervisor/node_link.c, for nodes.c and node_tree.c: a frame to agent i (on its link, or
 * kept until it dials back); node i's link closed and, for a node without a process of its own,
 * its end told from the loop (fin); BOOT for node i's agent, with flags (DDP__AW_BOOT_*), into
 * out (0, or -1 with errno). */
void ddp__nodes_send(struct ddp__nodes *n, int i, const struct ddp_buf *b);
void ddp__nodes_link_end(struct ddp__nodes *n, int i);
int ddp__nodes_boot(struct ddp__nodes *n, int i, uint8_t flags, struct ddp_buf *out);
/* cli/supervisor/node_tree.c, for nodes.c (which it never calls): starts node i through the agent
 * of its parent in the SSH tree (0), or says it starts as usual (1: not a node of the tree, or no
 * node above it runs), or -1 with errno; a frame of the tree's from node i's agent (true: taken);
 * node i ended at level (its parent ends its bridge); node i ended, and what it started below it
 * that never dialled back ends with it (the others live on, by their links). */
int ddp__nodes_tree_start(struct ddp__nodes *n, int i, const struct ddp__agent_join *join);
bool ddp__nodes_tree_frame(struct ddp__nodes *n, int i, uint8_t type, const uint8_t *body,
                           size_t len);
void ddp__nodes_tree_end(struct ddp__nodes *n, int i, int level);
void ddp__nodes_tree_gone(struct ddp__nodes *n, int i);
/* Node i held for an agent yet to dial back: a slot of launcher: external (HELLO waits in txq,
 * JOIN's body in join until the agent's name is known), or a member of a step to start (HELLO and
 * JOIN in txq). 0, or -1 with errno. */
int ddp__nodes_hold_slot(struct ddp__nodes *n, int i, const struct ddp__agent_join *join);
int ddp__nodes_hold_member(struct ddp__nodes *n, int i, const struct ddp__agent_join *join);
int ddp__nodes_steps_reaped(struct ddp__nodes *n, pid_t pid);
void ddp__nodes_steps_end(struct ddp__nodes *n, int s, int level);
bool ddp__nodes_steps_live(const struct ddp__nodes *n);
void ddp__nodes_steps_release(struct ddp__nodes *n);

#endif
