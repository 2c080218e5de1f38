/*
 * The job's records (cli/view/record.h): one model of a rank's outcome and of the job's status,
 * written the same way into events.jsonl and summary.json, plus ddprun.log and spec.yaml.
 */
#include "cli/view/record.h"
#include "cli/spec/job.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

static void close_logs(struct ddp__rec *r);

void ddp__rec_wall_clock(char *out, size_t n)
{
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    char s[32];
    strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, n, "%s.%03dZ", s, (int)(tv.tv_usec / 1000));
}

struct ddp__outcome ddp__outcome_of(int code, bool exec_failed)
{
    if (exec_failed)
        return (struct ddp__outcome){.state = DDP__RS_NOT_STARTED};
    if (code < 0)
        return (struct ddp__outcome){.state = DDP__RS_SIGNALED, .signal = -code};
    return (struct ddp__outcome){.state = DDP__RS_EXITED, .exit_code = code};
}

const char *ddp__signal_name(int sig, char *buf, size_t n)
{
    const char *a = sigabbrev_np(sig);
    if (a)
        snprintf(buf, n, "SIG%s", a);
    else
        snprintf(buf, n, "signal %d", sig);
    return buf;
}

const char *ddp__outcome_text(const struct ddp__outcome *o, char *buf, size_t n)
{
    char s[32];
    const char *a = o->stopped ? "stopped (" : "", *b = o->stopped ? ")" : "";
    switch (o->state) {
    case DDP__RS_EXITED:
        snprintf(buf, n, "%sexit %d%s", a, o->exit_code, b);
        break;
    case DDP__RS_SIGNALED:
        snprintf(buf, n, "%s%s%s", a, ddp__signal_name(o->signal, s, sizeof(s)), b);
        break;
    case DDP__RS_NOT_STARTED:
        snprintf(buf, n, "did not start");
        break;
    case DDP__RS_LOST:
        snprintf(buf, n, "node lost");
        break;
    default:
        snprintf(buf, n, "no report");
        break;
    }
    return buf;
}

const char *ddp__job_status(int exit_status)
{
    switch (exit_status) {
    case 0:
        return "succeeded";
    case 130:
        return "interrupted";
    case 3:
        return "launch_failed";
    default:
        return "failed";
    }
}

static const char *state_name(enum ddp__rank_state s)
{
    static const char *const n[] = {"no_report", "exited", "signaled", "not_started", "lost"};
    return n[s];
}

/* Bytes as a JSON string: valid UTF-8 as it is (controls, quote and backslash escaped), each
 * byte of anything else as U+FFFD, so that every line parses. */
static void json_bytes(FILE *f, const uint8_t *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len && i + len <= n;
        for (size_t k = 1; ok && k < len; k++)
            ok = (s[i + k] & 0xc0) == 0x80;
        if (ok && len > 1) { /* no overlong forms, surrogates or code points past U+10FFFF */
            uint32_t cp = c & (0x7f >> len);
            for (size_t k = 1; k < len; k++)
                cp = cp << 6 | (s[i + k] & 0x3f);
            uint32_t least = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
            ok = cp >= least && cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
        }
        if (!ok) {
            fputs("\\ufffd", f);
            i++;
            continue;
        }
        if (len > 1)
            fwrite(s + i, 1, len, f);
        else if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
        i += len;
    }
    fputc('"', f);
}

/* A C string as a JSON string (json_bytes), NULL as null. */
static void json_str(FILE *f, const char *s)
{
    if (s)
        json_bytes(f, (const uint8_t *)s, strlen(s));
    else
        fputs("null", f);
}

