/*
 * The job spec's rendezvous section (cli/spec/values.h): the built-in store's address and
 * timeouts, or an etcd cluster (backend: etcd) with its endpoints, key prefix and TLS files.
 */
#include "cli/spec/job.h"
#include "cli/spec/values.h"
#include "cli/spec/keys.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static bool endpoint_ok(const char *s)
{
    return (strncmp(s, "http://", 7) == 0 && s[7]) || (strncmp(s, "https://", 8) == 0 && s[8]) ||
           (strncmp(s, "unix:///", 8) == 0 && s[8]);
}

static int endpoints(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j)
{
    size_t cnt = n->type == DDP_Y_SEQ ? n->n : 1;
    if (n->type == DDP_Y_MAP || cnt == 0) {
        ddp__jv_err(c, n,
                    "%s must be a list of etcd URLs (http://HOST:PORT, https://HOST:PORT or "
                    "unix:///PATH)",
                    DDP_KEY(RDZV_ENDPOINTS));
        return -1;
    }
    if (!(j->etcd_endpoints = calloc(cnt + 1, sizeof(char *))))
        return -1;
    for (size_t k = 0; k < cnt; k++) {
        const struct ddp_ynode *e = n->type == DDP_Y_SEQ ? n->kids[k] : n;
        if (ddp__jv_str(c, e, "an etcd endpoint", &j->etcd_endpoints[k]) < 0)
            return -1;
        j->netcd = k + 1;
        if (!endpoint_ok(e->str)) {
            ddp__jv_err(c, e,
                        "'%s' is not an etcd endpoint: http://HOST:PORT, https://HOST:PORT or "
                        "unix:///PATH",
                        e->str);
            return -1;
        }
    }
    return 0;
}

/* Its files are made absolute with the job's other paths (cli/spec/keys.c). */
static int tls(const struct ddp__jctx *c, const struct ddp_ynode *sub, struct ddp_job *j)
{
    if (ddp__key_check(c, sub, DDP_K_RDZV_TLS) < 0 ||
        ddp__key_read_section(c, sub, DDP_K_RDZV_TLS, j) < 0)
        return -1;
    if (!j->etcd_cert != !j->etcd_key) {
        ddp__jv_err(c, sub, "%s: %s and %s go together (a client certificate)", DDP_KEY(RDZV_TLS),
                    ddp__key_name(DDP_K_RDZV_TLS_CERT), ddp__key_name(DDP_K_RDZV_TLS_KEY));
        return -1;
    }
    return 0;
}

/* Provisioning a node, as measured (BENCHMARKS.md's scale model): key exchange and
 * authentication over SSH, a step created and launched through srun. */
#define SSH_NODE_MS 87
#define SRUN_NODE_MS 15

/* rendezvous.timeout when the job gives none: 60 s, or twice the time its nodes take to be
 * provisioned when that is longer (the first round waits for all of them: 1,000 nodes over SSH
 * take about 87 s). */
static int64_t default_timeout(const struct ddp_job *j)
{
    int64_t est = 0;
    for (size_t i = 0; i < j->nnodes; i++)
        if (!ddp__job_host_is_local(j->nodes[i].host))
            est += j->srun ? SRUN_NODE_MS : SSH_NODE_MS;
    return 2 * est > 60000 ? 2 * est : 60000;
}

