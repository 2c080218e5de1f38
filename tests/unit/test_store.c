/*
 * Unit tests for the store server and client: every operation and error path, against a real
 * server on a loopback socket (the server against raw and misbehaving clients is in
 * test_store_server.c).
 */
#include "common/buf.h"
#include "common/util.h"
#include "rendezvous/proto.h"
#include "rendezvous/store.h"
#include "tests/unit/store_fixture.h"
#include "tests/unit/test.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/banned.h"

TEST(set_get_overwrite_missing)
{
    start_server();
    struct ddp_store *s = client();
    void *v;
    size_t n;
    ASSERT_ERR(ddp_store_get(s, "nope", &v, &n), DDP_ENOKEY);
    ASSERT_OK(ddp_store_set(s, "k", "hello", 5));
    ASSERT_OK(ddp_store_get(s, "k", &v, &n));
    ASSERT_EQ(n, 5);
    ASSERT_STREQ(v, "hello");
    free(v);
    ASSERT_OK(ddp_store_set(s, "k", "", 0)); /* empty values are values */
    ASSERT_OK(ddp_store_get(s, "k", &v, &n));
    ASSERT_EQ(n, 0);
    free(v);
    uint8_t bin[5] = {0, 1, 0, 255, 0};
    ASSERT_OK(ddp_store_set(s, "bin", bin, 5));
    ASSERT_OK(ddp_store_get(s, "bin", &v, &n));
    ASSERT_EQ(n, 5);
    ASSERT_MEMEQ(v, bin, 5);
    free(v);
    ASSERT_OK(ddp_store_ping(s));
    ddp_store_close(s);
    stop_server();
}

TEST(add_counts_and_rejects)
{
    start_server();
    struct ddp_store *s = client();
    int64_t v;
    ASSERT_OK(ddp_store_add(s, "c", 5, &v));
    ASSERT_EQ(v, 5);
    ASSERT_OK(ddp_store_add(s, "c", -7, &v));
    ASSERT_EQ(v, -2);
    void *raw;
    size_t n;
    ASSERT_OK(ddp_store_get(s, "c", &raw, &n)); /* stored as decimal text, like TCPStore */
    ASSERT_STREQ(raw, "-2");
    free(raw);
    ASSERT_OK(ddp_store_set(s, "text", "abc", 3));
    v = 77;
    ASSERT_ERR(ddp_store_add(s, "text", 1, &v), DDP_ENOTINT);
    ASSERT_EQ(v, 77);
    ASSERT_OK(ddp_store_set(s, "big", "9223372036854775807", 19));
    ASSERT_ERR(ddp_store_add(s, "big", 1, &v), DDP_EINVAL); /* overflow */
    ASSERT_OK(ddp_store_set(s, "sp", " 1", 2));
    ASSERT_ERR(ddp_store_add(s, "sp", 1, &v), DDP_ENOTINT);
    ASSERT_OK(ddp_store_ping(s)); /* errors leave the connection usable */
    ddp_store_close(s);
    stop_server();
}

TEST(cas_semantics)
{
    start_server();
    struct ddp_store *s = client();
    bool sw;
    void *cur;
    size_t n;
    /* absent expected, key absent: created */
    ASSERT_OK(ddp_store_cas(s, "k", NULL, 0, "v1", 2, &sw, &cur, &n));
    ASSERT_TRUE(sw);
    ASSERT_STREQ(cur, "v1");
    free(cur);
    /* absent expected, key present: no swap, current returned */
    ASSERT_OK(ddp_store_cas(s, "k", NULL, 0, "v2", 2, &sw, &cur, &n));
    ASSERT_TRUE(!sw);
    ASSERT_STREQ(cur, "v1");
    free(cur);
    /* wrong expected */
    ASSERT_OK(ddp_store_cas(s, "k", "zz", 2, "v2", 2, &sw, &cur, &n));
    ASSERT_TRUE(!sw);
    ASSERT_STREQ(cur, "v1");
    free(cur);
    /* right expected */
    ASSERT_OK(ddp_store_cas(s, "k", "v1", 2, "v2", 2, &sw, NULL, NULL));
    ASSERT_TRUE(sw);
    /* expected value on an absent key: no swap, *cur NULL */
    ASSERT_OK(ddp_store_cas(s, "other", "x", 1, "y", 1, &sw, &cur, &n));
    ASSERT_TRUE(!sw);
    ASSERT_TRUE(cur == NULL);
    /* expected empty string is not the same as absent */
    ASSERT_OK(ddp_store_cas(s, "other", "", 0, "y", 1, &sw, NULL, NULL));
    ASSERT_TRUE(!sw);
    ddp_store_close(s);
    stop_server();
}

