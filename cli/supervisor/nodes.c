/* The launcher's node agents as processes (cli/supervisor/nodes.h). */
#include "cli/supervisor/nodes.h"
#include "cli/supervisor/dialin.h"
#include "cli/proto/agent_proto.h"
#include "cli/proto/agent_wire.h"
#include "cli/spec/job.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "common/loop.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

#define HELD_MAX (32u << 20) /* an agent holds at most 16 MiB of output (cli/agent/link.c) */
#define SAME_DDPRUN                                                                                \
    "the same ddprun must run on every node (ssh.remote_ddprun names the one over SSH; "           \
    "`ddprun doctor` compares them)"

/* A node without a process of its own (an external slot, an srun step's member, a node started
 * below another) ended: its link, or the launcher gave it up. Told from the loop, as a reaped
 * process is. */
static void on_fin(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    struct ddp__node_proc *p =
        (struct ddp__node_proc *)((char *)t - offsetof(struct ddp__node_proc, fin));
    struct ddp__nodes *n = p->owner;
    if (!p->slot_held)
        return;
    p->slot_held = p->pending = false;
    ddp_buf_release(&p->rx);
    ddp_buf_release(&p->lraw);
    ddp_buf_release(&p->txq);
    ddp_buf_release(&p->join);
    ddp__seal_wipe(&p->seal);
    ddp__nodes_tree_gone(n, p->index);
    n->cb.ended(n->cb.arg, p->index, p->fin_st);
}

int ddp__nodes_init(struct ddp__nodes *n, struct ddp_loop *loop, const struct ddp_job *job,
                    const struct ddp__prov_ctx *ctx, const struct ddp__nodes_cb *cb)
{
    memset(n, 0, sizeof(*n));
    n->loop = loop;
    n->job = job;
    n->kh_gen = 1;
    n->ctx = *ctx;
    n->cb = *cb;
    int *ups = calloc(job->nnodes + 1, sizeof(*ups));
    if (!ups || ddp__job_ssh_tree(job, ups) < 0 || !(n->p = calloc(job->nnodes, sizeof(*n->p)))) {
        free(ups);
        return DDP_ENOMEM;
    }
    for (size_t i = 0; i < job->nnodes; i++) {
        n->p[i].owner = n;
        n->p[i].index = (int)i;
        n->p[i].prov = ddp__provisioner(job, i);
        n->p[i].ch.in_fd = n->p[i].ch.out_fd = n->p[i].ch.err_fd = -1;
        n->p[i].link = -1;
        n->p[i].step = -1;
        n->p[i].parent = -1;
        n->p[i].tree_up = ups[i];
        n->p[i].external = n->p[i].prov == &ddp__prov_external;
        n->p[i].grouped = n->p[i].prov->start_group != NULL;
        ddp_timer_init(&n->p[i].fin, on_fin);
    }
    free(ups);
    return 0;
}

static void close_fd(struct ddp__nodes *n, int *fd, bool watched)
{
    if (*fd < 0)
        return;
    if (watched)
        ddp_loop_del(n->loop, *fd);
    close(*fd);
    *fd = -1;
}

void ddp__nodes_release(struct ddp__nodes *n)
{
    ddp__dialin_stop();
    ddp__nodes_steps_release(n);
    for (size_t i = 0; n->p && i < n->job->nnodes; i++) {
        struct ddp__node_proc *p = &n->p[i];
        close_fd(n, &p->ch.in_fd, false);
        close_fd(n, &p->ch.out_fd, true);
        close_fd(n, &p->ch.err_fd, true);
        close_fd(n, &p->link, true);
        ddp__seal_wipe(&p->seal);
        ddp_buf_release(&p->rx);
        ddp_buf_release(&p->erx);
        ddp_buf_release(&p->held);
        ddp_buf_release(&p->lraw);
        ddp_buf_release(&p->txq);
        ddp_buf_release(&p->join);
        ddp_timer_stop(n->loop, &p->fin);
    }
    free(n->p);
    n->p = NULL;
}

/* The OUTPUT frames handed over (shown) or dropped for good: the agent need not keep them for
 * a next launcher. */
