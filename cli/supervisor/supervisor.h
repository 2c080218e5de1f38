/*
 * The supervisor's state, private to its two files: cli/supervisor/rounds.c (the policy: rendezvous
 * rounds, elastic restarts, the ranks' bookkeeping, stopping) and cli/supervisor/supervise.c (a job
 * from start to end: the store, the views, the nodes, signals, the summary), which calls rounds.c
 * and is never called by it. The supervisor talks to the nodes through cli/supervisor/nodes.h, to
 * the membership backend through cli/proto/membership.h, and to the console and the records only as
 * views (cli/view/view.h).
 */
#ifndef DDP_CLI_SUPERVISOR_H
#define DDP_CLI_SUPERVISOR_H

#include "cli/view/console.h"
#include "cli/spec/job.h"
#include "cli/proto/membership.h"
#include "cli/supervisor/nodes.h"
#include "cli/view/record.h"
#include "cli/view/attached.h"
#include "cli/view/view.h"
#include "common/loop.h"
#include "rendezvous/store.h"

struct ddp_etcd;

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#define DDP__SUP_TAIL_LINES 10
#define DDP__SUP_STOP_SLACK_MS 5000 /* beyond stop_grace, for agents to report before they end */
/* A node lost by its lease is ended through its provisioner (its SSH session, its srun step);
 * what has not ended this long after is SIGKILLed here. Longer than the node's guard takes
 * beyond the lease's expiry (cli/agent/guard.h): a round that waits for the lost node's end
 * starts only once the node's old ranks ended, or its guard ended them. */
#define DDP__SUP_END_WAIT_MS 2000
/* A node lost by its connection's end while it had ranks: the next round waits this long at most
 * for its agent's lease to end. An agent that lives kills its ranks at once and revokes it (it
 * finds the launcher's store still there, cli/agent/agent.c: cut_off); one that died leaves its
 * ranks dead with it (their parent-death signal, its guard). One its provisioner knows was
 * killed by a signal (cli/provision/provision.h, agent_signal) is not waited for. */
#define DDP__SUP_DRAIN_MS 1000
#define DDP__SUP_MAX_SHELL_ENV (384u << 10) /* exported shell variables, beside the job's env */

struct ddp__sup_rank {
    int node, local;
    bool started, exited, exec_failed, lost;
    bool stopped; /* it ended after its node was asked to stop it */
    int code;     /* >= 0 exit status, < 0 minus the signal */
    int64_t runtime_ms;
    int64_t t_started; /* when its STARTED came (ddp_now_ms), for a lost rank's runtime */
    bool cut[2];       /* its last stdout, stderr line was cut at 64 KiB: the next goes on */
    char *tail[DDP__SUP_TAIL_LINES];
    int ntail;
    char *error, *traceback; /* what it wrote to its TORCHELASTIC_ERROR_FILE, or NULL */
};

enum ddp__node_state {
    DDP__NS_NONE,     /* no agent */
    DDP__NS_JOINING,  /* agent started, JOIN sent, JOINED not yet seen */
    DDP__NS_READY,    /* joined, no workers: waiting for a round (or a spare) */
    DDP__NS_RUNNING,  /* a member of the current round, workers started */
    DDP__NS_STOPPING, /* STOP sent, DONE not yet seen */
    DDP__NS_GONE,     /* counted lost; its agent is being killed and reaped */
};

struct ddp__sup_node {
    enum ddp__node_state state;
    unsigned incarnation;
    int rank_offset, member_index;
    int64_t last_fail, cool_until;
    bool was_lost;     /* lost before: it rejoins when it can, rounds do not wait for it */
    int64_t left_ms;   /* when its agent revoked its lease while its process ran on, else 0 */
    int64_t ending_ms; /* when it was lost by its lease and its provisioner told to end it */
    /* when its agent's process ended (its connection) while it had ranks, until its lease ends
     * (the agent revoked it, having ended its ranks) or DDP__SUP_DRAIN_MS passed; 0 if not */
    int64_t draining_ms;
    unsigned draining_inc;
    uint64_t lease;   /* its agent's lease (JOINED), 0 before */
    int64_t heard_ms; /* when its last heartbeat's progress report was made (ddp_now_ms), or 0 */
    /* when the store's connection that kept that lease alive closed (its agent's process is
     * gone, or cut off from the store), else 0: a node lost by its connection within
     * DDP__SUP_DRAIN_MS of it is not drained */
    int64_t orphaned_ms;
    char why[160]; /* why it was last out, for the rendezvous timeout's message */
    bool closing;  /* done at the job's end, closed once checkpoint copies end (ckpt.h) */
};

