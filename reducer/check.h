/* Private to reducer/: the check that every rank registers the same parameters
 * (reducer/check.c). */
#ifndef DDP_REDUCER_CHECK_H
#define DDP_REDUCER_CHECK_H

#include "reducer/reducer.h"

#include <stddef.h>

/* 0, or a DDP_E* code with the reason, the same on every rank, in err (errlen bytes). */
int ddp__reducer_check_params(struct ddp_pg *pg, const struct ddp_param *ps, size_t n, char *err,
                              size_t errlen);

#endif
