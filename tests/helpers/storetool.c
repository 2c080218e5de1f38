/*
 * storetool: a small store client for the integration tests and for poking a
 * store by hand. Usage: storetool --addr HOST:PORT --token-file FILE CMD ARGS...
 * Exit 0 on success; on failure prints "storetool: <what>: DDP_E..." and exits 1.
 */
#include "common/err.h"
#include "common/util.h"
#include "rendezvous/store.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

static char host[256];
static int port;
static uint8_t *tok;
static size_t toklen;

static int fail(const char *what, int r)
{
    fprintf(stderr, "storetool: %s: %s (%s)\n", what, ddp_err_name(r), ddp_strerror(r));
    return 1;
}

static int connect_one(struct ddp_store **s, int timeout_ms)
{
    return ddp_store_connect(host, port, tok, toklen, timeout_ms, s);
}

/* ---- stress: many clients doing set/get/add at once, results checked ---- */
struct stress_arg {
    int id, ops;
    int rc;
};
static atomic_int stress_ready;

static void *stress_thread(void *a)
{
    struct stress_arg *sa = a;
    struct ddp_store *s;
    char key[64], val[64];
    if ((sa->rc = connect_one(&s, 30000)) < 0)
        return NULL;
    atomic_fetch_add(&stress_ready, 1);
    for (int i = 0; i < sa->ops && sa->rc == 0; i++) {
        snprintf(key, sizeof(key), "stress/%d/%d", sa->id, i % 16);
        int vl = snprintf(val, sizeof(val), "v-%d-%d", sa->id, i);
        void *got = NULL;
        size_t n;
        if ((sa->rc = ddp_store_set(s, key, val, (size_t)vl)) < 0 ||
            (sa->rc = ddp_store_get(s, key, &got, &n)) < 0 ||
            (sa->rc = ddp_store_add(s, "stress/counter", 1, NULL)) < 0)
            break;
        if (n != (size_t)vl || memcmp(got, val, n) != 0) {
            fprintf(stderr, "storetool: client %d read back the wrong value for %s\n", sa->id, key);
            sa->rc = DDP_EPROTO;
        }
        free(got);
    }
    ddp_store_close(s);
    return NULL;
}

static int cmd_stress(int nclients, int ops)
{
    pthread_t *th = calloc((size_t)nclients, sizeof(*th));
    struct stress_arg *a = calloc((size_t)nclients, sizeof(*a));
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    for (int i = 0; i < nclients; i++) {
        a[i] = (struct stress_arg){.id = i, .ops = ops};
        if (pthread_create(&th[i], &attr, stress_thread, &a[i]) != 0)
            return fail("pthread_create", DDP_ESYS);
    }
    int bad = 0;
    for (int i = 0; i < nclients; i++) {
        pthread_join(th[i], NULL);
        if (a[i].rc < 0 && bad++ == 0)
            fail("stress client", a[i].rc);
    }
    struct ddp_store *s;
    int r;
    int64_t total = -1;
    if ((r = connect_one(&s, 5000)) < 0 || (r = ddp_store_add(s, "stress/counter", 0, &total)) < 0)
        return fail("reading the counter", r);
    ddp_store_close(s);
    printf("clients=%d ops=%d failed=%d counter=%" PRId64 "\n", nclients, ops, bad, total);
    free(th);
    free(a);
    return bad == 0 && total == (int64_t)nclients * ops ? 0 : 1;
}

/* ---- barrier: N clients connect, authenticate and pass one barrier ---- */
struct bar_arg {
    int n;
    int rc;
    const char *name;
};

static void *bar_thread(void *a)
{
    struct bar_arg *b = a;
    struct ddp_store *s;
    if ((b->rc = connect_one(&s, 60000)) < 0)
        return NULL;
    b->rc = ddp_store_barrier(s, b->name, b->n, 60000);
    ddp_store_close(s);
    return NULL;
}

