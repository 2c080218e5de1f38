/*
 * A rank that finds a local peer on its own CPU moves itself off it (worker/shm_sync.c,
 * ddp__shm_part): to a CPU of its mask that no local rank published from, with its mask
 * restored after; never with a mask of one CPU, never onto a CPU a local rank uses, never
 * twice within DDP__SHM_PART_EVERY_NS, never when the peer has gone elsewhere. The control
 * lines are the segment's layout in ordinary memory; the moves are the kernel's, real.
 */
#include "tests/unit/test.h"
#include "common/util.h"
#include "worker/coll.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define RANKS_MAX 1025

static struct ddp__shm sh;
static cpu_set_t whole;

/* n local ranks, we local rank 0, everyone's last step published from here; false when this
 * process may run on one CPU only (the moves need two). */
static bool setup(int n)
{
    static _Alignas(64) char lines[RANKS_MAX * DDP__SHM_CTRL_LINE];
    memset(lines, 0, sizeof(lines));
    memset(&sh, 0, sizeof(sh));
    sh.base = lines;
    sh.n = n;
    sh.me = 0;
    if (sched_getaffinity(0, sizeof(whole), &whole) != 0 || CPU_COUNT(&whole) < 2) {
        fprintf(stderr, "one CPU usable: skipped\n");
        return false;
    }
    return true;
}

static void published(int j, int cpu)
{
    atomic_store(&ddp__shm_ctrl(&sh, j)->cpu, cpu);
    if (j == sh.me)
        sh.cpu = cpu;
}

/* This thread's mask is want. */
static bool mask_is(const cpu_set_t *want)
{
    cpu_set_t now;
    return sched_getaffinity(0, sizeof(now), &now) == 0 && CPU_EQUAL(&now, want);
}

/* This thread bound to the CPU it runs on (one), which it returns. */
static int bind_here(cpu_set_t *one)
{
    CPU_ZERO(one);
    CPU_SET(sched_getcpu(), one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(*one), one), 0);
    return sched_getcpu(); /* now it cannot change */
}

/* The peer (local rank 1) and we published from the CPU we run on; the call made there (a
 * thread may be moved between its sched_getcpu and the call: tried again then). */
static bool part_here(int *here)
{
    for (int tries = 0; tries < 1000; tries++) {
        *here = sched_getcpu();
        published(0, *here);
        published(1, *here);
        sh.parted_ns = 0;
        if (ddp__shm_part(&sh, ddp__shm_ctrl(&sh, 1)))
            return true;
        if (sh.parted_ns) /* it ran its checks on the peer's CPU, and did not move */
            return false;
    }
    return false;
}

TEST(a_rank_on_its_peers_cpu_moves_off_it_and_keeps_its_mask)
{
    if (!setup(2))
        return;
    int here;
    ASSERT_TRUE(part_here(&here));
    ASSERT_EQ(sh.parts, 1);
    /* published where it went, which is not the peer's CPU */
    ASSERT_EQ(atomic_load(&ddp__shm_ctrl(&sh, 0)->cpu), sh.cpu);
    ASSERT_TRUE(sh.cpu != here && sh.cpu >= 0);
    ASSERT_TRUE(CPU_ISSET(sh.cpu, &whole));
    ASSERT_TRUE(mask_is(&whole));
}

TEST(a_rank_moves_at_most_once_in_a_while)
{
    if (!setup(2))
        return;
    int here;
    ASSERT_TRUE(part_here(&here));
    /* on the peer's CPU again at once: not moved again */
    for (int i = 0; i < 100; i++) {
        published(1, sched_getcpu());
        ASSERT_TRUE(!ddp__shm_part(&sh, ddp__shm_ctrl(&sh, 1)));
    }
    ASSERT_EQ(sh.parts, 1);
    /* and once the time has passed, again */
    sh.parted_ns = ddp_now_ns() - DDP__SHM_PART_EVERY_NS - 1;
    bool moved = false;
    for (int tries = 0; tries < 1000 && !moved; tries++) {
        published(0, sched_getcpu());
        published(1, sched_getcpu());
        moved = ddp__shm_part(&sh, ddp__shm_ctrl(&sh, 1));
        if (!moved && sh.parted_ns > ddp_now_ns() - DDP__SHM_PART_EVERY_NS)
            break; /* checked on the peer's CPU, and not moved */
    }
    ASSERT_TRUE(moved);
    ASSERT_EQ(sh.parts, 2);
}

TEST(a_rank_bound_to_one_cpu_stays)
{
    if (!setup(2))
        return;
    cpu_set_t one;
    int here = bind_here(&one);
    published(0, here);
    published(1, here);
    ASSERT_TRUE(!ddp__shm_part(&sh, ddp__shm_ctrl(&sh, 1)));
    ASSERT_EQ(sh.parts, 0);
    ASSERT_EQ(atomic_load(&ddp__shm_ctrl(&sh, 0)->cpu), here);
    ASSERT_TRUE(mask_is(&one));
    ASSERT_EQ(sched_setaffinity(0, sizeof(whole), &whole), 0);
}

/* More local ranks than CPUs, one published from each CPU of the mask: nowhere to go. */
TEST(a_rank_stays_where_every_cpu_has_a_local_rank)
{
    if (!setup(2))
        return;
    int ncpu = CPU_COUNT(&whole);
    if (ncpu + 1 > RANKS_MAX) {
        fprintf(stderr, "more CPUs than the test's ranks: skipped\n");
        return;
    }
    setup(ncpu + 1);
    for (int tries = 0; tries < 1000; tries++) {
        int here = sched_getcpu(), j = 2;
        published(0, here);
        published(1, here);
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
            if (CPU_ISSET(cpu, &whole) && cpu != here)
                published(j++, cpu);
        sh.parted_ns = 0;
        ASSERT_TRUE(!ddp__shm_part(&sh, ddp__shm_ctrl(&sh, 1)));
        if (sh.parted_ns)
            break; /* checked on the peer's CPU */
    }
    ASSERT_TRUE(sh.parted_ns != 0);
    ASSERT_EQ(sh.parts, 0);
    ASSERT_TRUE(mask_is(&whole));
}

/* The peer last published from another CPU than ours: nothing to do, and no move spent (the
 * thread bound to its CPU meanwhile, so that the kernel cannot take it to the peer's). */
TEST(a_rank_whose_peer_is_elsewhere_stays)
{
    if (!setup(2))
        return;
    cpu_set_t one;
    int here = bind_here(&one), other = -1;
    for (int cpu = 0; cpu < CPU_SETSIZE && other < 0; cpu++)
        if (CPU_ISSET(cpu, &whole) && cpu != here)
            other = cpu;
    published(0, here);
    published(1, other);
    ASSERT_TRUE(!ddp__shm_part(&sh, ddp__shm_ctrl(&sh, 1)));
    ASSERT_EQ(sh.parted_ns, 0);
    ASSERT_EQ(atomic_load(&ddp__shm_ctrl(&sh, 0)->cpu), here);
    /* the same with the peer here goes on to the mask (one CPU: stays), and counts the time */
    published(1, here);
    ASSERT_TRUE(!ddp__shm_part(&sh, ddp__shm_ctrl(&sh, 1)));
    ASSERT_TRUE(sh.parted_ns != 0);
    ASSERT_EQ(sh.parts, 0);
    ASSERT_EQ(sched_setaffinity(0, sizeof(whole), &whole), 0);
}
