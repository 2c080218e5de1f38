/* Implementation of common/log.h: one formatted write(2) per line so lines never interleave. */
#include "common/log.h"
#include "common/err.h"
#include "common/util.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

static struct {
    bool inited;
    enum ddp_log_level level;
    unsigned subsys;
    int fd;
    int rank;
    char host[64];
} g = {.level = DDP_LOG_WARN, .subsys = DDP_SUB_ALL, .fd = 2, .rank = -1};

static pthread_once_t once = PTHREAD_ONCE_INIT;

static enum ddp_log_level parse_level(const char *s)
{
    static const char *const names[] = {"none", "error", "warn", "info", "debug", "trace"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcasecmp(s, names[i]) == 0)
            return (enum ddp_log_level)i;
    return DDP_LOG_WARN;
}

static unsigned parse_subsys(const char *s)
{
    static const struct {
        const char *name;
        unsigned bit;
    } map[] = {{"store", DDP_SUB_STORE}, {"pg", DDP_SUB_PG},   {"reducer", DDP_SUB_REDUCER},
               {"ssh", DDP_SUB_SSH},     {"sup", DDP_SUB_SUP}, {"all", DDP_SUB_ALL}};
    unsigned bits = 0;
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
            if (strcasecmp(tok, map[i].name) == 0)
                bits |= map[i].bit;
    return bits ? bits : DDP_SUB_ALL;
}

/* Expands %h and %p in a DDP_LOG_FILE pattern. */
static void expand_path(const char *pat, char *out, size_t n)
{
    size_t o = 0;
    for (const char *p = pat; *p && o + 1 < n; p++) {
        if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
            int w = p[1] == 'h' ? snprintf(out + o, n - o, "%s", g.host)
                                : snprintf(out + o, n - o, "%d", (int)getpid());
            if (w < 0 || (size_t)w >= n - o)
                break;
            o += (size_t)w;
            p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

void ddp_log_init(void)
{
    const char *s;
    if (gethostname(g.host, sizeof(g.host)) != 0)
        snprintf(g.host, sizeof(g.host), "?");
    g.host[sizeof(g.host) - 1] = '\0';
    g.level = (s = getenv("DDP_LOG_LEVEL")) ? parse_level(s) : DDP_LOG_WARN;
    g.subsys = (s = getenv("DDP_LOG_SUBSYS")) ? parse_subsys(s) : DDP_SUB_ALL;
    if ((s = getenv("DDP_LOG_FILE")) && *s) {
        char path[512];
        expand_path(s, path, sizeof(path));
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            if (g.fd > 2)
                close(g.fd);
            g.fd = fd;
        }
    }
    if (g.rank < 0 && (s = getenv("RANK")))
        g.rank = atoi(s);
    g.inited = true;
}

static void init_once(void)
{
    if (!g.inited)
        ddp_log_init();
}

void ddp_log_set_rank(int rank)
{
    pthread_once(&once, init_once);
    g.rank = rank;
}

void ddp_log_set_level(enum ddp_log_level level)
{
    pthread_once(&once, init_once);
    g.level = level;
}

bool ddp_log_enabled(enum ddp_log_level level, enum ddp_log_subsys sub)
{
    pthread_once(&once, init_once);
    return level <= g.level && (g.subsys & (unsigned)sub);
}

/* Formats and writes one line; suffix (or NULL) goes after the message. */
static void vwrite(enum ddp_log_level level, enum ddp_log_subsys sub, const char *file, int line,
                   const char *suffix, const char *fmt, va_list ap)
    __attribute__((format(printf, 6, 0)));
static void vwrite(enum ddp_log_level level, enum ddp_log_subsys sub, const char *file, int line,
                   const char *suffix, const char *fmt, va_list ap)
{
    static const char *const lvl[] = {"", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};
    const char *sname = sub == DDP_SUB_STORE     ? "store"
                        : sub == DDP_SUB_PG      ? "pg"
                        : sub == DDP_SUB_REDUCER ? "reducer"
                        : sub == DDP_SUB_SSH     ? "ssh"
                                                 : "sup";
    char buf[2048];
    char rank[16];
    if (g.rank >= 0)
        snprintf(rank, sizeof(rank), "%d", g.rank);
    else
        snprintf(rank, sizeof(rank), "-");
    int n = snprintf(buf, sizeof(buf), "%s:%d [%s] %s %s: ", g.host, (int)getpid(), rank,
                     lvl[level], sname);
    if (n < 0)
        return;
    int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof(buf) - 2)
        len = sizeof(buf) - 2;
    if (suffix) {
        int k = snprintf(buf + len, sizeof(buf) - len, "%s", suffix);
        if (k > 0)
            len = len + (size_t)k < sizeof(buf) - 2 ? len + (size_t)k : sizeof(buf) - 2;
    }
    if (level >= DDP_LOG_TRACE) {
        int k = snprintf(buf + len, sizeof(buf) - len, " (%s:%d)", file, line);
        if (k > 0 && len + (size_t)k < sizeof(buf) - 1)
            len += (size_t)k;
    }
    buf[len++] = '\n';
    /* One write per line: lines from several threads or processes never mix. */
    ssize_t w = write(g.fd, buf, len);
    (void)w;
}

void ddp_log_write(enum ddp_log_level level, enum ddp_log_subsys sub, const char *file, int line,
                   const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vwrite(level, sub, file, line, NULL, fmt, ap);
    va_end(ap);
}

void ddp_log_write_limited(struct ddp_log_limit *lim, enum ddp_log_level level,
                           enum ddp_log_subsys sub, const char *file, int line, const char *fmt,
                           ...)
{
    int64_t now = ddp_now_ms();
    if (lim->last_ms != 0 && now - lim->last_ms < 1000) {
        lim->held++;
        return;
    }
    char suffix[96] = "";
    if (lim->held > 0)
        snprintf(suffix, sizeof(suffix), " (%llu more like it in the last %.1f s not shown)",
                 (unsigned long long)lim->held, (double)(now - lim->last_ms) / 1000.0);
    lim->last_ms = now > 0 ? now : 1;
    lim->held = 0;
    va_list ap;
    va_start(ap, fmt);
    vwrite(level, sub, file, line, suffix[0] ? suffix : NULL, fmt, ap);
    va_end(ap);
}
