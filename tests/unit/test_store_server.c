/*
 * Unit tests of the store server against clients that misbehave: raw garbage, a wrong magic
 * or version, ops before authentication, oversized and half-sent frames, too many
 * connections, clients that time out, disconnect mid-wait or never read.
 */
#include "common/buf.h"
#include "common/util.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "tests/unit/store_fixture.h"
#include "tests/unit/test.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

static int raw_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* True when the server closed the connection within ms. */
static bool closed_within(int fd, int ms)
{
    char buf[256];
    int64_t end = ddp_now_ms() + ms;
    while (ddp_now_ms() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(end - ddp_now_ms())) <= 0)
            return false;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0)
            return true;
    }
    return false;
}

static void send_hello(int fd, uint32_t magic, uint16_t version)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__proto_begin(&b, DDP__OP_HELLO, 1);
    ddp_buf_put_u32(&b, magic);
    ddp_buf_put_u16(&b, version);
    ddp_buf_put_u16(&b, 0);
    uint8_t n[16] = {0};
    ddp_buf_put(&b, n, 16);
    ddp__proto_end(&b, pos);
    ASSERT_EQ(send(fd, b.data, b.len, 0), (ssize_t)b.len);
    ddp_buf_release(&b);
}

static void still_serving(void)
{
    struct ddp_store *s = client();
    ASSERT_OK(ddp_store_set(s, "alive", "1", 1));
    ddp_store_close(s);
}

TEST(raw_garbage_and_bad_magic_closed)
{
    start_server();
    int fd = raw_connect();
    ASSERT_EQ(send(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27, 0), 27);
    ASSERT_TRUE(closed_within(fd, 2000));
    close(fd);
    fd = raw_connect();
    send_hello(fd, 0x12345678, 1);
    ASSERT_TRUE(closed_within(fd, 2000));
    close(fd);
    still_serving();
    stop_server();
}

TEST(raw_version_mismatch_gets_reason)
{
    start_server();
    int fd = raw_connect();
    send_hello(fd, DDP__PROTO_MAGIC, 99);
    uint8_t buf[64];
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_WAITALL);
    ASSERT_GE(n, 15);
    struct ddp_rd r;
    uint32_t len, id, st;
    uint8_t op;
    uint16_t sv;
    ddp_rd_init(&r, buf, (size_t)n);
    ddp_rd_u32(&r, &len);
    ddp_rd_u8(&r, &op);
    ddp_rd_u32(&r, &id);
    ddp_rd_u32(&r, &st);
    ddp_rd_u16(&r, &sv);
    ASSERT_EQ(op, DDP__OP_HELLO | DDP__REPLY_BIT);
    ASSERT_EQ((int32_t)st, DDP_EVERSION);
    ASSERT_EQ(sv, DDP__PROTO_VERSION);
    ASSERT_TRUE(closed_within(fd, 2000));
    close(fd);
    still_serving();
    stop_server();
}

TEST(raw_op_before_auth_and_oversized_frames_closed)
{
    start_server();
    /* a SET before the handshake */
    int fd = raw_connect();
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__proto_begin(&b, DDP__OP_PING, 1);
    ddp__proto_end(&b, pos);
    ASSERT_EQ(send(fd, b.data, b.len, 0), (ssize_t)b.len);
    ASSERT_TRUE(closed_within(fd, 2000));
    close(fd);
    ddp_buf_release(&b);
    /* a huge length before authentication: refused without allocating */
    fd = raw_connect();
    uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
    ASSERT_EQ(send(fd, huge, 4, 0), 4);
    ASSERT_TRUE(closed_within(fd, 2000));
    close(fd);
    /* a length below the header size */
    fd = raw_connect();
    uint8_t tiny[5] = {1, 0, 0, 0, 0x10};
    ASSERT_EQ(send(fd, tiny, 5, 0), 5);
    ASSERT_TRUE(closed_within(fd, 2000));
    close(fd);
    still_serving();
    stop_server();
}

