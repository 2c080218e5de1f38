/*
 * The launcher's diagnosis model (cli/diag/line.c, cli/diag/diagnose.c): the agents' progress
 * lines, the hang report, stragglers, the status table and stack grouping, on reports built here.
 */
#include "cli/diag/diag.h"
#include "cli/diag/diagnose.h"
#include "common/progress.h"
#include "test.h"

#include <stdarg.h>

static const char *const NODES[] = {"n1", "n2"};

/* A rank's line as an agent would send it. */
static char *line_of(const struct ddp__rank_progress *p)
{
    struct ddp_buf b = {0};
    ddp__diag_line_put(&b, p);
    ddp_buf_put(&b, "", 1);
    return (char *)b.data;
}

static void take(struct ddp__diag *d, int node, const struct ddp__rank_progress *p, int64_t now)
{
    char *l = line_of(p);
    ddp__diag_take(d, node, l, now);
    free(l);
}

static struct ddp__rank_progress prog(int rank, uint64_t entered, uint64_t completed,
                                      int64_t idle_ms)
{
    struct ddp__rank_progress p = {.rank = rank, .pid = 1000 + rank, .state = 'S', .rec = true};
    snprintf(p.wchan, sizeof(p.wchan), "futex_wait_queue");
    p.entered = p.started = entered;
    p.completed = completed;
    p.idle_ms = idle_ms;
    if (entered > completed) {
        p.in_coll = true;
        p.op = DDP_PROG_ALLREDUCE;
        p.bucket = 3;
        p.bytes = 25u << 20;
        p.cur_ms = idle_ms;
        p.cur_run_ms = -1;
    }
    return p;
}

TEST(a_progress_line_reads_back_as_written)
{
    struct ddp__rank_progress p = prog(5, 1234, 1233, 62000), q;
    p.cpu_s = 12.25;
    p.formed_ago_ms = 4200;
    p.first_ago_ms = -1;
    p.nwaits = 3;
    for (int i = 0; i < 3; i++) {
        p.wseq[i] = 1230 + (uint64_t)i;
        p.wus[i] = 100u * (unsigned)(i + 1);
    }
    char *l = line_of(&p);
    *strchr(l, '\n') = '\0';
    ASSERT_OK(ddp__diag_line_parse(l, &q));
    free(l);
    ASSERT_EQ(q.rank, 5);
    ASSERT_EQ(q.pid, 1005);
    ASSERT_EQ(q.state, 'S');
    ASSERT_STREQ(q.wchan, "futex_wait_queue");
    ASSERT_TRUE(q.rec && q.in_coll);
    ASSERT_EQ(q.entered, 1234);
    ASSERT_EQ(q.completed, 1233);
    ASSERT_EQ(q.idle_ms, 62000);
    ASSERT_EQ(q.bucket, 3);
    ASSERT_EQ(q.bytes, 25u << 20);
    ASSERT_EQ(q.cur_run_ms, -1);
    ASSERT_EQ(q.nwaits, 3);
    ASSERT_EQ(q.wseq[2], 1232);
    ASSERT_EQ(q.wus[2], 300);
    ASSERT_TRUE(q.cpu_s == 12.25); /* two decimals print exactly */
    ASSERT_EQ(q.formed_ago_ms, 4200);
    ASSERT_EQ(q.first_ago_ms, -1);
    /* not a line: no rank, a negative one */
    ASSERT_EQ(ddp__diag_line_parse("pid=3 st=R", &q), -1);
    ASSERT_EQ(ddp__diag_line_parse("rank=-1 pid=3", &q), -1);
    ASSERT_EQ(ddp__diag_line_parse("", &q), -1);
    /* a truncated wait list keeps what is whole */
    ASSERT_OK(ddp__diag_line_parse("rank=0 rec=1 w=7:10,8:x", &q));
    ASSERT_EQ(q.nwaits, 1);
    ASSERT_EQ(q.wseq[0], 7);
    ASSERT_EQ(q.formed_ago_ms, -1); /* no up= (an older agent): not known */
    ASSERT_EQ(q.first_ago_ms, -1);
    ASSERT_OK(ddp__diag_line_parse("rank=0 rec=1 up=5:-7", &q)); /* out of range: not known */
    ASSERT_EQ(q.formed_ago_ms, -1);
}

