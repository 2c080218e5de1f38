/* The launcher's model of the ranks' progress (cli/diag/diagnose.h). */
#include "cli/diag/diagnose.h"
#include "common/err.h"
#include "common/progress.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define RATE_WINDOW_MS 900 /* rates are taken over reports at least this far apart */
#define LISTED 8           /* ranks named one by one in a hang report */

int ddp__diag_reset(struct ddp__diag *d, int world, const int *node_of_rank)
{
    ddp__diag_release(d);
    if (!(d->r = calloc((size_t)(world > 0 ? world : 1), sizeof(*d->r))))
        return DDP_ENOMEM;
    d->world = world;
    for (int i = 0; i < world; i++)
        d->r[i].node = node_of_rank[i];
    return 0;
}

void ddp__diag_release(struct ddp__diag *d)
{
    free(d->r);
    memset(d, 0, sizeof(*d));
}

void ddp__diag_take(struct ddp__diag *d, int node, const char *report, int64_t now_ms)
{
    for (const char *l = report; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        char line[2048];
        struct ddp__rank_progress p;
        if (len < sizeof(line)) {
            memcpy(line, l, len);
            line[len] = '\0';
            if (ddp__diag_line_parse(line, &p) == 0 && p.rank < d->world &&
                d->r[p.rank].node == node) {
                struct ddp__diag_rank *r = &d->r[p.rank];
                if (p.state == 'X') { /* exited: no rates */
                    r->rated = false;
                    r->cpu_pct = r->coll_per_s = 0;
                } else if (!r->have || now_ms - r->prev_at_ms >= RATE_WINDOW_MS) {
                    if (r->have && now_ms > r->prev_at_ms) {
                        double dt = (double)(now_ms - r->prev_at_ms) / 1000;
                        r->coll_per_s = (double)(p.completed - r->prev_completed) / dt;
                        r->cpu_pct = (p.cpu_s - r->prev_cpu_s) / dt * 100;
                        r->rated = true;
                    }
                    r->prev_at_ms = now_ms;
                    r->prev_completed = p.completed;
                    r->prev_cpu_s = p.cpu_s;
                }
                r->p = p;
                r->at_ms = now_ms;
                r->have = true;
            }
        }
        l = nl ? nl + 1 : NULL;
    }
}

static void add(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add(char *buf, size_t n, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

static const char *node_of(const struct ddp__diag *d, const char *const *names, int rank)
{
    return names ? names[d->r[rank].node] : "?";
}

static bool counted(const struct ddp__diag_rank *r)
{
    return r->have && r->p.rec;
}

/* A DDP step (cli/diag/torch_rec.py) is a rank's own work (forward, backward and the gradient
 * all-reduces torch runs inside it), not a collective the rank waits in: a rank in one has done
 * what it entered, and waits, if at all, for peers to enter its step. */
static bool in_step(const struct ddp__rank_progress *p)
{
    return p->in_coll && (p->op == DDP_PROG_DDP_STEP || p->op == DDP_PROG_DDP_FORWARD);
}

static uint64_t done_of(const struct ddp__rank_progress *p)
{
    return in_step(p) ? p->entered : p->completed;
}

/* The rank's operation at seq when it is in it now, else -1. */
static int op_at(const struct ddp__rank_progress *p, uint64_t seq)
{
    return p->in_coll && p->completed + 1 == seq ? p->op : -1;
}

/* Who did what, for a stuck point: the same only while no rank's counters move. */
static uint64_t signature(const struct ddp__diag *d)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < d->world; i++)
        if (counted(&d->r[i]))
            h = (h ^ (d->r[i].p.entered * 31 + d->r[i].p.completed)) * 1099511628211ull;
    return h;
}

/* How long ago (ms, now) the rank issued the entry it is in: its report's age added. */
static int64_t entered_ago(const struct ddp__diag_rank *r, int64_t now_ms)
{
    return r->p.cur_ms + (now_ms - r->at_ms);
}

/* "sleeping in futex_wait_queue at 0% CPU (pid 4242)" */
static void rank_state(const struct ddp__diag_rank *r, char *out, size_t n)
{
    char state[96], cpu[32] = "";
    ddp__diag_state_name(state, sizeof(state), r->p.state, r->p.wchan);
    if (r->rated && r->p.state != 'X')
        snprintf(cpu, sizeof(cpu), " at %.0f%% CPU", r->cpu_pct);
    snprintf(out, n, "%s%s (pid %d)", state, cpu, r->p.pid);
}

