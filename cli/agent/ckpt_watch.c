/* The checkpoint folder's watch (cli/agent/ckpt_watch.h). */
#include "cli/agent/ckpt_watch.h"
#include "common/loop.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/banned.h"

#define DIR_MASK                                                                                   \
    (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CREATE | IN_DELETE_SELF |       \
     IN_ONLYDIR)
#define MAX_DEPTH 64 /* folders below the top, at most */

struct dirw { /* a watched folder */
    int wd;
    char *rel; /* "" for the top */
};

struct file { /* a file seen: touched since it settled, or reported */
    char *rel;
    int64_t touched_ms;
    bool dirty; /* an event touched it: looked at once settled */
    bool known; /* reported FINISHED (so that its end is reported) */
};

struct ddp__cw {
    struct ddp_loop *loop;
    int fd;
    char *dir;
    int64_t settle_ms;
    ddp__cw_fn fn;
    void *arg;
    struct dirw *dirs;
    size_t ndirs, capdirs;
    struct file *files;
    size_t nfiles, capfiles;
    struct ddp_timer settle;
};

static char *join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 2);
    if (!s)
        return NULL;
    if (la) {
        memcpy(s, a, la);
        s[la++] = '/';
    }
    memcpy(s + la, b, lb + 1);
    return s;
}

static struct file *file_of(struct ddp__cw *w, const char *rel, bool make)
{
    for (size_t i = 0; i < w->nfiles; i++)
        if (strcmp(w->files[i].rel, rel) == 0)
            return &w->files[i];
    if (!make)
        return NULL;
    if (w->nfiles == w->capfiles) {
        size_t cap = w->capfiles ? 2 * w->capfiles : 16;
        struct file *f = realloc(w->files, cap * sizeof(*f));
        if (!f)
            return NULL;
        w->files = f;
        w->capfiles = cap;
    }
    struct file *f = &w->files[w->nfiles];
    *f = (struct file){.rel = strdup(rel)};
    if (!f->rel)
        return NULL;
    w->nfiles++;
    return f;
}

/* An event touched rel: looked at once nothing touched it for settle_ms. */
static void touch(struct ddp__cw *w, const char *rel)
{
    struct file *f = file_of(w, rel, true);
    if (!f)
        return; /* out of memory: a later event or overflow's rescan finds it */
    f->dirty = true;
    f->touched_ms = ddp_now_ms();
    if (!ddp_timer_armed(&w->settle))
        ddp_timer_start(w->loop, &w->settle, w->settle_ms);
}

static void add_dir(struct ddp__cw *w, int wd, const char *rel)
{
    for (size_t i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd == wd) { /* the same folder again (a rescan), or renamed */
            char *r = strdup(rel);
            if (r) {
                free(w->dirs[i].rel);
                w->dirs[i].rel = r;
            }
            return;
        }
    if (w->ndirs == w->capdirs) {
        size_t cap = w->capdirs ? 2 * w->capdirs : 8;
        struct dirw *d = realloc(w->dirs, cap * sizeof(*d));
        if (!d)
            return;
        w->dirs = d;
        w->capdirs = cap;
    }
    char *r = strdup(rel);
    if (!r)
        return;
    w->dirs[w->ndirs++] = (struct dirw){.wd = wd, .rel = r};
}

static const char *rel_of(const struct ddp__cw *w, int wd)
{
    for (size_t i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd == wd)
            return w->dirs[i].rel;
    return NULL;
}

static void forget_dir(struct ddp__cw *w, int wd)
{
    for (size_t i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd == wd) {
            free(w->dirs[i].rel);
            w->dirs[i] = w->dirs[--w->ndirs];
            return;
        }
}

/* Watches the folder rel and those below it; files: what is in them is touched (a folder made
 * after the watch began may hold files written before its own watch). 0, or -errno for the
 * folder itself. */
static int watch_tree(struct ddp__cw *w, const char *rel, bool files, int depth)
{
    char *path = join(w->dir, rel);
    if (!path)
        return -ENOMEM;
    int wd = inotify_add_watch(w->fd, path, DIR_MASK);
    if (wd < 0) {
        int e = errno;
        free(path);
        return -e;
    }
    add_dir(w, wd, rel);
    DIR *d = opendir(path);
    if (!d) {
        free(path);
        return 0; /* gone meanwhile: its events say so */
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        char *child = join(rel, e->d_name);
        if (!child)
            continue;
        if (S_ISDIR(st.st_mode) && depth < MAX_DEPTH)
            watch_tree(w, child, files, depth + 1);
        else if (S_ISREG(st.st_mode) && files)
            touch(w, child);
        free(child);
    }
    closedir(d);
    free(path);
    return 0;
}

static int depth_of(const char *rel)
{
    int n = 0;
    for (; *rel; rel++)
        n += *rel == '/';
    return n;
}

/* Every file known under the folder rel (gone with it, or moved away) is looked at again. */
static void touch_below(struct ddp__cw *w, const char *rel)
{
    size_t l = strlen(rel);
    for (size_t i = 0; i < w->nfiles; i++)
        if (!strncmp(w->files[i].rel, rel, l) && w->files[i].rel[l] == '/')
            touch(w, w->files[i].rel);
}

