/* Several shell commands in one remote session (cli/sys/shell_steps.h). */
#include "cli/sys/shell_steps.h"
#include "common/util.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

void ddp__steps_init(struct ddp__steps *s)
{
    memset(s, 0, sizeof(*s));
    ddp_buf_init(&s->sh);
    uint8_t r[8] = {0};
    if (ddp_random_bytes(r, sizeof(r)) != 0) { /* unlikely; a fixed mark still works */
        uint64_t t = (uint64_t)ddp_now_ns();
        memcpy(r, &t, sizeof(r));
    }
    int l = snprintf(s->mark, sizeof(s->mark), "@ddprun-step-");
    for (size_t i = 0; i < sizeof(r); i++)
        l += snprintf(s->mark + l, sizeof(s->mark) - (size_t)l, "%02x", r[i]);
}

void ddp__steps_release(struct ddp__steps *s)
{
    ddp_buf_release(&s->sh);
}

static void vput(struct ddp__steps *s, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static void vput(struct ddp__steps *s, const char *fmt, va_list ap)
{
    va_list aq;
    va_copy(aq, ap);
    int n = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    if (n < 0 || ddp_buf_reserve(&s->sh, (size_t)n + 1) != 0) {
        s->oom = true;
        return;
    }
    vsnprintf((char *)s->sh.data + s->sh.len, (size_t)n + 1, fmt, ap);
    s->sh.len += (size_t)n;
}

static void put(struct ddp__steps *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct ddp__steps *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vput(s, fmt, ap);
    va_end(ap);
}

void ddp__steps_raw(struct ddp__steps *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vput(s, fmt, ap);
    va_end(ap);
    put(s, "\n");
}

void ddp__steps_add(struct ddp__steps *s, const char *fmt, ...)
{
    put(s, "( ");
    va_list ap;
    va_start(ap, fmt);
    vput(s, fmt, ap);
    va_end(ap);
    /* Nothing of the script for the step's input (sh -s reads it from there); the newline
     * before the mark: a step's output need not end with one. */
    put(s, "\n) </dev/null; ddp_st=$?; printf '\\n%s %%s\\n' \"$ddp_st\"\n", s->mark);
}

void ddp__steps_gate(struct ddp__steps *s)
{
    put(s, "[ \"$ddp_st\" = 0 ] || exit 0\n");
}

const char *ddp__steps_script(struct ddp__steps *s)
{
    if (s->oom || ddp_buf_reserve(&s->sh, 1) != 0)
        return NULL;
    s->sh.data[s->sh.len] = '\0';
    return (const char *)s->sh.data;
}

int ddp__steps_split(const struct ddp__steps *s, char *out, char **text, int *status, int max)
{
    char key[64];
    int kl = snprintf(key, sizeof(key), "\n%s ", s->mark);
    int n = 0;
    for (char *p = out; n < max;) {
        char *m = strstr(p, key);
        if (!m)
            break;
        char *end;
        long st = strtol(m + kl, &end, 10);
        if (end == m + kl || (*end != '\n' && *end != '\0'))
            break;
        *m = '\0';
        text[n] = p;
        status[n++] = (int)st;
        p = *end ? end + 1 : end;
    }
    return n;
}
