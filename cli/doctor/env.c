/*
 * The environment `ddprun doctor` runs its checks in on a node: what the job's ranks get there
 * (cli/agent/rank_env.c), so that a program, a python and its torch are looked up as they will be.
 * On a node reached by SSH: the node's session, then the launching shell's variables the
 * export rule passes (PATH among them), then the job's env; here and through srun (which passes
 * this environment): this environment, then the job's env.
 */
#include "cli/doctor/doctor.h"
#include "cli/spec/job.h"
#include "common/buf.h"

#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* A name the shell can export: [A-Za-z_][A-Za-z0-9_]*. */
static bool shell_name(const char *kv)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv || (kv[0] >= '0' && kv[0] <= '9'))
        return false;
    for (const char *c = kv; c < eq; c++)
        if (!(*c == '_' || (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
              (*c >= '0' && *c <= '9')))
            return false;
    return true;
}

/* 'word' for sh, a quote inside written '\'' */
static void put_quoted(struct ddp_buf *b, const char *w)
{
    ddp_buf_put(b, "'", 1);
    for (const char *c = w; *c; c++)
        if (*c == '\'')
            ddp_buf_put(b, "'\\''", 4);
        else
            ddp_buf_put(b, c, 1);
    ddp_buf_put(b, "'", 1);
}

static void put_kv(struct ddp_buf *b, const char *k, const char *v)
{
    size_t l = strlen(k) + strlen(v) + 2;
    char *kv = malloc(l);
    if (!kv)
        return;
    snprintf(kv, l, "%s=%s", k, v);
    if (shell_name(kv)) {
        ddp_buf_put(b, " ", 1);
        put_quoted(b, kv);
    }
    free(kv);
}

char *ddp__doctor_env_sh(const struct ddp_job *job)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    ddp_buf_put(&b, "export", 6);
    size_t start = b.len;
    char **sh = ddp__job_shell_env(job, NULL);
    for (char **e = sh; e && *e; e++) {
        char *eq = strchr(*e, '=');
        *eq = '\0';
        put_kv(&b, *e, eq + 1);
        free(*e);
    }
    free(sh);
    for (size_t k = 0; k < job->nenv; k++)
        put_kv(&b, job->env[k].key, job->env[k].value);
    if (b.len == start)
        b.len = 0; /* nothing to export */
    else
        ddp_buf_put(&b, "; ", 2);
    ddp_buf_put(&b, "", 1);
    return (char *)b.data;
}

char **ddp__doctor_env_argv(const struct ddp_job *job)
{
    char **v = calloc(job->nenv + 2, sizeof(char *));
    if (!v)
        return NULL;
    size_t n = 0;
    v[n++] = strdup("env");
    for (size_t k = 0; k < job->nenv; k++) {
        size_t l = strlen(job->env[k].key) + strlen(job->env[k].value) + 2;
        if ((v[n] = malloc(l)))
            snprintf(v[n++], l, "%s=%s", job->env[k].key, job->env[k].value);
    }
    return v;
}
