/*
 * pgtest: run under ddprun (or with RANK/WORLD_SIZE/... set by hand) to check
 * the process group against a sequential reference. Every rank can rebuild
 * every other rank's input from (rank, index, seed), so each computes the
 * reference locally. Inputs are small integers: sums are exact in every
 * dtype, bf16 and f16 included, so results are compared bit for bit.
 *
 *   pgtest matrix        every collective, dtype, op and size up to 1 MiB (reduce-scatter
 *                        also in place)
 *   pgtest wide          every dtype and op at about 6 MiB: all-reduce and reduce-scatter
 *                        (into recv, then in place)
 *   pgtest big MIB       one float32 sum all-reduce of MIB MiB, checked; rank 0 prints its
 *                        time and the CPUs it counts as usable (common/cpus.h)
 *   pgtest loop MIB      all-reduce MIB MiB until an error (failure tests)
 *   pgtest direct        all-reduces of ordinary (malloc), registered (ddp_pg_mem_alloc) and
 *                        mixed buffers, checked; prints how many went single-copy and how
 *                        many peer reads were cross-memory attach
 *   pgtest auto N [mixed|MIB,...]  N all-reduces of 4 MiB registered (odd ranks malloc'd:
 *                        mixed; or of the sizes listed, in turn), checked; prints which way
 *                        each went under DDP_PG_DIRECT_BYTES=auto
 *   pgtest p2p           point-to-point (ddp_pg_send/recv, DDP_PG_P2P=1): a ring of sizes 0 to
 *                        16 MiB posted both ways round, tags out of order, one tag twice,
 *                        64 MiB both ways at once beside an all-reduce, a size mismatch, and a
 *                        peer's message received after it exited
 *   pgtest p2p-wait      rank 0 waits for 64 MiB from rank 1, which never sends (kill tests)
 *   pgtest post          an all-reduce posted (ddp_pg_allreduce_post) by ranks that then sleep,
 *                        summed by rank 0 alone meanwhile; then one posted before a barrier
 *   pgtest stream [--die] an all-reduce of pieces posted before its data is complete
 *                        (ddp_pg_allreduce_pieces_post): rank 0 sums what is ready, no more
 *   pgtest sndbuf        prints each collective connection's SO_SNDBUF (DDP_PG_TCP_SNDBUF)
 *   pgtest groups        sub-groups (ddp_pg_new_group): even and odd ranks all-reducing beside
 *                        the whole group, every rank in reverse order, lists that differ
 *                        between ranks or repeat a rank refused on every rank
 */
#include "common/cpus.h"
#include "common/err.h"
#include "common/util.h"
#include "worker/coll.h"
#include "worker/group.h"
#include "worker/pg.h"
#include "tests/helpers/pgtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

int rank, world;
long checks;

/* The checks' own arithmetic (inputs and references of millions of elements per check) runs
 * uninstrumented in the ASan/UBSan build, where it took about half of a rank's CPU: what the
 * sanitizers are there for is the library, whose accesses to these buffers stay checked. */
#define UNCHECKED __attribute__((no_sanitize("address", "undefined")))

/* Values into buf's dtype: n of them from v, with one switch per call, not one per element
 * (the reference and the inputs of a 6 MiB check are millions of elements). */
UNCHECKED static void store_vals(void *buf, enum ddp_dtype dt, const double *v, size_t n)
{
    switch (dt) {
    case DDP_F32:
        for (size_t i = 0; i < n; i++)
            ((float *)buf)[i] = (float)v[i];
        break;
    case DDP_F64:
        memcpy(buf, v, n * sizeof(double));
        break;
    case DDP_I32:
        for (size_t i = 0; i < n; i++)
            ((int32_t *)buf)[i] = (int32_t)v[i];
        break;
    case DDP_I64:
        for (size_t i = 0; i < n; i++)
            ((int64_t *)buf)[i] = (int64_t)v[i];
        break;
    case DDP_BF16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)buf)[i] = ddp__f32_to_bf16((float)v[i]);
        break;
    case DDP_F16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)buf)[i] = ddp__f32_to_f16((float)v[i]);
        break;
    }
}

#define BLOCK 4096 /* elements the helpers below work on at a time */

UNCHECKED static void fill(void *buf, size_t n, enum ddp_dtype dt, int r, unsigned seed,
                           size_t base)
{
    double v[BLOCK];
    size_t esz = ddp_dtype_size(dt);
    for (size_t i = 0; i < n; i += BLOCK) {
        size_t k = n - i < BLOCK ? n - i : BLOCK;
        for (size_t j = 0; j < k; j++)
            v[j] = (double)gen(r, base + i + j, seed);
        store_vals((char *)buf + i * esz, dt, v, k);
    }
}

/* Sequential reference for elements [0, n) of out, element i being element gi0 + i of the
 * ranks' inputs, over ranks 0..world-1: exact in int64 (the inputs are small integers), then
 * an average divides as each dtype does. */
