/* Reading a job's log folder for `ddprun report` (cli/view/report.h). */
#include "cli/view/report.h"
#include "common/json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define TAIL_LINES 10
#define TAIL_BYTES 4096
#define MAX_ITEMS 1000000 /* of each kind: a folder edited to hold more is cut there */

/* Appends a zeroed element to *arr (of *n, elements of size sz); NULL when out of memory. */
static void *grow(void *arr, size_t *n, size_t sz)
{
    void **a = arr;
    if (*n >= MAX_ITEMS)
        return NULL;
    if ((*n & (*n - 1)) == 0 || *n == 0) { /* at 0, 1, 2, 4, ...: double */
        void *m = realloc(*a, (*n ? 2 * *n : 1) * sz);
        if (!m)
            return NULL;
        *a = m;
    }
    char *e = (char *)*a + *n * sz;
    memset(e, 0, sz);
    (*n)++;
    return e;
}

static double num(const struct ddp_json *j, int obj, const char *key, double dflt)
{
    int t = ddp_json_get(j, obj, key);
    if (t < 0 || j->tok[t].type != DDP_J_NUMBER)
        return dflt;
    char b[64];
    size_t len = j->tok[t].end - j->tok[t].start;
    if (len >= sizeof(b))
        return dflt;
    memcpy(b, j->text + j->tok[t].start, len);
    b[len] = '\0';
    return strtod(b, NULL);
}

/* A whole number within [lo, hi], else dflt (no conversion out of range). */
static long long inum(const struct ddp_json *j, int obj, const char *key, long long lo,
                      long long hi, long long dflt)
{
    double v = num(j, obj, key, NAN);
    return v == v && v >= (double)lo && v <= (double)hi ? (long long)v : dflt;
}

static void str(const struct ddp_json *j, int obj, const char *key, char *out, size_t n)
{
    int t = ddp_json_get(j, obj, key);
    if (t < 0 || ddp_json_str(j, t, out, n) < 0)
        out[0] = '\0';
}

static struct ddp__rp_round *round_of(struct ddp__report *r, int round)
{
    for (size_t k = r->nrounds; k-- > 0;)
        if (r->rounds[k].round == round)
            return &r->rounds[k];
    return NULL;
}

static void track_ranks(struct ddp__report *r, int n)
{
    if (n > r->world_max && n < (1 << 24))
        r->world_max = n;
}

