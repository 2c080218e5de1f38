/* Private to worker/: reduction kernels, the transports (TCP, shared memory) and the CPU
 * collectives above them. */
#ifndef DDP_WORKER_COLL_H
#define DDP_WORKER_COLL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/half.h"
#include "worker/pg.h"

/* dst[i] = op(dst[i], src[i]) for n elements; DDP_AVG reduces as a sum. */
void ddp__reduce(void *dst, const void *src, size_t n, enum ddp_dtype dt, enum ddp_redop op);
/* dst = (dst + src) / world in one pass, bit for bit ddp__reduce then ddp__scale_avg. */
void ddp__reduce_avg(void *dst, const void *src, size_t n, enum ddp_dtype dt, int world);
/* The same two with the left operand a instead of dst (the first step of a reduction, with no
 * copy of a into dst first): dst = op(a, b), dst = (a + b) / world. No buffer overlaps another;
 * the bits are those of copying a into dst and then the in-place form. */
void ddp__reduce_to(void *dst, const void *a, const void *b, size_t n, enum ddp_dtype dt,
                    enum ddp_redop op);
void ddp__reduce_avg_to(void *dst, const void *a, const void *b, size_t n, enum ddp_dtype dt,
                        int world);
/* And with the right operand in place: dst = op(a, dst), dst = (a + dst) / world (a rank's own
 * elements already where the result goes, after a peer's on the left). */
void ddp__reduce_rev(void *dst, const void *a, size_t n, enum ddp_dtype dt, enum ddp_redop op);
void ddp__reduce_avg_rev(void *dst, const void *a, size_t n, enum ddp_dtype dt, int world);
/* buf[i] /= world, for DDP_AVG after the sum. */
void ddp__scale_avg(void *buf, size_t n, enum ddp_dtype dt, int world);
/* dst[i] = src[i] x scale rounded to dt (DDP_F16 or DDP_BF16), and back to float32: the
 * reducer's compression hooks, vectorized as the kernels above are (the same bits as
 * worker/half.h's conversions one element at a time). */
void ddp__f32_to_half(uint16_t *dst, const float *src, size_t n, enum ddp_dtype dt, float scale);
void ddp__half_to_f32(float *dst, const uint16_t *src, size_t n, enum ddp_dtype dt);
/* The instruction set the kernels above use in this process ("baseline", "avx2", "avx512"; by
 * default from DDP_PG_REDUCE_ISA, else the CPU's), and a switch to another for tests: -1 where
 * the name is unknown or this CPU lacks it. Every set gives the same bits. */
const char *ddp__reduce_isa_name(void);
int ddp__reduce_isa(const char *name);

/*
 * How long a thread with nothing to do keeps polling, calling sched_yield between polls, before
 * it sleeps: the TCP transfers (worker/coll_tcp.c), the point-to-point engine and a caller
 * waiting for a point-to-point operation (worker/p2p.c). A sleeping poll's or condition
 * variable's wake-up costs tens of microseconds on a VM, whose idle vCPU halts (a 4 KiB TCP
 * all-reduce of 2 ranks took 39 us sleeping and 8 us polling; an 8-byte point-to-point message
 * 44-59 us one way and 16-17); the yield leaves the core to what else runs there (more ranks than
 * cores, the reducer's or a pipeline stage's computation). BENCHMARKS.md, "TCP waits" and
 * "Point-to-point inside a node". The shared-memory transport's waits (worker/shm_sync.c)
 * spin, then yield for 1 ms, measured on their own.
 */
#define DDP__SPIN_NS ((int64_t)200000)

/*
 * The address in [base, base + DDP__PAGE) that lies half a page from dst modulo the page size:
 * where a buffer read while dst is written should start. At the same offset within a page
 * (glibc puts every large allocation 16 bytes past a page) loads wait on unrelated stores whose
 * low 12 address bits match (4K aliasing): the TCP ring ran at 1.6 GB/s instead of 2.4
 * (BENCHMARKS.md, "4K aliasing"). base needs DDP__PAGE bytes beyond what the buffer holds.
 */
