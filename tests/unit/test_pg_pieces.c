/*
 * Unit tests for worker/: the all-reduce of a buffer in pieces (the reducer's buckets without
 * bucket view) against one buffer, bit for bit, on every transport, with process groups formed
 * by threads of one process (so TSan sees the communication threads and the helpers).
 */
#include "tests/unit/pg_fixture.h"
#include "common/cpus.h"
#include "worker/coll.h"
#include "worker/group.h"
#include "worker/team.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- all-reduce of a buffer in pieces (the reducer's buckets without bucket view) ---- */

enum { PW = 4 };
static size_t PN = 30011;     /* elements of the buffer in pieces */
static int piece_threads;     /* with shared memory: threads each rank's all-reduces must use */
static bool piece_rank_order; /* one node's slots: the bits of summing in rank order */
static bool piece_flat_registered; /* the one buffer in registered memory, single-copy */
/* the pieces in registered memory, single-copy in claimed chunks: 1 every rank's, 2 all but
 * rank 1's (whose malloc'd pieces send every rank to the slots) */
static int piece_registered;
static bool piece_tcp_split;   /* over TCP: the sending thread did start */
static int piece_tcp_conns;    /* over TCP: the stripes' threads did start, and the ring's bits */
static bool piece_conns_auto;  /* each peer's connections as the default rule has them */
static bool piece_tcp_inplace; /* over TCP: the ring ran on the pieces, never staged */

struct piece_arg {
    int rank, local_world, rc;
    uint64_t claimed; /* chunks this rank summed (claimed pieces) */
};
static uint64_t piece_claimed; /* by all the ranks of the last run_pieces */

static float *piece_alloc(struct ddp_pg *pg, int rank, size_t bytes)
{
    bool reg = piece_registered == 1 || (piece_registered == 2 && rank != 1);
    return reg ? ddp_pg_mem_alloc(pg, bytes) : malloc(bytes);
}

