/*
 * The Slurm provisioner (cli/provision/provision.h): inside an allocation, the agents of the
 * nodes a round starts are one job step, `srun --nodes=N --ntasks-per-node=1 --nodelist=H1,...
 * ddprun agent` (Slurm's own tree launch), so that Slurm accounts for them, signals them and
 * cleans up after them; --input=all gives every task the launcher's BOOT_GROUP. The step's stdin
 * carries BOOT, and the agent dials back (cli/proto/agent_wire.h); its stderr carries its messages,
 * --unbuffered, as slurmstepd holds a task's output back until a newline otherwise. --overlap lets
 * the steps share the allocation's CPUs with the batch step that runs ddprun; --kill-on-bad-exit=0
 * and
 * --no-kill keep the job and its other steps alive when one node is lost (an elastic job goes
 * on without it); --cpus-per-task (the CPUs the job has there), --mem=0 and Slurm's default
 * for steps (all the job's GPUs on the node) leave the ranks the node's whole share. srun reads
 * options from its environment too, and an sbatch or salloc option exports them
 * (--ntasks-per-node=8 sets SLURM_NTASKS_PER_NODE, --gpus-per-task=1 SLURM_GPUS_PER_TASK): those
 * that would shape the agent's step as one of the job's tasks are unset for it.
 */
#include "cli/provision/provision.h"
#include "cli/spec/job.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/banned.h"

/* One step for nodes[0..k) of the job, which have the same CPUs there (the step gives each
 * task as many). */
static int start_group(const struct ddp_job *j, const size_t *nodes, size_t k,
                       const struct ddp__prov_ctx *ctx, struct ddp__child *out)
{
    size_t len = 16;
    for (size_t m = 0; m < k; m++)
        len += strlen(j->nodes[nodes[m]].host) + 1;
    char *nodelist = malloc(len), count[3][48], cpus[40];
    if (!nodelist)
        return -1;
    size_t l = (size_t)snprintf(nodelist, len, "--nodelist=");
    for (size_t m = 0; m < k; m++)
        l += (size_t)snprintf(nodelist + l, len - l, "%s%s", m ? "," : "", j->nodes[nodes[m]].host);
    snprintf(count[0], sizeof(count[0]), "--nodes=%zu", k);
    snprintf(count[1], sizeof(count[1]), "--ntasks=%zu", k);
    snprintf(count[2], sizeof(count[2]), "--ntasks-per-node=1");
    snprintf(cpus, sizeof(cpus), "--cpus-per-task=%d", j->nodes[nodes[0]].cpus);
    static char *const shaping[] = {"SLURM_NTASKS",           "SLURM_NPROCS",
                                    "SLURM_NTASKS_PER_NODE",  "SLURM_NTASKS_PER_SOCKET",
                                    "SLURM_NTASKS_PER_CORE",  "SLURM_NTASKS_PER_GPU",
                                    "SLURM_CPUS_PER_TASK",    "SLURM_CPUS_PER_GPU",
                                    "SLURM_GPUS_PER_TASK",    "SLURM_GPUS_PER_SOCKET",
                                    "SLURM_TRES_PER_TASK",    "SLURM_MEM_PER_CPU",
                                    "SLURM_MEM_PER_GPU",      "SLURM_MEM_PER_NODE",
                                    "SLURM_DISTRIBUTION",     "SLURM_CPU_BIND",
                                    "SLURM_GPU_BIND",         "SLURM_HINT",
                                    "SLURM_THREADS_PER_CORE", "SLURM_EXCLUSIVE",
                                    "SLURM_STEP_GRES"};
    enum { NSHAPING = sizeof(shaping) / sizeof(shaping[0]) };
    char *argv[2 * NSHAPING + 24];
    int a = 0;
    argv[a++] = "env"; /* env -u VAR ... srun ... */
    for (int v = 0; v < NSHAPING; v++) {
        argv[a++] = "-u";
        argv[a++] = shaping[v];
    }
    static char *const fixed[] = {"srun",      "--overlap",    "--kill-on-bad-exit=0",
                                  "--no-kill", "--unbuffered", "--quiet",
                                  "--mem=0",   "--input=all",  "--job-name=ddprun-agent"};
    for (size_t f = 0; f < sizeof(fixed) / sizeof(fixed[0]); f++)
        argv[a++] = fixed[f];
    for (int c = 0; c < 3; c++)
        argv[a++] = count[c];
    argv[a++] = nodelist;
    if (j->nodes[nodes[0]].cpus > 0)
        argv[a++] = cpus;
    argv[a++] = (char *)ctx->self;
    argv[a++] = "agent";
    argv[a] = NULL;
    /*
     * No parent-death signal: srun cancels the step at once on SIGTERM or SIGHUP; should
     * ddprun die, the EOF on the step's stdin that follows stops the nodes gracefully.
     */
    int r = ddp__spawn_piped("env", argv, 0, ctx->mask, out);
    free(nodelist);
    return r;
}

static int start(const struct ddp_job *j, size_t i, const struct ddp__prov_ctx *ctx,
                 struct ddp__child *out)
{
    return start_group(j, &i, 1, ctx, out);
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

/* end: ddp__end_child (cli/sys/sys.c): SIGTERM has srun cancel the step (every process of it,
 * SIGKILL after the cluster's KillWait) and leave. */
const struct ddp__prov_ops ddp__prov_srun = {.name = "srun",
                                             .start = start,
                                             .start_group = start_group,
                                             .end = ddp__end_child,
                                             .describe = describe};
