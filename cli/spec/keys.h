/*
 * The job file's keys (cli/spec/keys.def): their table, and the loader's generic part: the
 * keys a section allows, and the values it reads alone (cli/spec/keys.c).
 */
#ifndef DDP_CLI_SPEC_KEYS_H
#define DDP_CLI_SPEC_KEYS_H

#include <stdbool.h>
#include <stddef.h>

#include "cli/spec/values.h"

enum ddp__key_id {
#define DDP_SECT(id, path) DDP_K_##id,
#define DDP_CUSTOM(id, path, dflt) DDP_K_##id,
#define DDP_VAL(id, path, kind, field, lo, hi, dflt, unset) DDP_K_##id,
#include "cli/spec/keys.def"
#undef DDP_SECT
#undef DDP_CUSTOM
#undef DDP_VAL
    DDP_K__COUNT,
    DDP_K_TOP = -1 /* the job file itself, as the section of the top keys */
};

enum ddp__key_kind {
    DDP_KK_SECT,
    DDP_KK_CUSTOM,
    DDP_KK_STR,
    DDP_KK_PATH_,
    DDP_KK_INT,
    DDP_KK_BOOL,
    DDP_KK_DUR,
    DDP_KK_DUR_POS,
};

struct ddp__key {
    const char *path; /* "elastic.min_nodes" */
    enum ddp__key_kind kind;
    size_t off; /* a value's field in struct ddp_job */
    long lo, hi;
    const char *dflt;  /* as a user writes it, or NULL */
    const char *unset; /* what plan shows for a NULL string, or NULL */
};

extern const struct ddp__key ddp__keys[DDP_K__COUNT];

/* Each key's place in the job file and default, in every file that includes this one (static:
 * the files that only name keys, such as cli/spec/args.c, a leaf, call nothing for it). */
static const char *const ddp__key_path[DDP_K__COUNT] = {
#define DDP_SECT(id, path) path,
#define DDP_CUSTOM(id, path, dflt) path,
#define DDP_VAL(id, path, kind, field, lo, hi, dflt, unset) path,
#include "cli/spec/keys.def"
#undef DDP_SECT
#undef DDP_CUSTOM
#undef DDP_VAL
};
static const char *const ddp__key_default[DDP_K__COUNT] = {
#define DDP_SECT(id, path) NULL,
#define DDP_CUSTOM(id, path, dflt) dflt,
#define DDP_VAL(id, path, kind, field, lo, hi, dflt, unset) dflt,
#include "cli/spec/keys.def"
#undef DDP_SECT
#undef DDP_CUSTOM
#undef DDP_VAL
};

/* A key's place in the job file, "elastic.min_nodes", for messages. */
#define DDP_KEY(id) (ddp__key_path[DDP_K_##id])
/* Its default as a user writes it ("5s"), or NULL. */
#define DDP_KEY_DEFAULT(id) (ddp__key_default[DDP_K_##id])

/* Its name in its section ("min_nodes"). */
const char *ddp__key_name(int id);
/* The section it is in, or DDP_K_TOP. */
int ddp__key_parent(int id);
/* Node m's value of key id (m is the node of id's section), or NULL. */
struct ddp_ynode *ddp__key_get(const struct ddp_ynode *m, int id);
/* m (the node of section sect, DDP_K_TOP for the whole file) must be a mapping of its keys,
 * each at most once; an unknown one is named with the keys it could be. */
int ddp__key_check(const struct ddp__jctx *c, const struct ddp_ynode *m, int sect);
/* The same, naming m as where says ("a node"). */
int ddp__key_check_in(const struct ddp__jctx *c, const struct ddp_ynode *m, int sect,
                      const char *where);

struct ddp_job;
/* Key id's value from node n, by its kind, into its field of j. */
int ddp__key_read(const struct ddp__jctx *c, const struct ddp_ynode *n, int id, struct ddp_job *j);
/* Every value of section sect that m (its node) gives. */
int ddp__key_read_section(const struct ddp__jctx *c, const struct ddp_ynode *m, int sect,
                          struct ddp_job *j);
/* Every value's default; 0, or -1 when out of memory. */
int ddp__key_defaults(struct ddp_job *j);
/* Every path value made absolute (relative to basedir, the job file's folder). */
int ddp__key_resolve_paths(struct ddp_job *j, const char *basedir);

#endif