UNCHECKED static void reference(void *out, size_t n, size_t gi0, enum ddp_dtype dt,
                                enum ddp_redop op, unsigned seed)
{
    double v[BLOCK];
    size_t esz = ddp_dtype_size(dt);
    for (size_t i = 0; i < n; i += BLOCK) {
        size_t k = n - i < BLOCK ? n - i : BLOCK, g = gi0 + i;
        /* in registers, a loop per op: the sanitizer builds check every array access and
         * do not hoist the op's test out of the loop */
        for (size_t j = 0; j < k; j++) {
            int64_t acc = gen(0, g + j, seed);
            if (op == DDP_MAX)
                for (int r = 1; r < world; r++) {
                    int64_t x = gen(r, g + j, seed);
                    acc = x > acc ? x : acc;
                }
            else if (op == DDP_MIN)
                for (int r = 1; r < world; r++) {
                    int64_t x = gen(r, g + j, seed);
                    acc = x < acc ? x : acc;
                }
            else
                for (int r = 1; r < world; r++)
                    acc += gen(r, g + j, seed);
            if (op != DDP_AVG)
                v[j] = (double)acc;
            else if (dt == DDP_F32 || dt == DDP_BF16 || dt == DDP_F16)
                v[j] = (double)((float)acc / (float)world);
            else if (dt == DDP_F64)
                v[j] = (double)acc / world;
            else
                v[j] = (double)(acc / world);
        }
        store_vals((char *)out + i * esz, dt, v, k);
    }
}

static const char *dtn[] = {"f32", "f64", "bf16", "f16", "i32", "i64"};
static const char *opn[] = {"sum", "avg", "max", "min"};

int compare(const void *got, const void *want, size_t n, enum ddp_dtype dt, const char *what)
{
    size_t esz = ddp_dtype_size(dt);
    if (memcmp(got, want, n * esz) == 0) {
        checks++;
        return 0;
    }
    size_t i = 0;
    while (i < n && memcmp((const char *)got + i * esz, (const char *)want + i * esz, esz) == 0)
        i++;
    fprintf(stderr, "pgtest rank %d: %s: element %zu of %zu differs from the reference\n", rank,
            what, i, n);
    return 1;
}

int must(struct ddp_pg *pg, int r, const char *what)
{
    if (r != 0) {
        fprintf(stderr, "pgtest rank %d: %s failed: %s (%s)\n", rank, what, ddp_pg_last_error(pg),
                ddp_err_name(r));
        exit(1);
    }
    return 0;
}

/* All-reduces buf[n] with each op in turn (seeds *seed, *seed + 1, ...) and checks each
 * against the reference; label heads the description of a mismatch. */
static int allreduce_ops(struct ddp_pg *pg, void *buf, void *want, size_t n, enum ddp_dtype dt,
                         unsigned *seed, const char *label)
{
    int bad = 0;
    char what[160];
    for (int op = 0; op <= DDP_MIN; op++, (*seed)++) {
        fill(buf, n, dt, rank, *seed, 0);
        must(pg, ddp_pg_allreduce(pg, buf, n, dt, (enum ddp_redop)op), "allreduce");
        reference(want, n, 0, dt, (enum ddp_redop)op, *seed);
        snprintf(what, sizeof(what), "%sallreduce %s %s n=%zu", label, dtn[dt], opn[op], n);
        bad |= compare(buf, want, n, dt, what);
    }
    return bad;
}

/* Reduce-scatters send (n elements per rank) with each op in turn (seeds ++*seed), into recv,
 * then again in place (into this rank's own block of send), and checks each against the
 * reference in ref; label heads the description of a mismatch. */
static int reduce_scatter_ops(struct ddp_pg *pg, char *send, void *recv, void *ref, size_t n,
                              enum ddp_dtype dt, unsigned *seed, const char *label)
{
    int bad = 0;
    char what[160];
    for (int inplace = 0; inplace < 2; inplace++) {
        void *out = inplace ? send + (size_t)rank * n * ddp_dtype_size(dt) : recv;
        for (int op = 0; op <= DDP_MIN; op++) {
            fill(send, n * (size_t)world, dt, rank, ++*seed, 0);
            must(pg, ddp_pg_reduce_scatter(pg, send, out, n, dt, (enum ddp_redop)op),
                 "reduce_scatter");
            reference(ref, n, (size_t)rank * n, dt, (enum ddp_redop)op, *seed);
            snprintf(what, sizeof(what), "%s%sreduce_scatter %s %s n=%zu", label,
                     inplace ? "in place " : "", dtn[dt], opn[op], n);
            bad |= compare(out, ref, n, dt, what);
        }
    }
    return bad;
}

/* Every dtype and op at one size of about 6 MiB (an odd count of elements), all-reduce and
 * reduce-scatter (into its own buffer, then in place): over TCP at 2 ranks each ring step receives
 * more than the 2 MiB window it reduces from, so the window wraps with every element size. */
