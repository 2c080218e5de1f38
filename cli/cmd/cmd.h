/* The user commands, a file each in cli/cmd/ (as git's builtin.h declares its cmd_*), and the
 * job control socket they dial. */
#ifndef DDP_CLI_CMD_CMD_H
#define DDP_CLI_CMD_CMD_H

#include "cli/spec/args.h"

/* `ddprun store` with its parsed options (cli/cmd/store.c). */
int ddp__cmd_store(const struct ddp_cli_opts *o);
/* `ddprun status [JOB]` and `ddprun stacks [JOB] [--rank R]` (cli/cmd/status.c). */
int ddp__cmd_status(const struct ddp_cli_opts *o);
int ddp__cmd_stacks(const struct ddp_cli_opts *o);
/* attach, ps, logs, stop (cli/cmd/attach.c). */
int ddp__cmd_attach(const struct ddp_cli_opts *o);
int ddp__cmd_ps(const struct ddp_cli_opts *o);
int ddp__cmd_logs(const struct ddp_cli_opts *o);
int ddp__cmd_stop(const struct ddp_cli_opts *o);
/* JOB's log folder: JOB itself when it is one (a folder with ddprun.log or events.jsonl), else
 * the folder a job whose id JOB is (or starts) left beside its control socket; its id in id.
 * 0, or -1 after an error message that starts with cmd (cli/cmd/attach.c). */
int ddp__job_logdir(const char *cmd, const char *job, char *out, size_t n, char *id, size_t idn);
/* `ddprun report JOB [-o FILE]` (cli/cmd/report.c). */
int ddp__cmd_report(const struct ddp_cli_opts *o);
/* `ddprun pipeline plan PROFILE` (cli/cmd/pipeline.c). */
int ddp__cmd_pipeline(const struct ddp_cli_opts *o);
/* The hidden `ddprun __smoke-worker` of the default job without the example (cli/cmd/smoke.c). */
int ddp__cmd_smoke_worker(void);
/* The control socket at path, connected: the fd, or -1 with errno (cli/cmd/status.c). */
int ddp__control_dial(const char *path);
/* The control socket of JOB (its id, a unique start of one, or its log folder), or of the only
 * running job of this user when job is NULL: a connected fd, or -1 after an error message
 * that starts with cmd. */
int ddp__control_connect(const char *cmd, const char *job);

#endif
