/*
 * System helpers the launcher, the node agent and the doctor share (a leaf: it calls no other
 * cli file): the job's signal mask, starting a child with its three standard streams piped,
 * ending every child of a subreaper, and the local address and interface toward a host.
 */
#include "cli/sys/sys.h"
#include "common/buf.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/banned.h"

void ddp__block_job_signals(sigset_t *set, sigset_t *old)
{
    sigemptyset(set);
    sigaddset(set, SIGCHLD);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, set, old);
    signal(SIGPIPE, SIG_IGN);
}

/*
 * Calls fn(pid, arg) for every direct child of this process, in all its threads' lists
 * (orphans that reparent to a subreaper land there too), but those spare says to spare.
 * Returns how many.
 */
static int each_child(bool (*spare)(pid_t), void (*fn)(pid_t pid, void *arg), void *arg)
{
    char path[320], buf[16384];
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%s/children", de->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t len = ddp_read_eintr(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (len <= 0)
            continue;
        buf[len] = '\0';
        char *save = NULL;
        for (char *t = strtok_r(buf, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
            pid_t pid = (pid_t)atoi(t);
            if (pid <= 0 || (spare && spare(pid)))
                continue;
            fn(pid, arg);
            n++;
        }
    }
    closedir(d);
    return n;
}

static void signal_one(pid_t pid, void *arg)
{
    kill(pid, *(const int *)arg);
}

static void reap_one(pid_t pid, void *arg)
{
    (void)arg;
    waitpid(pid, NULL, WNOHANG);
}

int ddp__kill_children(int sig, bool (*spare)(pid_t))
{
    return each_child(spare, signal_one, &sig);
}

void ddp__sweep_children(bool (*spare)(pid_t))
{
    while (ddp__kill_children(SIGKILL, spare) > 0) {
        /* Each by its pid: the spared child's status is its owner's to read. */
        each_child(spare, reap_one, NULL);
        usleep(1000);
    }
}

/* The local address the kernel would use to reach host (no packet is sent). */
int ddp__route_source(const char *host, char *out, size_t n)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = -1, r = -1;
    if (getaddrinfo(host, "9", &hints, &res) != 0)
        return -1;
    if ((fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0)) >= 0 &&
        connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
        getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)n, NULL, 0, NI_NUMERICHOST) == 0)
        r = 0;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return r;
}

int ddp__spawn_piped(const char *prog, char *const argv[], int pdeathsig, const sigset_t *mask,
                     struct ddp__child *out)
{
    int in[2] = {-1, -1}, o[2] = {-1, -1}, e[2] = {-1, -1};
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(o, O_CLOEXEC) != 0 || pipe2(e, O_CLOEXEC) != 0)
        goto fail;
    pid_t pid = fork();
    if (pid < 0)
        goto fail;
    if (pid == 0) {
        /* Its own process group, set on both sides: the parent's setpgid fails once the child
         * has exec'd (EACCES), and a child left in ddprun's group would not be reached by
         * the kill(-pid) that ends it. */
        setpgid(0, 0);
        dup2(in[0], 0);
        dup2(o[1], 1);
        dup2(e[1], 2);
        if (mask)
            sigprocmask(SIG_SETMASK, mask, NULL);
        prctl(PR_SET_PDEATHSIG, pdeathsig);
        ddp_restore_nofile(); /* the store raised ddprun's own: agents and ranks get the user's */
        if (prog)
            execvp(prog, argv);
        else
            execv("/proc/self/exe", argv);
        _exit(127);
    }
    /* ... and here, so that no kill(-pid) from now on can find the group missing. */
    setpgid(pid, pid);
    close(in[0]);
    close(o[1]);
    close(e[1]);
    fcntl(o[0], F_SETFL, O_NONBLOCK);
    fcntl(e[0], F_SETFL, O_NONBLOCK);
    *out = (struct ddp__child){.pid = pid, .in_fd = in[1], .out_fd = o[0], .err_fd = e[0]};
    return 0;
fail:;
    int saved = errno;
    for (int k = 0; k < 2; k++) {
        if (in[k] >= 0)
            close(in[k]);
        if (o[k] >= 0)
            close(o[k]);
        if (e[k] >= 0)
            close(e[k]);
    }
    errno = saved;
    return -1;
}

