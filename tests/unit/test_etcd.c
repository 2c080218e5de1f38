/*
 * The etcd v3 client (rendezvous/etcd.c) and the store API on it (rendezvous/store_etcd.c,
 * rendezvous.backend: etcd) against a real etcd (Debian's etcd-server), started by each test on
 * a Unix socket in a folder of its own (no port to race for), and the JSON and base64 code it
 * rests on. Without etcd installed the etcd tests say so and pass.
 */
#include "common/base64.h"
#include "common/json.h"
#include "common/util.h"
#include "rendezvous/etcd.h"
#include "rendezvous/store.h"
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

struct etcd_proc {
    pid_t pid[3];
    int n;
    char dir[64], sock[3][128];
};

/* Member m of an n-member cluster, in p->dir: client socket cM:0, peer socket pM:0. */
static void etcd_member(struct etcd_proc *p, int m)
{
    char name[16], client[48], peer[48], data[32], cluster[256] = "";
    snprintf(name, sizeof(name), "m%d", m);
    snprintf(client, sizeof(client), "unix://c%d:0", m);
    snprintf(peer, sizeof(peer), "unix://p%d:0", m);
    snprintf(data, sizeof(data), "data%d", m);
    for (int k = 0; k < p->n; k++) {
        size_t l = strlen(cluster);
        snprintf(cluster + l, sizeof(cluster) - l, "%sm%d=unix://p%d:0", k ? "," : "", k, k);
    }
    snprintf(p->sock[m], sizeof(p->sock[m]), "%s/c%d:0", p->dir, m);
    p->pid[m] = fork();
    ASSERT_TRUE(p->pid[m] >= 0);
    if (p->pid[m] == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test takes it along */
        ASSERT_TRUE(chdir(p->dir) == 0);
        char log[32];
        snprintf(log, sizeof(log), "etcd%d.log", m);
        if (!freopen(log, "w", stderr))
            _exit(127);
        execl("/usr/bin/etcd", "etcd", "--name", name, "--data-dir", data, "--listen-client-urls",
              client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
              "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
              "--initial-cluster-state", "new", "--heartbeat-interval", "50", "--election-timeout",
              "500", (char *)NULL);
        _exit(127);
    }
}

/* Starts an n-member cluster in a new folder; false when etcd is not installed. */
static bool etcd_cluster(struct etcd_proc *p, int n)
{
    if (access("/usr/bin/etcd", X_OK) != 0) {
        fprintf(stderr, "(etcd is not installed: ./dev.sh deps installs etcd-server)\n");
        return false;
    }
    snprintf(p->dir, sizeof(p->dir), "/tmp/ddp-etcd-XXXXXX");
    ASSERT_TRUE(mkdtemp(p->dir));
    p->n = n;
    for (int m = 0; m < n; m++)
        etcd_member(p, m);
    return true;
}

static bool etcd_start(struct etcd_proc *p)
{
    return etcd_cluster(p, 1);
}

static void etcd_stop(struct etcd_proc *p)
{
    for (int m = 0; m < p->n; m++)
        if (p->pid[m] > 0) {
            kill(p->pid[m], SIGKILL);
            waitpid(p->pid[m], NULL, 0);
        }
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p->dir);
    ASSERT_EQ(system(cmd), 0);
}

/* A client of it, once it answers (10 s at most). */
static struct ddp_etcd *client(const char *const *eps, size_t n)
{
    struct ddp_etcd *e;
    struct ddp_etcd_opts o = {.endpoints = eps, .nendpoints = n, .timeout_ms = 2000};
    ASSERT_EQ(ddp_etcd_new(&o, &e), 0);
    char v[64];
    for (int k = 0; k < 200 && ddp_etcd_version(e, v, sizeof(v)) != 0; k++)
        usleep(50 * 1000);
    ASSERT_EQ(ddp_etcd_version(e, v, sizeof(v)), 0);
    ASSERT_TRUE(strncmp(v, "3.", 2) == 0);
    return e;
}

/* A 1-member etcd, its endpoint in ep and a client of it; false (the test passes, saying why)
 * where etcd is not installed. */
