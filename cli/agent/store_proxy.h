/*
 * The node's store proxy (cli/agent/store_proxy.c): the ranks of a node reach the job's store
 * through their agent, so that the launcher's store holds connections and serves requests per
 * node, not per rank. The agent listens on the node's address toward the store (the address the
 * ranks then find as their own, ddp_store_local_addr), proves and checks the job's token as the
 * store does, and relays the ranks' requests on one connection of its own, combining what
 * several ranks ask at once:
 *   - ADDs to one key (a barrier's arrivals) go up as one ADD of their sum, and each rank gets
 *     the value its own ADD would have had: the first waits up to 50 ms for the node's other
 *     ranks' (which a barrier waits for anyway), and those that come while one is on its way go
 *     with the next;
 *   - reads (GET, MULTI_GET, CHECK) asked again while one is on its way get its reply;
 *   - WAITs for the same keys are one WAIT, on a connection of a small pool (a WAIT holds up the
 *     requests behind it on its connection), answered to each rank by its own deadline;
 *   - every other request goes up as it came, its reply back to the rank that asked.
 * A rank's requests are answered in order, one at a time, as the store answers them.
 *
 * PyTorch's ranks (MASTER_ADDR:MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True) reach it on a
 * port of its own, in TCPStore's protocol, which cli/agent/torch_proxy.h puts into the store's:
 * their requests are combined with the node's others in the same way. TCPStore has no token:
 * that port serves connections from the node's own address only (a rank that connects to its
 * node's address has it as its source), refusing others with a rate-limited warning.
 */
#ifndef DDP_CLI_AGENT_STORE_PROXY_H
#define DDP_CLI_AGENT_STORE_PROXY_H

#include <stddef.h>
#include <stdint.h>

struct ddp_loop;

/* Starts the proxy (or keeps the one that runs for the same store): listens on listen_host (a
 * free port, and another for TCPStore clients), connects to store_addr ("host:port") with the
 * token. Its address for the ranks ("host:port") in addr, the TCPStore port in *torch_port (0
 * where it has none). 0, or -1 said on stderr (the ranks then reach the store directly). */
int ddp__proxy_start(struct ddp_loop *loop, const char *listen_host, const char *store_addr,
                     const char *token, char *addr, size_t n, int *torch_port);
/* The round's ranks on this node: an ADD waits for theirs (HOLD_MS at most) to go up as one;
 * TCPStore clients that connect from now on use the round's key space ("torch/<round>/"). */
void ddp__proxy_ranks(unsigned nlocal, int round);
/* Closes every connection. */
void ddp__proxy_stop(void);

#endif
