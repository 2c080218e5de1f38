/* The environment a node agent gives each rank, and the rest of a rank's start in its process
 * (cli/agent/rank_env.h). */
#include "cli/agent/rank_env.h"
#include "cli/provision/slurm.h"
#include "cli/sys/cpubind.h"
#include "cli/agent/errfile.h"
#include "cli/spec/pipe_layout.h"
#include "cli/diag/pystacks.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/banned.h"

const char *const ddp__rank_round_vars[] = {"RANK",
                                            "WORLD_SIZE",
                                            "GROUP_RANK",
                                            "GROUP_WORLD_SIZE",
                                            "ROLE_RANK",
                                            "ROLE_WORLD_SIZE",
                                            "MASTER_ADDR",
                                            "MASTER_PORT",
                                            "TORCHELASTIC_RESTART_COUNT",
                                            "DDPRUN_STORE_ADDR",
                                            "DDPRUN_NODE_ADDR",
                                            "DDPRUN_PIPELINE_STAGE",
                                            "DDPRUN_PIPELINE_REPLICA",
                                            NULL};

static int set_env_int(const char *k, long v)
{
    char s[32];
    snprintf(s, sizeof(s), "%ld", v);
    return setenv(k, s, 1);
}

/* As torchrun's agent: PyTorch's NCCL watchdog tears a rank down on a collective's error or
 * timeout rather than leave it hanging. torch up to 2.1 reads NCCL_ASYNC_ERROR_HANDLING; 2.2
 * and later TORCH_NCCL_ASYNC_ERROR_HANDLING first, and warn on every rank when the old name is
 * set at all. Both are set, to 1 or to the value of the one the node, the shell's exported
 * variables or the job set; the old name ddprun set itself is marked for the Python ranks'
 * sitecustomize, which drops it under torch 2.2 and later (cli/diag/pystacks.c). */
static void nccl_async_error_handling(void)
{
    const char *o = getenv("NCCL_ASYNC_ERROR_HANDLING"),
               *n = getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
    char old[32], now[32];
    snprintf(old, sizeof(old), "%s", o ? o : "1");
    snprintf(now, sizeof(now), "%s", n ? n : old);
    if (!n)
        setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", now, 1);
    if (o) {
        unsetenv("DDPRUN_PY_NCCL_AEH");
        return;
    }
    setenv("NCCL_ASYNC_ERROR_HANDLING", now, 1);
    setenv("DDPRUN_PY_NCCL_AEH", "1", 1);
}

