/* The agent's part in the SSH tree (cli/agent/fanout.h). */
#include "cli/agent/fanout.h"
#include "cli/proto/agent_tree.h"
#include "cli/sys/sys.h"
#include "common/loop.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/banned.h"

#define END_SLACK_MS 5000 /* beyond the largest stop_grace, for the nodes below to end */
#define KILL_WAIT_MS 3000 /* for a bridge told SIGTERM to kill its remote session and leave */
#define KNOWN_HOST_LINE "ddprun-known-host " /* cli/provision/ssh_bridge.c, below */

struct bridge {
    uint32_t node, start; /* the launcher's count of the node's starts below another */
    struct ddp__child ch; /* pid 0 once reaped */
    struct ddp_buf erx;
};

static struct {
    struct ddp_loop *loop;
    void (*send)(struct ddp_buf *b);
    const sigset_t *mask;
    struct bridge **b; /* each its own allocation: the loop's callbacks point to them */
    size_t n, cap;
    char kh[64]; /* the known_hosts copy, "" before KNOWN_HOSTS */
    uint64_t grace_ms;
    void (*done)(void);
    struct ddp_timer end;
    int phase; /* of the end: 0 waiting, 1 SIGTERM sent, 2 SIGKILL sent */
} F;

static void on_end(struct ddp_loop *loop, struct ddp_timer *t);

void ddp__fanout_init(struct ddp_loop *loop, void (*send)(struct ddp_buf *b), const sigset_t *mask)
{
    F.loop = loop;
    F.send = send;
    F.mask = mask;
    ddp_timer_init(&F.end, on_end);
}

static void close_fd(int *fd, bool watched)
{
    if (*fd < 0)
        return;
    if (watched)
        ddp_loop_del(F.loop, *fd);
    close(*fd);
    *fd = -1;
}

static void send_str(uint8_t type, uint32_t node, uint32_t start, const char *s, size_t n)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (ddp__tree_put_node_str(&b, type, node, start, s, n) == 0)
        F.send(&b);
    ddp_buf_release(&b);
}

/* A line of a bridge's stderr: its messages (and the node's agent's, before its link) go up. */
static void bridge_line(void *arg, const char *s, size_t n)
{
    struct bridge *br = arg;
    size_t k = strlen(KNOWN_HOST_LINE);
    if (n > k && !memcmp(s, KNOWN_HOST_LINE, k))
        send_str(DDP__AG_HOST_KEY, br->node, br->start, s + k, n - k);
    else
        send_str(DDP__AG_CHILD_MSG, br->node, br->start, s, n);
}

static void on_err(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    struct bridge *br = arg;
    if (ddp__read_lines(fd, &br->erx, bridge_line, br) == 1)
        close_fd(&br->ch.err_fd, true);
}

/* Nothing is expected on a bridge's stdout (the node's agent speaks on its link). */
static void on_out(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    struct bridge *br = arg;
    if (ddp__drain(fd))
        close_fd(&br->ch.out_fd, true);
}

/* The launcher's known_hosts, written whole to a new file (mode 0600, made by mkstemp) that then
 * takes the copy's name (a bridge that is reading the old one keeps reading it). 0, or -1 said. */
static int keep_known_hosts(const uint8_t *s, uint32_t n)
{
    const char *dir = getenv("TMPDIR");
    char tmp[sizeof(F.kh) + 8];
    if (!F.kh[0]) {
        snprintf(F.kh, sizeof(F.kh), "%s/ddprun-kh-XXXXXX",
                 dir && *dir && strlen(dir) < 32 ? dir : "/tmp");
        int fd = mkstemp(F.kh);
        if (fd < 0) {
            fprintf(stderr, "ddprun agent: cannot make a file for the launcher's known_hosts: %s\n",
                    strerror(errno));
            F.kh[0] = '\0';
            return -1;
        }
        close(fd);
    }
    snprintf(tmp, sizeof(tmp), "%s.XXXXXX", F.kh); /* a name of its own: none made it first */
    int fd = mkstemp(tmp);
    if (fd < 0 || ddp_write_all(fd, s, n) < 0 || close(fd) != 0 || rename(tmp, F.kh) != 0) {
        fprintf(stderr, "ddprun agent: cannot write the launcher's known_hosts to %s: %s\n", F.kh,
                strerror(errno));
        if (fd >= 0)
            unlink(tmp);
        return -1;
    }
    return 0;
}

