/* A store connection's replies and output (rendezvous/server.h): queued in its buffer, written
 * after the loop iteration, the rest on EPOLLOUT; closing is deferred to the after-hook. */
#include "rendezvous/server.h"
#include "common/log.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

void ddp__srv_close_later(struct conn *c, const char *reason)
{
    if (c->closing)
        return;
    c->closing = true;
    c->close_reason = reason;
    ddp_list_del(&c->link);
    ddp_list_add_tail(&c->srv->closing, &c->link);
}

/* Marks the connection as having output; the after-hook writes it. */
void ddp__srv_want_flush(struct conn *c)
{
    if (ddp_list_empty(&c->flush_link))
        ddp_list_add_tail(&c->srv->flushq, &c->flush_link);
    if (ddp_buf_pending(&c->out) > c->srv->max_outbuf && !c->closing) {
        DDP__SRV_DROP_WARN(
            c, "dropping connection from '%s': %zu bytes of replies unread (slow client)", c->peer,
            ddp_buf_pending(&c->out));
        STAT_ADD(c->srv, conns_dropped, 1);
        ddp__srv_close_later(c, "slow client: output backlog over the limit");
    }
}

size_t ddp__srv_reply_begin(struct conn *c, uint8_t op, uint32_t id, int status)
{
    size_t pos = ddp__proto_begin(&c->out, (uint8_t)(op | DDP__REPLY_BIT), id);
    ddp_buf_put_u32(&c->out, (uint32_t)status);
    return pos;
}

void ddp__srv_reply_end(struct conn *c, size_t pos)
{
    ddp__proto_end(&c->out, pos);
    ddp__srv_want_flush(c);
}

void ddp__srv_reply(struct conn *c, uint8_t op, uint32_t id, int status)
{
    ddp__srv_reply_end(c, ddp__srv_reply_begin(c, op, id, status));
}

/* Writes as much queued output as the socket takes; arms EPOLLOUT for the rest. */
void ddp__srv_flush(struct conn *c)
{
    while (ddp_buf_pending(&c->out) > 0) {
        ssize_t w = send(c->fd, c->out.data + c->out.off, ddp_buf_pending(&c->out), MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            ddp__srv_close_later(c, "write failed");
            return;
        }
        c->out.off += (size_t)w;
    }
    if (ddp_buf_pending(&c->out) == 0) {
        c->out.off = c->out.len = 0;
        /* Give back a large buffer once it drains (a big GET reply, say). */
        if (c->out.cap > (4u << 20))
            ddp_buf_release(&c->out);
        ddp_loop_modify(c->srv->loop, c->fd, DDP_LOOP_READ);
        if (c->close_after_write)
            ddp__srv_close_later(c, c->close_reason);
    } else {
        ddp_buf_compact(&c->out);
        /* A connection on its way out reads nothing more. */
        ddp_loop_modify(c->srv->loop, c->fd,
                        c->close_after_write ? DDP_LOOP_WRITE : DDP_LOOP_READ | DDP_LOOP_WRITE);
    }
}

void ddp__srv_reply_wait(struct conn *c, uint32_t id, int status)
{
    if (!c->torch) {
        ddp__srv_reply(c, DDP__OP_WAIT, id, status);
        return;
    }
    /* TCPStore: STOP_WAITING (0) once the keys exist; its waits do not time out here. */
    if (status == 0) {
        ddp_buf_put_u8(&c->out, 0);
        ddp__srv_want_flush(c);
    }
}