/* The startup timeline: the latest of the ranks' times, once every rank has reported it. */
TEST(the_startup_timeline_waits_for_every_rank_and_takes_the_latest)
{
    struct ddp__diag d = {0};
    int node_of[] = {0, 1};
    ASSERT_OK(ddp__diag_reset(&d, 2, node_of));
    int64_t at;
    ASSERT_TRUE(!ddp__diag_startup(&d, false, &at));
    struct ddp__rank_progress p0 = prog(0, 0, 0, 0), p1 = prog(1, 0, 0, 0);
    p0.formed_ago_ms = 3000;
    p0.first_ago_ms = p1.formed_ago_ms = p1.first_ago_ms = -1;
    take(&d, 0, &p0, 10000);                         /* formed at 7000 */
    ASSERT_TRUE(!ddp__diag_startup(&d, false, &at)); /* rank 1 has not reported it */
    take(&d, 1, &p1, 10000);
    ASSERT_TRUE(!ddp__diag_startup(&d, false, &at));
    p1.formed_ago_ms = 3400;
    take(&d, 1, &p1, 10500); /* formed at 7100 */
    ASSERT_TRUE(ddp__diag_startup(&d, false, &at));
    ASSERT_EQ(at, 7100);
    ASSERT_TRUE(!ddp__diag_startup(&d, true, &at));
    p0.first_ago_ms = 500;
    p1.first_ago_ms = 200;
    take(&d, 0, &p0, 11000); /* 10500 */
    take(&d, 1, &p1, 11000); /* 10800 */
    ASSERT_TRUE(ddp__diag_startup(&d, true, &at));
    ASSERT_EQ(at, 10800);
    /* a rank without a recorder: no timeline */
    p1.rec = false;
    take(&d, 1, &p1, 11500);
    ASSERT_TRUE(!ddp__diag_startup(&d, true, &at));
    ddp__diag_release(&d);
}

TEST(names_of_collectives_and_process_states)
{
    char s[160];
    ddp__diag_coll_name(s, sizeof(s), DDP_PROG_ALLREDUCE, 1234, 3, 25u << 20);
    ASSERT_STREQ(s, "allreduce #1234 (bucket 3, 25.0 MiB)");
    ddp__diag_coll_name(s, sizeof(s), DDP_PROG_BROADCAST, 7, -1, 16);
    ASSERT_STREQ(s, "broadcast #7 (16 bytes)");
    ddp__diag_state_name(s, sizeof(s), 'T', "");
    ASSERT_STREQ(s, "stopped (SIGSTOP or job control)");
    ddp__diag_state_name(s, sizeof(s), 'S', "ep_poll");
    ASSERT_STREQ(s, "sleeping in ep_poll");
    ddp__diag_state_name(s, sizeof(s), 'R', "");
    ASSERT_STREQ(s, "running (on a CPU)");
}

