/*
 * Provisioners: how the launcher gets a node agent onto a node. Each starts, for node i of a
 * job, a local child process whose stdin carries the launcher's BOOT to the agent (where to dial
 * back: the frames then travel on that link, cli/proto/agent_wire.h) and whose stderr carries
 * messages; the launcher learns that the agent is gone when that child is reaped. A provisioner is
 * a file behind this ops struct: local nodes (cli/provision/local.c: `ddprun agent` itself), SSH
 * (cli/provision/ssh.c: the bridge of cli/provision/ssh_bridge.c), Slurm job steps
 * (cli/provision/srun.c: srun); the table in cli/provision/provision.c picks one per node.
 */
#ifndef DDP_CLI_PROVISION_H
#define DDP_CLI_PROVISION_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "cli/sys/sys.h"

struct ddp_job;

struct ddp__prov_ctx {
    const char *self;     /* this ddprun's path: the default ddprun on the nodes */
    const sigset_t *mask; /* the signal mask the child starts with */
    /* The agents outlive this launcher (a takeover wait, cli/agent/link.h): a launcher's death
     * does not end them (local and SSH nodes). */
    bool detach;
    /* Not NULL: rejoin the agents of this job id waiting for a new launcher
     * (`ddprun agent --rejoin JOB NODE`) rather than start new ones (local and SSH nodes). */
    const char *rejoin;
};

struct ddp__prov_ops {
    const char *name; /* "local", "ssh", "srun", "external" (no process: pid 0) */
    /* Starts node i's agent (out: its pid and pipes); 0, or -1 with errno. */
    int (*start)(const struct ddp_job *job, size_t i, const struct ddp__prov_ctx *ctx,
                 struct ddp__child *out);
    /* Where the provisioner can (srun: one step), starts the agents of nodes[0..k) as one
     * process; NULL where it cannot. */
    int (*start_group)(const struct ddp_job *job, const size_t *nodes, size_t k,
                       const struct ddp__prov_ctx *ctx, struct ddp__child *out);
    /*
     * Ends the agent process pid at once. Level 1 lets it take down what it started where it
     * runs (an SSH bridge has the remote session killed) before it goes; level 2 SIGKILLs its
     * process group.
     */
    void (*end)(pid_t pid, int level);
    /* Why an agent that ended with wait status st is gone, for "node 'x' lost: ...". */
    void (*describe)(int st, bool joining, char *buf, size_t n);
    /* The signal that ended the agent's own process, read from st (its process's wait status),
     * or 0 where that is not known (NULL: never known). An agent killed so has its ranks killed
     * with it (their parent-death signal). */
    int (*agent_signal)(int st);
};

extern const struct ddp__prov_ops ddp__prov_local, ddp__prov_ssh, ddp__prov_srun,
    ddp__prov_external;

/* The provisioner for node i of the job: external for launcher: external, local for localhost,
 * 127.0.0.1 and ::1, else srun (launcher: srun, cli/spec/job.h) or SSH. */
const struct ddp__prov_ops *ddp__provisioner(const struct ddp_job *job, size_t i);

#endif
