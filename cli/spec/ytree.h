/*
 * A YAML document as a small tree whose nodes remember where they came from (line and column
 * in the job file, or the --set that made them), built from libyaml's events with limits that
 * keep a hostile file from exhausting the stack, memory or time.
 */
#ifndef DDP_CLI_YTREE_H
#define DDP_CLI_YTREE_H

#include <stdbool.h>
#include <stddef.h>

/* Nesting deeper than this is refused (a job spec needs 4 levels). */
#define DDP_YTREE_MAX_DEPTH 64
/* More values than this in one document are refused (100,000 nodes need about 300,000). */
#define DDP_YTREE_MAX_NODES 1000000

enum ddp_ytype { DDP_Y_SCALAR, DDP_Y_SEQ, DDP_Y_MAP };

struct ddp_ynode {
    enum ddp_ytype type;
    int line, col;           /* 1-based, in the job file */
    const char *origin;      /* "--set a.b=..." for overrides (borrowed), else NULL */
    char *str;               /* scalar text */
    struct ddp_ynode **kids; /* seq items; map: key, value, key, value... */
    size_t n, cap;
};

/*
 * Parses one YAML document from text[0..len) into *root (NULL for an empty document).
 * file names the text in messages; origin, when not NULL, labels every node made (a --set)
 * and replaces file:line:col in messages. Aliases, a second document, nesting deeper than
 * DDP_YTREE_MAX_DEPTH and more than DDP_YTREE_MAX_NODES values are errors. On error prints
 * one message (ddp__cli_error) and returns -1.
 */
int ddp__ytree_parse(const char *file, const char *text, size_t len, const char *origin,
                     struct ddp_ynode **root);

void ddp__ytree_free(struct ddp_ynode *n);

/* A new node at line:col (0 for made-up nodes) labelled origin; NULL when out of memory. */
struct ddp_ynode *ddp__ytree_new(enum ddp_ytype t, int line, int col, const char *origin);
/* Appends k to p's children (growing geometrically); -1 when out of memory. */
int ddp__ytree_add(struct ddp_ynode *p, struct ddp_ynode *k);

/* The value of key in mapping m, or NULL. Linear: for the few fixed keys of a schema. */
struct ddp_ynode *ddp__ytree_get(const struct ddp_ynode *m, const char *key);

/*
 * Finds the first string of strs[0..n) (in order) equal to an earlier one, in O(n log n):
 * true with *dup its index and *first the earlier one's, or false when all differ.
 */
bool ddp__ytree_find_dup(const char *const *strs, size_t n, size_t *dup, size_t *first);

/* "FILE:LINE:COL: message" (or "--set ...: message") for node n (NULL: the file alone). */
void ddp__ytree_error(const char *file, const struct ddp_ynode *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Applies set ("KEY=VALUE", KEY dotted: a.b.0.c) to *root, making the mappings a new key
 * needs; VALUE is YAML. origin labels the nodes made and must outlive them. -1 after a
 * message when the path cannot be followed.
 */
int ddp__ytree_apply_set(const char *file, struct ddp_ynode **root, const char *set,
                         const char *origin);

#endif
