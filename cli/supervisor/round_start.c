/*
 * A round's start (cli/supervisor/supervisor.h): once the rendezvous closes, the members' ranks are
 * numbered contiguously in node order, a pipeline's stages planned for them, MASTER_ADDR
 * chosen, the views told, and each member sent START. Part of the supervisor; called by its
 * policy (cli/supervisor/rounds.c), it calls only downward (nodes, views, records, the pipeline
 * layout).
 */
#include "cli/proto/agent_proto.h"
#include "cli/spec/job.h"
#include "cli/sys/sys.h"
#include "cli/spec/pipe_layout.h"
#include "cli/supervisor/recovery.h"
#include "cli/supervisor/ckpt.h"
#include "cli/supervisor/supervisor.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static const char *host_of(int node)
{
    return ddp__supervisor.job->nodes[node].host;
}

/* Every address of this machine but loopback and IPv6 link-local ones, as "ip:port,..."
 * (IPv6 in brackets); false when it has none. */
static bool all_addrs(int port, char *out, size_t n)
{
    struct ifaddrs *ifs = NULL;
    size_t l = 0;
    out[0] = '\0';
    if (getifaddrs(&ifs) != 0)
        return false;
    for (struct ifaddrs *f = ifs; f; f = f->ifa_next) {
        char ip[INET6_ADDRSTRLEN];
        if (!f->ifa_addr || !(f->ifa_flags & IFF_UP) || (f->ifa_flags & IFF_LOOPBACK))
            continue;
        int fam = f->ifa_addr->sa_family;
        const void *a =
            fam == AF_INET    ? (const void *)&((struct sockaddr_in *)f->ifa_addr)->sin_addr
            : fam == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)f->ifa_addr)->sin6_addr
                              : NULL;
        if (!a || (fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)a)) ||
            !inet_ntop(fam, a, ip, sizeof(ip)))
            continue;
        int w = snprintf(out + l, n - l, fam == AF_INET6 ? "%s[%s]:%d" : "%s%s:%d", l ? "," : "",
                         ip, port);
        if (w < 0 || (size_t)w >= n - l)
            break;
        l += (size_t)w;
    }
    freeifaddrs(ifs);
    return l > 0;
}

/* addr (host:port) as node i reaches it: where the launcher listens on every address (wildcard) and
 * some node is another machine, the address the route toward the node leaves from, else all
 * of them for the node to try. */
static void node_addr(int i, const char *addr, bool wildcard, int port, char *out, size_t n)
{
    snprintf(out, n, "%s", addr);
    if (ddp__supervisor.first_remote && wildcard) {
        char ip[INET6_ADDRSTRLEN];
        const char *toward = ddp__job_host_is_local(host_of(i)) ? ddp__supervisor.first_remote
                                                                : ddp__sup_node_addr(i);
        if (ddp__route_source(toward, ip, sizeof(ip)) == 0)
            snprintf(out, n, strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip, port);
        else if (!all_addrs(port, out, n)) /* no route known from here: the node tries each */
            snprintf(out, n, "%s", addr);
    }
}

/* The store's address ("etcd" for etcd's: then no address of ours is of use). */
void ddp__sup_node_store_addr(int i, char *out, size_t n)
{
    node_addr(i, ddp__supervisor.store_addr, ddp__supervisor.wildcard, ddp__supervisor.store_port,
              out, n);
}

void ddp__sup_node_agent_addr(int i, char *out, size_t n)
{
    char addr[300];
    const char *listen = ddp__job_store_listen(ddp__supervisor.job);
    bool wildcard = strcmp(listen, "0.0.0.0") == 0 || strcmp(listen, "::") == 0;
    const char *h = wildcard ? "127.0.0.1" : listen;
    snprintf(addr, sizeof(addr), strchr(h, ':') ? "[%s]:%d" : "%s:%d", h,
             ddp__supervisor.agent_port);
    node_addr(i, addr, wildcard, ddp__supervisor.agent_port, out, n);
}

/* Node i's START (a member's), or its PREPARE (a spare's START as it would be were it taken
 * in now, the round's values the running round's: cli/proto/agent_proto.h). */
