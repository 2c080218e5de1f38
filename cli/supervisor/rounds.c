/*
 * The supervisor's policy: a job runs as a series of rendezvous rounds. Each node's agent
 * joins the membership (a lease it keeps alive); a round closes once at least
 * elastic.min_nodes agents have joined (at most max_nodes), ranks are numbered contiguously
 * over the members in node order; workers start with TORCHELASTIC_RESTART_COUNT = the round.
 *
 * A member node is lost when its lease ends (missed heartbeats), when its agent or SSH
 * connection ends, and a round fails when a worker exits with an error. Then, while
 * elastic.max_restarts allows, the surviving members stop their workers (SIGTERM, SIGKILL
 * after stop_grace) and a new round opens, in which lost and spare nodes may join again;
 * otherwise the job stops with status 1 and a summary of what was lost, when and why. Every
 * transition is said to the views and written to events.jsonl.
 *
 * Stopping is bounded: members get stop_grace, their agents a few seconds more, then the
 * agents are ended through their provisioners (cli/supervisor/stop.c); an agent that never
 * answered (hung on start) has no workers and is ended at once.
 *
 * It is over 800 lines as one state machine: every transition of a node or a round, and the
 * rules between them, are read together here.
 */
#include "cli/spec/pipe_layout.h"
#include "cli/supervisor/recovery.h"
#include "cli/supervisor/ckpt.h"
#include "cli/supervisor/supervisor.h"
#include "cli/proto/agent_proto.h"
#include "cli/provision/slurm.h"
#include "cli/sys/sys.h"
#include "cli/supervisor/watchdog.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

static void rdzv_check(void);
static void rdzv_open(void);
static void maybe_restart(void);
static bool can_rejoin(int i);

static const char *host_of(int node)
{
    return ddp__supervisor.job->nodes[node].host;
}

/*
 * Under srun a failure may be the allocation ending (scancel, its time limit), which salloc
 * does not tell the command it runs: then the job ends too (status 130 when it was cancelled,
 * as on SIGTERM, else 1), rather than restarting into steps that Slurm refuses.
 */
static bool allocation_ended(void)
{
    char state[64], why[160];
    if (!ddp__supervisor.job->srun || ddp__slurm_alloc_state(state, sizeof(state)) != 0)
        return false;
    /* Under sbatch Slurm also sends ddprun SIGTERM, which may come after the steps' end: then
     * the stop is the signal's (status 130), handled once the loop reads it. */
    sigset_t pend;
    if (sigpending(&pend) == 0 && (sigismember(&pend, SIGTERM) || sigismember(&pend, SIGINT)))
        return true;
    snprintf(why, sizeof(why), "the Slurm allocation %s ended (%s)", getenv("SLURM_JOB_ID"), state);
    ddp__sup_say("ddprun: %s; stopping the job", why);
    /* a node's failure ended it: worth requeueing, as a fall below min_nodes is */
    ddp__sup_finish(why, !strcmp(state, "CANCELLED")   ? DDP_EXIT_INTERRUPTED
                         : !strcmp(state, "NODE_FAIL") ? DDP_EXIT_REQUEUE
                                                       : DDP_EXIT_JOB_FAILED);
    return true;
}

/* A round failed (a worker failed, or a member node was lost: lost): restart or stop. */
static void round_failed(const char *what, bool lost)
{
    if (ddp__supervisor.ph != DDP__PH_RUNNING || allocation_ended())
        return;
    const struct ddp_job *j = ddp__supervisor.job;
    if (lost && ddp__supervisor.round > 0 && ddp__supervisor.ranks_up < ddp__supervisor.world) {
        /* The round began after another loss and never got going: its restart is that loss's,
         * done again without this node. */
        ddp__supervisor.free_rounds++;
        ddp__sup_say("ddprun: round %d lost a node before all its ranks had started: its restart "
                     "is not counted against elastic.max_restarts",
                     ddp__supervisor.round);
    }
    int used = ddp__supervisor.round - ddp__supervisor.free_rounds;
    if (used >= j->max_restarts) {
        char why[600];
        if (j->max_restarts == 0) {
            ddp__sup_say("ddprun: %s; stopping the job", what);
            snprintf(why, sizeof(why), "%s", what);
        } else {
            ddp__sup_say(
                "ddprun: %s; no restarts left (elastic.max_restarts is %d); stopping the job", what,
                j->max_restarts);
            snprintf(why, sizeof(why), "%s, and the %d restarts of elastic.max_restarts were used",
                     what, j->max_restarts);
        }
        ddp__sup_finish(why, DDP_EXIT_JOB_FAILED);
        return;
    }
    ddp__sup_say("ddprun: %s; stopping the other workers for restart %d of %d", what, used + 1,
                 j->max_restarts);
    ddp__rcv_begin(what);
    ddp__wd_round_end();
    ddp__supervisor.ph = DDP__PH_RESTARTING;
    ddp__sup_set_phase("restarting");
    for (size_t i = 0; i < j->nnodes; i++) {
        struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        if (a->state == DDP__NS_RUNNING) {
            ddp__nodes_stop(&ddp__supervisor.nodes, (int)i, (uint64_t)j->stop_grace_ms, SIGTERM);
            a->state = DDP__NS_STOPPING;
        }
    }
    maybe_restart();
}

void ddp__sup_hang_failed(const char *why)
{
    ddp__sup_event("hang_failed", "reason", why, NULL);
    round_failed(why, false);
}

/*
 * Whether this launcher did not run (its loop did not tick) for longer than the heartbeat
 * timeout, now or lately: stopped (SIGSTOP, a Ctrl-Z), starved of CPU, or its machine
 * suspended. Its store did not answer meanwhile, so the agents stopped their ranks: the
 * failures that follow are its own. The first callbacks after a stall are those failures, so
 * they check it rather than wait for the tick.
 */
