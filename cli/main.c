/* ddprun's entry point: global options, subcommand dispatch and the generated --help. */
#include "cli/cli.h"
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static const struct {
    const char *cmd, *name, *arg, *help;
} opts[] = {
#define DDP_OPT(cmd, id, name, arg, help) {#cmd, name, arg, help},
#include "cli/options.def"
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

static bool cmd_in(const char *cmd, const char *const *cmds)
{
    for (; *cmds; cmds++)
        if (strcmp(cmd, *cmds) == 0)
            return true;
    return false;
}

int ddp__cli_parse(int argc, char **argv, int *i, const char *const *cmds,
                   const char *vals[DDP_OPT__COUNT])
{
    for (; *i < argc; (*i)++) {
        const char *a = argv[*i];
        if (strcmp(a, "--") == 0) {
            (*i)++;
            return 0;
        }
        if (strncmp(a, "--", 2) != 0)
            return 0;
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        int found = -1;
        for (int k = 0; k < DDP_OPT__COUNT; k++)
            if (cmd_in(opts[k].cmd, cmds) && strlen(opts[k].name) == nl &&
                strncmp(opts[k].name, name, nl) == 0)
                found = k;
        if (found < 0) {
            ddp__cli_error("unknown option '%.*s' (see 'ddprun --help')", (int)nl + 2, a);
            return -1;
        }
        if (!opts[found].arg) {
            if (eq) {
                ddp__cli_error("option '--%s' takes no value", opts[found].name);
                return -1;
            }
            vals[found] = "";
        } else if (eq) {
            vals[found] = eq + 1;
        } else if (*i + 1 < argc) {
            vals[found] = argv[++(*i)];
        } else {
            ddp__cli_error("option '--%s' needs a value (%s)", opts[found].name, opts[found].arg);
            return -1;
        }
    }
    return 0;
}

static void print_opts(const char *cmd)
{
    for (size_t k = 0; k < sizeof(opts) / sizeof(opts[0]); k++) {
        if (strcmp(opts[k].cmd, cmd) != 0)
            continue;
        char left[64];
        snprintf(left, sizeof(left), "--%s%s%s", opts[k].name, opts[k].arg ? " " : "",
                 opts[k].arg ? opts[k].arg : "");
        printf("  %-24s %s\n", left, opts[k].help);
    }
}

static void usage(void)
{
    printf("usage: ddprun [GLOBAL OPTIONS] [--nproc N] [--timeout SECONDS]\n"
           "       ddprun [GLOBAL OPTIONS] store --listen HOST:PORT --token-file FILE "
           "[--max-conns N]\n"
           "\n"
           "Without a command, ddprun runs its embedded default job: a local smoke job whose\n"
           "ranks meet at an embedded, authenticated rendezvous store.\n"
           "\nGlobal options:\n");
    print_opts("global");
    printf("\nDefault job options:\n");
    print_opts("run");
    printf("\nCommands:\n  store                    run a standalone rendezvous store\n");
    printf("\nstore options:\n");
    print_opts("store");
    printf("\nExit status: 0 success, 1 job failed, 2 usage error, 3 launch error, "
           "130 interrupted.\nSee ddprun(1) and ddprun-store(7).\n");
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

int main(int argc, char **argv)
{
    const char *vals[DDP_OPT__COUNT] = {0};
    static const char *const global_cmds[] = {"global", "run", NULL};
    int i = 1;

    if (argc >= 2 && strcmp(argv[1], "__smoke-worker") == 0)
        return ddp__cmd_smoke_worker();
    if (ddp__cli_parse(argc, argv, &i, global_cmds, vals) < 0)
        return DDP_EXIT_USAGE;
    if (vals[DDP_OPT_HELP]) {
        usage();
        return DDP_EXIT_OK;
    }
    if (vals[DDP_OPT_VERSION]) {
        printf("ddprun %s\n", DDP_VERSION);
        return DDP_EXIT_OK;
    }
    if (vals[DDP_OPT_LOG_LEVEL] && ddp__cli_apply_log_level(vals[DDP_OPT_LOG_LEVEL]) < 0)
        return DDP_EXIT_USAGE;
    if (i >= argc)
        return ddp__cmd_default_job(vals);
    if (strcmp(argv[i], "store") == 0)
        return ddp__cmd_store(argc, argv, i + 1);
    if (strcmp(argv[i], "help") == 0) {
        usage();
        return DDP_EXIT_OK;
    }
    ddp__cli_error("unknown command '%s' (see 'ddprun --help')", argv[i]);
    return DDP_EXIT_USAGE;
}
