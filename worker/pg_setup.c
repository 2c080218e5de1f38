/*
 * Forming a process group and freeing it: the authenticated TCP mesh between ranks (addresses
 * and one-time secrets exchanged through the store, each connection proven with an HMAC), the
 * node layout, the node's shared-memory segment, the cross-node rings of the hierarchical
 * all-reduce, the NCCL communicator on NCCL groups; and ddp_pg_init_env's reading of the
 * torchrun environment.
 */
#include "worker/group.h"
#include "worker/fdshare.h"
#include "worker/p2p_shm.h"
#include "worker/team.h"
#include "common/cpus.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/banned.h"

#define PEER_MAGIC 0x47504444u /* "DDPG" */
#define P2P_MAGIC 0x50504444u  /* "DDPP": the point-to-point connection of a pair */
/* stripe connection s (1..DDP_PG_TCP_CONNS-1) of a pair: bytes s, "DPS" on the wire */
#define STRIPE_MAGIC(s) (0x53504400u | (uint32_t)(s))
#define SECRET_LEN 16
#define DEFAULT_SMALL_BYTES (64u << 10)

/* The proof a connecting rank sends: HMAC(listener's secret, "ddp-pg" || my rank). */
static void peer_mac(const uint8_t *secret, uint32_t rank, uint8_t out[32])
{
    uint8_t msg[10] = {'d', 'd', 'p', '-', 'p', 'g'};
    unsigned int len = 32;
    for (int i = 0; i < 4; i++)
        msg[6 + i] = (uint8_t)(rank >> (8 * i));
    HMAC(EVP_sha256(), secret, SECRET_LEN, msg, sizeof(msg), out, &len);
}

static int hex_decode(const char *hex, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

static void set_sock(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* One connect to ai, given up at deadline (a blocking connect to a host behind a firewall that
 * drops it would wait out the kernel's SYN retries, minutes): the blocking socket, or -1 with
 * *err set. */
static int connect_until(const struct addrinfo *ai, int64_t deadline, int *err)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), e = 0;
    socklen_t el = sizeof(e);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && (e = errno) == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int64_t left = deadline - ddp_now_ms();
        int r = left > 0 ? poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left) : 0;
        if (r != 1)
            e = r == 0 ? ETIMEDOUT : errno; /* EINTR: tried again while time is left */
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
            e = errno;
    }
    if (e) {
        close(fd);
        *err = e;
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

/* Connects to rank j's listener and proves our rank; the connection goes to the group's
 * collectives (PEER_MAGIC, or STRIPE_MAGIC(s) for their stripe s) or to its point-to-point
 * engine (P2P_MAGIC). */
static int connect_peer(struct ddp_pg *pg, int j, const char *ip, int port, const uint8_t *secret,
                        uint32_t magic, int64_t deadline)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV},
                    *res = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    if (getaddrinfo(ip, ps, &hints, &res) != 0)
        return DDP_EINVAL;
    int fd = -1, err = ETIMEDOUT;
    while (fd < 0 && ddp_now_ms() < deadline)
        if ((fd = connect_until(res, deadline, &err)) < 0 && err != ETIMEDOUT && err != EINTR)
            usleep(20000); /* refused: its listener may not be up yet */
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(pg->err, sizeof(pg->err),
                 "cannot connect to peer rank %d (%s at %s:%d): %s (`ddprun doctor` checks that "
                 "the nodes reach each other)",
                 j, pg->comm.peers[j].host, ip, port, strerror(err));
        return DDP_ECONNECT;
    }
    set_sock(fd);
    uint8_t hello[40];
    uint32_t v = magic, me = (uint32_t)pg->rank;
    memcpy(hello, &v, 4);
    memcpy(hello + 4, &me, 4);
    peer_mac(secret, me, hello + 8);
    if (ddp_write_all(fd, hello, sizeof(hello)) < 0) {
        close(fd);
        return DDP_ECONNECT;
    }
    if (magic == P2P_MAGIC)
        pg->p2p_fd[j] = fd;
    else if (magic == PEER_MAGIC)
        pg->comm.peers[j].fd = fd;
    else
        pg->comm.peers[j].sfd[(magic & 0xffu) - 1] = fd;
    return 0;
}

