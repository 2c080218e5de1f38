/*
 * The NCCL unique-id exchange of an NCCL process group, through the job's store (which only
 * moves the bytes): rank 0 creates the id with ncclGetUniqueId (its process hosts NCCL's
 * bootstrap root from then on) and sets it under a key; the others wait for the key and read
 * it. Built without NCCL, it refuses with DDP_ENOTSUP.
 */
#include "worker/pg_nccl.h"
#include "common/err.h"
#include "common/log.h"
#include "rendezvous/store.h"

#include <stdlib.h>
#include <string.h>

#ifdef DDP_HAVE_NCCL
#include <nccl.h>
#endif

#include "common/banned.h"

int ddp__pg_nccl_id(struct ddp_store *s, const char *key, int rank, int timeout_ms, void *id)
{
#ifdef DDP_HAVE_NCCL
    int r;
    if (!key || !id || rank < 0)
        return DDP_EINVAL;
    if (rank == 0) {
        ncclUniqueId uid;
        _Static_assert(sizeof(uid) == DDP__NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");
        ncclResult_t nr = ncclGetUniqueId(&uid);
        if (nr != ncclSuccess) {
            DDP_ERROR(PG, "ncclGetUniqueId failed: %s", ncclGetErrorString(nr));
            return DDP_ESYS;
        }
        if ((r = ddp_store_set(s, key, &uid, sizeof(uid))) < 0)
            return r;
        memcpy(id, &uid, sizeof(uid));
        return 0;
    }
    const char *keys[1] = {key};
    if ((r = ddp_store_wait(s, keys, 1, timeout_ms)) < 0) {
        if (r == DDP_ETIMEDOUT)
            DDP_ERROR(PG, "rank %d: no NCCL unique id under '%s' after %d ms (is rank 0 alive?)",
                      rank, key, timeout_ms);
        return r;
    }
    void *v;
    size_t len;
    if ((r = ddp_store_get(s, key, &v, &len)) < 0)
        return r;
    if (len != DDP__NCCL_ID_BYTES) {
        DDP_ERROR(PG, "NCCL unique id under '%s' has %zu bytes, expected %d", key, len,
                  DDP__NCCL_ID_BYTES);
        free(v);
        return DDP_EPROTO;
    }
    memcpy(id, v, len);
    free(v);
    return 0;
#else
    (void)s;
    (void)key;
    (void)rank;
    (void)timeout_ms;
    (void)id;
    DDP_ERROR(PG, "NCCL unique-id exchange requested, but libddp was built without NCCL");
    return DDP_ENOTSUP;
#endif
}
