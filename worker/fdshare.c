/*
 * Descriptors between a node's ranks (worker/fdshare.h). Each rank listens on an abstract Unix
 * socket under a random name and publishes it (an all-gather); a rank with a descriptor to
 * give connects to every other's socket and sends it there (SCM_RIGHTS) without waiting for an
 * accept, the message waiting in the connection's queue; a second all-gather says who sent to
 * whom, so each rank accepts exactly the connections already queued for it and no one ever
 * waits on a socket for a peer that died: all waiting is on the store, with its timeout.
 */
#include "worker/fdshare.h"
#include "common/err.h"
#include "rendezvous/store.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

#include "common/banned.h"

#define NAME_LEN 21 /* "@ddp-" and 16 hex digits */

int ddp__memfd(const char *tag, size_t len)
{
    int fd = memfd_create(tag, MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)len) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* The socket address of a published name ("@ddp-" and 16 hex digits); false if it is not one. */
static bool addr_of(const char *name, struct sockaddr_un *a, socklen_t *alen)
{
    if (strlen(name) != NAME_LEN || strncmp(name, "@ddp-", 5) != 0 ||
        strspn(name + 5, "0123456789abcdef") != NAME_LEN - 5)
        return false;
    *a = (struct sockaddr_un){.sun_family = AF_UNIX};
    memcpy(a->sun_path + 1, name + 1, NAME_LEN - 1); /* sun_path[0] = '\0': abstract */
    *alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + NAME_LEN);
    return true;
}

/* A listening socket under a new random name (written to name); -1 when that fails. */
static int listen_new(int backlog, char name[NAME_LEN + 1])
{
    uint64_t rnd;
    struct sockaddr_un a;
    socklen_t alen;
    if (ddp_random_bytes(&rnd, sizeof(rnd)) != 0)
        return -1;
    snprintf(name, NAME_LEN + 1, "@ddp-%016llx", (unsigned long long)rnd);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -1;
    if (!addr_of(name, &a, &alen) || bind(s, (struct sockaddr *)&a, alen) != 0 ||
        listen(s, backlog) != 0) {
        close(s);
        return -1;
    }
    return s;
}

/* The other end of a connected Unix socket runs as this user. */
static bool same_user(int s)
{
    struct ucred cr;
    socklen_t l = sizeof(cr);
    return getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &l) == 0 && cr.uid == geteuid();
}

/* Connects to name and leaves fd there with this rank's number; true if it was sent. */
static bool send_fd(const char *name, int me, int fd)
{
    struct sockaddr_un a;
    socklen_t alen;
    if (!addr_of(name, &a, &alen))
        return false;
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c < 0)
        return false;
    int32_t who = me;
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec iov = {.iov_base = &who, .iov_len = sizeof(who)};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl)};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof(int));
    /* A listener's full queue is EAGAIN, not a wait; the message stays queued after close. */
    bool ok = connect(c, (struct sockaddr *)&a, alen) == 0 && same_user(c) &&
              sendmsg(c, &m, MSG_NOSIGNAL) == (ssize_t)sizeof(who);
    close(c);
    return ok;
}

/* One queued connection's number and descriptor; -1 when it is not a well-formed one from
 * this user (its descriptor, if any, closed). */
static int recv_fd(int s, int *fd)
{
    *fd = -1;
    int32_t who = -1;
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = &who, .iov_len = sizeof(who)};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl)};
    ssize_t got = same_user(s) ? recvmsg(s, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) : -1;
    if (got < 0)
        return -1;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int x;
            memcpy(&x, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
            if (*fd < 0 && k == 1)
                *fd = x;
            else
                close(x);
        }
    }
    if (got != (ssize_t)sizeof(who) || (m.msg_flags & MSG_CTRUNC) || *fd < 0) {
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return -1;
    }
    return who;
}

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Accepts the `expect` connections queued on listener l: fds[j] for each well-formed one
 * from a rank j that said it sent here (sent[j]). Stops at the deadline. */
static void accept_all(int l, int n, int me, int expect, const bool *sent, int timeout_ms, int *fds)
{
    int64_t end = now_ms() + (timeout_ms < 0 ? 3600 * 1000 : timeout_ms);
    for (int got = 0; got < expect;) {
        int s = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        if (s < 0) {
            int64_t left = end - now_ms();
            if ((errno != EAGAIN && errno != EINTR) || left <= 0)
                return;
            struct pollfd p = {.fd = l, .events = POLLIN};
            poll(&p, 1, (int)(left < 1000 ? left : 1000));
            continue;
        }
        int fd, j = recv_fd(s, &fd);
        close(s);
        if (j < 0 || j >= n || j == me || !sent[j] || fds[j] >= 0) {
            if (fd >= 0)
                close(fd);
            continue; /* not one of the node's ranks' messages: ignored */
        }
        fds[j] = fd;
        got++;
    }
}

int ddp__fd_from_first(struct ddp_store *store, const char *prefix, int me, int n, int fd_in,
                       int timeout_ms, int *out)
{
    *out = me == 0 ? fd_in : -1;
    int *fds = malloc((size_t)n * sizeof(int));
    if (!fds)
        return DDP_ENOMEM;
    int r = ddp__fd_exchange(store, prefix, me, n, me == 0 ? fd_in : -1, timeout_ms, fds);
    for (int j = 0; j < n; j++) {
        if (j == 0 && me != 0)
            *out = fds[0];
        else if (fds[j] >= 0)
            close(fds[j]); /* only number 0 gives one */
    }
    free(fds);
    return r;
}

int ddp__fd_exchange(struct ddp_store *store, const char *prefix, int me, int n, int fd_in,
                     int timeout_ms, int *fds)
{
    for (int j = 0; j < n; j++)
        fds[j] = -1;
    if (n < 2)
        return 0;
    char name[NAME_LEN + 1] = "-", key[320];
    int l = listen_new(4 * n + 16, name), r;
    if (l < 0)
        snprintf(name, sizeof(name), "-");
    struct ddp_store_value *where = calloc((size_t)n, sizeof(*where));
    struct ddp_store_value *told = calloc((size_t)n, sizeof(*told));
    char *mine = malloc((size_t)n + 1);
    bool *sent = calloc((size_t)n, sizeof(bool));
    if (!where || !told || !mine || !sent) {
        r = DDP_ENOMEM;
        goto out;
    }
    snprintf(key, sizeof(key), "%s/where", prefix);
    if ((r = ddp_store_all_gather(store, key, me, n, name, strlen(name) + 1, timeout_ms, where)) <
        0)
        goto out;
    for (int j = 0; j < n; j++) {
        const char *w = where[j].data;
        bool named = w && where[j].len > 0 && w[where[j].len - 1] == '\0';
        mine[j] = j != me && fd_in >= 0 && named && send_fd(w, me, fd_in) ? '1' : '0';
    }
    mine[n] = '\0';
    snprintf(key, sizeof(key), "%s/sent", prefix);
    if ((r = ddp_store_all_gather(store, key, me, n, mine, (size_t)n + 1, timeout_ms, told)) < 0)
        goto out;
    int expect = 0;
    for (int j = 0; j < n; j++) {
        sent[j] = told[j].data && told[j].len == (size_t)n + 1 && ((char *)told[j].data)[me] == '1';
        expect += sent[j];
    }
    if (l >= 0)
        accept_all(l, n, me, expect, sent, timeout_ms, fds);
out:
    if (where)
        ddp_store_values_free(where, (size_t)n);
    if (told)
        ddp_store_values_free(told, (size_t)n);
    free(where);
    free(told);
    free(mine);
    free(sent);
    if (l >= 0)
        close(l);
    return r;
}
