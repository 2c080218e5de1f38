/*
 * Job spec loading: the YAML tree of cli/spec/ytree.c (nodes that remember their line and
 * column, or the --set that made them) is walked against the schema, which fills struct
 * ddp_job and reports the first problem as "FILE:LINE:COL: what is wrong (what was expected)".
 */
#include "cli/spec/job.h"
#include "cli/spec/args.h"
#include "cli/sys/cpubind.h"
#include "cli/spec/values.h"
#include "cli/spec/ytree.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/banned.h"

/* ------------------------------------------------------------------ */
/* Schema                                                             */
/* ------------------------------------------------------------------ */

static const char *const top_keys[] = {"name",       "command",        "workdir",  "env",
                                       "nodes",      "nproc_per_node", "backend",  "bind_to",
                                       "rendezvous", "elastic",        "ssh",      "logs",
                                       "checkpoint", "stop_grace",     "network",  "export",
                                       "diagnose",   "launcher",       "pipeline", NULL};
static const char *const elastic_keys[] = {
    "min_nodes", "max_nodes", "max_restarts", "heartbeat_interval", "heartbeat_timeout",
    "cooldown",  NULL};
static const char *const ssh_keys[] = {
    "user", "port", "identity", "known_hosts", "strict_host_key_checking", "remote_ddprun", NULL};
static const char *const logs_keys[] = {"dir",           "tag_output", "timestamps",
                                        "console_ranks", "jsonl",      NULL};
static const char *const ckpt_keys[] = {"dir", NULL};
static const char *const network_keys[] = {"interface", "family", NULL};
static const char *const diag_keys[] = {"hang_after", "on_hang", NULL};

static char *default_name(const char *file)
{
    const char *b = strrchr(file, '/');
    b = b ? b + 1 : file;
    char *n = strdup(b);
    char *dot = n ? strrchr(n, '.') : NULL;
    if (dot && dot != n)
        *dot = '\0';
    return n;
}

static int load_tree(const struct ddp__jctx *c, const struct ddp_ynode *root, const char *basedir,
                     struct ddp_job *j)
{
    const struct ddp_ynode *n, *sub;
    int *slots_given = NULL, rc = -1;

