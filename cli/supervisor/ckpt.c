/* The launcher's record of the replicated checkpoints (cli/supervisor/ckpt.h). */
#include "cli/supervisor/ckpt.h"
#include "cli/supervisor/ckpt_store.h"
#include "cli/proto/agent_proto.h"
#include "cli/proto/ckpt_proto.h"
#include "cli/spec/job.h"
#include "cli/supervisor/nodes.h"
#include "cli/supervisor/recovery.h"
#include "cli/supervisor/supervisor.h"
#include "common/log.h"
#include "common/loop.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/banned.h"

struct file {
    char *rel;
    struct ddp__ck_version v;
    int origin;                /* the node whose record made it */
    bool *holder;              /* [nnodes]: holds this version */
    struct ddp__ck_version pv; /* the version before (pv.seq 0: none), while some node holds it */
    bool *pholder;             /* [nnodes]: holds that one */
    int64_t pending_since;     /* short of its copies since (ddp_now_ms), or 0 */
    char *saved;               /* its record as last written to etcd, or NULL */
};
struct pending { /* a SYNC sent, its answer awaited */
    uint32_t id;
    int node;
    bool restore;  /* of the restore in progress (a restore of a round before counts as a copy) */
    size_t *files; /* the files it listed as HAVE, and their versions then */
    unsigned *seq;
    size_t n;
};

static struct {
    const struct ddp_job *job;
    struct ddp__nodes *nodes;
    bool on;
    size_t nn;   /* nodes */
    char **addr; /* [node]: its replication port, or NULL */
    struct file *f;
    size_t n, cap;
    struct pending *p;
    size_t np;
    uint32_t next_id;
    unsigned seq;
    /* the round's restore */
    uint32_t restore_first; /* the first SYNC id of the restore in progress */
    int restores_left;
    int64_t restore_t0;
    uint64_t restore_bytes;
    uint32_t restore_files;
    char restore_fail[1024];
    int64_t last_lag_ms;
    char *saved_addr;       /* the ports' record as last written to etcd */
    struct ddp_timer retry; /* copies that failed are asked for again */
    int64_t said_ms;        /* when a failed copy was last said */
} C;

static void persist(void);
static void on_retry(struct ddp_loop *loop, struct ddp_timer *t);

#define RETRY_MS 5000 /* a copy that failed is asked for again after */
#define SAY_MS 30000  /* failed copies are said at most once per */

static const char *host_of(int i)
{
    return C.job->nodes[i].host;
}

static void hex(const uint8_t sha[32], char out[65])
{
    for (int k = 0; k < 32; k++)
        snprintf(out + 2 * k, 3, "%02x", sha[k]);
}

/* Node i's agent is joined, not counted lost, and serves its folder. */
static bool alive(int i)
{
    enum ddp__node_state st = ddp__supervisor.nd[i].state;
    return (st == DDP__NS_READY || st == DDP__NS_RUNNING || st == DDP__NS_STOPPING) && C.addr[i];
}

void ddp__ck_init(const struct ddp_job *job, struct ddp__nodes *nodes)
{
    memset(&C, 0, sizeof(C));
    C.job = job;
    C.nodes = nodes;
    C.nn = job->nnodes;
    C.last_lag_ms = -1;
    C.on = job->ckpt_replicas > 0 && job->checkpoint_dir;
    ddp_timer_init(&C.retry, on_retry);
    if (C.on && !(C.addr = calloc(C.nn, sizeof(*C.addr))))
        C.on = false;
}

static void pending_free(struct pending *p)
{
    free(p->files);
    free(p->seq);
}

void ddp__ck_release(void)
{
    if (C.job && ddp_timer_armed(&C.retry)) /* (C.job: ddp__ck_init ran) */
        ddp_timer_stop(ddp__supervisor.loop, &C.retry);
    for (size_t i = 0; C.addr && i < C.nn; i++)
        free(C.addr[i]);
    for (size_t k = 0; k < C.n; k++) {
        free(C.f[k].rel);
        free(C.f[k].holder);
        free(C.f[k].pholder);
        free(C.f[k].saved);
    }
    for (size_t k = 0; k < C.np; k++)
        pending_free(&C.p[k]);
    free(C.addr);
    free(C.f);
    free(C.p);
    free(C.saved_addr);
    memset(&C, 0, sizeof(C));
}

