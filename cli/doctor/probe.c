/*
 * What `ddprun doctor` learns on a node from its `__probe` (cli/doctor/doctor.c): a port the node
 * can listen on, its reach to the store's address, the interface that routes there, the GPUs its
 * ranks would see, their limit on open files, and its clock against the doctor's. A leaf.
 */
#include "cli/doctor/doctor.h"
#include "cli/sys/sys.h"
#include "cli/sys/devices.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

static int64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ddp__doctor_stamp(int fd)
{
    uint64_t now = (uint64_t)realtime_ns();
    uint8_t b[8];
    for (int k = 0; k < 8; k++)
        b[k] = (uint8_t)(now >> (8 * k));
    send(fd, b, sizeof(b), MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* The doctor's time as its listener answered connection fd, against this machine's before the
 * connect (t1) and now: " clock OFFSET ERROR" (ns, this clock less the doctor's, and the most
 * that can be off: half the round trip), or "" when nothing came (an etcd endpoint). */
static void clock_reading(int fd, int64_t t1, char *out, size_t n)
{
    uint8_t b[8];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    out[0] = '\0';
    if (poll(&p, 1, 500) != 1 || recv(fd, b, sizeof(b), 0) != (ssize_t)sizeof(b))
        return;
    int64_t t3 = realtime_ns();
    uint64_t t2 = 0;
    for (int k = 0; k < 8; k++)
        t2 |= (uint64_t)b[k] << (8 * k);
    snprintf(out, n, " clock %lld %lld", (long long)(t1 / 2 + t3 / 2 - (int64_t)t2),
             (long long)((t3 - t1) / 2));
}

int ddp__doctor_probe(const char *host, int port, char *out, size_t n)
{
    int lfd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6};
    struct sockaddr_in a4 = {.sin_family = AF_INET};
    socklen_t sl;
    int myport = -1;
    if (lfd >= 0 && bind(lfd, (struct sockaddr *)&a6, sizeof(a6)) == 0 && listen(lfd, 1) == 0) {
        sl = sizeof(a6);
        getsockname(lfd, (struct sockaddr *)&a6, &sl);
        myport = ntohs(a6.sin6_port);
    } else {
        if (lfd >= 0)
            close(lfd);
        lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (lfd >= 0 && bind(lfd, (struct sockaddr *)&a4, sizeof(a4)) == 0 && listen(lfd, 1) == 0) {
            sl = sizeof(a4);
            getsockname(lfd, (struct sockaddr *)&a4, &sl);
            myport = ntohs(a4.sin_port);
        }
    }
    if (lfd >= 0)
        close(lfd);
    if (myport < 0) {
        snprintf(out, n, "port: cannot listen on a free port: %s", strerror(errno));
        return 2;
    }
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        snprintf(out, n, "store: cannot resolve %s: %s", host, gai_strerror(g));
        return 1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int64_t t1 = realtime_ns();
    int ok = fd >= 0 && (connect(fd, res->ai_addr, res->ai_addrlen) == 0 || errno == EINPROGRESS);
    if (ok) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof(err);
        ok = poll(&p, 1, 3000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 &&
             err == 0;
        if (!ok)
            errno = err ? err : ETIMEDOUT;
    }
    int e = errno;
    char clock[64] = "";
    if (ok)
        clock_reading(fd, t1, clock, sizeof(clock));
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    if (!ok) {
        snprintf(out, n, "store: cannot connect to %s:%d from here: %s", host, port, strerror(e));
        return 1;
    }
    char ifname[64];
    if (ddp__route_iface(host, ifname, sizeof(ifname), NULL, 0) < 0)
        snprintf(ifname, sizeof(ifname), "?");
    struct rlimit rl = {RLIM_INFINITY, RLIM_INFINITY};
    getrlimit(RLIMIT_NOFILE, &rl);
    char soft[24] = "inf", hard[24] = "inf";
    if (rl.rlim_cur != RLIM_INFINITY)
        snprintf(soft, sizeof(soft), "%llu", (unsigned long long)rl.rlim_cur);
    if (rl.rlim_max != RLIM_INFINITY)
        snprintf(hard, sizeof(hard), "%llu", (unsigned long long)rl.rlim_max);
    snprintf(out, n, "ok port %d iface %s gpus %d nofile %s %s%s", myport, ifname, ddp__gpus_here(),
             soft, hard, clock);
    return 0;
}
