/*
 * The job spec's value readers (cli/spec/values.h) and the small questions asked of a loaded
 * job (cli/spec/job.h): is a host local, where does the store listen, is a rank shown.
 */
#include "cli/spec/values.h"
#include "cli/spec/args.h"
#include "cli/spec/job.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/banned.h"

void ddp__jv_err(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ddp__ytree_error(c->file, n, "%s", msg);
}

/* A key given twice in mapping m is an error (O(n log n): a file may hold many keys). */
int ddp__jv_check_dups(const struct ddp__jctx *c, const struct ddp_ynode *m, const char *where)
{
    size_t nk = m->n / 2, dup, first;
    const char **keys = malloc((nk ? nk : 1) * sizeof(*keys));
    if (!keys) {
        ddp__cli_error("out of memory");
        return -1;
    }
    for (size_t i = 0; i < nk; i++)
        keys[i] = m->kids[2 * i]->str;
    bool found = ddp__ytree_find_dup(keys, nk, &dup, &first);
    free(keys);
    if (found) {
        const struct ddp_ynode *k = m->kids[2 * dup], *k0 = m->kids[2 * first];
        if (k0->origin || k->origin)
            ddp__jv_err(c, k, "duplicate key '%s' in %s", k->str, where);
        else
            ddp__jv_err(c, k, "duplicate key '%s' in %s (first given at line %d)", k->str, where,
                        k0->line);
        return -1;
    }
    return 0;
}

/* Checks a mapping's keys against a list: unknown and duplicate keys are errors. */
int ddp__jv_check_keys(const struct ddp__jctx *c, const struct ddp_ynode *m, const char *where,
                       const char *const *allowed)
{
    if (m->type != DDP_Y_MAP) {
        ddp__jv_err(c, m, "%s must be a mapping of keys to values", where);
        return -1;
    }
    for (size_t i = 0; i + 1 < m->n; i += 2) {
        const struct ddp_ynode *k = m->kids[i];
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            ok |= strcmp(*a, k->str) == 0;
        if (!ok) {
            char list[512] = "";
            size_t o = 0;
            for (const char *const *a = allowed; *a && o < sizeof(list); a++)
                o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s", a == allowed ? "" : ", ",
                                      *a);
            ddp__jv_err(c, k, "unknown key '%s' in %s (expected one of: %s)", k->str, where, list);
            return -1;
        }
    }
    return ddp__jv_check_dups(c, m, where);
}

int ddp__jv_scalar(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what)
{
    if (n->type != DDP_Y_SCALAR) {
        ddp__jv_err(c, n, "%s must be a single value, not a %s", what,
                    n->type == DDP_Y_MAP ? "mapping" : "list");
        return -1;
    }
    return 0;
}

int ddp__jv_str(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what, char **out)
{
    if (ddp__jv_scalar(c, n, what) < 0)
        return -1;
    if (!n->str[0]) {
        ddp__jv_err(c, n, "%s must not be empty", what);
        return -1;
    }
    free(*out);
    *out = strdup(n->str);
    return *out ? 0 : -1;
}