void ddp__ck_closed(int i)
{
    if (!C.on)
        return;
    free(C.addr[i]);
    C.addr[i] = NULL;
    persist();
}

bool ddp__ck_copying(void)
{
    for (size_t k = 0; C.on && k < C.np; k++)
        if (!C.p[k].restore && alive(C.p[k].node))
            return true;
    return false;
}

bool ddp__ck_on(void)
{
    return C.on;
}

void ddp__ck_joined(int i)
{
    if (!C.on)
        return;
    struct ddp_buf b;
    ddp_buf_init(&b);
    size_t pos = ddp__agent_begin(&b, DDP__AG_CKPT_OPEN);
    ddp_buf_put_str(&b, C.job->checkpoint_dir, strlen(C.job->checkpoint_dir));
    ddp__agent_end(&b, pos);
    ddp__nodes_frame(C.nodes, i, &b);
    ddp_buf_release(&b);
}

/* ---- the files ---- */

static struct file *file_of(const char *rel, bool make)
{
    for (size_t k = 0; k < C.n; k++)
        if (strcmp(C.f[k].rel, rel) == 0)
            return &C.f[k];
    if (!make)
        return NULL;
    if (C.n == C.cap) {
        size_t cap = C.cap ? 2 * C.cap : 16;
        struct file *n = realloc(C.f, cap * sizeof(*n));
        if (!n)
            return NULL;
        C.f = n;
        C.cap = cap;
    }
    struct file *f = &C.f[C.n];
    memset(f, 0, sizeof(*f));
    if (!(f->rel = strdup(rel)) || !(f->holder = calloc(C.nn, sizeof(bool))) ||
        !(f->pholder = calloc(C.nn, sizeof(bool)))) {
        free(f->rel);
        free(f->holder);
        return NULL;
    }
    C.n++;
    return f;
}

static int holders(const struct file *f)
{
    int h = 0;
    for (size_t i = 0; i < C.nn; i++)
        h += f->holder[i];
    return h;
}

/* Copies wanted of f beyond its holders: K, or as many live nodes as there are. */
static int wanted(void)
{
    int live = 0;
    for (size_t i = 0; i < C.nn; i++)
        live += alive((int)i);
    int want = 1 + C.job->ckpt_replicas;
    return want < live ? want : live;
}

static bool in_flight(const struct file *f, int node)
{
    for (size_t k = 0; k < C.np; k++)
        if (C.p[k].node == node)
            for (size_t j = 0; j < C.p[k].n; j++)
                if (C.p[k].files[j] == (size_t)(f - C.f) && C.p[k].seq[j] == f->v.seq)
                    return true;
    return false;
}

/* A SYNC of entries for files idx[0..n) (HAVE, or DROP where removed) to node i; a restore holds
 * its START. */
