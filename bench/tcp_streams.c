/*
 * How fast two hosts exchange a message over TCP when it is cut over several connections: the
 * transport under a 2-rank ring step (each host sends BYTES and receives BYTES at once), measured
 * alone, without a reduction, for issue 21's "several connections per peer".
 *
 *   tcp_streams listen ADDR CONNS THREADS BYTES ITERS    (prints "PORT n", then serves)
 *   tcp_streams connect ADDR PORT CONNS THREADS BYTES ITERS
 *
 * The message is cut into CONNS contiguous stripes, one per connection. THREADS 1: a thread per
 * connection sends and receives its stripe in turn, as ddp__xfer does (poll, 256 KiB per call);
 * THREADS 2: a thread sends while another receives (DDP_PG_TCP_THREADS=2). Every round ends with
 * a one-byte handshake on the first connection, so rounds line up; after a warm-up round the
 * connecting side prints "STREAMS conns threads bytes median_us gbps", GB/s each way from the
 * median round.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SLICE ((size_t)256 << 10)
#define MAX_CONNS 16

struct part {
    int fd;
    char *sbuf, *rbuf;
    size_t len;
    int dirs; /* 1: send, 2: receive, 3: both */
};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void die(const char *what)
{
    fprintf(stderr, "tcp_streams: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void *run_part(void *arg)
{
    struct part *p = arg;
    size_t sent = p->dirs & 1 ? 0 : p->len, got = p->dirs & 2 ? 0 : p->len;
    while (sent < p->len || got < p->len) {
        struct pollfd pf = {
            .fd = p->fd,
            .events = (short)((sent < p->len ? POLLOUT : 0) | (got < p->len ? POLLIN : 0))};
        if (poll(&pf, 1, 10000) <= 0)
            die("poll");
        if (got < p->len && (pf.revents & (POLLIN | POLLHUP | POLLERR))) {
            size_t want = p->len - got < SLICE ? p->len - got : SLICE;
            ssize_t n = recv(p->fd, p->rbuf + got, want, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
                die("recv");
            if (n > 0)
                got += (size_t)n;
        }
        if (sent < p->len && (pf.revents & POLLOUT)) {
            size_t want = p->len - sent < SLICE ? p->len - sent : SLICE;
            ssize_t n = send(p->fd, p->sbuf + sent, want, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                die("send");
            if (n > 0)
                sent += (size_t)n;
        }
    }
    return NULL;
}

static void handshake(int fd, int first)
{
    char b = 'x';
    if (first && write(fd, &b, 1) != 1)
        die("write");
    if (read(fd, &b, 1) != 1)
        die("read");
    if (!first && write(fd, &b, 1) != 1)
        die("write");
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int is_listen = argc == 7 && strcmp(argv[1], "listen") == 0;
    if (!is_listen && !(argc == 8 && strcmp(argv[1], "connect") == 0)) {
        fprintf(stderr, "usage: tcp_streams listen ADDR CONNS THREADS BYTES ITERS\n"
                        "       tcp_streams connect ADDR PORT CONNS THREADS BYTES ITERS\n");
        return 2;
    }
    int a = is_listen ? 3 : 4;
    int conns = atoi(argv[a]), threads = atoi(argv[a + 1]), iters = atoi(argv[a + 3]);
    size_t bytes = (size_t)atoll(argv[a + 2]);
    if (conns < 1 || conns > MAX_CONNS || threads < 1 || threads > 2 || iters < 1 || !bytes) {
        fprintf(stderr, "tcp_streams: CONNS 1-%d, THREADS 1 or 2, BYTES and ITERS > 0\n",
                MAX_CONNS);
        return 2;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1) {
        fprintf(stderr, "tcp_streams: bad address %s\n", argv[2]);
        return 2;
    }
    int fds[MAX_CONNS], one = 1;
    if (is_listen) {
        int lfd = socket(AF_INET, SOCK_STREAM, 0);
        socklen_t sl = sizeof(sa);
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, MAX_CONNS) ||
            getsockname(lfd, (struct sockaddr *)&sa, &sl))
            die("listen");
        printf("PORT %d\n", ntohs(sa.sin_port));
        fflush(stdout);
        for (int i = 0; i < conns; i++)
            if ((fds[i] = accept(lfd, NULL, NULL)) < 0)
                die("accept");
        close(lfd);
    } else {
        sa.sin_port = htons((uint16_t)atoi(argv[3]));
        for (int i = 0; i < conns; i++) {
            int tries = 0;
            fds[i] = socket(AF_INET, SOCK_STREAM, 0);
            while (connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)) != 0) {
                if (++tries > 200)
                    die("connect");
                usleep(20000);
            }
        }
    }
    /* Blocking connects, one after the other: the listener accepts them in the same order, so
     * connection i carries stripe i on both sides. */
    handshake(fds[0], !is_listen);
    for (int i = 0; i < conns; i++)
        setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char *sbuf = malloc(bytes), *rbuf = malloc(bytes);
    if (!sbuf || !rbuf)
        die("malloc");
    memset(sbuf, 1, bytes);
    memset(rbuf, 0, bytes);
    struct part parts[2 * MAX_CONNS];
    int np = 0;
    size_t stripe = (bytes / (size_t)conns + 63) & ~(size_t)63;
    for (int i = 0; i < conns; i++) {
        size_t off = stripe * (size_t)i < bytes ? stripe * (size_t)i : bytes;
        size_t len = bytes - off < stripe ? bytes - off : stripe;
        for (int t = 0; t < threads; t++)
            parts[np++] =
                (struct part){fds[i], sbuf + off, rbuf + off, len, threads == 1 ? 3 : 1 << t};
    }
    double *us = malloc((size_t)iters * sizeof(double));
    if (!us)
        die("malloc");
    for (int it = -1; it < iters; it++) {
        pthread_t th[2 * MAX_CONNS];
        double t0 = now_us();
        for (int i = 1; i < np; i++)
            if (pthread_create(&th[i], NULL, run_part, &parts[i]) != 0)
                die("pthread_create");
        run_part(&parts[0]);
        for (int i = 1; i < np; i++)
            pthread_join(th[i], NULL);
        handshake(fds[0], !is_listen);
        if (it >= 0)
            us[it] = now_us() - t0;
    }
    if (!is_listen) {
        qsort(us, (size_t)iters, sizeof(double), cmp_d);
        double med = us[iters / 2];
        printf("STREAMS %d %d %zu %.0f %.3f\n", conns, threads, bytes, med,
               (double)bytes / med / 1e3);
    }
    for (int i = 0; i < conns; i++)
        close(fds[i]);
    free(sbuf);
    free(rbuf);
    free(us);
    return 0;
}
