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

#include "tests/unit/pg_fixture.h"

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
    start_server();
    ASSERT_EQ(failed_ranks(rank_main), 0);
    stop_server();
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
    start_server();
    ASSERT_EQ(failed_ranks(inline_rank), 0);
    stop_server();
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
    start_server();
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
    stop_server();
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
    start_server();
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
    stop_server();
}
