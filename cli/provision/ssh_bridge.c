/*
 * The SSH bridge: how the launcher reaches a node agent on another host.
 *
 * The launcher starts `ddprun __ssh-bridge ...` where it would start a local agent, with the
 * same pipes. The bridge opens an SSH session with libssh, verifies the server's host key
 * against known_hosts (strict, accept-new or no, as OpenSSH's StrictHostKeyChecking; a changed
 * key is always refused), authenticates with the identity file or the SSH agent and default
 * keys, runs `REMOTE_DDPRUN agent` on the node, and then copies bytes: its stdin to the
 * channel (so the START frame and its token travel inside the encrypted channel, never on a
 * command line) and the channel's stdout and stderr back. EOF on its stdin becomes EOF on the
 * agent's stdin, which stops the node's workers; if the launcher dies, its end of the pipe
 * closes, and the bridge passes that EOF on the same way. With "detach" (the agents wait for
 * a new launcher, cli/agent/link.h) that EOF leaves the agent running: the bridge relays what
 * comes for the stop grace at most and leaves without killing anything.
 *
 * Stopping is bounded whatever the node does: once its stdin closed, the bridge waits at most
 * the job's stop grace plus a few seconds for the remote agent to finish, and on SIGTERM (the
 * launcher ending it) not at all, before it has the remote session killed with an SSH "signal
 * KILL" request (sshd signals the session's process group: the agent and its workers) and
 * leaves. Its parent-death signal is SIGHUP, which it ignores: the EOF that follows on its
 * stdin starts the graceful stop.
 *
 * A node that cannot be provisioned (unreachable, host key refused, authentication refused,
 * ddprun missing there) is one message naming the node and the cause, and exit status 3.
 *
 * In the SSH tree (ssh.fanout, cli/agent/fanout.h) an agent runs the bridges of the nodes below
 * it, mode "below": the end of its stdin (that agent's death) starts no deadline, as the node
 * below lives by its own link; the known_hosts it checks is the agent's copy of the launcher's,
 * named in messages as the launcher's file, and a key accepted under accept-new is also written
 * on stderr as "ddprun-known-host LINE" for the launcher's file.
 */
#include "cli/provision/ssh_session.h"
#include "cli/provision/ssh_session.h"
#include "cli/sys/sys.h"
#include "cli/spec/job.h"
#include "common/util.h"

#include <errno.h>
#include <libssh/callbacks.h>
#include <libssh/libssh.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/banned.h"

#define BRIDGE_SLACK_MS 5000 /* beyond the stop grace, as the launcher's own deadline */
#define KILL_WAIT_MS 2000    /* for the remote session's end once it was killed */

static volatile sig_atomic_t g_term;

static void on_term(int sig)
{
    (void)sig;
    g_term = 1;
}

/*
 * The remote session goes, with its process group (the agent and its workers): an SSH
 * "signal KILL" request, which sshd (OpenSSH 7.9 and later) honours with killpg for sessions
 * under privilege separation, and, as sshd refuses it for root logins, `kill -KILL -- -PGID`
 * on a second channel of the same connection (the session's pid, its process group since
 * sshd puts it in a session of its own, came first on the channel).
 */
static int kill_remote(struct ddp__ssh *b, long pgid, const char *why)
{
    if (!b->quiet)
        fprintf(stderr, "ddprun: node '%s': %s; killing what runs there\n", b->host, why);
    ssh_channel_request_send_signal(b->ch, "KILL");
    if (pgid > 1) {
        char cmd[96], out[64];
        int st;
        snprintf(cmd, sizeof(cmd), "kill -KILL -- -%ld 2>/dev/null", pgid);
        ddp__ssh_run(b, cmd, out, sizeof(out), &st);
    }
    /* The session's output ends once every process holding it is gone: the agent, its ranks,
     * and the node's guard (cli/agent/guard.h), which holds its stderr and leaves as soon as
     * the agent is gone. Waiting for that end (KILL_WAIT_MS at most: over a cut link it never
     * comes, and the node's guard acts alone) means that once this bridge has exited, and
     * ddprun after it, nothing of the job runs there. Messages still go to the launcher. */
    char buf[4096];
    int64_t end = ddp_now_ms() + KILL_WAIT_MS;
    while (!ssh_channel_is_eof(b->ch) && ddp_now_ms() < end) {
        int n = ssh_channel_read_timeout(b->ch, buf, sizeof(buf), 1, 50);
        if (n > 0 && ddp_write_all(2, buf, (size_t)n) < 0)
            break;
        while (n >= 0 && (n = ssh_channel_read_nonblocking(b->ch, buf, sizeof(buf), 0)) > 0) {
        }
        if (n < 0)
            break;
    }
    return 1;
}

