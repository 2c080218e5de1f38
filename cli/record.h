/*
 * A job's records in its log folder, written from one model so that they agree:
 *   events.jsonl  one JSON object per transition, as it happens
 *   summary.json  the job at its end: status, times, command, overrides, every rank's outcome
 *   ddprun.log    every message ddprun printed about the job, each with its UTC time
 *   spec.yaml     the resolved job spec (what `ddprun plan` prints)
 * and the lines of the ranks' own logs (rank-N.log), optionally time-stamped.
 */
#ifndef DDP_CLI_RECORD_H
#define DDP_CLI_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct ddp_job;

/* How a rank ended (or did not). The same fields are written wherever a rank's outcome is. */
enum ddp__rank_state {
    DDP__RS_RUNNING,     /* no end reported (yet) */
    DDP__RS_EXITED,      /* exit_code */
    DDP__RS_SIGNALED,    /* killed by signal */
    DDP__RS_NOT_STARTED, /* its program could not be started */
    DDP__RS_LOST,        /* its node was lost while it ran */
};

struct ddp__outcome {
    enum ddp__rank_state state;
    int exit_code, signal;
    bool stopped; /* it ended after ddprun stopped it (another rank failed, an interrupt) */
};

/* An outcome from the agent's report: code >= 0 an exit status, < 0 minus the signal. */
struct ddp__outcome ddp__outcome_of(int code, bool exec_failed);
/* For people: "exit 3", "signal 11 (SIGSEGV)", "did not start", "node lost", "no report";
 * "stopped (...)" around the first two when ddprun stopped it. */
const char *ddp__outcome_text(const struct ddp__outcome *o, char *buf, size_t n);
/* "SIGSEGV" for 11, written into buf. */
const char *ddp__signal_name(int sig, char *buf, size_t n);
/* The job's status for ddprun's exit status: succeeded, failed, interrupted, launch_failed. */
const char *ddp__job_status(int exit_status);

struct ddp__rank_rec {
    int rank, local;
    const char *host, *log;
    struct ddp__outcome out;
    bool started;
    double runtime_s;
};

struct ddp__loss_rec {
    const char *host, *when, *why;
    double t; /* seconds since the start */
    int round;
};

struct ddp__summary {
    int exit_status;
    const char *reason; /* why the job stopped early, or NULL */
    int world, nodes, restarts, first_fail;
    const struct ddp__rank_rec *ranks; /* [world] */
    const struct ddp__loss_rec *losses;
    int nlosses;
};

struct ddp__rec {
    char dir[4096];
    const struct ddp_job *job;
    const char *job_id;
    FILE *events, *log;
    int64_t t0_ms;    /* monotonic, for "t" */
    char started[40]; /* UTC */
};

/* Opens the records in dir (which exists): writes spec.yaml, opens events.jsonl and
 * ddprun.log. A record that cannot be written is skipped with a warning; returns 0. */
int ddp__rec_open(struct ddp__rec *r, const char *dir, const struct ddp_job *job,
                  const char *job_id);
void ddp__rec_close(struct ddp__rec *r);

/*
 * One line of events.jsonl: {"time", "t", "event", "round", then the fields given as pairs of
 * a key and a value, ended by NULL}. A key starting with '#' takes a long long (the '#'
 * dropped); the key "@outcome" takes a const struct ddp__outcome * and writes its fields
 * (state, exit_code, signal, signal_number); any other key a string (NULL: null).
 */
void ddp__rec_event(struct ddp__rec *r, int round, const char *name, ...);

/* A message of ddprun's (no newline) into ddprun.log, with its time. */
void ddp__rec_message(struct ddp__rec *r, const char *msg, size_t n);

/* A line of a rank's output into its log (fd), with its UTC time first when stamp is set. */
void ddp__rec_rank_line(int fd, bool stamp, const uint8_t *line, size_t n);

/* Writes summary.json. */
void ddp__rec_summary(struct ddp__rec *r, const struct ddp__summary *s);

/* The wall clock as 2026-11-22T10:15:00.123Z. */
void ddp__rec_wall_clock(char *out, size_t n);

#endif
