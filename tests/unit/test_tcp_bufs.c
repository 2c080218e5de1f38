/*
 * The send buffers of a group's TCP connections (worker/tcp_bufs.c) apart from a group's setup:
 * DDP_PG_TCP_SNDBUF's values, auto's rule (peers on this rank's kernel, by boot id), and the
 * buffers set on real sockets of a hand-built comm, every connection of a peer in stripes.
 */
#include "tests/unit/test.h"
#include "worker/coll.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

TEST(sndbuf_from_the_environment)
{
    unsetenv("DDP_PG_TCP_SNDBUF");
    ASSERT_EQ(ddp__tcp_sndbuf_env(), -1L);
    setenv("DDP_PG_TCP_SNDBUF", "auto", 1);
    ASSERT_EQ(ddp__tcp_sndbuf_env(), -1L);
    setenv("DDP_PG_TCP_SNDBUF", "0", 1);
    ASSERT_EQ(ddp__tcp_sndbuf_env(), 0L);
    setenv("DDP_PG_TCP_SNDBUF", "4096", 1);
    ASSERT_EQ(ddp__tcp_sndbuf_env(), 4096L);
    setenv("DDP_PG_TCP_SNDBUF", "1073741824", 1);
    ASSERT_EQ(ddp__tcp_sndbuf_env(), 1073741824L);
    const char *bad[] = {"4095", "1073741825", "-1", "128K", "", " 1", "99999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        setenv("DDP_PG_TCP_SNDBUF", bad[i], 1);
        ASSERT_EQ(ddp__tcp_sndbuf_env(), -1L);
    }
    unsetenv("DDP_PG_TCP_SNDBUF");
}

/* auto: 128 KiB to a peer whose boot id is this rank's, the kernel's elsewhere; an unknown id
 * ("-", on either side) is never alike; a setting goes to every peer, 0 to none. */
TEST(auto_sets_peers_on_this_kernel_and_a_setting_every_peer)
{
    const char *a = "0f3c5a2e-9b1d-4c8e-a7f6-1d2e3f4a5b6c",
               *b = "11111111-2222-3333-4444-555555555555";
    ASSERT_EQ(ddp__tcp_peer_sndbuf(-1, a, a), DDP__TCP_NEAR_SNDBUF);
    ASSERT_EQ(DDP__TCP_NEAR_SNDBUF, 131072);
    ASSERT_EQ(ddp__tcp_peer_sndbuf(-1, a, b), 0);
    ASSERT_EQ(ddp__tcp_peer_sndbuf(-1, "-", "-"), 0);
    ASSERT_EQ(ddp__tcp_peer_sndbuf(-1, a, "-"), 0);
    ASSERT_EQ(ddp__tcp_peer_sndbuf(-1, "-", a), 0);
    ASSERT_EQ(ddp__tcp_peer_sndbuf(0, a, a), 0);
    ASSERT_EQ(ddp__tcp_peer_sndbuf(65536, a, b), 65536);
    ASSERT_EQ(ddp__tcp_peer_sndbuf(65536, "-", "-"), 65536);
}

static int sndbuf_of(int fd)
{
    int v = 0;
    socklen_t l = sizeof(v);
    return getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, &l) == 0 ? v : -1;
}

/* Rank 1 of 3: peer 0 with 3 connections, a point-to-point one and a buffer asked, peer 2 with
 * 1 and a point-to-point one and none. Every connection of peer 0 reports twice what was asked
 * (the kernel's doubling); peer 2's and our own slot are untouched. */
TEST(buffers_are_set_on_every_connection_of_a_peer_that_has_one)
{
    int sp[6][2];
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sp[i]), 0);
    struct ddp__peer peers[3];
    memset(peers, 0, sizeof(peers));
    for (int j = 0; j < 3; j++) {
        peers[j].fd = -1;
        peers[j].rank = j;
        peers[j].nconns = 1;
        for (int s = 0; s < DDP__TCP_MAX_CONNS - 1; s++)
            peers[j].sfd[s] = -1;
    }
    peers[0].fd = sp[0][0];
    peers[0].sfd[0] = sp[1][0];
    peers[0].sfd[1] = sp[2][0];
    peers[0].nconns = 3;
    peers[0].sndbuf = 50000;
    peers[2].fd = sp[3][0];
    peers[1].sndbuf = 70000; /* our own: no connection */
    int before = sndbuf_of(sp[3][0]);
    struct ddp__comm c;
    memset(&c, 0, sizeof(c));
    c.rank = 1;
    c.world = 3;
    c.peers = peers;
    int p2p[3] = {sp[4][0], -1, sp[5][0]};
    ASSERT_EQ(ddp__tcp_apply_sndbufs(&c, p2p), 1);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(sndbuf_of(sp[i][0]), 100000);
    ASSERT_EQ(sndbuf_of(sp[4][0]), 100000);
    ASSERT_EQ(sndbuf_of(sp[3][0]), before);
    ASSERT_EQ(sndbuf_of(sp[5][0]), before);
    ASSERT_TRUE(before != 100000);
    /* without point-to-point connections */
    peers[0].sndbuf = 60000;
    ASSERT_EQ(ddp__tcp_apply_sndbufs(&c, NULL), 1);
    ASSERT_EQ(sndbuf_of(sp[0][0]), 120000);
    ASSERT_EQ(sndbuf_of(sp[4][0]), 100000);
    for (int i = 0; i < 6; i++) {
        close(sp[i][0]);
        close(sp[i][1]);
    }
}
