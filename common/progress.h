/*
 * The progress page: a rank's flight recorder, in memory its node agent can read. The agent
 * makes one page per rank (a memfd, DDPRUN_PROGRESS_FD in the rank's environment); libddp's
 * first process group writes its recorder there (worker/recorder.c), and the agent reads it on
 * each heartbeat (cli/diag/node.c) without the rank doing anything more: no store write per
 * collective. Without ddprun, the recorder is the same ring in private memory.
 *
 * One writer (the rank: its program threads under the group's lock, and the communication
 * thread), lock-free readers: an entry's seq is cleared before it is rewritten and stored last
 * (release), so a reader that sees the same seq before and after copying it has a whole entry.
 * Times are CLOCK_MONOTONIC nanoseconds (the agent runs on the same host).
 */
#ifndef DDP_COMMON_PROGRESS_H
#define DDP_COMMON_PROGRESS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define DDP_PROGRESS_MAGIC 0x50504444u /* "DDPP" */
#define DDP_PROGRESS_VERSION 2u
#define DDP_PROGRESS_RING 1024u /* entries; a power of two */

/* Operations, as recorded (the names are ddp_progress_op_name's). libddp records the first
 * five; a PyTorch rank's recorder (cli/diag/torch_rec.py) all of them: DDP_PROG_DDP_STEP is a
 * DistributedDataParallel forward that its backward's gradient all-reduces follow (t_enq the
 * forward, t_start when the rank's gradients are ready, t_end when the backward and DDP's wait
 * for its all-reduces are over; a step whose end is not seen is finished by the rank's next
 * entry, t_start cleared), DDP_PROG_DDP_FORWARD one without them (no_grad, no_sync; finished by
 * the next entry). */
enum ddp_progress_op {
    DDP_PROG_ALLREDUCE,
    DDP_PROG_BROADCAST,
    DDP_PROG_ALLGATHER,
    DDP_PROG_REDUCE_SCATTER,
    DDP_PROG_BARRIER,
    DDP_PROG_REDUCE,
    DDP_PROG_GATHER,
    DDP_PROG_SCATTER,
    DDP_PROG_ALLTOALL,
    DDP_PROG_DDP_STEP,
    DDP_PROG_DDP_FORWARD,
    DDP_PROG__COUNT
};

/* One collective of the ring: its slot is seq % DDP_PROGRESS_RING. */
struct ddp_progress_ent {
    _Atomic uint64_t seq; /* 1, 2, ... in the order the group runs them; 0 while written */
    uint8_t op;           /* enum ddp_progress_op */
    uint8_t dtype;        /* enum ddp_dtype */
    uint16_t pad;
    int32_t bucket;                        /* the reducer's bucket index, or -1 */
    uint64_t bytes;                        /* payload of this rank (count * dtype size) */
    _Atomic int64_t t_enq, t_start, t_end; /* 0 until it happens */
    _Atomic int32_t result;                /* 0, or a DDP_E code once it failed */
    int32_t pad2;
};

struct ddp_progress_page {
    uint32_t magic, version, ring, pad;
    int32_t rank, world; /* the group's */
    /* The group's counters: the last collective the program issued, the last the group began
     * to run, the last that finished (ok or not), and when any of them last moved. */
    _Atomic uint64_t entered, started, completed;
    _Atomic int64_t changed_ns;
    _Atomic uint32_t attached; /* a group writes here (only the first of a process does) */
    uint32_t pad3;
    _Atomic int64_t attached_ns; /* when it did: the group was formed (the startup timeline) */
    struct ddp_progress_ent ent[DDP_PROGRESS_RING];
};

static inline const char *ddp_progress_op_name(unsigned op)
{
    static const char *const names[] = {"allreduce", "broadcast", "allgather",  "reduce_scatter",
                                        "barrier",   "reduce",    "gather",     "scatter",
                                        "alltoall",  "ddp_step",  "ddp_forward"};
    return op < DDP_PROG__COUNT ? names[op] : "?";
}

/* A consistent copy of entry seq, or false when the slot holds another one (or is being
 * rewritten). */
static inline bool ddp_progress_read(const struct ddp_progress_page *p, uint64_t seq,
                                     struct ddp_progress_ent *out)
{
    if (seq == 0)
        return false;
    const struct ddp_progress_ent *e = &p->ent[seq % DDP_PROGRESS_RING];
    if (atomic_load_explicit(&e->seq, memory_order_acquire) != seq)
        return false;
    out->op = e->op;
    out->dtype = e->dtype;
    out->bucket = e->bucket;
    out->bytes = e->bytes;
    atomic_store_explicit(&out->t_enq, atomic_load_explicit(&e->t_enq, memory_order_acquire),
                          memory_order_relaxed);
    atomic_store_explicit(&out->t_start, atomic_load_explicit(&e->t_start, memory_order_acquire),
                          memory_order_relaxed);
    atomic_store_explicit(&out->t_end, atomic_load_explicit(&e->t_end, memory_order_acquire),
                          memory_order_relaxed);
    atomic_store_explicit(&out->result, atomic_load_explicit(&e->result, memory_order_relaxed),
                          memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&e->seq, memory_order_relaxed) != seq)
        return false;
    atomic_store_explicit(&out->seq, seq, memory_order_relaxed);
    return true;
}

#endif
