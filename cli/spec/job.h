/* The job spec: parsed from YAML (libyaml) with file:line:col errors, --set overrides and defaults.
 */
#ifndef DDP_CLI_JOB_H
#define DDP_CLI_JOB_H

#include "cli/sys/cidr.h"
#include "cli/sys/devices.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct ddp_job_node {
    char *host;
    int slots;    /* ranks on this node (0 until counted, for a counted one) */
    bool counted; /* nproc_per_node gpu|cpu|auto: its agent counts its slots (cli/sys/devices.h) */
    int cpus;     /* the CPUs a Slurm allocation gives the job there (its agent's step), or 0 */
};

struct ddp_job_kv {
    char *key, *value;
};

/* pipeline: (cli/spec/stages.c): how the ranks split into a pipeline's stages. One of split,
 * plan_file or profile is set. */
struct ddp_job_pipeline {
    bool on;
    int nsplit, *split;       /* pipeline.split: layers per stage, or NULL */
    int nreplicas, *replicas; /* pipeline.replicas: ranks per stage, or NULL (1 each, or the
                                 plan file's) */
    char *plan_file;          /* pipeline.plan (absolute): graph.txt with stage_id[, replicas] */
    char *profile;            /* pipeline.auto.profile (absolute): planned on every round */
    char *bandwidth;          /* pipeline.auto.bandwidth: "1Gbit" or "100Gbit,1Gbit" */
    char *memory;             /* pipeline.auto.memory, or NULL */
    bool straight;            /* pipeline.auto.straight */
    bool flush;               /* schedule: flush (else 1f1b) */
    int microbatches;         /* flush: minibatches per update */
    int microbatch_size;      /* samples per minibatch; 0: the program's own */
};

#define DDP__EXTERNAL_NAME 256

struct ddp_job {
    char *file; /* path of the job file ("<default>" for the embedded job) */
    char *name;
    char **argv;   /* command as a list: exec'd directly (NULL-terminated) */
    char *shell;   /* command as a string: run by /bin/sh -c */
    char *workdir; /* absolute */
    struct ddp_job_kv *env;
    size_t nenv;
    struct ddp_job_node *nodes;
    size_t nnodes;
    int nproc_per_node;
    char *backend; /* "cpu" | "nccl" */
    int bind_to;   /* enum ddp__cpubind (cli/sys/cpubind.h): each rank's CPUs */
    char *rdzv_listen;
    int rdzv_port;
    int64_t rdzv_timeout_ms;
    int64_t rdzv_last_call_ms; /* once min_nodes joined, how long more may still join */
    bool torch_store_rank0;    /* rendezvous.torch_store: rank0 (else the launcher's port) */
    bool rdzv_etcd;            /* rendezvous.backend: etcd (else the built-in store) */
    char **etcd_endpoints;     /* rendezvous.endpoints (NULL-terminated) */
    size_t netcd;
    char *etcd_prefix; /* rendezvous.prefix: the job's keys are under <it><job id>/ */
    char *etcd_ca, *etcd_cert, *etcd_key; /* rendezvous.tls (absolute), or NULL */
    int64_t takeover_ms; /* rendezvous.takeover_timeout: how long the agents wait for a new
                            launcher (ddprun attach --etcd) once theirs died; 0: they stop */
    int min_nodes, max_nodes, max_restarts;
    int64_t heartbeat_interval_ms, heartbeat_timeout_ms;
    int64_t cooldown_ms; /* a node lost twice within this is left out for this long */
    char *ssh_user, *ssh_identity, *ssh_known_hosts, *ssh_strict;
    char *ssh_remote_ddprun; /* NULL: the same path as this ddprun */
    int ssh_port;
    /* the launcher starts this many SSH nodes itself, and each agent as many below it
     * (ddp__job_ssh_tree) */
    int ssh_fanout;
    bool ssh_forward_agent; /* this machine's SSH agent to the nodes (and on down the tree) */
    bool srun; /* launcher: agents on remote nodes start as srun steps (else over SSH) */
    /* launcher: external: the agents are started by someone else and join (`ddprun agent
     * --join`); nodes holds nnodes slots, each host a buffer of DDP__EXTERNAL_NAME bytes that
     * takes the name of the agent that takes the slot (cli/supervisor/nodes.c) */
    bool external;
    char *token_file; /* rendezvous.token_file (absolute): the job's token, or NULL */
    char *logs_dir;   /* absolute */
    bool tag_output;
    bool log_timestamps;  /* each line of a rank's log starts with its UTC time */
    bool log_jsonl;       /* every rank's lines also in output.jsonl, one object each */
    char *console_ranks;  /* logs.console_ranks: ranks shown on the console, NULL for all */
    char *checkpoint_dir; /* absolute, or NULL */
    int ckpt_replicas;    /* checkpoint.replicas: 0, or the dir is node-local and the agents
                             copy each file to that many other nodes (cli/supervisor/ckpt.h) */
    bool ckpt_restart;    /* checkpoint.on_corrupt: restart (a file with no valid copy left is
                             dropped everywhere) rather than fail */
    bool warm_off;        /* warm: off (a Python command's ranks all start cold) */
    bool warm_listed;     /* warm.imports given: a module that fails to import warns */
    char **warm_imports;  /* warm.imports (NULL-terminated; NULL: the default, torch) */
    char **export_pats;   /* export: patterns added ("NAME", "PREFIX_*") or removed ("-...") */
    size_t nexport;
    char *net_iface; /* network.interface: forced for every node, or NULL (auto) */
    int net_family;  /* network.family: 0 auto, 4 IPv4, 6 IPv6 */
    int64_t stop_grace_ms;
    int64_t hang_after_ms;           /* diagnose.hang_after: the hang report; 0 turns it off */
    bool hang_fail;                  /* diagnose.on_hang: fail (the round fails) rather than wait */
    char *metrics_listen;            /* metrics.listen: HOST:PORT of /metrics, or NULL (off) */
    struct ddp__cidr *metrics_allow; /* metrics.allow: who may read it (none: loopback) */
    int nmetrics_allow;
    struct ddp_job_pipeline pipe;
    int world_size;   /* derived: sum of slots (0 while some node's are counted there) */
    char **overrides; /* the --set (and --nproc) given, as written: "--set a=b" */
    size_t noverrides;
    /* nproc_per_node gpu, cpu or auto where some node is another machine: each node without
     * slots of its own has slots 0 until its agent's HELLO counts them (cli/sys/devices.h) */
    enum ddp_nproc_kind nproc_kind;
};

