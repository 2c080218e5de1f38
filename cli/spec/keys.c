/* The job file's keys (cli/spec/keys.h): the table cli/spec/keys.def makes, and the loader's
 * generic part. */
#include "cli/spec/keys.h"
#include "cli/spec/job.h"
#include "cli/spec/ytree.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

const struct ddp__key ddp__keys[DDP_K__COUNT] = {
#define DDP_SECT(id, p) [DDP_K_##id] = {.path = p, .kind = DDP_KK_SECT},
#define DDP_CUSTOM(id, p, d) [DDP_K_##id] = {.path = p, .kind = DDP_KK_CUSTOM, .dflt = d},
#define DDP_VAL(id, p, k, field, l, h, d, u)                                                       \
    [DDP_K_##id] = {.path = p,                                                                     \
                    .kind = DDP_KK_##k,                                                            \
                    .off = offsetof(struct ddp_job, field),                                        \
                    .lo = l,                                                                       \
                    .hi = h,                                                                       \
                    .dflt = d,                                                                     \
                    .unset = u},
#include "cli/spec/keys.def"
#undef DDP_SECT
#undef DDP_CUSTOM
#undef DDP_VAL
};

const char *ddp__key_name(int id)
{
    const char *dot = strrchr(ddp__keys[id].path, '.');
    return dot ? dot + 1 : ddp__keys[id].path;
}

int ddp__key_parent(int id)
{
    const char *p = ddp__keys[id].path, *dot = strrchr(p, '.');
    if (!dot)
        return DDP_K_TOP;
    for (int k = id - 1; k >= 0; k--)
        if (strlen(ddp__keys[k].path) == (size_t)(dot - p) &&
            strncmp(ddp__keys[k].path, p, (size_t)(dot - p)) == 0)
            return k;
    return DDP_K_TOP; /* a table without its section: 09-structure's check says so */
}

struct ddp_ynode *ddp__key_get(const struct ddp_ynode *m, int id)
{
    return m ? ddp__ytree_get(m, ddp__key_name(id)) : NULL;
}

int ddp__key_check(const struct ddp__jctx *c, const struct ddp_ynode *m, int sect)
{
    return ddp__key_check_in(c, m, sect, sect == DDP_K_TOP ? "the job spec" : ddp__keys[sect].path);
}

int ddp__key_check_in(const struct ddp__jctx *c, const struct ddp_ynode *m, int sect,
                      const char *where)
{
    const char *names[DDP_K__COUNT + 1];
    size_t n = 0;
    for (int k = 0; k < DDP_K__COUNT; k++)
        if (ddp__key_parent(k) == sect)
            names[n++] = ddp__key_name(k);
    names[n] = NULL;
    return ddp__jv_check_keys(c, m, where, names);
}

int ddp__key_read(const struct ddp__jctx *c, const struct ddp_ynode *n, int id, struct ddp_job *j)
{
    const struct ddp__key *k = &ddp__keys[id];
    void *f = (char *)j + k->off;
    int v;
    switch (k->kind) {
    case DDP_KK_STR:
    case DDP_KK_PATH_:
        return ddp__jv_str(c, n, k->path, (char **)f);
    case DDP_KK_INT:
        if (ddp__jv_int(c, n, k->path, k->lo, k->hi, &v) < 0)
            return -1;
        *(int *)f = v;
        return 0;
    case DDP_KK_BOOL:
        return ddp__jv_bool(c, n, k->path, (bool *)f);
    case DDP_KK_DUR:
        return ddp__jv_duration(c, n, k->path, (int64_t *)f);
    case DDP_KK_DUR_POS:
        return ddp__jv_duration_pos(c, n, k->path, (int64_t *)f);
    case DDP_KK_SECT:
    case DDP_KK_CUSTOM:
        break;
    }
    return 0; /* its section's code reads it */
}

int ddp__key_read_section(const struct ddp__jctx *c, const struct ddp_ynode *m, int sect,
                          struct ddp_job *j)
{
    const struct ddp_ynode *n;
    for (int k = 0; k < DDP_K__COUNT; k++)
        if (ddp__keys[k].kind >= DDP_KK_STR && ddp__key_parent(k) == sect &&
            (n = ddp__key_get(m, k)) && ddp__key_read(c, n, k, j) < 0)
            return -1;
    return 0;
}

int ddp__key_defaults(struct ddp_job *j)
{
    struct ddp__jctx c = {.file = "keys.def"};
    for (int k = 0; k < DDP_K__COUNT; k++) {
        if (ddp__keys[k].kind < DDP_KK_STR || !ddp__keys[k].dflt)
            continue;
        struct ddp_ynode n = {.type = DDP_Y_SCALAR, .str = (char *)ddp__keys[k].dflt};
        if (ddp__key_read(&c, &n, k, j) < 0)
            return -1;
    }
    return 0;
}

int ddp__key_resolve_paths(struct ddp_job *j, const char *basedir)
{
    for (int k = 0; k < DDP_K__COUNT; k++) {
        char **f = (char **)((char *)j + ddp__keys[k].off);
        if (ddp__keys[k].kind != DDP_KK_PATH_ || !*f)
            continue;
        char *abs = ddp__jv_path(basedir, *f);
        if (!abs)
            return -1;
        free(*f);
        *f = abs;
    }
    return 0;
}