static void send_sync(int i, const size_t *idx, size_t n, bool restore)
{
    struct ddp__ck_sync s = {.id = ++C.next_id, .flags = restore ? DDP__CK_SYNC_RESTORE : 0};
    struct pending p = {.id = s.id, .node = i, .restore = restore};
    uint32_t *slot = calloc(C.nn, sizeof(*slot)); /* node -> its index in s.addr + 1 */
    s.addr = calloc(C.nn, sizeof(*s.addr));
    s.e = calloc(n + 1, sizeof(*s.e));
    p.files = calloc(n + 1, sizeof(*p.files));
    p.seq = calloc(n + 1, sizeof(*p.seq));
    uint32_t *hbuf = calloc((n + 1) * C.nn, sizeof(*hbuf));
    if (!slot || !s.addr || !s.e || !p.files || !p.seq || !hbuf)
        goto out;
    for (size_t k = 0; k < n; k++) {
        struct file *f = &C.f[idx[k]];
        struct ddp__ck_entry *e = &s.e[s.n++];
        e->rel = f->rel;
        if (f->v.removed) {
            e->op = DDP__CK_DROP;
            continue;
        }
        e->op = DDP__CK_HAVE;
        e->size = f->v.size;
        memcpy(e->sha, f->v.sha, 32);
        e->holder = hbuf + k * C.nn;
        /* the holders in node order from its origin: the one that made it first */
        for (size_t d = 0; d < C.nn; d++) {
            size_t h = ((size_t)f->origin + d) % C.nn;
            if (!f->holder[h] || !C.addr[h])
                continue;
            if (!slot[h]) {
                s.addr[s.naddr] = C.addr[h];
                slot[h] = ++s.naddr;
            }
            e->holder[e->nh++] = slot[h] - 1;
        }
        p.files[p.n] = idx[k];
        p.seq[p.n++] = f->v.seq;
    }
    struct ddp_buf b;
    ddp_buf_init(&b);
    struct pending *np = realloc(C.p, (C.np + 1) * sizeof(*np));
    if (np && ddp__ck_put_sync(&b, &s) == 0 && b.len <= DDP__AGENT_MAX_FRAME) {
        C.p = np;
        C.p[C.np++] = p;
        p.files = NULL;
        p.seq = NULL;
        ddp__nodes_frame(C.nodes, i, &b);
        if (restore)
            C.restores_left++;
    } else if (np) {
        C.p = np;
        ddp__sup_say(
            "ddprun: checkpoint: the manifest for node '%s' is too large to send (%zu files)",
            host_of(i), n);
    }
    ddp_buf_release(&b);
out:
    free(slot);
    free(s.addr);
    free(s.e);
    free(hbuf);
    free(p.files);
    free(p.seq);
}

/* Sends f's new version to the nodes that should copy it: the next live nodes after its holder
 * until it has its K copies, and every spare (a node waiting while a round runs), so that one
 * taken in finds the newest version already there. */
static void replicate(struct file *f)
{
    int have = holders(f), want = wanted();
    for (size_t k = 0; k < C.nn; k++)
        if (in_flight(f, (int)k))
            have++;
    size_t idx = (size_t)(f - C.f);
    for (size_t d = 1; d < C.nn; d++) {
        int i = (int)(((size_t)f->origin + d) % C.nn);
        bool spare =
            ddp__supervisor.nd[i].state == DDP__NS_READY && ddp__supervisor.ph == DDP__PH_RUNNING;
        if (f->holder[i] || !alive(i) || in_flight(f, i) || (have >= want && !spare))
            continue;
        send_sync(i, &idx, 1, false);
        have++;
    }
}

static void check_replicated(struct file *f)
{
    if (f->pending_since && !f->v.removed && holders(f) >= wanted()) {
        C.last_lag_ms = ddp_now_ms() - f->pending_since;
        f->pending_since = 0;
    }
}

/* CKPT_FILE from node i. */
static void on_file(int i, const struct ddp__ck_file *r)
{
    char sha[65];
    if (!alive(i)) { /* fenced: a node counted lost */
        DDP_DEBUG(SUP, "checkpoint: %s from node '%s', counted lost: fenced", r->rel, host_of(i));
        return;
    }
    struct file *f = file_of(r->rel, r->kind == DDP__CK_FINISHED);
    if (!f)
        return;
    if (r->kind == DDP__CK_REMOVED) {
        if (!f->holder[i] || f->v.removed)
            return; /* (its copy was not the newest: nothing of the newest goes) */
        f->v = (struct ddp__ck_version){
            .round = r->round, .recv_ms = ddp_now_ms(), .removed = true, .seq = ++C.seq};
        memset(f->holder, 0, C.nn * sizeof(bool));
        f->pending_since = 0;
        ddp__sup_event("checkpoint_file", "path", f->rel, "node", host_of(i), "#file_round",
                       (long long)r->round, "state", "removed", NULL);
        size_t idx = (size_t)(f - C.f);
        for (size_t k = 0; k < C.nn; k++)
            if ((int)k != i && alive((int)k) && C.addr[k])
                send_sync((int)k, &idx, 1, false);
        return;
    }
    if (f->v.seq && !f->v.removed && r->round < f->v.round) {
        f->holder[i] = false; /* an older round's: not the newest */
        return;
    }
    if (f->v.seq && !f->v.removed && memcmp(f->v.sha, r->sha, 32) == 0 && f->v.size == r->size) {
        f->holder[i] = true; /* the same bytes again */
        check_replicated(f);
        return;
    }
    if (f->v.seq && !f->v.removed && holders(f)) { /* kept while a node holds only it */
        f->pv = f->v;
        memcpy(f->pholder, f->holder, C.nn * sizeof(bool));
    }
    f->v = (struct ddp__ck_version){
        .round = r->round, .recv_ms = ddp_now_ms(), .size = r->size, .seq = ++C.seq};
    memcpy(f->v.sha, r->sha, 32);
    memset(f->holder, 0, C.nn * sizeof(bool));
    f->holder[i] = true;
    f->pholder[i] = false;
    f->origin = i;
    f->pending_since = f->v.recv_ms;
    hex(r->sha, sha);
    ddp__sup_event("checkpoint_file", "path", f->rel, "node", host_of(i), "#file_round",
                   (long long)r->round, "#size", (long long)r->size, "sha256", sha, NULL);
    replicate(f);
    check_replicated(f);
}