void ddp__agent_rank_env(const struct ddp__agent_start *st, const struct ddp__agent_join *j,
                         int local_rank, const char *iface, const char *node_addr,
                         const char *store_addr, int tokfd, int progfd, const char *error_file)
{
    /* Slurm's description of the agent's own step is not the rank's (cli/provision/slurm.c). */
    ddp__slurm_scrub_env();
    /* The launching shell's variables (the export rule) first: ddprun's own and the job's env
     * below win over them. */
    for (char **e = st->shell_env; e && *e; e++)
        putenv(*e);
    int rank = (int)st->rank_offset + local_rank;
    set_env_int("RANK", rank);
    set_env_int("LOCAL_RANK", local_rank);
    set_env_int("WORLD_SIZE", st->world_size);
    set_env_int("LOCAL_WORLD_SIZE", st->nlocal);
    set_env_int("GROUP_RANK", st->node_rank);
    set_env_int("GROUP_WORLD_SIZE", st->nnodes);
    setenv("ROLE_NAME", "default", 1);
    set_env_int("ROLE_RANK", rank);
    set_env_int("ROLE_WORLD_SIZE", st->world_size);
    setenv("MASTER_ADDR", st->master_addr, 1);
    set_env_int("MASTER_PORT", st->master_port);
    set_env_int("TORCHELASTIC_RESTART_COUNT", st->restart_count);
    set_env_int("TORCHELASTIC_MAX_RESTARTS", st->max_restarts);
    setenv("TORCHELASTIC_RUN_ID", st->job_id, 1);
    /* torch's @record writes a failing rank's exception there (the job's env may name another) */
    if (error_file[0])
        setenv("TORCHELASTIC_ERROR_FILE", error_file, 1);
    else
        unsetenv("TORCHELASTIC_ERROR_FILE");
    /* True: every rank is a client of MASTER_ADDR:MASTER_PORT, the launcher's TCPStore port
     * (torch's agent store); False: rank 0 hosts a TCPStore there. */
    setenv("TORCHELASTIC_USE_AGENT_STORE", st->agent_store ? "True" : "False", 1);
    setenv("DDPRUN_JOB_ID", st->job_id, 1);
    setenv("DDPRUN_STORE_ADDR", store_addr ? store_addr : st->store_addr, 1);
    if (strcmp(st->store_addr, "etcd") == 0) { /* rendezvous: {backend: etcd} */
        setenv("DDPRUN_ETCD_ENDPOINTS", j->etcd_endpoints, 1);
        setenv("DDPRUN_ETCD_PREFIX", j->etcd_prefix, 1);
        const char *tls[][2] = {{"DDPRUN_ETCD_CA", j->etcd_ca},
                                {"DDPRUN_ETCD_CERT", j->etcd_cert},
                                {"DDPRUN_ETCD_KEY", j->etcd_key}};
        for (int k = 0; k < 3; k++)
            if (*tls[k][1])
                setenv(tls[k][0], tls[k][1], 1);
            else
                unsetenv(tls[k][0]);
        if (node_addr[0])
            setenv("DDPRUN_NODE_ADDR", node_addr, 1);
    }
    setenv("DDPRUN_BACKEND", st->backend, 1);
    setenv("DDPRUN_NODE", st->host_label, 1);
    set_env_int("DDPRUN_TOKEN_FD", tokfd);
    /* The progress page libddp keeps its flight recorder in (cli/diag/node.h). */
    if (progfd >= 0)
        set_env_int("DDPRUN_PROGRESS_FD", progfd);
    else
        unsetenv("DDPRUN_PROGRESS_FD");
    unsetenv("DDPRUN_TOKEN_FILE");
    if (st->checkpoint_dir[0])
        setenv("DDPRUN_CHECKPOINT_DIR", st->checkpoint_dir, 1);
    if (!getenv("PYTHONUNBUFFERED"))
        setenv("PYTHONUNBUFFERED", "1", 1); /* lines stream as they are printed, as with -u */
    for (char **e = st->env; *e; e++)
        putenv(*e);
    nccl_async_error_handling();
    /* A pipeline job's ranks: this rank's stage and its replica there (cli/spec/pipe_layout.h). */
    int stage, replica;
    if (ddp__pipe_env_rank(getenv("DDPRUN_PIPELINE_REPLICAS"), rank, &stage, &replica)) {
        set_env_int("DDPRUN_PIPELINE_STAGE", stage);
        set_env_int("DDPRUN_PIPELINE_REPLICA", replica);
    } else {
        unsetenv("DDPRUN_PIPELINE_STAGE");
        unsetenv("DDPRUN_PIPELINE_REPLICA");
    }
    /* Gloo, NCCL and TensorPipe bind to the interface that reaches the other nodes, not to
     * whatever the host name resolves to (often 127.0.1.1), unless the job or the node's
     * environment chose one. */
    static const char *const ifvars[] = {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                                         "TP_SOCKET_IFNAME"};
    for (int k = 0; k < 3 && iface[0]; k++)
        if (!getenv(ifvars[k]))
            setenv(ifvars[k], iface, 1);
}

/* A warm interpreter's start (cli/agent/warm.h), once the rank's environment is made: that
 * environment to x->snap, then the round's variables unset. */
static bool warm_snapshot(const struct ddp__rank_warm *x)
{
    extern char **environ;
    for (char **e = environ; e && *e; e++)
        if (ddp_write_all(x->snap, *e, strlen(*e) + 1) < 0)
            return false;
    close(x->snap);
    for (int k = 0; ddp__rank_round_vars[k]; k++)
        unsetenv(ddp__rank_round_vars[k]);
    return true;
}

/* Then, after the Python shim's variables: the descriptors it takes at its rank's start and its
 * imports in DDPRUN_PY_WARM*; SIGINT and SIGTERM ignored until then (a round's stop signals
 * the agent's whole process group), their dispositions kept for then. False: it cannot wait
 * (no sitecustomize will run). */
static bool warm_env(const struct ddp__rank_warm *x)
{
    if (!getenv("DDPRUN_PY_SHIM"))
        return false;
    int c = dup(x->ctl), o = dup(x->out), e = dup(x->err); /* without CLOEXEC */
    if (c < 0 || o < 0 || e < 0)
        return false;
    struct sigaction si, st;
    sigaction(SIGINT, NULL, &si);
    sigaction(SIGTERM, NULL, &st);
    char spec[64];
    snprintf(spec, sizeof(spec), "%d,%d,%d,%c,%c", c, o, e, si.sa_handler == SIG_IGN ? 'I' : 'D',
             st.sa_handler == SIG_IGN ? 'I' : 'D');
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    setenv("DDPRUN_PY_WARM", spec, 1);
    setenv("DDPRUN_PY_WARM_IMPORTS", x->imports, 1);
    setenv("DDPRUN_PY_WARM_LISTED", x->listed ? "1" : "0", 1);
    return true;
}