int ddp__jv_int(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what, long lo,
                long hi, int *out)
{
    if (ddp__jv_scalar(c, n, what) < 0)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(n->str, &end, 10);
    if (errno || !n->str[0] || *end || v < lo || v > hi) {
        ddp__jv_err(c, n, "%s must be a whole number from %ld to %ld, got '%s'", what, lo, hi,
                    n->str);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int ddp__jv_bool(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what, bool *out)
{
    static const char *const t[] = {"true", "yes", "on", "1"}, *const f[] = {"false", "no", "off",
                                                                             "0"};
    if (ddp__jv_scalar(c, n, what) < 0)
        return -1;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(n->str, t[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(n->str, f[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    ddp__jv_err(c, n, "%s must be true or false, got '%s'", what, n->str);
    return -1;
}

int64_t ddp__parse_duration_ms(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !isdigit((unsigned char)s[0]))
        return -1;
    double mul;
    if (strcmp(end, "ms") == 0)
        mul = 1;
    else if (strcmp(end, "s") == 0)
        mul = 1000;
    else if (strcmp(end, "m") == 0)
        mul = 60000;
    else if (strcmp(end, "h") == 0)
        mul = 3600000;
    else
        return -1;
    double ms = v * mul;
    return ms > 1e15 ? -1 : (int64_t)(ms + 0.5);
}

int ddp__jv_duration(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what,
                     int64_t *out)
{
    if (ddp__jv_scalar(c, n, what) < 0)
        return -1;
    int64_t v = ddp__parse_duration_ms(n->str);
    if (v < 0) {
        ddp__jv_err(c, n, "%s: bad duration '%s' (expected a number and a unit: 500ms, 5s, 2m, 1h)",
                    what, n->str);
        return -1;
    }
    *out = v;
    return 0;
}

int ddp__jv_duration_pos(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what,
                         int64_t *out)
{
    int64_t v;
    if (ddp__jv_duration(c, n, what, &v) < 0)
        return -1;
    if (v == 0) {
        ddp__jv_err(c, n, "%s must be longer than 0 (a duration such as 500ms or 5s), got '%s'",
                    what, n->str);
        return -1;
    }
    *out = v;
    return 0;
}

int ddp__jv_enum(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what,
                 const char *no, const char *yes, bool *out)
{
    if (ddp__jv_scalar(c, n, what) < 0)
        return -1;
    if (strcmp(n->str, no) != 0 && strcmp(n->str, yes) != 0) {
        ddp__jv_err(c, n, "%s must be %s or %s, got '%s'", what, no, yes, n->str);
        return -1;
    }
    *out = strcmp(n->str, yes) == 0;
    return 0;
}

bool ddp__job_host_is_local(const char *host)
{
    return strcmp(host, "localhost") == 0 || strcmp(host, "127.0.0.1") == 0 ||
           strcmp(host, "::1") == 0;
}

int ddp__job_ssh_tree(const struct ddp_job *j, int *parent)
{
    size_t *ssh = calloc(j->nnodes + 1, sizeof(*ssh)), n = 0; /* the SSH nodes, in order */
    if (!ssh)
        return -1;
    /* agents that wait for a new launcher (an etcd job's takeover) are each started by it */
    bool tree =
        !j->external && !j->srun && j->ssh_fanout >= 1 && !(j->rdzv_etcd && j->takeover_ms > 0);
    size_t fan = tree ? (size_t)j->ssh_fanout : 0;
    for (size_t i = 0; i < j->nnodes; i++) {
        parent[i] = -1;
        if (!tree || ddp__job_host_is_local(j->nodes[i].host))
            continue;
        if (n >= fan) /* the (n - K) / K-th SSH node starts it */
            parent[i] = (int)ssh[(n - fan) / fan];
        ssh[n++] = i;
    }
    free(ssh);
    return 0;
}

const char *ddp__job_first_remote(const struct ddp_job *j)
{
    for (size_t i = 0; i < j->nnodes; i++)
        if (!ddp__job_host_is_local(j->nodes[i].host))
            return j->nodes[i].host;
    return NULL;
}

const char *ddp__job_store_listen(const struct ddp_job *j)
{
    if (strcmp(j->rdzv_listen, "auto") != 0)
        return j->rdzv_listen;
    return ddp__job_first_remote(j) ? "0.0.0.0" : "127.0.0.1";
}

/*
 * The one rule for paths in a job spec: absolute as given; "~/..." in the home folder; any
 * other relative path relative to base, the job file's folder (the current folder for the
 * embedded default job), whether it came from the file or from --set.
 */
char *ddp__jv_path(const char *base, const char *p)
{
    if (p[0] == '/')
        return strdup(p);
    const char *home = getenv("HOME");
    if (p[0] == '~' && (p[1] == '/' || !p[1]) && home && home[0]) {
        size_t n = strlen(home) + strlen(p) + 1;
        char *r = malloc(n);
        if (r)
            snprintf(r, n, "%s%s", home, p + 1);
        return r;
    }
    size_t n = strlen(base) + strlen(p) + 2;
    char *r = malloc(n);
    if (r)
        snprintf(r, n, "%s/%s", base, p);
    return r;
}

bool ddp__jv_env_name_ok(const char *s)
{
    if (!(isalpha((unsigned char)s[0]) || s[0] == '_'))
        return false;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_'))
            return false;
    return true;
}

/* "all", or comma-separated ranks N and ranges N-M (N <= M). */
bool ddp__jv_rank_list_ok(const char *s)
{
    if (strcmp(s, "all") == 0)
        return true;
    for (;;) {
        char *end;
        if (!isdigit((unsigned char)*s))
            return false;
        long a = strtol(s, &end, 10), b = a;
        s = end;
        if (*s == '-') {
            if (!isdigit((unsigned char)s[1]))
                return false;
            b = strtol(s + 1, &end, 10);
            s = end;
        }
        if (a < 0 || b < a || b > 10000000)
            return false;
        if (!*s)
            return true;
        if (*s++ != ',')
            return false;
    }
}

bool ddp__job_rank_listed(const char *list, int rank)
{
    if (!list)
        return true;
    for (const char *s = list; *s;) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        s = end;
        if (*s == '-') {
            b = strtol(s + 1, &end, 10);
            s = end;
        }
        if (rank >= a && rank <= b)
            return true;
        if (*s == ',')
            s++;
        else
            break;
    }
    return false;
}

/*
 * What remote ranks get from the launching shell, as mpirun's -x and DeepSpeed's exported
 * prefixes do it (local ranks inherit the whole environment, as with torchrun): the libraries'
 * tuning and debugging (NCCL, CUDA, OpenMP, BLAS, PyTorch, Gloo, UCX, libfabric, Hugging Face),
 * Python's own variables, and an activated virtualenv or conda environment with its PATH.
 */
const char *const ddp__job_export_defaults[] = {"NCCL_*",
                                                "CUDA_*",
                                                "CUBLAS_*",
                                                "CUDNN_*",
                                                "PYTHON*",
                                                "OMP_*",
                                                "MKL_*",
                                                "OPENBLAS_*",
                                                "TORCH_*",
                                                "GLOO_*",
                                                "TP_*",
                                                "UCX_*",
                                                "FI_*",
                                                "HF_*",
                                                "TRANSFORMERS_*",
                                                "VIRTUAL_ENV",
                                                "CONDA_*",
                                                "PATH",
                                                "LD_LIBRARY_PATH",
                                                "LANG",
                                                "LC_*",
                                                "TZ",
                                                "DDP_LOG_*",
                                                NULL};

bool ddp__job_exports(const struct ddp_job *j, const char *name)
{
    bool in = false;
    for (const char *const *p = ddp__job_export_defaults; *p && !in; p++)
        in = fnmatch(*p, name, 0) == 0;
    for (size_t k = 0; k < j->nexport && !in; k++)
        in = j->export_pats[k][0] != '-' && fnmatch(j->export_pats[k], name, 0) == 0;
    for (size_t k = 0; k < j->nexport && in; k++)
        in = !(j->export_pats[k][0] == '-' && fnmatch(j->export_pats[k] + 1, name, 0) == 0);
    return in;
}

char **ddp__job_shell_env(const struct ddp_job *j, size_t *bytes)
{
    extern char **environ;
    size_t n = 0, total = 0;
    for (char **e = environ; e && *e; e++)
        n++;
    char **out = calloc(n + 1, sizeof(char *));
    if (!out)
        return NULL;
    n = 0;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        char name[256];
        if (!eq || eq == *e || (size_t)(eq - *e) >= sizeof(name))
            continue;
        snprintf(name, sizeof(name), "%.*s", (int)(eq - *e), *e);
        if (!ddp__job_exports(j, name))
            continue;
        if (!(out[n] = strdup(*e))) {
            for (size_t k = 0; k < n; k++)
                free(out[k]);
            free(out);
            return NULL;
        }
        total += strlen(*e) + 1;
        n++;
    }
    if (bytes)
        *bytes = total;
    return out;
}