TEST(raw_half_frame_does_not_block_others_and_auth_times_out)
{
    start_server_opts(0, 300);
    int fd = raw_connect();
    send_hello(fd, DDP__PROTO_MAGIC, 1);
    /* then half an AUTH frame, and silence */
    uint8_t part[6] = {37, 0, 0, 0, DDP__OP_AUTH, 2};
    ASSERT_EQ(send(fd, part, sizeof(part), 0), 6);
    still_serving();                      /* others are served meanwhile */
    ASSERT_TRUE(closed_within(fd, 3000)); /* dropped at the auth timeout */
    close(fd);
    stop_server();
}

TEST(max_conns_refuses_extra_clients)
{
    start_server_opts(2, 0);
    struct ddp_store *a = client(), *b = client(), *c = NULL;
    ASSERT_TRUE(ddp_store_connect("127.0.0.1", port, TOKEN, strlen(TOKEN), 300, &c) < 0);
    ASSERT_OK(ddp_store_ping(a));
    ddp_store_close(b);
    wait_stat(st_open, 1);
    c = client();
    ASSERT_OK(ddp_store_ping(c));
    ddp_store_close(a);
    ddp_store_close(c);
    stop_server();
}

TEST(client_timeout_breaks_connection_cleanly)
{
    start_server();
    struct ddp_store *s = client();
    ddp_store_set_timeout(s, 50);
    stop_server(); /* server gone: the next call fails, nothing hangs */
    ASSERT_TRUE(ddp_store_ping(s) < 0);
    ASSERT_ERR(ddp_store_ping(s), DDP_ECLOSED);
    ddp_store_close(s);
}

/* Performs the HELLO/AUTH handshake by hand on a raw socket. */
static void raw_auth(int fd)
{
    send_hello(fd, DDP__PROTO_MAGIC, 1);
    uint8_t buf[64];
    ASSERT_EQ(recv(fd, buf, 37, MSG_WAITALL), 37); /* 9 hdr + 4 status + 4 + 2 + 2 + 16 */
    struct ddp_rd r;
    const uint8_t *sn;
    ddp_rd_init(&r, buf + 21, 16);
    ASSERT_OK(ddp_rd_raw(&r, 16, &sn));
    uint8_t cn[16] = {0}, mac[32];
    ASSERT_OK(
        ddp__proto_mac((const uint8_t *)TOKEN, strlen(TOKEN), DDP__LABEL_CLIENT, sn, cn, mac));
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__proto_begin(&b, DDP__OP_AUTH, 2);
    ddp_buf_put(&b, mac, 32);
    ddp__proto_end(&b, pos);
    ASSERT_EQ(send(fd, b.data, b.len, 0), (ssize_t)b.len);
    ddp_buf_release(&b);
    ASSERT_EQ(recv(fd, buf, 9 + 4 + 32, MSG_WAITALL), 45);
    ASSERT_EQ(buf[9], 0); /* status 0 */
}

static _Atomic uint64_t orphaned_lease;
static _Atomic int orphaned_calls;

static void on_orphaned(void *arg, uint64_t lease)
{
    (void)arg;
    orphaned_lease = lease;
    orphaned_calls++;
}

/* The launcher's test of a lost node's agent (cli/supervisor/rounds.c): told when the
 * connection that kept a lease alive closes, not when another one does, nor for a lease gone. */
TEST(lease_orphaned_when_its_holders_connection_closes)
{
    opt_orphaned = on_orphaned;
    orphaned_lease = 0;
    orphaned_calls = 0;
    start_server();
    struct ddp_store *a = client(), *b = client(), *c = client();
    uint64_t l1, l2;
    ASSERT_OK(ddp_store_lease_grant(a, 60000, &l1));
    ASSERT_OK(ddp_store_lease_grant(c, 60000, &l2));
    ASSERT_OK(ddp_store_lease_keepalive(b, l1, NULL)); /* b holds l1 now */
    ddp_store_close(a);
    wait_stat(st_open, 2);
    ASSERT_EQ(orphaned_calls, 0);
    ddp_store_close(b);
    for (int i = 0; i < 300 && orphaned_calls == 0; i++)
        usleep(10000);
    ASSERT_EQ(orphaned_calls, 1);
    ASSERT_EQ(orphaned_lease, l1);
    /* the lease lives on (its keepalive from another connection holds it again) */
    struct ddp_store *d = client();
    ASSERT_OK(ddp_store_lease_keepalive(d, l1, NULL));
    ASSERT_OK(ddp_store_lease_revoke(c, l2)); /* revoked: nothing to tell when c closes */
    ddp_store_close(c);
    wait_stat(st_open, 1);
    ASSERT_EQ(orphaned_calls, 1);
    ddp_store_close(d);
    for (int i = 0; i < 300 && orphaned_calls == 1; i++)
        usleep(10000);
    ASSERT_EQ(orphaned_calls, 2);
    stop_server();
    opt_orphaned = NULL;
}