static void send_ack(struct ddp__nodes *n, int i)
{
    struct ddp__node_proc *p = &n->p[i];
    if (!n->ctx.detach || p->acked == p->outputs)
        return;
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_ACK);
    ddp_buf_put_u64(&b, p->outputs);
    ddp__agent_end(&b, pos);
    ddp__nodes_send(n, i, &b);
    ddp_buf_release(&b);
    p->acked = p->outputs;
}

void ddp__nodes_flush_held(struct ddp__nodes *n, int i, bool deliver)
{
    struct ddp__node_proc *p = &n->p[i];
    uint8_t type;
    const uint8_t *body;
    size_t len;
    p->holding = false;
    while (ddp__agent_next(&p->held, &type, &body, &len) > 0) {
        /* (a checkpoint file's record counts in any round: its fence is the node's loss) */
        if (deliver || type == DDP__AG_ACKED_CKPT_FILE)
            n->cb.frame(n->cb.arg, i, type, body, len);
        p->outputs++;
    }
    p->outputs += p->held_dropped;
    p->held_dropped = 0;
    ddp_buf_release(&p->held);
    send_ack(n, i);
}

bool ddp__nodes_counts(const struct ddp__nodes *n, int i, struct ddp__node_counts *c)
{
    *c = n->p[i].counts;
    return n->p[i].has_counts;
}

uint32_t ddp__nodes_free_port(const struct ddp__nodes *n, int i)
{
    return n->p[i].hello ? n->p[i].port : 0;
}

void ddp__nodes_refuse(struct ddp__nodes *n, int i, const char *why)
{
    struct ddp__node_proc *p = &n->p[i];
    snprintf(p->refused, sizeof(p->refused), "%s", why);
    char msg[500];
    int m = snprintf(msg, sizeof(msg), "ddprun: error: the agent on '%s' %s", n->job->nodes[i].host,
                     why);
    n->cb.message(n->cb.arg, i, msg, (size_t)m < sizeof(msg) ? (size_t)m : sizeof(msg) - 1);
    p->hello = false; /* what else it sends is dropped */
    ddp__nodes_end(n, i, 1);
}

/* Agent i's first frame: its HELLO, of our protocol. Else false, said why. */
static bool agent_hello(struct ddp__nodes *n, int i, uint8_t type, const uint8_t *body, size_t len)
{
    struct ddp__node_proc *p = &n->p[i];
    uint32_t proto;
    int counts, port;
    char ver[DDP__AGENT_VERSION_MAX + 1];
    if (type != DDP__AG_AGENT_HELLO)
        snprintf(p->refused, sizeof(p->refused),
                 "did not say its version first: a ddprun older than this one (%s) runs there",
                 DDP_VERSION);
    else if (ddp__agent_get_hello(body, len, &proto, ver, sizeof(ver)) < 0)
        snprintf(p->refused, sizeof(p->refused), "sent a malformed HELLO");
    else if (proto != DDP__AGENT_PROTO)
        snprintf(p->refused, sizeof(p->refused),
                 "is ddprun %s (agent protocol %u), this is ddprun %s (protocol %u)", ver, proto,
                 DDP_VERSION, DDP__AGENT_PROTO);
    else if ((counts = ddp__agent_get_hello_counts(body, len, &p->counts)) < 0)
        snprintf(p->refused, sizeof(p->refused), "sent a malformed HELLO (its node's counts)");
    else if ((port = ddp__agent_get_hello_port(body, len, &p->port)) < 0)
        snprintf(p->refused, sizeof(p->refused), "sent a malformed HELLO (its free port)");
    else {
        p->has_counts = counts == 0; /* an agent of 0.1.0 before them sends none */
        if (port != 0)
            p->port = 0; /* nor one before it a port */
        return p->hello = true;
    }
    char msg[400];
    int m = snprintf(msg, sizeof(msg), "ddprun: error: the agent on '%s' %s; " SAME_DDPRUN,
                     n->job->nodes[i].host, p->refused);
    n->cb.message(n->cb.arg, i, msg, (size_t)m < sizeof(msg) ? (size_t)m : sizeof(msg) - 1);
    return false;
}

static void parse_frames(struct ddp__nodes *n, int i);

/* Reads what agent i sent on its link and hands over its frames: 1 when something was read, 0
 * when nothing was waiting, -1 at EOF (or a record that fails its authentication). */
