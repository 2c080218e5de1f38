/* How many CPUs this process can keep busy, their L2 cache, and the kernel they run on
 * (common/cpus.c). */
#ifndef DDP_COMMON_CPUS_H
#define DDP_COMMON_CPUS_H

#include <stddef.h>

/* The CPUs of the process's affinity mask, fewer where its cgroup has a CPU bandwidth quota
 * (a container given 2 CPUs of a 64-CPU host counts 2): for policies that must not start more
 * busy threads than there are CPUs to run them (the reducer's overlap, the shared-memory
 * all-reduce's helper threads). At least 1. */
int ddp_usable_cpus(void);

/* The quota part, from the cgroup files under root ("" for the real ones) and proc_cgroup
 * (the text of /proc/self/cgroup): the tightest quota of the process's cgroup and its
 * parents, in CPUs rounded up; 0 when there is none. cgroup v2's cpu.max, v1's
 * cpu.cfs_quota_us over cpu.cfs_period_us. */
int ddp__cgroup_cpu_quota(const char *root, const char *proc_cgroup);

/* Bytes of CPU 0's level-2 cache (its data or unified one), from sysfs under root ("" for the
 * real one): for sizes that should fit it. CPU 0 on every caller, not the CPU it runs on, so that
 * every process of a machine reads the same size (a hybrid CPU's cores have L2s of their own
 * sizes). 0 where it cannot be read. */
size_t ddp__l2_bytes(const char *root);

/* The running kernel's boot id (/proc/sys/kernel/random/boot_id under root, "" for the real one:
 * 36 characters, the same in every container and network namespace of one machine's kernel, and
 * new at each boot) into out (at least 37 bytes), or "-" where it cannot be read. */
void ddp__boot_id(const char *root, char *out, size_t n);

#endif