static void restore_done(enum ddp__ck_action *act, char *why, size_t whyn)
{
    int64_t took = ddp_now_ms() - C.restore_t0;
    ddp__sup_event("checkpoint_restored", "#bytes", (long long)C.restore_bytes, "#files",
                   (long long)C.restore_files, "#ms", (long long)took, NULL);
    ddp__rcv_restored(C.restore_bytes, took);
    if (!C.restore_fail[0])
        return;
    if (!C.job->ckpt_restart) {
        *act = DDP__CK_FAIL_JOB;
        snprintf(why, whyn, "checkpoint: no valid copy left of %s", C.restore_fail);
        return;
    }
    /* on_corrupt: restart: those files are gone everywhere, and the round starts again */
    *act = DDP__CK_FAIL_ROUND;
    snprintf(why, whyn,
             "checkpoint: no valid copy left of %s; checkpoint.on_corrupt is restart: removed on "
             "every node, the round starts again without it",
             C.restore_fail);
}

/* A restore's failed file: it goes everywhere when on_corrupt is restart. */
static void restore_failed(const char *rel, const char *what)
{
    size_t l = strlen(C.restore_fail);
    if (!strstr(C.restore_fail, rel) && l + strlen(rel) + strlen(what) + 8 < sizeof(C.restore_fail))
        snprintf(C.restore_fail + l, sizeof(C.restore_fail) - l, "%s%s (%s)", l ? ", " : "", rel,
                 what);
    struct file *f = file_of(rel, false);
    if (f && C.job->ckpt_restart && !f->v.removed) {
        f->v.removed = true;
        f->v.seq = ++C.seq;
        memset(f->holder, 0, C.nn * sizeof(bool));
        f->pending_since = 0;
    }
}

/* CKPT_SYNCED from node i. */
static void on_synced(int i, const struct ddp__ck_synced *s, enum ddp__ck_action *act, char *why,
                      size_t whyn)
{
    size_t k = 0;
    while (k < C.np && C.p[k].id != s->id)
        k++;
    if (k == C.np || C.p[k].node != i)
        return; /* (its node was lost meanwhile) */
    struct pending p = C.p[k];
    C.p[k] = C.p[--C.np];
    if (p.restore && p.id < C.restore_first)
        p.restore = false; /* a round before's: its copies count, its outcome no more */
    for (size_t j = 0; j < p.n; j++) {
        struct file *f = &C.f[p.files[j]];
        bool failed = false;
        for (uint32_t x = 0; x < s->nfail; x++)
            failed |= strcmp(s->fail[x].rel, f->rel) == 0;
        if (!failed && f->v.seq == p.seq[j] && !f->v.removed) {
            f->holder[i] = true;
            f->pholder[i] = false; /* (its copy of the version before is replaced) */
            check_replicated(f);
        }
    }
    for (uint32_t x = 0; x < s->nfail; x++) {
        struct file *ff = file_of(s->fail[x].rel, false);
        if (ff)
            ff->holder[i] = false; /* (its copy is not that version) */
        if (p.restore) {
            restore_failed(s->fail[x].rel, s->fail[x].why);
        } else {
            /* asked again in RETRY_MS (said at most once per SAY_MS) */
            if (ddp_now_ms() - C.said_ms >= SAY_MS || !C.said_ms) {
                ddp__sup_say("ddprun: checkpoint: node '%s' could not copy %s: %s; trying "
                             "again every %d s",
                             host_of(i), s->fail[x].rel, s->fail[x].why, RETRY_MS / 1000);
                C.said_ms = ddp_now_ms();
            }
            if (!ddp_timer_armed(&C.retry))
                ddp_timer_start(ddp__supervisor.loop, &C.retry, RETRY_MS);
        }
    }
    if (p.restore) {
        C.restore_bytes += s->bytes;
        C.restore_files += s->files;
        if (--C.restores_left == 0)
            restore_done(act, why, whyn);
    }
    pending_free(&p);
}

