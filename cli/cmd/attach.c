/*
 * The commands for jobs that run on without a terminal (ddprun --detach), all clients of a
 * job's control socket (cli/view/attached.h) or of its log folder:
 *
 *   ddprun attach [JOB]   the job's console from now on: its output, messages and status
 *                         line, and the summary at its end (then its exit status); Ctrl-C
 *                         detaches and leaves the job running
 *   ddprun ps             this user's running jobs on this machine
 *   ddprun logs JOB [--rank R] [-f]
 *                         the console of a detached job (console.log), or rank R's log
 *                         (every restart's, in order); -f follows until the job ends
 *   ddprun stop [JOB]     stops the job as SIGINT does, and waits for its end
 */
#include "cli/cmd/cmd.h"
#include "cli/spec/args.h"
#include "cli/sys/sys.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/banned.h"

static volatile sig_atomic_t interrupted;

static void on_int(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* The fields of an info line (cli/supervisor/supervise.c, remote_info). */
enum { F_ID, F_PID, F_PHASE, F_UP, F_WORLD, F_NODES, F_MS, F_MODE, F_LOGDIR, F_N };

static int split_info(char *line, char **f)
{
    int n = 0;
    for (char *p = line; n < F_N;) {
        f[n++] = p;
        char *t = strchr(p, '\t');
        if (!t)
            break;
        *t = '\0';
        p = t + 1;
    }
    line[strcspn(line, "\n")] = '\0';
    if (n == F_N)
        f[F_LOGDIR][strcspn(f[F_LOGDIR], "\n")] = '\0';
    return n == F_N ? 0 : -1;
}

static void elapsed(long long ms, char *out, size_t n)
{
    long long s = ms / 1000;
    snprintf(out, n, "%02lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
}

int ddp__cmd_attach(const struct ddp_cli_opts *o)
{
    int fd = ddp__control_connect("attach", o->npos ? o->pos[0] : NULL);
    if (fd < 0)
        return DDP_EXIT_USAGE;
    if (ddp_write_all(fd, "attach\n", 7) < 0) {
        ddp__cli_error("attach: the job closed its control socket");
        close(fd);
        return DDP_EXIT_LAUNCH;
    }
    struct sigaction sa = {.sa_handler = on_int};
    sigaction(SIGINT, &sa, NULL);
    bool tty = isatty(2), transient = false;
    char id[256] = "?";
    static char buf[1 << 16];
    size_t len = 0;
    int rc = -1;
    while (rc < 0 && !interrupted) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0)
            continue; /* EINTR: Ctrl-C is looked at above */
        ssize_t r = read(fd, buf + len, sizeof(buf) - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
        char *line = buf, *nl;
        while (rc < 0 && (nl = memchr(line, '\n', len - (size_t)(line - buf)))) {
            char kind = *line;
            size_t n = (size_t)(nl - line) - 1;
            const char *text = line + 1;
            if (transient && kind != 's') {
                ddp_write_all(2, "\r\033[K", 4);
                transient = false;
            }
            if (kind == 'i') {
                char info[1024], *f[F_N], when[32];
                snprintf(info, sizeof(info), "%.*s", (int)n, text);
                if (split_info(info, f) == 0) {
                    snprintf(id, sizeof(id), "%s", f[F_ID]);
                    elapsed(atoll(f[F_MS]), when, sizeof(when));
                    fprintf(stderr,
                            "ddprun: attached to job %s (%s, %s ranks up, %s since its start); "
                            "Ctrl-C detaches\n",
                            f[F_ID], f[F_PHASE], f[F_UP], when);
                }
            } else if (kind == 'o' || kind == 'e') {
                fflush(stdout);
                ddp_write_all(kind == 'o' ? 1 : 2, text, n + 1); /* with its newline */
            } else if (kind == 's' && tty) {
                ddp_write_all(2, "\r\033[K", 4);
                ddp_write_all(2, text, n);
                transient = true;
            } else if (kind == 'x') {
                rc = atoi(text);
            }
            line = nl + 1;
        }
        len -= (size_t)(line - buf);
        memmove(buf, line, len);
        if (len == sizeof(buf)) /* a line longer than the buffer: not ours */
            len = 0;
    }
    if (transient)
        ddp_write_all(2, "\r\033[K", 4);
    close(fd);
    if (interrupted) {
        fprintf(stderr, "ddprun: detached from job %s; it runs on (ddprun stop %s ends it)\n", id,
                id);
        return DDP_EXIT_OK;
    }
    if (rc < 0) {
        ddp__cli_error("attach: job %s's supervisor went away before the job's end", id);
        return DDP_EXIT_LAUNCH;
    }
    return rc;
}

int ddp__cmd_ps(const struct ddp_cli_opts *o)
{
    (void)o;
    char dir[3072], why[3200], path[4096];
    printf("%-36s %-8s %-9s %-22s %-7s %-6s %-9s %s\n", "JOB", "PID", "MODE", "PHASE", "RANKS",
           "NODES", "ELAPSED", "LOGS");
    if (ddp__control_dir(dir, sizeof(dir), false, why, sizeof(why)) < 0)
        return DDP_EXIT_OK; /* no folder: no job */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".sock") != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        int fd = ddp__control_dial(path);
        if (fd < 0)
            continue;
        char line[2048] = "", *f[F_N], when[32], ranks[32];
        size_t n = 0;
        if (ddp_write_all(fd, "info\n", 5) == 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            while (n < sizeof(line) - 1 && poll(&p, 1, 2000) == 1) {
                ssize_t r = read(fd, line + n, sizeof(line) - 1 - n);
                if (r <= 0)
                    break;
                n += (size_t)r;
            }
        }
        close(fd);
        line[n] = '\0';
        if (split_info(line, f) < 0)
            continue;
        elapsed(atoll(f[F_MS]), when, sizeof(when));
        snprintf(ranks, sizeof(ranks), "%s/%s", f[F_UP], f[F_WORLD]);
        printf("%-36s %-8s %-9s %-22s %-7s %-6s %-9s %s\n", f[F_ID], f[F_PID], f[F_MODE],
               f[F_PHASE], ranks, f[F_NODES], when, f[F_LOGDIR]);
    }
    if (d)
        closedir(d);
    return DDP_EXIT_OK;
}