static bool launcher_stalled(void)
{
    int64_t now = ddp_now_ms(), gap = now - ddp__supervisor.last_tick_ms;
    if (ddp__supervisor.last_tick_ms && gap > ddp__supervisor.job->heartbeat_timeout_ms) {
        ddp__supervisor.stall_ms = gap;
        ddp__supervisor.stall_end_ms = now;
        ddp__sup_say("ddprun: this launcher did not run for %.1f s (it was stopped, or starved of "
                     "CPU), longer than elastic.heartbeat_timeout (%.1f s): the nodes' agents "
                     "could not reach its store, and stop their ranks",
                     (double)gap / 1000, (double)ddp__supervisor.job->heartbeat_timeout_ms / 1000);
        ddp__sup_event("launcher_stalled", "#ms", (long long)gap, NULL);
    }
    ddp__supervisor.last_tick_ms = now;
    return ddp__supervisor.stall_end_ms &&
           now - ddp__supervisor.stall_end_ms <= ddp__supervisor.job->heartbeat_timeout_ms +
                                                     ddp__supervisor.job->stop_grace_ms +
                                                     DDP__SUP_STOP_SLACK_MS;
}

/* A failure (what) in the wake of the launcher's stall is the stall's: says so first. */
static void blame_stall(char *what, size_t n)
{
    if (!launcher_stalled())
        return;
    char was[1024];
    snprintf(was, sizeof(was), "%s", what);
    snprintf(what, n,
             "this launcher did not run for %.1f s (stopped or starved), so the nodes' agents "
             "lost contact with its store and stopped their ranks (%.700s)",
             (double)ddp__supervisor.stall_ms / 1000, was);
}

static void rank_exited(int rank, int code, int64_t runtime_ms, bool exec_failed)
{
    struct ddp__sup_rank *r = &ddp__supervisor.rk[rank];
    r->exited = true;
    r->stopped = ddp__supervisor.nd[r->node].state == DDP__NS_STOPPING;
    r->code = code;
    r->runtime_ms = runtime_ms;
    r->exec_failed = exec_failed;
    ddp__supervisor.ranks_done++;
    if (code != 0 && launcher_stalled())
        r->stopped = true; /* by its agent, for ddprun */
    if (code == 0 && ++ddp__supervisor.ranks_ok == ddp__supervisor.world &&
        ddp__supervisor.ph == DDP__PH_RUNNING) {
        ddp__sup_finish(NULL, DDP_EXIT_OK);
        return;
    }
    if (code == 0 || ddp__supervisor.ph != DDP__PH_RUNNING)
        return;
    if (ddp__supervisor.first_fail < 0)
        ddp__supervisor.first_fail = rank;
    char what[1024], how[160];
    ddp__sup_describe_exit(code, how, sizeof(how));
    if (exec_failed && r->ntail) /* the agent's note: cannot run 'x': why */
        snprintf(what, sizeof(what), "rank %d (%s) did not start: %s", rank, host_of(r->node),
                 r->tail[r->ntail - 1]);
    else
        snprintf(what, sizeof(what), "rank %d (%s) %s%s%.*s", rank, host_of(r->node), how,
                 r->error ? ": " : "", (int)(r->error ? ddp_utf8_prefix(r->error, 400) : 0),
                 r->error ? r->error : "");
    blame_stall(what, sizeof(what));
    struct ddp__outcome o = ddp__sup_outcome(rank);
    ddp__sup_event("worker_failed", "node", host_of(r->node), "#rank", (long long)rank, "@outcome",
                   &o, "reason", what, NULL);
    if (exec_failed) {
        /* The program cannot even start: another round would fail the same way. */
        ddp__sup_say("ddprun: %s; stopping the job", what);
        ddp__sup_finish(what, DDP_EXIT_LAUNCH);
        return;
    }
    round_failed(what, false);
}

/* Records that node i is out: the cooldown count and, when listed, the event log and the
 * summary. */
static void record_loss(int i, const char *why, bool listed)
{
    struct ddp__sup_node *a = &ddp__supervisor.nd[i];
    int64_t now = ddp_now_ms();
    a->was_lost = true;
    if (a->last_fail && now - a->last_fail <= ddp__supervisor.job->cooldown_ms &&
        ddp__supervisor.job->max_restarts > 0) {
        a->cool_until = now + ddp__supervisor.job->cooldown_ms;
        ddp__sup_say(
            "ddprun: node '%s' failed twice within %.0f s; leaving it out of rounds for %.0f s",
            host_of(i), (double)ddp__supervisor.job->cooldown_ms / 1000,
            (double)ddp__supervisor.job->cooldown_ms / 1000);
        ddp__sup_event("node_cooldown", "node", host_of(i), "#until_ms",
                       (long long)(a->cool_until - ddp__supervisor.t0), NULL);
    }
    a->last_fail = now;
    snprintf(a->why, sizeof(a->why), "%s", why);
    ddp__ck_lost(i); /* its checkpoint copies no longer count */
    if (!listed)
        return;
    ddp__supervisor.losses = realloc(ddp__supervisor.losses, (size_t)(ddp__supervisor.nlosses + 1) *
                                                                 sizeof(*ddp__supervisor.losses));
    struct ddp__sup_loss *l = &ddp__supervisor.losses[ddp__supervisor.nlosses++];
    l->node = i;
    l->round = ddp__supervisor.round;
    l->t_ms = now - ddp__supervisor.t0;
    ddp__rec_wall_clock(l->when, sizeof(l->when));
    snprintf(l->why, sizeof(l->why), "%s", why);
    ddp__sup_event("node_lost", "node", host_of(i), "reason", why, NULL);
}

