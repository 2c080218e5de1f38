/*
 * Unit tests for point-to-point inside a node (worker/p2p_shm.c): the ring's sleep flags and
 * bells step by step, a byte stream through a small ring between two threads, and groups of
 * threads whose pairs on one "node" talk through rings and across "nodes" over TCP (so TSan
 * sees the engines and the rings).
 */
#include "common/util.h"
#include "rendezvous/store.h"
#include "tests/unit/test.h"
#include "worker/group.h"
#include "worker/p2p_shm.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TOKEN "p2p-unit-token"

/* A ring of cap bytes in ordinary memory (the control block zeroed, as in a new segment). */
static struct ddp__ring ring_new(size_t cap)
{
    char *p = aligned_alloc(64, DDP__RING_CTL_BYTES + cap);
    ASSERT_TRUE(p != NULL);
    memset(p, 0, DDP__RING_CTL_BYTES);
    return (struct ddp__ring){
        .c = (struct ddp__ring_ctl *)p, .data = p + DDP__RING_CTL_BYTES, .cap = cap};
}

TEST(ring_bells_wake_only_a_sleeping_side)
{
    struct ddp__ring r = ring_new(4096);
    char in[5000], out[5000];
    bool bell;
    for (int i = 0; i < 5000; i++)
        in[i] = (char)(i * 7 + 1);
    /* an empty ring: the reader gets nothing and sleeps; the next write rings, once */
    ASSERT_EQ(ddp__ring_get(&r, out, 10, &bell), 0);
    ASSERT_TRUE(!bell);
    ASSERT_EQ(ddp__ring_put(&r, in, 100, &bell), 100);
    ASSERT_TRUE(bell);
    ASSERT_EQ(ddp__ring_put(&r, in + 100, 100, &bell), 100);
    ASSERT_TRUE(!bell);
    /* it takes what fits; a full ring puts the writer to sleep; the next read rings */
    ASSERT_EQ(ddp__ring_put(&r, in + 200, 4800, &bell), 4096 - 200);
    ASSERT_EQ(ddp__ring_put(&r, in, 1, &bell), 0);
    ASSERT_EQ(ddp__ring_get(&r, out, 1000, &bell), 1000);
    ASSERT_TRUE(bell);
    ASSERT_EQ(ddp__ring_get(&r, out + 1000, 5000, &bell), 4096 - 1000);
    ASSERT_TRUE(!bell);
    ASSERT_TRUE(memcmp(in, out, 4096) == 0);
    /* across the end of the data: a write that wraps reads back in order */
    ASSERT_EQ(ddp__ring_put(&r, in, 3000, &bell), 3000);
    ASSERT_EQ(ddp__ring_get(&r, out, 3000, &bell), 3000);
    ASSERT_TRUE(memcmp(in, out, 3000) == 0);
    free(r.c);
}

TEST(ring_reader_awake_between_messages_is_not_rung_for)
{
    struct ddp__ring r = ring_new(4096);
    char in[64] = "header", out[64];
    bool bell;
    /* a polling reader finds the ring empty without marking itself asleep: no ring */
    r.awake = true;
    ASSERT_EQ(ddp__ring_get(&r, out, 16, &bell), 0);
    ASSERT_EQ(ddp__ring_put(&r, in, 16, &bell), 16);
    ASSERT_TRUE(!bell);
    ASSERT_EQ(ddp__ring_get(&r, out, 16, &bell), 16);
    ASSERT_TRUE(memcmp(in, out, 16) == 0);
    /* about to sleep, it clears the flag and looks once more: now the next write rings */
    r.awake = false;
    ASSERT_EQ(ddp__ring_get(&r, out, 16, &bell), 0);
    ASSERT_EQ(ddp__ring_put(&r, in, 16, &bell), 16);
    ASSERT_TRUE(bell);
    /* the flag is the reader's: a full ring still marks the writer, whose reader rings */
    for (size_t left = 4096 - 16; left > 0;) {
        size_t k = ddp__ring_put(&r, out, left < sizeof(out) ? left : sizeof(out), &bell);
        ASSERT_TRUE(k > 0);
        left -= k;
    }
    ASSERT_EQ(ddp__ring_put(&r, in, 1, &bell), 0);
    r.awake = true;
    ASSERT_EQ(ddp__ring_get(&r, out, 1, &bell), 1);
    ASSERT_TRUE(bell);
    free(r.c);
}