static int read_frames(struct ddp__nodes *n, int i)
{
    struct ddp__node_proc *p = &n->p[i];
    if (p->link < 0 || ddp_buf_reserve(&p->lraw, 65536) < 0)
        return -1;
    ssize_t r;
    do
        r = recv(p->link, p->lraw.data + p->lraw.len, p->lraw.cap - p->lraw.len, MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (r <= 0) {
        close_fd(n, &p->link, true);
        return -1;
    }
    p->lraw.len += (size_t)r;
    if (ddp__seal_open(&p->seal, &p->lraw, &p->rx) < 0) {
        char msg[300];
        int m = snprintf(msg, sizeof(msg),
                         "ddprun: error: a record from the agent on '%s' failed its "
                         "authentication; ending it",
                         n->job->nodes[i].host);
        n->cb.message(n->cb.arg, i, msg, (size_t)m);
        close_fd(n, &p->link, true);
        p->rx.len = p->rx.off = 0;
        ddp__nodes_end(n, i, 1);
        return -1;
    }
    parse_frames(n, i);
    return 1;
}

/* Hands over the whole frames agent i's link has brought. */
static void parse_frames(struct ddp__nodes *n, int i)
{
    struct ddp__node_proc *p = &n->p[i];
    uint8_t type;
    const uint8_t *body;
    size_t len;
    int k;
    bool refused = false;
    while ((k = ddp__agent_next(&p->rx, &type, &body, &len)) > 0) {
        if (!p->hello) {
            if (p->refused[0]) { /* refused already: what else it sends is dropped */
                p->rx.len = p->rx.off = 0;
                return;
            }
            if (!(refused = !agent_hello(n, i, type, body, len)))
                continue;
            break;
        }
        if (ddp__agent_acked(type) && p->holding) {
            if (p->held.len + len + 5 <= HELD_MAX) {
                size_t pos = ddp__agent_begin(&p->held, type);
                ddp_buf_put(&p->held, body, len);
                ddp__agent_end(&p->held, pos);
            } else {
                p->held_dropped++; /* dropped for good */
            }
            continue;
        }
        if (ddp__nodes_tree_frame(n, i, type, body, len))
            continue; /* the SSH tree's (cli/supervisor/node_tree.c) */
        n->cb.frame(n->cb.arg, i, type, body, len);
        p->outputs += ddp__agent_acked(type);
    }
    ddp_buf_compact(&p->rx);
    send_ack(n, i);
    if (k < 0) { /* a refusal said its own why */
        char msg[300];
        int m = snprintf(msg, sizeof(msg),
                         "ddprun: error: bad frame from the agent on '%s'; "
                         "ending it",
                         n->job->nodes[i].host);
        n->cb.message(n->cb.arg, i, msg, (size_t)m);
    }
    if (k < 0 || refused) {
        p->rx.len = p->rx.off = 0;
        /* Level 1: an SSH bridge, still connected, has the remote session killed (SIGKILL of
         * the bridge would leave the agent there); a local agent's process group ends. */
        ddp__nodes_end(n, i, 1);
    }
}

static void message_line(void *arg, const char *s, size_t len)
{
    struct ddp__node_proc *p = arg;
    p->owner->cb.message(p->owner->cb.arg, p->index, s, len);
}

/* Reads agent i's stderr (its own messages and, over SSH, the bridge's and the remote
 * agent's): each line goes to cb.message. At EOF the rest goes out and the pipe closes. */
static void read_messages(struct ddp__nodes *n, int i)
{
    struct ddp__node_proc *p = &n->p[i];
    if (p->ch.err_fd >= 0 && ddp__read_lines(p->ch.err_fd, &p->erx, message_line, p) == 1) {
        close_fd(n, &p->ch.err_fd, true);
        ddp_buf_release(&p->erx);
    }
}

static void on_link(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)fd;
    (void)mask;
    struct ddp__node_proc *p = arg;
    if (read_frames(p->owner, p->index) < 0 && p->slot_held) {
        p->via_link = true;
        ddp__nodes_link_end(p->owner, p->index); /* its agent is gone: nothing else will say so */
    }
}

/* The provisioner's stdout: the agent's frames travel on its link, and nothing is expected
 * here (an SSH bridge relays the remote agent's stdout): read and let go, to its end. */
