/* The node agent (cli/agent/agent.c). */
#ifndef DDP_CLI_AGENT_AGENT_H
#define DDP_CLI_AGENT_AGENT_H

/* `ddprun agent` (cli/agent/agent.c). */
int ddp__cmd_agent(void);

#endif