#define DDP__PAGE ((size_t)4096)
static inline void *ddp__away_from(void *base, const void *dst)
{
    uintptr_t want = ((uintptr_t)dst + DDP__PAGE / 2) & (DDP__PAGE - 1);
    return (char *)base + ((want - (uintptr_t)base) & (DDP__PAGE - 1));
}

/* A connection to one peer. */
#define DDP__TCP_MAX_CONNS 8
struct ddp__peer {
    int fd;
    /* connections 1..nconns-1 to this peer (-1 when none), over which a large message is cut
     * in stripes beside fd's (worker/coll_tcp.c); nconns is DDP_PG_TCP_CONNS, or by default
     * ddp__tcp_pair_conns's (1, or 2 or 4 between two ranks that are each alone on their node),
     * so peers of one comm may have different counts; tcp_conns is the largest */
    int sfd[DDP__TCP_MAX_CONNS - 1];
    int nconns;
    int rank;
    /* SO_SNDBUF asked for its connections, 0 for the kernel's autotuning: ddp__tcp_peer_sndbuf */
    int sndbuf;
    char host[128];
};

/* One step of a collective: send and receive at once (either may be empty), reducing received
 * bytes into reduce_dst as they arrive when reduce_dst is set. */
struct ddp__xfer {
    struct ddp__peer *to;
    const void *sbuf;
    size_t slen;
    struct ddp__peer *from;
    void *rbuf; /* where received bytes land (a scratch buffer when reducing) */
    size_t rlen;
    void *reduce_dst;
    /* With reduce_dst: rbuf holds only rwin bytes (a multiple of the element size), reused
     * round and round as they are reduced, so it stays in the cache; 0: rlen bytes. */
    size_t rwin;
    /* With reduce_dst: the left operand of the reduction, read from here instead of from
     * reduce_dst, which is only written (ddp__reduce_to: one pass over memory, no copy of it
     * into reduce_dst first); NULL: reduce_dst holds it. */
    const void *reduce_own;
    /* A buffer in pieces (an all-reduce of pieces over TCP, in place): where set, the bytes
     * sent are those at soff of spcs's concatenation instead of sbuf's, those received land at
     * roff of rpcs's instead of rbuf's (not when reducing: rbuf stays the window), and those
     * reduced go to doff of dpcs's instead of reduce_dst's (reduce_own unused). */
    const struct ddp__pieces *spcs, *rpcs, *dpcs;
    size_t soff, roff, doff;
    enum ddp_dtype dt;
    enum ddp_redop op;
};

/* Each local rank's control line at the head of the node's segment (worker/shm_sync.c). */
#define DDP__SHM_CTRL_LINE 64
#define DDP__NOT_IN_ARENA UINT64_MAX
#define DDP__AUTO_PAIRS 5   /* worker/shm_auto.c: timed pairs in a trial */
#define DDP__AUTO_CLASSES 4 /* and its size classes */
struct ddp__shm_ctrl {
    _Atomic uint32_t seq;      /* the low 32 bits of the steps this rank passed */
    _Atomic uint32_t sleepers; /* peers asleep on seq */
    /* The buffer of the single-copy all-reduce in progress (worker/shm_direct.c), written
     * before the step that publishes it: its address in its owner, and its offset in the
     * owner's arena (or DDP__NOT_IN_ARENA). */
    uint64_t addr, arena_off;
    /* Auto (worker/shm_auto.c): this rank's last trial of each size class, single-copy's time
     * per byte over the slots' in parts per million (0: not measured), written before the
     * step that follows. */
    uint64_t auto_ratio[DDP__AUTO_CLASSES];
    /* The CPU this rank published its last step from (-1 while it moves: ddp__shm_part): a peer
     * waiting on the same CPU yields at once instead of spinning (we cannot arrive while it
     * spins), or moves. */
    _Atomic int32_t cpu;
};

struct ddp__arena;

/* DDP_PG_DIRECT_BYTES=auto: single-copy or the slots, chosen from the group's all-reduces of
 * registered memory (worker/shm_auto.c), for each size class apart: 1-4, 4-16, 16-64, 64- MiB. */