/* The higher-ranked peers that have not connected, for the timeout's message: "rank 5 (host),
 * ..." (the first four). */
static void missing_peers(const struct ddp_pg *pg, char *out, size_t n)
{
    size_t l = 0;
    int shown = 0, more = 0;
    out[0] = '\0';
    for (int j = pg->rank + 1; j < pg->world; j++) {
        bool all = pg->comm.peers[j].fd >= 0 && (!pg->p2p_fd || pg->p2p_fd[j] >= 0);
        for (int st = 0; st < pg->comm.peers[j].nconns - 1; st++)
            all = all && pg->comm.peers[j].sfd[st] >= 0;
        if (all)
            continue;
        if (shown == 4) {
            more++;
            continue;
        }
        int k = snprintf(out + l, n - l, "%srank %d (%s)", shown ? ", " : "", j,
                         pg->comm.peers[j].host);
        l = k > 0 && (size_t)k < n - l ? l + (size_t)k : n - 1;
        shown++;
    }
    if (more)
        snprintf(out + l, n - l, " and %d more", more);
}

/* The higher-ranked peers connect to this rank until deadline, and a second beyond it: a peer
 * that cannot connect says why first (cli/doctor/mesh.c's check finds the same). */
static int accept_peers(struct ddp_pg *pg, int lfd, const uint8_t *my_secret, int64_t deadline)
{
    struct ddp_log_limit refused_log = {0}; /* this listener's: a line a second */
    int want = 0;
    for (int j = pg->rank + 1; j < pg->world; j++)
        want += pg->comm.peers[j].nconns + (pg->p2p_fd ? 1 : 0);
    deadline += 1000;
    while (want > 0) {
        int64_t rem = deadline - ddp_now_ms();
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (rem <= 0 || poll(&p, 1, (int)(rem > 1000 ? 1000 : rem)) < 0) {
            if (rem > 0 && errno == EINTR)
                continue;
            char who[300];
            missing_peers(pg, who, sizeof(who));
            snprintf(pg->err, sizeof(pg->err),
                     "timed out waiting for %s to connect to this rank (`ddprun doctor` checks "
                     "that the nodes reach each other)",
                     who);
            return DDP_ETIMEDOUT;
        }
        if (!(p.revents & POLLIN))
            continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        uint8_t hello[40], mac[32];
        struct timeval tv = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        ssize_t n = recv(fd, hello, sizeof(hello), MSG_WAITALL);
        uint32_t magic, who;
        memcpy(&magic, hello, 4);
        memcpy(&who, hello + 4, 4);
        int *slot = NULL;
        uint32_t st = magic & 0xffu; /* a stripe's number */
        if (n == (ssize_t)sizeof(hello) && who > (uint32_t)pg->rank && who < (uint32_t)pg->world)
            slot =
                magic == PEER_MAGIC                ? &pg->comm.peers[who].fd
                : magic == P2P_MAGIC && pg->p2p_fd ? &pg->p2p_fd[who]
                : magic == STRIPE_MAGIC(st) && st >= 1 && st < (uint32_t)pg->comm.peers[who].nconns
                    ? &pg->comm.peers[who].sfd[st - 1]
                    : NULL;
        if (slot && *slot < 0) {
            peer_mac(my_secret, who, mac);
            if (CRYPTO_memcmp(mac, hello + 8, 32) == 0) {
                tv.tv_sec = 0;
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
                set_sock(fd);
                *slot = fd;
                want--;
                continue;
            }
        }
        DDP_WARN_LIMITED(&refused_log, PG,
                         "rank %d: refused a peer connection that failed the handshake", pg->rank);
        close(fd);
    }
    return 0;
}

/* Where every rank runs, from the addresses they published. */
struct layout {
    bool uniform;  /* every node has local ranks 0..L-1 once each, L the same everywhere */
    int nodes;     /* distinct node ranks */
    int node_idx;  /* ours, counted in ascending node rank */
    int *local_of; /* [local rank] -> group rank, on our node */
    int *cross_of; /* [node index] -> group rank with our local rank on that node */
};

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void layout_free(struct layout *l)
{
    free(l->local_of);
    free(l->cross_of);
}