/*
 * Node i is out (its agent exited, or its lease expired). prev is the state it was in.
 * Members end the round; a node that was joining or waiting may leave a round short.
 */
static void node_out(int i, enum ddp__node_state prev, const char *why)
{
    if (ddp__supervisor.ph == DDP__PH_FINISHING ||
        (ddp__supervisor.ph != DDP__PH_RUNNING && allocation_ended()))
        return;
    if (prev == DDP__NS_JOINING) {
        /* Joining a round (or the first one) failed; a lost node's retries while the job
         * runs fail quietly. */
        bool listed = ddp__supervisor.ph == DDP__PH_RDZV || !ddp__supervisor.nd[i].was_lost;
        if (listed)
            ddp__sup_say("ddprun: node '%s' %s", host_of(i), why);
        record_loss(i, why, listed);
        rdzv_check();
        return;
    }
    char what[1024];
    snprintf(what, sizeof(what), "node '%s' lost: %s", host_of(i), why);
    blame_stall(what, sizeof(what));
    record_loss(i, why, true);
    if (prev == DDP__NS_RUNNING || prev == DDP__NS_STOPPING) {
        int64_t now = ddp_now_ms();
        for (int r = 0; r < ddp__supervisor.world; r++)
            if (ddp__supervisor.rk[r].node == i && !ddp__supervisor.rk[r].exited) {
                ddp__supervisor.rk[r].lost = true;
                /* how long it ran, as far as ddprun saw: until its node was lost */
                if (ddp__supervisor.rk[r].started && ddp__supervisor.rk[r].t_started)
                    ddp__supervisor.rk[r].runtime_ms = now - ddp__supervisor.rk[r].t_started;
            }
        ddp__supervisor.t_lost = now;
    }
    if (prev == DDP__NS_RUNNING && ddp__supervisor.ph == DDP__PH_RUNNING) {
        round_failed(what, true);
    } else {
        ddp__sup_say("ddprun: %s", what);
        if (ddp__supervisor.ph == DDP__PH_RESTARTING)
            maybe_restart();
        else if (ddp__supervisor.ph == DDP__PH_RDZV)
            rdzv_check();
    }
}

/* A rank of the round started (its STARTED, or a rejoined agent's STATE). */
static void rank_started(int rank, bool warm)
{
    if (warm)
        ddp__rcv_warm();
    ddp__supervisor.rk[rank].started = true;
    ddp__supervisor.rk[rank].t_started = ddp_now_ms();
    if (++ddp__supervisor.ranks_up == ddp__supervisor.world &&
        ddp__supervisor.ph == DDP__PH_RUNNING) {
        ddp__sup_set_phase("running");
        ddp__sup_event("workers_running", "#world_size", (long long)ddp__supervisor.world, NULL);
        ddp__rcv_mark(DDP__RCV_STARTED);
    }
}

/* A rejoined agent's STATE (cli/supervisor/takeover.c): what the last launcher knew of its ranks,
 * after the output it may not have shown (held until now). */
static void agent_state(int i, const uint8_t *body, size_t len)
{
    struct ddp__sup_node *a = &ddp__supervisor.nd[i];
    struct ddp__agent_state s;
    if (ddp__agent_get_state(body, len, &s) < 0 || !ddp__sup_count_slots(i)) {
        ddp__nodes_flush_held(&ddp__supervisor.nodes, i, false);
        return;
    }
    a->incarnation = s.incarnation;
    if (a->state != DDP__NS_NONE)
        ddp__ck_joined(i); /* (its replication port again: CKPT_PORT) */
    if (s.dropped)
        ddp__sup_say("ddprun: node '%s': %llu lines of output were lost while the job had no "
                     "launcher",
                     host_of(i), (unsigned long long)s.dropped);
    bool same = s.have_start && s.round == (uint32_t)ddp__supervisor.round &&
                (int)s.rank_offset == a->rank_offset &&
                (int)s.nlocal == ddp__supervisor.job->nodes[i].slots;
    ddp__nodes_flush_held(&ddp__supervisor.nodes, i, a->state == DDP__NS_RUNNING && same);
    if (a->state == DDP__NS_RUNNING && same) {
        /* rank_exited is right in any phase: a failure among them fails the round, and the
         * exits after it are still recorded for the summary. */
        for (uint32_t k = 0; k < s.nlocal; k++) {
            if (s.ranks[k].pid)
                rank_started(a->rank_offset + (int)k, false);
            if (s.ranks[k].exited)
                rank_exited(a->rank_offset + (int)k, s.ranks[k].code,
                            (int64_t)s.ranks[k].runtime_ms, s.ranks[k].exec_failed);
        }
        if (s.done)
            a->state = DDP__NS_READY;
    } else if (a->state == DDP__NS_RUNNING) {
        round_failed("a node's agent was not in the round the records name", false);
    } else if (s.have_start && !s.done) {
        ddp__nodes_stop(&ddp__supervisor.nodes, i, (uint64_t)ddp__supervisor.job->stop_grace_ms,
                        SIGTERM); /* not a member: nothing of it may run */
    }
    free(s.ranks);
}

/* At the job's end, the nodes that are done are closed once the copies of the last checkpoint
 * files have ended (checkpoint.replicas: their agents serve and fetch them until then; the
 * stop's deadline bounds the wait). */
static void close_when_copied(void)
{
    if (ddp__ck_copying())
        return;
    for (size_t k = 0; k < ddp__supervisor.job->nnodes; k++)
        if (ddp__supervisor.nd[k].closing) {
            ddp__supervisor.nd[k].closing = false;
            ddp__ck_closed((int)k);
            ddp__nodes_close(&ddp__supervisor.nodes, (int)k);
        }
}

