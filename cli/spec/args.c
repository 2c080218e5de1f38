/*
 * The command line's shared helpers (a leaf: it calls no other cli file): the error printer,
 * option parsing from the table in cli/spec/options.def, the log level, and the generated option
 * list of each command's help.
 */
#include "cli/spec/args.h"
#include "cli/spec/keys.h"
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static const struct {
    const char *group, *name, *arg, *help;
} opts[] = {
#define DDP_OPT(group, id, name, arg, help) {#group, name, arg, help},
#include "cli/spec/options.def"
#undef DDP_OPT
};

void ddp__cli_error(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "ddprun: error: %s\n", buf);
}

static bool in_groups(const char *g, const char *const *groups)
{
    for (; *groups; groups++)
        if (strcmp(g, *groups) == 0)
            return true;
    return false;
}

/* Whether name (nl bytes) spells want, '_' standing for '-' as argparse takes it
 * (--nproc_per_node, --max_restarts: torchrun's command lines). */
static bool same_name(const char *want, const char *name, size_t nl)
{
    if (strlen(want) != nl)
        return false;
    for (size_t i = 0; i < nl; i++)
        if (want[i] != name[i] && !(want[i] == '-' && name[i] == '_'))
            return false;
    return true;
}

/* The option named a (after "--"), or -1. "-h" is --help. */
static int find_opt(const char *name, size_t nl, const char *const *groups)
{
    for (int k = 0; k < DDP_OPT__COUNT; k++)
        if (in_groups(opts[k].group, groups) && same_name(opts[k].name, name, nl))
            return k;
    return -1;
}

/* torchrun's options for a launcher started on every node, which ddprun is not. */
static const char *const per_node[] = {"node-rank",     "master-addr",  "master-port",
                                       "rdzv-endpoint", "rdzv-backend", "rdzv-id",
                                       "rdzv-conf",     "local-addr"};

static bool torchrun_per_node(const char *name, size_t nl)
{
    for (size_t k = 0; k < sizeof(per_node) / sizeof(per_node[0]); k++)
        if (same_name(per_node[k], name, nl))
            return true;
    return false;
}

/* Adds "key=val" to the overrides, shown in messages as "--NAME VAL". */
static int add_set(struct ddp_cli_opts *o, const char *key, const char *val, const char *name)
{
    if (o->nsets == DDP_CLI_MAX_SETS) {
        ddp__cli_error("too many --set options (at most %d)", DDP_CLI_MAX_SETS);
        return -1;
    }
    if (strlen(val) > 120) {
        ddp__cli_error("option '--%s': the value is too long", name);
        return -1;
    }
    size_t k = o->nsets++;
    snprintf(o->set_buf[k], sizeof(o->set_buf[k]), "%s=%s", key, val);
    o->sets[k] = o->set_buf[k];
    snprintf(o->label_buf[k], sizeof(o->label_buf[k]), "--%s %s", name, val);
    o->labels[k] = o->label_buf[k];
    return 0;
}

/* torchrun's --nnodes: N, or MIN:MAX, the range an elastic job runs in. */
static int add_nnodes(struct ddp_cli_opts *o, const char *val)
{
    const char *p = val;
    char *end;
    long lo = -1, hi = -1;
    if (*p >= '0' && *p <= '9')
        hi = lo = strtol(p, &end, 10);
    if (lo >= 0 && *end == ':' && end[1] >= '0' && end[1] <= '9')
        hi = strtol(end + 1, &end, 10);
    if (lo < 0 || *end || lo > 100000 || hi > 100000) {
        ddp__cli_error("--nnodes '%s': give N or MIN:MAX, as torchrun takes it (2, 1:4)", val);
        return -1;
    }
    char a[24], b[24];
    snprintf(a, sizeof(a), "%ld", lo);
    snprintf(b, sizeof(b), "%ld", hi);
    return add_set(o, DDP_KEY(ELASTIC_MIN_NODES), a, "nnodes") < 0 ||
                   add_set(o, DDP_KEY(ELASTIC_MAX_NODES), b, "nnodes") < 0
               ? -1
               : 0;
}

