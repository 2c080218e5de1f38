/*
 * Unit tests for worker/: reduction kernels against float references, and
 * whole process groups formed by threads of one process (so TSan sees the
 * communication threads and the work queue).
 */
#include "rendezvous/store.h"
#include "tests/unit/test.h"
#include "worker/coll.h"
#include "worker/pg.h"
#include "worker/pg_nccl.h"
#include "worker/group.h"
#include "worker/team.h"
#include "common/cpus.h"
#include "common/progress.h"
#include "common/util.h"

#include <math.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#define TOKEN "pg-unit-token"

TEST(half_conversions_round_to_nearest_even)
{
    /* bf16: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even (1.0). */
    ASSERT_EQ(ddp__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    ASSERT_EQ(ddp__f32_to_bf16(1.0f + 0x1p-8f + 0x1p-12f), 0x3f81);
    ASSERT_TRUE(ddp__bf16_to_f32(0x4049) == 3.140625f);
    ASSERT_TRUE(isnan(ddp__bf16_to_f32(ddp__f32_to_bf16(NAN))));
    /* f16: exact values, ties to even, overflow, subnormals */
    ASSERT_EQ(ddp__f32_to_f16(1.0f), 0x3c00);
    ASSERT_EQ(ddp__f32_to_f16(-2.0f), 0xc000);
    ASSERT_EQ(ddp__f32_to_f16(65504.0f), 0x7bff);
    ASSERT_EQ(ddp__f32_to_f16(1e6f), 0x7c00);
    ASSERT_EQ(ddp__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    ASSERT_EQ(ddp__f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    ASSERT_EQ(ddp__f32_to_f16(0x1p-24f), 0x0001); /* smallest subnormal */
    ASSERT_TRUE(ddp__f16_to_f32(0x0001) == 0x1p-24f);
    ASSERT_TRUE(ddp__f16_to_f32(0x03ff) == 0x3ffp-24f);
    /* every f16 value survives a round trip through float32 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue; /* NaNs */
        ASSERT_EQ(ddp__f32_to_f16(ddp__f16_to_f32((uint16_t)h)), h);
    }
}

TEST(reduce_kernels)
{
    float a[3] = {1, -2, 3}, b[3] = {4, 5, -6};
    ddp__reduce(a, b, 3, DDP_F32, DDP_SUM);
    ASSERT_TRUE(a[0] == 5 && a[1] == 3 && a[2] == -3);
    ddp__reduce(a, b, 3, DDP_F32, DDP_MAX);
    ASSERT_TRUE(a[0] == 5 && a[1] == 5 && a[2] == -3);
    int32_t x[2] = {INT32_MAX, -5}, y[2] = {1, 2};
    ddp__reduce(x, y, 2, DDP_I32, DDP_SUM); /* wraps, defined */
    ASSERT_EQ(x[0], INT32_MIN);
    ddp__reduce(x, y, 2, DDP_I32, DDP_MIN);
    ASSERT_EQ(x[1], -3);
    int64_t q[1] = {-7};
    ddp__scale_avg(q, 1, DDP_I64, 2);
    ASSERT_EQ(q[0], -3); /* truncated toward zero */
    uint16_t h[2] = {ddp__f32_to_bf16(1.5f), ddp__f32_to_bf16(-4)},
             g[2] = {ddp__f32_to_bf16(2.25f), ddp__f32_to_bf16(1)};
    ddp__reduce(h, g, 2, DDP_BF16, DDP_SUM);
    ASSERT_TRUE(ddp__bf16_to_f32(h[0]) == 3.75f && ddp__bf16_to_f32(h[1]) == -3.0f);
    ASSERT_EQ(ddp_dtype_size(DDP_BF16), 2);
    ASSERT_EQ(ddp_dtype_size((enum ddp_dtype)99), 0);
}

/* The average's division: multiplication by an exact reciprocal for powers of two must give
 * the bits division gives, for every float (random bit patterns: normals, subnormals, huge). */
TEST(averages_give_the_bits_of_a_division_in_one_pass_or_two)
{
    enum { K = 1 << 16 };
    static float f[K], want[K];
    static double d[K], dwant[K];
    uint64_t x = 88172645463325252ull;
    for (int world = 1; world <= 16; world++) {
        for (int i = 0; i < K; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint32_t u = (uint32_t)x;
            if (i % 4 == 0)
                u &= 0x807fffffu; /* a subnormal (or zero) */
            if ((u & 0x7f800000u) == 0x7f800000u)
                u &= 0xbfffffffu; /* no inf/NaN */
            memcpy(&f[i], &u, 4);
            want[i] = f[i] / (float)world;
            uint64_t v = x;
            if ((v & 0x7ff0000000000000ull) == 0x7ff0000000000000ull)
                v &= 0xbfffffffffffffffull;
            if (i % 4 == 1)
                v &= 0x800fffffffffffffull;
            memcpy(&d[i], &v, 8);
            dwant[i] = d[i] / world;
        }
        /* the fused last step of an average, (a + b) / world in one pass, against the two
         * passes: b is the input reversed */
        static float fa[K], fb[K], ft[K];
        static double da[K], db[K], dt2[K];
        for (int i = 0; i < K; i++) {
            fa[i] = ft[i] = f[i];
            fb[i] = f[K - 1 - i];
            da[i] = dt2[i] = d[i];
            db[i] = d[K - 1 - i];
        }
        ddp__reduce_avg(fa, fb, K, DDP_F32, world);
        ddp__reduce(ft, fb, K, DDP_F32, DDP_AVG);
        ddp__scale_avg(ft, K, DDP_F32, world);
        ddp__reduce_avg(da, db, K, DDP_F64, world);
        ddp__reduce(dt2, db, K, DDP_F64, DDP_AVG);
        ddp__scale_avg(dt2, K, DDP_F64, world);
        ASSERT_TRUE(memcmp(fa, ft, sizeof(fa)) == 0);
        ASSERT_TRUE(memcmp(da, dt2, sizeof(da)) == 0);
        ddp__scale_avg(f, K, DDP_F32, world);
        ddp__scale_avg(d, K, DDP_F64, world);
        ASSERT_TRUE(memcmp(f, want, sizeof(f)) == 0);
        ASSERT_TRUE(memcmp(d, dwant, sizeof(d)) == 0);
    }
}

/* The three-operand kernels (the first step of a shard's reduction, slot 0 op slot 1 into the
 * output) and the right-in-place ones (slot 0 op our own elements, where they lie) give the
 * bits of copying the left operand out and reducing in place, for every dtype and op, NaNs
 * and subnormals included (random bit patterns: max and min are not symmetric in NaNs, so an
 * operand order swapped would show). */
TEST(three_operand_and_right_in_place_kernels_give_the_bits_of_copy_then_reduce)
{
    enum { K = 4099 };
    static uint8_t a[K * 8], b[K * 8], want[K * 8], got[K * 8];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof(a); i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        a[i] = (uint8_t)x;
        b[i] = (uint8_t)(x >> 8);
    }
    const enum ddp_dtype dts[] = {DDP_F32, DDP_F64, DDP_I32, DDP_I64, DDP_BF16, DDP_F16};
    const enum ddp_redop ops[] = {DDP_SUM, DDP_MAX, DDP_MIN, DDP_AVG};
    for (size_t t = 0; t < 6; t++) {
        size_t bytes = K * ddp_dtype_size(dts[t]);
        for (size_t o = 0; o < 4; o++) {
            memcpy(want, a, bytes);
            ddp__reduce(want, b, K, dts[t], ops[o]);
            memset(got, 0xa5, bytes);
            ddp__reduce_to(got, a, b, K, dts[t], ops[o]);
            ASSERT_TRUE(memcmp(got, want, bytes) == 0);
            memcpy(got, b, bytes);
            ddp__reduce_rev(got, a, K, dts[t], ops[o]);
            ASSERT_TRUE(memcmp(got, want, bytes) == 0);
        }
        for (int world = 2; world <= 3; world++) {
            memcpy(want, a, bytes);
            ddp__reduce_avg(want, b, K, dts[t], world);
            ddp__reduce_avg_to(got, a, b, K, dts[t], world);
            ASSERT_TRUE(memcmp(got, want, bytes) == 0);
            memcpy(got, b, bytes);
            ddp__reduce_avg_rev(got, a, K, dts[t], world);
            ASSERT_TRUE(memcmp(got, want, bytes) == 0);
        }
    }
}

static struct ddp_store_server *srv;
static pthread_t srv_th;
static int port;

static void *serve(void *a)
{
    (void)a;
    ddp_store_server_run(srv);
    return NULL;
}

/* The groups' store, served by a thread of this process. */
static void store_up(void)
{
    struct ddp_store_server_opts so = {
        .host = "127.0.0.1", .token = TOKEN, .token_len = strlen(TOKEN)};
    ASSERT_OK(ddp_store_server_new(&so, &srv));
    port = ddp_store_server_port(srv);
    pthread_create(&srv_th, NULL, serve, NULL);
}

static void store_down(void)
{
    ddp_store_server_stop(srv);
    pthread_join(srv_th, NULL);
    ddp_store_server_free(srv);
}

/* A thread rank's group (ranks numbered node by node, local_world per node), over its own
 * store connection; NULL, with nothing left open, on failure. */
static struct ddp_pg *join(const char *name, int rank, int world, int local_world,
                           struct ddp_store **s)
{
    struct ddp_pg *pg;
    if (ddp_store_connect("127.0.0.1", port, TOKEN, strlen(TOKEN), 5000, s) != 0)
        return NULL;
    struct ddp_pg_opts o = {.timeout_ms = 20000, .name = name};
    if (ddp_pg_init(*s, rank, world, rank % local_world, local_world, rank / local_world, &o,
                    &pg) != 0) {
        ddp_store_close(*s);
        return NULL;
    }
    return pg;
}

enum { W = 3, N = 50021 };

struct rank_arg {
    int rank, rc;
};

static void *rank_main(void *a)
{
    struct rank_arg *ra = a;
    struct ddp_store *s;
    struct ddp_pg *pg;
    ra->rc = -1;
    if (!(pg = join("unit", ra->rank, W, W, &s)))
        return NULL;
    float *buf = malloc(N * sizeof(float)), *b2 = malloc(N * sizeof(float));
    int bad = 0;
    for (int it = 0; it < 5 && !bad; it++) {
        for (int i = 0; i < N; i++) {
            buf[i] = (float)(ra->rank + i % 7 + it);
            b2[i] = (float)(ra->rank * 2);
        }
        struct ddp_work *w1 = NULL, *w2 = NULL, *w3 = NULL;
        /* two in flight at once, plus a barrier behind them */
        if (ddp_pg_allreduce_start(pg, buf, N, DDP_F32, DDP_SUM, &w1) ||
            ddp_pg_allreduce_start(pg, b2, N, DDP_F32, DDP_MAX, &w2) ||
            ddp_pg_barrier_start(pg, &w3)) {
            bad = 1;
        } else {
            bad |= ddp_work_wait(w3) != 0;
            bad |= ddp_work_wait(w1) != 0 || ddp_work_wait(w2) != 0;
        }
        ddp_work_free(w1);
        ddp_work_free(w2);
        ddp_work_free(w3);
        for (int i = 0; i < N && !bad; i++)
            bad |= buf[i] != (float)(0 + 1 + 2 + 3 * (i % 7 + it)) || b2[i] != 4.0f;
        /* A blocking call right behind queued work: it must wait its turn (the inline fast
         * path applies only to an idle group), then run. */
        int64_t v[2] = {ra->rank, 1};
        struct ddp_work *wq = NULL;
        if (ddp_pg_allreduce_start(pg, buf, N, DDP_F32, DDP_SUM, &wq) != 0) {
            bad = 1;
        } else {
            bad |= ddp_pg_allreduce(pg, v, 2, DDP_I64, DDP_SUM) != 0;
            bad |= !ddp_work_test(wq, NULL); /* issued first, so done first */
            ddp_work_free(wq);
        }
        bad |= v[0] != 0 + 1 + 2 || v[1] != W;
        bad |= ddp_pg_barrier(pg) != 0;
    }
    free(buf);
    free(b2);
    ddp_pg_free(pg);
    ddp_store_close(s); /* the group used it until it was freed */
    ra->rc = bad;
    return NULL;
}

/* Runs fn as W ranks, a thread each, against the store; how many of them failed. */
static int failed_ranks(void *(*fn)(void *))
{
    pthread_t th[W];
    struct rank_arg ra[W];
    for (int r = 0; r < W; r++) {
        ra[r].rank = r;
        pthread_create(&th[r], NULL, fn, &ra[r]);
    }
    int bad = 0;
    for (int r = 0; r < W; r++) {
        pthread_join(th[r], NULL);
        bad += ra[r].rc != 0;
    }
    return bad;
}

TEST(groups_formed_by_threads_reduce_correctly)
{
    store_up();
    ASSERT_EQ(failed_ranks(rank_main), 0);
    store_down();
}

/* ---- work queued by a second thread while a blocking call runs inline ---- */

enum { QN = 4 << 20 }; /* 16 MiB: a few milliseconds, long enough to queue behind */

struct queue_arg {
    struct ddp_pg *pg;
    float *b;
    int rc;
};

static void *queue_behind(void *a)
{
    struct queue_arg *qa = a;
    struct ddp_work *w = NULL;
    usleep(300);
    qa->rc = ddp_pg_allreduce_start(qa->pg, qa->b, QN, DDP_F32, DDP_SUM, &w);
    if (qa->rc == 0) {
        qa->rc = ddp_work_wait(w); /* hangs if the end of the inline call did not wake the
                                      communication thread for it */
        ddp_work_free(w);
    }
    return NULL;
}

static void *inline_rank(void *a)
{
    struct rank_arg *ra = a;
    struct ddp_store *s;
    struct ddp_pg *pg;
    ra->rc = -1;
    if (!(pg = join("inline", ra->rank, W, W, &s)))
        return NULL;
    /* Both buffers hold the same values, so the sums are right whichever of the two
     * collectives each rank ends up issuing first. */
    float *a1 = malloc(QN * sizeof(float)), *b1 = malloc(QN * sizeof(float));
    int bad = 0;
    for (int it = 0; it < 3 && !bad; it++) {
        for (int i = 0; i < QN; i++)
            a1[i] = b1[i] = (float)(ra->rank + i % 5);
        struct queue_arg qa = {.pg = pg, .b = b1, .rc = -1};
        pthread_t t;
        pthread_create(&t, NULL, queue_behind, &qa);
        bad |= ddp_pg_allreduce(pg, a1, QN, DDP_F32, DDP_SUM) != 0;
        pthread_join(t, NULL);
        bad |= qa.rc != 0;
        for (int i = 0; i < QN && !bad; i++)
            bad |= a1[i] != (float)(0 + 1 + 2 + 3 * (i % 5)) || b1[i] != a1[i];
    }
    free(a1);
    free(b1);
    ddp_pg_free(pg);
    ddp_store_close(s);
    ra->rc = bad;
    return NULL;
}

TEST(work_queued_during_an_inline_call_runs_after_it)
{
    store_up();
    ASSERT_EQ(failed_ranks(inline_rank), 0);
    store_down();
}

/* ---- all-reduce of a buffer in pieces (the reducer's buckets without bucket view) ---- */

enum { PW = 4 };
static size_t PN = 30011;     /* elements of the buffer in pieces */
static int piece_threads;     /* with shared memory: threads each rank's all-reduces must use */
static bool piece_rank_order; /* one node's slots: the bits of summing in rank order */
static bool piece_flat_registered; /* the one buffer in registered memory, single-copy */
/* the pieces in registered memory, single-copy in claimed chunks: 1 every rank's, 2 all but
 * rank 1's (whose malloc'd pieces send every rank to the slots) */
static int piece_registered;
static bool piece_tcp_split;  /* over TCP: the sending thread did start */
static int piece_tcp_conns;   /* over TCP: the stripes' threads did start, and the ring's bits */
static bool piece_conns_auto; /* each peer's connections as the default rule has them */

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
    ddp_pg_mem_free(pg, flat); /* either kind */
    free(got);
    ddp_pg_free(pg);
    ddp_store_close(s);
    pa->rc = bad;
    return NULL;
}

