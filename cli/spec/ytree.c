/*
 * libyaml events into a located tree (cli/spec/ytree.h). The builder recurses once per nesting
 * level, so depth is limited before it can exhaust the stack; children grow geometrically and
 * duplicates are found by sorting, so a file with a million keys costs O(n log n), not O(n^2);
 * libyaml's terse messages for the usual mistakes (tabs, binary files) are said plainly.
 */
#include "cli/spec/ytree.h"
#include "cli/spec/args.h"
#include "cli/spec/keys.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/banned.h"

struct parse {
    const char *file, *text, *origin;
    size_t len, nodes;
};

void ddp__ytree_free(struct ddp_ynode *n)
{
    if (!n)
        return;
    for (size_t i = 0; i < n->n; i++)
        ddp__ytree_free(n->kids[i]);
    free(n->kids);
    free(n->str);
    free(n);
}

struct ddp_ynode *ddp__ytree_new(enum ddp_ytype t, int line, int col, const char *origin)
{
    struct ddp_ynode *n = calloc(1, sizeof(*n));
    if (n) {
        n->type = t;
        n->line = line;
        n->col = col;
        n->origin = origin;
    }
    return n;
}

int ddp__ytree_add(struct ddp_ynode *p, struct ddp_ynode *k)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 4;
        struct ddp_ynode **v = realloc(p->kids, cap * sizeof(*v));
        if (!v)
            return -1;
        p->kids = v;
        p->cap = cap;
    }
    p->kids[p->n++] = k;
    return 0;
}

struct ddp_ynode *ddp__ytree_get(const struct ddp_ynode *m, const char *key)
{
    for (size_t i = 0; i + 1 < m->n; i += 2)
        if (strcmp(m->kids[i]->str, key) == 0)
            return m->kids[i + 1];
    return NULL;
}

void ddp__ytree_error(const char *file, const struct ddp_ynode *n, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n && n->origin)
        ddp__cli_error("%s: %s", n->origin, msg);
    else if (n)
        ddp__cli_error("%s:%d:%d: %s", file, n->line, n->col, msg);
    else
        ddp__cli_error("%s: %s", file, msg);
}

struct strpos {
    const char *s;
    size_t i;
};

