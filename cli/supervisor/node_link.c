/*
 * An agent's link as the launcher's files about nodes share it (cli/supervisor/nodes.h): what is
 * sent to an agent (on its link, or kept until it dials back), a link's end for a node without a
 * process of its own, and the BOOT that tells an agent where to dial.
 */
#include "cli/supervisor/nodes.h"
#include "cli/proto/agent_wire.h"
#include "common/loop.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

void ddp__nodes_send(struct ddp__nodes *n, int i, const struct ddp_buf *b)
{
    struct ddp__node_proc *p = &n->p[i];
    if (p->link >= 0) {
        if (ddp__aw_write(p->link, &p->seal, b->data, b->len) < 0)
            shutdown(p->link, SHUT_WR); /* the agent is gone; its reaping tells the rest */
    } else if ((p->ch.pid > 0 || p->slot_held) && !p->linked) {
        ddp_buf_put(&p->txq, b->data, b->len);
    }
}

/* Ends a node without a process of its own (an external slot, an srun step's member, a node
 * started below another): its link closes (its agent stops), and its end is told. */
void ddp__nodes_link_end(struct ddp__nodes *n, int i)
{
    struct ddp__node_proc *p = &n->p[i];
    if (p->link >= 0) {
        ddp_loop_del(n->loop, p->link);
        close(p->link);
        p->link = -1;
    }
    if (p->slot_held && !ddp_timer_armed(&p->fin))
        ddp_timer_start(n->loop, &p->fin, 0);
}

int ddp__nodes_boot(struct ddp__nodes *n, int i, uint8_t flags, struct ddp_buf *out)
{
    struct ddp__aw_boot *boot = calloc(1, sizeof(*boot));
    if (!boot) {
        errno = ENOMEM;
        return -1;
    }
    snprintf(boot->token, sizeof(boot->token), "%s", n->cb.token);
    n->cb.dial_addrs(n->cb.arg, i, boot->addrs, sizeof(boot->addrs));
    boot->node = (uint32_t)i;
    memcpy(boot->ticket, n->p[i].ticket, sizeof(n->p[i].ticket));
    boot->flags = flags;
    int r = ddp__aw_put_boot(out, boot);
    explicit_bzero(boot, sizeof(*boot));
    free(boot);
    if (r < 0)
        errno = ENOMEM;
    return r < 0 ? -1 : 0;
}