/* "state": ..., "exit_code": ..., "signal": ..., "signal_number": ... */
static void outcome_json(FILE *f, const struct ddp__outcome *o)
{
    char s[32];
    fprintf(f, "\"state\": \"%s\", \"exit_code\": ", state_name(o->state));
    if (o->state == DDP__RS_EXITED)
        fprintf(f, "%d", o->exit_code);
    else
        fputs("null", f);
    fputs(", \"signal\": ", f);
    if (o->state == DDP__RS_SIGNALED) {
        json_str(f, ddp__signal_name(o->signal, s, sizeof(s)));
        fprintf(f, ", \"signal_number\": %d", o->signal);
    } else {
        fputs("null, \"signal_number\": null", f);
    }
    fprintf(f, ", \"stopped_by_ddprun\": %s", o->stopped ? "true" : "false");
}

/* Notes that record name could not be written (errno err): said once, listed in the summary. */
static void failed(struct ddp__rec *r, const char *name, int err)
{
    for (int k = 0; k < r->nfails; k++)
        if (strcmp(r->fails[k].name, name) == 0)
            return;
    if (r->nfails < DDP__REC_MAX_FAILS) {
        snprintf(r->fails[r->nfails].name, sizeof(r->fails[0].name), "%s", name);
        r->fails[r->nfails++].err = err;
    } else {
        r->more++;
    }
    /* Said after it is noted: the message goes to ddprun.log too, which may be this file. */
    if (r->say)
        r->say("ddprun: cannot write the job's record %s/%s: %s; the job goes on, and its records "
               "are incomplete",
               r->dir, name, strerror(err));
    else
        fprintf(stderr, "ddprun: warning: cannot write %s/%s: %s\n", r->dir, name, strerror(err));
}

void ddp__rec_incomplete(const struct ddp__rec *r, char *buf, size_t n)
{
    size_t l = 0;
    buf[0] = '\0';
    for (int k = 0; k < r->nfails; k++) {
        int w = snprintf(buf + l, n - l, "%s%s (%s)", k ? ", " : "", r->fails[k].name,
                         strerror(r->fails[k].err));
        if (w < 0 || (size_t)w >= n - l)
            return;
        l += (size_t)w;
    }
    if (r->more)
        snprintf(buf + l, n - l, " and %d more", r->more);
}

/* Opens record name for appending whole lines (append: to what is there; else emptied). */
static void file_open(struct ddp__rec *r, struct ddp__rec_file *f, const char *name, bool append)
{
    char path[4200];
    snprintf(f->name, sizeof(f->name), "%s", name);
    snprintf(path, sizeof(path), "%s/%s", r->dir, name);
    f->fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    struct stat st;
    f->size = f->fd >= 0 && fstat(f->fd, &st) == 0 ? (long long)st.st_size : 0;
    if (f->fd < 0)
        failed(r, name, errno);
}

static void file_close(struct ddp__rec_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

/*
 * Appends one or more whole lines at once. A write that fails or stops short (ENOSPC part-way
 * through) is undone, so that the file ends with the last whole line, and the file is given
 * up: it is complete up to the failure, and the summary says so.
 */
static void file_append(struct ddp__rec *r, struct ddp__rec_file *f, const struct iovec *iov, int n)
{
    if (f->fd < 0)
        return;
    size_t want = 0;
    for (int i = 0; i < n; i++)
        want += iov[i].iov_len;
    ssize_t w;
    do
        w = writev(f->fd, iov, n);
    while (w < 0 && errno == EINTR);
    if (w == (ssize_t)want) {
        f->size += w;
        return;
    }
    int err = w < 0 ? errno : ENOSPC; /* a short write: the disk is full */
    if (w > 0 && ftruncate(f->fd, (off_t)f->size) != 0)
        DDP_DEBUG(SUP, "cannot cut %s back to its last whole line: %s", f->name, strerror(errno));
    file_close(f);
    failed(r, f->name, err);
}

/* A line formatted into memory (open_memstream), to be appended whole. */
struct line {
    FILE *f;
    char *buf;
    size_t len;
};

static FILE *line_begin(struct line *l)
{
    l->buf = NULL;
    l->len = 0;
    l->f = open_memstream(&l->buf, &l->len);
    return l->f;
}

static void line_end(struct ddp__rec *r, struct ddp__rec_file *f, struct line *l)
{
    if (!l->f)
        return;
    if (fclose(l->f) == 0 && l->buf) {
        struct iovec iov = {.iov_base = l->buf, .iov_len = l->len};
        file_append(r, f, &iov, 1);
    }
    free(l->buf);
}

/*
 * Writes a whole-file record: into a hidden temporary file beside it, renamed into place once
 * written and flushed, so that the record is either whole or as it was (absent). write(f, arg)
 * fills it.
 */
static void whole_file(struct ddp__rec *r, const char *name, void (*write)(FILE *f, void *arg),
                       void *arg)
{
    char path[4200], tmp[4200];
    snprintf(path, sizeof(path), "%s/%s", r->dir, name);
    snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", r->dir, name);
    FILE *f = fopen(tmp, "we");
    if (!f) {
        failed(r, name, errno);
        return;
    }
    write(f, arg);
    int err = 0;
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0)
        err = errno ? errno : EIO;
    if (fclose(f) != 0 && !err)
        err = errno;
    if (!err && rename(tmp, path) != 0)
        err = errno;
    if (err) {
        unlink(tmp);
        failed(r, name, err);
    }
}

