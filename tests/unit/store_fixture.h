/* The store tests' fixture (test_store.c, test_store_server.c): a real server on a loopback
 * port in a thread of the test, clients of it, and its statistics polled until they settle. */
#ifndef DDP_TESTS_UNIT_STORE_FIXTURE_H
#define DDP_TESTS_UNIT_STORE_FIXTURE_H

#include "common/util.h"
#include "rendezvous/store.h"
#include "tests/unit/test.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define TOKEN "unit-test-token-0123456789"

__attribute__((unused)) static struct ddp_store_server *srv;
__attribute__((unused)) static pthread_t srv_thread;
__attribute__((unused)) static int port;

__attribute__((unused)) static void *serve(void *a)
{
    (void)a;
    ddp_store_server_run(srv);
    return NULL;
}

__attribute__((unused)) static size_t opt_max_outbuf;
__attribute__((unused)) static void (*opt_orphaned)(void *arg, uint64_t lease);

__attribute__((unused)) static void start_server_opts(unsigned max_conns, int auth_timeout_ms)
{
    struct ddp_store_server_opts o = {.host = "127.0.0.1",
                                      .token = TOKEN,
                                      .token_len = strlen(TOKEN),
                                      .max_conns = max_conns,
                                      .auth_timeout_ms = auth_timeout_ms,
                                      .max_outbuf = opt_max_outbuf,
                                      .lease_orphaned = opt_orphaned};
    ASSERT_OK(ddp_store_server_new(&o, &srv));
    port = ddp_store_server_port(srv);
    ASSERT_TRUE(port > 0);
    ASSERT_EQ(pthread_create(&srv_thread, NULL, serve, NULL), 0);
}

__attribute__((unused)) static void start_server(void)
{
    start_server_opts(0, 0);
}

__attribute__((unused)) static void stop_server(void)
{
    ddp_store_server_stop(srv);
    pthread_join(srv_thread, NULL);
    ddp_store_server_free(srv);
    srv = NULL;
}

__attribute__((unused)) static struct ddp_store *client(void)
{
    struct ddp_store *s;
    ASSERT_OK(ddp_store_connect("127.0.0.1", port, TOKEN, strlen(TOKEN), 5000, &s));
    return s;
}

/* Server stats are read without a lock; poll until the loop thread settles. */
__attribute__((unused)) static void
wait_stat(uint64_t (*get)(const struct ddp_store_server_stats *), uint64_t want)
{
    struct ddp_store_server_stats st;
    for (int i = 0; i < 300; i++) {
        ddp_store_server_get_stats(srv, &st);
        if (get(&st) == want)
            return;
        usleep(10000);
    }
    ddp_store_server_get_stats(srv, &st);
    FAIL_AT("server stat stayed at %llu, wanted %llu", (unsigned long long)get(&st),
            (unsigned long long)want);
}
__attribute__((unused)) static uint64_t st_waiters(const struct ddp_store_server_stats *s)
{
    return s->waiters;
}
__attribute__((unused)) static uint64_t st_open(const struct ddp_store_server_stats *s)
{
    return s->conns_open;
}
__attribute__((unused)) static uint64_t st_dropped(const struct ddp_store_server_stats *s)
{
    return s->conns_dropped;
}
__attribute__((unused)) static uint64_t st_refused(const struct ddp_store_server_stats *s)
{
    return s->conns_refused_auth;
}

#endif