TEST(ring_put_whole_writes_all_or_nothing)
{
    struct ddp__ring r = ring_new(4096);
    static char body[200016], out[4096];
    char hdr[16] = "0123456789abcdef";
    bool bell;
    for (size_t i = 0; i < sizeof(body); i++)
        body[i] = (char)(i * 13 + 5);
    /* a sleeping reader is rung once the whole message is in */
    ASSERT_EQ(ddp__ring_get(&r, out, 16, &bell), 0);
    ASSERT_TRUE(ddp__ring_put_whole(&r, hdr, 16, body, 3000, &bell));
    ASSERT_TRUE(bell);
    /* what does not fit is not written at all, and the writer is not marked asleep */
    ASSERT_TRUE(!ddp__ring_put_whole(&r, hdr, 16, body, 4096 - 3016 + 1, &bell));
    ASSERT_TRUE(!bell);
    ASSERT_TRUE(ddp__ring_put_whole(&r, hdr, 16, NULL, 0, &bell));
    ASSERT_EQ(ddp__ring_get(&r, out, sizeof(out), &bell), 3032);
    ASSERT_TRUE(!bell);
    ASSERT_TRUE(memcmp(out, hdr, 16) == 0 && memcmp(out + 16, body, 3000) == 0);
    ASSERT_TRUE(memcmp(out + 3016, hdr, 16) == 0);
    /* written in 64 KiB pieces, across the end of the data: 200,000 bytes in order */
    struct ddp__ring big = ring_new((size_t)256 << 10);
    static char back[(size_t)256 << 10];
    for (int round = 0; round < 3; round++) {
        ASSERT_TRUE(ddp__ring_put_whole(&big, hdr, 16, body + round, 200000, &bell));
        ASSERT_EQ(ddp__ring_get(&big, back, sizeof(back), &bell), 200016);
        ASSERT_TRUE(memcmp(back, hdr, 16) == 0 && memcmp(back + 16, body + round, 200000) == 0);
    }
    ASSERT_TRUE(!ddp__ring_put_whole(&big, hdr, 16, body, (size_t)256 << 10, &bell));
    free(big.c);
    free(r.c);
}

struct stream {
    struct ddp__ring r;
    size_t total;
    int bad;
};

static uint8_t stream_byte(size_t i)
{
    return (uint8_t)((i * 2654435761u) >> 13);
}

static void *writer(void *a)
{
    struct stream *s = a;
    uint8_t chunk[10007];
    unsigned seed = 1;
    for (size_t done = 0; done < s->total;) {
        size_t n = 1 + (size_t)rand_r(&seed) % sizeof(chunk);
        if (n > s->total - done)
            n = s->total - done;
        for (size_t i = 0; i < n; i++)
            chunk[i] = stream_byte(done + i);
        for (size_t off = 0; off < n;) {
            bool bell;
            size_t k = ddp__ring_put(&s->r, chunk + off, n - off, &bell);
            off += k;
            if (k == 0)
                sched_yield();
        }
        done += n;
    }
    return NULL;
}