static void write_spec(FILE *f, void *arg)
{
    const struct ddp__rec *r = arg;
    ddp__job_print_plan(r->job, r->job_id, f);
}

int ddp__rec_open(struct ddp__rec *r, const char *dir, const struct ddp_job *job,
                  const char *job_id, bool resume,
                  void (*say)(const char *fmt, ...) __attribute__((format(printf, 1, 2))))
{
    memset(r, 0, sizeof(*r));
    snprintf(r->dir, sizeof(r->dir), "%s", dir);
    r->job = job;
    r->job_id = job_id;
    r->t0_ms = ddp_now_ms();
    ddp__rec_wall_clock(r->started, sizeof(r->started));
    r->resume = resume;
    r->events.fd = r->log.fd = r->output.fd = -1;
    if (!resume)
        whole_file(r, "spec.yaml", write_spec, r);
    file_open(r, &r->events, "events.jsonl", resume);
    file_open(r, &r->log, "ddprun.log", resume);
    if (job->log_jsonl)
        file_open(r, &r->output, "output.jsonl", resume);
    r->say = say; /* from now on: the console exists */
    return 0;
}

void ddp__rec_close(struct ddp__rec *r)
{
    close_logs(r);
    file_close(&r->events);
    file_close(&r->log);
    file_close(&r->output);
}

void ddp__rec_event(struct ddp__rec *r, int round, const char *name, ...)
{
    struct line l;
    FILE *f;
    if (r->events.fd < 0 || !(f = line_begin(&l)))
        return;
    char when[40];
    ddp__rec_wall_clock(when, sizeof(when));
    fprintf(f, "{\"time\": \"%s\", \"t\": %.3f, \"event\": \"%s\", \"round\": %d", when,
            (double)(ddp_now_ms() - r->t0_ms) / 1000, name, round);
    va_list ap;
    va_start(ap, name);
    for (const char *k; (k = va_arg(ap, const char *));) {
        if (k[0] == '#') {
            fprintf(f, ", \"%s\": %lld", k + 1, va_arg(ap, long long));
        } else if (k[0] == '?') { /* a count, or null when negative (not known) */
            long long v = va_arg(ap, long long);
            if (v < 0)
                fprintf(f, ", \"%s\": null", k + 1);
            else
                fprintf(f, ", \"%s\": %lld", k + 1, v);
        } else if (strcmp(k, "@outcome") == 0) {
            fputs(", ", f);
            outcome_json(f, va_arg(ap, const struct ddp__outcome *));
        } else {
            fprintf(f, ", \"%s\": ", k);
            json_str(f, va_arg(ap, const char *));
        }
    }
    va_end(ap);
    fputs("}\n", f);
    line_end(r, &r->events, &l);
}

/* A number of seconds, or null when negative (not known). */
static void num_or_null(FILE *f, double v)
{
    if (v < 0)
        fputs("null", f);
    else
        fprintf(f, "%.3f", v);
}