static int cmp_strpos(const void *a, const void *b)
{
    const struct strpos *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

bool ddp__ytree_find_dup(const char *const *strs, size_t n, size_t *dup, size_t *first)
{
    if (n < 2)
        return false;
    struct strpos *v = malloc(n * sizeof(*v));
    if (!v) { /* no memory for the fast way: the slow one still answers */
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (strcmp(strs[i], strs[j]) == 0) {
                    *dup = i;
                    *first = j;
                    return true;
                }
        return false;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = (struct strpos){strs[i], i};
    qsort(v, n, sizeof(*v), cmp_strpos);
    /* In each run of equal strings the first is the earliest and the second the first
     * repeat; the earliest repeat over all runs is the one a reader meets first. */
    bool found = false;
    for (size_t k = 1; k < n; k++)
        if (strcmp(v[k].s, v[k - 1].s) == 0 && (k < 2 || strcmp(v[k - 2].s, v[k].s) != 0) &&
            (!found || v[k].i < *dup)) {
            *dup = v[k].i;
            *first = v[k - 1].i;
            found = true;
        }
    free(v);
    return found;
}

/* Line and column (1-based) of byte offset off in the text. */
static void line_col(const struct parse *ps, size_t off, int *line, int *col)
{
    int l = 1, c = 1;
    for (size_t i = 0; i < off && i < ps->len; i++) {
        if (ps->text[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static void syntax_error(const struct parse *ps, const yaml_parser_t *p)
{
    const char *what = p->problem ? p->problem : "malformed YAML";
    struct ddp_ynode at = {.origin = ps->origin};
    if (p->error == YAML_READER_ERROR) {
        /* Bytes that are not text: libyaml gives an offset, not a mark. */
        line_col(ps, p->problem_offset, &at.line, &at.col);
        if (p->problem_value == 0 && p->problem_offset < ps->len)
            ddp__ytree_error(ps->file, &at, "a NUL byte: a job file is YAML text (is it one?)");
        else if (strstr(what, "UTF-8"))
            ddp__ytree_error(ps->file, &at,
                             "not UTF-8 text (byte 0x%02x): a job file is YAML text (is it one?)",
                             (unsigned)p->problem_value & 0xffu);
        else
            ddp__ytree_error(ps->file, &at, "%s (character 0x%02x): a job file is YAML text", what,
                             (unsigned)p->problem_value);
        return;
    }
    at.line = (int)p->problem_mark.line + 1;
    at.col = (int)p->problem_mark.column + 1;
    size_t off = p->problem_mark.index;
    if ((off < ps->len && ps->text[off] == '\t') || strstr(what, "tab")) {
        ddp__ytree_error(ps->file, &at, "tabs cannot indent YAML: indent with spaces");
        return;
    }
    ddp__ytree_error(ps->file, &at, "YAML syntax error: %s%s%s", what, p->context ? " " : "",
                     p->context ? p->context : "");
}

static struct ddp_ynode *node_at(struct parse *ps, enum ddp_ytype t, const yaml_mark_t *m)
{
    if (++ps->nodes > DDP_YTREE_MAX_NODES) {
        struct ddp_ynode at = {
            .line = (int)m->line + 1, .col = (int)m->column + 1, .origin = ps->origin};
        ddp__ytree_error(ps->file, &at, "more than %d values in one job file", DDP_YTREE_MAX_NODES);
        return NULL;
    }
    struct ddp_ynode *n = ddp__ytree_new(t, (int)m->line + 1, (int)m->column + 1, ps->origin);
    if (!n)
        ddp__cli_error("%s: out of memory", ps->file);
    return n;
}

/* Builds the node for the event just read (ev) and everything under it; depth is ev's. */
static struct ddp_ynode *build(struct parse *ps, yaml_parser_t *p, yaml_event_t *ev, int depth)
{
    struct ddp_ynode *n = NULL;
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        if (!(n = node_at(ps, DDP_Y_SCALAR, &ev->start_mark)))
            return NULL;
        if (memchr(ev->data.scalar.value, '\0', ev->data.scalar.length)) {
            /* "\0" in a double-quoted string: every value ends as a C string (an argument, an
             * environment value), which would end there, silently */
            ddp__ytree_error(ps->file, n,
                             "a NUL character (\\0) in a value: ddprun passes values to "
                             "programs as C strings, which cannot hold one");
            ddp__ytree_free(n);
            return NULL;
        }
        if (!(n->str = strndup((const char *)ev->data.scalar.value, ev->data.scalar.length))) {
            ddp__cli_error("%s: out of memory", ps->file);
            ddp__ytree_free(n);
            return NULL;
        }
        return n;
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        bool map = ev->type == YAML_MAPPING_START_EVENT;
        if (depth > DDP_YTREE_MAX_DEPTH) {
            struct ddp_ynode at = {.line = (int)ev->start_mark.line + 1,
                                   .col = (int)ev->start_mark.column + 1,
                                   .origin = ps->origin};
            ddp__ytree_error(ps->file, &at,
                             "lists and mappings nested more than %d deep (a job spec needs 4)",
                             DDP_YTREE_MAX_DEPTH);
            return NULL;
        }
        yaml_event_type_t end = map ? YAML_MAPPING_END_EVENT : YAML_SEQUENCE_END_EVENT;
        if (!(n = node_at(ps, map ? DDP_Y_MAP : DDP_Y_SEQ, &ev->start_mark)))
            return NULL;
        for (;;) {
            yaml_event_t e;
            if (!yaml_parser_parse(p, &e)) {
                syntax_error(ps, p);
                ddp__ytree_free(n);
                return NULL;
            }
            if (e.type == end) {
                yaml_event_delete(&e);
                return n;
            }
            struct ddp_ynode *k = build(ps, p, &e, depth + 1);
            yaml_event_delete(&e);
            if (!k || ddp__ytree_add(n, k) < 0) {
                if (k)
                    ddp__cli_error("%s: out of memory", ps->file);
                ddp__ytree_free(k);
                ddp__ytree_free(n);
                return NULL;
            }
            if (map && (n->n % 2) == 1 && k->type != DDP_Y_SCALAR) {
                ddp__ytree_error(ps->file, k, "a mapping key must be a plain word");
                ddp__ytree_free(n);
                return NULL;
            }
        }
    }
    case YAML_ALIAS_EVENT: {
        struct ddp_ynode at = {.line = (int)ev->start_mark.line + 1,
                               .col = (int)ev->start_mark.column + 1,
                               .origin = ps->origin};
        ddp__ytree_error(ps->file, &at, "YAML aliases (*name) are not supported in job files");
        return NULL;
    }
    default:
        ddp__cli_error("%s: unexpected YAML event %d", ps->file, (int)ev->type);
        return NULL;
    }
}

int ddp__ytree_parse(const char *file, const char *text, size_t len, const char *origin,
                     struct ddp_ynode **root)
{
    struct parse ps = {.file = file, .text = text, .origin = origin, .len = len};
    yaml_parser_t p;
    yaml_event_t ev;
    struct ddp_ynode *r = NULL;
    int rc = -1, docs = 0;
    if (!yaml_parser_initialize(&p)) {
        ddp__cli_error("%s: out of memory", file);
        return -1;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    for (;;) {
        if (!yaml_parser_parse(&p, &ev)) {
            syntax_error(&ps, &p);
            goto out;
        }
        yaml_event_type_t t = ev.type;
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        if (t == YAML_DOCUMENT_START_EVENT && ++docs > 1) {
            struct ddp_ynode at = {.line = (int)ev.start_mark.line + 1,
                                   .col = (int)ev.start_mark.column + 1,
                                   .origin = origin};
            ddp__ytree_error(file, &at, "a job file holds one YAML document, found a second one");
            yaml_event_delete(&ev);
            goto out;
        }
        if (t == YAML_SCALAR_EVENT || t == YAML_SEQUENCE_START_EVENT ||
            t == YAML_MAPPING_START_EVENT || t == YAML_ALIAS_EVENT) {
            r = build(&ps, &p, &ev, 1);
            yaml_event_delete(&ev);
            if (!r)
                goto out;
            continue;
        }
        yaml_event_delete(&ev);
    }
    *root = r;
    r = NULL;
    rc = 0;
out:
    ddp__ytree_free(r);
    yaml_parser_delete(&p);
    return rc;
}

int ddp__ytree_apply_set(const char *file, struct ddp_ynode **root, const char *set,
                         const char *origin)
{
    const char *eq = strchr(set, '=');
    if (!eq || eq == set) {
        ddp__cli_error("%s: expected KEY=VALUE, with a dotted KEY such as %s", origin,
                       DDP_KEY(ELASTIC_MIN_NODES));
        return -1;
    }
    struct ddp_ynode *val = NULL;
    if (ddp__ytree_parse(file, eq + 1, strlen(eq + 1), origin, &val) < 0)
        return -1;
    if (!val) { /* "--set key=" means an empty string */
        if (!(val = ddp__ytree_new(DDP_Y_SCALAR, 0, 0, origin)) || !(val->str = strdup(""))) {
            ddp__ytree_free(val);
            ddp__cli_error("out of memory");
            return -1;
        }
    }
    if (!*root && !(*root = ddp__ytree_new(DDP_Y_MAP, 0, 0, origin))) {
        ddp__ytree_free(val);
        ddp__cli_error("out of memory");
        return -1;
    }
    char *path = strndup(set, (size_t)(eq - set));
    struct ddp_ynode *cur = *root;
    char *save = NULL, *tok = path ? strtok_r(path, ".", &save) : NULL;
    int rc = -1;
    if (!tok)
        ddp__cli_error("%s: expected KEY=VALUE, with a dotted KEY such as %s", origin,
                       DDP_KEY(ELASTIC_MIN_NODES));
    while (tok) {
        char *next = strtok_r(NULL, ".", &save);
        if (cur->type == DDP_Y_SEQ) {
            char *end;
            long idx = strtol(tok, &end, 10);
            if (*end || idx < 0 || (size_t)idx >= cur->n) {
                ddp__cli_error("%s: '%s' is not an index of the list (0 to %zu)", origin, tok,
                               cur->n ? cur->n - 1 : 0);
                goto out;
            }
            if (!next) {
                ddp__ytree_free(cur->kids[idx]);
                cur->kids[idx] = val;
                val = NULL;
                rc = 0;
                goto out;
            }
            cur = cur->kids[idx];
        } else if (cur->type == DDP_Y_MAP) {
            size_t i;
            for (i = 0; i + 1 < cur->n && strcmp(cur->kids[i]->str, tok) != 0; i += 2)
                ;
            if (i + 1 >= cur->n) { /* a new key */
                struct ddp_ynode *k = ddp__ytree_new(DDP_Y_SCALAR, 0, 0, origin);
                struct ddp_ynode *v = next ? ddp__ytree_new(DDP_Y_MAP, 0, 0, origin) : val;
                if (!k || !v || !(k->str = strdup(tok)) || ddp__ytree_add(cur, k) < 0) {
                    ddp__ytree_free(k);
                    if (v != val)
                        ddp__ytree_free(v);
                    ddp__cli_error("out of memory");
                    goto out;
                }
                if (ddp__ytree_add(cur, v) < 0) {
                    if (v != val)
                        ddp__ytree_free(v);
                    cur->n--; /* the key alone would leave an odd mapping */
                    ddp__ytree_free(k);
                    ddp__cli_error("out of memory");
                    goto out;
                }
                if (!next)
                    val = NULL;
                i = cur->n - 2;
            } else if (!next) {
                ddp__ytree_free(cur->kids[i + 1]);
                cur->kids[i + 1] = val;
                val = NULL;
            }
            if (!next) {
                rc = 0;
                goto out;
            }
            cur = cur->kids[i + 1];
        } else {
            ddp__cli_error("%s: '%s' is inside a value that is not a mapping or a list", origin,
                           tok);
            goto out;
        }
        tok = next;
    }
out:
    free(path);
    ddp__ytree_free(val);
    return rc;
}
