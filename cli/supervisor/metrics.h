/*
 * Prometheus metrics (metrics.listen, --metrics): the launcher serves /metrics in Prometheus'
 * text exposition format while the job runs (cli/sys/http_serve.h: read-only, loopback peers or
 * metrics.allow). The ranks' series come from the model `ddprun status` shows
 * (cli/supervisor/watchdog.h, cli/diag/metrics.h); the nodes' and the job's from the
 * supervisor's own state. Every series has the label job_id; no command line, environment or
 * output line is in them.
 */
#ifndef DDP_CLI_SUPERVISOR_METRICS_H
#define DDP_CLI_SUPERVISOR_METRICS_H

#include "common/buf.h"

/* Opens the port where the job asks for it; says where (and records the event "metrics").
 * 0, or -1 after an error naming the address. */
int ddp__met_start(void);
void ddp__met_stop(void);
/* "metrics: http://HOST:PORT/metrics" for `ddprun status` (no newline); 0 when off. */
int ddp__met_line(char *buf, size_t n);
/* The whole exposition, as /metrics serves it. */
void ddp__met_render(struct ddp_buf *out);

#endif