/*
 * SSH agent forwarding (ssh.forward_agent: true), as OpenSSH's ForwardAgent: sshd opens an
 * "auth-agent" channel for each client of the SSH_AUTH_SOCK it made on the node, and each is
 * relayed to a new connection to this machine's agent (SSH_AUTH_SOCK here). The keys stay in the
 * agent; a process on the node with the socket can use them while the session lasts.
 */
#define FWD_MAX 16
static struct {
    ssh_channel ch;
    int fd;
} g_fwd[FWD_MAX];
static int g_nfwd;

/* The signal sshd said ended the remote command (the agent, exec'd by it), or 0. */
static int g_exit_signal;

static void on_exit_signal(ssh_session s, ssh_channel ch, const char *sig, int core,
                           const char *errmsg, const char *lang, void *userdata)
{
    (void)s, (void)ch, (void)core, (void)errmsg, (void)lang, (void)userdata;
    static const struct {
        const char *name;
        int sig;
    } names[] = {{"KILL", SIGKILL}, {"TERM", SIGTERM}, {"SEGV", SIGSEGV}, {"ABRT", SIGABRT},
                 {"INT", SIGINT},   {"HUP", SIGHUP},   {"BUS", SIGBUS},   {"ILL", SIGILL},
                 {"FPE", SIGFPE},   {"QUIT", SIGQUIT}, {"PIPE", SIGPIPE}, {"USR1", SIGUSR1},
                 {"USR2", SIGUSR2}, {"ALRM", SIGALRM}};
    g_exit_signal = SIGKILL; /* a name not known here: killed all the same */
    for (size_t k = 0; sig && k < sizeof(names) / sizeof(names[0]); k++)
        if (strcmp(sig, names[k].name) == 0)
            g_exit_signal = names[k].sig;
}