static int cmd_barrier(int n, const char *name)
{
    pthread_t *th = calloc((size_t)n, sizeof(*th));
    struct bar_arg *a = calloc((size_t)n, sizeof(*a));
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 128 << 10);
    int64_t t0 = ddp_now_ns();
    for (int i = 0; i < n; i++) {
        a[i] = (struct bar_arg){.n = n, .name = name};
        if (pthread_create(&th[i], &attr, bar_thread, &a[i]) != 0)
            return fail("pthread_create", DDP_ESYS);
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (a[i].rc < 0 && bad++ == 0)
            fail("barrier client", a[i].rc);
    }
    double ms = (double)(ddp_now_ns() - t0) / 1e6;
    printf("barrier clients=%d failed=%d ms=%.1f\n", n, bad, ms);
    free(th);
    free(a);
    return bad ? 1 : 0;
}

/* ---- proxy-rank: run as a ddprun worker; what its agent's store proxy must get right ----
 * Prints its store address; after a barrier, ADDs 1 to a counter and RANK+1 to a sum, all ranks
 * at once, and prints what each ADD returned (the test checks they are those of some order of
 * the ADDs); a WAIT of 300 ms for a key nobody sets must time out while the other ranks' go on;
 * then it sleeps SECS (the test pokes the proxy meanwhile) and passes a last barrier. */
static int cmd_proxy_rank(int secs)
{
    struct ddp_store *s = NULL;
    int r, n = atoi(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "0");
    int rank = atoi(getenv("RANK") ? getenv("RANK") : "-1");
    int64_t c = 0, sum = 0;
    if ((r = ddp_store_connect_env(10000, &s)) < 0)
        return fail("connect", r);
    printf("addr %s\n", getenv("DDPRUN_STORE_ADDR"));
    if ((r = ddp_store_barrier(s, "pr/start", n, 30000)) < 0 ||
        (r = ddp_store_add(s, "pr/counter", 1, &c)) < 0 ||
        (r = ddp_store_add(s, "pr/sum", rank + 1, &sum)) < 0)
        return fail("add", r);
    printf("counter %" PRId64 " sum %" PRId64 " delta %d\n", c, sum, rank + 1);
    const char *never[] = {"pr/never"};
    int64_t t0 = ddp_now_ms();
    r = ddp_store_wait(s, never, 1, 300);
    printf("wait %s after %s\n", ddp_err_name(r),
           ddp_now_ms() - t0 >= 250 ? "its timeout" : "less");
    fflush(stdout);
    sleep((unsigned)secs);
    if ((r = ddp_store_barrier(s, "pr/end", n, 30000)) < 0)
        return fail("barrier", r);
    ddp_store_close(s);
    return 0;
}

/* ---- env-check: run as a ddprun worker; checks the environment the agent gave it ---- */
static const char *need(const char *k, int *bad)
{
    const char *v = getenv(k);
    if (!v || !*v) {
        fprintf(stderr, "env-check: %s is not set\n", k);
        (*bad)++;
        return "";
    }
    return v;
}