static void agent_frame(void *arg, int i, uint8_t type, const uint8_t *body, size_t len)
{
    (void)arg;
    struct ddp__sup_node *a = &ddp__supervisor.nd[i];
    struct ddp_rd rd;
    uint32_t lr, v32;
    uint64_t v64;
    uint8_t u8;
    ddp_rd_init(&rd, body, len);
    if (type == DDP__AG_JOINED) {
        if (a->state != DDP__NS_JOINING || !ddp__sup_count_slots(i))
            return;
        a->lease = ddp_rd_u64(&rd, &v64) == 0 ? v64 : 0;
        a->orphaned_ms = 0;
        a->state = DDP__NS_READY;
        ddp__sup_event("node_joined", "node", host_of(i), "#incarnation", (long long)a->incarnation,
                       NULL);
        ddp__ck_joined(i); /* (before any START: its folder is watched before ranks write) */
        if (ddp__supervisor.ph == DDP__PH_FINISHING)
            ddp__nodes_close(&ddp__supervisor.nodes, i);
        else
            rdzv_check();
        ddp__sup_prepare_spare(i); /* joined while a round runs: a spare until the next */
        return;
    }
    if (type == DDP__AG_DONE) {
        if (a->state != DDP__NS_RUNNING && a->state != DDP__NS_STOPPING)
            return;
        a->state = DDP__NS_READY;
        if (ddp__supervisor.ph == DDP__PH_FINISHING) {
            a->closing = true;
            close_when_copied();
        } else if (ddp__supervisor.ph == DDP__PH_RESTARTING)
            maybe_restart();
        return;
    }
    if (type == DDP__AG_STACKS_REPLY) {
        ddp__wd_stacks_reply(i, body, len);
        return;
    }
    if (type == DDP__AG_STATE) {
        agent_state(i, body, len);
        return;
    }
    enum ddp__ck_action act;
    char why[1400];
    if (ddp__ck_frame(i, type, body, len, &act, why, sizeof(why))) {
        if (ddp__supervisor.ph == DDP__PH_FINISHING)
            close_when_copied();
        if (act == DDP__CK_FAIL_JOB) {
            ddp__sup_say("ddprun: %s; stopping the job", why);
            ddp__sup_finish(why, DDP_EXIT_JOB_FAILED);
        } else if (act == DDP__CK_FAIL_ROUND) {
            round_failed(why, false);
        }
        return;
    }
    /* Rank frames count only from the current round's members. */
    if ((a->state != DDP__NS_RUNNING && a->state != DDP__NS_STOPPING) || ddp_rd_u32(&rd, &lr) < 0 ||
        lr >= (uint32_t)ddp__supervisor.job->nodes[i].slots)
        return;
    int rank = a->rank_offset + (int)lr;
    switch (type) {
    case DDP__AG_STARTED: {
        uint32_t pid;
        uint8_t warm = 0;
        if (ddp_rd_u32(&rd, &pid) == 0 && ddp_rd_u8(&rd, &warm) < 0)
            warm = 0;
        rank_started(rank, warm == 1);
        break;
    }
    case DDP__AG_OUTPUT: {
        const uint8_t *p;
        uint32_t n;
        if (ddp_rd_u8(&rd, &u8) == 0 && ddp_rd_str(&rd, DDP__AGENT_MAX_FRAME, &p, &n) == 0)
            ddp__sup_rank_output(rank, u8 & 0x0f, p, n,
                                 ((u8 & DDP__AG_OUT_PROGRESS) ? DDP__LINE_PROGRESS : 0) |
                                     ((u8 & DDP__AG_OUT_CUT) ? DDP__LINE_CUT : 0));
        break;
    }
    case DDP__AG_ERROR:
        ddp__sup_rank_error(rank, body + 4, len - 4);
        break;
    case DDP__AG_EXITED:
        if (ddp_rd_u32(&rd, &v32) == 0 && ddp_rd_u64(&rd, &v64) == 0 && ddp_rd_u8(&rd, &u8) == 0)
            rank_exited(rank, (int32_t)v32, (int64_t)v64, u8 != 0);
        break;
    default:
        break;
    }
}

/* Agent i's process ended with wait status st (its last frames were handled first). */
static void agent_ended(void *arg, int i, int st)
{
    (void)arg;
    struct ddp__sup_node *a = &ddp__supervisor.nd[i];
    enum ddp__node_state prev = a->state;
    a->state = DDP__NS_NONE;
    bool revoked = a->left_ms != 0; /* its agent revoked its lease: its ranks had ended */
    a->left_ms = 0;
    a->ending_ms = 0;
    /* an agent known to be killed itself took its ranks with it: nothing to drain */
    bool killed = ddp__nodes_agent_signal(&ddp__supervisor.nodes, i, st) != 0 ||
                  (a->orphaned_ms && ddp_now_ms() - a->orphaned_ms <= DDP__SUP_DRAIN_MS);
    if ((prev == DDP__NS_RUNNING || prev == DDP__NS_STOPPING) && !revoked && !killed &&
        ddp__supervisor.ph != DDP__PH_FINISHING) {
        a->draining_ms = ddp_now_ms();
        a->draining_inc = a->incarnation;
        if (!ddp_timer_armed(&ddp__supervisor.end_check))
            ddp_timer_start(ddp__supervisor.loop, &ddp__supervisor.end_check, DDP__SUP_DRAIN_MS);
    }
    if (prev == DDP__NS_GONE && ddp__supervisor.ph == DDP__PH_RESTARTING)
        maybe_restart();
    /* (an agent's process is reaped on a signal, which checks this too; an external slot's end
     * comes from the loop) */
    if (ddp__supervisor.ph == DDP__PH_FINISHING && ddp__nodes_all_gone(&ddp__supervisor.nodes))
        ddp_loop_stop(ddp__supervisor.loop);
    if (prev == DDP__NS_GONE || ddp__supervisor.ph == DDP__PH_FINISHING)
        return;
    char why[300];
    ddp__nodes_describe(&ddp__supervisor.nodes, i, st, prev == DDP__NS_JOINING, why, sizeof(why));
    node_out(i, prev, why);
}