/* 4 ranks on 2 nodes; rank 3 (on n2) stopped before #30, which the other three entered. */
TEST(the_hang_report_names_the_rank_that_never_entered)
{
    struct ddp__diag d = {0};
    int node_of[] = {0, 0, 1, 1};
    ASSERT_OK(ddp__diag_reset(&d, 4, node_of));
    int64_t t0 = 1000000;
    for (int r = 0; r < 3; r++)
        take(&d, node_of[r], &(struct ddp__rank_progress){0}, t0); /* rank 0, ignored twice */
    for (int r = 0; r < 3; r++) {
        struct ddp__rank_progress p = prog(r, 30, 29, 500);
        take(&d, node_of[r], &p, t0);
    }
    struct ddp__rank_progress stuck = prog(3, 29, 29, 500);
    stuck.state = 'T';
    stuck.wchan[0] = '\0';
    take(&d, 1, &stuck, t0);
    struct ddp__hang h;
    /* not yet: 500 ms + 4 s < hang_after */
    ASSERT_TRUE(!ddp__diag_hang(&d, t0 + 4000, 5000, (const char *const *)NODES, &h));
    ASSERT_TRUE(ddp__diag_hang(&d, t0 + 4600, 5000, (const char *const *)NODES, &h));
    ASSERT_EQ(h.seq, 30);
    ASSERT_EQ(h.nbehind, 1);
    ASSERT_EQ(h.behind[0], 3);
    ASSERT_TRUE(!h.entered_by_all);
    ASSERT_STREQ(h.what, "allreduce #30 (bucket 3, 25.0 MiB)");
    if (!strstr(h.text, "rank 3 on n2 has not entered allreduce #30 (bucket 3, 25.0 MiB) that the "
                        "other 3 ranks entered 5 s ago; it is stopped (SIGSTOP or job control) "
                        "(pid 1003)"))
        FAIL_AT("report:\n%s", h.text);
    ddp__diag_hang_release(&h);
    /* reported once per stuck point */
    ASSERT_TRUE(!ddp__diag_hang(&d, t0 + 9000, 5000, (const char *const *)NODES, &h));
    /* one rank moves: no hang until hang_after has passed again */
    struct ddp__rank_progress moved = prog(0, 31, 30, 0);
    take(&d, 0, &moved, t0 + 9000);
    ASSERT_TRUE(!ddp__diag_hang(&d, t0 + 9000, 5000, (const char *const *)NODES, &h));
    ddp__diag_release(&d);
}

TEST(a_hang_inside_a_collective_every_rank_entered_names_those_still_in_it)
{
    struct ddp__diag d = {0};
    int node_of[] = {0, 1};
    ASSERT_OK(ddp__diag_reset(&d, 2, node_of));
    struct ddp__rank_progress a = prog(0, 8, 8, 3000), b = prog(1, 8, 7, 3000);
    b.state = 'R';
    take(&d, 0, &a, 0);
    take(&d, 1, &b, 0);
    struct ddp__hang h;
    ASSERT_TRUE(ddp__diag_hang(&d, 2000, 5000, (const char *const *)NODES, &h));
    ASSERT_EQ(h.seq, 8);
    ASSERT_TRUE(h.entered_by_all);
    ASSERT_EQ(h.nbehind, 1);
    ASSERT_EQ(h.behind[0], 1);
    if (!strstr(h.text, "all 2 ranks entered allreduce #8") ||
        !strstr(h.text, "rank 1 on n2 is running (on a CPU)"))
        FAIL_AT("report:\n%s", h.text);
    ddp__diag_hang_release(&h);
    ddp__diag_release(&d);
}

/* Every rank formed its group (its page is attached) and none has issued a collective: a
 * program between init_process_group and its first collective (loading a model, importing). */
TEST(no_collective_since_the_groups_formed_says_so)
{
    struct ddp__diag d = {0};
    int node_of[] = {0, 1};
    ASSERT_OK(ddp__diag_reset(&d, 2, node_of));
    for (int r = 0; r < 2; r++) {
        struct ddp__rank_progress p = prog(r, 0, 0, 6000);
        p.state = 'R';
        take(&d, node_of[r], &p, 0);
    }
    struct ddp__hang h;
    ASSERT_TRUE(ddp__diag_hang(&d, 0, 5000, (const char *const *)NODES, &h));
    ASSERT_EQ(h.seq, 1);
    ASSERT_EQ(h.nbehind, 2);
    if (!strstr(h.text, "no rank has made progress for 6 s: every rank formed its process group "
                        "and none has issued a collective since\n") ||
        !strstr(h.text, "rank 1 on n2 is running (on a CPU)"))
        FAIL_AT("report:\n%s", h.text);
    ddp__diag_hang_release(&h);
    ddp__diag_release(&d);
}

