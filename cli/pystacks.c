/* Python tracebacks of ranks on demand (cli/pystacks.h). */
#include "cli/pystacks.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/banned.h"

/* The rank's sitecustomize. It runs before the program, so it does as little as it can and
 * never fails the rank: a problem leaves Python as it would have been. */
static const char SHIM[] =
    "# ddprun: this rank's Python stacks on demand (`ddprun stacks`, hang reports). faulthandler\n"
    "# writes every thread's traceback to a file the node agent reads when it sends a signal.\n"
    "# Then this module leaves sys.path and PYTHONPATH, and the sitecustomize it hid, if any,\n"
    "# runs as Python would have run it. DDPRUN_PYTHON_STACKS=0 in the job's env turns it off.\n"
    "def _ddprun_shim():\n"
    "    import os\n"
    "    import sys\n"
    "    env = os.environ\n"
    "    me = env.pop('DDPRUN_PY_SHIM', None)\n"
    "    if me is not None:\n"
    "        sys.path[:] = [p for p in sys.path if p != me]\n"
    "        sys.path_importer_cache.pop(me, None)\n"
    "    old = env.pop('DDPRUN_PY_PYTHONPATH', None)\n"
    "    if old is None:\n"
    "        env.pop('PYTHONPATH', None)\n"
    "    else:\n"
    "        env['PYTHONPATH'] = old\n"
    "    fd = env.pop('DDPRUN_PY_STACKS_FD', None)\n"
    "    sig = env.pop('DDPRUN_PY_STACKS_SIG', None)\n"
    "    try:\n"
    "        import faulthandler\n"
    "        faulthandler.register(int(sig), file=int(fd), all_threads=True)\n"
    "    except Exception:\n"
    "        pass\n"
    "    shim = sys.modules.pop('sitecustomize')\n"
    "    try:\n"
    "        __import__('sitecustomize')\n"
    "    except ImportError as e:\n"
    "        if e.name != 'sitecustomize':\n"
    "            raise\n"
    "    finally:\n"
    "        sys.modules.setdefault('sitecustomize', shim)\n"
    "\n"
    "\n"
    "_ddprun_shim()\n"
    "del _ddprun_shim\n";

static uint32_t crc32_of(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

/* The fields a zip's local header and its central directory entry share, in the same order:
 * version needed to extract, flags, method (stored), time, date (1980-01-01), CRC-32, both
 * sizes, the name's length, no extra field. */
static void put_entry(struct ddp_buf *b, uint32_t crc, size_t n, uint16_t nl)
{
    ddp_buf_put_u16(b, 20);
    ddp_buf_put_u16(b, 0);
    ddp_buf_put_u16(b, 0);
    ddp_buf_put_u16(b, 0);
    ddp_buf_put_u16(b, (0 << 9) | (1 << 5) | 1);
    ddp_buf_put_u32(b, crc);
    ddp_buf_put_u32(b, (uint32_t)n);
    ddp_buf_put_u32(b, (uint32_t)n);
    ddp_buf_put_u16(b, nl);
    ddp_buf_put_u16(b, 0);
}

/* A zip archive of one file, stored (not compressed), as zipimport reads it. */
static void put_zip(struct ddp_buf *b, const char *name, const uint8_t *data, size_t n)
{
    uint32_t crc = crc32_of(data, n);
    uint16_t nl = (uint16_t)strlen(name);
    ddp_buf_put_u32(b, 0x04034b50); /* local file header */
    put_entry(b, crc, n, nl);
    ddp_buf_put(b, name, nl);
    ddp_buf_put(b, data, n);
    size_t cd = b->len;
    ddp_buf_put_u32(b, 0x02014b50); /* central directory */
    ddp_buf_put_u16(b, 20);         /* made by */
    put_entry(b, crc, n, nl);
    ddp_buf_put_u16(b, 0); /* comment */
    ddp_buf_put_u16(b, 0); /* disk */
    ddp_buf_put_u16(b, 0); /* internal attributes */
    ddp_buf_put_u32(b, 0); /* external attributes */
    ddp_buf_put_u32(b, 0); /* the local header's offset */
    ddp_buf_put(b, name, nl);
    size_t cd_len = b->len - cd;
    ddp_buf_put_u32(b, 0x06054b50); /* end of central directory */
    ddp_buf_put_u16(b, 0);
    ddp_buf_put_u16(b, 0);
    ddp_buf_put_u16(b, 1);
    ddp_buf_put_u16(b, 1);
    ddp_buf_put_u32(b, (uint32_t)cd_len);
    ddp_buf_put_u32(b, (uint32_t)cd);
    ddp_buf_put_u16(b, 0); /* comment */
}

int ddp__pys_shim_new(void)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    put_zip(&b, "sitecustomize.py", (const uint8_t *)SHIM, sizeof(SHIM) - 1);
    int fd = memfd_create("ddprun-pyshim", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd >= 0 && (ddp_write_all(fd, b.data, b.len) < 0 ||
                    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0)) {
        close(fd);
        fd = -1;
    }
    ddp_buf_release(&b);
    return fd;
}

