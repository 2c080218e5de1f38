/* The node agent's link to its launcher, and the takeover wait (cli/agent/link.h). */
#include "cli/agent/link.h"
#include "cli/proto/agent_proto.h"
#include "cli/proto/agent_wire.h"
#include "cli/sys/sys.h"
#include "common/err.h"
#include "rendezvous/store.h"
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
    int in, out;           /* the launcher's frames and ours; -1 while none is linked */
    struct ddp__seal seal; /* on: the link it dialled (TCP); off: a rejoin's local socket */
    struct ddp_buf raw;    /* records read, not yet opened */
    bool stdin_watched;    /* the starting session (stdin) is watched for its end */
    bool external;         /* joined with --join: no session started it */
    bool below;            /* started by another agent (ssh.fanout): its session may end first */
    int lfd;               /* listening for a new launcher */
    bool waiting;          /* no launcher linked */
    bool gone;             /* told cb.gone */
    char name[200];        /* the socket's abstract name */
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

/* Reads the one frame a launcher writes on an agent's stdin, BOOT: 0, or -1 said. */
static int read_boot(struct ddp__aw_boot *boot)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    int64_t deadline = ddp_now_ms() + 60000;
    int r = 0;
    uint8_t type = 0;
    const uint8_t *body;
    size_t len;
    const char *why = NULL;
    while ((r = ddp__agent_next(&b, &type, &body, &len)) == 0) {
        int64_t left = deadline - ddp_now_ms();
        struct pollfd p = {.fd = 0, .events = POLLIN};
        int pr = left > 0 ? poll(&p, 1, (int)left) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0) {
            why = "no word from the launcher on stdin within 60 s";
            break;
        }
        if (ddp_buf_reserve(&b, 4096) < 0)
            break;
        ssize_t n = ddp_read_eintr(0, b.data + b.len, b.cap - b.len);
        if (n == -EAGAIN)
            continue;
        if (n <= 0) {
            why = b.len ? "stdin ended inside the launcher's first frame"
                        : "stdin ended before the launcher said where to dial back (an agent is "
                          "started by ddprun, or joins a job with --join)";
            break;
        }
        b.len += (size_t)n;
    }
    int rc = -1, g = -1;
    /* An srun step's agents all read one BOOT_GROUP: each takes its node's entry, by the name
     * Slurm knows it by. */
    const char *me = getenv("SLURMD_NODENAME");
    char host[256] = "";
    if (!me || !*me)
        me = gethostname(host, sizeof(host) - 1) == 0 ? host : "";
    if (r > 0 && type == DDP__AG_BOOT && ddp__aw_get_boot(body, len, boot) == 0)
        rc = 0;
    else if (r > 0 && type == DDP__AG_BOOT_GROUP &&
             (g = ddp__aw_get_boot_group(body, len, me, boot)) == 0)
        rc = 0;
    else if (g == 1)
        fprintf(stderr, "ddprun agent: the launcher started no agent for this node ('%s')\n", me);
    else if (why)
        fprintf(stderr, "ddprun agent: %s\n", why);
    else if (r > 0 && type != DDP__AG_BOOT && type != DDP__AG_BOOT_GROUP)
        fprintf(stderr,
                "ddprun agent: the launcher's first frame is not BOOT (a ddprun older than this "
                "one, %s?): run the same ddprun on every node\n",
                DDP_VERSION);
    else
        fprintf(stderr, "ddprun agent: bad BOOT frame from the launcher\n");
    explicit_bzero(b.data, b.cap);
    ddp_buf_release(&b);
    return rc;
}

int ddp__link_dial(const char *addrs, const char *token, const struct ddp__aw_attach *att)
{
    char why[2048];
    int fd;
    if (ddp__aw_dial(addrs, token, att, 10000, &fd, &K.seal, why, sizeof(why)) < 0) {
        fprintf(stderr, "ddprun agent: cannot reach the launcher at any address it offered: %s\n",
                why);
        return -1;
    }
    return fd;
}

/* BOOT from stdin, then the launcher it names, dialled with its ticket: the fd, or -1 said. */
static int boot_and_dial(void)
{
    struct ddp__aw_boot *boot = calloc(1, sizeof(*boot));
    int fd = -1;
    if (boot && read_boot(boot) == 0) {
        K.below = boot->flags & DDP__AW_BOOT_BELOW;
        struct ddp__aw_attach att = {.kind = DDP__AW_PROVISIONED, .node = boot->node};
        snprintf(att.name, sizeof(att.name), "%s", boot->ticket);
        fd = ddp__link_dial(boot->addrs, boot->token, &att);
    }
    if (boot)
        explicit_bzero(boot, sizeof(*boot));
    free(boot);
    return fd;
}

/* `ddprun agent --join HOST:PORT --token-file FILE`: the launcher's store at HOST:PORT, proved
 * with the file's token, says where its agent port is; the agent dials HOST there. The fd, or
 * -1 said. */
