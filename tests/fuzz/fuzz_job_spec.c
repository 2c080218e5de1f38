/*
 * libFuzzer target for the job-spec loader (cli/spec/ytree.c, cli/spec/load.c): arbitrary bytes as
 * a job file, with and without --set overrides. Every input must either load or be refused with an
 * error, without crashing, leaking or taking long (dev.sh runs it with a dictionary of YAML tokens,
 * tests/fuzz/job.dict, inputs up to 64 KiB and a per-input time limit).
 */
#include "cli/spec/args.h"
#include "cli/spec/job.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* The CLI's error printer: silent here, so the fuzzer runs at full speed. */
void ddp__cli_error(const char *fmt, ...)
{
    (void)fmt;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    struct ddp_job *job = NULL;
    if (ddp__job_load_string("fuzz.yaml", text, NULL, NULL, 0, &job) == 0) {
        if (!job->name || (!job->argv && !job->shell) || job->world_size < 1)
            abort();
        ddp__job_free(job);
    }
    /* The same text as a --set value exercises the override path, and below nodes the
     * expansion of the default node list. */
    static const char *const paths[] = {"env.X", "nodes.0.slots"};
    for (size_t k = 0; k < sizeof(paths) / sizeof(paths[0]); k++) {
        const char *sets[2] = {"command=[true]", NULL};
        size_t n = strlen(text) + 32;
        char *set = malloc(n);
        if (!set)
            break;
        snprintf(set, n, "%s=%s", paths[k], text);
        sets[1] = set;
        job = NULL;
        if (ddp__job_load_string("fuzz.yaml", "command: [true]\n", sets, NULL, 2, &job) == 0)
            ddp__job_free(job);
        free(set);
    }
    free(text);
    return 0;
}
