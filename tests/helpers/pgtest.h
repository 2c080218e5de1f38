/* Shared by pgtest's files (tests/helpers/pgtest.c, the main one). */
#ifndef DDP_TESTS_PGTEST_H
#define DDP_TESTS_PGTEST_H

#include "worker/pg.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern int rank, world;
extern long checks; /* passed */

/* Rank r's element i for a seed: a small integer, -8 to 8, from a hash of the three (its top
 * 32 bits scaled to 0-16 by a multiply, cheaper than a division by 17). */
static inline __attribute__((always_inline)) int64_t gen(int r, size_t i, unsigned seed)
{
    uint64_t x = ((uint64_t)r * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull) ^ seed;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    return (int64_t)(((x >> 32) * 17) >> 32) - 8;
}

/* f32 sums whose rounding depends on the order: the reference adds rank 0's, 1's, ... value
 * in float, as the slots and the single-copy path both do on one node. */
static inline float ordered(int r, size_t i)
{
    return (float)gen(r, i, 4242) * 0.1f + (r % 2 ? 3.0e4f : 0.0f);
}

/* The reference: element i of ordered() summed over the world's ranks, in rank order. */
static inline float ordered_sum(size_t i)
{
    float acc = ordered(0, i);
    for (int r = 1; r < world; r++)
        acc += ordered(r, i);
    return acc;
}

/* 0 and a check passed where got is want bit for bit; else 1, the first difference told. */
int compare(const void *got, const void *want, size_t n, enum ddp_dtype dt, const char *what);
/* Exits the rank (1) where r is not 0, with the group's last error. */
int must(struct ddp_pg *pg, int r, const char *what);

/* pgtest post and pgtest stream [--die] (tests/helpers/pgtest_post.c). */
int pgtest_post(struct ddp_pg *pg);
int pgtest_stream(struct ddp_pg *pg, bool die);

#endif