    if (!root) {
        ddp__jv_err(c, NULL, "the job file is empty (it needs at least 'command')");
        return -1;
    }
    if (root->type != DDP_Y_MAP) {
        /* Most often a program given where a job file goes: ddprun train.py. */
        const char *dot = strrchr(c->file, '.');
        bool prog = dot && (!strcmp(dot, ".py") || !strcmp(dot, ".sh") || !strcmp(dot, ".pl"));
        ddp__jv_err(
            c, prog ? NULL : root,
            "%s, not a job file: a job file is a YAML mapping of keys to values (see "
            "ddprun-job(5)); to run a program without one, as torchrun does: ddprun "
            "[--nproc-per-node N] --no-python PROGRAM ARGS... (a .py script: ddprun train.py)",
            prog                      ? "this is a program"
            : root->type == DDP_Y_SEQ ? "this is a YAML list"
                                      : "this is a single value");
        return -1;
    }
    if (ddp__jv_check_keys(c, root, "the job spec", top_keys) < 0)
        return -1;
    if ((n = ddp__ytree_get(root, "name")) && ddp__jv_str(c, n, "name", &j->name) < 0)
        return -1;
    if (!(n = ddp__ytree_get(root, "command"))) {
        ddp__jv_err(c, root,
                    "missing 'command' (the program each rank runs, as a list or a string)");
        return -1;
    }
    if (ddp__job_command(c, n, j) < 0)
        return -1;
    if ((n = ddp__ytree_get(root, "workdir"))) {
        char *w = NULL;
        if (ddp__jv_str(c, n, "workdir", &w) < 0)
            return -1;
        j->workdir = ddp__jv_path(basedir, w);
        free(w);
    } else {
        j->workdir = strdup(basedir);
    }
    if ((n = ddp__ytree_get(root, "env")) && ddp__job_env(c, n, j) < 0)
        return -1;
    if (ddp__job_exec_size(c, root, j) < 0)
        return -1;
    const struct ddp_ynode *per_node = ddp__ytree_get(root, "nproc_per_node");
    bool alloc = false; /* the nodes are the Slurm allocation's */
    if ((n = ddp__ytree_get(root, "nodes")) && n->type == DDP_Y_SCALAR &&
        !strcmp(n->str, "slurm")) {
        if ((alloc = true), ddp__slurm_nodes(c, n, per_node, j, &slots_given) < 0)
            goto out;
    } else if (n) {
        if (ddp__job_nodes(c, n, j, &slots_given) < 0)
            goto out;
    } else if (ddp__slurm_allocated()) { /* inside an allocation: its nodes */
        if ((alloc = true), ddp__slurm_nodes(c, root, per_node, j, &slots_given) < 0)
            goto out;
    } else {
        j->nodes = calloc(1, sizeof(*j->nodes));
        slots_given = calloc(1, sizeof(int));
        j->nodes[0].host = strdup("localhost");
        j->nnodes = 1;
    }
    if (ddp__slurm_launcher(c, ddp__ytree_get(root, "launcher"), alloc, j) < 0)
        goto out;
    int named = 0; /* gpu, cpu, auto */
    if ((n = per_node) && (named = ddp__nproc_named(c, n, j, &j->nproc_per_node)) < 0)
        goto out;
    if (n && !named && ddp__jv_int(c, n, "nproc_per_node", 1, 4096, &j->nproc_per_node) < 0)
        goto out;
    j->world_size = 0;
    bool counted = false; /* some node's slots are counted there */
    for (size_t i = 0; i < j->nnodes; i++) {
        j->nodes[i].slots = slots_given[i] ? slots_given[i] : j->nproc_per_node;
        j->world_size += j->nodes[i].slots;
        j->nodes[i].counted = j->nodes[i].slots == 0;
        counted |= j->nodes[i].counted;
    }
    if (counted)
        j->world_size = 0;
    if ((n = ddp__ytree_get(root, "backend"))) {
        if (ddp__jv_str(c, n, "backend", &j->backend) < 0)
            goto out;
        if (strcmp(j->backend, "cpu") != 0 && strcmp(j->backend, "nccl") != 0) {
            ddp__jv_err(c, n, "backend must be 'cpu' or 'nccl', got '%s'", j->backend);
            goto out;
        }
#ifndef DDP_HAVE_NCCL
        if (strcmp(j->backend, "nccl") == 0) {
            ddp__jv_err(c, n,
                        "backend 'nccl' needs a ddprun built with CUDA and NCCL; this one was not");
            goto out;
        }
#endif
    }
    if ((n = ddp__ytree_get(root, "bind_to"))) {
        char *b = NULL;
        if (ddp__jv_str(c, n, "bind_to", &b) < 0)
            goto out;
        j->bind_to = ddp__cpubind_parse(b);
        if (j->bind_to < 0)
            ddp__jv_err(c, n, "bind_to must be 'none', 'core' or 'numa', got '%s'", b);
        free(b);
        if (j->bind_to < 0)
            goto out;
    }
    if (ddp__job_rdzv(c, ddp__ytree_get(root, "rendezvous"), basedir, j) < 0)
        goto out;
    j->min_nodes = j->max_nodes = (int)j->nnodes;
    if ((sub = ddp__ytree_get(root, "elastic"))) {
        const struct ddp_ynode *mn = ddp__ytree_get(sub, "min_nodes");
        if (ddp__jv_check_keys(c, sub, "elastic", elastic_keys) < 0 ||
            (mn && ddp__jv_int(c, mn, "elastic.min_nodes", 1, 100000, &j->min_nodes) < 0) ||
            ((n = ddp__ytree_get(sub, "max_nodes")) &&
             ddp__jv_int(c, n, "elastic.max_nodes", 1, 100000, &j->max_nodes) < 0) ||
            ((n = ddp__ytree_get(sub, "max_restarts")) &&
             ddp__jv_int(c, n, "elastic.max_restarts", 0, 1000000, &j->max_restarts) < 0) ||
            ((n = ddp__ytree_get(sub, "heartbeat_interval")) &&
             ddp__jv_duration_pos(c, n, "elastic.heartbeat_interval", &j->heartbeat_interval_ms) <
                 0) ||
            ((n = ddp__ytree_get(sub, "heartbeat_timeout")) &&
             ddp__jv_duration_pos(c, n, "elastic.heartbeat_timeout", &j->heartbeat_timeout_ms) <
                 0) ||
            ((n = ddp__ytree_get(sub, "cooldown")) &&
             ddp__jv_duration(c, n, "elastic.cooldown", &j->cooldown_ms) < 0))
            goto out;
        if (j->min_nodes > j->max_nodes) {
            ddp__jv_err(c, mn ? mn : sub, "elastic.min_nodes (%d) is above elastic.max_nodes (%d)",
                        j->min_nodes, j->max_nodes);
            goto out;
        }
        if (j->heartbeat_timeout_ms <= j->heartbeat_interval_ms) {
            ddp__jv_err(c, sub, "elastic.heartbeat_timeout must be longer than heartbeat_interval");
            goto out;
        }
    }
    if (j->max_nodes > (int)j->nnodes) {
        ddp__jv_err(c, ddp__ytree_get(root, "elastic"),
                    "elastic.max_nodes (%d) is above the number of nodes listed (%zu; -H or "
                    "--hostfile list them on a command line)",
                    j->max_nodes, j->nnodes);
        goto out;
    }
    if ((sub = ddp__ytree_get(root, "ssh"))) {
        if (ddp__jv_check_keys(c, sub, "ssh", ssh_keys) < 0 ||
            ((n = ddp__ytree_get(sub, "user")) &&
             ddp__jv_str(c, n, "ssh.user", &j->ssh_user) < 0) ||
            ((n = ddp__ytree_get(sub, "port")) &&
             ddp__jv_int(c, n, "ssh.port", 1, 65535, &j->ssh_port) < 0) ||
            ((n = ddp__ytree_get(sub, "identity")) &&
             ddp__jv_str(c, n, "ssh.identity", &j->ssh_identity) < 0) ||
            ((n = ddp__ytree_get(sub, "known_hosts")) &&
             ddp__jv_str(c, n, "ssh.known_hosts", &j->ssh_known_hosts) < 0) ||
            ((n = ddp__ytree_get(sub, "remote_ddprun")) &&
             ddp__jv_str(c, n, "ssh.remote_ddprun", &j->ssh_remote_ddprun) < 0))
            goto out;
        if ((n = ddp__ytree_get(sub, "strict_host_key_checking"))) {
            if (ddp__jv_scalar(c, n, "ssh.strict_host_key_checking") < 0)
                goto out;
            /* YAML 1.1 reads yes/no as booleans; they are names here. */
            const char *v = n->str;
            if (!strcasecmp(v, "true") || !strcasecmp(v, "on"))
                v = "yes";
            if (!strcasecmp(v, "false") || !strcasecmp(v, "off"))
                v = "no";
            if (strcmp(v, "yes") != 0 && strcmp(v, "no") != 0 && strcmp(v, "accept-new") != 0) {
                ddp__jv_err(c, n,
                            "ssh.strict_host_key_checking must be yes, no or accept-new, got '%s'",
                            n->str);
                goto out;
            }
            free(j->ssh_strict);
            j->ssh_strict = strdup(v);
        }
    }
    char **local_paths[] = {&j->ssh_identity, &j->ssh_known_hosts};
    for (size_t k = 0; k < sizeof(local_paths) / sizeof(local_paths[0]); k++)
        if (*local_paths[k]) {
            char *abs = ddp__jv_path(basedir, *local_paths[k]);
            free(*local_paths[k]);
            *local_paths[k] = abs;
        }
    if ((sub = ddp__ytree_get(root, "logs"))) {
        if (ddp__jv_check_keys(c, sub, "logs", logs_keys) < 0 ||
            ((n = ddp__ytree_get(sub, "dir")) && ddp__jv_str(c, n, "logs.dir", &j->logs_dir) < 0) ||
            ((n = ddp__ytree_get(sub, "tag_output")) &&
             ddp__jv_bool(c, n, "logs.tag_output", &j->tag_output) < 0) ||
            ((n = ddp__ytree_get(sub, "timestamps")) &&
             ddp__jv_bool(c, n, "logs.timestamps", &j->log_timestamps) < 0) ||
            ((n = ddp__ytree_get(sub, "jsonl")) &&
             ddp__jv_bool(c, n, "logs.jsonl", &j->log_jsonl) < 0))
            goto out;
        if ((n = ddp__ytree_get(sub, "console_ranks"))) {
            if (ddp__jv_str(c, n, "logs.console_ranks", &j->console_ranks) < 0)
                goto out;
            if (!ddp__jv_rank_list_ok(j->console_ranks)) {
                ddp__jv_err(
                    c, n,
                    "logs.console_ranks must be 'all' or ranks and ranges such as 0 or 0,4-7, "
                    "got '%s'",
                    j->console_ranks);
                goto out;
            }
            if (strcmp(j->console_ranks, "all") == 0) {
                free(j->console_ranks);
                j->console_ranks = NULL;
            }
        }
    }
    if ((sub = ddp__ytree_get(root, "checkpoint"))) {
        char *d = NULL;
        if (ddp__jv_check_keys(c, sub, "checkpoint", ckpt_keys) < 0)
            goto out;
        if ((n = ddp__ytree_get(sub, "dir"))) {
            if (ddp__jv_str(c, n, "checkpoint.dir", &d) < 0)
                goto out;
            j->checkpoint_dir = ddp__jv_path(basedir, d);
            free(d);
        }
    }
    char *ld = ddp__jv_path(basedir, j->logs_dir);
    free(j->logs_dir);
    j->logs_dir = ld;
    if ((sub = ddp__ytree_get(root, "export"))) {
        if (sub->type != DDP_Y_SEQ) {
            ddp__jv_err(c, sub,
                        "export must be a list of variable names or patterns (NCCL_*, "
                        "-PATH)");
            goto out;
        }
        if (!(j->export_pats = calloc(sub->n + 1, sizeof(char *))))
            goto out;
        for (size_t k = 0; k < sub->n; k++) {
            const struct ddp_ynode *e = sub->kids[k];
            if (ddp__jv_str(c, e, "an export entry", &j->export_pats[k]) < 0)
                goto out;
            j->nexport = k + 1;
            const char *p = j->export_pats[k] + (j->export_pats[k][0] == '-');
            bool ok = *p != '\0';
            for (; *p && ok; p++)
                ok = isalnum((unsigned char)*p) || *p == '_' || *p == '*' || *p == '?';
            if (!ok) {
                ddp__jv_err(c, e,
                            "export: '%s' is not a variable name or pattern (letters, digits, _, "
                            "* and ?; a leading - removes)",
                            j->export_pats[k]);
                goto out;
            }
        }
    }
    if ((sub = ddp__ytree_get(root, "network"))) {
        if (ddp__jv_check_keys(c, sub, "network", network_keys) < 0)
            goto out;
        if ((n = ddp__ytree_get(sub, "interface"))) {
            if (ddp__jv_str(c, n, "network.interface", &j->net_iface) < 0)
                goto out;
            if (strcmp(j->net_iface, "auto") == 0) {
                free(j->net_iface);
                for (size_t k = 0; k < j->nexport; k++)
                    free(j->export_pats[k]);
                free(j->export_pats);
                j->net_iface = NULL;
            } else if (strlen(j->net_iface) >= 16 || strpbrk(j->net_iface, " /,:")) {
                ddp__jv_err(c, n,
                            "network.interface must be 'auto' or an interface name such as eth0 "
                            "(at most 15 characters), got '%s'",
                            j->net_iface);
                goto out;
            }
        }
        if ((n = ddp__ytree_get(sub, "family"))) {
            if (ddp__jv_scalar(c, n, "network.family") < 0)
                goto out;
            if (!strcmp(n->str, "auto"))
                j->net_family = 0;
            else if (!strcmp(n->str, "ipv4"))
                j->net_family = 4;
            else if (!strcmp(n->str, "ipv6"))
                j->net_family = 6;
            else {
                ddp__jv_err(c, n, "network.family must be auto, ipv4 or ipv6, got '%s'", n->str);
                goto out;
            }
        }
    }
    if ((n = ddp__ytree_get(root, "stop_grace")) &&
        ddp__jv_duration(c, n, "stop_grace", &j->stop_grace_ms) < 0)
        goto out;
    if ((sub = ddp__ytree_get(root, "diagnose")) &&
        (ddp__jv_check_keys(c, sub, "diagnose", diag_keys) < 0 ||
         ((n = ddp__ytree_get(sub, "hang_after")) &&
          ddp__jv_duration(c, n, "diagnose.hang_after", &j->hang_after_ms) < 0) ||
         ((n = ddp__ytree_get(sub, "on_hang")) &&
          ddp__jv_enum(c, n, "diagnose.on_hang", "wait", "fail", &j->hang_fail) < 0)))
        goto out;
    if ((sub = ddp__ytree_get(root, "pipeline")) && j->world_size == 0) {
        ddp__jv_err(c, per_node,
                    "nproc_per_node: %s is counted on each node when its agent starts, and a "
                    "pipeline's stages need the ranks of every node: give the number of ranks "
                    "per node",
                    per_node->str);
        goto out;
    }
    if (sub && ddp__job_pipeline(c, sub, basedir, j) < 0)
        goto out;
    bool all_local = true;
    for (size_t i = 0; i < j->nnodes; i++)
        all_local &= ddp__job_host_is_local(j->nodes[i].host);
    if (all_local) {
        struct stat st;
        n = ddp__ytree_get(root, "workdir");
        if (stat(j->workdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            ddp__jv_err(c, n, "workdir '%s' is not a folder", j->workdir);
            goto out;
        }
    }
    rc = 0;
out:
    free(slots_given);
    return rc;
}

/*
 * Before a --set below nodes (nodes.0.slots=4): the list it addresses must exist in its long
 * form. A job without nodes gets the default list, [{host: localhost}], and a node given as
 * a bare host name becomes {host: NAME}, so the set adds a key beside it.
 */
static int expand_nodes(struct ddp_ynode **root, const char *origin)
{
    struct ddp_ynode *list =
        *root && (*root)->type == DDP_Y_MAP ? ddp__ytree_get(*root, "nodes") : NULL;
    if (*root && (*root)->type != DDP_Y_MAP)
        return 0; /* the schema walk says what is wrong with it */
    if (!list) {
        if (ddp__ytree_apply_set("--set", root, "nodes=[localhost]", origin) < 0)
            return -1;
        list = ddp__ytree_get(*root, "nodes");
    }
    if (list->type != DDP_Y_SEQ)
        return 0;
    for (size_t i = 0; i < list->n; i++) {
        struct ddp_ynode *e = list->kids[i];
        if (e->type != DDP_Y_SCALAR)
            continue;
        struct ddp_ynode *m = ddp__ytree_new(DDP_Y_MAP, e->line, e->col, e->origin);
        struct ddp_ynode *k = ddp__ytree_new(DDP_Y_SCALAR, e->line, e->col, e->origin);
        if (!m || !k || !(k->str = strdup("host")) || ddp__ytree_add(m, k) < 0) {
            ddp__ytree_free(k);
            ddp__ytree_free(m);
            ddp__cli_error("out of memory");
            return -1;
        }
        if (ddp__ytree_add(m, e) < 0) {
            ddp__ytree_free(m);
            ddp__cli_error("out of memory");
            return -1;
        }
        list->kids[i] = m;
    }
    return 0;
}

static void set_defaults(struct ddp_job *j)
{
    j->nproc_per_node = 1;
    j->backend = strdup("cpu");
    j->rdzv_listen = strdup("auto");
    j->rdzv_timeout_ms = 60000;
    j->heartbeat_interval_ms = 1000;
    j->heartbeat_timeout_ms = 5000;
    j->rdzv_last_call_ms = 2000;
    j->cooldown_ms = 60000;
    j->ssh_port = 22;
    j->ssh_strict = strdup("yes");
    j->logs_dir = strdup("ddprun-logs");
    j->tag_output = true;
    j->stop_grace_ms = 10000;
    j->hang_after_ms = 120000;
}

static int load(const char *file, const char *basedir, const char *text, size_t len,
                const char *const *sets, const char *const *labels, size_t nsets,
                struct ddp_job **out)
{
    struct ddp__jctx c = {.file = file};
    struct ddp_ynode *root = NULL;
    char **origins = NULL;
    struct ddp_job *j = calloc(1, sizeof(*j));
    int rc = -1;
    if (!j)
        return -1;
    set_defaults(j);
    j->file = strdup(file);
    if (ddp__ytree_parse(file, text, len, NULL, &root) < 0)
        goto out;
    if (nsets && !(origins = calloc(nsets, sizeof(char *))))
        goto out;
    for (size_t i = 0; i < nsets; i++) {
        size_t n = strlen(sets[i]) + 8;
        if (labels && labels[i])
            n = strlen(labels[i]) + 1;
        if (!(origins[i] = malloc(n)))
            goto out;
        if (labels && labels[i])
            snprintf(origins[i], n, "%s", labels[i]);
        else
            snprintf(origins[i], n, "--set %s", sets[i]);
        if (strncmp(sets[i], "nodes.", 6) == 0 && expand_nodes(&root, origins[i]) < 0)
            goto out;
        if (ddp__ytree_apply_set(file, &root, sets[i], origins[i]) < 0)
            goto out;
    }
    if (load_tree(&c, root, basedir, j) < 0)
        goto out;
    if (nsets && !(j->overrides = calloc(nsets, sizeof(char *))))
        goto out;
    for (size_t i = 0; i < nsets; i++) {
        if (!(j->overrides[i] = strdup(origins[i])))
            goto out;
        j->noverrides = i + 1;
    }
    if (!j->name)
        j->name = default_name(file);
    *out = j;
    j = NULL;
    rc = 0;
out:
    ddp__ytree_free(root);
    for (size_t i = 0; origins && i < nsets; i++)
        free(origins[i]);
    free(origins);
    ddp__job_free(j);
    return rc;
}

int ddp__job_load(const char *path, const char *const *sets, const char *const *labels,
                  size_t nsets, struct ddp_job **out)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        ddp__cli_error("%s: is a folder, not a job file", path);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        ddp__cli_error("%s: cannot read the job file: %s", path, strerror(errno));
        return -1;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            char *t = realloc(text, cap = cap ? cap * 2 : 8192);
            if (!t) {
                free(text);
                fclose(f);
                return -1;
            }
            text = t;
        }
        size_t r = fread(text + len, 1, cap - len, f);
        len += r;
        if (r == 0)
            break;
        if (len > (16u << 20)) {
            ddp__cli_error("%s: the job file is larger than 16 MiB", path);
            free(text);
            fclose(f);
            return -1;
        }
    }
    bool rerr = ferror(f);
    fclose(f);
    if (rerr) {
        ddp__cli_error("%s: cannot read the job file", path);
        free(text);
        return -1;
    }
    char base[PATH_MAX], *rp = realpath(path, NULL);
    if (!rp) {
        ddp__cli_error("%s: cannot resolve the job file's path: %s", path, strerror(errno));
        free(text);
        return -1;
    }
    snprintf(base, sizeof(base), "%s", rp);
    char *slash = strrchr(base, '/');
    if (slash && slash != base)
        *slash = '\0';
    free(rp);
    int rc = load(path, base, text, len, sets, labels, nsets, out);
    free(text);
    return rc;
}

