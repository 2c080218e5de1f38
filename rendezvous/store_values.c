/* Freeing what the store calls return (rendezvous/store.h): a leaf, so that the client's files
 * and the etcd store (rendezvous/store_etcd.c) share it without calling each other. */
#include "rendezvous/store.h"

#include <stdlib.h>

#include "common/banned.h"

void ddp_store_event_free(struct ddp_store_event *ev)
{
    if (!ev)
        return;
    free(ev->key);
    free(ev->value);
    free(ev);
}

void ddp_store_values_free(struct ddp_store_value *vals, size_t n)
{
    if (!vals)
        return;
    for (size_t i = 0; i < n; i++) {
        free(vals[i].data);
        vals[i].data = NULL;
        vals[i].len = 0;
    }
}
