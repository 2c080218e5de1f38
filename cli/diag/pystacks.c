/* Python tracebacks of ranks on demand (cli/diag/pystacks.h). */
#include "cli/diag/pystacks.h"
#include "common/progress.h"
#include "common/util.h"
#include "worker/pg.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
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
    "# With a progress page (DDPRUN_PROGRESS_FD), a finder waits for torch.distributed to load\n"
    "# ddprun's flight recorder for it (_ddprun_torch in this archive; DDP_FLIGHT_RECORDER=0\n"
    "# turns it off); where ddprun set NCCL_ASYNC_ERROR_HANDLING itself (DDPRUN_PY_NCCL_AEH), it\n"
    "# drops that under torch 2.2 and later, which read TORCH_NCCL_ASYNC_ERROR_HANDLING and warn\n"
    "# on every rank that the old name is set. Then this module leaves sys.path and PYTHONPATH,\n"
    "# and the sitecustomize it hid, if any, runs as Python would have run it.\n"
    "# DDPRUN_PYTHON_STACKS=0 in the job's env turns all of it off. In a warm interpreter\n"
    "# (DDPRUN_PY_WARM, cli/agent/warm.h) it then waits, in _ddprun_warm, for its rank's start.\n"
    "class _DdprunTorchFinder:\n"
    "    W = ('torch.distributed.distributed_c10d', 'torch.nn.parallel.distributed')\n"
    "\n"
    "    def __init__(self, imp, path, rec, aeh):\n"
    "        self.imp, self.path, self.rec, self.done = imp, path, None, set()\n"
    "        self.rec_on, self.aeh = rec, aeh\n"
    "\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name not in self.W or name in self.done:\n"
    "            return None\n"
    "        import sys\n"
    "        for f in sys.meta_path:\n"
    "            if f is not self and hasattr(f, 'find_spec'):\n"
    "                spec = f.find_spec(name, path, target)\n"
    "                if spec is not None:\n"
    "                    break\n"
    "        else:\n"
    "            return None\n"
    "        ld = spec.loader\n"
    "        ex = getattr(ld, 'exec_module', None)\n"
    "        if ex is None or type(ld).__name__ not in ('SourceFileLoader', "
    "'SourcelessFileLoader'):\n"
    "            return spec\n"
    "        hook = self\n"
    "\n"
    "        def exec_module(module):\n"
    "            ex(module)\n"
    "            hook.loaded(name, module)\n"
    "        ld.exec_module = exec_module\n"
    "        return spec\n"
    "\n"
    "    def loaded(self, name, module):\n"
    "        import sys\n"
    "        self.done.add(name)\n"
    "        if len(self.done) == len(self.W) and self in sys.meta_path:\n"
    "            sys.meta_path.remove(self)\n"
    "        if self.aeh and name == self.W[0]:\n"
    "            self.aeh = False\n"
    "            try:\n"
    "                v = sys.modules['torch'].__version__.split('.')\n"
    "                if (int(v[0]), int(v[1])) >= (2, 2):\n"
    "                    import os\n"
    "                    os.environ.pop('NCCL_ASYNC_ERROR_HANDLING', None)\n"
    "            except Exception:\n"
    "                pass\n"
    "        if not self.rec_on:\n"
    "            return\n"
    "        try:\n"
    "            if self.rec is None:\n"
    "                m = type(sys)('_ddprun_torch')\n"
    "                m.__loader__, m.__file__ = self.imp, self.path + '/_ddprun_torch.py'\n"
    "                exec(self.imp.get_code('_ddprun_torch'), m.__dict__)\n"
    "                self.rec = sys.modules['_ddprun_torch'] = m\n"
    "            self.rec.patch(name, module)\n"
    "        except Exception:\n"
    "            pass\n"
    "\n"
    "\n"
    "def _ddprun_shim():\n"
    "    import os\n"
    "    import sys\n"
    "    env = os.environ\n"
    "    me = env.pop('DDPRUN_PY_SHIM', None)\n"
    "    imp = None\n"
    "    if me is not None:\n"
    "        sys.path[:] = [p for p in sys.path if p != me]\n"
    "        imp = sys.path_importer_cache.pop(me, None)\n"
    "    old = env.pop('DDPRUN_PY_PYTHONPATH', None)\n"
    "    if old is None:\n"
    "        env.pop('PYTHONPATH', None)\n"
    "    else:\n"
    "        env['PYTHONPATH'] = old\n"
    "    warm = env.pop('DDPRUN_PY_WARM', None)\n"
    "    wimp = env.pop('DDPRUN_PY_WARM_IMPORTS', '')\n"
    "    wlisted = env.pop('DDPRUN_PY_WARM_LISTED', None) == '1'\n"
    "    fd = env.pop('DDPRUN_PY_STACKS_FD', None)\n"
    "    sig = env.pop('DDPRUN_PY_STACKS_SIG', None)\n"
    "    try:\n"
    "        import faulthandler\n"
    "        faulthandler.register(int(sig), file=int(fd), all_threads=True)\n"
    "    except Exception:\n"
    "        pass\n"
    "    aeh = env.pop('DDPRUN_PY_NCCL_AEH', None) == '1'\n"
    "    rec = (imp is not None and hasattr(imp, 'get_code') and\n"
    "           env.get('DDPRUN_PROGRESS_FD') and env.get('DDP_FLIGHT_RECORDER') != '0')\n"
    "    if rec or aeh:\n"
    "        sys.meta_path.insert(0, _DdprunTorchFinder(imp, me, bool(rec), aeh))\n"
    "    shim = sys.modules.pop('sitecustomize')\n"
    "    try:\n"
    "        __import__('sitecustomize')\n"
    "    except ImportError as e:\n"
    "        if e.name != 'sitecustomize':\n"
    "            raise\n"
    "    finally:\n"
    "        sys.modules.setdefault('sitecustomize', shim)\n"
    "        if warm is not None:\n"
    "            try:\n"
    "                m = type(sys)('_ddprun_warm')\n"
    "                exec(imp.get_code('_ddprun_warm'), m.__dict__)\n"
    "                m.main(warm, wimp, wlisted)\n"
    "            except BaseException:\n"
    "                os._exit(126)  # a warm interpreter never runs the program unready\n"
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

