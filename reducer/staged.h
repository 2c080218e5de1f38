/* Private to reducer/: the reducer's own small collectives on host arrays (reducer/staged.c). */
#ifndef DDP_REDUCER_STAGED_H
#define DDP_REDUCER_STAGED_H

#include "worker/pg.h"

#include <stddef.h>

enum staged_kind { STAGED_ALLGATHER, STAGED_BROADCAST, STAGED_ALLREDUCE };

/* send to recv (recv is also send for the in-place broadcast and all-reduce): through device
 * memory on an NCCL group, the host waiting. */
int ddp__reducer_staged(struct ddp_pg *pg, enum staged_kind kind, const void *send, void *recv,
                        size_t count, enum ddp_dtype dt, enum ddp_redop op);

#endif
