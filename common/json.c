/* A small JSON reader (common/json.h). */
#include "common/json.h"
#include "common/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define JSON_MAX_DEPTH 64
#define JSON_MAX_TOKENS (1u << 20)

struct parser {
    const char *s;
    size_t len, pos;
    struct ddp_jtok *tok;
    uint32_t n, cap;
};

static void skip_ws(struct parser *p)
{
    while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                               p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

static int new_tok(struct parser *p, enum ddp_json_type t, uint32_t *out)
{
    if (p->n == p->cap) {
        if (p->cap >= JSON_MAX_TOKENS)
            return DDP_EPROTO;
        uint32_t cap = p->cap ? p->cap * 2 : 64;
        struct ddp_jtok *nt = realloc(p->tok, cap * sizeof(*nt));
        if (!nt)
            return DDP_ENOMEM;
        p->tok = nt;
        p->cap = cap;
    }
    p->tok[p->n] = (struct ddp_jtok){.type = t, .start = (uint32_t)p->pos};
    *out = p->n++;
    return 0;
}

static int hex4(const char *s, unsigned *v)
{
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d > 15)
            return -1;
        *v = *v << 4 | d;
    }
    return 0;
}

static int parse_string(struct parser *p, uint32_t *out)
{
    p->pos++; /* the opening quote */
    int r = new_tok(p, DDP_J_STRING, out);
    if (r < 0)
        return r;
    while (p->pos < p->len) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            p->tok[*out].end = (uint32_t)p->pos++;
            return 0;
        }
        if (c < 0x20)
            return DDP_EPROTO;
        if (c == '\\') {
            if (p->pos + 1 >= p->len)
                return DDP_EPROTO;
            char e = p->s[p->pos + 1];
            unsigned v;
            if (e == 'u') {
                if (p->pos + 6 > p->len || hex4(p->s + p->pos + 2, &v) < 0)
                    return DDP_EPROTO;
                p->pos += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e))
                return DDP_EPROTO;
            p->pos += 2;
            continue;
        }
        p->pos++;
    }
    return DDP_EPROTO;
}

static int parse_value(struct parser *p, int depth, uint32_t *out)
{
    skip_ws(p);
    if (p->pos >= p->len || depth > JSON_MAX_DEPTH)
        return DDP_EPROTO;
    char c = p->s[p->pos];
    int r;
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        uint32_t me;
        if ((r = new_tok(p, obj ? DDP_J_OBJECT : DDP_J_ARRAY, &me)) < 0)
            return r;
        p->pos++;
        skip_ws(p);
        uint32_t count = 0;
        if (p->pos < p->len && p->s[p->pos] == (obj ? '}' : ']')) {
            p->pos++;
        } else {
            for (;;) {
                uint32_t k;
                if (obj) {
                    skip_ws(p);
                    if (p->pos >= p->len || p->s[p->pos] != '"')
                        return DDP_EPROTO;
                    if ((r = parse_string(p, &k)) < 0)
                        return r;
                    p->tok[k].next = k + 1;
                    skip_ws(p);
                    if (p->pos >= p->len || p->s[p->pos] != ':')
                        return DDP_EPROTO;
                    p->pos++;
                }
                if ((r = parse_value(p, depth + 1, &k)) < 0)
                    return r;
                count++;
                skip_ws(p);
                if (p->pos >= p->len)
                    return DDP_EPROTO;
                if (p->s[p->pos] == ',') {
                    p->pos++;
                    continue;
                }
                if (p->s[p->pos] != (obj ? '}' : ']'))
                    return DDP_EPROTO;
                p->pos++;
                break;
            }
        }
        p->tok[me].end = (uint32_t)p->pos;
        p->tok[me].count = count;
        p->tok[me].next = p->n;
        *out = me;
        return 0;
    }
    if (c == '"') {
        if ((r = parse_string(p, out)) < 0)
            return r;
        p->tok[*out].next = *out + 1;
        return 0;
    }
    static const struct {
        const char *w;
        enum ddp_json_type t;
    } words[] = {{"true", DDP_J_BOOL}, {"false", DDP_J_BOOL}, {"null", DDP_J_NULL}};
    for (size_t k = 0; k < sizeof(words) / sizeof(words[0]); k++) {
        size_t wl = strlen(words[k].w);
        if (p->len - p->pos >= wl && !memcmp(p->s + p->pos, words[k].w, wl)) {
            if ((r = new_tok(p, words[k].t, out)) < 0)
                return r;
            p->pos += wl;
            p->tok[*out].end = (uint32_t)p->pos;
            p->tok[*out].next = *out + 1;
            return 0;
        }
    }
    /* a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
    size_t q = p->pos;
    if (q < p->len && p->s[q] == '-')
        q++;
    size_t d0 = q;
    while (q < p->len && p->s[q] >= '0' && p->s[q] <= '9')
        q++;
    if (q == d0 || (p->s[d0] == '0' && q - d0 > 1))
        return DDP_EPROTO;
    if (q < p->len && p->s[q] == '.') {
        size_t f = ++q;
        while (q < p->len && p->s[q] >= '0' && p->s[q] <= '9')
            q++;
        if (q == f)
            return DDP_EPROTO;
    }
    if (q < p->len && (p->s[q] == 'e' || p->s[q] == 'E')) {
        q++;
        if (q < p->len && (p->s[q] == '+' || p->s[q] == '-'))
            q++;
        size_t e = q;
        while (q < p->len && p->s[q] >= '0' && p->s[q] <= '9')
            q++;
        if (q == e)
            return DDP_EPROTO;
    }
    if ((r = new_tok(p, DDP_J_NUMBER, out)) < 0)
        return r;
    p->pos = q;
    p->tok[*out].end = (uint32_t)q;
    p->tok[*out].next = *out + 1;
    return 0;
}

int ddp_json_parse(const char *text, size_t len, struct ddp_json *out)
{
    if (len >= UINT32_MAX)
        return DDP_EPROTO;
    struct parser p = {.s = text, .len = len};
    uint32_t top;
    int r = parse_value(&p, 0, &top);
    if (r == 0) {
        skip_ws(&p);
        if (p.pos != p.len)
            r = DDP_EPROTO;
    }
    if (r < 0) {
        free(p.tok);
        return r;
    }
    *out = (struct ddp_json){.text = text, .tok = p.tok, .n = p.n};
    return 0;
}

void ddp_json_free(struct ddp_json *j)
{
    free(j->tok);
    j->tok = NULL;
    j->n = 0;
}

int ddp_json_get(const struct ddp_json *j, int obj, const char *key)
{
    if (obj < 0 || (uint32_t)obj >= j->n || j->tok[obj].type != DDP_J_OBJECT)
        return -1;
    size_t kl = strlen(key);
    uint32_t t = (uint32_t)obj + 1;
    for (uint32_t m = 0; m < j->tok[obj].count; m++) {
        const struct ddp_jtok *k = &j->tok[t];
        /* keys are compared as written: the keys we look up need no escapes */
        bool hit = k->end - k->start == kl && !memcmp(j->text + k->start, key, kl);
        if (hit)
            return (int)(t + 1);
        t = j->tok[t + 1].next;
    }
    return -1;
}

