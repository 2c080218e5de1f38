/* Slurm at run time (cli/provision/slurm.c). */
#ifndef DDP_CLI_PROVISION_SLURM_H
#define DDP_CLI_PROVISION_SLURM_H

#include <stddef.h>

struct ddp_job;

/* Removes from this process's environment the SLURM_* variables that describe a job step and
 * its tasks, keeping those of the allocation (cli/provision/slurm.c). */
void ddp__slurm_scrub_env(void);
/* The state of the Slurm allocation ddprun runs in (SLURM_JOB_ID), asked of scontrol: 1 while
 * it runs; 0 once it ended, with how in state ("CANCELLED", "TIMEOUT", ..., "ENDED" when Slurm
 * forgot it); -1 when Slurm cannot tell (then assume it runs). Takes up to a few seconds. */
int ddp__slurm_alloc_state(char *state, size_t n);
/* Each of the job's nodes' NodeAddr where it is not the node's name (a name only Slurm knows,
 * with NodeAddr=10.1.2.3), from one `scontrol show node -o SLURM_JOB_NODELIST` (within 5 s):
 * addr[i] (j->nnodes of them) malloc'd, or NULL where the name is the address (resolved as a
 * host name) or Slurm did not say. 0, or -1 when scontrol could not be asked (every addr[i]
 * is then NULL). */
int ddp__slurm_node_addrs(const struct ddp_job *j, char **addr);

#endif
