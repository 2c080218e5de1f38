/* The reducer's overlap policy (see overlap.h). */
#include "reducer/overlap.h"
#include "common/log.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/banned.h"

bool ddp__overlap_pays(bool cuda, int world, int local_world, int cores)
{
    if (cuda || local_world < world) /* a device, or a network between nodes */
        return true;
    return cores >= 2 * local_world;
}

static int usable_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

bool ddp__reducer_overlap(const struct ddp_pg *pg, char *why, size_t len)
{
    const char *v = getenv("DDP_REDUCER_OVERLAP");
    why[0] = '\0';
    if (v && (strcasecmp(v, "on") == 0 || strcmp(v, "1") == 0))
        return true;
    if (v && (strcasecmp(v, "off") == 0 || strcmp(v, "0") == 0)) {
        snprintf(why, len, "DDP_REDUCER_OVERLAP=%s", v);
        return false;
    }
    if (v && *v && strcasecmp(v, "auto") != 0)
        DDP_WARN(REDUCER, "DDP_REDUCER_OVERLAP='%s' is not on, off or auto; using auto", v);
    int cores = usable_cores(), lw = ddp_pg_local_world_size(pg);
    if (ddp__overlap_pays(ddp_pg_is_cuda(pg), ddp_pg_world_size(pg), lw, cores))
        return true;
    snprintf(why, len,
             "%d usable core%s for %d ranks on this node: a shared-memory all-reduce started "
             "during backward would take cores from it, so buckets start at finalize "
             "(DDP_REDUCER_OVERLAP=on to overlap anyway)",
             cores, cores == 1 ? "" : "s", lw);
    return false;
}