static void send_start(int i, uint8_t type, const char *master, int master_port, char **env)
{
    static char torch[] = "torch", *warm_default[] = {torch, NULL}; /* warm.imports' default */
    const struct ddp_job *j = ddp__supervisor.job;
    const struct ddp__sup_node *a = &ddp__supervisor.nd[i];
    bool member = type == DDP__AG_START;
    char node_store[1024], store_host[300], node_master[1024];
    int store_port;
    ddp__sup_node_store_addr(i, node_store, sizeof(node_store));
    /* With the launcher's TCPStore port, MASTER_ADDR is this machine as the node sees it
     * (where the node is offered several addresses, the one its agent reached: it puts
     * it in place of the list). */
    snprintf(node_master, sizeof(node_master), "%s", master);
    if (ddp__supervisor.torch_port && strchr(node_store, ','))
        snprintf(node_master, sizeof(node_master), "%s", node_store);
    else if (ddp__supervisor.torch_port &&
             ddp_parse_hostport(node_store, store_host, sizeof(store_host), &store_port) == 0)
        snprintf(node_master, sizeof(node_master), "%s", store_host);
    struct ddp__agent_start st = {
        .token = ddp__supervisor.token,
        .store_addr = node_store,
        .job_id = ddp__supervisor.job_id,
        .host_label = j->nodes[i].host,
        .master_addr = node_master,
        .master_port = (uint32_t)master_port,
        .node_rank = (uint32_t)(member ? a->member_index : ddp__supervisor.nmembers),
        .nnodes = (uint32_t)(ddp__supervisor.nmembers + !member),
        .world_size = (uint32_t)(ddp__supervisor.world + (member ? 0 : j->nodes[i].slots)),
        .rank_offset = (uint32_t)(member ? a->rank_offset : ddp__supervisor.world),
        .nlocal = (uint32_t)j->nodes[i].slots,
        .restart_count = (uint32_t)ddp__supervisor.round,
        .max_restarts = (uint32_t)j->max_restarts,
        .grace_ms = (uint64_t)j->stop_grace_ms,
        .workdir = j->workdir,
        .backend = j->backend,
        .checkpoint_dir = j->checkpoint_dir ? j->checkpoint_dir : "",
        .shell = j->shell ? j->shell : "",
        .argv = j->argv,
        .env = env,
        /* local ranks inherit this shell's whole environment */
        .shell_env = ddp__job_host_is_local(j->nodes[i].host) ? NULL : ddp__supervisor.shell_env,
        .agent_store = ddp__supervisor.torch_port != 0,
        .bind_to = (uint8_t)j->bind_to,
        .warm = !j->warm_off,
        .warm_listed = j->warm_listed,
        .warm_imports = j->warm_imports ? j->warm_imports : warm_default};
    ddp__nodes_start_round(&ddp__supervisor.nodes, i, type, &st);
}

static bool is_member(int i)
{
    return ddp__supervisor.nd[i].state == DDP__NS_RUNNING;
}

void ddp__sup_prepare_spare(int i)
{
    const struct ddp_job *j = ddp__supervisor.job;
    /* (a pipeline's ranks get a round's own environment: a spare's could not be foreseen) */
    if (ddp__supervisor.ph != DDP__PH_RUNNING || ddp__supervisor.nd[i].state != DDP__NS_READY ||
        j->warm_off || j->max_restarts == 0 || j->pipe.on)
        return;
    send_start(i, DDP__AG_PREPARE, "127.0.0.1", 0, ddp__supervisor.env);
}

