/*
 * The reducer's inputs checked at creation (reducer/reducer.c calls these): its sizes from the
 * environment, and that every rank registers the same parameters, by count and by dtype and
 * shape (on a mismatch every rank reports the same first offender, by rank and parameter).
 */
#include "reducer/check.h"
#include "reducer/staged.h"
#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define DESC_WORDS (3 + DDP_PARAM_MAX_DIMS) /* count, dtype, ndim, shape */

size_t ddp__reducer_env_mib(const char *name, size_t dflt)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return dflt;
    double mb = strtod(v, &end);
    if (*end || mb < 0) {
        DDP_WARN(REDUCER, "%s='%s' is not a size in MiB; using %zu bytes", name, v, dflt);
        return dflt;
    }
    size_t b = (size_t)(mb * (1u << 20));
    return b ? b : 1;
}

static void describe(const struct ddp_param *p, char *out, size_t len)
{
    static const char *const dn[] = {"float32", "float64", "bfloat16", "float16", "int32", "int64"};
    int n = snprintf(out, len, "%s [", (unsigned)p->dtype <= DDP_I64 ? dn[p->dtype] : "?");
    if (p->ndim == 0)
        n += snprintf(out + n, len - (size_t)n, "%zu", p->count);
    for (int d = 0; d < p->ndim && (size_t)n < len; d++)
        n += snprintf(out + n, len - (size_t)n, "%s%lld", d ? ", " : "", (long long)p->shape[d]);
    if ((size_t)n < len)
        snprintf(out + n, len - (size_t)n, "]");
}

static void desc_words(const struct ddp_param *p, int64_t *w)
{
    w[0] = (int64_t)p->count;
    w[1] = p->dtype;
    w[2] = p->ndim;
    for (int d = 0; d < DDP_PARAM_MAX_DIMS; d++)
        w[3 + d] = d < p->ndim ? p->shape[d] : 0;
}

int ddp__reducer_check_params(struct ddp_pg *pg, const struct ddp_param *ps, size_t n, char *err,
                              size_t errlen)
{
    int world = ddp_pg_world_size(pg), rc;
    int64_t mine = (int64_t)n, *counts = malloc((size_t)world * sizeof(int64_t));
    int64_t *all = NULL, *my = NULL;
    if (!counts)
        return DDP_ENOMEM;
    if ((rc = ddp__reducer_staged(pg, STAGED_ALLGATHER, &mine, counts, 1, DDP_I64, DDP_SUM)) < 0) {
        snprintf(err, errlen, "exchanging parameter counts failed: %s", ddp_pg_last_error(pg));
        goto out;
    }
    for (int k = 1; k < world; k++)
        if (counts[k] != counts[0]) {
            snprintf(err, errlen, "rank %d registers %lld parameters but rank 0 registers %lld", k,
                     (long long)counts[k], (long long)counts[0]);
            rc = DDP_EINVAL;
            goto out;
        }
    size_t words = n * DESC_WORDS;
    rc = DDP_ENOMEM;
    if (!(my = malloc((words ? words : 1) * sizeof(int64_t))) ||
        !(all = malloc((words ? words : 1) * (size_t)world * sizeof(int64_t))))
        goto out;
    for (size_t i = 0; i < n; i++)
        desc_words(&ps[i], my + i * DESC_WORDS);
    if ((rc = ddp__reducer_staged(pg, STAGED_ALLGATHER, my, all, words, DDP_I64, DDP_SUM)) < 0) {
        snprintf(err, errlen, "exchanging parameter shapes failed: %s", ddp_pg_last_error(pg));
        goto out;
    }
    for (int k = 1; k < world; k++)
        for (size_t i = 0; i < n; i++) {
            const int64_t *a = all + i * DESC_WORDS, *b = all + ((size_t)k * n + i) * DESC_WORDS;
            if (memcmp(a, b, DESC_WORDS * sizeof(int64_t)) == 0)
                continue;
            struct ddp_param pa = {.count = (size_t)a[0],
                                   .dtype = (enum ddp_dtype)a[1],
                                   .ndim = (int)a[2]},
                             pk = {.count = (size_t)b[0],
                                   .dtype = (enum ddp_dtype)b[1],
                                   .ndim = (int)b[2]};
            for (int d = 0; d < DDP_PARAM_MAX_DIMS; d++) {
                pa.shape[d] = a[3 + d];
                pk.shape[d] = b[3 + d];
            }
            char sa[200], sk[200];
            describe(&pa, sa, sizeof(sa));
            describe(&pk, sk, sizeof(sk));
            snprintf(err, errlen, "rank %d's parameter %zu ('%s') is %s but rank 0's is %s", k, i,
                     ps[i].name ? ps[i].name : "?", sk, sa);
            rc = DDP_EINVAL;
            goto out;
        }
    rc = 0;
out:
    free(counts);
    free(my);
    free(all);
    return rc;
}