static void on_out(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    struct ddp__node_proc *p = arg;
    if (ddp__drain(fd))
        close_fd(p->owner, &p->ch.out_fd, true);
}

static bool link_up(struct ddp__nodes *n, int i, int fd, struct ddp__seal *s, struct ddp_buf *raw,
                    struct ddp_buf *plain, const char *peer, char *why, size_t whyn);
static bool take_slot(struct ddp__nodes *n, int fd, struct ddp__seal *s,
                      const struct ddp__aw_attach *a, struct ddp_buf *raw, struct ddp_buf *plain,
                      const char *peer, char *why, size_t whyn);

bool ddp__nodes_attach(struct ddp__nodes *n, int fd, struct ddp__seal *s,
                       const struct ddp__aw_attach *a, struct ddp_buf *raw, struct ddp_buf *plain,
                       const char *peer, char *why, size_t whyn)
{
    if (a->kind == DDP__AW_EXTERNAL)
        return take_slot(n, fd, s, a, raw, plain, peer, why, whyn);
    if (a->node >= n->job->nnodes) {
        snprintf(why, whyn, "it says it is node %u, and the job has %zu", a->node, n->job->nnodes);
        return false;
    }
    struct ddp__node_proc *p = &n->p[a->node];
    /* the ticket is 32 hex digits: compared in constant time */
    unsigned diff = strlen(a->name) != DDP__AW_TICKET ||
                    (p->ch.pid <= 0 && !(p->slot_held && !p->pending && !p->external)) || p->linked;
    for (size_t k = 0; k < DDP__AW_TICKET && a->name[k]; k++)
        diff |= (unsigned)(a->name[k] ^ p->ticket[k]);
    if (diff) {
        snprintf(why, whyn,
                 "no agent of node %u ('%s') waits with its ticket (one started "
                 "earlier, or ended)",
                 a->node, n->job->nodes[a->node].host);
        return false;
    }
    return link_up(n, (int)a->node, fd, s, raw, plain, peer, why, whyn);
}

static bool link_up(struct ddp__nodes *n, int i, int fd, struct ddp__seal *s, struct ddp_buf *raw,
                    struct ddp_buf *plain, const char *peer, char *why, size_t whyn)
{
    struct ddp__node_proc *p = &n->p[i];
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK); /* writes block, as to a pipe; reads do not */
    p->link = fd;
    p->linked = true;
    p->seal = *s;
    ddp_buf_release(&p->lraw);
    p->lraw = *raw;
    ddp_buf_init(raw);
    ddp_buf_put(&p->rx, plain->data + plain->off, ddp_buf_pending(plain));
    DDP_DEBUG(SUP, "node %d ('%s'): its agent dialled back from %s", i, n->job->nodes[i].host,
              peer);
    if (ddp_loop_add(n->loop, fd, DDP_LOOP_READ, on_link, p) < 0) {
        p->link = -1;
        snprintf(why, whyn, "cannot watch its connection");
        return false;
    }
    if (p->txq.len && ddp__aw_write(fd, &p->seal, p->txq.data, p->txq.len) < 0)
        shutdown(fd, SHUT_WR);
    explicit_bzero(p->txq.data, p->txq.len); /* JOIN holds the token */
    ddp_buf_release(&p->txq);
    parse_frames(n, i);
    if (ddp_buf_pending(&p->lraw))
        read_frames(n, i);
    return true;
}

/* A name fit for messages and records: [A-Za-z0-9._-], 1 to 200 bytes. */
static bool name_ok(const char *s)
{
    size_t k = 0;
    for (; s[k]; k++)
        if (k >= 200 ||
            !((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= 'A' && s[k] <= 'Z') ||
              (s[k] >= '0' && s[k] <= '9') || s[k] == '.' || s[k] == '_' || s[k] == '-'))
            return false;
    return k > 0;
}

/* An agent started elsewhere (`ddprun agent --join`): it takes the first slot held for one, in
 * the order agents arrive, named after it; its JOIN, kept until now, goes out with that name. */
