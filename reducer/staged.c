/*
 * The reducer's own small collectives on host arrays (parameter descriptions, the bucket order,
 * the used map), on any group: an NCCL group's collectives take device memory, so the arrays
 * go through it there.
 */
#include "reducer/staged.h"
#include "worker/devmem.h"

#include "common/banned.h"

/*
 * The reducer's own small collectives on host arrays (parameter descriptions, the bucket
 * order, the used map): on an NCCL group they go through device memory and the host waits.
 * recv is also send for the in-place broadcast and all-reduce.
 */
int ddp__reducer_staged(struct ddp_pg *pg, enum staged_kind kind, const void *send, void *recv,
                        size_t count, enum ddp_dtype dt, enum ddp_redop op)
{
    size_t esz = ddp_dtype_size(dt), in = count * esz,
           out = kind == STAGED_ALLGATHER ? in * (size_t)ddp_pg_world_size(pg) : in;
    if (!ddp_pg_is_cuda(pg)) {
        if (kind == STAGED_ALLGATHER)
            return ddp_pg_allgather(pg, send, recv, count, dt);
        if (kind == STAGED_BROADCAST)
            return ddp_pg_broadcast(pg, recv, count, dt, 0);
        return ddp_pg_allreduce(pg, recv, count, dt, op);
    }
    void *stream = ddp_pg_compute_stream(pg), *dsend = NULL, *drecv = NULL;
    int rc;
    if ((rc = ddp__dev_alloc(&drecv, out)) < 0 ||
        (kind == STAGED_ALLGATHER && (rc = ddp__dev_alloc(&dsend, in)) < 0) ||
        (rc = ddp__dev_from_host(kind == STAGED_ALLGATHER ? dsend : drecv,
                                 kind == STAGED_ALLGATHER ? send : recv, in, stream)) < 0)
        goto out;
    if (kind == STAGED_ALLGATHER)
        rc = ddp_pg_allgather(pg, dsend, drecv, count, dt);
    else if (kind == STAGED_BROADCAST)
        rc = ddp_pg_broadcast(pg, drecv, count, dt, 0);
    else
        rc = ddp_pg_allreduce(pg, drecv, count, dt, op);
    if (rc == 0)
        rc = ddp__dev_to_host(recv, drecv, out, stream);
out:
    ddp__dev_free(dsend);
    ddp__dev_free(drecv);
    return rc;
}
