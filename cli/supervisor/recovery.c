/*
 * Each restart's recovery timeline (cli/supervisor/recovery.h): from the failure that caused it
 * to the new round's first collective, phase by phase, for events.jsonl, summary.json and
 * `ddprun status`.
 */
#include "cli/supervisor/recovery.h"
#include "cli/supervisor/supervisor.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static const char *const words[DDP__RCV_N] = {"old ranks stopped", "round formed", "ranks started",
                                              "process groups formed", "first collective done"};

static struct {
    struct ddp__recovery_rec *list;
    int n;
    bool open;        /* the last one is still going */
    int64_t t_detect; /* when its failure was detected (ddp_now_ms) */
} R;

/* The open one ends: its event says what it reached. */
static void close_open(void)
{
    if (!R.open)
        return;
    R.open = false;
    const struct ddp__recovery_rec *r = &R.list[R.n - 1];
    /* (the restore's fields where the round restored a checkpoint: checkpoint.replicas) */
    if (r->restored_ms < 0)
        ddp__sup_event("recovery", "cause", r->cause, "#detected_ms",
                       (long long)(r->detected_s * 1000 + 0.5), "?stopped_ms", (long long)r->ms[0],
                       "?formed_ms", (long long)r->ms[1], "?started_ms", (long long)r->ms[2],
                       "?group_formed_ms", (long long)r->ms[3], "?first_collective_ms",
                       (long long)r->ms[4], "#warm_ranks", (long long)r->warm_ranks, NULL);
    else
        ddp__sup_event("recovery", "cause", r->cause, "#detected_ms",
                       (long long)(r->detected_s * 1000 + 0.5), "?stopped_ms", (long long)r->ms[0],
                       "?formed_ms", (long long)r->ms[1], "?started_ms", (long long)r->ms[2],
                       "?group_formed_ms", (long long)r->ms[3], "?first_collective_ms",
                       (long long)r->ms[4], "#warm_ranks", (long long)r->warm_ranks, "#restored_ms",
                       (long long)r->restored_ms, "#restore_took_ms", (long long)r->restore_took_ms,
                       "#restored_bytes", (long long)r->restored_bytes, NULL);
}

void ddp__rcv_begin(const char *cause)
{
    close_open(); /* the round before failed before its first collective */
    struct ddp__recovery_rec *l = realloc(R.list, (size_t)(R.n + 1) * sizeof(*l));
    if (!l)
        return;
    R.list = l;
    struct ddp__recovery_rec *r = &R.list[R.n++];
    memset(r, 0, sizeof(*r));
    r->round = -1;
    snprintf(r->cause, sizeof(r->cause), "%.*s", (int)ddp_utf8_prefix(cause, sizeof(r->cause) - 1),
             cause);
    R.t_detect = ddp_now_ms();
    r->detected_s = (double)(R.t_detect - ddp__supervisor.t0) / 1000;
    for (int k = 0; k < DDP__RCV_N; k++)
        r->ms[k] = -1;
    r->restored_ms = r->restore_took_ms = r->restored_bytes = -1;
    R.open = true;
}

void ddp__rcv_mark_at(enum ddp__rcv_phase ph, int64_t at_ms)
{
    if (!R.open)
        return;
    struct ddp__recovery_rec *r = &R.list[R.n - 1];
    if (ph == DDP__RCV_FORMED)
        r->round = ddp__supervisor.round;
    if (r->ms[ph] < 0)
        r->ms[ph] = at_ms > R.t_detect ? at_ms - R.t_detect : 0;
    if (ph == DDP__RCV_FIRST)
        close_open();
}

void ddp__rcv_mark(enum ddp__rcv_phase ph)
{
    ddp__rcv_mark_at(ph, ddp_now_ms());
}

void ddp__rcv_end(void)
{
    close_open();
}

void ddp__rcv_restored(uint64_t bytes, int64_t took_ms)
{
    if (!R.open)
        return;
    struct ddp__recovery_rec *r = &R.list[R.n - 1];
    int64_t now = ddp_now_ms();
    r->restored_ms = now > R.t_detect ? now - R.t_detect : 0;
    r->restore_took_ms = took_ms;
    r->restored_bytes = (int64_t)bytes;
}

void ddp__rcv_warm(void)
{
    if (R.open)
        R.list[R.n - 1].warm_ranks++;
}

void ddp__rcv_startup(bool first, int64_t at_ms)
{
    ddp__rcv_mark_at(first ? DDP__RCV_FIRST : DDP__RCV_GROUP, at_ms);
}

int ddp__rcv_line(char *buf, size_t n)
{
    if (!R.n || !n)
        return 0;
    const struct ddp__recovery_rec *r = &R.list[R.n - 1];
    int len = snprintf(buf, n, "last recovery (%s at %.1f s):", r->cause, r->detected_s);
    for (int k = 0; k < DDP__RCV_N && len >= 0 && (size_t)len < n; k++) {
        if (r->ms[k] >= 0 && k == DDP__RCV_STARTED && r->warm_ranks)
            len += snprintf(buf + len, n - (size_t)len, ", %s %.2f s (%d warm)", words[k],
                            (double)r->ms[k] / 1000, r->warm_ranks);
        else if (r->ms[k] >= 0)
            len += snprintf(buf + len, n - (size_t)len, "%s %s %.2f s", k ? "," : "", words[k],
                            (double)r->ms[k] / 1000);
        else
            len += snprintf(buf + len, n - (size_t)len, "%s %s: %s", k ? "," : "", words[k],
                            R.open ? "not yet" : "never");
        if (k == DDP__RCV_FORMED && r->restored_ms >= 0 && len >= 0 && (size_t)len < n)
            len += snprintf(buf + len, n - (size_t)len,
                            ", checkpoint restored %.2f s (%.1f MB in %.2f s)",
                            (double)r->restored_ms / 1000, (double)r->restored_bytes / 1e6,
                            (double)r->restore_took_ms / 1000);
    }
    return len < 0 ? 0 : (size_t)len < n ? len : (int)n - 1;
}

const struct ddp__recovery_rec *ddp__rcv_list(int *n)
{
    *n = R.n;
    return R.list;
}