int ddp__cli_parse(int argc, char **argv, int *i, const char *const *groups, bool stop_at_word,
                   struct ddp_cli_opts *o)
{
    for (; *i < argc; (*i)++) {
        const char *a = argv[*i];
        if (strcmp(a, "--") == 0) { /* the rest are words, even if they start with - */
            for ((*i)++; *i < argc; (*i)++) {
                if (o->npos == DDP_CLI_MAX_WORDS) {
                    ddp__cli_error("unexpected argument '%s'", argv[*i]);
                    return -1;
                }
                o->pos[o->npos++] = argv[*i];
            }
            return 0;
        }
        if (strcmp(a, "-h") == 0)
            a = "--help";
        else if (strcmp(a, "-H") == 0) /* Horovod's host list */
            a = "--nodes";
        else if (strcmp(a, "-m") == 0) /* python -m, as torchrun takes it */
            a = "--module";
        else if (strcmp(a, "-f") == 0) /* tail -f */
            a = "--follow";
        else if (strcmp(a, "-o") == 0) /* cc -o */
            a = "--output";
        else if (strcmp(a, "-r") == 0) /* torchrun's */
            a = "--redirects";
        else if (strcmp(a, "-t") == 0)
            a = "--tee";
        if (strncmp(a, "--", 2) != 0 || !a[2]) {
            if (a[0] == '-' && a[1]) {
                ddp__cli_error("unknown option '%s' (options are long: --help)", a);
                return -1;
            }
            if (stop_at_word)
                return 0;
            if (o->npos == DDP_CLI_MAX_WORDS) {
                ddp__cli_error("unexpected argument '%s'", a);
                return -1;
            }
            o->pos[o->npos++] = a;
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        int found = find_opt(name, nl, groups);
        if (found < 0 && torchrun_per_node(name, nl)) {
            ddp__cli_error("'%.*s' is torchrun's, for a launcher started on every node; ddprun "
                           "runs once, from here, and starts every node itself: name them with "
                           "-H h1,h2 or --hostfile FILE (its store is its own: "
                           "--set %s=N and %s say where)",
                           (int)nl + 2, a, DDP_KEY(RDZV_PORT), DDP_KEY(RDZV_LISTEN));
            return -1;
        }
        if (found < 0) {
            ddp__cli_error("unknown option '%.*s' (see 'ddprun %s%s--help')", (int)nl + 2, a,
                           o->cmd ? o->cmd : "", o->cmd ? " " : "");
            return -1;
        }
        const char *val;
        if (!opts[found].arg) {
            if (eq) {
                ddp__cli_error("option '--%s' takes no value", opts[found].name);
                return -1;
            }
            val = "";
        } else if (eq) {
            val = eq + 1;
        } else if (*i + 1 < argc) {
            val = argv[++(*i)];
        } else {
            ddp__cli_error("option '--%s' needs a value (%s)", opts[found].name, opts[found].arg);
            return -1;
        }
        /* --nproc N is --set nproc_per_node=N (--ranks L: logs.console_ranks=L, ...), named
         * as the user wrote it. */
        char role[64];
        snprintf(role, sizeof(role), "%s.ROLE_NAME", DDP_KEY(ENV));
        const char *key = found == DDP_OPT_RANKS          ? DDP_KEY(LOGS_CONSOLE_RANKS)
                          : found == DDP_OPT_MAX_RESTARTS ? DDP_KEY(ELASTIC_MAX_RESTARTS)
                          : found == DDP_OPT_BIND_TO      ? DDP_KEY(BIND_TO)
                          : found == DDP_OPT_LOG_DIR      ? DDP_KEY(LOGS_DIR)
                          : found == DDP_OPT_METRICS      ? DDP_KEY(METRICS_LISTEN)
                          : found == DDP_OPT_ROLE         ? role
                          : found == DDP_OPT_NPROC || found == DDP_OPT_NPROC_PER_NODE
                              ? DDP_KEY(NPROC_PER_NODE)
                              : NULL;
        if (found == DDP_OPT_SET) {
            if (o->nsets == DDP_CLI_MAX_SETS) {
                ddp__cli_error("too many --set options (at most %d)", DDP_CLI_MAX_SETS);
                return -1;
            }
            o->sets[o->nsets] = val;
            o->labels[o->nsets++] = NULL;
        } else if (key && add_set(o, key, val, opts[found].name) < 0) {
            return -1;
        } else if (found == DDP_OPT_NNODES && add_nnodes(o, val) < 0) {
            return -1;
        }
        o->vals[found] = val;
    }
    return 0;
}

void ddp__cli_print_opts(const char *group, FILE *f)
{
    for (size_t k = 0; k < sizeof(opts) / sizeof(opts[0]); k++) {
        if (strcmp(opts[k].group, group) != 0)
            continue;
        char left[64];
        snprintf(left, sizeof(left), "--%s%s%s", opts[k].name, opts[k].arg ? " " : "",
                 opts[k].arg ? opts[k].arg : "");
        fprintf(f, "  %-24s %s\n", left, opts[k].help);
    }
}

int ddp__cli_apply_log_level(const char *lvl)
{
    static const char *const names[] = {"none", "error", "warn", "info", "debug", "trace"};
    for (int k = 0; k < 6; k++)
        if (strcmp(lvl, names[k]) == 0) {
            ddp_log_set_level((enum ddp_log_level)k);
            return 0;
        }
    ddp__cli_error("--log-level '%s' is not one of none, error, warn, info, debug, trace", lvl);
    return -1;
}
