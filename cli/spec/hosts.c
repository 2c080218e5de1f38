/* The job spec's nodes key: hosts and their slots (cli/spec/values.h). */
#include "cli/spec/job.h"
#include "cli/spec/values.h"
#include "cli/spec/ytree.h"
#include "cli/spec/keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/*
 * Other tools' host syntax is an error naming the right form, never a host literally called
 * "gpu1:4" (Horovod's host:slots) or "gpu1 slots=4" (a DeepSpeed or Open MPI hostfile line).
 * An IPv6 address has more than one colon and is a host.
 */
static int check_host_syntax(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *h)
{
    const char *colon = strchr(h, ':');
    char *end;
    if (colon && !strchr(colon + 1, ':') && colon[1] && (strtol(colon + 1, &end, 10), !*end)) {
        ddp__jv_err(
            c, n,
            "node '%s' looks like Horovod's host:slots; in a job file write {%s: %.*s, %s: %s}", h,
            ddp__key_name(DDP_K_NODES_HOST), (int)(colon - h), h, ddp__key_name(DDP_K_NODES_SLOTS),
            colon + 1);
        return -1;
    }
    const char *sp = strpbrk(h, " \t");
    if (sp) {
        const char *slots = strstr(h, "slots=");
        if (slots)
            ddp__jv_err(c, n,
                        "node '%s' is a hostfile line; in a job file write {%s: %.*s, %s: %s}", h,
                        ddp__key_name(DDP_K_NODES_HOST), (int)(sp - h), h,
                        ddp__key_name(DDP_K_NODES_SLOTS), slots + 6);
        else
            ddp__jv_err(c, n, "node '%s' is not a host name (no spaces)", h);
        return -1;
    }
    return 0;
}

int ddp__job_nodes(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j,
                   int **slots_given)
{
    if (n->type != DDP_Y_SEQ || n->n == 0) {
        ddp__jv_err(c, n, "%s must be a non-empty list of hosts ('- %s: NAME' or '- NAME')",
                    DDP_KEY(NODES), ddp__key_name(DDP_K_NODES_HOST));
        return -1;
    }
    j->nodes = calloc(n->n, sizeof(*j->nodes));
    *slots_given = calloc(n->n, sizeof(int));
    if (!j->nodes || !*slots_given)
        return -1;
    for (size_t i = 0; i < n->n; i++) {
        const struct ddp_ynode *e = n->kids[i], *host = e;
        if (e->type == DDP_Y_MAP) {
            if (ddp__key_check_in(c, e, DDP_K_NODES, "a node") < 0)
                return -1;
            if (!(host = ddp__key_get(e, DDP_K_NODES_HOST))) {
                ddp__jv_err(c, e, "a node needs '%s'", ddp__key_name(DDP_K_NODES_HOST));
                return -1;
            }
            const struct ddp_ynode *s = ddp__key_get(e, DDP_K_NODES_SLOTS);
            if (s && ddp__jv_int(c, s, ddp__key_name(DDP_K_NODES_SLOTS), 1, 4096,
                                 &(*slots_given)[i]) < 0)
                return -1;
        }
        if (ddp__jv_str(c, host, ddp__key_name(DDP_K_NODES_HOST), &j->nodes[i].host) < 0)
            return -1;
        j->nnodes = i + 1; /* counted now, so an error below still frees it */
        if (check_host_syntax(c, host, j->nodes[i].host) < 0)
            return -1;
    }
    const char **hosts = malloc(j->nnodes * sizeof(*hosts));
    size_t dup, first;
    if (!hosts)
        return -1;
    for (size_t i = 0; i < j->nnodes; i++)
        hosts[i] = j->nodes[i].host;
    bool found = ddp__ytree_find_dup(hosts, j->nnodes, &dup, &first);
    free(hosts);
    if (found) {
        const struct ddp_ynode *e = n->kids[dup];
        ddp__jv_err(c, e->type == DDP_Y_MAP ? ddp__key_get(e, DDP_K_NODES_HOST) : e,
                    "node '%s' is listed twice", j->nodes[dup].host);
        return -1;
    }
    return 0;
}

int ddp__job_external_slots(const struct ddp__jctx *c, const struct ddp_ynode *n,
                            const struct ddp_ynode *launcher, struct ddp_job *j, int **slots_given)
{
    int count = 0;
    if (!n) {
        ddp__jv_err(c, launcher,
                    "%s: external needs %s: N, how many agents may join (the agents started "
                    "elsewhere run `ddprun agent --join`)",
                    DDP_KEY(LAUNCHER), DDP_KEY(NODES));
        return -1;
    }
    if (n->type != DDP_Y_SCALAR || ddp__jv_int(c, n, DDP_KEY(NODES), 1, 100000, &count) < 0) {
        if (n->type != DDP_Y_SCALAR)
            ddp__jv_err(c, n,
                        "with %s: external, %s is how many agents may join (a number): the "
                        "agents say who they are",
                        DDP_KEY(LAUNCHER), DDP_KEY(NODES));
        return -1;
    }
    j->nodes = calloc((size_t)count, sizeof(*j->nodes));
    *slots_given = calloc((size_t)count, sizeof(int));
    if (!j->nodes || !*slots_given)
        return -1;
    for (int i = 0; i < count; i++) {
        /* named by the agent that takes it; until then its slot's number */
        if (!(j->nodes[i].host = calloc(1, DDP__EXTERNAL_NAME)))
            return -1;
        snprintf(j->nodes[i].host, DDP__EXTERNAL_NAME, "agent-%d", i);
        j->nnodes = (size_t)i + 1;
    }
    return 0;
}
