/*
 * Sub-groups of a process group (ddp_pg_new_group): the parent's ranks agree on the list and
 * learn each other's node through one all-gather on the parent; each member then forms a group
 * of its own through the parent's store (ddp_pg_init), with its place on its node counted
 * among the members there, so members on one node share memory as in any group.
 */
#include "worker/group.h"
#include "common/err.h"
#include "common/log.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* FNV-1a over the name and the list, so that ranks can compare what they were given. */
static int64_t digest(const char *name, const int *ranks, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *q = name; *q; q++)
        h = (h ^ (uint8_t)*q) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
    for (int k = 0; k < n; k++)
        for (int b = 0; b < 4; b++)
            h = (h ^ (uint8_t)((uint32_t)ranks[k] >> (8 * b))) * 1099511628211ull;
    h = (h ^ (uint64_t)(uint32_t)n) * 1099511628211ull;
    return (int64_t)(h >> 1);
}

static int fail(struct ddp_pg *pg, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct ddp_pg *pg, int r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&pg->mu);
    vsnprintf(pg->err, sizeof(pg->err), fmt, ap);
    pthread_mutex_unlock(&pg->mu);
    va_end(ap);
    DDP_ERROR(PG, "rank %d: %s", pg->rank, pg->err);
    return r;
}

int ddp_pg_new_group(struct ddp_pg *pg, const int *ranks, int n, const char *name,
                     struct ddp_pg **out)
{
    *out = NULL;
    if (!name || !*name || strlen(name) > 63 || strpbrk(name, " /\t\n"))
        return fail(pg, DDP_EINVAL,
                    "sub-group name '%s' is not 1-63 characters without spaces or slashes",
                    name ? name : "");
    /* every rank's node and digest of (name, list), gathered on the parent */
    int64_t mine[2] = {pg->node_rank, digest(name, ranks, n > 0 ? n : 0)};
    int64_t *all = malloc(sizeof(int64_t) * 2 * (size_t)pg->world);
    if (!all)
        return DDP_ENOMEM;
    int r = ddp_pg_allgather(pg, mine, all, 2, DDP_I64);
    if (r < 0) {
        free(all);
        return r;
    }
    for (int j = 0; j < pg->world; j++)
        if (all[2 * j + 1] != all[1]) {
            free(all);
            return fail(pg, DDP_EINVAL,
                        "sub-group '%s': ranks 0 and %d of the group passed different names or "
                        "rank lists",
                        name, j);
        }
    int me = -1;
    for (int k = 0; k < n; k++) {
        if (ranks[k] < 0 || ranks[k] >= pg->world) {
            free(all);
            return fail(pg, DDP_EINVAL, "sub-group '%s': rank %d is not in the group of %d", name,
                        ranks[k], pg->world);
        }
        for (int q = 0; q < k; q++)
            if (ranks[q] == ranks[k]) {
                free(all);
                return fail(pg, DDP_EINVAL, "sub-group '%s': rank %d is listed twice", name,
                            ranks[k]);
            }
        if (ranks[k] == pg->rank)
            me = k;
    }
    if (n < 1) {
        free(all);
        return fail(pg, DDP_EINVAL, "sub-group '%s': %d ranks", name, n);
    }
    if (me < 0) {
        free(all);
        return 0; /* not a member */
    }
    /* our place among the members on our node */
    int local_rank = 0, local_world = 0;
    for (int k = 0; k < n; k++)
        if (all[2 * ranks[k]] == pg->node_rank) {
            local_world++;
            local_rank += k < me;
        }
    free(all);
    char full[200];
    snprintf(full, sizeof(full), "%s/%s", pg->name, name);
    struct ddp_pg_opts o = {.timeout_ms = pg->timeout_ms,
                            .name = full,
                            .small_bytes = pg->comm.small_bytes,
                            .backend = pg->nccl ? DDP_PG_BACKEND_NCCL : DDP_PG_BACKEND_CPU};
    r = ddp_pg_init(pg->store, me, n, local_rank, local_world, pg->node_rank, &o, out);
    if (r < 0)
        return fail(pg, r, "cannot form sub-group '%s' (rank %d of %d): see the error above", name,
                    me, n);
    return 0;
}