void ddp__agent_exec_rank(const struct ddp__rank_exec *x, int ofd, int efd, int tfd, int xfd,
                          int pfd, pid_t agent)
{
    const struct ddp__agent_start *st = x->st;
    int err;
    sigprocmask(SIG_SETMASK, x->mask, NULL);
    signal(SIGPIPE, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != agent)
        _exit(127);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    if (x->warm) /* (its rank's own come later, cli/agent/warm.py) */
        devnull = open("/dev/null", O_WRONLY);
    dup2(x->warm ? devnull : ofd, 1);
    dup2(x->warm ? devnull : efd, 2);
    int tokfd = dup(tfd);                  /* without CLOEXEC: the worker reads the token from it */
    int progfd = pfd >= 0 ? dup(pfd) : -1; /* without CLOEXEC */
    char ef[64] = "";
    if (x->errfd >= 0)
        ddp__ef_path(x->errfd, agent, ef, sizeof(ef));
    ddp__agent_rank_env(st, x->join, x->local_rank, x->iface, x->node_addr, x->store_addr, tokfd,
                        progfd, ef);
    bool warm_ok = !x->warm || warm_snapshot(x->warm);
    ddp__pys_rank_env(x->pyshim, x->pydump);
    if (x->warm && (!warm_ok || !warm_env(x->warm))) {
        int msg[2] = {3, 0};
        ssize_t w = write(xfd, msg, sizeof(msg));
        (void)w;
        _exit(126);
    }
    ddp__cpubind_apply(x->bound ? st->bind_to : DDP__BIND_NONE, x->cpus, x->sharers, x->local_rank);
    if (chdir(st->workdir) != 0) {
        err = errno;
        int msg[2] = {1, err};
        ssize_t w = write(xfd, msg, sizeof(msg));
        (void)w;
        _exit(127);
    }
    if (st->shell[0])
        execl("/bin/sh", "sh", "-c", st->shell, (char *)NULL);
    else
        execvp(st->argv[0], st->argv);
    err = errno;
    int msg[2] = {2, err};
    ssize_t w = write(xfd, msg, sizeof(msg));
    (void)w;
    _exit(127);
}

void ddp__agent_exec_error(const struct ddp__agent_start *st, int what, int err, char *buf,
                           size_t n)
{
    if (what == 1) {
        snprintf(buf, n, "ddprun agent: cannot enter workdir '%s': %s", st->workdir, strerror(err));
        return;
    }
    /* where a program not found was looked for: the workdir for a relative path, the ranks'
     * PATH for a bare name */
    const char *cmd = st->shell[0] ? "/bin/sh" : st->argv[0];
    char where[PATH_MAX + 64] = "";
    if (err == ENOENT && !st->shell[0] && !strchr(cmd, '/'))
        snprintf(where, sizeof(where), " (no such program on the ranks' PATH)");
    else if (err == ENOENT && !st->shell[0] && cmd[0] != '/')
        snprintf(where, sizeof(where), " (a path relative to the workdir, %s)", st->workdir);
    snprintf(buf, n, "ddprun agent: cannot run '%s': %s%s", cmd, strerror(err), where);
}

void ddp__agent_spawn_error(int lr, int err, int same, int nw, char *buf, size_t n)
{
    struct rlimit rl;
    if (same >= 0)
        snprintf(buf, n, "ddprun agent: cannot start local rank %d: %s (as local rank %d)", lr,
                 strerror(err), same);
    else if ((err == EMFILE || err == ENFILE) && getrlimit(RLIMIT_NOFILE, &rl) == 0)
        snprintf(buf, n,
                 "ddprun agent: cannot start local rank %d: %s (the limit on open files here is "
                 "%llu, and the agent holds about 6 for each of its %d ranks: raise it with "
                 "ulimit -n; ddprun doctor checks it)",
                 lr, strerror(err), (unsigned long long)rl.rlim_cur, nw);
    else
        snprintf(buf, n, "ddprun agent: cannot start local rank %d: %s", lr, strerror(err));
}
