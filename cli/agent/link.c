/* The node agent's link to its launcher, and the takeover wait (cli/agent/link.h). */
#include "cli/agent/link.h"
#include "cli/proto/agent_proto.h"
#include "cli/sys/sys.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "common/loop.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/banned.h"

#define HELD_OUTPUT_MAX (16u << 20) /* output held for a new launcher; beyond it lines drop */
#define UNACKED_MAX (16u << 20)     /* output kept until acknowledged; beyond it the oldest goes */

static struct {
    struct ddp_loop *loop;
    struct ddp__link_cb cb;
    int in, out;    /* the launcher's frames and ours; -1 while none is linked */
    int lfd;        /* listening for a new launcher */
    bool waiting;   /* no launcher linked */
    bool gone;      /* told cb.gone */
    char name[200]; /* the socket's abstract name */
    uint64_t takeover_ms;
    struct ddp_buf hello; /* our HELLO: first on every link */
    struct ddp_buf held;  /* STATE, then the frames since */
    size_t held_output;
    /* With a takeover wait: the OUTPUT and ERROR frames this link carried that the launcher has
     * not acknowledged (ACK): in its pipes or its SSH connection when it died, they go to the
     * next launcher first, before STATE. unacked_seq is the link's count of such frames before
     * them. */
    struct ddp_buf unacked;
    uint64_t unacked_seq, sent_output;
    uint64_t dropped;
    struct ddp_timer expire, fail;
} K = {.in = -1, .out = -1, .lfd = -1};

static void on_readable(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    (void)arg;
    K.cb.readable(fd);
}

static void on_gone(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    if (!K.gone) {
        K.gone = true;
        K.cb.gone();
    }
}

void ddp__link_init(struct ddp_loop *loop, const struct ddp__link_cb *cb, const char *version)
{
    K.loop = loop;
    K.cb = *cb;
    K.in = 0;
    K.out = 1;
    ddp_buf_init(&K.hello);
    struct ddp__node_counts counts; /* for nproc_per_node gpu|cpu|auto, counted here */
    ddp__counts_here(&counts);
    /* MASTER_PORT, should this node be node 0 with rank 0's own TCPStore: free here, where
     * rank 0 binds it (the launcher's machine may be another, with other ports in use) */
    if (ddp__agent_put_hello(&K.hello, DDP__AG_AGENT_HELLO, version, &counts,
                             (uint32_t)ddp__free_port()) < 0 ||
        ddp_write_all(K.out, K.hello.data, K.hello.len) < 0)
        K.out = -1; /* the first frame sent finds the link lost */
    ddp_buf_init(&K.held);
    ddp_buf_init(&K.unacked);
    ddp_timer_init(&K.expire, on_gone);
    ddp_timer_init(&K.fail, on_gone);
    if (ddp_loop_add(loop, 0, DDP_LOOP_READ, on_readable, NULL) < 0) {
        /* a file, /dev/null: epoll cannot watch it, and no launcher's frames come from it */
        fprintf(stderr, "ddprun agent: stdin is not a pipe or socket from a launcher\n");
        K.in = -1;
        ddp_timer_start(loop, &K.fail, 0);
    }
}

void ddp__link_configure(const char *job_id, unsigned node, uint64_t takeover_ms)
{
    K.takeover_ms = takeover_ms;
    snprintf(K.name, sizeof(K.name), "ddprun-agent.%u.%s.%u", (unsigned)getuid(), job_id, node);
}

static socklen_t abstract_addr(const char *name, struct sockaddr_un *a)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    size_t n = strlen(name);
    if (n > sizeof(a->sun_path) - 1)
        n = sizeof(a->sun_path) - 1;
    memcpy(a->sun_path + 1, name, n); /* sun_path[0] == 0: the abstract namespace */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* Drops the first unacknowledged frame. */
