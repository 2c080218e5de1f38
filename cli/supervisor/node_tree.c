/*
 * The SSH tree (ssh.fanout: K; cli/supervisor/nodes.h). With more SSH nodes than K, the
 * launcher opens SSH sessions to the first K nodes only; each of their agents starts up to K
 * nodes below it with SPAWN (cli/proto/agent_tree.h), the next level's agents as many again,
 * and so on (ddp__job_ssh_tree says who starts whom), as PRRTE's tree spawn and pdsh's fanout
 * do. Every agent, whatever its level, dials back to the launcher itself: only its start goes
 * through its parent, whose SSH bridge holds its session, checks its host key against the
 * launcher's known_hosts (handed down as KNOWN_HOSTS), and reports its messages and end up.
 *
 * A node started below another is held as a slot is (its link is its life). Its parent's death
 * costs one node: the nodes it started live on by their links (an agent started below another
 * ignores the end of its session, cli/agent/link.c), ended by the launcher on their links and by
 * their own guards should the launcher go. Only those that had not yet dialled back end with it,
 * to be started again at the next round through the nearest node above that still runs, or by
 * the launcher itself.
 */
#include "cli/proto/agent_proto.h"
#include "cli/proto/agent_tree.h"
#include "cli/proto/agent_wire.h"
#include "cli/spec/job.h"
#include "cli/supervisor/nodes.h"
#include "cli/sys/sys.h"
#include "common/log.h"
#include "common/loop.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/banned.h"

/* Where the launcher's known_hosts is: ssh.known_hosts, or ~/.ssh/known_hosts. */
static const char *kh_path(const struct ddp_job *j, char *buf, size_t n)
{
    if (j->ssh_known_hosts && *j->ssh_known_hosts)
        return j->ssh_known_hosts;
    const char *home = getenv("HOME");
    snprintf(buf, n, "%s/.ssh/known_hosts", home ? home : "");
    return buf;
}

static void say(struct ddp__nodes *n, int i, const char *msg)
{
    n->cb.message(n->cb.arg, i, msg, strlen(msg));
}

/* KNOWN_HOSTS for agent up, unless it has this generation of the file already. 0, or -1 said. */
static int hand_down_known_hosts(struct ddp__nodes *n, int up, int i)
{
    if (n->p[up].kh_sent == n->kh_gen)
        return 0;
    char pb[4200], msg[4400];
    const char *path = kh_path(n->job, pb, sizeof(pb));
    struct ddp_buf c, b;
    ddp_buf_init(&c);
    ddp_buf_init(&b);
    int fd = open(path, O_RDONLY | O_CLOEXEC), rc = -1;
    struct stat st;
    snprintf(msg, sizeof(msg), "ddprun: error: node '%s': out of memory handing down %s",
             n->job->nodes[i].host, path);
    if (fd < 0 && errno != ENOENT) {
        snprintf(msg, sizeof(msg), "ddprun: error: node '%s': cannot read %s to hand it down: %s",
                 n->job->nodes[i].host, path, strerror(errno));
    } else if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_size > (off_t)DDP__TREE_KH_MAX)) {
        snprintf(msg, sizeof(msg),
                 "ddprun: error: node '%s': %s is over %u KiB, more than the SSH tree "
                 "(ssh.fanout) hands down to the agents that start nodes: give the job a "
                 "known_hosts of its nodes (ssh.known_hosts)",
                 n->job->nodes[i].host, path, DDP__TREE_KH_MAX >> 10);
    } else if (fd >= 0 &&
               (ddp_buf_reserve(&c, (size_t)st.st_size + 1) < 0 ||
                (c.len = (size_t)read(fd, c.data, (size_t)st.st_size)) != (size_t)st.st_size)) {
        snprintf(msg, sizeof(msg), "ddprun: error: node '%s': cannot read %s to hand it down",
                 n->job->nodes[i].host, path);
    } else if (ddp__tree_put_known_hosts(&b, c.data ? (const char *)c.data : "", c.len) == 0) {
        ddp__nodes_send(n, up, &b);
        n->p[up].kh_sent = n->kh_gen;
        rc = 0;
    }
    if (fd >= 0)
        close(fd);
    if (rc < 0)
        say(n, i, msg);
    ddp_buf_release(&c);
    ddp_buf_release(&b);
    return rc;
}

/* The node above i that runs now: its parent in the tree, else the nearest above that; -1 when
 * none does (the launcher starts i). */