static bool with_etcd(struct etcd_proc *p, char *ep, size_t n, struct ddp_etcd **e)
{
    if (!etcd_start(p))
        return false;
    snprintf(ep, n, "unix://%s", p->sock[0]);
    const char *eps[] = {ep};
    *e = client(eps, 1);
    return true;
}

static char listed[4096];

static void on_kv(void *arg, const char *key, const char *val, size_t vlen)
{
    (void)arg;
    size_t l = strlen(listed);
    snprintf(listed + l, sizeof(listed) - l, "%s=%zu:%c;", key, vlen, vlen ? val[vlen - 1] : '-');
}

TEST(keys_values_create_list_delete)
{
    struct etcd_proc p;
    char ep[160];
    struct ddp_etcd *e;
    if (!with_etcd(&p, ep, sizeof(ep), &e))
        return;
    char *v;
    size_t vl;
    int64_t rev = 0;
    ASSERT_ERR(ddp_etcd_get(e, "job/a", &v, &vl, NULL), DDP_ENOKEY);
    ASSERT_EQ(ddp_etcd_put(e, "job/a", "one", 3, 0), 0);
    ASSERT_EQ(ddp_etcd_get(e, "job/a", &v, &vl, &rev), 0);
    ASSERT_EQ(vl, 3);
    ASSERT_STREQ(v, "one");
    ASSERT_GE(rev, 2);
    free(v);
    /* binary values, and the empty value (which the gateway leaves out) */
    const char bin[] = {'\0', '\xff', '\n', '"', '\\', 'x'};
    ASSERT_EQ(ddp_etcd_put(e, "job/bin", bin, sizeof(bin), 0), 0);
    ASSERT_EQ(ddp_etcd_get(e, "job/bin", &v, &vl, NULL), 0);
    ASSERT_EQ(vl, sizeof(bin));
    ASSERT_TRUE(memcmp(v, bin, sizeof(bin)) == 0);
    free(v);
    ASSERT_EQ(ddp_etcd_put(e, "job/empty", "", 0, 0), 0);
    ASSERT_EQ(ddp_etcd_get(e, "job/empty", &v, &vl, NULL), 0);
    ASSERT_EQ(vl, 0);
    free(v);
    /* create if absent: once */
    bool created = false;
    ASSERT_EQ(ddp_etcd_create(e, "job/leader", "n1", 2, 0, &created), 0);
    ASSERT_TRUE(created);
    ASSERT_EQ(ddp_etcd_create(e, "job/leader", "n2", 2, 0, &created), 0);
    ASSERT_TRUE(!created);
    ASSERT_EQ(ddp_etcd_get(e, "job/leader", &v, &vl, NULL), 0);
    ASSERT_STREQ(v, "n1");
    free(v);
    /* a prefix: its keys in order, not the neighbours' */
    ASSERT_EQ(ddp_etcd_put(e, "joc", "x", 1, 0), 0);
    ASSERT_EQ(ddp_etcd_put(e, "job", "x", 1, 0), 0);
    listed[0] = '\0';
    ASSERT_EQ(ddp_etcd_list(e, "job/", on_kv, NULL, &rev), 0);
    ASSERT_STREQ(listed, "job/a=3:e;job/bin=6:x;job/empty=0:-;job/leader=2:1;");
    int64_t deleted = 0;
    ASSERT_EQ(ddp_etcd_delete(e, "job/", true, &deleted), 0);
    ASSERT_EQ(deleted, 4);
    ASSERT_EQ(ddp_etcd_delete(e, "job/a", false, &deleted), 0);
    ASSERT_EQ(deleted, 0);
    ASSERT_ERR(ddp_etcd_get(e, "job/leader", &v, &vl, NULL), DDP_ENOKEY);
    ASSERT_EQ(ddp_etcd_get(e, "joc", &v, &vl, NULL), 0);
    free(v);
    ddp_etcd_free(e);
    etcd_stop(&p);
}

