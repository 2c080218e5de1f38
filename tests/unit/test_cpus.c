/*
 * The CPUs a process can keep busy (common/cpus.c): cgroup CPU quotas read from cgroup trees
 * written here (v2's cpu.max, v1's cfs quota and period under cpu,cpuacct or cpu), the
 * tightest of a cgroup and its parents, a container whose own cgroup path is not in its view,
 * no quota, malformed /proc/self/cgroup text; and the real machine's count against its
 * affinity mask. CPU 0's L2 size from a sysfs cache folder written here.
 */
#include "common/cpus.h"
#include "test.h"
#include "tree.h"

#include <sched.h>
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

static void box(void)
{
    ddp_tree_make(root, sizeof(root), "ddp-cpus");
}

static void rm_box(void)
{
    ddp_tree_remove(root);
}

TEST(cgroup_v2_quota_is_the_tightest_of_the_cgroup_and_its_parents_rounded_up)
{
    box();
    put("sys/fs/cgroup/cpu.max", "max 100000");
    put("sys/fs/cgroup/job/cpu.max", "250000 100000");
    put("sys/fs/cgroup/job/rank/cpu.max", "max 100000");
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "0::/job/rank\n"), 3);
    put("sys/fs/cgroup/job/rank/cpu.max", "50000 100000"); /* half a CPU: 1 */
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "0::/job/rank\n"), 1);
    put("sys/fs/cgroup/job/rank/cpu.max", "800000 100000"); /* the parent's 3 is tighter */
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "0::/job/rank\n"), 3);
    /* a container's namespace: its cgroup is the root it sees */
    put("sys/fs/cgroup/cpu.max", "200000 100000");
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "0::/\n"), 2);
    rm_box();
}

TEST(no_quota_anywhere_is_zero)
{
    box();
    put("sys/fs/cgroup/cpu.max", "max 100000");
    put("sys/fs/cgroup/a/cpu.max", "max 100000");
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "0::/a\n"), 0);
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "0::/not/there\n"), 0);
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000");
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "3:cpu,cpuacct:/\n"), 0);
    rm_box();
}

TEST(cgroup_v1_quota_under_cpu_cpuacct_or_cpu_and_from_the_mount_root_in_a_container)
{
    box();
    put("sys/fs/cgroup/cpu,cpuacct/docker/x/cpu.cfs_quota_us", "150000");
    put("sys/fs/cgroup/cpu,cpuacct/docker/x/cpu.cfs_period_us", "100000");
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "9:memory:/docker/x\n2:cpu,cpuacct:/docker/x\n"), 2);
    /* the host's path of the cgroup, not in the container's view: its mount root holds it */
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "400000");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000");
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "2:cpu,cpuacct:/docker/elsewhere\n"), 4);
    rm_box();
    /* mounted as cpu alone, named cpuacct,cpu in the list */
    box();
    put("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "100000");
    put("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000");
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "5:cpuacct,cpu:/\n"), 1);
    /* a hybrid machine: the v2 and the v1 quotas both count */
    put("sys/fs/cgroup/cpu.max", "300000 100000");
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "0::/\n5:cpuacct,cpu:/\n"), 1);
    /* controllers that only look like cpu */
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "6:cpuset:/\n7:cpuacct:/\n"), 0);
    rm_box();
}

TEST(malformed_proc_cgroup_text_is_no_quota)
{
    box();
    put("sys/fs/cgroup/cpu.max", "garbage");
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, ""), 0);
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "garbage"), 0);
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "1:cpu\n::\n0::\n"), 0);
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "0::/\n"), 0);
    put("sys/fs/cgroup/cpu.max", "0 100000");
    ASSERT_EQ(ddp__cgroup_cpu_quota(root, "0::/\n"), 0);
    rm_box();
}

TEST(this_machine_counts_at_least_one_cpu_and_no_more_than_its_affinity)
{
    cpu_set_t set;
    ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
    int n = ddp_usable_cpus();
    ASSERT_TRUE(n >= 1);
    ASSERT_TRUE(n <= CPU_COUNT(&set));
}

/* A CPU 0 cache folder as sysfs has it: index0 L1 data, index1 L1 instruction, index2 L2,
 * index3 L3. */
