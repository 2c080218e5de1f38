/*
 * What /proc says of a process: the node agent's view of its ranks (cli/diag/node.c). A leaf.
 */
#ifndef DDP_CLI_PROC_STAT_H
#define DDP_CLI_PROC_STAT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct ddp__proc_stat {
    char state;     /* /proc/PID/stat's: R, S, D, T, t, Z...; '?' when unreadable */
    double cpu_s;   /* user + system time, seconds */
    char wchan[48]; /* the kernel function it sleeps in ("" when running or unknown) */
};

/* Reads pid's state, CPU time and wait channel; false (state '?') when the process is gone. */
bool ddp__proc_stat_read(pid_t pid, struct ddp__proc_stat *ps);

/* Whether pid is traced by a child of this process (the agent's eu-stack or gdb, which stops
 * it for as long as it reads its stack): its state then says only that ddprun is looking. */
bool ddp__proc_traced_by_child(pid_t pid);

#endif