static ssh_channel on_agent_open(ssh_session s, void *userdata)
{
    (void)userdata;
    const char *path = getenv("SSH_AUTH_SOCK");
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (g_nfwd >= FWD_MAX || !path || strlen(path) >= sizeof(a.sun_path))
        return NULL;
    memcpy(a.sun_path, path, strlen(path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    ssh_channel ch = ssh_channel_new(s);
    if (!ch) {
        close(fd);
        return NULL;
    }
    g_fwd[g_nfwd].ch = ch;
    g_fwd[g_nfwd++].fd = fd;
    return ch;
}

static void fwd_close(int k)
{
    close(g_fwd[k].fd);
    ssh_channel_send_eof(g_fwd[k].ch);
    ssh_channel_close(g_fwd[k].ch);
    ssh_channel_free(g_fwd[k].ch);
    g_fwd[k] = g_fwd[--g_nfwd];
}

/* Relays what waits between the forwarded channels and the agent's connections (readable: the
 * agent's side polled readable). */
static void fwd_pump(const struct pollfd *p)
{
    char buf[16384];
    for (int k = g_nfwd; k-- > 0;) {
        int n;
        bool end = false;
        while ((n = ssh_channel_read_nonblocking(g_fwd[k].ch, buf, sizeof(buf), 0)) > 0)
            end |= ddp_write_all(g_fwd[k].fd, buf, (size_t)n) < 0;
        end |= n < 0 || ssh_channel_is_eof(g_fwd[k].ch) || ssh_channel_is_closed(g_fwd[k].ch);
        if (p && !end && p[k].revents) {
            /* (not blocking: a slot refilled during this pass may hold another connection) */
            ssize_t r = recv(g_fwd[k].fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                continue;
            end = r <= 0 || ssh_channel_write(g_fwd[k].ch, buf, (uint32_t)r) != r;
        }
        if (end)
            fwd_close(k);
    }
}

/* The first line on the channel is "ddprun-pid N" (see ddp__cmd_ssh_bridge). */
#define PID_LINE "ddprun-pid "

/* Records why (printed at once unless quiet); returns DDP_EXIT_LAUNCH. */
static int fail(struct ddp__ssh *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct ddp__ssh *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, sizeof(b->err), fmt, ap);
    va_end(ap);
    if (!b->quiet)
        fprintf(stderr, "ddprun: error: node '%s': %s\n", b->host, b->err);
    return DDP_EXIT_LAUNCH;
}

static const char *kh_file(const struct ddp__ssh *b, char *buf, size_t n)
{
    if (b->known_hosts && *b->known_hosts)
        return b->known_hosts;
    const char *home = getenv("HOME");
    snprintf(buf, n, "%s/.ssh/known_hosts", home ? home : "~");
    return buf;
}

/* A key accepted under accept-new by a bridge below (ssh.fanout): recorded in the copy it
 * checks against, and said as a known_hosts line for the launcher's file. */
static int record_below(struct ddp__ssh *b, const char *kh)
{
    char *entry = NULL;
    if (ssh_session_update_known_hosts(b->s) != SSH_OK ||
        ssh_session_export_known_hosts_entry(b->s, &entry) != SSH_OK || !entry)
        return fail(b, "cannot add the host key of %s to %s: %s", b->host, kh, ssh_get_error(b->s));
    entry[strcspn(entry, "\r\n")] = '\0';
    fprintf(stderr, "ddprun-known-host %s\n", entry);
    ssh_string_free_char(entry);
    return 0;
}

static int verify_host(struct ddp__ssh *b)
{
    b->key_note = "";
    char khb[4096];
    /* messages name the launcher's file, of which a bridge below checks a copy */
    const char *kh = b->kh_name && *b->kh_name ? b->kh_name : kh_file(b, khb, sizeof(khb));
    enum ssh_known_hosts_e st = ssh_session_is_known_server(b->s);
    switch (st) {
    case SSH_KNOWN_HOSTS_OK:
        return 0;
    case SSH_KNOWN_HOSTS_CHANGED:
        return fail(b,
                    "the host key of %s port %d has CHANGED from the one recorded in %s; refusing "
                    "to connect (someone may be intercepting the connection; if the host was "
                    "reinstalled, remove the old key with: ssh-keygen -f '%s' -R '[%s]:%d')",
                    b->host, b->port, kh, kh, b->host, b->port);
    case SSH_KNOWN_HOSTS_OTHER:
        return fail(b,
                    "%s port %d offers a host key of a different type than the one recorded in "
                    "%s; refusing to connect",
                    b->host, b->port, kh);
    case SSH_KNOWN_HOSTS_NOT_FOUND:
    case SSH_KNOWN_HOSTS_UNKNOWN:
        if (strcmp(b->strict, "accept-new") == 0) {
            if (b->dry_run) {
                b->key_note = "new (accept-new will record it)";
                return 0;
            }
            if (b->below)
                return record_below(b, kh);
            if (ssh_session_update_known_hosts(b->s) != SSH_OK)
                return fail(b, "cannot add the host key of %s to %s: %s", b->host, kh,
                            ssh_get_error(b->s));
            fprintf(stderr, "ddprun: node '%s': host key of %s port %d added to %s\n", b->host,
                    b->host, b->port, kh);
            return 0;
        }
        if (strcmp(b->strict, "no") == 0) {
            b->key_note = "not verified (strict_host_key_checking: no)";
            if (!b->quiet)
                fprintf(stderr,
                        "ddprun: warning: node '%s': host key of %s port %d not verified "
                        "(strict_host_key_checking: no)\n",
                        b->host, b->host, b->port);
            return 0;
        }
        return fail(b,
                    "the host key of %s port %d is not in %s (strict_host_key_checking: yes); add "
                    "it (ssh-keyscan -p %d %s >> %s, after checking it) or set "
                    "ssh.strict_host_key_checking: accept-new",
                    b->host, b->port, kh, b->port, b->host, kh);
    case SSH_KNOWN_HOSTS_ERROR:
    default:
        return fail(b, "cannot check the host key against %s: %s", kh, ssh_get_error(b->s));
    }
}

static int authenticate(struct ddp__ssh *b)
{
    int r;
    if (b->identity && *b->identity) {
        ssh_key key = NULL;
        char path[4096];
        const char *home = getenv("HOME");
        if (strncmp(b->identity, "~/", 2) == 0 && home)
            snprintf(path, sizeof(path), "%s/%s", home, b->identity + 2);
        else
            snprintf(path, sizeof(path), "%s", b->identity);
        if (ssh_pki_import_privkey_file(path, NULL, NULL, NULL, &key) != SSH_OK)
            return fail(b,
                        "cannot read the identity file %s (missing, unreadable, or protected "
                        "by a passphrase: load it into ssh-agent and leave ssh.identity out)",
                        b->identity);
        r = ssh_userauth_publickey(b->s, NULL, key);
        ssh_key_free(key);
        if (r != SSH_AUTH_SUCCESS)
            return fail(b, "the server refused the key %s for user '%s'", b->identity,
                        b->user && *b->user ? b->user : "(current user)");
        return 0;
    }
    r = ssh_userauth_publickey_auto(b->s, NULL, NULL);
    if (r != SSH_AUTH_SUCCESS)
        return fail(b,
                    "authentication as '%s' failed: the server accepted none of the SSH agent's "
                    "keys or the default keys in ~/.ssh (set ssh.identity, or ssh.user)",
                    b->user && *b->user ? b->user : "(current user)");
    return 0;
}

static int write_fd(int fd, const char *p, size_t n)
{
    return ddp_write_all(fd, p, n);
}

/* Copies stdin to the channel and the channel's stdout/stderr back until the remote agent
 * exits; returns its exit status. */
static int pump(struct ddp__ssh *b, int64_t grace_ms)
{
    char buf[65536], first[64];
    size_t nfirst = 0;
    bool in_open = true, got_output = false, first_done = false;
    long pgid = 0;
    int64_t deadline = 0; /* once stdin closed: when the remote agent must be done */
    for (bool last = false;;) {
        if (g_term)
            return kill_remote(b, pgid, "ddprun is ending the node");
        if (deadline && ddp_now_ms() > deadline && b->detach)
            return 0; /* its agent waits for a new launcher (cli/agent/link.h) */
        if (deadline && ddp_now_ms() > deadline)
            return kill_remote(b, pgid, "the node agent did not stop within stop_grace");
        /* Drain what libssh has (it may hold data the socket no longer shows). Reading one
         * stream can pull the other's data, the EOF and the close into libssh's buffers, so
         * once the channel ends everything is drained once more before leaving. */
        for (int stream = 0; stream < 2; stream++) {
            int n;
            while ((n = ssh_channel_read_nonblocking(b->ch, buf, sizeof(buf), stream)) > 0) {
                if (stream == 0) {
                    const char *p = buf;
                    size_t len = (size_t)n;
                    if (!first_done) {
                        /* Take the pid line off the front; what follows is the agent's. */
                        while (len && nfirst < sizeof(first) - 1 && *p != '\n') {
                            first[nfirst++] = *p++;
                            len--;
                        }
                        if (len && *p == '\n') {
                            p++;
                            len--;
                        } else if (nfirst < sizeof(first) - 1) {
                            continue; /* the line is not whole yet */
                        }
                        first[nfirst] = '\0';
                        first_done = true;
                        if (strncmp(first, PID_LINE, strlen(PID_LINE)) == 0)
                            pgid = atol(first + strlen(PID_LINE));
                        else if (write_fd(1, first, nfirst) < 0) /* not ours: pass it on */
                            return 1;
                    }
                    got_output |= len > 0;
                    if (len && write_fd(1, p, len) < 0)
                        return 1; /* the launcher is gone */
                } else {
                    write_fd(2, buf, (size_t)n);
                }
            }
            if (n == SSH_ERROR) {
                fail(b, "lost the SSH connection: %s", ssh_get_error(b->s));
                return 1;
            }
        }
        if (ssh_channel_is_eof(b->ch) || ssh_channel_is_closed(b->ch)) {
            if (!last) {
                last = true;
                continue;
            }
            int st = (int)ssh_channel_get_exit_status(b->ch);
            if (st == 127 && !got_output) {
                return fail(b,
                            "'%s' was not found there (install ddprun on the node at the same "
                            "path, or set ssh.remote_ddprun)",
                            b->remote);
            }
            if (st == 126 && !got_output)
                return fail(b, "'%s' is not executable there", b->remote);
            if (st < 0 && g_exit_signal)
                return DDP__SSH_EXIT_SIGNAL + g_exit_signal; /* cli/provision/ssh.c */
            return st < 0 ? 1 : st;
        }
        struct pollfd p[2 + FWD_MAX] = {{.fd = ssh_get_fd(b->s), .events = POLLIN},
                                        {.fd = in_open ? 0 : -1, .events = POLLIN}};
        int nfwd = g_nfwd;
        for (int k = 0; k < nfwd; k++)
            p[2 + k] = (struct pollfd){.fd = g_fwd[k].fd, .events = POLLIN};
        if (poll(p, 2 + (nfds_t)nfwd, 200) < 0 && errno != EINTR)
            return 1;
        if (nfwd)
            fwd_pump(p + 2);
        else if (g_nfwd)
            fwd_pump(NULL); /* opened while reading: data may wait already */
        if (in_open && p[1].revents) {
            ssize_t n = read(0, buf, sizeof(buf));
            if (n > 0) {
                if (ssh_channel_write(b->ch, buf, (uint32_t)n) != n) {
                    fail(b, "lost the SSH connection: %s", ssh_get_error(b->s));
                    return 1;
                }
            } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                /* The launcher closed our stdin: the agent's stdin closes, it stops its ranks,
                 * and we keep relaying until it has reported and exited. Below another agent,
                 * that agent's end says nothing of the node's: its link does, and this relays
                 * until it ends. */
                ssh_channel_send_eof(b->ch);
                in_open = false;
                if (!b->below)
                    deadline = ddp_now_ms() + grace_ms + BRIDGE_SLACK_MS;
            }
        }
    }
}

int ddp__ssh_open(struct ddp__ssh *b)
{
    long timeout = 10;
    int rc;
    if (!(b->s = ssh_new()))
        return fail(b, "out of memory");
    ssh_options_set(b->s, SSH_OPTIONS_HOST, b->host);
    ssh_options_set(b->s, SSH_OPTIONS_PORT, &b->port);
    ssh_options_set(b->s, SSH_OPTIONS_TIMEOUT, &timeout);
    if (b->user && *b->user)
        ssh_options_set(b->s, SSH_OPTIONS_USER, b->user);
    if (b->known_hosts && *b->known_hosts) {
        ssh_options_set(b->s, SSH_OPTIONS_KNOWNHOSTS, b->known_hosts);
        ssh_options_set(b->s, SSH_OPTIONS_GLOBAL_KNOWNHOSTS, "/dev/null");
    }
    b->stage = DDP__SSH_CONNECT;
    if (ssh_connect(b->s) != SSH_OK)
        return fail(b, "cannot connect to %s port %d: %s", b->host, b->port, ssh_get_error(b->s));
    b->stage = DDP__SSH_HOSTKEY;
    if ((rc = verify_host(b)) != 0)
        return rc;
    b->stage = DDP__SSH_AUTH;
    if ((rc = authenticate(b)) != 0)
        return rc;
    b->stage = DDP__SSH_READY;
    return 0;
}

void ddp__ssh_close(struct ddp__ssh *b)
{
    if (b->ch) {
        ssh_channel_close(b->ch);
        ssh_channel_free(b->ch);
        b->ch = NULL;
    }
    if (b->s) {
        ssh_disconnect(b->s);
        ssh_free(b->s);
        b->s = NULL;
    }
}

int ddp__ssh_run(struct ddp__ssh *b, const char *cmd, char *out, size_t outlen, int *status)
{
    return ddp__ssh_run_input(b, cmd, NULL, out, outlen, status);
}

int ddp__ssh_run_input(struct ddp__ssh *b, const char *cmd, const char *in, char *out,
                       size_t outlen, int *status)
{
    ssh_channel ch = ssh_channel_new(b->s);
    size_t got = 0;
    if (!ch || ssh_channel_open_session(ch) != SSH_OK ||
        ssh_channel_request_exec(ch, cmd) != SSH_OK ||
        (in && (ssh_channel_write(ch, in, (uint32_t)strlen(in)) != (int)strlen(in) ||
                ssh_channel_send_eof(ch) != SSH_OK))) {
        if (ch)
            ssh_channel_free(ch);
        fail(b, "cannot run a command over SSH: %s", ssh_get_error(b->s));
        return -1;
    }
    char buf[4096];
    int n;
    while ((n = ssh_channel_read(ch, buf, sizeof(buf), 0)) > 0) {
        size_t k = (size_t)n < outlen - 1 - got ? (size_t)n : outlen - 1 - got;
        memcpy(out + got, buf, k);
        got += k;
    }
    while (ssh_channel_read(ch, buf, sizeof(buf), 1) > 0) {
    }
    out[got] = '\0';
    ssh_channel_send_eof(ch);
    *status = (int)ssh_channel_get_exit_status(ch);
    ssh_channel_close(ch);
    ssh_channel_free(ch);
    return n < 0 ? -1 : 0;
}

/* argv: host port user identity known_hosts strict remote_ddprun grace_ms agent_args mode
 * [known_hosts_name] ("" = unset; mode's words, joined by '+': "detach", "below", "agent") */
int ddp__cmd_ssh_bridge(int argc, char **argv)
{
    if (argc != 12 && argc != 13) {
        fprintf(stderr, "ddprun: __ssh-bridge is internal to ddprun\n");
        return DDP_EXIT_USAGE;
    }
    struct ddp__ssh b = {.host = argv[2],
                         .port = atoi(argv[3]),
                         .user = argv[4],
                         .identity = argv[5],
                         .known_hosts = argv[6],
                         .strict = argv[7],
                         .remote = argv[8],
                         .detach = strstr(argv[11], "detach") != NULL,
                         .below = strstr(argv[11], "below") != NULL,
                         .forward_agent = strstr(argv[11], "agent") != NULL,
                         .kh_name = argc > 12 ? argv[12] : NULL};
    int rc;
    char cmd[8192];
    struct sigaction sa = {.sa_handler = on_term}; /* no SA_RESTART: poll returns */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGHUP, SIG_IGN);
    int64_t grace_ms = atoll(argv[9]);
    if ((rc = ddp__ssh_open(&b)) != 0)
        goto out;
    rc = DDP_EXIT_LAUNCH;
    /* The path is single-quoted for the remote shell; a quote inside is refused. */
    if (strchr(b.remote, '\'')) {
        rc = fail(&b, "ssh.remote_ddprun must not contain a single quote");
        goto out;
    }
    /* The session's pid first (for kill_remote), then the agent in its place. */
    snprintf(cmd, sizeof(cmd), "echo " PID_LINE "$$; exec '%s' %s", b.remote, argv[10]);
    struct ssh_callbacks_struct cbs = {.channel_open_request_auth_agent_function = on_agent_open};
    ssh_callbacks_init(&cbs);
    if (b.forward_agent && !getenv("SSH_AUTH_SOCK"))
        fprintf(stderr,
                "ddprun: warning: node '%s': ssh.forward_agent is true, and no SSH agent runs here "
                "(SSH_AUTH_SOCK is unset): none is forwarded\n",
                b.host);
    else if (b.forward_agent)
        ssh_set_callbacks(b.s, &cbs);
    bool open = (b.ch = ssh_channel_new(b.s)) && ssh_channel_open_session(b.ch) == SSH_OK;
    if (open && b.forward_agent && getenv("SSH_AUTH_SOCK") &&
        ssh_channel_request_auth_agent(b.ch) != SSH_OK)
        fprintf(stderr,
                "ddprun: warning: node '%s': its sshd refused to forward the SSH agent "
                "(AllowAgentForwarding)\n",
                b.host);
    struct ssh_channel_callbacks_struct ccb = {.channel_exit_signal_function = on_exit_signal};
    ssh_callbacks_init(&ccb);
    if (open)
        ssh_set_channel_callbacks(b.ch, &ccb);
    if (!open || ssh_channel_request_exec(b.ch, cmd) != SSH_OK) {
        rc = fail(&b, "cannot start a command over SSH: %s", ssh_get_error(b.s));
        goto out;
    }
    rc = pump(&b, grace_ms);
out:
    while (g_nfwd)
        fwd_close(g_nfwd - 1);
    ddp__ssh_close(&b);
    return rc;
}

void ddp__ssh_for_node(struct ddp__ssh *b, const struct ddp_job *j, size_t i, const char *self)
{
    *b = (struct ddp__ssh){.host = j->nodes[i].host,
                           .port = j->ssh_port,
                           .user = j->ssh_user,
                           .identity = j->ssh_identity,
                           .known_hosts = j->ssh_known_hosts,
                           .strict = j->ssh_strict,
                           .remote = j->ssh_remote_ddprun ? j->ssh_remote_ddprun : self,
                           .quiet = true,
                           .dry_run = true};
}
