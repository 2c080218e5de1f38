/*
 * Several shell commands in one remote session (cli/doctor/doctor.c's checks of a node over SSH:
 * each exec is a channel, a session process and a shell there, about 0.1 s apiece on a LAN). The
 * script runs each step in a subshell, then prints a line of its own, a mark no step prints,
 * with the step's exit status; ddp__steps_split finds the steps' outputs and statuses again in
 * what the session printed. The script is for /bin/sh: the doctor gives it to `/bin/sh -s` on
 * the session's standard input, so a csh or fish login shell never reads it. A leaf.
 */
#ifndef DDP_CLI_SHELL_STEPS_H
#define DDP_CLI_SHELL_STEPS_H

#include <stdbool.h>

#include "common/buf.h"

struct ddp__steps {
    struct ddp_buf sh; /* the script */
    char mark[48];     /* "@ddprun-step-" and 16 random hex digits */
    bool oom;
};

void ddp__steps_init(struct ddp__steps *s);
void ddp__steps_release(struct ddp__steps *s);
/* Shell text, as is, at the script's top level (a variable, an export). */
void ddp__steps_raw(struct ddp__steps *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A step: the command runs in a subshell (a cd or an exit there ends with it), its standard
 * input /dev/null; its standard output, then the mark and its status. */
void ddp__steps_add(struct ddp__steps *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* After a step: the script ends there unless that step's status was 0. */
void ddp__steps_gate(struct ddp__steps *s);
/* The script (NUL-terminated), or NULL when out of memory. */
const char *ddp__steps_script(struct ddp__steps *s);
/* Cuts out, in place, into the steps' outputs: text[i] (as the step printed it) and status[i]
 * for the steps whose mark came, at most max; returns how many. */
int ddp__steps_split(const struct ddp__steps *s, char *out, char **text, int *status, int max);

#endif