TEST(ring_carries_a_byte_stream_between_threads_in_order)
{
    struct stream s = {.r = ring_new(4096), .total = (size_t)16 << 20};
    pthread_t th;
    pthread_create(&th, NULL, writer, &s);
    uint8_t chunk[6007];
    unsigned seed = 2;
    size_t bad_at = SIZE_MAX;
    for (size_t done = 0; done < s.total;) {
        size_t want = 1 + (size_t)rand_r(&seed) % sizeof(chunk);
        bool bell;
        size_t k = ddp__ring_get(&s.r, chunk, want, &bell);
        for (size_t i = 0; i < k && bad_at == SIZE_MAX; i++)
            if (chunk[i] != stream_byte(done + i))
                bad_at = done + i;
        done += k;
        if (k == 0)
            sched_yield();
    }
    pthread_join(th, NULL);
    ASSERT_EQ(bad_at, SIZE_MAX);
    free(s.r.c);
}

static struct ddp_store_server *srv;
static int port;

static void *serve(void *a)
{
    (void)a;
    ddp_store_server_run(srv);
    return NULL;
}

/* 4 ranks as 2 nodes of 2: ranks 0,1 and 2,3 share a node. */
enum { W = 4 };

static uint8_t msg_byte(int from, int to, size_t i)
{
    return (uint8_t)(from * 31 + to * 7 + (int)(i % 251));
}

struct rank_arg {
    int rank, rc;
    char why[200];
};

#define RFAIL(...)                                                                                 \
    do {                                                                                           \
        snprintf(ra->why, sizeof(ra->why), __VA_ARGS__);                                           \
        goto done;                                                                                 \
    } while (0)

static void *rank_main(void *a)
{
    struct rank_arg *ra = a;
    struct ddp_store *s = NULL;
    struct ddp_pg *pg = NULL;
    uint8_t *out[W] = {0}, *in[W] = {0};
    struct ddp_work *ws[W] = {0}, *wr[W] = {0};
    int me = ra->rank;
    ra->rc = 1;
    if (ddp_store_connect("127.0.0.1", port, TOKEN, strlen(TOKEN), 5000, &s) != 0)
        RFAIL("store");
    struct ddp_pg_opts o = {.timeout_ms = 20000, .name = "p2p-unit", .p2p = true};
    if (ddp_pg_init(s, me, W, me % 2, 2, me / 2, &o, &pg) != 0)
        RFAIL("group");
    /* the node's partner through rings, the other node over TCP */
    for (int j = 0; j < W; j++) {
        bool ring = pg->p2p_shm && pg->p2p_shm->in[j].data && pg->p2p_shm->out[j].data;
        if (j != me && ring != (j / 2 == me / 2))
            RFAIL("rank %d: rings with rank %d: %d", me, j, ring);
    }
    /* every pair both ways at once, 1 B to several times a ring; half the receives late */
    for (int j = 0; j < W; j++) {
        if (j == me)
            continue;
        size_t n = (size_t)(1 + me + j) * 333337u, m = (size_t)(1 + j + me) * 333337u;
        out[j] = malloc(n);
        in[j] = malloc(m);
        for (size_t i = 0; i < n; i++)
            out[j][i] = msg_byte(me, j, i);
        if (j % 2 == 0 && ddp_pg_recv_start(pg, in[j], m, j, 5, &wr[j]) != 0)
            RFAIL("recv");
        if (ddp_pg_send_start(pg, out[j], n, j, 5, &ws[j]) != 0)
            RFAIL("send");
    }
    for (int j = 1; j < W; j += 2)
        if (j != me &&
            ddp_pg_recv_start(pg, in[j], (size_t)(1 + j + me) * 333337u, j, 5, &wr[j]) != 0)
            RFAIL("late recv");
    for (int j = 0; j < W; j++) {
        if (j == me)
            continue;
        if (ddp_work_wait(wr[j]) != 0 || ddp_work_wait(ws[j]) != 0)
            RFAIL("rank %d with %d: %s", me, j, ddp_pg_last_error(pg));
        for (size_t i = 0; i < (size_t)(1 + j + me) * 333337u; i++)
            if (in[j][i] != msg_byte(j, me, i))
                RFAIL("rank %d: byte %zu from %d", me, i, j);
    }
    ra->rc = 0;
done:
    for (int j = 0; j < W; j++) {
        ddp_work_free(ws[j]);
        ddp_work_free(wr[j]);
        free(out[j]);
        free(in[j]);
    }
    ddp_pg_free(pg);
    if (s)
        ddp_store_close(s);
    return NULL;
}

