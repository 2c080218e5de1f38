/*
 * Agents started by someone else (cli/provision/provision.h; launcher: external): a Kubernetes
 * JobSet, pdsh, a site's scripts run `ddprun agent --join HOST:PORT --token-file FILE` on each
 * node, and each takes a free slot of the job when it dials back (cli/supervisor/nodes.c). There
 * is nothing to start here and no process to reap: a slot's agent is gone when its link ends.
 */
#include "cli/provision/provision.h"

#include <stdio.h>

#include "common/banned.h"

static int start(const struct ddp_job *job, size_t i, const struct ddp__prov_ctx *ctx,
                 struct ddp__child *out)
{
    (void)job;
    (void)i;
    (void)ctx;
    *out = (struct ddp__child){.pid = 0, .in_fd = -1, .out_fd = -1, .err_fd = -1};
    return 0;
}

/* Ending it is closing its link (cli/supervisor/nodes.c): its agent then stops its ranks. */
static void end(pid_t pid, int level)
{
    (void)pid;
    (void)level;
}

static void describe(int st, bool joining, char *buf, size_t n)
{
    (void)st;
    snprintf(buf, n,
             joining ? "its agent went away before it joined"
                     : "its agent's connection to ddprun ended");
}

const struct ddp__prov_ops ddp__prov_external = {
    .name = "external", .start = start, .end = end, .describe = describe};
