/* Private declarations shared by the files of the ddprun command. */
#ifndef DDP_CLI_CLI_H
#define DDP_CLI_CLI_H

#include <stdbool.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* Documented exit statuses (man/ddprun.1). */
enum ddp_exit {
    DDP_EXIT_OK = 0,
    DDP_EXIT_JOB_FAILED = 1,
    DDP_EXIT_USAGE = 2,
    DDP_EXIT_LAUNCH = 3,
    DDP_EXIT_INTERRUPTED = 130,
};

enum ddp_opt_id {
#define DDP_OPT(cmd, id, name, arg, help) DDP_OPT_##id,
#include "cli/spec/options.def"
#undef DDP_OPT
    DDP_OPT__COUNT
};

#define DDP_CLI_MAX_SETS 64
#define DDP_CLI_MAX_WORDS 8

/* Parsed options: the last value of each option (borrowed from argv; "" for flags), every
 * --set (and --nproc, as nproc_per_node=N) in order with its label for messages (NULL:
 * "--set KEY=VALUE"), and the words that are not options. */
struct ddp_cli_opts {
    const char *cmd; /* the command ("plan") for messages, or NULL for a run */
    const char *vals[DDP_OPT__COUNT];
    const char *sets[DDP_CLI_MAX_SETS], *labels[DDP_CLI_MAX_SETS];
    size_t nsets;
    char set_buf[DDP_CLI_MAX_SETS][160], label_buf[DDP_CLI_MAX_SETS][160];
    const char *pos[DDP_CLI_MAX_WORDS];
    size_t npos;
    /* A program run without a job file (torchrun style): the program and its arguments. */
    const char *program;
    char *const *prog_args;
    int nprog_args;
};

/*
 * Parses "--name value", "--name=value" and "-h" options of the given option groups
 * (cli/spec/options.def) from argv[*i...] into o. Words that are not options are collected in
 * o->pos, wherever they stand (ddprun plan --set a=b job.yaml), or with stop_at_word parsing
 * stops at the first one (the command name). "--" makes the rest words. Returns 0, or prints
 * an error and returns -1.
 */
int ddp__cli_parse(int argc, char **argv, int *i, const char *const *groups, bool stop_at_word,
                   struct ddp_cli_opts *o);

/* Prints the options of one group, a line each, for a command's --help. */
void ddp__cli_print_opts(const char *group, FILE *f);

/* Sets the log level from a --log-level value; prints an error and returns -1 if unknown. */
int ddp__cli_apply_log_level(const char *lvl);

/* Prints "ddprun: error: ..." to stderr. */
void ddp__cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

struct ddp_job;

/* ---- the commands (each in its file) ---- */

/* `ddprun store` with its parsed options (cli/cmd/store.c). */
int ddp__cmd_store(const struct ddp_cli_opts *o);
/* `ddprun status [JOB]` and `ddprun stacks [JOB] [--rank R]` (cli/cmd/status.c). */
int ddp__cmd_status(const struct ddp_cli_opts *o);
int ddp__cmd_stacks(const struct ddp_cli_opts *o);
/* attach, ps, logs, stop (cli/cmd/attach.c). */
int ddp__cmd_attach(const struct ddp_cli_opts *o);
int ddp__cmd_ps(const struct ddp_cli_opts *o);
int ddp__cmd_logs(const struct ddp_cli_opts *o);
int ddp__cmd_stop(const struct ddp_cli_opts *o);
/* `ddprun pipeline plan PROFILE` (cli/cmd/pipeline.c). */
int ddp__cmd_pipeline(const struct ddp_cli_opts *o);
/* `ddprun agent` (cli/agent/agent.c). */
int ddp__cmd_agent(void);
/* `ddprun attach --etcd`: takes a job over whose launcher died (cli/supervisor/takeover.c). */
int ddp__cmd_takeover(const struct ddp_cli_opts *o);
/* The command line, for the launcher's record in etcd. */
void ddp__to_set_argv(int argc, char **argv);
/* The hidden `ddprun __ssh-bridge HOST PORT USER IDENTITY KNOWN_HOSTS STRICT REMOTE_DDPRUN
 * GRACE_MS`: a node agent on another host, reached over SSH (cli/provision/ssh_bridge.c). */
int ddp__cmd_ssh_bridge(int argc, char **argv);
/* The hidden `ddprun __smoke-worker` of the default job without the example (cli/cmd/smoke.c). */
int ddp__cmd_smoke_worker(void);
/* `ddprun doctor`: checks every node of the job (cli/doctor/doctor.c); 0 when all pass, else 1. */
int ddp__doctor(const struct ddp_job *job);
/* Its etcd part (cli/doctor/etcd.c): prints each endpoint's answer and the prefix check; the
 * failures' count. host/port: the first TCP endpoint, for the nodes' check (host "" if none). */
int ddp__doctor_etcd(const struct ddp_job *job, char *host, size_t n, int *port);
/* The file the doctor compares between nodes (cli/doctor/code.c): the program, or for python
 * the script (*script set), or NULL (a shell command, python -c/-m/-). */