TEST(delete_check_num_keys)
{
    start_server();
    struct ddp_store *s = client();
    bool del, all;
    int64_t nk;
    ASSERT_OK(ddp_store_num_keys(s, &nk));
    ASSERT_EQ(nk, 0);
    ASSERT_OK(ddp_store_set(s, "a", "1", 1));
    ASSERT_OK(ddp_store_set(s, "b", "2", 1));
    ASSERT_OK(ddp_store_num_keys(s, &nk));
    ASSERT_EQ(nk, 2);
    const char *ab[] = {"a", "b"}, *ac[] = {"a", "c"};
    ASSERT_OK(ddp_store_check(s, ab, 2, &all));
    ASSERT_TRUE(all);
    ASSERT_OK(ddp_store_check(s, ac, 2, &all));
    ASSERT_TRUE(!all);
    ASSERT_OK(ddp_store_delete(s, "a", &del));
    ASSERT_TRUE(del);
    ASSERT_OK(ddp_store_delete(s, "a", &del));
    ASSERT_TRUE(!del);
    ASSERT_OK(ddp_store_num_keys(s, &nk));
    ASSERT_EQ(nk, 1);
    ASSERT_OK(ddp_store_check(s, ab, 2, &all));
    ASSERT_TRUE(!all);
    ASSERT_ERR(ddp_store_check(s, ab, 0, &all), DDP_EINVAL);
    ddp_store_close(s);
    stop_server();
}

struct setter {
    int delay_ms;
    const char *key;
};

static void *set_later(void *a)
{
    struct setter *st = a;
    usleep((useconds_t)st->delay_ms * 1000);
    struct ddp_store *s = client();
    ASSERT_OK(ddp_store_set(s, st->key, "x", 1));
    ddp_store_close(s);
    return NULL;
}

TEST(wait_parks_until_set)
{
    start_server();
    struct ddp_store *s = client();
    ASSERT_OK(ddp_store_set(s, "early", "1", 1));
    const char *k1[] = {"early"};
    ASSERT_OK(ddp_store_wait(s, k1, 1, 1000)); /* already there */
    pthread_t th;
    struct setter st = {150, "late"};
    pthread_create(&th, NULL, set_later, &st);
    const char *k2[] = {"early", "late", "late"};
    int64_t t0 = ddp_now_ms();
    ASSERT_OK(ddp_store_wait(s, k2, 3, 5000));
    ASSERT_GE(ddp_now_ms() - t0, 140);
    pthread_join(th, NULL);
    wait_stat(st_waiters, 0);
    ddp_store_close(s);
    stop_server();
}

TEST(wait_times_out_and_connection_survives)
{
    start_server();
    struct ddp_store *s = client();
    const char *k[] = {"never"};
    int64_t t0 = ddp_now_ms();
    ASSERT_ERR(ddp_store_wait(s, k, 1, 200), DDP_ETIMEDOUT);
    int64_t dt = ddp_now_ms() - t0;
    ASSERT_GE(dt, 190);
    ASSERT_LE(dt, 2000);
    ASSERT_ERR(ddp_store_wait(s, k, 1, 0), DDP_ETIMEDOUT); /* zero: a check */
    ASSERT_OK(ddp_store_set(s, "never", "now", 3));
    ASSERT_OK(ddp_store_wait(s, k, 1, 0));
    wait_stat(st_waiters, 0);
    ddp_store_close(s);
    stop_server();
}

TEST(multi_get)
{
    start_server();
    struct ddp_store *s = client();
    ASSERT_OK(ddp_store_set(s, "a", "AA", 2));
    ASSERT_OK(ddp_store_set(s, "c", "", 0));
    const char *k[] = {"a", "b", "c"};
    struct ddp_store_value v[3];
    ASSERT_OK(ddp_store_multi_get(s, k, 3, v));
    ASSERT_STREQ(v[0].data, "AA");
    ASSERT_TRUE(v[1].data == NULL);
    ASSERT_TRUE(v[2].data != NULL);
    ASSERT_EQ(v[2].len, 0);
    ddp_store_values_free(v, 3);
    ddp_store_close(s);
    stop_server();
}

