/*
 * `ddprun --detach JOB.yaml` (cli/supervisor/launch.h): the job's supervisor becomes a process of
 * its own in a new session, without the terminal: closing the terminal or the SSH session, or
 * killing the shell, leaves the job running. Until the job can be reached (its control socket
 * listens), the supervisor's messages come back here through a pipe, so a failed start is reported
 * as in the foreground, with its status; then this process prints the job id and returns.
 */
#include "cli/spec/args.h"
#include "cli/supervisor/launch.h"
#include "cli/sys/sys.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/banned.h"

int ddp__launch_detached(const struct ddp_job *job)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        ddp__cli_error("cannot detach: %s", strerror(errno));
        return DDP_EXIT_LAUNCH;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        ddp__cli_error("cannot detach: %s", strerror(errno));
        return DDP_EXIT_LAUNCH;
    }
    if (pid == 0) {
        close(p[0]);
        setsid(); /* no controlling terminal: no SIGHUP when it goes */
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        dup2(null, 0);
        dup2(p[1], 1);
        dup2(p[1], 2);
        signal(SIGHUP, SIG_IGN);
        _exit(ddp__launch(job, p[1]));
    }
    close(p[1]);
    /* Everything it says before "OK" is a failed start's messages. */
    char buf[8192];
    size_t len = 0;
    for (;;) {
        ssize_t r = ddp_read_eintr(p[0], buf + len, sizeof(buf) - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == sizeof(buf) - 1)
            break;
    }
    close(p[0]);
    buf[len] = '\0';
    char *ok = strstr(buf, "OK ");
    if (ok && (ok == buf || ok[-1] == '\n')) {
        fwrite(buf, 1, (size_t)(ok - buf), stderr);
        char *tab = strchr(ok, '\t'), *nl = strchr(ok, '\n');
        if (tab && nl) {
            *tab = *nl = '\0';
            printf("%s\n", ok + 3);
            fflush(stdout);
            fprintf(stderr,
                    "ddprun: job %s runs detached (pid %d; logs in %s)\n"
                    "ddprun: ddprun attach %s | ddprun logs %s -f | ddprun stop %s\n",
                    ok + 3, (int)pid, tab + 1, ok + 3, ok + 3, ok + 3);
            return DDP_EXIT_OK;
        }
    }
    fwrite(buf, 1, len, stderr);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) && WEXITSTATUS(st) ? WEXITSTATUS(st) : DDP_EXIT_LAUNCH;
}
