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
#include "cli/spec/keys.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/banned.h"

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
        ddp__jv_err(c, NULL, "the job file is empty (it needs at least '%s')", DDP_KEY(COMMAND));
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
    if (ddp__key_check(c, root, DDP_K_TOP) < 0)
        return -1;
    if ((n = ddp__key_get(root, DDP_K_NAME)) && ddp__key_read(c, n, DDP_K_NAME, j) < 0)
        return -1;
    if (!(n = ddp__key_get(root, DDP_K_COMMAND))) {
        ddp__jv_err(c, root, "missing '%s' (the program each rank runs, as a list or a string)",
                    DDP_KEY(COMMAND));
        return -1;
    }
    if (ddp__job_command(c, n, j) < 0)
        return -1;
    if ((n = ddp__key_get(root, DDP_K_WORKDIR))) {
        char *w = NULL;
        if (ddp__jv_str(c, n, DDP_KEY(WORKDIR), &w) < 0)
            return -1;
        j->workdir = ddp__jv_path(basedir, w);
        free(w);
    } else {
        j->workdir = strdup(basedir);
    }
    if ((n = ddp__key_get(root, DDP_K_ENV)) && ddp__job_env(c, n, j) < 0)
        return -1;
    if (ddp__job_exec_size(c, root, j) < 0)
        return -1;
    const struct ddp_ynode *per_node = ddp__key_get(root, DDP_K_NPROC_PER_NODE);
    bool alloc = false; /* the nodes are the Slurm allocation's */
    const struct ddp_ynode *ln = ddp__key_get(root, DDP_K_LAUNCHER);
    if (ln && ln->type == DDP_Y_SCALAR && !strcmp(ln->str, "external")) {
        if (ddp__job_external_slots(c, ddp__key_get(root, DDP_K_NODES), ln, j, &slots_given) < 0)
            goto out;
    } else if ((n = ddp__key_get(root, DDP_K_NODES)) && n->type == DDP_Y_SCALAR &&
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
    if (ddp__slurm_launcher(c, ddp__key_get(root, DDP_K_LAUNCHER), alloc, j) < 0)
        goto out;
    int named = 0; /* gpu, cpu, auto */
    if ((n = per_node) && (named = ddp__nproc_named(c, n, j, &j->nproc_per_node)) < 0)
        goto out;
    if (n && !named && ddp__jv_int(c, n, DDP_KEY(NPROC_PER_NODE), 1, 4096, &j->nproc_per_node) < 0)
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
    if ((n = ddp__key_get(root, DDP_K_BACKEND))) {
        if (ddp__jv_str(c, n, DDP_KEY(BACKEND), &j->backend) < 0)
            goto out;
        if (strcmp(j->backend, "cpu") != 0 && strcmp(j->backend, "nccl") != 0) {
            ddp__jv_err(c, n, "%s must be 'cpu' or 'nccl', got '%s'", DDP_KEY(BACKEND), j->backend);
            goto out;
        }
#ifndef DDP_HAVE_NCCL
        if (strcmp(j->backend, "nccl") == 0) {
            ddp__jv_err(c, n, "%s 'nccl' needs a ddprun built with CUDA and NCCL; this one was not",
                        DDP_KEY(BACKEND));
            goto out;
        }
#endif
    }
    if ((n = ddp__key_get(root, DDP_K_BIND_TO))) {
        char *b = NULL;
        if (ddp__jv_str(c, n, DDP_KEY(BIND_TO), &b) < 0)
            goto out;
        j->bind_to = ddp__cpubind_parse(b);
        if (j->bind_to < 0)
            ddp__jv_err(c, n, "%s must be 'none', 'core' or 'numa', got '%s'", DDP_KEY(BIND_TO), b);
        free(b);
        if (j->bind_to < 0)
            goto out;
    }
    if (ddp__job_rdzv(c, ddp__key_get(root, DDP_K_RDZV), j, ddp__key_get(root, DDP_K_LAUNCHER)) < 0)
        goto out;
    j->min_nodes = j->max_nodes = (int)j->nnodes;
    if ((sub = ddp__key_get(root, DDP_K_ELASTIC))) {
        const struct ddp_ynode *mn = ddp__key_get(sub, DDP_K_ELASTIC_MIN_NODES);
        if (ddp__key_check(c, sub, DDP_K_ELASTIC) < 0 ||
            ddp__key_read_section(c, sub, DDP_K_ELASTIC, j) < 0)
            goto out;
        if (j->min_nodes > j->max_nodes) {
            ddp__jv_err(c, mn ? mn : sub, "%s (%d) is above %s (%d)", DDP_KEY(ELASTIC_MIN_NODES),
                        j->min_nodes, DDP_KEY(ELASTIC_MAX_NODES), j->max_nodes);
            goto out;
        }
        if (j->heartbeat_timeout_ms <= j->heartbeat_interval_ms) {
            ddp__jv_err(c, sub, "%s must be longer than %s", DDP_KEY(ELASTIC_HEARTBEAT_TIMEOUT),
                        ddp__key_name(DDP_K_ELASTIC_HEARTBEAT_INTERVAL));
            goto out;
        }
    }
    if (j->max_nodes > (int)j->nnodes) {
        ddp__jv_err(c, ddp__key_get(root, DDP_K_ELASTIC),
                    "%s (%d) is above the number of nodes listed (%zu; -H or "
                    "--hostfile list them on a command line)",
                    DDP_KEY(ELASTIC_MAX_NODES), j->max_nodes, j->nnodes);
        goto out;
    }
    if ((sub = ddp__key_get(root, DDP_K_SSH))) {
        if (ddp__key_check(c, sub, DDP_K_SSH) < 0 ||
            ddp__key_read_section(c, sub, DDP_K_SSH, j) < 0)
            goto out;
        if ((n = ddp__key_get(sub, DDP_K_SSH_STRICT_HOST_KEY_CHECKING))) {
            if (ddp__jv_scalar(c, n, DDP_KEY(SSH_STRICT_HOST_KEY_CHECKING)) < 0)
                goto out;
            /* YAML 1.1 reads yes/no as booleans; they are names here. */
            const char *v = n->str;
            if (!strcasecmp(v, "true") || !strcasecmp(v, "on"))
                v = "yes";
            if (!strcasecmp(v, "false") || !strcasecmp(v, "off"))
                v = "no";
            if (strcmp(v, "yes") != 0 && strcmp(v, "no") != 0 && strcmp(v, "accept-new") != 0) {
                ddp__jv_err(c, n, "%s must be yes, no or accept-new, got '%s'",
                            DDP_KEY(SSH_STRICT_HOST_KEY_CHECKING), n->str);
                goto out;
            }
            free(j->ssh_strict);
            j->ssh_strict = strdup(v);
        }
    }
    if ((sub = ddp__key_get(root, DDP_K_LOGS))) {
        if (ddp__key_check(c, sub, DDP_K_LOGS) < 0 ||
            ddp__key_read_section(c, sub, DDP_K_LOGS, j) < 0)
            goto out;
        if ((n = ddp__key_get(sub, DDP_K_LOGS_CONSOLE_RANKS))) {
            if (ddp__jv_str(c, n, DDP_KEY(LOGS_CONSOLE_RANKS), &j->console_ranks) < 0)
                goto out;
            if (!ddp__jv_rank_list_ok(j->console_ranks)) {
                ddp__jv_err(c, n,
                            "%s must be 'all' or ranks and ranges such as 0 or 0,4-7, got '%s'",
                            DDP_KEY(LOGS_CONSOLE_RANKS), j->console_ranks);
                goto out;
            }
            if (strcmp(j->console_ranks, "all") == 0) {
                free(j->console_ranks);
                j->console_ranks = NULL;
            }
        }
    }
    if ((sub = ddp__key_get(root, DDP_K_CHECKPOINT)) &&
        (ddp__key_check(c, sub, DDP_K_CHECKPOINT) < 0 ||
         ddp__key_read_section(c, sub, DDP_K_CHECKPOINT, j) < 0 ||
         ((n = ddp__key_get(sub, DDP_K_CHECKPOINT_ON_CORRUPT)) &&
          ddp__jv_enum(c, n, DDP_KEY(CHECKPOINT_ON_CORRUPT), "fail", "restart", &j->ckpt_restart) <
              0)))
        goto out;
    if (j->ckpt_replicas > 0 && !j->checkpoint_dir) {
        ddp__jv_err(c, ddp__key_get(sub, DDP_K_CHECKPOINT_REPLICAS), "%s needs %s",
                    DDP_KEY(CHECKPOINT_REPLICAS), DDP_KEY(CHECKPOINT_DIR));
        goto out;
    }
    if ((sub = ddp__key_get(root, DDP_K_WARM)) && ddp__job_warm(c, sub, j) < 0)
        goto out;
    if ((sub = ddp__key_get(root, DDP_K_METRICS)) && ddp__job_metrics(c, sub, j) < 0)
        goto out;
    if ((sub = ddp__key_get(root, DDP_K_EXPORT))) {
        if (sub->type != DDP_Y_SEQ) {
            ddp__jv_err(c, sub, "%s must be a list of variable names or patterns (NCCL_*, -PATH)",
                        DDP_KEY(EXPORT));
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
                            "%s: '%s' is not a variable name or pattern (letters, digits, _, "
                            "* and ?; a leading - removes)",
                            DDP_KEY(EXPORT), j->export_pats[k]);
                goto out;
            }
        }
    }
    if ((sub = ddp__key_get(root, DDP_K_NETWORK))) {
        if (ddp__key_check(c, sub, DDP_K_NETWORK) < 0)
            goto out;
        if ((n = ddp__key_get(sub, DDP_K_NETWORK_INTERFACE))) {
            if (ddp__jv_str(c, n, DDP_KEY(NETWORK_INTERFACE), &j->net_iface) < 0)
                goto out;
            if (strcmp(j->net_iface, "auto") == 0) {
                free(j->net_iface);
                for (size_t k = 0; k < j->nexport; k++)
                    free(j->export_pats[k]);
                free(j->export_pats);
                j->net_iface = NULL;
            } else if (strlen(j->net_iface) >= 16 || strpbrk(j->net_iface, " /,:")) {
                ddp__jv_err(c, n,
                            "%s must be 'auto' or an interface name such as eth0 (at most 15 "
                            "characters), got '%s'",
                            DDP_KEY(NETWORK_INTERFACE), j->net_iface);
                goto out;
            }
        }
        if ((n = ddp__key_get(sub, DDP_K_NETWORK_FAMILY))) {
            if (ddp__jv_scalar(c, n, DDP_KEY(NETWORK_FAMILY)) < 0)
                goto out;
            if (!strcmp(n->str, "auto"))
                j->net_family = 0;
            else if (!strcmp(n->str, "ipv4"))
                j->net_family = 4;
            else if (!strcmp(n->str, "ipv6"))
                j->net_family = 6;
            else {
                ddp__jv_err(c, n, "%s must be auto, ipv4 or ipv6, got '%s'",
                            DDP_KEY(NETWORK_FAMILY), n->str);
                goto out;
            }
        }
    }
    if ((n = ddp__key_get(root, DDP_K_STOP_GRACE)) && ddp__key_read(c, n, DDP_K_STOP_GRACE, j) < 0)
        goto out;
    if ((sub = ddp__key_get(root, DDP_K_DIAGNOSE)) &&
        (ddp__key_check(c, sub, DDP_K_DIAGNOSE) < 0 ||
         ddp__key_read_section(c, sub, DDP_K_DIAGNOSE, j) < 0 ||
         ((n = ddp__key_get(sub, DDP_K_DIAGNOSE_ON_HANG)) &&
          ddp__jv_enum(c, n, DDP_KEY(DIAGNOSE_ON_HANG), "wait", "fail", &j->hang_fail) < 0)))
        goto out;
    if ((sub = ddp__key_get(root, DDP_K_PIPELINE)) && j->world_size == 0) {
        ddp__jv_err(c, per_node,
                    "%s: %s is counted on each node when its agent starts, and a pipeline's "
                    "stages need the ranks of every node: give the number of ranks per node",
                    DDP_KEY(NPROC_PER_NODE), per_node->str);
        goto out;
    }
    if (sub && ddp__job_pipeline(c, sub, basedir, j) < 0)
        goto out;
    if (ddp__key_resolve_paths(j, basedir) < 0)
        goto out;
    bool all_local = true;
    for (size_t i = 0; i < j->nnodes; i++)
        all_local &= ddp__job_host_is_local(j->nodes[i].host);
    if (all_local) {
        struct stat st;
        n = ddp__key_get(root, DDP_K_WORKDIR);
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
        *root && (*root)->type == DDP_Y_MAP ? ddp__key_get(*root, DDP_K_NODES) : NULL;
    if (*root && (*root)->type != DDP_Y_MAP)
        return 0; /* the schema walk says what is wrong with it */
    if (!list) {
        char set[64];
        snprintf(set, sizeof(set), "%s=[localhost]", DDP_KEY(NODES));
        if (ddp__ytree_apply_set("--set", root, set, origin) < 0)
            return -1;
        list = ddp__key_get(*root, DDP_K_NODES);
    }
    if (list->type != DDP_Y_SEQ)
        return 0;
    for (size_t i = 0; i < list->n; i++) {
        struct ddp_ynode *e = list->kids[i];
        if (e->type != DDP_Y_SCALAR)
            continue;
        struct ddp_ynode *m = ddp__ytree_new(DDP_Y_MAP, e->line, e->col, e->origin);
        struct ddp_ynode *k = ddp__ytree_new(DDP_Y_SCALAR, e->line, e->col, e->origin);
        if (!m || !k || !(k->str = strdup(ddp__key_name(DDP_K_NODES_HOST))) ||
            ddp__ytree_add(m, k) < 0) {
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

/* The defaults of cli/spec/keys.def: the values' by their kind, and those of the keys read here. */
static int set_defaults(struct ddp_job *j)
{
    j->nproc_per_node = atoi(DDP_KEY_DEFAULT(NPROC_PER_NODE));
    j->backend = strdup(DDP_KEY_DEFAULT(BACKEND));
    j->ssh_strict = strdup(DDP_KEY_DEFAULT(SSH_STRICT_HOST_KEY_CHECKING));
    return j->backend && j->ssh_strict ? ddp__key_defaults(j) : -1;
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
    if (set_defaults(j) < 0)
        goto out;
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
        size_t nl = strlen(DDP_KEY(NODES));
        if (strncmp(sets[i], DDP_KEY(NODES), nl) == 0 && sets[i][nl] == '.' &&
            expand_nodes(&root, origins[i]) < 0)
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
    free(j->token_file);
    free(j->ssh_user);
    free(j->ssh_identity);
    free(j->ssh_known_hosts);
    free(j->ssh_strict);
    free(j->ssh_remote_ddprun);
    free(j->logs_dir);
    free(j->checkpoint_dir);
    free(j->metrics_listen);
    free(j->metrics_allow);
    for (char **m = j->warm_imports; m && *m; m++)
        free(*m);
    free(j->warm_imports);
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
