/*
 * `ddprun JOB.yaml`: a job from start to end. It hosts the job's store (a thread of its own),
 * sets up the views (the console, the records), the node agents (cli/supervisor/nodes.c) and the
 * membership watch, runs the round policy (cli/supervisor/rounds.c) on one loop with the job's
 * signals, and at the end gives every view the summary and leaves nothing behind.
 *
 * Signals: SIGINT and SIGTERM stop the job (the ranks get SIGINT or SIGTERM first), a second
 * one ends every rank at once; SIGUSR1, SIGUSR2 and SIGHUP are passed to every running rank.
 */
#include "cli/supervisor/recovery.h"
#include "cli/supervisor/ckpt.h"
#include "cli/supervisor/metrics.h"
#include "cli/supervisor/supervisor.h"
#include "cli/proto/agent_proto.h"
#include "cli/supervisor/watchdog.h"
#include "cli/provision/slurm.h"
#include "cli/spec/args.h"
#include "cli/supervisor/launch.h"
#include "cli/sys/sys.h"
#include "cli/view/console.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/etcd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"

static int mkdir_p(const char *path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static void make_job_id(const char *name, char *out, size_t n)
{
    char stamp[32], clean[64];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
    size_t k = 0;
    for (const char *p = name; *p && k + 1 < sizeof(clean); p++)
        clean[k++] = (char)((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                                    (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'
                                ? *p
                                : '-');
    clean[k] = '\0';
    uint16_t rnd = 0;
    ddp_random_bytes(&rnd, sizeof(rnd));
    snprintf(out, n, "%s-%s-%04x", clean[0] ? clean : "job", stamp, rnd);
}

/* rendezvous: {backend: etcd}: the job's folder "<prefix><job id>/", and etcd answering now
 * (rather than each agent failing on its own later). */
static int etcd_setup(const struct ddp_job *job)
{
    size_t len = 1;
    for (size_t k = 0; k < job->netcd; k++)
        len += strlen(job->etcd_endpoints[k]) + 1;
    if (!(ddp__supervisor.etcd_eps = calloc(1, len)))
        return -1;
    for (size_t k = 0, at = 0; k < job->netcd; k++)
        at += (size_t)snprintf(ddp__supervisor.etcd_eps + at, len - at, "%s%s", k ? "," : "",
                               job->etcd_endpoints[k]);
    snprintf(ddp__supervisor.etcd_prefix, sizeof(ddp__supervisor.etcd_prefix), "%s%s/",
             job->etcd_prefix, ddp__supervisor.job_id);
    snprintf(ddp__supervisor.store_addr, sizeof(ddp__supervisor.store_addr), "etcd");
    struct ddp_etcd_opts o = {.endpoints = (const char *const *)job->etcd_endpoints,
                              .nendpoints = job->netcd,
                              .ca_file = job->etcd_ca,
                              .cert_file = job->etcd_cert,
                              .key_file = job->etcd_key};
    struct ddp_etcd *e;
    char ver[64];
    if (ddp_etcd_new(&o, &e) < 0)
        return -1;
    if (ddp_etcd_version(e, ver, sizeof(ver)) < 0) {
        ddp__cli_error("rendezvous.backend etcd: %s", ddp_etcd_error(e));
        ddp_etcd_free(e);
        return -1;
    }
    ddp__supervisor.etcd = e; /* kept for the cleanup at the end */
    return 0;
}

/* The job's folder goes with the job: every key its agents and ranks left (the agents' leases
 * ended with them). */
static void etcd_cleanup(void)
{
    if (!ddp__supervisor.etcd)
        return;
    ddp_etcd_set_timeout(ddp__supervisor.etcd, 2000);
    if (ddp_etcd_delete(ddp__supervisor.etcd, ddp__supervisor.etcd_prefix, true, NULL) < 0)
        ddp__sup_say("ddprun: the job's keys under %s stay in etcd: %s",
                     ddp__supervisor.etcd_prefix, ddp_etcd_error(ddp__supervisor.etcd));
    ddp_etcd_free(ddp__supervisor.etcd);
    ddp__supervisor.etcd = NULL;
}

static void *serve(void *srv)
{
    ddp_store_server_run(srv);
    return NULL;
}

/* SIGUSR1, SIGUSR2, SIGHUP: for the job, not for ddprun (Slurm's --signal=USR1@T pattern). */
static void pass_signal(int sig)
{
    char name[32];
    int n = 0;
    for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++)
        if (ddp__supervisor.nd[i].state == DDP__NS_RUNNING ||
            ddp__supervisor.nd[i].state == DDP__NS_STOPPING) {
            ddp__nodes_signal(&ddp__supervisor.nodes, (int)i, sig);
            n += ddp__supervisor.job->nodes[i].slots;
        }
    ddp__signal_name(sig, name, sizeof(name));
    ddp__sup_say("ddprun: %s: passed to the %d rank%s running", name, n, n == 1 ? "" : "s");
    ddp__sup_event("signal", "signal", name, "#ranks", (long long)n, NULL);
}

/* SIGINT or SIGTERM: the first stops the job, the second ends every rank now, a third ends
 * the agents themselves. */
static void stop_signal(struct ddp_loop *loop, int sig, const char *who)
{
    char name[32];
    if (++ddp__supervisor.sigints == 1) {
        bool stopping = ddp__supervisor.ph == DDP__PH_FINISHING;
        if (!stopping) {
            ddp__supervisor.interrupted = true;
            ddp__supervisor.stop_sig = sig == SIGINT ? SIGINT : SIGTERM;
        }
        ddp__sup_say("ddprun: %s: stopping %d rank%s (%s, %sSIGKILL after %lld ms; "
                     "interrupt again to end them now)",
                     who ? who : strsignal(sig),
                     ddp__supervisor.ranks_up - ddp__supervisor.ranks_done,
                     ddp__supervisor.ranks_up - ddp__supervisor.ranks_done == 1 ? "" : "s",
                     stopping ? "stopping already"
                              : ddp__signal_name(ddp__supervisor.stop_sig, name, sizeof(name)),
                     ddp__supervisor.stop_sig == SIGINT ? "SIGTERM halfway, " : "",
                     (long long)ddp__supervisor.job->stop_grace_ms);
        if (!stopping)
            ddp__sup_finish("interrupted", DDP_EXIT_INTERRUPTED);
    } else if (ddp__supervisor.sigints == 2) {
        ddp__sup_say("ddprun: ending every rank now");
        /* The agents SIGKILL their ranks and sweep what the ranks left behind; should one
         * not be gone in 2 s, it is ended (ddp__sup_escalate). */
        for (size_t i = 0; i < ddp__supervisor.job->nnodes; i++)
            if (ddp__supervisor.nd[i].state == DDP__NS_STOPPING)
                ddp__nodes_stop(&ddp__supervisor.nodes, (int)i, 0, SIGKILL);
        ddp_timer_stop(loop, &ddp__supervisor.stop_deadline);
        ddp_timer_start(loop, &ddp__supervisor.force, 2000);
    } else {
        ddp__sup_escalate();
    }
}

/* On the store's thread: a lease whose holder's connection closed (rendezvous/store.h). */
static void lease_orphaned(void *arg, uint64_t lease)
{
    (void)arg;
    ssize_t w = write(ddp__supervisor.orphans[1], &lease, sizeof(lease)); /* full: they drain */
    (void)w;
}

static void on_orphans(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)loop;
    (void)mask;
    (void)arg;
    uint64_t lease;
    while (read(fd, &lease, sizeof(lease)) == (ssize_t)sizeof(lease))
        ddp__sup_lease_orphaned(lease);
}

static void on_signal(struct ddp_loop *loop, int fd, unsigned mask, void *arg)
{
    (void)mask;
    (void)arg;
    struct signalfd_siginfo si;
    while (ddp_read_eintr(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) {
            int st;
            pid_t p;
            /* Orphans of the job reparented to us are reaped here too, and ignored. */
            while ((p = waitpid(-1, &st, WNOHANG)) > 0)
                ddp__nodes_reaped(&ddp__supervisor.nodes, p, st);
        } else if (sig == SIGHUP && ddp__supervisor.hup_ignored) {
            ddp__sup_say(
                "ddprun: SIGHUP: ignored, as it was when ddprun started (nohup, --detach)");
        } else if (sig == SIGUSR1 || sig == SIGUSR2 || sig == SIGHUP) {
            pass_signal(sig);
        } else {
            stop_signal(loop, sig, NULL);
        }
    }
    if (ddp__supervisor.ph == DDP__PH_FINISHING && ddp__nodes_all_gone(&ddp__supervisor.nodes))
        ddp_loop_stop(loop);
}

static bool env_has(const struct ddp_job *job, const char *key)
{
    for (size_t k = 0; k < job->nenv; k++)
        if (strcmp(job->env[k].key, key) == 0)
            return true;
    return false;
}

/* Appends the numeric addresses of host to the list (a few, each once). */
static void add_addrs(char ***list, size_t *n, const struct addrinfo *ai)
{
    for (; ai; ai = ai->ai_next) {
        char ip[INET6_ADDRSTRLEN];
        if (getnameinfo(ai->ai_addr, ai->ai_addrlen, ip, sizeof(ip), NULL, 0, NI_NUMERICHOST) != 0)
            continue;
        char *pct = strchr(ip, '%');
        if (pct)
            *pct = '\0';
        bool seen = false;
        for (size_t k = 0; k < *n && !seen; k++)
            seen = strcmp((*list)[k], ip) == 0;
        char **v = seen ? NULL : realloc(*list, (*n + 2) * sizeof(char *));
        if (v) {
            *list = v;
            if (((*list)[*n] = strdup(ip)))
                (*n)++;
        }
    }
}

/*
 * The TCPStore port (rendezvous.torch_store: launcher): PyTorch's protocol has no
 * authentication, so it serves only the job's nodes: every address of each node's host, and
 * every address of this machine (its local nodes' ranks come from one of them).
 */
static int torch_listen(const struct ddp_job *job, const char *listen)
{
    char **allow = NULL;
    size_t n = 0;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    for (size_t i = 0; i < job->nnodes; i++)
        if (getaddrinfo(ddp__sup_node_addr((int)i), NULL, &hints, &res) == 0) {
            add_addrs(&allow, &n, res);
            freeaddrinfo(res);
        }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *f = ifs; f; f = f->ifa_next) {
            if (!f->ifa_addr ||
                (f->ifa_addr->sa_family != AF_INET && f->ifa_addr->sa_family != AF_INET6))
                continue;
            struct addrinfo one = {.ai_addr = f->ifa_addr,
                                   .ai_addrlen = f->ifa_addr->sa_family == AF_INET
                                                     ? sizeof(struct sockaddr_in)
                                                     : sizeof(struct sockaddr_in6)};
            add_addrs(&allow, &n, &one);
        }
        freeifaddrs(ifs);
    }
    /* On a wildcard store, the port is bound to the address the nodes are reached from when it
     * is one for all of them (the job's interface), else to the wildcard. */
    char bind_ip[INET6_ADDRSTRLEN] = "", ip[INET6_ADDRSTRLEN];
    bool one = strcmp(listen, "0.0.0.0") == 0 || strcmp(listen, "::") == 0;
    for (size_t i = 0; i < job->nnodes && one; i++) {
        if (ddp__job_host_is_local(job->nodes[i].host))
            continue;
        if (ddp__route_source(ddp__sup_node_addr((int)i), ip, sizeof(ip)) < 0 ||
            (bind_ip[0] && strcmp(ip, bind_ip) != 0))
            one = false;
        else
            snprintf(bind_ip, sizeof(bind_ip), "%s", ip);
    }
    const char *host = one && bind_ip[0] ? bind_ip : listen;
    DDP_INFO(SUP, "serving PyTorch's TCPStore protocol on '%s'", host);
    int r = ddp_store_server_torch_listen(ddp__supervisor.srv, host, 0, (const char *const *)allow,
                                          n, &ddp__supervisor.torch_port);
    for (size_t k = 0; k < n; k++)
        free(allow[k]);
    free(allow);
    return r;
}

