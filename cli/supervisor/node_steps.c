/*
 * Agents started as one process for many nodes (cli/supervisor/nodes.h): under Slurm, the nodes a
 * round starts are one srun step, `srun --nodes=N --ntasks-per-node=1` (Slurm's own tree launch;
 * a step per CPU count, which a step gives every task alike). The step's stdin carries one
 * BOOT_GROUP that every agent reads (cli/proto/agent_wire.h), and each dials back with its node's
 * ticket. A member is a node without a process of its own: its agent's link is its life. A lost
 * node's link is closed (its agent stops its ranks; a hung one is ended by its guard within the
 * documented deadline) and the step goes on for the others (--no-kill, --kill-on-bad-exit=0);
 * the step itself is ended only when none of its members is left, and its end ends them all.
 * Spares and returning nodes start as steps of their own.
 *
 * Also how such nodes, and the slots of launcher: external, are held before their agents dial
 * back: what they are to be sent waits.
 */
#include "cli/proto/agent_proto.h"
#include "cli/proto/agent_wire.h"
#include "cli/spec/job.h"
#include "cli/sys/sys.h"
#include "cli/supervisor/nodes.h"
#include "common/loop.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

static void close_fd(struct ddp__nodes *n, int *fd, bool watched)
{
    if (*fd < 0)
        return;
    if (watched)
        ddp_loop_del(n->loop, *fd);
    close(*fd);
    *fd = -1;
}

static void message_line(void *arg, const char *line, size_t len)
{
    struct ddp__node_step *s = arg;
    s->owner->cb.message(s->owner->cb.arg, s->first, line, len);
}

/* The step's stderr: its agents' messages, told under its first node. */
static void read_messages(struct ddp__node_step *s)
{
    if (s->ch.err_fd >= 0 && ddp__read_lines(s->ch.err_fd, &s->erx, message_line, s) == 1)
        close_fd(s->owner, &s->ch.err_fd, true);
}

static void on_err(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)fd;
    (void)mask;
    read_messages(arg);
}

/* Nothing is expected on its stdout: let go, to its end. */
static void on_out(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    struct ddp__node_step *s = arg;
    if (ddp__drain(fd))
        close_fd(s->owner, &s->ch.out_fd, true);
}

/* A free entry of n->steps (one whose step was reaped), NULL when none is. The array is made
 * once, for twice the nodes: the loop's callbacks point into it, so it never moves. */
static struct ddp__node_step *new_step(struct ddp__nodes *n, int *index)
{
    if (!n->steps) {
        n->nsteps = 2 * n->job->nnodes + 8;
        if (!(n->steps = calloc(n->nsteps, sizeof(*n->steps)))) {
            n->nsteps = 0;
            return NULL;
        }
        for (size_t k = 0; k < n->nsteps; k++)
            n->steps[k].ch = (struct ddp__child){.pid = 0, .in_fd = -1, .out_fd = -1, .err_fd = -1};
    }
    for (size_t k = 0; k < n->nsteps; k++)
        if (n->steps[k].ch.pid == 0 && n->steps[k].ch.err_fd < 0 && n->steps[k].ch.out_fd < 0) {
            *index = (int)k;
            return &n->steps[k];
        }
    return NULL;
}

int ddp__nodes_steps_start(struct ddp__nodes *n, int cpus)
{
    const struct ddp_job *j = n->job;
    size_t *nodes = calloc(j->nnodes, sizeof(*nodes)), k = 0;
    if (!nodes)
        return -1;
    for (size_t i = 0; i < j->nnodes; i++)
        if (n->p[i].grouped && n->p[i].pending && j->nodes[i].cpus == cpus)
            nodes[k++] = i;
    int index = -1;
    struct ddp__node_step *s = new_step(n, &index);
    if (!s) {
        free(nodes);
        errno = ENOMEM;
        return -1;
    }
    *s = (struct ddp__node_step){.owner = n, .first = (int)nodes[0]};
    ddp_buf_init(&s->erx);
    const struct ddp__prov_ops *prov = n->p[nodes[0]].prov;
    if (prov->start_group(j, nodes, k, &n->ctx, &s->ch) < 0) {
        s->ch = (struct ddp__child){.pid = 0, .in_fd = -1, .out_fd = -1, .err_fd = -1};
        free(nodes);
        return -1;
    }
    /* BOOT_GROUP: each node's ticket and where it dials back, for all of them to read */
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__aw_group_begin(&b, n->cb.token);
    char *addrs = malloc(DDP__AW_ADDRS_MAX);
    for (size_t m = 0; addrs && m < k; m++) {
        struct ddp__node_proc *p = &n->p[nodes[m]];
        uint8_t t[DDP__AW_TICKET / 2];
        ddp_random_bytes(t, sizeof(t));
        for (size_t q = 0; q < sizeof(t); q++)
            snprintf(p->ticket + 2 * q, 3, "%02x", t[q]);
        n->cb.dial_addrs(n->cb.arg, (int)nodes[m], addrs, DDP__AW_ADDRS_MAX);
        ddp__aw_group_add(&b, j->nodes[nodes[m]].host, (uint32_t)nodes[m], p->ticket, addrs);
        p->pending = false;
        p->step = index;
    }
    ddp__aw_group_end(&b, pos, (uint32_t)k);
    if (!addrs || !b.data || ddp_write_all(s->ch.in_fd, b.data, b.len) < 0)
        close_fd(n, &s->ch.in_fd, false); /* its agents see no BOOT and say so */
    explicit_bzero(b.data, b.len);
    ddp_buf_release(&b);
    free(addrs);
    free(nodes);
    ddp_loop_add(n->loop, s->ch.err_fd, DDP_LOOP_READ, on_err, s);
    ddp_loop_add(n->loop, s->ch.out_fd, DDP_LOOP_READ, on_out, s);
    return 0;
}