static int join_dial(const char *hostport, const char *token_file)
{
    char host[256], addr[300], name[256] = "";
    int port;
    uint8_t *tok = NULL;
    size_t toklen = 0;
    struct ddp_store *s = NULL;
    void *v = NULL;
    size_t vlen = 0;
    int fd = -1, r;
    if (ddp_parse_hostport(hostport, host, sizeof(host), &port) < 0) {
        fprintf(stderr,
                "ddprun agent: --join takes HOST:PORT, the job's rendezvous address, not "
                "'%s'\n",
                hostport);
        return -1;
    }
    if (ddp_store_token_read_file(token_file, &tok, &toklen) < 0) {
        fprintf(stderr, "ddprun agent: cannot use the token file '%s' (said above)\n", token_file);
        return -1;
    }
    char *token = calloc(1, toklen + 1);
    if (token)
        memcpy(token, tok, toklen);
    ddp_store_token_free(tok, toklen);
    if (!token)
        return -1;
    if ((r = ddp_store_connect(host, port, token, strlen(token), 30000, &s)) < 0 ||
        (r = ddp_store_wait(s, (const char *const[]){DDP__AGENT_PORT_KEY}, 1, 30000)) < 0 ||
        (r = ddp_store_get(s, DDP__AGENT_PORT_KEY, &v, &vlen)) < 0) {
        fprintf(stderr,
                "ddprun agent: cannot join the job at %s: %s (is ddprun running there with "
                "launcher: external, and is this its token file?)\n",
                hostport, ddp_strerror(r));
    } else {
        int ap = vlen > 0 && vlen < 8 ? atoi((const char *)v) : 0;
        snprintf(addr, sizeof(addr), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, ap);
        gethostname(name, sizeof(name) - 1);
        struct ddp__aw_attach att = {.kind = DDP__AW_EXTERNAL};
        snprintf(att.name, sizeof(att.name), "%s", name[0] ? name : "unnamed");
        fd = ap > 0 ? ddp__link_dial(addr, token, &att) : -1;
        if (ap <= 0)
            fprintf(stderr, "ddprun agent: the job at %s gave no agent port\n", hostport);
    }
    free(v);
    ddp_store_close(s);
    explicit_bzero(token, strlen(token));
    free(token);
    return fd;
}

/* What both starts of a link set up before dialling. */
static void link_setup(struct ddp_loop *loop, const struct ddp__link_cb *cb)
{
    K.loop = loop;
    K.cb = *cb;
    ddp_buf_init(&K.hello);
    ddp_buf_init(&K.held);
    ddp_buf_init(&K.unacked);
    ddp_buf_init(&K.raw);
    ddp_timer_init(&K.expire, on_gone);
    ddp_timer_init(&K.fail, on_gone);
}

int ddp__link_init_join(struct ddp_loop *loop, const struct ddp__link_cb *cb, const char *version,
                        const char *hostport, const char *token_file)
{
    link_setup(loop, cb);
    K.external = true;
    int fd = join_dial(hostport, token_file);
    return fd < 0 ? -1 : ddp__link_attach(fd, version);
}

int ddp__link_init(struct ddp_loop *loop, const struct ddp__link_cb *cb, const char *version)
{
    link_setup(loop, cb);
    int fd = boot_and_dial();
    return fd < 0 ? -1 : ddp__link_attach(fd, version);
}

/*
 * The session that started the agent (its stdin: the launcher's pipe, the SSH channel, the
 * srun step) ended: the link ends with it, as when the launcher is gone (the launcher keeps
 * that session open for the agent's life and ends it only after the link). Not so for an agent
 * another agent started (ssh.fanout): that one's death ends the session, and must cost one node,
 * not this one too; the launcher ends this node on its link, and its guard ends it should the
 * launcher be gone.
 */
static void on_stdin(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    (void)arg;
    char buf[512];
    ssize_t n = ddp_read_eintr(fd, buf, sizeof(buf));
    if (n > 0 || n == -EAGAIN)
        return; /* nothing is sent there after BOOT: let it go */
    ddp_loop_del(loop, fd);
    K.stdin_watched = false;
    if (K.below)
        DDP_DEBUG(SUP, "agent: the session that started this node ended; its link goes on");
    else if (K.in >= 0 && K.seal.on)
        shutdown(K.in, SHUT_RDWR); /* the link reads its end next */
}

