/*
 * bind_to (cli/sys/cpubind.c) against topologies written here as sysfs trees: hardware threads
 * stay with their core, ranks get contiguous blocks, an affinity mask narrows the choice,
 * ranks beyond the units share them (and say how many do), NUMA nodes, and no sysfs at all.
 */
#include "cli/sys/cpubind.h"
#include "test.h"
#include "tree.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[64];

static void put(const char *rel, const char *text)
{
    ddp_tree_put(root, rel, text);
}

/* 8 CPUs numbered as on most x86 servers: CPU c and c+4 are one core's two threads; two NUMA
 * nodes of two cores each. */
static void smt_box(void)
{
    ddp_tree_make(root, sizeof(root), "ddp-cpubind");
    for (int c = 0; c < 8; c++) {
        char rel[96], sib[16];
        snprintf(rel, sizeof(rel), "cpu/cpu%d/topology/thread_siblings_list", c);
        snprintf(sib, sizeof(sib), "%d,%d", c % 4, c % 4 + 4);
        put(rel, sib);
    }
    put("node/node0/cpulist", "0-1,4-5");
    put("node/node1/cpulist", "2-3,6-7");
}

static void rm_box(void)
{
    ddp_tree_remove(root);
}

/* The CPU list of rank `local` of n, with its sharers. */
static const char *rank_cpus(int mode, const char *allowed, int n, int local, int *sharers)
{
    static char buf[256];
    cpu_set_t a, out;
    int units;
    if (!ddp__cpubind_parse_list(allowed, &a) ||
        ddp__cpubind_rank(mode, root, &a, n, local, &out, sharers, &units) != 0)
        return "(error)";
    ddp__cpubind_list(&out, buf, sizeof(buf));
    return buf;
}

TEST(cpu_lists_parse_and_print_as_linux_does)
{
    cpu_set_t s;
    char buf[64];
    ASSERT_TRUE(ddp__cpubind_parse_list("0-3,8,10-11\n", &s));
    ASSERT_EQ(CPU_COUNT(&s), 7);
    ddp__cpubind_list(&s, buf, sizeof(buf));
    ASSERT_STREQ(buf, "0-3,8,10-11");
    ASSERT_TRUE(ddp__cpubind_parse_list("", &s));
    ASSERT_EQ(CPU_COUNT(&s), 0);
    const char *bad[] = {"1-", "a", "3-1", "1,,2", "1;2", "-1", "99999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        ASSERT_TRUE(!ddp__cpubind_parse_list(bad[i], &s));
    /* a buffer too short keeps whole ranges only */
    ASSERT_TRUE(ddp__cpubind_parse_list("0-3,8,10-11", &s));
    ddp__cpubind_list(&s, buf, 8);
    ASSERT_STREQ(buf, "0-3,8");
    ASSERT_EQ(ddp__cpubind_parse("core"), DDP__BIND_CORE);
    ASSERT_EQ(ddp__cpubind_parse("numa"), DDP__BIND_NUMA);
    ASSERT_EQ(ddp__cpubind_parse("none"), DDP__BIND_NONE);
    ASSERT_EQ(ddp__cpubind_parse("socket"), -1);
}

TEST(cores_keep_their_threads_and_go_in_contiguous_blocks)
{
    int sh;
    smt_box();
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-7", 2, 0, &sh), "0-1,4-5");
    ASSERT_EQ(sh, 1);
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-7", 2, 1, &sh), "2-3,6-7");
    for (int i = 0; i < 4; i++) {
        char want[32]; /* two of any int */
        snprintf(want, sizeof(want), "%d,%d", i, i + 4);
        ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-7", 4, i, &sh), want);
    }
    /* 4 cores for 3 ranks: blocks of 1, 1 and 2 */
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-7", 3, 0, &sh), "0,4");
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-7", 3, 1, &sh), "1,5");
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-7", 3, 2, &sh), "2-3,6-7");
    rm_box();
}

TEST(the_affinity_mask_narrows_and_extra_ranks_share)
{
    int sh;
    smt_box();
    /* taskset -c 0,1,4,5 (or a cgroup): two cores to share */
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-1,4-5", 2, 0, &sh), "0,4");
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-1,4-5", 2, 1, &sh), "1,5");
    /* one thread of each core allowed: a core is that thread */
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-3", 4, 3, &sh), "3");
    /* 8 ranks on 4 cores: two per core, side by side */
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-7", 8, 0, &sh), "0,4");
    ASSERT_EQ(sh, 2);
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-7", 8, 1, &sh), "0,4");
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-7", 8, 7, &sh), "3,7");
    ASSERT_EQ(sh, 2);
    /* 3 ranks on 2 cores: ranks 0 and 1 share core 0, rank 2 has core 1 alone */
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-1,4-5", 3, 1, &sh), "0,4");
    ASSERT_EQ(sh, 2);
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-1,4-5", 3, 2, &sh), "1,5");
    ASSERT_EQ(sh, 1);
    cpu_set_t none, out;
    int units;
    CPU_ZERO(&none);
    ASSERT_EQ(ddp__cpubind_rank(DDP__BIND_CORE, root, &none, 2, 0, &out, &sh, &units), -1);
    rm_box();
}

TEST(numa_nodes_go_to_blocks_of_ranks)
{
    int sh;
    smt_box();
    ASSERT_STREQ(rank_cpus(DDP__BIND_NUMA, "0-7", 4, 0, &sh), "0-1,4-5");
    ASSERT_EQ(sh, 2);
    ASSERT_STREQ(rank_cpus(DDP__BIND_NUMA, "0-7", 4, 1, &sh), "0-1,4-5");
    ASSERT_STREQ(rank_cpus(DDP__BIND_NUMA, "0-7", 4, 3, &sh), "2-3,6-7");
    ASSERT_STREQ(rank_cpus(DDP__BIND_NUMA, "0-7", 1, 0, &sh), "0-7");
    ASSERT_EQ(sh, 1);
    /* a mask inside node 1: one node to share */
    ASSERT_STREQ(rank_cpus(DDP__BIND_NUMA, "2-3", 2, 1, &sh), "2-3");
    ASSERT_EQ(sh, 2);
    rm_box();
}

TEST(without_sysfs_each_cpu_is_a_core_and_all_one_node)
{
    int sh;
    snprintf(root, sizeof(root), "/nonexistent/ddp-cpubind");
    ASSERT_STREQ(rank_cpus(DDP__BIND_CORE, "0-3", 2, 1, &sh), "2-3");
    ASSERT_STREQ(rank_cpus(DDP__BIND_NUMA, "0-3", 2, 1, &sh), "0-3");
    ASSERT_EQ(sh, 2);
}