TEST(leases_keep_keys_alive_and_take_them_when_they_end)
{
    struct etcd_proc p;
    char ep[160];
    struct ddp_etcd *e;
    if (!with_etcd(&p, ep, sizeof(ep), &e))
        return;
    int64_t id = 0, ttl = 0;
    ASSERT_EQ(ddp_etcd_lease_grant(e, 2, &id), 0);
    ASSERT_TRUE(id != 0);
    ASSERT_EQ(ddp_etcd_put(e, "m/n1", "up", 2, id), 0);
    /* kept alive past its TTL */
    for (int k = 0; k < 6; k++) {
        usleep(500 * 1000);
        ASSERT_EQ(ddp_etcd_lease_keepalive(e, id, &ttl), 0);
        ASSERT_EQ(ttl, 2);
    }
    char *v;
    size_t vl;
    ASSERT_EQ(ddp_etcd_get(e, "m/n1", &v, &vl, NULL), 0);
    free(v);
    /* left to expire: the key goes, and the lease cannot be renewed */
    int64_t id2;
    ASSERT_EQ(ddp_etcd_lease_grant(e, 1, &id2), 0);
    ASSERT_EQ(ddp_etcd_put(e, "m/n2", "up", 2, id2), 0);
    int gone = 0;
    for (int k = 0; k < 60 && !gone; k++) {
        usleep(100 * 1000);
        gone = ddp_etcd_get(e, "m/n2", &v, &vl, NULL) == DDP_ENOKEY;
        if (!gone)
            free(v);
    }
    ASSERT_TRUE(gone);
    ASSERT_ERR(ddp_etcd_lease_keepalive(e, id2, NULL), DDP_ENOLEASE);
    ASSERT_TRUE(strstr(ddp_etcd_error(e), "has expired or was revoked"));
    /* the first lease, no longer renewed meanwhile, goes the same way */
    gone = 0;
    for (int k = 0; k < 60 && !gone; k++) {
        gone = ddp_etcd_get(e, "m/n1", &v, &vl, NULL) == DDP_ENOKEY;
        if (!gone) {
            free(v);
            usleep(100 * 1000);
        }
    }
    ASSERT_TRUE(gone);
    /* revoked: at once */
    int64_t id3;
    ASSERT_EQ(ddp_etcd_lease_grant(e, 60, &id3), 0);
    ASSERT_EQ(ddp_etcd_put(e, "m/n3", "up", 2, id3), 0);
    ASSERT_EQ(ddp_etcd_lease_revoke(e, id3), 0);
    ASSERT_ERR(ddp_etcd_get(e, "m/n3", &v, &vl, NULL), DDP_ENOKEY);
    ASSERT_ERR(ddp_etcd_lease_revoke(e, id3), DDP_ENOLEASE);
    ddp_etcd_free(e);
    etcd_stop(&p);
}

TEST(a_dead_endpoint_is_passed_over_and_named_when_none_answers)
{
    struct etcd_proc p;
    if (!etcd_start(&p))
        return;
    char ep[160];
    snprintf(ep, sizeof(ep), "unix://%s", p.sock[0]);
    const char *eps[] = {"unix:///nonexistent/etcd.sock", "http://127.0.0.1:1", ep};
    struct ddp_etcd *e = client(eps, 3);
    ASSERT_EQ(ddp_etcd_put(e, "k", "v", 1, 0), 0);
    ddp_etcd_free(e);
    const char *dead[] = {"http://127.0.0.1:1"};
    struct ddp_etcd_opts o = {.endpoints = dead, .nendpoints = 1, .timeout_ms = 1000};
    ASSERT_EQ(ddp_etcd_new(&o, &e), 0);
    ASSERT_ERR(ddp_etcd_put(e, "k", "v", 1, 0), DDP_ECONNECT);
    ASSERT_TRUE(strstr(ddp_etcd_error(e), "etcd at http://127.0.0.1:1: "));
    ddp_etcd_free(e);
    /* an answer that is an error names the endpoint and the server's words */
    const char *one[] = {ep};
    e = client(one, 1);
    ASSERT_ERR(ddp_etcd_lease_keepalive(e, 12345, NULL), DDP_ENOLEASE);
    ddp_etcd_free(e);
    etcd_stop(&p);
}

