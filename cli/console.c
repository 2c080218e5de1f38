/* The launcher's console (cli/console.h). */
#include "cli/console.h"
#include "cli/job.h"
#include "cli/record.h"
#include "common/buf.h"
#include "common/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/banned.h"

void ddp__con_init(struct ddp__console *c, bool tty, bool tag, const char *ranks,
                   struct ddp__rec *rec)
{
    memset(c, 0, sizeof(*c));
    c->tty = tty;
    c->tag = tag;
    c->ranks = ranks;
    c->rec = rec;
}

void ddp__con_clear(struct ddp__console *c)
{
    if (c->transient) {
        ddp_write_all(2, "\r\033[K", 4);
        c->transient = false;
    }
}

void ddp__con_say(struct ddp__console *c, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(buf) - 2)
        n = (int)sizeof(buf) - 2;
    if (c->rec)
        ddp__rec_message(c->rec, buf, (size_t)n);
    buf[n++] = '\n';
    ddp__con_clear(c);
    ddp_write_all(2, buf, (size_t)n);
}

void ddp__con_status(struct ddp__console *c, const char *text)
{
    if (!c->tty || ddp_now_ms() - c->progress_ms < 1000)
        return;
    char buf[300];
    int n = snprintf(buf, sizeof(buf), "\r\033[K%s", text);
    ddp_write_all(2, buf, (size_t)(n < (int)sizeof(buf) ? n : (int)sizeof(buf) - 1));
    c->transient = true;
}

void ddp__con_rank(struct ddp__console *c, int rank, const char *host, int stream,
                   const uint8_t *line, size_t n, bool progress)
{
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
    ddp_buf_put(&b, line, n);
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