struct ddp__auto_class {
    bool direct;           /* the choice now */
    uint64_t calls;        /* all-reduces of the class so far, alike on every local rank */
    uint64_t trial;        /* the one that starts the next trial */
    bool in_trial, decide; /* in a trial; deciding after the next all-reduce */
    int warm, got, tries;  /* the trial's warm-ups, halves timed, timed all-reduces */
    int fails;             /* single-copy halves that could not run, in a row */
    int backoff;           /* the next trial EVERY << this later (unmeasured trials in a row) */
    uint64_t ns_per_mb[DDP__AUTO_PAIRS][2]; /* its pairs' times: [0] slots, [1] single-copy */
    uint64_t trials, chosen;                /* trials decided, and how many chose single-copy */
};
struct ddp__direct_auto {
    bool on;
    double margin;  /* DDP_PG_DIRECT_AUTO_MARGIN */
    uint64_t every; /* DDP_PG_DIRECT_AUTO_EVERY */
    struct ddp__auto_class cls[DDP__AUTO_CLASSES];
};

/* The node's shared-memory segment, shared by the ranks of one node. */
struct ddp__shm {
    void *base; /* NULL when not in use */
    size_t len;
    int n, me;  /* local ranks, and ours */
    int *grank; /* the group rank of each local rank */
    size_t slot_bytes, slots_off; /* each slot's bytes; where the slots start */
    uint64_t seq;                 /* barriers passed, the same on every rank of the node */
    uint64_t round; /* rounds done (their parity picks the set of slots) */
    int cpu;        /* where we published our last step from (sched_getcpu) */
    int64_t parted_ns; /* when we last moved off a CPU shared with a local peer (shm_sync.c) */
    uint64_t parts;    /* times we moved */
    /* Single-copy all-reduce (worker/shm_direct.c) from direct_min bytes (0: never): peers'
     * buffers read where they are, through the arenas every local rank maps (ddp_pg_mem_alloc)
     * or cross-memory attach (cma: every rank of the group may read its local peers' memory
     * with process_vm_readv; pid: each local rank's). */
    size_t direct_min, direct_block;
    struct ddp__direct_auto autod;
    bool cma;
    int *pid;
    struct ddp__arena *arena; /* ours, or NULL */
    void **peer_arena;        /* each local rank's arena as mapped here ([me]: ours), or NULL */
    size_t arena_len;
    uint64_t direct_done, cma_reads; /* single-copy all-reduces done, process_vm_readv calls */
    uint64_t direct_shared;          /* single-copy all-reduces shared with helper threads */
    /* Registered memory on one node: chunks claimed (worker/shm_claim.c) before this rank's
     * next all-reduce of them, the same on every local rank; and those this rank summed. */
    uint64_t claim_base, claimed;
    uint64_t *ptab; /* our pieces' offsets in our arena, a table in the arena (claimed pieces) */
    size_t ptab_cap;
    bool claim_off; /* DDP_PG_DIRECT_CLAIM=0: fixed shards and blocks (worker/shm_direct.c) */
    /* An all-reduce posted (ddp_pg_allreduce_post): its buffer and first step published before
     * the call, so that peers may start on it; the group's next collective (worker/coll_cpu.c). */
    struct {
        bool on;   /* its first step published, the all-reduce not run yet */
        bool done; /* run before another collective: the program's call returns at once */
        void *buf; /* one buffer's (ddp_pg_allreduce_post), or NULL */
        size_t count;
        enum ddp_dtype dt;
        enum ddp_redop op;
        /* pieces' (ddp_pg_allreduce_pieces_post): the caller's array (its pieces not final
         * yet may still move: read again as they are made final), a copy of it as published,
         * the word of our table that says how many elements are final (ddp_pg_post_ready),
         * and the pieces [0, qfinal) that lie where published for good */
        bool pieces;
        const struct ddp_piece *user;
        struct ddp_piece *pcs;
        size_t npc, pcs_cap, qfinal, qat; /* qat: where piece qfinal starts */
        uint64_t *ready;
        uint64_t unread; /* where ready points when our table could not be published */
    } post;
    /* This rank's threads for the slots' one-node all-reduces of at least DDP__TEAM_MIN_BYTES
     * (worker/team.h, worker/shm.c): in all, the collective's own thread included (1: it alone;
     * DDP_PG_SHM_THREADS); the helpers start at the first all-reduce that uses them. */
    int threads;
    struct ddp__team *team;
};
#define DDP__TEAM_MAX 16                      /* threads of a rank's team at most */
#define DDP__TEAM_MIN_BYTES ((size_t)1 << 20) /* all-reduces shared out from this size */
/* DDP_PG_SHM_THREADS: a number (1: no helpers), or "auto" (unset): the CPUs this process may
 * run on over the node's ranks, less one, at most DDP__TEAM_AUTO_MAX (worker/shm_sync.c). */