TEST(json_reads_what_it_should_and_refuses_the_rest)
{
    const char *t = "{\"header\":{\"revision\":\"42\"},\"kvs\":[{\"key\":\"YQ==\"},{\"n\":-1.5e3}],"
                    "\"s\":\"a\\\"b\\\\c\\n\\u00e9\\ud83d\\ude00\",\"ok\":true,\"z\":null}";
    struct ddp_json j;
    ASSERT_EQ(ddp_json_parse(t, strlen(t), &j), 0);
    static const char *const rev[] = {"header", "revision", NULL};
    int64_t v = 0;
    ASSERT_TRUE(ddp_json_i64(&j, ddp_json_path(&j, 0, rev), &v));
    ASSERT_EQ(v, 42);
    int kvs = ddp_json_get(&j, 0, "kvs");
    ASSERT_EQ(j.tok[kvs].count, 2);
    ASSERT_TRUE(ddp_json_get(&j, ddp_json_at(&j, kvs, 1), "n") >= 0);
    ASSERT_EQ(ddp_json_at(&j, kvs, 2), -1);
    char s[64];
    ASSERT_EQ(ddp_json_str(&j, ddp_json_get(&j, 0, "s"), s, sizeof(s)), 12);
    ASSERT_STREQ(s, "a\"b\\c\n\xc3\xa9\xf0\x9f\x98\x80");
    ASSERT_TRUE(ddp_json_bool(&j, ddp_json_get(&j, 0, "ok")));
    ASSERT_EQ(ddp_json_get(&j, 0, "missing"), -1);
    ASSERT_EQ(ddp_json_str(&j, ddp_json_get(&j, 0, "s"), s, 5), -1); /* too small */
    ddp_json_free(&j);
    const char *bad[] = {"",        "{",        "{\"a\":}", "[1,]",  "{\"a\" 1}",  "01",       "1.",
                         "\"\\x\"", "\"a\nb\"", "tru",      "[1] 2", "{\"a\":1,}", "\"\\u12\""};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
        if (ddp_json_parse(bad[k], strlen(bad[k]), &j) == 0)
            FAIL_AT("'%s' was accepted", bad[k]);
    /* nesting is bounded */
    char deep[400];
    memset(deep, '[', 200);
    memset(deep + 200, ']', 200);
    ASSERT_ERR(ddp_json_parse(deep, 400, &j), DDP_EPROTO);
    ASSERT_EQ(ddp_json_parse(deep + 140, 120, &j), 0); /* 60 deep is fine */
    ddp_json_free(&j);
}

TEST(base64_round_trips_and_refuses_the_rest)
{
    const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *want[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int k = 0; k < 7; k++) {
        char enc[16], dec[16];
        ddp_b64_encode(in[k], strlen(in[k]), enc);
        ASSERT_STREQ(enc, want[k]);
        long n = ddp_b64_decode(enc, strlen(enc), dec);
        ASSERT_EQ(n, (long)strlen(in[k]));
        ASSERT_TRUE(memcmp(dec, in[k], (size_t)n) == 0);
    }
    char d[16];
    ASSERT_EQ(ddp_b64_decode("Zm9", 3, d), -1);
    ASSERT_EQ(ddp_b64_decode("Zm=v", 4, d), -1);
    ASSERT_EQ(ddp_b64_decode("Z!9v", 4, d), -1);
    ASSERT_EQ(ddp_b64_decode("Zg==Zg==", 8, d), -1);
    ASSERT_EQ(ddp_b64_decode("Zh==", 4, d), -1); /* not the canonical Zg== */
    ASSERT_EQ(ddp_b64_decode("Zm9=", 4, d), -1);
}

/* ------------------------------------------------------------------ */
/* Watches, and a 3-member cluster that loses a member                */
/* ------------------------------------------------------------------ */

static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;
static char seen[8192];

static void on_event(void *arg, char kind, const char *key, const char *val, size_t vlen,
                     int64_t rev)
{
    (void)arg;
    (void)rev;
    pthread_mutex_lock(&seen_mu);
    size_t l = strlen(seen);
    snprintf(seen + l, sizeof(seen) - l, "%c %s%s%.*s;", kind, key, kind == 'P' ? "=" : "",
             kind == 'P' ? (int)vlen : 0, kind == 'P' ? val : "");
    pthread_mutex_unlock(&seen_mu);
}

