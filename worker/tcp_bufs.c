/*
 * The send buffers of a group's TCP connections (worker/coll.h, DDP_PG_TCP_SNDBUF).
 *
 * Between two ranks on one machine's kernel (containers or network namespaces of one host,
 * loopback) a byte sent over TCP is copied by the sender into the kernel's buffers and out of
 * them by the receiver, both on the same machine's cores and caches. With the kernel's
 * autotuning the send buffer grows to MiBs, so what the receiver copies was written long before
 * and has left the caches; with 128 KiB asked (the kernel doubles it) the bytes in flight stay
 * in them. Measured between two network-namespace hosts on a 2-vCPU AMD EPYC (BENCHMARKS.md,
 * "Send buffers between ranks on one kernel"): a 2-rank all-reduce of 4 to 64 MiB moved
 * 1.9-2.1 GB/s against 0.8 with autotuning (medians, 2.2-2.6x), the receive copy's share of the
 * CPU 12% against 29%; 256 KiB asked lost most of that; on loopback 1.5-2.0x. Across machines the
 * receiver's bytes come from its NIC, and a small buffer would cap a link whose bandwidth times
 * round trip is larger, so there the kernel's autotuning stays.
 */
#include "worker/coll.h"
#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/banned.h"

long ddp__tcp_sndbuf_env(void)
{
    const char *v = getenv("DDP_PG_TCP_SNDBUF");
    if (!v || !*v || strcmp(v, "auto") == 0)
        return -1;
    char *end;
    errno = 0;
    long long k = strtoll(v, &end, 10);
    if (errno || *end || (k != 0 && (k < DDP__TCP_SNDBUF_MIN || k > DDP__TCP_SNDBUF_MAX))) {
        DDP_WARN(PG,
                 "DDP_PG_TCP_SNDBUF='%s' is neither auto, 0 nor a number of bytes from %d to %d; "
                 "using auto",
                 v, DDP__TCP_SNDBUF_MIN, DDP__TCP_SNDBUF_MAX);
        return -1;
    }
    return (long)k;
}

int ddp__tcp_peer_sndbuf(long setting, const char *mine, const char *theirs)
{
    if (setting >= 0)
        return (int)setting;
    return strcmp(mine, "-") != 0 && strcmp(mine, theirs) == 0 ? DDP__TCP_NEAR_SNDBUF : 0;
}

int ddp__tcp_apply_sndbufs(struct ddp__comm *c, const int *p2p_fd)
{
    int set = 0, bytes = 0;
    for (int j = 0; j < c->world; j++) {
        struct ddp__peer *p = &c->peers[j];
        if (j == c->rank || p->sndbuf <= 0 || p->fd < 0)
            continue;
        for (int k = 0; k <= p->nconns; k++) {
            int fd = k == p->nconns ? (p2p_fd ? p2p_fd[j] : -1) : k == 0 ? p->fd : p->sfd[k - 1];
            if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &p->sndbuf, sizeof(p->sndbuf)))
                DDP_WARN(PG, "rank %d: cannot set the send buffer to peer rank %d: %s", c->rank, j,
                         strerror(errno));
        }
        set++;
        bytes = p->sndbuf;
    }
    if (set)
        DDP_INFO(PG, "rank %d: TCP send buffers of %d bytes to %d peer(s)", c->rank, bytes, set);
    return set;
}
