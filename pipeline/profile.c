/* PipeDream's graph.txt: read with a message at file:line:col for anything malformed, and
 * written back as graph.py writes it. */
#include "pipeline/profile.h"

#include "common/err.h"
#include "common/htab.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/banned.h"

struct idnode {
    struct ddp_hnode h;
    size_t idx;
};

struct parser {
    const char *name;
    char *err;
    size_t errlen;
    struct ddp_profile *p;
    size_t cap_layers, cap_edges;
    struct ddp_htab ids;
    struct idnode *idnodes; /* parallel to p->layers; re-keyed after growth */
};

static int fail(struct parser *ps, int line, size_t col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct parser *ps, int line, size_t col, const char *fmt, ...)
{
    int n = snprintf(ps->err, ps->errlen, "%s:%d:%zu: ", ps->name, line, col);
    if (n >= 0 && (size_t)n < ps->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return DDP_EINVAL;
}

/* The token [s, e) of one line, for splitting on a separator. */
struct tok {
    const char *s, *e;
};

/* Splits [s, e) on sep into at most max tokens; returns how many there are (max+1 if more). */
static size_t split(const char *s, const char *e, const char *sep, struct tok *out, size_t max)
{
    size_t n = 0, sl = strlen(sep);
    for (;;) {
        const char *hit = NULL;
        for (const char *q = s; q + sl <= e; q++)
            if (memcmp(q, sep, sl) == 0) {
                hit = q;
                break;
            }
        if (n == max)
            return max + 1;
        out[n].s = s;
        out[n++].e = hit ? hit : e;
        if (!hit)
            return n;
        s = hit + sl;
    }
}

/*
 * A number from 0 to PROFILE_MAX filling [s, e) exactly. The bound (1e18 ms is 3e7 years,
 * 1e18 bytes an exabyte) keeps every sum and product the planner forms finite: sums over
 * layers, times machine counts, over the slowest bandwidth it accepts.
 */
#define PROFILE_MAX 1e18
/* A profile file larger than this is refused (the released repository's profiles are at most 35
 * KB). */
#define PROFILE_MAX_BYTES (64 << 20)

static bool number(const char *s, const char *e, double *v)
{
    char buf[64];
    size_t n = (size_t)(e - s);
    if (n == 0 || n >= sizeof(buf))
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (buf[0] == ' ' || buf[0] == '\t')
        return false;
    char *end;
    errno = 0;
    double d = strtod(buf, &end);
    if (*end || errno == ERANGE || !isfinite(d) || d < 0 || d > PROFILE_MAX)
        return false;
    *v = d == 0 ? 0 : d; /* no -0 */
    return true;
}

static size_t col_of(const char *line, const char *at)
{
    return (size_t)(at - line) + 1;
}

static const char *const fields[] = {"forward_compute_time", "backward_compute_time",
                                     "activation_size", "parameter_size"};

/* "key=value" with the expected key: returns the value's start, or NULL. */
static const char *keyed(struct tok t, const char *key)
{
    size_t kl = strlen(key);
    if ((size_t)(t.e - t.s) <= kl || memcmp(t.s, key, kl) != 0 || t.s[kl] != '=')
        return NULL;
    return t.s + kl + 1;
}

/* "key=K" with lo <= K <= hi into *out; -1 if not. */
static int keyed_int(struct tok t, const char *key, long lo, long hi, int *out)
{
    const char *v = keyed(t, key);
    char *e2 = NULL;
    long x = v ? strtol(v, &e2, 10) : -1;
    if (!v || e2 != t.e || v == e2 || x < lo || x > hi)
        return -1;
    *out = (int)x;
    return 0;
}

/* "[A; B; ...]": the sum, in order, as graph.py takes it. */
static bool number_list(const char *s, const char *e, double *v)
{
    if (e - s < 2 || *s != '[' || e[-1] != ']')
        return false;
    double sum = 0;
    struct tok part[2];
    for (const char *q = s + 1;;) {
        size_t n = split(q, e - 1, "; ", part, 1);
        const char *pe = n > 1 ? part[0].e : e - 1;
        double x;
        if (!number(q, pe, &x))
            return false;
        sum += x;
        if (sum > PROFILE_MAX)
            return false;
        if (n == 1)
            break;
        q = pe + 2;
    }
    *v = sum;
    return true;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*arr, nc * elem);
    if (!q)
        return DDP_ENOMEM;
    *arr = q;
    *cap = nc;
    return 0;
}

static char *dup_range(const char *s, const char *e)
{
    char *q = malloc((size_t)(e - s) + 1);
    if (q) {
        memcpy(q, s, (size_t)(e - s));
        q[e - s] = '\0';
    }
    return q;
}