/* The ranks are not all in the same operation at seq (a rank skipped a collective, or ran more
 * steps than the others): names each operation with its ranks, the fewest first. */
static bool mismatch(struct ddp__diag *d, uint64_t seq, int64_t now_ms, const char *const *names,
                     struct ddp__hang *h)
{
    int ops[DDP_PROG__COUNT] = {0}, kinds = 0;
    for (int i = 0; i < d->world; i++) {
        int op = counted(&d->r[i]) ? op_at(&d->r[i].p, seq) : -1;
        if (op >= 0 && op < DDP_PROG__COUNT && ops[op]++ == 0)
            kinds++;
    }
    if (kinds < 2)
        return false;
    h->mismatch = true;
    snprintf(h->what, sizeof(h->what), "different operations at #%" PRIu64 " (", seq);
    for (int op = 0, k = 0; op < DDP_PROG__COUNT; op++) {
        int one = -1;
        for (int i = 0; i < d->world && ops[op] == 1 && one < 0; i++)
            if (counted(&d->r[i]) && op_at(&d->r[i].p, seq) == op)
                one = i;
        if (one >= 0)
            add(h->what, sizeof(h->what), "%s%s: rank %d", k++ ? "; " : "",
                ddp_progress_op_name((unsigned)op), one);
        else if (ops[op])
            add(h->what, sizeof(h->what), "%s%s: %d ranks", k++ ? "; " : "",
                ddp_progress_op_name((unsigned)op), ops[op]);
    }
    add(h->what, sizeof(h->what), ")");
    add(h->text, sizeof(h->text),
        " the ranks are not in the same operation at #%" PRIu64
        " (a rank skipped a collective or ran more steps than the others)\n",
        seq);
    int listed = 0, largest = 0;
    bool tie = true;
    for (int op = 0; op < DDP_PROG__COUNT; op++)
        largest = ops[op] > ops[largest] ? op : largest;
    for (int op = 0; op < DDP_PROG__COUNT; op++)
        tie &= ops[op] == 0 || ops[op] == ops[largest];
    for (int round = 0; round < 2; round++) /* the other operations' ranks first */
        for (int i = 0; i < d->world; i++) {
            const struct ddp__diag_rank *r = &d->r[i];
            int op = counted(r) ? op_at(&r->p, seq) : -1;
            if (op < 0 || (op == largest) != (round == 1))
                continue;
            if (op != largest || tie)
                h->behind[h->nbehind++] = i;
            if (listed++ >= LISTED)
                continue;
            char what[96], it[160];
            ddp__diag_coll_name(what, sizeof(what), op, seq, r->p.bucket, r->p.bytes);
            rank_state(r, it, sizeof(it));
            add(h->text, sizeof(h->text),
                "  rank %d on %s is in %s, entered %.0f s ago; it is %s\n", i, node_of(d, names, i),
                what, (double)entered_ago(r, now_ms) / 1000, it);
        }
    if (listed > LISTED)
        add(h->text, sizeof(h->text), "  and %d more rank%s\n", listed - LISTED,
            listed - LISTED == 1 ? "" : "s");
    return true;
}