int ddp__job_load_string(const char *name, const char *yaml, const char *const *sets,
                         const char *const *labels, size_t nsets, struct ddp_job **out)
{
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof(cwd)))
        snprintf(cwd, sizeof(cwd), "/");
    return load(name, cwd, yaml, strlen(yaml), sets, labels, nsets, out);
}

int ddp__job_load_default(const char *const *sets, const char *const *labels, size_t nsets,
                          struct ddp_job **out)
{
    char self[PATH_MAX], trainer[PATH_MAX + 32], yaml[2 * PATH_MAX + 256];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        ddp__cli_error("cannot find the ddprun executable: %s", strerror(errno));
        return -1;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    snprintf(trainer, sizeof(trainer), "%.*s/ddprun-fmnist", slash ? (int)(slash - self) : 1,
             slash ? self : ".");
    if (access(trainer, X_OK) == 0)
        snprintf(yaml, sizeof(yaml),
                 "name: default\n"
                 "command: ['%s', --epochs, '3']\n"
                 "nproc_per_node: 2\n"
                 "stop_grace: 5s\n",
                 trainer);
    else
        snprintf(yaml, sizeof(yaml),
                 "name: default\n"
                 "command: ['%s', __smoke-worker]\n"
                 "nproc_per_node: 2\n"
                 "stop_grace: 5s\n",
                 self);
    return ddp__job_load_string("<default job>", yaml, sets, labels, nsets, out);
}