static struct bridge *new_bridge(void)
{
    for (size_t k = 0; k < F.n; k++)
        if (F.b[k]->ch.pid == 0 && F.b[k]->ch.err_fd < 0 && F.b[k]->ch.out_fd < 0)
            return F.b[k];
    if (F.n == F.cap) {
        size_t cap = F.cap ? 2 * F.cap : 8;
        struct bridge **nb = realloc(F.b, cap * sizeof(*nb));
        if (!nb)
            return NULL;
        F.b = nb;
        F.cap = cap;
    }
    struct bridge *br = calloc(1, sizeof(*br));
    if (!br)
        return NULL;
    br->ch = (struct ddp__child){.pid = 0, .in_fd = -1, .out_fd = -1, .err_fd = -1};
    F.b[F.n++] = br;
    return br;
}

/* SPAWN: the node's bridge, with its BOOT on the bridge's stdin (kept open: its end would read
 * as this agent gone). */
static void spawn(const struct ddp__spawn *s)
{
    char port[16], grace[24];
    snprintf(port, sizeof(port), "%u", s->port);
    snprintf(grace, sizeof(grace), "%llu", (unsigned long long)s->grace_ms);
    char *mode = s->flags & DDP__SPAWN_FORWARD_AGENT ? "below+agent" : "below";
    char *argv[] = {"ddprun",
                    "__ssh-bridge",
                    (char *)s->host,
                    port,
                    (char *)s->user,
                    (char *)s->identity,
                    F.kh,
                    (char *)s->strict,
                    (char *)s->remote,
                    grace,
                    (char *)s->args,
                    mode,
                    (char *)s->kh_name,
                    NULL};
    struct bridge *br = new_bridge();
    char msg[400];
    if (!F.kh[0] || !br || ddp__spawn_piped(NULL, argv, 0, F.mask, &br->ch) < 0) {
        int m = snprintf(msg, sizeof(msg),
                         "ddprun: error: node '%s': cannot start its SSH bridge "
                         "on this node: %s",
                         s->host, F.kh[0] ? strerror(errno) : "no known_hosts was handed down");
        send_str(DDP__AG_CHILD_MSG, s->node, s->start, msg,
                 (size_t)m < sizeof(msg) ? (size_t)m : 0);
        struct ddp_buf b;
        ddp_buf_init(&b);
        if (ddp__tree_put_child_exit(&b, s->node, s->start, DDP_EXIT_LAUNCH << 8) == 0)
            F.send(&b);
        ddp_buf_release(&b);
        if (br)
            br->ch = (struct ddp__child){.pid = 0, .in_fd = -1, .out_fd = -1, .err_fd = -1};
        return;
    }
    br->node = s->node;
    br->start = s->start;
    ddp_buf_init(&br->erx);
    if (ddp_write_all(br->ch.in_fd, s->boot, s->boot_len) < 0)
        close_fd(&br->ch.in_fd, false); /* its agent sees no BOOT and says so */
    if (s->grace_ms > F.grace_ms)
        F.grace_ms = s->grace_ms;
    ddp_loop_add(F.loop, br->ch.err_fd, DDP_LOOP_READ, on_err, br);
    ddp_loop_add(F.loop, br->ch.out_fd, DDP_LOOP_READ, on_out, br);
}

/* The running bridge of node's start. */
static struct bridge *of_node(uint32_t node, uint32_t start)
{
    for (size_t k = 0; k < F.n; k++)
        if (F.b[k]->ch.pid > 0 && F.b[k]->node == node && F.b[k]->start == start)
            return F.b[k];
    return NULL;
}

