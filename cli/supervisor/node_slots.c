/*
 * nproc_per_node gpu, cpu or auto on nodes that are other machines: each node's slots are
 * counted there, as torchrun counts on the node it runs on. The node's agent says in its HELLO
 * what its environment gives ranks (cli/sys/devices.h); the ranks' environment puts the job's env
 * and, on another machine, the exported shell variables before the node's own, so those are
 * applied here. Part of the supervisor (cli/supervisor/supervisor.h).
 */
#include "cli/supervisor/supervisor.h"
#include "cli/sys/devices.h"
#include "cli/supervisor/nodes.h"

#include <stdio.h>
#include <string.h>

#include "common/banned.h"

/* name's value in the ranks' environment where the launcher sets it (the job's env, then for
 * another machine the exported shell variables), else NULL: the node's own. */
static const char *set_by_launcher(const char *name, bool remote)
{
    size_t n = strlen(name);
    for (size_t k = 0; k < ddp__supervisor.job->nenv; k++)
        if (strcmp(ddp__supervisor.job->env[k].key, name) == 0)
            return ddp__supervisor.job->env[k].value;
    for (char **p = ddp__supervisor.shell_env; remote && p && *p; p++)
        if (strncmp(*p, name, n) == 0 && (*p)[n] == '=')
            return *p + n + 1;
    return NULL;
}

bool ddp__sup_count_slots(int i)
{
    struct ddp_job_node *node = &ddp__supervisor.job->nodes[i];
    if (!node->counted)
        return true;
    const char *kind = ddp__nproc_kind_name(ddp__supervisor.job->nproc_kind);
    char why[300];
    struct ddp__node_counts c;
    if (!ddp__nodes_counts(&ddp__supervisor.nodes, i, &c)) {
        snprintf(why, sizeof(why),
                 "did not count its node's GPUs and CPUs for nproc_per_node: %s (a ddprun older "
                 "than this one (%s) runs there); the same ddprun must run on every node",
                 kind, DDP_VERSION);
        ddp__nodes_refuse(&ddp__supervisor.nodes, i, why);
        return false;
    }
    bool remote = !ddp__job_host_is_local(node->host);
    const char *v;
    if ((v = set_by_launcher("SLURM_GPUS_ON_NODE", remote)))
        c.slurm_gpus = ddp__slurm_gpus_of(v);
    if ((v = set_by_launcher("CUDA_VISIBLE_DEVICES", remote)))
        c.cvd_gpus = ddp__cvd_gpus_of(v);
    int slots = ddp__counts_slots(&c, ddp__supervisor.job->nproc_kind);
    if (slots < 1) {
        snprintf(why, sizeof(why),
                 "sees no GPU there for nproc_per_node: gpu (SLURM_GPUS_ON_NODE, "
                 "CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus, as its ranks would see them): "
                 "give the number of ranks per node");
        ddp__nodes_refuse(&ddp__supervisor.nodes, i, why);
        return false;
    }
    if (slots != node->slots)
        ddp__sup_event("node_counted", "node", node->host, "nproc_per_node", kind, "#slots",
                       (long long)slots, NULL);
    node->slots = slots;
    return true;
}