static bool bad_id(struct tok t)
{
    if (t.s == t.e)
        return true;
    for (const char *q = t.s; q < t.e; q++)
        if (*q == ' ' || *q == '\t')
            return true;
    return false;
}

static int node_line(struct parser *ps, const char *line, const char *end, int lineno)
{
    struct tok t[6];
    size_t n = split(line, end, " -- ", t, 5);
    if (n < 3 || n > 5)
        return fail(ps, lineno, 1,
                    "a layer line has 3 to 5 fields separated by ' -- ' (ID -- DESCRIPTION -- "
                    "forward_compute_time=..., ...[ -- stage_id=K[ -- replicas=R]]), this one "
                    "has %s",
                    n > 5    ? "more"
                    : n == 2 ? "2"
                             : "1");
    if (bad_id(t[0]))
        return fail(ps, lineno, 1, "a layer id is one word, without spaces");
    struct ddp_layer L = {.stage = -1, .line = lineno};
    struct tok m[5];
    size_t nm = split(t[2].s, t[2].e, ", ", m, 4);
    if (nm != 4)
        return fail(ps, lineno, col_of(line, t[2].s),
                    "expected forward_compute_time=MS, backward_compute_time=MS, "
                    "activation_size=BYTES, parameter_size=BYTES");
    double *dst[4] = {&L.fwd_ms, &L.bwd_ms, &L.act_bytes, &L.param_bytes};
    for (int k = 0; k < 4; k++) {
        const char *v = keyed(m[k], fields[k]);
        if (!v)
            return fail(ps, lineno, col_of(line, m[k].s), "expected '%s=' here", fields[k]);
        bool ok = k == 2 && *v == '[' ? number_list(v, m[k].e, dst[k]) : number(v, m[k].e, dst[k]);
        if (!ok)
            return fail(ps, lineno, col_of(line, v), "%s: '%.*s' is not a number from 0 to 1e18%s",
                        fields[k], (int)(m[k].e - v), v,
                        k == 2 ? " (or a list [A; B] of such, summing to at most 1e18)" : "");
    }
    if (n >= 4 && keyed_int(t[3], "stage_id", 0, 1000000, &L.stage) < 0)
        return fail(ps, lineno, col_of(line, t[3].s), "expected stage_id=K (K >= 0)");
    if (n == 5 && keyed_int(t[4], "replicas", 1, 1000000, &L.replicas) < 0)
        return fail(ps, lineno, col_of(line, t[4].s),
                    "expected replicas=R (R >= 1: the workers of the layer's stage)");
    struct ddp_profile *p = ps->p;
    if (ddp_htab_find(&ps->ids, t[0].s, (size_t)(t[0].e - t[0].s)))
        return fail(ps, lineno, 1, "layer '%.*s' is defined twice", (int)(t[0].e - t[0].s), t[0].s);
    size_t oldcap = ps->cap_layers;
    if (grow((void **)&p->layers, &ps->cap_layers, p->nlayers + 1, sizeof(*p->layers)) < 0)
        return DDP_ENOMEM;
    if (ps->cap_layers != oldcap) {
        /* the id nodes point into the layers' strings, which do not move; only the array does */
        void *q = realloc(ps->idnodes, ps->cap_layers * sizeof(*ps->idnodes));
        if (!q)
            return DDP_ENOMEM;
        ps->idnodes = q;
        ddp_htab_release(&ps->ids);
        if (ddp_htab_init(&ps->ids) < 0)
            return DDP_ENOMEM;
        for (size_t k = 0; k < p->nlayers; k++)
            ddp_htab_insert(&ps->ids, &ps->idnodes[k].h);
    }
    L.id = dup_range(t[0].s, t[0].e);
    L.desc = dup_range(t[1].s, t[1].e);
    if (!L.id || !L.desc) {
        free(L.id);
        free(L.desc);
        return DDP_ENOMEM;
    }
    struct idnode *in = &ps->idnodes[p->nlayers];
    *in = (struct idnode){.h = {.key = (const uint8_t *)L.id, .klen = (uint32_t)strlen(L.id)},
                          .idx = p->nlayers};
    p->layers[p->nlayers++] = L;
    ddp_htab_insert(&ps->ids, &in->h);
    return 0;
}

