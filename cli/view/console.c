/* The launcher's console (cli/view/console.h). */
#include "cli/view/console.h"
#include "cli/spec/job.h"
#include "cli/view/record.h"
#include "common/buf.h"
#include "common/util.h"

#include <stdio.h>
#include <string.h>

#include "common/banned.h"

void ddp__con_init(struct ddp__console *c, bool tty, bool tag, const char *ranks)
{
    memset(c, 0, sizeof(*c));
    c->tty = tty;
    c->tag = tag;
    c->ranks = ranks;
}

void ddp__con_clear(struct ddp__console *c)
{
    if (c->transient) {
        ddp_write_all(2, "\r\033[K", 4);
        c->transient = false;
    }
}

/* One message of ddprun's: one write to stderr, never mixed into another line. */
static void con_message(void *self, const char *msg, size_t n)
{
    struct ddp__console *c = self;
    struct ddp_buf b;
    ddp_buf_init(&b);
    ddp_buf_put(&b, msg, n);
    ddp_buf_put_u8(&b, '\n');
    ddp__con_clear(c);
    ddp_write_all(2, b.data, b.len);
    ddp_buf_release(&b);
}

static void con_status(void *self, const struct ddp__status *st)
{
    struct ddp__console *c = self;
    if (!c->tty || ddp_now_ms() - c->progress_ms < 1000)
        return;
    char buf[300] = "\r\033[K";
    size_t n = 4 + ddp__status_text(st, buf + 4, sizeof(buf) - 4);
    ddp_write_all(2, buf, n);
    c->transient = true;
}

static void con_rank_line(void *self, int rank, const char *host, int stream, const uint8_t *line,
                          size_t n, unsigned flags)
{
    struct ddp__console *c = self;
    bool progress = flags & DDP__LINE_PROGRESS;
    if (!ddp__job_rank_listed(c->ranks, rank) || (progress && !c->tty))
        return;
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (progress)
        ddp_buf_put(&b, "\r\033[K", 4);
    if (c->tag) {
        char tag[300];
        int tl = snprintf(tag, sizeof(tag), "[%s:%d] ", host, rank);
        ddp_buf_put(&b, tag, (size_t)(tl < (int)sizeof(tag) ? tl : (int)sizeof(tag) - 1));
    }
    /* the pieces of a line over 64 KiB: each shown as a line, marked where it was cut */
    if (flags & DDP__LINE_REST)
        ddp_buf_put(&b, "[...] ", 6);
    ddp_buf_put(&b, line, n);
    if (flags & DDP__LINE_CUT)
        ddp_buf_put(&b, " [...]", 6);
    if (!progress)
        ddp_buf_put_u8(&b, '\n');
    /* One write per line: lines from different ranks never mix within a line. A progress bar
     * goes to stderr, on the terminal's last line, where the status line also lives. */
    if (!progress)
        ddp__con_clear(c);
    ddp_write_all(progress ? 2 : stream == 2 ? 2 : 1, b.data, b.len);
    if (progress) {
        c->transient = true;
        c->progress_ms = ddp_now_ms();
    }
    ddp_buf_release(&b);
}

static void con_round(void *self, int round, int world, const char *const *hosts)
{
    (void)self;
    (void)round;
    (void)world;
    (void)hosts;
}

static void con_summary(void *self, const struct ddp__summary *s)
{
    ddp__con_clear(self);
    ddp__summary_text(s, con_message, self);
}

static const struct ddp__view_ops con_ops = {.message = con_message,
                                             .rank_line = con_rank_line,
                                             .status = con_status,
                                             .round = con_round,
                                             .summary = con_summary};

struct ddp__view ddp__con_view(struct ddp__console *c)
{
    return (struct ddp__view){.ops = &con_ops, .self = c};
}
