/*
 * The node agent's side of diagnosis (cli/diag/node.c): a progress page per rank (the rank's
 * flight recorder, common/progress.h), the node's progress report from those pages and /proc,
 * and native stacks of its ranks (eu-stack from elfutils, else gdb), gathered without blocking
 * the agent's loop.
 */
#ifndef DDP_CLI_DIAG_NODE_H
#define DDP_CLI_DIAG_NODE_H

#include "common/buf.h"
#include "common/progress.h"

#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>

struct ddp_loop;

/* A page for one rank: fd goes to the rank (DDPRUN_PROGRESS_FD); p is the agent's view. */
struct ddp__dn_page {
    int fd;
    struct ddp_progress_page *p;
    /* the rank's state and kernel wait last read while no stack tool of the agent stopped it */
    char seen_state;
    char seen_wchan[48];
    int64_t first_done_ns; /* when its first collective finished, once seen (0: not yet) */
    uint64_t steps;        /* DDP steps (DDP_PROG_DDP_STEP entries) finished, counted so far */
    uint64_t steps_seq;    /* the entries counted: up to this seq */
};

/* 0, or DDP_ESYS (then the rank simply runs without one). */
int ddp__dn_page_new(struct ddp__dn_page *pg);
void ddp__dn_page_release(struct ddp__dn_page *pg);

/* Appends the line of a rank (global rank, pid, its page: p NULL without one) to b: a running
 * one, or one that exited (state X: what its page held last). inspected: the agent's stack
 * collection has the rank (ddp__dn_asker_touches), so its state and kernel wait are the last
 * seen before: what the rank was doing, not its waking for ddprun's signal or ptrace. */
void ddp__dn_report_rank(struct ddp_buf *b, int rank, pid_t pid, bool exited, bool inspected,
                         struct ddp__dn_page *pg);

/* A rank's process: its pid, and its Python dump file (cli/diag/pystacks.h) or -1. */
struct ddp__dn_proc {
    pid_t pid;
    int pydump;
};

/* Stacks of n processes: first the Python tracebacks of those that armed them (waited for up
 * to 1 s), then native stacks, gathered by one eu-stack (or gdb) each, in parallel; done is
 * called on loop with each one's text (or why there is none) once all have finished or
 * timeout_ms passed, and the collection frees itself (it may do so before this returns; *out
 * is set first). The tools run with signal mask `mask`. */
struct ddp__dn_stacks;
int ddp__dn_stacks_start(struct ddp_loop *loop, const struct ddp__dn_proc *procs, int n,
                         int timeout_ms, const sigset_t *mask,
                         void (*done)(void *arg, char *const *texts, int n), void *arg,
                         struct ddp__dn_stacks **out);
/* Stops a collection (killing its tools); done is not called. NULL is a no-op. */
void ddp__dn_stacks_free(struct ddp__dn_stacks *s);

/* A STACKS frame (cli/proto/agent_proto.h) on the node: one collection at a time, answered by
 * STACKS_REPLY through send (a second request meanwhile is answered at once: busy). */
struct ddp__dn_asker {
    struct ddp_loop *loop;
    const sigset_t *mask;                /* the tools' signal mask */
    void (*send)(struct ddp_buf *frame); /* the reply goes to the launcher */
    struct ddp__dn_stacks *stacks;       /* a collection under way */
    uint32_t req;
    int *local; /* the local ranks asked for (while the collection runs) */
    /* their processes, kept after it until the next (ddp__dn_asker_touches), and until when
     * (ddp_now_ms) they count as touched: while it runs, and 200 ms after */
    struct ddp__dn_proc *procs;
    int nprocs;
    int64_t touched_until_ms;
};
/* body: the frame's; running[lr]: local rank lr's process (pid 0 unless it runs), nw of them. */
void ddp__dn_stacks_frame(struct ddp__dn_asker *a, const uint8_t *body, size_t len,
                          const struct ddp__dn_proc *running, int nw);
void ddp__dn_asker_release(struct ddp__dn_asker *a);
/* Whether pid is in the collection under way, or was in one that ended within 200 ms (a rank
 * woken by the Python stacks' signal or a ptrace stop takes a moment to go back to its wait). */
bool ddp__dn_asker_touches(const struct ddp__dn_asker *a, pid_t pid);

#endif