static int wide(struct ddp_pg *pg)
{
    int bad = 0;
    unsigned seed = 7;
    for (int dt = 0; dt <= DDP_I64; dt++) {
        size_t esz = ddp_dtype_size((enum ddp_dtype)dt), n = (6u << 20) / esz + 7;
        char *buf = malloc(n * esz), *want = malloc(n * esz);
        bad |= allreduce_ops(pg, buf, want, n, (enum ddp_dtype)dt, &seed, "wide ");
        free(buf);
        free(want);
        size_t m = n / (size_t)world;
        char *send = malloc(m * (size_t)world * esz), *recv = malloc(m * esz),
             *ref = malloc(m * esz);
        bad |= reduce_scatter_ops(pg, send, recv, ref, m, (enum ddp_dtype)dt, &seed, "wide ");
        free(send);
        free(recv);
        free(ref);
    }
    return bad;
}

static int matrix(struct ddp_pg *pg)
{
    static const size_t sizes[] = {0, 1, 2, 3, 7, 13, 127, 1021, 4099, 65537, 262147};
    int bad = 0;
    char what[128];
    unsigned seed = 1;
    for (int dt = 0; dt <= DDP_I64; dt++) {
        size_t esz = ddp_dtype_size((enum ddp_dtype)dt);
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
            size_t n = sizes[si];
            /* the largest size only for float32, to bound the run time */
            if (n > 65537 && dt != DDP_F32)
                continue;
            char *buf = malloc(n * esz + 1), *want = malloc(n * esz + 1);
            bad |= allreduce_ops(pg, buf, want, n, (enum ddp_dtype)dt, &seed, "");
            /* broadcast from a root that moves with the size */
            int root = (int)(n % (size_t)world);
            fill(buf, n, (enum ddp_dtype)dt, rank, ++seed, 0);
            must(pg, ddp_pg_broadcast(pg, buf, n, (enum ddp_dtype)dt, root), "broadcast");
            fill(want, n, (enum ddp_dtype)dt, root, seed, 0);
            snprintf(what, sizeof(what), "broadcast %s n=%zu root=%d", dtn[dt], n, root);
            bad |= compare(buf, want, n, (enum ddp_dtype)dt, what);
            free(buf);
            free(want);
            /* allgather and reduce-scatter, n elements per rank */
            if (n > 4099)
                continue;
            char *send = malloc(n * esz * (size_t)world + 1),
                 *recv = malloc(n * esz * (size_t)world + 1),
                 *ref = malloc(n * esz * (size_t)world + 1);
            fill(send, n, (enum ddp_dtype)dt, rank, ++seed, 0);
            must(pg, ddp_pg_allgather(pg, send, recv, n, (enum ddp_dtype)dt), "allgather");
            for (int r = 0; r < world; r++)
                fill(ref + (size_t)r * n * esz, n, (enum ddp_dtype)dt, r, seed, 0);
            snprintf(what, sizeof(what), "allgather %s n=%zu", dtn[dt], n);
            bad |= compare(recv, ref, n * (size_t)world, (enum ddp_dtype)dt, what);
            bad |= reduce_scatter_ops(pg, send, recv, ref, n, (enum ddp_dtype)dt, &seed, "");
            free(send);
            free(recv);
            free(ref);
        }
    }
    /* Non-blocking: three operations in flight, waited for in reverse order. */
    size_t n = 100003;
    float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4), *w = malloc(n * 4);
    struct ddp_work *wa, *wb, *wc;
    fill(a, n, DDP_F32, rank, 901, 0);
    fill(b, n, DDP_F32, rank, 902, 0);
    fill(c, n, DDP_F32, rank, 903, 0);
    must(pg, ddp_pg_allreduce_start(pg, a, n, DDP_F32, DDP_SUM, &wa), "start");
    must(pg, ddp_pg_broadcast_start(pg, b, n, DDP_F32, world - 1, &wb), "start");
    must(pg, ddp_pg_allreduce_start(pg, c, n, DDP_F32, DDP_MAX, &wc), "start");
    must(pg, ddp_work_wait(wc), "allreduce (async)");
    int res = 1;
    if (!ddp_work_test(wa, &res) || res != 0) {
        fprintf(stderr, "pgtest rank %d: work issued first did not complete first\n", rank);
        bad = 1;
    }
    must(pg, ddp_work_wait(wb), "broadcast (async)");
    must(pg, ddp_work_wait(wa), "allreduce (async)");
    ddp_work_free(wa);
    ddp_work_free(wb);
    ddp_work_free(wc);
    reference(w, n, 0, DDP_F32, DDP_SUM, 901);
    bad |= compare(a, w, n, DDP_F32, "async allreduce sum");
    fill(w, n, DDP_F32, world - 1, 902, 0);
    bad |= compare(b, w, n, DDP_F32, "async broadcast");
    reference(w, n, 0, DDP_F32, DDP_MAX, 903);
    bad |= compare(c, w, n, DDP_F32, "async allreduce max");
    free(a);
    free(b);
    free(c);
    free(w);
    for (int i = 0; i < 20; i++)
        must(pg, ddp_pg_barrier(pg), "barrier");
    return bad;
}

