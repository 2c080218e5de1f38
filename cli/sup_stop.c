/*
 * The end of a stop, whatever the nodes do: once members have had stop_grace and their agents
 * DDP__SUP_STOP_SLACK_MS more to report, or on a second signal, the agents left are ended
 * through their provisioners, and two seconds later whatever is left is killed.
 */
#include "cli/supervisor.h"

#include <stddef.h>

#include "common/banned.h"

#define L ddp__S

/*
 * Ends every agent process still there, through its provisioner: at level 1 a local agent
 * with its process group (its workers too), an SSH bridge with SIGTERM, on which it has the
 * remote session killed and closes. Two seconds later (level 2), whatever is left is
 * SIGKILLed.
 */
void ddp__sup_escalate(void)
{
    if (L.escalation >= 2)
        return;
    L.escalation++;
    for (size_t i = 0; i < L.job->nnodes; i++)
        ddp__nodes_end(&L.nodes, (int)i, L.escalation);
    if (L.escalation == 1)
        ddp_timer_start(L.loop, &L.force, 2000);
}

static void on_stop_deadline(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    int left = 0;
    for (size_t i = 0; i < L.job->nnodes; i++)
        left += ddp__nodes_pid(&L.nodes, (int)i) > 0;
    if (!left)
        return;
    ddp__sup_say("ddprun: %d node agent%s did not stop within stop_grace + %d s; ending them", left,
                 left == 1 ? "" : "s", DDP__SUP_STOP_SLACK_MS / 1000);
    ddp__sup_escalate();
}

static void on_force(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    ddp__sup_escalate();
}

void ddp__sup_stop_timers_init(void)
{
    ddp_timer_init(&L.force, on_force);
    ddp_timer_init(&L.stop_deadline, on_stop_deadline);
}