/* The ranks' extra environment: OMP_NUM_THREADS=1 as torchrun sets it, a forced network
 * interface or family (network:; an automatic interface is chosen by each node's agent),
 * then the job's env. */
static char **job_env(const struct ddp_job *job)
{
    static const char *const ifvars[] = {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                                         "TP_SOCKET_IFNAME"};
    size_t e = 0;
    char **env = calloc(job->nenv + 6, sizeof(char *));
    if (!env)
        return NULL;
    if (ddp__job_omp_default(job))
        env[e++] = strdup("OMP_NUM_THREADS=1");
    for (size_t k = 0; k < 3 && job->net_iface; k++) {
        size_t len = strlen(ifvars[k]) + strlen(job->net_iface) + 2;
        if (!env_has(job, ifvars[k]) && (env[e] = malloc(len)))
            snprintf(env[e++], len, "%s=%s", ifvars[k], job->net_iface);
    }
    if (job->net_family && !env_has(job, "NCCL_SOCKET_FAMILY"))
        env[e++] = strdup(job->net_family == 6 ? "NCCL_SOCKET_FAMILY=AF_INET6"
                                               : "NCCL_SOCKET_FAMILY=AF_INET");
    for (size_t k = 0; k < job->nenv; k++) {
        size_t len = strlen(job->env[k].key) + strlen(job->env[k].value) + 2;
        if ((env[e] = malloc(len)))
            snprintf(env[e++], len, "%s=%s", job->env[k].key, job->env[k].value);
    }
    return env;
}

