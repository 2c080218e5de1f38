/*
 * Store benchmark driver. The same C client threads drive either ddprun's
 * store (through libddp) or PyTorch's TCPStore (its 1.13 wire protocol,
 * spoken directly), so the comparison measures the servers, not the client
 * languages.
 *
 *   store_bench --proto ddp|tcpstore --addr HOST:PORT [--token-file F]
 *               ops --op set|get|add --clients N --seconds S
 *               barrier --clients N [--name NAME]
 *
 * ops prints:     RESULT ops <proto> <op> <clients> <ops/s> <p50 us> <p99 us>
 * barrier prints: RESULT barrier <proto> <clients> <ms> <failed>
 */
#include "common/err.h"
#include "common/util.h"
#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/banned.h"

static const char *proto = "ddp", *addr, *token_file, *op = "get", *bname = "bench";
static char host[256];
static int port, nclients = 1;
static double seconds = 3;
static uint8_t *tok;
static size_t toklen;

/* ---- a minimal TCPStore (PyTorch 1.13) client: 1-byte query type, u64-length strings ---- */
enum { TS_SET = 0, TS_GET = 2, TS_ADD = 3, TS_WAIT = 5 };

struct ts {
    int fd;
};

static int ts_connect(struct ts *t)
{
    for (int attempt = 0; attempt < 200; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, host, &a.sin_addr);
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            t->fd = fd;
            return 0;
        }
        close(fd);
        usleep(50000);
    }
    return DDP_ECONNECT;
}

static int ts_sendall(struct ts *t, const void *p, size_t n)
{
    return ddp_write_all(t->fd, p, n);
}

