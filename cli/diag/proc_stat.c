/* What /proc says of a process (cli/diag/proc_stat.h). */
#include "cli/diag/proc_stat.h"
#include "common/util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

/* A /proc file into buf (NUL-terminated); its length, or -1. */
static ssize_t slurp(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = ddp_read_eintr(fd, buf, cap - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    return n;
}

/* The fields of /proc/PID/stat after the command name (which may hold spaces and ')'). */
static const char *after_comm(pid_t pid, char *buf, size_t cap)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (slurp(path, buf, cap) <= 0)
        return NULL;
    const char *p = strrchr(buf, ')');
    return p ? p + 1 : NULL;
}

bool ddp__proc_stat_read(pid_t pid, struct ddp__proc_stat *ps)
{
    char buf[1024], path[64];
    ps->state = '?';
    ps->cpu_s = 0;
    ps->wchan[0] = '\0';
    const char *f = after_comm(pid, buf, sizeof(buf));
    unsigned long ut = 0, st = 0;
    char s;
    if (!f || sscanf(f, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &s, &ut, &st) != 3)
        return false;
    ps->state = s;
    long hz = sysconf(_SC_CLK_TCK);
    ps->cpu_s = (double)(ut + st) / (double)(hz > 0 ? hz : 100);
    snprintf(path, sizeof(path), "/proc/%d/wchan", (int)pid);
    if (slurp(path, ps->wchan, sizeof(ps->wchan)) > 0) {
        if (strcmp(ps->wchan, "0") == 0)
            ps->wchan[0] = '\0';
        for (char *c = ps->wchan; *c; c++)
            if (*c == ' ' || *c == '\n')
                *c = '_';
    } else {
        ps->wchan[0] = '\0';
    }
    return true;
}

bool ddp__proc_traced_by_child(pid_t pid)
{
    char buf[2048], path[64];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    if (slurp(path, buf, sizeof(buf)) <= 0)
        return false;
    const char *t = strstr(buf, "\nTracerPid:");
    long tracer = t ? strtol(t + strlen("\nTracerPid:"), NULL, 10) : 0;
    if (tracer <= 0)
        return false;
    int ppid = 0;
    const char *f = after_comm((pid_t)tracer, buf, sizeof(buf));
    return f && sscanf(f, " %*c %d", &ppid) == 1 && ppid == (int)getpid();
}
