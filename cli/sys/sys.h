/* System helpers of the ddprun command (cli/sys/sys.c): signals, children, routes and ports,
 * the control folder, programs run and found. Also the documented exit statuses. */
#ifndef DDP_CLI_SYS_SYS_H
#define DDP_CLI_SYS_SYS_H

#include <stdbool.h>
#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

/* Documented exit statuses (man/ddprun.1). */
enum ddp_exit {
    DDP_EXIT_OK = 0,
    DDP_EXIT_JOB_FAILED = 1,
    DDP_EXIT_USAGE = 2,
    DDP_EXIT_LAUNCH = 3,
    /* the job fell below elastic.min_nodes through node loss: worth requeueing (EX_TEMPFAIL) */
    DDP_EXIT_REQUEUE = 75,
    DDP_EXIT_INTERRUPTED = 130,
};

/* Blocks SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 (to be read from a signalfd
 * made from *set) in the calling thread, saving the old mask in *old, and ignores SIGPIPE. */
void ddp__block_job_signals(sigset_t *set, sigset_t *old);
/* Signals every direct child of this process (orphans of a subreaper included) but those spare
 * is true of (spare NULL: none); returns how many. */
int ddp__kill_children(int sig, bool (*spare)(pid_t));
/* SIGKILLs and reaps every child but those spare is true of (the node agent's guard,
 * cli/agent/guard.h, and its SSH bridges, cli/agent/fanout.h), again as orphans reparent to
 * this subreaper, until none is left. */
void ddp__sweep_children(bool (*spare)(pid_t));
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

/* Reads what waits on fd (a child's stderr, non-blocking) into b and hands each whole line to
 * line (without its '\n'); a line over 4000 bytes goes in pieces, and at EOF the rest goes out.
 * 1 at EOF or an error (the caller closes fd), 0 when nothing more waits now. */
struct ddp_buf;
/* Reads and drops what waits on fd (a child's stdout nothing is expected on): true at its end or
 * an error (the caller closes fd). */
bool ddp__drain(int fd);
int ddp__read_lines(int fd, struct ddp_buf *b, void (*line)(void *arg, const char *s, size_t n),
                    void *arg);

/* Ends a provisioner's child pid: level 1 SIGTERM to it alone (it takes down what it started
 * where that runs, then leaves), level 2 SIGKILL to its process group. */
void ddp__end_child(pid_t pid, int level);

/* Runs argv[0] (looked up in PATH) with argv, stdin and stderr on /dev/null, and keeps what it
 * writes on stdout (up to n - 1 bytes, NUL-terminated, kept in every case) and its wait status:
 * 0, or -1 when it could not start, had not ended within timeout_ms or wrote more than out
 * holds (then it is SIGKILLed). */
int ddp__run_capture(char *const argv[], char *out, size_t n, int timeout_ms, int *status);

/* The folder of this ddprun executable (/proc/self/exe's); 0 or -1. */
int ddp__self_dir(char *out, size_t n);
/* Appends that folder to this process's PATH unless PATH names it already: a node agent's ranks
 * then find the programs installed beside ddprun (ddprun-fmnist), or built beside it in a
 * build tree, as Open MPI's --prefix gives its ranks its bin folder; their own come first. */
void ddp__path_add_self(void);
/* Whether prog runs here from workdir: a path (relative to workdir), or a name in PATH. */
bool ddp__program_here(const char *prog, const char *workdir);
/* The same, writing where it was found (PATH's relative entries taken from workdir; then the
 * folder of ddprun, which ends the ranks' PATH). */
bool ddp__program_path(const char *prog, const char *workdir, char *out, size_t n);

#endif
