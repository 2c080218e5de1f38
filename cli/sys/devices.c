/* What a node gives its ranks to run on (cli/sys/devices.h). */
#include "cli/sys/devices.h"

#include <dirent.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define MAX_COUNT 4096

int ddp__slurm_gpus_of(const char *v)
{
    char *end;
    long n = v && *v ? strtol(v, &end, 10) : 0;
    return v && *v && *end == '\0' && n > 0 && n <= MAX_COUNT ? (int)n : -1;
}

int ddp__cvd_gpus_of(const char *v)
{
    if (!v)
        return -1;
    /* what CUDA will show the ranks, all of it ("" and -1: none) */
    if (!*v || strcmp(v, "-1") == 0 || strcmp(v, "NoDevFiles") == 0)
        return 0;
    int k = 1;
    for (const char *c = v; *c && k < MAX_COUNT; c++)
        k += *c == ',';
    return k;
}

/* The NVIDIA driver's own list: a folder per GPU, named by its PCI address. */
static int driver_gpus(void)
{
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    int k = 0;
    for (struct dirent *e; d && (e = readdir(d)) && k < MAX_COUNT;)
        k += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return k;
}

void ddp__counts_here(struct ddp__node_counts *c)
{
    cpu_set_t set;
    c->slurm_gpus = ddp__slurm_gpus_of(getenv("SLURM_GPUS_ON_NODE"));
    c->cvd_gpus = ddp__cvd_gpus_of(getenv("CUDA_VISIBLE_DEVICES"));
    c->driver_gpus = (uint32_t)driver_gpus();
    c->cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? (uint32_t)CPU_COUNT(&set) : 1;
}

int ddp__counts_gpus(const struct ddp__node_counts *c)
{
    long n = c->slurm_gpus > 0  ? (long)c->slurm_gpus
             : c->cvd_gpus >= 0 ? (long)c->cvd_gpus
                                : (long)c->driver_gpus;
    return n > MAX_COUNT ? MAX_COUNT : (int)n;
}

int ddp__gpus_here(void)
{
    struct ddp__node_counts c;
    ddp__counts_here(&c);
    return ddp__counts_gpus(&c);
}

const char *ddp__nproc_kind_name(enum ddp_nproc_kind kind)
{
    return kind == DDP_NPROC_GPU ? "gpu" : kind == DDP_NPROC_CPU ? "cpu" : kind ? "auto" : "";
}

int ddp__counts_slots(const struct ddp__node_counts *c, enum ddp_nproc_kind kind)
{
    int gpus = ddp__counts_gpus(c);
    long cpus = c->cpus < 1 ? 1 : c->cpus > MAX_COUNT ? MAX_COUNT : c->cpus;
    if (kind == DDP_NPROC_CPU || (kind == DDP_NPROC_AUTO && gpus == 0))
        return (int)cpus;
    return gpus;
}
