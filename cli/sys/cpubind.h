/*
 * Binding a node's ranks to CPUs (the job key bind_to, ddprun --bind-to): which CPUs local rank
 * i of n may run on. A leaf: reads sysfs, calls no sibling.
 *
 * The agent's own CPUs (its affinity mask: what Slurm, a cgroup or taskset left it) are cut
 * into units: physical cores (a core's hardware threads stay together) for "core", NUMA nodes
 * for "numa". With n ranks and U units, rank i gets units [i*U/n, (i+1)*U/n) when n <= U (a
 * contiguous block each, as DeepSpeed's --bind_cores_to_rank; Open MPI's --bind-to core gives
 * one core each), else unit i*U/n, shared by the ranks that map to it (oversubscribed).
 */
#ifndef DDP_CLI_CPUBIND_H
#define DDP_CLI_CPUBIND_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>

enum ddp__cpubind { DDP__BIND_NONE = 0, DDP__BIND_CORE = 1, DDP__BIND_NUMA = 2 };

/* "none", "core" or "numa": the mode, or -1 for anything else. */
int ddp__cpubind_parse(const char *s);
const char *ddp__cpubind_name(int mode);

/*
 * The CPUs of local rank `local` of `n` in `mode` (not NONE), from `allowed` and the topology
 * under `sysroot` (NULL: /sys/devices/system; tests pass a tree of their own). Sets *out,
 * *sharers (how many of the n ranks share those CPUs: 1 unless ranks outnumber units) and
 * *units (how many units the allowed CPUs make). Where sysfs says nothing (no topology files,
 * no NUMA nodes) each CPU is its own core and all CPUs one node. 0, or -1 when `allowed` is
 * empty.
 */
int ddp__cpubind_rank(int mode, const char *sysroot, const cpu_set_t *allowed, int n, int local,
                      cpu_set_t *out, int *sharers, int *units);

/*
 * In a rank's process before exec: binds it to cpus and sets DDPRUN_CPU_BIND (the mode) and
 * DDPRUN_CPU_SHARERS; with DDP__BIND_NONE unsets both. Where the kernel refuses, says so on
 * stderr and leaves the rank unbound.
 */
void ddp__cpubind_apply(int mode, const cpu_set_t *cpus, int sharers, int local_rank);

/* "0-3,8,10-11": writes a CPU list as Linux prints one (cpulist format); "" when empty. */
void ddp__cpubind_list(const cpu_set_t *set, char *buf, size_t len);
/* Parses such a list into *set (cleared first). false on malformed text. */
bool ddp__cpubind_parse_list(const char *s, cpu_set_t *set);

#endif
