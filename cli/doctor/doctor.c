/*
 * `ddprun doctor JOB.yaml` (over 800 lines as one table: each column's check, here, over SSH or
 * through srun, and the row it fills): checks every node of a job before it runs, all at once:
 * SSH reachable, host key known, authentication, ddprun present there in the same version,
 * the workdir present, the command's program present (as the agent runs it, from workdir),
 * the interface its ranks will use (the one that routes to the store), the GPUs its ranks would
 * see (shown for backend: nccl, which fails a node with fewer than its slots, or when a node has
 * some), a port
 * the node can listen on, and whether the node can reach the address the store would be served on
 * (a listener of the doctor's own, on the address and interface a launch would use). Prints one row
 * per node; exit status 0 when every node passes, 1 otherwise.
 *
 * Nodes a job reaches with srun (launcher: srun) are checked through one srun step each: the
 * "ssh" column then says srun, and "host key" does not apply.
 *
 * With rendezvous: {backend: etcd}, etcd is checked from here first (cli/doctor/etcd.c) and
 * the nodes' reach check is toward its first TCP endpoint (the "etcd" column).
 *
 * `ddprun __probe HOST:PORT` is what it runs on each node for the last two checks. The nodes
 * that pass then check that they reach each other where their ranks would listen (the "mesh"
 * column, cli/doctor/mesh.c).
 *
 * A Python job (the command's program is python...) also has each node's interpreter report
 * its version and torch's (or none), from workdir as the agent would run it; every node must
 * show the same two as the first one that reports them.
 *
 * The code column: the program (or a Python job's script) each node would run, hashed there;
 * every node must have the same as the first (cli/doctor/code.c).
 *
 * The nofile column, shown when some node fails it: the ranks' soft limit on open files there
 * (the probe's), against what a job of this many ranks can take (check_nofile). The clock
 * column, likewise: the node's clock against this machine's (check_clock).
 */
#include "cli/doctor/doctor.h"
#include "cli/provision/ssh_session.h"
#include "cli/spec/args.h"
#include "cli/sys/sys.h"
#include "cli/spec/job.h"
#include "cli/sys/shell_steps.h"
#include "cli/provision/ssh_session.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/banned.h"

enum {
    C_SSH,
    C_KEY,
    C_DDPRUN,
    C_WORKDIR,
    C_CMD,
    C_PORT,
    C_STORE,
    C_IFACE,
    C_MESH,
    C_GPUS,
    C_NOFILE,
    C_CLOCK,
    C_PY,
    C_TORCH,
    C_CODE,
    C_N
};
static const char *const col_name[C_N] = {"ssh",    "host key", "ddprun",    "workdir", "command",
                                          "port",   "store",    "interface", "mesh",    "gpus",
                                          "nofile", "clock",    "python",    "torch",   "code"};

/*
 * Prints "python VERSION torch VERSION" (torch: "-" when there is none; a torch that fails to
 * import fails the program, with its traceback), then "missing NAME,..." (or "missing -"): the
 * modules that the program (argv[1] "script" PATH or "module" NAME; none: nothing to check)
 * imports at its top level and this interpreter cannot find, from where the program would run
 * (a script's folder, or for -m the workdir, first on sys.path). Only statements of the
 * module's body count: an import inside try, if or a function may be optional. Nothing is
 * imported but torch (find_spec of a top-level name runs no code). No single quote: the remote
 * shell script holds it in single quotes.
 */
#define PY_CHECK                                                                                   \
    "import sys,os,ast,importlib.util as u\n"                                                      \
    "t=u.find_spec(\"torch\") and __import__(\"torch\").__version__ or \"-\"\n"                    \
    "print(\"python\",sys.version.split()[0],\"torch\",t)\n"                                       \
    "k,p=(sys.argv+[\"\",\"\"])[1:3]\n"                                                            \
    "f=p\n"                                                                                        \
    "if k==\"module\":\n"                                                                          \
    " sys.path.insert(0,os.getcwd())\n"                                                            \
    " try:\n"                                                                                      \
    "  s=u.find_spec(p)\n"                                                                         \
    " except Exception:\n"                                                                         \
    "  s=None\n"                                                                                   \
    " f=s and s.origin\n"                                                                          \
    "elif k:\n"                                                                                    \
    " sys.path.insert(0,os.path.dirname(os.path.abspath(p)))\n"                                    \
    "m=[p] if k==\"module\" and not f else []\n"                                                   \
    "b=[]\n"                                                                                       \
    "if k and f and str(f).endswith(\".py\") and os.path.isfile(f):\n"                             \
    " b=ast.parse(open(f,\"rb\").read()).body\n"                                                   \
    "for n in b:\n"                                                                                \
    " x=[a.name for a in n.names] if isinstance(n,ast.Import) else [n.module] if "                 \
    "isinstance(n,ast.ImportFrom) and not n.level and n.module else []\n"                          \
    " for y in x:\n"                                                                               \
    "  y=y.split(\".\")[0]\n"                                                                      \
    "  try:\n"                                                                                     \
    "   ok=y==\"__future__\" or u.find_spec(y) is not None\n"                                      \
    "  except Exception:\n"                                                                        \
    "   ok=True\n"                                                                                 \
    "  if not ok and y not in m:\n"                                                                \
    "   m.append(y)\n"                                                                             \
    "print(\"missing\",\",\".join(m) or \"-\")"