static int running_parent(const struct ddp__nodes *n, int i)
{
    int up = n->p[i].tree_up;
    while (up >= 0) {
        const struct ddp__node_proc *q = &n->p[up];
        if ((q->ch.pid > 0 || q->slot_held) && !ddp_timer_armed(&q->fin) && !q->refused[0])
            return up;
        up = q->tree_up;
    }
    return -1;
}

int ddp__nodes_tree_start(struct ddp__nodes *n, int i, const struct ddp__agent_join *join)
{
    struct ddp__node_proc *p = &n->p[i];
    const struct ddp_job *j = n->job;
    int up;
    /* agents that wait for a new launcher are each started by it (ddp__job_ssh_tree) */
    if (p->prov != &ddp__prov_ssh || n->ctx.rejoin || n->ctx.detach ||
        (up = running_parent(n, i)) < 0)
        return 1;
    if (ddp__nodes_hold_member(n, i, join) < 0)
        return -1;
    p->pending = false;
    p->below = true;
    p->parent = up;
    p->tree_start++;
    if (hand_down_known_hosts(n, up, i) < 0) {
        p->fin_st = DDP_EXIT_LAUNCH << 8;
        ddp__nodes_link_end(n, i);
        return 0;
    }
    struct ddp__spawn *sp = calloc(1, sizeof(*sp));
    struct ddp_buf boot, b;
    ddp_buf_init(&boot);
    ddp_buf_init(&b);
    char kb[4096];
    int r = -1;
    if (sp && ddp__nodes_boot(n, i, DDP__AW_BOOT_BELOW, &boot) == 0) {
        sp->node = (uint32_t)i;
        sp->start = p->tree_start;
        sp->port = (uint32_t)j->ssh_port;
        sp->grace_ms = (uint64_t)j->stop_grace_ms;
        snprintf(sp->host, sizeof(sp->host), "%s", j->nodes[i].host);
        snprintf(sp->user, sizeof(sp->user), "%s", j->ssh_user ? j->ssh_user : "");
        snprintf(sp->identity, sizeof(sp->identity), "%s", j->ssh_identity ? j->ssh_identity : "");
        snprintf(sp->strict, sizeof(sp->strict), "%s", j->ssh_strict);
        snprintf(sp->remote, sizeof(sp->remote), "%s",
                 j->ssh_remote_ddprun ? j->ssh_remote_ddprun : n->ctx.self);
        snprintf(sp->args, sizeof(sp->args), "agent");
        snprintf(sp->kh_name, sizeof(sp->kh_name), "%s", kh_path(j, kb, sizeof(kb)));
        sp->boot = boot.data;
        sp->boot_len = (uint32_t)boot.len;
        sp->flags = j->ssh_forward_agent ? DDP__SPAWN_FORWARD_AGENT : 0;
        r = ddp__tree_put_spawn(&b, sp);
    }
    if (r == 0)
        ddp__nodes_send(n, up, &b);
    explicit_bzero(b.data, b.len); /* BOOT holds the token */
    explicit_bzero(boot.data, boot.len);
    ddp_buf_release(&b);
    ddp_buf_release(&boot);
    free(sp);
    if (r < 0) {
        errno = ENOMEM;
        return -1;
    }
    DDP_DEBUG(SUP, "node %d ('%s'): started over SSH by the agent on '%s'", i, j->nodes[i].host,
              j->nodes[up].host);
    return 0;
}

/* A host key a bridge below accepted under accept-new: recorded in the launcher's known_hosts,
 * where that file has no key for the host yet. */
