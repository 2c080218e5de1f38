/* `ddprun plan`'s view of a job (the resolved spec, rank map and environment), also kept as
 * the job's spec.yaml, and the rank environment's OMP_NUM_THREADS rule. */
#include "cli/sys/sys.h"
#include "cli/sys/cpubind.h"
#include "cli/spec/job.h"
#include "cli/spec/pipe_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* "5s" or "500ms" into buf. */
static const char *fmt_duration(char *buf, size_t n, int64_t ms)
{
    if (ms % 1000 == 0)
        snprintf(buf, n, "%llds", (long long)(ms / 1000));
    else
        snprintf(buf, n, "%lldms", (long long)ms);
    return buf;
}

void ddp__job_print_plan(const struct ddp_job *j, const char *job_id, FILE *f)
{
    fprintf(f, "# ddprun plan for %s (job id %s)\n", j->file, job_id);
    fprintf(f, "name: %s\ncommand: ", j->name);
    if (j->shell) {
        fprintf(f, "%s   # run by /bin/sh -c\n", j->shell);
    } else {
        fprintf(f, "[");
        for (char **a = j->argv; *a; a++)
            fprintf(f, "%s%s", a == j->argv ? "" : ", ", *a);
        fprintf(f, "]\n");
    }
    fprintf(f, "workdir: %s\nenv:", j->workdir);
    if (!j->nenv)
        fprintf(f, " {}");
    fprintf(f, "\n");
    for (size_t i = 0; i < j->nenv; i++)
        fprintf(f, "  %s: %s\n", j->env[i].key, j->env[i].value);
    fprintf(f, "nodes:\n");
    const char *kind = ddp__nproc_kind_name(j->nproc_kind);
    for (size_t i = 0; i < j->nnodes; i++)
        if (j->nodes[i].slots)
            fprintf(f, "  - {host: %s, slots: %d}\n", j->nodes[i].host, j->nodes[i].slots);
        else
            fprintf(f, "  - {host: %s, slots: %s}   # counted there by its agent\n",
                    j->nodes[i].host, kind);
    if (j->nproc_kind)
        fprintf(f, "nproc_per_node: %s   # %s\n", kind,
                j->world_size ? "every node gives slots of its own"
                              : "counted on each node by its agent, as torchrun counts");
    else
        fprintf(f, "nproc_per_node: %d\n", j->nproc_per_node);
    fprintf(f, "backend: %s\nbind_to: %s\n", j->backend, ddp__cpubind_name(j->bind_to));
    char d1[32], d2[32];
    if (j->rdzv_etcd) {
        fprintf(f, "rendezvous: {backend: etcd, endpoints: [");
        for (size_t k = 0; k < j->netcd; k++)
            fprintf(f, "%s%s", k ? ", " : "", j->etcd_endpoints[k]);
        fprintf(f, "], prefix: %s, ", j->etcd_prefix);
        if (j->etcd_ca || j->etcd_cert)
            fprintf(f, "tls: {ca: %s, cert: %s, key: %s}, ", j->etcd_ca ? j->etcd_ca : "(system)",
                    j->etcd_cert ? j->etcd_cert : "(none)", j->etcd_key ? j->etcd_key : "(none)");
        fprintf(f, "takeover_timeout: %s, ", fmt_duration(d2, sizeof(d2), j->takeover_ms));
        fprintf(f, "timeout: %s, ", fmt_duration(d1, sizeof(d1), j->rdzv_timeout_ms));
    } else {
        fprintf(f, "rendezvous: {backend: store, listen: %s, port: %d, timeout: %s, ",
                j->rdzv_listen, j->rdzv_port, fmt_duration(d1, sizeof(d1), j->rdzv_timeout_ms));
    }
    fprintf(f, "last_call: %s}\n", fmt_duration(d1, sizeof(d1), j->rdzv_last_call_ms));
    fprintf(f,
            "elastic: {min_nodes: %d, max_nodes: %d, max_restarts: %d, heartbeat_interval: %s, "
            "heartbeat_timeout: %s, ",
            j->min_nodes, j->max_nodes, j->max_restarts,
            fmt_duration(d1, sizeof(d1), j->heartbeat_interval_ms),
            fmt_duration(d2, sizeof(d2), j->heartbeat_timeout_ms));
    fprintf(f, "cooldown: %s}\n", fmt_duration(d1, sizeof(d1), j->cooldown_ms));
    fprintf(f,
            "ssh: {user: %s, port: %d, identity: %s, known_hosts: %s, "
            "strict_host_key_checking: %s, remote_ddprun: %s}\n",
            j->ssh_user ? j->ssh_user : "(current user)", j->ssh_port,
            j->ssh_identity ? j->ssh_identity : "(agent, then default keys)",
            j->ssh_known_hosts ? j->ssh_known_hosts : "~/.ssh/known_hosts", j->ssh_strict,
            j->ssh_remote_ddprun ? j->ssh_remote_ddprun : "(this ddprun's path)");
    fprintf(f, "launcher: %s\n", j->srun ? "srun" : "ssh");
    fprintf(f, "logs: {dir: %s, tag_output: %s, timestamps: %s, console_ranks: %s, jsonl: %s}\n",
            j->logs_dir, j->tag_output ? "true" : "false", j->log_timestamps ? "true" : "false",
            j->console_ranks ? j->console_ranks : "all", j->log_jsonl ? "true" : "false");
    fprintf(f, "checkpoint: {dir: %s}\n", j->checkpoint_dir ? j->checkpoint_dir : "(none)");
    fprintf(f, "stop_grace: %s\n", fmt_duration(d1, sizeof(d1), j->stop_grace_ms));
    fprintf(f, "network: {interface: %s, family: %s}\n", j->net_iface ? j->net_iface : "auto",
            j->net_family == 4   ? "ipv4"
            : j->net_family == 6 ? "ipv6"
                                 : "auto");
    /* a pipeline's stages for the job's ranks (each round has its own: pipeline.auto plans
     * for the nodes it has) */
    struct ddp__pipe_layout pl = {0};
    char **penv = NULL, err[1024];
    if (j->pipe.on && ddp__pipe_layout_job(j, &pl, err, sizeof(err)) == 0) {
        ddp__pipe_layout_print(&j->pipe, &pl, f);
        penv = ddp__pipe_layout_env(&j->pipe, &pl);
    } else if (j->pipe.on) {
        fprintf(f, "pipeline: {}   # %s\n", err);
    }
    char ws[96];
    snprintf(ws, sizeof(ws), j->world_size ? "%d" : "<the nodes' counts added up>", j->world_size);
    fprintf(f, "world_size: %s\n\n# rank map\n%-5s %-20s %-10s %-11s%s\n", ws, "node", "host",
            "local_rank", "global_rank", pl.nstages ? " stage replica" : "");
    int rank = 0;
    bool after_counted = false;
    for (size_t i = 0; i < j->nnodes; i++) {
        after_counted |= !j->nodes[i].slots;
        if (!j->nodes[i].slots)
            fprintf(f,
                    "%-5zu %-20s (a rank per %s it counts; ranks numbered over the nodes in "
                    "order)\n",
                    i, j->nodes[i].host,
                    j->nproc_kind == DDP_NPROC_GPU   ? "GPU"
                    : j->nproc_kind == DDP_NPROC_CPU ? "CPU"
                                                     : "GPU, else per CPU,");
        for (int l = 0; l < j->nodes[i].slots; l++, rank++) {
            char g[16] = "?"; /* after a counted node: known once it has counted */
            if (!after_counted)
                snprintf(g, sizeof(g), "%d", rank);
            fprintf(f, "%-5zu %-20s %-10d %-11s", i, j->nodes[i].host, l, g);
            int st, rep;
            if (pl.nstages) {
                ddp__pipe_layout_rank(&pl, rank, &st, &rep);
                fprintf(f, " %-5d %d", st, rep);
            }
            fprintf(f, "\n");
        }
    }
    ddp__pipe_layout_release(&pl);
    fprintf(f, "\n# environment added to every rank (per-rank values: see the rank map)\n");
    fprintf(
        f,
        "RANK=<global_rank> LOCAL_RANK=<local_rank> GROUP_RANK=<node> ROLE_RANK=<global_rank>\n");
    fprintf(f,
            "WORLD_SIZE=%s ROLE_WORLD_SIZE=%s LOCAL_WORLD_SIZE=<slots of the node> "
            "GROUP_WORLD_SIZE=%zu ROLE_NAME=default\n",
            ws, ws, j->nnodes);
    if (j->torch_store_rank0)
        fprintf(f, "MASTER_ADDR=<node 0's address> MASTER_PORT=<a free port on node 0> "
                   "TORCHELASTIC_USE_AGENT_STORE=False   # rank 0 hosts the TCPStore\n");
    else
        fprintf(f, "MASTER_ADDR=<this machine, as each node reaches the store> "
                   "MASTER_PORT=<the launcher's TCPStore port> "
                   "TORCHELASTIC_USE_AGENT_STORE=True\n");
    fprintf(f,
            "TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=%d TORCHELASTIC_RUN_ID=%s "
            "TORCHELASTIC_ERROR_FILE=/proc/<agent>/fd/<n>\n",
            j->max_restarts, job_id);
    fprintf(f,
            "DDPRUN_JOB_ID=%s DDPRUN_STORE_ADDR=%s DDPRUN_TOKEN_FD=<pipe> "
            "DDPRUN_BACKEND=%s%s%s\n",
            job_id,
            j->rdzv_etcd
                ? "etcd DDPRUN_ETCD_ENDPOINTS=<endpoints> DDPRUN_ETCD_PREFIX=<prefix><job id>/"
                : "<store host:port>",
            j->backend, j->checkpoint_dir ? " DDPRUN_CHECKPOINT_DIR=" : "",
            j->checkpoint_dir ? j->checkpoint_dir : "");
    if (j->bind_to != DDP__BIND_NONE)
        fprintf(f, "DDPRUN_CPU_BIND=%s DDPRUN_CPU_SHARERS=<ranks of the node on these CPUs>\n",
                ddp__cpubind_name(j->bind_to));
    fprintf(f, "NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1   # as torchrun, "
               "unless set\n");
    if (ddp__job_omp_default(j))
        fprintf(f, "OMP_NUM_THREADS=1   # as torchrun: several ranks per node and none set\n");
    bool pystacks = true;
    for (size_t i = 0; i < j->nenv; i++)
        if (strcmp(j->env[i].key, "DDPRUN_PYTHON_STACKS") == 0 && strcmp(j->env[i].value, "0") == 0)
            pystacks = false;
    if (pystacks)
        fprintf(f, "PYTHONPATH=/proc/self/fd/<ddprun's sitecustomize>:<its own>   # ddprun stacks' "
                   "Python tracebacks; a Python rank sees its own (env: DDPRUN_PYTHON_STACKS=0 "
                   "leaves it out)\n");
    for (char **e = penv; e && *e; e++) {
        fprintf(f, "%s ", *e);
        free(*e);
    }
    if (penv)
        fprintf(f, "DDPRUN_PIPELINE_STAGE=<stage> DDPRUN_PIPELINE_REPLICA=<replica>\n");
    free(penv);
    for (size_t i = 0; i < j->nenv; i++)
        fprintf(f, "%s=%s%s", j->env[i].key, j->env[i].value, i + 1 < j->nenv ? " " : "\n");
    /* What the launching shell gives: everything to local ranks, the export rule's share to
     * remote ones. */
    fprintf(f, "\n# from this shell: local nodes' ranks inherit all of its environment; remote "
               "nodes' ranks get the variables the export rule takes (defaults");
    for (size_t k = 0; k < j->nexport; k++)
        fprintf(f, "%s %s", k ? "," : ";", j->export_pats[k]);
    fprintf(f, "), before the env above:\n");
    size_t bytes = 0;
    char **sh = ddp__job_shell_env(j, &bytes);
    for (char **e = sh; e && *e; e++) {
        fprintf(f, "%s\n", *e);
        free(*e);
    }
    free(sh);
    /* The interface the ranks' libraries use (Gloo, NCCL, TensorPipe), unless env sets it. */
    fprintf(f,
            "\n# network interface of each node's ranks: GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, "
            "TP_SOCKET_IFNAME%s (unless env or the node's environment sets them)\n",
            j->net_family ? ", NCCL_SOCKET_FAMILY" : "");
    const char *toward = ddp__job_first_remote(j) ? NULL : "127.0.0.1";
    for (size_t i = 0; i < j->nnodes; i++) {
        char ifname[64];
        if (j->net_iface)
            fprintf(f, "%-20s %s (network.interface)\n", j->nodes[i].host, j->net_iface);
        else if (toward && ddp__route_iface(toward, ifname, sizeof(ifname), NULL, 0) == 0)
            fprintf(f, "%-20s %s (routes to the store at %s)\n", j->nodes[i].host, ifname, toward);
        else
            fprintf(f,
                    "%-20s the interface that routes to the store, chosen on the node (ddprun "
                    "doctor shows it)\n",
                    j->nodes[i].host);
    }
}

bool ddp__job_omp_default(const struct ddp_job *j)
{
    int most = 0;
    for (size_t i = 0; i < j->nnodes; i++) {
        int s = j->nodes[i].slots ? j->nodes[i].slots : 2; /* counted there: more than one */
        most = s > most ? s : most;
    }
    for (size_t i = 0; i < j->nenv; i++)
        if (strcmp(j->env[i].key, "OMP_NUM_THREADS") == 0)
            return false;
    return most > 1 && !getenv("OMP_NUM_THREADS");
}
