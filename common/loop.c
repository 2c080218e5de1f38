/* Implementation of common/loop.h, after redis's ae: poll, fire timers, then run the
 * after-hook. */
#include "common/loop.h"
#include "common/err.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "common/banned.h"

struct fdslot {
    ddp_loop_fd_cb cb;
    void *arg;
    unsigned mask;
    uint32_t gen; /* bumped on del so stale events in the current batch are ignored */
};

struct ddp_loop {
    int epfd;
    bool stop;
    struct fdslot *fds;
    size_t nfds;
    struct ddp_timer **heap;
    size_t heap_len, heap_cap;
    void (*after)(struct ddp_loop *, void *);
    void *after_arg;
};

int ddp_loop_new(struct ddp_loop **out)
{
    struct ddp_loop *l = calloc(1, sizeof(*l));
    if (!l)
        return DDP_ENOMEM;
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l->epfd < 0) {
        free(l);
        return DDP_ESYS;
    }
    *out = l;
    return 0;
}

void ddp_loop_free(struct ddp_loop *l)
{
    if (!l)
        return;
    close(l->epfd);
    free(l->fds);
    free(l->heap);
    free(l);
}

static uint32_t to_epoll(unsigned mask)
{
    return (mask & DDP_LOOP_READ ? EPOLLIN : 0) | (mask & DDP_LOOP_WRITE ? EPOLLOUT : 0);
}

static int ensure_fd(struct ddp_loop *l, int fd)
{
    if ((size_t)fd < l->nfds)
        return 0;
    size_t n = l->nfds ? l->nfds : 64;
    while (n <= (size_t)fd)
        n *= 2;
    struct fdslot *s = realloc(l->fds, n * sizeof(*s));
    if (!s)
        return DDP_ENOMEM;
    memset(s + l->nfds, 0, (n - l->nfds) * sizeof(*s));
    l->fds = s;
    l->nfds = n;
    return 0;
}

int ddp_loop_add(struct ddp_loop *l, int fd, unsigned mask, ddp_loop_fd_cb cb, void *arg)
{
    int r;
    if (fd < 0)
        return DDP_EINVAL;
    if ((r = ensure_fd(l, fd)) < 0)
        return r;
    struct epoll_event ev = {.events = to_epoll(mask), .data.u64 = 0};
    ev.data.u64 = (uint64_t)(uint32_t)fd | ((uint64_t)l->fds[fd].gen << 32);
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
        return DDP_ESYS;
    l->fds[fd].cb = cb;
    l->fds[fd].arg = arg;
    l->fds[fd].mask = mask;
    return 0;
}

int ddp_loop_modify(struct ddp_loop *l, int fd, unsigned mask)
{
    if (fd < 0 || (size_t)fd >= l->nfds || !l->fds[fd].cb)
        return DDP_EINVAL;
    if (l->fds[fd].mask == mask)
        return 0;
    struct epoll_event ev = {.events = to_epoll(mask)};
    ev.data.u64 = (uint64_t)(uint32_t)fd | ((uint64_t)l->fds[fd].gen << 32);
    if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &ev) != 0)
        return DDP_ESYS;
    l->fds[fd].mask = mask;
    return 0;
}

void ddp_loop_del(struct ddp_loop *l, int fd)
{
    if (fd < 0 || (size_t)fd >= l->nfds || !l->fds[fd].cb)
        return;
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
    l->fds[fd].cb = NULL;
    l->fds[fd].arg = NULL;
    l->fds[fd].mask = 0;
    l->fds[fd].gen++;
}

/* Min-heap on deadline; each timer remembers its index so stop is O(log n). */
static void heap_set(struct ddp_loop *l, size_t i, struct ddp_timer *t)
{
    l->heap[i] = t;
    t->heap_idx = i;
}

static void sift_up(struct ddp_loop *l, size_t i)
{
    struct ddp_timer *t = l->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (l->heap[p]->deadline_ms <= t->deadline_ms)
            break;
        heap_set(l, i, l->heap[p]);
        i = p;
    }
    heap_set(l, i, t);
}