int ddp__cmd_stop(const struct ddp_cli_opts *o)
{
    int fd = ddp__control_connect("stop", o->npos ? o->pos[0] : NULL);
    if (fd < 0)
        return DDP_EXIT_USAGE;
    if (ddp_write_all(fd, "stop\n", 5) < 0) {
        ddp__cli_error("stop: the job closed its control socket");
        close(fd);
        return DDP_EXIT_LAUNCH;
    }
    /* "stopping", then the job closes the connection as it exits. */
    char buf[256];
    ssize_t r;
    bool said = false;
    while ((r = read(fd, buf, sizeof(buf))) > 0 || (r < 0 && errno == EINTR))
        if (r > 0 && !said) {
            fprintf(stderr, "ddprun: stopping the job (as SIGINT does); waiting for its end\n");
            said = true;
        }
    close(fd);
    if (!said) {
        ddp__cli_error("stop: the job did not answer");
        return DDP_EXIT_LAUNCH;
    }
    fprintf(stderr, "ddprun: the job has ended\n");
    return DDP_EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* ddprun logs                                                        */
/* ------------------------------------------------------------------ */

int ddp__job_logdir(const char *cmd, const char *job, char *out, size_t n, char *id, size_t idn)
{
    struct stat st;
    char path[4096], dir[3072], why[3200];
    snprintf(path, sizeof(path), "%s/ddprun.log", job);
    bool folder = stat(path, &st) == 0;
    snprintf(path, sizeof(path), "%s/events.jsonl", job);
    if (folder || stat(path, &st) == 0) {
        snprintf(out, n, "%s", job);
        const char *b = strrchr(job, '/');
        snprintf(id, idn, "%s", b && b[1] ? b + 1 : job);
        return 0;
    }
    if (ddp__control_dir(dir, sizeof(dir), false, why, sizeof(why)) < 0) {
        ddp__cli_error("%s: no job '%s' of yours on this machine", cmd, job);
        return -1;
    }
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 8 || strcmp(e->d_name + l - 7, ".logdir") != 0 ||
            strncmp(e->d_name, job, strlen(job)) != 0)
            continue;
        bool exact = l - 7 == strlen(job);
        if (found && !exact) {
            found++;
            continue;
        }
        snprintf(id, idn, "%.*s", (int)(l - 7), e->d_name);
        found = exact ? 1 : found + 1;
        if (exact)
            break;
    }
    if (d)
        closedir(d);
    if (found > 1) {
        ddp__cli_error("%s: '%s' names %d jobs; give more of the id", cmd, job, found);
        return -1;
    }
    if (!found) {
        ddp__cli_error("%s: no job '%s' of yours on this machine (only the newest %d jobs are "
                       "remembered here: for an older one, pass its log folder, "
                       "LOGS_DIR/JOB_ID)",
                       cmd, job, DDP__LOGDIR_KEEP);
        return -1;
    }
    snprintf(path, sizeof(path), "%s/%s.logdir", dir, id);
    FILE *f = fopen(path, "re");
    if (!f || !fgets(out, (int)n, f)) {
        if (f)
            fclose(f);
        ddp__cli_error("%s: cannot read %s", cmd, path);
        return -1;
    }
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
    return 0;
}

