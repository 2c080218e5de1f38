/*
 * What the node agent reads of its ranks in /proc (cli/diag/proc_stat.c), and the report line it
 * sends (cli/diag/node.c): a rank its own stack tool has stopped, or its stack collection has
 * woken, is reported in the state it was in before, not as stopped by a debugger. Real child
 * processes, a real ptrace stop, a real collection (eu-stack or gdb).
 */
#include "cli/diag/diag.h"
#include "cli/diag/node.h"
#include "cli/diag/proc_stat.h"
#include "common/buf.h"
#include "common/util.h"
#include "common/loop.h"
#include "test.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t spinner(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);          /* nothing left if the test fails */
        prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); /* Yama ptrace_scope 1 */
        for (volatile unsigned long i = 0;; i++) {
        }
    }
    ASSERT_TRUE(pid > 0);
    return pid;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* A child of this process that ptrace-stops target (as eu-stack does) and holds it until its
 * pipe closes; 0 where ptrace is refused here. */
static pid_t stopper(pid_t target, int *release)
{
    int ready[2], go[2];
    ASSERT_TRUE(pipe(ready) == 0 && pipe(go) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        close(ready[0]);
        close(go[1]);
        int st;
        char ok = ptrace(PTRACE_SEIZE, target, 0, 0) == 0 &&
                          ptrace(PTRACE_INTERRUPT, target, 0, 0) == 0 &&
                          waitpid(target, &st, __WALL) == target
                      ? 'y'
                      : 'n';
        if (write(ready[1], &ok, 1) != 1 || ok != 'y')
            _exit(1);
        char c;
        while (read(go[0], &c, 1) > 0) {
        }
        ptrace(PTRACE_DETACH, target, 0, 0);
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    char ok = 'n';
    if (read(ready[0], &ok, 1) != 1 || ok != 'y') {
        close(go[1]);
        waitpid(pid, NULL, 0);
        pid = 0;
    }
    close(ready[0]);
    *release = go[1];
    return pid;
}

static void reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* The state letter of a report line for pid, with its page; inspected: the agent's stack
 * collection has it. */
static char reported_as(pid_t pid, bool inspected, struct ddp__dn_page *pg)
{
    struct ddp_buf b = {0};
    ddp__dn_report_rank(&b, 0, pid, false, inspected, pg);
    ddp_buf_put(&b, "", 1);
    struct ddp__rank_progress rp;
    ASSERT_TRUE(ddp__diag_line_parse((const char *)b.data, &rp) == 0);
    ddp_buf_release(&b);
    ASSERT_EQ(rp.pid, pid);
    return rp.state;
}

static char reported_state(pid_t pid, struct ddp__dn_page *pg)
{
    return reported_as(pid, false, pg);
}

TEST(states_of_a_running_a_sleeping_and_a_gone_process)
{
    pid_t spin = spinner();
    struct ddp__proc_stat ps;
    ASSERT_TRUE(ddp__proc_stat_read(spin, &ps));
    ASSERT_EQ(ps.state, 'R'); /* running or runnable: it never sleeps */
    sleep_ms(300);
    ASSERT_TRUE(ddp__proc_stat_read(spin, &ps));
    ASSERT_TRUE(ps.cpu_s > 0.05); /* CPU time counts (clock ticks of 10 ms at most) */
    ASSERT_TRUE(!ddp__proc_traced_by_child(spin));
    reap(spin);

    pid_t idle = fork();
    if (idle == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        pause();
        _exit(0);
    }
    char st = '?';
    for (int i = 0; i < 500 && st != 'S'; i++) { /* until it reached pause() */
        ASSERT_TRUE(ddp__proc_stat_read(idle, &ps));
        st = ps.state;
        sleep_ms(10);
    }
    ASSERT_EQ(st, 'S');
    reap(idle);
    ASSERT_TRUE(!ddp__proc_stat_read(idle, &ps)); /* reaped: gone */
    ASSERT_EQ(ps.state, '?');
}

TEST(a_rank_stopped_by_the_agents_own_stack_tool_keeps_the_state_seen_before)
{
    pid_t spin = spinner();
    struct ddp__dn_page pg = {.fd = -1};
    ASSERT_EQ(reported_state(spin, &pg), 'R');
    int release;
    pid_t tool = stopper(spin, &release);
    if (!tool) {
        fprintf(stderr, "note: ptrace is refused here; the stopped-rank case is not tested\n");
        reap(spin);
        return;
    }
    struct ddp__proc_stat ps;
    ASSERT_TRUE(ddp__proc_stat_read(spin, &ps));
    ASSERT_EQ(ps.state, 't'); /* what /proc says: a tracing stop */
    ASSERT_TRUE(ddp__proc_traced_by_child(spin));
    ASSERT_EQ(reported_state(spin, &pg), 'R'); /* what it was doing */
    struct ddp__dn_page fresh = {.fd = -1};    /* a rank never seen before its stop */
    ASSERT_EQ(reported_state(spin, &fresh), 't');
    close(release);
    ASSERT_EQ(waitpid(tool, NULL, 0), tool);
    ASSERT_TRUE(!ddp__proc_traced_by_child(spin));
    ASSERT_EQ(reported_state(spin, &pg), 'R');
    reap(spin);
}

TEST(a_rank_stopped_by_a_debugger_of_its_own_is_reported_so)
{
    /* a tracer that is not a child of the agent (here: the agent itself; in life, a user's gdb) */
    pid_t spin = spinner();
    struct ddp__dn_page pg = {.fd = -1};
    ASSERT_EQ(reported_state(spin, &pg), 'R');
    int st;
    if (ptrace(PTRACE_SEIZE, spin, 0, 0) != 0 || ptrace(PTRACE_INTERRUPT, spin, 0, 0) != 0 ||
        waitpid(spin, &st, __WALL) != spin) {
        fprintf(stderr, "note: ptrace is refused here; not tested\n");
        reap(spin);
        return;
    }
    ASSERT_TRUE(!ddp__proc_traced_by_child(spin));
    ASSERT_EQ(reported_state(spin, &pg), 't');
    reap(spin);
}

static pid_t pauser(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
        pause();
        _exit(0);
    }
    ASSERT_TRUE(pid > 0);
    return pid;
}

