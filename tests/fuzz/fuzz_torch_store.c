/*
 * libFuzzer target for the store's TCPStore port (rendezvous/server_torch.c): each input is sent
 * whole, as one client's bytes, to a real server on a loopback port, then that client shuts
 * its writing side. The server must close the connection (it has read everything by then:
 * no request may leave it stuck), and must still answer a well-formed client on a new
 * connection (torch 2.2's VALIDATE and PING). The server is made and freed per input, so that
 * ASan's leak checks see what a connection's requests left behind.
 */
#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

#define TOKEN "fuzz-token-0123456789abcdef"

static void *serve(void *a)
{
    ddp_store_server_run(a);
    return NULL;
}

/* poll that goes on after a signal (libFuzzer's -timeout alarm interrupts calls). */
static int poll_one(int fd, short events, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = events};
    int r;
    while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
    }
    return r;
}

static int dial(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), err = 0;
    socklen_t el = sizeof(err);
    if (fd < 0)
        abort();
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 &&
        (errno != EINTR || poll_one(fd, POLLOUT, 5000) != 1 ||
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err != 0)) {
        perror("fuzz_torch_store: connect");
        abort();
    }
    return fd;
}

/* Closes with a reset, so that a run of thousands of inputs leaves no TIME_WAIT behind. */
static void close_reset(int fd)
{
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
}

/* Reads (and drops) what fd receives until the peer closes; aborts after 5 s without it. */
static void drain_until_closed(int fd)
{
    char buf[65536];
    for (;;) {
        if (poll_one(fd, POLLIN, 5000) != 1) {
            fprintf(stderr, "fuzz_torch_store: the server kept a connection whose client had "
                            "finished\n");
            abort();
        }
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return;
        if (n < 0 && errno != EINTR)
            abort();
    }
}

static void send_all(int fd, const uint8_t *p, size_t n)
{
    /* The server reads while it answers, so this never blocks for long; a reply we have not
     * read yet only fills the server's own queue. */
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return; /* the server closed the connection: a refused request */
        p += w;
        n -= (size_t)w;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ddp_store_server_opts o = {
        .host = "127.0.0.1", .token = TOKEN, .token_len = strlen(TOKEN)};
    struct ddp_store_server *srv;
    const char *allow[] = {"127.0.0.1"};
    int tport;
    pthread_t th;
    if (ddp_store_server_new(&o, &srv) != 0 ||
        ddp_store_server_torch_listen(srv, "127.0.0.1", 0, allow, 1, &tport) != 0 ||
        pthread_create(&th, NULL, serve, srv) != 0)
        abort();

    int fd = dial(tport);
    send_all(fd, data, size);
    shutdown(fd, SHUT_WR);
    drain_until_closed(fd);
    close_reset(fd);

    /* VALIDATE, then PING 0x01020304: the reply is the same 4 bytes. */
    static const uint8_t probe[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C, 0x0D, 4, 3, 2, 1};
    fd = dial(tport);
    send_all(fd, probe, sizeof(probe));
    uint8_t got[4];
    size_t have = 0;
    while (have < sizeof(got)) {
        ssize_t n = poll_one(fd, POLLIN, 5000) == 1 ? read(fd, got + have, sizeof(got) - have) : -1;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "fuzz_torch_store: a good client is no longer served\n");
            abort();
        }
        have += (size_t)n;
    }
    if (memcmp(got, probe + 6, 4) != 0)
        abort();
    close_reset(fd);

    ddp_store_server_stop(srv);
    pthread_join(th, NULL);
    ddp_store_server_free(srv);
    return 0;
}
