/*
 * A job's nodes from the Slurm allocation it runs in (nodes: slurm, or no nodes: inside one) and
 * nproc_per_node's names (gpu, cpu, auto: torchrun's; counted here when every node is this
 * machine, else by each node's agent). Private to the job-spec files
 * (cli/spec/values.h).
 */
#include "cli/sys/sys.h"
#include "cli/sys/devices.h"
#include "cli/sys/hostlist.h"
#include "cli/spec/job.h"
#include "cli/spec/keys.h"
#include "cli/spec/values.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

bool ddp__slurm_allocated(void)
{
    const char *id = getenv("SLURM_JOB_ID"), *list = getenv("SLURM_JOB_NODELIST");
    return id && *id && list && *list;
}

int ddp__nproc_named(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j,
                     int *out)
{
    if (n->type != DDP_Y_SCALAR || (strcmp(n->str, "gpu") && strcmp(n->str, "cpu") &&
                                    strcmp(n->str, "auto") && strcmp(n->str, "xpu")))
        return 0;
    if (!strcmp(n->str, "xpu")) {
        ddp__jv_err(c, n, "%s: xpu (Intel GPUs) is not supported: give a number",
                    DDP_KEY(NPROC_PER_NODE));
        return -1;
    }
    enum ddp_nproc_kind kind = !strcmp(n->str, "gpu")   ? DDP_NPROC_GPU
                               : !strcmp(n->str, "cpu") ? DDP_NPROC_CPU
                                                        : DDP_NPROC_AUTO;
    bool local = true; /* every node is this machine: counting here counts there */
    for (size_t i = 0; i < j->nnodes; i++)
        local = local && ddp__job_host_is_local(j->nodes[i].host);
    if (!local) { /* as torchrun counts on each node: each agent counts its own (HELLO) */
        j->nproc_kind = kind;
        *out = 0;
        return 1;
    }
    struct ddp__node_counts here;
    ddp__counts_here(&here);
    if ((*out = ddp__counts_slots(&here, kind)) < 1) {
        ddp__jv_err(c, n,
                    "%s: gpu is counted on this machine, and no GPU is visible here "
                    "(SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus): give "
                    "the number of ranks per node",
                    DDP_KEY(NPROC_PER_NODE));
        return -1;
    }
    return 1;
}

int ddp__slurm_nodes(const struct ddp__jctx *c, const struct ddp_ynode *at, bool per_node_given,
                     struct ddp_job *j, int **slots_given)
{
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (!ddp__slurm_allocated()) {
        ddp__jv_err(c, at,
                    "nodes: slurm needs a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST "
                    "are not set): run ddprun inside salloc or an sbatch script");
        return -1;
    }
    char **hosts, why[512];
    size_t n;
    if (ddp__hostlist_expand(list, &hosts, &n, why, sizeof(why)) < 0) {
        ddp__jv_err(c, at, "SLURM_JOB_NODELIST: %s", why);
        return -1;
    }
    j->nodes = calloc(n, sizeof(*j->nodes));
    *slots_given = calloc(n, sizeof(int));
    if (!j->nodes || !*slots_given) {
        ddp__hostlist_free(hosts, n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        j->nodes[i].host = hosts[i]; /* taken */
        j->nnodes = i + 1;
    }
    free(hosts);
    /* As mpirun does inside an allocation: the tasks Slurm gives each node are its slots,
     * unless nproc_per_node says otherwise. */
    const char *tasks = getenv("SLURM_TASKS_PER_NODE");
    if (!per_node_given && tasks && *tasks &&
        ddp__counts_expand(tasks, *slots_given, n, why, sizeof(why)) < 0) {
        ddp__jv_err(c, at, "SLURM_TASKS_PER_NODE: %s", why);
        return -1;
    }
    /* The CPUs each node gives the job: what an agent's srun step asks for (cli/provision/srun.c).
     */
    const char *cpus = getenv("SLURM_JOB_CPUS_PER_NODE");
    int *cpn = calloc(n, sizeof(int));
    if (cpn && cpus && *cpus && ddp__counts_expand(cpus, cpn, n, why, sizeof(why)) == 0)
        for (size_t i = 0; i < n; i++)
            j->nodes[i].cpus = cpn[i] > 0 && cpn[i] <= 1 << 20 ? cpn[i] : 0;
    free(cpn);
    for (size_t i = 0; i < n; i++)
        if ((*slots_given)[i] > 4096) {
            ddp__jv_err(c, at, "SLURM_TASKS_PER_NODE gives %s %d tasks (4096 at most)",
                        j->nodes[i].host, (*slots_given)[i]);
            return -1;
        }
    return 0;
}

/* As mpirun does: inside an allocation, on its nodes, srun (when there is one); else SSH. */
int ddp__slurm_launcher(const struct ddp__jctx *c, const struct ddp_ynode *n, bool alloc,
                        struct ddp_job *j)
{
    const char *v = DDP_KEY_DEFAULT(LAUNCHER);
    if (n) {
        if (ddp__jv_scalar(c, n, DDP_KEY(LAUNCHER)) < 0)
            return -1;
        v = n->str;
        if (strcmp(v, "auto") != 0 && strcmp(v, "ssh") != 0 && strcmp(v, "srun") != 0 &&
            strcmp(v, "external") != 0) {
            ddp__jv_err(c, n, "%s must be auto, ssh, srun or external, got '%s'", DDP_KEY(LAUNCHER),
                        v);
            return -1;
        }
        if (!strcmp(v, "external")) { /* the nodes were read as slots (cli/spec/hosts.c) */
            j->external = true;
            return 0;
        }
    }
    bool srun = ddp__program_here("srun", "/");
    if (!strcmp(v, "srun") && !ddp__slurm_allocated()) {
        ddp__jv_err(c, n,
                    "%s: srun needs a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are "
                    "not set): run ddprun inside salloc or an sbatch script",
                    DDP_KEY(LAUNCHER));
        return -1;
    }
    if (!strcmp(v, "srun") && !srun) {
        ddp__jv_err(c, n, "%s: srun, but there is no srun in PATH", DDP_KEY(LAUNCHER));
        return -1;
    }
    j->srun = !strcmp(v, "srun") || (!strcmp(v, "auto") && alloc && srun);
    return 0;
}