#define DDP__TEAM_AUTO_MAX 4
int ddp__shm_threads(int nlocal);
/* The rank's helper threads for a one-node all-reduce of bytes (the slots', or single-copy's on
 * registered memory), started at the first that has a use for them (worker/shm.c); NULL: the
 * thread that runs the collective works alone. */
struct ddp__team *ddp__shm_team(struct ddp__shm *sh, size_t bytes);

size_t ddp__shm_segment_bytes(int nlocal, size_t slot_bytes);
/* Where the slots start in it (worker/shm_sync.c). */
size_t ddp__shm_slots_offset(int nlocal);
/* Takes over a mapping of ddp__shm_segment_bytes() bytes (zero-filled when created) and the
 * malloc'd grank array. */
int ddp__shm_attach(struct ddp__shm *sh, void *base, int nlocal, int me, int *grank,
                    size_t slot_bytes);
/* Unmaps the segment and the arenas, and frees what the group attached. */
void ddp__shm_detach(struct ddp__shm *sh);
struct ddp__shm_ctrl *ddp__shm_ctrl(struct ddp__shm *sh, int j);
/* The chunks of the one-node single-copy all-reduces of registered memory claimed so far
 * (worker/shm_claim.c): a line of its own after the slots, which keep their places. */
_Atomic uint64_t *ddp__shm_claim_counter(struct ddp__shm *sh);
/* Unmaps the local peers' arenas (not ours) and forgets them. */
void ddp__shm_unmap_arenas(struct ddp__shm *sh);

/* Registered memory: a rank's arena, a memfd every local rank maps (worker/arena.c). */
int ddp__arena_create(size_t len, struct ddp__arena **out);
void *ddp__arena_base(const struct ddp__arena *a);
/* Its descriptor, for the local peers to map (-1 for NULL). */
int ddp__arena_fd(const struct ddp__arena *a);
/* bytes of zero-filled memory, page-aligned, its pages reserved (NULL when the arena or the
 * memory is full); _free gives the pages back. */
void *ddp__arena_alloc(struct ddp__arena *a, size_t bytes);
int ddp__arena_free(struct ddp__arena *a, void *p);
/* The offset of [p, p + bytes) in the arena, or DDP__NOT_IN_ARENA. */
uint64_t ddp__arena_offset(const struct ddp__arena *a, const void *p, size_t bytes);
void ddp__arena_destroy(struct ddp__arena *a);