struct ddp__sup_loss {
    int node, round;
    int64_t t_ms;  /* since the job started */
    char when[32]; /* wall clock, UTC */
    char why[300];
};

enum ddp__sup_phase { DDP__PH_RDZV, DDP__PH_RUNNING, DDP__PH_RESTARTING, DDP__PH_FINISHING };

struct ddp__sup {
    const struct ddp_job *job;
    char job_id[160];
    char logdir[PATH_MAX];
    char token[DDP_STORE_TOKEN_HEX + 1];
    char store_addr[300], store_host[256];
    int store_port;
    /* rendezvous: {backend: etcd}: the endpoints (comma-separated) and the job's folder */
    char *etcd_eps, etcd_prefix[512];
    struct ddp_etcd *etcd;        /* a client of it, for the cleanup at the end */
    struct ddp_store_server *srv; /* the job\'s store (its thread runs it) */
    int orphans[2]; /* leases whose holder's connection closed, from its thread (a pipe) */
    int torch_port; /* its TCPStore port, 0 when rendezvous.torch_store is rank0 */
    bool wildcard;
    int agent_port; /* where every agent dials back (cli/supervisor/dialin.h), on listen's host */
    const char *first_remote; /* the address of the first node that is not this machine */
    char **node_addr;    /* [node]: Slurm's NodeAddr where it is not the node's name, or NULL */
    char **env;          /* the job's extra environment, "K=V" */
    char **shell_env;    /* what remote ranks get from the launching shell (the export rule) */
    char self[PATH_MAX]; /* this ddprun's path: the default path on remote nodes */
    struct ddp_loop *loop;
    sigset_t oldmask;
    struct ddp__nodes nodes;
    struct ddp__sup_node *nd; /* per node */
    struct ddp__sup_rank *rk; /* [0, world) are the current round's ranks */
    int total_slots;          /* rk's length: the most ranks a round has had room for */
    enum ddp__sup_phase ph;
    int round, world, nmembers;
    /* Restarts not counted against max_restarts: a round a node was lost from before every
     * one of its ranks had started is the previous failure's restart over again (two nodes
     * lost a moment apart cost one restart). */
    int free_rounds;
    int ranks_up, ranks_done, ranks_ok;
    int first_fail; /* rank in the current round, or -1 */
    char *fatal;    /* why the job stops, when it stops early */
    int fatal_rc;
    bool interrupted, opened;
    bool hup_ignored; /* SIGHUP was ignored when ddprun started (nohup): it is not passed on */
    int sigints;
    int stop_sig;   /* what a stop sends the ranks first: SIGINT after an interrupt */
    int escalation; /* 0; 1 once agents were told to end; 2 once SIGKILLed */
    struct ddp__sup_loss *losses;
    int nlosses;
    struct ddp__rec rec;
    struct ddp__console con;
    struct ddp__view views[4]; /* the console, the records, attached consoles, the round
                                  record in etcd (cli/supervisor/takeover.c) */
    struct ddp__remote remote;
    int nviews;
    const struct ddp__member_ops *member;
    struct ddp__member_watch *watch;
    bool tty;
    bool detached;      /* ddprun --detach: no terminal; the console is console.log */
    int64_t t0, t_lost; /* t_lost: when the last member was lost (recovery time) */
    /* The launcher's own stall (stopped, starved): when its loop last ticked, and the last
     * stall longer than the heartbeat timeout, which the agents answer by stopping their ranks
     * (rounds.c: launcher_stall). */
    int64_t last_tick_ms, stall_ms, stall_end_ms;
    const char *phase_name;
    struct ddp_timer tick, force, stop_deadline, rdzv_deadline, last_call, retry, left_check;
    struct ddp_timer end_check; /* nodes lost by their lease: ended at level 2 if still there */
    /* cli/supervisor/takeover.c: how long agents wait for a new launcher (0: no takeover), this
     * launcher's lease in etcd, and whether it took the job over from another */
    uint64_t takeover_ms;
    int64_t sup_lease;
    bool sup_lost, resuming;
    struct ddp_timer keepalive;
};

/* The one supervisor of this process (cli/supervisor/ranks.c). */
extern struct ddp__sup ddp__supervisor;

/* ---- cli/supervisor/rounds.c, for cli/supervisor/supervise.c ---- */

/* A message of ddprun's to every view. */
void ddp__sup_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* An event in events.jsonl: see ddp__rec_event. */
#define ddp__sup_event(...) ddp__rec_event(&ddp__supervisor.rec, ddp__supervisor.round, __VA_ARGS__)
void ddp__sup_set_phase(const char *phase);
/* The status line of every view, now. */
void ddp__sup_draw_status(void);
/* Arms the supervisor's timers on its loop. */
void ddp__sup_timers_init(void);
/* Opens the first round (and, as it closes, starts the workers). */
void ddp__sup_open(void);
/* The job ends: why is NULL on success, rc the exit status it stands for. */
void ddp__sup_finish(const char *why, int rc);
/* Every view gets the job's summary: the console's table, summary.json, ddprun.log
 * (cli/supervisor/summary.c). */
