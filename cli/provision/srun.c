/*
 * The Slurm provisioner (cli/provision/provision.h): inside an allocation, node i's agent is a job
 * step of its own, `srun --nodes=1 --ntasks=1 --nodelist=HOST ... ddprun agent`, so that Slurm
 * accounts for it, signals it and cleans up after it. The step's stdin carries BOOT, and the agent
 * dials back (cli/proto/agent_wire.h); its stderr carries its messages, --unbuffered, as
 * slurmstepd holds a task's output back until a newline otherwise. --overlap lets the steps share
 * the allocation's CPUs with the batch step that runs ddprun; --kill-on-bad-exit=0 and
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
#include <sys/wait.h>

#include "common/banned.h"

static int start(const struct ddp_job *j, size_t i, const struct ddp__prov_ctx *ctx,
                 struct ddp__child *out)
{
    char nodelist[300], cpus[40];
    snprintf(nodelist, sizeof(nodelist), "--nodelist=%s", j->nodes[i].host);
    snprintf(cpus, sizeof(cpus), "--cpus-per-task=%d", j->nodes[i].cpus);
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
    char *argv[2 * NSHAPING + 20];
    int k = 0;
    argv[k++] = "env"; /* env -u VAR ... srun ... */
    for (int v = 0; v < NSHAPING; v++) {
        argv[k++] = "-u";
        argv[k++] = shaping[v];
    }
    static char *const fixed[] = {
        "srun",      "--nodes=1",    "--ntasks=1", "--overlap", "--kill-on-bad-exit=0",
        "--no-kill", "--unbuffered", "--quiet",    "--mem=0",   "--job-name=ddprun-agent"};
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
    return ddp__spawn_piped("env", argv, 0, ctx->mask, out);
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
const struct ddp__prov_ops ddp__prov_srun = {
    .name = "srun", .start = start, .end = ddp__end_child, .describe = describe};
