/*
 * The ranks' progress in Prometheus' text exposition format (cli/diag/metrics.c), from the same
 * model as `ddprun status` (cli/diag/diagnose.h), and the format's small helpers that the
 * launcher's own series use (cli/supervisor/metrics.c). Names follow Prometheus' conventions:
 * the ddprun_ prefix, base units (seconds, ratios), _total for counters.
 */
#ifndef DDP_CLI_DIAG_METRICS_H
#define DDP_CLI_DIAG_METRICS_H

#include "cli/diag/diagnose.h"
#include "common/buf.h"

#include <stdint.h>

/* "# HELP name help" and "# TYPE name type" lines. */
void ddp__prom_family(struct ddp_buf *out, const char *name, const char *type, const char *help);
/* A label value, escaped as the format wants (\\, \", \n), appended to out. */
void ddp__prom_escape(struct ddp_buf *out, const char *v);
/* One sample: name{labels} value (labels "" for none; written as given). */
void ddp__prom_sample(struct ddp_buf *out, const char *name, const char *labels, double v);

/* Every rank's series: labels job_id, node and rank (each value escaped). */
void ddp__diag_metrics(const struct ddp__diag *d, int64_t now_ms, const char *const *node_names,
                       const char *job_id, struct ddp_buf *out);

#endif
