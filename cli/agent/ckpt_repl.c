/* A node's share of the replicated checkpoints (cli/agent/ckpt_repl.h): the watch's reports,
 * the replication port's server threads, and the copying thread that hashes, fetches and drops. */
#include "cli/agent/ckpt_repl.h"
#include "cli/agent/ckpt_serve.h"
#include "cli/agent/ckpt_watch.h"
#include "cli/proto/agent_wire.h"
#include "cli/proto/ckpt_proto.h"
#include "common/err.h"
#include "common/log.h"
#include "common/loop.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/banned.h"

#define REQUEST_MS 5000      /* a copy's handshake */
#define IO_MS 10000          /* a copy that makes no progress this long fails */
#define CHUNK (256u << 10)   /* bytes read and sealed at a time */
#define SETTLE_MS 200        /* a finished file is left alone this long before it is reported */
#define PART ".ddprun-part." /* a copy's temporary name, ignored by the watch */

enum task_kind { T_HASH, T_GONE, T_SYNC };
struct task {
    struct task *next;
    enum task_kind kind;
    uint32_t round;
    char *rel;
    struct ddp__ck_sync sync;
};
struct result {
    struct result *next;
    struct ddp_buf frame; /* (empty: nothing to send) */
    bool report;          /* a HASH's or GONE's, sent or not */
    bool restore;         /* the SYNCED of a restore */
    bool ok;              /* and every file of it matches */
};
struct known { /* a file whose SHA-256 the copying thread knows, and the state it had then */
    char *rel;
    uint64_t size;
    uint8_t sha[32];
    dev_t dev;
    ino_t ino;
    struct timespec mtime;
};

