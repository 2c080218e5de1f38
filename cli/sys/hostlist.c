/* Slurm's host lists and count lists (cli/sys/hostlist.h). A leaf. */
#include "cli/sys/hostlist.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define NAME_MAX_LEN 255 /* a host name */
#define MAX_RANGES 4096  /* numbers and ranges in one host's brackets, all groups together */
#define MAX_GROUPS 16    /* bracket groups in one host */

struct range {
    unsigned long lo, hi;
    int width;
};

/* A host pattern: literal pieces between bracket groups. lit[i] precedes group i; lit[ngroups]
 * ends it. */
struct pattern {
    const char *lit[MAX_GROUPS + 1];
    size_t litlen[MAX_GROUPS + 1];
    int ngroups;
    int first[MAX_GROUPS + 1]; /* group g's ranges are r[first[g]] .. r[first[g + 1]) */
    struct range r[MAX_RANGES];
    int nr;
};

static int fail(char *why, size_t whyn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *why, size_t whyn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whyn, fmt, ap);
    va_end(ap);
    return -1;
}

static bool digits(const char *s, size_t n)
{
    if (n == 0 || n > 9) /* up to 999999999: no overflow, and wider is not a host number */
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

/* One bracket group's text (between '[' and ']') into p's ranges. */
static int parse_group(struct pattern *p, const char *s, size_t n, const char *host, char *why,
                       size_t whyn)
{
    if (n == 0)
        return fail(why, whyn, "empty brackets in '%s'", host);
    for (size_t i = 0; i <= n;) {
        size_t e = i;
        while (e < n && s[e] != ',')
            e++;
        const char *item = s + i;
        size_t len = e - i;
        const char *dash = memchr(item, '-', len);
        size_t ll = dash ? (size_t)(dash - item) : len;
        size_t hl = dash ? len - ll - 1 : 0;
        if (!digits(item, ll) || (dash && !digits(dash + 1, hl)))
            return fail(why, whyn,
                        "'%.*s' in '%s' is not a number or a range of numbers such as 01-16",
                        (int)len, item, host);
        if (p->nr == MAX_RANGES)
            return fail(why, whyn, "more than %d numbers and ranges in '%s'", MAX_RANGES, host);
        struct range *r = &p->r[p->nr];
        r->lo = strtoul(item, NULL, 10);
        r->hi = dash ? strtoul(dash + 1, NULL, 10) : r->lo;
        r->width = (int)ll;
        if (r->hi < r->lo)
            return fail(why, whyn, "the range '%.*s' in '%s' goes down", (int)len, item, host);
        p->nr++;
        i = e + 1;
    }
    return 0;
}

/* Splits one host pattern (no top-level comma) into literals and groups. */
static int parse_pattern(struct pattern *p, const char *s, size_t n, char *why, size_t whyn)
{
    char host[320];
    snprintf(host, sizeof(host), "%.*s%s", (int)(n > 300 ? 300 : n), s, n > 300 ? "..." : "");
    p->ngroups = 0;
    p->nr = 0;
    size_t i = 0, start = 0;
    while (i < n) {
        if (s[i] == ']')
            return fail(why, whyn, "']' without '[' in '%s'", host);
        if (s[i] != '[') {
            i++;
            continue;
        }
        const char *close = memchr(s + i, ']', n - i);
        if (!close)
            return fail(why, whyn, "'[' without ']' in '%s'", host);
        size_t c = (size_t)(close - s);
        if (memchr(s + i + 1, '[', c - i - 1))
            return fail(why, whyn, "brackets inside brackets in '%s'", host);
        if (p->ngroups == MAX_GROUPS)
            return fail(why, whyn, "more than %d bracket groups in '%s'", MAX_GROUPS, host);
        p->lit[p->ngroups] = s + start;
        p->litlen[p->ngroups] = i - start;
        p->first[p->ngroups] = p->nr;
        if (parse_group(p, s + i + 1, c - i - 1, host, why, whyn) < 0)
            return -1;
        p->ngroups++;
        i = start = c + 1;
    }
    p->lit[p->ngroups] = s + start;
    p->litlen[p->ngroups] = n - start;
    p->first[p->ngroups] = p->nr;
    return 0;
}

/* Hosts a group stands for (capped past max). */
static uint64_t group_size(const struct pattern *p, int g, uint64_t max)
{
    uint64_t k = 0;
    for (int i = p->first[g]; i < p->first[g + 1] && k <= max; i++)
        k += p->r[i].hi - p->r[i].lo + 1;
    return k;
}

/* The idx-th number of group g. */
static void group_at(const struct pattern *p, int g, uint64_t idx, unsigned long *v, int *width)
{
    for (int i = p->first[g]; i < p->first[g + 1]; i++) {
        uint64_t k = p->r[i].hi - p->r[i].lo + 1;
        if (idx < k) {
            *v = p->r[i].lo + (unsigned long)idx;
            *width = p->r[i].width;
            return;
        }
        idx -= k;
    }
}

void ddp__hostlist_free(char **hosts, size_t n)
{
    for (size_t i = 0; hosts && i < n; i++)
        free(hosts[i]);
    free(hosts);
}

/* Appends pattern p's hosts to *out. */
static int emit(const struct pattern *p, char ***out, size_t *n, size_t *cap, char *why,
                size_t whyn)
{
    uint64_t total = 1, size[MAX_GROUPS], idx[MAX_GROUPS] = {0};
    for (int g = 0; g < p->ngroups; g++) {
        size[g] = group_size(p, g, DDP__HOSTLIST_MAX);
        total *= size[g];
        if (*n + total > DDP__HOSTLIST_MAX)
            return fail(why, whyn, "the host list names more than %d hosts", DDP__HOSTLIST_MAX);
    }
    if (*n + total > DDP__HOSTLIST_MAX)
        return fail(why, whyn, "the host list names more than %d hosts", DDP__HOSTLIST_MAX);
    for (uint64_t h = 0; h < total; h++) {
        char name[NAME_MAX_LEN + 2];
        size_t len = 0;
        for (int g = 0; g <= p->ngroups; g++) {
            int w = snprintf(name + len, sizeof(name) - len, "%.*s", (int)p->litlen[g], p->lit[g]);
            len += (size_t)w < sizeof(name) - len ? (size_t)w : sizeof(name) - len - 1;
            if (g == p->ngroups)
                break;
            unsigned long v = 0;
            int width = 0;
            group_at(p, g, idx[g], &v, &width);
            w = snprintf(name + len, sizeof(name) - len, "%0*lu", width, v);
            len += (size_t)w < sizeof(name) - len ? (size_t)w : sizeof(name) - len - 1;
        }
        if (len > NAME_MAX_LEN)
            return fail(why, whyn, "a host name longer than %d characters", NAME_MAX_LEN);
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 16;
            char **m = realloc(*out, nc * sizeof(char *));
            if (!m)
                return fail(why, whyn, "out of memory");
            *out = m;
            *cap = nc;
        }
        if (!((*out)[*n] = strdup(name)))
            return fail(why, whyn, "out of memory");
        (*n)++;
        /* the next combination: the last group turns fastest */
        for (int g = p->ngroups - 1; g >= 0; g--) {
            if (++idx[g] < size[g])
                break;
            idx[g] = 0;
        }
    }
    return 0;
}