int ddp__sup_start_round(char *why, size_t whylen)
{
    const struct ddp_job *j = ddp__supervisor.job;
    ddp__sup_release_ranks();
    int room = 0; /* the round's ranks, as its nodes counted them */
    for (size_t i = 0, nm = 0; i < j->nnodes && nm < (size_t)j->max_nodes; i++)
        if (ddp__supervisor.nd[i].state == DDP__NS_READY)
            room += j->nodes[i].slots, nm++;
    if (ddp__sup_ranks_reserve(room) < 0) {
        snprintf(why, whylen, "out of memory for the round's ranks");
        return -1;
    }
    ddp__supervisor.world = ddp__supervisor.nmembers = 0;
    ddp__supervisor.ranks_up = ddp__supervisor.ranks_done = ddp__supervisor.ranks_ok = 0;
    ddp__supervisor.first_fail = -1;
    char names[2048] = "";
    size_t nl = 0;
    int first = -1;
    for (size_t i = 0; i < j->nnodes && ddp__supervisor.nmembers < j->max_nodes; i++) {
        struct ddp__sup_node *a = &ddp__supervisor.nd[i];
        if (a->state != DDP__NS_READY)
            continue;
        if (first < 0)
            first = (int)i;
        a->state = DDP__NS_RUNNING; /* a member: its START follows */
        a->member_index = ddp__supervisor.nmembers++;
        a->rank_offset = ddp__supervisor.world;
        for (int l = 0; l < j->nodes[i].slots; l++) {
            struct ddp__sup_rank *r = &ddp__supervisor.rk[ddp__supervisor.world];
            r->node = (int)i;
            r->local = l;
            ddp__supervisor.world++;
        }
        int w = snprintf(names + nl, sizeof(names) - nl, "%s%s", nl ? ", " : "", host_of((int)i));
        if (w > 0 && nl + (size_t)w < sizeof(names))
            nl += (size_t)w;
    }
    /* A pipeline's stages for this round's ranks (pipeline.auto plans them anew). */
    char **env = ddp__supervisor.env;
    int nowned = 0, *ms = calloc(j->nnodes + 1, sizeof(int)), nm = 0;
    for (size_t i = 0; ms && i < j->nnodes; i++)
        if (ddp__supervisor.nd[i].state == DDP__NS_RUNNING)
            ms[nm++] = j->nodes[i].slots;
    if (j->pipe.on && !(env = ddp__pipe_round_env(&j->pipe, ddp__supervisor.env, ms, nm, &nowned,
                                                  why + 10, whylen - 10))) {
        free(ms);
        memcpy(why, "pipeline: ", 10);
        for (size_t i = 0; i < j->nnodes; i++) /* no member started: each agent just leaves */
            if (ddp__supervisor.nd[i].state == DDP__NS_RUNNING)
                ddp__supervisor.nd[i].state = DDP__NS_READY;
        ddp__supervisor.world = ddp__supervisor.nmembers = 0;
        return -1;
    }
    free(ms);
    /* With remote nodes, every node (the local ones too) must use addresses the others can
     * reach: MASTER_ADDR is the first member's, or this machine's routable address. */
    char master[256] = "127.0.0.1";
    if (ddp__supervisor.first_remote) {
        if (!ddp__job_host_is_local(host_of(first)))
            snprintf(master, sizeof(master), "%s", ddp__sup_node_addr(first));
        else if (ddp__route_source(ddp__supervisor.first_remote, master, sizeof(master)) < 0)
            snprintf(master, sizeof(master), "127.0.0.1");
    }
    /* Rank 0's own TCPStore (rendezvous.torch_store: rank0) binds MASTER_PORT on node 0: a port
     * its agent found free there when it started, where node 0 is another machine (the same
     * in every round while it is node 0); else one free here now. */
    int master_port = ddp__supervisor.torch_port;
    if (!master_port && ddp__supervisor.first_remote && !ddp__job_host_is_local(host_of(first)))
        master_port = (int)ddp__nodes_free_port(&ddp__supervisor.nodes, first);
    if (!master_port)
        master_port = ddp__free_port();
    /* TCPStore connections from now on use this round's key space. */
    if (ddp__supervisor.torch_port)
        ddp_store_server_torch_round(ddp__supervisor.srv, ddp__supervisor.round);
    /* The views learn the round's ranks before any of their output (the records open the rank
     * logs). */
    ddp__sup_announce_round();
    ddp__sup_say("ddprun: round %d: %d node%s (%s), %d rank%s%s", ddp__supervisor.round,
                 ddp__supervisor.nmembers, ddp__supervisor.nmembers == 1 ? "" : "s", names,
                 ddp__supervisor.world, ddp__supervisor.world == 1 ? "" : "s",
                 !ddp__supervisor.round ? ""
                 : j->checkpoint_dir    ? "; workers restart from the last checkpoint"
                                        : "; workers restart");
    ddp__sup_event("membership", "nodes", names, "#world_size", (long long)ddp__supervisor.world,
                   "#restart_count", (long long)ddp__supervisor.round, NULL);
    ddp__rcv_mark(DDP__RCV_FORMED);
    /* checkpoint.replicas: each member's folder restored before its ranks start (its agent
     * holds the START until then), each spare's brought up to date */
    if (ddp__ck_restore(is_member, why, whylen) == DDP__CK_FAIL_JOB) {
        for (int k = 0; k < nowned; k++)
            free(env[k]);
        if (env != ddp__supervisor.env)
            free(env);
        for (size_t i = 0; i < j->nnodes; i++) /* no member started: each agent just leaves */
            if (ddp__supervisor.nd[i].state == DDP__NS_RUNNING)
                ddp__supervisor.nd[i].state = DDP__NS_READY;
        ddp__supervisor.world = ddp__supervisor.nmembers = 0;
        return -1;
    }
    ddp__supervisor.ph = DDP__PH_RUNNING;
    ddp__sup_set_phase(ddp__supervisor.round ? "restarting workers" : "starting workers");
    for (size_t i = 0; i < j->nnodes; i++)
        if (ddp__supervisor.nd[i].state == DDP__NS_RUNNING)
            send_start((int)i, DDP__AG_START, master, master_port, env);
    for (int k = 0; k < nowned; k++)
        free(env[k]);
    if (env != ddp__supervisor.env)
        free(env);
    for (size_t i = 0; i < j->nnodes; i++) /* the spares keep warm interpreters ready */
        ddp__sup_prepare_spare((int)i);
    return 0;
}