static struct {
    struct ddp_loop *loop;
    struct ddp__cr_cb cb;
    bool open;
    char *dir, *token;
    int dirfd, efd;
    char self[DDP__CK_ADDR_MAX + 1];
    struct ddp__cw *watch;
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct task *head, **tail;
    struct result *rhead, **rtail;
    atomic_bool stop;
    atomic_int cur_fd;
    atomic_bool copying; /* the copying thread runs a SYNC that is no restore */
    atomic_bool cut;     /* a restore waits: the copy in flight ends */
    int restoring;       /* restores queued or running (the loop's thread) */
    int reporting;       /* files' reports queued and not yet sent (the loop's thread) */
    struct known *kn;    /* the copying thread's */
    size_t nkn, capkn;
} R = {.dirfd = -1, .efd = -1, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* ---- the results, handed to the loop's thread ---- */

static void post(struct result *x)
{
    pthread_mutex_lock(&R.mu);
    *R.rtail = x;
    R.rtail = &x->next;
    pthread_mutex_unlock(&R.mu);
    uint64_t one = 1;
    if (write(R.efd, &one, sizeof(one)) < 0) {
        /* (the counter cannot overflow here: the loop reads it at once) */
    }
}

static void on_results(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    (void)arg;
    uint64_t v;
    if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        return;
    pthread_mutex_lock(&R.mu);
    struct result *l = R.rhead;
    R.rhead = NULL;
    R.rtail = &R.rhead;
    pthread_mutex_unlock(&R.mu);
    while (l) {
        struct result *x = l;
        l = l->next;
        if (x->frame.len)
            R.cb.send(&x->frame);
        if (x->report && R.reporting > 0)
            R.reporting--;
        if (x->restore && R.restoring > 0 && --R.restoring == 0)
            R.cb.restored(x->ok);
        ddp_buf_release(&x->frame);
        free(x);
    }
}

static void queue(struct task *t)
{
    pthread_mutex_lock(&R.mu);
    *R.tail = t;
    R.tail = &t->next;
    pthread_cond_signal(&R.cv);
    pthread_mutex_unlock(&R.mu);
}

/* ---- what the copying thread knows ---- */

static struct known *known_of(const char *rel)
{
    for (size_t k = 0; k < R.nkn; k++)
        if (strcmp(R.kn[k].rel, rel) == 0)
            return &R.kn[k];
    return NULL;
}

static bool same_state(const struct known *k, const struct stat *sb)
{
    return k->dev == sb->st_dev && k->ino == sb->st_ino && k->size == (uint64_t)sb->st_size &&
           k->mtime.tv_sec == sb->st_mtim.tv_sec && k->mtime.tv_nsec == sb->st_mtim.tv_nsec;
}

static void know(const char *rel, const struct stat *sb, const uint8_t sha[32])
{
    struct known *k = known_of(rel);
    if (!k) {
        if (R.nkn == R.capkn) {
            size_t cap = R.capkn ? 2 * R.capkn : 16;
            struct known *n = realloc(R.kn, cap * sizeof(*n));
            if (!n)
                return;
            R.kn = n;
            R.capkn = cap;
        }
        k = &R.kn[R.nkn];
        if (!(k->rel = strdup(rel)))
            return;
        R.nkn++;
    }
    k->size = (uint64_t)sb->st_size;
    k->dev = sb->st_dev;
    k->ino = sb->st_ino;
    k->mtime = sb->st_mtim;
    memcpy(k->sha, sha, 32);
}

static void forget(const char *rel)
{
    struct known *k = known_of(rel);
    if (!k)
        return;
    free(k->rel);
    *k = R.kn[--R.nkn];
}

/* rel's SHA-256 here: 0 with *sb, or -errno. Known unchanged files are not read again unless
 * verify (a restore reads every copy: a disk may change bytes without a write). */
static int local_sha(const char *rel, struct stat *sb, uint8_t sha[32], bool verify)
{
    if (fstatat(R.dirfd, rel, sb, AT_SYMLINK_NOFOLLOW) != 0)
        return -errno;
    if (!S_ISREG(sb->st_mode))
        return -EINVAL;
    const struct known *k = known_of(rel);
    if (k && !verify && same_state(k, sb)) {
        memcpy(sha, k->sha, 32);
        return 0;
    }
    char path[PATH_MAX];
    uint64_t size;
    if (snprintf(path, sizeof(path), "%s/%s", R.dir, rel) >= (int)sizeof(path))
        return -ENAMETOOLONG;
    int r = ddp__cw_hash(path, &size, sha);
    if (r < 0)
        return r;
    if (fstatat(R.dirfd, rel, sb, AT_SYMLINK_NOFOLLOW) != 0)
        return -errno;
    if ((uint64_t)sb->st_size != size)
        return -EAGAIN; /* written to meanwhile: its next close reports it */
    know(rel, sb, sha);
    return 0;
}

/* ---- the watch: what the ranks finish and remove ---- */

static void report(uint8_t kind, uint32_t round, const char *rel, uint64_t size,
                   const uint8_t sha[32])
{
    struct result *x = calloc(1, sizeof(*x));
    struct ddp__ck_file f = {.kind = kind, .round = round, .size = size};
    if (!x)
        return;
    snprintf(f.rel, sizeof(f.rel), "%s", rel);
    if (sha)
        memcpy(f.sha, sha, 32);
    ddp_buf_init(&x->frame);
    ddp__ck_put_file(&x->frame, &f);
    x->report = true;
    post(x);
}

/* A HASH or GONE that reports nothing: its count goes down all the same. */
static void reported_nothing(void)
{
    struct result *x = calloc(1, sizeof(*x));
    if (!x)
        return; /* (the count stays up: ddp__cr_quiet's wait is bounded) */
    ddp_buf_init(&x->frame);
    x->report = true;
    post(x);
}

static void do_hash(const struct task *t)
{
    struct stat sb;
    uint8_t sha[32];
    const struct known *k = known_of(t->rel);
    bool had = k != NULL;
    uint8_t before[32];
    if (had)
        memcpy(before, k->sha, 32);
    if (local_sha(t->rel, &sb, sha, false) < 0 || (had && memcmp(before, sha, 32) == 0)) {
        reported_nothing(); /* gone, or unchanged: a copy this thread put there, or the same */
        return;
    }
    report(DDP__CK_FINISHED, t->round, t->rel, (uint64_t)sb.st_size, sha);
}

static void do_gone(const struct task *t)
{
    struct stat sb;
    if (!known_of(t->rel) || fstatat(R.dirfd, t->rel, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        reported_nothing(); /* never reported or dropped by a SYNC; or back already */
        return;
    }
    forget(t->rel);
    report(DDP__CK_REMOVED, t->round, t->rel, 0, NULL);
}

static void on_watch(void *arg, enum ddp__cw_kind kind, const char *rel)
{
    (void)arg;
    const char *base = strrchr(rel, '/');
    base = base ? base + 1 : rel;
    if (strncmp(base, PART, strlen(PART)) == 0 || !ddp__ck_rel_ok(rel, strlen(rel)))
        return;
    struct task *t = calloc(1, sizeof(*t));
    if (!t || !(t->rel = strdup(rel))) {
        free(t);
        return;
    }
    t->kind = kind == DDP__CW_FINISHED ? T_HASH : T_GONE;
    t->round = R.cb.round();
    R.reporting++;
    queue(t);
}

/* ---- the copying thread: a SYNC ---- */

/* Makes rel's parent folders under the checkpoint folder. */
static int make_parents(const char *rel)
{
    char p[DDP__CK_REL_MAX + 1];
    snprintf(p, sizeof(p), "%s", rel);
    for (char *s = strchr(p, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        if (mkdirat(R.dirfd, p, 0755) != 0 && errno != EEXIST)
            return -errno;
        *s = '/';
    }
    return 0;
}

/* Reads what the server sent until want plaintext bytes are pending (or the end). */
static int fill(int fd, struct ddp__seal *s, struct ddp_buf *raw, struct ddp_buf *plain,
                size_t want, char *why, size_t whyn)
{
    int idle = 0;
    while (ddp_buf_pending(plain) < want) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, 100);
        if (atomic_load(&R.stop)) {
            snprintf(why, whyn, "the agent is stopping");
            return -1;
        }
        if (atomic_load(&R.copying) && atomic_load(&R.cut)) {
            snprintf(why, whyn, "cut short for a restore (asked again later)");
            return -1;
        }
        if (r == 0 && (idle += 100) >= IO_MS) {
            snprintf(why, whyn, "it sent nothing for %d s", IO_MS / 1000);
            return -1;
        }
        if (r == 0)
            continue;
        if (r < 0 && errno == EINTR)
            continue;
        if (ddp_buf_reserve(raw, CHUNK) < 0) {
            snprintf(why, whyn, "out of memory");
            return -1;
        }
        ssize_t n = ddp_read_eintr(fd, raw->data + raw->len, CHUNK);
        if (n == -EAGAIN)
            continue;
        if (n <= 0) {
            snprintf(why, whyn, "%s",
                     n == 0 ? "it closed the connection early" : strerror((int)-n));
            return -1;
        }
        raw->len += (size_t)n;
        idle = 0;
        if (ddp__seal_open(s, raw, plain) < 0) {
            snprintf(why, whyn, "a record failed its authentication");
            return -1;
        }
    }
    return 0;
}

/* Fetches rel from addr into place, checking it against the record. 0, or -1 with why. */
static int fetch(const char *addr, const struct ddp__ck_entry *e, uint64_t *bytes, char *why,
                 size_t whyn)
{
    struct ddp__seal s;
    char tmp[DDP__CK_REL_MAX + 64];
    int fd = ddp__aw_dial_one(addr, R.token, REQUEST_MS, &s, why, whyn), out = -1, rc = -1;
    if (fd < 0)
        return -1;
    atomic_store(&R.cur_fd, fd);
    struct ddp_buf req, raw, plain;
    ddp_buf_init(&req);
    ddp_buf_init(&raw);
    ddp_buf_init(&plain);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    const char *slash = strrchr(e->rel, '/');
    int tl = snprintf(tmp, sizeof(tmp), "%.*s%s%.40s.%ld", slash ? (int)(slash - e->rel + 1) : 0,
                      e->rel, PART, slash ? slash + 1 : e->rel, (long)syscall(SYS_gettid));
    if (tl < 0 || (size_t)tl >= sizeof(tmp)) { /* (its temporary name must be in its folder) */
        snprintf(why, whyn, "its path is too long for a temporary name beside it");
        goto out;
    }
    if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 ||
        ddp__ck_put_request(&req, e->rel) < 0 || ddp__aw_write(fd, &s, req.data, req.len) < 0) {
        snprintf(why, whyn, "cannot send the request");
        goto out;
    }
    if (fill(fd, &s, &raw, &plain, 9, why, whyn) < 0)
        goto out;
    struct ddp_rd rd;
    uint8_t status;
    uint64_t size;
    ddp_rd_init(&rd, plain.data + plain.off, 9);
    ddp_rd_u8(&rd, &status);
    ddp_rd_u64(&rd, &size);
    plain.off += 9;
    if (status != 0) {
        snprintf(why, whyn, "%s", status == 1 ? "it has no such file" : "it refused the request");
        goto out;
    }
    if (size != e->size) {
        snprintf(why, whyn, "its copy is %llu bytes, the record's %llu", (unsigned long long)size,
                 (unsigned long long)e->size);
        goto out;
    }
    if (make_parents(e->rel) < 0 ||
        (out = openat(R.dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0) {
        snprintf(why, whyn, "cannot write its copy here: %s", strerror(errno));
        goto out;
    }
    for (uint64_t got = 0; got < size;) {
        if (ddp_buf_pending(&plain) == 0 && fill(fd, &s, &raw, &plain, 1, why, whyn) < 0)
            goto out;
        size_t m = ddp_buf_pending(&plain);
        if (m > size - got)
            m = (size_t)(size - got);
        const uint8_t *p = plain.data + plain.off;
        if (ddp_write_all(out, p, m) < 0) {
            snprintf(why, whyn, "cannot write its copy here: %s", strerror(errno));
            goto out;
        }
        EVP_DigestUpdate(md, p, m);
        plain.off += m;
        got += m;
        ddp_buf_compact(&plain);
    }
    uint8_t sha[32];
    unsigned shalen = 0;
    EVP_DigestFinal_ex(md, sha, &shalen);
    if (memcmp(sha, e->sha, 32) != 0) {
        snprintf(why, whyn, "its copy's SHA-256 differs from the record's: refused");
        goto out;
    }
    struct stat sb;
    if (fstat(out, &sb) != 0 || renameat(R.dirfd, tmp, R.dirfd, e->rel) != 0) {
        snprintf(why, whyn, "cannot put it in place: %s", strerror(errno));
        goto out;
    }
    know(e->rel, &sb, sha); /* (the rename keeps the inode and its times) */
    *bytes += size;
    rc = 0;
out:
    atomic_store(&R.cur_fd, -1);
    if (out >= 0) {
        close(out);
        if (rc < 0)
            unlinkat(R.dirfd, tmp, 0);
    }
    EVP_MD_CTX_free(md);
    ddp__seal_wipe(&s);
    ddp_buf_release(&req);
    ddp_buf_release(&raw);
    ddp_buf_release(&plain);
    close(fd);
    return rc;
}

/* One HAVE: the copy here is that version already, or fetched from its holders in turn. */
static int sync_one(const struct ddp__ck_sync *s, const struct ddp__ck_entry *e, uint64_t *bytes,
                    uint32_t *files, char *why, size_t whyn)
{
    struct stat sb;
    uint8_t sha[32];
    bool verify = (s->flags & DDP__CK_SYNC_RESTORE) != 0;
    int here = local_sha(e->rel, &sb, sha, verify);
    if (here == 0 && memcmp(sha, e->sha, 32) == 0)
        return 0;
    size_t wl = 0;
    why[0] = '\0';
    bool mine = false; /* this node holds it, the launcher says: its copy here changed */
    for (uint32_t h = 0; h < e->nh; h++)
        mine |= strcmp(s->addr[e->holder[h]], R.self) == 0;
    if (mine && here == 0 && (uint64_t)sb.st_size == e->size) {
        int w = snprintf(why, whyn, "the copy here does not match its record's SHA-256");
        wl = w > 0 && (size_t)w < whyn ? (size_t)w : 0;
    }
    for (uint32_t h = 0; h < e->nh; h++) {
        const char *a = s->addr[e->holder[h]];
        if (strcmp(a, R.self) == 0)
            continue; /* (ours is not that version) */
        char one[DDP__CK_WHY_MAX];
        if (fetch(a, e, bytes, one, sizeof(one)) == 0) {
            (*files)++;
            if (wl)
                DDP_WARN(SUP, "agent: checkpoint %s: %s; fetched from %s", e->rel, why, a);
            return 0;
        }
        int w = snprintf(why + wl, whyn - wl, "%s%s: %s", wl ? "; " : "", a, one);
        wl += w > 0 && (size_t)w < whyn - wl ? (size_t)w : 0;
        if (atomic_load(&R.stop))
            break;
    }
    if (!wl)
        snprintf(why, whyn, "no holder of that version is left");
    else if (wl + 40 < whyn && e->nh <= (mine ? 1u : 0u))
        snprintf(why + wl, whyn - wl, "; no other node holds it");
    return -1;
}

static void do_sync(struct ddp__ck_sync *s)
{
    int64_t t0 = ddp_now_ms();
    struct ddp__ck_synced out = {.id = s->id};
    out.fail = calloc(s->n ? s->n : 1, sizeof(*out.fail));
    for (uint32_t k = 0; k < s->n && out.fail; k++) {
        const struct ddp__ck_entry *e = &s->e[k];
        if (e->op == DDP__CK_DROP) {
            forget(e->rel);
            unlinkat(R.dirfd, e->rel, 0);
            continue;
        }
        char why[DDP__CK_WHY_MAX + 1];
        if (sync_one(s, e, &out.bytes, &out.files, why, sizeof(why)) < 0) {
            snprintf(out.fail[out.nfail].rel, sizeof(out.fail[0].rel), "%s", e->rel);
            snprintf(out.fail[out.nfail].why, sizeof(out.fail[0].why), "%s", why);
            out.nfail++;
        }
    }
    out.ms = (uint64_t)(ddp_now_ms() - t0);
    struct result *x = calloc(1, sizeof(*x));
    if (x) {
        ddp_buf_init(&x->frame);
        ddp__ck_put_synced(&x->frame, &out);
        x->restore = (s->flags & DDP__CK_SYNC_RESTORE) != 0;
        x->ok = out.nfail == 0;
        post(x);
    }
    free(out.fail);
}

static void *work(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&R.mu);
        while (!R.head && !atomic_load(&R.stop))
            pthread_cond_wait(&R.cv, &R.mu);
        struct task *t = R.head;
        if (t && !(R.head = t->next))
            R.tail = &R.head;
        pthread_mutex_unlock(&R.mu);
        if (!t)
            return NULL; /* stopping, nothing left */
        if (!atomic_load(&R.stop)) {
            if (t->kind == T_HASH)
                do_hash(t);
            else if (t->kind == T_GONE)
                do_gone(t);
            else {
                bool restore = (t->sync.flags & DDP__CK_SYNC_RESTORE) != 0;
                if (restore)
                    atomic_store(&R.cut, false);
                atomic_store(&R.copying, !restore);
                do_sync(&t->sync);
                atomic_store(&R.copying, false);
            }
        }
        free(t->rel);
        ddp__ck_sync_release(&t->sync);
        free(t);
    }
}

