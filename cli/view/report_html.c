/* The page of `ddprun report` (cli/view/report.h): inline CSS and SVG, the data as JSON, no
 * script and nothing fetched. */
#include "cli/view/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define W 960.0  /* a plot's width */
#define LEFT 150 /* its labels' column */
#define ROW 16   /* a rank's row */

static void esc(FILE *f, const char *s) /* HTML text and attributes */
{
    for (; *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

static void jstr(FILE *f, const char *s) /* a JSON string, safe inside a script element */
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20 || *c == '<' || *c == '>' || *c == '&')
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

static void data(const struct ddp__report *r, FILE *f)
{
    fprintf(f, "{\"job_id\": ");
    jstr(f, r->job_id);
    fprintf(f, ", \"finished\": %s, \"status\": ", r->finished ? "true" : "false");
    jstr(f, r->status);
    fprintf(f, ", \"exit_status\": %d, \"runtime_s\": %.3f, \"unread_event_lines\": %zu,\n",
            r->exit_status, r->runtime_s, r->bad_events);
    fprintf(f, " \"rounds\": [");
    for (size_t k = 0; k < r->nrounds; k++) {
        const struct ddp__rp_round *d = &r->rounds[k];
        fprintf(f,
                "%s{\"round\": %d, \"t\": %.3f, \"end_t\": %.3f, \"world_size\": %d, \"nodes\": ",
                k ? ", " : "", d->round, d->t, d->end_t, d->world);
        jstr(f, d->nodes);
        fprintf(f, ", \"group_formed_ms\": %lld, \"first_collective_ms\": %lld}", d->formed_ms,
                d->first_ms);
    }
    fprintf(f, "],\n \"node_losses\": [");
    for (size_t k = 0; k < r->nlosses; k++) {
        fprintf(f, "%s{\"t\": %.3f, \"round\": %d, \"node\": ", k ? ", " : "", r->losses[k].t,
                r->losses[k].round);
        jstr(f, r->losses[k].node);
        fprintf(f, ", \"reason\": ");
        jstr(f, r->losses[k].reason);
        fputc('}', f);
    }
    fprintf(f, "],\n \"hangs\": [");
    for (size_t k = 0; k < r->nhangs; k++) {
        const struct ddp__rp_hang *h = &r->hangs[k];
        fprintf(
            f, "%s{\"t\": %.3f, \"round\": %d, \"seq\": %lld, \"stuck_ms\": %lld, \"collective\": ",
            k ? ", " : "", h->t, h->round, h->seq, h->stuck_ms);
        jstr(f, h->what);
        fprintf(f, ", \"ranks\": ");
        jstr(f, h->ranks);
        fputc('}', f);
    }
    fprintf(f, "],\n \"recoveries\": [");
    static const char *const ph[5] = {"stopped_ms", "formed_ms", "started_ms", "group_formed_ms",
                                      "first_collective_ms"};
    for (size_t k = 0; k < r->nrecs; k++) {
        const struct ddp__rp_recovery *c = &r->recs[k];
        fprintf(f, "%s{\"t\": %.3f, \"round\": %d, \"cause\": ", k ? ", " : "", c->t, c->round);
        jstr(f, c->cause);
        fprintf(f, ", \"detected_ms\": %lld", c->detected_ms);
        for (int i = 0; i < 5; i++)
            fprintf(f, ", \"%s\": %lld", ph[i], c->ms[i]);
        fprintf(f, ", \"restored_ms\": %lld}", c->restored_ms);
    }
    fprintf(f, "],\n \"samples\": [");
    for (size_t k = 0; k < r->nsamples; k++) {
        const struct ddp__rp_sample *s = &r->samples[k];
        fprintf(f, "%s[%.3f, %d, %d, %llu, %llu, %.2f, \"%c\", %d]", k ? ", " : "", s->t, s->round,
                s->rank, (unsigned long long)s->coll, (unsigned long long)s->steps, s->cpu_s,
                s->state >= 'A' && s->state <= 'z' ? s->state : '?', s->straggler);
    }
    fprintf(f, "],\n \"ranks\": [");
    for (size_t k = 0; k < r->nranks; k++) {
        const struct ddp__rp_rank *e = &r->ranks[k];
        fprintf(f, "%s{\"rank\": %d, \"host\": ", k ? ", " : "", e->rank);
        jstr(f, e->host);
        fprintf(f, ", \"state\": ");
        jstr(f, e->state);
        fprintf(f, ", \"exit_code\": %lld, \"signal\": ", e->exit_code);
        jstr(f, e->signal);
        fprintf(f, ", \"stopped_by_ddprun\": %s, \"runtime_s\": %.3f, \"last_lines\": ",
                e->stopped ? "true" : "false", e->runtime_s);
        jstr(f, e->tail ? e->tail : "");
        fputc('}', f);
    }
    fprintf(f, "]}\n");
}

static double span(const struct ddp__report *r)
{
    double t = r->runtime_s > r->last_t ? r->runtime_s : r->last_t;
    return t > 0 ? t : 1;
}

static double x_of(const struct ddp__report *r, double t)
{
    return LEFT + (W - LEFT - 20) * (t / span(r));
}

static void axis(const struct ddp__report *r, FILE *f, double y)
{
    double s = span(r), step = pow(10, floor(log10(s)));
    if (s / step < 3)
        step /= 2;
    fprintf(f, "<line x1='%d' y1='%.0f' x2='%.0f' y2='%.0f' class='ax'/>\n", LEFT, y, W - 20, y);
    for (double t = 0; t <= s + 1e-9; t += step)
        fprintf(f, "<text x='%.1f' y='%.0f' class='tick'>%g s</text>\n", x_of(r, t), y + 14, t);
}

/* The ranks a plot has a row for: the first PLOT_RANKS (a page of a million ranks' rows would be
 * hundreds of megabytes; the data has them all). */
#define PLOT_RANKS 1024
static int plotted(const struct ddp__report *r)
{
    return r->world_max < PLOT_RANKS ? r->world_max : PLOT_RANKS;
}

static void more(const struct ddp__report *r, FILE *f, double y)
{
    if (r->world_max > PLOT_RANKS)
        fprintf(f, "<text x='4' y='%.0f' class='lbl'>(and %d more ranks, in the data)</text>\n", y,
                r->world_max - PLOT_RANKS);
}

/* A vertical line at x down to bottom, and its label at height ty: pre, what, post (escaped),
 * with title as its tooltip. */
static void mark(FILE *f, double x, double bottom, int ty, const char *cls, const char *pre,
                 const char *what, const char *post, const char *title)
{
    fprintf(f, "<line x1='%.1f' y1='24' x2='%.1f' y2='%.0f' class='%s'/>", x, x, bottom, cls);
    fprintf(f, "<text x='%.1f' y='%d' class='%s'>%s", x + 3, ty, cls, pre);
    esc(f, what);
    fprintf(f, "%s<title>", post);
    esc(f, title);
    fprintf(f, "</title></text>\n");
}

/* Rows of ranks by round, node losses, hangs, and each recovery's phases above them. */
static void timeline(const struct ddp__report *r, FILE *f)
{
    int n = plotted(r);
    double top = 50, h = top + ROW * n + (r->world_max > PLOT_RANKS ? 46 : 30);
    fprintf(f,
            "<svg id='timeline' xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f'>\n",
            W, h);
    fprintf(f, "<text x='4' y='14' class='lbl'>recovery phases</text>\n");
    for (size_t k = 0; k < r->nrecs; k++) {
        const struct ddp__rp_recovery *c = &r->recs[k];
        double at = (double)c->detected_ms / 1000, prev = at;
        for (int i = 0; i < 5; i++) {
            if (c->ms[i] < 0)
                break;
            double to = at + (double)c->ms[i] / 1000;
            fprintf(f,
                    "<rect x='%.1f' y='4' width='%.1f' height='14' class='ph%d'><title>round %d: "
                    "%s %.3f s after the detection</title></rect>\n",
                    x_of(r, prev), fmax(x_of(r, to) - x_of(r, prev), 1), i, c->round,
                    (const char *[]){"old ranks stopped", "round formed", "ranks started",
                                     "process groups formed", "first collective done"}[i],
                    (double)c->ms[i] / 1000);
            prev = to;
        }
    }
    for (int i = 0; i < n; i++) {
        double y = top + ROW * i;
        fprintf(f, "<text x='4' y='%.0f' class='lbl'>rank %d</text>\n", y + 11, i);
        for (size_t k = 0; k < r->nrounds; k++) {
            const struct ddp__rp_round *d = &r->rounds[k];
            if (i >= d->world)
                continue;
            fprintf(f,
                    "<rect x='%.1f' y='%.0f' width='%.1f' height='%d' class='r%d'><title>rank %d, "
                    "round %d on %s</title></rect>\n",
                    x_of(r, d->t), y, fmax(x_of(r, d->end_t) - x_of(r, d->t), 1), ROW - 3,
                    d->round % 2, i, d->round, d->nodes);
        }
    }
    for (size_t k = 0; k < r->nlosses; k++)
        mark(f, x_of(r, r->losses[k].t), top + ROW * n, 34, "loss", "", r->losses[k].node, " lost",
             r->losses[k].reason);
    for (size_t k = 0; k < r->nhangs; k++)
        mark(f, x_of(r, r->hangs[k].t), top + ROW * n, 46, "hang", "hang: rank ", r->hangs[k].ranks,
             "", r->hangs[k].what);
    axis(r, f, top + ROW * n + 4);
    more(r, f, top + ROW * n + 28);
    fprintf(f, "</svg>\n");
}

/* Each rank's collectives per second between its samples; stragglers dashed. */
static void progress(const struct ddp__report *r, FILE *f)
{
    int n = plotted(r);
    double maxr = 0, ph = 240;
    /* the samples' indexes rank by rank, each rank's in their order: idx[at[i] .. at[i + 1]) */
    size_t *at = calloc((size_t)n + 2, sizeof(size_t)),
           *idx = calloc(r->nsamples + 1, sizeof(size_t));
    if (!at || !idx) {
        free(at);
        free(idx);
        return;
    }
    for (size_t k = 0; k < r->nsamples; k++)
        if (r->samples[k].rank < n)
            at[r->samples[k].rank + 2]++;
    for (int i = 2; i < n + 2; i++)
        at[i] += at[i - 1];
    for (size_t k = 0; k < r->nsamples; k++)
        if (r->samples[k].rank < n)
            idx[at[r->samples[k].rank + 1]++] = k;
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            fprintf(f,
                    "<svg id='progress' xmlns='http://www.w3.org/2000/svg' width='%.0f' "
                    "height='%.0f'>\n",
                    W, ph + 40 + ROW * n + (r->world_max > PLOT_RANKS ? 16 : 0));
        for (int i = 0; i < n; i++) {
            bool strag = false, open = false;
            double lx = 0, ly = 0;
            const struct ddp__rp_sample *prev = NULL;
            for (size_t x = at[i]; x < at[i + 1]; x++) {
                const struct ddp__rp_sample *s = &r->samples[idx[x]];
                strag |= s->straggler;
                if (prev && prev->round == s->round && s->t > prev->t && s->coll >= prev->coll) {
                    double rate = (double)(s->coll - prev->coll) / (s->t - prev->t);
                    if (!pass) {
                        maxr = fmax(maxr, rate);
                    } else {
                        double y = 10 + ph * (1 - rate / (maxr > 0 ? maxr : 1));
                        fprintf(f, "%s%.1f,%.1f ", open ? "" : "<polyline class='rate' points='",
                                x_of(r, (s->t + prev->t) / 2), y);
                        open = true;
                        lx = x_of(r, (s->t + prev->t) / 2);
                        ly = y;
                    }
                }
                prev = s;
            }
            /* a colour of its own per rank (hues 137.5 degrees apart), a straggler dashed */
            int hue = (int)fmod(137.5 * i, 360);
            if (pass && open)
                fprintf(f,
                        "' stroke='hsl(%d,65%%,42%%)'%s><title>rank %d</title></polyline>\n"
                        "<circle cx='%.1f' cy='%.1f' r='2.5' fill='hsl(%d,65%%,42%%)'/>"
                        "<text x='%.1f' y='%.1f' class='tick'>%d</text>\n",
                        hue, strag ? " stroke-dasharray='4 3'" : "", i, lx, ly, hue, lx + 4, ly - 3,
                        i);
            if (pass)
                fprintf(f,
                        "<rect x='4' y='%.0f' width='10' height='3' fill='hsl(%d,65%%,42%%)'/>"
                        "<text x='18' y='%.0f' class='lbl%s'>rank %d%s</text>\n",
                        ph + 40 + ROW * i + 6, hue, ph + 40 + ROW * i + 11, strag ? " strag" : "",
                        i, strag ? " (straggler: arrives last at most collectives)" : "");
        }
    }
    fprintf(f,
            "<text x='4' y='18' class='lbl'>%.1f coll/s</text><text x='4' y='%.0f' "
            "class='lbl'>0</text>\n",
            maxr, ph + 10);
    axis(r, f, ph + 14);
    more(r, f, ph + 40 + ROW * n + 11);
    fprintf(f, "</svg>\n");
    free(at);
    free(idx);
}

