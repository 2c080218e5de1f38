/*
 * The job spec's value readers (cli/spec/values.c), private to the job-spec files: each reads
 * one YAML node (cli/spec/ytree.h) as a value of a type, or says at the node's file:line:col (or
 * the --set that made it) what is wrong and returns -1.
 */
#ifndef DDP_CLI_JOB_VALUES_H
#define DDP_CLI_JOB_VALUES_H

#include <stdbool.h>
#include <stdint.h>

#include "cli/spec/ytree.h"

struct ddp__jctx {
    const char *file; /* the job file, for messages */
};

/* "FILE:LINE:COL: message" (or "--set ...: message") for node n (NULL: the file alone). */
void ddp__jv_err(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A key given twice in mapping m is an error (O(n log n)). */
int ddp__jv_check_dups(const struct ddp__jctx *c, const struct ddp_ynode *m, const char *where);
/* m must be a mapping of allowed keys (a NULL-terminated list), each at most once. */
int ddp__jv_check_keys(const struct ddp__jctx *c, const struct ddp_ynode *m, const char *where,
                       const char *const *allowed);
/* n must be a single value (what names it in the message). */
int ddp__jv_scalar(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what);
/* A non-empty string; *out (freed first) takes a copy. */
int ddp__jv_str(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what, char **out);
/* A whole number from lo to hi. */
int ddp__jv_int(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what, long lo,
                long hi, int *out);
/* true/yes/on/1 or false/no/off/0. */
int ddp__jv_bool(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what, bool *out);
/* A duration ("500ms", "5s", "2m", "1h") in ms. */
int ddp__jv_duration(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what,
                     int64_t *out);
/* As ddp__jv_duration, refusing 0 (an interval or a timeout that must pass). */
int ddp__jv_duration_pos(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what,
                         int64_t *out);
/* One of two words: *out is false for `no`, true for `yes`. */
int ddp__jv_enum(const struct ddp__jctx *c, const struct ddp_ynode *n, const char *what,
                 const char *no, const char *yes, bool *out);
/* The one rule for paths: absolute as given, "~/..." in the home folder, else relative to
 * base (the job file's folder). A new string, or NULL when out of memory. */
char *ddp__jv_path(const char *base, const char *p);
/* Letters, digits and _, not starting with a digit. */
bool ddp__jv_env_name_ok(const char *s);
/* "all", or ranks N and ranges N-M (N <= M) separated by commas. */
bool ddp__jv_rank_list_ok(const char *s);

struct ddp_job;

/* The command and env keys (cli/spec/command.c), and the exec limits they must fit. */
int ddp__job_command(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j);
int ddp__job_env(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j);
/* The warm key: on, off, or {imports: [MODULE, ...]} (cli/spec/command.c). */
int ddp__job_warm(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j);
/* metrics: {listen, allow} (cli/spec/metrics.c). */
int ddp__job_metrics(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j);
int ddp__job_exec_size(const struct ddp__jctx *c, const struct ddp_ynode *root,
                       const struct ddp_job *j);
/* The nodes key (cli/spec/hosts.c): hosts, and each one's slots where given (*slots_given, a
 * malloc'd array of nnodes, 0 where not given). */
int ddp__job_nodes(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j,
                   int **slots_given);
/* launcher: external (its node: launcher): nodes is N, the slots agents may take (hosts
 * "agent-K" until one does, cli/spec/job.h). */
int ddp__job_external_slots(const struct ddp__jctx *c, const struct ddp_ynode *n,
                            const struct ddp_ynode *launcher, struct ddp_job *j, int **slots_given);

/* cli/spec/rdzv.c: the rendezvous section sub (the store's or etcd's settings; NULL: none) into
 * j, whose nodes and launcher are read: a timeout it does not give grows with the nodes. Its TLS
 * files are made absolute with the job's other paths (cli/spec/keys.c). */
int ddp__job_rdzv(const struct ddp__jctx *c, const struct ddp_ynode *sub, struct ddp_job *j,
                  const struct ddp_ynode *launcher);

/* cli/spec/stages.c: the pipeline section sub into j->pipe (j's nodes already read: the
 * stages' ranks must add up to its ranks); its release. */
struct ddp_job_pipeline;
int ddp__job_pipeline(const struct ddp__jctx *c, const struct ddp_ynode *sub, const char *basedir,
                      struct ddp_job *j);
void ddp__job_pipeline_free(struct ddp_job_pipeline *p);

/* cli/spec/slurm_alloc.c: whether ddprun runs inside a Slurm allocation; nproc_per_node n when it
 * is a name (gpu, cpu, auto, as torchrun's: counted here, j's nodes read): 1 and *out, 0 when it is
 * not one, -1 when it cannot be counted (said at n); the allocation's nodes as j's (nodes: slurm),
 * with their task counts as slots unless per_node_given. */
bool ddp__slurm_allocated(void);
int ddp__nproc_named(const struct ddp__jctx *c, const struct ddp_ynode *n, struct ddp_job *j,
                     int *out);
int ddp__slurm_nodes(const struct ddp__jctx *c, const struct ddp_ynode *at, bool per_node_given,
                     struct ddp_job *j, int **slots_given);
/* launcher: n (NULL: auto), alloc: whether the nodes are the allocation's. Sets j->srun. */
int ddp__slurm_launcher(const struct ddp__jctx *c, const struct ddp_ynode *n, bool alloc,
                        struct ddp_job *j);

#endif