static void unacked_pop(void)
{
    uint8_t type;
    const uint8_t *body;
    size_t len;
    if (ddp__agent_next(&K.unacked, &type, &body, &len) <= 0) {
        K.unacked.len = K.unacked.off = 0; /* cannot be: only whole frames go in */
        return;
    }
    K.unacked_seq++;
    if (!ddp_buf_pending(&K.unacked))
        K.unacked.len = K.unacked.off = 0;
    else if (K.unacked.off > ddp_buf_pending(&K.unacked))
        ddp_buf_compact(&K.unacked);
}

/* An OUTPUT or ERROR frame went out on the link: kept until the launcher acknowledges it. */
static void unacked_push(const uint8_t *frame, size_t n)
{
    K.sent_output++;
    if (!K.takeover_ms)
        return;
    while (ddp_buf_pending(&K.unacked) && ddp_buf_pending(&K.unacked) + n > UNACKED_MAX)
        unacked_pop();
    if (ddp_buf_put(&K.unacked, frame, n) < 0)
        K.unacked_seq = K.sent_output; /* out of memory: what was kept is let go */
}

/* A new link: its count of OUTPUT frames starts again. */
static void unacked_reset(void)
{
    K.unacked.len = K.unacked.off = 0;
    K.unacked_seq = K.sent_output = 0;
}

int ddp__link_ack(const uint8_t *body, size_t len)
{
    struct ddp_rd rd;
    uint64_t n;
    ddp_rd_init(&rd, body, len);
    if (ddp_rd_u64(&rd, &n) < 0 || ddp_rd_left(&rd) || n > K.sent_output)
        return -1;
    while (K.unacked_seq < n && ddp_buf_pending(&K.unacked))
        unacked_pop();
    if (K.unacked_seq < n) /* let go of (beyond the bound) before the ACK came */
        K.unacked_seq = n;
    return 0;
}

/* The launcher is linked again: what was held goes out first, in order. */
static void on_accept(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    (void)arg;
    int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0)
        return;
    struct ucred cr;
    socklen_t cl = sizeof(cr);
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 || cr.uid != getuid() ||
        ddp_write_all(c, K.hello.data, K.hello.len) < 0 ||
        ddp_write_all(c, K.held.data, K.held.len) < 0) {
        close(c); /* another user, or a launcher gone at once: keep waiting */
        return;
    }
    DDP_DEBUG(SUP, "agent: a new launcher rejoined (pid %d); %zu bytes held went out", (int)cr.pid,
              K.held.len);
    ddp_loop_del(loop, fd);
    close(fd);
    K.lfd = -1;
    ddp_timer_stop(loop, &K.expire);
    /* The OUTPUT and ERROR frames held are this link's first: kept until acknowledged. */
    unacked_reset();
    uint8_t type;
    const uint8_t *body;
    size_t len;
    while (ddp__agent_next(&K.held, &type, &body, &len) > 0)
        if (ddp__agent_acked(type))
            unacked_push(body - 5, len + 5);
    K.held.len = K.held.off = 0;
    K.held_output = 0;
    K.dropped = 0;
    K.in = K.out = c;
    K.waiting = false;
    K.cb.linked();
    ddp_loop_add(loop, c, DDP_LOOP_READ, on_readable, NULL);
}

int ddp__link_lost(void)
{
    if (K.waiting)
        return 0;
    if (K.in >= 0) {
        ddp_loop_del(K.loop, K.in);
        if (K.in > 2)
            close(K.in);
    }
    K.in = K.out = -1;
    if (!K.takeover_ms || !K.name[0])
        return -1;
    /* Nothing reads our stdout and stderr any more: writes there would fail or block. */
    int dn = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (dn >= 0) {
        dup2(dn, 0);
        dup2(dn, 1);
        dup2(dn, 2);
        close(dn);
    }
    struct sockaddr_un a;
    socklen_t al = abstract_addr(K.name, &a);
    K.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (K.lfd < 0 || bind(K.lfd, (struct sockaddr *)&a, al) != 0 || listen(K.lfd, 4) != 0 ||
        ddp_loop_add(K.loop, K.lfd, DDP_LOOP_READ, on_accept, NULL) < 0) {
        if (K.lfd >= 0)
            close(K.lfd);
        K.lfd = -1;
        return -1;
    }
    K.waiting = true;
    /* What the launcher may not have shown goes first, as it was written before STATE's news
     * (the new launcher holds it until STATE names the round it belongs to). */
    K.held.len = K.held.off = 0;
    K.held_output = ddp_buf_pending(&K.unacked);
    ddp_buf_put(&K.held, K.unacked.data + K.unacked.off, ddp_buf_pending(&K.unacked));
    unacked_reset();
    K.cb.snapshot(&K.held);
    ddp_timer_start(K.loop, &K.expire, (int64_t)K.takeover_ms);
    return 0;
}

