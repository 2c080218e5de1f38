/* The node guard (cli/agent/guard.h): started by the agent, it ends the node's job when the agent
 * cannot. */
#include "cli/agent/guard.h"
#include "common/err.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

#define PAGE_FD 3
#define POLL_MS 100

/* What the agent and its guard share. */
struct page {
    _Atomic int64_t renewed_ms; /* the lease's last renewal (ddp_now_ms: CLOCK_MONOTONIC) */
};

struct ddp__guard {
    pid_t pid;
    int mfd; /* the page's memfd, for the guard to map */
    struct page *page;
};

int ddp__guard_new(struct ddp__guard **out)
{
    struct ddp__guard *g = calloc(1, sizeof(*g));
    int mfd = memfd_create("ddprun-guard", MFD_CLOEXEC);
    int r = DDP_ESYS;
    if (g)
        g->mfd = -1;
    if (!g || mfd < 0 || ftruncate(mfd, sizeof(struct page)) != 0)
        goto out;
    g->page = mmap(NULL, sizeof(struct page), PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (g->page == MAP_FAILED) {
        g->page = NULL;
        goto out;
    }
    g->mfd = mfd;
    mfd = -1;
    atomic_store(&g->page->renewed_ms, ddp_now_ms());
    *out = g;
    g = NULL;
    r = 0;
out:
    if (mfd >= 0)
        close(mfd);
    ddp__guard_free(g);
    return r;
}

int ddp__guard_start(struct ddp__guard *g, int64_t timeout_ms, const char *label)
{
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0)
        return DDP_ESYS;
    atomic_store(&g->page->renewed_ms, ddp_now_ms());
    char agent[24], timeout[24];
    snprintf(agent, sizeof(agent), "%d", (int)getpid());
    snprintf(timeout, sizeof(timeout), "%lld", (long long)timeout_ms);
    char *argv[] = {"ddprun", "__guard", agent, timeout, (char *)label, NULL};
    /* Only async-signal-safe calls between fork and exec: the agent has threads. */
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); /* out of the agent's group: a signal to the job does not stop it */
        prctl(PR_SET_PDEATHSIG, SIGUSR2); /* wakes it at once when the agent dies */
        if (dup2(null, 0) < 0 || dup2(null, 1) < 0 ||
            (g->mfd == PAGE_FD ? fcntl(PAGE_FD, F_SETFD, 0) : dup2(g->mfd, PAGE_FD)) < 0)
            _exit(127);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(null);
    if (pid < 0)
        return DDP_ESYS;
    setpgid(pid, pid);
    g->pid = pid;
    return 0;
}

_Atomic int64_t *ddp__guard_renewal(struct ddp__guard *g)
{
    return &g->page->renewed_ms;
}

pid_t ddp__guard_pid(const struct ddp__guard *g)
{
    return g ? g->pid : 0;
}

void ddp__guard_reaped(struct ddp__guard *g)
{
    if (g)
        g->pid = 0;
}

void ddp__guard_free(struct ddp__guard *g)
{
    if (!g)
        return;
    if (g->pid > 0) {
        kill(g->pid, SIGKILL);
        waitpid(g->pid, NULL, 0);
    }
    if (g->page)
        munmap(g->page, sizeof(struct page));
    if (g->mfd >= 0)
        close(g->mfd);
    free(g);
}

/* ------------------------------------------------------------------ */
/* The guard process                                                  */
/* ------------------------------------------------------------------ */

struct pids {
    pid_t *v;
    size_t n, cap;
};

static bool has(const struct pids *p, pid_t pid)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->v[i] == pid)
            return true;
    return false;
}

static void add(struct pids *p, pid_t pid)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        pid_t *v = realloc(p->v, cap * sizeof(*v));
        if (!v)
            return;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = pid;
}

/* The parent and process group of pid, from /proc/PID/stat (the fields after the command's
 * closing parenthesis, which may itself hold spaces and parentheses). */
static bool stat_of(pid_t pid, pid_t *ppid, pid_t *pgrp)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = ddp_read_eintr(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    char state;
    int pp, pg;
    if (!p || sscanf(p + 1, " %c %d %d", &state, &pp, &pg) != 3)
        return false;
    *ppid = pp;
    *pgrp = pg;
    return true;
}

