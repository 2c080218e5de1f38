/* The replicated checkpoints' records in etcd (cli/supervisor/ckpt_store.h). */
#include "cli/supervisor/ckpt_store.h"
#include "cli/proto/ckpt_proto.h"
#include "cli/supervisor/supervisor.h"
#include "common/buf.h"
#include "rendezvous/etcd.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

#define REC_MAGIC "ddprun-ckpt 1"

static bool g_warned;

bool ddp__cks_on(void)
{
    return ddp__supervisor.etcd && ddp__supervisor.sup_lease;
}

static void put_holders(struct ddp_buf *b, const bool *h, size_t nn)
{
    char w[24];
    bool any = false;
    for (size_t i = 0; i < nn; i++)
        if (h[i]) {
            int n = snprintf(w, sizeof(w), "%s%zu", any ? "," : "", i);
            ddp_buf_put(b, w, (size_t)n);
            any = true;
        }
    ddp_buf_put(b, any ? "\n" : "-\n", any ? 1 : 2);
}

static void put_version(struct ddp_buf *b, char tag, const struct ddp__ck_version *v)
{
    char line[200];
    int n = snprintf(line, sizeof(line), "%c %u %" PRIu32 " %" PRIu64 " ", tag, v->seq, v->round,
                     v->size);
    for (int k = 0; k < 32; k++)
        n += snprintf(line + n, sizeof(line) - (size_t)n, "%02x", v->sha[k]);
    n += snprintf(line + n, sizeof(line) - (size_t)n, " %d ", (int)v->removed);
    ddp_buf_put(b, line, (size_t)n);
}

/* One etcd put of name (under the job's folder) = val, unless *saved says it is there. */
static void put(const char *name, const char *val, char **saved)
{
    if (*saved && strcmp(*saved, val) == 0)
        return;
    char key[2048];
    snprintf(key, sizeof(key), "%s%s", ddp__supervisor.etcd_prefix, name);
    if (ddp_etcd_put(ddp__supervisor.etcd, key, val, strlen(val), 0) < 0) {
        if (!g_warned)
            ddp__sup_say("ddprun: warning: checkpoint records could not be written to etcd (%s): "
                         "a launcher that takes the job over would not know every copy",
                         ddp_etcd_error(ddp__supervisor.etcd));
        g_warned = true;
        return;
    }
    free(*saved);
    *saved = strdup(val);
}

void ddp__cks_put_file(const struct ddp__ck_record *r, size_t nn, char **saved)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    ddp_buf_put(&b, REC_MAGIC "\n", sizeof(REC_MAGIC));
    put_version(&b, 'v', &r->v);
    char w[40];
    int n = snprintf(w, sizeof(w), "%d %d ", r->origin, (int)r->pending);
    ddp_buf_put(&b, w, (size_t)n);
    put_holders(&b, r->holder, nn);
    if (r->pv.seq) {
        put_version(&b, 'p', &r->pv);
        put_holders(&b, r->pholder, nn);
    }
    ddp_buf_put_u8(&b, 0);
    char name[DDP__CK_REL_MAX + 16];
    snprintf(name, sizeof(name), "ckpt/%s", r->rel);
    if (b.data)
        put(name, (const char *)b.data, saved);
    ddp_buf_release(&b);
}

void ddp__cks_put_ports(char *const *addr, size_t nn, char **saved)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    for (size_t i = 0; i < nn; i++)
        if (addr[i]) {
            char line[DDP__CK_ADDR_MAX + 32];
            int n = snprintf(line, sizeof(line), "%zu %s\n", i, addr[i]);
            ddp_buf_put(&b, line, (size_t)n);
        }
    ddp_buf_put_u8(&b, 0);
    if (b.data)
        put("ckpt-ports", (const char *)b.data, saved);
    ddp_buf_release(&b);
}

/* ---- reading them back ---- */

/* "a,b,c" or "-" into h[nn]; -1 when an index is out of range. */
static int get_holders(const char *s, bool *h, size_t nn)
{
    if (strcmp(s, "-") == 0)
        return 0;
    for (const char *p = s; *p;) {
        char *end;
        unsigned long i = strtoul(p, &end, 10);
        if (end == p || i >= nn || (*end && *end != ','))
            return -1;
        h[i] = true;
        p = *end ? end + 1 : end;
    }
    return 0;
}

