/*
 * The end of a stop, whatever the nodes do: once members have had stop_grace and their agents
 * DDP__SUP_STOP_SLACK_MS more to report, or on a second signal, the agents left are ended
 * through their provisioners, and two seconds later whatever is left is killed.
 */
#include "cli/supervisor/supervisor.h"

#include <stddef.h>

#include "common/banned.h"

/*
 * Ends every agent process still there, through its provisioner: at level 1 a local agent
 * with its process group (its workers too), an SSH bridge with SIGTERM, on which it has the
 * remote session killed and closes. Two seconds later (level 2), whatever is left is
 * SIGKILLed.
 */
void ddp__sup_escalate(void)
{
    if (ddp__supervisor.escalation >= 2)
        return;
    ddp__supervisor.escalation++;
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++)
        ddp__nodes_end(&ddp__supervisor.nodes, (int)i, ddp__supervisor.escalation);
    if (ddp__supervisor.escalation == 1)
        ddp_timer_start(ddp__supervisor.loop, &ddp__supervisor.force, 2000);
}

static void on_stop_deadline(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    int left = 0;
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++)
        left += ddp__nodes_running(&ddp__supervisor.nodes, (int)i);
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
    ddp_timer_init(&ddp__supervisor.force, on_force);
    ddp_timer_init(&ddp__supervisor.stop_deadline, on_stop_deadline);
}