/* A line an agent (or its SSH bridge) wrote on stderr: one of ddprun's messages. */
static void agent_message(void *arg, int i, const char *line, size_t n)
{
    (void)arg;
    (void)i;
    ddp__sup_say("%.*s", (int)n, line);
}

static void agent_dial_addrs(void *arg, int i, char *out, size_t n)
{
    (void)arg;
    ddp__sup_node_agent_addr(i, out, n);
}

static void agent_taken(void *arg, int i, const char *peer_ip)
{
    (void)arg;
    ddp__sup_slot_taken(i, peer_ip);
}

const struct ddp__nodes_cb ddp__sup_nodes_cb = {.frame = agent_frame,
                                                .taken = agent_taken,
                                                .message = agent_message,
                                                .ended = agent_ended,
                                                .dial_addrs = agent_dial_addrs,
                                                .token = ddp__supervisor.token};

/* Whether a lease event of agent incarnation inc of node i still matters: that agent's process
 * runs, the node is neither out nor being ended, and the job is not finishing. */
static bool lease_current(int i, unsigned inc)
{
    const struct ddp__sup_node *a = &ddp__supervisor.nd[i];
    return a->incarnation == inc && ddp__nodes_running(&ddp__supervisor.nodes, i) &&
           a->state != DDP__NS_GONE && a->state != DDP__NS_NONE &&
           ddp__supervisor.ph != DDP__PH_FINISHING;
}

/* The lease of agent incarnation inc of node i ended (why): the node is lost. */
static void lease_lost(int i, unsigned inc, const char *why)
{
    struct ddp__sup_node *a = &ddp__supervisor.nd[i];
    if (!lease_current(i, inc))
        return;
    enum ddp__node_state prev = a->state;
    a->state = DDP__NS_GONE;
    a->left_ms = 0;
    /* Its provisioner ends what runs there: a local agent with its workers (one process
     * group), an SSH bridge by killing the remote session's process group, srun by cancelling
     * the step. A stopped or hung agent cannot do it itself. Should that not end within
     * DDP__SUP_END_WAIT_MS (a cut link), the provisioner's process is killed here, and the
     * node's own guard has ended the rest by then. The next round waits for either
     * (maybe_restart), so old and new ranks never run at once. */
    ddp__nodes_end(&ddp__supervisor.nodes, i, 1);
    a->ending_ms = ddp_now_ms();
    if (!ddp_timer_armed(&ddp__supervisor.end_check))
        ddp_timer_start(ddp__supervisor.loop, &ddp__supervisor.end_check, DDP__SUP_END_WAIT_MS);
    node_out(i, prev, why);
}

/* Nodes lost by their lease whose provisioner has not ended them yet: SIGKILLed; nodes lost by
 * their connection whose drain time is up: the round may open. */
static void on_end_check(struct ddp_loop *loop, struct ddp_timer *t)
{
    int64_t now = ddp_now_ms(), next = 0;
    bool drained = false;
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++) {
        struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        if (a->draining_ms && now - a->draining_ms >= DDP__SUP_DRAIN_MS) {
            a->draining_ms = 0; /* its agent died with it, or cannot say: its time is up */
            drained = true;
        } else if (a->draining_ms) {
            int64_t due = a->draining_ms + DDP__SUP_DRAIN_MS - now;
            next = next && next < due ? next : due;
        }
        if (!a->ending_ms)
            continue;
        if (!ddp__nodes_running(&ddp__supervisor.nodes, (int)i)) {
            a->ending_ms = 0;
        } else if (now - a->ending_ms >= DDP__SUP_END_WAIT_MS) {
            ddp__nodes_end(&ddp__supervisor.nodes, (int)i, 2);
            a->ending_ms = 0;
        } else {
            int64_t due = a->ending_ms + DDP__SUP_END_WAIT_MS - now;
            next = next && next < due ? next : due;
        }
    }
    if (next)
        ddp_timer_start(loop, t, next);
    if (drained)
        maybe_restart();
}

void ddp__sup_lease_orphaned(uint64_t lease)
{
    for (size_t i = 0; lease && i < ddp__supervisor.job->nnodes; i++) {
        struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        if (a->lease != lease)
            continue;
        /* its agent's process is gone (or cut off from the store, which its guard fences):
         * a node lost by its connection need not drain longer */
        a->orphaned_ms = ddp_now_ms();
        if (a->draining_ms) {
            a->draining_ms = 0;
            maybe_restart();
        }
    }
}

static void lease_expired(int i, unsigned inc)
{
    char why[200];
    snprintf(why, sizeof(why), "no heartbeat for %.1f s (elastic.heartbeat_timeout)",
             (double)ddp__supervisor.job->heartbeat_timeout_ms / 1000);
    lease_lost(i, inc, why);
}

/* Nodes whose agent revoked its lease heartbeat_timeout ago and whose process still runs. */
static void on_left_check(struct ddp_loop *loop, struct ddp_timer *t)
{
    int64_t now = ddp_now_ms(), next = 0,
            limit = (int64_t)ddp__supervisor.job->heartbeat_timeout_ms;
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++) {
        struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        if (!a->left_ms)
            continue;
        if (now - a->left_ms < limit) {
            int64_t due = a->left_ms + limit - now;
            next = next && next < due ? next : due;
            continue;
        }
        char why[200];
        snprintf(why, sizeof(why),
                 "its agent left the job (it revoked its lease) but its process did not end "
                 "within %.1f s (elastic.heartbeat_timeout)",
                 (double)ddp__supervisor.job->heartbeat_timeout_ms / 1000);
        lease_lost((int)i, a->incarnation, why);
    }
    if (next)
        ddp_timer_start(loop, t, next);
}

