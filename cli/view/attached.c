/* Consoles attached over the control socket, and the requests that act on the job
 * (cli/view/attached.h). */
#include "cli/view/attached.h"
#include "cli/spec/job.h"
#include "cli/view/record.h"
#include "common/buf.h"
#include "common/util.h"
#include "common/loop.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/banned.h"

#define REMOTE_MAX_BEHIND (16u << 20)

struct ddp__remote_client {
    struct ddp__remote *owner;
    int fd;
    struct ddp_buf out;
    bool dead, writing;
    struct ddp__remote_client *next;
};

void ddp__remote_init(struct ddp__remote *r, struct ddp_loop *loop, bool tag, const char *ranks,
                      const struct ddp__remote_cb *cb)
{
    memset(r, 0, sizeof(*r));
    r->loop = loop;
    r->tag = tag;
    r->ranks = ranks;
    r->cb = *cb;
}

static void drop(struct ddp__remote_client *c)
{
    if (c->dead)
        return;
    c->dead = true;
    ddp_loop_del(c->owner->loop, c->fd);
    close(c->fd);
    c->fd = -1;
    ddp_buf_release(&c->out);
}

/* Frees the clients that went away. */
static void sweep(struct ddp__remote *r)
{
    for (struct ddp__remote_client **p = &r->clients; *p;) {
        struct ddp__remote_client *c = *p;
        if (c->dead) {
            *p = c->next;
            free(c);
        } else {
            p = &c->next;
        }
    }
}

static void flush(struct ddp__remote_client *c)
{
    while (!c->dead && ddp_buf_pending(&c->out)) {
        ssize_t w = send(c->fd, c->out.data + c->out.off, ddp_buf_pending(&c->out),
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w <= 0) {
            drop(c);
            return;
        }
        c->out.off += (size_t)w;
    }
    if (c->dead)
        return;
    ddp_buf_compact(&c->out);
    bool want = ddp_buf_pending(&c->out) > 0;
    if (want != c->writing) {
        c->writing = want;
        ddp_loop_modify(c->owner->loop, c->fd, DDP_LOOP_READ | (want ? DDP_LOOP_WRITE : 0));
    }
}

static void on_io(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    struct ddp__remote_client *c = arg;
    if (mask & DDP_LOOP_READ) {
        char junk[256];
        ssize_t n = read(fd, junk, sizeof(junk));
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            drop(c); /* the client went away (detached, or killed) */
            sweep(c->owner);
            return;
        }
    }
    if (mask & DDP_LOOP_WRITE)
        flush(c);
    sweep(c->owner);
}

/* One line of kind k to every client. */
static void send_line(struct ddp__remote *r, char k, const char *a, size_t an, const void *b,
                      size_t bn)
{
    for (struct ddp__remote_client *c = r->clients; c; c = c->next) {
        if (c->dead)
            continue;
        if (ddp_buf_pending(&c->out) > REMOTE_MAX_BEHIND) {
            drop(c); /* it does not keep up: the job does not wait for it */
            continue;
        }
        ddp_buf_put_u8(&c->out, (uint8_t)k);
        ddp_buf_put(&c->out, a, an);
        ddp_buf_put(&c->out, b, bn);
        ddp_buf_put_u8(&c->out, '\n');
        flush(c);
    }
    sweep(r);
}

static void rv_message(void *self, const char *msg, size_t n)
{
    send_line(self, 'e', msg, n, "", 0);
}

static void rv_rank_line(void *self, int rank, const char *host, int stream, const uint8_t *line,
                         size_t n, unsigned flags)
{
    struct ddp__remote *r = self;
    if (!r->clients || (flags & DDP__LINE_PROGRESS) || !ddp__job_rank_listed(r->ranks, rank))
        return;
    char tag[300] = "";
    int tl = r->tag ? snprintf(tag, sizeof(tag), "[%s:%d] ", host, rank) : 0;
    if (tl >= (int)sizeof(tag))
        tl = (int)sizeof(tag) - 1;
    /* as the console marks the pieces of a line over 64 KiB */
    if ((flags & DDP__LINE_REST) && (size_t)tl + 6 < sizeof(tag)) {
        memcpy(tag + tl, "[...] ", 6);
        tl += 6;
    }
    if (flags & DDP__LINE_CUT) {
        uint8_t *p = malloc(n + 6);
        if (!p)
            return;
        memcpy(p, line, n);
        memcpy(p + n, " [...]", 6);
        send_line(r, stream == 2 ? 'e' : 'o', tag, (size_t)tl, p, n + 6);
        free(p);
        return;
    }
    send_line(r, stream == 2 ? 'e' : 'o', tag, (size_t)tl, line, n);
}