struct ddp__comm {
    int rank, world;
    struct ddp__peer *peers; /* indexed by rank; peers[rank].fd == -1 */
    int64_t deadline_ms;
    const char *opname;
    char err[512];      /* first error, naming the peer */
    size_t small_bytes; /* recursive doubling at or below */
    void *scratch;
    size_t scratch_len;
    void *stage; /* a buffer in pieces all-reduced over TCP: gathered here */
    size_t stage_len;
    struct ddp__shm shm;
    /* Hierarchical all-reduce across nodes: the ring of the ranks with our local rank, one per
     * node (peers point at the group's connections); NULL on a single node. */
    struct ddp__comm *cross;
    /* DDP_PG_TCP_THREADS=2: a transfer of DDP__TCP_SPLIT_BYTES or more each way (a ring step)
     * sends on a second thread while this one receives and reduces, so the kernel's send and
     * receive copies run on two cores (worker/coll_tcp.c); the thread starts at the first. */
    bool tcp_split;
    /* The most connections to any peer (struct ddp__peer's nconns; 1: no stripes), the
     * stripes' team's size: a message of tcp_stripe_bytes or more to or from a peer with
     * more than one connection is cut into that peer's nconns stripes, each sent and received
     * by a thread of its own; each direction decides on its own length and peer alone, which
     * both ends know alike. Takes the place of tcp_split. */
    int tcp_conns;
    size_t tcp_stripe_bytes;    /* DDP_PG_TCP_STRIPE_BYTES, alike on every rank */
    struct ddp__team *tcp_team; /* tcp_split's 2 threads or tcp_conns's k, started at the first */
};
#define DDP__TCP_SPLIT_BYTES ((size_t)256 << 10)
#define DDP__TCP_STRIPE_BYTES ((size_t)1 << 20) /* tcp_stripe_bytes's default */
#define DDP__TCP_STRIPE_MIN ((size_t)64 << 10)
/* DDP_PG_TCP_THREADS: 1 (unset) or 2, for tcp_split; anything else is named and taken as 1. */
bool ddp__tcp_split_env(void);
/* DDP_PG_TCP_CONNS: 1 to DDP__TCP_MAX_CONNS connections to every peer, or 0 for "auto" (unset,
 * or auto: ddp__tcp_pair_conns below); anything else is named and taken as auto. */
int ddp__tcp_conns_env(void);
/* DDP_PG_TCP_STRIPE_BYTES: the smallest message cut in stripes, DDP__TCP_STRIPE_MIN to 1 GiB;
 * unset: DDP__TCP_STRIPE_BYTES; anything else is named and taken as that. */
size_t ddp__tcp_stripe_env(void);
/* DDP_PG_TCP_SNDBUF: -1 for auto (unset, or auto), 0 (the kernel's autotuning for every peer), or
 * DDP__TCP_SNDBUF_MIN to DDP__TCP_SNDBUF_MAX bytes for every peer; anything else is named and
 * taken as auto (worker/tcp_bufs.c). */
#define DDP__TCP_SNDBUF_MIN 4096
#define DDP__TCP_SNDBUF_MAX (1 << 30)
long ddp__tcp_sndbuf_env(void);
/* What auto asks for the connections to a peer on this rank's kernel: the kernel doubles it. */
#define DDP__TCP_NEAR_SNDBUF (128 << 10)
/* The send buffer for the connections to a peer: setting where >= 0; with auto (-1),
 * DDP__TCP_NEAR_SNDBUF where both ends run on one kernel (mine and theirs, the ranks' boot ids,
 * known and alike: ddp__boot_id), else 0 (the kernel's autotuning). */
int ddp__tcp_peer_sndbuf(long setting, const char *mine, const char *theirs);
/* Sets each peer's sndbuf on all its connections (after they are made), its point-to-point one
 * too where p2p_fd (per peer, -1 for none) is given; returns how many peers have one. */
int ddp__tcp_apply_sndbufs(struct ddp__comm *c, const int *p2p_fd);
/* The connections a rank offers each peer by default (auto) when the two are each the only rank
 * of their node: 4 with DDP__TCP_WIDE_CPUS usable CPUs or more, else 2 (BENCHMARKS.md, "Several
 * connections per peer": 2 beat 1 and 4 on a 2-vCPU VM; 4 moved 1.7-2.4x what 2 did from 4 MiB
 * between two hosts on 16 cores). */
#define DDP__TCP_WIDE_CPUS 8
int ddp__tcp_auto_conns(int usable_cpus);
/* The connections of a pair: asked (DDP_PG_TCP_CONNS, alike on every rank) where > 0; else,
 * when the two are each alone on nodes of their own (alone_apart), the smaller of the two offers
 * (mine, theirs: ddp__tcp_auto_conns of each end), so both ends compute the same; else 1. */
int ddp__tcp_pair_conns(int asked, bool alone_apart, int mine, int theirs);

/* A local peer last published from this thread's CPU: move to a CPU of this thread's mask that
 * no local rank published from, then restore the mask (worker/shm_sync.c). True if it moved;
 * false when the thread is no longer on the peer's CPU, the mask has one CPU or none free, or
 * it moved less than DDP__SHM_PART_EVERY_NS ago. */
