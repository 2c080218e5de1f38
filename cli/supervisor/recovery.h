/*
 * Each restart's recovery timeline (cli/supervisor/recovery.c). A restart begins when the
 * failure that causes it is detected (a node lost, a rank failed, a hang); its phases are marked
 * as they happen: the old ranks stopped, the next round formed, its checkpoint restored (where
 * the agents replicate it), its ranks started, their process
 * groups formed and their first collective done. It ends at that first collective, as a
 * "recovery" event with every phase's milliseconds after the detection (null where not
 * reached), or when another failure begins the next one first, or the job ends. summary.json lists
 * them all; `ddprun status` shows the last.
 */
#ifndef DDP_CLI_SUPERVISOR_RECOVERY_H
#define DDP_CLI_SUPERVISOR_RECOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/view/view.h"

enum ddp__rcv_phase {
    DDP__RCV_STOPPED,
    DDP__RCV_FORMED,
    DDP__RCV_STARTED,
    DDP__RCV_GROUP,
    DDP__RCV_FIRST,
    DDP__RCV_N
};

/* A restart because of cause (a line: what failed) begins now. */
void ddp__rcv_begin(const char *cause);
/* Phase ph of the restart in progress happened now, or at at_ms (ddp_now_ms's clock). */
void ddp__rcv_mark(enum ddp__rcv_phase ph);
void ddp__rcv_mark_at(enum ddp__rcv_phase ph, int64_t at_ms);
/* The restart's round restored its checkpoint files (cli/supervisor/ckpt.h): bytes copied, in
 * took_ms; the phase "checkpoint restored" is now. */
void ddp__rcv_restored(uint64_t bytes, int64_t took_ms);
/* A rank of the restart's round started from a warm interpreter. */
void ddp__rcv_warm(void);
/* The watchdog's startup events (struct ddp__wd_ctx's startup): groups formed, first collective. */
void ddp__rcv_startup(bool first, int64_t at_ms);
/* The job ends: a restart still going ends too (its event, with what it reached). */
void ddp__rcv_end(void);
/* The last restart's timeline as one line (no newline) into buf; its length, 0 when none. */
int ddp__rcv_line(char *buf, size_t n);
/* Every restart's, oldest first. */
const struct ddp__recovery_rec *ddp__rcv_list(int *n);

#endif