/* One line of events.jsonl: false when it is not one. */
static bool event(struct ddp__report *r, const char *line, size_t len)
{
    struct ddp_json j;
    if (ddp_json_parse(line, len, &j) < 0)
        return false;
    char ev[64];
    bool ok = j.tok[0].type == DDP_J_OBJECT;
    str(&j, 0, "event", ev, sizeof(ev));
    double t = num(&j, 0, "t", -1);
    int round = (int)inum(&j, 0, "round", 0, 1 << 30, 0);
    if (!ok || !ev[0] || !(t >= 0 && t < 1e9)) {
        ddp_json_free(&j);
        return false;
    }
    int world = (int)inum(&j, 0, "world_size", 0, 1 << 24, -1);
    if (strcmp(ev, "membership") == 0 && world < 0) { /* (a round of no size it could have) */
        ddp_json_free(&j);
        return false;
    }
    if (t > r->last_t)
        r->last_t = t;
    struct ddp__rp_round *rd;
    if (strcmp(ev, "job_start") == 0) {
        str(&j, 0, "job_id", r->job_id, sizeof(r->job_id));
    } else if (strcmp(ev, "membership") == 0 && (rd = grow(&r->rounds, &r->nrounds, sizeof(*rd)))) {
        rd->round = round;
        rd->world = world;
        rd->t = rd->end_t = t;
        rd->formed_ms = rd->first_ms = -1;
        str(&j, 0, "nodes", rd->nodes, sizeof(rd->nodes));
        track_ranks(r, rd->world);
    } else if (strcmp(ev, "workers_running") == 0 && (rd = round_of(r, round))) {
        rd->t = t;
    } else if (strcmp(ev, "group_formed") == 0 && (rd = round_of(r, round))) {
        rd->formed_ms = inum(&j, 0, "after_start_ms", 0, 1LL << 50, -1);
    } else if (strcmp(ev, "first_collective") == 0 && (rd = round_of(r, round))) {
        rd->first_ms = inum(&j, 0, "after_start_ms", 0, 1LL << 50, -1);
    } else if (strcmp(ev, "node_lost") == 0) {
        struct ddp__rp_loss *l = grow(&r->losses, &r->nlosses, sizeof(*l));
        if (l) {
            l->t = t;
            l->round = round;
            str(&j, 0, "node", l->node, sizeof(l->node));
            str(&j, 0, "reason", l->reason, sizeof(l->reason));
        }
    } else if (strcmp(ev, "hang") == 0) {
        struct ddp__rp_hang *h = grow(&r->hangs, &r->nhangs, sizeof(*h));
        if (h) {
            h->t = t;
            h->round = round;
            h->seq = inum(&j, 0, "seq", 0, 1LL << 62, 0);
            h->stuck_ms = inum(&j, 0, "stuck_ms", 0, 1LL << 50, 0);
            str(&j, 0, "collective", h->what, sizeof(h->what));
            str(&j, 0, "ranks", h->ranks, sizeof(h->ranks));
        }
    } else if (strcmp(ev, "recovery") == 0) {
        struct ddp__rp_recovery *c = grow(&r->recs, &r->nrecs, sizeof(*c));
        static const char *const k[5] = {"stopped_ms", "formed_ms", "started_ms", "group_formed_ms",
                                         "first_collective_ms"};
        if (c) {
            c->t = t;
            c->round = round;
            str(&j, 0, "cause", c->cause, sizeof(c->cause));
            c->detected_ms = inum(&j, 0, "detected_ms", 0, 1LL << 50, -1);
            for (int i = 0; i < 5; i++)
                c->ms[i] = inum(&j, 0, k[i], 0, 1LL << 50, -1);
            c->restored_ms = inum(&j, 0, "restored_ms", 0, 1LL << 50, -1);
        }
    }
    ddp_json_free(&j);
    return true;
}

/* progress.tsv: "t round rank node collectives steps cpu_s state straggler". */
static void samples(struct ddp__report *r)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/progress.tsv", r->dir);
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#')
            continue;
        struct ddp__rp_sample s = {0};
        char node[256], state[4];
        unsigned long long coll, steps;
        int strag;
        if (sscanf(line, "%lf\t%d\t%d\t%255s\t%llu\t%llu\t%lf\t%3s\t%d", &s.t, &s.round, &s.rank,
                   node, &coll, &steps, &s.cpu_s, state, &strag) != 9 ||
            s.rank < 0 || s.rank >= (1 << 24) || !(s.t >= 0 && s.t < 1e9) ||
            !(s.cpu_s >= 0 && s.cpu_s < 1e12)) {
            r->bad_samples++;
            continue;
        }
        s.coll = coll;
        s.steps = steps;
        s.state = state[0];
        s.straggler = strag != 0;
        struct ddp__rp_sample *e = grow(&r->samples, &r->nsamples, sizeof(*e));
        if (!e)
            break;
        *e = s;
        track_ranks(r, s.rank + 1);
    }
    fclose(f);
}

/* A failed rank's last lines, from its log. */
static char *tail_of(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    char buf[TAIL_BYTES + 1];
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > TAIL_BYTES ? size - TAIL_BYTES : 0;
    fseek(f, from, SEEK_SET);
    size_t n = fread(buf, 1, TAIL_BYTES, f);
    fclose(f);
    buf[n] = '\0';
    const char *end = buf + n, *p;
    if (end > buf && end[-1] == '\n')
        end--;
    int lines = 0;
    for (p = end; p > buf; p--)
        if (p[-1] == '\n' && ++lines == TAIL_LINES)
            break;
    return strdup(p);
}

