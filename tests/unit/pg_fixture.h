/* The process-group tests' fixture (test_pg.c, test_pg_pieces.c): the store of
 * tests/unit/store_fixture.h (start_server, stop_server), and groups formed by threads of the
 * test, one per rank. */
#ifndef DDP_TESTS_UNIT_PG_FIXTURE_H
#define DDP_TESTS_UNIT_PG_FIXTURE_H

#include "tests/unit/store_fixture.h"
#include "worker/pg.h"

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
