/* An intrusive, seeded hash table keyed by byte strings, with incremental-free growth. */
#ifndef DDP_COMMON_HTAB_H
#define DDP_COMMON_HTAB_H

#include <stddef.h>
#include <stdint.h>

/* Embed in the element; key/klen must stay valid while the node is in a table. */
struct ddp_hnode {
    struct ddp_hnode *next;
    uint64_t hash;
    const uint8_t *key;
    uint32_t klen;
};

struct ddp_htab {
    struct ddp_hnode **slots;
    size_t nslots; /* power of two */
    size_t count;
    uint64_t seed;
};

/* DDP_ENOMEM on failure. The seed is random per table (hash flooding). */
int ddp_htab_init(struct ddp_htab *t);
/* Frees the slot array only; elements belong to the caller. */
void ddp_htab_release(struct ddp_htab *t);
uint64_t ddp_htab_hash(const struct ddp_htab *t, const void *key, size_t len);
/* The node with this key, or NULL. */
struct ddp_hnode *ddp_htab_find(const struct ddp_htab *t, const void *key, size_t len);
/* Inserts a node whose key is not present; sets n->hash. DDP_ENOMEM if growth fails
 * (the node is still inserted; the table just stays denser). */
int ddp_htab_insert(struct ddp_htab *t, struct ddp_hnode *n);
void ddp_htab_remove(struct ddp_htab *t, struct ddp_hnode *n);

/* Visits every node; fn may remove the node it is given. */
void ddp_htab_foreach(struct ddp_htab *t, void (*fn)(struct ddp_hnode *, void *), void *arg);

#endif
