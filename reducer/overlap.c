/* The reducer's overlap policy (see overlap.h). */
#include "reducer/overlap.h"
#include "common/cpus.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/banned.h"

bool ddp__overlap_pays(bool cuda, int world, int local_world, int sharers, int cores)
{
    if (cuda || local_world < world) /* a device, or a network between nodes */
        return true;
    return cores >= 2 * sharers;
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
    int cores = ddp_usable_cpus(), lw = ddp_pg_local_world_size(pg);
    /* How many of the node's ranks run on this rank's CPUs: all of them, unless ddprun's
     * bind_to gave each its own (DDPRUN_CPU_SHARERS: the ranks bound to the same CPUs). */
    const char *sh = getenv("DDPRUN_CPU_SHARERS");
    int sharers = sh ? atoi(sh) : lw;
    if (sharers < 1 || sharers > lw)
        sharers = lw;
    if (ddp__overlap_pays(ddp_pg_is_cuda(pg), ddp_pg_world_size(pg), lw, sharers, cores))
        return true;
    snprintf(why, len,
             "%d usable core%s for %d rank%s %s: a shared-memory all-reduce started "
             "during backward would take cores from it, so buckets start at finalize "
             "(DDP_REDUCER_OVERLAP=on to overlap anyway)",
             cores, cores == 1 ? "" : "s", sharers, sharers == 1 ? "" : "s",
             sh ? "bound to them (--bind-to)" : "on this node");
    return false;
}
