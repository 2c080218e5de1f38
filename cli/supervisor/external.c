/*
 * The supervisor's side of agents started by someone else (launcher: external, cli/spec/job.h):
 * the job's token from rendezvous.token_file, which each agent is given too; the agent port
 * published in the store, where `ddprun agent --join HOST:PORT` reads it after proving that
 * token; and what the launcher learns of the agent that takes a slot.
 */
#include "cli/proto/agent_wire.h"
#include "cli/spec/args.h"
#include "cli/spec/job.h"
#include "cli/supervisor/supervisor.h"
#include "common/err.h"
#include "rendezvous/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

int ddp__sup_token(const struct ddp_job *job)
{
    if (!job->token_file)
        return ddp_store_token_generate(ddp__supervisor.token) < 0 ? -1 : 0;
    uint8_t *tok = NULL;
    size_t len = 0;
    if (ddp_store_token_read_file(job->token_file, &tok, &len) < 0) {
        ddp__cli_error("cannot use rendezvous.token_file '%s' (said above)", job->token_file);
        return -1;
    }
    bool ok = len >= 16 && len < sizeof(ddp__supervisor.token);
    for (size_t k = 0; ok && k < len; k++)
        ok = tok[k] > 0x20 && tok[k] < 0x7f;
    if (ok) {
        memcpy(ddp__supervisor.token, tok, len);
        ddp__supervisor.token[len] = '\0';
    } else {
        ddp__cli_error(
            "rendezvous.token_file '%s' must hold 16 to %zu printable characters (openssl "
            "rand -hex 32 makes one)",
            job->token_file, sizeof(ddp__supervisor.token) - 1);
    }
    ddp_store_token_free(tok, len);
    return ok ? 0 : -1;
}

int ddp__sup_publish_agent_port(void)
{
    struct ddp_store *s = NULL;
    char v[16];
    int r = ddp_store_connect(ddp__supervisor.store_host, ddp__supervisor.store_port,
                              ddp__supervisor.token, strlen(ddp__supervisor.token), 10000, &s);
    if (r == 0) {
        snprintf(v, sizeof(v), "%d", ddp__supervisor.agent_port);
        r = ddp_store_set(s, DDP__AGENT_PORT_KEY, v, strlen(v));
        ddp_store_close(s);
    }
    if (r < 0)
        ddp__cli_error("cannot publish the agent port in the job's store: %s", ddp_strerror(r));
    return r < 0 ? -1 : 0;
}

void ddp__sup_slot_taken(int i, const char *peer_ip)
{
    if (!ddp__supervisor.node_addr)
        return;
    free(ddp__supervisor.node_addr[i]);
    ddp__supervisor.node_addr[i] = strdup(peer_ip); /* where its ranks are reached */
}