/* Whether job id still runs: its control socket answers. */
static bool running(const char *id)
{
    char dir[3072], why[3200], path[4096];
    if (ddp__control_dir(dir, sizeof(dir), false, why, sizeof(why)) < 0)
        return false;
    snprintf(path, sizeof(path), "%s/%s.sock", dir, id);
    int fd = ddp__control_dial(path);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

/* The path of rank r's log of restart k (k = 0: rank-R.log). */
static void rank_log(const char *logdir, long r, int k, char *out, size_t n)
{
    if (k == 0)
        snprintf(out, n, "%s/rank-%ld.log", logdir, r);
    else
        snprintf(out, n, "%s/rank-%ld.restart-%d.log", logdir, r, k);
}

/* Copies what path has from *off on to stdout; the bytes copied. */
static size_t copy_from(const char *path, off_t *off)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t total = 0;
    if (fseeko(f, *off, SEEK_SET) == 0) {
        char buf[65536];
        size_t r;
        while ((r = fread(buf, 1, sizeof(buf), f)) > 0) {
            fwrite(buf, 1, r, stdout);
            total += r;
        }
    }
    fclose(f);
    *off += (off_t)total;
    fflush(stdout);
    return total;
}

int ddp__cmd_logs(const struct ddp_cli_opts *o)
{
    char logdir[PATH_MAX], id[256], path[PATH_MAX + 64];
    if (!o->npos) {
        ddp__cli_error("logs: which job? (ddprun logs JOB [--rank R] [-f]; ddprun ps lists them)");
        return DDP_EXIT_USAGE;
    }
    long rank = -1;
    if (o->vals[DDP_OPT_RANK]) {
        char *end;
        rank = strtol(o->vals[DDP_OPT_RANK], &end, 10);
        if (*end || rank < 0 || rank > 1 << 24) {
            ddp__cli_error("logs: --rank '%s' is not a rank number", o->vals[DDP_OPT_RANK]);
            return DDP_EXIT_USAGE;
        }
    }
    if (ddp__job_logdir("logs", o->pos[0], logdir, sizeof(logdir), id, sizeof(id)) < 0)
        return DDP_EXIT_USAGE;
    bool follow = o->vals[DDP_OPT_FOLLOW] != NULL;
    int k = 0;
    struct stat st;
    if (rank >= 0) {
        rank_log(logdir, rank, 0, path, sizeof(path));
        if (stat(path, &st) != 0 && !follow) {
            ddp__cli_error("logs: job %s has no log of rank %ld (%s)", id, rank, path);
            return DDP_EXIT_USAGE;
        }
    } else {
        snprintf(path, sizeof(path), "%s/console.log", logdir);
        if (stat(path, &st) != 0) {
            ddp__cli_error("logs: job %s ran on a terminal, which kept its console; its ranks' "
                           "logs are in %s (ddprun logs %s --rank R)",
                           id, logdir, id);
            return DDP_EXIT_USAGE;
        }
    }
    off_t off = 0;
    for (;;) {
        copy_from(path, &off);
        char next[PATH_MAX + 64];
        if (rank >= 0) { /* a restart's log follows the last one */
            rank_log(logdir, rank, k + 1, next, sizeof(next));
            if (stat(next, &st) == 0) {
                copy_from(path, &off);
                snprintf(path, sizeof(path), "%s", next);
                off = 0;
                k++;
                continue;
            }
        }
        if (!follow)
            break;
        if (!running(id)) { /* what the end wrote, then done */
            copy_from(path, &off);
            break;
        }
        usleep(200 * 1000);
    }
    return DDP_EXIT_OK;
}
