/* Private to reducer/: the reducer's inputs checked at creation (reducer/check.c). */
#ifndef DDP_REDUCER_CHECK_H
#define DDP_REDUCER_CHECK_H

#include "reducer/reducer.h"

#include <stddef.h>

/* Bytes from a size in MiB in the environment variable name (more than 0), else dflt (a value
 * that is not a size is warned about). */
size_t ddp__reducer_env_mib(const char *name, size_t dflt);
/* Every rank registers the same parameters: 0, or a DDP_E* code with the reason, the same on
 * every rank, in err (errlen bytes). */
int ddp__reducer_check_params(struct ddp_pg *pg, const struct ddp_param *ps, size_t n, char *err,
                              size_t errlen);

#endif