int ddp__pys_dump_new(void)
{
    return memfd_create("ddprun-pystacks", MFD_CLOEXEC);
}

void ddp__pys_rank_env(int shim, int dump)
{
    const char *off = getenv("DDPRUN_PYTHON_STACKS");
    if (shim < 0 || dump < 0 || (off && strcmp(off, "0") == 0))
        return;
    int s = dup(shim), d = dup(dump); /* without CLOEXEC */
    if (s < 0 || d < 0)
        return;
    char path[64], num[16];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", s);
    const char *old = getenv("PYTHONPATH");
    if (old) {
        size_t n = strlen(path) + strlen(old) + 2;
        char *pp = malloc(n);
        if (!pp)
            return;
        snprintf(pp, n, "%s:%s", path, old);
        setenv("DDPRUN_PY_PYTHONPATH", old, 1);
        setenv("PYTHONPATH", pp, 1);
        free(pp);
    } else {
        unsetenv("DDPRUN_PY_PYTHONPATH");
        setenv("PYTHONPATH", path, 1);
    }
    setenv("DDPRUN_PY_SHIM", path, 1);
    snprintf(num, sizeof(num), "%d", d);
    setenv("DDPRUN_PY_STACKS_FD", num, 1);
    snprintf(num, sizeof(num), "%d", DDP__PYS_SIGNAL);
    setenv("DDPRUN_PY_STACKS_SIG", num, 1);
}

bool ddp__pys_armed(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    unsigned long long mask = 0;
    bool found = false;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "SigCgt:", 7) == 0) {
            found = sscanf(line + 7, "%llx", &mask) == 1;
            break;
        }
    fclose(f);
    return found && (mask >> (DDP__PYS_SIGNAL - 1) & 1);
}

/* Whether process p holds the file of fd (the same inode among its descriptors). */
static bool holds(pid_t p, int fd)
{
    struct stat want, st;
    char path[80];
    if (fstat(fd, &want) != 0)
        return false;
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)p);
    DIR *d = opendir(path);
    struct dirent *e;
    bool found = false;
    while (d && !found && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/fd/%.16s", (int)p, e->d_name);
        found = stat(path, &st) == 0 && st.st_ino == want.st_ino && st.st_dev == want.st_dev;
    }
    if (d)
        closedir(d);
    return found;
}

pid_t ddp__pys_find(pid_t rank, int dump)
{
    enum { MAX = 64 };
    pid_t q[MAX];
    int head = 0, tail = 0;
    q[tail++] = rank;
    while (head < tail) {
        pid_t p = q[head++];
        if (ddp__pys_armed(p) && holds(p, dump))
            return p;
        /* Children hang off the thread that forked them: every thread's list. */
        char path[80], line[4096];
        snprintf(path, sizeof(path), "/proc/%d/task", (int)p);
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d)) && tail < MAX) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof(path), "/proc/%d/task/%.16s/children", (int)p, e->d_name);
            FILE *f = fopen(path, "re");
            if (!f)
                continue;
            size_t n = fread(line, 1, sizeof(line) - 1, f);
            fclose(f);
            line[n] = '\0';
            for (char *s = line, *end; tail < MAX; s = end) {
                long c = strtol(s, &end, 10);
                if (end == s)
                    break;
                q[tail++] = (pid_t)c;
            }
        }
        if (d)
            closedir(d);
    }
    return 0;
}

size_t ddp__pys_size(int dump)
{
    struct stat st;
    return dump >= 0 && fstat(dump, &st) == 0 && st.st_size > 0 ? (size_t)st.st_size : 0;
}

void ddp__pys_read(int dump, size_t off, size_t max, struct ddp_buf *out)
{
    size_t end = ddp__pys_size(dump);
    if (end <= off)
        return;
    size_t n = end - off < max ? end - off : max;
    if (ddp_buf_reserve(out, n) < 0)
        return;
    ssize_t r = pread(dump, out->data + out->len, n, (off_t)off);
    if (r > 0)
        out->len += (size_t)r;
}
