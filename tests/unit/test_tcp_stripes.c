/*
 * TCP stripes (worker/coll_tcp.c) apart from a process group's setup: the default's count of
 * connections per pair (a rank's offer from its usable CPUs, a pair's the smaller of two), and
 * an all-reduce over hand-built comms on socket pairs whose pairs have different counts, as
 * that default gives ranks of different CPU counts.
 */
#include "tests/unit/test.h"
#include "common/util.h"
#include "worker/coll.h"
#include "worker/team.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The default's rule apart from the machine: a rank offers 4 connections from 8 usable CPUs, 2
 * below; a pair of ranks alone on their nodes takes the smaller offer, seen alike from both
 * ends; DDP_PG_TCP_CONNS wins over both; ranks sharing a node have one. */
TEST(auto_connections_are_4_from_8_usable_cpus_and_a_pair_takes_the_smaller_offer)
{
    ASSERT_EQ(ddp__tcp_auto_conns(1), 2);
    ASSERT_EQ(ddp__tcp_auto_conns(2), 2);
    ASSERT_EQ(ddp__tcp_auto_conns(7), 2);
    ASSERT_EQ(ddp__tcp_auto_conns(8), 4);
    ASSERT_EQ(ddp__tcp_auto_conns(256), 4);
    ASSERT_EQ(ddp__tcp_pair_conns(0, true, 4, 4), 4);
    ASSERT_EQ(ddp__tcp_pair_conns(0, true, 4, 2), 2);
    ASSERT_EQ(ddp__tcp_pair_conns(0, true, 2, 4), 2);
    ASSERT_EQ(ddp__tcp_pair_conns(0, false, 4, 4), 1);
    ASSERT_EQ(ddp__tcp_pair_conns(3, true, 2, 4), 3);
    ASSERT_EQ(ddp__tcp_pair_conns(3, false, 4, 4), 3);
}

/* DDP_PG_TCP_STRIPE_BYTES: unset is the default; a number of bytes in range is taken; below
 * 64 KiB, above 1 GiB, negative or not a number is the default. */
TEST(stripe_size_from_the_environment)
{
    unsetenv("DDP_PG_TCP_STRIPE_BYTES");
    ASSERT_EQ(ddp__tcp_stripe_env(), DDP__TCP_STRIPE_BYTES);
    setenv("DDP_PG_TCP_STRIPE_BYTES", "262144", 1);
    ASSERT_EQ(ddp__tcp_stripe_env(), (size_t)262144);
    setenv("DDP_PG_TCP_STRIPE_BYTES", "65536", 1);
    ASSERT_EQ(ddp__tcp_stripe_env(), (size_t)65536);
    const char *bad[] = {"65535", "1073741825", "-1", "1M", "", "18446744073709551617"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        setenv("DDP_PG_TCP_STRIPE_BYTES", bad[i], 1);
        ASSERT_EQ(ddp__tcp_stripe_env(), DDP__TCP_STRIPE_BYTES);
    }
    unsetenv("DDP_PG_TCP_STRIPE_BYTES");
}

/* A ring whose pairs have different counts of connections, as the default gives ranks of
 * different CPU counts: 0-1 and 1-2 have 2, 2-0 has 4, so rank 0 sends in 2 stripes and
 * receives in 4, rank 2 the other way round. Three hand-built comms on socket pairs, a thread
 * each, an int32 all-reduce of n elements (ring steps of n/3), stripes from stripe bytes: the
 * exact sums, and the stripes' threads started. */
struct mixed_rank {
    struct ddp__comm c;
    struct ddp__peer peers[3];
    int32_t *buf;
    size_t n;
    int rc;
};

static void *mixed_thread(void *a)
{
    struct mixed_rank *m = a;
    m->c.deadline_ms = ddp_now_ms() + 60000;
    m->rc = ddp__tcp_allreduce(&m->c, m->buf, m->n, DDP_I32, DDP_SUM);
    return NULL;
}

static int32_t mixed_input(int r, size_t i)
{
    return (int32_t)((i % 1000) * 3 + (size_t)r * 1000003 + i / 7);
}

static void run_mixed(size_t n, size_t stripe)
{
    static struct mixed_rank m[3];
    int conns[3][3] = {{1, 2, 4}, {2, 1, 2}, {4, 2, 1}};
    memset(m, 0, sizeof(m));
    for (int r = 0; r < 3; r++) {
        m[r].c.rank = r;
        m[r].c.world = 3;
        m[r].c.peers = m[r].peers;
        m[r].c.small_bytes = 64 << 10;
        m[r].c.opname = "allreduce";
        m[r].c.tcp_conns = 1;
        m[r].c.tcp_stripe_bytes = stripe;
        m[r].n = n;
        for (int j = 0; j < 3; j++) {
            m[r].peers[j].rank = j;
            m[r].peers[j].fd = -1;
            m[r].peers[j].nconns = conns[r][j];
            for (int s = 0; s < DDP__TCP_MAX_CONNS - 1; s++)
                m[r].peers[j].sfd[s] = -1;
            if (conns[r][j] > m[r].c.tcp_conns)
                m[r].c.tcp_conns = conns[r][j];
        }
        ASSERT_TRUE((m[r].buf = malloc(n * sizeof(int32_t))) != NULL);
        for (size_t i = 0; i < n; i++)
            m[r].buf[i] = mixed_input(r, i);
    }
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++)
            for (int k = 0; k < conns[a][b]; k++) {
                int sv[2];
                ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
                *(k ? &m[a].peers[b].sfd[k - 1] : &m[a].peers[b].fd) = sv[0];
                *(k ? &m[b].peers[a].sfd[k - 1] : &m[b].peers[a].fd) = sv[1];
            }
    pthread_t t[3];
    for (int r = 0; r < 3; r++)
        ASSERT_EQ(pthread_create(&t[r], NULL, mixed_thread, &m[r]), 0);
    for (int r = 0; r < 3; r++)
        pthread_join(t[r], NULL);
    int bad = 0;
    for (int r = 0; r < 3; r++) {
        ASSERT_EQ(m[r].rc, 0);
        /* the stripes' threads did start: as many as the widest pair */
        ASSERT_EQ(ddp__team_size(m[r].c.tcp_team), r == 1 ? 2 : 4);
        for (size_t i = 0; i < n && !bad; i++)
            bad = m[r].buf[i] != mixed_input(0, i) + mixed_input(1, i) + mixed_input(2, i);
        ddp__team_free(m[r].c.tcp_team);
        free(m[r].c.scratch);
        free(m[r].buf);
        for (int j = 0; j < 3; j++) {
            if (m[r].peers[j].fd >= 0)
                close(m[r].peers[j].fd);
            for (int s = 0; s < DDP__TCP_MAX_CONNS - 1; s++)
                if (m[r].peers[j].sfd[s] >= 0)
                    close(m[r].peers[j].sfd[s]);
        }
    }
    ASSERT_EQ(bad, 0);
}

/* 5.2 MB: ring steps of 1.7 MB, over the default 1 MiB from which messages are striped. */
TEST(allreduce_over_tcp_with_pairs_of_different_stripe_counts_is_exact)
{
    run_mixed(1300001, DDP__TCP_STRIPE_BYTES);
}

/* DDP_PG_TCP_STRIPE_BYTES's smallest, 64 KiB: 1.2 MB in steps of 400 KB, each striped (below
 * the default, whole); the stripes of a 4-connection pair are then 100 KB. */
TEST(stripes_from_a_smaller_size_are_exact_too)
{
    run_mixed(300007, DDP__TCP_STRIPE_MIN);
}
