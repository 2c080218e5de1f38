/*
 * The Slurm provisioner (cli/provision.h): inside an allocation, node i's agent is a job step of
 * its own, `srun --nodes=1 --ntasks=1 --nodelist=HOST ... ddprun agent`, so that Slurm accounts
 * for it, signals it and cleans up after it. The step's stdin and stdout carry the agent frames:
 * --unbuffered, as slurmstepd holds a task's output back until a newline otherwise (the agent
 * makes the pseudo-terminal that then carries its stdout raw). --overlap lets the steps share
 * the allocation's CPUs with the batch step that runs ddprun; --kill-on-bad-exit=0 and
 * --no-kill keep the job and its other steps alive when one node is lost (an elastic job goes
 * on without it); --cpu-bind=none and --cpus-per-task (the CPUs the job has there) leave the
 * ranks the node's whole share.
 */
#include "cli/provision.h"
#include "cli/job.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

#include "common/banned.h"

static int start(const struct ddp_job *j, size_t i, const struct ddp__prov_ctx *ctx,
                 struct ddp__child *out)
{
    char nodelist[300], cpus[40];
    snprintf(nodelist, sizeof(nodelist), "--nodelist=%s", j->nodes[i].host);
    snprintf(cpus, sizeof(cpus), "--cpus-per-task=%d", j->nodes[i].cpus);
    char *argv[20];
    int k = 0;
    static char *const fixed[] = {"srun",
                                  "--nodes=1",
                                  "--ntasks=1",
                                  "--overlap",
                                  "--kill-on-bad-exit=0",
                                  "--no-kill",
                                  "--unbuffered",
                                  "--quiet",
                                  "--mem=0",
                                  "--job-name=ddprun-agent"};
    for (size_t f = 0; f < sizeof(fixed) / sizeof(fixed[0]); f++)
        argv[k++] = fixed[f];
    argv[k++] = nodelist;
    if (j->nodes[i].cpus > 0)
        argv[k++] = cpus;
    argv[k++] = (char *)ctx->self;
    argv[k++] = "agent";
    argv[k] = NULL;
    /*
     * No parent-death signal: srun cancels the step at once on SIGTERM or SIGHUP; should
     * ddprun die, the EOF on the step's stdin that follows stops the node gracefully.
     */
    return ddp__spawn_piped("srun", argv, 0, ctx->mask, out);
}

/* Level 1: SIGTERM, on which srun has Slurm cancel the step (every process of it, SIGKILL
 * after the cluster's KillWait) and leaves; level 2: SIGKILL to srun. */
static void end(pid_t pid, int level)
{
    if (level <= 1)
        kill(pid, SIGTERM);
    else
        kill(-pid, SIGKILL);
}

static void describe(int st, bool joining, char *buf, size_t n)
{
    if (joining && WIFEXITED(st) && WEXITSTATUS(st) != 0)
        snprintf(buf, n, "could not be provisioned (srun exited with status %d)", WEXITSTATUS(st));
    else if (joining)
        snprintf(buf, n, "could not join the store (its srun %s %d)",
                 WIFSIGNALED(st) ? "died of signal" : "exited with status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    else
        snprintf(buf, n, "its srun step ended (%s %d)", WIFSIGNALED(st) ? "signal" : "status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

const struct ddp__prov_ops ddp__prov_srun = {
    .name = "srun", .start = start, .end = end, .describe = describe};