bool ddp__diag_hang(struct ddp__diag *d, int64_t now_ms, int64_t hang_after_ms,
                    const char *const *node_names, struct ddp__hang *h)
{
    memset(h, 0, sizeof(*h));
    int64_t last = INT64_MIN;
    uint64_t seq = UINT64_MAX;
    int n = 0;
    for (int i = 0; i < d->world; i++) {
        struct ddp__diag_rank *r = &d->r[i];
        if (!counted(r))
            continue;
        n++;
        int64_t t = r->at_ms - r->p.idle_ms;
        if (t > last)
            last = t;
        if (done_of(&r->p) + 1 < seq)
            seq = done_of(&r->p) + 1;
    }
    if (n == 0 || now_ms - last < hang_after_ms)
        return false;
    uint64_t sig = signature(d);
    if (d->reported && sig == d->reported_sig)
        return false; /* this stuck point was reported */
    /* The collective: as a rank that is in it describes it. */
    int64_t entered_ms = -1;
    const struct ddp__rank_progress *in = NULL;
    for (int i = 0; i < d->world; i++) {
        struct ddp__diag_rank *r = &d->r[i];
        if (counted(r) && op_at(&r->p, seq) >= 0) {
            int64_t e = entered_ago(r, now_ms);
            if (e > entered_ms) {
                entered_ms = e;
                in = &r->p;
            }
        }
    }
    if (!(h->behind = calloc((size_t)d->world, sizeof(int))))
        return false;
    d->reported = true;
    d->reported_sig = sig;
    h->seq = seq;
    h->stuck_ms = now_ms - last;
    add(h->text, sizeof(h->text),
        "ddprun: no rank has made progress for %.0f s:", (double)h->stuck_ms / 1000);
    if (mismatch(d, seq, now_ms, node_names, h))
        return true;
    if (in)
        ddp__diag_coll_name(h->what, sizeof(h->what), in->op, seq, in->bucket, in->bytes);
    else
        snprintf(h->what, sizeof(h->what), "collective #%" PRIu64, seq);
    int entered = 0, stepping = 0;
    for (int i = 0; i < d->world; i++)
        if (counted(&d->r[i])) {
            entered += d->r[i].p.entered >= seq;
            stepping += in_step(&d->r[i].p);
        }
    h->entered_by_all = entered == n;
    for (int i = 0; i < d->world; i++) {
        const struct ddp__diag_rank *r = &d->r[i];
        if (!counted(r))
            continue;
        if (entered == 0 && stepping > 0 ? in_step(&r->p) || r->p.state == 'X'
            : h->entered_by_all          ? r->p.completed < seq
                                         : r->p.entered < seq)
            h->behind[h->nbehind++] = i;
    }
    if (entered == 0 && stepping > 0)
        add(h->text, sizeof(h->text),
            " every rank finished #%" PRIu64 " or is in its DDP step (forward, backward and "
            "gradient all-reduces), and none has entered anything since\n",
            seq - 1);
    else if (entered == 0 && seq == 1) /* a PyTorch rank: init_process_group returned */
        add(h->text, sizeof(h->text),
            " every rank formed its process group and none has issued a collective since\n");
    else if (entered == 0)
        add(h->text, sizeof(h->text),
            " every rank finished #%" PRIu64 " and none has issued another collective since\n",
            seq - 1);
    else if (h->entered_by_all)
        add(h->text, sizeof(h->text), " all %d ranks entered %s %.0f s ago and none finished it\n",
            n, h->what, (double)entered_ms / 1000);
    else
        add(h->text, sizeof(h->text), "\n");
    for (int k = 0; k < h->nbehind && k < LISTED; k++) {
        int i = h->behind[k];
        const struct ddp__diag_rank *r = &d->r[i];
        char it[160];
        rank_state(r, it, sizeof(it));
        if (!h->entered_by_all && entered > 0) {
            add(h->text, sizeof(h->text),
                "  rank %d on %s has not entered %s that the other %d rank%s entered %.0f s ago; "
                "it is %s\n",
                i, node_of(d, node_names, i), h->what, entered, entered == 1 ? "" : "s",
                (double)entered_ms / 1000, it);
        } else if (in_step(&r->p)) {
            char what[96], where[80];
            ddp__diag_coll_name(what, sizeof(what), r->p.op, r->p.entered, -1, r->p.bytes);
            if (r->p.op == DDP_PROG_DDP_STEP && r->p.cur_run_ms >= 0)
                snprintf(where, sizeof(where), "its gradients ready %.0f s ago (in its all-reduce)",
                         (double)(r->p.cur_run_ms + (now_ms - r->at_ms)) / 1000);
            else
                snprintf(where, sizeof(where), "in its forward or backward");
            add(h->text, sizeof(h->text),
                "  rank %d on %s is in %s, entered %.0f s ago, %s; it is %s\n", i,
                node_of(d, node_names, i), what, (double)entered_ago(r, now_ms) / 1000, where, it);
        } else {
            add(h->text, sizeof(h->text), "  rank %d on %s is %s\n", i, node_of(d, node_names, i),
                it);
        }
    }
    if (h->nbehind > LISTED)
        add(h->text, sizeof(h->text), "  and %d more rank%s\n", h->nbehind - LISTED,
            h->nbehind - LISTED == 1 ? "" : "s");
    return true;
}

