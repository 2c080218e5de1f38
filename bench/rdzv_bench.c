/*
 * Rendezvous through the built-in store vs through etcd, as node agents and ranks do it: N
 * processes each connect, take a lease, put their node key bound to it (what an agent's join
 * does, cli/proto/membership_store.c), then all-gather a 64-byte address blob among the N (what the
 * ranks' process-group setup does). The same libddp calls drive both backends
 * (rendezvous/store.h; etcd through rendezvous/store_etcd.c), so the comparison is of the
 * servers and the paths to them.
 *
 *   rdzv_bench --store HOST:PORT --token-file F | --etcd URL[,URL] [--prefix P]
 *              --agents N [--tag T] [--keepalive-s S --interval-ms I --server-pid PID]
 *
 * T (default 0) names this run's keys: runs against the same server use different tags.
 *
 * prints:  RESULT rdzv <backend> <N> <ms from the first fork to the last gather>
 * and with --keepalive-s, after the rendezvous, every agent renews its lease every I ms for S s:
 *          RESULT keepalive <backend> <N> <I> <server CPU ms per s> <p50 us> <p99 us>
 */
#include "common/err.h"
#include "common/util.h"
#include "rendezvous/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

static const char *store_addr, *token_file, *etcd_eps, *prefix = "/bench/", *tag = "0";
static int agents = 8, interval_ms = 1000, server_pid;
static double keepalive_s;

static int connect_one(struct ddp_store **s)
{
    if (etcd_eps) {
        struct ddp_store_etcd_opts o = {.endpoints = etcd_eps, .prefix = prefix};
        return ddp_store_connect_etcd(&o, 30000, s);
    }
    char host[256];
    int port;
    uint8_t *tok;
    size_t tl;
    int r;
    if (ddp_parse_hostport(store_addr, host, sizeof(host), &port) < 0 ||
        (r = ddp_store_token_read_file(token_file, &tok, &tl)) < 0)
        return DDP_EINVAL;
    r = ddp_store_connect(host, port, tok, tl, 30000, s);
    ddp_store_token_free(tok, tl);
    return r;
}

/* What an agent tells the parent: its gather's end (ms), or one keepalive round trip (us). */
struct rec {
    int64_t kind; /* 0: gathered, 1: keepalive */
    int64_t v;
};

