/*
 * The worker of the embedded default job (`ddprun` without a job file): each
 * rank connects to the job's store with the environment the agent gave it,
 * passes a barrier and all-gathers a line about itself; rank 0 prints them.
 * The Fashion-MNIST trainer replaces it as the default in a later issue.
 */
#include "cli/cmd/cmd.h"
#include "common/err.h"
#include "rendezvous/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

int ddp__cmd_smoke_worker(void)
{
    struct ddp_store *s = NULL;
    struct ddp_store_value *vals = NULL;
    const char *rs = getenv("RANK"), *ws = getenv("WORLD_SIZE");
    char host[128], blob[256];
    int r = -1;
    if (!rs || !ws) {
        fprintf(stderr, "ddprun smoke worker: RANK and WORLD_SIZE must be set\n");
        return 2;
    }
    int rank = atoi(rs), n = atoi(ws);
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "?");
    host[sizeof(host) - 1] = '\0';
    if ((r = ddp_store_connect_env(30000, &s)) < 0)
        goto out;
    if ((r = ddp_store_barrier(s, "smoke/start", n, 30000)) < 0)
        goto out;
    snprintf(blob, sizeof(blob), "rank %d on %s, pid %d", rank, host, (int)getpid());
    if (!(vals = calloc((size_t)n, sizeof(*vals)))) {
        r = DDP_ENOMEM;
        goto out;
    }
    if ((r = ddp_store_all_gather(s, "smoke/hello", rank, n, blob, strlen(blob), 30000, vals)) < 0)
        goto out;
    if (rank == 0) {
        printf("%d rank%s met at the store:\n", n, n == 1 ? "" : "s");
        for (int k = 0; k < n; k++)
            printf("  %s\n", (const char *)vals[k].data);
        fflush(stdout);
    }
    r = ddp_store_barrier(s, "smoke/end", n, 30000);
out:
    if (vals)
        ddp_store_values_free(vals, (size_t)n);
    free(vals);
    ddp_store_close(s);
    if (r < 0) {
        fprintf(stderr, "ddprun smoke worker rank %d: %s\n", rank, ddp_strerror(r));
        return 1;
    }
    return 0;
}
