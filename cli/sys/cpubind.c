/* Binding a node's ranks to CPUs (see cpubind.h). */
#include "cli/sys/cpubind.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static const char *const names[] = {"none", "core", "numa"};

int ddp__cpubind_parse(const char *s)
{
    for (int i = 0; i < 3; i++)
        if (s && strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

const char *ddp__cpubind_name(int mode)
{
    return mode >= 0 && mode < 3 ? names[mode] : "?";
}

bool ddp__cpubind_parse_list(const char *s, cpu_set_t *set)
{
    CPU_ZERO(set);
    while (*s && *s != '\n') {
        char *end;
        if (!isdigit((unsigned char)*s))
            return false;
        unsigned long a = strtoul(s, &end, 10), b = a;
        if (*end == '-') {
            if (!isdigit((unsigned char)end[1]))
                return false;
            b = strtoul(end + 1, &end, 10);
        }
        if (a > b || b >= CPU_SETSIZE)
            return false;
        for (unsigned long c = a; c <= b; c++)
            CPU_SET(c, set);
        s = end;
        if (*s == ',')
            s++;
        else if (*s && *s != '\n')
            return false;
    }
    return true;
}

void ddp__cpubind_list(const cpu_set_t *set, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, set))
            continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set))
            e++;
        int w = e > c ? snprintf(buf + at, len - at, "%s%d-%d", at ? "," : "", c, e)
                      : snprintf(buf + at, len - at, "%s%d", at ? "," : "", c);
        if (w < 0 || (size_t)w >= len - at) {
            buf[at] = '\0'; /* cut at the last whole range */
            return;
        }
        at += (size_t)w;
        c = e;
    }
}

/* The CPU list in a sysfs file, or false when it cannot be read. */
static bool read_list(const char *path, cpu_set_t *set)
{
    char line[4096];
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool ok = fgets(line, sizeof(line), f) && ddp__cpubind_parse_list(line, set);
    fclose(f);
    return ok;
}

/* Each unit is a set; units are kept in order. */
struct units {
    cpu_set_t *u;
    int n;
};

static void add_unit(struct units *us, const cpu_set_t *s)
{
    if (CPU_COUNT(s) > 0 && us->n < CPU_SETSIZE)
        us->u[us->n++] = *s;
}

/* Physical cores: a CPU and its hardware-thread siblings that are allowed. */
static void cores(const char *root, const cpu_set_t *allowed, struct units *us)
{
    cpu_set_t taken, sib, unit;
    CPU_ZERO(&taken);
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, allowed) || CPU_ISSET(c, &taken))
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/cpu/cpu%d/topology/thread_siblings_list", root, c);
        if (!read_list(path, &sib))
            CPU_ZERO(&sib);
        CPU_SET(c, &sib);
        CPU_AND(&unit, &sib, allowed);
        cpu_set_t rest;
        CPU_XOR(&rest, &unit, &taken); /* siblings listed under another core stay there */
        CPU_AND(&unit, &unit, &rest);
        CPU_OR(&taken, &taken, &unit);
        add_unit(us, &unit);
    }
}

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

/* NUMA nodes, in node order; allowed CPUs in no node form one more unit. */
static void numa_nodes(const char *root, const cpu_set_t *allowed, struct units *us)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/node", root);
    int ids[1024], nid = 0;
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d)) && nid < 1024;) {
        if (strncmp(e->d_name, "node", 4) == 0 && isdigit((unsigned char)e->d_name[4]))
            ids[nid++] = atoi(e->d_name + 4);
    }
    if (d)
        closedir(d);
    qsort(ids, (size_t)nid, sizeof(int), cmp_int);
    cpu_set_t left = *allowed, s, unit;
    for (int k = 0; k < nid; k++) {
        snprintf(path, sizeof(path), "%s/node/node%d/cpulist", root, ids[k]);
        if (!read_list(path, &s))
            continue;
        CPU_AND(&unit, &s, &left);
        CPU_XOR(&left, &left, &unit);
        add_unit(us, &unit);
    }
    add_unit(us, &left);
}

int ddp__cpubind_rank(int mode, const char *sysroot, const cpu_set_t *allowed, int n, int local,
                      cpu_set_t *out, int *sharers, int *units)
{
    const char *root = sysroot ? sysroot : "/sys/devices/system";
    struct units us = {.u = calloc(CPU_SETSIZE, sizeof(cpu_set_t)), .n = 0};
    CPU_ZERO(out);
    *sharers = 1;
    *units = 0;
    if (!us.u || CPU_COUNT(allowed) == 0 || n < 1 || local < 0 || local >= n) {
        free(us.u);
        return -1;
    }
    if (mode == DDP__BIND_NUMA)
        numa_nodes(root, allowed, &us);
    else
        cores(root, allowed, &us);
    long U = us.n, i = local, N = n;
    *units = us.n;
    if (N <= U) {
        for (long k = i * U / N; k < (i + 1) * U / N; k++)
            CPU_OR(out, out, &us.u[k]);
    } else {
        long mine = i * U / N;
        *out = us.u[mine];
        *sharers = 0;
        for (long j = 0; j < N; j++)
            *sharers += j * U / N == mine;
    }
    free(us.u);
    return 0;
}

void ddp__cpubind_apply(int mode, const cpu_set_t *cpus, int sharers, int local_rank)
{
    if (mode == DDP__BIND_NONE) {
        unsetenv("DDPRUN_CPU_BIND");
        unsetenv("DDPRUN_CPU_SHARERS");
        return;
    }
    char n[16];
    snprintf(n, sizeof(n), "%d", sharers);
    setenv("DDPRUN_CPU_BIND", ddp__cpubind_name(mode), 1);
    setenv("DDPRUN_CPU_SHARERS", n, 1);
    if (sched_setaffinity(0, sizeof(*cpus), cpus) != 0) {
        char list[256];
        ddp__cpubind_list(cpus, list, sizeof(list));
        fprintf(stderr, "ddprun agent: cannot bind local rank %d to CPUs %s: %s; it runs unbound\n",
                local_rank, list, strerror(errno));
    }
}