struct zfile {
    const char *name;
    const uint8_t *data;
    size_t n;
};

/* A zip archive of n files (at most 4), stored (not compressed), as zipimport reads it. */
static void put_zip(struct ddp_buf *b, const struct zfile *f, int n)
{
    uint32_t crc[4], at[4];
    n = n < 4 ? n : 4;
    for (int i = 0; i < n; i++) {
        crc[i] = crc32_of(f[i].data, f[i].n);
        at[i] = (uint32_t)b->len;
        ddp_buf_put_u32(b, 0x04034b50); /* local file header */
        put_entry(b, crc[i], f[i].n, (uint16_t)strlen(f[i].name));
        ddp_buf_put(b, f[i].name, strlen(f[i].name));
        ddp_buf_put(b, f[i].data, f[i].n);
    }
    size_t cd = b->len;
    for (int i = 0; i < n; i++) {
        ddp_buf_put_u32(b, 0x02014b50); /* central directory */
        ddp_buf_put_u16(b, 20);         /* made by */
        put_entry(b, crc[i], f[i].n, (uint16_t)strlen(f[i].name));
        ddp_buf_put_u16(b, 0);     /* comment */
        ddp_buf_put_u16(b, 0);     /* disk */
        ddp_buf_put_u16(b, 0);     /* internal attributes */
        ddp_buf_put_u32(b, 0);     /* external attributes */
        ddp_buf_put_u32(b, at[i]); /* the local header's offset */
        ddp_buf_put(b, f[i].name, strlen(f[i].name));
    }
    size_t cd_len = b->len - cd;
    ddp_buf_put_u32(b, 0x06054b50); /* end of central directory */
    ddp_buf_put_u16(b, 0);
    ddp_buf_put_u16(b, 0);
    ddp_buf_put_u16(b, (uint16_t)n);
    ddp_buf_put_u16(b, (uint16_t)n);
    ddp_buf_put_u32(b, (uint32_t)cd_len);
    ddp_buf_put_u32(b, (uint32_t)cd);
    ddp_buf_put_u16(b, 0); /* comment */
}

#define OFF(f) ((unsigned)offsetof(struct ddp_progress_page, f))
#define EOFF(f) ((unsigned)offsetof(struct ddp_progress_ent, f))