const char *ddp__code_file(const struct ddp_job *job, bool *script);
/* The module a Python job runs with -m (python -m NAME), or NULL (cli/doctor/code.c). */
const char *ddp__py_module(const struct ddp_job *job);
/* "code HEX\n" (its SHA-256's first 8 bytes) or "code none WHY\n" for file from workdir. */
void ddp__code_line(const char *workdir, const char *file, bool script, char *out, size_t n);
/* The hidden `ddprun __code WORKDIR FILE program|script` the doctor runs on a node. */
int ddp__cmd_code(int argc, char **argv);
/* The environment of the doctor's checks on a node, as its ranks get it (cli/doctor/env.c):
 * for a node reached by SSH a shell prefix "export 'K=V' ...; " (the export rule's variables,
 * then the job's env; "" when none), malloc'd; here and through srun {"env", "K=V", ..., NULL}
 * (the job's env), each string and the array malloc'd. NULL when out of memory. */
char *ddp__doctor_env_sh(const struct ddp_job *job);
char **ddp__doctor_env_argv(const struct ddp_job *job);
/* srun's words for one step of the doctor's on a node (its --nodelist and the command follow). */
#define DDP__DOCTOR_SRUN                                                                           \
    "srun", "--nodes=1", "--ntasks=1", "--overlap", "--quiet", "--job-name=ddprun-doctor"
/* The doctor's mesh check (cli/doctor/mesh.c): the nodes with part[i] run `__mesh` at once
 * (as a launch reaches them; over ssh[i], a node's open session, where not NULL), each
 * connecting back to the listener lfd (port), and report
 * which others they cannot reach where those nodes' ranks would listen. why: nnodes strings of
 * whyn bytes, "" for a node that reached every other, else why it fails: "cannot reach 'host'
 * (ADDR): WHY; ..., where its ranks would listen (...)" or "its mesh check ..." (it could not
 * run). False when it did not run (fewer than two nodes, or all
 * local). */
struct ddp__ssh;
bool ddp__doctor_mesh(const struct ddp_job *job, const char *self, int lfd, int port,
                      const bool *part, struct ddp__ssh *const *ssh, char *why, size_t whyn);
/* The hidden `ddprun __mesh HOST:PORT INDEX [IFACE]` it runs on each node. */
int ddp__cmd_mesh(int argc, char **argv);
/* Binds a free port and connects to host:port within 3 s; writes what happened to out: "ok port
 * P iface I gpus G nofile SOFT HARD[ clock OFFSET ERROR]" (0), or why not (2: no port to listen
 * on; 1: the store not reached) (cli/doctor/probe.c). */
int ddp__doctor_probe(const char *host, int port, char *out, size_t n);
/* The doctor's listener answers each probe with its clock (CLOCK_REALTIME, 8 bytes), which
 * the probe's line gives as " clock OFFSET_NS ERROR_NS" (cli/doctor/probe.c). */
void ddp__doctor_stamp(int fd);
/* The hidden `ddprun __probe HOST:PORT` the doctor runs on nodes (cli/doctor/doctor.c). */
int ddp__cmd_probe(int argc, char **argv);
/* Runs a job to the end; returns the exit status (enum ddp_exit) (cli/supervisor/supervise.c). With
 * ready_fd >= 0 (ddprun --detach, cli/supervisor/detach.c), once the job can be reached it writes
 * "OK ID\tLOGDIR\n" there, closes it, and sends its console to LOGDIR/console.log. */
int ddp__launch(const struct ddp_job *job, int ready_fd);
/* ddprun --detach: runs the job in a process of its own, without this terminal; returns once
 * it can be reached (attach, logs, stop), or with the status of its failed start. */
int ddp__launch_detached(const struct ddp_job *job);

/* ---- system helpers (cli/sys/sys.c) ---- */

/* Blocks SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 (to be read from a signalfd
 * made from *set) in the calling thread, saving the old mask in *old, and ignores SIGPIPE. */
void ddp__block_job_signals(sigset_t *set, sigset_t *old);
/* Signals every direct child of this process (orphans of a subreaper included) but spare (0:
 * none); returns how many. */
int ddp__kill_children(int sig, pid_t spare);
/* SIGKILLs and reaps every child but spare (the node agent's guard, cli/agent/guard.h), again
 * as orphans reparent to this subreaper, until none is left. */
void ddp__sweep_children(pid_t spare);
/* The local address the kernel would use to reach host (no packet is sent); 0 or -1. */
int ddp__route_source(const char *host, char *out, size_t n);
/* A TCP port free now on every address of this machine, for rank 0's own TCPStore
 * (rendezvous.torch_store: rank0's MASTER_PORT), or -1. A second or more passes before rank 0
 * binds it (Python imports torch), and a port of the kernel's range for outgoing connections
 * (ip_local_port_range) may be taken meanwhile by any process's connect ("Address already in
 * use" in rank 0, seen in CI): it is drawn at random from ddp__port_pool's ports outside that
 * range, checked as TCPStore binds (SO_REUSEADDR); where there are none, the kernel's choice. */
