/*
 * A job's records in its log folder, written from one model (cli/view/view.h) so that they agree:
 *   events.jsonl  one JSON object per transition, as it happens
 *   summary.json  the job at its end: status, times, command, overrides, every rank's outcome
 *   ddprun.log    every message ddprun printed about the job, each with its UTC time
 *   spec.yaml     the resolved job spec (what `ddprun plan` prints)
 *   output.jsonl  with logs.jsonl: every rank's lines as they arrive, one JSON object each
 * and the lines of the ranks' own logs (rank-N.log), optionally time-stamped.
 */
#ifndef DDP_CLI_RECORD_H
#define DDP_CLI_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/view/view.h"

struct ddp_job;

/* An outcome from the agent's report: code >= 0 an exit status, < 0 minus the signal. */
struct ddp__outcome ddp__outcome_of(int code, bool exec_failed);
/* For people: "exit 3", "signal 11 (SIGSEGV)", "did not start", "node lost", "no report";
 * "stopped (...)" around the first two when ddprun stopped it. */
const char *ddp__outcome_text(const struct ddp__outcome *o, char *buf, size_t n);
/* "SIGSEGV" for 11, written into buf. */
const char *ddp__signal_name(int sig, char *buf, size_t n);
/* The job's status for ddprun's exit status: succeeded, failed, interrupted, launch_failed. */
const char *ddp__job_status(int exit_status);

/* A record appended to in whole lines: a write that fails, or writes part of a line (a full
 * disk), is undone (the file is cut back to its last whole line) and the file is given up. */
struct ddp__rec_file {
    int fd;         /* -1: not open, or given up */
    long long size; /* its length after the last whole line */
    char name[48];  /* its name in the log folder */
};

#define DDP__REC_MAX_FAILS 8

struct ddp__rec {
    char dir[4096];
    const struct ddp_job *job;
    const char *job_id;
    struct ddp__rec_file events, log;
    struct ddp__rec_file output; /* output.jsonl (logs.jsonl): every rank's lines */
    int round;                   /* the round the rank logs are of */
    int64_t t0_ms;               /* monotonic, for "t" */
    char started[40];            /* UTC */
    /* the current round's rank logs */
    int nlogs;
    struct ddp__rec_file *logs;
    char (*logpath)[4200];
    bool resume; /* a launcher that took the job over: every record is appended to */
    /* Where a record could not be written: its name and errno, the first DDP__REC_MAX_FAILS
     * (more counts the rest). Each is said once, through say, as it happens. */
    struct {
        char name[48];
        int err;
    } fails[DDP__REC_MAX_FAILS];
    int nfails, more;
    void (*say)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
};

/* Opens the records in dir (which exists): writes spec.yaml, opens events.jsonl and
 * ddprun.log (resume: appends to them and to the rank logs, as a launcher that took the job
 * over). A record that cannot be written is skipped, said once through say (or, before the
 * first message can be shown, on stderr) and listed as incomplete; returns 0. */
int ddp__rec_open(struct ddp__rec *r, const char *dir, const struct ddp_job *job,
                  const char *job_id, bool resume,
                  void (*say)(const char *fmt, ...) __attribute__((format(printf, 1, 2))));
void ddp__rec_close(struct ddp__rec *r);

/* "rank-0.log (No space left on device), summary.json (...)" for the records that could not
 * be written whole, or "" when all were. */
void ddp__rec_incomplete(const struct ddp__rec *r, char *buf, size_t n);

/*
 * One line of events.jsonl: {"time", "t", "event", "round", then the fields given as pairs of
 * a key and a value, ended by NULL}. A key starting with '#' takes a long long (the '#'
 * dropped); the key "@outcome" takes a const struct ddp__outcome * and writes its fields
 * (state, exit_code, signal, signal_number); any other key a string (NULL: null).
 */
void ddp__rec_event(struct ddp__rec *r, int round, const char *name, ...);

/* The records as a view (cli/view/view.h): messages into ddprun.log, rank lines into the rank
 * logs (rank-N.log, rank-N.restart-R.log from round R on; with logs.timestamps each line after
 * its UTC time), a summary into summary.json. */
struct ddp__view ddp__rec_view(struct ddp__rec *r);

/* The status line ("[ddprun] PHASE | ranks up U/W | restarts R | HH:MM:SS") into buf; its
 * length (at most n - 1). */
size_t ddp__status_text(const struct ddp__status *st, char *buf, size_t n);

/* The summary as ddprun prints it, a line (no newline) at a time to line(arg, ...). */
void ddp__summary_text(const struct ddp__summary *s,
                       void (*line)(void *arg, const char *msg, size_t n), void *arg);

/* The path of rank's log in the current round ("" before the first round). */
const char *ddp__rec_rank_log(const struct ddp__rec *r, int rank);

/* The wall clock as 2026-11-22T10:15:00.123Z. */
void ddp__rec_wall_clock(char *out, size_t n);

#endif
