/* The node agent (cli/agent/agent.c). */
#ifndef DDP_CLI_AGENT_AGENT_H
#define DDP_CLI_AGENT_AGENT_H

/* `ddprun agent` (cli/agent/agent.c). */
int ddp__cmd_agent(void);
/* `ddprun agent --join HOST:PORT --token-file FILE`: an agent started by someone else joins the
 * job that runs there with launcher: external (cli/agent/link.h). */
int ddp__cmd_agent_join(const char *hostport, const char *token_file);

#endif
