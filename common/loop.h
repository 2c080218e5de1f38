/* A single-threaded epoll event loop with fd callbacks and a min-heap of embedded timers. */
#ifndef DDP_RENDEZVOUS_LOOP_H
#define DDP_RENDEZVOUS_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ddp_loop;

enum ddp_loop_mask {
    DDP_LOOP_READ = 1 << 0,
    DDP_LOOP_WRITE = 1 << 1,
};

/* mask holds DDP_LOOP_READ/WRITE that fired; errors and hang-ups are reported as READ. */
typedef void (*ddp_loop_fd_cb)(struct ddp_loop *loop, int fd, unsigned mask, void *arg);

/* A timer embedded in its owner; it must stay in place while armed. */
struct ddp_timer {
    int64_t deadline_ms;
    size_t heap_idx; /* SIZE_MAX when not armed */
    void (*cb)(struct ddp_loop *loop, struct ddp_timer *t);
};

int ddp_loop_new(struct ddp_loop **out);
/* Closes the epoll fd; registered fds are the caller's. NULL is a no-op. */
void ddp_loop_free(struct ddp_loop *loop);

/* Registers fd (mask of DDP_LOOP_*). DDP_ESYS or DDP_ENOMEM on failure. */
int ddp_loop_add(struct ddp_loop *loop, int fd, unsigned mask, ddp_loop_fd_cb cb, void *arg);
/* Changes the mask of a registered fd. */
int ddp_loop_modify(struct ddp_loop *loop, int fd, unsigned mask);
/* Unregisters fd; events already collected for it in this iteration are dropped. */
void ddp_loop_del(struct ddp_loop *loop, int fd);

void ddp_timer_init(struct ddp_timer *t, void (*cb)(struct ddp_loop *, struct ddp_timer *));
/* (Re)arms t to fire once, ms from now. */
int ddp_timer_start(struct ddp_loop *loop, struct ddp_timer *t, int64_t ms);
/* Disarms t; harmless if it is not armed. */
void ddp_timer_stop(struct ddp_loop *loop, struct ddp_timer *t);
static inline bool ddp_timer_armed(const struct ddp_timer *t)
{
    return t->heap_idx != SIZE_MAX;
}

/* A hook run at the end of every iteration (deferred frees). */
void ddp_loop_set_after(struct ddp_loop *loop, void (*fn)(struct ddp_loop *, void *), void *arg);

/* Runs one iteration, blocking at most max_wait_ms (-1: until an event or timer). */
int ddp_loop_run_once(struct ddp_loop *loop, int max_wait_ms);
/* Runs until ddp_loop_stop. Returns 0, or DDP_ESYS if epoll_wait fails. */
int ddp_loop_run(struct ddp_loop *loop);
void ddp_loop_stop(struct ddp_loop *loop);

#endif