static int rdzv_section(const struct ddp__jctx *c, const struct ddp_ynode *sub, struct ddp_job *j)
{
    const struct ddp_ynode *n, *be = ddp__key_get(sub, DDP_K_RDZV_BACKEND);
    const char *store = DDP_KEY_DEFAULT(RDZV_BACKEND),
               *launcher = DDP_KEY_DEFAULT(RDZV_TORCH_STORE);
    if (ddp__key_check(c, sub, DDP_K_RDZV) < 0 ||
        (be && ddp__jv_enum(c, be, DDP_KEY(RDZV_BACKEND), store, "etcd", &j->rdzv_etcd) < 0) ||
        ddp__key_read_section(c, sub, DDP_K_RDZV, j) < 0)
        return -1;
    const struct ddp_ynode *ts = ddp__key_get(sub, DDP_K_RDZV_TORCH_STORE);
    if (ts) {
        if (ddp__jv_scalar(c, ts, DDP_KEY(RDZV_TORCH_STORE)) < 0)
            return -1;
        if (strcmp(ts->str, "rank0") == 0)
            j->torch_store_rank0 = true;
        else if (strcmp(ts->str, launcher) != 0) {
            ddp__jv_err(c, ts, "%s must be %s or rank0, got '%s'", DDP_KEY(RDZV_TORCH_STORE),
                        launcher, ts->str);
            return -1;
        }
    }
    /* What belongs to the other backend is an error rather than silently unused. */
    static const int etcd_only[] = {DDP_K_RDZV_ENDPOINTS, DDP_K_RDZV_PREFIX, DDP_K_RDZV_TLS,
                                    DDP_K_RDZV_TAKEOVER_TIMEOUT};
    static const int store_only[] = {DDP_K_RDZV_LISTEN, DDP_K_RDZV_PORT, DDP_K_RDZV_TOKEN_FILE};
    for (size_t k = 0; k < 4 && !j->rdzv_etcd; k++)
        if ((n = ddp__key_get(sub, etcd_only[k]))) {
            ddp__jv_err(c, n, "%s is for %s: etcd (this job's is the built-in store)",
                        ddp__keys[etcd_only[k]].path, ddp__key_name(DDP_K_RDZV_BACKEND));
            return -1;
        }
    if (!j->rdzv_etcd)
        return 0;
    for (size_t k = 0; k < 3; k++)
        if ((n = ddp__key_get(sub, store_only[k]))) {
            ddp__jv_err(c, n,
                        "%s is the built-in store's; with %s: etcd no store runs on this machine",
                        ddp__keys[store_only[k]].path, ddp__key_name(DDP_K_RDZV_BACKEND));
            return -1;
        }
    /* No process on this machine serves the ranks: PyTorch's TCPStore is rank 0's. */
    if (ts && !j->torch_store_rank0) {
        ddp__jv_err(c, ts, "%s: %s needs the built-in store; with %s: etcd it is rank0",
                    DDP_KEY(RDZV_TORCH_STORE), launcher, ddp__key_name(DDP_K_RDZV_BACKEND));
        return -1;
    }
    j->torch_store_rank0 = true;
    if (!(n = ddp__key_get(sub, DDP_K_RDZV_ENDPOINTS))) {
        ddp__jv_err(c, be, "%s: etcd needs %s (etcd's URLs)", DDP_KEY(RDZV_BACKEND),
                    DDP_KEY(RDZV_ENDPOINTS));
        return -1;
    }
    if (endpoints(c, n, j) < 0)
        return -1;
    if ((n = ddp__key_get(sub, DDP_K_RDZV_PREFIX))) {
        if (ddp__jv_str(c, n, DDP_KEY(RDZV_PREFIX), &j->etcd_prefix) < 0)
            return -1;
        if (j->etcd_prefix[strlen(j->etcd_prefix) - 1] != '/') {
            ddp__jv_err(c, n, "%s must end with '/' (a folder of keys), got '%s'",
                        DDP_KEY(RDZV_PREFIX), j->etcd_prefix);
            return -1;
        }
    } else if (!(j->etcd_prefix = strdup(DDP_KEY_DEFAULT(RDZV_PREFIX)))) {
        return -1;
    }
    j->takeover_ms = ddp__parse_duration_ms(DDP_KEY_DEFAULT(RDZV_TAKEOVER_TIMEOUT));
    if ((n = ddp__key_get(sub, DDP_K_RDZV_TAKEOVER_TIMEOUT)) &&
        ddp__jv_duration(c, n, DDP_KEY(RDZV_TAKEOVER_TIMEOUT), &j->takeover_ms) < 0)
        return -1;
    if ((n = ddp__key_get(sub, DDP_K_RDZV_TLS)) && tls(c, n, j) < 0)
        return -1;
    bool https = false;
    for (size_t k = 0; k < j->netcd; k++)
        https |= strncmp(j->etcd_endpoints[k], "https://", 8) == 0;
    if (n && !https) {
        ddp__jv_err(c, n, "%s needs https:// endpoints", DDP_KEY(RDZV_TLS));
        return -1;
    }
    return 0;
}

/* launcher: external: agents started elsewhere find the launcher where the job says, and
 * prove a token they were given as a file. */
static int external(const struct ddp__jctx *c, const struct ddp_ynode *launcher,
                    const struct ddp_ynode *sub, struct ddp_job *j)
{
    const char *l = j->rdzv_listen;
    const struct ddp_ynode *at = sub ? sub : launcher;
    if (j->rdzv_etcd)
        ddp__jv_err(c, at, "%s: external needs the built-in store (its agents join at its port)",
                    DDP_KEY(LAUNCHER));
    else if (!j->token_file)
        ddp__jv_err(c, at,
                    "%s: external needs %s (a file of mode 0600 holding the job's token, which "
                    "each agent is given too)",
                    DDP_KEY(LAUNCHER), DDP_KEY(RDZV_TOKEN_FILE));
    else if (j->rdzv_port == 0)
        ddp__jv_err(c, at, "%s: external needs a fixed %s (where the agents join)",
                    DDP_KEY(LAUNCHER), DDP_KEY(RDZV_PORT));
    else if (!strcmp(l, "auto") || !strncmp(l, "127.", 4) || !strcmp(l, "::1") ||
             !strcmp(l, "localhost"))
        ddp__jv_err(c, at,
                    "%s: external needs a %s the agents' nodes reach (0.0.0.0, or an address of "
                    "this machine), not '%s'",
                    DDP_KEY(LAUNCHER), DDP_KEY(RDZV_LISTEN), l);
    else if (sub && ddp__key_get(sub, DDP_K_RDZV_TORCH_STORE) && !j->torch_store_rank0)
        ddp__jv_err(c, ddp__key_get(sub, DDP_K_RDZV_TORCH_STORE),
                    "%s: launcher serves only the nodes it knows at the start; with %s: external "
                    "it is rank0 (rank 0 hosts PyTorch's TCPStore, as under torchrun)",
                    DDP_KEY(RDZV_TORCH_STORE), DDP_KEY(LAUNCHER));
    else
        return j->torch_store_rank0 = true, 0;
    return -1;
}

int ddp__job_rdzv(const struct ddp__jctx *c, const struct ddp_ynode *sub, struct ddp_job *j,
                  const struct ddp_ynode *launcher)
{
    if (!sub || !ddp__key_get(sub, DDP_K_RDZV_TIMEOUT))
        j->rdzv_timeout_ms = default_timeout(j);
    if (sub && rdzv_section(c, sub, j) < 0)
        return -1;
    return j->external ? external(c, launcher, sub, j) : 0;
}