static int big(struct ddp_pg *pg, size_t mib)
{
    size_t n = mib * (1u << 20) / 4;
    float *buf = malloc(n * 4), *want = malloc(n * 4);
    fill(buf, n, DDP_F32, rank, 77, 0);
    int64_t t0 = ddp_now_ns();
    must(pg, ddp_pg_allreduce(pg, buf, n, DDP_F32, DDP_SUM), "allreduce");
    double ms = (double)(ddp_now_ns() - t0) / 1e6;
    reference(want, n, 0, DDP_F32, DDP_SUM, 77);
    int bad = compare(buf, want, n, DDP_F32, "big allreduce");
    if (rank == 0)
        printf("pgtest: %zu MiB float32 all-reduce over %d ranks in %.1f ms, %d usable CPUs\n", mib,
               world, ms, ddp_usable_cpus());
    free(buf);
    free(want);
    return bad;
}

/* kind 0: every buffer malloc'd; 1: every one registered; 2: even ranks' registered. */
static int direct_kind(struct ddp_pg *pg, int kind, long *done, long *reads, long *shared)
{
    static const size_t sizes[] = {1021, 4099, 65537, 262147, 1048579};
    bool reg = kind == 1 || (kind == 2 && rank % 2 == 0);
    int bad = 0;
    unsigned seed = 500;
    char what[160], label[32];
    snprintf(label, sizeof(label), "direct kind %d ", kind);
    const struct ddp__shm *sh = &pg->comm.shm;
    uint64_t d0 = sh->direct_done, r0 = sh->cma_reads, s0 = sh->direct_shared, c0 = sh->claimed;
    int64_t chunks = 0; /* what the node's ranks claim among them where all is registered */
    for (int dt = 0; dt <= DDP_I64; dt++) {
        size_t esz = ddp_dtype_size((enum ddp_dtype)dt);
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
            size_t n = sizes[si];
            if (sh->direct_min && n * esz >= sh->direct_min) /* each of the 4 ops */
                chunks += 4 * (int64_t)((n * esz + DDP__CLAIM_CHUNK - 1) / DDP__CLAIM_CHUNK);
            char *buf = reg ? ddp_pg_mem_alloc(pg, n * esz) : malloc(n * esz);
            char *want = malloc(n * esz);
            bad |= allreduce_ops(pg, buf, want, n, (enum ddp_dtype)dt, &seed, label);
            ddp_pg_mem_free(pg, buf); /* frees ordinary memory too */
            free(want);
        }
    }
    /* the order of the sum, where rounding shows it (on one node: across nodes the hierarchy
     * adds each node's sum) */
    size_t n = pg->comm.cross ? 0 : 300007;
    float *f = reg ? ddp_pg_mem_alloc(pg, n * 4 + 4) : malloc(n * 4 + 4), *w = malloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) {
        f[i] = ordered(rank, i);
        w[i] = ordered_sum(i);
    }
    must(pg, ddp_pg_allreduce(pg, f, n, DDP_F32, DDP_SUM), "allreduce");
    snprintf(what, sizeof(what), "direct kind %d f32 sum in rank order", kind);
    bad |= compare(f, w, n, DDP_F32, what);
    ddp_pg_mem_free(pg, f);
    free(w);
    chunks += (int64_t)((n * 4 + DDP__CLAIM_CHUNK - 1) / DDP__CLAIM_CHUNK);
    if (kind == 1 && !pg->comm.cross && !sh->claim_off && sh->direct_min) {
        /* every chunk claimed once, by one rank or another: the node's claims add up */
        int64_t mine = (int64_t)(sh->claimed - c0), all = mine;
        must(pg, ddp_pg_allreduce(pg, &all, 1, DDP_I64, DDP_SUM), "allreduce");
        printf("pgtest rank %d: registered: %lld chunks claimed here, %lld by all (%lld chunks)\n",
               rank, (long long)mine, (long long)all, (long long)chunks);
        bad |= all != chunks;
    }
    *done = (long)(pg->comm.shm.direct_done - d0);
    *reads = (long)(pg->comm.shm.cma_reads - r0);
    *shared = (long)(pg->comm.shm.direct_shared - s0);
    return bad;
}