int ddp_json_at(const struct ddp_json *j, int arr, uint32_t i)
{
    if (arr < 0 || (uint32_t)arr >= j->n || j->tok[arr].type != DDP_J_ARRAY ||
        i >= j->tok[arr].count)
        return -1;
    uint32_t t = (uint32_t)arr + 1;
    while (i--)
        t = j->tok[t].next;
    return (int)t;
}

int ddp_json_path(const struct ddp_json *j, int obj, const char *const *keys)
{
    for (; *keys && obj >= 0; keys++)
        obj = ddp_json_get(j, obj, *keys);
    return obj;
}

static size_t utf8(unsigned cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

long ddp_json_str(const struct ddp_json *j, int tok, char *out, size_t n)
{
    if (tok < 0 || (uint32_t)tok >= j->n || j->tok[tok].type != DDP_J_STRING || n == 0)
        return -1;
    const char *s = j->text + j->tok[tok].start, *e = j->text + j->tok[tok].end;
    size_t o = 0;
    while (s < e) {
        char buf[4];
        size_t bl = 1;
        if (*s != '\\') {
            buf[0] = *s++;
        } else {
            char c = s[1];
            s += 2;
            if (c == 'u') {
                unsigned cp, lo;
                hex4(s, &cp); /* checked by the parser */
                s += 4;
                /* a surrogate pair makes one code point; a lone surrogate is U+FFFD */
                if (cp >= 0xD800 && cp < 0xDC00 && e - s >= 6 && s[0] == '\\' && s[1] == 'u' &&
                    hex4(s + 2, &lo) == 0 && lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    s += 6;
                } else if (cp >= 0xD800 && cp < 0xE000) {
                    cp = 0xFFFD;
                }
                bl = utf8(cp, buf);
            } else {
                buf[0] = c == 'b'   ? '\b'
                         : c == 'f' ? '\f'
                         : c == 'n' ? '\n'
                         : c == 'r' ? '\r'
                         : c == 't' ? '\t'
                                    : c;
            }
        }
        if (o + bl >= n)
            return -1;
        memcpy(out + o, buf, bl);
        o += bl;
    }
    out[o] = '\0';
    return (long)o;
}

bool ddp_json_i64(const struct ddp_json *j, int tok, int64_t *out)
{
    if (tok < 0 || (uint32_t)tok >= j->n ||
        (j->tok[tok].type != DDP_J_NUMBER && j->tok[tok].type != DDP_J_STRING))
        return false;
    char num[32];
    size_t l = j->tok[tok].end - j->tok[tok].start;
    if (l == 0 || l >= sizeof(num))
        return false;
    memcpy(num, j->text + j->tok[tok].start, l);
    num[l] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(num, &end, 10);
    if (*end || errno)
        return false;
    *out = v;
    return true;
}

bool ddp_json_bool(const struct ddp_json *j, int tok)
{
    return tok >= 0 && (uint32_t)tok < j->n && j->tok[tok].type == DDP_J_BOOL &&
           j->text[j->tok[tok].start] == 't';
}
