/*
 * Python tracebacks of ranks on demand (cli/pystacks.c), for `ddprun stacks` and hang reports:
 * what a PyTorch rank's Python threads are doing, where a native stack shows only the
 * interpreter's frames.
 *
 * A node agent gives each rank a sitecustomize module, kept in a memfd as a zip archive that
 * the rank finds first on PYTHONPATH (/proc/self/fd/N: nothing is written to disk, nothing
 * is left behind). In a Python rank it arms faulthandler to write every thread's traceback
 * to the rank's dump file (another memfd) on DDP__PYS_SIGNAL, then takes itself off sys.path
 * and PYTHONPATH and runs the sitecustomize it hid, if any, as Python would have. The agent
 * sends the signal only to a rank whose handler is installed (/proc/PID/status, SigCgt): to
 * any other process this real-time signal would be fatal. DDPRUN_PYTHON_STACKS=0 in the
 * rank's environment (the job's env) leaves Python alone.
 */
#ifndef DDP_CLI_PYSTACKS_H
#define DDP_CLI_PYSTACKS_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "common/buf.h"

#define DDP__PYS_SIGNAL (SIGRTMAX - 2)

/* The shim archive (read-only; CLOEXEC), or -1. */
int ddp__pys_shim_new(void);
/* A rank's dump file (CLOEXEC), or -1. */
int ddp__pys_dump_new(void);
/* In a rank's process before exec: its environment and descriptors (shim, dump: the agent's
 * CLOEXEC ones, or -1: nothing is done). */
void ddp__pys_rank_env(int shim, int dump);

/* Whether pid has the dump's handler installed. */
bool ddp__pys_armed(pid_t pid);
/* The process of a rank to signal for its tracebacks: the rank itself or, breadth first among
 * its first 64 descendants, the first (a wrapper script's Python) that has the handler and
 * holds the rank's dump file; 0 when none does. */
pid_t ddp__pys_find(pid_t rank, int dump);
/* The dump file's size now (where the next traceback starts). */
size_t ddp__pys_size(int dump);
/* Appends what the dump file holds from off on (at most max bytes). */
void ddp__pys_read(int dump, size_t off, size_t max, struct ddp_buf *out);

#endif
