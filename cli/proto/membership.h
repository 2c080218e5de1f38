/*
 * Membership backends: where nodes hold their leases and the launcher learns of losses and of
 * where training resumed. The round policy (cli/supervisor/rounds.c) and the node agent
 * (cli/agent/agent.c) use only this interface. The store implements it
 * (cli/proto/membership_store.c: a leased key per agent incarnation, a prefix watch), the built-in
 * store or, with rendezvous: {backend: etcd}, the job's folder in etcd through the same store calls
 * (rendezvous/store_etcd.h).
 *
 * Agent side: join takes a lease of heartbeat_timeout and renews it every heartbeat_interval
 * from a thread; should the lease be lost, the backend stay unreachable for the timeout, or
 * the heartbeat find that the timeout passed since the last renewal (the agent was stopped),
 * `fenced` is called on the agent's loop (the launcher has counted the node lost by then, and
 * the agent must stop its workers); the node's progress report rides with the heartbeat.
 * Launcher side: a watch reports, on the launcher's loop, each agent incarnation whose lease
 * ended, each round's resume point as the workers report it (ddp_pg_report_resume), and each
 * node's progress report.
 */
#ifndef DDP_CLI_MEMBERSHIP_H
#define DDP_CLI_MEMBERSHIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ddp_loop;
struct ddp__agent_join;
struct ddp__member_lease;
struct ddp__member_watch;

enum ddp__member_ev_kind {
    DDP__MEV_LEASE_ENDED, /* node, incarnation: its lease expired (through etcd: or was revoked) */
    DDP__MEV_LEASE_LEFT,  /* node, incarnation: its agent revoked its lease, leaving cleanly */
    DDP__MEV_RESUMED,     /* round, step */
    DDP__MEV_PROGRESS,    /* node, incarnation, report (cli/diag/diag.h lines) */
};

struct ddp__member_ev {
    enum ddp__member_ev_kind kind;
    unsigned node, incarnation;
    int round;
    long long step;
    char *report; /* PROGRESS: malloc'd, NUL-terminated; the callback owns it */
};

struct ddp__member_ops {
    const char *name;
    /* Agent: joins as j says (token, store address, node index, incarnation, heartbeat);
     * *lease_id for the launcher's records. Each renewal of the lease writes its time
     * (ddp_now_ms) to *renewed, when not NULL (the node's guard reads it, cli/agent/guard.h).
     * Messages go to stderr. 0 or a DDP_E* code. */
    int (*join)(const struct ddp__agent_join *j, struct ddp_loop *loop,
                void (*fenced)(void *arg, const char *why), void *arg, _Atomic int64_t *renewed,
                uint64_t *lease_id, struct ddp__member_lease **out);
    /* Agent: stops the heartbeat; with revoke, the lease ends now rather than at expiry.
     * NULL is a no-op. */
    void (*leave)(struct ddp__member_lease *l, bool revoke);
    /* Agent: the node's progress report, sent with the next heartbeat (and kept, bound to
     * the lease, until the next one), after a first line "age N": the milliseconds it waited
     * for that heartbeat, which the launcher takes off its arrival time. */
    void (*publish)(struct ddp__member_lease *l, const void *report, size_t len);
    /* Agent: the store's address as the agent reached it: of several the launcher offered
     * ("ip:port,ip:port"), the one that answered; for the ranks' environment. */
    const char *(*store_addr)(const struct ddp__member_lease *l);
    /* Launcher: watches the job's membership (where: the store or etcd, as agents are told to
     * join); each event is given to cb on loop. */
    int (*watch)(const struct ddp__agent_join *where, struct ddp_loop *loop,
                 void (*cb)(void *arg, const struct ddp__member_ev *ev), void *arg,
                 struct ddp__member_watch **out);
    void (*unwatch)(struct ddp__member_watch *w);
};

extern const struct ddp__member_ops ddp__member_store;

#endif
