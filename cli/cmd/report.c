/* `ddprun report JOB [-o FILE]` (cli/view/report.h). */
#include "cli/cmd/cmd.h"
#include "cli/spec/args.h"
#include "cli/sys/sys.h"
#include "cli/view/report.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

int ddp__cmd_report(const struct ddp_cli_opts *o)
{
    if (o->npos != 1) {
        ddp__cli_error("report: which job? (ddprun report JOB [-o FILE]: its id, or its log "
                       "folder)");
        return DDP_EXIT_USAGE;
    }
    char dir[4096], id[512], why[4400], out[4200];
    if (ddp__job_logdir("report", o->pos[0], dir, sizeof(dir), id, sizeof(id)) < 0)
        return DDP_EXIT_USAGE;
    struct ddp__report r;
    if (ddp__report_read(dir, &r, why, sizeof(why)) < 0) {
        ddp__cli_error("report: %s", why);
        return DDP_EXIT_USAGE;
    }
    const char *path = o->vals[DDP_OPT_OUTPUT];
    if (!path) {
        snprintf(out, sizeof(out), "%s/report.html", dir);
        path = out;
    }
    /* written beside, then renamed: a reader never sees half a page */
    char tmp[4300];
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
    bool std_out = strcmp(path, "-") == 0;
    FILE *f = std_out ? stdout : fopen(tmp, "we");
    if (!f) {
        ddp__cli_error("report: cannot write %s: %s", path, strerror(errno));
        ddp__report_free(&r);
        return DDP_EXIT_LAUNCH;
    }
    int rc = ddp__report_html(&r, f);
    if (!std_out && (fclose(f) != 0 || rc < 0 || rename(tmp, path) != 0)) {
        ddp__cli_error("report: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        ddp__report_free(&r);
        return DDP_EXIT_LAUNCH;
    }
    if (!std_out)
        fprintf(stderr, "ddprun: report of job %s written to %s%s\n", r.job_id, path,
                r.bad_events || r.bad_samples || r.bad_summary
                    ? " (partial: some of its records could not be read)"
                    : "");
    ddp__report_free(&r);
    return DDP_EXIT_OK;
}
