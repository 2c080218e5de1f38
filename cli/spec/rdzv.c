/*
 * The job spec's rendezvous section (cli/spec/values.h): the built-in store's address and
 * timeouts, or an etcd cluster (backend: etcd) with its endpoints, key prefix and TLS files.
 */
#include "cli/spec/job.h"
#include "cli/spec/values.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static const char *const rdzv_keys[] = {"backend",          "endpoints",   "prefix", "tls",
                                        "takeover_timeout", "listen",      "port",   "timeout",
                                        "last_call",        "torch_store", NULL};
static const char *const tls_keys[] = {"ca", "cert", "key", NULL};

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
                    "rendezvous.endpoints must be a list of etcd URLs (http://HOST:PORT, "
                    "https://HOST:PORT or unix:///PATH)");
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

static int tls(const struct ddp__jctx *c, const struct ddp_ynode *sub, const char *basedir,
               struct ddp_job *j)
{
    const struct ddp_ynode *n;
    if (ddp__jv_check_keys(c, sub, "rendezvous.tls", tls_keys) < 0 ||
        ((n = ddp__ytree_get(sub, "ca")) &&
         ddp__jv_str(c, n, "rendezvous.tls.ca", &j->etcd_ca) < 0) ||
        ((n = ddp__ytree_get(sub, "cert")) &&
         ddp__jv_str(c, n, "rendezvous.tls.cert", &j->etcd_cert) < 0) ||
        ((n = ddp__ytree_get(sub, "key")) &&
         ddp__jv_str(c, n, "rendezvous.tls.key", &j->etcd_key) < 0))
        return -1;
    if (!j->etcd_cert != !j->etcd_key) {
        ddp__jv_err(c, sub, "rendezvous.tls: cert and key go together (a client certificate)");
        return -1;
    }
    char **files[] = {&j->etcd_ca, &j->etcd_cert, &j->etcd_key};
    for (size_t k = 0; k < 3; k++)
        if (*files[k]) {
            char *abs = ddp__jv_path(basedir, *files[k]);
            free(*files[k]);
            if (!(*files[k] = abs))
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

static int rdzv_section(const struct ddp__jctx *c, const struct ddp_ynode *sub, const char *basedir,
                        struct ddp_job *j)
{
    const struct ddp_ynode *n, *be = ddp__ytree_get(sub, "backend");
    if (ddp__jv_check_keys(c, sub, "rendezvous", rdzv_keys) < 0 ||
        (be && ddp__jv_enum(c, be, "rendezvous.backend", "store", "etcd", &j->rdzv_etcd) < 0) ||
        ((n = ddp__ytree_get(sub, "listen")) &&
         ddp__jv_str(c, n, "rendezvous.listen", &j->rdzv_listen) < 0) ||
        ((n = ddp__ytree_get(sub, "port")) &&
         ddp__jv_int(c, n, "rendezvous.port", 0, 65535, &j->rdzv_port) < 0) ||
        ((n = ddp__ytree_get(sub, "timeout")) &&
         ddp__jv_duration_pos(c, n, "rendezvous.timeout", &j->rdzv_timeout_ms) < 0) ||
        ((n = ddp__ytree_get(sub, "last_call")) &&
         ddp__jv_duration(c, n, "rendezvous.last_call", &j->rdzv_last_call_ms) < 0))
        return -1;
    const struct ddp_ynode *ts = ddp__ytree_get(sub, "torch_store");
    if (ts) {
        if (ddp__jv_scalar(c, ts, "rendezvous.torch_store") < 0)
            return -1;
        if (strcmp(ts->str, "rank0") == 0)
            j->torch_store_rank0 = true;
        else if (strcmp(ts->str, "launcher") != 0) {
            ddp__jv_err(c, ts, "rendezvous.torch_store must be launcher or rank0, got '%s'",
                        ts->str);
            return -1;
        }
    }
    /* What belongs to the other backend is an error rather than silently unused. */
    static const char *const etcd_only[] = {"endpoints", "prefix", "tls", "takeover_timeout"};
    static const char *const store_only[] = {"listen", "port"};
    for (size_t k = 0; k < 4 && !j->rdzv_etcd; k++)
        if ((n = ddp__ytree_get(sub, etcd_only[k]))) {
            ddp__jv_err(c, n,
                        "rendezvous.%s is for backend: etcd (this job's is the built-in store)",
                        etcd_only[k]);
            return -1;
        }
    if (!j->rdzv_etcd)
        return 0;
    for (size_t k = 0; k < 2; k++)
        if ((n = ddp__ytree_get(sub, store_only[k]))) {
            ddp__jv_err(c, n,
                        "rendezvous.%s is the built-in store's; with backend: etcd no store runs "
                        "on this machine",
                        store_only[k]);
            return -1;
        }
    /* No process on this machine serves the ranks: PyTorch's TCPStore is rank 0's. */
    if (ts && !j->torch_store_rank0) {
        ddp__jv_err(c, ts,
                    "rendezvous.torch_store: launcher needs the built-in store; with backend: etcd "
                    "it is rank0");
        return -1;
    }
    j->torch_store_rank0 = true;
    if (!(n = ddp__ytree_get(sub, "endpoints"))) {
        ddp__jv_err(c, be, "rendezvous.backend: etcd needs rendezvous.endpoints (etcd's URLs)");
        return -1;
    }
    if (endpoints(c, n, j) < 0)
        return -1;
    if ((n = ddp__ytree_get(sub, "prefix"))) {
        if (ddp__jv_str(c, n, "rendezvous.prefix", &j->etcd_prefix) < 0)
            return -1;
        if (j->etcd_prefix[strlen(j->etcd_prefix) - 1] != '/') {
            ddp__jv_err(c, n, "rendezvous.prefix must end with '/' (a folder of keys), got '%s'",
                        j->etcd_prefix);
            return -1;
        }
    } else if (!(j->etcd_prefix = strdup("/ddprun/"))) {
        return -1;
    }
    j->takeover_ms = 60000;
    if ((n = ddp__ytree_get(sub, "takeover_timeout")) &&
        ddp__jv_duration(c, n, "rendezvous.takeover_timeout", &j->takeover_ms) < 0)
        return -1;
    if ((n = ddp__ytree_get(sub, "tls")) && tls(c, n, basedir, j) < 0)
        return -1;
    bool https = false;
    for (size_t k = 0; k < j->netcd; k++)
        https |= strncmp(j->etcd_endpoints[k], "https://", 8) == 0;
    if (n && !https) {
        ddp__jv_err(c, n, "rendezvous.tls needs https:// endpoints");
        return -1;
    }
    return 0;
}

int ddp__job_rdzv(const struct ddp__jctx *c, const struct ddp_ynode *sub, const char *basedir,
                  struct ddp_job *j)
{
    if (!sub || !ddp__ytree_get(sub, "timeout"))
        j->rdzv_timeout_ms = default_timeout(j);
    return sub ? rdzv_section(c, sub, basedir, j) : 0;
}