TEST(ranks_without_a_recorder_are_never_a_hang)
{
    struct ddp__diag d = {0};
    int node_of[] = {0, 0};
    ASSERT_OK(ddp__diag_reset(&d, 2, node_of));
    for (int r = 0; r < 2; r++) {
        struct ddp__rank_progress p = {.rank = r, .pid = 9 + r, .state = 'S'};
        take(&d, 0, &p, 0);
    }
    struct ddp__hang h;
    ASSERT_TRUE(!ddp__diag_hang(&d, 3600000, 1000, (const char *const *)NODES, &h));
    /* a report from the wrong node for a rank is not taken */
    struct ddp__rank_progress p = prog(1, 5, 5, 0);
    take(&d, 1, &p, 0);
    ASSERT_TRUE(!d.r[1].p.rec);
    ddp__diag_release(&d);
}

/* Rank 2 arrives last at 8 of 10 collectives, 4 ms after the first (its runs are 4 ms shorter);
 * the others by chance. */
TEST(stragglers_arrive_last_most_of_the_time)
{
    struct ddp__diag d = {0};
    int node_of[] = {0, 0, 1, 1};
    ASSERT_OK(ddp__diag_reset(&d, 4, node_of));
    struct ddp__rank_progress p[4];
    for (int r = 0; r < 4; r++) {
        p[r] = prog(r, 10, 10, 0);
        p[r].nwaits = 10;
        for (int k = 0; k < 10; k++) {
            p[r].wseq[k] = 1 + (uint64_t)k;
            p[r].wus[k] = 5000 + 100u * (unsigned)r;
        }
    }
    for (int k = 0; k < 10; k++)
        p[2].wus[k] = k < 8 ? 1000 : 9000;
    struct ddp__straggle st[4];
    /* node 1's ranks alone (node 0 has not reported yet): shares shown, no verdict */
    for (int r = 2; r < 4; r++)
        take(&d, node_of[r], &p[r], 0);
    ddp__diag_stragglers(&d, st);
    ASSERT_EQ(st[2].n, 10);
    ASSERT_TRUE(!st[2].flagged && !st[3].flagged);
    for (int r = 0; r < 2; r++)
        take(&d, node_of[r], &p[r], 0);
    ddp__diag_stragglers(&d, st);
    for (int r = 0; r < 4; r++)
        ASSERT_EQ(st[r].n, 10);
    ASSERT_TRUE(st[2].flagged);
    ASSERT_EQ((int)(st[2].last_frac * 100 + 0.5), 80);
    ASSERT_EQ((int)(st[2].late_ms * 10 + 0.5), 43); /* 5300 - 1000 us, the median */
    for (int r = 0; r < 4; r++)
        if (r != 2)
            ASSERT_TRUE(!st[r].flagged);
    struct ddp_buf b = {0};
    ddp__diag_status(&d, 0, (const char *const *)NODES, &b);
    ddp_buf_put(&b, "", 1);
    const char *row = strstr((const char *)b.data, "\n2 ");
    if (!row || !strstr(row, "80%, by 4.3 ms  STRAGGLER"))
        FAIL_AT("status:\n%s", (const char *)b.data);
    ddp_buf_release(&b);
    ddp__diag_release(&d);
}

TEST(identical_stacks_print_once_with_their_ranks)
{
    char a[] = "PID 100 - process\nTID 100:\n#0  0x00007f12 nanosleep\n#1  0x0000aa main\n";
    char b[] = "PID 200 - process\nTID 200:\n#0  0x00007f99 nanosleep\n#1  0x0000bb main\n";
    char c[] = "PID 300 - process\nTID 300:\n#0  0x00007f12 epoll_wait\n";
    char *texts[] = {a, c, b};
    int ranks[] = {0, 1, 2};
    struct ddp_buf out = {0};
    ddp__diag_group_stacks(&out, 3, ranks, texts);
    ddp_buf_put(&out, "", 1);
    const char *s = (const char *)out.data;
    ASSERT_STREQ(s, "== ranks 0,2 (2 of 3):\nthread:\n#0  nanosleep\n#1  main\n"
                    "== rank 1 (1 of 3):\nthread:\n#0  epoll_wait\n");
    ddp_buf_release(&out);
}

