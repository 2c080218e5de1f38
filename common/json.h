/*
 * A small JSON reader: the text is checked and cut into tokens once (no tree, no copies); the
 * values are read through token indexes. Enough for the answers of the services we talk to
 * (etcd's JSON gateway): objects, arrays, strings with every escape, numbers, true, false,
 * null. Bounded: nesting 64 deep, 1 Mi tokens; anything else is DDP_EPROTO.
 */
#ifndef DDP_COMMON_JSON_H
#define DDP_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ddp_json_type {
    DDP_J_OBJECT,
    DDP_J_ARRAY,
    DDP_J_STRING,
    DDP_J_NUMBER,
    DDP_J_BOOL,
    DDP_J_NULL
};

struct ddp_jtok {
    enum ddp_json_type type;
    uint32_t start, end; /* the value's text (a string's without its quotes) */
    uint32_t next;       /* the token after this value and everything inside it */
    uint32_t count;      /* object: members; array: elements */
};

struct ddp_json {
    const char *text;
    struct ddp_jtok *tok; /* tok[0] is the top value; an object's members are key, value, ... */
    uint32_t n;
};

/* Parses text[0..len) (one value, blanks around it allowed): 0, or DDP_EPROTO / DDP_ENOMEM. */
int ddp_json_parse(const char *text, size_t len, struct ddp_json *out);
void ddp_json_free(struct ddp_json *j);
/* The value of key in object obj, or -1. */
int ddp_json_get(const struct ddp_json *j, int obj, const char *key);
/* Element i of array arr, or -1. */
int ddp_json_at(const struct ddp_json *j, int arr, uint32_t i);
/* The value at a path of object keys from obj ("header", "revision", NULL), or -1. */
int ddp_json_path(const struct ddp_json *j, int obj, const char *const *keys);
/* String tok, unescaped (\uXXXX as UTF-8) into out (NUL-terminated); its length, or -1 when
 * tok is not a string or out is too small. */
long ddp_json_str(const struct ddp_json *j, int tok, char *out, size_t n);
/* A whole number, written as a number or as a string of one (int64 in gRPC's JSON). */
bool ddp_json_i64(const struct ddp_json *j, int tok, int64_t *out);
bool ddp_json_bool(const struct ddp_json *j, int tok);

#endif
