/*
 * `ddprun status [JOB]` and `ddprun stacks [JOB] [--rank R]`: clients of a running job's
 * control socket (served by cli/supervisor/watchdog.c), from another terminal on the launching
 * machine.
 */
#include "cli/cmd/cmd.h"
#include "cli/spec/args.h"
#include "cli/sys/sys.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

int ddp__control_dial(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int ddp__control_connect(const char *cmd, const char *job)
{
    char dir[3072], why[3200], path[4096], name[256] = "";
    if (ddp__control_dir(dir, sizeof(dir), false, why, sizeof(why)) < 0) {
        ddp__cli_error("%s: %s", cmd, why);
        return -1;
    }
    if (job) { /* a log folder (logs/JOB_ID/) names its job by its last component */
        size_t l = strlen(job);
        while (l > 1 && job[l - 1] == '/')
            l--;
        size_t b = l;
        while (b > 0 && job[b - 1] != '/')
            b--;
        snprintf(name, sizeof(name), "%.*s", (int)(l - b), job + b);
    }
    DIR *d = opendir(dir);
    if (!d) {
        ddp__cli_error("%s: no running job of yours on this machine", cmd);
        return -1;
    }
    char found[16][256];
    int nfound = 0, fd = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".sock") != 0)
            continue;
        if (name[0] && strncmp(e->d_name, name, strlen(name)) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        int c = ddp__control_dial(path);
        if (c < 0) {
            if (errno == ECONNREFUSED)
                unlink(path); /* its job is gone */
            continue;
        }
        bool exact = name[0] && l - 5 == strlen(name);
        if (exact || nfound == 0) {
            if (fd >= 0)
                close(fd);
            fd = c;
        } else {
            close(c);
        }
        if (nfound < 16)
            snprintf(found[nfound], sizeof(found[0]), "%.*s", (int)(l - 5), e->d_name);
        nfound++;
        if (exact) {
            nfound = 1;
            break;
        }
    }
    closedir(d);
    if (nfound == 1)
        return fd;
    if (fd >= 0)
        close(fd);
    if (nfound == 0 && name[0])
        ddp__cli_error("%s: no running job '%s' of yours on this machine", cmd, name);
    else if (nfound == 0)
        ddp__cli_error("%s: no running job of yours on this machine", cmd);
    else {
        fprintf(stderr, "ddprun: error: %s: %d jobs are running; name one:\n", cmd, nfound);
        for (int k = 0; k < nfound && k < 16; k++)
            fprintf(stderr, "  %s\n", found[k]);
    }
    return -1;
}

/* Sends one request and prints the answer: an exit status. */
static int ask(const char *cmd, const char *job, const char *req, int timeout_ms)
{
    int fd = ddp__control_connect(cmd, job);
    if (fd < 0)
        return DDP_EXIT_USAGE;
    char line[128];
    int n = snprintf(line, sizeof(line), "%s\n", req);
    if (ddp_write_all(fd, line, (size_t)n) < 0) {
        ddp__cli_error("%s: the job closed its control socket", cmd);
        close(fd);
        return DDP_EXIT_LAUNCH;
    }
    int64_t end = ddp_now_ms() + timeout_ms;
    char buf[65536];
    bool first = true, err = false;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(end - ddp_now_ms());
        int pr = left > 0 ? poll(&p, 1, left) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0) {
            ddp__cli_error("%s: no answer from the job within %d s", cmd, timeout_ms / 1000);
            close(fd);
            return DDP_EXIT_LAUNCH;
        }
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (first && r >= 6 && strncmp(buf, "error:", 6) == 0)
            err = true;
        first = false;
        fwrite(buf, 1, (size_t)r, err ? stderr : stdout);
    }
    close(fd);
    fflush(stdout);
    return err ? DDP_EXIT_USAGE : DDP_EXIT_OK;
}

int ddp__cmd_status(const struct ddp_cli_opts *o)
{
    return ask("status", o->npos ? o->pos[0] : NULL, "status", 5000);
}

int ddp__cmd_stacks(const struct ddp_cli_opts *o)
{
    char req[64] = "stacks";
    const char *r = o->vals[DDP_OPT_RANK];
    if (r) {
        char *end;
        long v = strtol(r, &end, 10);
        if (*end || v < 0 || v > 1 << 24) {
            ddp__cli_error("stacks: --rank '%s' is not a rank number", r);
            return DDP_EXIT_USAGE;
        }
        snprintf(req, sizeof(req), "stacks %ld", v);
    }
    return ask("stacks", o->npos ? o->pos[0] : NULL, req, 30000);
}