static bool frame(int i, uint8_t type, const uint8_t *body, size_t len, enum ddp__ck_action *act,
                  char *why, size_t whyn)
{
    *act = DDP__CK_NONE;
    if (type == DDP__AG_CKPT_PORT) {
        char addr[DDP__CK_ADDR_MAX + 1], w[DDP__CK_WHY_MAX + 1];
        if (!C.on || ddp__ck_get_port(body, len, addr, w) < 0)
            return true;
        free(C.addr[i]);
        C.addr[i] = addr[0] ? strdup(addr) : NULL;
        if (!addr[0]) { /* its ranks would see another folder than the others': no job */
            *act = DDP__CK_FAIL_JOB;
            snprintf(why, whyn, "checkpoint: node '%s' cannot keep copies of checkpoint.dir: %s",
                     host_of(i), w);
            return true;
        }
        ddp__sup_event("checkpoint_port", "node", host_of(i), "addr", addr, NULL);
        for (size_t k = 0; k < C.n; k++) /* a node that can hold copies now */
            if (C.f[k].pending_since)
                replicate(&C.f[k]);
        size_t *idx = calloc(C.n + 1, sizeof(*idx)), m = 0;
        for (size_t k = 0; idx && k < C.n; k++)
            if (!C.f[k].v.removed && !in_flight(&C.f[k], i))
                idx[m++] = k;
        if (idx && m && alive(i) && ddp__supervisor.nd[i].state == DDP__NS_READY &&
            ddp__supervisor.ph == DDP__PH_RUNNING)
            send_sync(i, idx, m, false); /* a spare: every file's newest version */
        free(idx);
        return true;
    }
    if (type == DDP__AG_CKPT_FILE) {
        struct ddp__ck_file r;
        if (C.on && ddp__ck_get_file(body, len, &r) == 0)
            on_file(i, &r);
        return true;
    }
    if (type == DDP__AG_CKPT_SYNCED) {
        struct ddp__ck_synced s;
        if (C.on && ddp__ck_get_synced(body, len, &s) == 0) {
            on_synced(i, &s, act, why, whyn);
            free(s.fail);
        }
        return true;
    }
    return false;
}

bool ddp__ck_frame(int i, uint8_t type, const uint8_t *body, size_t len, enum ddp__ck_action *act,
                   char *why, size_t whyn)
{
    bool mine = frame(i, type, body, len, act, why, whyn);
    if (mine)
        persist(); /* (before the frame's ACK: cli/proto/agent_proto.h) */
    return mine;
}

/* The files short of their copies, asked for again (a copy failed RETRY_MS ago). */
static void on_retry(struct ddp_loop *loop, struct ddp_timer *t)
{
    (void)loop;
    (void)t;
    for (size_t k = 0; C.on && k < C.n; k++)
        if (C.f[k].pending_since && !C.f[k].v.removed && holders(&C.f[k]))
            replicate(&C.f[k]);
}

/* f's newest version was lost with node i before any copy was made: the version before is
 * the newest where a live node holds it (the "newest that some live node holds"); else
 * the file is as if never written, removed everywhere at the next restore. */