/* Waits (10 s at most) until the events seen are want. */
static void expect_seen(const char *want)
{
    for (int k = 0; k < 200; k++) {
        pthread_mutex_lock(&seen_mu);
        bool same = strcmp(seen, want) == 0;
        pthread_mutex_unlock(&seen_mu);
        if (same)
            return;
        usleep(50 * 1000);
    }
    FAIL_AT("events seen: '%s', wanted '%s'", seen, want);
}

TEST(a_watch_sees_puts_deletes_and_expiries_in_order_and_replays_from_a_revision)
{
    struct etcd_proc p;
    char ep[160];
    struct ddp_etcd *e;
    if (!with_etcd(&p, ep, sizeof(ep), &e))
        return;
    int64_t rev = 0, lease;
    ASSERT_EQ(ddp_etcd_put(e, "w/before", "0", 1, 0), 0);
    ASSERT_EQ(ddp_etcd_list(e, "w/", on_kv, NULL, &rev), 0);
    const char *eps[] = {ep};
    struct ddp_etcd_opts o = {.endpoints = eps, .nendpoints = 1, .timeout_ms = 2000};
    struct ddp_etcd_watch *w;
    seen[0] = '\0';
    ASSERT_EQ(ddp_etcd_watch_start(&o, "w/", rev + 1, on_event, NULL, &w), 0);
    ASSERT_EQ(ddp_etcd_put(e, "w/a", "1", 1, 0), 0);
    ASSERT_EQ(ddp_etcd_put(e, "x/b", "2", 1, 0), 0); /* not under the prefix */
    ASSERT_EQ(ddp_etcd_delete(e, "w/a", false, NULL), 0);
    ASSERT_EQ(ddp_etcd_lease_grant(e, 1, &lease), 0);
    ASSERT_EQ(ddp_etcd_put(e, "w/node", "up", 2, lease), 0);
    expect_seen("P w/a=1;D w/a;P w/node=up;D w/node;"); /* the lease expired */
    int64_t t0 = ddp_now_ms();
    ddp_etcd_watch_stop(w);
    ASSERT_LE(ddp_now_ms() - t0, 2000);
    /* from a past revision: the same history again, the put before it too */
    seen[0] = '\0';
    ASSERT_EQ(ddp_etcd_watch_start(&o, "w/", rev, on_event, NULL, &w), 0);
    expect_seen("P w/before=0;P w/a=1;D w/a;P w/node=up;D w/node;");
    ddp_etcd_watch_stop(w);
    ddp_etcd_free(e);
    etcd_stop(&p);
}

TEST(a_3_member_cluster_that_loses_a_member_serves_on_and_its_watch_loses_nothing)
{
    struct etcd_proc p;
    if (!etcd_cluster(&p, 3))
        return;
    char eps_s[3][160];
    const char *eps[3];
    for (int m = 0; m < 3; m++) {
        snprintf(eps_s[m], sizeof(eps_s[m]), "unix://%s", p.sock[m]);
        eps[m] = eps_s[m];
    }
    struct ddp_etcd *e = client(eps, 3);
    struct ddp_etcd_opts o = {.endpoints = eps, .nendpoints = 3, .timeout_ms = 5000};
    int64_t rev = 0;
    ASSERT_EQ(ddp_etcd_put(e, "c/0", "a", 1, 0), 0);
    ASSERT_EQ(ddp_etcd_list(e, "c/", on_kv, NULL, &rev), 0);
    struct ddp_etcd_watch *w;
    seen[0] = '\0';
    ASSERT_EQ(ddp_etcd_watch_start(&o, "c/", rev + 1, on_event, NULL, &w), 0);
    ASSERT_EQ(ddp_etcd_put(e, "c/1", "b", 1, 0), 0);
    expect_seen("P c/1=b;");
    /* the first member (the one both talk to) dies: the cluster keeps its quorum */
    kill(p.pid[0], SIGKILL);
    waitpid(p.pid[0], NULL, 0);
    p.pid[0] = 0;
    int r = -1;
    for (int k = 0; k < 100 && r != 0; k++) { /* a new leader may take an election */
        r = ddp_etcd_put(e, "c/2", "c", 1, 0);
        if (r != 0)
            usleep(100 * 1000);
    }
    ASSERT_EQ(r, 0);
    char *v;
    size_t vl;
    ASSERT_EQ(ddp_etcd_get(e, "c/1", &v, &vl, NULL), 0);
    ASSERT_STREQ(v, "b");
    free(v);
    /* the watch moved to another member, from the revision after the last it saw */
    expect_seen("P c/1=b;P c/2=c;");
    ddp_etcd_watch_stop(w);
    ddp_etcd_free(e);
    etcd_stop(&p);
}