struct node_check {
    const struct ddp_job *job;
    size_t i;
    const char *self, *probe_host;
    int probe_port;
    const char *env_sh;    /* "export 'K=V' ...; ": a remote node's ranks' (doctor_env.c) */
    char *const *env_argv; /* {"env", "K=V", ...}: the job's env, here and through srun */
    const char *code_file; /* what every node must have the same of (cli/doctor/code.c), or NULL */
    bool code_script;
    /* a Python job's program, whose imports are checked: "script" PATH, "module" NAME, or "" */
    const char *py_kind, *py_target;
    const char *cell[C_N];  /* "ok", "FAIL", "-" or a short note */
    char why[1200];         /* the first failure */
    char iface[64];         /* the node's interface toward the store: its ranks' default */
    char py[32], torch[64]; /* a Python job's versions there */
    int gpus;               /* the GPUs its ranks would see (ddp__gpus_here there), or -1 */
    char gpus_s[16];
    long long nofile, nofile_hard; /* its ranks' limit on open files (LLONG_MAX: none), or -1 */
    char nofile_s[24];
    bool clocked;                  /* its clock was read against this machine's: */
    long long clock_ns, clock_err; /* how far ahead, and how much that can be off */
    char clock_s[16];
    char code[17]; /* the start of the SHA-256 of the code it would run (doctor_code.c) */
    char code_s[9];
    struct ddp__ssh *ssh; /* its session, kept for the mesh check once its checks passed */
};

