/*
 * `ddprun doctor`'s code column: every node must run the same code. The file compared is the
 * job's program as the agent finds it (from workdir, a name through PATH), or for a Python job
 * the script python is given (relative to workdir); the interpreter itself is compared by
 * version (cli/doctor/doctor.c). Each node hashes the file it would run (SHA-256): here, or with
 * `ddprun __code WORKDIR FILE program|script` there (through SSH, or in __probe's srun step).
 */
#include "cli/doctor/doctor.h"
#include "cli/sys/sys.h"
#include "cli/spec/job.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/banned.h"

const char *ddp__code_file(const struct ddp_job *job, bool *script)
{
    *script = false;
    if (job->shell || !job->argv || !job->argv[0])
        return NULL;
    const char *b = strrchr(job->argv[0], '/');
    if (strncmp(b ? b + 1 : job->argv[0], "python", 6) != 0)
        return job->argv[0];
    for (char **a = job->argv + 1; *a; a++) {
        const char *o = *a;
        if (o[0] != '-') {
            *script = true;
            return o;
        }
        if (strcmp(o, "-") == 0)
            return NULL;   /* the program from stdin */
        if (o[1] == '-') { /* --check-hash-based-pycs MODE; other long options take none */
            if (strcmp(o, "--check-hash-based-pycs") == 0 && a[1])
                a++;
            continue;
        }
        for (const char *f = o + 1; *f; f++) { /* a cluster of flags: -uB, -Wignore, -uc CODE */
            if (*f == 'c' || *f == 'm')
                return NULL; /* inline code, or a module the interpreter finds */
            if (*f == 'W' || *f == 'X') {
                if (!f[1] && a[1])
                    a++; /* the value is the next argument */
                break;
            }
        }
    }
    return NULL;
}

const char *ddp__py_module(const struct ddp_job *job)
{
    if (job->shell || !job->argv || !job->argv[0])
        return NULL;
    const char *b = strrchr(job->argv[0], '/');
    if (strncmp(b ? b + 1 : job->argv[0], "python", 6) != 0)
        return NULL;
    for (char **a = job->argv + 1; *a; a++) {
        const char *o = *a;
        if (o[0] != '-' || strcmp(o, "-") == 0)
            return NULL; /* a script, or stdin */
        if (o[1] == '-') {
            if (strcmp(o, "--check-hash-based-pycs") == 0 && a[1])
                a++;
            continue;
        }
        for (const char *f = o + 1; *f; f++) {
            if (*f == 'c')
                return NULL;
            if (*f == 'm') /* -m NAME, or -mNAME */
                return f[1] ? f + 1 : a[1];
            if (*f == 'W' || *f == 'X') {
                if (!f[1] && a[1])
                    a++;
                break;
            }
        }
    }
    return NULL;
}

/* SHA-256 of a file, its first 8 bytes in hex; an errno. */
static int digest(const char *path, char *hex, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int err = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) ? 0 : ENOMEM;
    char buf[65536];
    for (ssize_t r; !err && (r = ddp_read_eintr(fd, buf, sizeof(buf))) != 0;) {
        if (r < 0)
            err = errno;
        else if (!EVP_DigestUpdate(c, buf, (size_t)r))
            err = ENOMEM;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdl = 0;
    if (!err && !EVP_DigestFinal_ex(c, md, &mdl))
        err = ENOMEM;
    EVP_MD_CTX_free(c);
    close(fd);
    for (unsigned i = 0; !err && i < 8 && 2 * i + 2 < n; i++)
        snprintf(hex + 2 * i, n - 2 * i, "%02x", md[i]);
    return err;
}

void ddp__code_line(const char *workdir, const char *file, bool script, char *out, size_t n)
{
    char path[PATH_MAX * 2], hex[17] = "";
    bool found = true;
    if (script)
        snprintf(path, sizeof(path), "%s%s%s", file[0] == '/' ? "" : workdir,
                 file[0] == '/' ? "" : "/", file);
    else
        found = ddp__program_path(file, workdir, path, sizeof(path));
    int err = found ? digest(path, hex, sizeof(hex)) : ENOENT;
    if (err)
        snprintf(out, n, "code none %s\n", strerror(err));
    else
        snprintf(out, n, "code %s\n", hex);
}

int ddp__cmd_code(int argc, char **argv)
{
    if (argc != 5 || (strcmp(argv[4], "script") != 0 && strcmp(argv[4], "program") != 0)) {
        fprintf(stderr, "ddprun: __code is internal to ddprun doctor\n");
        return DDP_EXIT_USAGE;
    }
    char line[256];
    ddp__code_line(argv[2], argv[3], strcmp(argv[4], "script") == 0, line, sizeof(line));
    fputs(line, stdout);
    return 0;
}