static void rec_message(void *self, const char *msg, size_t n)
{
    struct ddp__rec *r = self;
    if (r->log.fd < 0)
        return;
    char when[40];
    ddp__rec_wall_clock(when, sizeof(when));
    size_t wl = strlen(when);
    when[wl++] = ' ';
    struct iovec iov[3] = {{when, wl}, {(void *)msg, n}, {"\n", 1}};
    file_append(r, &r->log, iov, 3);
}

static void rec_rank_line(void *self, int rank, const char *host, int stream, const uint8_t *line,
                          size_t n, unsigned flags)
{
    struct ddp__rec *r = self;
    if (flags & DDP__LINE_PROGRESS)
        return; /* a progress bar is logged as the line it ends with */
    struct line l;
    FILE *f;
    if (r->output.fd >= 0 && rank >= 0 && (f = line_begin(&l))) {
        char when[40];
        ddp__rec_wall_clock(when, sizeof(when));
        fprintf(f, "{\"time\": \"%s\", \"t\": %.3f, \"round\": %d, \"rank\": %d, \"host\": ", when,
                (double)(ddp_now_ms() - r->t0_ms) / 1000, r->round, rank);
        json_str(f, host);
        fprintf(f, ", \"stream\": \"%s\", \"line\": ", stream == 2 ? "stderr" : "stdout");
        json_bytes(f, line, n);
        if (flags & DDP__LINE_CUT) /* a line over 64 KiB: the next object goes on with it */
            fputs(", \"continues\": true", f);
        fputs("}\n", f);
        line_end(r, &r->output, &l);
    }
    if (rank < 0 || rank >= r->nlogs)
        return;
    /* The rank's log keeps a line over 64 KiB whole: its pieces are written one after the
     * other, the time before the first and the newline after the last. */
    char when[40] = "";
    size_t wl = 0;
    if (r->job->log_timestamps && !(flags & DDP__LINE_REST)) {
        ddp__rec_wall_clock(when, sizeof(when));
        wl = strlen(when);
        when[wl++] = ' ';
    }
    struct iovec iov[3] = {{when, wl}, {(void *)line, n}, {"\n", (flags & DDP__LINE_CUT) ? 0 : 1}};
    file_append(r, &r->logs[rank], iov, 3);
}

static void close_logs(struct ddp__rec *r)
{
    for (int i = 0; i < r->nlogs; i++)
        file_close(&r->logs[i]);
    free(r->logs);
    free(r->logpath);
    r->logs = NULL;
    r->logpath = NULL;
    r->nlogs = 0;
}

static void rec_round(void *self, int round, int world, const char *const *hosts)
{
    (void)hosts;
    struct ddp__rec *r = self;
    close_logs(r);
    r->round = round;
    r->logs = calloc((size_t)(world ? world : 1), sizeof(*r->logs));
    r->logpath = malloc((size_t)(world ? world : 1) * sizeof(*r->logpath));
    if (!r->logs || !r->logpath) {
        close_logs(r);
        return;
    }
    r->nlogs = world;
    for (int i = 0; i < world; i++) {
        char name[48];
        if (round == 0)
            snprintf(name, sizeof(name), "rank-%d.log", i);
        else
            snprintf(name, sizeof(name), "rank-%d.restart-%d.log", i, round);
        snprintf(r->logpath[i], sizeof(r->logpath[i]), "%s/%s", r->dir, name);
        file_open(r, &r->logs[i], name, r->resume);
    }
}

const char *ddp__rec_rank_log(const struct ddp__rec *r, int rank)
{
    return rank >= 0 && rank < r->nlogs ? r->logpath[rank] : "";
}

struct summary_arg {
    struct ddp__rec *r;
    const struct ddp__summary *s;
};

static void write_summary(FILE *f, void *arg);

