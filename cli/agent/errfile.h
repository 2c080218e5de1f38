/*
 * torchrun's TORCHELASTIC_ERROR_FILE (cli/agent/errfile.c): where a rank's `@record` (torch's
 * torch.distributed.elastic.multiprocessing.errors.record) writes the exception that ended it,
 * as JSON. The agent gives each rank a memfd of its own, named /proc/<agent>/fd/<n> so that
 * any process of the rank's user can open it (a script's Python, a child that closed its
 * descriptors): nothing is written to disk and nothing outlives the agent. When the rank fails,
 * its message and traceback go to the launcher in an ERROR frame (cli/proto/agent_proto.h), for the
 * failure's reason and the job's summary.
 */
#ifndef DDP_CLI_ERRFILE_H
#define DDP_CLI_ERRFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/buf.h"

#define DDP__EF_MESSAGE_MAX 2048    /* of the exception's message, bytes: its first ones */
#define DDP__EF_TRACEBACK_MAX 16384 /* of its traceback: the last ones */

/* A new error file (close-on-exec memfd), or -1. */
int ddp__ef_new(void);
/* Its path for a rank of the agent agent: "/proc/<agent>/fd/<fd>". */
void ddp__ef_path(int fd, pid_t agent, char *buf, size_t n);
/* Appends the ERROR frame of local_rank when fd holds torch's error JSON (message, and
 * traceback when there is one); true when it did. */
bool ddp__ef_frame(int fd, uint32_t local_rank, struct ddp_buf *out);

#endif