static int direct(struct ddp_pg *pg)
{
    static const char *kinds[] = {"malloc", "registered", "mixed"};
    int bad = 0;
    printf("pgtest rank %d: arena %s\n", rank, pg->comm.shm.arena ? "kept" : "none");
    for (int k = 0; k < 3; k++) {
        long done = 0, reads = 0, shared = 0;
        bad |= direct_kind(pg, k, &done, &reads, &shared);
        printf("pgtest rank %d: %s: %ld single-copy, %ld cross-memory reads\n", rank, kinds[k],
               done, reads);
        printf("pgtest rank %d: %s: %ld single-copy on helper threads\n", rank, kinds[k], shared);
    }
    return bad;
}

/* DDP_PG_DIRECT_BYTES=auto: calls all-reduces of 4 MiB (registered, or on odd ranks malloc'd
 * with "mixed"; or of the sizes in MiB of a list such as "4,16", in turn), each checked bit for
 * bit against the sum in rank order, and prints which way each went (S: slots, D: single-copy)
 * and the trials of every size class. */
static int auto_run(struct ddp_pg *pg, long calls, const char *arg)
{
    bool mixed = arg && strcmp(arg, "mixed") == 0;
    size_t mib[8] = {4}, nsz = 1, n = 0;
    if (arg && !mixed) {
        nsz = 0;
        for (const char *p = arg; *p && nsz < 8; p += *p == ',')
            mib[nsz++] = strtoul(p, (char **)&p, 10);
    }
    for (size_t k = 0; k < nsz; k++)
        n = mib[k] > n ? mib[k] : n;
    n = (n << 20) / 4;
    bool reg = !mixed || rank % 2 == 0;
    float *f = reg ? ddp_pg_mem_alloc(pg, n * 4) : malloc(n * 4), *w = malloc(n * 4);
    char *way = calloc((size_t)calls + 1, 1);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        w[i] = ordered_sum(i);
    }
    for (long c = 0; c < calls && !bad; c++) {
        size_t m = (mib[(size_t)c % nsz] << 20) / 4;
        for (size_t i = 0; i < m; i++)
            f[i] = ordered(rank, i);
        uint64_t d0 = pg->comm.shm.direct_done;
        must(pg, ddp_pg_allreduce(pg, f, m, DDP_F32, DDP_SUM), "allreduce");
        way[c] = pg->comm.shm.direct_done > d0 ? 'D' : 'S';
        bad |= compare(f, w, m, DDP_F32, "auto f32 sum in rank order");
    }
    printf("pgtest rank %d: auto %s:", rank, way);
    for (int k = 0; k < DDP__AUTO_CLASSES; k++) {
        const struct ddp__auto_class *a = &pg->comm.shm.autod.cls[k];
        printf(" class %d %llu trials %llu single-copy%s", k, (unsigned long long)a->trials,
               (unsigned long long)a->chosen, k + 1 < DDP__AUTO_CLASSES ? "," : "\n");
    }
    ddp_pg_mem_free(pg, f);
    free(w);
    free(way);
    return bad;
}

/* The byte i of the message with tag t from rank r. */
static uint8_t pbyte(int r, uint32_t t, size_t i)
{
    return (uint8_t)(gen(r, i, 0x5eed0000u + t) * 7 + (int64_t)i);
}

static int check_msg(const char *what, const uint8_t *got, size_t n, int from, uint32_t tag)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != pbyte(from, tag, i)) {
            fprintf(stderr, "pgtest rank %d: %s: byte %zu of %zu from rank %d tag %u differs\n",
                    rank, what, i, n, from, tag);
            return 1;
        }
    checks++;
    return 0;
}

static uint8_t *message(int r, uint32_t tag, size_t n)
{
    uint8_t *m = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        m[i] = pbyte(r, tag, i);
    return m;
}

