/*
 * The launcher's console, a view of the job (cli/view/view.h): ddprun's messages on stderr, the
 * status line on a terminal, the ranks' output tagged [host:rank] and filtered to the ranks
 * chosen (logs.console_ranks, --ranks), progress bars (lines a rank rewrites after a carriage
 * return, as tqdm does) redrawn in place on a terminal, and the final table.
 */
#ifndef DDP_CLI_CONSOLE_H
#define DDP_CLI_CONSOLE_H

#include <stdbool.h>
#include <stdint.h>

#include "cli/view/view.h"

struct ddp__console {
    bool tty, tag;
    const char *ranks;   /* the ranks shown, as in logs.console_ranks; NULL: all */
    bool transient;      /* the status line or a progress bar is on the screen's last line */
    int64_t progress_ms; /* when a progress bar was last drawn: the status line waits */
};

void ddp__con_init(struct ddp__console *c, bool tty, bool tag, const char *ranks);
struct ddp__view ddp__con_view(struct ddp__console *c);
/* Takes the status line or a progress bar off the screen (before ddprun exits). */
void ddp__con_clear(struct ddp__console *c);

#endif
