/*
 * Consoles attached over the control socket (`ddprun attach`), a view of the job (cli/view/view.h),
 * and the control requests that act on the job: attach, stop, info. The supervisor hands it
 * the requests the watchdog (cli/supervisor/watchdog.c) does not answer itself, with callbacks for
 * what only it can do, so this file calls nothing of the supervisor's.
 *
 * To an attached client the job is a stream of lines, each a kind letter and text: 'o' a line
 * for stdout, 'e' one for stderr (ddprun's messages, the ranks' stderr, the summary), 's' the
 * status line (a terminal shows it in place), and at the end 'x' and the job's exit status.
 * A client that does not keep up (16 MiB behind) is dropped; the job never waits for one.
 */
#ifndef DDP_CLI_REMOTE_H
#define DDP_CLI_REMOTE_H

#include <stdbool.h>
#include <stddef.h>

#include "cli/view/view.h"

struct ddp_loop;
struct ddp__remote_client;

struct ddp__remote_cb {
    /* Stops the job as SIGINT does. */
    void (*stop)(void);
    /* One line for `ddprun ps`, tab-separated, without newline (cli/view/attached.c, info). */
    void (*info)(char *out, size_t n);
};

struct ddp__remote {
    struct ddp_loop *loop;
    struct ddp__remote_cb cb;
    bool tag;
    const char *ranks; /* the ranks shown (logs.console_ranks); NULL: all */
    struct ddp__remote_client *clients;
    int waiters[16]; /* `ddprun stop` clients: they learn the end when the job closes them */
    int nwaiters;
};

void ddp__remote_init(struct ddp__remote *r, struct ddp_loop *loop, bool tag, const char *ranks,
                      const struct ddp__remote_cb *cb);
struct ddp__view ddp__remote_view(struct ddp__remote *r);
/* A control request the watchdog passed on (fd is the client's); true when it took the fd. */
bool ddp__remote_request(struct ddp__remote *r, const char *req, int fd);
/* Sends what is left (2 s at most per client) and closes every client. */
void ddp__remote_release(struct ddp__remote *r);

#endif