/* ---- the agent's side ---- */

int ddp__cr_open(struct ddp_loop *loop, const char *dir, const char *token, const char *bind_host,
                 const struct ddp__cr_cb *cb, char *addr, size_t addrn, char *why, size_t whyn)
{
    if (R.open) {
        snprintf(addr, addrn, "%s", R.self);
        return 0;
    }
    R.loop = loop;
    R.cb = *cb;
    R.tail = &R.head;
    R.rtail = &R.rhead;
    atomic_store(&R.cur_fd, -1);
    if (!(R.dir = strdup(dir)) || !(R.token = strdup(token))) {
        snprintf(why, whyn, "out of memory");
        return -1;
    }
    if ((R.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        snprintf(why, whyn, "checkpoint.dir %s: %s", dir, strerror(errno));
        return -1;
    }
    R.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int w = ddp__cw_open(loop, dir, SETTLE_MS, false, on_watch, NULL, &R.watch);
    if (w < 0 || R.efd < 0 || ddp_loop_add(loop, R.efd, DDP_LOOP_READ, on_results, NULL) < 0) {
        snprintf(why, whyn, "cannot watch checkpoint.dir %s: %s", dir,
                 w == -ENOSPC ? "the system's inotify watches are used up "
                                "(fs.inotify.max_user_watches)"
                              : strerror(w < 0 ? -w : errno));
        return -1;
    }
    if (pthread_create(&R.worker, NULL, work, NULL) != 0) {
        snprintf(why, whyn, "cannot start a thread");
        return -1;
    }
    if (ddp__cs_start(R.dirfd, R.token, bind_host, addr, addrn, why, whyn) < 0) {
        atomic_store(&R.stop, true);
        pthread_mutex_lock(&R.mu);
        pthread_cond_signal(&R.cv);
        pthread_mutex_unlock(&R.mu);
        pthread_join(R.worker, NULL);
        return -1;
    }
    snprintf(R.self, sizeof(R.self), "%s", addr);
    R.open = true;
    return 0;
}

int ddp__cr_sync(const uint8_t *body, size_t len)
{
    struct task *t = calloc(1, sizeof(*t));
    if (!t)
        return DDP_ENOMEM;
    if (!R.open) { /* (its CKPT_PORT said why: the launcher stops the job) */
        free(t);
        return 1;
    }
    int r = ddp__ck_get_sync(body, len, &t->sync);
    if (r < 0) {
        free(t);
        return r;
    }
    t->kind = T_SYNC;
    if (t->sync.flags & DDP__CK_SYNC_RESTORE) {
        R.restoring++;
        /* a copy in flight (from a node maybe lost now) must not hold the ranks back: it is
         * cut short, and the launcher asks for it again */
        atomic_store(&R.cut, true);
    }
    queue(t);
    return 0;
}

bool ddp__cr_quiet(void)
{
    return !R.open || (R.reporting == 0 && !ddp__cw_busy(R.watch));
}

bool ddp__cr_restoring(void)
{
    return R.restoring > 0;
}

void ddp__cr_close(void)
{
    if (!R.open)
        return;
    R.open = false;
    atomic_store(&R.stop, true);
    ddp__cs_stop();
    int fd = atomic_load(&R.cur_fd);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
    pthread_mutex_lock(&R.mu);
    pthread_cond_signal(&R.cv);
    pthread_mutex_unlock(&R.mu);
    pthread_join(R.worker, NULL);
    ddp__cw_close(R.watch);
    ddp_loop_del(R.loop, R.efd);
    for (struct task *t = R.head, *n; t; t = n) {
        n = t->next;
        free(t->rel);
        ddp__ck_sync_release(&t->sync);
        free(t);
    }
    R.head = NULL;
    for (struct result *x = R.rhead, *n; x; x = n) {
        n = x->next;
        ddp_buf_release(&x->frame);
        free(x);
    }
    R.rhead = NULL;
    for (size_t k = 0; k < R.nkn; k++)
        free(R.kn[k].rel);
    free(R.kn);
    R.kn = NULL;
    R.nkn = R.capkn = 0;
    /* (dirfd, the token and the folder stay: a connection's thread may still be ending) */
}