void ddp__diag_hang_release(struct ddp__hang *h)
{
    free(h->behind);
    h->behind = NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void ddp__diag_stragglers(const struct ddp__diag *d, struct ddp__straggle *out)
{
    memset(out, 0, sizeof(*out) * (size_t)d->world);
    /* The collectives every reporting rank lists: those of the rank with the fewest. */
    int ref = -1, nr = 0;
    for (int i = 0; i < d->world; i++)
        if (counted(&d->r[i]) && d->r[i].p.nwaits > 0) {
            nr++;
            if (ref < 0 || d->r[i].p.nwaits < d->r[ref].p.nwaits)
                ref = i;
        }
    if (nr < 2)
        return;
    /* Arriving last among some of the ranks is no verdict: name a straggler only once every
     * rank of the round has reported (early in a round, one node's agent reports first). */
    bool everyone = true;
    for (int i = 0; i < d->world; i++)
        everyone &= d->r[i].have;
    double *late = calloc((size_t)d->world * DDP__DIAG_WAITS, sizeof(double));
    uint32_t *dur = calloc((size_t)d->world, sizeof(uint32_t));
    int *lasts = calloc((size_t)d->world, sizeof(int));
    int seqs = 0;
    for (int k = 0; late && dur && lasts && k < d->r[ref].p.nwaits; k++) {
        uint64_t s = d->r[ref].p.wseq[k];
        bool all = true;
        uint32_t lo = UINT32_MAX, hi = 0;
        for (int i = 0; i < d->world && all; i++) {
            const struct ddp__rank_progress *p = &d->r[i].p;
            if (!counted(&d->r[i]) || p->nwaits == 0)
                continue;
            int j = 0;
            while (j < p->nwaits && p->wseq[j] != s)
                j++;
            if (j == p->nwaits) {
                all = false;
                break;
            }
            dur[i] = p->wus[j];
            lo = dur[i] < lo ? dur[i] : lo;
            hi = dur[i] > hi ? dur[i] : hi;
        }
        if (!all)
            continue;
        for (int i = 0; i < d->world; i++) {
            if (!counted(&d->r[i]) || d->r[i].p.nwaits == 0)
                continue;
            late[(size_t)i * DDP__DIAG_WAITS + (size_t)out[i].n] = (double)(hi - dur[i]) / 1000;
            out[i].n++;
            lasts[i] += dur[i] == lo;
        }
        seqs++;
    }
    for (int i = 0; late && dur && lasts && i < d->world; i++) {
        if (out[i].n == 0)
            continue;
        double *l = &late[(size_t)i * DDP__DIAG_WAITS];
        qsort(l, (size_t)out[i].n, sizeof(double), cmp_double);
        out[i].late_ms = l[out[i].n / 2];
        out[i].last_frac = (double)lasts[i] / out[i].n;
        /* Last more than half the time (by chance: 1/world), and by at least a millisecond. */
        out[i].flagged = everyone && seqs >= 4 && out[i].last_frac > 0.5 && out[i].late_ms >= 1.0;
    }
    free(late);
    free(dur);
    free(lasts);
}

bool ddp__diag_startup(const struct ddp__diag *d, bool first, int64_t *at_ms)
{
    *at_ms = 0;
    for (int i = 0; i < d->world; i++) {
        const struct ddp__diag_rank *r = &d->r[i];
        int64_t ago = first ? r->p.first_ago_ms : r->p.formed_ago_ms;
        if (!r->have || !r->p.rec || ago < 0)
            return false;
        if (i == 0 || r->at_ms - ago > *at_ms)
            *at_ms = r->at_ms - ago;
    }
    return d->world > 0;
}

void ddp__diag_status(const struct ddp__diag *d, int64_t now_ms, const char *const *node_names,
                      struct ddp_buf *out)
{
    struct ddp__straggle *st = calloc((size_t)(d->world > 0 ? d->world : 1), sizeof(*st));
    if (st)
        ddp__diag_stragglers(d, st);
    char line[512];
    int n = snprintf(line, sizeof(line), "%-5s %-16s %-8s %-30s %5s %7s  %-42s %10s  %s\n", "rank",
                     "node", "pid", "state", "cpu%", "coll/s", "collective", "progress",
                     "arrives last");
    ddp_buf_put(out, line, (size_t)n);
    for (int i = 0; i < d->world; i++) {
        const struct ddp__diag_rank *r = &d->r[i];
        if (!r->have) {
            n = snprintf(line, sizeof(line), "%-5d %-16.16s (no report yet)\n", i,
                         node_of(d, node_names, i));
            ddp_buf_put(out, line, (size_t)n);
            continue;
        }
        char state[96], last[112] = "-", prog[32] = "-", strag[64] = "-";
        ddp__diag_state_name(state, sizeof(state), r->p.state, r->p.wchan);
        if (r->p.rec && r->p.in_coll) {
            char what[96];
            ddp__diag_coll_name(what, sizeof(what), r->p.op, r->p.completed + 1, r->p.bucket,
                                r->p.bytes);
            snprintf(last, sizeof(last), "in %s", what);
        } else if (r->p.rec && r->p.completed) {
            snprintf(last, sizeof(last), "#%" PRIu64 " done", r->p.completed);
        } else if (!r->p.rec) {
            snprintf(last, sizeof(last), "(no flight recorder)");
        }
        if (r->p.rec)
            snprintf(prog, sizeof(prog), "%.1f s ago",
                     (double)(r->p.idle_ms + (now_ms - r->at_ms)) / 1000);
        if (st && st[i].n > 0)
            snprintf(strag, sizeof(strag), "%.0f%%, by %.1f ms%s", st[i].last_frac * 100,
                     st[i].late_ms, st[i].flagged ? "  STRAGGLER" : "");
        n = snprintf(line, sizeof(line),
                     "%-5d %-16.16s %-8d %-30.30s %5.0f %7.1f  %-42.42s %10s  %s\n", i,
                     node_of(d, node_names, i), r->p.pid, state, r->cpu_pct, r->coll_per_s, last,
                     prog, strag);
        ddp_buf_put(out, line, (size_t)(n < (int)sizeof(line) ? n : (int)sizeof(line) - 1));
    }
    free(st);
}

/* A stack without what differs between processes: addresses, pids and thread ids. */
static char *normalize(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(n + 1), *w = o;
    if (!o)
        return NULL;
    for (const char *l = s; *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) + 1 : strlen(l);
        if (strncmp(l, "PID ", 4) == 0) { /* "PID 123 - process" */
            l += len;
            continue;
        }
        if (strncmp(l, "TID ", 4) == 0) {
            memcpy(w, "thread:\n", 8);
            w += 8;
            l += len;
            continue;
        }
        for (size_t i = 0; i < len;) {
            if (l[i] == '0' && i + 1 < len && l[i + 1] == 'x') { /* an address */
                i += 2;
                while (i < len && ((l[i] >= '0' && l[i] <= '9') || (l[i] >= 'a' && l[i] <= 'f')))
                    i++;
                while (i < len && l[i] == ' ')
                    i++;
                continue;
            }
            *w++ = l[i++];
        }
        l += len;
    }
    *w = '\0';
    return o;
}

