/* `ddprun plan`'s view of a job (the resolved spec, rank map and environment), also kept as
 * the job's spec.yaml, and the rank environment's OMP_NUM_THREADS rule. */
#include "cli/sys/sys.h"
#include "cli/sys/cpubind.h"
#include "cli/spec/job.h"
#include "cli/spec/keys.h"
#include "cli/spec/pipe_layout.h"

#include <arpa/inet.h>
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

/* A value of the table's kinds as plan shows it. */
static void print_val(FILE *f, const struct ddp_job *j, int id)
{
    const struct ddp__key *k = &ddp__keys[id];
    const void *p = (const char *)j + k->off;
    char d[32];
    switch (k->kind) {
    case DDP_KK_STR:
    case DDP_KK_PATH_: {
        const char *v = *(char *const *)p;
        fputs(v ? v : k->unset ? k->unset : "(none)", f);
        break;
    }
    case DDP_KK_INT:
        fprintf(f, "%d", *(const int *)p);
        break;
    case DDP_KK_BOOL:
        fputs(*(const bool *)p ? "true" : "false", f);
        break;
    case DDP_KK_DUR:
    case DDP_KK_DUR_POS:
        fputs(fmt_duration(d, sizeof(d), *(const int64_t *)p), f);
        break;
    case DDP_KK_SECT:
    case DDP_KK_CUSTOM:
        break;
    }
}

/* Whether key id of a section is shown for this job (what belongs to the other rendezvous
 * backend is not). */
static bool shown(const struct ddp_job *j, int id)
{
    switch (id) {
    case DDP_K_RDZV_ENDPOINTS:
    case DDP_K_RDZV_PREFIX:
    case DDP_K_RDZV_TAKEOVER_TIMEOUT:
        return j->rdzv_etcd;
    case DDP_K_RDZV_TLS:
        return j->rdzv_etcd && (j->etcd_ca || j->etcd_cert);
    case DDP_K_RDZV_LISTEN:
    case DDP_K_RDZV_PORT:
        return !j->rdzv_etcd;
    default:
        return true;
    }
}