static int p2p(struct ddp_pg *pg)
{
    static const size_t sizes[] = {0, 1, 4097, 1u << 20, 16u << 20};
    enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
    int bad = 0, next = (rank + 1) % world, prev = (rank + world - 1) % world;
    /* a ring: receives posted first for even tags, sends first for odd ones */
    uint8_t *out[NS], *in[NS];
    struct ddp_work *ws[NS], *wr[NS];
    for (int k = 0; k < NS; k++) {
        out[k] = message(rank, (uint32_t)k, sizes[k]);
        in[k] = malloc(sizes[k] ? sizes[k] : 1);
    }
    for (int k = 0; k < NS; k++) {
        if (k % 2 == 0)
            must(pg, ddp_pg_recv_start(pg, in[k], sizes[k], prev, (uint32_t)k, &wr[k]), "recv");
        must(pg, ddp_pg_send_start(pg, out[k], sizes[k], next, (uint32_t)k, &ws[k]), "send");
    }
    usleep(100000); /* let the odd ones arrive before their receives */
    for (int k = 1; k < NS; k += 2)
        must(pg, ddp_pg_recv_start(pg, in[k], sizes[k], prev, (uint32_t)k, &wr[k]), "recv");
    for (int k = NS - 1; k >= 0; k--) {
        must(pg, ddp_work_wait(wr[k]), "ring receive");
        must(pg, ddp_work_wait(ws[k]), "ring send");
        ddp_work_free(wr[k]);
        ddp_work_free(ws[k]);
        bad |= check_msg("ring", in[k], sizes[k], prev, (uint32_t)k);
        free(out[k]);
        free(in[k]);
    }
    if (world >= 2 && rank < 2) {
        int peer = 1 - rank;
        /* tags out of order, and one tag twice (matched in sending order) */
        if (rank == 0) {
            static const uint32_t order[] = {3, 1, 2};
            for (int k = 0; k < 3; k++) {
                uint8_t *m = message(0, order[k], 1000 + order[k]);
                must(pg, ddp_pg_send(pg, m, 1000 + order[k], peer, order[k]), "send");
                free(m);
            }
            for (uint32_t t = 100; t < 102; t++) {
                uint8_t *m = message(0, t, 5000);
                must(pg, ddp_pg_send(pg, m, 5000, peer, 7), "send tag 7");
                free(m);
            }
        } else {
            for (uint32_t t = 1; t <= 3; t++) {
                uint8_t *m = malloc(1000 + t);
                must(pg, ddp_pg_recv(pg, m, 1000 + t, peer, t), "recv by tag");
                bad |= check_msg("tags out of order", m, 1000 + t, 0, t);
                free(m);
            }
            for (uint32_t t = 100; t < 102; t++) {
                uint8_t *m = malloc(5000);
                must(pg, ddp_pg_recv(pg, m, 5000, peer, 7), "recv tag 7");
                bad |= check_msg("one tag twice, in order", m, 5000, 0, t);
                free(m);
            }
        }
        /* 64 MiB each way at once, beside an all-reduce of the pair... of the group */
        size_t big = 64u << 20;
        uint8_t *mo = message(rank, 40, big), *mi = malloc(big);
        struct ddp_work *a, *b;
        must(pg, ddp_pg_send_start(pg, mo, big, peer, 40, &a), "big send");
        must(pg, ddp_pg_recv_start(pg, mi, big, peer, 40, &b), "big recv");
        must(pg, ddp_work_wait(a), "64 MiB send");
        must(pg, ddp_work_wait(b), "64 MiB receive");
        ddp_work_free(a);
        ddp_work_free(b);
        bad |= check_msg("64 MiB both ways", mi, big, peer, 40);
        free(mo);
        free(mi);
        /* a receive of another size fails; the message waits for one of its size */
        uint8_t m100[100];
        if (rank == 0) {
            uint8_t *m = message(0, 99, 100);
            must(pg, ddp_pg_send(pg, m, 100, peer, 99), "send 100");
            free(m);
        } else {
            int r = ddp_pg_recv(pg, m100, 50, peer, 99);
            if (r != DDP_EPROTO) {
                fprintf(stderr, "pgtest rank 1: a 50-byte receive of 100 bytes gave %s\n",
                        ddp_err_name(r));
                bad = 1;
            }
            must(pg, ddp_pg_recv(pg, m100, 100, peer, 99), "recv 100");
            bad |= check_msg("after a size mismatch", m100, 100, 0, 99);
        }
    }
    double x = rank;
    must(pg, ddp_pg_allreduce(pg, &x, 1, DDP_F64, DDP_SUM), "all-reduce beside");
    if (x != world * (world - 1) / 2.0)
        bad = 1;
    /* rank 1 sends, then leaves: rank 0 still gets the message, then a clear error */
    if (world >= 2 && rank == 1) {
        uint8_t *m = message(1, 5, 3000);
        must(pg, ddp_pg_send(pg, m, 3000, 0, 5), "send before exit");
        free(m);
        ddp_pg_free(pg);
        printf("pgtest rank %d of %d: %ld checks passed\n", rank, world, checks);
        exit(bad);
    }
    if (world >= 2 && rank == 0) {
        usleep(300000);
        uint8_t m[3000];
        must(pg, ddp_pg_recv(pg, m, 3000, 1, 5), "recv after the peer exited");
        bad |= check_msg("sent before the sender exited", m, 3000, 1, 5);
        int r = ddp_pg_recv(pg, m, 10, 1, 6);
        if (r != DDP_ECLOSED) {
            fprintf(stderr, "pgtest rank 0: a receive from an exited rank gave %s\n",
                    ddp_err_name(r));
            bad = 1;
        }
        checks++;
    }
    return bad;
}

/* A sub-group's all-reduce of (parent rank + 1) * (i % 7 + 1) over its members, checked. */
static int check_sum(const char *what, const double *got, size_t n, const int *members, int m)
{
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int k = 0; k < m; k++)
            want += (members[k] + 1) * (double)(i % 7 + 1);
        if (got[i] != want) {
            fprintf(stderr, "pgtest rank %d: %s: element %zu is %g, not %g\n", rank, what, i,
                    got[i], want);
            return 1;
        }
    }
    checks++;
    return 0;
}