#define DDP__SHM_PART_EVERY_NS ((int64_t)50 * 1000 * 1000)
bool ddp__shm_part(struct ddp__shm *sh, const struct ddp__shm_ctrl *peer);
/* One step of the node's ranks: publish seq + k, wait until every local rank reached it. */
int ddp__shm_step(struct ddp__comm *c, uint64_t k);
/* Its two halves apart: a posted all-reduce publishes its first step before it is called. */
void ddp__shm_step_publish(struct ddp__comm *c, uint64_t k);
int ddp__shm_step_wait(struct ddp__comm *c, uint64_t k);
/* Waits until local rank j's word reaches target (acquire): 0, DDP_ECLOSED (j died) or
 * DDP_ETIMEDOUT (the collective's deadline); writes no message, so helper threads may wait. */
int ddp__shm_wait_word(struct ddp__comm *c, int j, const uint64_t *word, uint64_t target);
/* The group's message for such a failure of a wait for local rank j. */
void ddp__shm_wait_error(struct ddp__comm *c, int j, int e);
/* A shard this rank reduced over the node: across nodes, all-reduced on our own ring (the
 * hierarchical all-reduce of PowerAI DDL); then divided for DDP_AVG. */
int ddp__shm_shard_done(struct ddp__comm *c, void *shard, size_t count, enum ddp_dtype dt,
                        enum ddp_redop op);

/* A buffer in pieces (worker/pieces.c): its concatenation read and written by element
 * ranges, with a cursor (accesses mostly move forward). */
struct ddp__pieces {
    const struct ddp_piece *p;
    size_t n, esz;
    size_t at, at_off; /* the cursor: a piece and the offset of its first element */
};
void ddp__pieces_init(struct ddp__pieces *v, const struct ddp_piece *p, size_t n, size_t esz);
void ddp__pieces_read(struct ddp__pieces *v, size_t off, size_t count, void *dst);
void ddp__pieces_write(struct ddp__pieces *v, size_t off, size_t count, const void *src);
/* Elements [off, off + count) in place when one piece holds them all, else NULL. */
void *ddp__pieces_span(struct ddp__pieces *v, size_t off, size_t count);
/* Element off in place, and *count cut to what its piece holds from there (off inside the
 * total). */
void *ddp__pieces_run(struct ddp__pieces *v, size_t off, size_t *count);
/* The same by bytes: byte off of the concatenation in place (it may lie inside an element), and
 * *len cut to what its piece holds from there; NULL past the end. */
void *ddp__pieces_bytes(struct ddp__pieces *v, size_t off, size_t *len);

int ddp__shm_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                       enum ddp_redop op);
/* The same over a buffer in pieces, reading and writing them in place (count: the total). */
int ddp__shm_allreduce_pieces(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc,
                              size_t count, enum ddp_dtype dt, enum ddp_redop op);
/* The single-copy all-reduce (worker/shm_direct.c): 0 or a DDP_E* code, or 1 when it cannot
 * run this time (a local rank's buffer cannot be read in place): every local rank then
 * returns 1 alike and ddp__shm_allreduce does the work. */
int ddp__shm_direct_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                              enum ddp_redop op);
#define DDP__CLAIM_CHUNK ((size_t)64 << 10) /* bytes of a claimed chunk: n of them fit the L2 */
#define DDP__CLAIM_MAX_LOCAL 64 /* local ranks at most for claimed chunks (else fixed shards) */
/* Its one-node form where every local buffer is registered, after step 1 has published them:
 * chunks claimed by whichever rank or helper thread is free (worker/shm_claim.c). */
int ddp__shm_claim_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                             enum ddp_redop op, struct ddp__team *team);
/* Publishes buf as the next single-copy all-reduce's (its first step) and returns: peers that
 * reach it may read and write buf from now on (worker/shm_direct.c). */
void ddp__shm_direct_post(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                          enum ddp_redop op);
/* Whether auto's next all-reduce of bytes goes single-copy as the first thing it does (not a
 * timed half of a trial, which steps first). */
bool ddp__shm_auto_would_direct(const struct ddp__shm *sh, uint64_t bytes);
/* The same over a buffer in pieces, where every piece of every local rank is registered (else
 * 1 on every local rank alike, after one step: the slots do the work). */