static void run_pieces(int local_world)
{
    store_up();
    pthread_t th[PW];
    struct piece_arg pa[PW];
    for (int r = 0; r < PW; r++) {
        pa[r] = (struct piece_arg){.rank = r, .local_world = local_world};
        pthread_create(&th[r], NULL, piece_rank, &pa[r]);
    }
    for (int r = 0; r < PW; r++)
        pthread_join(th[r], NULL);
    store_down();
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

/* TCP alone: gathered into a staging buffer and scattered back. */
TEST(allreduce_in_pieces_equals_one_buffer_bit_for_bit_over_tcp)
{
    setenv("DDP_PG_TRANSPORT", "tcp", 1);
    run_pieces(PW);
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
    run_pieces(PW);
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
 * whose staging buffer goes the same way. The stripes start 108320 and 216656 elements into a
 * chunk, not multiples of the inputs' period (1000): a stripe sent from the wrong place fails. */
TEST(allreduce_over_tcp_in_stripes_has_the_rings_bits)
{
    setenv("DDP_PG_TRANSPORT", "tcp", 1);
    setenv("DDP_PG_TCP_CONNS", "3", 1);
    PN = 1300001;
    piece_tcp_conns = 3;
    run_pieces(PW);
    piece_tcp_conns = 0;
    PN = 30011;
    unsetenv("DDP_PG_TCP_CONNS");
    unsetenv("DDP_PG_TRANSPORT");
}

struct nccl_arg {
    int rank;
    int rc;
    uint8_t id[DDP__NCCL_ID_BYTES];
};

static void *nccl_thread(void *a)
{
    struct nccl_arg *n = a;
    struct ddp_store *s;
    if (ddp_store_connect("127.0.0.1", port, TOKEN, strlen(TOKEN), 5000, &s) != 0)
        return NULL;
    n->rc = ddp__pg_nccl_id(s, "nccl/0", n->rank, 10000, n->id);
    ddp_store_close(s);
    return NULL;
}

TEST(nccl_unique_id_broadcast)
{
    store_up();
    struct nccl_arg a[3];
    pthread_t th[3];
    /* start the receivers first: they must wait for rank 0 */
    for (int i = 2; i >= 0; i--) {
        memset(&a[i], 0, sizeof(a[i]));
        a[i].rc = -1;
        a[i].rank = i;
        pthread_create(&th[i], NULL, nccl_thread, &a[i]);
        if (i == 1)
            usleep(100000);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
#ifdef DDP_HAVE_NCCL
    for (int i = 0; i < 3; i++)
        ASSERT_OK(a[i].rc);
    ASSERT_MEMEQ(a[0].id, a[1].id, DDP__NCCL_ID_BYTES);
    ASSERT_MEMEQ(a[0].id, a[2].id, DDP__NCCL_ID_BYTES);
    uint8_t zero[DDP__NCCL_ID_BYTES] = {0};
    ASSERT_TRUE(memcmp(a[0].id, zero, sizeof(zero)) != 0);
    /* the id is NCCL's own: its first bytes hold the bootstrap root's socket family */
    printf("nccl id bytes: %02x %02x %02x %02x ...\n", a[0].id[0], a[0].id[1], a[0].id[2],
           a[0].id[3]);
#else
    for (int i = 0; i < 3; i++)
        ASSERT_ERR(a[i].rc, DDP_ENOTSUP);
#endif
    store_down();
}

TEST(bad_arguments_are_refused)
{
    struct ddp_pg *pg = NULL;
    ASSERT_ERR(ddp_pg_init(NULL, 0, 1, 0, 1, 0, NULL, &pg), DDP_EINVAL);
    ASSERT_ERR(ddp_pg_allreduce(NULL, NULL, 0, DDP_F32, DDP_SUM), DDP_EINVAL);
}

/* ---- the flight recorder ---- */

struct rec_arg {
    int rank, rc;
    char *dump;
};

static void *rec_rank(void *a)
{
    struct rec_arg *ra = a;
    struct ddp_store *s;
    struct ddp_pg *pg;
    ra->rc = -1;
    if (!(pg = join("rec", ra->rank, 2, 2, &s)))
        return NULL;
    float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double d[2] = {1, 2};
    struct ddp_work *w = NULL;
    int bad = ddp_pg_allreduce(pg, f, 4, DDP_F32, DDP_SUM) != 0;
    bad |= ddp_pg_allreduce_start_bucket(pg, f, 8, DDP_F32, DDP_AVG, 7, &w) != 0;
    bad |= w == NULL || ddp_work_wait(w) != 0;
    ddp_work_free(w);
    bad |= ddp_pg_broadcast(pg, d, 2, DDP_F64, 1) != 0;
    bad |= ddp_pg_barrier(pg) != 0;
    /* the blocking bucket forms (inline: the group is idle) note their bucket too */
    bad |= ddp_pg_allreduce_bucket(pg, f, 2, DDP_F32, DDP_MAX, 9) != 0;
    struct ddp_piece pc[2] = {{f, 3}, {d, 0}};
    bad |= ddp_pg_allreduce_pieces(pg, pc, 2, DDP_F32, DDP_MIN, 2) != 0;
    size_t len;
    FILE *m = open_memstream(&ra->dump, &len);
    ddp_pg_dump_recorder(pg, m, 10);
    fclose(m);
    ddp_pg_free(pg);
    ddp_store_close(s);
    ra->rc = bad;
    return NULL;
}

TEST(flight_recorder_keeps_each_collective_and_fills_the_agents_page)
{
    /* The page a node agent would give: the first group of the process writes there. */
    int fd = memfd_create("progress", 0);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ(ftruncate(fd, sizeof(struct ddp_progress_page)), 0);
    struct ddp_progress_page *p = mmap(NULL, sizeof(*p), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_TRUE(p != MAP_FAILED);
    char fds[16];
    snprintf(fds, sizeof(fds), "%d", dup(fd));
    setenv("DDPRUN_PROGRESS_FD", fds, 1);
    store_up();
    pthread_t th[2];
    struct rec_arg ra[2] = {{.rank = 0}, {.rank = 1}};
    for (int r = 0; r < 2; r++)
        pthread_create(&th[r], NULL, rec_rank, &ra[r]);
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        ASSERT_EQ(ra[r].rc, 0);
        /* every group has its own recorder, in the order it ran its collectives */
        const char *want[] = {
            "#1 allreduce f32 16 bytes: done",         "#2 allreduce f32 32 bytes bucket 7: done",
            "#3 broadcast f64 16 bytes: done",         "#4 barrier f32 0 bytes: done",
            "#5 allreduce f32 8 bytes bucket 9: done", "#6 allreduce f32 12 bytes bucket 2: done"};
        const char *at = ra[r].dump;
        for (int k = 0; k < 6; k++) {
            const char *hit = strstr(at, want[k]);
            if (!hit)
                FAIL_AT("rank %d's recorder lacks '%s' in order:\n%s", r, want[k], ra[r].dump);
            at = hit + strlen(want[k]);
        }
        ASSERT_TRUE(strstr(at, "#7") == NULL);
        free(ra[r].dump);
    }
    /* One group only wrote the page (the other kept a private ring), and let it go. */
    ASSERT_EQ(p->magic, DDP_PROGRESS_MAGIC);
    ASSERT_TRUE(p->rank == 0 || p->rank == 1);
    ASSERT_EQ(p->world, 2);
    ASSERT_EQ(atomic_load(&p->entered), 6);
    ASSERT_EQ(atomic_load(&p->started), 6);
    ASSERT_EQ(atomic_load(&p->completed), 6);
    ASSERT_EQ(atomic_load(&p->attached), 0);
    /* when the group that wrote it was formed (the startup timeline), on this clock */
    ASSERT_TRUE(atomic_load(&p->attached_ns) > 0 && atomic_load(&p->attached_ns) <= ddp_now_ns());
    struct ddp_progress_ent e;
    ASSERT_TRUE(ddp_progress_read(p, 2, &e));
    ASSERT_EQ(e.op, DDP_PROG_ALLREDUCE);
    ASSERT_EQ(e.bucket, 7);
    ASSERT_EQ(e.bytes, 32);
    ASSERT_TRUE(atomic_load(&e.t_enq) > 0 && atomic_load(&e.t_enq) <= atomic_load(&e.t_start) &&
                atomic_load(&e.t_start) <= atomic_load(&e.t_end));
    ASSERT_TRUE(ddp_progress_read(p, 6, &e));
    ASSERT_EQ(e.bucket, 2);
    ASSERT_TRUE(!ddp_progress_read(p, 7, &e)); /* never issued */
    store_down();
}
