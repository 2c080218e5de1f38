/*
 * `ddprun report`: one self-contained HTML page of a job (running or finished) from its log
 * folder: the timeline of rounds, node losses, hangs and recoveries with their phases; each
 * rank's progress rate over time with stragglers marked; each round's startup; the exit table
 * with each failed rank's last lines. The data it plots is embedded as JSON (a script element
 * of type application/json, id "ddprun-data"): what events.jsonl, summary.json and progress.tsv
 * (the launcher's samples, cli/supervisor/watchdog.h) say, nothing computed beyond rates.
 * cli/view/report_read.c reads a folder into the model below; cli/view/report_html.c writes it.
 * A folder cut short or edited by hand gives a partial report (lines that cannot be read are
 * counted and said), never a crash; one without events.jsonl is an error.
 */
#ifndef DDP_CLI_VIEW_REPORT_H
#define DDP_CLI_VIEW_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct ddp__rp_round {
    int round, world;
    double t, end_t; /* its ranks started (workers_running), and its end (the next round's
                        start, or the job's last event) */
    char nodes[512];
    long long formed_ms, first_ms; /* after the start: group_formed, first_collective; -1 */
};
struct ddp__rp_loss {
    double t;
    int round;
    char node[256], reason[512];
};
struct ddp__rp_hang {
    double t;
    int round;
    long long seq, stuck_ms;
    char what[200], ranks[512];
};
struct ddp__rp_recovery {
    double t;
    int round;
    char cause[512];
    long long detected_ms, ms[5], restored_ms; /* ms: stopped, formed, started, group_formed,
                                                  first_collective; -1 not reached */
};
struct ddp__rp_sample {
    double t, cpu_s;
    int round, rank;
    uint64_t coll, steps;
    char state;
    bool straggler;
};
struct ddp__rp_rank {
    int rank;
    char host[256], state[32], signal[32];
    long long exit_code; /* -1: none */
    bool stopped;
    double runtime_s;
    char *tail; /* a failed rank's last lines, or NULL */
};

struct ddp__report {
    char dir[4096], job_id[256], status[64], reason[1024];
    bool finished; /* summary.json was read */
    int exit_status;
    double runtime_s, last_t;
    struct ddp__rp_round *rounds;
    struct ddp__rp_loss *losses;
    struct ddp__rp_hang *hangs;
    struct ddp__rp_recovery *recs;
    struct ddp__rp_sample *samples;
    struct ddp__rp_rank *ranks;
    size_t nrounds, nlosses, nhangs, nrecs, nsamples, nranks;
    int world_max;                  /* ranks named anywhere */
    size_t bad_events, bad_samples; /* lines that could not be read */
    bool bad_summary;
};

/* Reads dir; 0, or -1 with why (no events.jsonl there). */
int ddp__report_read(const char *dir, struct ddp__report *r, char *why, size_t whyn);
void ddp__report_free(struct ddp__report *r);
/* The page; 0, or -1 when f failed. */
int ddp__report_html(const struct ddp__report *r, FILE *f);

#endif