static void on_event(struct ddp__cw *w, const struct inotify_event *ev)
{
    if (ev->mask & IN_Q_OVERFLOW) { /* events were lost: everything is looked at again */
        for (size_t i = 0; i < w->nfiles; i++)
            touch(w, w->files[i].rel);
        watch_tree(w, "", true, 0);
        return;
    }
    if (ev->mask & IN_IGNORED) {
        forget_dir(w, ev->wd);
        return;
    }
    const char *base = rel_of(w, ev->wd);
    if (!base || !ev->len || !ev->name[0])
        return;
    char *rel = join(base, ev->name);
    if (!rel)
        return;
    if (ev->mask & IN_ISDIR) {
        if (ev->mask & (IN_CREATE | IN_MOVED_TO))
            watch_tree(w, rel, true, depth_of(rel));
        if (ev->mask & (IN_MOVED_FROM | IN_DELETE))
            touch_below(w, rel);
    } else if (ev->mask & (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE)) {
        touch(w, rel);
    }
    free(rel);
}

static void on_inotify(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    struct ddp__cw *w = arg;
    char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0)
            return; /* EAGAIN: all read */
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            on_event(w, ev);
            p += sizeof(*ev) + ev->len;
        }
    }
}

/* What settled is reported: a regular file there is FINISHED; one reported and gone, REMOVED. */
bool ddp__cw_busy(const struct ddp__cw *w)
{
    for (size_t i = 0; i < w->nfiles; i++)
        if (w->files[i].dirty)
            return true;
    struct pollfd p = {.fd = w->fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

static void on_settle(struct ddp_loop *loop, struct ddp_timer *t)
{
    struct ddp__cw *w = (struct ddp__cw *)((char *)t - offsetof(struct ddp__cw, settle));
    int64_t now = ddp_now_ms(), next = 0;
    for (size_t i = w->nfiles; i-- > 0;) {
        struct file *f = &w->files[i];
        if (!f->dirty)
            continue;
        if (now - f->touched_ms < w->settle_ms) {
            int64_t left = w->settle_ms - (now - f->touched_ms);
            next = !next || left < next ? left : next;
            continue;
        }
        f->dirty = false;
        char *path = join(w->dir, f->rel);
        struct stat st;
        bool there = path && lstat(path, &st) == 0 && S_ISREG(st.st_mode);
        free(path);
        if (there) {
            f->known = true;
            w->fn(w->arg, DDP__CW_FINISHED, f->rel);
            continue;
        }
        if (f->known)
            w->fn(w->arg, DDP__CW_REMOVED, f->rel);
        free(f->rel);
        w->files[i] = w->files[--w->nfiles];
    }
    if (next)
        ddp_timer_start(loop, &w->settle, next);
}

int ddp__cw_open(struct ddp_loop *loop, const char *dir, int64_t settle_ms, bool existing,
                 ddp__cw_fn fn, void *arg, struct ddp__cw **out)
{
    struct ddp__cw *w = calloc(1, sizeof(*w));
    if (!w || !(w->dir = strdup(dir))) {
        free(w);
        return -ENOMEM;
    }
    w->loop = loop;
    w->settle_ms = settle_ms > 0 ? settle_ms : 1;
    w->fn = fn;
    w->arg = arg;
    ddp_timer_init(&w->settle, on_settle);
    int r;
    if ((w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0) {
        r = -errno;
        goto fail;
    }
    if ((r = watch_tree(w, "", existing, 0)) < 0)
        goto fail;
    if (ddp_loop_add(loop, w->fd, DDP_LOOP_READ, on_inotify, w) < 0) {
        r = -ENOMEM;
        goto fail;
    }
    *out = w;
    return 0;
fail:
    ddp_timer_stop(loop, &w->settle);
    ddp__cw_close(w);
    return r;
}

void ddp__cw_close(struct ddp__cw *w)
{
    if (!w)
        return;
    ddp_timer_stop(w->loop, &w->settle);
    if (w->fd >= 0) {
        ddp_loop_del(w->loop, w->fd);
        close(w->fd);
    }
    for (size_t i = 0; i < w->ndirs; i++)
        free(w->dirs[i].rel);
    for (size_t i = 0; i < w->nfiles; i++)
        free(w->files[i].rel);
    free(w->dirs);
    free(w->files);
    free(w->dir);
    free(w);
}

int ddp__cw_hash(const char *path, uint64_t *size, uint8_t sha256[32])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    int r = 0;
    uint64_t total = 0;
    if (!ctx || !buf || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        r = -ENOMEM;
        goto out;
    }
    for (;;) {
        ssize_t n = read(fd, buf, cap);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = -errno;
            goto out;
        }
        if (n == 0)
            break;
        if (EVP_DigestUpdate(ctx, buf, (size_t)n) != 1) {
            r = -ENOMEM;
            goto out;
        }
        total += (uint64_t)n;
    }
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx, sha256, &len) != 1 || len != 32) {
        r = -EINVAL;
        goto out;
    }
    *size = total;
out:
    free(buf);
    EVP_MD_CTX_free(ctx);
    close(fd);
    return r;
}