/* Each round: its ranks started, their process groups formed, their first collective done. */
static void startup(const struct ddp__report *r, FILE *f)
{
    long long most = 1;
    for (size_t k = 0; k < r->nrounds; k++)
        most = r->rounds[k].first_ms > most ? r->rounds[k].first_ms : most;
    fprintf(f, "<svg id='startup' xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f'>\n",
            W, 30.0 + 20 * (double)r->nrounds);
    for (size_t k = 0; k < r->nrounds; k++) {
        const struct ddp__rp_round *d = &r->rounds[k];
        double y = 10 + 20 * (double)k, scale = (W - LEFT - 20) / (double)most;
        fprintf(f, "<text x='4' y='%.0f' class='lbl'>round %d: ranks 0-%d</text>\n", y + 11,
                d->round, d->world - 1);
        if (d->formed_ms >= 0)
            fprintf(f,
                    "<rect x='%d' y='%.0f' width='%.1f' height='14' class='ph3'><title>process "
                    "groups formed %lld ms after the start</title></rect>\n",
                    LEFT, y, fmax(scale * (double)d->formed_ms, 1), d->formed_ms);
        if (d->first_ms >= 0 && d->formed_ms >= 0)
            fprintf(f,
                    "<rect x='%.1f' y='%.0f' width='%.1f' height='14' class='ph4'><title>first "
                    "collective done %lld ms after the start</title></rect>\n",
                    LEFT + scale * (double)d->formed_ms, y,
                    fmax(scale * (double)(d->first_ms - d->formed_ms), 1), d->first_ms);
        fprintf(f, "<text x='%.0f' y='%.0f' class='tick'>%s</text>\n", W - 140, y + 11,
                d->first_ms >= 0 ? "" : "(not reached)");
    }
    fprintf(f,
            "<text x='%d' y='%.0f' class='tick'>0 to %lld ms after the ranks were started</text>\n",
            LEFT, 24 + 20 * (double)r->nrounds, most);
    fprintf(f, "</svg>\n");
}