/* A PyTorch rank's DDP step (cli/diag/torch_rec.py): the rank's own work, open until its next
 * entry. */
static struct ddp__rank_progress step(int rank, uint64_t entered, int64_t idle_ms, char state)
{
    struct ddp__rank_progress p = prog(rank, entered, entered - 1, idle_ms);
    p.op = DDP_PROG_DDP_STEP;
    p.bucket = -1;
    p.bytes = 272;
    p.state = state;
    return p;
}

/* Rank 1 stuck loading data before its step #7; rank 0 in #7 (its backward waits for rank 1's
 * gradients). Reports arrive with a few ms of jitter: reported once all the same. */
TEST(a_rank_that_has_not_started_the_next_ddp_step_is_named)
{
    struct ddp__diag d = {0};
    int node_of[] = {0, 1};
    ASSERT_OK(ddp__diag_reset(&d, 2, node_of));
    struct ddp__rank_progress a = step(0, 7, 4000, 'S'), b = step(1, 6, 4000, 'S');
    snprintf(b.wchan, sizeof(b.wchan), "hrtimer_nanosleep");
    take(&d, 0, &a, 10000);
    take(&d, 1, &b, 10000);
    struct ddp__hang h;
    ASSERT_TRUE(ddp__diag_hang(&d, 10000, 3000, (const char *const *)NODES, &h));
    ASSERT_EQ(h.seq, 7);
    ASSERT_TRUE(!h.entered_by_all && !h.mismatch);
    ASSERT_EQ(h.nbehind, 1);
    ASSERT_EQ(h.behind[0], 1);
    if (!strstr(h.text, "rank 1 on n2 has not entered ddp_step #7 (272 bytes) that the other 1 "
                        "rank entered 4 s ago; it is sleeping in hrtimer_nanosleep (pid 1001)"))
        FAIL_AT("report:\n%s", h.text);
    ddp__diag_hang_release(&h);
    for (int k = 1; k <= 5; k++) { /* the same counters, idle a few ms off each time */
        a.idle_ms = 4000 + 1000 * k + k % 3;
        b.idle_ms = 4000 + 1000 * k - 2;
        take(&d, 0, &a, 10000 + 1000 * k);
        take(&d, 1, &b, 10000 + 1000 * k);
        ASSERT_TRUE(!ddp__diag_hang(&d, 10000 + 1000 * k, 3000, (const char *const *)NODES, &h));
    }
    ddp__diag_release(&d);
}

/* Every rank in step #12 for long (a backward stuck in torch's all-reduce, or all computing):
 * each is listed with what it is doing. */
TEST(every_rank_in_its_ddp_step_lists_each_with_its_state)
{
    struct ddp__diag d = {0};
    int node_of[] = {0, 1};
    ASSERT_OK(ddp__diag_reset(&d, 2, node_of));
    struct ddp__rank_progress a = step(0, 12, 9000, 'S'), b = step(1, 12, 9000, 'R');
    a.cur_run_ms = 8000; /* its gradients are ready: it waits in torch's all-reduce */
    take(&d, 0, &a, 0);
    take(&d, 1, &b, 0);
    struct ddp__hang h;
    ASSERT_TRUE(ddp__diag_hang(&d, 0, 5000, (const char *const *)NODES, &h));
    ASSERT_EQ(h.nbehind, 2);
    if (!strstr(h.text, "every rank finished #12 or is in its DDP step") ||
        !strstr(h.text, "rank 0 on n1 is in ddp_step #12 (272 bytes), entered 9 s ago, its "
                        "gradients ready 8 s ago (in its all-reduce); it is sleeping in "
                        "futex_wait_queue (pid 1000)") ||
        !strstr(h.text, "rank 1 on n2 is in ddp_step #12 (272 bytes), entered 9 s ago, in its "
                        "forward or backward; it is running (on a CPU) (pid 1001)"))
        FAIL_AT("report:\n%s", h.text);
    ddp__diag_hang_release(&h);
    ddp__diag_release(&d);
}