int ddp__route_iface(const char *host, char *ifname, size_t n, char *ip, size_t ipn)
{
    char addr[INET6_ADDRSTRLEN];
    if (ddp__route_source(host, addr, sizeof(addr)) < 0)
        return -1;
    struct ifaddrs *ifs = NULL, *i;
    int r = -1;
    if (getifaddrs(&ifs) != 0)
        return -1;
    for (i = ifs; i && r < 0; i = i->ifa_next) {
        if (!i->ifa_addr ||
            (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
            continue;
        char a[INET6_ADDRSTRLEN];
        socklen_t sl = i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                         : sizeof(struct sockaddr_in6);
        if (getnameinfo(i->ifa_addr, sl, a, sizeof(a), NULL, 0, NI_NUMERICHOST) != 0)
            continue;
        char *pct = strchr(a, '%'); /* a link-local address carries its scope */
        if (pct)
            *pct = '\0';
        if (strcmp(a, addr) == 0) {
            snprintf(ifname, n, "%s", i->ifa_name);
            if (ip)
                snprintf(ip, ipn, "%s", addr);
            r = 0;
        }
    }
    freeifaddrs(ifs);
    return r;
}

int ddp__control_dir(char *out, size_t n, bool create, char *why, size_t whyn)
{
    const char *rt = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    if (rt && rt[0] == '/' && stat(rt, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(out, n, "%s/ddprun", rt);
    else
        snprintf(out, n, "/tmp/ddprun-%u", (unsigned)geteuid());
    if (create && mkdir(out, 0700) != 0 && errno != EEXIST) {
        snprintf(why, whyn, "cannot make %s: %s", out, strerror(errno));
        return -1;
    }
    if (lstat(out, &st) != 0) {
        snprintf(why, whyn, "no running job of yours on this machine (%s: %s)", out,
                 strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
        snprintf(why, whyn, "%s is not a folder of yours closed to others; remove it", out);
        return -1;
    }
    return 0;
}

/* Where prog is found from workdir, as the agent would run it: a path (relative to workdir),
 * or a name in PATH (an empty entry: workdir); false when it is no executable file there. */
int ddp__self_dir(char *out, size_t n)
{
    char exe[PATH_MAX];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (l <= 0)
        return -1;
    exe[l] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash || (size_t)(slash - exe) >= n)
        return -1;
    snprintf(out, n, "%.*s", slash == exe ? 1 : (int)(slash - exe), exe);
    return 0;
}

void ddp__path_add_self(void)
{
    char dir[PATH_MAX];
    if (ddp__self_dir(dir, sizeof(dir)) < 0)
        return;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/bin:/bin"; /* execvp's own default */
    size_t dl = strlen(dir);
    for (const char *p = path; *p;) {
        const char *c = strchr(p, ':');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        if (l == dl && memcmp(p, dir, dl) == 0)
            return; /* there already, wherever it stands */
        p += l + (c ? 1 : 0);
    }
    size_t n = strlen(path) + dl + 2;
    char *v = malloc(n);
    if (!v)
        return;
    snprintf(v, n, "%s:%s", path, dir);
    setenv("PATH", v, 1);
    free(v);
}

bool ddp__program_path(const char *prog, const char *workdir, char *out, size_t n)
{
    if (strchr(prog, '/')) {
        snprintf(out, n, "%s%s%s", prog[0] == '/' ? "" : workdir, prog[0] == '/' ? "" : "/", prog);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        const char *c = strchr(p, ':');
        size_t l = c ? (size_t)(c - p) : strlen(p);
        if (l == 0 || p[0] != '/') /* relative entries are relative to workdir, the ranks' cwd */
            snprintf(out, n, "%s/%.*s%s%s", workdir, (int)l, p, l ? "/" : "", prog);
        else
            snprintf(out, n, "%.*s/%s", (int)l, p, prog);
        if (access(out, X_OK) == 0)
            return true;
        p += l + (c ? 1 : 0);
    }
    char dir[PATH_MAX]; /* the ranks' PATH ends with ddprun's folder (ddp__path_add_self) */
    if (ddp__self_dir(dir, sizeof(dir)) == 0) {
        snprintf(out, n, "%s/%s", dir, prog);
        return access(out, X_OK) == 0;
    }
    return false;
}

bool ddp__program_here(const char *prog, const char *workdir)
{
    char p[PATH_MAX * 2];
    return ddp__program_path(prog, workdir, p, sizeof(p));
}

int ddp__run_capture(char *const argv[], char *out, size_t n, int timeout_ms, int *status)
{
    int p[2];
    if (n == 0)
        return -1;
    out[0] = '\0';
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(p[1], 1);
        dup2(null, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    bool eof = false;
    int64_t deadline = ddp_now_ms() + timeout_ms;
    while (!eof) {
        int64_t left = deadline - ddp_now_ms();
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
            break;
        ssize_t r = ddp_read_eintr(p[0], out + len, n - 1 - len);
        if (r < 0 || (r > 0 && (len += (size_t)r) == n - 1))
            break;
        eof = r == 0;
    }
    out[len] = '\0';
    close(p[0]);
    /* Its output ended: it ends too, within the time left. */
    pid_t w;
    while ((w = waitpid(pid, status, WNOHANG)) == 0 && eof && ddp_now_ms() < deadline)
        usleep(2000);
    if (w == pid)
        return 0;
    kill(pid, SIGKILL); /* it hung, or had more to say than out holds */
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    return -1;
}

void ddp__end_child(pid_t pid, int level)
{
    if (level <= 1)
        kill(pid, SIGTERM);
    else
        kill(-pid, SIGKILL);
}

int ddp__url_hostport(const char *url, char *host, size_t n, int *port)
{
    const char *p = strstr(url, "://");
    if (!p || strncmp(url, "http", 4) != 0)
        return -1;
    p += 3;
    char hp[300];
    snprintf(hp, sizeof(hp), "%.*s", (int)strcspn(p, ",/"), p);
    if (ddp_parse_hostport(hp, host, n, port) < 0)
        return -1;
    if (*port == 0)
        *port = strncmp(url, "https", 5) == 0 ? 443 : 80;
    return 0;
}

int ddp__store_host(const char *store_addr, const char *etcd_endpoints, const char *master,
                    char *host, size_t n)
{
    int port;
    if (strcmp(store_addr, "etcd") != 0)
        return ddp_parse_hostport(store_addr, host, n, &port);
    if (ddp__url_hostport(etcd_endpoints, host, n, &port) == 0)
        return 0;
    snprintf(host, n, "%s", master); /* a Unix socket */
    return 0;
}

bool ddp__port_pool(const char *range, int *lo, int *hi)
{
    int a, b;
    if (!range || sscanf(range, "%d %d", &a, &b) != 2 || a < 1 || b < a || b > 65535)
        return false;
    if (a - DDP__PORT_POOL_FLOOR >= DDP__PORT_POOL_MIN) { /* below the range: the usual case */
        *lo = DDP__PORT_POOL_FLOOR;
        *hi = a - 1;
        return true;
    }
    if (65535 - b >= DDP__PORT_POOL_MIN) {
        *lo = b + 1;
        *hi = 65535;
        return true;
    }
    return false;
}

/* Whether port is free for a listener on every address, bound as TCPStore binds (with
 * SO_REUSEADDR: a connection of an earlier round's store in TIME_WAIT does not count). port 0:
 * the kernel's choice, returned. */
static int try_port(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, got = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t sl = sizeof(a);
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &sl) == 0)
        got = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return got;
}

int ddp__free_port(void)
{
    char range[64] = "";
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (!fgets(range, sizeof(range), f))
            range[0] = '\0';
        fclose(f);
    }
    int lo, hi;
    if (ddp__port_pool(range, &lo, &hi))
        for (int i = 0; i < 64; i++) {
            uint32_t r = 0;
            if (ddp_random_bytes(&r, sizeof(r)) < 0)
                break;
            int p = lo + (int)(r % (uint32_t)(hi - lo + 1));
            if (try_port(p) == p)
                return p;
        }
    return try_port(0);
}

int ddp__read_lines(int fd, struct ddp_buf *b, void (*line)(void *arg, const char *s, size_t n),
                    void *arg)
{
    for (;;) {
        if (ddp_buf_reserve(b, 4096) < 0)
            return 1;
        ssize_t r = ddp_read_eintr(fd, b->data + b->len, b->cap - b->len);
        if (r == -EAGAIN)
            return 0;
        if (r > 0)
            b->len += (size_t)r;
        char *s, *nl;
        while ((s = (char *)b->data + b->off), (nl = memchr(s, '\n', ddp_buf_pending(b)))) {
            line(arg, s, (size_t)(nl - s));
            b->off += (size_t)(nl - s) + 1;
        }
        if (r <= 0 || ddp_buf_pending(b) > 4000) { /* EOF, or a line without end */
            if (ddp_buf_pending(b))
                line(arg, (char *)b->data + b->off, ddp_buf_pending(b));
            b->off = b->len;
        }
        ddp_buf_compact(b);
        if (r <= 0)
            return 1;
    }
}

bool ddp__drain(int fd)
{
    char buf[4096];
    ssize_t r = ddp_read_eintr(fd, buf, sizeof(buf));
    return r == 0 || (r < 0 && r != -EAGAIN);
}