int ddp__shm_claim_pieces(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc, size_t count,
                          enum ddp_dtype dt, enum ddp_redop op);
/* Publishes the pieces as the next claimed all-reduce's (its first step), the first ready
 * elements final: peers claim chunks up to where every rank's data is final, and wait there.
 * Where a piece is not registered, the step says so, and every rank then goes to the slots.
 * 0 or DDP_ENOMEM (nothing published). */
int ddp__shm_claim_post(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc, size_t count,
                        enum ddp_dtype dt, enum ddp_redop op, size_t ready);
/* The posted pieces' first ready elements final, the pieces they lie in read again from pc
 * (where they now are: registered, else DDP_EINVAL and nothing changes). */
int ddp__shm_claim_ready(struct ddp__comm *c, const struct ddp_piece *pc, size_t ready);
/* An all-reduce of direct_min bytes or more on a one-node group with auto on: single-copy or
 * the slots as chosen now, or as its trial of the two asks (worker/shm_auto.c). */
int ddp__shm_auto_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                            enum ddp_redop op);

/* The same, for groups on one node (no cross ring): every byte through the node's segment. */
int ddp__shm_broadcast(struct ddp__comm *c, void *buf, size_t bytes, int root);
int ddp__shm_allgather(struct ddp__comm *c, const void *send, void *recv, size_t bytes);
int ddp__shm_reduce_scatter(struct ddp__comm *c, const void *send, void *recv, size_t count,
                            enum ddp_dtype dt, enum ddp_redop op);
int ddp__shm_barrier(struct ddp__comm *c);

/* The TCP transport and its algorithms (worker/coll_tcp.c): rings, recursive doubling, a
 * binomial tree, a dissemination barrier, over the group's connections. */
int ddp__xfer(struct ddp__comm *c, const struct ddp__xfer *x);
int ddp__tcp_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                       enum ddp_redop op);
/* The ring all-reduce of a buffer in pieces, sent from and reduced into them in place; 1 where
 * it is small enough for recursive doubling (the caller stages it then). */
int ddp__tcp_allreduce_pieces(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc,
                              size_t count, enum ddp_dtype dt, enum ddp_redop op);
int ddp__tcp_broadcast(struct ddp__comm *c, void *buf, size_t bytes, int root);
int ddp__tcp_allgather(struct ddp__comm *c, const void *send, void *recv, size_t bytes);
int ddp__tcp_reduce_scatter(struct ddp__comm *c, const void *send, void *recv, size_t count,
                            enum ddp_dtype dt, enum ddp_redop op);
int ddp__tcp_barrier(struct ddp__comm *c);

/* The collectives of a CPU group, each on its transport (worker/coll_cpu.c). */
int ddp__cpu_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                       enum ddp_redop op);
/* ddp_pg_allreduce_post on a CPU group: 0 posted, 1 not (it could not go single-copy). */
int ddp__cpu_allreduce_post(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                            enum ddp_redop op);
int ddp__cpu_allreduce_pieces(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc,
                              size_t count, enum ddp_dtype dt, enum ddp_redop op);
/* ddp_pg_allreduce_pieces_post and ddp_pg_post_ready on a CPU group: 0 done, 1 not (nothing
 * posted: the group cannot claim these pieces' chunks, ddp__cpu_can_post_pieces), or an error. */
bool ddp__cpu_can_post_pieces(const struct ddp__comm *c, size_t count, enum ddp_dtype dt);
int ddp__cpu_allreduce_pieces_post(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc,
                                   size_t count, enum ddp_dtype dt, enum ddp_redop op,
                                   size_t ready);
int ddp__cpu_post_ready(struct ddp__comm *c, size_t ready);
int ddp__cpu_broadcast(struct ddp__comm *c, void *buf, size_t bytes, int root);
int ddp__cpu_allgather(struct ddp__comm *c, const void *send, void *recv, size_t bytes);
int ddp__cpu_reduce_scatter(struct ddp__comm *c, const void *send, void *recv, size_t count,
                            enum ddp_dtype dt, enum ddp_redop op);
int ddp__cpu_barrier(struct ddp__comm *c);

#endif