static void lost_version(struct file *f, int i)
{
    bool prev = false;
    for (size_t h = 0; h < C.nn; h++)
        prev |= f->pholder[h] && C.addr[h];
    if (prev && f->pv.seq) {
        ddp__sup_say("ddprun: checkpoint: %s's newest version was lost with node '%s' before it "
                     "was copied; the version before it is restored",
                     f->rel, host_of(i));
        f->v = f->pv;
        f->v.seq = ++C.seq;
        memcpy(f->holder, f->pholder, C.nn * sizeof(bool));
    } else {
        ddp__sup_say("ddprun: checkpoint: %s was lost with node '%s' before any copy of it was "
                     "made; it is removed on every node",
                     f->rel, host_of(i));
        f->v = (struct ddp__ck_version){
            .round = f->v.round, .recv_ms = ddp_now_ms(), .removed = true, .seq = ++C.seq};
        memset(f->holder, 0, C.nn * sizeof(bool));
        f->pending_since = 0;
    }
    f->pv.seq = 0;
    memset(f->pholder, 0, C.nn * sizeof(bool));
}

void ddp__ck_lost(int i)
{
    if (!C.on)
        return;
    free(C.addr[i]);
    C.addr[i] = NULL;
    for (size_t k = 0; k < C.np;) { /* its answers will not come */
        if (C.p[k].node != i) {
            k++;
            continue;
        }
        if (C.p[k].restore && C.restores_left > 0)
            C.restores_left--; /* (the round fails with the loss) */
        pending_free(&C.p[k]);
        C.p[k] = C.p[--C.np];
    }
    for (size_t k = 0; k < C.n; k++) {
        struct file *f = &C.f[k];
        f->pholder[i] = false;
        if (!f->holder[i])
            continue;
        f->holder[i] = false;
        if (f->v.removed)
            continue;
        if (!holders(f))
            lost_version(f, i);
        if (!holders(f))
            continue; /* nothing of it left on a live node: the restore leaves it out */
        if (!f->pending_since)
            f->pending_since = ddp_now_ms();
        for (size_t h = 0; h < C.nn; h++)
            if (f->holder[h]) {
                f->origin = (int)h;
                break;
            }
        replicate(f);
    }
    persist();
}

static enum ddp__ck_action restore(bool (*member)(int), char *why, size_t whyn)
{
    enum ddp__ck_action act = DDP__CK_NONE;
    if (!C.on || !C.n)
        return act;
    C.restores_left = 0;
    C.restore_first = C.next_id + 1;
    C.restore_t0 = ddp_now_ms();
    C.restore_bytes = 0;
    C.restore_files = 0;
    C.restore_fail[0] = '\0';
    for (size_t k = 0; k < C.n; k++) /* (what ddp__ck_lost left with no holder: none) */
        if (!C.f[k].v.removed && !holders(&C.f[k]))
            restore_failed(C.f[k].rel, "no live node holds it");
    if (C.restore_fail[0] && !C.job->ckpt_restart) {
        restore_done(&act, why, whyn);
        return act;
    }
    if (C.restore_fail[0])
        ddp__sup_say(
            "ddprun: checkpoint: no copy left of %s; checkpoint.on_corrupt is restart: the "
            "round starts without it",
            C.restore_fail);
    C.restore_fail[0] = '\0';
    size_t *idx = calloc(C.n, sizeof(*idx));
    if (!idx)
        return act;
    for (size_t k = 0; k < C.n; k++)
        idx[k] = k;
    /* (a member whose CKPT_PORT has not come yet gets its restore too: its agent read
     * CKPT_OPEN before it) */
    for (size_t i = 0; i < C.nn; i++)
        if (member((int)i) || alive((int)i))
            send_sync((int)i, idx, C.n, member((int)i));
    free(idx);
    return act;
}

enum ddp__ck_action ddp__ck_restore(bool (*member)(int), char *why, size_t whyn)
{
    enum ddp__ck_action act = restore(member, why, whyn);
    persist();
    return act;
}