void ddp__job_free(struct ddp_job *j)
{
    if (!j)
        return;
    ddp__job_pipeline_free(&j->pipe);
    if (j->argv)
        for (char **a = j->argv; *a; a++)
            free(*a);
    free(j->argv);
    for (size_t i = 0; i < j->nenv; i++) {
        free(j->env[i].key);
        free(j->env[i].value);
    }
    free(j->env);
    for (size_t i = 0; i < j->nnodes; i++)
        free(j->nodes[i].host);
    free(j->nodes);
    free(j->file);
    free(j->name);
    free(j->shell);
    free(j->workdir);
    free(j->backend);
    free(j->rdzv_listen);
    for (size_t k = 0; k < j->netcd; k++)
        free(j->etcd_endpoints[k]);
    free(j->etcd_endpoints);
    free(j->etcd_prefix);
    free(j->etcd_ca);
    free(j->etcd_cert);
    free(j->etcd_key);
    free(j->ssh_user);
    free(j->ssh_identity);
    free(j->ssh_known_hosts);
    free(j->ssh_strict);
    free(j->ssh_remote_ddprun);
    free(j->logs_dir);
    free(j->checkpoint_dir);
    free(j->net_iface);
    for (size_t k = 0; k < j->nexport; k++)
        free(j->export_pats[k]);
    free(j->export_pats);
    free(j->console_ranks);
    for (size_t i = 0; i < j->noverrides; i++)
        free(j->overrides[i]);
    free(j->overrides);
    free(j);
}
