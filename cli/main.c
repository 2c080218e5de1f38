/* ddprun's entry point: global options, subcommand dispatch and the generated --help. */
#include "cli/cli.h"
#include "cli/job.h"
#include "common/log.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int ddp__cli_parse(int argc, char **argv, int *i, const char *const *cmds, struct ddp_cli_opts *o)
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
        if (found == DDP_OPT_SET) {
            if (o->nsets == sizeof(o->sets) / sizeof(o->sets[0])) {
                ddp__cli_error("too many --set options (at most 64)");
                return -1;
            }
            o->sets[o->nsets++] = val;
        }
        o->vals[found] = val;
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
    printf("usage: ddprun [OPTIONS] JOB.yaml [--set KEY=VALUE]...   run a job\n"
           "       ddprun plan JOB.yaml [--set KEY=VALUE]...        print the resolved job and "
           "rank map\n"
           "       ddprun doctor JOB.yaml [--set KEY=VALUE]...      check every node before a run\n"
           "       ddprun [--nproc N]                               run the embedded default job\n"
           "       ddprun store --listen HOST:PORT --token-file FILE [--max-conns N]\n"
           "\n"
           "ddprun runs a data-parallel job described by a YAML file (see ddprun-job(5)): it\n"
           "hosts an authenticated rendezvous store, starts a node agent per node, and the\n"
           "agents start the ranks with a torchrun-compatible environment.\n"
           "\nOptions:\n");
    print_opts("global");
    print_opts("run");
    printf("\nCommands:\n"
           "  plan                     resolve JOB.yaml and print it with the rank map; start "
           "nothing\n"
           "  doctor                   check every node of JOB.yaml at once (SSH, host key, "
           "ddprun\n"
           "                           version, the command, a free port, reaching the store); "
           "table\n"
           "  store                    run a standalone rendezvous store\n"
           "  agent                    (internal) the node agent; takes its orders on stdin\n");
    printf("\nstore options:\n");
    print_opts("store");
    printf("\nExit status: 0 success, 1 job failed, 2 usage or job-spec error, 3 launch error, "
           "130 interrupted.\nSee ddprun(1), ddprun-job(5) and ddprun-store(7).\n");
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

/*
 * The embedded default job: the Fashion-MNIST example (ddprun-fmnist, installed next to ddprun)
 * on two local ranks, 3 epochs; where the example is not installed, ranks that meet at the
 * store and pass a barrier (cli/smoke.c).
 */
static int load_default_job(struct ddp_cli_opts *o, struct ddp_job **job)
{
    char self[PATH_MAX], trainer[PATH_MAX + 32], yaml[2 * PATH_MAX + 256], nproc[64];
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
    if (o->vals[DDP_OPT_NPROC]) {
        snprintf(nproc, sizeof(nproc), "nproc_per_node=%s", o->vals[DDP_OPT_NPROC]);
        if (o->nsets < sizeof(o->sets) / sizeof(o->sets[0]))
            o->sets[o->nsets++] = nproc;
        return ddp__job_load_string("--nproc", yaml, o->sets, o->nsets, job);
    }
    return ddp__job_load_string("<default job>", yaml, o->sets, o->nsets, job);
}

int main(int argc, char **argv)
{
    struct ddp_cli_opts o = {0};
    static const char *const run_cmds[] = {"global", "run", NULL};
    struct ddp_job *job = NULL;
    int i = 1, rc;

    if (argc >= 2 && strcmp(argv[1], "__probe") == 0)
        return ddp__cmd_probe(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "__ssh-bridge") == 0)
        return ddp__cmd_ssh_bridge(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "__smoke-worker") == 0)
        return ddp__cmd_smoke_worker();
    if (argc >= 2 && strcmp(argv[1], "agent") == 0)
        return ddp__cmd_agent();
    if (ddp__cli_parse(argc, argv, &i, run_cmds, &o) < 0)
        return DDP_EXIT_USAGE;
    if (o.vals[DDP_OPT_HELP]) {
        usage();
        return DDP_EXIT_OK;
    }
    if (o.vals[DDP_OPT_VERSION]) {
        printf("ddprun %s\n", DDP_VERSION);
        return DDP_EXIT_OK;
    }
    if (o.vals[DDP_OPT_LOG_LEVEL] && ddp__cli_apply_log_level(o.vals[DDP_OPT_LOG_LEVEL]) < 0)
        return DDP_EXIT_USAGE;
    if (i >= argc) {
        if (load_default_job(&o, &job) < 0)
            return DDP_EXIT_USAGE;
        rc = ddp__launch(job);
        ddp__job_free(job);
        return rc;
    }
    if (strcmp(argv[i], "store") == 0)
        return ddp__cmd_store(argc, argv, i + 1);
    if (strcmp(argv[i], "help") == 0) {
        usage();
        return DDP_EXIT_OK;
    }
    bool plan = strcmp(argv[i], "plan") == 0, doctor = strcmp(argv[i], "doctor") == 0;
    if ((plan || doctor) && ++i >= argc) {
        ddp__cli_error("%s: which job file? (ddprun %s JOB.yaml)", argv[i - 1], argv[i - 1]);
        return DDP_EXIT_USAGE;
    }
    if (o.vals[DDP_OPT_NPROC]) {
        ddp__cli_error("--nproc is for the embedded default job; in a job file use nproc_per_node "
                       "(or --set nproc_per_node=N)");
        return DDP_EXIT_USAGE;
    }
    const char *file = argv[i++];
    /* Options may follow the job file too: ddprun job.yaml --set a=b. */
    if (ddp__cli_parse(argc, argv, &i, run_cmds, &o) < 0)
        return DDP_EXIT_USAGE;
    if (i < argc) {
        ddp__cli_error("unexpected argument '%s' after the job file (the command to run goes in "
                       "the job file's 'command')",
                       argv[i]);
        return DDP_EXIT_USAGE;
    }
    if (o.vals[DDP_OPT_LOG_LEVEL] && ddp__cli_apply_log_level(o.vals[DDP_OPT_LOG_LEVEL]) < 0)
        return DDP_EXIT_USAGE;
    if (ddp__job_load(file, o.sets, o.nsets, &job) < 0)
        return DDP_EXIT_USAGE;
    if (plan) {
        char id[160];
        snprintf(id, sizeof(id), "%s-<timestamp>-<random>", job->name);
        ddp__job_print_plan(job, id, stdout);
        rc = DDP_EXIT_OK;
    } else if (doctor) {
        rc = ddp__doctor(job);
    } else {
        rc = ddp__launch(job);
    }
    ddp__job_free(job);
    return rc;
}
