/*
 * libFuzzer target for `ddprun report`'s reading of a log folder (cli/view/report_read.c) and its
 * page (cli/view/report_html.c): the input, cut at its first two NUL bytes, is a folder's
 * events.jsonl, progress.tsv and summary.json (a hand-edited or truncated folder); reading it
 * must give a report or an error, and writing the page must not fail, never crash.
 */
#include "cli/view/report.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

static char g_dir[64];

static void put(const char *name, const uint8_t *p, size_t n)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE *f = fopen(path, "we");
    if (!f)
        abort();
    if (n && fwrite(p, 1, n, f) != n)
        abort();
    fclose(f);
}

/* The folder goes when the fuzzer exits. */
static void cleanup(void)
{
    static const char *const names[] = {"events.jsonl", "progress.tsv", "summary.json"};
    char path[128];
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof(path), "%s/%s", g_dir, names[k]);
        unlink(path);
    }
    rmdir(g_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof(g_dir), "/tmp/ddprun-fuzz-report-XXXXXX");
        if (!mkdtemp(g_dir))
            abort();
        atexit(cleanup);
    }
    const uint8_t *a = memchr(data, 0, size),
                  *b = a ? memchr(a + 1, 0, size - (size_t)(a + 1 - data)) : NULL;
    size_t n1 = a ? (size_t)(a - data) : size;
    put("events.jsonl", data, n1);
    put("progress.tsv", a ? a + 1 : data, a ? (b ? (size_t)(b - a - 1) : size - n1 - 1) : 0);
    put("summary.json", b ? b + 1 : data, b ? size - (size_t)(b + 1 - data) : 0);
    struct ddp__report r;
    char why[512];
    if (ddp__report_read(g_dir, &r, why, sizeof(why)) == 0) {
        FILE *f = fopen("/dev/null", "we");
        if (!f || ddp__report_html(&r, f) < 0)
            abort();
        fclose(f);
        ddp__report_free(&r);
    }
    return 0;
}