/* The value of a key its section's code reads (a key in a section: the value alone). */
static void print_custom_val(FILE *f, const struct ddp_job *j, int id)
{
    char d[32];
    switch (id) {
    case DDP_K_RDZV_BACKEND:
        fputs(j->rdzv_etcd ? "etcd" : DDP_KEY_DEFAULT(RDZV_BACKEND), f);
        break;
    case DDP_K_RDZV_ENDPOINTS:
        fputc('[', f);
        for (size_t k = 0; k < j->netcd; k++)
            fprintf(f, "%s%s", k ? ", " : "", j->etcd_endpoints[k]);
        fputc(']', f);
        break;
    case DDP_K_RDZV_PREFIX:
        fputs(j->etcd_prefix, f);
        break;
    case DDP_K_RDZV_TAKEOVER_TIMEOUT:
        fputs(fmt_duration(d, sizeof(d), j->takeover_ms), f);
        break;
    case DDP_K_RDZV_TORCH_STORE:
        fputs(j->torch_store_rank0 ? "rank0" : DDP_KEY_DEFAULT(RDZV_TORCH_STORE), f);
        break;
    case DDP_K_SSH_STRICT_HOST_KEY_CHECKING:
        fputs(j->ssh_strict, f);
        break;
    case DDP_K_LOGS_CONSOLE_RANKS:
        fputs(j->console_ranks ? j->console_ranks : DDP_KEY_DEFAULT(LOGS_CONSOLE_RANKS), f);
        break;
    case DDP_K_NETWORK_INTERFACE:
        fputs(j->net_iface ? j->net_iface : DDP_KEY_DEFAULT(NETWORK_INTERFACE), f);
        break;
    case DDP_K_NETWORK_FAMILY:
        fputs(j->net_family == 4   ? "ipv4"
              : j->net_family == 6 ? "ipv6"
                                   : DDP_KEY_DEFAULT(NETWORK_FAMILY),
              f);
        break;
    case DDP_K_CHECKPOINT_ON_CORRUPT:
        fputs(j->ckpt_restart ? "restart" : DDP_KEY_DEFAULT(CHECKPOINT_ON_CORRUPT), f);
        break;
    case DDP_K_METRICS_ALLOW:
        fputc('[', f);
        for (int k = 0; k < j->nmetrics_allow; k++) {
            char a[64];
            const struct ddp__cidr *r = &j->metrics_allow[k];
            inet_ntop(r->family, r->addr, a, sizeof(a));
            fprintf(f, "%s%s/%d", k ? ", " : "", a, r->bits);
        }
        fputc(']', f);
        break;
    case DDP_K_DIAGNOSE_ON_HANG:
        fputs(j->hang_fail ? "fail" : DDP_KEY_DEFAULT(DIAGNOSE_ON_HANG), f);
        break;
    case DDP_K_BACKEND:
        fputs(j->backend, f);
        break;
    case DDP_K_BIND_TO:
        fputs(ddp__cpubind_name(j->bind_to), f);
        break;
    case DDP_K_WORKDIR:
        fputs(j->workdir, f);
        break;
    case DDP_K_LAUNCHER:
        fputs(j->external ? "external" : j->srun ? "srun" : "ssh", f);
        if (j->external) /* what each node runs: the token file's path, never the token */
            fprintf(f, "   # each node runs: ddprun agent --join %s%s%s:%d --token-file %s",
                    strchr(j->rdzv_listen, ':') ? "[" : "",
                    strcmp(j->rdzv_listen, "0.0.0.0") && strcmp(j->rdzv_listen, "::")
                        ? j->rdzv_listen
                        : "<this machine's address>",
                    strchr(j->rdzv_listen, ':') ? "]" : "", j->rdzv_port, j->token_file);
        break;
    case DDP_K_EXPORT:
        fputc('[', f);
        for (size_t k = 0; k < j->nexport; k++)
            fprintf(f, "%s%s", k ? ", " : "", j->export_pats[k]);
        fputc(']', f);
        break;
    default:
        fputs("(see ddprun-job(5))", f); /* a custom key plan does not know yet */
        break;
    }
}

static void print_key_val(FILE *f, const struct ddp_job *j, int id)
{
    if (ddp__keys[id].kind == DDP_KK_CUSTOM)
        print_custom_val(f, j, id);
    else
        print_val(f, j, id);
}

/* A section as a flow mapping: "name: {key: value, ...}" (a section inside one nested). */
static void print_section(FILE *f, const struct ddp_job *j, int sect)
{
    fprintf(f, "%s: {", ddp__key_name(sect));
    bool first = true;
    for (int k = 0; k < DDP_K__COUNT; k++) {
        if (ddp__key_parent(k) != sect || !shown(j, k))
            continue;
        fputs(first ? "" : ", ", f);
        first = false;
        if (ddp__keys[k].kind == DDP_KK_SECT) {
            print_section(f, j, k);
            continue;
        }
        fprintf(f, "%s: ", ddp__key_name(k));
        print_key_val(f, j, k);
    }
    fputc('}', f);
}

/* A top-level key whose lines are its own (a list, a mapping, a comment after the value);
 * false for the others. */