static int layout_compute(const struct ddp_pg *pg, const int *node_of, const int *local_of,
                          const int *lw_of, struct layout *l)
{
    int W = pg->world, L = pg->local_world;
    memset(l, 0, sizeof(*l));
    int *sorted = malloc((size_t)W * sizeof(int));
    l->local_of = malloc((size_t)L * sizeof(int));
    l->cross_of = malloc((size_t)W * sizeof(int));
    if (!sorted || !l->local_of || !l->cross_of) {
        free(sorted);
        layout_free(l);
        return DDP_ENOMEM;
    }
    memcpy(sorted, node_of, (size_t)W * sizeof(int));
    qsort(sorted, (size_t)W, sizeof(int), cmp_int);
    int n = 0;
    for (int i = 0; i < W; i++)
        if (i == 0 || sorted[i] != sorted[i - 1])
            sorted[n++] = sorted[i];
    l->nodes = n;
    l->uniform = n * L == W;
    for (int k = 0; k < n; k++)
        if (sorted[k] == pg->node_rank)
            l->node_idx = k;
    for (int i = 0; i < L; i++)
        l->local_of[i] = -1;
    for (int k = 0; k < n; k++)
        l->cross_of[k] = -1;
    /* Each (node, local rank) must occur once, with the same local world size everywhere:
     * checked on everyone's data, so every rank reaches the same verdict. */
    char *seen = l->uniform ? calloc((size_t)W, 1) : NULL;
    if (l->uniform && !seen) {
        free(sorted);
        layout_free(l);
        return DDP_ENOMEM;
    }
    for (int j = 0; j < W && l->uniform; j++) {
        int k =
            (int)((int *)bsearch(&node_of[j], sorted, (size_t)n, sizeof(int), cmp_int) - sorted);
        if (lw_of[j] != L || local_of[j] < 0 || local_of[j] >= L || seen[k * L + local_of[j]]++) {
            l->uniform = false;
            break;
        }
        if (node_of[j] == pg->node_rank)
            l->local_of[local_of[j]] = j;
        if (local_of[j] == pg->local_rank)
            l->cross_of[k] = j;
    }
    free(seen);
    free(sorted);
    return 0;
}

/*
 * The slots' default size: 4 MiB where the group is one node of at most BIG_SLOT_RANKS ranks
 * and CPU 0's L2 holds 2 MiB or more, else 1 MiB. Measured with 2 ranks (BENCHMARKS.md, "The
 * slots' size from the L2"): 4 MiB slots ran 1.07-1.11x 1 MiB slots at 4 MiB messages, 1.03x
 * at 1 and 16 MiB and 0.98-1.02x at 64 on a 2-vCPU Intel Xeon with 2 MiB of L2; 1.11-1.80x from
 * 1 MiB with 4 helper threads on a 16-core one (2 MiB of L2 too); 0.64x at 16 MiB on an AMD
 * EPYC with 1 MiB, where 1 MiB slots were the best. (From 16 MiB the rounds stay 512 KiB whatever
 * the slots: worker/shm.c, round_elems.) Every local rank reads CPU 0's L2, so all make the same
 * segment; across nodes the slots stay 1 MiB (a round's shard is what each TCP ring carries, tuned
 * with those), and so does a node of many ranks (the segment holds two slots per rank).
 */
#define BIG_SLOT_RANKS 8
static size_t default_slot(const struct ddp_pg *pg)
{
    if (pg->local_world == pg->world && pg->local_world <= BIG_SLOT_RANKS &&
        ddp__l2_bytes("") >= ((size_t)2 << 20))
        return (size_t)4 << 20;
    return (size_t)1 << 20;
}

/*
 * Maps the node's shared-memory segment when the node has several ranks, every node has the
 * same number (DDP_PG_TRANSPORT=tcp turns it off). Local rank 0 creates it (a memfd, with no
 * name to leave behind) and gives its descriptor to the node's other ranks (worker/fdshare.h);
 * every rank maps its node's; all ranks of the group agree through an all-gather whether
 * everyone succeeded (else all keep TCP, so every rank runs the same algorithms).
 */