static int edge_line(struct parser *ps, const char *line, const char *end, int lineno)
{
    const char *s = line;
    while (s < end && (*s == '\t' || *s == ' '))
        s++;
    struct tok t[3];
    size_t n = split(s, end, " -- ", t, 2);
    if (n != 2 || bad_id(t[0]) || bad_id(t[1]))
        return fail(ps, lineno, col_of(line, s), "an edge line is '<TAB>FROM -- TO'");
    size_t idx[2];
    for (int k = 0; k < 2; k++) {
        struct ddp_hnode *h = ddp_htab_find(&ps->ids, t[k].s, (size_t)(t[k].e - t[k].s));
        if (!h)
            return fail(ps, lineno, col_of(line, t[k].s),
                        "edge names layer '%.*s', which no line before it defines",
                        (int)(t[k].e - t[k].s), t[k].s);
        idx[k] = ((struct idnode *)h)->idx;
    }
    if (idx[0] == idx[1])
        return fail(ps, lineno, col_of(line, s), "edge from layer '%s' to itself",
                    ps->p->layers[idx[0]].id);
    struct ddp_profile *p = ps->p;
    if (grow((void **)&p->edges, &ps->cap_edges, p->nedges + 1, sizeof(*p->edges)) < 0)
        return DDP_ENOMEM;
    p->edges[p->nedges][0] = idx[0];
    p->edges[p->nedges][1] = idx[1];
    p->nedges++;
    return 0;
}

/* Kahn's algorithm; names a layer on a cycle when there is one. */
static int check_acyclic(struct parser *ps)
{
    struct ddp_profile *p = ps->p;
    size_t *indeg = calloc(p->nlayers + 1, sizeof(size_t)), *queue = NULL;
    size_t *first = calloc(p->nlayers + 1, sizeof(size_t)), *adj = NULL;
    int r = DDP_ENOMEM;
    if (!indeg || !first)
        goto out;
    queue = malloc((p->nlayers + 1) * sizeof(size_t));
    adj = malloc((p->nedges + 1) * sizeof(size_t));
    if (!queue || !adj)
        goto out;
    for (size_t e = 0; e < p->nedges; e++) {
        indeg[p->edges[e][1]]++;
        first[p->edges[e][0] + 1]++;
    }
    for (size_t k = 0; k < p->nlayers; k++)
        first[k + 1] += first[k];
    size_t *fill = calloc(p->nlayers + 1, sizeof(size_t));
    if (!fill)
        goto out;
    for (size_t e = 0; e < p->nedges; e++) {
        size_t u = p->edges[e][0];
        adj[first[u] + fill[u]++] = p->edges[e][1];
    }
    free(fill);
    size_t head = 0, tail = 0;
    for (size_t k = 0; k < p->nlayers; k++)
        if (indeg[k] == 0)
            queue[tail++] = k;
    while (head < tail) {
        size_t u = queue[head++];
        for (size_t a = first[u]; a < first[u + 1]; a++)
            if (--indeg[adj[a]] == 0)
                queue[tail++] = adj[a];
    }
    r = 0;
    if (tail < p->nlayers)
        for (size_t k = 0; k < p->nlayers; k++)
            if (indeg[k]) {
                r = fail(ps, p->layers[k].line, 1, "the edges make a cycle through layer '%s'",
                         p->layers[k].id);
                break;
            }
out:
    free(indeg);
    free(first);
    free(queue);
    free(adj);
    return r;
}

int ddp__profile_parse(const char *text, size_t len, const char *name, struct ddp_profile *p,
                       char *err, size_t errlen)
{
    *p = (struct ddp_profile){0};
    struct parser ps = {.name = name, .err = err, .errlen = errlen, .p = p};
    if (errlen)
        err[0] = '\0';
    int r = ddp_htab_init(&ps.ids);
    if (r < 0)
        return r;
    const char *s = text, *end = text + len;
    int lineno = 0;
    while (s < end && r == 0) {
        const char *nl = memchr(s, '\n', (size_t)(end - s)), *e = nl ? nl : end;
        lineno++;
        if (lineno > 100000000) {
            r = fail(&ps, lineno, 1, "too many lines");
            break;
        }
        size_t llen = (size_t)(e - s);
        if (llen && s[llen - 1] == '\r')
            llen--;
        const char *le = s + llen;
        if (memchr(s, '\0', llen))
            r = fail(&ps, lineno, 1, "a NUL byte: this is not a text file");
        else {
            const char *q = s;
            while (q < le && (*q == ' ' || *q == '\t'))
                q++;
            if (q == le)
                ; /* blank */
            else if (*s == '\t')
                r = edge_line(&ps, s, le, lineno);
            else
                r = node_line(&ps, s, le, lineno);
        }
        s = nl ? nl + 1 : end;
    }
    if (r == 0 && p->nlayers == 0)
        r = fail(&ps, lineno ? lineno : 1, 1, "no layers: a profile has a line per layer");
    if (r == 0)
        r = check_acyclic(&ps);
    ddp_htab_release(&ps.ids);
    free(ps.idnodes);
    if (r < 0) {
        if (r == DDP_ENOMEM && errlen)
            snprintf(err, errlen, "%s: out of memory", name);
        ddp__profile_release(p);
    }
    return r;
}

