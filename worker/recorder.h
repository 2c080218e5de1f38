/*
 * The flight recorder of a process group (worker/ only): the last DDP_PROGRESS_RING collectives
 * with their times, and the group's entered/started/completed counters. The first group of a
 * process started by ddprun writes into the progress page its node agent gave it
 * (DDPRUN_PROGRESS_FD, common/progress.h), so the agent sees it without a store write per
 * collective; other groups, and programs started otherwise, keep it in private memory.
 * DDP_FLIGHT_RECORDER=0 turns it off (for the benchmark that measures its cost).
 */
#ifndef DDP_WORKER_RECORDER_H
#define DDP_WORKER_RECORDER_H

#include "common/progress.h"

#include <stdint.h>
#include <stdio.h>

struct ddp__recorder;

/* A recorder for a group of rank/world: the agent's page when one is given and not yet taken
 * by another group of this process, else private memory. NULL when turned off or out of
 * memory (every call below accepts NULL). */
struct ddp__recorder *ddp__rec_new(int rank, int world);
void ddp__rec_free(struct ddp__recorder *r);

/* The program issued a collective (called under the group's lock, so sequence numbers follow
 * the order the group runs them): its sequence number. */
uint64_t ddp__rec_enter(struct ddp__recorder *r, enum ddp_progress_op op, int dtype, uint64_t bytes,
                        int bucket);
/* The group began to run it; it finished with result (0 or a DDP_E code). */
void ddp__rec_start(struct ddp__recorder *r, uint64_t seq);
void ddp__rec_end(struct ddp__recorder *r, uint64_t seq, int result);

/* Prints the last n entries, oldest first, a line each. */
void ddp__rec_dump(const struct ddp__recorder *r, FILE *f, unsigned n);

#endif