static void rec_summary(void *self, const struct ddp__summary *s)
{
    struct ddp__rec *r = self;
    ddp__summary_text(s, rec_message, r);
    struct summary_arg a = {r, s};
    whole_file(r, "summary.json", write_summary, &a);
}

static void write_summary(FILE *f, void *arg)
{
    const struct summary_arg *sa = arg;
    struct ddp__rec *r = sa->r;
    const struct ddp__summary *s = sa->s;
    const struct ddp_job *j = r->job;
    char ended[40];
    ddp__rec_wall_clock(ended, sizeof(ended));
    fprintf(f, "{\"job_id\": ");
    json_str(f, r->job_id);
    fprintf(f, ", \"name\": ");
    json_str(f, j->name);
    fprintf(f, ", \"status\": \"%s\", \"exit_status\": %d,\n \"reason\": ",
            ddp__job_status(s->exit_status), s->exit_status);
    json_str(f, s->exit_status ? s->reason : NULL);
    fprintf(f, ",\n \"started\": \"%s\", \"ended\": \"%s\", \"runtime_s\": %.3f,\n", r->started,
            ended, s->runtime_s);
    char *abs = realpath(j->file, NULL); /* NULL for the embedded default job */
    fprintf(f, " \"job_file\": ");
    json_str(f, abs ? abs : j->file);
    free(abs);
    fprintf(f, ", \"spec\": \"spec.yaml\", \"log\": \"ddprun.log\", \"events\": \"events.jsonl\",\n"
               " \"command\": ");
    if (j->shell) {
        json_str(f, j->shell);
    } else {
        fputc('[', f);
        for (char **a = j->argv; *a; a++) {
            if (a != j->argv)
                fputs(", ", f);
            json_str(f, *a);
        }
        fputc(']', f);
    }
    fprintf(f, ",\n \"overrides\": [");
    for (size_t i = 0; i < j->noverrides; i++) {
        if (i)
            fputs(", ", f);
        json_str(f, j->overrides[i]);
    }
    fprintf(f, "],\n \"workdir\": ");
    json_str(f, j->workdir);
    fprintf(f, ", \"world_size\": %d, \"nodes\": %d, \"restarts\": %d, \"first_failed_rank\": ",
            s->world, s->nodes, s->restarts);
    if (s->first_fail >= 0)
        fprintf(f, "%d", s->first_fail);
    else
        fputs("null", f);
    /* The ranks that failed on their own (not those ddprun stopped), each with its own exit
     * code or signal. */
    if (s->store_requests >= 0)
        fprintf(f, ",\n \"store\": {\"connections\": %lld, \"requests\": %lld}", s->store_conns,
                s->store_requests);
    fprintf(f, ",\n \"failed_ranks\": [");
    int nf = 0;
    for (int i = 0; i < s->world; i++) {
        const struct ddp__rank_rec *k = &s->ranks[i];
        if ((k->out.state == DDP__RS_EXITED && k->out.exit_code == 0) || k->out.stopped ||
            k->out.state == DDP__RS_RUNNING)
            continue;
        fprintf(f, "%s\n  {\"rank\": %d, \"host\": ", nf++ ? "," : "", k->rank);
        json_str(f, k->host);
        fputs(", ", f);
        outcome_json(f, &k->out);
        if (k->error) { /* torch's @record, through TORCHELASTIC_ERROR_FILE */
            fputs(", \"error\": ", f);
            json_str(f, k->error);
            fputs(", \"traceback\": ", f);
            json_str(f, k->traceback);
        }
        fputc('}', f);
    }
    fprintf(f, "],\n \"lost_nodes\": [");
    for (int k = 0; k < s->nlosses; k++) {
        const struct ddp__loss_rec *l = &s->losses[k];
        fprintf(f, "%s\n  {\"host\": ", k ? "," : "");
        json_str(f, l->host);
        fprintf(f, ", \"time\": \"%s\", \"t\": %.3f, \"round\": %d, \"reason\": ", l->when, l->t,
                l->round);
        json_str(f, l->why);
        fputc('}', f);
    }
    fputs("],\n \"startup\": ", f);
    if (s->startup_round < 0) {
        fputs("null", f);
    } else {
        fprintf(f, "{\"round\": %d, \"group_formed_s\": ", s->startup_round);
        num_or_null(f, s->formed_s);
        fputs(", \"first_collective_s\": ", f);
        num_or_null(f, s->first_s);
        fputc('}', f);
    }
    /* each restart's timeline (cli/supervisor/recovery.h): seconds after its detection */
    static const char *const phase[5] = {"stopped_s", "formed_s", "started_s", "group_formed_s",
                                         "first_collective_s"};
    fputs(",\n \"recoveries\": [", f);
    for (int i = 0; i < s->nrecoveries; i++) {
        const struct ddp__recovery_rec *v = &s->recoveries[i];
        fprintf(f, "%s\n  {\"round\": ", i ? "," : "");
        if (v->round < 0)
            fputs("null", f);
        else
            fprintf(f, "%d", v->round);
        fputs(", \"cause\": ", f);
        json_str(f, v->cause);
        fprintf(f, ", \"detected_s\": %.3f", v->detected_s);
        for (int k = 0; k < 5; k++) {
            fprintf(f, ", \"%s\": ", phase[k]);
            num_or_null(f, v->ms[k] < 0 ? -1 : (double)v->ms[k] / 1000);
        }
        fprintf(f, ", \"warm_ranks\": %d", v->warm_ranks);
        /* checkpoint.replicas: the restore's phase, bytes and time, where the round had one */
        if (v->restored_ms >= 0)
            fprintf(f, ", \"restored_s\": %.3f, \"restored_bytes\": %lld, \"restore_took_s\": %.3f",
                    (double)v->restored_ms / 1000, (long long)v->restored_bytes,
                    (double)v->restore_took_ms / 1000);
        fputc('}', f);
    }
    fputs("]", f);
    fprintf(f, ",\n \"ranks\": [");
    for (int i = 0; i < s->world; i++) {
        const struct ddp__rank_rec *k = &s->ranks[i];
        fprintf(f, "%s\n  {\"rank\": %d, \"host\": ", i ? "," : "", k->rank);
        json_str(f, k->host);
        fprintf(f, ", \"local_rank\": %d, ", k->local);
        outcome_json(f, &k->out);
        fprintf(f,
                ", \"started\": %s, \"runtime_s\": %.3f, \"log\": ", k->started ? "true" : "false",
                k->runtime_s);
        json_str(f, k->log);
        fputc('}', f);
    }
    fprintf(f, "\n],\n \"records_incomplete\": [");
    for (int k = 0; k < r->nfails; k++) {
        fprintf(f, "%s{\"file\": ", k ? ", " : "");
        json_str(f, r->fails[k].name);
        fputs(", \"error\": ", f);
        json_str(f, strerror(r->fails[k].err));
        fputc('}', f);
    }
    fprintf(f, "]}\n");
}

