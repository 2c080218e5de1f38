/* ddprun's entry point: finds the command, parses its options, and dispatches to it. */
#include "cli/agent/guard.h"
#include "cli/agent/link.h"
#include "cli/agent/agent.h"
#include "cli/cmd/cmd.h"
#include "cli/doctor/doctor.h"
#include "cli/provision/ssh_session.h"
#include "cli/spec/args.h"
#include "cli/supervisor/launch.h"
#include "cli/sys/sys.h"
#include "cli/spec/job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

struct command {
    const char *name, *synopsis, *about;
    const char *groups[3]; /* option groups besides global */
    int words;             /* job-file commands: at most this many words (the job file) */
    int (*run)(struct ddp_cli_opts *o);
};

static int cmd_run(struct ddp_cli_opts *o);
static int cmd_plan(struct ddp_cli_opts *o);
static int cmd_doctor(struct ddp_cli_opts *o);
static int cmd_store(struct ddp_cli_opts *o);
static int cmd_agent(struct ddp_cli_opts *o);
static int cmd_status(struct ddp_cli_opts *o);
static int cmd_stacks(struct ddp_cli_opts *o);
static int cmd_attach(struct ddp_cli_opts *o);
static int cmd_ps(struct ddp_cli_opts *o);
static int cmd_logs(struct ddp_cli_opts *o);
static int cmd_report(struct ddp_cli_opts *o);
static int cmd_stop(struct ddp_cli_opts *o);
static int cmd_pipeline(struct ddp_cli_opts *o);
static int cmd_help(struct ddp_cli_opts *o);
static int cmd_version(struct ddp_cli_opts *o);