TEST(watch_key_and_prefix)
{
    start_server();
    struct ddp_store *w = client(), *s = client();
    uint32_t wk, wp;
    struct ddp_store_event *ev;
    ASSERT_OK(ddp_store_watch(w, "exact", false, &wk));
    ASSERT_OK(ddp_store_watch(w, "nodes/", true, &wp));
    ASSERT_TRUE(wk != wp);
    ASSERT_ERR(ddp_store_next_event(w, 0, &ev), DDP_ETIMEDOUT);
    ASSERT_OK(ddp_store_set(s, "exactly", "no", 2)); /* neither watch matches */
    ASSERT_OK(ddp_store_set(s, "nodes/a", "up", 2));
    ASSERT_OK(ddp_store_set(s, "exact", "yes", 3));
    ASSERT_OK(ddp_store_delete(s, "nodes/a", NULL));
    ASSERT_OK(ddp_store_next_event(w, 2000, &ev));
    ASSERT_EQ(ev->kind, DDP_STORE_EV_SET);
    ASSERT_EQ(ev->watch_id, wp);
    ASSERT_STREQ(ev->key, "nodes/a");
    ASSERT_STREQ(ev->value, "up");
    ddp_store_event_free(ev);
    ASSERT_OK(ddp_store_next_event(w, 2000, &ev));
    ASSERT_EQ(ev->watch_id, wk);
    ASSERT_STREQ(ev->value, "yes");
    ddp_store_event_free(ev);
    ASSERT_OK(ddp_store_next_event(w, 2000, &ev));
    ASSERT_EQ(ev->kind, DDP_STORE_EV_DELETE);
    ASSERT_STREQ(ev->key, "nodes/a");
    ddp_store_event_free(ev);
    /* events that arrive during another call are queued, not lost */
    ASSERT_OK(ddp_store_set(s, "nodes/b", "1", 1));
    usleep(50000);
    ASSERT_OK(ddp_store_ping(w));
    ASSERT_OK(ddp_store_next_event(w, 0, &ev));
    ASSERT_STREQ(ev->key, "nodes/b");
    ddp_store_event_free(ev);
    ASSERT_OK(ddp_store_unwatch(w, wp));
    ASSERT_ERR(ddp_store_unwatch(w, wp), DDP_EINVAL);
    ASSERT_OK(ddp_store_set(s, "nodes/c", "1", 1));
    ASSERT_ERR(ddp_store_next_event(w, 200, &ev), DDP_ETIMEDOUT);
    ddp_store_close(w);
    ddp_store_close(s);
    stop_server();
}

struct blocked {
    struct ddp_store *s;
    int r;
};

static void *wait_event(void *arg)
{
    struct blocked *b = arg;
    struct ddp_store_event *ev = NULL;
    b->r = ddp_store_next_event(b->s, 20000, &ev);
    ddp_store_event_free(ev);
    return NULL;
}

/* A thread waiting for events is released by ddp_store_interrupt, not by its timeout (a
 * broken interrupt ends the wait with DDP_ETIMEDOUT after 20 s); later calls fail too. */
TEST(interrupt_releases_a_waiting_thread)
{
    start_server();
    struct blocked b = {.s = client(), .r = 1};
    uint32_t id;
    ASSERT_OK(ddp_store_watch(b.s, "nodes/", true, &id));
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, wait_event, &b), 0);
    usleep(100 * 1000); /* most likely blocked by now; either way the result is the same */
    ddp_store_interrupt(b.s);
    pthread_join(th, NULL);
    ASSERT_ERR(b.r, DDP_ECLOSED);
    struct ddp_store_event *ev;
    ASSERT_ERR(ddp_store_next_event(b.s, 0, &ev), DDP_ECLOSED);
    ddp_store_close(b.s);
    /* the server is unharmed */
    struct ddp_store *s = client();
    ASSERT_OK(ddp_store_ping(s));
    ddp_store_close(s);
    stop_server();
}