/* ------------------------------------------------------------------ */
/* The store API on etcd (what workers, agents and the launcher call)  */
/* ------------------------------------------------------------------ */

static struct ddp_store *etcd_store(const char *ep, const char *prefix)
{
    struct ddp_store *s;
    struct ddp_store_etcd_opts o = {.endpoints = ep, .prefix = prefix};
    ASSERT_EQ(ddp_store_connect_etcd(&o, 10000, &s), 0);
    return s;
}

struct adder {
    const char *ep;
    int rank, n;
    struct ddp_store_value vals[4];
    int rc;
};

/* Each of 4 threads, on its own connection: 25 adds to one counter, then an all-gather. */
static void *adder_main(void *arg)
{
    struct adder *a = arg;
    struct ddp_store *s = etcd_store(a->ep, "/jobs/j1/");
    a->rc = 0;
    for (int k = 0; k < 25 && a->rc == 0; k++)
        a->rc = ddp_store_add(s, "counter", 1, NULL);
    char blob[32];
    int bl = snprintf(blob, sizeof(blob), "rank %d", a->rank);
    if (a->rc == 0)
        a->rc = ddp_store_all_gather(s, "gather", a->rank, a->n, blob, (size_t)bl, 20000, a->vals);
    ddp_store_close(s);
    return NULL;
}

TEST(the_store_api_on_etcd_keeps_its_meaning_under_a_prefix)
{
    struct etcd_proc p;
    char ep[160];
    struct ddp_etcd *e;
    if (!with_etcd(&p, ep, sizeof(ep), &e))
        return;
    struct ddp_store *s = etcd_store(ep, "/jobs/j1/");
    void *v;
    size_t vl;
    ASSERT_EQ(ddp_store_get(s, "a", &v, &vl), DDP_ENOKEY);
    ASSERT_EQ(ddp_store_set(s, "a", "one", 3), 0);
    ASSERT_EQ(ddp_store_get(s, "a", &v, &vl), 0);
    ASSERT_EQ(vl, 3u);
    ASSERT_STREQ((char *)v, "one");
    free(v);
    /* under the job's folder, beside the keys ddprun itself keeps */
    char *raw;
    ASSERT_EQ(ddp_etcd_get(e, "/jobs/j1/kv/a", &raw, &vl, NULL), 0);
    free(raw);
    /* compare-and-set: absent, then a mismatch that reports the value, then a match */
    bool swapped;
    void *cur;
    size_t cl;
    ASSERT_EQ(ddp_store_cas(s, "c", NULL, 0, "x", 1, &swapped, &cur, &cl), 0);
    ASSERT_TRUE(swapped);
    free(cur);
    ASSERT_EQ(ddp_store_cas(s, "c", "y", 1, "z", 1, &swapped, &cur, &cl), 0);
    ASSERT_TRUE(!swapped);
    ASSERT_TRUE(cur && cl == 1 && ((char *)cur)[0] == 'x');
    free(cur);
    ASSERT_EQ(ddp_store_cas(s, "c", "x", 1, "z", 1, &swapped, NULL, NULL), 0);
    ASSERT_TRUE(swapped);
    ASSERT_EQ(ddp_store_set(s, "notint", "abc", 3), 0);
    ASSERT_EQ(ddp_store_add(s, "notint", 1, NULL), DDP_ENOTINT);
    /* a wait for a key nobody sets ends at its timeout; one for keys that exist returns */
    const char *missing[] = {"gone/1"};
    int64_t t0 = ddp_now_ms();
    ASSERT_EQ(ddp_store_wait(s, missing, 1, 300), DDP_ETIMEDOUT);
    ASSERT_GE(ddp_now_ms() - t0, 300);
    /* 4 clients at once: no add is lost (each is a compare on the key's revision), and the
     * all-gather gives each every rank's blob in rank order */
    pthread_t th[4];
    struct adder ad[4];
    for (int r = 0; r < 4; r++) {
        ad[r] = (struct adder){.ep = ep, .rank = r, .n = 4};
        ASSERT_EQ(pthread_create(&th[r], NULL, adder_main, &ad[r]), 0);
    }
    for (int r = 0; r < 4; r++) {
        pthread_join(th[r], NULL);
        ASSERT_EQ(ad[r].rc, 0);
        for (int k = 0; k < 4; k++) {
            char want[24]; /* "rank " and any int */
            snprintf(want, sizeof(want), "rank %d", k);
            ASSERT_STREQ((char *)ad[r].vals[k].data, want);
        }
        ddp_store_values_free(ad[r].vals, 4);
    }
    int64_t total;
    ASSERT_EQ(ddp_store_add(s, "counter", 0, &total), 0);
    ASSERT_EQ(total, 100);
    bool deleted;
    ASSERT_EQ(ddp_store_delete(s, "a", &deleted), 0);
    ASSERT_TRUE(deleted);
    ASSERT_EQ(ddp_store_delete(s, "a", &deleted), 0);
    ASSERT_TRUE(!deleted);
    ddp_store_close(s);
    ddp_etcd_free(e);
    etcd_stop(&p);
}