int ddp__link_attach(int fd, const char *version)
{
    K.in = K.out = fd;
    struct ddp__node_counts counts; /* for nproc_per_node gpu|cpu|auto, counted here */
    ddp__counts_here(&counts);
    /* MASTER_PORT, should this node be node 0 with rank 0's own TCPStore: free here, where
     * rank 0 binds it (the launcher's machine may be another, with other ports in use) */
    if (ddp__agent_put_hello(&K.hello, DDP__AG_AGENT_HELLO, version, &counts,
                             (uint32_t)ddp__free_port()) < 0 ||
        ddp__aw_write(K.out, &K.seal, K.hello.data, K.hello.len) < 0)
        K.out = -1; /* the first frame sent finds the link lost */
    if (ddp_loop_add(K.loop, K.in, DDP_LOOP_READ, on_readable, NULL) < 0) {
        fprintf(stderr, "ddprun agent: cannot watch the link to the launcher\n");
        return -1;
    }
    /* a file (/dev/null) cannot be watched, and does not end: then only the link tells */
    K.stdin_watched = !K.external && ddp_loop_add(K.loop, 0, DDP_LOOP_READ, on_stdin, NULL) == 0;
    return 0;
}

ssize_t ddp__link_read(int fd, struct ddp_buf *in)
{
    if (!K.seal.on || fd != K.in) {
        if (ddp_buf_reserve(in, 65536) < 0)
            return -ENOMEM;
        ssize_t n = ddp_read_eintr(fd, in->data + in->len, in->cap - in->len);
        if (n > 0)
            in->len += (size_t)n;
        return n;
    }
    if (ddp_buf_reserve(&K.raw, 65536) < 0)
        return -ENOMEM;
    ssize_t n;
    do
        n = recv(fd, K.raw.data + K.raw.len, K.raw.cap - K.raw.len, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    if (n == 0)
        return 0;
    K.raw.len += (size_t)n;
    size_t before = in->len;
    if (ddp__seal_open(&K.seal, &K.raw, in) < 0) {
        fprintf(stderr, "ddprun agent: a record from the launcher failed its authentication\n");
        return -EBADMSG;
    }
    return in->len > before ? (ssize_t)(in->len - before) : -EAGAIN;
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
    ddp__seal_wipe(&K.seal); /* a local socket of this user: no record layer */
    K.raw.len = K.raw.off = 0;
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
    ddp__seal_wipe(&K.seal);
    K.raw.len = K.raw.off = 0;
    if (!K.takeover_ms || !K.name[0])
        return -1;
    if (K.stdin_watched)
        ddp_loop_del(K.loop, 0);
    K.stdin_watched = false;
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
    if (!K.waiting && K.out >= 0 && ddp__aw_write(K.out, &K.seal, b->data, b->len) == 0) {
        if (output)
            unacked_push(b->data, b->len);
        return true;
    }
    if (!K.waiting && ddp__link_lost() < 0) {
        if (K.loop) /* from the loop: this may run deep inside a report */
            ddp_timer_start(K.loop, &K.fail, 0);
        return false;
    }
    bool record = b->len > 4 && b->data[4] == DDP__AG_ACKED_CKPT_FILE; /* never dropped */
    if (output && !record && K.held_output + b->len > HELD_OUTPUT_MAX) {
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
    ddp_buf_release(&K.raw);
    ddp__seal_wipe(&K.seal);
}

/* ---- `ddprun agent --rejoin JOB NODE` ---- */

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
    /* The new launcher's link, dialled back as any agent's, relayed in plain to the agent. */
    int l = boot_and_dial();
    if (l < 0)
        return DDP_EXIT_LAUNCH;
    K.in = l;
    struct ddp_buf plain;
    ddp_buf_init(&plain);
    int rc = 0;
    bool l_open = true;
    for (;;) {
        struct pollfd p[3] = {{.fd = l_open ? l : -1, .events = POLLIN},
                              {.fd = s, .events = POLLIN},
                              {.fd = l_open ? 0 : -1, .events = POLLIN}};
        if (poll(p, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            rc = DDP_EXIT_LAUNCH;
            break;
        }
        if (p[1].revents) { /* the agent's frames, to the launcher */
            char buf[65536];
            ssize_t n = ddp_read_eintr(s, buf, sizeof(buf));
            if (n == -EAGAIN)
                continue;
            if (n <= 0 || ddp__aw_write(l, &K.seal, buf, (size_t)n) < 0) {
                rc = n < 0 ? DDP_EXIT_LAUNCH : 0; /* the agent ended, or our launcher */
                break;
            }
        }
        if (l_open && p[2].revents) { /* the session that started us: its end is the link's */
            char c[512];
            ssize_t n = ddp_read_eintr(0, c, sizeof(c));
            if (n == 0 || (n < 0 && n != -EAGAIN)) {
                shutdown(s, SHUT_WR);
                l_open = false;
                continue;
            }
        }
        if (l_open && p[0].revents) {
            ssize_t n = ddp__link_read(l, &plain);
            if (n == -EAGAIN)
                continue;
            if (n <= 0 || ddp_write_all(s, plain.data, plain.len) < 0) {
                /* Our launcher is gone: the agent waits for the next one. */
                shutdown(s, SHUT_WR);
                l_open = false;
            }
            plain.len = plain.off = 0;
        }
    }
    ddp_buf_release(&plain);
    close(l);
    return rc;
}
