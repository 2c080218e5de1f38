/*
 * The SSH provisioner (cli/provision/provision.h): `ddprun __ssh-bridge` as a child of the
 * launcher, which runs the agent on the node over libssh and relays its frames
 * (cli/provision/ssh_bridge.c).
 */
#include "cli/provision/provision.h"
#include "cli/provision/ssh_session.h"
#include "cli/spec/job.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

#include "common/banned.h"

static int start(const struct ddp_job *j, size_t i, const struct ddp__prov_ctx *ctx,
                 struct ddp__child *out)
{
    char port[16], grace[24], agent[200];
    snprintf(port, sizeof(port), "%d", j->ssh_port);
    /* The job id is [A-Za-z0-9_-] (cli/supervisor/supervise.c): safe in the remote command line. */
    if (ctx->rejoin)
        snprintf(agent, sizeof(agent), "agent --rejoin %s %zu", ctx->rejoin, i);
    else
        snprintf(agent, sizeof(agent), "agent");
    snprintf(grace, sizeof(grace), "%lld", (long long)j->stop_grace_ms);
    char mode[32]; /* the bridge's (cli/provision/ssh_session.h) */
    snprintf(mode, sizeof(mode), "%s%s%s", ctx->detach ? "detach" : "",
             ctx->detach && j->ssh_forward_agent ? "+" : "", j->ssh_forward_agent ? "agent" : "");
    char *argv[] = {"ddprun",
                    "__ssh-bridge",
                    j->nodes[i].host,
                    port,
                    j->ssh_user ? j->ssh_user : "",
                    j->ssh_identity ? j->ssh_identity : "",
                    j->ssh_known_hosts ? j->ssh_known_hosts : "",
                    j->ssh_strict,
                    j->ssh_remote_ddprun ? j->ssh_remote_ddprun : (char *)ctx->self,
                    grace,
                    agent,
                    mode,
                    NULL};
    /* The bridge ignores SIGHUP: should ddprun die, the EOF on its stdin that follows stops
     * the remote node gracefully (see cli/provision/ssh_bridge.c). */
    return ddp__spawn_piped(NULL, argv, SIGHUP, ctx->mask, out);
}

static void describe(int st, bool joining, char *buf, size_t n)
{
    if (joining && WIFEXITED(st) && WEXITSTATUS(st) == DDP_EXIT_LAUNCH)
        snprintf(buf, n, "could not be provisioned");
    else if (joining)
        snprintf(buf, n, "could not join the store (its agent %s %d)",
                 WIFSIGNALED(st) ? "died of signal" : "exited with status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    else if (WIFEXITED(st) && WEXITSTATUS(st) > DDP__SSH_EXIT_SIGNAL)
        snprintf(buf, n, "the SSH connection to it ended (its agent was killed by signal %d)",
                 WEXITSTATUS(st) - DDP__SSH_EXIT_SIGNAL);
    else
        snprintf(buf, n, "the SSH connection to it ended (%s %d)",
                 WIFSIGNALED(st) ? "signal" : "status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* The bridge exits with DDP__SSH_EXIT_SIGNAL + the signal sshd said ended the agent. */
static int agent_signal(int st)
{
    return WIFEXITED(st) && WEXITSTATUS(st) > DDP__SSH_EXIT_SIGNAL
               ? WEXITSTATUS(st) - DDP__SSH_EXIT_SIGNAL
               : 0;
}

/* end: ddp__end_child (cli/sys/sys.c): SIGTERM has the bridge kill the remote session and leave. */
const struct ddp__prov_ops ddp__prov_ssh = {.name = "ssh",
                                            .start = start,
                                            .end = ddp__end_child,
                                            .describe = describe,
                                            .agent_signal = agent_signal};