/* n ranks as threads beside a store server, each running fn; fails naming the first that did. */
static void run_ranks(int n, void *(*fn)(void *))
{
    struct ddp_store_server_opts so = {
        .host = "127.0.0.1", .token = TOKEN, .token_len = strlen(TOKEN)};
    ASSERT_OK(ddp_store_server_new(&so, &srv));
    port = ddp_store_server_port(srv);
    pthread_t srv_th, th[W];
    pthread_create(&srv_th, NULL, serve, NULL);
    struct rank_arg ra[W];
    for (int r = 0; r < n; r++) {
        ra[r] = (struct rank_arg){.rank = r};
        pthread_create(&th[r], NULL, fn, &ra[r]);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        if (ra[r].rc)
            FAIL_AT("rank %d: %s", r, ra[r].why);
    }
    ddp_store_server_stop(srv);
    pthread_join(srv_th, NULL);
    ddp_store_server_free(srv);
}

static void run_group(void)
{
    run_ranks(W, rank_main);
}

TEST(pairs_on_a_node_use_rings_and_the_others_tcp)
{
    run_group();
}

TEST(messages_many_times_a_small_ring_arrive_whole)
{
    setenv("DDP_PG_P2P_SHM_BYTES", "4096", 1);
    run_group();
}

/* Rank me of a 2-rank group on one node with point-to-point on: 0, or -1 (what was made is
 * left in *s and *pg for the caller to free). */
static int pair_join(int me, const char *name, struct ddp_store **s, struct ddp_pg **pg)
{
    if (ddp_store_connect("127.0.0.1", port, TOKEN, strlen(TOKEN), 5000, s) != 0)
        return -1;
    struct ddp_pg_opts o = {.timeout_ms = 20000, .name = name, .p2p = true};
    return ddp_pg_init(*s, me, 2, me, 2, 0, &o, pg) != 0 ? -1 : 0;
}

/* 2 ranks of one node, ping-pong of one small message with 2 ms of silence before each: both
 * engines have stopped polling and sleep in poll(2) when it comes, so each send is taken
 * through the engine's wake-up pipe and each message found through its doorbell. A wake-up
 * missed waits out the rest of the engine's 100 ms poll timeout: the 20 messages of a rank's
 * 10 round trips took 2 s with the reader never marked asleep, and 1.9 s with the pipe never
 * written. The bound leaves a slow VM 1 s beyond the silences for 20 wake-ups. */
enum { PINGS = 20 };

static void *idle_rank(void *a)
{
    struct rank_arg *ra = a;
    struct ddp_store *s = NULL;
    struct ddp_pg *pg = NULL;
    int me = ra->rank, peer = 1 - me;
    ra->rc = 1;
    if (pair_join(me, "p2p-idle", &s, &pg) != 0)
        RFAIL("rank %d: no store or group", me);
    if (!pg->p2p_shm || !pg->p2p_shm->in[peer].data)
        RFAIL("rank %d: no rings", me);
    uint64_t v = 0;
    int64_t busy = 0;
    for (int i = 0; i < PINGS; i++) {
        if (me == (i & 1)) {
            nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
            int64_t t0 = ddp_now_ns();
            v = (uint64_t)i * 1000003u + 7;
            if (ddp_pg_send(pg, &v, sizeof(v), peer, 9) != 0)
                RFAIL("send %d: %s", i, ddp_pg_last_error(pg));
            if (ddp_pg_recv(pg, &v, sizeof(v), peer, 9) != 0)
                RFAIL("recv %d: %s", i, ddp_pg_last_error(pg));
            busy += ddp_now_ns() - t0 - 2000000;
            if (v != (uint64_t)i * 1000003u + 8)
                RFAIL("rank %d: reply %d is %llu", me, i, (unsigned long long)v);
        } else {
            if (ddp_pg_recv(pg, &v, sizeof(v), peer, 9) != 0)
                RFAIL("recv %d: %s", i, ddp_pg_last_error(pg));
            nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
            v++;
            if (ddp_pg_send(pg, &v, sizeof(v), peer, 9) != 0)
                RFAIL("reply %d: %s", i, ddp_pg_last_error(pg));
        }
    }
    if (busy > 1000000000)
        RFAIL("%d round trips took %lld ms beyond their silences: a doorbell missed?", PINGS / 2,
              (long long)(busy / 1000000));
    ra->rc = 0;
done:
    ddp_pg_free(pg);
    if (s)
        ddp_store_close(s);
    return NULL;
}