/*
 * Agent incarnation inc of node i revoked its lease: it leaves cleanly (its stdin ended, as
 * when its SSH connection did, or it was told to), and its process ends next: that end, not
 * the lease, says why the node is out (agent_ended). Only a process that outlives the lease's
 * timeout is lost by it. (Through etcd a revoke reads as an expiry: lease_expired.)
 */
static void lease_left(int i, unsigned inc)
{
    struct ddp__sup_node *a = &ddp__supervisor.nd[i];
    if (!lease_current(i, inc) || a->left_ms)
        return;
    a->left_ms = ddp_now_ms();
    if (!ddp_timer_armed(&ddp__supervisor.left_check))
        ddp_timer_start(ddp__supervisor.loop, &ddp__supervisor.left_check,
                        (int64_t)ddp__supervisor.job->heartbeat_timeout_ms);
}

void ddp__sup_join_where(struct ddp__agent_join *jf)
{
    const struct ddp_job *j = ddp__supervisor.job;
    *jf = (struct ddp__agent_join){.token = ddp__supervisor.token,
                                   .store_addr = ddp__supervisor.store_addr,
                                   .job_id = ddp__supervisor.job_id,
                                   .etcd_endpoints = ddp__supervisor.etcd_eps,
                                   .etcd_prefix = ddp__supervisor.etcd_prefix,
                                   .etcd_ca = j->etcd_ca,
                                   .etcd_cert = j->etcd_cert,
                                   .etcd_key = j->etcd_key};
}

/* Starts node i's agent through its provisioner and sends it JOIN. */
static int provision(int i)
{
    struct ddp__sup_node *a = &ddp__supervisor.nd[i];
    const struct ddp_job *j = ddp__supervisor.job;
    char node_store[1024];
    ddp__sup_node_store_addr(i, node_store, sizeof(node_store));
    struct ddp__agent_join jf;
    ddp__sup_join_where(&jf);
    jf.store_addr = node_store;
    jf.host_label = j->nodes[i].host;
    jf.node_index = (uint32_t)i;
    jf.incarnation = a->incarnation + 1;
    jf.heartbeat_interval_ms = (uint64_t)j->heartbeat_interval_ms;
    jf.heartbeat_timeout_ms = (uint64_t)j->heartbeat_timeout_ms;
    jf.grace_ms = (uint64_t)j->stop_grace_ms;
    jf.takeover_ms = ddp__supervisor.takeover_ms;
    if (ddp__nodes_start(&ddp__supervisor.nodes, i, &jf) < 0)
        return -1;
    a->state = DDP__NS_JOINING;
    a->incarnation++;
    return 0;
}

static bool can_rejoin(int i)
{
    return ddp__supervisor.nd[i].state == DDP__NS_NONE &&
           ddp_now_ms() >= ddp__supervisor.nd[i].cool_until;
}

/* Nodes ready for a round, nodes on their way, and of those the ones a round waits for
 * (not the ones lost before: they join when they can, and the next round takes them). */
static void count_nodes(int *ready, int *joining, int *awaited)
{
    *ready = *joining = *awaited = 0;
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++) {
        *ready += ddp__supervisor.nd[i].state == DDP__NS_READY;
        *joining += ddp__supervisor.nd[i].state == DDP__NS_JOINING;
        *awaited +=
            ddp__supervisor.nd[i].state == DDP__NS_JOINING && !ddp__supervisor.nd[i].was_lost;
    }
}

static void rdzv_fail(const char *why, bool below_min);

/* Closes the round with the nodes that joined: numbers the ranks and starts the workers. */
static void rdzv_close(void)
{
    ddp_timer_stop(ddp__supervisor.loop, &ddp__supervisor.rdzv_deadline);
    ddp_timer_stop(ddp__supervisor.loop, &ddp__supervisor.last_call);
    char why[1200];
    if (ddp__sup_start_round(why, sizeof(why)) < 0)
        rdzv_fail(why, false); /* the round's own start: its layout, its ranks */
}

/* Round 0 that cannot start is a launch error (status 3). A later one is the job's failure (1),
 * or with below_min, fewer than elastic.min_nodes left after nodes were lost, status 75, which a
 * scheduler may take as "requeue" (sysexits' EX_TEMPFAIL). */
static void rdzv_fail(const char *why, bool below_min)
{
    ddp__sup_say("ddprun: round %d cannot start: %s", ddp__supervisor.round, why);
    ddp__sup_finish(why, ddp__supervisor.round == 0             ? DDP_EXIT_LAUNCH
                         : below_min && ddp__supervisor.nlosses ? DDP_EXIT_REQUEUE
                                                                : DDP_EXIT_JOB_FAILED);
}

/* Decides whether the open round can close now, must fail, or waits. */
static void rdzv_check(void)
{
    if (ddp__supervisor.ph != DDP__PH_RDZV)
        return;
    const struct ddp_job *j = ddp__supervisor.job;
    int ready, joining, awaited;
    count_nodes(&ready, &joining, &awaited);
    if (ready >= j->max_nodes || (ready >= j->min_nodes && awaited == 0)) {
        rdzv_close();
    } else if (ready + joining < j->min_nodes) {
        char why[300];
        snprintf(why, sizeof(why), "only %d node%s can take part, and elastic.min_nodes is %d",
                 ready + joining, ready + joining == 1 ? "" : "s", j->min_nodes);
        rdzv_fail(why, true);
    } else if (ready >= j->min_nodes && !ddp_timer_armed(&ddp__supervisor.last_call)) {
        /* Enough to train: late nodes get a short last call. */
        ddp_timer_start(ddp__supervisor.loop, &ddp__supervisor.last_call, j->rdzv_last_call_ms);
    }
}

