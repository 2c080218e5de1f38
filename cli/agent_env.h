/* The environment a node agent gives each rank (cli/agent_env.c), set in the rank's process
 * before it execs: torchrun's variables, ddprun's, the job's. */
#ifndef DDP_CLI_AGENT_ENV_H
#define DDP_CLI_AGENT_ENV_H

#include "cli/agent_proto.h"

/* iface/node_addr: the node's interface and address toward the store ("" unknown); tokfd: the
 * token's descriptor; progfd: the progress page's, or -1; error_file: the rank's
 * TORCHELASTIC_ERROR_FILE (cli/errfile.h), "" for none. */
void ddp__agent_rank_env(const struct ddp__agent_start *st, const struct ddp__agent_join *j,
                         int local_rank, const char *iface, const char *node_addr, int tokfd,
                         int progfd, const char *error_file);

#endif
