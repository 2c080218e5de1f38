/* Implementation of common/util.h. */
#include "common/util.h"
#include "common/err.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

int64_t ddp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t ddp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

ssize_t ddp_read_eintr(int fd, void *p, size_t n)
{
    for (;;) {
        ssize_t r = read(fd, p, n);
        if (r >= 0)
            return r;
        if (errno != EINTR)
            return -errno;
    }
}

ssize_t ddp_write_eintr(int fd, const void *p, size_t n)
{
    for (;;) {
        ssize_t r = write(fd, p, n);
        if (r >= 0)
            return r;
        if (errno != EINTR)
            return -errno;
    }
}

int ddp_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = ddp_write_eintr(fd, c, n);
        if (w < 0)
            return DDP_ESYS;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int ddp_parse_hostport(const char *s, char *host, size_t hostlen, int *port)
{
    const char *colon, *hs = s;
    size_t hl;
    if (!s || !*s)
        return DDP_EINVAL;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':')
            return DDP_EINVAL;
        hs = s + 1;
        hl = (size_t)(end - hs);
        colon = end + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return DDP_EINVAL;
        hl = (size_t)(colon - s);
    }
    if (hl == 0 || hl + 1 > hostlen)
        return DDP_EINVAL;
    char *endp;
    errno = 0;
    long p = strtol(colon + 1, &endp, 10);
    if (errno || *endp || endp == colon + 1 || p < 0 || p > 65535)
        return DDP_EINVAL;
    memcpy(host, hs, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

int ddp_random_bytes(void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = getrandom(c, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return DDP_ESYS;
        }
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

void ddp_freezero(void *p, size_t n)
{
    if (!p)
        return;
    explicit_bzero(p, n);
    free(p);
}

/* The soft limit before ddp_raise_nofile first raised it (valid once raised). */
static rlim_t nofile_was;
static bool nofile_raised;

long ddp_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            return -1;
        if (!nofile_raised) {
            nofile_was = was;
            nofile_raised = true;
        }
    }
    return (long)rl.rlim_cur;
}

void ddp_restore_nofile(void)
{
    struct rlimit rl;
    if (nofile_raised && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = nofile_was;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

size_t ddp_utf8_prefix(const char *s, size_t max)
{
    size_t n = strnlen(s, max + 1);
    if (n <= max)
        return n;
    while (max > 0 && ((unsigned char)s[max] & 0xc0) == 0x80) /* s[max] continues a character */
        max--;
    return max;
}