static int cmd_env_check(void)
{
    static const char *const vars[] = {"RANK",
                                       "LOCAL_RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK",
                                       "GROUP_WORLD_SIZE",
                                       "ROLE_NAME",
                                       "ROLE_RANK",
                                       "ROLE_WORLD_SIZE",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "TORCHELASTIC_RESTART_COUNT",
                                       "TORCHELASTIC_MAX_RESTARTS",
                                       "TORCHELASTIC_RUN_ID",
                                       "DDPRUN_JOB_ID",
                                       "DDPRUN_STORE_ADDR",
                                       "DDPRUN_TOKEN_FD",
                                       NULL};
    int bad = 0;
    for (const char *const *v = vars; *v; v++)
        need(*v, &bad);
    if (bad)
        return 1;
    int rank = atoi(getenv("RANK")), world = atoi(getenv("WORLD_SIZE"));
    int local = atoi(getenv("LOCAL_RANK")), lws = atoi(getenv("LOCAL_WORLD_SIZE"));
    int group = atoi(getenv("GROUP_RANK"));
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "env-check rank %d: ", rank);                                          \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
    CHECK(rank >= 0 && rank < world, "RANK %d outside 0..%d", rank, world - 1);
    CHECK(local >= 0 && local < lws, "LOCAL_RANK %d outside 0..%d", local, lws - 1);
    CHECK(atoi(getenv("ROLE_RANK")) == rank, "ROLE_RANK != RANK");
    CHECK(atoi(getenv("ROLE_WORLD_SIZE")) == world, "ROLE_WORLD_SIZE != WORLD_SIZE");
    CHECK(strcmp(getenv("ROLE_NAME"), "default") == 0, "ROLE_NAME is not 'default'");
    CHECK(strcmp(getenv("TORCHELASTIC_RUN_ID"), getenv("DDPRUN_JOB_ID")) == 0,
          "TORCHELASTIC_RUN_ID differs from DDPRUN_JOB_ID");
    CHECK(strcmp(getenv("TORCHELASTIC_RESTART_COUNT"), "0") == 0, "restart count is not 0");
    CHECK(group >= 0 && group < atoi(getenv("GROUP_WORLD_SIZE")), "GROUP_RANK out of range");
    CHECK(!getenv("DDPRUN_TOKEN"), "a token variable is in the environment");
    struct ddp_store *s;
    int r;
    if ((r = ddp_store_connect_env(10000, &s)) < 0)
        return fail("connect from the environment", r);
    /* The token came through the fd; it must appear in no variable. */
    extern char **environ;
    uint8_t *t2;
    size_t t2len;
    if ((r = ddp_store_token_from_env(&t2, &t2len)) < 0)
        return fail("token", r);
    for (char **e = environ; *e; e++)
        CHECK(!memmem(*e, strlen(*e), t2, t2len), "the job token is in the environment");
    ddp_store_token_free(t2, t2len);
    char blob[64];
    int bl = snprintf(blob, sizeof(blob), "%d %s", rank, getenv("MASTER_PORT"));
    struct ddp_store_value *vals = calloc((size_t)world, sizeof(*vals));
    if ((r = ddp_store_all_gather(s, "envcheck", rank, world, blob, (size_t)bl, 20000, vals)) < 0)
        return fail("all-gather", r);
    for (int i = 0; i < world; i++) {
        int rr = -1;
        char mport[32] = "";
        sscanf(vals[i].data, "%d %31s", &rr, mport);
        CHECK(rr == i, "rank slot %d holds rank %d: ranks are not distinct", i, rr);
        CHECK(strcmp(mport, getenv("MASTER_PORT")) == 0, "ranks disagree on MASTER_PORT");
    }
    ddp_store_values_free(vals, (size_t)world);
    free(vals);
    ddp_store_close(s);
    printf("env ok rank %d of %d (local %d of %d, node %d)\n", rank, world, local, lws, group);
    return 0;
#undef CHECK
}