/* `ddprun stop`: as SIGINT. */
static void remote_stop(void)
{
    stop_signal(ddp__supervisor.loop, SIGINT, "ddprun stop");
}

/* `ddprun ps`: id, pid, phase, ranks up, ranks, nodes, ms since the start, mode, log folder. */
static void remote_info(char *out, size_t n)
{
    snprintf(out, n, "%s\t%d\t%s\t%d\t%d\t%d\t%lld\t%s\t%s", ddp__supervisor.job_id, (int)getpid(),
             ddp__supervisor.phase_name ? ddp__supervisor.phase_name : "starting",
             ddp__supervisor.ranks_up - ddp__supervisor.ranks_done,
             ddp__supervisor.world ? ddp__supervisor.world : ddp__supervisor.job->world_size,
             ddp__supervisor.nmembers ? ddp__supervisor.nmembers : (int)ddp__supervisor.job->nnodes,
             (long long)(ddp_now_ms() - ddp__supervisor.t0),
             ddp__supervisor.detached ? "detached" : "attached", ddp__supervisor.logdir);
}

static bool remote_request(const char *req, int fd)
{
    return ddp__remote_request(&ddp__supervisor.remote, req, fd);
}

struct logdir_file {
    char name[256];
    time_t mtime;
};

static int newer_first(const void *a, const void *b)
{
    const struct logdir_file *x = a, *y = b;
    return x->mtime > y->mtime ? -1 : x->mtime < y->mtime ? 1 : strcmp(x->name, y->name);
}

