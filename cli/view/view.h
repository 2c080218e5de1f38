/*
 * Views of a job: what the supervisor (cli/supervisor/rounds.c, cli/supervisor/supervise.c) tells
 * those who show it or keep it, and the model they share (how a rank ended, the job's summary). The
 * console (cli/view/console.c) shows a job on the terminal, the records (cli/view/record.c) keep it
 * in its log folder; a console that attaches to a detached job would be one more view, over a
 * socket. The supervisor only talks to views through this ops struct.
 */
#ifndef DDP_CLI_VIEW_H
#define DDP_CLI_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

struct ddp__rank_rec {
    int rank, local;
    const char *host, *log;
    struct ddp__outcome out;
    bool started;
    double runtime_s;
    const char *error, *traceback; /* from its TORCHELASTIC_ERROR_FILE, or NULL */
};

struct ddp__loss_rec {
    const char *host, *when, *why;
    double t; /* seconds since the start */
    int round;
};

/* A restart's recovery timeline (cli/supervisor/recovery.h). */
struct ddp__recovery_rec {
    int round;         /* the round it restarted into (-1: none formed) */
    char cause[256];   /* what failed */
    double detected_s; /* when that was detected, seconds since the start */
    /* milliseconds after the detection until the old ranks stopped, the round formed, its ranks
     * started, their process groups formed and their first collective was done; -1 not reached */
    int64_t ms[5];
    int warm_ranks; /* of the new round's ranks, how many started warm (cli/agent/warm.h) */
    /* checkpoint.replicas: milliseconds after the detection until the round's checkpoint was
     * restored on its members, the bytes copied and how long it took; -1 not reached */
    int64_t restored_ms, restore_took_ms;
    int64_t restored_bytes;
};

/* The job at its end. */
struct ddp__summary {
    const char *job_id;
    int exit_status;
    const char *reason; /* why the job stopped early, or NULL */
    bool explain;       /* the reason is worth a line (elastic jobs, lost nodes) */
    double runtime_s;
    int world, nodes, restarts, first_fail;
    const struct ddp__rank_rec *ranks; /* [world] */
    const struct ddp__loss_rec *losses;
    int nlosses;
    char *const *tail; /* the first failed rank's last lines */
    int ntail;
    /* the startup of the last round (cli/supervisor/watchdog.h): round -1 when none ran */
    int startup_round;
    double formed_s, first_s;
    /* the records that could not be written whole (cli/view/record.h), "" when none */
    const char *records_incomplete;
    /* the job's own store: connections it accepted and requests it served; -1 without one */
    long long store_conns, store_requests;
    const struct ddp__recovery_rec *recoveries; /* each restart's timeline, oldest first */
    int nrecoveries;
};

/* What the status line shows. */
struct ddp__status {
    const char *phase;
    int ranks_up, world, restarts;
    int64_t elapsed_ms;
};

enum ddp__line_flags {
    /* a line the rank rewrites in place after a carriage return (a progress bar) */
    DDP__LINE_PROGRESS = 1 << 0,
    /* a line longer than 64 KiB is passed on in pieces: this one was cut there ... */
    DDP__LINE_CUT = 1 << 1,
    /* ... and this one goes on from the piece before it */
    DDP__LINE_REST = 1 << 2,
};

struct ddp__view_ops { /* any may be NULL: that view ignores it */
    /* One message of ddprun's, without its newline. */
    void (*message)(void *self, const char *msg, size_t n);
    /* A line of a rank's output (stream 1 stdout, 2 stderr), without its newline; flags
     * (enum ddp__line_flags): a progress bar, or a piece of a line longer than 64 KiB. */
    void (*rank_line)(void *self, int rank, const char *host, int stream, const uint8_t *line,
                      size_t n, unsigned flags);
    /* The phase and counts changed, or a second passed. */
    void (*status)(void *self, const struct ddp__status *st);
    /* Round round's world ranks are about to start (host of each, by rank). */
    void (*round)(void *self, int round, int world, const char *const *hosts);
    /* The job ended. */
    void (*summary)(void *self, const struct ddp__summary *s);
};

struct ddp__view {
    const struct ddp__view_ops *ops;
    void *self;
};

#endif
