/*
 * Whether the reducer starts a bucket's all-reduce during backward (reducer/overlap.c). Private
 * to reducer/.
 */
#ifndef DDP_REDUCER_OVERLAP_H
#define DDP_REDUCER_OVERLAP_H

#include <stdbool.h>
#include <stddef.h>

#include "worker/pg.h"

/* The decision for pg: DDP_REDUCER_OVERLAP=on|off, else the automatic rule of
 * ddp__overlap_pays on this process's usable cores. why: a sentence when it is off. */
bool ddp__reducer_overlap(const struct ddp_pg *pg, char *why, size_t len);

/*
 * The automatic rule: overlapping pays when communication uses something backward does not
 * (a GPU's copy engines and links, a network) or a core of its own. A CPU all-reduce inside a
 * node is copying and adding on the cores; with fewer than 2 cores per local rank it would
 * take them from backward, and run slower for being interleaved with it (measured:
 * BENCHMARKS.md, "Gradient reducer"), so it waits for finalize. cores: this process's usable
 * CPUs; sharers: how many of the node's ranks run on them (local_world, unless ranks were
 * bound to CPUs of their own: ddprun --bind-to).
 */
bool ddp__overlap_pays(bool cuda, int world, int local_world, int sharers, int cores);

#endif