static void sift_down(struct ddp_loop *l, size_t i)
{
    struct ddp_timer *t = l->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= l->heap_len)
            break;
        if (c + 1 < l->heap_len && l->heap[c + 1]->deadline_ms < l->heap[c]->deadline_ms)
            c++;
        if (t->deadline_ms <= l->heap[c]->deadline_ms)
            break;
        heap_set(l, i, l->heap[c]);
        i = c;
    }
    heap_set(l, i, t);
}

void ddp_timer_init(struct ddp_timer *t, void (*cb)(struct ddp_loop *, struct ddp_timer *))
{
    t->deadline_ms = 0;
    t->heap_idx = SIZE_MAX;
    t->cb = cb;
}

void ddp_timer_stop(struct ddp_loop *l, struct ddp_timer *t)
{
    size_t i = t->heap_idx;
    if (i == SIZE_MAX)
        return;
    t->heap_idx = SIZE_MAX;
    struct ddp_timer *last = l->heap[--l->heap_len];
    if (i == l->heap_len)
        return;
    heap_set(l, i, last);
    sift_up(l, i);
    sift_down(l, last->heap_idx);
}

int ddp_timer_start(struct ddp_loop *l, struct ddp_timer *t, int64_t ms)
{
    ddp_timer_stop(l, t);
    if (l->heap_len == l->heap_cap) {
        size_t cap = l->heap_cap ? l->heap_cap * 2 : 64;
        struct ddp_timer **h = realloc(l->heap, cap * sizeof(*h));
        if (!h)
            return DDP_ENOMEM;
        l->heap = h;
        l->heap_cap = cap;
    }
    t->deadline_ms = ddp_now_ms() + (ms < 0 ? 0 : ms);
    heap_set(l, l->heap_len++, t);
    sift_up(l, t->heap_idx);
    return 0;
}

void ddp_loop_set_after(struct ddp_loop *l, void (*fn)(struct ddp_loop *, void *), void *arg)
{
    l->after = fn;
    l->after_arg = arg;
}

int ddp_loop_run_once(struct ddp_loop *l, int max_wait_ms)
{
    struct epoll_event evs[256];
    int timeout = max_wait_ms;
    if (l->heap_len > 0) {
        int64_t d = l->heap[0]->deadline_ms - ddp_now_ms();
        if (d < 0)
            d = 0;
        if (timeout < 0 || d < timeout)
            timeout = d > 1000000 ? 1000000 : (int)d;
    }
    int n = epoll_wait(l->epfd, evs, (int)(sizeof(evs) / sizeof(evs[0])), timeout);
    if (n < 0) {
        if (errno != EINTR)
            return DDP_ESYS;
        n = 0;
    }
    for (int i = 0; i < n; i++) {
        int fd = (int)(uint32_t)evs[i].data.u64;
        uint32_t gen = (uint32_t)(evs[i].data.u64 >> 32);
        /* A callback earlier in this batch may have closed (and even reused) this fd. */
        if ((size_t)fd >= l->nfds || !l->fds[fd].cb || l->fds[fd].gen != gen)
            continue;
        unsigned mask = 0;
        if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP))
            mask |= DDP_LOOP_READ;
        if (evs[i].events & EPOLLOUT)
            mask |= DDP_LOOP_WRITE;
        l->fds[fd].cb(l, fd, mask, l->fds[fd].arg);
    }
    int64_t now = ddp_now_ms();
    while (l->heap_len > 0 && l->heap[0]->deadline_ms <= now) {
        struct ddp_timer *t = l->heap[0];
        ddp_timer_stop(l, t);
        t->cb(l, t);
    }
    if (l->after)
        l->after(l, l->after_arg);
    return 0;
}

int ddp_loop_run(struct ddp_loop *l)
{
    int r = 0;
    l->stop = false;
    while (!l->stop)
        if ((r = ddp_loop_run_once(l, -1)) < 0)
            break;
    return r;
}

void ddp_loop_stop(struct ddp_loop *l)
{
    l->stop = true;
}