int ddp__free_port(void);
/* The ports outside the kernel's ephemeral range (range: ip_local_port_range's text, "32768
 * 60999"): DDP__PORT_POOL_FLOOR up to below it where at least DDP__PORT_POOL_MIN fit, else above it
 * up to 65535 where they fit there; false where neither (or the text is malformed). */
#define DDP__PORT_POOL_FLOOR 10000
#define DDP__PORT_POOL_MIN 1000
bool ddp__port_pool(const char *range, int *lo, int *hi);
/* HOST and PORT of an http:// or https:// URL (up to a ',' or '/'; 80 or 443 unless given);
 * -1 for another scheme (unix://) or a malformed one. */
int ddp__url_hostport(const char *url, char *host, size_t n, int *port);
/* The host a node reaches the job's store at: the built-in store's (store_addr HOST:PORT), or
 * with etcd (store_addr "etcd") the first endpoint's host, or master for a Unix socket. 0/-1. */
int ddp__store_host(const char *store_addr, const char *etcd_endpoints, const char *master,
                    char *host, size_t n);
/* The network interface (and its address, when ip is not NULL) that routes to host; 0 or -1. */
int ddp__route_iface(const char *host, char *ifname, size_t n, char *ip, size_t ipn);

/* The folder of this user's running jobs' control sockets (JOB_ID.sock), used by `ddprun
 * status` and `ddprun stacks`: $XDG_RUNTIME_DIR/ddprun, else /tmp/ddprun-UID. With create it is
 * made (mode 0700). It must belong to this user and be closed to others: 0, or -1 with a
 * message in why. */
int ddp__control_dir(char *out, size_t n, bool create, char *why, size_t whyn);
/* How many jobs' JOB_ID.logdir files (their log folders, for `ddprun logs`) the control
 * folder keeps: the newest, the older ones pruned as each job starts. */
#define DDP__LOGDIR_KEEP 200

/* A child with its stdin, stdout and stderr piped to us (the last two non-blocking). */
struct ddp__child {
    pid_t pid;
    int in_fd, out_fd, err_fd;
};
/* Starts prog (looked up in PATH; NULL: this ddprun again, argv[0] only its name) with argv, in
 * a process group of its own, with the signal mask mask (when not NULL) and the parent-death
 * signal pdeathsig (0: none). 0, or -1 with errno. */
int ddp__spawn_piped(const char *prog, char *const argv[], int pdeathsig, const sigset_t *mask,
                     struct ddp__child *out);

/* The control socket at path, connected: the fd, or -1 with errno (cli/cmd/status.c). */
int ddp__control_dial(const char *path);
/* The control socket of JOB (its id, a unique start of one, or its log folder), or of the only
 * running job of this user when job is NULL: a connected fd, or -1 after an error message
 * that starts with cmd. */
int ddp__control_connect(const char *cmd, const char *job);

/* Removes from this process's environment the SLURM_* variables that describe a job step and
 * its tasks, keeping those of the allocation (cli/provision/slurm.c). */
void ddp__slurm_scrub_env(void);
/* The state of the Slurm allocation ddprun runs in (SLURM_JOB_ID), asked of scontrol: 1 while
 * it runs; 0 once it ended, with how in state ("CANCELLED", "TIMEOUT", ..., "ENDED" when Slurm
 * forgot it); -1 when Slurm cannot tell (then assume it runs). Takes up to a few seconds. */
int ddp__slurm_alloc_state(char *state, size_t n);
/* Each of the job's nodes' NodeAddr where it is not the node's name (a name only Slurm knows,
 * with NodeAddr=10.1.2.3), from one `scontrol show node -o SLURM_JOB_NODELIST` (within 5 s):
 * addr[i] (j->nnodes of them) malloc'd, or NULL where the name is the address (resolved as a
 * host name) or Slurm did not say. 0, or -1 when scontrol could not be asked (every addr[i]
 * is then NULL). */
int ddp__slurm_node_addrs(const struct ddp_job *j, char **addr);

/* Ends a provisioner's child pid: level 1 SIGTERM to it alone (it takes down what it started
 * where that runs, then leaves), level 2 SIGKILL to its process group. */
void ddp__end_child(pid_t pid, int level);

/* Runs argv[0] (looked up in PATH) with argv, stdin and stderr on /dev/null, and keeps what it
 * writes on stdout (up to n - 1 bytes, NUL-terminated, kept in every case) and its wait status:
 * 0, or -1 when it could not start, had not ended within timeout_ms or wrote more than out
 * holds (then it is SIGKILLed). */
int ddp__run_capture(char *const argv[], char *out, size_t n, int timeout_ms, int *status);

/* Whether prog runs here from workdir: a path (relative to workdir), or a name in PATH. */
bool ddp__program_here(const char *prog, const char *workdir);
/* The same, writing where it was found (PATH's relative entries taken from workdir). */
bool ddp__program_path(const char *prog, const char *workdir, char *out, size_t n);

#endif