static void failed(struct node_check *n, int col, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void failed(struct node_check *n, int col, const char *fmt, ...)
{
    n->cell[col] = "FAIL";
    for (int c = col + 1; c < C_N; c++)
        if (!n->cell[c])
            n->cell[c] = "-";
    if (n->why[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(n->why, sizeof(n->why), fmt, ap);
    va_end(ap);
}

/* From workdir ($1), program $2 runs PY_CHECK ($3) on the program $4 $5 (script PATH, module
 * NAME, or nothing): the last lines of what it printed, and its status. */
#define PY_SH                                                                                      \
    "cd \"$1\" || exit; o=$(\"$2\" -c \"$3\" \"$4\" \"$5\" 2>&1); r=$?; "                          \
    "printf '%s\\n' \"$o\" | tail -n 5; exit $r"

/* argv after the words of env (an "env K=V ..." list, or NULL), into a new NULL-terminated
 * array (NULL when out of memory). */
static char **with_env(char *const *env, char *const *argv)
{
    size_t ne = 0, na = 0;
    while (env && env[ne])
        ne++;
    while (argv[na])
        na++;
    char **v = calloc(ne + na + 1, sizeof(char *));
    for (size_t i = 0; v && i < ne + na; i++)
        v[i] = i < ne ? env[i] : argv[i - ne];
    return v;
}

/* Runs argv (after env's words) here; its wait status into *st. */
static int run_env(char *const *env, char *const *argv, char *out, size_t n, int timeout_ms,
                   int *st)
{
    char **v = with_env(env, argv);
    int r = v ? ddp__run_capture(v, out, n, timeout_ms, st) : -1;
    free(v);
    return r;
}

/* kind and target: the program whose imports PY_CHECK checks ("script" PATH, "module" NAME, or
 * "" ""). */
static int run_python_here(char *const *env, const char *workdir, const char *prog,
                           const char *kind, const char *target, char *out, size_t n)
{
    char *argv[] = {
        "/bin/sh",        "-c",         PY_SH,          "sh", (char *)workdir, (char *)prog,
        (char *)PY_CHECK, (char *)kind, (char *)target, NULL};
    int st = -1;
    if (run_env(env, argv, out, n, 60000, &st) < 0)
        snprintf(out, n, "cannot run /bin/sh");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static bool is_python(const char *prog)
{
    const char *b = strrchr(prog, '/');
    return strncmp(b ? b + 1 : prog, "python", 6) == 0;
}

/* What PY_CHECK printed (with its stderr): the versions, or why there are none. */
static void apply_python(struct node_check *n, const char *prog, const char *where, int st,
                         const char *out)
{
    const char *l = strstr(out, "python ");
    char v[32], t[64];
    if (st == 0 && l && sscanf(l, "python %31s torch %63s", v, t) == 2) {
        snprintf(n->py, sizeof(n->py), "%s", v);
        snprintf(n->torch, sizeof(n->torch), "%s", strcmp(t, "-") == 0 ? "none" : t);
        n->cell[C_PY] = n->py;
        n->cell[C_TORCH] = n->torch;
        const char *m = strstr(out, "\nmissing ");
        int ml = m ? (int)strcspn(m + 9, "\n") : 0;
        if (m && !(ml == 1 && m[9] == '-'))
            failed(n, C_PY,
                   "'%s' %s cannot import %.*s, which the program imports at its top level: its "
                   "ranks would fail at once (install %s there, or run the job with the "
                   "interpreter that has %s)",
                   prog, where, ml, m + 9, ml && memchr(m + 9, ',', (size_t)ml) ? "them" : "it",
                   ml && memchr(m + 9, ',', (size_t)ml) ? "them" : "it");
        return;
    }
    size_t len = strlen(out);
    while (len && out[len - 1] == '\n')
        len--;
    const char *last = out + len;
    while (last > out && last[-1] != '\n')
        last--;
    failed(n, C_PY, "'%s' fails to start, or to import torch, %s: %.*s", prog, where,
           (int)(out + len - last), len ? last : "(no output)");
}

/* After every node reported: each Python job's node against the first that reported. */
static void compare_python(struct node_check *nc, size_t nn)
{
    const struct node_check *ref = NULL;
    for (size_t i = 0; i < nn && !ref; i++)
        if (nc[i].py[0])
            ref = &nc[i];
    for (size_t i = 0; ref && i < nn; i++) {
        struct node_check *n = &nc[i];
        if (!n->py[0] || n->why[0] ||
            (strcmp(n->py, ref->py) == 0 && strcmp(n->torch, ref->torch) == 0))
            continue;
        snprintf(
            n->why, sizeof(n->why),
            "python %s with torch %s on this node, python %s with torch %s on %s: the ranks must "
            "run the same (a mixed job fails in its rendezvous or first collective, or "
            "computes wrong)",
            n->py, n->torch, ref->py, ref->torch, n->job->nodes[ref->i].host);
    }
}

/* The "code ..." line of ddp__code_line, run here or there. */
static void apply_code(struct node_check *n, const char *file, const char *where, const char *out)
{
    const char *l = strncmp(out, "code ", 5) == 0 ? out : strstr(out, "\ncode ");
    l = l && l != out ? l + 1 : l;
    if (l && sscanf(l, "code %16[0-9a-f]", n->code) == 1 && strlen(n->code) == 16) {
        snprintf(n->code_s, sizeof(n->code_s), "%.8s", n->code);
        n->cell[C_CODE] = n->code_s;
        return;
    }
    n->code[0] = '\0';
    const char *why = l && strncmp(l, "code none ", 10) == 0 ? l + 10 : out;
    failed(n, C_CODE, "'%s' cannot be read %s (from workdir %s): %.*s", file, where,
           n->job->workdir, (int)strcspn(why, "\n"), why[0] ? why : "no answer");
}

/* After every node reported: the code each would run against the first node's. */
static void compare_code(struct node_check *nc, size_t nn, const char *file)
{
    const struct node_check *ref = NULL;
    for (size_t i = 0; i < nn && !ref; i++)
        if (nc[i].code[0])
            ref = &nc[i];
    for (size_t i = 0; ref && i < nn; i++) {
        struct node_check *n = &nc[i];
        if (!n->code[0] || n->why[0] || strcmp(n->code, ref->code) == 0)
            continue;
        snprintf(n->why, sizeof(n->why),
                 "'%s' on this node is not the one on %s (SHA-256 %s..., there %s...): every "
                 "node must run the same code",
                 file, n->job->nodes[ref->i].host, n->code, ref->code);
    }
}

/* backend: nccl takes a GPU per rank: a node that shows fewer than its slots fails, and so does
 * one that counts its slots as its GPUs (nproc_per_node: gpu) and shows none. Whether the GPUs
 * column is worth showing (those jobs, or a node with GPUs). */
static bool check_gpus(struct node_check *nc, size_t nn)
{
    bool nccl = strcmp(nc[0].job->backend, "nccl") == 0,
         per_gpu = nc[0].job->nproc_kind == DDP_NPROC_GPU, any = nccl || per_gpu;
    for (size_t i = 0; i < nn; i++) {
        struct node_check *n = &nc[i];
        int slots = n->job->nodes[n->i].slots;
        any = any || n->gpus > 0;
        if (per_gpu && n->job->nodes[n->i].counted && !n->why[0] && n->gpus == 0) {
            n->cell[C_GPUS] = "FAIL"; /* its agent would refuse it (cli/supervisor/node_slots.c) */
            snprintf(n->why, sizeof(n->why),
                     "no GPU visible there for nproc_per_node: gpu (SLURM_GPUS_ON_NODE, "
                     "CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus)");
        } else if (nccl && !n->why[0] && n->gpus >= 0 && n->gpus < slots) {
            n->cell[C_GPUS] = "FAIL";
            snprintf(n->why, sizeof(n->why),
                     "%d GPU%s visible %s for its %d rank%s (backend: nccl takes a GPU per "
                     "rank; SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus)",
                     n->gpus, n->gpus == 1 ? "" : "s",
                     ddp__job_host_is_local(n->job->nodes[n->i].host) ? "here" : "there", slots,
                     slots == 1 ? "" : "s");
        }
    }
    return any;
}

/* A rank of a TCP group keeps a connection to every other rank (libddp's TCP transports and
 * point-to-point, Gloo's full mesh), NCCL's bootstrap and proxies a few more, and the program
 * its own files (a DataLoader's workers hand tensors over as descriptors): a node whose ranks'
 * soft limit on open files is under 2 per rank of the job + 256 fails, before a large job's
 * ranks fail with "Too many open files". Whether the column is worth showing (some node is
 * under it). */
static bool check_nofile(struct node_check *nc, size_t nn)
{
    long long world = 0;
    for (size_t i = 0; i < nn; i++)
        world += nc[i].job->nodes[i].slots;
    long long need = 2 * world + 256;
    bool any = false;
    for (size_t i = 0; i < nn; i++) {
        struct node_check *n = &nc[i];
        if (n->nofile < 0 || n->nofile >= need)
            continue;
        any = true;
        if (n->why[0])
            continue;
        n->cell[C_NOFILE] = "FAIL";
        char hard[24] = "unlimited";
        if (n->nofile_hard != LLONG_MAX)
            snprintf(hard, sizeof(hard), "%lld", n->nofile_hard);
        snprintf(n->why, sizeof(n->why),
                 "its ranks may run out of open files: their soft limit is %lld (ulimit -n), "
                 "under the %lld a job of %lld ranks can take (2 per rank, a connection to each "
                 "other, + 256); raise it to at least that, up to the hard limit %s (ulimit -n "
                 "%lld before ddprun, or limits.conf for SSH sessions)",
                 n->nofile, need, world, hard, need);
    }
    return any;
}

/* A node whose clock is more than a second off this machine's (beyond what the reading can
 * be off) fails: the ranks' log timestamps disagree across nodes, and Slurm's munge and TLS
 * fail once it grows. Whether the column is worth showing (some node fails it). */
static bool check_clock(struct node_check *nc, size_t nn)
{
    bool any = false;
    for (size_t i = 0; i < nn; i++) {
        struct node_check *n = &nc[i];
        long long off = n->clock_ns < 0 ? -n->clock_ns : n->clock_ns;
        if (!n->clocked || off - n->clock_err <= 1000000000LL)
            continue;
        any = true;
        if (n->why[0])
            continue;
        n->cell[C_CLOCK] = "FAIL";
        snprintf(n->why, sizeof(n->why),
                 "its clock is %.1f s %s this machine's (to within %lld ms): the ranks' log "
                 "timestamps disagree across nodes, and Slurm's munge and TLS fail as it grows; "
                 "is NTP (chrony, systemd-timesyncd) running there?",
                 (double)off / 1e9, n->clock_ns > 0 ? "ahead of" : "behind",
                 (n->clock_err + 999999) / 1000000);
    }
    return any;
}

/* `__probe HOST:PORT [WORKDIR PROGRAM [FILE program|script]]`: with a workdir and program (a
 * node reached by srun, where this ddprun is the one the agent would be), a line for each of
 * them first; with a file, its "code" line (cli/doctor/code.c) last. */
int ddp__cmd_probe(int argc, char **argv)
{
    char host[256], out[512];
    int port;
    if ((argc != 3 && argc != 5 && argc != 7) ||
        ddp_parse_hostport(argv[2], host, sizeof(host), &port) < 0) {
        fprintf(stderr, "ddprun: __probe is internal to ddprun doctor\n");
        return DDP_EXIT_USAGE;
    }
    if (argc >= 5) {
        bool wd = access(argv[3], X_OK) == 0;
        printf("version ddprun %s\nworkdir %s\ncommand %s\n", DDP_VERSION, wd ? "ok" : "FAIL",
               wd && ddp__program_here(argv[4], argv[3]) ? "ok" : "FAIL");
    }
    int r = ddp__doctor_probe(host, port, out, sizeof(out));
    puts(out);
    if (argc >= 5 && is_python(argv[4])) { /* a Python job's versions, for ddprun doctor */
        char py[2048];
        bool script = argc == 7 && strcmp(argv[6], "script") == 0,
             module = argc == 7 && strcmp(argv[6], "module") == 0;
        int st = run_python_here(NULL, argv[3], argv[4],
                                 script   ? "script"
                                 : module ? "module"
                                          : "",
                                 script || module ? argv[5] : "", py, sizeof(py));
        printf("pyrc %d\n%s", st, py);
    }
    if (argc == 7 && strcmp(argv[6], "module") != 0) {
        char code[256];
        ddp__code_line(argv[3], argv[5], strcmp(argv[6], "script") == 0, code, sizeof(code));
        printf("\n%s", code);
    }
    return r;
}

static void apply_probe(struct node_check *n, int rc, const char *out)
{
    if (rc == 0) {
        n->cell[C_PORT] = n->cell[C_STORE] = "ok";
        const char *f = strstr(out, " iface ");
        if (n->job->net_iface)
            snprintf(n->iface, sizeof(n->iface), "%s", n->job->net_iface);
        else if (f)
            snprintf(n->iface, sizeof(n->iface), "%.*s", (int)strcspn(f + 7, " \n"), f + 7);
        n->cell[C_IFACE] = n->iface[0] ? n->iface : "?";
        const char *g = strstr(out, " gpus ");
        if (g && (n->gpus = atoi(g + 6)) >= 0)
            snprintf(n->gpus_s, sizeof(n->gpus_s), "%d", n->gpus);
        n->cell[C_GPUS] = n->gpus_s[0] ? n->gpus_s : NULL;
        const char *f2 = strstr(out, " nofile ");
        char soft[24], hard[24];
        if (f2 && sscanf(f2, " nofile %23s %23s", soft, hard) == 2) {
            n->nofile = strcmp(soft, "inf") == 0 ? LLONG_MAX : atoll(soft);
            n->nofile_hard = strcmp(hard, "inf") == 0 ? LLONG_MAX : atoll(hard);
            snprintf(n->nofile_s, sizeof(n->nofile_s), "%s", soft);
            n->cell[C_NOFILE] = n->nofile_s;
        }
        const char *f3 = strstr(out, " clock ");
        if (f3 && sscanf(f3, " clock %lld %lld", &n->clock_ns, &n->clock_err) == 2) {
            n->clocked = true;
            snprintf(n->clock_s, sizeof(n->clock_s), "%+.3f", (double)n->clock_ns / 1e9);
            n->cell[C_CLOCK] = n->clock_s;
        }
    } else if (rc == 2) {
        failed(n, C_PORT, "%s", out);
    } else {
        n->cell[C_PORT] = "ok";
        failed(n, C_STORE, "%s", out[0] ? out : "the probe failed");
    }
}

/* A node reached by srun (launcher: srun): one step runs this ddprun's __probe there. */
static void check_srun(struct node_check *n, const char *host, const char *prog)
{
    const struct ddp_job *j = n->job;
    char nodelist[300], target[300], ip[INET6_ADDRSTRLEN], out[2048];
    if (ddp__route_source(host, ip, sizeof(ip)) < 0)
        snprintf(ip, sizeof(ip), "%s", n->probe_host);
    snprintf(nodelist, sizeof(nodelist), "--nodelist=%s", host);
    snprintf(target, sizeof(target), strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip, n->probe_port);
    char *opts[] = {DDP__DOCTOR_SRUN, nodelist, NULL};
    bool module = !n->code_file && !strcmp(n->py_kind, "module");
    char *probe[] = {(char *)n->self,
                     "__probe",
                     target,
                     j->workdir,
                     (char *)prog,
                     module ? (char *)n->py_target : (char *)n->code_file,
                     module           ? "module"
                     : n->code_script ? "script"
                                      : "program",
                     NULL};
    char **tail = with_env(n->env_argv, probe), **argv = tail ? with_env(opts, tail) : NULL;
    free(tail);
    int st = 0;
    n->cell[C_KEY] = "n/a";
    int rc = argv ? ddp__run_capture(argv, out, sizeof(out), 30000, &st) : -1;
    free(argv);
    if (rc < 0 || !strstr(out, "version ")) {
        failed(n, C_SSH, "srun could not run '%s' there (%s %d; see `srun -w %s %s --version`)",
               n->self, WIFSIGNALED(st) ? "signal" : "status",
               WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st), host, n->self);
        return;
    }
    n->cell[C_SSH] = "srun";
    const char *v = strstr(out, "version "), *probe_line = strstr(out, "command ");
    if (strncmp(v + 8, "ddprun " DDP_VERSION "\n", strlen("ddprun " DDP_VERSION "\n")) != 0)
        failed(n, C_DDPRUN, "'%s' there is '%.*s', this is ddprun %s", n->self,
               (int)strcspn(v + 8, "\n"), v + 8, DDP_VERSION);
    else if ((n->cell[C_DDPRUN] = "ok"), !strstr(out, "workdir ok\n"))
        failed(n, C_WORKDIR, "workdir '%s' is not a folder there", j->workdir);
    else if ((n->cell[C_WORKDIR] = "ok"), !strstr(out, "command ok\n"))
        failed(n, C_CMD, "'%s' is not an executable program there (from workdir %s)", prog,
               j->workdir);
    else if ((n->cell[C_CMD] = "ok"), probe_line && (probe_line = strchr(probe_line, '\n'))) {
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)strcspn(probe_line + 1, "\n"), probe_line + 1);
        apply_probe(n, WIFEXITED(st) ? WEXITSTATUS(st) : 1, line);
        const char *py = strstr(out, "\npyrc "), *nl = py ? strchr(py + 1, '\n') : NULL;
        if (!n->why[0] && is_python(prog) && py)
            apply_python(n, prog, "there", atoi(py + 6), nl ? nl + 1 : "");
        if (!n->why[0] && n->code_file)
            apply_code(n, n->code_file, "there", out);
    }
}

/* A node's checks over SSH, in one session (cli/sys/shell_steps.h), each after the last passed: the
 * ddprun there in this version, the workdir, then under the ranks' environment the program (as
 * the agent runs it: from workdir, a name looked up in PATH), the probe, a Python job's
 * interpreter and torch, and the code's hash. */
static void remote_checks(struct node_check *n, struct ddp__ssh *s, const char *prog)
{
    const struct ddp_job *j = n->job;
    if (strchr(s->remote, '\'') || strchr(prog, '\'') || strchr(j->workdir, '\'')) {
        failed(n, C_DDPRUN, "'%s' is missing or broken there (exit -1)", s->remote);
        return;
    }
    char ip[INET6_ADDRSTRLEN];
    if (ddp__route_source(j->nodes[n->i].host, ip, sizeof(ip)) < 0)
        snprintf(ip, sizeof(ip), "%s", n->probe_host);
    bool code = n->code_file && !strchr(n->code_file, '\'');
    struct ddp__steps st;
    ddp__steps_init(&st);
    ddp__steps_raw(&st, "ddp_v=$('%s' --version </dev/null); ddp_vs=$?", s->remote);
    ddp__steps_add(&st, "printf '%%s\\n' \"$ddp_v\"; exit $ddp_vs");
    ddp__steps_gate(&st);
    ddp__steps_raw(&st, "case \"$ddp_v\" in 'ddprun " DDP_VERSION "'|'ddprun " DDP_VERSION
                        "\n'*) ;; *) exit 0 ;; esac");
    ddp__steps_add(&st, "test -d '%s' && cd '%s'", j->workdir, j->workdir);
    ddp__steps_gate(&st);
    ddp__steps_raw(&st, "%s", n->env_sh);
    ddp__steps_add(&st, "cd '%s' && { command -v '%s' >/dev/null || test -x '%s'; }", j->workdir,
                   prog, prog);
    ddp__steps_gate(&st);
    ddp__steps_add(&st, strchr(ip, ':') ? "'%s' __probe '[%s]:%d'" : "'%s' __probe '%s:%d'",
                   s->remote, ip, n->probe_port);
    bool quoted = strchr(n->py_target, '\'') != NULL; /* not checked: no way to pass it */
    if (is_python(prog))
        ddp__steps_add(&st,
                       "cd '%s' || exit; o=$('%s' -c '%s' '%s' '%s' 2>&1); r=$?; printf '%%s\\n' "
                       "\"$o\" | tail -n 5; exit $r",
                       j->workdir, prog, PY_CHECK, quoted ? "" : n->py_kind,
                       quoted ? "" : n->py_target);
    if (code)
        ddp__steps_add(&st, "'%s' __code '%s' '%s' %s", s->remote, j->workdir, n->code_file,
                       n->code_script ? "script" : "program");
    const char *script = ddp__steps_script(&st);
    char out[8192] = "", *text[6];
    int status[6], rc = 0;
    if (!script)
        snprintf(s->err, sizeof(s->err), "out of memory");
    else
        ddp__ssh_run_input(s, "/bin/sh -s", script, out, sizeof(out), &rc);
    int got = script ? ddp__steps_split(&st, out, text, status, 6) : 0;
    const char *lost = s->err[0] ? s->err : "the node's shell ended before this check";
    /* the step k, when it ran: its status, else -1 */
#define RAN(k) ((k) < got ? status[k] : -1)
    for (int i = 0; i < got && i < 4; i += 3) /* the version, the probe: a line each */
        text[i][strcspn(text[i], "\n")] = '\0';
    if (RAN(0) != 0)
        failed(n, C_DDPRUN, "'%s' is missing or broken there (exit %d)", s->remote, RAN(0));
    else if (strcmp(text[0], "ddprun " DDP_VERSION) != 0)
        failed(n, C_DDPRUN, "'%s' there is '%s', this is ddprun %s", s->remote, text[0],
               DDP_VERSION);
    else if ((n->cell[C_DDPRUN] = "ok"), RAN(1) != 0)
        failed(n, C_WORKDIR, "workdir '%s' is not a folder there", j->workdir);
    else if ((n->cell[C_WORKDIR] = "ok"), RAN(2) != 0)
        failed(n, C_CMD, "'%s' is not an executable program there (from workdir %s)", prog,
               j->workdir);
    else if ((n->cell[C_CMD] = "ok"), got <= 3)
        failed(n, C_PORT, "%s", lost);
    else
        apply_probe(n, status[3], text[3]);
    int k = is_python(prog) ? 5 : 4; /* the code's step */
    if (k == 5 && !n->why[0] && got <= 4)
        failed(n, C_PY, "%s", lost);
    else if (k == 5 && !n->why[0])
        apply_python(n, prog, "there", status[4], text[4]);
    if (n->code_file && !code && !n->why[0])
        failed(n, C_CODE, "'%s': a name with a quote cannot be checked there", n->code_file);
    else if (code && !n->why[0] && got <= k)
        failed(n, C_CODE, "%s", lost);
    else if (code && !n->why[0])
        apply_code(n, n->code_file, "there", text[k]);
#undef RAN
    ddp__steps_release(&st);
}

static void *check_node(void *arg)
{
    struct node_check *n = arg;
    const struct ddp_job *j = n->job;
    const char *host = j->nodes[n->i].host;
    const char *prog = j->shell ? "/bin/sh" : j->argv[0];
    char out[1024];
    if (j->srun && !ddp__job_host_is_local(host)) {
        check_srun(n, host, prog);
        return NULL;
    }
    if (ddp__job_host_is_local(host)) {
        n->cell[C_SSH] = n->cell[C_KEY] = "local";
        n->cell[C_DDPRUN] = "ok";
        if (access(j->workdir, X_OK) != 0)
            failed(n, C_WORKDIR, "workdir '%s' is not a folder here", j->workdir);
        else if ((n->cell[C_WORKDIR] = "ok"), ddp__program_here(prog, j->workdir))
            n->cell[C_CMD] = "ok";
        else
            failed(n, C_CMD, "'%s' is not an executable program here (from workdir %s)", prog,
                   j->workdir);
        if (!n->why[0])
            apply_probe(n, ddp__doctor_probe(n->probe_host, n->probe_port, out, sizeof(out)), out);
        if (!n->why[0] && is_python(prog)) {
            int st = run_python_here(n->env_argv, j->workdir, prog, n->py_kind, n->py_target, out,
                                     sizeof(out));
            apply_python(n, prog, "here", st, out);
        }
        if (!n->why[0] && n->code_file) { /* under the job's env, as the python check */
            char *argv[] = {(char *)n->self,
                            "__code",
                            j->workdir,
                            (char *)n->code_file,
                            n->code_script ? "script" : "program",
                            NULL};
            int st;
            if (run_env(n->env_argv, argv, out, sizeof(out), 30000, &st) < 0)
                snprintf(out, sizeof(out), "code none '%s __code' failed", n->self);
            apply_code(n, n->code_file, "here", out);
        }
        return NULL;
    }
    struct ddp__ssh *s = calloc(1, sizeof(*s));
    if (!s) {
        failed(n, C_SSH, "out of memory");
        return NULL;
    }
    ddp__ssh_for_node(s, j, n->i, n->self);
    if (ddp__ssh_open(s) != 0) {
        /* Authentication failing shows in the ssh column, after a good host key. */
        if (s->stage != DDP__SSH_CONNECT)
            n->cell[s->stage == DDP__SSH_HOSTKEY ? C_SSH : C_KEY] = "ok";
        failed(n, s->stage == DDP__SSH_HOSTKEY ? C_KEY : C_SSH, "%s", s->err);
    } else {
        n->cell[C_SSH] = "ok";
        n->cell[C_KEY] = s->key_note[0] ? "new" : "ok";
        remote_checks(n, s, prog);
        if (!n->why[0]) {
            n->ssh = s;
            return NULL;
        }
    }
    ddp__ssh_close(s);
    free(s);
    return NULL;
}

/* The nodes that passed so far check that they reach each other where their ranks would
 * listen (cli/doctor/mesh.c), through the store's stand-in lfd; whether that ran. */
static bool check_mesh(struct node_check *nc, const struct ddp_job *job, const char *self, int lfd,
                       int port)
{
    enum { WHY = 800 };
    bool *part = calloc(job->nnodes, sizeof(bool));
    char *why = calloc(job->nnodes, WHY);
    struct ddp__ssh **ssh = calloc(job->nnodes, sizeof(*ssh));
    bool ran = false;
    for (size_t i = 0; part && ssh && i < job->nnodes; i++) {
        part[i] = !nc[i].why[0] && nc[i].cell[C_STORE];
        ssh[i] = nc[i].ssh;
    }
    if (part && why && ssh && (ran = ddp__doctor_mesh(job, self, lfd, port, part, ssh, why, WHY)))
        for (size_t i = 0; i < job->nnodes; i++) {
            if (!part[i])
                continue;
            if (why[i * WHY] == '\0')
                nc[i].cell[C_MESH] = "ok";
            else
                failed(&nc[i], C_MESH, "%s", why + i * WHY);
        }
    free(part);
    free(why);
    free(ssh);
    return ran;
}

static int width(int col)
{
    return col == C_IFACE || col == C_TORCH ? 16 : 10;
}

static _Atomic bool stop_accepting;

static void *accept_loop(void *arg)
{
    int lfd = *(int *)arg;
    while (!atomic_load(&stop_accepting)) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (poll(&p, 1, 100) == 1) {
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) {
                ddp__doctor_stamp(fd); /* the probe reads the node's clock against it */
                close(fd);
            }
        }
    }
    return NULL;
}