static bool take_slot(struct ddp__nodes *n, int fd, struct ddp__seal *s,
                      const struct ddp__aw_attach *a, struct ddp_buf *raw, struct ddp_buf *plain,
                      const char *peer, char *why, size_t whyn)
{
    size_t i = 0;
    while (i < n->job->nnodes && !(n->p[i].external && n->p[i].slot_held && !n->p[i].linked))
        i++;
    if (!n->job->external || i == n->job->nnodes) {
        snprintf(why, whyn,
                 n->job->external ? "an agent started elsewhere (%s), and every slot of the job "
                                    "is taken (nodes: %zu)"
                                  : "an agent started elsewhere (%s), and this job starts its own "
                                    "(launcher: external takes such agents)",
                 a->name, n->job->nnodes);
        return false;
    }
    struct ddp__node_proc *p = &n->p[i];
    char *host = n->job->nodes[i].host; /* a slot's buffer (cli/spec/job.h) */
    char ip[128];
    snprintf(ip, sizeof(ip), "%s", peer[0] == '[' ? peer + 1 : peer);
    char *colon = strrchr(ip, peer[0] == '[' ? ']' : ':');
    if (colon)
        *colon = '\0';
    bool taken = false; /* two agents of one name (one machine, or a name reused): told apart */
    for (size_t k = 0; k < n->job->nnodes; k++)
        taken |= k != i && n->p[k].linked && n->p[k].slot_held &&
                 !strcmp(n->job->nodes[k].host, a->name);
    if (name_ok(a->name) && !taken)
        snprintf(host, DDP__EXTERNAL_NAME, "%s", a->name);
    else if (name_ok(a->name))
        snprintf(host, DDP__EXTERNAL_NAME, "%.200s.%zu", a->name, i);
    else
        snprintf(host, DDP__EXTERNAL_NAME, "agent-%zu@%s", i, ip);
    struct ddp__agent_join j;
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (ddp__agent_get_join(p->join.data, p->join.len, &j) < 0) {
        snprintf(why, whyn, "slot %zu has no JOIN to send (out of memory?)", i);
        return false;
    }
    free(j.host_label);
    j.host_label = strdup(host);
    int r = j.host_label ? ddp__agent_put_join(&b, &j) : -1;
    ddp__agent_join_release(&j);
    if (r == 0)
        ddp_buf_put(&p->txq, b.data, b.len);
    explicit_bzero(b.data, b.len);
    ddp_buf_release(&b);
    explicit_bzero(p->join.data, p->join.len);
    ddp_buf_release(&p->join);
    if (n->cb.taken)
        n->cb.taken(n->cb.arg, (int)i, ip);
    DDP_INFO(SUP, "slot %zu: the agent on '%s' joined from %s", i, host, peer);
    return link_up(n, (int)i, fd, s, raw, plain, peer, why, whyn);
}

static void on_err(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)fd;
    (void)mask;
    struct ddp__node_proc *p = arg;
    read_messages(p->owner, p->index);
}

int ddp__nodes_start(struct ddp__nodes *n, int i, const struct ddp__agent_join *join)
{
    struct ddp__node_proc *p = &n->p[i];
    uint8_t t[DDP__AW_TICKET / 2];
    if (ddp_random_bytes(t, sizeof(t)) < 0)
        return -1;
    for (size_t k = 0; k < sizeof(t); k++)
        snprintf(p->ticket + 2 * k, 3, "%02x", t[k]);
    p->linked = p->below = false;
    p->fin_st = 0;
    if (p->external)
        return ddp__nodes_hold_slot(n, i, join);
    if (p->grouped)
        return ddp__nodes_hold_member(n, i, join);
    int r = ddp__nodes_tree_start(n, i, join); /* through the agent of a node above it */
    if (r <= 0)
        return r;
    if (p->prov->start(n->job, (size_t)i, &n->ctx, &p->ch) < 0)
        return -1;
    ddp_buf_init(&p->rx);
    ddp_buf_init(&p->erx);
    ddp_buf_init(&p->lraw);
    ddp_buf_init(&p->txq);
    /* BOOT: where to dial back and what to prove; the only frame on the agent's stdin */
    struct ddp_buf bb;
    ddp_buf_init(&bb);
    if (ddp__nodes_boot(n, i, 0, &bb) < 0 || ddp_write_all(p->ch.in_fd, bb.data, bb.len) < 0)
        close_fd(n, &p->ch.in_fd, false); /* the agent sees no BOOT and says so */
    explicit_bzero(bb.data, bb.len);
    ddp_buf_release(&bb);
    p->outputs = p->acked = p->held_dropped = 0;
    ddp_buf_release(&p->held);
    p->holding = !join;
    p->hello = p->has_counts = false;
    p->refused[0] = '\0';
    ddp_loop_add(n->loop, p->ch.err_fd, DDP_LOOP_READ, on_err, p);
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (ddp__agent_put_hello(&b, DDP__AG_HELLO, DDP_VERSION, NULL, 0) == 0)
        ddp__nodes_send(n, i, &b); /* first, before JOIN or what a rejoined agent is told */
    ddp_buf_release(&b);
    if (join) {
        ddp_buf_init(&b);
        if (ddp__agent_put_join(&b, join) == 0)
            ddp__nodes_send(n, i, &b);
        explicit_bzero(b.data, b.len); /* it holds the token */
        ddp_buf_release(&b);
    }
    return ddp_loop_add(n->loop, p->ch.out_fd, DDP_LOOP_READ, on_out, p);
}

