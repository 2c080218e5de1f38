/* Implementation of common/htab.h: chained buckets, keyed 64-bit hash, doubling at load 1. */
#include "common/htab.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/banned.h"

int ddp_htab_init(struct ddp_htab *t)
{
    memset(t, 0, sizeof(*t));
    t->nslots = 64;
    t->slots = calloc(t->nslots, sizeof(*t->slots));
    if (!t->slots)
        return DDP_ENOMEM;
    if (getrandom(&t->seed, sizeof(t->seed), GRND_NONBLOCK) != (ssize_t)sizeof(t->seed))
        t->seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)t;
    return 0;
}

void ddp_htab_release(struct ddp_htab *t)
{
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t ddp_htab_hash(const struct ddp_htab *t, const void *key, size_t len)
{
    /* 8 bytes at a time through a strong 64-bit mixer, seeded per table. */
    const uint8_t *p = key;
    uint64_t h = mix(t->seed ^ len);
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix(h ^ w) + 0x9e3779b97f4a7c15ull;
        p += 8;
        len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, len);
    return mix(h ^ w ^ ((uint64_t)len << 56));
}

struct ddp_hnode *ddp_htab_find(const struct ddp_htab *t, const void *key, size_t len)
{
    uint64_t h = ddp_htab_hash(t, key, len);
    for (struct ddp_hnode *n = t->slots[h & (t->nslots - 1)]; n; n = n->next)
        if (n->hash == h && n->klen == len && memcmp(n->key, key, len) == 0)
            return n;
    return NULL;
}

static int grow(struct ddp_htab *t)
{
    size_t ns = t->nslots * 2;
    struct ddp_hnode **s = calloc(ns, sizeof(*s));
    if (!s)
        return DDP_ENOMEM;
    for (size_t i = 0; i < t->nslots; i++) {
        struct ddp_hnode *n = t->slots[i], *next;
        for (; n; n = next) {
            next = n->next;
            size_t j = n->hash & (ns - 1);
            n->next = s[j];
            s[j] = n;
        }
    }
    free(t->slots);
    t->slots = s;
    t->nslots = ns;
    return 0;
}

int ddp_htab_insert(struct ddp_htab *t, struct ddp_hnode *n)
{
    int r = 0;
    if (t->count + 1 > t->nslots)
        r = grow(t);
    n->hash = ddp_htab_hash(t, n->key, n->klen);
    size_t i = n->hash & (t->nslots - 1);
    n->next = t->slots[i];
    t->slots[i] = n;
    t->count++;
    return r;
}

void ddp_htab_remove(struct ddp_htab *t, struct ddp_hnode *n)
{
    struct ddp_hnode **pp = &t->slots[n->hash & (t->nslots - 1)];
    for (; *pp; pp = &(*pp)->next) {
        if (*pp == n) {
            *pp = n->next;
            n->next = NULL;
            t->count--;
            return;
        }
    }
}

void ddp_htab_foreach(struct ddp_htab *t, void (*fn)(struct ddp_hnode *, void *), void *arg)
{
    for (size_t i = 0; i < t->nslots; i++) {
        struct ddp_hnode *n = t->slots[i], *next;
        for (; n; n = next) {
            next = n->next;
            fn(n, arg);
        }
    }
}
