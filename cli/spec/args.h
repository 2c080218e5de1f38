/* The command line (cli/spec/args.c): options from the table in cli/spec/options.def, the
 * error printer, the log level. */
#ifndef DDP_CLI_SPEC_ARGS_H
#define DDP_CLI_SPEC_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum ddp_opt_id {
#define DDP_OPT(cmd, id, name, arg, help) DDP_OPT_##id,
#include "cli/spec/options.def"
#undef DDP_OPT
    DDP_OPT__COUNT
};

#define DDP_CLI_MAX_SETS 64
#define DDP_CLI_MAX_WORDS 8

/* Parsed options: the last value of each option (borrowed from argv; "" for flags), every
 * --set (and --nproc, as nproc_per_node=N) in order with its label for messages (NULL:
 * "--set KEY=VALUE"), and the words that are not options. */
struct ddp_cli_opts {
    const char *cmd; /* the command ("plan") for messages, or NULL for a run */
    const char *vals[DDP_OPT__COUNT];
    const char *sets[DDP_CLI_MAX_SETS], *labels[DDP_CLI_MAX_SETS];
    size_t nsets;
    char set_buf[DDP_CLI_MAX_SETS][160], label_buf[DDP_CLI_MAX_SETS][160];
    const char *pos[DDP_CLI_MAX_WORDS];
    size_t npos;
    /* A program run without a job file (torchrun style): the program and its arguments. */
    const char *program;
    char *const *prog_args;
    int nprog_args;
};

/*
 * Parses "--name value", "--name=value" and "-h" options of the given option groups
 * (cli/spec/options.def) from argv[*i...] into o. Words that are not options are collected in
 * o->pos, wherever they stand (ddprun plan --set a=b job.yaml), or with stop_at_word parsing
 * stops at the first one (the command name). "--" makes the rest words. Returns 0, or prints
 * an error and returns -1.
 */
int ddp__cli_parse(int argc, char **argv, int *i, const char *const *groups, bool stop_at_word,
                   struct ddp_cli_opts *o);

/* Prints the options of one group, a line each, for a command's --help. */
void ddp__cli_print_opts(const char *group, FILE *f);

/* Sets the log level from a --log-level value; prints an error and returns -1 if unknown. */
int ddp__cli_apply_log_level(const char *lvl);

/* Prints "ddprun: error: ..." to stderr. */
void ddp__cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