static void summary(struct ddp__report *r)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/summary.json", r->dir);
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    char *text = NULL;
    size_t cap = 0, len = 0;
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0 && len < (64u << 20)) {
        char *m = realloc(text, cap = len + got + 1);
        if (!m)
            break;
        text = m;
        memcpy(text + len, chunk, got);
        len += got;
    }
    fclose(f);
    struct ddp_json j;
    bool parsed = text && ddp_json_parse(text, len, &j) == 0;
    if (!parsed || j.tok[0].type != DDP_J_OBJECT) {
        if (parsed)
            ddp_json_free(&j);
        r->bad_summary = true;
        free(text);
        return;
    }
    r->finished = true;
    str(&j, 0, "status", r->status, sizeof(r->status));
    str(&j, 0, "reason", r->reason, sizeof(r->reason));
    r->exit_status = (int)inum(&j, 0, "exit_status", 0, 255, -1);
    r->runtime_s = num(&j, 0, "runtime_s", r->last_t);
    if (!(r->runtime_s >= 0 && r->runtime_s < 1e9))
        r->runtime_s = r->last_t;
    int ranks = ddp_json_get(&j, 0, "ranks");
    for (uint32_t k = 0; ranks >= 0 && j.tok[ranks].type == DDP_J_ARRAY && k < j.tok[ranks].count;
         k++) {
        int o = ddp_json_at(&j, ranks, k);
        struct ddp__rp_rank *e = grow(&r->ranks, &r->nranks, sizeof(*e));
        if (!e)
            break;
        e->rank = (int)inum(&j, o, "rank", 0, (1 << 24) - 1, k);
        str(&j, o, "host", e->host, sizeof(e->host));
        str(&j, o, "state", e->state, sizeof(e->state));
        str(&j, o, "signal", e->signal, sizeof(e->signal));
        e->exit_code = inum(&j, o, "exit_code", 0, 255, -1);
        e->runtime_s = num(&j, o, "runtime_s", 0);
        if (!(e->runtime_s >= 0 && e->runtime_s < 1e9))
            e->runtime_s = 0;
        int sb = ddp_json_get(&j, o, "stopped_by_ddprun");
        e->stopped = sb >= 0 && ddp_json_bool(&j, sb);
        track_ranks(r, e->rank + 1);
        bool failed = strcmp(e->state, "exited") != 0 || e->exit_code != 0;
        if (failed && !e->stopped) {
            char log[4096], alt[4200];
            str(&j, o, "log", log, sizeof(log));
            snprintf(alt, sizeof(alt), "%s/rank-%d.log", r->dir, e->rank);
            if (!(e->tail = log[0] ? tail_of(log) : NULL))
                e->tail = tail_of(alt);
        }
    }
    ddp_json_free(&j);
    free(text);
}

int ddp__report_read(const char *dir, struct ddp__report *r, char *why, size_t whyn)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->dir, sizeof(r->dir), "%s", dir);
    snprintf(r->status, sizeof(r->status), "running (or ended without its summary)");
    r->exit_status = -1;
    char path[4200];
    snprintf(path, sizeof(path), "%s/events.jsonl", dir);
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(why, whyn, "%s: %s (not a ddprun job's log folder?)", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (n > (1 << 20) || !event(r, line, (size_t)n))
            r->bad_events++;
    }
    free(line);
    fclose(f);
    for (size_t k = 0; k < r->nrounds; k++) /* a round ends where the next begins */
        r->rounds[k].end_t = k + 1 < r->nrounds ? r->rounds[k + 1].t : r->last_t;
    samples(r);
    summary(r);
    if (!r->finished)
        r->runtime_s = r->last_t;
    if (!r->job_id[0]) {
        const char *b = strrchr(dir, '/');
        snprintf(r->job_id, sizeof(r->job_id), "%s", b && b[1] ? b + 1 : dir);
    }
    return 0;
}

void ddp__report_free(struct ddp__report *r)
{
    for (size_t k = 0; k < r->nranks; k++)
        free(r->ranks[k].tail);
    free(r->rounds);
    free(r->losses);
    free(r->hangs);
    free(r->recs);
    free(r->samples);
    free(r->ranks);
    memset(r, 0, sizeof(*r));
}
