/*
 * The embedded default job: a local N-rank smoke job. ddprun hosts an
 * authenticated store, starts N copies of itself as workers with a
 * torchrun-style environment, and each worker meets the others through the
 * store (barrier, all-gather). The full launcher (YAML jobs, logs, SSH) and
 * the Fashion-MNIST default replace this in later issues.
 */
#include "cli/cli.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

#define MAX_NPROC 256

static void *serve(void *arg)
{
    ddp_store_server_run(arg);
    return NULL;
}

static void kill_all(const pid_t *pids, int n, int sig)
{
    for (int k = 0; k < n; k++)
        if (pids[k] > 0)
            kill(pids[k], sig);
}

/* Forks one worker; the token travels through a pipe named by DDPRUN_TOKEN_FD. */
static pid_t spawn_worker(int rank, int n, int port, const char *token)
{
    int tp[2], ep[2];
    if (pipe2(tp, O_CLOEXEC) != 0 || pipe2(ep, O_CLOEXEC) != 0)
        return -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char v[64];
        /* Die with ddprun, whatever path it takes out. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = dup(tp[0]); /* a copy without CLOEXEC survives exec */
        snprintf(v, sizeof(v), "%d", rank);
        setenv("RANK", v, 1);
        setenv("LOCAL_RANK", v, 1);
        snprintf(v, sizeof(v), "%d", n);
        setenv("WORLD_SIZE", v, 1);
        setenv("LOCAL_WORLD_SIZE", v, 1);
        setenv("GROUP_RANK", "0", 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(v, sizeof(v), "%d", port);
        setenv("MASTER_PORT", v, 1);
        snprintf(v, sizeof(v), "127.0.0.1:%d", port);
        setenv("DDPRUN_STORE_ADDR", v, 1);
        snprintf(v, sizeof(v), "%d", fd);
        setenv("DDPRUN_TOKEN_FD", v, 1);
        execl("/proc/self/exe", "ddprun", "__smoke-worker", (char *)NULL);
        int e = errno;
        ssize_t w = write(ep[1], &e, sizeof(e));
        (void)w;
        _exit(127);
    }
    close(tp[0]);
    close(ep[1]);
    int rc = ddp_write_all(tp[1], token, strlen(token));
    close(tp[1]);
    /* The CLOEXEC error pipe reads EOF on a successful exec, or the exec's errno. */
    int e = 0;
    ssize_t got = ddp_read_eintr(ep[0], &e, sizeof(e));
    close(ep[0]);
    if (got == (ssize_t)sizeof(e)) {
        ddp__cli_error("cannot start rank %d: exec failed: %s", rank, strerror(e));
        waitpid(pid, NULL, 0);
        return -1;
    }
    if (rc < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

int ddp__cmd_default_job(const char *vals[DDP_OPT__COUNT])
{
    int n = 2, timeout_s = 60, rc = DDP_EXIT_OK;
    char token[DDP_STORE_TOKEN_HEX + 1];
    struct ddp_store_server *srv = NULL;
    pthread_t th;
    pid_t pids[MAX_NPROC] = {0};
    int status[MAX_NPROC];

    if (vals[DDP_OPT_NPROC]) {
        char *end;
        long v = strtol(vals[DDP_OPT_NPROC], &end, 10);
        if (*end || v < 1 || v > MAX_NPROC) {
            ddp__cli_error("--nproc '%s' is not a number from 1 to %d", vals[DDP_OPT_NPROC],
                           MAX_NPROC);
            return DDP_EXIT_USAGE;
        }
        n = (int)v;
    }
    if (vals[DDP_OPT_TIMEOUT]) {
        char *end;
        long v = strtol(vals[DDP_OPT_TIMEOUT], &end, 10);
        if (*end || v < 1 || v > 86400) {
            ddp__cli_error("--timeout '%s' is not a number of seconds from 1 to 86400",
                           vals[DDP_OPT_TIMEOUT]);
            return DDP_EXIT_USAGE;
        }
        timeout_s = (int)v;
    }
    if (ddp_store_token_generate(token) < 0) {
        ddp__cli_error("cannot generate a job token");
        return DDP_EXIT_LAUNCH;
    }
    struct ddp_store_server_opts o = {.host = "127.0.0.1", .port = 0, .token = token,
                                      .token_len = strlen(token)};
    int r = ddp_store_server_new(&o, &srv);
    if (r < 0) {
        ddp__cli_error("cannot start the rendezvous store: %s", ddp_strerror(r));
        explicit_bzero(token, sizeof(token));
        return DDP_EXIT_LAUNCH;
    }
    int port = ddp_store_server_port(srv);
    if (pthread_create(&th, NULL, serve, srv) != 0) {
        ddp_store_server_free(srv);
        explicit_bzero(token, sizeof(token));
        return DDP_EXIT_LAUNCH;
    }

    /* Signals are taken synchronously below, so block them before forking. */
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old);

    fprintf(stderr, "ddprun: default job: %d local ranks, store on 127.0.0.1:%d\n", n, port);
    int started = 0;
    for (; started < n; started++) {
        if ((pids[started] = spawn_worker(started, n, port, token)) < 0) {
            rc = DDP_EXIT_LAUNCH;
            break;
        }
    }
    explicit_bzero(token, sizeof(token));

    int alive = started, first_fail = -1;
    int64_t deadline = ddp_now_ms() + (int64_t)timeout_s * 1000;
    while (alive > 0) {
        pid_t p;
        int st;
        while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
            for (int k = 0; k < started; k++) {
                if (pids[k] != p)
                    continue;
                pids[k] = 0;
                status[k] = st;
                alive--;
                if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && first_fail < 0) {
                    first_fail = k;
                    rc = DDP_EXIT_JOB_FAILED;
                    kill_all(pids, started, SIGTERM);
                }
            }
        }
        if (alive == 0)
            break;
        int64_t left = deadline - ddp_now_ms();
        if (left <= 0) {
            ddp__cli_error("default job did not finish within %d s; stopping it", timeout_s);
            kill_all(pids, started, SIGKILL);
            rc = DDP_EXIT_JOB_FAILED;
            deadline = ddp_now_ms() + 5000;
            continue;
        }
        struct timespec ts = {left / 1000, (long)(left % 1000) * 1000000L};
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig == SIGINT || sig == SIGTERM) {
            fprintf(stderr, "ddprun: interrupted; stopping %d ranks\n", alive);
            kill_all(pids, started, SIGKILL);
            rc = DDP_EXIT_INTERRUPTED;
        }
    }
    if (first_fail >= 0) {
        int st = status[first_fail];
        if (WIFSIGNALED(st))
            ddp__cli_error("rank %d (localhost) was killed by signal %d", first_fail,
                           WTERMSIG(st));
        else
            ddp__cli_error("rank %d (localhost) exited with status %d", first_fail,
                           WEXITSTATUS(st));
    } else if (rc == DDP_EXIT_OK) {
        fprintf(stderr, "ddprun: default job finished: %d ranks exited 0\n", n);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    ddp_store_server_stop(srv);
    pthread_join(th, NULL);
    ddp_store_server_free(srv);
    return rc;
}

