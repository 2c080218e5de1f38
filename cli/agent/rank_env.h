/* The environment a node agent gives each rank (cli/agent/rank_env.c), set in the rank's process
 * before it execs: torchrun's variables, ddprun's, the job's; and the rest of that process's
 * start (descriptors, CPUs, workdir, exec). */
#ifndef DDP_CLI_AGENT_ENV_H
#define DDP_CLI_AGENT_ENV_H

#include "cli/proto/agent_proto.h"

#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>

/* iface/node_addr: the node's interface and address toward the store ("" unknown); store_addr:
 * where the rank reaches the store (its agent's proxy, cli/agent/store_proxy.h), NULL for
 * st->store_addr; tokfd: the
 * token's descriptor; progfd: the progress page's, or -1; error_file: the rank's
 * TORCHELASTIC_ERROR_FILE (cli/agent/errfile.h), "" for none. */
void ddp__agent_rank_env(const struct ddp__agent_start *st, const struct ddp__agent_join *j,
                         int local_rank, const char *iface, const char *node_addr,
                         const char *store_addr, int tokfd, int progfd, const char *error_file);

/* The variables a round sets that the next one may change (RANK, MASTER_PORT, ...): a warm
 * interpreter starts without them and is given them when its rank starts (cli/agent/warm.h).
 * NULL-terminated. */
extern const char *const ddp__rank_round_vars[];

/* A warm interpreter's start (cli/agent/warm.h): the child's ends of its control socket and of
 * the rank's stdout and stderr, which it takes only when its rank starts (until then both go to
 * /dev/null), and where its environment is written, before the round's variables go. */
struct ddp__rank_warm {
    int ctl, out, err, snap;
    const char *imports; /* warm.imports, comma-separated */
    bool listed;         /* given in the job: a failure to import one is said */
};

/* What starting one rank's process takes from its agent (cli/agent/agent.c). */
struct ddp__rank_exec {
    const struct ddp__agent_start *st;
    const struct ddp__agent_join *join;
    const char *iface, *node_addr, *store_addr; /* as for ddp__agent_rank_env */
    const sigset_t *mask;                       /* the signal mask the rank starts with */
    int pyshim;                    /* the ranks' sitecustomize (cli/diag/pystacks.h), or -1 */
    int local_rank, pydump, errfd; /* its Python tracebacks' and error file's fds, or -1 */
    bool bound;                    /* bind_to: its CPUs, and how many local ranks share them */
    const cpu_set_t *cpus;
    int sharers;
    const struct ddp__rank_warm *warm; /* a warm interpreter for the slot, or NULL */
};

/* In the rank's forked process: the agent's death kills it, stdin is /dev/null, stdout and
 * stderr are ofd and efd, the token is read from tfd and the progress page is pfd (-1: none),
 * then its environment, CPUs and workdir, and exec. A failure is written to xfd as two ints
 * (1: the workdir, 2: the exec; errno) before it exits with 127. A warm interpreter (x->warm)
 * that could not run Python's sitecustomize (DDPRUN_PYTHON_STACKS=0) writes 3 and exits. */
void ddp__agent_exec_rank(const struct ddp__rank_exec *x, int ofd, int efd, int tfd, int xfd,
                          int pfd, pid_t agent) __attribute__((noreturn));

/* What the agent says of a rank whose process failed before its exec (what: 1 the workdir, 2
 * the exec; err its errno): where a program not found was looked for. */
void ddp__agent_exec_error(const struct ddp__agent_start *st, int what, int err, char *buf,
                           size_t n);
/* Of local rank lr that could not even be forked (err): as local rank same (-1: none) before it,
 * or the limit on open files that nw ranks reach first. */
void ddp__agent_spawn_error(int lr, int err, int same, int nw, char *buf, size_t n);

#endif