TEST(client_disconnect_mid_wait_frees_waiter)
{
    start_server();
    int fd = raw_connect();
    raw_auth(fd);
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__proto_begin(&b, DDP__OP_WAIT, 3);
    ddp_buf_put_u32(&b, DDP__WAIT_FOREVER);
    ddp_buf_put_u32(&b, 2);
    ddp_buf_put_str(&b, "x", 1);
    ddp_buf_put_str(&b, "y", 1);
    ddp__proto_end(&b, pos);
    ASSERT_EQ(send(fd, b.data, b.len, 0), (ssize_t)b.len);
    ddp_buf_release(&b);
    wait_stat(st_waiters, 1);
    close(fd); /* the client dies mid-wait */
    wait_stat(st_waiters, 0);
    wait_stat(st_open, 0);
    /* the keys it waited for can still be set and waited on by others */
    struct ddp_store *s = client();
    ASSERT_OK(ddp_store_set(s, "x", "1", 1));
    const char *k[] = {"x"};
    ASSERT_OK(ddp_store_wait(s, k, 1, 100));
    ddp_store_close(s);
    stop_server();
}

TEST(wrong_mac_on_raw_socket_gets_eauth)
{
    start_server();
    int fd = raw_connect();
    send_hello(fd, DDP__PROTO_MAGIC, 1);
    uint8_t buf[64];
    ASSERT_EQ(recv(fd, buf, 37, MSG_WAITALL), 37);
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__proto_begin(&b, DDP__OP_AUTH, 2);
    uint8_t mac[32] = {0};
    ddp_buf_put(&b, mac, 32);
    ddp__proto_end(&b, pos);
    ASSERT_EQ(send(fd, b.data, b.len, 0), (ssize_t)b.len);
    ddp_buf_release(&b);
    ASSERT_EQ(recv(fd, buf, 13, MSG_WAITALL), 13);
    struct ddp_rd r;
    uint32_t st;
    ddp_rd_init(&r, buf + 9, 4);
    ddp_rd_u32(&r, &st);
    ASSERT_EQ((int32_t)st, DDP_EAUTH);
    ASSERT_TRUE(closed_within(fd, 2000));
    close(fd);
    still_serving();
    stop_server();
}

TEST(slow_reader_is_dropped_and_others_are_served)
{
    opt_max_outbuf = 1 << 20;
    start_server();
    struct ddp_store *s = client();
    size_t vlen = 512 << 10;
    char *val = calloc(1, vlen);
    ASSERT_OK(ddp_store_set(s, "fat", val, vlen));
    free(val);
    int fd = raw_connect();
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    raw_auth(fd);
    /* 200 GETs of 512 KiB = 100 MiB of replies that this client never reads */
    struct ddp_buf b;
    ddp_buf_init(&b);
    for (int i = 0; i < 200; i++) {
        size_t pos = ddp__proto_begin(&b, DDP__OP_GET, (uint32_t)(10 + i));
        ddp_buf_put_str(&b, "fat", 3);
        ddp__proto_end(&b, pos);
    }
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    size_t off = 0;
    int64_t end = ddp_now_ms() + 5000;
    while (off < b.len && ddp_now_ms() < end) {
        ssize_t w = send(fd, b.data + off, b.len - off, MSG_NOSIGNAL);
        if (w > 0)
            off += (size_t)w;
        else
            usleep(1000);
    }
    ddp_buf_release(&b);
    wait_stat(st_dropped, 1);
    ASSERT_OK(ddp_store_ping(s)); /* everyone else is still served */
    close(fd);
    ddp_store_close(s);
    stop_server();
}