static int setup_shm(struct ddp_pg *pg, struct ddp_store *store, const char *name,
                     struct layout *lay)
{
    const char *tr = getenv("DDP_PG_TRANSPORT"), *sl = getenv("DDP_PG_SHM_SLOT_BYTES");
    if ((tr && strcmp(tr, "tcp") == 0) || pg->local_world < 2)
        return 0;
    if (!lay->uniform) {
        if (pg->rank == 0)
            DDP_WARN(PG, "nodes have different numbers of ranks; collectives use TCP only");
        return 0;
    }
    int L = pg->local_world;
    size_t slot = sl && atol(sl) >= 4096 ? (size_t)atol(sl) : default_slot(pg);
    if (slot < (size_t)L * 64)
        slot = (size_t)L * 64; /* a reduce-scatter round moves at least one element per rank */
    slot = (slot + 63) / 64 * 64;
    size_t len = ddp__shm_segment_bytes(L, slot);
    char prefix[300];
    int r, fd = pg->local_rank == 0 ? ddp__memfd("ddp-segment", len) : -1;
    void *base = MAP_FAILED;
    snprintf(prefix, sizeof(prefix), "pg/%s/shm/%d", name, pg->node_rank);
    if ((r = ddp__fd_from_first(store, prefix, pg->local_rank, L, fd, pg->timeout_ms, &fd)) < 0)
        goto out;
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size == len)
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    /* Everyone or no one: agree on whether every rank mapped its node's segment. */
    bool all;
    snprintf(prefix, sizeof(prefix), "pg/%s/shm-mapped", name);
    r = ddp_store_all_agree(store, prefix, pg->rank, pg->world, base != MAP_FAILED, pg->timeout_ms,
                            &all);
    if (r < 0)
        goto out;
    if (all) {
        ddp__shm_attach(&pg->comm.shm, base, L, pg->local_rank, lay->local_of, slot);
        lay->local_of = NULL; /* owned by the segment now */
        base = MAP_FAILED;
        DDP_INFO(PG, "rank %d: shared-memory all-reduce on (%zu-byte slots)", pg->rank, slot);
        if ((r = ddp__pg_setup_direct(pg, store, name)) < 0)
            goto out;
    } else {
        DDP_WARN(PG, "rank %d: shared memory unavailable on some node; all-reduce uses TCP",
                 pg->rank);
    }
out:
    if (base != MAP_FAILED)
        munmap(base, len);
    if (fd >= 0)
        close(fd);
    return r;
}

/* With shared memory on several nodes: our ring across the nodes, for the hierarchical
 * all-reduce. Its peers are copies of the group's connections (closed by the group). */
static int setup_cross(struct ddp_pg *pg, const struct layout *lay)
{
    if (!pg->comm.shm.base || lay->nodes < 2)
        return 0;
    struct ddp__comm *x = calloc(1, sizeof(*x));
    if (!x || !(x->peers = calloc((size_t)lay->nodes, sizeof(struct ddp__peer)))) {
        free(x);
        return DDP_ENOMEM;
    }
    x->rank = lay->node_idx;
    x->world = lay->nodes;
    x->small_bytes = pg->comm.small_bytes;
    x->tcp_split = pg->comm.tcp_split;
    x->tcp_conns = pg->comm.tcp_conns;
    x->tcp_stripe_bytes = pg->comm.tcp_stripe_bytes;
    for (int k = 0; k < lay->nodes; k++) {
        x->peers[k] = pg->comm.peers[lay->cross_of[k]];
        if (k == x->rank)
            x->peers[k].fd = -1;
    }
    pg->comm.cross = x;
    if (pg->rank == 0)
        DDP_INFO(PG, "hierarchical all-reduce: %d nodes x %d ranks, %d rings across nodes",
                 lay->nodes, pg->local_world, pg->local_world);
    return 0;
}

static void cross_free(struct ddp__comm *x)
{
    if (!x)
        return;
    ddp__team_free(x->tcp_team);
    free(x->scratch);
    free(x->peers);
    free(x);
}

/* What a group holds once its communication thread is stopped (or was never started): its
 * links to the world peers, shared memory, cross-node rings, NCCL communicator, recorder. */