static void on_last_call(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    if (ddp__supervisor.ph == DDP__PH_RDZV)
        rdzv_close();
}

static void on_rdzv_deadline(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    if (ddp__supervisor.ph != DDP__PH_RDZV)
        return;
    int ready, joining, awaited;
    count_nodes(&ready, &joining, &awaited);
    if (ready >= ddp__supervisor.job->min_nodes) {
        rdzv_close();
        return;
    }
    /* Name the nodes that are not there, and what is known of each. */
    char why[1400], missing[1024] = "";
    size_t ml = 0;
    int nmissing = 0;
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++) {
        const struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        if (a->state == DDP__NS_READY)
            continue;
        nmissing++;
        const char *what = a->state == DDP__NS_JOINING ? "started, no answer"
                           : a->why[0]                 ? a->why
                                                       : "not started";
        int w = snprintf(missing + ml, sizeof(missing) - ml, "%s'%s' (%s)", ml ? ", " : "",
                         host_of((int)i), what);
        if (w > 0 && ml + (size_t)w < sizeof(missing))
            ml += (size_t)w;
    }
    snprintf(why, sizeof(why),
             "only %d of the %d nodes elastic.min_nodes needs joined within %.0f s "
             "(rendezvous.timeout); not joined: %s",
             ready, ddp__supervisor.job->min_nodes,
             (double)ddp__supervisor.job->rdzv_timeout_ms / 1000, nmissing ? missing : "none");
    rdzv_fail(why, true);
}

/* Opens the next round: survivors are waiting already; lost and spare nodes are started. */
static void rdzv_open(void)
{
    const struct ddp_job *j = ddp__supervisor.job;
    if (ddp__supervisor.opened) /* round 0 is the first */
        ddp__supervisor.round++;
    ddp__supervisor.opened = true;
    ddp__supervisor.ph = DDP__PH_RDZV;
    int64_t soonest = 0;
    for (size_t i = 0; i < j->nnodes; i++) {
        if (can_rejoin((int)i)) {
            if (provision((int)i) < 0)
                ddp__sup_say("ddprun: cannot start the node agent for '%s': %s", host_of((int)i),
                             strerror(errno));
        } else if (ddp__supervisor.nd[i].state == DDP__NS_NONE) {
            soonest = !soonest || ddp__supervisor.nd[i].cool_until < soonest
                          ? ddp__supervisor.nd[i].cool_until
                          : soonest;
        }
    }
    if (ddp__nodes_flush(&ddp__supervisor.nodes) < 0) /* srun: one step for them all */
        ddp__sup_say("ddprun: cannot start the node agents' srun step: %s", strerror(errno));
    int ready, joining, awaited;
    count_nodes(&ready, &joining, &awaited);
    ddp__sup_say("ddprun: round %d: rendezvous of %d..%d nodes (%d ready, %d joining)",
                 ddp__supervisor.round, j->min_nodes, j->max_nodes, ready, joining);
    ddp__sup_event("round_open", "#ready", (long long)ready, "#joining", (long long)joining, NULL);
    ddp__sup_set_phase("rendezvous");
    ddp_timer_start(ddp__supervisor.loop, &ddp__supervisor.rdzv_deadline, j->rdzv_timeout_ms);
    rdzv_check();
}

/* While the job runs, lost nodes are tried again now and then: one that is back joins
 * and waits, as a spare, for the next round. */
static void on_retry(struct ddp_loop *loop, struct ddp_timer *t)
{
    if (ddp__supervisor.ph == DDP__PH_FINISHING)
        return;
    if (ddp__supervisor.ph == DDP__PH_RUNNING)
        for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++)
            if (ddp__supervisor.nd[i].was_lost && can_rejoin((int)i) && provision((int)i) < 0)
                DDP_DEBUG(SUP, "cannot start an agent for %s: %s", host_of((int)i),
                          strerror(errno));
    if (ddp__supervisor.ph == DDP__PH_RUNNING && ddp__nodes_flush(&ddp__supervisor.nodes) < 0)
        DDP_DEBUG(SUP, "cannot start an srun step for returning nodes: %s", strerror(errno));
    ddp_timer_start(loop, t,
                    ddp__supervisor.job->heartbeat_timeout_ms > 1000
                        ? ddp__supervisor.job->heartbeat_timeout_ms
                        : 1000);
}

/* After a failure: once no member still runs workers, the next round opens. */
static void maybe_restart(void)
{
    if (ddp__supervisor.ph != DDP__PH_RESTARTING)
        return;
    /* A node being ended (DDP__NS_GONE: SIGKILLed, its reaping a moment away) must be reaped
     * first, or the round would open without trying it again; one lost by its connection's end
     * while it had ranks drains first (DDP__SUP_DRAIN_MS), so that old and new ranks never run
     * at once. */
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++)
        if (ddp__supervisor.nd[i].state == DDP__NS_RUNNING ||
            ddp__supervisor.nd[i].state == DDP__NS_STOPPING ||
            ddp__supervisor.nd[i].state == DDP__NS_GONE || ddp__supervisor.nd[i].draining_ms)
            return;
    ddp__sup_event("workers_stopped", NULL);
    ddp__rcv_mark(DDP__RCV_STOPPED);
    rdzv_open();
}

