/*
 * A job from a torchrun-style command line, for users without a job file:
 *   ddprun [--nproc-per-node N] [--nodes h1,h2 | -H h1:4,h2:4 | --hostfile F] train.py ARGS...
 * becomes the job spec a file would have given (command, nproc_per_node, nodes), so that plan,
 * doctor and every key (--set) work the same. A .py script runs under python3 (the first in
 * each node's PATH), as torchrun runs it; -m runs a module; --no-python runs the program itself.
 * Host lists take the forms users already have: h1,h2; Horovod's h1:4,h2:4; hostfiles of one host
 * per line, "host slots=N" (DeepSpeed, Open MPI) or "host:N".
 */
#include "cli/spec/args.h"
#include "cli/spec/job.h"
#include "cli/spec/keys.h"
#include "common/buf.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* "KEY: " of key id, or "KEY:\n" with nl, into b. */
static void put_key(struct ddp_buf *b, int id, bool nl)
{
    ddp_buf_put(b, ddp__key_name(id), strlen(ddp__key_name(id)));
    ddp_buf_put(b, nl ? ":\n" : ": ", 2);
}

/* s as a YAML double-quoted scalar: quotes, backslashes and control bytes escaped. */
static void put_quoted(struct ddp_buf *b, const char *s)
{
    ddp_buf_put_u8(b, '"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            ddp_buf_put_u8(b, '\\');
            ddp_buf_put_u8(b, c);
        } else if (c < 0x20 || c == 0x7f) {
            int n = snprintf(esc, sizeof(esc), "\\x%02x", c);
            ddp_buf_put(b, esc, (size_t)n);
        } else {
            ddp_buf_put_u8(b, c);
        }
    }
    ddp_buf_put_u8(b, '"');
}

/* One host entry: "host", "host:N" or "[v6addr]:N"; a bare IPv6 address has no slots. */
static int put_host(struct ddp_buf *b, const char *spec, size_t len, const char *where,
                    bool keep_slots)
{
    char h[512];
    if (len == 0 || len >= sizeof(h)) {
        ddp__cli_error("%s: an empty or over-long host", where);
        return -1;
    }
    memcpy(h, spec, len);
    h[len] = '\0';
    const char *host = h;
    char *slots = NULL;
    if (h[0] == '[') { /* [v6]:N */
        char *close = strchr(h, ']');
        if (!close || (close[1] && close[1] != ':')) {
            ddp__cli_error("%s: '%s' is not [address] or [address]:slots", where, h);
            return -1;
        }
        *close = '\0';
        host = h + 1;
        slots = close[1] == ':' ? close + 2 : NULL;
    } else {
        char *colon = strchr(h, ':');
        if (colon && !strchr(colon + 1, ':')) { /* one colon: host:slots (else IPv6) */
            *colon = '\0';
            slots = colon + 1;
        }
    }
    for (const char *p = host; *p; p++)
        if (isspace((unsigned char)*p) || *p == '=' || *p == ',' || *p == '"') {
            ddp__cli_error("%s: '%s' is not a host name", where, host);
            return -1;
        }
    ddp_buf_put(b, "  - {", 5);
    put_key(b, DDP_K_NODES_HOST, false);
    put_quoted(b, host);
    if (slots) {
        char *end;
        long n = strtol(slots, &end, 10);
        if (!*slots || *end || n < 1 || n > 4096) {
            ddp__cli_error("%s: '%s' is not a number of slots from 1 to 4096", where, slots);
            return -1;
        }
        char t[32];
        if (!keep_slots) /* an explicit nproc_per_node wins, as over Slurm's tasks per node */
            n = 0;
        int k = snprintf(t, sizeof(t), ", %s: %ld", ddp__key_name(DDP_K_NODES_SLOTS), n);
        if (n)
            ddp_buf_put(b, t, (size_t)k);
    }
    ddp_buf_put(b, "}\n", 2);
    return 0;
}