int ddp__cmd_smoke_worker(void)
{
    struct ddp_store *s = NULL;
    struct ddp_store_value *vals = NULL;
    const char *rs = getenv("RANK"), *ws = getenv("WORLD_SIZE");
    char host[128], blob[256];
    int r = -1;
    if (!rs || !ws) {
        fprintf(stderr, "ddprun smoke worker: RANK and WORLD_SIZE must be set\n");
        return 2;
    }
    int rank = atoi(rs), n = atoi(ws);
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "?");
    host[sizeof(host) - 1] = '\0';
    if ((r = ddp_store_connect_env(30000, &s)) < 0)
        goto out;
    if ((r = ddp_store_barrier(s, "smoke/start", n, 30000)) < 0)
        goto out;
    snprintf(blob, sizeof(blob), "rank %d on %s, pid %d", rank, host, (int)getpid());
    if (!(vals = calloc((size_t)n, sizeof(*vals)))) {
        r = DDP_ENOMEM;
        goto out;
    }
    if ((r = ddp_store_all_gather(s, "smoke/hello", rank, n, blob, strlen(blob), 30000, vals)) < 0)
        goto out;
    if (rank == 0) {
        printf("%d ranks met at the store:\n", n);
        for (int k = 0; k < n; k++)
            printf("  %s\n", (const char *)vals[k].data);
        fflush(stdout);
    }
    r = ddp_store_barrier(s, "smoke/end", n, 30000);
out:
    if (vals)
        ddp_store_values_free(vals, (size_t)n);
    free(vals);
    ddp_store_close(s);
    if (r < 0) {
        fprintf(stderr, "ddprun smoke worker rank %d: %s\n", rank, ddp_strerror(r));
        return 1;
    }
    return 0;
}
