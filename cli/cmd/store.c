/* `ddprun store`: a standalone rendezvous store, stopped by SIGINT or SIGTERM. */
#include "cli/cmd/cmd.h"
#include "cli/spec/args.h"
#include "cli/sys/sys.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static struct ddp_store_server *g_srv;

static void on_signal(int sig)
{
    (void)sig;
    if (g_srv)
        ddp_store_server_stop(g_srv); /* async-signal-safe: one eventfd write */
}

/* HOST:PORT of the listen value, with the bound port (IPv6 in brackets). */
static void print_addr(const char *listen, int port)
{
    char host[256];
    int ignored;
    if (ddp_parse_hostport(listen, host, sizeof(host), &ignored) < 0)
        return;
    printf(strchr(host, ':') ? "[%s]:%d\n" : "%s:%d\n", host, port);
}

/* --torch-listen and --torch-allow: the TCPStore port, serving only the allowed addresses (the
 * protocol has no authentication). An exit status. */
static int torch_port(const char *const *vals, int *tport)
{
    char host[256], list[4096];
    int port;
    if (ddp_parse_hostport(vals[DDP_OPT_TORCH_LISTEN], host, sizeof(host), &port) < 0) {
        ddp__cli_error("store: --torch-listen '%s' is not HOST:PORT (port 0 picks a free one)",
                       vals[DDP_OPT_TORCH_LISTEN]);
        return DDP_EXIT_USAGE;
    }
    const char *allow_s = vals[DDP_OPT_TORCH_ALLOW] ? vals[DDP_OPT_TORCH_ALLOW] : "127.0.0.1,::1";
    if (strlen(allow_s) >= sizeof(list)) {
        ddp__cli_error("store: --torch-allow is too long");
        return DDP_EXIT_USAGE;
    }
    snprintf(list, sizeof(list), "%s", allow_s);
    const char *allow[256];
    size_t n = 0;
    char *save = NULL;
    for (char *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        unsigned char bin[16];
        if ((inet_pton(AF_INET, a, bin) != 1 && inet_pton(AF_INET6, a, bin) != 1) ||
            n == sizeof(allow) / sizeof(allow[0])) {
            ddp__cli_error("store: --torch-allow '%s' is not a numeric IPv4 or IPv6 address "
                           "(at most 256 of them)",
                           a);
            return DDP_EXIT_USAGE;
        }
        allow[n++] = a;
    }
    if (n == 0) {
        ddp__cli_error("store: --torch-allow names no address");
        return DDP_EXIT_USAGE;
    }
    int r = ddp_store_server_torch_listen(g_srv, host, port, allow, n, tport);
    if (r < 0) {
        ddp__cli_error("store: cannot serve TCPStore on '%s': %s", vals[DDP_OPT_TORCH_LISTEN],
                       ddp_strerror(r));
        return DDP_EXIT_LAUNCH;
    }
    return DDP_EXIT_OK;
}

int ddp__cmd_store(const struct ddp_cli_opts *cli)
{
    const char *const *vals = cli->vals;
    char host[256];
    int port, r;
    uint8_t *tok = NULL;
    size_t toklen = 0;

    if (!vals[DDP_OPT_LISTEN]) {
        ddp__cli_error("store: --listen HOST:PORT is required");
        return DDP_EXIT_USAGE;
    }
    if (ddp_parse_hostport(vals[DDP_OPT_LISTEN], host, sizeof(host), &port) < 0) {
        ddp__cli_error("store: --listen '%s' is not HOST:PORT (port 0 picks a free one)",
                       vals[DDP_OPT_LISTEN]);
        return DDP_EXIT_USAGE;
    }
    if (!vals[DDP_OPT_TOKEN_FILE]) {
        ddp__cli_error("store: --token-file FILE is required (the token never goes on a "
                       "command line)");
        return DDP_EXIT_USAGE;
    }
    long max_conns = 0;
    if (vals[DDP_OPT_MAX_CONNS]) {
        char *end;
        max_conns = strtol(vals[DDP_OPT_MAX_CONNS], &end, 10);
        if (*end || max_conns <= 0 || max_conns > 1000000) {
            ddp__cli_error("store: --max-conns '%s' is not a number from 1 to 1000000",
                           vals[DDP_OPT_MAX_CONNS]);
            return DDP_EXIT_USAGE;
        }
    }
    if (ddp_store_token_read_file(vals[DDP_OPT_TOKEN_FILE], &tok, &toklen) < 0) {
        ddp__cli_error("store: cannot use token file '%s' (see the message above)",
                       vals[DDP_OPT_TOKEN_FILE]);
        return DDP_EXIT_USAGE;
    }
    struct ddp_store_server_opts o = {.host = host,
                                      .port = port,
                                      .token = tok,
                                      .token_len = toklen,
                                      .max_conns = (unsigned)max_conns};
    r = ddp_store_server_new(&o, &g_srv);
    ddp_store_token_free(tok, toklen);
    if (r < 0) {
        ddp__cli_error("store: cannot start on '%s': %s", vals[DDP_OPT_LISTEN], ddp_strerror(r));
        return DDP_EXIT_LAUNCH;
    }
    int tport = 0;
    if (vals[DDP_OPT_TORCH_ALLOW] && !vals[DDP_OPT_TORCH_LISTEN]) {
        ddp__cli_error("store: --torch-allow needs --torch-listen HOST:PORT");
        ddp_store_server_free(g_srv);
        g_srv = NULL;
        return DDP_EXIT_USAGE;
    }
    if (vals[DDP_OPT_TORCH_LISTEN] && (r = torch_port(vals, &tport)) != DDP_EXIT_OK) {
        ddp_store_server_free(g_srv);
        g_srv = NULL;
        return r;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* The first line of stdout is the address, for scripts that asked for port 0. */
    if (strchr(host, ':'))
        printf("[%s]:%d\n", host, ddp_store_server_port(g_srv));
    else
        printf("%s:%d\n", host, ddp_store_server_port(g_srv));
    if (tport)
        print_addr(vals[DDP_OPT_TORCH_LISTEN], tport);
    fflush(stdout);
    DDP_INFO(STORE, "serving on '%s' port %d", host, ddp_store_server_port(g_srv));

    r = ddp_store_server_run(g_srv);
    struct ddp_store_server_stats st;
    ddp_store_server_get_stats(g_srv, &st);
    DDP_INFO(STORE,
             "stopping: %" PRIu64 " connections accepted, %" PRIu64 " refused (token), %" PRIu64
             " dropped, %" PRIu64 " leases expired",
             st.conns_accepted, st.conns_refused_auth, st.conns_dropped, st.leases_expired);
    ddp_store_server_free(g_srv);
    g_srv = NULL;
    return r < 0 ? DDP_EXIT_JOB_FAILED : DDP_EXIT_OK;
}