static void *piece_rank(void *a)
{
    struct piece_arg *pa = a;
    struct ddp_store *s;
    struct ddp_pg *pg;
    pa->rc = -1;
    if (!(pg = join("pieces", pa->rank, PW, pa->local_world, &s)))
        return NULL;
    float *flat = piece_flat_registered ? ddp_pg_mem_alloc(pg, PN * sizeof(float))
                                        : malloc(PN * sizeof(float)),
          *got = malloc(PN * sizeof(float));
    struct ddp_piece pc[64];
    float *mem[64];
    size_t np = 0, at = 0;
    /* Each rank cuts the buffer its own way: pieces of 0 to ~2000 elements, and one large. */
    uint32_t x = 2654435761u * (uint32_t)(pa->rank + 1);
    while (at < PN && np < 63) {
        x = x * 1664525u + 1013904223u;
        size_t k = np == 5 ? 9000 : (x >> 8) % 2000;
        if (k > PN - at)
            k = PN - at;
        pc[np].count = k;
        mem[np] = piece_alloc(pg, pa->rank, (k ? k : 1) * sizeof(float));
        pc[np].data = mem[np];
        at += k;
        np++;
    }
    pc[np].count = PN - at;
    mem[np] = piece_alloc(pg, pa->rank, (PN - at + 1) * sizeof(float));
    pc[np].data = mem[np];
    np++;
    int bad = 0;
    for (int it = 0; it < 4 && !bad; it++) {
        for (size_t i = 0; i < PN; i++)
            flat[i] =
                (float)((i * 7919 + (size_t)pa->rank * 104729 + (size_t)it) % 1000) / 997.0f - 0.3f;
        for (size_t k = 0, off = 0; k < np; off += pc[k].count, k++)
            memcpy(pc[k].data, flat + off, pc[k].count * sizeof(float));
        struct ddp_work *w = NULL;
        enum ddp_redop op = it & 1 ? DDP_SUM : DDP_AVG;
        if (it & 2) { /* the blocking form */
            bad |= ddp_pg_allreduce_pieces(pg, pc, np, DDP_F32, op, 3) != 0;
        } else {
            bad |= ddp_pg_allreduce_pieces_start(pg, pc, np, DDP_F32, op, 3, &w) != 0;
            bad |= !w || ddp_work_wait(w) != 0;
            ddp_work_free(w);
        }
        bad |= ddp_pg_allreduce(pg, flat, PN, DDP_F32, op) != 0;
        for (size_t k = 0, off = 0; k < np; off += pc[k].count, k++)
            memcpy(got + off, pc[k].data, pc[k].count * sizeof(float));
        bad |= memcmp(got, flat, PN * sizeof(float)) != 0;
        /* and with one thread's bits: the ranks' values summed in rank order (the slots'),
         * the average's division in the last addition's pass */
        for (size_t i = 0; piece_rank_order && i < PN; i++) {
            float acc = 0.0f;
            for (int r = 0; r < PW; r++) {
                float v =
                    (float)((i * 7919 + (size_t)r * 104729 + (size_t)it) % 1000) / 997.0f - 0.3f;
                acc = r == 0 ? v : acc + v;
            }
            if (op == DDP_AVG)
                acc = acc * (1.0f / (float)PW);
            if (memcmp(&acc, &got[i], sizeof(float)) != 0) {
                bad = 1;
                break;
            }
        }
        /* over TCP, the sums' bits of the ring: chunk k of PW is summed from rank k on, round
         * the ring (checked for SUM; AVG's division is the ring's own) */
        for (size_t i = 0, k = 0; piece_tcp_conns && (it & 1) && i < PN; i++) {
            while ((unsigned __int128)PN * (k + 1) / PW <= i)
                k++;
            float acc = 0.0f;
            for (int j = 0; j < PW; j++) {
                size_t r = (k + (size_t)j) % PW;
                float v = (float)((i * 7919 + r * 104729 + (size_t)it) % 1000) / 997.0f - 0.3f;
                acc = j == 0 ? v : acc + v;
            }
            if (memcmp(&acc, &got[i], sizeof(float)) != 0) {
                bad = 1;
                break;
            }
        }
    }
    struct ddp_piece hole = {.data = NULL, .count = 4};
    struct ddp_work *w = NULL;
    bad |= ddp_pg_allreduce_pieces_start(pg, &hole, 1, DDP_F32, DDP_SUM, -1, &w) != DDP_EINVAL;
    bad |= ddp_pg_allreduce_pieces(pg, &hole, 1, DDP_F32, DDP_SUM, -1) != DDP_EINVAL;
    if (piece_threads) /* the helpers did share them out */
        bad |= ddp__team_size(pg->comm.shm.team) != piece_threads;
    if (piece_tcp_split)
        bad |= ddp__team_size(pg->comm.tcp_team) != 2;
    if (piece_tcp_conns)
        bad |= ddp__team_size(pg->comm.tcp_team) != piece_tcp_conns;
    if (piece_tcp_inplace)
        bad |= pg->comm.stage_len != 0 || pg->comm.stage != NULL;
    for (int j = 0; piece_conns_auto && j < PW; j++) {
        int offer = ddp__tcp_auto_conns(ddp_usable_cpus());
        int want = j == pa->rank || pa->local_world > 1 ? 1 : offer, got_fds = 0;
        for (int st = 0; st < DDP__TCP_MAX_CONNS - 1; st++)
            got_fds += pg->comm.peers[j].sfd[st] >= 0;
        bad |= pg->comm.peers[j].nconns != want || got_fds != want - 1;
        bad |= pg->comm.tcp_conns != (pa->local_world > 1 ? 1 : offer);
        bad |= pa->local_world > 1 && pg->comm.tcp_team != NULL;
    }
    if (piece_flat_registered) /* each iteration's one buffer single-copy, on the helpers */
        bad |= pg->comm.shm.direct_done != 4 || pg->comm.shm.direct_shared != 4;
    if (piece_registered) /* and the pieces' too where every rank's are registered */
        bad |= pg->comm.shm.direct_done != (piece_registered == 1 ? 4u : 0u);
    pa->claimed = pg->comm.shm.claimed;
    for (size_t k = 0; k < np; k++)
        ddp_pg_mem_free(pg, mem[k]); /* either kind */
    ddp_pg_mem_free(pg, flat);       /* either kind */
    free(got);
    ddp_pg_free(pg);
    ddp_store_close(s);
    pa->rc = bad;
    return NULL;
}

