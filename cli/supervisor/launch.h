/* What the commands ask of the supervisor: run a job, here or detached, or take one over. */
#ifndef DDP_CLI_SUPERVISOR_LAUNCH_H
#define DDP_CLI_SUPERVISOR_LAUNCH_H

#include "cli/spec/args.h"

struct ddp_job;

/* Runs a job to the end; returns the exit status (enum ddp_exit) (cli/supervisor/supervise.c). With
 * ready_fd >= 0 (ddprun --detach, cli/supervisor/detach.c), once the job can be reached it writes
 * "OK ID\tLOGDIR\n" there, closes it, and sends its console to LOGDIR/console.log. */
int ddp__launch(const struct ddp_job *job, int ready_fd);
/* ddprun --detach: runs the job in a process of its own, without this terminal; returns once
 * it can be reached (attach, logs, stop), or with the status of its failed start. */
int ddp__launch_detached(const struct ddp_job *job);

/* `ddprun attach --etcd`: takes a job over whose launcher died (cli/supervisor/takeover.c). */
int ddp__cmd_takeover(const struct ddp_cli_opts *o);
/* The command line, for the launcher's record in etcd. */
void ddp__to_set_argv(int argc, char **argv);

#endif