/* "T seq round size sha removed REST" with REST (the line's rest) in rest[600]. */
static int get_version(const char *line, char tag, struct ddp__ck_version *v, char *rest)
{
    char t, sha[65];
    unsigned seq;
    uint32_t round;
    uint64_t size;
    int removed;
    if (sscanf(line, "%c %u %" SCNu32 " %" SCNu64 " %64s %d %599[^\n]", &t, &seq, &round, &size,
               sha, &removed, rest) < 7 ||
        t != tag || strlen(sha) != 64 || !seq)
        return -1;
    *v = (struct ddp__ck_version){.round = round, .size = size, .seq = seq, .removed = removed};
    for (int k = 0; k < 32; k++) {
        unsigned x;
        if (sscanf(sha + 2 * k, "%2x", &x) != 1)
            return -1;
        v->sha[k] = (uint8_t)x;
    }
    return 0;
}

/* One record: 0, or -1 when malformed. */
static int parse(const char *rel, const char *val, size_t nn, struct ddp__ck_record *r)
{
    char rest[600], phold[600] = "-";
    const char *l1 = strchr(val, '\n'), *l2;
    int origin, pending;
    if (!l1 || strncmp(val, REC_MAGIC "\n", sizeof(REC_MAGIC)) != 0 ||
        !ddp__ck_rel_ok(rel, strlen(rel)) || get_version(l1 + 1, 'v', &r->v, rest) < 0)
        return -1;
    char hold[600];
    if (sscanf(rest, "%d %d %599s", &origin, &pending, hold) != 3 || origin < 0 ||
        (size_t)origin >= nn)
        return -1;
    if ((l2 = strchr(l1 + 1, '\n')) && l2[1] && get_version(l2 + 1, 'p', &r->pv, phold) < 0)
        return -1;
    r->rel = rel;
    r->origin = origin;
    r->pending = pending != 0;
    return get_holders(hold, r->holder, nn) < 0 || get_holders(phold, r->pholder, nn) < 0 ? -1 : 0;
}

struct load {
    size_t skip, nn, bad;
    char first_bad[200];
    void (*take)(void *arg, const struct ddp__ck_record *r, const char *val);
    void *arg;
    bool *h;
};

static void on_record(void *arg, const char *key, const char *val, size_t vlen)
{
    struct load *x = arg;
    (void)vlen;
    struct ddp__ck_record r = {.holder = x->h, .pholder = x->h + x->nn};
    memset(x->h, 0, 2 * x->nn * sizeof(bool));
    if (strlen(key) > x->skip && parse(key + x->skip, val, x->nn, &r) == 0)
        x->take(x->arg, &r, val);
    else if (!x->bad++)
        snprintf(x->first_bad, sizeof(x->first_bad), "%s", key);
}

int ddp__cks_load(size_t nn,
                  void (*take)(void *arg, const struct ddp__ck_record *r, const char *val),
                  void *arg, char **addr)
{
    char key[1024];
    struct load x = {.nn = nn, .take = take, .arg = arg, .h = calloc(2 * nn + 1, sizeof(bool))};
    snprintf(key, sizeof(key), "%sckpt/", ddp__supervisor.etcd_prefix);
    x.skip = strlen(key);
    if (!x.h || ddp_etcd_list(ddp__supervisor.etcd, key, on_record, &x, NULL) < 0) {
        ddp__sup_say("ddprun: warning: the job's checkpoint records could not be read from etcd "
                     "(%s): only files finished from now on are restored",
                     x.h ? ddp_etcd_error(ddp__supervisor.etcd) : "out of memory");
        free(x.h);
        return -1;
    }
    free(x.h);
    if (x.bad)
        ddp__sup_say("ddprun: warning: %zu checkpoint record%s in etcd %s malformed (%s): left out",
                     x.bad, x.bad == 1 ? "" : "s", x.bad == 1 ? "is" : "are", x.first_bad);
    char *ports = NULL;
    size_t len = 0;
    snprintf(key, sizeof(key), "%sckpt-ports", ddp__supervisor.etcd_prefix);
    if (ddp_etcd_get(ddp__supervisor.etcd, key, &ports, &len, NULL) != 0)
        return 0;
    for (char *line = ports, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        if ((nl = strchr(line, '\n')))
            *nl = '\0';
        char a[DDP__CK_ADDR_MAX + 1];
        size_t i;
        if (sscanf(line, "%zu %300s", &i, a) == 2 && i < nn && !addr[i])
            addr[i] = strdup(a);
    }
    free(ports);
    return 0;
}