/* A line of the summary's text, formatted, to line(arg, ...). */
static void out(void (*line)(void *, const char *, size_t), void *arg, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void out(void (*line)(void *, const char *, size_t), void *arg, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n >= 0)
        line(arg, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

#define TRACEBACK_LINES 30

/* The first failure with the traceback torch's @record wrote (its last lines). */
static void traceback_text(void (*line)(void *, const char *, size_t), void *arg, int rank,
                           const struct ddp__rank_rec *r)
{
    char buf[128];
    out(line, arg,
        "ddprun: first failure: rank %d on '%s': %s: %.*s; its traceback (from "
        "TORCHELASTIC_ERROR_FILE; log %s):",
        rank, r->host, ddp__outcome_text(&r->out, buf, sizeof(buf)),
        (int)ddp_utf8_prefix(r->error, 400), r->error, r->log);
    const char *p = r->traceback, *end = p + strlen(p);
    while (end > p && end[-1] == '\n')
        end--;
    int lines = end > p;
    for (const char *q = p; q < end; q++)
        lines += *q == '\n';
    for (int skip = lines - TRACEBACK_LINES; skip > 0; skip--) /* each finds a newline */
        p = (const char *)memchr(p, '\n', (size_t)(end - p)) + 1;
    if (p != r->traceback)
        out(line, arg, "    ...");
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        out(line, arg, "    %.*s", (int)len, p);
        p += len + 1;
    }
}

void ddp__summary_text(const struct ddp__summary *s,
                       void (*line)(void *arg, const char *msg, size_t n), void *arg)
{
    char buf[128];
    out(line, arg, "ddprun: job %s %s after %.1f s (%d rank%s on %d node%s%s%.0d%s)", s->job_id,
        s->exit_status == 3 ? "launch failed" : ddp__job_status(s->exit_status), s->runtime_s,
        s->world, s->world == 1 ? "" : "s", s->nodes, s->nodes == 1 ? "" : "s",
        s->restarts ? ", after " : "", s->restarts,
        s->restarts == 1 ? " restart"
        : s->restarts    ? " restarts"
                         : "");
    if (s->reason && s->explain)
        out(line, arg, "ddprun: the job cannot continue: %s", s->reason);
    for (int k = 0; k < s->nlosses; k++) {
        const struct ddp__loss_rec *l = &s->losses[k];
        if (k == 0)
            out(line, arg, "ddprun: nodes lost:");
        out(line, arg, "    '%s' at %s (+%.1f s, round %d): %s", l->host, l->when, l->t, l->round,
            l->why);
    }
    if (s->first_fail >= 0 && s->first_fail < s->world) {
        const struct ddp__rank_rec *r = &s->ranks[s->first_fail];
        if (r->error && r->traceback)
            traceback_text(line, arg, s->first_fail, r);
        else
            out(line, arg, "ddprun: first failure: rank %d on '%s': %s%s%.*s; last lines of %s:",
                s->first_fail, r->host, ddp__outcome_text(&r->out, buf, sizeof(buf)),
                r->error ? ": " : "", (int)(r->error ? ddp_utf8_prefix(r->error, 400) : 0),
                r->error ? r->error : "", r->log);
        for (int k = 0; k < s->ntail && !(r->error && r->traceback); k++)
            out(line, arg, "    %s", s->tail[k]);
    }
    if (s->world)
        out(line, arg, "  %-6s %-20s %-22s %-9s %s", "rank", "host", "status", "runtime", "log");
    for (int i = 0; i < s->world; i++) {
        const struct ddp__rank_rec *r = &s->ranks[i];
        char rt[32];
        snprintf(rt, sizeof(rt), "%.1fs", r->runtime_s);
        out(line, arg, "  %-6d %-20s %-22s %-9s %s", i, r->host,
            ddp__outcome_text(&r->out, buf, sizeof(buf)), rt, r->log);
    }
    if (s->records_incomplete && s->records_incomplete[0])
        out(line, arg, "ddprun: records incomplete: %s", s->records_incomplete);
}

static void rec_status(void *self, const struct ddp__status *st)
{
    (void)self;
    (void)st;
}

static const struct ddp__view_ops rec_ops = {.message = rec_message,
                                             .rank_line = rec_rank_line,
                                             .status = rec_status,
                                             .round = rec_round,
                                             .summary = rec_summary};

struct ddp__view ddp__rec_view(struct ddp__rec *r)
{
    return (struct ddp__view){.ops = &rec_ops, .self = r};
}

size_t ddp__status_text(const struct ddp__status *st, char *buf, size_t n)
{
    int64_t s = st->elapsed_ms / 1000;
    int len = snprintf(buf, n, "[ddprun] %s | ranks up %d/%d | restarts %d | %02lld:%02lld:%02lld",
                       st->phase, st->ranks_up, st->world, st->restarts, (long long)(s / 3600),
                       (long long)(s / 60 % 60), (long long)(s % 60));
    return len < 0 ? 0 : (size_t)len < n ? (size_t)len : n - 1;
}