double ddp__ck_lag_s(int node)
{
    if (!C.on)
        return -1;
    int64_t oldest = 0, now = ddp_now_ms();
    for (size_t k = 0; k < C.n; k++) {
        const struct file *f = &C.f[k];
        if (f->v.removed || !f->pending_since || (oldest && f->pending_since >= oldest))
            continue;
        if (node >= 0 && !in_flight(f, node))
            continue;
        oldest = f->pending_since;
    }
    return oldest ? (double)(now - oldest) / 1000 : 0;
}

int ddp__ck_line(char *buf, size_t n)
{
    if (!C.on || !n)
        return 0;
    size_t files = 0, short_of = 0;
    int64_t oldest = 0, now = ddp_now_ms();
    for (size_t k = 0; k < C.n; k++) {
        if (C.f[k].v.removed)
            continue;
        files++;
        if (C.f[k].pending_since) {
            short_of++;
            if (!oldest || C.f[k].pending_since < oldest)
                oldest = C.f[k].pending_since;
        }
    }
    int len;
    if (short_of)
        len = snprintf(buf, n,
                       "checkpoint replication: %zu file%s, %zu short of %d cop%s, lag %.2f s",
                       files, files == 1 ? "" : "s", short_of, C.job->ckpt_replicas,
                       C.job->ckpt_replicas == 1 ? "y" : "ies", (double)(now - oldest) / 1000);
    else
        len = snprintf(buf, n, "checkpoint replication: %zu file%s, each with %d cop%s%s", files,
                       files == 1 ? "" : "s", C.job->ckpt_replicas,
                       C.job->ckpt_replicas == 1 ? "y" : "ies", files ? "; lag 0 s" : "");
    if (C.last_lag_ms >= 0 && len > 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, " (the last copy took %.2f s)",
                        (double)C.last_lag_ms / 1000);
    return len < 0 ? 0 : (size_t)len < n ? len : (int)n - 1;
}

/* ---- the records in etcd (cli/supervisor/ckpt_store.h) ---- */

/* Each file's record and the ports, where they changed: called before the frame that changed
 * them is acknowledged (ACK), so a record in flight when a launcher died reaches the next. */
static void persist(void)
{
    if (!C.on || !ddp__cks_on())
        return;
    for (size_t k = 0; k < C.n; k++) {
        struct file *f = &C.f[k];
        struct ddp__ck_record r = {.rel = f->rel,
                                   .v = f->v,
                                   .pv = f->pv,
                                   .origin = f->origin,
                                   .pending = f->pending_since != 0,
                                   .holder = f->holder,
                                   .pholder = f->pholder};
        ddp__cks_put_file(&r, C.nn, &f->saved);
    }
    ddp__cks_put_ports(C.addr, C.nn, &C.saved_addr);
}

static void take(void *arg, const struct ddp__ck_record *r, const char *val)
{
    (void)arg;
    struct file *f = file_of(r->rel, false) ? NULL : file_of(r->rel, true);
    if (!f)
        return;
    memcpy(f->holder, r->holder, C.nn * sizeof(bool));
    memcpy(f->pholder, r->pholder, C.nn * sizeof(bool));
    f->v = r->v;
    f->pv = r->pv;
    f->v.recv_ms = f->pv.recv_ms = ddp_now_ms();
    f->origin = r->origin;
    f->pending_since = r->pending ? ddp_now_ms() : 0;
    f->saved = strdup(val);
    C.seq = r->v.seq > C.seq ? r->v.seq : C.seq;
    C.seq = r->pv.seq > C.seq ? r->pv.seq : C.seq;
}

void ddp__ck_load(void)
{
    if (!C.on || !ddp__cks_on() || ddp__cks_load(C.nn, take, NULL, C.addr) < 0)
        return;
    /* SYNC ids apart from the last launcher's, whose answers may still come */
    C.next_id = 0x40000000u | (uint32_t)(time(NULL) & 0x1fffffff);
    persist(); /* (the ports' record, read back: unchanged) */
    DDP_INFO(SUP, "checkpoint: %zu file record%s taken over from etcd", C.n, C.n == 1 ? "" : "s");
}