TEST(lease_keepalive_expiry_and_revoke)
{
    start_server();
    struct ddp_store *w = client(), *s = client();
    uint64_t lease, lease2;
    uint32_t wid;
    int ttl;
    struct ddp_store_event *ev;
    ASSERT_ERR(ddp_store_lease_grant(s, 0, &lease), DDP_EINVAL);
    ASSERT_OK(ddp_store_lease_grant(s, 300, &lease));
    ASSERT_OK(ddp_store_set_leased(s, "nodes/n0", "alive", 5, lease));
    ASSERT_ERR(ddp_store_set_leased(s, "nodes/bad", "x", 1, 12345), DDP_ENOLEASE);
    ASSERT_OK(ddp_store_watch(w, "nodes/", true, &wid));
    /* renewed past several TTLs: the key stays */
    for (int i = 0; i < 6; i++) {
        usleep(100000);
        ASSERT_OK(ddp_store_lease_keepalive(s, lease, &ttl));
        ASSERT_EQ(ttl, 300);
    }
    void *v;
    size_t n;
    ASSERT_OK(ddp_store_get(s, "nodes/n0", &v, &n));
    free(v);
    /* stop renewing: the key vanishes and the watch reports the expiry */
    int64_t t0 = ddp_now_ms();
    ASSERT_OK(ddp_store_next_event(w, 3000, &ev));
    int64_t dt = ddp_now_ms() - t0;
    ASSERT_EQ(ev->kind, DDP_STORE_EV_EXPIRE);
    ASSERT_STREQ(ev->key, "nodes/n0");
    ddp_store_event_free(ev);
    ASSERT_GE(dt, 250);
    ASSERT_LE(dt, 1500);
    ASSERT_ERR(ddp_store_get(s, "nodes/n0", &v, &n), DDP_ENOKEY);
    ASSERT_ERR(ddp_store_lease_keepalive(s, lease, &ttl), DDP_ENOLEASE);
    /* revoke deletes now; re-setting a key without a lease unbinds it */
    ASSERT_OK(ddp_store_lease_grant(s, 60000, &lease2));
    ASSERT_OK(ddp_store_set_leased(s, "nodes/n1", "a", 1, lease2));
    ASSERT_OK(ddp_store_set_leased(s, "nodes/n2", "b", 1, lease2));
    ASSERT_OK(ddp_store_set(s, "nodes/n2", "c", 1));
    ASSERT_OK(ddp_store_lease_revoke(s, lease2));
    ASSERT_ERR(ddp_store_lease_revoke(s, lease2), DDP_ENOLEASE);
    ASSERT_ERR(ddp_store_get(s, "nodes/n1", &v, &n), DDP_ENOKEY);
    ASSERT_OK(ddp_store_get(s, "nodes/n2", &v, &n));
    free(v);
    /* the watch saw n1 and n2 set, n2 set again (unbound), then n1 deleted as revoked (not
     * expired: the launcher tells an agent that left from one that went silent) */
    const char *seen[] = {"nodes/n1", "nodes/n2", "nodes/n2", "nodes/n1"};
    for (int i = 0; i < 4; i++) {
        ASSERT_OK(ddp_store_next_event(w, 3000, &ev));
        ASSERT_STREQ(ev->key, seen[i]);
        ASSERT_EQ(ev->kind, i < 3 ? DDP_STORE_EV_SET : DDP_STORE_EV_REVOKE);
        ddp_store_event_free(ev);
    }
    ddp_store_close(w);
    ddp_store_close(s);
    stop_server();
}

TEST(wrong_token_refused_others_keep_working)
{
    start_server();
    struct ddp_store *good = client(), *bad = NULL;
    ASSERT_OK(ddp_store_set(good, "k", "v", 1));
    ASSERT_ERR(ddp_store_connect("127.0.0.1", port, "wrong", 5, 2000, &bad), DDP_EAUTH);
    ASSERT_TRUE(bad == NULL);
    wait_stat(st_refused, 1);
    ASSERT_OK(ddp_store_ping(good));
    struct ddp_store *again = client();
    ASSERT_OK(ddp_store_ping(again));
    ddp_store_close(again);
    ddp_store_close(good);
    stop_server();
}

