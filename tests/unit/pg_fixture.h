/* The process-group tests' fixture (test_pg.c, test_pg_pieces.c): a store served by a thread of
 * the test, and groups formed by threads of it, one per rank. */
#ifndef DDP_TESTS_UNIT_PG_FIXTURE_H
#define DDP_TESTS_UNIT_PG_FIXTURE_H

#include "rendezvous/store.h"
#include "tests/unit/test.h"
#include "worker/pg.h"

#include <pthread.h>
#include <string.h>

#define TOKEN "pg-unit-token"

__attribute__((unused)) static struct ddp_store_server *srv;
__attribute__((unused)) static pthread_t srv_th;
__attribute__((unused)) static int port;

__attribute__((unused)) static void *serve(void *a)
{
    (void)a;
    ddp_store_server_run(srv);
    return NULL;
}

/* The groups' store, served by a thread of this process. */
__attribute__((unused)) static void store_up(void)
{
    struct ddp_store_server_opts so = {
        .host = "127.0.0.1", .token = TOKEN, .token_len = strlen(TOKEN)};
    ASSERT_OK(ddp_store_server_new(&so, &srv));
    port = ddp_store_server_port(srv);
    pthread_create(&srv_th, NULL, serve, NULL);
}

__attribute__((unused)) static void store_down(void)
{
    ddp_store_server_stop(srv);
    pthread_join(srv_th, NULL);
    ddp_store_server_free(srv);
}

/* A thread rank's group (ranks numbered node by node, local_world per node), over its own
 * store connection; NULL, with nothing left open, on failure. */
__attribute__((unused)) static struct ddp_pg *join(const char *name, int rank, int world,
                                                   int local_world, struct ddp_store **s)
{
    struct ddp_pg *pg;
    if (ddp_store_connect("127.0.0.1", port, TOKEN, strlen(TOKEN), 5000, s) != 0)
        return NULL;
    struct ddp_pg_opts o = {.timeout_ms = 20000, .name = name};
    if (ddp_pg_init(*s, rank, world, rank % local_world, local_world, rank / local_world, &o,
                    &pg) != 0) {
        ddp_store_close(*s);
        return NULL;
    }
    return pg;
}

#endif