/* The job ends: why is NULL on success. Members stop their workers; agents then exit. */
void ddp__sup_finish(const char *why, int rc)
{
    if (ddp__supervisor.ph == DDP__PH_FINISHING)
        return;
    ddp__supervisor.ph = DDP__PH_FINISHING;
    ddp__wd_round_end();
    if (why && !ddp__supervisor.fatal) {
        ddp__supervisor.fatal = strdup(why);
        ddp__supervisor.fatal_rc = rc;
    }
    ddp_timer_stop(ddp__supervisor.loop, &ddp__supervisor.rdzv_deadline);
    ddp_timer_stop(ddp__supervisor.loop, &ddp__supervisor.last_call);
    if (why)
        ddp__sup_set_phase("stopping");
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++) {
        struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        if (a->state == DDP__NS_RUNNING || a->state == DDP__NS_STOPPING) {
            ddp__nodes_stop(&ddp__supervisor.nodes, (int)i,
                            (uint64_t)ddp__supervisor.job->stop_grace_ms,
                            ddp__supervisor.stop_sig ? ddp__supervisor.stop_sig : SIGTERM);
            a->state = DDP__NS_STOPPING;
        } else {
            ddp__nodes_close(&ddp__supervisor.nodes, (int)i);
            if (a->state == DDP__NS_JOINING) /* never answered: no workers, maybe no agent */
                ddp__nodes_end(&ddp__supervisor.nodes, (int)i, 1);
        }
    }
    /* Whatever the nodes do (a hung node never answers), the stop ends: the workers have
     * stop_grace, their agents a few seconds more to report; then the agents are ended. */
    ddp_timer_start(ddp__supervisor.loop, &ddp__supervisor.stop_deadline,
                    ddp__supervisor.job->stop_grace_ms + DDP__SUP_STOP_SLACK_MS);
    if (ddp__nodes_all_gone(&ddp__supervisor.nodes))
        ddp_loop_stop(ddp__supervisor.loop);
}

static void on_tick(struct ddp_loop *loop, struct ddp_timer *t)
{
    launcher_stalled();
    if (ddp__supervisor.tty)
        ddp__sup_draw_status();
    ddp_timer_start(loop, t, 250);
}

void ddp__sup_on_member(void *arg, const struct ddp__member_ev *ev)
{
    (void)arg;
    if (ev->kind == DDP__MEV_PROGRESS) {
        if (ev->node < ddp__supervisor.job->nnodes &&
            ev->incarnation == ddp__supervisor.nd[ev->node].incarnation) {
            /* (the heartbeat that carried it: its first line says how long it waited) */
            long long age = strncmp(ev->report, "age ", 4) == 0 ? atoll(ev->report + 4) : 0;
            ddp__supervisor.nd[ev->node].heard_ms =
                ddp_now_ms() - (age > 0 && age < 3600000 ? age : 0);
        }
        if (ev->node < ddp__supervisor.job->nnodes &&
            ev->incarnation == ddp__supervisor.nd[ev->node].incarnation &&
            ddp__supervisor.nd[ev->node].state == DDP__NS_RUNNING)
            ddp__wd_progress((int)ev->node, ev->report);
        else
            free(ev->report);
    } else if ((ev->kind == DDP__MEV_LEASE_ENDED || ev->kind == DDP__MEV_LEASE_LEFT) &&
               ev->node < ddp__supervisor.job->nnodes && ddp__supervisor.nd[ev->node].draining_ms &&
               ddp__supervisor.nd[ev->node].draining_inc == ev->incarnation) {
        ddp__supervisor.nd[ev->node].draining_ms = 0; /* that agent is gone: so are its ranks */
        maybe_restart();
    } else if (ev->kind == DDP__MEV_LEASE_ENDED && ev->node < ddp__supervisor.job->nnodes) {
        lease_expired((int)ev->node, ev->incarnation);
    } else if (ev->kind == DDP__MEV_LEASE_LEFT && ev->node < ddp__supervisor.job->nnodes) {
        lease_left((int)ev->node, ev->incarnation);
    } else if (ev->kind == DDP__MEV_RESUMED && ev->round == ddp__supervisor.round) {
        char extra[96] = "";
        if (ddp__supervisor.t_lost && ev->round > 0)
            snprintf(extra, sizeof(extra), " (%.1f s after the node was lost)",
                     (double)(ddp_now_ms() - ddp__supervisor.t_lost) / 1000);
        ddp__sup_say("ddprun: round %d: training resumed at step %lld%s", ev->round, ev->step,
                     extra);
        ddp__sup_event(
            "resumed", "#step", ev->step, "#since_loss_ms",
            (long long)(ddp__supervisor.t_lost ? ddp_now_ms() - ddp__supervisor.t_lost : -1), NULL);
    }
}

void ddp__sup_open(void)
{
    rdzv_open();
}

void ddp__sup_timers_init(void)
{
    ddp_timer_init(&ddp__supervisor.tick, on_tick);
    ddp__sup_stop_timers_init();
    ddp_timer_init(&ddp__supervisor.rdzv_deadline, on_rdzv_deadline);
    ddp_timer_init(&ddp__supervisor.last_call, on_last_call);
    ddp_timer_init(&ddp__supervisor.retry, on_retry);
    ddp_timer_init(&ddp__supervisor.left_check, on_left_check);
    ddp_timer_init(&ddp__supervisor.end_check, on_end_check);
    /* The tick redraws the status line on a terminal, and tells a stall of the launcher */
    ddp__supervisor.last_tick_ms = ddp_now_ms();
    ddp_timer_start(ddp__supervisor.loop, &ddp__supervisor.tick, 250);
    if (ddp__supervisor.job->max_restarts > 0)
        ddp_timer_start(ddp__supervisor.loop, &ddp__supervisor.retry, 1000);
}
