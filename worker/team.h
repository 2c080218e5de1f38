/* Private to worker/: a rank's own helper threads, which share the work of one step of a
 * collective with the thread that runs it (worker/team.c): the copies and sums of the slots
 * (worker/shm.c), or a TCP transfer's sends (worker/coll_tcp.c). */
#ifndef DDP_WORKER_TEAM_H
#define DDP_WORKER_TEAM_H

#include <stddef.h>

/* One part of a step: part of parts (the caller runs part 0). */
typedef void (*ddp__team_fn)(void *arg, int part, int parts);

struct ddp__team;

/* A team of threads in all (the caller's included): threads - 1 helpers, started now. NULL when
 * threads < 2 or a helper cannot start (the caller then works alone). */
struct ddp__team *ddp__team_new(int threads);
int ddp__team_size(const struct ddp__team *t);
/* fn(arg, i, n) for every part i of the team's n, part 0 on the calling thread; returns once every
 * part has returned, with their writes visible. A part must not wait for another part (one may
 * wait on a socket, as a TCP transfer's halves do). One caller at a time. */
void ddp__team_run(struct ddp__team *t, ddp__team_fn fn, void *arg);
/* Stops and joins the helpers (NULL: nothing). */
void ddp__team_free(struct ddp__team *t);

/* Part p of n of the elements [lo, hi) of esz bytes each, split at multiples of a cache line's
 * elements from lo (where lo starts a line, no two parts write the same line): *a, *b. */
void ddp__team_split(size_t lo, size_t hi, int p, int n, size_t esz, size_t *a, size_t *b);

#endif