static bool print_top_custom(FILE *f, const struct ddp_job *j, int id)
{
    const char *kind = ddp__nproc_kind_name(j->nproc_kind);
    switch (id) {
    case DDP_K_COMMAND:
        fprintf(f, "%s: ", DDP_KEY(COMMAND));
        if (j->shell) {
            fprintf(f, "%s   # run by /bin/sh -c\n", j->shell);
        } else {
            fprintf(f, "[");
            for (char **a = j->argv; *a; a++)
                fprintf(f, "%s%s", a == j->argv ? "" : ", ", *a);
            fprintf(f, "]\n");
        }
        return true;
    case DDP_K_ENV:
        fprintf(f, "%s:%s\n", DDP_KEY(ENV), j->nenv ? "" : " {}");
        for (size_t i = 0; i < j->nenv; i++)
            fprintf(f, "  %s: %s\n", j->env[i].key, j->env[i].value);
        return true;
    case DDP_K_NODES:
        fprintf(f, "%s:\n", DDP_KEY(NODES));
        int *ups = calloc(j->nnodes + 1, sizeof(*ups)); /* the SSH tree (ssh.fanout) */
        if (ups && ddp__job_ssh_tree(j, ups) < 0) {
            free(ups);
            ups = NULL;
        }
        for (size_t i = 0; i < j->nnodes; i++) {
            int up = ups ? ups[i] : -1;
            if (j->nodes[i].slots)
                fprintf(f, "  - {%s: %s, %s: %d}", ddp__key_name(DDP_K_NODES_HOST),
                        j->nodes[i].host, ddp__key_name(DDP_K_NODES_SLOTS), j->nodes[i].slots);
            else
                fprintf(f, "  - {%s: %s, %s: %s}", ddp__key_name(DDP_K_NODES_HOST),
                        j->nodes[i].host, ddp__key_name(DDP_K_NODES_SLOTS), kind);
            if (!j->nodes[i].slots || up >= 0)
                fprintf(f, "   #");
            if (!j->nodes[i].slots)
                fprintf(f, " counted there by its agent%s", up >= 0 ? ";" : "");
            if (up >= 0)
                fprintf(f, " started over SSH by the agent on %s", j->nodes[up].host);
            fputc('\n', f);
        }
        free(ups);
        return true;
    case DDP_K_WARM:
        if (j->warm_off) {
            fprintf(f, "%s: off\n", DDP_KEY(WARM));
            return true;
        }
        fprintf(f, "%s: {%s: [", DDP_KEY(WARM), ddp__key_name(DDP_K_WARM_IMPORTS));
        for (char **m = j->warm_imports; m && *m; m++)
            fprintf(f, "%s%s", m == j->warm_imports ? "" : ", ", *m);
        fprintf(f, "%s]}   # Python ranks restart from warm interpreters\n",
                j->warm_imports ? "" : "torch");
        return true;
    case DDP_K_NPROC_PER_NODE:
        if (j->nproc_kind)
            fprintf(f, "%s: %s   # %s\n", DDP_KEY(NPROC_PER_NODE), kind,
                    j->world_size ? "every node gives slots of its own"
                                  : "counted on each node by its agent, as torchrun counts");
        else
            fprintf(f, "%s: %d\n", DDP_KEY(NPROC_PER_NODE), j->nproc_per_node);
        return true;
    default:
        return false;
    }
}

void ddp__job_print_plan(const struct ddp_job *j, const char *job_id, FILE *f)
{
    fprintf(f, "# ddprun plan for %s (job id %s)\n", j->file, job_id);
    /* every key of the table, in its order (cli/spec/keys.def); the pipeline's after them */
    for (int k = 0; k < DDP_K__COUNT; k++) {
        if (ddp__key_parent(k) != DDP_K_TOP || k == DDP_K_PIPELINE || print_top_custom(f, j, k))
            continue;
        if (ddp__keys[k].kind == DDP_KK_SECT) {
            print_section(f, j, k);
        } else {
            fprintf(f, "%s: ", ddp__key_name(k));
            print_key_val(f, j, k);
        }
        fputc('\n', f);
    }
    /* a pipeline's stages for the job's ranks (each round has its own: pipeline.auto plans
     * for the nodes it has) */
    struct ddp__pipe_layout pl = {0};
    char **penv = NULL, err[1024];
    if (j->pipe.on && ddp__pipe_layout_job(j, &pl, err, sizeof(err)) == 0) {
        ddp__pipe_layout_print(&j->pipe, &pl, f);
        penv = ddp__pipe_layout_env(&j->pipe, &pl);
    } else if (j->pipe.on) {
        fprintf(f, "%s: {}   # %s\n", DDP_KEY(PIPELINE), err);
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
        fprintf(f, "MASTER_ADDR=<the node's address toward the store> "
                   "MASTER_PORT=<its agent's TCPStore port, which relays to the launcher's> "
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
            fprintf(f, "%-20s %s (%s)\n", j->nodes[i].host, j->net_iface,
                    DDP_KEY(NETWORK_INTERFACE));
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