static int usage(void)
{
    fprintf(stderr,
            "usage: storetool --addr HOST:PORT --token-file FILE CMD ARGS...\n"
            "  set KEY VALUE | get KEY | add KEY DELTA | del KEY | wait TIMEOUT_MS KEY...\n"
            "  lease-hold TTL_MS KEY        grant a lease, bind KEY, renew every TTL/3 for ever\n"
            "  watch PREFIX COUNT TIMEOUT_MS print COUNT events under PREFIX, then exit\n"
            "  stress NCLIENTS OPS          concurrent set/get/add, results checked\n"
            "  barrier N NAME               N clients connect and pass one barrier\n"
            "usage: storetool env-check      (as a ddprun worker) check the rank environment\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *addr = NULL, *tf = NULL;
    int i = 1, r;
    struct ddp_store *s = NULL;
    if (argc == 2 && strcmp(argv[1], "env-check") == 0)
        return cmd_env_check();
    if (argc == 3 && strcmp(argv[1], "proxy-rank") == 0)
        return cmd_proxy_rank(atoi(argv[2]));
    for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (strcmp(argv[i], "--addr") == 0)
            addr = argv[i + 1];
        else if (strcmp(argv[i], "--token-file") == 0)
            tf = argv[i + 1];
        else
            return usage();
    }
    if (!addr || !tf || i >= argc)
        return usage();
    if (ddp_parse_hostport(addr, host, sizeof(host), &port) < 0)
        return usage();
    if ((r = ddp_store_token_read_file(tf, &tok, &toklen)) < 0)
        return fail("token", r);
    ddp_raise_nofile();
    const char *cmd = argv[i++];
    int nargs = argc - i;
    char **av = argv + i;

    if (strcmp(cmd, "stress") == 0 && nargs == 2)
        return cmd_stress(atoi(av[0]), atoi(av[1]));
    if (strcmp(cmd, "barrier") == 0 && nargs == 2)
        return cmd_barrier(atoi(av[0]), av[1]);
    if ((r = connect_one(&s, 10000)) < 0)
        return fail("connect", r);

    if (strcmp(cmd, "set") == 0 && nargs == 2) {
        if ((r = ddp_store_set(s, av[0], av[1], strlen(av[1]))) < 0)
            return fail("set", r);
    } else if (strcmp(cmd, "get") == 0 && nargs == 1) {
        void *v;
        size_t n;
        if ((r = ddp_store_get(s, av[0], &v, &n)) < 0)
            return fail("get", r);
        fwrite(v, 1, n, stdout);
        printf("\n");
        free(v);
    } else if (strcmp(cmd, "add") == 0 && nargs == 2) {
        int64_t v;
        if ((r = ddp_store_add(s, av[0], strtoll(av[1], NULL, 10), &v)) < 0)
            return fail("add", r);
        printf("%" PRId64 "\n", v);
    } else if (strcmp(cmd, "del") == 0 && nargs == 1) {
        bool d;
        if ((r = ddp_store_delete(s, av[0], &d)) < 0)
            return fail("del", r);
        printf("%d\n", d);
    } else if (strcmp(cmd, "wait") == 0 && nargs >= 2) {
        if ((r = ddp_store_wait(s, (const char *const *)av + 1, (size_t)nargs - 1, atoi(av[0]))) <
            0)
            return fail("wait", r);
        printf("ready\n");
    } else if (strcmp(cmd, "lease-hold") == 0 && nargs == 2) {
        int ttl = atoi(av[0]);
        uint64_t lease;
        if ((r = ddp_store_lease_grant(s, ttl, &lease)) < 0)
            return fail("lease grant", r);
        if ((r = ddp_store_set_leased(s, av[1], "alive", 5, lease)) < 0)
            return fail("set", r);
        printf("held %016" PRIx64 "\n", lease);
        fflush(stdout);
        for (;;) {
            usleep((useconds_t)(ttl / 3) * 1000);
            if ((r = ddp_store_lease_keepalive(s, lease, NULL)) < 0)
                return fail("keepalive", r);
        }
    } else if (strcmp(cmd, "watch") == 0 && nargs == 3) {
        uint32_t wid;
        int count = atoi(av[1]), timeout = atoi(av[2]);
        if ((r = ddp_store_watch(s, av[0], true, &wid)) < 0)
            return fail("watch", r);
        printf("watching\n");
        fflush(stdout);
        static const char *const kinds[] = {"?", "SET", "DELETE", "EXPIRE"};
        for (int k = 0; k < count; k++) {
            struct ddp_store_event *ev;
            if ((r = ddp_store_next_event(s, timeout, &ev)) < 0)
                return fail("next event", r);
            printf("%s %s\n", kinds[ev->kind], ev->key);
            fflush(stdout);
            ddp_store_event_free(ev);
        }
    } else {
        return usage();
    }
    ddp_store_close(s);
    ddp_store_token_free(tok, toklen);
    return 0;
}