bool ddp__nodes_steps_live(const struct ddp__nodes *n)
{
    for (size_t k = 0; k < n->nsteps; k++)
        if (n->steps[k].ch.pid > 0)
            return true;
    return false;
}

/* Whether a member of step s still takes part (held, not on its way out). */
static bool members_left(const struct ddp__nodes *n, int s)
{
    for (size_t i = 0; i < n->job->nnodes; i++)
        if (n->p[i].step == s && n->p[i].slot_held && !ddp_timer_armed(&n->p[i].fin))
            return true;
    return false;
}

void ddp__nodes_steps_end(struct ddp__nodes *n, int s, int level)
{
    if (s >= 0 && (size_t)s < n->nsteps && n->steps[s].ch.pid > 0 && !members_left(n, s))
        n->p[n->steps[s].first].prov->end(n->steps[s].ch.pid, level);
}

int ddp__nodes_steps_reaped(struct ddp__nodes *n, pid_t pid)
{
    for (size_t k = 0; k < n->nsteps; k++) {
        struct ddp__node_step *s = &n->steps[k];
        if (s->ch.pid != pid || pid <= 0)
            continue;
        read_messages(s);
        close_fd(n, &s->ch.out_fd, true);
        close_fd(n, &s->ch.err_fd, true);
        close_fd(n, &s->ch.in_fd, false);
        ddp_buf_release(&s->erx);
        s->ch.pid = 0;
        return (int)k;
    }
    return -1;
}

void ddp__nodes_steps_release(struct ddp__nodes *n)
{
    for (size_t k = 0; k < n->nsteps; k++) {
        close_fd(n, &n->steps[k].ch.out_fd, true);
        close_fd(n, &n->steps[k].ch.err_fd, true);
        close_fd(n, &n->steps[k].ch.in_fd, false);
        ddp_buf_release(&n->steps[k].erx);
    }
    free(n->steps);
    n->steps = NULL;
    n->nsteps = 0;
}

/* Slot i of launcher: external is held for the next agent that joins: HELLO waits in txq, JOIN
 * (without the agent's name yet) in join. */
int ddp__nodes_hold_slot(struct ddp__nodes *n, int i, const struct ddp__agent_join *join)
{
    struct ddp__node_proc *p = &n->p[i];
    ddp_buf_init(&p->rx);
    ddp_buf_init(&p->erx);
    ddp_buf_init(&p->lraw);
    ddp_buf_init(&p->txq);
    ddp_buf_init(&p->join);
    p->outputs = p->acked = p->held_dropped = 0;
    ddp_buf_release(&p->held);
    p->holding = false;
    p->hello = p->has_counts = false;
    p->refused[0] = '\0';
    snprintf(n->job->nodes[i].host, DDP__EXTERNAL_NAME, "agent-%d", i);
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (!join || ddp__agent_put_hello(&b, DDP__AG_HELLO, DDP_VERSION, NULL, 0) < 0 ||
        ddp_buf_put(&p->txq, b.data, b.len) < 0 || ddp__agent_put_join(&p->join, join) < 0) {
        ddp_buf_release(&b);
        errno = ENOMEM;
        return -1;
    }
    ddp_buf_release(&b);
    /* the body alone: it is parsed again when the agent's name is known */
    memmove(p->join.data, p->join.data + 5, p->join.len - 5);
    p->join.len -= 5;
    p->slot_held = true;
    return 0;
}

/* Node i's agent is to start with others (ddp__nodes_flush): HELLO and JOIN wait in txq. */
int ddp__nodes_hold_member(struct ddp__nodes *n, int i, const struct ddp__agent_join *join)
{
    struct ddp__node_proc *p = &n->p[i];
    ddp_buf_init(&p->rx);
    ddp_buf_init(&p->erx);
    ddp_buf_init(&p->lraw);
    ddp_buf_init(&p->txq);
    p->outputs = p->acked = p->held_dropped = 0;
    ddp_buf_release(&p->held);
    p->holding = !join;
    p->hello = p->has_counts = p->via_link = false;
    p->refused[0] = '\0';
    struct ddp_buf b;
    ddp_buf_init(&b);
    int r = ddp__agent_put_hello(&b, DDP__AG_HELLO, DDP_VERSION, NULL, 0);
    if (r == 0 && join)
        r = ddp__agent_put_join(&b, join);
    if (r == 0)
        r = ddp_buf_put(&p->txq, b.data, b.len);
    explicit_bzero(b.data, b.len);
    ddp_buf_release(&b);
    if (r < 0) {
        errno = ENOMEM;
        return -1;
    }
    p->slot_held = p->pending = true;
    p->step = -1;
    return 0;
}
