/* Link rates and sizes as a user writes them: 10Gbit, 100Mbit/s, 1.25GB/s, 16GiB. */
#include "pipeline/plan.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ctype.h>

#include "common/banned.h"

struct unit {
    const char *name;
    double mult;
};

static bool scaled(const char *s, const struct unit *units, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno == ERANGE || !isfinite(v) || v <= 0 || isspace((unsigned char)*s))
        return false;
    for (const struct unit *u = units; u->name; u++)
        if (strcasecmp(end, u->name) == 0 && (u->name[0] || *end == '\0')) {
            /* lower and upper case mean the same except b (bit) and B (byte) */
            const char *b = strpbrk(u->name, "bB");
            if (b && end[b - u->name] != *b)
                continue;
            double r = v * u->mult;
            if (!isfinite(r))
                return false;
            *out = r;
            return true;
        }
    return false;
}

bool ddp__pipe_parse_rate(const char *s, double *bytes_per_s)
{
    static const struct unit units[] = {
        {"", 1},           {"B/s", 1},        {"bit", 0.125},       {"bit/s", 0.125},
        {"bps", 0.125},    {"Kbit", 125},     {"Kbit/s", 125},      {"Kbps", 125},
        {"Mbit", 125e3},   {"Mbit/s", 125e3}, {"Mbps", 125e3},      {"Gbit", 125e6},
        {"Gbit/s", 125e6}, {"Gbps", 125e6},   {"Tbit", 125e9},      {"Tbit/s", 125e9},
        {"Tbps", 125e9},   {"KB/s", 1e3},     {"MB/s", 1e6},        {"GB/s", 1e9},
        {"TB/s", 1e12},    {"KiB/s", 1024.0}, {"MiB/s", 1048576.0}, {"GiB/s", 1073741824.0},
        {NULL, 0}};
    /* at least one bit per second, so that no planned time overflows (see profile.c) */
    double r;
    if (!scaled(s, units, &r) || r < 0.125)
        return false;
    *bytes_per_s = r;
    return true;
}

bool ddp__pipe_parse_bytes(const char *s, double *bytes)
{
    static const struct unit units[] = {{"", 1},
                                        {"B", 1},
                                        {"KB", 1e3},
                                        {"MB", 1e6},
                                        {"GB", 1e9},
                                        {"TB", 1e12},
                                        {"KiB", 1024.0},
                                        {"MiB", 1048576.0},
                                        {"GiB", 1073741824.0},
                                        {"TiB", 1099511627776.0},
                                        {NULL, 0}};
    return scaled(s, units, bytes);
}
