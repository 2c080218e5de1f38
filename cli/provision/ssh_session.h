/* SSH sessions to nodes (cli/provision/ssh_bridge.c): shared by the bridge and `ddprun doctor`. */
#ifndef DDP_CLI_SSH_H
#define DDP_CLI_SSH_H

#include <libssh/libssh.h>
#include <stdbool.h>
#include <stddef.h>

/* The bridge's exit status when sshd said the agent was killed by a signal: this plus its
 * number (an agent itself exits 0-3 or 75). */
#define DDP__SSH_EXIT_SIGNAL 128

enum ddp__ssh_stage { DDP__SSH_CONNECT, DDP__SSH_HOSTKEY, DDP__SSH_AUTH, DDP__SSH_READY };

struct ddp__ssh {
    const char *host, *user, *identity, *known_hosts, *strict, *remote; /* "" or NULL: unset */
    int port;
    bool quiet;   /* keep errors in err only */
    bool dry_run; /* accept-new: report a new key without recording it */
    bool detach;  /* the bridge: the agent may outlive the launcher */
    /* the bridge of an agent started by another (ssh.fanout): its stdin's end (that agent's)
     * leaves the node running, and known_hosts is a copy of kh_name, the launcher's */
    bool below;
    const char *kh_name;
    bool forward_agent;        /* ssh.forward_agent: this machine's SSH agent, to the node */
    enum ddp__ssh_stage stage; /* how far ddp__ssh_open got */
    const char *key_note;      /* "" or what was special about the host key */
    char err[1024];
    ssh_session s;
    ssh_channel ch;
};

struct ddp_job;
/* The session to node i of job as `ddprun doctor` opens it: the job's ssh settings, its
 * remote_ddprun or self, quiet, and accept-new without recording the key. */
void ddp__ssh_for_node(struct ddp__ssh *b, const struct ddp_job *job, size_t i, const char *self);

/* Connects, checks the host key, authenticates. 0, or DDP_EXIT_LAUNCH with err set. */
int ddp__ssh_open(struct ddp__ssh *b);
/* Runs cmd on the node; its stdout (truncated to outlen-1) in out, its exit status in *status.
 * 0, or -1 with err set. */
int ddp__ssh_run(struct ddp__ssh *b, const char *cmd, char *out, size_t outlen, int *status);
/* The same, with in (NUL-terminated, a few KiB at most: it is written whole before the output
 * is read) on cmd's standard input, then its end. */
int ddp__ssh_run_input(struct ddp__ssh *b, const char *cmd, const char *in, char *out,
                       size_t outlen, int *status);
void ddp__ssh_close(struct ddp__ssh *b);

/* The hidden `ddprun __ssh-bridge HOST PORT USER IDENTITY KNOWN_HOSTS STRICT REMOTE_DDPRUN
 * GRACE_MS AGENT_ARGS MODE [KNOWN_HOSTS_NAME]` (MODE: "", or "detach", "below", "agent" joined
 * by '+'): a node agent on
 * another host, reached over SSH (cli/provision/ssh_bridge.c). */
int ddp__cmd_ssh_bridge(int argc, char **argv);

#endif