/* A hostfile: a host per line, "host", "host:N", or "host slots=N [max_slots=M]"; # comments. */
static int put_hostfile(struct ddp_buf *b, const char *path, bool keep_slots)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        ddp__cli_error("--hostfile %s: %s", path, strerror(errno));
        return -1;
    }
    char line[1024], where[1100];
    int ln = 0, hosts = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        ln++;
        snprintf(where, sizeof(where), "%s:%d", path, ln);
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *tok = strtok(line, " \t\r\n");
        if (!tok)
            continue;
        char *slots = NULL;
        for (char *w; (w = strtok(NULL, " \t\r\n"));) {
            if (strncmp(w, "slots=", 6) == 0)
                slots = w + 6;
            else if (strncmp(w, "max_slots=", 10) != 0) {
                ddp__cli_error("%s: '%s' is not slots=N (lines are 'host', 'host slots=N' or "
                               "'host:N')",
                               where, w);
                rc = -1;
            }
        }
        char spec[1100];
        int n = slots ? snprintf(spec, sizeof(spec), "%s:%s", tok, slots)
                      : snprintf(spec, sizeof(spec), "%s", tok);
        if (rc == 0 && put_host(b, spec, (size_t)n, where, keep_slots) < 0)
            rc = -1;
        hosts++;
    }
    fclose(f);
    if (rc == 0 && hosts == 0) {
        ddp__cli_error("--hostfile %s: no hosts in it", path);
        rc = -1;
    }
    return rc;
}

int ddp__job_from_cmdline(const struct ddp_cmdline *cl, const char *const *sets,
                          const char *const *labels, size_t nsets, struct ddp_job **out)
{
    struct ddp_buf b;
    int rc = -1;
    ddp_buf_init(&b);
    const char *base = strrchr(cl->program, '/');
    base = base ? base + 1 : cl->program;
    char name[128];
    snprintf(name, sizeof(name), "%.*s", (int)strcspn(base, "."), base);
    put_key(&b, DDP_K_NAME, false);
    put_quoted(&b, name[0] ? name : "job");
    ddp_buf_put_u8(&b, '\n');
    put_key(&b, DDP_K_COMMAND, false);
    ddp_buf_put_u8(&b, '[');
    if (!cl->no_python) {
        put_quoted(&b, "python3");
        ddp_buf_put(&b, ", ", 2);
        if (cl->module) {
            put_quoted(&b, "-m");
            ddp_buf_put(&b, ", ", 2);
        }
    }
    put_quoted(&b, cl->program);
    for (int k = 0; k < cl->nargs; k++) {
        ddp_buf_put(&b, ", ", 2);
        put_quoted(&b, cl->args[k]);
    }
    ddp_buf_put(&b, "]\n", 2);
    /* --nproc-per-node (or --set nproc_per_node) given: it wins over the hosts' slots */
    bool keep_slots = true;
    for (size_t k = 0; k < nsets; k++)
        if (strncmp(sets[k], DDP_KEY(NPROC_PER_NODE), strlen(DDP_KEY(NPROC_PER_NODE))) == 0 &&
            sets[k][strlen(DDP_KEY(NPROC_PER_NODE))] == '=')
            keep_slots = false;
    if (cl->nodes || cl->hostfile) {
        put_key(&b, DDP_K_NODES, true);
        if (cl->hostfile && put_hostfile(&b, cl->hostfile, keep_slots) < 0)
            goto out;
        for (const char *p = cl->nodes; p && *p;) {
            size_t len = strcspn(p, ",");
            if (put_host(&b, p, len, cl->nodes_label, keep_slots) < 0)
                goto out;
            p += len + (p[len] == ',');
        }
    }
    ddp_buf_put_u8(&b, '\0');
    rc = ddp__job_load_string("the command line", (const char *)b.data, sets, labels, nsets, out);
out:
    ddp_buf_release(&b);
    return rc;
}
