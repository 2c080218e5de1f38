/*
 * The checkpoint folder's watch (cli/agent/ckpt_watch.c) on a real folder under /tmp and the
 * kernel's inotify: which files it reports finished and removed, in the folder and below it
 * (folders made after the watch began too), never a write-then-rename's temporary name; and the
 * SHA-256 it reads a file's bytes to, against the standard's vectors and OpenSSL's one-shot
 * digest of the same bytes.
 */
#include "cli/agent/ckpt_watch.h"
#include "common/loop.h"
#include "common/util.h"
#include "test.h"
#include "tree.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct seen {
    int n;
    char what[64][160]; /* "F rel" or "R rel" */
};

static void on_cw(void *arg, enum ddp__cw_kind kind, const char *rel)
{
    struct seen *s = arg;
    if (s->n < 64)
        snprintf(s->what[s->n++], sizeof(s->what[0]), "%c %s", kind == DDP__CW_FINISHED ? 'F' : 'R',
                 rel);
}

static bool saw(const struct seen *s, const char *what)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->what[i], what))
            return true;
    return false;
}

static void run_for(struct ddp_loop *l, int64_t ms)
{
    int64_t end = ddp_now_ms() + ms;
    while (ddp_now_ms() < end)
        ddp_loop_run_once(l, 10);
}

/* Until want reports came (10 s at most, for a busy machine), then 300 ms more for any beyond. */
static void run_until(struct ddp_loop *l, const struct seen *s, int want)
{
    int64_t end = ddp_now_ms() + 10000;
    while (s->n < want && ddp_now_ms() < end)
        ddp_loop_run_once(l, 10);
    run_for(l, 300);
}

static void show(const struct seen *s)
{
    for (int i = 0; i < s->n; i++)
        fprintf(stderr, "  seen: %s\n", s->what[i]);
}

static void path_of(char *out, size_t n, const char *root, const char *rel)
{
    snprintf(out, n, "%s/%s", root, rel);
}

TEST(finished_files_and_removals_in_the_folder_and_below_never_a_temporary_name)
{
    char root[64], a[128], b[128], c[128];
    ddp_tree_make(root, sizeof(root), "ckpt-watch");
    ddp_tree_put(root, "old.pt", "there before the watch");
    struct ddp_loop *l;
    ASSERT_OK(ddp_loop_new(&l));
    struct seen s = {0};
    struct ddp__cw *w;
    ASSERT_OK(ddp__cw_open(l, root, 100, false, on_cw, &s, &w));
    ddp_tree_put(root, "a.pt", "a");
    /* torch.save's pattern of a careful trainer: a temporary file renamed into place */
    ddp_tree_put(root, "final.pt.tmp", "final");
    path_of(a, sizeof(a), root, "final.pt.tmp");
    path_of(b, sizeof(b), root, "final.pt");
    ASSERT_EQ(rename(a, b), 0);
    /* a folder made now, and one three deep whose file comes before its watch may */
    ddp_tree_put(root, "step-10/model.pt", "model");
    ddp_tree_put(root, "x/y/z/c.pt", "c");
    run_until(l, &s, 4);
    show(&s);
    ASSERT_EQ(s.n, 4);
    ASSERT_TRUE(saw(&s, "F a.pt"));
    ASSERT_TRUE(saw(&s, "F final.pt"));
    ASSERT_TRUE(saw(&s, "F step-10/model.pt"));
    ASSERT_TRUE(saw(&s, "F x/y/z/c.pt"));
    /* rewritten: finished again; deleted, renamed away, gone with its folder: removed */
    s.n = 0;
    ddp_tree_put(root, "a.pt", "a again");
    run_until(l, &s, 1);
    ASSERT_EQ(s.n, 1);
    ASSERT_TRUE(saw(&s, "F a.pt"));
    s.n = 0;
    path_of(a, sizeof(a), root, "a.pt");
    ASSERT_EQ(unlink(a), 0);
    char away[160];
    snprintf(away, sizeof(away), "%s-away.pt", root);
    ASSERT_EQ(rename(b, away), 0);
    path_of(c, sizeof(c), root, "step-10/model.pt");
    ASSERT_EQ(unlink(c), 0);
    path_of(c, sizeof(c), root, "step-10");
    ASSERT_EQ(rmdir(c), 0);
    run_until(l, &s, 3);
    show(&s);
    ASSERT_EQ(s.n, 3);
    ASSERT_TRUE(saw(&s, "R a.pt"));
    ASSERT_TRUE(saw(&s, "R final.pt"));
    ASSERT_TRUE(saw(&s, "R step-10/model.pt"));
    ddp__cw_close(w);
    ddp_loop_free(l);
    unlink(away);
    ddp_tree_remove(root);
}

TEST(files_there_before_the_watch_are_reported_when_asked)
{
    char root[64];
    ddp_tree_make(root, sizeof(root), "ckpt-watch");
    ddp_tree_put(root, "old.pt", "old");
    ddp_tree_put(root, "deep/er/old2.pt", "old2");
    struct ddp_loop *l;
    ASSERT_OK(ddp_loop_new(&l));
    struct seen s = {0};
    struct ddp__cw *w;
    ASSERT_OK(ddp__cw_open(l, root, 50, true, on_cw, &s, &w));
    run_until(l, &s, 2);
    show(&s);
    ASSERT_EQ(s.n, 2);
    ASSERT_TRUE(saw(&s, "F old.pt"));
    ASSERT_TRUE(saw(&s, "F deep/er/old2.pt"));
    ddp__cw_close(w);
    ddp_loop_free(l);
    ddp_tree_remove(root);
    /* a folder that does not exist is an error, not a watch of nothing */
    ASSERT_OK(ddp_loop_new(&l));
    ASSERT_EQ(ddp__cw_open(l, root, 50, true, on_cw, &s, &w), -ENOENT);
    ddp_loop_free(l);
}

static void hex(const uint8_t *b, char *out)
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

TEST(sha256_of_the_standard_vectors_and_of_a_file_read_in_pieces)
{
    char root[64], p[128], h[65];
    uint8_t sha[32], want[32];
    uint64_t size = 1;
    ddp_tree_make(root, sizeof(root), "ckpt-hash");
    path_of(p, sizeof(p), root, "empty");
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    ASSERT_OK(ddp__cw_hash(p, &size, sha));
    hex(sha, h);
    ASSERT_EQ(size, 0);
    ASSERT_STREQ(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    path_of(p, sizeof(p), root, "abc");
    fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_EQ(write(fd, "abc", 3), 3);
    close(fd);
    ASSERT_OK(ddp__cw_hash(p, &size, sha));
    hex(sha, h);
    ASSERT_EQ(size, 3);
    ASSERT_STREQ(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    /* 3 MiB and 5 bytes: read in several pieces, the same digest as of the bytes at once */
    size_t n = (3u << 20) + 5;
    uint8_t *buf = malloc(n);
    ASSERT_TRUE(buf != NULL);
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    path_of(p, sizeof(p), root, "big");
    fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_EQ(write(fd, buf, n), (ssize_t)n);
    close(fd);
    unsigned int wl = 0;
    ASSERT_EQ(EVP_Digest(buf, n, want, &wl, EVP_sha256(), NULL), 1);
    ASSERT_OK(ddp__cw_hash(p, &size, sha));
    ASSERT_EQ(size, n);
    ASSERT_MEMEQ(sha, want, 32);
    free(buf);
    path_of(p, sizeof(p), root, "none");
    ASSERT_EQ(ddp__cw_hash(p, &size, sha), -ENOENT);
    ddp_tree_remove(root);
}