static void run_pieces(int local_world)
{
    start_server();
    pthread_t th[PW];
    struct piece_arg pa[PW];
    for (int r = 0; r < PW; r++) {
        pa[r] = (struct piece_arg){.rank = r, .local_world = local_world};
        pthread_create(&th[r], NULL, piece_rank, &pa[r]);
    }
    for (int r = 0; r < PW; r++)
        pthread_join(th[r], NULL);
    stop_server();
    piece_claimed = 0;
    for (int r = 0; r < PW; r++) {
        ASSERT_EQ(pa[r].rc, 0);
        piece_claimed += pa[r].claimed;
    }
}

/* Small slots: many rounds, and shards that straddle pieces; local ranks 2 and 3 reduce their
 * shard in an accumulator, 0 and 1 in place: the bits of rank order either way. */
TEST(allreduce_in_pieces_equals_one_buffer_bit_for_bit_through_shared_memory)
{
    setenv("DDP_PG_SHM_SLOT_BYTES", "4096", 1);
    piece_rank_order = true;
    run_pieces(PW);
    piece_rank_order = false;
    unsetenv("DDP_PG_SHM_SLOT_BYTES");
}

/* Shared out over three threads per rank (worker/team.c): every part of each step moves its own
 * range of the pieces with a cursor of its own; the bits are those of one thread, and of one
 * buffer. 1.2 MB in 64 KiB slots: many rounds, parts that end inside pieces. */
TEST(allreduce_in_pieces_over_helper_threads_equals_one_buffer_bit_for_bit)
{
    setenv("DDP_PG_SHM_SLOT_BYTES", "65536", 1);
    setenv("DDP_PG_SHM_THREADS", "3", 1);
    PN = 300007;
    piece_threads = 3;
    piece_rank_order = true;
    run_pieces(PW);
    PN = 30011;
    piece_threads = 0;
    piece_rank_order = false;
    unsetenv("DDP_PG_SHM_THREADS");
    unsetenv("DDP_PG_SHM_SLOT_BYTES");
}

/* The one buffer in the ranks' registered memory, all-reduced single-copy (each rank's shard
 * reduced reading the peers' arenas in place, then the others' shards copied out of them) and
 * shared out over three threads per rank: the bits of the slots, and of rank order. 1.2 MB in
 * 256 KiB blocks, so parts end inside blocks and shards. */
TEST(single_copy_allreduce_over_helper_threads_equals_the_slots_bit_for_bit)
{
    setenv("DDP_PG_DIRECT_BYTES", "4096", 1);
    setenv("DDP_PG_DIRECT_BLOCK", "262144", 1);
    setenv("DDP_PG_SHM_THREADS", "3", 1);
    PN = 300007;
    piece_threads = 3;
    piece_rank_order = true;
    piece_flat_registered = true;
    run_pieces(PW);
    PN = 30011;
    piece_threads = 0;
    piece_rank_order = false;
    piece_flat_registered = false;
    unsetenv("DDP_PG_SHM_THREADS");
    unsetenv("DDP_PG_DIRECT_BLOCK");
    unsetenv("DDP_PG_DIRECT_BYTES");
}

/* The pieces in registered memory (worker/shm_claim.c): chunks claimed by whichever rank's
 * thread is free, summed in ranges within one piece of every rank (each rank cuts its buffer
 * its own way), over three threads per rank: the bits of rank order. Then with rank 1's
 * pieces malloc'd: every rank agrees on the slots. 1.2 MB. */
TEST(allreduce_in_registered_pieces_claimed_equals_one_buffer_bit_for_bit)
{
    setenv("DDP_PG_DIRECT_BYTES", "4096", 1);
    setenv("DDP_PG_CMA", "0", 1); /* the one buffer (malloc'd) through the slots */
    setenv("DDP_PG_SHM_THREADS", "3", 1);
    PN = 300007;
    piece_rank_order = true;
    for (int kind = 1; kind <= 2; kind++) {
        piece_registered = kind;
        run_pieces(PW);
        /* each chunk claimed once, by one rank or another: 4 all-reduces of 19 chunks */
        ASSERT_EQ(piece_claimed,
                  kind == 1 ? 4 * ((PN * 4 + DDP__CLAIM_CHUNK - 1) / DDP__CLAIM_CHUNK) : 0);
    }
    PN = 30011;
    piece_rank_order = false;
    piece_registered = 0;
    unsetenv("DDP_PG_SHM_THREADS");
    unsetenv("DDP_PG_CMA");
    unsetenv("DDP_PG_DIRECT_BYTES");
}

