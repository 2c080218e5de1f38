/*
 * Collectives over TCP (a transport of worker/coll_cpu.c): a full-duplex transfer primitive
 * that reduces
 * received bytes as soon as whole elements have arrived (so each ring step
 * overlaps sending, receiving and reducing), the ring all-reduce
 * (reduce-scatter then all-gather), recursive doubling for small messages,
 * a binomial-tree broadcast, ring all-gather and reduce-scatter, and a
 * dissemination barrier.
 */
#include "worker/coll.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "worker/team.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/banned.h"

#define IO_SLICE (256u << 10) /* bytes per send/recv call, so both directions progress */
/*
 * Received bytes that are reduced as they arrive land in a window of this many bytes, reused,
 * instead of a scratch buffer as large as a ring step (half the message at 2 ranks: 512 MiB for
 * a 1 GiB bucket). Measured on loopback TCP at 2 ranks (BENCHMARKS.md, "All-reduce across two
 * hosts"): 2 MiB costs nothing at any size. Since the window is placed away from 4K aliasing
 * (ddp__away_from), 256 KiB to 2 MiB windows measure alike at 4 to 64 MiB messages.
 */
#define RECV_WIN ((size_t)2 << 20)

/* Where a transfer's first error goes: the group's message, or with a split transfer each
 * thread's own (c->err is the group's, written by one thread at a time). */
struct errto {
    char *buf;
    size_t len;
};

static int fail(const struct ddp__comm *c, struct errto e, int code, const struct ddp__peer *p,
                const char *what)
{
    if (!e.buf[0])
        snprintf(e.buf, e.len, "%s peer rank %d (%s) during %s", what, p->rank, p->host, c->opname);
    return code;
}

/* One transfer's loop: sends and receives whatever x asks of either; with stop, a split
 * transfer's other half may end it early (a failure there: DDP_ECLOSED here, its own message
 * kept), so it never sleeps in poll for long. */