static int ts_recvall(struct ts *t, void *p, size_t n)
{
    char *c = p;
    while (n) {
        ssize_t r = recv(t->fd, c, n, 0);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return DDP_ECLOSED;
        }
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Builds one request in buf: query type, then length-prefixed strings. */
static size_t ts_put_str(uint8_t *buf, size_t off, const void *s, uint64_t n)
{
    memcpy(buf + off, &n, 8);
    memcpy(buf + off + 8, s, n);
    return off + 8 + n;
}

static int ts_set(struct ts *t, const char *k, const void *v, size_t vl)
{
    uint8_t buf[512];
    buf[0] = TS_SET;
    size_t off = ts_put_str(buf, 1, k, strlen(k));
    off = ts_put_str(buf, off, v, vl);
    return ts_sendall(t, buf, off);
}

static int ts_get(struct ts *t, const char *k, char *out, size_t cap)
{
    uint8_t buf[512];
    uint64_t n;
    buf[0] = TS_GET;
    size_t off = ts_put_str(buf, 1, k, strlen(k));
    int r;
    if ((r = ts_sendall(t, buf, off)) < 0 || (r = ts_recvall(t, &n, 8)) < 0)
        return r;
    if (n > cap)
        return DDP_ETOOBIG;
    return ts_recvall(t, out, n);
}

static int ts_add(struct ts *t, const char *k, int64_t d, int64_t *res)
{
    uint8_t buf[512];
    buf[0] = TS_ADD;
    size_t off = ts_put_str(buf, 1, k, strlen(k));
    memcpy(buf + off, &d, 8);
    off += 8;
    int r;
    if ((r = ts_sendall(t, buf, off)) < 0)
        return r;
    return ts_recvall(t, res, 8);
}

static int ts_wait(struct ts *t, const char *k)
{
    uint8_t buf[512], resp;
    buf[0] = TS_WAIT;
    uint64_t one = 1;
    memcpy(buf + 1, &one, 8);
    size_t off = ts_put_str(buf, 9, k, strlen(k));
    int r;
    if ((r = ts_sendall(t, buf, off)) < 0 || (r = ts_recvall(t, &resp, 1)) < 0)
        return r;
    return resp == 0 ? 0 : DDP_EPROTO;
}

/* ---- the two client kinds behind one interface ---- */
struct cli {
    struct ddp_store *d;
    struct ts t;
};

static bool is_ddp(void)
{
    return strcmp(proto, "ddp") == 0;
}

static int cli_connect(struct cli *c)
{
    if (is_ddp())
        return ddp_store_connect(host, port, tok, toklen, 120000, &c->d);
    return ts_connect(&c->t);
}

static void cli_close(struct cli *c)
{
    if (is_ddp())
        ddp_store_close(c->d);
    else
        close(c->t.fd);
}

/* ---- ops mode ---- */
struct ops_arg {
    int id;
    uint64_t n;
    uint32_t *lat_us; /* per-op latency samples */
    size_t nlat, cap;
    int rc;
};
static atomic_int ready_count;
static atomic_bool go, stop;

static void *ops_thread(void *a)
{
    struct ops_arg *o = a;
    struct cli c;
    char key[64], buf[256];
    snprintf(key, sizeof(key), "bench/%d", o->id);
    if ((o->rc = cli_connect(&c)) < 0) {
        atomic_fetch_add(&ready_count, 1);
        return NULL;
    }
    /* the key read by GETs exists before timing starts */
    o->rc = is_ddp() ? ddp_store_set(c.d, key, "0123456789abcdef", 16)
                     : ts_set(&c.t, key, "0123456789abcdef", 16);
    atomic_fetch_add(&ready_count, 1);
    while (!atomic_load(&go))
        usleep(100);
    while (!atomic_load_explicit(&stop, memory_order_relaxed) && o->rc == 0) {
        int64_t t0 = ddp_now_ns();
        if (strcmp(op, "set") == 0) {
            o->rc = is_ddp() ? ddp_store_set(c.d, key, "0123456789abcdef", 16)
                             : ts_set(&c.t, key, "0123456789abcdef", 16);
        } else if (strcmp(op, "get") == 0) {
            if (is_ddp()) {
                void *v;
                size_t n;
                if ((o->rc = ddp_store_get(c.d, key, &v, &n)) == 0)
                    free(v);
            } else {
                o->rc = ts_get(&c.t, key, buf, sizeof(buf));
            }
        } else {
            int64_t v;
            o->rc = is_ddp() ? ddp_store_add(c.d, "bench/ctr", 1, &v)
                             : ts_add(&c.t, "bench/ctr", 1, &v);
        }
        int64_t dt = (ddp_now_ns() - t0) / 1000;
        if (o->nlat < o->cap)
            o->lat_us[o->nlat++] = (uint32_t)dt;
        o->n++;
    }
    cli_close(&c);
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int run_ops(void)
{
    pthread_t *th = calloc((size_t)nclients, sizeof(*th));
    struct ops_arg *a = calloc((size_t)nclients, sizeof(*a));
    for (int i = 0; i < nclients; i++) {
        a[i].id = i;
        a[i].cap = 1 << 20;
        a[i].lat_us = malloc(a[i].cap * sizeof(uint32_t));
        pthread_create(&th[i], NULL, ops_thread, &a[i]);
    }
    while (atomic_load(&ready_count) < nclients)
        usleep(1000);
    int64_t t0 = ddp_now_ns();
    atomic_store(&go, true);
    usleep((useconds_t)(seconds * 1e6));
    atomic_store(&stop, true);
    double el = (double)(ddp_now_ns() - t0) / 1e9;
    uint64_t total = 0;
    size_t nl = 0;
    int bad = 0;
    for (int i = 0; i < nclients; i++) {
        pthread_join(th[i], NULL);
        total += a[i].n;
        nl += a[i].nlat;
        if (a[i].rc < 0 && bad++ == 0)
            fprintf(stderr, "client %d: %s\n", i, ddp_err_name(a[i].rc));
    }
    uint32_t *all = malloc((nl ? nl : 1) * sizeof(uint32_t));
    size_t k = 0;
    for (int i = 0; i < nclients; i++) {
        memcpy(all + k, a[i].lat_us, a[i].nlat * sizeof(uint32_t));
        k += a[i].nlat;
        free(a[i].lat_us);
    }
    qsort(all, nl, sizeof(uint32_t), cmp_u32);
    printf("RESULT ops %s %s %d %.0f %u %u\n", proto, op, nclients, (double)total / el,
           nl ? all[nl / 2] : 0, nl ? all[(size_t)((double)nl * 0.99)] : 0);
    free(all);
    free(a);
    free(th);
    return bad ? 1 : 0;
}

/* ---- barrier mode: connect, authenticate (ddp), ADD, last one SETs, all WAIT ---- */
struct bar_arg {
    int rc;
};

static void *bar_thread(void *a)
{
    struct bar_arg *b = a;
    struct cli c;
    char arrived[128], done[128];
    snprintf(arrived, sizeof(arrived), "%s/arrived", bname);
    snprintf(done, sizeof(done), "%s/done", bname);
    if ((b->rc = cli_connect(&c)) < 0)
        return NULL;
    if (is_ddp()) {
        b->rc = ddp_store_barrier(c.d, bname, nclients, 120000);
    } else {
        int64_t v;
        if ((b->rc = ts_add(&c.t, arrived, 1, &v)) == 0) {
            if (v == nclients)
                b->rc = ts_set(&c.t, done, "1", 1);
            if (b->rc == 0)
                b->rc = ts_wait(&c.t, done);
        }
    }
    cli_close(&c);
    return NULL;
}

static int run_barrier(void)
{
    pthread_t *th = calloc((size_t)nclients, sizeof(*th));
    struct bar_arg *a = calloc((size_t)nclients, sizeof(*a));
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 128 << 10);
    int64_t t0 = ddp_now_ns();
    for (int i = 0; i < nclients; i++)
        if (pthread_create(&th[i], &attr, bar_thread, &a[i]) != 0) {
            fprintf(stderr, "pthread_create failed at %d\n", i);
            return 1;
        }
    int bad = 0;
    for (int i = 0; i < nclients; i++) {
        pthread_join(th[i], NULL);
        bad += a[i].rc < 0;
    }
    printf("RESULT barrier %s %d %.1f %d\n", proto, nclients, (double)(ddp_now_ns() - t0) / 1e6,
           bad);
    free(a);
    free(th);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *mode = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--proto") && v)
            proto = argv[++i];
        else if (!strcmp(a, "--addr") && v)
            addr = argv[++i];
        else if (!strcmp(a, "--token-file") && v)
            token_file = argv[++i];
        else if (!strcmp(a, "--op") && v)
            op = argv[++i];
        else if (!strcmp(a, "--clients") && v)
            nclients = atoi(argv[++i]);
        else if (!strcmp(a, "--seconds") && v)
            seconds = atof(argv[++i]);
        else if (!strcmp(a, "--name") && v)
            bname = argv[++i];
        else if (!mode)
            mode = a;
        else
            goto usage;
    }
    if (!mode || !addr || ddp_parse_hostport(addr, host, sizeof(host), &port) < 0)
        goto usage;
    if (is_ddp() && (!token_file || ddp_store_token_read_file(token_file, &tok, &toklen) < 0))
        goto usage;
    ddp_raise_nofile();
    if (!strcmp(mode, "ops"))
        return run_ops();
    if (!strcmp(mode, "barrier"))
        return run_barrier();
usage:
    fprintf(stderr, "usage: see the comment at the top of bench/store_bench.c\n");
    return 2;
}