void ddp__nodes_start_round(struct ddp__nodes *n, int i, uint8_t type,
                            const struct ddp__agent_start *st)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (ddp__agent_put_start_as(&b, type, st) == 0)
        ddp__nodes_send(n, i, &b);
    explicit_bzero(b.data, b.len);
    ddp_buf_release(&b);
}

void ddp__nodes_stop(struct ddp__nodes *n, int i, uint64_t grace_ms, int sig)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_STOP);
    ddp_buf_put_u64(&b, grace_ms);
    ddp_buf_put_u8(&b, (uint8_t)sig);
    ddp__agent_end(&b, pos);
    ddp__nodes_send(n, i, &b);
    ddp_buf_release(&b);
}

void ddp__nodes_frame(struct ddp__nodes *n, int i, const struct ddp_buf *b)
{
    ddp__nodes_send(n, i, b);
}

void ddp__nodes_signal(struct ddp__nodes *n, int i, int sig)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_SIGNAL);
    ddp_buf_put_u8(&b, (uint8_t)sig);
    ddp__agent_end(&b, pos);
    ddp__nodes_send(n, i, &b);
    ddp_buf_release(&b);
}

void ddp__nodes_stacks(struct ddp__nodes *n, int i, uint32_t req, const int *local, int nlocal)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_STACKS);
    ddp_buf_put_u32(&b, req);
    ddp_buf_put_u32(&b, (uint32_t)nlocal);
    for (int k = 0; k < nlocal; k++)
        ddp_buf_put_u32(&b, (uint32_t)local[k]);
    ddp__agent_end(&b, pos);
    ddp__nodes_send(n, i, &b);
    ddp_buf_release(&b);
}

void ddp__nodes_close(struct ddp__nodes *n, int i)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_BYE);
    ddp__agent_end(&b, pos);
    ddp__nodes_send(n, i, &b);
    ddp_buf_release(&b);
    if (n->p[i].link >= 0)
        shutdown(n->p[i].link, SHUT_WR); /* the end of its frames: it exits */
    n->p[i].linked = true;               /* and nothing more is kept for it */
    /* Its stdin (the session that started it) stays open until it is reaped: its end before
     * BYE is read would read as the launcher gone. */
    if (n->p[i].link < 0)
        close_fd(n, &n->p[i].ch.in_fd, false); /* it never dialled back: it ends at this */
}

void ddp__nodes_end(struct ddp__nodes *n, int i, int level)
{
    if (n->p[i].below && n->p[i].slot_held)
        ddp__nodes_tree_end(n, i, level);
    else if (n->p[i].external)
        ddp__nodes_link_end(n, i);
    else if (n->p[i].grouped) {
        if (n->p[i].slot_held)
            ddp__nodes_link_end(n, i);
        ddp__nodes_steps_end(n, n->p[i].step, level); /* the last of its step: the step ends */
    } else if (n->p[i].ch.pid > 0)
        n->p[i].prov->end(n->p[i].ch.pid, level);
}

bool ddp__nodes_running(const struct ddp__nodes *n, int i)
{
    return n->p[i].ch.pid > 0 || n->p[i].slot_held;
}

bool ddp__nodes_all_gone(const struct ddp__nodes *n)
{
    for (size_t i = 0; i < n->job->nnodes; i++)
        if (ddp__nodes_running(n, (int)i))
            return false;
    return !ddp__nodes_steps_live(n);
}