static int xfer_loop(struct ddp__comm *c, const struct ddp__xfer *x, struct errto et,
                     _Atomic int *stop)
{
    size_t sent = 0, got = 0, reduced = 0;
    size_t esz = x->reduce_dst || x->dpcs ? ddp_dtype_size(x->dt) : 1;
    struct ddp__pieces sv, rv, dv; /* cursors of our own over pieces */
    if (x->spcs)
        sv = *x->spcs;
    if (x->rpcs)
        rv = *x->rpcs;
    if (x->dpcs)
        dv = *x->dpcs;
    int64_t spin_end = ddp_now_ns() + DDP__SPIN_NS; /* then sleep in poll */
    while (sent < x->slen || got < x->rlen) {
        if (stop && atomic_load_explicit(stop, memory_order_relaxed))
            return DDP_ECLOSED;
        struct pollfd p[2];
        int np = 0, is = -1, ir = -1;
        if (sent < x->slen) {
            p[np] = (struct pollfd){.fd = x->to->fd, .events = POLLOUT};
            is = np++;
        }
        if (got < x->rlen) {
            p[np] = (struct pollfd){.fd = x->from->fd, .events = POLLIN};
            ir = np++;
        }
        int64_t rem = c->deadline_ms - ddp_now_ms();
        if (rem <= 0)
            return fail(c, et, DDP_ETIMEDOUT, ir >= 0 ? x->from : x->to, "timed out waiting for");
        bool spin = ddp_now_ns() < spin_end;
        int cap = stop ? 50 : 1000;
        int pr = poll(p, (nfds_t)np, spin ? 0 : rem > cap ? cap : (int)rem);
        if (pr < 0 && errno != EINTR)
            return fail(c, et, DDP_ESYS, x->to, "poll failed with");
        if (pr == 0 && spin)
            sched_yield();
        if (pr <= 0)
            continue;
        if (ir >= 0 && p[ir].revents) {
            size_t want = x->rlen - got, at = x->rwin ? got % x->rwin : got;
            if (want > IO_SLICE)
                want = IO_SLICE;
            if (x->rwin && want > x->rwin - at) /* up to the window's end: elements never wrap */
                want = x->rwin - at;
            char *into =
                x->rpcs ? ddp__pieces_bytes(&rv, x->roff + got, &want) : (char *)x->rbuf + at;
            ssize_t n = recv(x->from->fd, into, want, MSG_DONTWAIT);
            if (n == 0)
                return fail(c, et, DDP_ECLOSED, x->from, "connection closed by");
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                return fail(c, et, DDP_ECLOSED, x->from, "connection lost to");
            if (n > 0) {
                got += (size_t)n;
                if (x->dpcs) {
                    size_t whole = got / esz * esz;
                    /* as below, into the pieces: a run of whole elements per piece */
                    const char *from = (char *)x->rbuf + (x->rwin ? reduced % x->rwin : reduced);
                    while (whole > reduced) {
                        size_t len = whole - reduced;
                        char *dst = ddp__pieces_bytes(&dv, x->doff + reduced, &len);
                        ddp__reduce(dst, from, len / esz, x->dt, x->op);
                        from += len;
                        reduced += len;
                    }
                } else if (x->reduce_dst) {
                    size_t whole = got / esz * esz;
                    if (whole > reduced) {
                        /* [reduced, whole) lies in one pass over the window: the unreduced
                         * bytes before this recv were less than an element, behind got */
                        size_t from = x->rwin ? reduced % x->rwin : reduced;
                        char *dst = (char *)x->reduce_dst + reduced;
                        if (x->reduce_own)
                            ddp__reduce_to(dst, (const char *)x->reduce_own + reduced,
                                           (char *)x->rbuf + from, (whole - reduced) / esz, x->dt,
                                           x->op);
                        else
                            ddp__reduce(dst, (char *)x->rbuf + from, (whole - reduced) / esz, x->dt,
                                        x->op);
                        reduced = whole;
                    }
                }
            }
        }
        if (is >= 0 && (p[is].revents & (POLLOUT | POLLERR | POLLHUP))) {
            size_t want = x->slen - sent > IO_SLICE ? IO_SLICE : x->slen - sent;
            const char *out = x->spcs ? ddp__pieces_bytes(&sv, x->soff + sent, &want)
                                      : (const char *)x->sbuf + sent;
            ssize_t n = send(x->to->fd, out, want, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                return fail(c, et, DDP_ECLOSED, x->to, "connection lost to");
            if (n > 0)
                sent += (size_t)n;
        }
    }
    return 0;
}

bool ddp__tcp_split_env(void)
{
    const char *v = getenv("DDP_PG_TCP_THREADS");
    if (!v || !*v || strcmp(v, "1") == 0)
        return false;
    if (strcmp(v, "2") == 0)
        return true;
    DDP_WARN(PG, "DDP_PG_TCP_THREADS='%s' is neither 1 nor 2; using 1", v);
    return false;
}

int ddp__tcp_conns_env(void)
{
    const char *v = getenv("DDP_PG_TCP_CONNS");
    if (!v || !*v || strcmp(v, "auto") == 0)
        return 0;
    char *end;
    long k = strtol(v, &end, 10);
    if (*end || k < 1 || k > DDP__TCP_MAX_CONNS) {
        DDP_WARN(PG, "DDP_PG_TCP_CONNS='%s' is neither auto nor a number from 1 to %d; using auto",
                 v, DDP__TCP_MAX_CONNS);
        return 0;
    }
    return (int)k;
}

size_t ddp__tcp_stripe_env(void)
{
    const char *v = getenv("DDP_PG_TCP_STRIPE_BYTES");
    if (!v || !*v)
        return DDP__TCP_STRIPE_BYTES;
    char *end;
    errno = 0;
    unsigned long long k = strtoull(v, &end, 10);
    if (errno || *end || v[0] == '-' || k < DDP__TCP_STRIPE_MIN || k > (1ull << 30)) {
        DDP_WARN(PG,
                 "DDP_PG_TCP_STRIPE_BYTES='%s' is not a number of bytes from %zu to %llu; "
                 "using %zu",
                 v, (size_t)DDP__TCP_STRIPE_MIN, 1ull << 30, (size_t)DDP__TCP_STRIPE_BYTES);
        return DDP__TCP_STRIPE_BYTES;
    }
    return (size_t)k;
}

int ddp__tcp_auto_conns(int usable_cpus)
{
    return usable_cpus >= DDP__TCP_WIDE_CPUS ? 4 : 2;
}

int ddp__tcp_pair_conns(int asked, bool alone_apart, int mine, int theirs)
{
    if (asked > 0)
        return asked;
    if (!alone_apart)
        return 1;
    return mine < theirs ? mine : theirs;
}

/* A transfer split over two threads: part 0 (the collective's own thread) receives and
 * reduces, part 1 sends. */
struct split {
    struct ddp__comm *c;
    struct ddp__xfer half[2];
    char err[2][512];
    int rc[2];
    _Atomic int stop;
};

static void split_part(void *arg, int part, int parts)
{
    struct split *sp = arg;
    (void)parts;
    struct errto et = {sp->err[part], sizeof(sp->err[part])};
    sp->rc[part] = xfer_loop(sp->c, &sp->half[part], et, &sp->stop);
    if (sp->rc[part] < 0)
        atomic_store(&sp->stop, 1);
}

static bool apart(const void *a, size_t alen, const void *b, size_t blen)
{
    return (const char *)a + alen <= (const char *)b || (const char *)b + blen <= (const char *)a;
}

/* The comm's sending thread for a transfer of x, or NULL: the caller does both directions.
 * Only where each way carries DDP__TCP_SPLIT_BYTES or more and the bytes sent are none that
 * this transfer receives or reduces into (the ring's steps: other chunks), so the two halves
 * need not wait for each other. */
static struct ddp__team *split_team(struct ddp__comm *c, const struct ddp__xfer *x)
{
    if (!c->tcp_split || x->spcs || x->rpcs || x->dpcs || x->slen < DDP__TCP_SPLIT_BYTES ||
        x->rlen < DDP__TCP_SPLIT_BYTES ||
        !apart(x->sbuf, x->slen, x->rbuf, x->rwin ? x->rwin : x->rlen) ||
        (x->reduce_dst && !apart(x->sbuf, x->slen, x->reduce_dst, x->rlen)))
        return NULL;
    if (!c->tcp_team) {
        if (!(c->tcp_team = ddp__team_new(2))) {
            DDP_WARN(PG, "cannot start a sending thread for TCP transfers; one thread does both");
            c->tcp_split = false;
        } else {
            DDP_INFO(PG,
                     "TCP transfers from %zu KiB each way: a thread sends while another receives",
                     (size_t)DDP__TCP_SPLIT_BYTES >> 10);
        }
    }
    return c->tcp_team;
}

/*
 * A transfer cut in stripes, one per connection to the peer, part k on its own thread (k = 0
 * the collective's): each direction is striped when it carries tcp_stripe_bytes or more
 * and its peer has more than one connection, which the other end of the same bytes decides
 * alike (both know the length, and the pair's count); a direction that is not goes whole over
 * the first connection, in part 0. Each direction has its own peer's count of stripes (the
 * default gives pairs different counts: ddp__tcp_pair_conns), parts beyond it idle there; the
 * team has tcp_conns parts, the largest count. Stripes start at multiples of 64 bytes (whole
 * elements of every dtype), so each part reduces whole elements; a reducing transfer's receive
 * window is shared out among the parts.
 */
struct stripes {
    struct ddp__comm *c;
    const struct ddp__xfer *x;
    int ns, nr; /* stripes sent and received: 1 where that direction is not striped */
    struct ddp__peer to[DDP__TCP_MAX_CONNS], from[DDP__TCP_MAX_CONNS];
    char err[DDP__TCP_MAX_CONNS][512];
    int rc[DDP__TCP_MAX_CONNS];
    _Atomic int stop;
};

/* [*a, *b) of len for stripe k of n. */
static void stripe_range(size_t len, int k, int n, size_t *a, size_t *b)
{
    *a = (size_t)((unsigned __int128)len * (unsigned)k / (unsigned)n) & ~(size_t)63;
    *b = k + 1 == n
             ? len
             : (size_t)((unsigned __int128)len * (unsigned)(k + 1) / (unsigned)n) & ~(size_t)63;
}

static void stripe_part(void *arg, int k, int parts)
{
    struct stripes *sp = arg;
    const struct ddp__xfer *x = sp->x;
    struct ddp__xfer p = *x;
    size_t a, b;
    (void)parts;
    if (k < sp->ns && sp->ns > 1) {
        stripe_range(x->slen, k, sp->ns, &a, &b);
        if (x->spcs)
            p.soff = x->soff + a;
        else
            p.sbuf = (const char *)x->sbuf + a;
        p.slen = b - a;
    } else if (k > 0) {
        p.slen = 0;
    }
    if (k < sp->nr && sp->nr > 1) {
        int n = sp->nr;
        stripe_range(x->rlen, k, n, &a, &b);
        p.rlen = b - a;
        if (x->dpcs) {
            p.doff = x->doff + a;
        } else if (x->reduce_dst) {
            p.reduce_dst = (char *)x->reduce_dst + a;
            if (x->reduce_own)
                p.reduce_own = (const char *)x->reduce_own + a;
        }
        if (x->rwin) { /* a share of the window, in whole elements */
            size_t esz = x->reduce_dst || x->dpcs ? ddp_dtype_size(x->dt) : 1;
            p.rwin = x->rwin / (size_t)n / esz * esz;
            p.rbuf = (char *)x->rbuf + (size_t)k * p.rwin;
        } else if (x->rpcs) {
            p.roff = x->roff + a;
        } else {
            p.rbuf = (char *)x->rbuf + a;
        }
    } else if (k > 0) {
        p.rlen = 0;
        p.reduce_dst = NULL;
        p.dpcs = NULL;
    }
    p.to = x->to ? &sp->to[k] : NULL;
    p.from = x->from ? &sp->from[k] : NULL;
    struct errto et = {sp->err[k], sizeof(sp->err[k])};
    sp->rc[k] = xfer_loop(sp->c, &p, et, &sp->stop);
    if (sp->rc[k] < 0)
        atomic_store(&sp->stop, 1);
}

/* Whether len bytes to or from peer p go in stripes. */
static bool striped(const struct ddp__comm *c, const struct ddp__peer *p, size_t len)
{
    return p && p->nconns > 1 && len >= c->tcp_stripe_bytes;
}

static int xfer_striped(struct ddp__comm *c, const struct ddp__xfer *x)
{
    bool ss = striped(c, x->to, x->slen), rs = striped(c, x->from, x->rlen);
    if (!c->tcp_team) {
        if (!(c->tcp_team = ddp__team_new(c->tcp_conns))) {
            /* both ends must stripe alike: without threads the group cannot go on */
            snprintf(c->err, sizeof(c->err), "cannot start %d threads for TCP stripes during %s",
                     c->tcp_conns, c->opname);
            return DDP_ESYS;
        }
        DDP_INFO(PG, "TCP messages from %zu KiB: %d connections to a peer, a thread each",
                 c->tcp_stripe_bytes >> 10, c->tcp_conns);
    }
    struct stripes *sp = calloc(1, sizeof(*sp));
    if (!sp)
        return DDP_ENOMEM;
    sp->c = c;
    sp->x = x;
    sp->ns = ss ? x->to->nconns : 1;
    sp->nr = rs ? x->from->nconns : 1;
    for (int k = 0; k < c->tcp_conns; k++) { /* a part beyond a direction's stripes: -1 */
        if (x->to) {
            sp->to[k] = *x->to;
            sp->to[k].fd = !k ? x->to->fd : k < sp->ns ? x->to->sfd[k - 1] : -1;
        }
        if (x->from) {
            sp->from[k] = *x->from;
            sp->from[k].fd = !k ? x->from->fd : k < sp->nr ? x->from->sfd[k - 1] : -1;
        }
    }
    ddp__team_run(c->tcp_team, stripe_part, sp);
    int rc = 0;
    /* the first failure's message: a part that stopped because another failed says nothing */
    for (int k = 0; k < c->tcp_conns && !rc; k++)
        if (sp->rc[k] < 0 && sp->err[k][0]) {
            if (!c->err[0])
                snprintf(c->err, sizeof(c->err), "%s", sp->err[k]);
            rc = sp->rc[k];
        }
    for (int k = 0; k < c->tcp_conns && !rc; k++)
        rc = sp->rc[k];
    free(sp);
    return rc;
}

int ddp__xfer(struct ddp__comm *c, const struct ddp__xfer *x)
{
    struct errto own = {c->err, sizeof(c->err)};
    if (c->tcp_conns > 1 && (striped(c, x->to, x->slen) || striped(c, x->from, x->rlen)))
        return xfer_striped(c, x);
    struct ddp__team *t = split_team(c, x);
    if (!t)
        return xfer_loop(c, x, own, NULL);
    struct split sp = {.c = c, .half = {*x, *x}, .stop = 0};
    sp.half[0].slen = 0; /* receives (and reduces) */
    sp.half[1].rlen = 0; /* sends */
    sp.half[1].reduce_dst = NULL;
    sp.half[1].reduce_own = NULL;
    ddp__team_run(t, split_part, &sp);
    /* the first failure's message: a half that stopped because the other failed says nothing */
    for (int k = 0; k < 2; k++)
        if (sp.rc[k] < 0 && sp.err[k][0]) {
            if (!c->err[0])
                snprintf(c->err, sizeof(c->err), "%s", sp.err[k]);
            return sp.rc[k];
        }
    return sp.rc[0] < 0 ? sp.rc[0] : sp.rc[1];
}

static int scratch(struct ddp__comm *c, size_t bytes, void **out)
{
    if (c->scratch_len < bytes) {
        void *p = realloc(c->scratch, bytes ? bytes : 1);
        if (!p)
            return DDP_ENOMEM;
        c->scratch = p;
        c->scratch_len = bytes;
    }
    *out = c->scratch;
    return 0;
}

static struct ddp__peer *peer(struct ddp__comm *c, int r)
{
    return &c->peers[((r % c->world) + c->world) % c->world];
}

/* Element offset of chunk i when count elements are split into n nearly equal chunks. */
static size_t chunk_off(size_t count, int n, int i)
{
    return (size_t)((unsigned __int128)count * (unsigned)i / (unsigned)n);
}

/* Byte off of buf, or of the pieces' concatenation where pv is set (a cursor of our own). */
static char *byte_at(char *buf, const struct ddp__pieces *pv, size_t off)
{
    if (!pv)
        return buf + off;
    struct ddp__pieces v = *pv;
    size_t len = 1;
    return ddp__pieces_bytes(&v, off, &len);
}

/* The ring over buf, or over the pieces of pv in place (buf NULL). */
static int ring_allreduce(struct ddp__comm *c, char *buf, const struct ddp__pieces *pv,
                          size_t count, enum ddp_dtype dt, enum ddp_redop op)
{
    int n = c->world, r = c->rank, e;
    size_t esz = ddp_dtype_size(dt), maxchunk = (count + (size_t)n - 1) / (size_t)n;
    size_t win = maxchunk * esz > RECV_WIN ? RECV_WIN : 0;
    void *tmp;
    if ((e = scratch(c, (win ? win : maxchunk * esz) + DDP__PAGE, &tmp)) < 0)
        return e;
    struct ddp__peer *next = peer(c, r + 1), *prev = peer(c, r - 1);
    /* Reduce-scatter: after n-1 steps this rank holds the full reduction of chunk r+1. */
    for (int s = 0; s < n - 1; s++) {
        int si = ((r - s) % n + n) % n, ri = ((r - s - 1) % n + n) % n;
        size_t so = chunk_off(count, n, si), ro = chunk_off(count, n, ri);
        struct ddp__xfer x = {.to = next,
                              .sbuf = pv ? NULL : buf + so * esz,
                              .slen = (chunk_off(count, n, si + 1) - so) * esz,
                              .from = prev,
                              .rbuf = ddp__away_from(tmp, byte_at(buf, pv, ro * esz)),
                              .rlen = (chunk_off(count, n, ri + 1) - ro) * esz,
                              .reduce_dst = pv ? NULL : buf + ro * esz,
                              .rwin = win,
                              .spcs = pv,
                              .dpcs = pv,
                              .soff = so * esz,
                              .doff = ro * esz,
                              .dt = dt,
                              .op = op};
        if ((e = ddp__xfer(c, &x)) < 0)
            return e;
    }
    if (op == DDP_AVG) {
        int own = (r + 1) % n;
        size_t o = chunk_off(count, n, own), left = chunk_off(count, n, own + 1) - o;
        struct ddp__pieces v;
        if (pv)
            v = *pv;
        while (left) { /* one run per piece */
            size_t k = left;
            char *at = pv ? ddp__pieces_run(&v, o, &k) : buf + o * esz;
            ddp__scale_avg(at, k, dt, n);
            o += k;
            left -= k;
        }
    }
    /* All-gather: pass the finished chunks around the ring, straight into place. */
    for (int s = 0; s < n - 1; s++) {
        int si = ((r - s + 1) % n + n) % n, ri = ((r - s) % n + n) % n;
        size_t so = chunk_off(count, n, si), ro = chunk_off(count, n, ri);
        struct ddp__xfer x = {.to = next,
                              .sbuf = pv ? NULL : buf + so * esz,
                              .slen = (chunk_off(count, n, si + 1) - so) * esz,
                              .from = prev,
                              .rbuf = pv ? NULL : buf + ro * esz,
                              .rlen = (chunk_off(count, n, ri + 1) - ro) * esz,
                              .spcs = pv,
                              .rpcs = pv,
                              .soff = so * esz,
                              .roff = ro * esz};
        if ((e = ddp__xfer(c, &x)) < 0)
            return e;
    }
    return 0;
}

/* Latency-optimal for small messages: log2(n) exchanges of the whole buffer. Ranks beyond
 * the largest power of two fold into a partner first and get the result back at the end. */
static int rd_allreduce(struct ddp__comm *c, char *buf, size_t count, enum ddp_dtype dt,
                        enum ddp_redop op)
{
    int n = c->world, r = c->rank, e, p2 = 1;
    size_t bytes = count * ddp_dtype_size(dt);
    void *tmp;
    while (p2 * 2 <= n)
        p2 *= 2;
    int extra = n - p2;
    if ((e = scratch(c, bytes + DDP__PAGE, &tmp)) < 0)
        return e;
    tmp = ddp__away_from(tmp, buf);
    if (r >= p2) {
        struct ddp__xfer out = {.to = peer(c, r - p2), .sbuf = buf, .slen = bytes};
        struct ddp__xfer in = {.from = peer(c, r - p2), .rbuf = buf, .rlen = bytes};
        if ((e = ddp__xfer(c, &out)) < 0 || (e = ddp__xfer(c, &in)) < 0)
            return e;
        return 0;
    }
    if (r < extra) {
        struct ddp__xfer in = {.from = peer(c, r + p2), .rbuf = tmp, .rlen = bytes};
        if ((e = ddp__xfer(c, &in)) < 0)
            return e;
        ddp__reduce(buf, tmp, count, dt, op);
    }
    for (int mask = 1; mask < p2; mask <<= 1) {
        struct ddp__peer *pp = peer(c, r ^ mask);
        /* Reduce only after the exchange: buf is being sent meanwhile. */
        struct ddp__xfer x = {
            .to = pp, .sbuf = buf, .slen = bytes, .from = pp, .rbuf = tmp, .rlen = bytes};
        if ((e = ddp__xfer(c, &x)) < 0)
            return e;
        ddp__reduce(buf, tmp, count, dt, op);
    }
    if (op == DDP_AVG)
        ddp__scale_avg(buf, count, dt, n);
    if (r < extra) {
        struct ddp__xfer out = {.to = peer(c, r + p2), .sbuf = buf, .slen = bytes};
        if ((e = ddp__xfer(c, &out)) < 0)
            return e;
    }
    return 0;
}

/* The ring, or recursive doubling for small messages: the ring needs more than small_bytes and
 * at least one element per rank to be worth its 2(n-1) steps. */
static bool ring_pays(const struct ddp__comm *c, size_t count, enum ddp_dtype dt)
{
    return count * ddp_dtype_size(dt) > c->small_bytes && count >= (size_t)c->world;
}

int ddp__tcp_allreduce(struct ddp__comm *c, void *buf, size_t count, enum ddp_dtype dt,
                       enum ddp_redop op)
{
    if (c->world == 1 || count == 0)
        return 0; /* AVG over one rank is the value itself */
    if (!ring_pays(c, count, dt))
        return rd_allreduce(c, buf, count, dt, op);
    return ring_allreduce(c, buf, NULL, count, dt, op);
}

int ddp__tcp_allreduce_pieces(struct ddp__comm *c, const struct ddp_piece *pc, size_t npc,
                              size_t count, enum ddp_dtype dt, enum ddp_redop op)
{
    if (!ring_pays(c, count, dt))
        return 1;
    struct ddp__pieces v;
    ddp__pieces_init(&v, pc, npc, ddp_dtype_size(dt));
    return ring_allreduce(c, NULL, &v, count, dt, op);
}

int ddp__tcp_broadcast(struct ddp__comm *c, void *buf, size_t bytes, int root)
{
    int n = c->world, vr = ((c->rank - root) % n + n) % n, mask = 1, e;
    if (n == 1 || bytes == 0)
        return 0;
    /* Binomial tree on ranks relative to the root: receive once, then forward. */
    while (mask < n) {
        if (vr & mask) {
            struct ddp__xfer in = {.from = peer(c, vr - mask + root), .rbuf = buf, .rlen = bytes};
            if ((e = ddp__xfer(c, &in)) < 0)
                return e;
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (vr + mask < n) {
            struct ddp__xfer out = {.to = peer(c, vr + mask + root), .sbuf = buf, .slen = bytes};
            if ((e = ddp__xfer(c, &out)) < 0)
                return e;
        }
    }
    return 0;
}

int ddp__tcp_allgather(struct ddp__comm *c, const void *send, void *recv, size_t bytes)
{
    int n = c->world, r = c->rank, e;
    char *out = recv;
    if (bytes)
        memmove(out + (size_t)r * bytes, send, bytes);
    for (int s = 0; s < n - 1 && bytes; s++) {
        int si = ((r - s) % n + n) % n, ri = ((r - s - 1) % n + n) % n;
        struct ddp__xfer x = {.to = peer(c, r + 1),
                              .sbuf = out + (size_t)si * bytes,
                              .slen = bytes,
                              .from = peer(c, r - 1),
                              .rbuf = out + (size_t)ri * bytes,
                              .rlen = bytes};
        if ((e = ddp__xfer(c, &x)) < 0)
            return e;
    }
    return 0;
}

/*
 * The ring's reduce-scatter, shifted so that this rank ends with block r. Step s reduces the
 * partial sum of one block from the previous rank with this rank's own block into q[s], which
 * step s+1 sends on: q alternates between recv and one block of scratch so that the last lands
 * in recv. send is only read; recv may be send's own block r (in place), then the last result
 * goes through scratch too.
 */
int ddp__tcp_reduce_scatter(struct ddp__comm *c, const void *send, void *recv, size_t count,
                            enum ddp_dtype dt, enum ddp_redop op)
{
    int n = c->world, r = c->rank, e = 0;
    size_t esz = ddp_dtype_size(dt), bytes = count * esz;
    const char *in = send;
    char *out = recv;
    if (count == 0)
        return 0;
    if (n == 1) {
        memmove(out, in, bytes); /* AVG over one rank is the value itself */
        return 0;
    }
    bool alias = out < in + bytes * (size_t)n && in < out + bytes;
    size_t nscratch = (n > 2) + alias;
    char *extra = NULL, *win;
    if (nscratch && !(extra = malloc(bytes * nscratch)))
        return DDP_ENOMEM;
    char *last = alias ? extra + (nscratch - 1) * bytes : out, *other = extra;
    size_t wlen = bytes > RECV_WIN ? RECV_WIN : bytes;
    if ((e = scratch(c, wlen + DDP__PAGE, (void **)&win)) < 0)
        goto out;
    const char *next_send = in + (size_t)((r - 1 + n) % n) * bytes; /* step 0: block r-1 */
    for (int s = 0; s < n - 1; s++) {
        int ri = ((r - s - 2) % n + n) % n;
        char *dst = (n - 2 - s) % 2 == 0 ? last : other;
        struct ddp__xfer x = {.to = peer(c, r + 1),
                              .sbuf = next_send,
                              .slen = bytes,
                              .from = peer(c, r - 1),
                              .rbuf = ddp__away_from(win, dst),
                              .rlen = bytes,
                              .reduce_dst = dst,
                              .rwin = wlen,
                              .reduce_own = in + (size_t)ri * bytes,
                              .dt = dt,
                              .op = op};
        if ((e = ddp__xfer(c, &x)) < 0)
            goto out;
        next_send = dst; /* step s+1 passes on what step s reduced */
    }
    if (op == DDP_AVG)
        ddp__scale_avg(last, count, dt, n);
    if (alias)
        memmove(out, last, bytes);
out:
    free(extra);
    return e;
}

int ddp__tcp_barrier(struct ddp__comm *c)
{
    int n = c->world, r = c->rank, e;
    char out = 1, in;
    /* Dissemination: after ceil(log2 n) rounds everyone has heard from everyone. */
    for (int k = 1; k < n; k <<= 1) {
        struct ddp__xfer x = {.to = peer(c, r + k),
                              .sbuf = &out,
                              .slen = 1,
                              .from = peer(c, r - k),
                              .rbuf = &in,
                              .rlen = 1};
        if ((e = ddp__xfer(c, &x)) < 0)
            return e;
    }
    return 0;
}