TEST(connect_refused_times_out)
{
    struct ddp_store *s = NULL;
    /* Bind a port, close it: nothing listens there. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    socklen_t sl = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &sl);
    close(fd);
    int64_t t0 = ddp_now_ms();
    ASSERT_ERR(ddp_store_connect("127.0.0.1", ntohs(a.sin_port), "t", 1, 300, &s), DDP_ECONNECT);
    ASSERT_GE(ddp_now_ms() - t0, 250);
    ASSERT_TRUE(s == NULL);
    ASSERT_ERR(ddp_store_connect("no-such-host.invalid", 1, "t", 1, 100, &s), DDP_ECONNECT);
}

static int late_port;

static void *start_late(void *a)
{
    (void)a;
    usleep(300000);
    struct ddp_store_server_opts o = {
        .host = "127.0.0.1", .port = late_port, .token = TOKEN, .token_len = strlen(TOKEN)};
    ASSERT_OK(ddp_store_server_new(&o, &srv));
    port = ddp_store_server_port(srv);
    ASSERT_EQ(pthread_create(&srv_thread, NULL, serve, NULL), 0);
    return NULL;
}

TEST(connect_retries_until_server_is_up)
{
    /* Learn a free port, then start the server on it 300 ms after the client began. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    socklen_t sl = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &sl);
    close(fd);
    late_port = ntohs(a.sin_port);
    pthread_t th;
    struct ddp_store *s = NULL;
    pthread_create(&th, NULL, start_late, NULL);
    int64_t t0 = ddp_now_ms();
    ASSERT_OK(ddp_store_connect("127.0.0.1", late_port, TOKEN, strlen(TOKEN), 5000, &s));
    ASSERT_GE(ddp_now_ms() - t0, 250);
    pthread_join(th, NULL);
    ASSERT_OK(ddp_store_ping(s));
    ddp_store_close(s);
    stop_server();
}

TEST(limits)
{
    start_server();
    struct ddp_store *s = client();
    char *key = malloc(DDP_STORE_MAX_KEY + 2);
    memset(key, 'k', DDP_STORE_MAX_KEY + 1);
    key[DDP_STORE_MAX_KEY + 1] = '\0';
    ASSERT_ERR(ddp_store_set(s, key, "v", 1), DDP_ETOOBIG);
    {
        void *v;
        size_t n;
        const char *ks[] = {key};
        bool all;
        ASSERT_ERR(ddp_store_get(s, key, &v, &n), DDP_ETOOBIG);
        ASSERT_ERR(ddp_store_add(s, key, 1, NULL), DDP_ETOOBIG);
        ASSERT_ERR(ddp_store_check(s, ks, 1, &all), DDP_ETOOBIG);
        ASSERT_ERR(ddp_store_get(s, NULL, &v, &n), DDP_EINVAL);
        ASSERT_OK(ddp_store_ping(s)); /* refused locally: the connection is untouched */
    }
    key[DDP_STORE_MAX_KEY] = '\0'; /* exactly the limit is fine */
    ASSERT_OK(ddp_store_set(s, key, "v", 1));
    size_t big = DDP_STORE_MAX_VALUE;
    uint8_t *val = malloc(big + 1);
    for (size_t i = 0; i < big + 1; i++)
        val[i] = (uint8_t)(i * 131);
    ASSERT_ERR(ddp_store_set(s, "big", val, big + 1), DDP_ETOOBIG);
    ASSERT_OK(ddp_store_set(s, "big", val, big));
    void *got;
    size_t n;
    ASSERT_OK(ddp_store_get(s, "big", &got, &n));
    ASSERT_EQ(n, big);
    ASSERT_MEMEQ(got, val, big);
    free(got);
    free(val);
    free(key);
    ddp_store_close(s);
    stop_server();
}

struct barrier_arg {
    int rank, n;
    int rc;
    struct ddp_store_value *out;
};

static void *barrier_thread(void *a)
{
    struct barrier_arg *b = a;
    struct ddp_store *s = client();
    b->rc = ddp_store_barrier(s, "b1", b->n, 5000);
    if (b->rc == 0 && b->out) {
        char blob[32];
        int len = snprintf(blob, sizeof(blob), "addr-of-%d", b->rank);
        b->rc = ddp_store_all_gather(s, "ag", b->rank, b->n, blob, (size_t)len, 5000, b->out);
    }
    ddp_store_close(s);
    return NULL;
}