static void caches(const char *l2_type, const char *l2_size)
{
    static const char d[] = "sys/devices/system/cpu/cpu0/cache/index";
    char rel[96];
    const char *level[] = {"1", "1", "2", "3"},
               *type[] = {"Data", "Instruction", l2_type, "Unified"};
    const char *size[] = {"48K", "32K", l2_size, "307200K"};
    for (int i = 0; i < 4; i++) {
        snprintf(rel, sizeof(rel), "%s%d/level", d, i);
        put(rel, level[i]);
        snprintf(rel, sizeof(rel), "%s%d/type", d, i);
        put(rel, type[i]);
        snprintf(rel, sizeof(rel), "%s%d/size", d, i);
        put(rel, size[i]);
    }
}

TEST(l2_size_is_cpu0s_level_2_data_or_unified_cache_from_sysfs)
{
    box();
    caches("Unified", "2048K\n");
    ASSERT_EQ(ddp__l2_bytes(root), (size_t)2 << 20);
    caches("Data", "512K");
    ASSERT_EQ(ddp__l2_bytes(root), (size_t)512 << 10);
    caches("Unified", "1M");
    ASSERT_EQ(ddp__l2_bytes(root), (size_t)1 << 20);
    /* unreadable sizes: none */
    caches("Unified", "big");
    ASSERT_EQ(ddp__l2_bytes(root), 0u);
    caches("Unified", "2048Q");
    ASSERT_EQ(ddp__l2_bytes(root), 0u);
    caches("Unified", "99999999999999999999K");
    ASSERT_EQ(ddp__l2_bytes(root), 0u);
    rm_box();
    /* an L2 that holds instructions only is not it; no L2 at all, no cache folder: none */
    box();
    caches("Instruction", "2048K");
    ASSERT_EQ(ddp__l2_bytes(root), 0u);
    rm_box();
    box();
    put("sys/devices/system/cpu/cpu0/cache/index0/level", "1");
    put("sys/devices/system/cpu/cpu0/cache/index0/size", "32K");
    ASSERT_EQ(ddp__l2_bytes(root), 0u);
    rm_box();
    box();
    ASSERT_EQ(ddp__l2_bytes(root), 0u);
    rm_box();
}

/* The kernel's boot id: 36 characters of hex digits and dashes, with or without the newline;
 * anything else, or no file, is "-" (never taken as alike); the real one is 36 characters. */
TEST(boot_id_is_the_kernels_36_characters_or_a_dash)
{
    char id[40];
    box();
    put("proc/sys/kernel/random/boot_id", "0f3c5a2e-9b1d-4c8e-a7f6-1d2e3f4a5b6c\n");
    ddp__boot_id(root, id, sizeof(id));
    ASSERT_STREQ(id, "0f3c5a2e-9b1d-4c8e-a7f6-1d2e3f4a5b6c");
    put("proc/sys/kernel/random/boot_id", "0f3c5a2e-9b1d-4c8e-a7f6-1d2e3f4a5b6c");
    ddp__boot_id(root, id, sizeof(id));
    ASSERT_STREQ(id, "0f3c5a2e-9b1d-4c8e-a7f6-1d2e3f4a5b6c");
    const char *bad[] = {"0f3c5a2e-9b1d-4c8e-a7f6-1d2e3f4a5b6\n",
                         "0f3c5a2e-9b1d-4c8e-a7f6-1d2e3f4a5b6c7\n",
                         "0f3c5a2e 9b1d-4c8e-a7f6-1d2e3f4a5b6c\n", "\n", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        put("proc/sys/kernel/random/boot_id", bad[i]);
        ddp__boot_id(root, id, sizeof(id));
        ASSERT_STREQ(id, "-");
    }
    put("proc/sys/kernel/random/boot_id", "0f3c5a2e-9b1d-4c8e-a7f6-1d2e3f4a5b6c\n");
    ddp__boot_id(root, id, 36); /* no room for it */
    ASSERT_STREQ(id, "-");
    rm_box();
    box();
    ddp__boot_id(root, id, sizeof(id));
    ASSERT_STREQ(id, "-");
    rm_box();
    ddp__boot_id("", id, sizeof(id));
    ASSERT_EQ(strlen(id), 36u);
}