void ddp__nodes_describe(const struct ddp__nodes *n, int i, int st, bool joining, char *buf,
                         size_t len)
{
    if (n->p[i].refused[0])
        snprintf(buf, len, "its agent %s", n->p[i].refused);
    else if ((n->p[i].grouped || n->p[i].below) && n->p[i].via_link)
        ddp__prov_external.describe(st, joining, buf, len);
    else
        n->p[i].prov->describe(st, joining, buf, len);
}

int ddp__nodes_agent_signal(const struct ddp__nodes *n, int i, int st)
{
    if (n->p[i].refused[0] || ((n->p[i].grouped || n->p[i].below) && n->p[i].via_link) ||
        !n->p[i].prov->agent_signal)
        return 0;
    return n->p[i].prov->agent_signal(st);
}

int ddp__nodes_flush(struct ddp__nodes *n)
{
    int rc = 0;
    for (size_t i = 0; i < n->job->nnodes; i++) {
        if (!n->p[i].grouped || !n->p[i].pending)
            continue;
        int cpus = n->job->nodes[i].cpus;
        if (ddp__nodes_steps_start(n, cpus) == 0)
            continue;
        rc = -1;
        for (size_t k = i; k < n->job->nnodes; k++) /* not started: they end */
            if (n->p[k].grouped && n->p[k].pending && n->job->nodes[k].cpus == cpus) {
                n->p[k].pending = false;
                ddp__nodes_link_end(n, (int)k);
            }
    }
    return rc;
}

/* Step s was reaped: its members still in ended with it (what their agents sent last first). */
static void step_reaped(struct ddp__nodes *n, int s, int st)
{
    for (size_t i = 0; i < n->job->nnodes; i++) {
        struct ddp__node_proc *p = &n->p[i];
        if (p->step != s || !p->slot_held)
            continue;
        while (read_frames(n, (int)i) > 0) {
        }
        ddp_timer_stop(n->loop, &p->fin);
        close_fd(n, &p->link, true);
        p->slot_held = p->pending = p->via_link = false;
        p->step = -1;
        n->cb.ended(n->cb.arg, (int)i, st);
    }
}

bool ddp__nodes_reaped(struct ddp__nodes *n, pid_t pid, int st)
{
    int s = ddp__nodes_steps_reaped(n, pid);
    if (s >= 0) {
        step_reaped(n, s, st);
        return true;
    }
    for (size_t k = 0; k < n->job->nnodes; k++) {
        struct ddp__node_proc *p = &n->p[k];
        if (p->ch.pid != pid)
            continue;
        /* What it wrote before exiting may still sit in the pipes (the signal can be read
         * first): take it before telling how it ended. A child of its may still hold its
         * stderr: what it said is in. */
        while (read_frames(n, (int)k) > 0) {
        }
        read_messages(n, (int)k);
        close_fd(n, &p->ch.out_fd, true);
        close_fd(n, &p->ch.err_fd, true);
        close_fd(n, &p->ch.in_fd, false);
        /* its link ends with it: an agent still connected (its SSH session gone) stops */
        close_fd(n, &p->link, true);
        ddp__seal_wipe(&p->seal);
        ddp_buf_release(&p->rx);
        ddp_buf_release(&p->erx);
        ddp_buf_release(&p->lraw);
        ddp_buf_release(&p->txq);
        p->ch.pid = 0;
        ddp__nodes_tree_gone(n, (int)k);
        n->cb.ended(n->cb.arg, (int)k, st);
        return true;
    }
    return false;
}

static bool on_dialin(void *arg, int fd, struct ddp__seal *s, const struct ddp__aw_attach *a,
                      struct ddp_buf *raw, struct ddp_buf *plain, const char *peer, char *why,
                      size_t whyn)
{
    return ddp__nodes_attach(arg, fd, s, a, raw, plain, peer, why, whyn);
}

int ddp__nodes_listen(struct ddp__nodes *n, const char *host, int want, int *port)
{
    struct ddp__dialin_cb cb = {.attach = on_dialin, .arg = n};
    if (ddp__dialin_start(n->loop, host, want, n->cb.token, &cb) < 0)
        return -1;
    *port = ddp__dialin_port();
    return 0;
}