bool ddp__link_send(const struct ddp_buf *b, bool output)
{
    if (!K.waiting && K.out >= 0 && ddp_write_all(K.out, b->data, b->len) == 0) {
        if (output)
            unacked_push(b->data, b->len);
        return true;
    }
    if (!K.waiting && ddp__link_lost() < 0) {
        if (K.loop) /* from the loop: this may run deep inside a report */
            ddp_timer_start(K.loop, &K.fail, 0);
        return false;
    }
    if (output && K.held_output + b->len > HELD_OUTPUT_MAX) {
        K.dropped++;
        return false;
    }
    if (output)
        K.held_output += b->len;
    ddp_buf_put(&K.held, b->data, b->len);
    return false;
}

bool ddp__link_hello(uint8_t type, const uint8_t *body, size_t len)
{
    uint32_t proto;
    char ver[DDP__AGENT_VERSION_MAX + 1];
    if (type != DDP__AG_HELLO) {
        fprintf(stderr,
                "ddprun agent: the launcher did not say its version first (a ddprun older "
                "than this one, %s?): run the same ddprun on every node\n",
                DDP_VERSION);
        return false;
    }
    if (ddp__agent_get_hello(body, len, &proto, ver, sizeof(ver)) < 0) {
        fprintf(stderr, "ddprun agent: malformed HELLO from the launcher\n");
        return false;
    }
    if (proto != DDP__AGENT_PROTO) {
        DDP_INFO(SUP, "agent: the launcher is ddprun %s (agent protocol %u), we are %s (%u)", ver,
                 proto, DDP_VERSION, DDP__AGENT_PROTO);
        return false;
    }
    return true;
}

void ddp__link_release(void)
{
    if (K.lfd >= 0)
        close(K.lfd);
    K.lfd = -1;
    ddp_buf_release(&K.hello);
    ddp_buf_release(&K.held);
    ddp_buf_release(&K.unacked);
}

/* ---- `ddprun agent --rejoin JOB NODE` ---- */

static int relay(int from, int to)
{
    char buf[65536];
    ssize_t n = ddp_read_eintr(from, buf, sizeof(buf));
    if (n > 0 && ddp_write_all(to, buf, (size_t)n) < 0)
        return -1;
    if (n == -EAGAIN)
        return 1;
    return n > 0 ? 1 : 0;
}

int ddp__cmd_agent_rejoin(const char *job_id, const char *node)
{
    char name[200];
    snprintf(name, sizeof(name), "ddprun-agent.%u.%s.%s", (unsigned)getuid(), job_id, node);
    struct sockaddr_un a;
    socklen_t al = abstract_addr(name, &a);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&a, al) != 0) {
        fprintf(stderr,
                "ddprun agent: no agent of job %s for node %s waits here (it ended, or its wait "
                "for a new launcher ran out)\n",
                job_id, node);
        return DDP_EXIT_LAUNCH;
    }
    bool in_open = true;
    for (;;) {
        struct pollfd p[2] = {{.fd = in_open ? 0 : -1, .events = POLLIN},
                              {.fd = s, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return DDP_EXIT_LAUNCH;
        }
        if (p[1].revents) {
            int r = relay(s, 1);
            if (r <= 0)
                return r < 0 ? DDP_EXIT_LAUNCH : 0; /* the agent ended, or our launcher */
        }
        if (in_open && p[0].revents && relay(0, s) <= 0) {
            /* Our launcher is gone: the agent waits for the next one. */
            shutdown(s, SHUT_WR);
            in_open = false;
        }
    }
}