/* The recorder's source after _L, the layout and codes of common/progress.h it writes. */
static void put_recorder(struct ddp_buf *b)
{
    char l[1536];
    int n = snprintf(
        l, sizeof(l),
        "_L = {'size': %u, 'magic': %u, 'version': %u, 'ring_n': %u, 'rank': %u, 'world': %u, "
        "'entered': %u, 'started': %u, 'completed': %u, 'changed': %u, 'attached': %u, "
        "'attached_ns': %u, "
        "'ent': %u, 'esz': %u, 'ring': %u, 'MAGIC': %u, 'VERSION': %u, 'e_op': %u, "
        "'e_dtype': %u, 'e_bucket': %u, 'e_bytes': %u, 'e_enq': %u, 'e_start': %u, "
        "'e_end': %u, 'e_result': %u, 'dtypes': {'float32': %d, 'float64': %d, 'bfloat16': %d, "
        "'float16': %d, 'int32': %d, 'int64': %d}, 'ops': {",
        (unsigned)sizeof(struct ddp_progress_page), OFF(magic), OFF(version), OFF(ring), OFF(rank),
        OFF(world), OFF(entered), OFF(started), OFF(completed), OFF(changed_ns), OFF(attached),
        OFF(attached_ns), OFF(ent), (unsigned)sizeof(struct ddp_progress_ent), DDP_PROGRESS_RING,
        DDP_PROGRESS_MAGIC, DDP_PROGRESS_VERSION, EOFF(op), EOFF(dtype), EOFF(bucket), EOFF(bytes),
        EOFF(t_enq), EOFF(t_start), EOFF(t_end), EOFF(result), DDP_F32, DDP_F64, DDP_BF16, DDP_F16,
        DDP_I32, DDP_I64);
    for (unsigned op = 0; op < DDP_PROG__COUNT && n > 0 && (size_t)n < sizeof(l); op++)
        n += snprintf(l + n, sizeof(l) - (size_t)n, "%s'%s': %u", op ? ", " : "",
                      ddp_progress_op_name(op), op);
    if (n > 0 && (size_t)n < sizeof(l))
        n += snprintf(l + n, sizeof(l) - (size_t)n, "}}\n");
    if (n > 0 && (size_t)n < sizeof(l))
        ddp_buf_put(b, l, (size_t)n);
    ddp_buf_put(b, ddp__torch_rec_py, ddp__torch_rec_py_len);
}

int ddp__pys_shim_new(const char *name, const uint8_t *data, size_t n)
{
    struct ddp_buf b, rec;
    ddp_buf_init(&b);
    ddp_buf_init(&rec);
    put_recorder(&rec);
    const struct zfile files[] = {
        {"sitecustomize.py", (const uint8_t *)SHIM, sizeof(SHIM) - 1},
        {"_ddprun_torch.py", rec.data, rec.len},
        {name, data, n},
    };
    put_zip(&b, files, name ? 3 : 2);
    int fd = memfd_create("ddprun-pyshim", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd >= 0 && (ddp_write_all(fd, b.data, b.len) < 0 ||
                    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0)) {
        close(fd);
        fd = -1;
    }
    ddp_buf_release(&b);
    ddp_buf_release(&rec);
    return fd;
}

int ddp__pys_dump_new(void)
{
    return memfd_create("ddprun-pystacks", MFD_CLOEXEC);
}

void ddp__pys_rank_env(int shim, int dump)
{
    const char *off = getenv("DDPRUN_PYTHON_STACKS");
    int s = -1, d = -1; /* the dups: without CLOEXEC */
    if (shim < 0 || dump < 0 || (off && strcmp(off, "0") == 0) || (s = dup(shim)) < 0 ||
        (d = dup(dump)) < 0) {
        if (s >= 0)
            close(s);
        unsetenv("DDPRUN_PY_NCCL_AEH"); /* no sitecustomize to take it (cli/agent/rank_env.c) */
        return;
    }
    char path[64], num[16];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", s);
    const char *old = getenv("PYTHONPATH");
    if (old) {
        size_t n = strlen(path) + strlen(old) + 2;
        char *pp = malloc(n);
        if (!pp) {
            close(s);
            close(d);
            unsetenv("DDPRUN_PY_NCCL_AEH");
            return;
        }
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

/* The signal masks named in a /proc status file (SigCgt, SigBlk...): whether each of n names
 * has DDP__PYS_SIGNAL set, in has[i]; false where the file cannot be read. */
static bool status_bits(const char *path, const char *const *names, bool *has, int n)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    char line[256];
    for (int i = 0; i < n; i++)
        has[i] = false;
    while (fgets(line, sizeof(line), f))
        for (int i = 0; i < n; i++) {
            size_t l = strlen(names[i]);
            unsigned long long mask;
            if (strncmp(line, names[i], l) == 0 && sscanf(line + l, "%llx", &mask) == 1)
                has[i] = mask >> (DDP__PYS_SIGNAL - 1) & 1;
        }
    fclose(f);
    return true;
}

bool ddp__pys_armed(pid_t pid)
{
    char path[64];
    static const char *const cgt[] = {"SigCgt:"};
    bool has = false;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    return status_bits(path, cgt, &has, 1) && has;
}

int ddp__pys_blocked(pid_t pid)
{
    char path[80];
    static const char *const proc[] = {"ShdPnd:"}, *const thread[] = {"SigPnd:", "SigBlk:"};
    bool has[2];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    if (!status_bits(path, proc, has, 1))
        return 0; /* gone */
    if (has[0])
        return -1;
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    struct dirent *e;
    int n = 0;
    while (d && n >= 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/status", (int)pid, e->d_name);
        if (status_bits(path, thread, has, 2))
            n = has[0] ? -1 : n + has[1];
    }
    if (d)
        closedir(d);
    return n;
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