TEST(store_leases_and_watches_on_etcd_see_a_lost_lease_as_a_delete)
{
    struct etcd_proc p;
    char ep[160];
    struct ddp_etcd *e;
    if (!with_etcd(&p, ep, sizeof(ep), &e))
        return;
    struct ddp_store *agent = etcd_store(ep, "/jobs/j2/"), *launcher = etcd_store(ep, "/jobs/j2/");
    uint32_t wid;
    ASSERT_EQ(ddp_store_watch(launcher, "ddprun/", true, &wid), 0);
    uint64_t lease;
    ASSERT_EQ(ddp_store_lease_grant(agent, 1500, &lease), 0); /* 2 s: whole seconds */
    ASSERT_EQ(ddp_store_set_leased(agent, "ddprun/nodes/0.1", "n0", 2, lease), 0);
    ASSERT_EQ(ddp_store_set(agent, "other/key", "x", 1), 0); /* outside the watch */
    int ttl;
    for (int k = 0; k < 5; k++) { /* kept alive past its TTL */
        usleep(500 * 1000);
        ASSERT_EQ(ddp_store_lease_keepalive(agent, lease, &ttl), 0);
        ASSERT_EQ(ttl, 2000);
    }
    struct ddp_store_event *ev;
    ASSERT_EQ(ddp_store_next_event(launcher, 2000, &ev), 0);
    ASSERT_EQ(ev->kind, DDP_STORE_EV_SET);
    ASSERT_EQ(ev->watch_id, wid);
    ASSERT_STREQ(ev->key, "ddprun/nodes/0.1");
    ASSERT_STREQ((char *)ev->value, "n0");
    ddp_store_event_free(ev);
    /* left alone, it ends within its TTL and the half second etcd's leader checks leases in */
    int64_t t0 = ddp_now_ms();
    ASSERT_EQ(ddp_store_next_event(launcher, 5000, &ev), 0);
    int64_t took = ddp_now_ms() - t0;
    ASSERT_EQ(ev->kind, DDP_STORE_EV_DELETE);
    ASSERT_STREQ(ev->key, "ddprun/nodes/0.1");
    ddp_store_event_free(ev);
    ASSERT_GE(took, 1000);
    ASSERT_EQ(ddp_store_lease_keepalive(agent, lease, &ttl), DDP_ENOLEASE);
    ASSERT_EQ(ddp_store_next_event(launcher, 300, &ev), DDP_ETIMEDOUT);
    /* interrupted: a blocked call and every later one return at once */
    ddp_store_interrupt(launcher);
    ASSERT_EQ(ddp_store_next_event(launcher, 20000, &ev), DDP_ECLOSED); /* not DDP_ETIMEDOUT */
    ASSERT_EQ(ddp_store_unwatch(launcher, wid), 0);
    ddp_store_close(agent);
    ddp_store_close(launcher);
    ddp_etcd_free(e);
    etcd_stop(&p);
}
