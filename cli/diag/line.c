/* The rank progress line (cli/diag/diag.h): "key=value" words, a line per rank. A leaf. */
#include "cli/diag/diag.h"
#include "common/progress.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

void ddp__diag_line_put(struct ddp_buf *b, const struct ddp__rank_progress *p)
{
    char line[2048];
    int n =
        snprintf(line, sizeof(line),
                 "rank=%d pid=%d st=%c cpu=%.2f wchan=%s rec=%d ent=%" PRIu64 " sta=%" PRIu64
                 " done=%" PRIu64 " idle=%" PRId64,
                 p->rank, p->pid, p->state ? p->state : '?', p->cpu_s, p->wchan[0] ? p->wchan : "-",
                 p->rec ? 1 : 0, p->entered, p->started, p->completed, p->idle_ms);
    if (p->rec && n > 0 && (size_t)n < sizeof(line))
        n += snprintf(line + n, sizeof(line) - (size_t)n,
                      " up=%" PRId64 ":%" PRId64 " steps=%" PRIu64, p->formed_ago_ms,
                      p->first_ago_ms, p->steps);
    if (p->in_coll && n > 0 && (size_t)n < sizeof(line))
        n += snprintf(line + n, sizeof(line) - (size_t)n,
                      " cur=%d:%d:%" PRIu64 ":%d:%" PRId64 ":%" PRId64, p->op, p->dtype, p->bytes,
                      p->bucket, p->cur_ms, p->cur_run_ms);
    for (int i = 0; i < p->nwaits && n > 0 && (size_t)n < sizeof(line) - 40; i++)
        n += snprintf(line + n, sizeof(line) - (size_t)n, "%s%" PRIu64 ":%u",
                      i ? "," : " w=", p->wseq[i], p->wus[i]);
    if (n < 0 || (size_t)n >= sizeof(line))
        return;
    ddp_buf_put(b, line, (size_t)n);
    ddp_buf_put(b, "\n", 1);
}

/* The value of key in a line of words, into out: true when present. */
static bool word(const char *line, const char *key, char *out, size_t n)
{
    size_t kl = strlen(key);
    for (const char *w = line; *w;) {
        while (*w == ' ')
            w++;
        const char *end = strchr(w, ' ');
        size_t wl = end ? (size_t)(end - w) : strlen(w);
        if (wl > kl && strncmp(w, key, kl) == 0 && w[kl] == '=') {
            size_t vl = wl - kl - 1;
            if (vl >= n)
                return false;
            memcpy(out, w + kl + 1, vl);
            out[vl] = '\0';
            return true;
        }
        w += wl;
    }
    return false;
}

static bool num(const char *line, const char *key, long long lo, long long *v)
{
    char s[32], *end;
    if (!word(line, key, s, sizeof(s)))
        return false;
    *v = strtoll(s, &end, 10);
    return *end == '\0' && *v >= lo;
}

int ddp__diag_line_parse(const char *line, struct ddp__rank_progress *p)
{
    memset(p, 0, sizeof(*p));
    long long v;
    char s[1600];
    if (!num(line, "rank", 0, &v))
        return -1;
    p->rank = (int)v;
    p->pid = num(line, "pid", 0, &v) ? (int)v : 0;
    p->state = word(line, "st", s, sizeof(s)) ? s[0] : '?';
    p->cpu_s = word(line, "cpu", s, sizeof(s)) ? strtod(s, NULL) : 0;
    if (word(line, "wchan", p->wchan, sizeof(p->wchan)) && strcmp(p->wchan, "-") == 0)
        p->wchan[0] = '\0';
    p->rec = num(line, "rec", 0, &v) && v == 1;
    p->entered = num(line, "ent", 0, &v) ? (uint64_t)v : 0;
    p->started = num(line, "sta", 0, &v) ? (uint64_t)v : 0;
    p->completed = num(line, "done", 0, &v) ? (uint64_t)v : 0;
    p->idle_ms = num(line, "idle", 0, &v) ? v : 0;
    p->steps = num(line, "steps", 0, &v) ? (uint64_t)v : 0;
    p->formed_ago_ms = p->first_ago_ms = -1;
    long long up_f, up_c;
    if (word(line, "up", s, sizeof(s)) && sscanf(s, "%lld:%lld", &up_f, &up_c) == 2 && up_f >= -1 &&
        up_c >= -1) {
        p->formed_ago_ms = up_f;
        p->first_ago_ms = up_c;
    }
    if (word(line, "cur", s, sizeof(s))) {
        long long op, dt, bucket, cur, run;
        unsigned long long bytes;
        if (sscanf(s, "%lld:%lld:%llu:%lld:%lld:%lld", &op, &dt, &bytes, &bucket, &cur, &run) ==
            6) {
            p->in_coll = true;
            p->op = (int)op;
            p->dtype = (int)dt;
            p->bytes = bytes;
            p->bucket = (int)bucket;
            p->cur_ms = cur;
            p->cur_run_ms = run;
        }
    }
    if (word(line, "w", s, sizeof(s))) {
        for (char *t = s; *t && p->nwaits < DDP__DIAG_WAITS;) {
            unsigned long long seq;
            unsigned us;
            int used;
            if (sscanf(t, "%llu:%u%n", &seq, &us, &used) != 2)
                break;
            p->wseq[p->nwaits] = seq;
            p->wus[p->nwaits++] = us;
            t += used;
            if (*t == ',')
                t++;
        }
    }
    return 0;
}

void ddp__diag_coll_name(char *out, size_t n, int op, uint64_t seq, int bucket, uint64_t bytes)
{
    char size[32];
    if (bytes >= (1u << 20))
        snprintf(size, sizeof(size), "%.1f MiB", (double)bytes / (1 << 20));
    else if (bytes >= 1024)
        snprintf(size, sizeof(size), "%.1f KiB", (double)bytes / 1024);
    else
        snprintf(size, sizeof(size), "%" PRIu64 " bytes", bytes);
    if (bucket >= 0)
        snprintf(out, n, "%s #%" PRIu64 " (bucket %d, %s)", ddp_progress_op_name((unsigned)op), seq,
                 bucket, size);
    else
        snprintf(out, n, "%s #%" PRIu64 " (%s)", ddp_progress_op_name((unsigned)op), seq, size);
}

void ddp__diag_state_name(char *out, size_t n, char state, const char *wchan)
{
    switch (state) {
    case 'R':
        snprintf(out, n, "running (on a CPU)");
        break;
    case 'S':
    case 'I':
        if (wchan && wchan[0])
            snprintf(out, n, "sleeping in %s", wchan);
        else
            snprintf(out, n, "sleeping");
        break;
    case 'D':
        snprintf(out, n, "in uninterruptible wait%s%s", wchan && wchan[0] ? " in " : "",
                 wchan && wchan[0] ? wchan : "");
        break;
    case 'T':
        snprintf(out, n, "stopped (SIGSTOP or job control)");
        break;
    case 't':
        snprintf(out, n, "stopped by a debugger");
        break;
    case 'Z':
        snprintf(out, n, "exited, not yet reaped");
        break;
    case 'X': /* the agent's word for a rank it reaped */
        snprintf(out, n, "exited");
        break;
    default:
        snprintf(out, n, "in state %c", state);
    }
}