/*
 * Finds every process of the agent's: its process group and every descendant of the agent
 * (a rank's child in a group or session of its own is still the agent's descendant: the agent
 * is a subreaper). Each one found is stopped at once, so that nothing forks behind the scan,
 * and the scan repeats until it finds nothing new.
 */
static void collect(pid_t agent, pid_t pgrp, struct pids *found)
{
    pid_t self = getpid();
    add(found, agent);
    if (pgrp > 1)
        kill(-pgrp, SIGSTOP);
    else
        kill(agent, SIGSTOP);
    for (int round = 0; round < 100; round++) {
        size_t before = found->n;
        DIR *d = opendir("/proc");
        if (!d)
            return;
        struct dirent *de;
        while ((de = readdir(d))) {
            char *end;
            long v = strtol(de->d_name, &end, 10);
            pid_t pid = (pid_t)v, pp, pg;
            if (*end || v <= 0 || pid == self || has(found, pid) || !stat_of(pid, &pp, &pg))
                continue;
            if ((pgrp > 1 && pg == pgrp) || has(found, pp)) {
                kill(pid, SIGSTOP);
                add(found, pid);
            }
        }
        closedir(d);
        if (found->n == before)
            return;
    }
}

/* Ends them all: the descendants first, the agent last. Returns how many processes besides
 * the agent there were. */
static size_t end_all(pid_t agent, pid_t pgrp)
{
    struct pids found = {0};
    collect(agent, pgrp, &found);
    for (size_t i = found.n; i-- > 0;)
        kill(found.v[i], SIGKILL);
    if (pgrp > 1)
        kill(-pgrp, SIGKILL);
    size_t n = found.n ? found.n - 1 : 0;
    free(found.v);
    return n;
}

/* A signal (the agent's death, SIGUSR2) only cuts the sleep short. */
static void on_wake(int sig)
{
    (void)sig;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int ddp__cmd_guard(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "ddprun: __guard is internal to ddprun agent\n");
        return 2;
    }
    pid_t agent = (pid_t)atoi(argv[2]);
    int64_t timeout = atoll(argv[3]);
    const char *label = argv[4];
    struct page *page = mmap(NULL, sizeof(struct page), PROT_READ, MAP_SHARED, PAGE_FD, 0);
    if (agent <= 1 || timeout <= 0 || page == MAP_FAILED) {
        fprintf(stderr, "ddprun: __guard is internal to ddprun agent\n");
        return 2;
    }
    close(PAGE_FD);
    /* The agent leads a process group of its own (it made one, or it leads the session its SSH
     * server made); in any other group it would share with what is not the job's (slurmstepd,
     * a login shell), only its descendants are ended. */
    pid_t pgrp = getpgid(agent) == agent ? agent : 0;
    /* Nothing of the agent's but the page and stderr: a descriptor held here (a pipe of a
     * rank's, say) would keep its reader from seeing its end. */
    if (close_range(PAGE_FD, ~0U, 0) != 0)
        for (int fd = PAGE_FD; fd < 1024; fd++)
            close(fd);
    /* The agent blocks the job's signals for its signalfd: the guard takes them as any
     * process does (srun ends a step by signalling every process of it). A write to a
     * terminal from a background group must not stop it. */
    signal(SIGTTOU, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_wake}; /* no SA_RESTART: the sleep ends */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL); /* Slurm's --signal reaches every process of a step */
    sigset_t all; /* unblocked once the handlers are there: a SIGUSR2 may be pending */
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    for (;;) {
        sleep_ms(POLL_MS);
        if (getppid() != agent) {
            /* The agent died without ending its process group: its ranks died with it
             * (their parent-death signal), what they started did not. */
            if (pgrp > 1)
                kill(-pgrp, SIGKILL);
            return 0;
        }
        int64_t quiet = ddp_now_ms() - atomic_load(&page->renewed_ms);
        if (quiet > timeout + DDP__GUARD_SLACK_MS) {
            size_t n = end_all(agent, pgrp);
            fprintf(stderr,
                    "ddprun guard on '%s': the node's lease was not renewed for %.1f s "
                    "(elastic.heartbeat_timeout is %.1f s): the launcher counts this node lost, "
                    "and its agent did not stop its ranks (stopped or hung); killed the agent "
                    "and %zu process%s of the job\n",
                    label, (double)quiet / 1000, (double)timeout / 1000, n, n == 1 ? "" : "es");
            return 1;
        }
    }
}
