/*
 * The CPUs a process can keep busy. The affinity mask says which CPUs it may run on; a cgroup
 * CPU bandwidth quota (docker --cpus, a Kubernetes CPU limit, systemd's CPUQuota) says for how
 * much of their time, and a container usually sees every CPU of its host in its mask. Both
 * count, as a runtime sizing its thread pools does.
 */
#include "common/cpus.h"

#include <ctype.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

#define PATH_BYTES 4096

/* The first line of root followed by rel, false where it cannot be read. */
static bool read_line(const char *root, const char *rel, char *buf, size_t len)
{
    char path[PATH_BYTES + 32];
    int n = snprintf(path, sizeof(path), "%s%s", root, rel);
    FILE *f = n > 0 && n < (int)sizeof(path) ? fopen(path, "r") : NULL;
    if (!f)
        return false;
    bool ok = fgets(buf, (int)len, f) != NULL;
    fclose(f);
    return ok;
}

/* CPUs (rounded up) of the quota in the cgroup folder dir, 0 for none or unreadable. */
static int quota_in(const char *dir, int v2)
{
    char buf[128];
    long long q = -1, p = 0;
    if (v2) {
        char max[32] = "";
        if (!read_line(dir, "/cpu.max", buf, sizeof(buf)))
            return 0;
        if (sscanf(buf, "%31s %lld", max, &p) == 2 && strcmp(max, "max") != 0)
            q = atoll(max);
    } else {
        if (!read_line(dir, "/cpu.cfs_quota_us", buf, sizeof(buf)))
            return 0;
        q = atoll(buf);
        if (read_line(dir, "/cpu.cfs_period_us", buf, sizeof(buf)))
            p = atoll(buf);
    }
    if (q <= 0 || p <= 0)
        return 0;
    long long n = (q + p - 1) / p;
    return n > 1 << 20 ? 1 << 20 : (int)n;
}

/* Whether a v1 hierarchy's controller list (cpu,cpuacct) has the cpu controller. */
static int has_cpu(const char *ctrl)
{
    for (const char *t = ctrl; t; t = strchr(t, ',') ? strchr(t, ',') + 1 : NULL)
        if (strncmp(t, "cpu", 3) == 0 && (t[3] == ',' || t[3] == '\0'))
            return 1;
    return 0;
}

/* The tightest quota from dir/rel up to dir itself (the hierarchy's root as mounted). */
static int walk(const char *mnt, const char *rel, int v2)
{
    char dir[PATH_BYTES];
    int best = 0;
    int n = snprintf(dir, sizeof(dir), "%s%s", mnt, rel);
    if (n < 0 || n >= (int)sizeof(dir))
        return 0;
    size_t base = strlen(mnt);
    for (;;) {
        int q = quota_in(dir, v2);
        if (q > 0 && (best == 0 || q < best))
            best = q;
        char *slash = strrchr(dir + base, '/');
        if (!slash)
            break;
        *slash = '\0';
    }
    return best;
}

int ddp__cgroup_cpu_quota(const char *root, const char *proc_cgroup)
{
    int best = 0;
    const char *line = proc_cgroup;
    while (line && *line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char l[4096];
        if (len < sizeof(l)) {
            memcpy(l, line, len);
            l[len] = '\0';
            char *c1 = strchr(l, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (c2) {
                *c1 = *c2 = '\0'; /* l: the hierarchy's number */
                const char *ctrl = c1 + 1, *rel = c2 + 1;
                char mnt[PATH_BYTES / 2];
                int q = 0;
                if (strcmp(l, "0") == 0 && !*ctrl) { /* v2: the unified hierarchy */
                    snprintf(mnt, sizeof(mnt), "%s/sys/fs/cgroup", root);
                    q = walk(mnt, strcmp(rel, "/") == 0 ? "" : rel, 1);
                } else if (has_cpu(ctrl)) {
                    /* v1: the hierarchy with the cpu controller, mounted under its controllers'
                     * names (cpu,cpuacct) or cpu */
                    snprintf(mnt, sizeof(mnt), "%s/sys/fs/cgroup/%s", root, ctrl);
                    if (access(mnt, F_OK) != 0)
                        snprintf(mnt, sizeof(mnt), "%s/sys/fs/cgroup/cpu", root);
                    q = walk(mnt, strcmp(rel, "/") == 0 ? "" : rel, 0);
                }
                if (q > 0 && (best == 0 || q < best))
                    best = q;
            }
        }
        line = end ? end + 1 : NULL;
    }
    return best;
}

size_t ddp__l2_bytes(const char *root)
{
    static const char dir[] = "/sys/devices/system/cpu/cpu0/cache/index";
    char rel[96], buf[64];
    for (int i = 0; i < 16; i++) {
        snprintf(rel, sizeof(rel), "%s%d/level", dir, i);
        if (!read_line(root, rel, buf, sizeof(buf)))
            break; /* index0, 1, ... without a gap */
        if (atoi(buf) != 2)
            continue;
        snprintf(rel, sizeof(rel), "%s%d/type", dir, i);
        if (read_line(root, rel, buf, sizeof(buf)) && strncmp(buf, "Instruction", 11) == 0)
            continue;
        snprintf(rel, sizeof(rel), "%s%d/size", dir, i);
        if (!read_line(root, rel, buf, sizeof(buf)))
            return 0;
        char *end;
        unsigned long long v = strtoull(buf, &end, 10); /* "2048K" */
        int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : -1;
        if (end == buf || shift < 0 || v > (1ull << 20))
            return 0;
        return (size_t)(v << shift);
    }
    return 0;
}

int ddp_usable_cpus(void)
{
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0) {
        long k = sysconf(_SC_NPROCESSORS_ONLN);
        n = k > 0 ? (int)k : 1;
    }
    char text[8192];
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (f) {
        size_t len = fread(text, 1, sizeof(text) - 1, f);
        text[len] = '\0';
        fclose(f);
        int q = ddp__cgroup_cpu_quota("", text);
        if (q > 0 && q < n)
            n = q;
    }
    return n < 1 ? 1 : n;
}

void ddp__boot_id(const char *root, char *out, size_t n)
{
    char buf[64];
    size_t len = 0;
    if (read_line(root, "/proc/sys/kernel/random/boot_id", buf, sizeof(buf)))
        while (len < 36 && (isxdigit((unsigned char)buf[len]) || buf[len] == '-'))
            len++;
    if (len != 36 || (buf[36] != '\n' && buf[36] != '\0') || n <= 36)
        snprintf(out, n, "-");
    else
        snprintf(out, n, "%.36s", buf);
}