/* Uneven inputs: ranks 0-2 ran out of data and wait in barrier #9; rank 3 is in a ninth step
 * (its gradient all-reduce waits for the others). Then the tie of two ranks. */
TEST(ranks_in_different_operations_at_the_same_seq_are_a_mismatch)
{
    struct ddp__diag d = {0};
    int node_of[] = {0, 0, 1, 1};
    ASSERT_OK(ddp__diag_reset(&d, 4, node_of));
    for (int r = 0; r < 3; r++) {
        struct ddp__rank_progress p = prog(r, 9, 8, 6000);
        p.op = DDP_PROG_BARRIER;
        p.bucket = -1;
        p.bytes = 0;
        take(&d, node_of[r], &p, 0);
    }
    struct ddp__rank_progress s = step(3, 9, 6000, 'S');
    take(&d, 1, &s, 0);
    struct ddp__hang h;
    ASSERT_TRUE(ddp__diag_hang(&d, 0, 5000, (const char *const *)NODES, &h));
    ASSERT_TRUE(h.mismatch);
    ASSERT_EQ(h.seq, 9);
    ASSERT_EQ(h.nbehind, 1);
    ASSERT_EQ(h.behind[0], 3);
    ASSERT_STREQ(h.what, "different operations at #9 (barrier: 3 ranks; ddp_step: rank 3)");
    const char *first = strstr(h.text, "  rank 3 on n2 is in ddp_step #9 (272 bytes)");
    if (!strstr(h.text, "the ranks are not in the same operation at #9") || !first ||
        !strstr(first, "  rank 0 on n1 is in barrier #9 (0 bytes), entered 6 s ago"))
        FAIL_AT("report:\n%s", h.text);
    ddp__diag_hang_release(&h);
    ASSERT_OK(ddp__diag_reset(&d, 2, node_of));
    struct ddp__rank_progress x = prog(0, 5, 4, 6000);
    x.op = DDP_PROG_BROADCAST;
    take(&d, 0, &x, 0);
    x = prog(1, 5, 4, 6000);
    take(&d, 0, &x, 0);
    ASSERT_TRUE(ddp__diag_hang(&d, 0, 5000, (const char *const *)NODES, &h));
    ASSERT_TRUE(h.mismatch);
    ASSERT_EQ(h.nbehind, 2);
    ASSERT_STREQ(h.what, "different operations at #5 (allreduce: rank 1; broadcast: rank 0)");
    ddp__diag_hang_release(&h);
    ddp__diag_release(&d);
}

/* Rank 1 exited after its step #4 (the agent reports its page's last state, X); rank 0 waits in
 * step #5's backward for it. */
TEST(a_rank_that_exited_is_named_as_not_having_entered)
{
    struct ddp__diag d = {0};
    int node_of[] = {0, 1};
    ASSERT_OK(ddp__diag_reset(&d, 2, node_of));
    struct ddp__rank_progress a = step(0, 5, 7000, 'S'), b = prog(1, 4, 4, 7000);
    b.state = 'X';
    b.wchan[0] = '\0';
    b.cpu_s = 0;
    take(&d, 0, &a, 0);
    take(&d, 1, &b, 0);
    take(&d, 1, &b, 2000); /* exited: no CPU rate from the zero it reports */
    ASSERT_TRUE(!d.r[1].rated);
    struct ddp__hang h;
    ASSERT_TRUE(ddp__diag_hang(&d, 2000, 5000, (const char *const *)NODES, &h));
    ASSERT_EQ(h.nbehind, 1);
    ASSERT_EQ(h.behind[0], 1);
    if (!strstr(h.text, "rank 1 on n2 has not entered ddp_step #5 (272 bytes) that the other 1 "
                        "rank entered 9 s ago; it is exited (pid 1001)"))
        FAIL_AT("report:\n%s", h.text);
    ddp__diag_hang_release(&h);
    ddp__diag_release(&d);
}