static void add_host_key(struct ddp__nodes *n, int from, uint32_t node, const uint8_t *s,
                         uint32_t len)
{
    const struct ddp_job *j = n->job;
    const char *host = j->nodes[node].host;
    char want[300], pb[4200], msg[4600];
    if (j->ssh_port == 22)
        snprintf(want, sizeof(want), "%s ", host);
    else
        snprintf(want, sizeof(want), "[%s]:%d ", host, j->ssh_port);
    bool ok = len > strlen(want) && len < 16384 && !memcmp(s, want, strlen(want));
    for (uint32_t k = 0; ok && k < len; k++)
        ok = s[k] >= 0x20 && s[k] <= 0x7e;
    const char *path = kh_path(j, pb, sizeof(pb));
    if (!ok || strcmp(j->ssh_strict, "accept-new") != 0) {
        snprintf(msg, sizeof(msg),
                 "ddprun: warning: the agent on '%s' sent a host key for node '%s' that is not "
                 "one (ignored)",
                 j->nodes[from].host, host);
        say(n, (int)node, msg);
        return;
    }
    /* Known already (another bridge saw it first): nothing to add. */
    FILE *f = fopen(path, "r");
    char line[16384];
    bool known = false;
    while (f && !known && fgets(line, sizeof(line), f))
        known = !strncmp(line, want, strlen(want));
    if (f)
        fclose(f);
    if (known)
        return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ddp_write_all(fd, s, len) < 0 || ddp_write_all(fd, "\n", 1) < 0) {
        snprintf(msg, sizeof(msg), "ddprun: error: cannot add the host key of %s to %s: %s", host,
                 path, strerror(errno));
    } else {
        snprintf(msg, sizeof(msg),
                 "ddprun: node '%s': host key of %s port %d added to %s (seen by the agent on "
                 "'%s')",
                 host, host, j->ssh_port, path, j->nodes[from].host);
        n->kh_gen++;
    }
    if (fd >= 0)
        close(fd);
    say(n, (int)node, msg);
}

bool ddp__nodes_tree_frame(struct ddp__nodes *n, int i, uint8_t type, const uint8_t *body,
                           size_t len)
{
    if (type != DDP__AG_CHILD_MSG && type != DDP__AG_CHILD_EXIT && type != DDP__AG_HOST_KEY)
        return false;
    uint32_t node, start;
    const uint8_t *s = NULL;
    uint32_t sl = 0;
    int32_t st = 0;
    int r = type == DDP__AG_CHILD_EXIT ? ddp__tree_get_child_exit(body, len, &node, &start, &st)
                                       : ddp__tree_get_node_str(body, len, &node, &start, &s, &sl);
    /* only about a node this agent was asked to start, this start (a last start's bridge may
     * say its last) */
    if (r < 0 || node >= n->job->nnodes || !n->p[node].below || n->p[node].parent != i ||
        start != n->p[node].tree_start) {
        DDP_DEBUG(SUP, "node %d: a frame %u of the SSH tree about another node's agent dropped", i,
                  type);
        return true;
    }
    struct ddp__node_proc *c = &n->p[node];
    if (type == DDP__AG_CHILD_MSG) {
        n->cb.message(n->cb.arg, (int)node, (const char *)s, sl);
    } else if (type == DDP__AG_HOST_KEY) {
        add_host_key(n, i, node, s, sl);
    } else if (c->slot_held && c->link < 0 && !ddp_timer_armed(&c->fin)) {
        /* its bridge ended, and no link of its agent is up (it never dialled back, or was told
         * to leave before it did): it could not be started, or is gone */
        c->fin_st = st;
        ddp__nodes_link_end(n, (int)node);
    } else {
        c->parent = -1; /* its session is gone: its link alone tells now */
    }
    return true;
}

void ddp__nodes_tree_end(struct ddp__nodes *n, int i, int level)
{
    struct ddp__node_proc *p = &n->p[i];
    int up = p->parent;
    if (up >= 0 && (n->p[up].ch.pid > 0 || n->p[up].slot_held)) {
        struct ddp_buf b;
        ddp_buf_init(&b);
        if (ddp__tree_put_unspawn(&b, (uint32_t)i, p->tree_start, (uint8_t)(level < 2 ? 1 : 2)) ==
            0)
            ddp__nodes_send(n, up, &b); /* its bridge has its SSH session killed */
        ddp_buf_release(&b);
    }
    ddp__nodes_link_end(n, i);
}

void ddp__nodes_tree_gone(struct ddp__nodes *n, int i)
{
    char msg[600];
    for (size_t k = 0; k < n->job->nnodes; k++) {
        struct ddp__node_proc *c = &n->p[k];
        if (!c->below || c->parent != i)
            continue;
        c->parent = -1;
        if (!c->slot_held || c->link >= 0 || ddp_timer_armed(&c->fin))
            continue;     /* it lives on by its link */
        if (!c->linked) { /* (not told to leave already) */
            snprintf(msg, sizeof(msg),
                     "ddprun: error: node '%s': the agent on '%s', which was starting it over "
                     "SSH, is gone",
                     n->job->nodes[k].host, n->job->nodes[i].host);
            say(n, (int)k, msg);
        }
        c->fin_st = DDP_EXIT_LAUNCH << 8;
        ddp__nodes_link_end(n, (int)k);
    }
}