int ddp__doctor(const struct ddp_job *job)
{
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[sl > 0 ? sl : 0] = '\0';
    /* With etcd: its checks first, and the nodes check they reach its first TCP endpoint. */
    char ehost[256] = "";
    int eport = 0, ebad = 0;
    if (job->rdzv_etcd)
        ebad = ddp__doctor_etcd(job, ehost, sizeof(ehost), &eport);
    /* The store's stand-in: the address and interfaces a launch would serve on. */
    const char *laddr = ddp__job_store_listen(job);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", job->rdzv_port);
    int lfd = -1, port = -1;
    if (getaddrinfo(laddr, ps, &hints, &res) == 0) {
        lfd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        struct sockaddr_storage ss;
        socklen_t l = sizeof(ss);
        if (lfd >= 0 && bind(lfd, res->ai_addr, res->ai_addrlen) == 0 && listen(lfd, 64) == 0 &&
            getsockname(lfd, (struct sockaddr *)&ss, &l) == 0)
            port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                            : ntohs(((struct sockaddr_in *)&ss)->sin_port);
        freeaddrinfo(res);
    }
    if (port < 0) {
        ddp__cli_error("cannot listen on %s:%d (rendezvous.listen/port): %s", laddr, job->rdzv_port,
                       strerror(errno));
        if (lfd >= 0)
            close(lfd);
        return DDP_EXIT_LAUNCH;
    }
    pthread_t acc;
    atomic_store(&stop_accepting, false);
    pthread_create(&acc, NULL, accept_loop, &lfd);
    bool wildcard = strcmp(laddr, "0.0.0.0") == 0 || strcmp(laddr, "::") == 0;
    bool code_script;
    const char *code_file = ddp__code_file(job, &code_script);
    const char *module = ddp__py_module(job);
    char *env_sh = ddp__doctor_env_sh(job), **env_argv = ddp__doctor_env_argv(job);
    struct node_check *nc = calloc(job->nnodes, sizeof(*nc));
    pthread_t *th = calloc(job->nnodes, sizeof(*th));
    if (!nc || !th || !env_sh || !env_argv) {
        ddp__cli_error("out of memory");
        return DDP_EXIT_LAUNCH;
    }
    for (size_t i = 0; i < job->nnodes; i++) {
        nc[i] = (struct node_check){.job = job,
                                    .i = i,
                                    .self = self,
                                    .probe_host = ehost[0]   ? ehost
                                                  : wildcard ? "127.0.0.1"
                                                             : laddr,
                                    .probe_port = ehost[0] ? eport : port,
                                    .env_sh = env_sh,
                                    .env_argv = env_argv,
                                    .code_file = code_file,
                                    .code_script = code_script,
                                    .py_kind = code_script ? "script"
                                               : module    ? "module"
                                                           : "",
                                    .py_target = code_script ? code_file
                                                 : module    ? module
                                                             : "",
                                    .gpus = -1,
                                    .nofile = -1};
        pthread_create(&th[i], NULL, check_node, &nc[i]);
    }
    for (size_t i = 0; i < job->nnodes; i++)
        pthread_join(th[i], NULL);
    atomic_store(&stop_accepting, true);
    pthread_join(acc, NULL);
    bool mesh = check_mesh(nc, job, self, lfd, port);
    for (size_t i = 0; i < job->nnodes; i++)
        if (nc[i].ssh) {
            ddp__ssh_close(nc[i].ssh);
            free(nc[i].ssh);
        }
    compare_python(nc, job->nnodes);
    if (code_file)
        compare_code(nc, job->nnodes, code_file);
    bool py = is_python(job->shell ? "/bin/sh" : job->argv[0]), gpus = check_gpus(nc, job->nnodes);
    bool nofile = check_nofile(nc, job->nnodes), clock = check_clock(nc, job->nnodes);
    bool shown[C_N];
    for (int c = 0; c < C_N; c++)
        shown[c] = c == C_GPUS                 ? gpus
                   : c == C_NOFILE             ? nofile
                   : c == C_CLOCK              ? clock
                   : c == C_PY || c == C_TORCH ? py
                   : c == C_CODE               ? !!code_file
                   : c == C_MESH               ? mesh
                                               : true;
    close(lfd);
    size_t hw = 4;
    for (size_t i = 0; i < job->nnodes; i++) {
        size_t l = strlen(job->nodes[i].host);
        hw = l > hw ? l : hw;
    }
    printf("%-*s", (int)hw + 2, "node");
    for (int c = 0; c < C_N; c++)
        if (shown[c])
            printf("%-*s", width(c), c == C_STORE && ehost[0] ? "etcd" : col_name[c]);
    printf("result\n");
    int bad = 0;
    for (size_t i = 0; i < job->nnodes; i++) {
        printf("%-*s", (int)hw + 2, job->nodes[i].host);
        for (int c = 0; c < C_N; c++)
            if (shown[c])
                printf("%-*s", width(c), nc[i].cell[c] ? nc[i].cell[c] : "-");
        if (nc[i].why[0]) {
            bad++;
            printf("FAIL: %s\n", nc[i].why);
        } else {
            printf("pass\n");
        }
    }
    printf("%zu node%s checked: %zu passed, %d failed\n", job->nnodes, job->nnodes == 1 ? "" : "s",
           job->nnodes - (size_t)bad, bad);
    free(nc);
    free(th);
    free(env_sh);
    for (char **e = env_argv; *e; e++)
        free(*e);
    free(env_argv);
    if (ebad)
        printf("etcd: %d check%s failed (above)\n", ebad, ebad == 1 ? "" : "s");
    return bad || ebad ? DDP_EXIT_JOB_FAILED : DDP_EXIT_OK;
}
