/*
 * System helpers the launcher, the node agent and the doctor share (a leaf: it calls no other
 * cli file): the job's signal mask, ending every child of a subreaper, and the local address
 * toward a host.
 */
#include "cli/cli.h"
#include "common/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/banned.h"

void ddp__block_job_signals(sigset_t *set, sigset_t *old)
{
    sigemptyset(set);
    sigaddset(set, SIGCHLD);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, set, old);
    signal(SIGPIPE, SIG_IGN);
}

/*
 * Signals every direct child of this process, in all its threads' lists (orphans that
 * reparent to a subreaper land there too). Returns how many it signalled.
 */
int ddp__kill_children(int sig)
{
    char path[320], buf[16384];
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%s/children", de->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t len = ddp_read_eintr(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (len <= 0)
            continue;
        buf[len] = '\0';
        char *save = NULL;
        for (char *t = strtok_r(buf, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
            kill((pid_t)atoi(t), sig);
            n++;
        }
    }
    closedir(d);
    return n;
}

void ddp__sweep_children(void)
{
    while (ddp__kill_children(SIGKILL) > 0) {
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        usleep(1000);
    }
}

/* The local address the kernel would use to reach host (no packet is sent). */
int ddp__route_source(const char *host, char *out, size_t n)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = -1, r = -1;
    if (getaddrinfo(host, "9", &hints, &res) != 0)
        return -1;
    if ((fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0)) >= 0 &&
        connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)n, NULL, 0, NI_NUMERICHOST) == 0)
        r = 0;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return r;
}
