/*
 * The launcher's console: ddprun's own messages (also kept in the job's ddprun.log), the
 * status line on a terminal, and the ranks' output, tagged [host:rank], filtered to the ranks
 * chosen (logs.console_ranks, --ranks), with progress bars (lines a rank rewrites with a
 * carriage return, as tqdm does) redrawn in place on a terminal.
 */
#ifndef DDP_CLI_CONSOLE_H
#define DDP_CLI_CONSOLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ddp__rec;

struct ddp__console {
    bool tty, tag;
    const char *ranks;    /* the ranks shown, as in logs.console_ranks; NULL: all */
    struct ddp__rec *rec; /* where messages are kept, or NULL */
    bool transient;       /* the status line or a progress bar is on the screen's last line */
    int64_t progress_ms;  /* when a progress bar was last drawn: the status line waits */
};

void ddp__con_init(struct ddp__console *c, bool tty, bool tag, const char *ranks,
                   struct ddp__rec *rec);

/* One message of ddprun's, one write to stderr, never mixed into another line. */
void ddp__con_say(struct ddp__console *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* On a terminal: the status line (text) on the last line, unless a progress bar was drawn in
 * the last second. */
void ddp__con_status(struct ddp__console *c, const char *text);
/* Takes the status line or progress bar off the screen (before other output). */
void ddp__con_clear(struct ddp__console *c);

/*
 * A line of rank's output (stream 1 stdout, 2 stderr), without its newline: one write,
 * tagged unless tagging is off, if the rank is shown. With progress set it is a line the rank
 * rewrites in place: drawn over the last line on a terminal, not shown elsewhere.
 */
void ddp__con_rank(struct ddp__console *c, int rank, const char *host, int stream,
                   const uint8_t *line, size_t n, bool progress);

#endif
