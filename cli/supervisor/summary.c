/* The job's summary for every view (cli/supervisor/supervisor.h, ddp__sup_summarize). */
#include "cli/supervisor/recovery.h"
#include "cli/supervisor/supervisor.h"
#include "cli/supervisor/watchdog.h"
#include "cli/sys/sys.h"
#include "common/util.h"

#include <stdlib.h>

#include "common/banned.h"

/* Every view gets the summary: the console's table, summary.json and ddprun.log. */
void ddp__sup_summarize(int rc)
{
    struct ddp__rank_rec *rr = calloc((size_t)ddp__supervisor.world + 1, sizeof(*rr));
    struct ddp__loss_rec *lr = calloc((size_t)ddp__supervisor.nlosses + 1, sizeof(*lr));
    if (!rr || !lr) {
        free(rr);
        free(lr);
        return;
    }
    for (int i = 0; i < ddp__supervisor.world; i++) {
        const struct ddp__sup_rank *r = &ddp__supervisor.rk[i];
        rr[i] = (struct ddp__rank_rec){.rank = i,
                                       .local = r->local,
                                       .host = ddp__supervisor.job->nodes[r->node].host,
                                       .log = ddp__rec_rank_log(&ddp__supervisor.rec, i),
                                       .out = ddp__sup_outcome(i),
                                       .started = r->started,
                                       .error = r->error,
                                       .traceback = r->traceback,
                                       .runtime_s = (double)r->runtime_ms / 1000};
    }
    for (int k = 0; k < ddp__supervisor.nlosses; k++)
        lr[k] = (struct ddp__loss_rec){
            .host = ddp__supervisor.job->nodes[ddp__supervisor.losses[k].node].host,
            .when = ddp__supervisor.losses[k].when,
            .why = ddp__supervisor.losses[k].why,
            .t = (double)ddp__supervisor.losses[k].t_ms / 1000,
            .round = ddp__supervisor.losses[k].round};
    const struct ddp__sup_rank *ff =
        ddp__supervisor.first_fail >= 0 ? &ddp__supervisor.rk[ddp__supervisor.first_fail] : NULL;
    struct ddp__summary sm = {
        .job_id = ddp__supervisor.job_id,
        .exit_status = rc,
        .reason = rc ? ddp__supervisor.fatal : NULL,
        .explain = ddp__supervisor.fatal && rc != DDP_EXIT_OK && rc != DDP_EXIT_INTERRUPTED &&
                   (ddp__supervisor.job->max_restarts > 0 || ddp__supervisor.nlosses > 0),
        .runtime_s = (double)(ddp_now_ms() - ddp__supervisor.t0) / 1000,
        .world = ddp__supervisor.world,
        .nodes = ddp__supervisor.nmembers,
        .restarts = ddp__supervisor.round,
        .first_fail = ddp__supervisor.first_fail,
        .ranks = rr,
        .losses = lr,
        .nlosses = ddp__supervisor.nlosses,
        .tail = ff ? ff->tail : NULL,
        .ntail = ff ? ff->ntail : 0};
    ddp__wd_startup(&sm.startup_round, &sm.formed_s, &sm.first_s);
    ddp__sup_store_counts(&sm.store_conns, &sm.store_requests);
    sm.recoveries = ddp__rcv_list(&sm.nrecoveries);
    /* The records first: what could not be written whole goes into summary.json, and the
     * other views' last line says it, summary.json's own failure included. */
    char incomplete[1024];
    sm.records_incomplete = incomplete;
    for (int pass = 0; pass < 2; pass++)
        for (int v = 0; v < ddp__supervisor.nviews; v++)
            if (ddp__supervisor.views[v].ops->summary &&
                (ddp__supervisor.views[v].self == &ddp__supervisor.rec) == (pass == 0)) {
                ddp__rec_incomplete(&ddp__supervisor.rec, incomplete, sizeof(incomplete));
                ddp__supervisor.views[v].ops->summary(ddp__supervisor.views[v].self, &sm);
            }
    free(rr);
    free(lr);
}