/*
 * Leaves the job's log folder in dir as JOB_ID.logdir (for `ddprun logs JOB_ID`), written
 * whole (a temporary file renamed: a full disk leaves it absent, never cut), and keeps only
 * the newest DDP__LOGDIR_KEEP of them there: a machine that ran thousands of jobs does not
 * keep a file for each.
 */
static void remember_logdir(const char *dir)
{
    char path[PATH_MAX + 64], tmp[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s.logdir", dir, ddp__supervisor.job_id);
    snprintf(tmp, sizeof(tmp), "%s/.%s.logdir.tmp", dir, ddp__supervisor.job_id);
    FILE *f = fopen(tmp, "we");
    bool ok = f && fprintf(f, "%s\n", ddp__supervisor.logdir) > 0;
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok || rename(tmp, path) != 0) {
        ddp__sup_say("ddprun: cannot write %s: %s (`ddprun logs %s` will need the log folder)",
                     path, strerror(errno ? errno : EIO), ddp__supervisor.job_id);
        unlink(tmp);
    }
    DIR *d = opendir(dir);
    struct logdir_file *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        struct stat st;
        char p[PATH_MAX + 300];
        if (l < 8 || l >= sizeof(v->name) || strcmp(e->d_name + l - 7, ".logdir") != 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        if (stat(p, &st) != 0)
            continue;
        if (n == cap) {
            struct logdir_file *nv = realloc(v, (cap = cap ? 2 * cap : 256) * sizeof(*v));
            if (!nv)
                break;
            v = nv;
        }
        snprintf(v[n].name, sizeof(v[n].name), "%s", e->d_name);
        v[n++].mtime = st.st_mtime;
    }
    if (d)
        closedir(d);
    if (n > DDP__LOGDIR_KEEP) {
        qsort(v, n, sizeof(*v), newer_first);
        for (size_t k = DDP__LOGDIR_KEEP; k < n; k++) {
            char p[PATH_MAX + 300];
            snprintf(p, sizeof(p), "%s/%s", dir, v[k].name);
            if (strncmp(v[k].name, ddp__supervisor.job_id, strlen(ddp__supervisor.job_id)) != 0)
                unlink(p);
        }
    }
    free(v);
}

/*
 * Detached (ready_fd >= 0): the control socket is up, so the job can be reached; tell the
 * waiting `ddprun --detach` so, and from now on write the console to console.log in the log
 * folder. Every job leaves its log folder's path beside its socket, for `ddprun logs`.
 */