int ddp__fanout_frame(uint8_t type, const uint8_t *body, size_t len)
{
    const uint8_t *s;
    uint32_t n, node, start;
    uint8_t level;
    if (type == DDP__AG_KNOWN_HOSTS) {
        if (ddp__tree_get_known_hosts(body, len, &s, &n) < 0)
            goto bad;
        keep_known_hosts(s, n); /* a failure is said; the SPAWNs after it fail naming it */
        return 1;
    }
    if (type == DDP__AG_SPAWN) {
        struct ddp__spawn *sp = malloc(sizeof(*sp));
        if (!sp || ddp__tree_get_spawn(body, len, sp) < 0) {
            free(sp);
            goto bad;
        }
        /* A new start of a node whose last start's bridge still runs: the launcher has given
         * that one up (its agent is gone or going), and the new one is to take the node. */
        for (size_t k = 0; k < F.n; k++)
            if (F.b[k]->ch.pid > 0 && F.b[k]->node == sp->node && F.b[k]->start != sp->start)
                ddp__end_child(F.b[k]->ch.pid, 1); /* it has its remote session killed */
        spawn(sp);
        explicit_bzero(sp, sizeof(*sp));
        free(sp);
        return 1;
    }
    if (type == DDP__AG_UNSPAWN) {
        if (ddp__tree_get_unspawn(body, len, &node, &start, &level) < 0)
            goto bad;
        struct bridge *br = of_node(node, start);
        if (br)
            ddp__end_child(br->ch.pid, level);
        return 1;
    }
    return 0;
bad:
    fprintf(stderr, "ddprun agent: malformed frame %u (the SSH tree's) from the launcher\n", type);
    return -1;
}

static struct bridge *of_pid(pid_t pid)
{
    for (size_t k = 0; pid > 0 && k < F.n; k++)
        if (F.b[k]->ch.pid == pid)
            return F.b[k];
    return NULL;
}

bool ddp__fanout_owns(pid_t pid)
{
    return of_pid(pid) != NULL;
}

static bool any_live(void)
{
    for (size_t k = 0; k < F.n; k++)
        if (F.b[k]->ch.pid > 0)
            return true;
    return false;
}

bool ddp__fanout_reaped(pid_t pid, int st)
{
    struct bridge *br = of_pid(pid);
    if (!br)
        return false;
    if (br->ch.err_fd >= 0) /* what it said before it went comes first */
        ddp__read_lines(br->ch.err_fd, &br->erx, bridge_line, br);
    close_fd(&br->ch.err_fd, true);
    close_fd(&br->ch.out_fd, true);
    close_fd(&br->ch.in_fd, false);
    ddp_buf_release(&br->erx);
    br->ch.pid = 0;
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (ddp__tree_put_child_exit(&b, br->node, br->start, st) == 0)
        F.send(&b);
    ddp_buf_release(&b);
    if (F.done && !any_live()) {
        ddp_timer_stop(F.loop, &F.end);
        void (*done)(void) = F.done;
        F.done = NULL;
        done();
    }
    return true;
}

/* The end's deadline: SIGTERM (each bridge kills its remote session and leaves), then SIGKILL,
 * then the agent leaves whatever is left. */
static void on_end(struct ddp_loop *loop, struct ddp_timer *t)
{
    for (size_t k = 0; k < F.n && F.phase < 2; k++)
        if (F.b[k]->ch.pid > 0)
            ddp__end_child(F.b[k]->ch.pid, F.phase + 1);
    if (F.phase++ < 2) {
        ddp_timer_start(loop, t, KILL_WAIT_MS);
        return;
    }
    void (*done)(void) = F.done;
    F.done = NULL;
    if (done)
        done();
}

bool ddp__fanout_end(void (*done)(void))
{
    if (!any_live())
        return false;
    F.done = done;
    F.phase = 0;
    ddp_timer_start(F.loop, &F.end, (int64_t)F.grace_ms + END_SLACK_MS);
    return true;
}

void ddp__fanout_release(void)
{
    for (size_t k = 0; k < F.n; k++) {
        struct bridge *br = F.b[k];
        if (br->ch.pid > 0) {
            kill(-br->ch.pid, SIGKILL);
            waitpid(br->ch.pid, NULL, 0);
        }
        close_fd(&br->ch.err_fd, true);
        close_fd(&br->ch.out_fd, true);
        close_fd(&br->ch.in_fd, false);
        ddp_buf_release(&br->erx);
        free(br);
    }
    free(F.b);
    F.b = NULL;
    F.n = F.cap = 0;
    if (F.loop)
        ddp_timer_stop(F.loop, &F.end);
    if (F.kh[0]) {
        unlink(F.kh);
        F.kh[0] = '\0';
    }
}
