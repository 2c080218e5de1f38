/*
 * What a node gives its ranks to run on: its GPUs (as CUDA will show them to the ranks) and its
 * CPUs. Counted by each node's agent and sent to the launcher in its HELLO
 * (cli/proto/agent_proto.h), so that `nproc_per_node: gpu|cpu|auto` is counted on every node, as
 * torchrun counts on the node it runs on. A leaf (cli/sys/devices.c).
 */
#ifndef DDP_CLI_DEVICES_H
#define DDP_CLI_DEVICES_H

#include <stdint.h>

/* What one node's environment says, each source apart, so that the launcher can put the
 * job's env and the exported shell variables before the node's own (cli/supervisor/rounds.c). */
struct ddp__node_counts {
    int32_t slurm_gpus;   /* SLURM_GPUS_ON_NODE as a count; -1 unset or not a count */
    int32_t cvd_gpus;     /* the devices CUDA_VISIBLE_DEVICES lists; -1 unset */
    uint32_t driver_gpus; /* the NVIDIA driver's (/proc/driver/nvidia/gpus) */
    uint32_t cpus;        /* in the process's CPU affinity (as nproc(1)) */
};

/* SLURM_GPUS_ON_NODE's value as a count (1..4096), or -1 (NULL, empty, not a count). */
int ddp__slurm_gpus_of(const char *v);
/* The devices a CUDA_VISIBLE_DEVICES value lists ("" and -1: none), or -1 for NULL. */
int ddp__cvd_gpus_of(const char *v);
/* This process's counts, from its environment, the driver and its affinity. */
void ddp__counts_here(struct ddp__node_counts *c);
/* The GPUs the counts give ranks: SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES's devices,
 * else the driver's; 0 for none (at most 4096). */
int ddp__counts_gpus(const struct ddp__node_counts *c);
/* ddp__counts_gpus of ddp__counts_here: the GPUs this machine gives its ranks. */
int ddp__gpus_here(void);

/* nproc_per_node's names, as torchrun takes them. */
enum ddp_nproc_kind {
    DDP_NPROC_NUMBER = 0, /* a number */
    DDP_NPROC_GPU,        /* a rank per GPU; none is an error */
    DDP_NPROC_CPU,        /* a rank per CPU */
    DDP_NPROC_AUTO,       /* a rank per GPU, else per CPU */
};
/* "gpu", "cpu", "auto" (nproc_per_node's words), "" for a number. */
const char *ddp__nproc_kind_name(enum ddp_nproc_kind kind);
/* The ranks a node with these counts runs for kind (GPU, CPU or AUTO); 0 for GPU without
 * any GPU. */
int ddp__counts_slots(const struct ddp__node_counts *c, enum ddp_nproc_kind kind);

#endif