void ddp__diag_group_stacks(struct ddp_buf *out, int n, const int *ranks, char *const *texts)
{
    char **norm = calloc((size_t)(n > 0 ? n : 1), sizeof(char *));
    int *group = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    for (int i = 0; norm && i < n; i++)
        norm[i] = normalize(texts[i] ? texts[i] : "");
    for (int i = 0; norm && group && i < n; i++) {
        if (group[i] || !norm[i])
            continue;
        char head[512];
        int count = 0, len = 0;
        for (int j = i; j < n; j++) {
            if (group[j] || !norm[j] || strcmp(norm[i], norm[j]) != 0)
                continue;
            group[j] = 1;
            if (len < (int)sizeof(head) - 16)
                len += snprintf(head + len, sizeof(head) - (size_t)len, "%s%d", count ? "," : "",
                                ranks[j]);
            count++;
        }
        char line[640];
        int ll = snprintf(line, sizeof(line), "== rank%s %s (%d of %d):\n", count > 1 ? "s" : "",
                          head, count, n);
        ddp_buf_put(out, line, (size_t)(ll < (int)sizeof(line) ? ll : (int)sizeof(line) - 1));
        ddp_buf_put(out, norm[i], strlen(norm[i]));
        if (norm[i][0] && norm[i][strlen(norm[i]) - 1] != '\n')
            ddp_buf_put(out, "\n", 1);
    }
    for (int i = 0; norm && i < n; i++)
        free(norm[i]);
    free(norm);
    free(group);
}