static void destroy(struct ddp_pg *pg)
{
    ddp__p2p_free(pg); /* its thread first: it uses the p2p connections and rings */
    ddp__p2p_shm_free(pg);
    for (int i = 0; i < pg->world; i++) {
        if (pg->comm.peers[i].fd >= 0)
            close(pg->comm.peers[i].fd);
        for (int s = 0; s < DDP__TCP_MAX_CONNS - 1; s++)
            if (pg->comm.peers[i].sfd[s] >= 0)
                close(pg->comm.peers[i].sfd[s]);
        if (pg->p2p_fd && pg->p2p_fd[i] >= 0)
            close(pg->p2p_fd[i]);
    }
    free(pg->p2p_fd);
    ddp__shm_detach(&pg->comm.shm);
    cross_free(pg->comm.cross);
#ifdef DDP_HAVE_NCCL
    ddp__nccl_free(pg->nccl);
#endif
    ddp__team_free(pg->comm.tcp_team);
    free(pg->comm.scratch);
    free(pg->comm.stage);
    free(pg->comm.peers);
    ddp__rec_free(pg->rec);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    free(pg);
}

int ddp_pg_init(struct ddp_store *store, int rank, int world, int local_rank, int local_world,
                int node_rank, const struct ddp_pg_opts *opts, struct ddp_pg **out)
{
    struct ddp_pg *pg = NULL;
    struct ddp_store_value *vals = NULL;
    int lfd = -1, r = DDP_EINVAL, *where = NULL; /* node, local rank, local world of each */
    struct layout lay;
    bool have_lay = false;
    uint8_t secret[SECRET_LEN];
    if (!store || world < 1 || rank < 0 || rank >= world || local_world < 1 || local_rank < 0 ||
        local_rank >= local_world || node_rank < 0)
        return DDP_EINVAL;
    if (!(pg = calloc(1, sizeof(*pg))) ||
        !(pg->comm.peers = calloc((size_t)world, sizeof(struct ddp__peer)))) {
        free(pg);
        return DDP_ENOMEM;
    }
    pg->rank = rank;
    pg->world = world;
    pg->local_rank = local_rank;
    pg->local_world = local_world;
    pg->node_rank = node_rank;
    pg->alive = true;
    const char *env;
    pg->timeout_ms = opts && opts->timeout_ms > 0                           ? opts->timeout_ms
                     : (env = getenv("DDP_PG_TIMEOUT_MS")) && atoi(env) > 0 ? atoi(env)
                                                                            : 300000;
    pg->comm.small_bytes = opts && opts->small_bytes ? opts->small_bytes
                           : (env = getenv("DDP_PG_SMALL_BYTES")) && atol(env) > 0
                               ? (size_t)atol(env)
                               : DEFAULT_SMALL_BYTES;
    pg->comm.rank = rank;
    pg->comm.world = world;
    pg->comm.tcp_split = ddp__tcp_split_env();
    int conns_asked = ddp__tcp_conns_env(); /* 0: auto (ddp__tcp_pair_conns) */
    /* auto's offer, published for the peers: one rank's CPUs need not be another's. A flat
     * ring across nodes carries the whole message there, and stripes over more connections
     * sped its large messages up between two hosts (BENCHMARKS.md, "Several connections per
     * peer"); with several ranks on a node, the collectives inside it go through shared memory
     * and its ranks' rings across nodes carry shards of a slot, below the stripe size, so extra
     * connections would only hold descriptors: 1 there. */
    int conns_offer = ddp__tcp_auto_conns(ddp_usable_cpus());
    pg->comm.tcp_conns = 1;
    pg->comm.tcp_stripe_bytes = ddp__tcp_stripe_env();
    for (int i = 0; i < world; i++) {
        pg->comm.peers[i].fd = -1;
        for (int s = 0; s < DDP__TCP_MAX_CONNS - 1; s++)
            pg->comm.peers[i].sfd[s] = -1;
        pg->comm.peers[i].rank = i;
    }
    /* point-to-point: a second connection per pair, for the engine of worker/p2p.c */
    if ((opts && opts->p2p) || ((env = getenv("DDP_PG_P2P")) && strcmp(env, "1") == 0)) {
        if (!(pg->p2p_fd = malloc((size_t)world * sizeof(int)))) {
            free(pg->comm.peers);
            free(pg);
            return DDP_ENOMEM;
        }
        for (int i = 0; i < world; i++)
            pg->p2p_fd[i] = -1;
    }
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    /* Keys of each restart of an elastic job stay apart from the earlier rounds' (whose
     * ranks may have left keys behind in the same store). */
    char scoped[200];
    const char *rc_env = getenv("TORCHELASTIC_RESTART_COUNT");
    snprintf(scoped, sizeof(scoped), "%s%s%s", opts && opts->name ? opts->name : "default",
             rc_env && *rc_env && strcmp(rc_env, "0") != 0 ? "@r" : "",
             rc_env && *rc_env && strcmp(rc_env, "0") != 0 ? rc_env : "");
    const char *name = scoped;
    snprintf(pg->name, sizeof(pg->name), "%s", opts && opts->name ? opts->name : "default");
    int64_t deadline = ddp_now_ms() + pg->timeout_ms;
    pg->store = store;
    snprintf(pg->abort_key, sizeof(pg->abort_key), "pg/%s/abort", name);
    if (opts && opts->backend == DDP_PG_BACKEND_NCCL) {
#ifdef DDP_HAVE_NCCL
        char key[300];
        snprintf(key, sizeof(key), "pg/%s/nccl-id", name);
        if ((r = ddp__nccl_init(store, key, rank, world, local_rank, pg->timeout_ms, &pg->nccl,
                                pg->err, sizeof(pg->err))) < 0)
            goto fail;
        if (ddp__pg_comm_start(pg) < 0) {
            r = DDP_ESYS;
            goto fail;
        }
        *out = pg;
        return 0;
#else
        snprintf(pg->err, sizeof(pg->err),
                 "backend nccl: this libddp was built without CUDA and NCCL");
        r = DDP_ENOTSUP;
        goto fail;
#endif
    }

    /* Listen on the interface that reaches the store; peers on other nodes can reach it too. */
    char ip[64];
    if ((r = ddp_store_local_addr(store, ip, sizeof(ip))) < 0)
        goto fail;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_PASSIVE},
                    *res = NULL;
    r = DDP_ESYS;
    if (getaddrinfo(ip, "0", &hints, &res) != 0)
        goto fail;
    lfd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, res->ai_addr, res->ai_addrlen) != 0 || listen(lfd, 1024) != 0 ||
        getsockname(lfd, (struct sockaddr *)&ss, &sl) != 0) {
        freeaddrinfo(res);
        snprintf(pg->err, sizeof(pg->err), "cannot listen on %s: %s", ip, strerror(errno));
        goto fail;
    }
    freeaddrinfo(res);
    int port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                        : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if ((r = ddp_random_bytes(secret, sizeof(secret))) < 0)
        goto fail;
    char host[128], blob[512], hex[2 * SECRET_LEN + 1], boot[40];
    ddp__boot_id("", boot, sizeof(boot)); /* peers on this kernel get DDP__TCP_NEAR_SNDBUF */
    long sndbuf_set = ddp__tcp_sndbuf_env();
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "?");
    host[sizeof(host) - 1] = '\0';
    for (int i = 0; i < SECRET_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", secret[i]);
    int bl = snprintf(blob, sizeof(blob), "%s %d %s %s %d %d %d %d %d %d %zu %s", ip, port, hex,
                      host, node_rank, local_rank, local_world, pg->p2p_fd != NULL, conns_asked,
                      conns_offer, pg->comm.tcp_stripe_bytes, boot);
    char prefix[256];
    snprintf(prefix, sizeof(prefix), "pg/%s/addr", name);
    r = DDP_ENOMEM;
    if (!(vals = calloc((size_t)world, sizeof(*vals))) ||
        !(where = malloc(3 * (size_t)world * sizeof(int))))
        goto fail;
    if ((r = ddp_store_all_gather(store, prefix, rank, world, blob, (size_t)bl, pg->timeout_ms,
                                  vals)) < 0) {
        snprintf(pg->err, sizeof(pg->err), "ranks did not all publish their addresses in time");
        goto fail;
    }
    /* Lower ranks are connected to (their backlog accepts even before they call accept);
     * higher ranks connect to us. */
    for (int j = 0; j < world; j++) {
        char pip[64], psec[2 * SECRET_LEN + 1], phost[128], pboot[40];
        int pport;
        int p2p, conns, offer;
        size_t stripe;
        if (sscanf(vals[j].data, "%63s %d %32s %127s %d %d %d %d %d %d %zu %39s", pip, &pport, psec,
                   phost, &where[j], &where[world + j], &where[2 * world + j], &p2p, &conns, &offer,
                   &stripe, pboot) != 12 ||
            offer < 1 || offer > DDP__TCP_MAX_CONNS) {
            r = DDP_EPROTO;
            snprintf(pg->err, sizeof(pg->err), "rank %d published a malformed address", j);
            goto fail;
        }
        if (p2p != (pg->p2p_fd != NULL)) {
            r = DDP_EINVAL;
            snprintf(pg->err, sizeof(pg->err),
                     "rank %d %s point-to-point connections and this rank %s (ddp_pg_opts.p2p, "
                     "DDP_PG_P2P must be alike on every rank)",
                     j, p2p ? "asked for" : "did not ask for", p2p ? "did not" : "did");
            goto fail;
        }
        if (conns != conns_asked) {
            char theirs[16] = "auto", ours[16] = "auto";
            if (conns)
                snprintf(theirs, sizeof(theirs), "%d", conns);
            if (conns_asked)
                snprintf(ours, sizeof(ours), "%d", conns_asked);
            r = DDP_EINVAL;
            snprintf(pg->err, sizeof(pg->err),
                     "rank %d has DDP_PG_TCP_CONNS=%s and this rank %s (it must be alike on every "
                     "rank)",
                     j, theirs, ours);
            goto fail;
        }
        if (stripe != pg->comm.tcp_stripe_bytes) {
            r = DDP_EINVAL;
            snprintf(pg->err, sizeof(pg->err),
                     "rank %d has DDP_PG_TCP_STRIPE_BYTES=%zu and this rank %zu (it must be alike "
                     "on every rank)",
                     j, stripe, pg->comm.tcp_stripe_bytes);
            goto fail;
        }
        int nc = ddp__tcp_pair_conns(
            conns_asked, where[j] != node_rank && local_world == 1 && where[2 * world + j] == 1,
            conns_offer, offer);
        pg->comm.peers[j].nconns = j == rank ? 1 : nc;
        pg->comm.peers[j].sndbuf = j == rank ? 0 : ddp__tcp_peer_sndbuf(sndbuf_set, boot, pboot);
        if (pg->comm.peers[j].nconns > pg->comm.tcp_conns)
            pg->comm.tcp_conns = pg->comm.peers[j].nconns;
        snprintf(pg->comm.peers[j].host, sizeof(pg->comm.peers[j].host), "%s", phost);
        if (j < rank) {
            uint8_t ps2[SECRET_LEN];
            if (hex_decode(psec, ps2, SECRET_LEN) < 0) {
                r = DDP_EPROTO;
                goto fail;
            }
            if ((r = connect_peer(pg, j, pip, pport, ps2, PEER_MAGIC, deadline)) < 0 ||
                (pg->p2p_fd && (r = connect_peer(pg, j, pip, pport, ps2, P2P_MAGIC, deadline)) < 0))
                goto fail;
            for (int st = 1; st < pg->comm.peers[j].nconns; st++)
                if ((r = connect_peer(pg, j, pip, pport, ps2, STRIPE_MAGIC(st), deadline)) < 0)
                    goto fail;
        }
    }
    if (pg->comm.tcp_conns > 1)
        pg->comm.tcp_split = false; /* each stripe's thread sends and receives */
    if ((r = accept_peers(pg, lfd, secret, deadline)) < 0)
        goto fail;
    ddp__tcp_apply_sndbufs(&pg->comm, pg->p2p_fd);
    if ((r = layout_compute(pg, where, where + world, where + 2 * world, &lay)) < 0)
        goto fail;
    have_lay = true;
    if ((r = setup_shm(pg, store, name, &lay)) < 0) {
        snprintf(pg->err, sizeof(pg->err), "cannot agree on the shared-memory segment: %s",
                 ddp_strerror(r));
        goto fail;
    }
    if ((r = setup_cross(pg, &lay)) < 0)
        goto fail;
    if (pg->p2p_fd && (r = ddp__p2p_setup_shm(pg, store, name, where)) < 0) {
        snprintf(pg->err, sizeof(pg->err), "cannot agree on point-to-point rings: %s",
                 ddp_strerror(r));
        goto fail;
    }
    layout_free(&lay);
    have_lay = false;
    free(where);
    where = NULL;
    close(lfd);
    lfd = -1;
    ddp_store_values_free(vals, (size_t)world);
    free(vals);
    vals = NULL;
    pg->rec = ddp__rec_new(rank, world);
    if (ddp__pg_comm_start(pg) < 0) {
        r = DDP_ESYS;
        goto fail;
    }
    DDP_INFO(PG, "rank %d of %d: process group '%s' formed (%s:%d)", rank, world, name, ip, port);
    *out = pg;
    return 0;
fail:
    DDP_ERROR(PG, "rank %d: cannot form the process group: %s", rank,
              pg->err[0] ? pg->err : ddp_strerror(r));
    if (lfd >= 0)
        close(lfd);
    if (vals) {
        ddp_store_values_free(vals, (size_t)world);
        free(vals);
    }
    if (have_lay)
        layout_free(&lay);
    free(where);
    destroy(pg);
    return r;
}

