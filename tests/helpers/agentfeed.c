/*
 * agentfeed: a launcher's end of the agent link, for the bats suite to feed `ddprun agent`
 * frames of its choosing (cli/proto/agent_wire.h).
 *
 *   agentfeed [--addrs LIST] [--boot FILE] [--close] [--wrong-token] FRAMES -- COMMAND...
 *
 * Listens on 127.0.0.1 (a free port), starts COMMAND with a pipe on its stdin and writes BOOT
 * there: the token, this port (or LIST), node 0 and a ticket (or, with --boot, FILE's bytes
 * instead of BOOT). It accepts the agent's connection, runs the launcher's side of the handshake,
 * reads ATTACH and the agent's HELLO, writes the HELLO frame's bytes to stdout, then sends
 * FRAMES' bytes (a file) sealed, as a launcher's frames. With --close it then closes the link;
 * with --wrong-token its side of the handshake proves another token than BOOT's.
 * It waits for COMMAND (10 s at most, then SIGKILL and status 124) and exits with its status.
 */
#include "cli/proto/agent_proto.h"
#include "cli/proto/agent_wire.h"
#include "common/buf.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *TOKEN = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

static int read_exact(int fd, void *p, size_t n, int64_t deadline)
{
    uint8_t *c = p;
    while (n > 0) {
        struct pollfd q = {.fd = fd, .events = POLLIN};
        int64_t left = deadline - ddp_now_ms();
        if (left <= 0 || poll(&q, 1, (int)left) <= 0)
            return -1;
        ssize_t r = read(fd, c, n);
        if (r <= 0)
            return -1;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

static void slurp(const char *path, struct ddp_buf *b)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        ddp_buf_put(b, buf, n);
    fclose(f);
}

int main(int argc, char **argv)
{
    const char *addrs = NULL, *bootf = NULL;
    bool close_after = false;
    const char *mine = TOKEN;
    int k = 1;
    for (; k < argc && strncmp(argv[k], "--", 2) == 0 && argv[k][2]; k++) {
        if (!strcmp(argv[k], "--addrs") && k + 1 < argc)
            addrs = argv[++k];
        else if (!strcmp(argv[k], "--boot") && k + 1 < argc)
            bootf = argv[++k];
        else if (!strcmp(argv[k], "--close"))
            close_after = true;
        else if (!strcmp(argv[k], "--wrong-token"))
            mine = "another job's token";
        else
            break;
    }
    if (k + 2 >= argc || strcmp(argv[k + 1], "--") != 0) {
        fprintf(stderr, "usage: agentfeed [--addrs LIST] [--boot FILE] [--close] [--wrong-token] "
                        "FRAMES -- COMMAND...\n");
        return 2;
    }
    struct ddp_buf frames;
    ddp_buf_init(&frames);
    slurp(argv[k], &frames);
    char **cmd = argv + k + 2;

    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 4) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) != 0) {
        perror("agentfeed: listen");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int in[2];
    if (pipe(in) != 0)
        return 2;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in[0], 0);
        close(in[0]);
        close(in[1]);
        close(l);
        execvp(cmd[0], cmd);
        _exit(127);
    }
    close(in[0]);
    struct ddp_buf b;
    ddp_buf_init(&b);
    if (bootf) {
        slurp(bootf, &b);
    } else {
        struct ddp__aw_boot boot = {.node = 0};
        snprintf(boot.token, sizeof(boot.token), "%s", TOKEN);
        if (addrs)
            snprintf(boot.addrs, sizeof(boot.addrs), "%s", addrs);
        else
            snprintf(boot.addrs, sizeof(boot.addrs), "127.0.0.1:%d", ntohs(a.sin_port));
        snprintf(boot.ticket, sizeof(boot.ticket), "%032d", 0);
        ddp__aw_put_boot(&b, &boot);
    }
    if (write(in[1], b.data, b.len) != (ssize_t)b.len)
        perror("agentfeed: BOOT");
    if (bootf) { /* what it was given is all it gets */
        close(in[1]);
        in[1] = -1;
    }
    int64_t deadline = ddp_now_ms() + 10000;
    int c = -1, st = 0;
    bool reaped = false;
    while (c < 0 && !reaped && ddp_now_ms() < deadline) { /* its connection, or its end */
        struct pollfd q = {.fd = l, .events = POLLIN};
        if (poll(&q, 1, 50) == 1)
            c = accept(l, NULL, NULL);
        else
            reaped = waitpid(pid, &st, WNOHANG) == pid;
    }
    uint8_t c1[DDP__AW_C1_LEN], s1[DDP__AW_S1_LEN], c2[DDP__AW_C2_LEN];
    uint8_t cn[DDP__AW_NONCE], sn[DDP__AW_NONCE];
    struct ddp__seal seal;
    struct ddp_buf raw, plain;
    ddp_buf_init(&raw);
    ddp_buf_init(&plain);
    uint8_t type;
    const uint8_t *body;
    size_t len;
    int got_hello = 0;
    if (c >= 0 && read_exact(c, c1, sizeof(c1), deadline) == 0 &&
        ddp__aw_s1(mine, c1, cn, sn, s1) == 0 && write(c, s1, sizeof(s1)) == sizeof(s1) &&
        read_exact(c, c2, sizeof(c2), deadline) == 0 && ddp__aw_check_c2(TOKEN, cn, sn, c2) == 0 &&
        ddp__seal_init(&seal, TOKEN, cn, sn, false) == 0) {
        /* ATTACH, then the agent's HELLO */
        int frames_seen = 0;
        while (frames_seen < 2) {
            int r;
            while (frames_seen < 2 && (r = ddp__agent_next(&plain, &type, &body, &len)) > 0) {
                if (frames_seen == 1) {
                    fwrite(body - 5, 1, len + 5, stdout);
                    fflush(stdout);
                    got_hello = 1;
                }
                frames_seen++;
            }
            if (frames_seen == 2)
                break;
            ddp_buf_reserve(&raw, 65536);
            struct pollfd p = {.fd = c, .events = POLLIN};
            int64_t left = deadline - ddp_now_ms();
            if (left <= 0 || poll(&p, 1, (int)left) <= 0)
                break;
            ssize_t n = read(c, raw.data + raw.len, raw.cap - raw.len);
            if (n <= 0)
                break;
            raw.len += (size_t)n;
            if (ddp__seal_open(&seal, &raw, &plain) < 0)
                break;
        }
        if (got_hello && frames.len)
            ddp__aw_write(c, &seal, frames.data, frames.len);
        if (close_after)
            close(c);
    }
    for (; !reaped;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (ddp_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            ddp_buf_release(&frames);
            ddp_buf_release(&b);
            ddp_buf_release(&raw);
            ddp_buf_release(&plain);
            return 124;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (in[1] >= 0)
        close(in[1]); /* the agent's stdin stays open to its end, as a launcher's pipe does */
    ddp_buf_release(&frames);
    ddp_buf_release(&b);
    ddp_buf_release(&raw);
    ddp_buf_release(&plain);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