static void tell(int fd, int64_t kind, int64_t v)
{
    struct rec r = {kind, v};
    ddp_write_all(fd, &r, sizeof(r)); /* under PIPE_BUF: atomic */
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* One agent: join, gather, then (maybe) keep its lease alive; its keepalive round trips (us)
 * go to fd. 0 on success. */
static int agent(int i, int fd)
{
    struct ddp_store *s;
    uint64_t lease;
    char key[64], blob[64];
    int r;
    if ((r = connect_one(&s)) < 0)
        return 1;
    char gather[64];
    snprintf(key, sizeof(key), "%s/nodes/%d.1", tag, i);
    snprintf(gather, sizeof(gather), "%s/addr", tag);
    memset(blob, 'a' + i % 26, sizeof(blob));
    struct ddp_store_value *vals = calloc((size_t)agents, sizeof(*vals));
    if (!vals || (r = ddp_store_lease_grant(s, 5000, &lease)) < 0 ||
        (r = ddp_store_set_leased(s, key, "node", 4, lease)) < 0 ||
        (r = ddp_store_all_gather(s, gather, i, agents, blob, sizeof(blob), 60000, vals)) < 0) {
        fprintf(stderr, "agent %d: %s\n", i, ddp_strerror(r));
        return 1;
    }
    for (int k = 0; k < agents; k++)
        if (vals[k].len != sizeof(blob) || ((char *)vals[k].data)[0] != 'a' + k % 26)
            return 1;
    ddp_store_values_free(vals, (size_t)agents);
    free(vals);
    tell(fd, 0, ddp_now_ms());
    int64_t end = ddp_now_ms() + (int64_t)(keepalive_s * 1000);
    /* spread over the interval, as agents that started at different times are */
    usleep((useconds_t)((i * 997) % interval_ms) * 1000);
    while (ddp_now_ms() < end) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if ((r = ddp_store_lease_keepalive(s, lease, NULL)) < 0)
            return 1;
        clock_gettime(CLOCK_MONOTONIC, &b);
        int64_t us = (b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000;
        tell(fd, 1, us);
        usleep((useconds_t)interval_ms * 1000);
    }
    ddp_store_lease_revoke(s, lease);
    ddp_store_close(s);
    return 0;
}

static double cpu_ms(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    /* fields after ')': state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
     * utime stime */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            goto usage;
        if (!strcmp(a, "--store"))
            store_addr = v;
        else if (!strcmp(a, "--token-file"))
            token_file = v;
        else if (!strcmp(a, "--etcd"))
            etcd_eps = v;
        else if (!strcmp(a, "--prefix"))
            prefix = v;
        else if (!strcmp(a, "--tag"))
            tag = v;
        else if (!strcmp(a, "--agents"))
            agents = atoi(v);
        else if (!strcmp(a, "--keepalive-s"))
            keepalive_s = atof(v);
        else if (!strcmp(a, "--interval-ms"))
            interval_ms = atoi(v);
        else if (!strcmp(a, "--server-pid"))
            server_pid = atoi(v);
        else
            goto usage;
    }
    if ((!store_addr || !token_file) == !etcd_eps || agents < 1 || interval_ms < 1)
        goto usage;
    int p[2];
    if (pipe(p) != 0)
        return 1;
    int64_t t0 = ddp_now_ms();
    for (int i = 0; i < agents; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            close(p[0]);
            _exit(agent(i, p[1]));
        }
    }
    close(p[1]);
    /* every record until all agents end: gathers' ends and keepalive round trips */
    int64_t last = 0, k0 = 0;
    int gathered = 0;
    double c0 = 0;
    size_t n = 0, cap = 1024;
    int64_t *lat = malloc(cap * sizeof(*lat));
    struct rec rc;
    const char *backend = etcd_eps ? "etcd" : "store";
    while (lat && ddp_read_eintr(p[0], &rc, sizeof(rc)) == (ssize_t)sizeof(rc)) {
        if (rc.kind == 0) {
            last = rc.v > last ? rc.v : last;
            if (++gathered == agents) {
                printf("RESULT rdzv %s %d %lld\n", backend, agents, (long long)(last - t0));
                fflush(stdout);
                c0 = server_pid ? cpu_ms(server_pid) : 0;
                k0 = ddp_now_ms();
            }
            continue;
        }
        if (n == cap && !(lat = realloc(lat, (cap *= 2) * sizeof(*lat))))
            break;
        lat[n++] = rc.v;
    }
    if (gathered < agents) {
        fprintf(stderr, "rdzv_bench: an agent failed\n");
        return 1;
    }
    double secs = (double)(ddp_now_ms() - k0) / 1000;
    int bad = 0, st;
    while (wait(&st) > 0)
        bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    if (keepalive_s > 0 && lat && n > 0) {
        qsort(lat, n, sizeof(*lat), cmp_i64);
        double cpu = server_pid ? (cpu_ms(server_pid) - c0) / secs : 0;
        printf("RESULT keepalive %s %d %d %.1f %lld %lld\n", backend, agents, interval_ms, cpu,
               (long long)lat[n / 2], (long long)lat[n * 99 / 100]);
    }
    free(lat);
    return bad ? 1 : 0;
usage:
    fprintf(stderr,
            "usage: rdzv_bench --store HOST:PORT --token-file F | --etcd URLS [--prefix P]\n"
            "       --agents N [--tag T] [--keepalive-s S --interval-ms I --server-pid PID]\n");
    return 2;
}