void ddp__sup_summarize(int rc);
/* diagnose.on_hang is fail and the ranks hang: the round fails with why. */
void ddp__sup_hang_failed(const char *why);

/* ---- cli/supervisor/stop.c: the end of a stop ---- */

/* Ends the agents that are left: level 1, then 2 (cli/supervisor/nodes.h). */
void ddp__sup_escalate(void);
/* The stop's deadline and the kill two seconds after level 1, on the supervisor's loop. */
void ddp__sup_stop_timers_init(void);

/* ---- cli/supervisor/ranks.c: the book of the round's ranks ---- */

/* How rank r of the current round ended. */
struct ddp__outcome ddp__sup_outcome(int r);
/* A line of a rank's output (progress: a line it rewrites in place, kept out of its log). */
/* flags: DDP__LINE_PROGRESS, DDP__LINE_CUT (cli/view/view.h); the launcher adds DDP__LINE_REST. */
void ddp__sup_rank_output(int rank, int stream, const uint8_t *line, size_t n, unsigned flags);
/* An ERROR frame's body after its local rank (cli/proto/agent_proto.h): rank's error. */
void ddp__sup_rank_error(int rank, const uint8_t *body, size_t len);
/* The views and the watchdog learn the round's ranks. */
void ddp__sup_announce_round(void);
/* Forgets every rank's last lines and state. */
void ddp__sup_release_ranks(void);
/* The store's address as node i reaches it (cli/supervisor/round_start.c). */
void ddp__sup_node_store_addr(int i, char *out, size_t n);
/* cli/supervisor/external.c: the job's token (rendezvous.token_file's, else a new one); the
 * agent port published in the store (launcher: external); slot i taken by an agent from ip. */
int ddp__sup_token(const struct ddp_job *job);
int ddp__sup_publish_agent_port(void);
void ddp__sup_slot_taken(int i, const char *peer_ip);
/* The job's own store's connections accepted and requests served so far; -1 without one (etcd). */
void ddp__sup_store_counts(long long *conns, long long *requests);
/* The agent port's addresses as node i reaches them, "host:port,..." (its BOOT). */
void ddp__sup_node_agent_addr(int i, char *out, size_t n);
/* The address node i is reached at: Slurm's NodeAddr where the node's name is not its address
 * (a name only Slurm knows), else its host name. */
const char *ddp__sup_node_addr(int i);
/* Numbers the ready members' ranks and sends each START (the round's phase begins); -1 with
 * why (at least 16 bytes) when the round cannot start: then no member was started. */
int ddp__sup_start_round(char *why, size_t whylen);
/* Node i, joined and waiting while a round runs (a spare), is sent PREPARE, so that its agent
 * keeps warm interpreters ready for its slots (cli/agent/warm.h): where the job may restart,
 * warm is on, and no pipeline plans each round's environment. */
void ddp__sup_prepare_spare(int i);
/* Room for n ranks in L.rk (grown as nodes count their slots, cli/supervisor/node_slots.c); -1 when
 * out of memory. */
int ddp__sup_ranks_reserve(int n);
/* A node whose slots nproc_per_node gpu|cpu|auto counts there: its slots from the counts its
 * agent's HELLO gave, the job's env and (another machine) the exported shell variables before
 * the node's own. False when it has none to run (the node is refused, saying why); true for
 * any other node. */
bool ddp__sup_count_slots(int i);
/* "exited with status 3", "was killed by signal 9 (Killed)". */
void ddp__sup_describe_exit(int code, char *buf, size_t n);
/* The callbacks of the nodes (cli/supervisor/nodes.h) and of the membership watch. */
extern const struct ddp__nodes_cb ddp__sup_nodes_cb;
void ddp__sup_on_member(void *arg, const struct ddp__member_ev *ev);
/* The connection that kept lease alive closed (the store's lease_orphaned, rendezvous/store.h). */
void ddp__sup_lease_orphaned(uint64_t lease);
/* ---- cli/supervisor/takeover.c ---- */
int ddp__to_start(void);
void ddp__to_end(void);
struct ddp__view ddp__to_view(void);
int ddp__to_restore(void);
void ddp__to_resume(const char *from);
/* Where the job's members meet (the store or etcd) as a JOIN's fields: token, store_addr,
 * job_id and the etcd settings; the rest zero. */
void ddp__sup_join_where(struct ddp__agent_join *jf);

#endif