TEST(barrier_and_all_gather)
{
    start_server();
    enum { N = 8 };
    pthread_t th[N];
    struct barrier_arg a[N];
    struct ddp_store_value out[N][N];
    for (int i = 0; i < N; i++) {
        a[i] = (struct barrier_arg){.rank = i, .n = N, .out = out[i]};
        pthread_create(&th[i], NULL, barrier_thread, &a[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        ASSERT_OK(a[i].rc);
    }
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < N; j++) {
            char want[32];
            snprintf(want, sizeof(want), "addr-of-%d", j);
            ASSERT_STREQ(out[i][j].data, want);
        }
        ddp_store_values_free(out[i], N);
    }
    /* a ninth caller of an 8-party barrier is an error, not a hang */
    struct ddp_store *s = client();
    ASSERT_ERR(ddp_store_barrier(s, "b1", N, 1000), DDP_EINVAL);
    /* a barrier nobody completes times out */
    ASSERT_ERR(ddp_store_barrier(s, "b2", 2, 200), DDP_ETIMEDOUT);
    ddp_store_close(s);
    stop_server();
}

TEST(tokens)
{
    char a[65], b[65];
    ASSERT_OK(ddp_store_token_generate(a));
    ASSERT_OK(ddp_store_token_generate(b));
    ASSERT_EQ(strlen(a), 64);
    ASSERT_TRUE(strcmp(a, b) != 0);
    ASSERT_EQ(strspn(a, "0123456789abcdef"), 64);

    char path[] = "/tmp/ddp-token-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ(write(fd, "sekrit\n", 7), 7);
    close(fd);
    uint8_t *tok;
    size_t len;
    chmod(path, 0644);
    ASSERT_ERR(ddp_store_token_read_file(path, &tok, &len), DDP_EINVAL);
    chmod(path, 0600);
    ASSERT_OK(ddp_store_token_read_file(path, &tok, &len));
    ASSERT_EQ(len, 6);
    ASSERT_MEMEQ(tok, "sekrit", 6);
    ddp_store_token_free(tok, len);
    unlink(path);
    ASSERT_ERR(ddp_store_token_read_file(path, &tok, &len), DDP_EINVAL);

    /* the fd hand-over is read once, then served from memory */
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    ASSERT_EQ(write(p[1], "fromfd", 6), 6);
    close(p[1]);
    char v[16];
    snprintf(v, sizeof(v), "%d", p[0]);
    setenv("DDPRUN_TOKEN_FD", v, 1);
    ASSERT_OK(ddp_store_token_from_env(&tok, &len));
    ASSERT_MEMEQ(tok, "fromfd", 6);
    ddp_store_token_free(tok, len);
    ASSERT_TRUE(getenv("DDPRUN_TOKEN_FD") == NULL);
    ASSERT_OK(ddp_store_token_from_env(&tok, &len));
    ASSERT_EQ(len, 6);
    ddp_store_token_free(tok, len);
}

TEST(connect_env)
{
    start_server();
    struct ddp_store *s = NULL;
    unsetenv("DDPRUN_STORE_ADDR");
    ASSERT_ERR(ddp_store_connect_env(1000, &s), DDP_EINVAL);
    setenv("DDPRUN_STORE_ADDR", "127.0.0.1", 1);
    ASSERT_ERR(ddp_store_connect_env(1000, &s), DDP_EINVAL);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    setenv("DDPRUN_STORE_ADDR", addr, 1);
    unsetenv("DDPRUN_TOKEN_FD");
    unsetenv("DDPRUN_TOKEN_FILE");
    ASSERT_ERR(ddp_store_connect_env(1000, &s), DDP_EINVAL);
    char path[] = "/tmp/ddp-token-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_EQ(write(fd, TOKEN, strlen(TOKEN)), (ssize_t)strlen(TOKEN));
    close(fd);
    setenv("DDPRUN_TOKEN_FILE", path, 1);
    ASSERT_OK(ddp_store_connect_env(1000, &s));
    ASSERT_OK(ddp_store_ping(s));
    ddp_store_close(s);
    unlink(path);
    stop_server();
}

/* ---- raw frames: what only a broken or hostile client sends ---- */