static void rv_status(void *self, const struct ddp__status *st)
{
    struct ddp__remote *r = self;
    if (!r->clients)
        return;
    char buf[300];
    size_t n = ddp__status_text(st, buf, sizeof(buf));
    send_line(r, 's', buf, n, "", 0);
}

static void rv_round(void *self, int round, int world, const char *const *hosts)
{
    (void)self;
    (void)round;
    (void)world;
    (void)hosts;
}

static void rv_summary(void *self, const struct ddp__summary *s)
{
    struct ddp__remote *r = self;
    ddp__summary_text(s, rv_message, r);
    char x[16];
    int n = snprintf(x, sizeof(x), "%d", s->exit_status);
    send_line(r, 'x', x, (size_t)n, "", 0);
}

static const struct ddp__view_ops remote_ops = {.message = rv_message,
                                                .rank_line = rv_rank_line,
                                                .status = rv_status,
                                                .round = rv_round,
                                                .summary = rv_summary};

struct ddp__view ddp__remote_view(struct ddp__remote *r)
{
    return (struct ddp__view){.ops = &remote_ops, .self = r};
}

bool ddp__remote_request(struct ddp__remote *r, const char *req, int fd)
{
    if (strcmp(req, "attach") == 0) {
        struct ddp__remote_client *c = calloc(1, sizeof(*c));
        if (!c || ddp_loop_add(r->loop, fd, DDP_LOOP_READ, on_io, c) < 0) {
            free(c);
            close(fd);
            return true;
        }
        c->owner = r;
        c->fd = fd;
        ddp_buf_init(&c->out);
        c->next = r->clients;
        r->clients = c;
        char info[1024];
        r->cb.info(info, sizeof(info));
        /* The first line: what it attached to (the same fields as `ddprun ps`). */
        ddp_buf_put_u8(&c->out, 'i');
        ddp_buf_put(&c->out, info, strlen(info));
        ddp_buf_put_u8(&c->out, '\n');
        flush(c);
        sweep(r);
        return true;
    }
    if (strcmp(req, "info") == 0) {
        char info[1024];
        r->cb.info(info, sizeof(info));
        size_t n = strlen(info);
        info[n < sizeof(info) - 1 ? n : sizeof(info) - 2] = '\n';
        ddp_write_all(fd, info, n < sizeof(info) - 1 ? n + 1 : sizeof(info) - 1);
        close(fd);
        return true;
    }
    if (strcmp(req, "stop") == 0) {
        static const char m[] = "stopping\n";
        ddp_write_all(fd, m, sizeof(m) - 1);
        if (r->nwaiters < (int)(sizeof(r->waiters) / sizeof(r->waiters[0])))
            r->waiters[r->nwaiters++] = fd; /* closed when the job ends */
        else
            close(fd);
        r->cb.stop();
        return true;
    }
    return false;
}

void ddp__remote_release(struct ddp__remote *r)
{
    for (struct ddp__remote_client *c = r->clients; c; c = c->next) {
        if (c->dead)
            continue;
        /* What is left, blocking now, but 2 s at most. */
        struct timeval tv = {.tv_sec = 2};
        setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) & ~O_NONBLOCK);
        ddp_loop_del(r->loop, c->fd);
        size_t left = ddp_buf_pending(&c->out);
        if (left)
            (void)ddp_write_all(c->fd, c->out.data + c->out.off, left);
        close(c->fd);
        c->fd = -1;
        c->dead = true;
        ddp_buf_release(&c->out);
    }
    sweep(r);
    for (int k = 0; k < r->nwaiters; k++)
        close(r->waiters[k]);
    r->nwaiters = 0;
}
