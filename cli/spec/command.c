/* The job spec's command, env and warm keys, and the exec limits they must fit
 * (cli/spec/values.h). */
#include "cli/spec/job.h"
#include "cli/spec/values.h"
#include "cli/spec/ytree.h"
#include "cli/spec/keys.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

int ddp__job_command(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j)
{
    if (n->type == DDP_Y_SCALAR)
        return ddp__jv_str(c, n, DDP_KEY(COMMAND), &j->shell);
    if (n->type != DDP_Y_SEQ || n->n == 0) {
        ddp__jv_err(c, n, "%s must be a list of arguments or a shell command string%s",
                    DDP_KEY(COMMAND), n->type == DDP_Y_SEQ ? ", not an empty list" : "");
        return -1;
    }
    if (!(j->argv = calloc(n->n + 1, sizeof(char *))))
        return -1;
    for (size_t i = 0; i < n->n; i++) {
        if (ddp__jv_scalar(c, n->kids[i], "each command argument") < 0)
            return -1;
        if (!(j->argv[i] = strdup(n->kids[i]->str)))
            return -1;
    }
    if (!j->argv[0][0]) {
        ddp__jv_err(c, n->kids[0], "%s: the program (first element) must not be empty",
                    DDP_KEY(COMMAND));
        return -1;
    }
    return 0;
}

int ddp__job_env(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j)
{
    if (n->type != DDP_Y_MAP) {
        ddp__jv_err(c, n, "%s must be a mapping of variable names to values", DDP_KEY(ENV));
        return -1;
    }
    if (ddp__jv_check_dups(c, n, DDP_KEY(ENV)) < 0)
        return -1;
    if (!(j->env = calloc(n->n / 2 + 1, sizeof(*j->env))))
        return -1;
    for (size_t i = 0; i + 1 < n->n; i += 2) {
        const struct ddp_ynode *k = n->kids[i], *v = n->kids[i + 1];
        if (!ddp__jv_env_name_ok(k->str)) {
            ddp__jv_err(c, k, "%s: '%s' is not a valid variable name (letters, digits, _)",
                        DDP_KEY(ENV), k->str);
            return -1;
        }
        if (ddp__jv_scalar(c, v, "an env value") < 0)
            return -1;
        j->env[j->nenv].key = strdup(k->str);
        j->env[j->nenv].value = strdup(v->str);
        j->nenv++;
    }
    return 0;
}

/* A Python module's dotted name: what `import NAME` takes (ASCII). */
static bool module_name_ok(const char *s)
{
    bool start = true;
    for (; *s; s++) {
        bool letter = *s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z');
        if (*s == '.' && !start)
            start = true;
        else if (letter || (!start && *s >= '0' && *s <= '9'))
            start = false;
        else
            return false;
    }
    return !start;
}

int ddp__job_warm(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j)
{
    if (n->type == DDP_Y_SCALAR) {
        bool on;
        if (ddp__jv_bool(c, n, DDP_KEY(WARM), &on) < 0)
            return -1;
        j->warm_off = !on;
        return 0;
    }
    if (n->type != DDP_Y_MAP) {
        ddp__jv_err(c, n, "%s must be on, off or a mapping with %s", DDP_KEY(WARM),
                    ddp__key_name(DDP_K_WARM_IMPORTS));
        return -1;
    }
    if (ddp__key_check(c, n, DDP_K_WARM) < 0)
        return -1;
    const struct ddp_ynode *im = ddp__key_get(n, DDP_K_WARM_IMPORTS);
    if (!im)
        return 0;
    if (im->type != DDP_Y_SEQ) {
        ddp__jv_err(c, im, "%s must be a list of Python modules ([] for none)",
                    DDP_KEY(WARM_IMPORTS));
        return -1;
    }
    if (!(j->warm_imports = calloc(im->n + 1, sizeof(char *))))
        return -1;
    j->warm_listed = true;
    for (size_t i = 0; i < im->n; i++) {
        if (ddp__jv_scalar(c, im->kids[i], DDP_KEY(WARM_IMPORTS)) < 0)
            return -1;
        if (!module_name_ok(im->kids[i]->str) || strlen(im->kids[i]->str) > 200) {
            ddp__jv_err(c, im->kids[i], "%s: '%s' is not a module name (such as torch or a.b)",
                        DDP_KEY(WARM_IMPORTS), im->kids[i]->str);
            return -1;
        }
        if (!(j->warm_imports[i] = strdup(im->kids[i]->str)))
            return -1;
    }
    return 0;
}

/*
 * The command and env reach every rank through exec(2), whose kernel limits are 128 KiB per
 * string and about 2 MiB for all of them with the inherited environment, and reach remote
 * agents in one frame of at most 1 MiB: a job over these would fail at launch with "Argument
 * list too long", so it is refused here, where the file and line can be named.
 */
#define DDP_JOB_MAX_STRING (128u << 10)
#define DDP_JOB_MAX_EXEC (512u << 10)

int ddp__job_exec_size(const struct ddp__jctx *c, const struct ddp_ynode *root,
                       const struct ddp_job *j)
{
    size_t total = 0;
    const struct ddp_ynode *cmd = ddp__key_get(root, DDP_K_COMMAND),
                           *env = ddp__key_get(root, DDP_K_ENV);
    for (size_t i = 0; j->argv && j->argv[i]; i++) {
        size_t l = strlen(j->argv[i]) + 1;
        if (l > DDP_JOB_MAX_STRING) {
            ddp__jv_err(c, cmd->kids[i], "%s argument %zu is %zu bytes; exec takes at most %u",
                        DDP_KEY(COMMAND), i, l - 1, DDP_JOB_MAX_STRING - 1);
            return -1;
        }
        total += l + sizeof(char *);
    }
    if (j->shell) {
        total += strlen(j->shell) + 1;
        if (strlen(j->shell) + 1 > DDP_JOB_MAX_STRING) {
            ddp__jv_err(c, cmd, "%s is %zu bytes; exec takes at most %u", DDP_KEY(COMMAND),
                        strlen(j->shell), DDP_JOB_MAX_STRING - 1);
            return -1;
        }
    }
    for (size_t i = 0; i < j->nenv; i++) {
        size_t l = strlen(j->env[i].key) + strlen(j->env[i].value) + 2;
        if (l > DDP_JOB_MAX_STRING) {
            ddp__jv_err(c, env->kids[2 * i], "%s: %s=... is %zu bytes; a variable holds at most %u",
                        DDP_KEY(ENV), j->env[i].key, l - 1, DDP_JOB_MAX_STRING - 1);
            return -1;
        }
        total += l + sizeof(char *);
    }
    if (total > DDP_JOB_MAX_EXEC) {
        ddp__jv_err(c, env ? env : cmd,
                    "%s and %s take %zu KiB (%zu variables); a rank's command line and "
                    "environment are limited to %u KiB",
                    DDP_KEY(COMMAND), DDP_KEY(ENV), (total + 1023) / 1024, j->nenv,
                    DDP_JOB_MAX_EXEC >> 10);
        return -1;
    }
    return 0;
}