/* Two nodes of two: the hierarchical all-reduce (a TCP ring per shard) on scattered shards. */
TEST(allreduce_in_pieces_equals_one_buffer_bit_for_bit_across_nodes)
{
    setenv("DDP_PG_SHM_SLOT_BYTES", "8192", 1);
    run_pieces(2);
    unsetenv("DDP_PG_SHM_SLOT_BYTES");
}

/* TCP alone: the ring sends from the pieces and reduces and receives into them (120 KB, above
 * recursive doubling's 64 KiB: nothing staged), each rank's pieces cut its own way; below
 * 64 KiB, gathered into a staging buffer and scattered back. */
TEST(allreduce_in_pieces_equals_one_buffer_bit_for_bit_over_tcp)
{
    setenv("DDP_PG_TRANSPORT", "tcp", 1);
    piece_tcp_inplace = true;
    run_pieces(PW);
    piece_tcp_inplace = false;
    PN = 3001;
    run_pieces(PW);
    PN = 30011;
    unsetenv("DDP_PG_TRANSPORT");
}

/* Over TCP with a sending thread (DDP_PG_TCP_THREADS=2): 1.2 MB, so each ring step moves 300 KB
 * each way, over the 256 KiB from which a step sends on the second thread. */
TEST(allreduce_over_tcp_with_a_sending_thread_equals_one_buffer_bit_for_bit)
{
    setenv("DDP_PG_TRANSPORT", "tcp", 1);
    setenv("DDP_PG_TCP_THREADS", "2", 1);
    PN = 300007;
    piece_tcp_split = true;
    piece_tcp_inplace = true; /* the pieces' ring on the group's own thread */
    run_pieces(PW);
    piece_tcp_inplace = false;
    piece_tcp_split = false;
    PN = 30011;
    unsetenv("DDP_PG_TCP_THREADS");
    unsetenv("DDP_PG_TRANSPORT");
}

/* By default (DDP_PG_TCP_CONNS unset: auto), 2 connections between ranks that are each the only
 * rank of their node (4 on a machine of 8 usable CPUs or more), and stripes over them: 4 nodes of
 * 1 rank, the ring's bits; 2 nodes of 2 ranks: one connection to every peer, no stripes. */
TEST(by_default_two_connections_between_ranks_alone_on_their_nodes_one_otherwise)
{
    unsetenv("DDP_PG_TCP_CONNS");
    PN = 1300001;
    piece_tcp_conns = ddp__tcp_auto_conns(ddp_usable_cpus());
    piece_conns_auto = true;
    run_pieces(1);
    piece_tcp_conns = 0;
    run_pieces(2);
    piece_conns_auto = false;
    PN = 30011;
}

/* Over 3 connections per peer (DDP_PG_TCP_CONNS=3): 5.2 MB, so each ring step moves 1.3 MB each
 * way, over the 1 MiB from which a message is cut in stripes, a thread each; also in pieces,
 * each stripe sent from and reduced into them in place. The stripes start 108320 and 216656
 * elements into a chunk, not multiples of the inputs' period (1000): a stripe sent from the wrong
 * place fails. */
TEST(allreduce_over_tcp_in_stripes_has_the_rings_bits)
{
    setenv("DDP_PG_TRANSPORT", "tcp", 1);
    setenv("DDP_PG_TCP_CONNS", "3", 1);
    PN = 1300001;
    piece_tcp_conns = 3;
    piece_tcp_inplace = true;
    run_pieces(PW);
    piece_tcp_inplace = false;
    piece_tcp_conns = 0;
    PN = 30011;
    unsetenv("DDP_PG_TCP_CONNS");
    unsetenv("DDP_PG_TRANSPORT");
}