int ddp__profile_load(const char *path, struct ddp_profile *p, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open profile '%s': %s", path, strerror(errno));
        return DDP_ESYS;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    int r = 0;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "profile '%s' is not a regular file", path);
        fclose(f);
        return DDP_EINVAL;
    }
    for (;;) {
        if (len >= PROFILE_MAX_BYTES) {
            r = DDP_EINVAL;
            snprintf(err, errlen, "profile '%s' is larger than %d MiB: not a graph.txt", path,
                     PROFILE_MAX_BYTES >> 20);
            break;
        }
        if (len == cap) {
            size_t nc = cap ? cap * 2 : 65536;
            char *q = realloc(text, nc);
            if (!q) {
                r = DDP_ENOMEM;
                snprintf(err, errlen, "%s: out of memory", path);
                break;
            }
            text = q;
            cap = nc;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                r = DDP_ESYS;
                snprintf(err, errlen, "cannot read profile '%s': %s", path, strerror(errno));
            }
            break;
        }
    }
    fclose(f);
    if (r == 0)
        r = ddp__profile_parse(text, len, path, p, err, errlen);
    free(text);
    return r;
}

void ddp__profile_pyfloat(double v, char *out, size_t outlen)
{
    if (!isfinite(v)) {
        snprintf(out, outlen, "%s", isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
        return;
    }
    /* the shortest digits that read back as v, then Python's layout: positional for
     * exponents -4..15 with at least one decimal, else d.ddde+XX */
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof(e), "%.*e", prec - 1, v);
        if (strtod(e, NULL) == v)
            break;
    }
    char digits[20];
    size_t nd = 0;
    const char *q = e;
    bool neg = *q == '-';
    if (neg)
        q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.')
            digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    char buf[400];
    size_t o = 0;
    if (neg)
        buf[o++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            buf[o++] = '0';
            buf[o++] = '.';
            for (int z = 0; z < -exp10 - 1; z++)
                buf[o++] = '0';
            for (size_t k = 0; k < nd; k++)
                buf[o++] = digits[k];
        } else {
            for (int k = 0; k <= exp10; k++)
                buf[o++] = (size_t)k < nd ? digits[k] : '0';
            buf[o++] = '.';
            if ((size_t)exp10 + 1 < nd)
                for (size_t k = (size_t)exp10 + 1; k < nd; k++)
                    buf[o++] = digits[k];
            else
                buf[o++] = '0';
        }
        buf[o] = '\0';
    } else {
        buf[o++] = digits[0];
        if (nd > 1) {
            buf[o++] = '.';
            for (size_t k = 1; k < nd; k++)
                buf[o++] = digits[k];
        }
        snprintf(buf + o, sizeof(buf) - o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
    snprintf(out, outlen, "%s", buf);
}

int ddp__profile_write(const struct ddp_profile *p, FILE *f)
{
    for (size_t k = 0; k < p->nlayers; k++) {
        const struct ddp_layer *L = &p->layers[k];
        char act[64];
        ddp__profile_pyfloat(L->act_bytes, act, sizeof(act));
        fprintf(f,
                "%s -- %s -- forward_compute_time=%.3f, backward_compute_time=%.3f, "
                "activation_size=%s, parameter_size=%.3f",
                L->id, L->desc, L->fwd_ms, L->bwd_ms, act, L->param_bytes);
        if (L->stage >= 0)
            fprintf(f, " -- stage_id=%d", L->stage);
        if (L->stage >= 0 && L->replicas > 0)
            fprintf(f, " -- replicas=%d", L->replicas);
        fputc('\n', f);
    }
    /* graph.py prints each layer's incoming edges, layer by layer */
    for (size_t k = 0; k < p->nlayers; k++)
        for (size_t e = 0; e < p->nedges; e++)
            if (p->edges[e][1] == k)
                fprintf(f, "\t%s -- %s\n", p->layers[p->edges[e][0]].id, p->layers[k].id);
    return fflush(f) == 0 && !ferror(f) ? 0 : DDP_ESYS;
}

void ddp__profile_release(struct ddp_profile *p)
{
    for (size_t k = 0; k < p->nlayers; k++) {
        free(p->layers[k].id);
        free(p->layers[k].desc);
    }
    free(p->layers);
    free(p->edges);
    *p = (struct ddp_profile){0};
}
