/* The local provisioner (cli/provision/provision.h): `ddprun agent` as a child of the launcher. */
#include "cli/provision/provision.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

#include "common/banned.h"

static int start(const struct ddp_job *job, size_t i, const struct ddp__prov_ctx *ctx,
                 struct ddp__child *out)
{
    (void)job;
    char node[16];
    snprintf(node, sizeof(node), "%zu", i);
    char *argv[] = {"ddprun", "agent", ctx->rejoin ? "--rejoin" : NULL, (char *)ctx->rejoin,
                    node,     NULL};
    /* If ddprun is killed outright, its local agents stop their workers (SIGTERM) and exit;
     * unless they wait for a new launcher: then the EOF on their stdin tells them. */
    return ddp__spawn_piped(NULL, argv, ctx->detach ? 0 : SIGTERM, ctx->mask, out);
}

/* The agent leads its process group, with its workers and what they started. */
static void end(pid_t pid, int level)
{
    (void)level;
    kill(-pid, SIGKILL);
}

static void describe(int st, bool joining, char *buf, size_t n)
{
    if (joining)
        snprintf(buf, n, "could not join the store (its agent %s %d)",
                 WIFSIGNALED(st) ? "died of signal" : "exited with status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    else
        snprintf(buf, n, "its agent died (%s %d)", WIFSIGNALED(st) ? "signal" : "status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

static int agent_signal(int st)
{
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

const struct ddp__prov_ops ddp__prov_local = {.name = "local",
                                              .start = start,
                                              .end = end,
                                              .describe = describe,
                                              .agent_signal = agent_signal};