static int announce(int ready_fd, bool listening)
{
    char dir[3072], why[3200], path[PATH_MAX + 64];
    if (ddp__control_dir(dir, sizeof(dir), true, why, sizeof(why)) == 0)
        remember_logdir(dir);
    if (ready_fd < 0)
        return 0;
    if (!listening) {
        ddp__cli_error("cannot detach: the job's control socket could not be opened (see the "
                       "warning above), so nothing could reach the job");
        return -1;
    }
    snprintf(path, sizeof(path), "%s/console.log", ddp__supervisor.logdir);
    int cfd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (cfd < 0) {
        ddp__cli_error("cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    dprintf(ready_fd, "OK %s\t%s\n", ddp__supervisor.job_id, ddp__supervisor.logdir);
    dup2(cfd, 1);
    dup2(cfd, 2);
    close(cfd);
    close(ready_fd);
    return 0;
}

/* The first line of `ddprun status`. */
/* `ddprun status`: the last recovery's timeline, then the checkpoints' replication. */
static int recovery_lines(char *buf, size_t n)
{
    /* the last restart's timeline, the replication's state, where the metrics are: each a line
     * where there is something to say */
    int (*const parts[])(char *, size_t) = {ddp__rcv_line, ddp__ck_line, ddp__met_line};
    size_t len = 0;
    for (size_t k = 0; k < sizeof(parts) / sizeof(parts[0]) && len + 2 < n; k++) {
        size_t at = len ? len + 1 : 0;
        int m = parts[k](buf + at, n - at);
        if (m <= 0)
            continue;
        if (len)
            buf[len] = '\n';
        len = at + (size_t)m;
    }
    if (n)
        buf[len < n ? len : n - 1] = '\0';
    return (int)len;
}

static void headline(char *out, size_t n)
{
    snprintf(out, n, "job %s: %s, round %d, %d rank%s on %d node%s, %.0f s since the start",
             ddp__supervisor.job_id,
             ddp__supervisor.phase_name ? ddp__supervisor.phase_name : "starting",
             ddp__supervisor.round, ddp__supervisor.world, ddp__supervisor.world == 1 ? "" : "s",
             ddp__supervisor.nmembers, ddp__supervisor.nmembers == 1 ? "" : "s",
             (double)(ddp_now_ms() - ddp__supervisor.t0) / 1000);
}

int ddp__launch(const struct ddp_job *job, int ready_fd)
{
    bool wd_up = false;
    int rc = DDP_EXIT_LAUNCH, sfd = -1;
    struct ddp_store_server *srv = NULL;
    pthread_t th;
    bool th_started = false, nodes_up = false;

    memset(&ddp__supervisor, 0, sizeof(ddp__supervisor));
    if (pipe2(ddp__supervisor.orphans, O_CLOEXEC | O_NONBLOCK) < 0)
        ddp__supervisor.orphans[0] = ddp__supervisor.orphans[1] = -1; /* (nodes drain) */
    ddp__supervisor.job = job;
    ddp__supervisor.first_fail = -1;
    ddp__supervisor.t0 = ddp_now_ms();
    ddp__supervisor.tty = isatty(2);
    ddp__supervisor.detached = ready_fd >= 0;
    ddp__supervisor.phase_name = "starting";
    ddp__supervisor.member = &ddp__member_store;
    /* `ddprun attach --etcd` runs the job's command line again to take it over. */
    const char *to = getenv("DDPRUN_TAKEOVER"), *to_prefix = getenv("DDPRUN_TAKEOVER_PREFIX");
    char from[300];
    snprintf(from, sizeof(from), "%s",
             getenv("DDPRUN_TAKEOVER_FROM") ? getenv("DDPRUN_TAKEOVER_FROM") : "?");
    if (to) {
        if (!job->rdzv_etcd || !to_prefix || strcmp(to_prefix, job->etcd_prefix) != 0) {
            ddp__cli_error("cannot take job %s over: its job spec, as it is now, does not "
                           "meet in etcd under %s",
                           to, to_prefix ? to_prefix : "?");
            return DDP_EXIT_USAGE;
        }
        ddp__supervisor.resuming = true;
        snprintf(ddp__supervisor.job_id, sizeof(ddp__supervisor.job_id), "%s", to);
    } else {
        make_job_id(job->name, ddp__supervisor.job_id, sizeof(ddp__supervisor.job_id));
    }
    unsetenv("DDPRUN_TAKEOVER");
    unsetenv("DDPRUN_TAKEOVER_PREFIX");
    unsetenv("DDPRUN_TAKEOVER_FROM");
    /* Under Slurm a node's name may be known to Slurm alone: where it is not its address,
     * the launcher reaches it, and routes toward it, by its NodeAddr (one scontrol call). */
    ddp__supervisor.node_addr = calloc(job->nnodes, sizeof(*ddp__supervisor.node_addr));
    if (job->srun && ddp__supervisor.node_addr)
        ddp__slurm_node_addrs(job, ddp__supervisor.node_addr);
    ddp__supervisor.first_remote = NULL; /* (an external job's nodes are named as they come) */
    for (size_t i = 0; i < job->nnodes && !ddp__supervisor.first_remote && !job->external; i++)
        if (!ddp__job_host_is_local(job->nodes[i].host))
            ddp__supervisor.first_remote = ddp__sup_node_addr((int)i);
    ssize_t sl = readlink("/proc/self/exe", ddp__supervisor.self, sizeof(ddp__supervisor.self) - 1);
    ddp__supervisor.self[sl > 0 ? sl : 0] = '\0';
    snprintf(ddp__supervisor.logdir, sizeof(ddp__supervisor.logdir), "%s/%s", job->logs_dir,
             ddp__supervisor.job_id);
    if (mkdir_p(ddp__supervisor.logdir) < 0) {
        ddp__cli_error("cannot create the log folder '%s': %s", ddp__supervisor.logdir,
                       strerror(errno));
        return DDP_EXIT_LAUNCH;
    }
    ddp__rec_open(&ddp__supervisor.rec, ddp__supervisor.logdir, job, ddp__supervisor.job_id,
                  ddp__supervisor.resuming, ddp__sup_say);
    ddp__con_init(&ddp__supervisor.con, ddp__supervisor.tty, job->tag_output, job->console_ranks);
    ddp__supervisor.views[ddp__supervisor.nviews++] = ddp__con_view(&ddp__supervisor.con);
    ddp__supervisor.views[ddp__supervisor.nviews++] = ddp__rec_view(&ddp__supervisor.rec);
    int slots = 0; /* nodes whose slots are counted there add theirs at their HELLO */
    for (size_t i = 0; i < job->nnodes; i++)
        slots += job->nodes[i].slots;
    ddp__supervisor.nd = calloc(job->nnodes, sizeof(*ddp__supervisor.nd));
    if (ddp__sup_ranks_reserve(slots) < 0 || !ddp__supervisor.nd)
        goto out;

    /*
     * Signals are read from a signalfd, so they must be blocked in every thread, and that
     * before the store thread exists (it inherits the mask; otherwise the kernel may hand
     * SIGTERM to it, and the default action ends the process). A shell starts background
     * jobs with SIGINT ignored: take SIGINT and SIGTERM back, so that the ranks get them as
     * they are meant. A SIGHUP ignored here (nohup; a detached job) is respected: the ranks
     * inherit it ignored, and since a blocked signal reaches the signalfd even when ignored,
     * the loop drops it instead of passing it on.
     */
    struct sigaction hup;
    ddp__supervisor.hup_ignored = sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler == SIG_IGN;
    sigset_t set;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    ddp__block_job_signals(&set, &ddp__supervisor.oldmask);

    ddp__sup_set_phase("starting store");
    if (ddp__sup_token(job) < 0)
        goto out;
    const char *listen = ddp__job_store_listen(job);
    int r;
    if (job->rdzv_etcd) {
        /* No store here: the agents, the ranks and this process meet in etcd. */
        if (etcd_setup(job) < 0)
            goto out;
    } else {
        struct ddp_store_server_opts o = {.host = listen,
                                          .port = job->rdzv_port,
                                          .token = ddp__supervisor.token,
                                          .token_len = strlen(ddp__supervisor.token),
                                          .lease_orphaned = lease_orphaned};
        if ((r = ddp_store_server_new(&o, &srv)) < 0) {
            ddp__cli_error("cannot start the rendezvous store on '%s:%d': %s", listen,
                           job->rdzv_port, ddp_strerror(r));
            goto out;
        }
        ddp__supervisor.srv = srv;
        if (!job->torch_store_rank0 && (r = torch_listen(job, listen)) < 0) {
            ddp__cli_error("cannot serve PyTorch's TCPStore protocol on '%s': %s", listen,
                           ddp_strerror(r));
            goto out;
        }
        if (pthread_create(&th, NULL, serve, srv) != 0)
            goto out;
        th_started = true;
        ddp__supervisor.store_port = ddp_store_server_port(srv);
        ddp__supervisor.wildcard = strcmp(listen, "0.0.0.0") == 0 || strcmp(listen, "::") == 0;
        snprintf(ddp__supervisor.store_host, sizeof(ddp__supervisor.store_host), "%s",
                 ddp__supervisor.wildcard ? "127.0.0.1" : listen);
        snprintf(ddp__supervisor.store_addr, sizeof(ddp__supervisor.store_addr),
                 strchr(ddp__supervisor.store_host, ':') ? "[%s]:%d" : "%s:%d",
                 ddp__supervisor.store_host, ddp__supervisor.store_port);
    }

    if (ddp_loop_new(&ddp__supervisor.loop) < 0 ||
        (sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0 ||
        ddp_loop_add(ddp__supervisor.loop, sfd, DDP_LOOP_READ, on_signal, NULL) < 0 ||
        (ddp__supervisor.orphans[0] >= 0 &&
         ddp_loop_add(ddp__supervisor.loop, ddp__supervisor.orphans[0], DDP_LOOP_READ, on_orphans,
                      NULL) < 0))
        goto out;
    struct ddp__remote_cb rcb = {.stop = remote_stop, .info = remote_info};
    ddp__remote_init(&ddp__supervisor.remote, ddp__supervisor.loop, job->tag_output,
                     job->console_ranks, &rcb);
    ddp__supervisor.views[ddp__supervisor.nviews++] = ddp__remote_view(&ddp__supervisor.remote);
    /* The agents of an etcd job outlive this launcher (cli/supervisor/takeover.c), but not under
     * srun: Slurm ends a step whose srun is gone. */
    ddp__supervisor.takeover_ms =
        job->rdzv_etcd && !job->srun && job->takeover_ms > 0 ? (uint64_t)job->takeover_ms : 0;
    if (job->rdzv_etcd &&
        (ddp__to_start() < 0 || (ddp__supervisor.resuming && ddp__to_restore() < 0)))
        goto out;
    if (job->rdzv_etcd)
        ddp__supervisor.views[ddp__supervisor.nviews++] = ddp__to_view();
    struct ddp__prov_ctx ctx = {.self = ddp__supervisor.self,
                                .mask = &ddp__supervisor.oldmask,
                                .detach = ddp__supervisor.takeover_ms > 0,
                                .rejoin = ddp__supervisor.resuming ? ddp__supervisor.job_id : NULL};
    if (ddp__nodes_init(&ddp__supervisor.nodes, ddp__supervisor.loop, job, &ctx,
                        &ddp__sup_nodes_cb) < 0)
        goto out;
    nodes_up = true;
    ddp__ck_init(job, &ddp__supervisor.nodes);
    if (ddp__supervisor.resuming)
        ddp__ck_load(); /* (the records the last launcher kept in etcd) */
    /* Every agent dials back there, on the store's address (cli/supervisor/dialin.h). */
    if (ddp__nodes_listen(&ddp__supervisor.nodes, listen, job->external ? job->rdzv_port + 1 : 0,
                          &ddp__supervisor.agent_port) < 0 ||
        (job->external && ddp__sup_publish_agent_port() < 0))
        goto out;
    struct ddp__agent_join where;
    ddp__sup_join_where(&where);
    if ((r = ddp__supervisor.member->watch(&where, ddp__supervisor.loop, ddp__sup_on_member, NULL,
                                           &ddp__supervisor.watch)) < 0) {
        if (job->rdzv_etcd)
            ddp__cli_error("cannot watch the job's folder %s in etcd (%s): %s",
                           ddp__supervisor.etcd_prefix, ddp__supervisor.etcd_eps, ddp_strerror(r));
        else
            ddp__cli_error("cannot watch the job's own store at %s: %s", ddp__supervisor.store_addr,
                           ddp_strerror(r));
        goto out;
    }
    /* Should an agent die abnormally, what its ranks leave behind is reparented to us
     * instead of init, and swept at the end. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    ddp__sup_timers_init();
    struct ddp__wd_ctx wd = {.loop = ddp__supervisor.loop,
                             .job = job,
                             .job_id = ddp__supervisor.job_id,
                             .nodes = &ddp__supervisor.nodes,
                             .say = ddp__sup_say,
                             .rec = &ddp__supervisor.rec,
                             .round = &ddp__supervisor.round,
                             .fail = ddp__sup_hang_failed,
                             .headline = headline,
                             .request = remote_request,
                             .startup = ddp__rcv_startup,
                             .recovery = recovery_lines};
    ddp__wd_init(&wd);
    wd_up = true;
    if (ddp__met_start() < 0) /* (cli/supervisor/metrics.h) */
        goto out;
    if (announce(ready_fd, ddp__wd_listen() == 0) < 0)
        goto out;
    char ranks[120]; /* "4 ranks on 2 nodes", or the ranks each node counts */
    if (job->world_size)
        snprintf(ranks, sizeof(ranks), "%d rank%s on %zu node%s", job->world_size,
                 job->world_size == 1 ? "" : "s", job->nnodes, job->nnodes == 1 ? "" : "s");
    else
        snprintf(ranks, sizeof(ranks), "a rank per %s on each of %zu node%s",
                 job->nproc_kind == DDP_NPROC_CPU   ? "CPU"
                 : job->nproc_kind == DDP_NPROC_GPU ? "GPU"
                                                    : "GPU (else per CPU)",
                 job->nnodes, job->nnodes == 1 ? "" : "s");
    if (!ddp__supervisor.tty && job->rdzv_etcd)
        ddp__sup_say("ddprun: job %s: %s, rendezvous in etcd (%s) under %s, logs in %s",
                     ddp__supervisor.job_id, ranks, ddp__supervisor.etcd_eps,
                     ddp__supervisor.etcd_prefix, ddp__supervisor.logdir);
    else if (!ddp__supervisor.tty)
        ddp__sup_say("ddprun: job %s: %s, store on %s:%d, logs in %s", ddp__supervisor.job_id,
                     ranks, listen, ddp__supervisor.store_port, ddp__supervisor.logdir);
    if (!ddp__supervisor.resuming)
        ddp__sup_event("job_start", "job_id", ddp__supervisor.job_id, "#nodes",
                       (long long)job->nnodes, "#min_nodes", (long long)job->min_nodes,
                       "#max_nodes", (long long)job->max_nodes, "#max_restarts",
                       (long long)job->max_restarts, "#agent_port",
                       (long long)ddp__supervisor.agent_port, NULL);
    if (!(ddp__supervisor.env = job_env(job)))
        goto out;
    /* The START frame carries it to remote nodes beside the job's env (at most 512 KiB). */
    size_t shell_bytes = 0;
    if (!(ddp__supervisor.shell_env = ddp__job_shell_env(job, &shell_bytes)))
        goto out;
    if (ddp__job_first_remote(job) && shell_bytes > DDP__SUP_MAX_SHELL_ENV) {
        ddp__cli_error("the launching shell's variables that remote ranks would get (the export "
                       "rule of ddprun-job(5)) take %zu KiB, over %u KiB; leave some out with "
                       "export: [-NAME]",
                       (shell_bytes + 1023) / 1024, DDP__SUP_MAX_SHELL_ENV >> 10);
        rc = DDP_EXIT_USAGE;
        goto out;
    }
    if (ddp__supervisor.resuming) {
        ddp__to_resume(from);
        ddp__supervisor.nodes.ctx.rejoin =
            NULL; /* nodes provisioned from now on are started afresh */
    } else {
        ddp__sup_set_phase("launching");
        ddp__sup_open();
    }
    if (!(ddp__supervisor.ph == DDP__PH_FINISHING && ddp__nodes_all_gone(&ddp__supervisor.nodes)))
        ddp_loop_run(ddp__supervisor.loop);

    rc = ddp__supervisor.interrupted ? DDP_EXIT_INTERRUPTED
         : ddp__supervisor.fatal     ? ddp__supervisor.fatal_rc
                                     : DDP_EXIT_OK;
    for (int i = 0; i < ddp__supervisor.world && rc == DDP_EXIT_OK; i++)
        if (!ddp__supervisor.rk[i].exited || ddp__supervisor.rk[i].code != 0)
            rc = DDP_EXIT_JOB_FAILED;
    if (ddp__supervisor.world == 0 && rc == DDP_EXIT_OK)
        rc = DDP_EXIT_LAUNCH;
    /* Anything still parented to us is an orphan of the job. */
    ddp__sweep_children(NULL);
    ddp__con_clear(&ddp__supervisor.con);
    ddp__rcv_end(); /* a restart still going: its event before the job's end */
    ddp__sup_event("job_end", "status", ddp__job_status(rc), "#exit_status", (long long)rc,
                   "reason", rc ? ddp__supervisor.fatal : NULL, NULL);
    ddp__sup_summarize(rc);
out:
    ddp__remote_release(
        &ddp__supervisor.remote); /* after the summary reached the attached consoles */
    ddp__met_stop();
    if (wd_up)
        ddp__wd_release();
    explicit_bzero(ddp__supervisor.token, sizeof(ddp__supervisor.token));
    if (ddp__supervisor.member)
        ddp__supervisor.member->unwatch(ddp__supervisor.watch);
    if (th_started) {
        ddp_store_server_stop(srv);
        pthread_join(th, NULL);
    }
    ddp_store_server_free(srv);
    if (nodes_up)
        ddp__nodes_release(&ddp__supervisor.nodes);
    ddp__ck_release();
    ddp__to_end();
    etcd_cleanup();
    if (ddp__supervisor.loop)
        ddp_loop_free(ddp__supervisor.loop);
    if (sfd >= 0)
        close(sfd);
    for (int k = 0; k < 2; k++)
        if (ddp__supervisor.orphans[k] >= 0)
            close(ddp__supervisor.orphans[k]); /* (after the store's thread) */
    pthread_sigmask(SIG_SETMASK, &ddp__supervisor.oldmask, NULL);
    ddp__sup_release_ranks();
    for (char **p = ddp__supervisor.env; p && *p; p++)
        free(*p);
    for (size_t i = 0; ddp__supervisor.node_addr && i < job->nnodes; i++)
        free(ddp__supervisor.node_addr[i]);
    free(ddp__supervisor.node_addr);
    ddp__supervisor.node_addr = NULL;
    free(ddp__supervisor.env);
    free(ddp__supervisor.etcd_eps);
    for (char **p = ddp__supervisor.shell_env; p && *p; p++)
        free(*p);
    free(ddp__supervisor.shell_env);
    ddp__rec_close(&ddp__supervisor.rec);
    free(ddp__supervisor.rk);
    free(ddp__supervisor.nd);
    free(ddp__supervisor.losses);
    free(ddp__supervisor.fatal);
    return rc;
}
