/*
 * `ddprun doctor` for a job with rendezvous: {backend: etcd} (cli/doctor/doctor.h): from this
 * machine, each endpoint answers and with which etcd version, and the job's prefix can be written,
 * read back and deleted (a probe key); the nodes then check they reach the first TCP endpoint.
 */
#include "cli/doctor/doctor.h"
#include "cli/sys/sys.h"
#include "cli/spec/job.h"
#include "rendezvous/etcd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

int ddp__doctor_etcd(const struct ddp_job *job, char *host, size_t n, int *port)
{
    int bad = 0;
    bool have_target = false;
    printf("etcd (rendezvous.backend), from this machine:\n");
    for (size_t k = 0; k < job->netcd; k++) {
        const char *ep = job->etcd_endpoints[k];
        const char *one[1] = {ep};
        struct ddp_etcd_opts o = {.endpoints = one,
                                  .nendpoints = 1,
                                  .ca_file = job->etcd_ca,
                                  .cert_file = job->etcd_cert,
                                  .key_file = job->etcd_key,
                                  .timeout_ms = 3000};
        struct ddp_etcd *e;
        char ver[64];
        if (ddp_etcd_new(&o, &e) < 0) {
            printf("  %-40s FAIL: out of memory\n", ep);
            bad++;
            continue;
        }
        if (ddp_etcd_version(e, ver, sizeof(ver)) < 0) {
            printf("  %-40s FAIL: %s\n", ep, ddp_etcd_error(e));
            bad++;
        } else {
            printf("  %-40s ok: etcd %s\n", ep, ver);
            if (!have_target && ddp__url_hostport(ep, host, n, port) == 0)
                have_target = true;
        }
        ddp_etcd_free(e);
    }
    /* The prefix: a key written, read back and deleted, through the cluster as a job uses it. */
    struct ddp_etcd_opts o = {.endpoints = (const char *const *)job->etcd_endpoints,
                              .nendpoints = job->netcd,
                              .ca_file = job->etcd_ca,
                              .cert_file = job->etcd_cert,
                              .key_file = job->etcd_key,
                              .timeout_ms = 3000};
    struct ddp_etcd *e = NULL;
    char key[600], *val = NULL;
    size_t vlen;
    snprintf(key, sizeof(key), "%sddprun-doctor-%d", job->etcd_prefix, (int)getpid());
    const char *step = "write";
    int r = ddp_etcd_new(&o, &e);
    if (r == 0 && (r = ddp_etcd_put(e, key, "ok", 2, 0)) == 0) {
        step = "read back";
        if ((r = ddp_etcd_get(e, key, &val, &vlen, NULL)) == 0 &&
            (vlen != 2 || memcmp(val, "ok", 2)))
            r = -1;
        free(val);
        step = r == 0 ? "delete" : step;
        if (r == 0)
            r = ddp_etcd_delete(e, key, false, NULL);
    }
    if (r < 0) {
        printf("  prefix %-33s FAIL: cannot %s %s: %s\n", job->etcd_prefix, step, key,
               e ? ddp_etcd_error(e) : "out of memory");
        bad++;
    } else {
        printf("  prefix %-33s ok: written, read back and deleted\n", job->etcd_prefix);
    }
    ddp_etcd_free(e);
    if (!have_target)
        host[0] = '\0';
    return bad;
}
