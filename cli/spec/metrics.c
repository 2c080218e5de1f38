/* The job's metrics section: metrics.listen and metrics.allow (cli/spec/values.h). */
#include "cli/spec/job.h"
#include "cli/spec/keys.h"
#include "cli/spec/values.h"
#include "cli/sys/cidr.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

int ddp__job_metrics(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j)
{
    if (n->type != DDP_Y_MAP) {
        ddp__jv_err(c, n, "%s must be a mapping with %s (HOST:PORT) and %s", DDP_KEY(METRICS),
                    ddp__key_name(DDP_K_METRICS_LISTEN), ddp__key_name(DDP_K_METRICS_ALLOW));
        return -1;
    }
    if (ddp__key_check(c, n, DDP_K_METRICS) < 0 ||
        ddp__key_read_section(c, n, DDP_K_METRICS, j) < 0)
        return -1;
    const struct ddp_ynode *al = ddp__key_get(n, DDP_K_METRICS_ALLOW), *ln;
    if (al) {
        if (al->type != DDP_Y_SEQ) {
            ddp__jv_err(c, al, "%s must be a list of addresses or ranges (10.0.0.0/8, ::1)",
                        DDP_KEY(METRICS_ALLOW));
            return -1;
        }
        if (!(j->metrics_allow = calloc(al->n + 1, sizeof(*j->metrics_allow))))
            return -1;
        for (size_t i = 0; i < al->n; i++) {
            if (ddp__jv_scalar(c, al->kids[i], DDP_KEY(METRICS_ALLOW)) < 0)
                return -1;
            if (ddp__cidr_parse(al->kids[i]->str, &j->metrics_allow[i]) < 0) {
                ddp__jv_err(c, al->kids[i],
                            "%s: '%s' is not a numeric address or range (10.0.0.0/8, fd00::/8)",
                            DDP_KEY(METRICS_ALLOW), al->kids[i]->str);
                return -1;
            }
            j->nmetrics_allow = (int)i + 1;
        }
    }
    if (!j->metrics_listen) {
        if (al) {
            ddp__jv_err(c, al, "%s needs %s", DDP_KEY(METRICS_ALLOW), DDP_KEY(METRICS_LISTEN));
            return -1;
        }
        return 0;
    }
    ln = ddp__key_get(n, DDP_K_METRICS_LISTEN);
    char host[256];
    int port;
    if (ddp_parse_hostport(j->metrics_listen, host, sizeof(host), &port) < 0 || !host[0] ||
        port < 0 || port > 65535) {
        ddp__jv_err(c, ln ? ln : n,
                    "%s must be HOST:PORT (127.0.0.1:9400; port 0 picks a free one), got '%s'",
                    DDP_KEY(METRICS_LISTEN), j->metrics_listen);
        return -1;
    }
    if (!ddp__host_is_loopback(host) && !j->nmetrics_allow) {
        ddp__jv_err(c, ln ? ln : n,
                    "%s: %s is not a loopback address; say who may read the metrics with %s: "
                    "[ADDRESS or RANGE, ...]",
                    DDP_KEY(METRICS_LISTEN), host, DDP_KEY(METRICS_ALLOW));
        return -1;
    }
    return 0;
}
