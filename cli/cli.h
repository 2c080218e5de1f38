/* Private declarations shared by the files of the ddprun command. */
#ifndef DDP_CLI_CLI_H
#define DDP_CLI_CLI_H

#include <stdbool.h>

/* Documented exit statuses (man/ddprun.1). */
enum ddp_exit {
    DDP_EXIT_OK = 0,
    DDP_EXIT_JOB_FAILED = 1,
    DDP_EXIT_USAGE = 2,
    DDP_EXIT_LAUNCH = 3,
    DDP_EXIT_INTERRUPTED = 130,
};

enum ddp_opt_id {
#define DDP_OPT(cmd, id, name, arg, help) DDP_OPT_##id,
#include "cli/options.def"
#undef DDP_OPT
    DDP_OPT__COUNT
};

/*
 * Parses "--name value" / "--name=value" options of the given commands from
 * argv[*i...]. Sets vals[id] (borrowed from argv; "" for flags) and stops at
 * the first non-option. Returns 0, or prints an error and returns -1.
 */
int ddp__cli_parse(int argc, char **argv, int *i, const char *const *cmds,
                   const char *vals[DDP_OPT__COUNT]);

/* Sets the log level from a --log-level value; prints an error and returns -1 if unknown. */
int ddp__cli_apply_log_level(const char *lvl);

/* Prints "ddprun: error: ..." to stderr. */
void ddp__cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

int ddp__cmd_store(int argc, char **argv, int i);
int ddp__cmd_default_job(const char *vals[DDP_OPT__COUNT]);
int ddp__cmd_smoke_worker(void);

#endif