static int groups(struct ddp_pg *pg)
{
    enum { N = 100000 };
    int ev[64], od[64], all[64], rev[64], ne = 0, no = 0, bad = 0;
    for (int r = 0; r < world; r++) {
        (r % 2 ? od : ev)[r % 2 ? no++ : ne++] = r;
        all[r] = r;
        rev[r] = world - 1 - r;
    }
    struct ddp_pg *ge, *go, *gr;
    must(pg, ddp_pg_new_group(pg, ev, ne, "evens", &ge), "new_group evens");
    must(pg, ddp_pg_new_group(pg, od, no, "odds", &go), "new_group odds");
    struct ddp_pg *mine = rank % 2 ? go : ge, *other = rank % 2 ? ge : go;
    if (!mine || other || ddp_pg_rank(mine) != rank / 2 ||
        ddp_pg_world_size(mine) != (rank % 2 ? no : ne)) {
        fprintf(stderr, "pgtest rank %d: wrong membership of the even and odd groups\n", rank);
        return 1;
    }
    /* the sub-group's all-reduce and the whole group's at once, each on its own thread */
    double *a = malloc(N * sizeof(double)), *b = malloc(N * sizeof(double));
    for (int rep = 0; rep < 3; rep++) {
        for (size_t i = 0; i < N; i++)
            a[i] = b[i] = (rank + 1) * (double)(i % 7 + 1);
        struct ddp_work *wa, *wb;
        must(pg, ddp_pg_allreduce_start(mine, a, N, DDP_F64, DDP_SUM, &wa), "sub-group start");
        must(pg, ddp_pg_allreduce_start(pg, b, N, DDP_F64, DDP_SUM, &wb), "group start");
        must(mine, ddp_work_wait(wa), "sub-group all-reduce");
        must(pg, ddp_work_wait(wb), "group all-reduce");
        ddp_work_free(wa);
        ddp_work_free(wb);
        bad |= check_sum(rank % 2 ? "odds" : "evens", a, N, rank % 2 ? od : ev, rank % 2 ? no : ne);
        bad |= check_sum("whole group beside them", b, N, all, world);
    }
    /* every rank, in reverse: rank 0 of the sub-group is the last rank */
    must(pg, ddp_pg_new_group(pg, rev, world, "reversed", &gr), "new_group reversed");
    if (!gr || ddp_pg_rank(gr) != world - 1 - rank) {
        fprintf(stderr, "pgtest rank %d: reversed group rank %d\n", rank,
                gr ? ddp_pg_rank(gr) : -1);
        return 1;
    }
    for (size_t i = 0; i < N; i++)
        a[i] = rank;
    must(gr, ddp_pg_broadcast(gr, a, N, DDP_F64, 0), "reversed broadcast");
    for (size_t i = 0; i < N && !bad; i++)
        if (a[i] != world - 1) {
            fprintf(stderr, "pgtest rank %d: broadcast from the reversed root gave %g\n", rank,
                    a[i]);
            bad = 1;
        }
    checks++;
    /* refused alike on every rank: a list that differs on rank 0, a rank listed twice */
    struct ddp_pg *x = NULL;
    int one[2] = {0, 0};
    int r = ddp_pg_new_group(pg, one, rank == 0 ? 1 : 2, "differs", &x);
    if (r != DDP_EINVAL || x ||
        !strstr(ddp_pg_last_error(pg), "passed different names or rank lists")) {
        fprintf(stderr, "pgtest rank %d: differing lists gave %s (%s)\n", rank, ddp_err_name(r),
                ddp_pg_last_error(pg));
        bad = 1;
    }
    r = ddp_pg_new_group(pg, one, 2, "twice", &x);
    if (r != DDP_EINVAL || x || !strstr(ddp_pg_last_error(pg), "rank 0 is listed twice")) {
        fprintf(stderr, "pgtest rank %d: a repeated rank gave %s (%s)\n", rank, ddp_err_name(r),
                ddp_pg_last_error(pg));
        bad = 1;
    }
    checks += 2;
    ddp_pg_free(gr);
    ddp_pg_free(ge);
    ddp_pg_free(go);
    /* the group goes on */
    for (size_t i = 0; i < N; i++)
        b[i] = (rank + 1) * (double)(i % 7 + 1);
    must(pg, ddp_pg_allreduce(pg, b, N, DDP_F64, DDP_SUM), "group all-reduce after");
    bad |= check_sum("whole group after", b, N, all, world);
    free(a);
    free(b);
    return bad;
}

/* Each connection's SO_SNDBUF as the kernel reports it (twice what was asked), one line each;
 * the point-to-point one (DDP_PG_P2P=1) as connection "p2p". */