static const struct command commands[] = {
    {"run",
     "ddprun [OPTIONS] [JOB.yaml] [OPTIONS]",
     "Runs the job JOB.yaml describes (see ddprun-job(5)): hosts an authenticated rendezvous\n"
     "store, starts a node agent per node, and the agents start the ranks with a\n"
     "torchrun-compatible environment. Without JOB.yaml, runs the embedded default job\n"
     "(Fashion-MNIST on 2 local ranks). Options may stand before or after JOB.yaml.\n"
     "With --detach the job runs on without this terminal (see attach, ps, logs, stop).",
     {"job", "run", NULL},
     1,
     cmd_run},
    {"plan",
     "ddprun plan [OPTIONS] JOB.yaml",
     "Resolves JOB.yaml with its overrides and prints it with the rank map and the\n"
     "environment every rank gets; starts nothing.",
     {"job", NULL},
     1,
     cmd_plan},
    {"doctor",
     "ddprun doctor [OPTIONS] JOB.yaml",
     "Checks every node of JOB.yaml at once (SSH, host key, the ddprun version, the command,\n"
     "the working folder, a free port, reaching the store) and prints a table; status 0 when\n"
     "every node passes, 1 otherwise.",
     {"job", NULL},
     1,
     cmd_doctor},
    {"store",
     "ddprun store --listen HOST:PORT --token-file FILE [--max-conns N] [--torch-listen HOST:PORT]",
     "Runs a standalone rendezvous store until SIGINT or SIGTERM; with port 0 it prints the\n"
     "address it chose on stdout's first line. The wire protocol is in ddprun-store(7).",
     {"store", NULL},
     0,
     cmd_store},
    {"status",
     "ddprun status [JOB]",
     "Shows a running job's ranks, from another terminal on the launching machine: each\n"
     "rank's process state, CPU, collectives per second, the collective it is in or last\n"
     "finished, time since its last progress, and stragglers. JOB is the job id (or its\n"
     "start, or its log folder); without it, the only job of yours that runs here.",
     {NULL},
     1,
     cmd_status},
    {"stacks",
     "ddprun stacks [JOB] [--rank R]",
     "Prints the stacks of a running job's ranks (or of rank R), gathered on every node: a\n"
     "Python rank's Python tracebacks (faulthandler), then native stacks by eu-stack\n"
     "(elfutils) or gdb; identical stacks print once, with the ranks that share them.",
     {"rank", NULL},
     1,
     cmd_stacks},
    {"attach",
     "ddprun attach [JOB] | attach --etcd URLS [--prefix P] JOB",
     "Shows a running job's console from now on, as if it had been started here: its output,\n"
     "ddprun's messages, the status line, and at its end the summary; exits with the job's\n"
     "status. Ctrl-C detaches and leaves the job running. With --etcd (rendezvous: {backend:\n"
     "etcd}), from any login node: once the job's launcher is gone (its lease in etcd ended),\n"
     "this ddprun takes over supervising the job, in the folder and with the job file it was\n"
     "started with, and stays its launcher until the end.",
     {"attach", NULL},
     1,
     cmd_attach},
    {"ps",
     "ddprun ps",
     "Lists your running jobs on this machine, attached or detached: id, supervisor pid,\n"
     "mode, phase, ranks up, nodes, time since the start, log folder.",
     {NULL},
     0,
     cmd_ps},
    {"logs",
     "ddprun logs JOB [--rank R] [-f]",
     "Prints a detached job's console (console.log in its log folder), or rank R's log with\n"
     "every restart's after it; -f follows until the job ends. JOB: its id (or its start),\n"
     "or its log folder; finished jobs too.",
     {"rank", "logs", NULL},
     1,
     cmd_logs},
    {"report",
     "ddprun report JOB [-o FILE]",
     "Writes one self-contained HTML page of a job, running or finished, from its log folder:\n"
     "the timeline of rounds, node losses, hangs and recoveries; each rank's progress over\n"
     "time with stragglers marked; each round's startup; how each rank ended, with a failed\n"
     "rank's last lines. The data it plots is in the page as JSON. JOB: its id (or its\n"
     "start), or its log folder. Default FILE: report.html in the log folder.",
     {"output", NULL},
     1,
     cmd_report},
    {"stop",
     "ddprun stop [JOB]",
     "Stops a running job as SIGINT does (the ranks get SIGINT, SIGTERM halfway through\n"
     "stop_grace, then SIGKILL) and waits for its end.",
     {NULL},
     1,
     cmd_stop},
    {"agent",
     "ddprun agent [--rejoin JOB NODE | --join HOST:PORT --token-file FILE]",
     "The node agent that ddprun starts on every node (locally, over SSH, through srun); it\n"
     "is told on stdin where to dial back to ddprun. --rejoin links a new launcher (ddprun\n"
     "attach --etcd) to the agent of that job and node waiting on this host. --join: an\n"
     "agent that another system starts on each node (Kubernetes, pdsh, a site's scripts)\n"
     "joins the job that ddprun runs with launcher: external at HOST:PORT (its\n"
     "rendezvous.listen and rendezvous.port), proving the token in FILE (mode 0600).",
     {NULL},
     0,
     cmd_agent},
    {"pipeline",
     "ddprun pipeline plan PROFILE --machines N[,N...] --bandwidth RATE[,RATE...] [OPTIONS]",
     "Plans a pipeline as PipeDream does: splits the model of PROFILE (PipeDream's graph.txt:\n"
     "a line per layer with its forward and backward time, activation and parameter bytes)\n"
     "into stages, each replicated on some machines, per level of machines (within a server,\n"
     "then servers), minimizing the slowest stage; prints each stage's layers, replicas and\n"
     "time, and the predicted speedup over data parallelism.",
     {"pipeline", "output", NULL},
     2,
     cmd_pipeline},
    {"help",
     "ddprun help [COMMAND]",
     "Shows the help of ddprun or of one command.",
     {NULL},
     1,
     cmd_help},
    {"version", "ddprun version", "Prints the version.", {NULL}, 0, cmd_version},
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const struct command *find_command(const char *name)
{
    for (size_t k = 0; k < NCOMMANDS; k++)
        if (strcmp(commands[k].name, name) == 0)
            return &commands[k];
    return NULL;
}

static void usage_of(const struct command *c)
{
    printf("usage: %s\n\n%s\n\nOptions:\n", c->synopsis, c->about);
    for (int g = 0; c->groups[g]; g++)
        ddp__cli_print_opts(c->groups[g], stdout);
    ddp__cli_print_opts("global", stdout);
    printf("\nExit status: 0 success, 1 job failed, 2 usage or job-spec error, 3 launch error, "
           "130 interrupted.\nSee ddprun(1)%s.\n",
           strcmp(c->name, "store") == 0 ? " and ddprun-store(7)" : " and ddprun-job(5)");
}

static void usage(void)
{
    printf("usage: ddprun [OPTIONS] JOB.yaml [OPTIONS]        run a job\n"
           "       ddprun [OPTIONS] train.py [ARGS...]         run a program as torchrun does\n"
           "       ddprun plan [OPTIONS] JOB.yaml              print the resolved job and rank "
           "map\n"
           "       ddprun doctor [OPTIONS] JOB.yaml            check every node before a run\n"
           "       ddprun status [JOB]                         a running job's ranks\n"
           "       ddprun stacks [JOB] [--rank R]              their Python and native stacks\n"
           "       ddprun --detach JOB.yaml                    run without this terminal\n"
           "       ddprun attach|stop [JOB], ddprun ps, ddprun logs JOB [--rank R] [-f]\n"
           "       ddprun [--nproc N]                          run the embedded default job\n"
           "       ddprun store --listen HOST:PORT --token-file FILE [--max-conns N]\n"
           "                    [--torch-listen HOST:PORT [--torch-allow LIST]]\n"
           "       ddprun pipeline plan PROFILE --machines N --bandwidth RATE\n"
           "                                                    plan a PipeDream pipeline\n"
           "       ddprun help [COMMAND] | COMMAND --help       help on one command\n"
           "\n"
           "ddprun runs a data-parallel job described by a YAML file (see ddprun-job(5)): it\n"
           "hosts an authenticated rendezvous store, starts a node agent per node, and the\n"
           "agents start the ranks with a torchrun-compatible environment.\n"
           "\nOptions (before or after JOB.yaml):\n");
    ddp__cli_print_opts("global", stdout);
    ddp__cli_print_opts("job", stdout);
    ddp__cli_print_opts("run", stdout);
    printf("\nCommands:\n");
    for (size_t k = 1; k < NCOMMANDS; k++) {
        const char *about = commands[k].about, *nl = strchr(about, '\n');
        printf("  %-9s %.*s%s\n", commands[k].name, nl ? (int)(nl - about) : (int)strlen(about),
               about, nl ? " ..." : "");
    }
    printf("\nstore options:\n");
    ddp__cli_print_opts("store", stdout);
    printf("\nstacks and logs options:\n");
    ddp__cli_print_opts("rank", stdout);
    ddp__cli_print_opts("logs", stdout);
    printf("\nattach options:\n");
    ddp__cli_print_opts("attach", stdout);
    printf("\npipeline plan options:\n");
    ddp__cli_print_opts("pipeline", stdout);
    printf("\npipeline plan and report options:\n");
    ddp__cli_print_opts("output", stdout);
    printf("\nExit status: 0 success, 1 job failed, 2 usage or job-spec error, 3 launch error, "
           "130 interrupted.\nSee ddprun(1), ddprun-job(5) and ddprun-store(7).\n");
}

/* The job of a run, plan or doctor: JOB.yaml with the overrides, a program's command line
 * (torchrun style), or the default job. */
static int load_spec(const struct ddp_cli_opts *o, bool file_needed, struct ddp_job **job)
{
    const char *const *v = o->vals;
    if (o->program) {
        if (v[DDP_OPT_NODES] && v[DDP_OPT_HOSTFILE]) {
            ddp__cli_error("give the hosts with --nodes or with --hostfile, not both");
            return -1;
        }
        char label[300];
        snprintf(label, sizeof(label), "--nodes %s", v[DDP_OPT_NODES] ? v[DDP_OPT_NODES] : "");
        struct ddp_cmdline cl = {.program = o->program,
                                 .args = o->prog_args,
                                 .nargs = o->nprog_args,
                                 .module = v[DDP_OPT_MODULE] != NULL,
                                 .no_python = v[DDP_OPT_NO_PYTHON] != NULL,
                                 .nodes = v[DDP_OPT_NODES],
                                 .nodes_label = label,
                                 .hostfile = v[DDP_OPT_HOSTFILE]};
        return ddp__job_from_cmdline(&cl, o->sets, o->labels, o->nsets, job);
    }
    static const int prog_only[] = {DDP_OPT_NODES, DDP_OPT_HOSTFILE, DDP_OPT_MODULE,
                                    DDP_OPT_NO_PYTHON};
    for (size_t k = 0; k < sizeof(prog_only) / sizeof(prog_only[0]); k++)
        if (v[prog_only[k]]) {
            ddp__cli_error("--nodes, -H, --hostfile, -m and --no-python are for a program run "
                           "without a job file (ddprun [OPTIONS] train.py ARGS...); a job file "
                           "says it with nodes: and command:");
            return -1;
        }
    if (o->npos == 0) {
        if (file_needed) {
            ddp__cli_error("%s: which job file? (ddprun %s JOB.yaml)", o->cmd, o->cmd);
            return -1;
        }
        return ddp__job_load_default(o->sets, o->labels, o->nsets, job);
    }
    return ddp__job_load(o->pos[0], o->sets, o->labels, o->nsets, job);
}

static int load_job(const struct ddp_cli_opts *o, bool file_needed, struct ddp_job **job)
{
    if (load_spec(o, file_needed, job) < 0)
        return -1;
    /* torchrun's --standalone: one node, this machine. */
    if (o->vals[DDP_OPT_STANDALONE] &&
        ((*job)->nnodes != 1 || !ddp__job_host_is_local((*job)->nodes[0].host))) {
        ddp__cli_error("--standalone runs the job on this machine alone, but it lists %zu node%s "
                       "(%s%s): leave out --standalone, or the other hosts",
                       (*job)->nnodes, (*job)->nnodes == 1 ? "" : "s", (*job)->nodes[0].host,
                       (*job)->nnodes > 1 ? ", ..." : "");
        ddp__job_free(*job);
        *job = NULL;
        return -1;
    }
    return 0;
}

static int cmd_run(struct ddp_cli_opts *o)
{
    struct ddp_job *job = NULL;
    if (load_job(o, false, &job) < 0)
        return DDP_EXIT_USAGE;
    /* A launcher taking a job over (cli/supervisor/takeover.c) runs where `ddprun attach --etcd`
     * does. */
    int rc = o->vals[DDP_OPT_DETACH] && !getenv("DDPRUN_TAKEOVER") ? ddp__launch_detached(job)
                                                                   : ddp__launch(job, -1);
    ddp__job_free(job);
    return rc;
}

static int cmd_plan(struct ddp_cli_opts *o)
{
    struct ddp_job *job = NULL;
    if (load_job(o, true, &job) < 0)
        return DDP_EXIT_USAGE;
    char id[160];
    snprintf(id, sizeof(id), "%s-<timestamp>-<random>", job->name);
    ddp__job_print_plan(job, id, stdout);
    ddp__job_free(job);
    return DDP_EXIT_OK;
}

static int cmd_doctor(struct ddp_cli_opts *o)
{
    struct ddp_job *job = NULL;
    if (load_job(o, true, &job) < 0)
        return DDP_EXIT_USAGE;
    int rc = ddp__doctor(job);
    ddp__job_free(job);
    return rc;
}

static int cmd_store(struct ddp_cli_opts *o)
{
    return ddp__cmd_store(o);
}

static int cmd_status(struct ddp_cli_opts *o)
{
    return ddp__cmd_status(o);
}

static int cmd_stacks(struct ddp_cli_opts *o)
{
    return ddp__cmd_stacks(o);
}

static int cmd_attach(struct ddp_cli_opts *o)
{
    if (o->vals[DDP_OPT_ETCD])
        return ddp__cmd_takeover(o);
    if (o->vals[DDP_OPT_PREFIX]) {
        ddp__cli_error("attach: --prefix goes with --etcd");
        return DDP_EXIT_USAGE;
    }
    return ddp__cmd_attach(o);
}

static int cmd_ps(struct ddp_cli_opts *o)
{
    return ddp__cmd_ps(o);
}

static int cmd_logs(struct ddp_cli_opts *o)
{
    return ddp__cmd_logs(o);
}

static int cmd_report(struct ddp_cli_opts *o)
{
    return ddp__cmd_report(o);
}

static int cmd_stop(struct ddp_cli_opts *o)
{
    return ddp__cmd_stop(o);
}

static int cmd_agent(struct ddp_cli_opts *o)
{
    (void)o;
    /* Frames on a terminal would wait forever for bytes nobody types. */
    if (isatty(0)) {
        ddp__cli_error("agent: the node agent takes its orders from ddprun on stdin, not from a "
                       "terminal (see 'ddprun agent --help')");
        return DDP_EXIT_USAGE;
    }
    return ddp__cmd_agent();
}

static int cmd_pipeline(struct ddp_cli_opts *o)
{
    return ddp__cmd_pipeline(o);
}

static int cmd_help(struct ddp_cli_opts *o)
{
    const struct command *c = o->npos ? find_command(o->pos[0]) : NULL;
    if (o->npos && !c) {
        ddp__cli_error("help: no command '%s' (commands: run, plan, doctor, status, stacks, "
                       "attach, ps, logs, stop, store, pipeline, agent, help, version)",
                       o->pos[0]);
        return DDP_EXIT_USAGE;
    }
    if (c)
        usage_of(c);
    else
        usage();
    return DDP_EXIT_OK;
}

static int cmd_version(struct ddp_cli_opts *o)
{
    (void)o;
    printf("ddprun %s\n", DDP_VERSION);
    return DDP_EXIT_OK;
}

/* A program rather than a job file: a .py script, or any word with -m or --no-python. */
static bool is_program(const char *word, const struct ddp_cli_opts *o)
{
    size_t n = strlen(word);
    return o->vals[DDP_OPT_MODULE] || o->vals[DDP_OPT_NO_PYTHON] ||
           (n > 3 && strcmp(word + n - 3, ".py") == 0);
}

int main(int argc, char **argv)
{
    ddp__to_set_argv(argc, argv);
    /* Hidden helpers that ddprun runs itself; their arguments are positional. */
    if (argc >= 2 && strcmp(argv[1], "__probe") == 0)
        return ddp__cmd_probe(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "__code") == 0)
        return ddp__cmd_code(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "__mesh") == 0)
        return ddp__cmd_mesh(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "__ssh-bridge") == 0)
        return ddp__cmd_ssh_bridge(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "__guard") == 0)
        return ddp__cmd_guard(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "__smoke-worker") == 0)
        return ddp__cmd_smoke_worker();
    if (argc == 5 && strcmp(argv[1], "agent") == 0 && strcmp(argv[2], "--rejoin") == 0)
        return ddp__cmd_agent_rejoin(argv[3], argv[4]);
    if (argc >= 3 && strcmp(argv[1], "agent") == 0 &&
        (strcmp(argv[2], "--join") == 0 || strcmp(argv[2], "--token-file") == 0)) {
        const char *at = NULL, *tf = NULL;
        for (int k = 2; k + 1 < argc; k += 2)
            if (strcmp(argv[k], "--join") == 0)
                at = argv[k + 1];
            else if (strcmp(argv[k], "--token-file") == 0)
                tf = argv[k + 1];
        if (argc != 6 || !at || !tf) {
            ddp__cli_error("agent: --join HOST:PORT and --token-file FILE go together (see "
                           "'ddprun agent --help')");
            return DDP_EXIT_USAGE;
        }
        return ddp__cmd_agent_join(at, tf);
    }

    /* Options before the first word are global or a job's (ddprun --set a=b job.yaml); the
     * first word names a command or is the job file of a run. */
    static struct ddp_cli_opts o;
    int i = 1;
    static const char *const lead[] = {"global", "job", "run", NULL};
    if (ddp__cli_parse(argc, argv, &i, lead, true, &o) < 0)
        return DDP_EXIT_USAGE;
    const struct command *c = i < argc ? find_command(argv[i]) : NULL;
    if (c)
        i++;
    else
        c = &commands[0];
    bool leading_help = o.vals[DDP_OPT_HELP], leading_version = o.vals[DDP_OPT_VERSION];
    if (c != &commands[0] && o.vals[DDP_OPT_DETACH]) {
        ddp__cli_error("%s: --detach is for running a job (ddprun --detach JOB.yaml)", c->name);
        return DDP_EXIT_USAGE;
    }
    if (c != &commands[0] && (o.nsets || o.vals[DDP_OPT_LOG_LEVEL]) && !c->groups[0]) {
        ddp__cli_error("%s: takes no job options", c->name);
        return DDP_EXIT_USAGE;
    }
    const char *groups[5] = {"global"};
    for (int g = 0; c->groups[g]; g++)
        groups[g + 1] = c->groups[g];
    o.cmd = c != &commands[0] ? c->name : NULL;
    /* Options before the first word; then a program (torchrun style) takes every word after
     * it as its own arguments, while after a job file options may still follow. */
    if (ddp__cli_parse(argc, argv, &i, groups, true, &o) < 0)
        return DDP_EXIT_USAGE;
    if (c->groups[0] && strcmp(c->groups[0], "job") == 0 && i < argc && is_program(argv[i], &o)) {
        o.program = argv[i];
        o.prog_args = argv + i + 1;
        o.nprog_args = argc - i - 1;
        i = argc;
    }
    if (ddp__cli_parse(argc, argv, &i, groups, false, &o) < 0)
        return DDP_EXIT_USAGE;
    if (o.vals[DDP_OPT_HELP]) {
        if (c == &commands[0] && (leading_help || !o.npos))
            usage();
        else
            usage_of(c);
        return DDP_EXIT_OK;
    }
    if (o.vals[DDP_OPT_VERSION] || (leading_version && c == &commands[0]))
        return cmd_version(&o);
    if (o.npos > (size_t)c->words) {
        if (c == &commands[0])
            ddp__cli_error("unexpected argument '%s' after the job file '%s' (the program to run "
                           "goes in the job file's 'command')",
                           o.pos[1], o.pos[0]);
        else
            ddp__cli_error("%s: unexpected argument '%s' (usage: %s)", o.cmd, o.pos[c->words],
                           c->synopsis);
        return DDP_EXIT_USAGE;
    }
    if (o.vals[DDP_OPT_LOG_LEVEL] && ddp__cli_apply_log_level(o.vals[DDP_OPT_LOG_LEVEL]) < 0)
        return DDP_EXIT_USAGE;
    return c->run(&o);
}
