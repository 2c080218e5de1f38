/*
 * The node guard: a process of the node agent's own, in a process group of its own, that ends
 * the agent and everything it started once the node's lease has not been renewed for
 * heartbeat_timeout + 1 s. By then the launcher has counted the node lost (and an elastic job
 * may train without it), but an agent that is stopped (SIGSTOP), hung, or starved cannot stop
 * its ranks itself, and a stopped process cannot be told anything; a signal to the agent's
 * process group does not reach the guard, so it acts whatever happened to the agent. It also
 * ends what is left of the agent's process group should the agent die without ending it.
 *
 * The guard is `ddprun __guard`, exec'd by the agent once it joined, so that it shares no
 * state (locks, threads) with the agent but a page of shared memory: the time of the lease's
 * last renewal, written by the agent's heartbeat thread.
 */
#ifndef DDP_CLI_AGENT_GUARD_H
#define DDP_CLI_AGENT_GUARD_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

/* How long after the last renewal beyond the heartbeat timeout the guard acts. */
#define DDP__GUARD_SLACK_MS 1000

struct ddp__guard;

/* A guard not started yet: its page, whose renewal time the heartbeat can be given. 0 or a
 * DDP_E* code. */
int ddp__guard_new(struct ddp__guard **out);

/* Where the heartbeat writes each renewal's time (ddp_now_ms). */
_Atomic int64_t *ddp__guard_renewal(struct ddp__guard *g);

/*
 * Starts the guard process: it ends the agent's process group and every descendant of the
 * agent once the renewal time is older than timeout_ms + 1 s (it is set to now here). label
 * names the node in its message (on stderr). It runs with every signal unblocked and in a
 * process group of its own. 0, or a DDP_E* code (then the agent runs on without a guard).
 */
int ddp__guard_start(struct ddp__guard *g, int64_t timeout_ms, const char *label);

/* The guard's pid (spared when the agent sweeps its children), or 0 for NULL. */
pid_t ddp__guard_pid(const struct ddp__guard *g);

/* The guard process was reaped by the agent (it ended on its own): forget its pid. */
void ddp__guard_reaped(struct ddp__guard *g);

/* Ends the guard (SIGKILL, reaped) and frees g: the agent leaves cleanly. NULL is a no-op. */
void ddp__guard_free(struct ddp__guard *g);

/* The hidden `ddprun __guard AGENT_PID TIMEOUT_MS LABEL`, its page at fd 3. */
int ddp__cmd_guard(int argc, char **argv);

#endif