TEST(messages_after_silence_wake_a_sleeping_engine)
{
    run_ranks(2, idle_rank);
}

/* A small send, which the caller writes into the ring itself when nothing is queued before
 * it, never overtakes a larger one to the same peer still in the engine's hands: rank 0
 * starts a message the engine carries (100 KiB, or 3 MiB: three rings' worth) and at once
 * small ones with the same tag; rank 1's receives, posted in the same order, each get the
 * message of their size and round. */
enum { ORDER_ROUNDS = 30 };

static void *order_rank(void *a)
{
    struct rank_arg *ra = a;
    struct ddp_store *s = NULL;
    struct ddp_pg *pg = NULL;
    int me = ra->rank, peer = 1 - me;
    size_t bigmax = (size_t)3 << 20;
    uint8_t *big = malloc(bigmax);
    uint64_t small[3];
    struct ddp_work *w[4] = {0};
    ra->rc = 1;
    if (!big)
        RFAIL("memory");
    if (pair_join(me, "p2p-order", &s, &pg) != 0)
        RFAIL("rank %d: no store or group", me);
    for (int i = 0; i < ORDER_ROUNDS; i++) {
        size_t nb = i % 3 == 2 ? bigmax : (size_t)100 << 10;
        int r = 0;
        if (me == 0) {
            memset(big, i + 1, nb);
            for (int k = 0; k < 3; k++)
                small[k] = (uint64_t)i * 10 + (uint64_t)k;
            r = ddp_pg_send_start(pg, big, nb, peer, 3, &w[0]);
            for (int k = 0; k < 3 && r == 0; k++)
                r = ddp_pg_send_start(pg, &small[k], 8, peer, 3, &w[k + 1]);
        } else {
            r = ddp_pg_recv_start(pg, big, nb, peer, 3, &w[0]);
            for (int k = 0; k < 3 && r == 0; k++)
                r = ddp_pg_recv_start(pg, &small[k], 8, peer, 3, &w[k + 1]);
        }
        for (int k = 0; k < 4; k++) {
            if (w[k] && ddp_work_wait(w[k]) != 0 && r == 0)
                r = -1;
            ddp_work_free(w[k]);
            w[k] = NULL;
        }
        if (r != 0)
            RFAIL("round %d: %s", i, ddp_pg_last_error(pg));
        if (me == 1) {
            if (big[0] != (uint8_t)(i + 1) || big[nb - 1] != (uint8_t)(i + 1))
                RFAIL("round %d: the large message holds another round's bytes", i);
            for (int k = 0; k < 3; k++)
                if (small[k] != (uint64_t)i * 10 + (uint64_t)k)
                    RFAIL("round %d: small message %d is %llu", i, k, (unsigned long long)small[k]);
        }
    }
    ra->rc = 0;
done:
    ddp_pg_free(pg);
    if (s)
        ddp_store_close(s);
    free(big);
    return NULL;
}

TEST(small_sends_keep_their_order_behind_queued_ones)
{
    run_ranks(2, order_rank);
}