static int env_int(const char *name, int lo, int *out)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v) {
        DDP_ERROR(PG, "%s is not set (is this process running under ddprun or torchrun?)", name);
        return DDP_EINVAL;
    }
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > 1 << 24) {
        DDP_ERROR(PG, "%s='%s' is not a whole number of at least %d", name, v, lo);
        return DDP_EINVAL;
    }
    *out = (int)x;
    return 0;
}

int ddp_pg_init_env(const struct ddp_pg_opts *opts, struct ddp_pg **out)
{
    int rank, world, lr, lw, node, r;
    if ((r = env_int("RANK", 0, &rank)) < 0 || (r = env_int("WORLD_SIZE", 1, &world)) < 0 ||
        (r = env_int("LOCAL_RANK", 0, &lr)) < 0 || (r = env_int("LOCAL_WORLD_SIZE", 1, &lw)) < 0 ||
        (r = env_int("GROUP_RANK", 0, &node)) < 0)
        return r;
    if (rank >= world || lr >= lw || lw > world) {
        DDP_ERROR(PG, "inconsistent ranks: RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d",
                  rank, world, lr, lw);
        return DDP_EINVAL;
    }
    ddp_log_set_rank(rank);
    struct ddp_pg_opts o = opts ? *opts : (struct ddp_pg_opts){0};
    if (o.backend == DDP_PG_BACKEND_DEFAULT) {
        const char *b = getenv("DDPRUN_BACKEND");
        if (b && strcmp(b, "nccl") == 0)
            o.backend = DDP_PG_BACKEND_NCCL;
        else if (!b || !*b || strcmp(b, "cpu") == 0)
            o.backend = DDP_PG_BACKEND_CPU;
        else {
            DDP_ERROR(PG, "DDPRUN_BACKEND='%s' is neither 'cpu' nor 'nccl'", b);
            return DDP_EINVAL;
        }
    }
    opts = &o;
    struct ddp_store *s;
    int timeout = opts->timeout_ms > 0 ? opts->timeout_ms : 300000;
    if ((r = ddp_store_connect_env(timeout, &s)) < 0)
        return r;
    if ((r = ddp_pg_init(s, rank, world, lr, lw, node, opts, out)) < 0) {
        ddp_store_close(s);
        return r;
    }
    /* Kept for the abort record, which must not hang on a dead store. */
    (*out)->owns_store = true;
    ddp_store_set_timeout(s, 2000);
    return 0;
}

void ddp_pg_free(struct ddp_pg *pg)
{
    if (!pg)
        return;
    ddp__pg_comm_stop(pg);
    if (pg->owns_store)
        ddp_store_close(pg->store);
    destroy(pg);
}