/* The patterns of the launching shell's variables that remote ranks get by default. */
extern const char *const ddp__job_export_defaults[];
/* Whether the shell variable name goes to remote ranks: it matches a default or added pattern
 * of export and no removed one. */
bool ddp__job_exports(const struct ddp_job *j, const char *name);
/* The "K=V" strings of this process's environment that the rule exports (NULL-terminated,
 * malloc'd; free each and the array), or NULL when out of memory. *bytes: their total size. */
char **ddp__job_shell_env(const struct ddp_job *j, size_t *bytes);

/* Whether rank is in a rank list of logs.console_ranks ("0,2-3"); NULL shows every rank. */
bool ddp__job_rank_listed(const char *list, int rank);

/*
 * Parses a job file and applies overrides: sets[0..nsets) are "a.b=value"; labels[k], when
 * labels and it are not NULL, names set k in messages ("--nproc 3"), else "--set a.b=value".
 * On error prints one message naming the file, line and column (or the override) and what
 * was expected, and returns -1; *out is untouched.
 */
int ddp__job_load(const char *path, const char *const *sets, const char *const *labels,
                  size_t nsets, struct ddp_job **out);

/* The same from YAML text in memory; name is used in messages. */
int ddp__job_load_string(const char *name, const char *yaml, const char *const *sets,
                         const char *const *labels, size_t nsets, struct ddp_job **out);

/* The embedded default job: ddprun-fmnist (installed beside ddprun) on two local ranks for 3
 * epochs, or where it is not installed ranks that meet at the store and pass a barrier. */
int ddp__job_load_default(const char *const *sets, const char *const *labels, size_t nsets,
                          struct ddp_job **out);

/* A program run without a job file, torchrun style (cli/spec/cmdline.c). */
struct ddp_cmdline {
    const char *program; /* a .py script (run under python3), a module (-m), or with no_python
                            a program */
    char *const *args;   /* its arguments */
    int nargs;
    bool module, no_python;
    const char *nodes;       /* --nodes / -H: h1,h2 or h1:4,h2:4; NULL for localhost */
    const char *nodes_label; /* "--nodes h1,h2", for messages */
    const char *hostfile;    /* --hostfile */
};

/* The job such a command line describes, with the overrides (as ddp__job_load). */
int ddp__job_from_cmdline(const struct ddp_cmdline *cl, const char *const *sets,
                          const char *const *labels, size_t nsets, struct ddp_job **out);

void ddp__job_free(struct ddp_job *job);

/* Parses "500ms", "5s", "2m", "1h" (also "1.5s"). -1 if malformed. */
int64_t ddp__parse_duration_ms(const char *s);

/* True for the hosts ddprun starts locally without SSH. */
bool ddp__job_host_is_local(const char *host);
/* The SSH tree (ssh.fanout: K): the SSH nodes in the job's order, the first K started by the
 * launcher, the next K*K by them (K each, in order), and so on. parent[i] (nnodes of them): the
 * index of the node whose agent starts node i; -1 where the launcher does (or i is not an SSH
 * node). 0, or -1 out of memory. */
int ddp__job_ssh_tree(const struct ddp_job *j, int *parent);
/* The first node reached over SSH, or NULL for a local job. */
const char *ddp__job_first_remote(const struct ddp_job *j);
/* Where the store listens: rendezvous.listen, or for auto loopback on a local job and every
 * interface when some node is remote (each node is then told the address that routes to it). */
const char *ddp__job_store_listen(const struct ddp_job *j);

/* True when ranks get OMP_NUM_THREADS=1, as torchrun does: more than one rank on a node and
 * the variable set neither in env nor in ddprun's own environment. */
bool ddp__job_omp_default(const struct ddp_job *job);

/* Writes the resolved spec and the rank map (`ddprun plan`). */
void ddp__job_print_plan(const struct ddp_job *job, const char *job_id, FILE *f);

#endif