static int sndbufs(struct ddp_pg *pg)
{
    for (int j = 0; j < world; j++)
        for (int k = 0; j != rank && k <= pg->comm.peers[j].nconns; k++) {
            bool p2p = k == pg->comm.peers[j].nconns;
            int fd = p2p ? (pg->p2p_fd ? pg->p2p_fd[j] : -1)
                     : k ? pg->comm.peers[j].sfd[k - 1]
                         : pg->comm.peers[j].fd,
                b = 0;
            socklen_t bl = sizeof(b);
            if (p2p && fd < 0)
                continue;
            if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, &bl) != 0)
                return 1;
            if (p2p)
                printf("pgtest rank %d: peer %d connection p2p sndbuf %d\n", rank, j, b);
            else
                printf("pgtest rank %d: peer %d connection %d sndbuf %d\n", rank, j, k, b);
            checks++;
        }
    return 0;
}

int main(int argc, char **argv)
{
    struct ddp_pg *pg;
    if (argc < 2)
        return 2;
    /* PGTEST_UNDUMPABLE=R: rank R refuses to be read by its peers (cross-memory attach) */
    const char *ud = getenv("PGTEST_UNDUMPABLE"), *rk = getenv("RANK");
    if (ud && rk && strcmp(ud, rk) == 0)
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    int r = ddp_pg_init_env(NULL, &pg);
    if (r < 0) {
        fprintf(stderr, "pgtest: cannot form the group: %s\n", ddp_err_name(r));
        return 1;
    }
    rank = ddp_pg_rank(pg);
    world = ddp_pg_world_size(pg);
    int bad = 0;
    if (strcmp(argv[1], "matrix") == 0) {
        bad = matrix(pg);
    } else if (strcmp(argv[1], "wide") == 0) {
        bad = wide(pg);
    } else if (strcmp(argv[1], "direct") == 0) {
        bad = direct(pg);
    } else if (strcmp(argv[1], "auto") == 0 && argc >= 3) {
        bad = auto_run(pg, atol(argv[2]), argc == 4 ? argv[3] : NULL);
    } else if (strcmp(argv[1], "p2p") == 0) {
        bad = p2p(pg);
    } else if (strcmp(argv[1], "p2p-wait") == 0 && world >= 2) {
        printf("pgtest rank %d: looping\n", rank);
        fflush(stdout);
        if (rank != 0)
            pause();
        size_t big = 64u << 20;
        char *m = malloc(big);
        int64_t t0 = ddp_now_ms();
        r = ddp_pg_recv(pg, m, big, 1, 1);
        printf("pgtest rank 0: receive failed after %lld ms: %s\n", (long long)(ddp_now_ms() - t0),
               ddp_err_name(r));
        fflush(stdout);
        free(m);
        ddp_pg_free(pg);
        return 3;
    } else if (strcmp(argv[1], "sndbuf") == 0) {
        bad = sndbufs(pg);
    } else if (strcmp(argv[1], "post") == 0) {
        bad = pgtest_post(pg);
    } else if (strcmp(argv[1], "stream") == 0) {
        bad = pgtest_stream(pg, argc > 2 && strcmp(argv[2], "--die") == 0);
    } else if (strcmp(argv[1], "groups") == 0 && world >= 2 && world <= 64) {
        bad = groups(pg);
    } else if (strcmp(argv[1], "big") == 0 && argc == 3) {
        bad = big(pg, (size_t)atol(argv[2]));
    } else if (strcmp(argv[1], "loop") == 0 && argc == 3) {
        size_t n = (size_t)atol(argv[2]) * (1u << 20) / 4;
        /* PGTEST_REGISTERED: the buffer in the group's registered memory (single-copy reads
         * it in place, on the helper threads where the rank has them) */
        bool reg = getenv("PGTEST_REGISTERED") != NULL;
        float *buf = reg ? ddp_pg_mem_alloc(pg, n * 4) : calloc(n, 4);
        printf("pgtest rank %d: looping%s\n", rank, reg ? " on registered memory" : "");
        fflush(stdout);
        for (long it = 0;; it++) {
            int64_t t0 = ddp_now_ms();
            r = ddp_pg_allreduce(pg, buf, n, DDP_F32, DDP_SUM);
            if (r < 0) {
                printf("pgtest rank %d: allreduce failed after %lld ms: %s (%s)\n", rank,
                       (long long)(ddp_now_ms() - t0), ddp_pg_last_error(pg), ddp_err_name(r));
                r = ddp_pg_allreduce(pg, buf, 1, DDP_F32, DDP_SUM);
                printf("pgtest rank %d: next call: %s\n", rank, ddp_err_name(r));
                fflush(stdout);
                ddp_pg_mem_free(pg, buf); /* either kind */
                ddp_pg_free(pg);
                return 3;
            }
        }
    } else {
        return 2;
    }
    if (!bad) /* with what the default rules read (DDP_PG_TCP_CONNS's offer, the helpers) */
        printf("pgtest rank %d of %d: %ld checks passed, %d usable CPUs\n", rank, world, checks,
               ddp_usable_cpus());
    ddp_pg_free(pg);
    return bad ? 1 : 0;
}