static void until_state(pid_t pid, char want)
{
    struct ddp__proc_stat ps = {0};
    for (int i = 0; i < 1000; i++) {
        ASSERT_TRUE(ddp__proc_stat_read(pid, &ps));
        if (ps.state == want)
            return;
        sleep_ms(10);
    }
    ASSERT_EQ(ps.state, want);
}

static int64_t replied_ms;
static void on_reply(struct ddp_buf *frame)
{
    (void)frame;
    replied_ms = ddp_now_ms();
}

TEST(a_rank_under_the_agents_stack_collection_keeps_the_state_seen_before)
{
    /* the report's side: a rank that is not asleep while the collection has it (here stopped by
     * SIGSTOP, in life woken by the Python stacks' signal) is reported as it was before */
    pid_t idle = pauser();
    until_state(idle, 'S');
    struct ddp__dn_page pg = {.fd = -1};
    ASSERT_EQ(reported_state(idle, &pg), 'S');
    ASSERT_EQ(kill(idle, SIGSTOP), 0);
    until_state(idle, 'T');
    ASSERT_EQ(reported_as(idle, true, &pg), 'S');
    ASSERT_EQ(reported_state(idle, &pg), 'T'); /* not inspected: what /proc says */
    struct ddp__dn_page fresh = {.fd = -1};    /* never seen before: what /proc says */
    ASSERT_EQ(reported_as(idle, true, &fresh), 'T');
    ASSERT_EQ(kill(idle, SIGCONT), 0);
    until_state(idle, 'S');

    /* the asker's side: its processes count as touched while its collection runs and for 200 ms
     * after; others never */
    struct ddp_loop *loop;
    ASSERT_EQ(ddp_loop_new(&loop), 0);
    sigset_t mask;
    sigemptyset(&mask);
    struct ddp__dn_asker a = {.loop = loop, .mask = &mask, .send = on_reply};
    ASSERT_TRUE(!ddp__dn_asker_touches(&a, idle));
    uint8_t body[8] = {7, 0, 0, 0, 0, 0, 0, 0}; /* request 7, every running rank */
    struct ddp__dn_proc running[2] = {{.pid = idle, .pydump = -1}, {.pid = 0, .pydump = -1}};
    replied_ms = 0;
    int64_t asked_ms = ddp_now_ms();
    ddp__dn_stacks_frame(&a, body, sizeof(body), running, 2);
    ASSERT_TRUE(a.stacks != NULL);
    ASSERT_TRUE(ddp__dn_asker_touches(&a, idle));
    ASSERT_TRUE(!ddp__dn_asker_touches(&a, getpid()));
    for (int i = 0; i < 300 && !replied_ms; i++)
        ddp_loop_run_once(loop, 100);
    ASSERT_TRUE(replied_ms > 0);
    ASSERT_TRUE(a.stacks == NULL);
    ASSERT_GE(a.touched_until_ms, asked_ms + 200); /* 200 ms from when it ended */
    ASSERT_LE(a.touched_until_ms, replied_ms + 200);
    ASSERT_TRUE(!ddp__dn_asker_touches(&a, getpid()));
    sleep_ms(250);
    ASSERT_TRUE(!ddp__dn_asker_touches(&a, idle));
    ddp__dn_asker_release(&a);
    ddp_loop_free(loop);
    reap(idle);
}