int ddp__hostlist_expand(const char *list, char ***out, size_t *n, char *why, size_t whyn)
{
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    struct pattern *p = malloc(sizeof(*p));
    if (!p)
        return fail(why, whyn, "out of memory");
    int rc = 0;
    for (const char *s = list; *s && rc == 0;) {
        /* a host ends at a comma or blank outside brackets */
        size_t e = 0;
        bool in = false;
        while (s[e] && (in || (s[e] != ',' && s[e] != ' ' && s[e] != '\t' && s[e] != '\n'))) {
            in = s[e] == '[' ? true : s[e] == ']' ? false : in;
            e++;
        }
        if (e > 0)
            rc = parse_pattern(p, s, e, why, whyn) < 0 || emit(p, out, n, &cap, why, whyn) < 0 ? -1
                                                                                               : 0;
        s += e;
        if (*s)
            s++;
    }
    free(p);
    if (rc == 0 && *n == 0)
        rc = fail(why, whyn, "the host list is empty");
    if (rc < 0) {
        ddp__hostlist_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int ddp__counts_expand(const char *list, int *out, size_t want, char *why, size_t whyn)
{
    size_t k = 0;
    for (const char *s = list;;) {
        char *end;
        if (*s < '0' || *s > '9')
            return fail(why, whyn, "'%s' is not a count list such as 2(x3),1", list);
        unsigned long v = strtoul(s, &end, 10), times = 1;
        if (v > 1u << 20)
            return fail(why, whyn, "the count %lu in '%s' is too large", v, list);
        if (end[0] == '(') {
            if (end[1] != 'x' || end[2] < '0' || end[2] > '9')
                return fail(why, whyn, "'%s' is not a count list such as 2(x3),1", list);
            times = strtoul(end + 2, &end, 10);
            if (*end != ')' || times == 0)
                return fail(why, whyn, "'%s' is not a count list such as 2(x3),1", list);
            end++;
        }
        if (times > want - k)
            return fail(why, whyn, "'%s' gives more than the %zu node%s of the host list", list,
                        want, want == 1 ? "" : "s");
        for (unsigned long i = 0; i < times; i++)
            out[k++] = (int)v;
        if (*end == '\0')
            break;
        if (*end != ',')
            return fail(why, whyn, "'%s' is not a count list such as 2(x3),1", list);
        s = end + 1;
    }
    if (k != want)
        return fail(why, whyn, "'%s' gives %zu count%s for %zu node%s", list, k, k == 1 ? "" : "s",
                    want, want == 1 ? "" : "s");
    return 0;
}