static void exits(const struct ddp__report *r, FILE *f)
{
    if (!r->nranks) {
        fprintf(f, "<p>No summary.json yet: the job runs, or ended without one.</p>\n");
        return;
    }
    fprintf(f, "<table><tr><th>rank</th><th>node</th><th>state</th><th>exit</th><th>runtime</"
               "th><th>last lines</th></tr>\n");
    for (size_t k = 0; k < r->nranks; k++) {
        const struct ddp__rp_rank *e = &r->ranks[k];
        fprintf(f, "<tr%s><td>rank %d</td><td>", e->tail ? " class='failed'" : "", e->rank);
        esc(f, e->host);
        fprintf(f, "</td><td>");
        esc(f, e->state);
        fprintf(f, "%s</td><td>", e->stopped ? " (stopped by ddprun)" : "");
        if (e->signal[0])
            esc(f, e->signal);
        else if (e->exit_code >= 0)
            fprintf(f, "%lld", e->exit_code);
        fprintf(f, "</td><td>%.1f s</td><td><pre>", e->runtime_s);
        esc(f, e->tail ? e->tail : "");
        fprintf(f, "</pre></td></tr>\n");
    }
    fprintf(f, "</table>\n");
}

int ddp__report_html(const struct ddp__report *r, FILE *f)
{
    fprintf(f, "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>\n<title>ddprun job ");
    esc(f, r->job_id);
    fprintf(
        f,
        "</title>\n<style>\n"
        "body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}\n"
        "h2{font-size:16px;margin-top:28px}svg{display:block;border:1px solid #ddd;margin:6px 0}\n"
        ".lbl{font:11px monospace;fill:#333}.strag{fill:#c0392b}.tick{font:10px "
        "monospace;fill:#777}\n"
        ".ax{stroke:#999}.r0{fill:#4a90d9}.r1{fill:#6cb36c}.loss{stroke:#c0392b;fill:#c0392b;font:"
        "11px monospace}\n"
        ".hang{stroke:#e67e22;fill:#e67e22;font:11px "
        "monospace}.rate{fill:none;stroke-width:1.5}\n"
        ".ph0{fill:#bbb}.ph1{fill:#999}.ph2{fill:#777}.ph3{fill:#a97}.ph4{fill:#6a4}\n"
        "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px "
        "8px;text-align:left;vertical-align:top}\n"
        "tr.failed{background:#fdecea}pre{margin:0;font:11px monospace;white-space:pre-wrap}\n"
        "</style></head><body>\n<h1>ddprun job ");
    esc(f, r->job_id);
    fprintf(f, "</h1>\n<p>");
    esc(f, r->status);
    if (r->finished)
        fprintf(f, " (exit status %d) after %.1f s", r->exit_status, r->runtime_s);
    else
        fprintf(f, "; its last event at %.1f s", r->last_t);
    fprintf(f, "; %zu round%s, %zu node%s lost, %zu hang%s.", r->nrounds,
            r->nrounds == 1 ? "" : "s", r->nlosses, r->nlosses == 1 ? "" : "s", r->nhangs,
            r->nhangs == 1 ? "" : "s");
    if (r->reason[0]) {
        fprintf(f, " ");
        esc(f, r->reason);
    }
    fprintf(f, "</p>\n");
    if (r->bad_events || r->bad_samples || r->bad_summary)
        fprintf(f,
                "<p class='warn'>A partial report: %zu line%s of events.jsonl and %zu of "
                "progress.tsv could not be read%s.</p>\n",
                r->bad_events, r->bad_events == 1 ? "" : "s", r->bad_samples,
                r->bad_summary ? "; summary.json could not be read" : "");
    fprintf(f, "<h2>Timeline: rounds, node losses, hangs, recoveries</h2>\n");
    timeline(r, f);
    fprintf(f, "<h2>Progress: each rank's collectives per second</h2>\n");
    progress(r, f);
    fprintf(f, "<h2>Startup of each round</h2>\n");
    startup(r, f);
    fprintf(f, "<h2>How each rank ended</h2>\n");
    exits(r, f);
    fprintf(f, "<script type='application/json' id='ddprun-data'>\n");
    data(r, f);
    fprintf(f, "</script>\n</body></html>\n");
    return ferror(f) ? -1 : 0;
}
