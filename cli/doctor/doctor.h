/* `ddprun doctor` and the hidden commands it runs on nodes (cli/doctor/). */
#ifndef DDP_CLI_DOCTOR_DOCTOR_H
#define DDP_CLI_DOCTOR_DOCTOR_H

#include <stdbool.h>
#include <stddef.h>

struct ddp_job;

/* `ddprun doctor`: checks every node of the job (cli/doctor/doctor.c); 0 when all pass, else 1. */
int ddp__doctor(const struct ddp_job *job);
/* Its etcd part (cli/doctor/etcd.c): prints each endpoint's answer and the prefix check; the
 * failures' count. host/port: the first TCP endpoint, for the nodes' check (host "" if none). */
int ddp__doctor_etcd(const struct ddp_job *job, char *host, size_t n, int *port);
/* The file the doctor compares between nodes (cli/doctor/code.c): the program, or for python
 * the script (*script set), or NULL (a shell command, python -c/-m/-). */
const char *ddp__code_file(const struct ddp_job *job, bool *script);
/* The module a Python job runs with -m (python -m NAME), or NULL (cli/doctor/code.c). */
const char *ddp__py_module(const struct ddp_job *job);
/* "code HEX\n" (its SHA-256's first 8 bytes) or "code none WHY\n" for file from workdir. */
void ddp__code_line(const char *workdir, const char *file, bool script, char *out, size_t n);
/* The hidden `ddprun __code WORKDIR FILE program|script` the doctor runs on a node. */
int ddp__cmd_code(int argc, char **argv);
/* The environment of the doctor's checks on a node, as its ranks get it (cli/doctor/env.c):
 * for a node reached by SSH a shell prefix "export 'K=V' ...; " (the export rule's variables,
 * then the job's env; "" when none), malloc'd; here and through srun {"env", "K=V", ..., NULL}
 * (the job's env), each string and the array malloc'd. NULL when out of memory. */
char *ddp__doctor_env_sh(const struct ddp_job *job);
char **ddp__doctor_env_argv(const struct ddp_job *job);
/* srun's words for one step of the doctor's on a node (its --nodelist and the command follow). */
#define DDP__DOCTOR_SRUN                                                                           \
    "srun", "--nodes=1", "--ntasks=1", "--overlap", "--quiet", "--job-name=ddprun-doctor"
/* The doctor's mesh check (cli/doctor/mesh.c): the nodes with part[i] run `__mesh` at once
 * (as a launch reaches them; over ssh[i], a node's open session, where not NULL), each
 * connecting back to the listener lfd (port), and report
 * which others they cannot reach where those nodes' ranks would listen. why: nnodes strings of
 * whyn bytes, "" for a node that reached every other, else why it fails: "cannot reach 'host'
 * (ADDR): WHY; ..., where its ranks would listen (...)" or "its mesh check ..." (it could not
 * run). False when it did not run (fewer than two nodes, or all
 * local). */
struct ddp__ssh;
bool ddp__doctor_mesh(const struct ddp_job *job, const char *self, int lfd, int port,
                      const bool *part, struct ddp__ssh *const *ssh, char *why, size_t whyn);
/* The hidden `ddprun __mesh HOST:PORT INDEX [IFACE]` it runs on each node. */
int ddp__cmd_mesh(int argc, char **argv);
/* Binds a free port and connects to host:port within 3 s; writes what happened to out: "ok port
 * P iface I gpus G nofile SOFT HARD[ clock OFFSET ERROR]" (0), or why not (2: no port to listen
 * on; 1: the store not reached) (cli/doctor/probe.c). */
int ddp__doctor_probe(const char *host, int port, char *out, size_t n);
/* The doctor's listener answers each probe with its clock (CLOCK_REALTIME, 8 bytes), which
 * the probe's line gives as " clock OFFSET_NS ERROR_NS" (cli/doctor/probe.c). */
void ddp__doctor_stamp(int fd);
/* The hidden `ddprun __probe HOST:PORT` the doctor runs on nodes (cli/doctor/doctor.c). */
int ddp__cmd_probe(int argc, char **argv);

#endif
