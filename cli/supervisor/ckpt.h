/*
 * The launcher's share of the checkpoints the agents replicate (checkpoint.replicas K >= 1;
 * cli/supervisor/ckpt.c; the agents' share: cli/agent/ckpt_repl.h). It keeps the record of every
 * file the ranks finished in the node-local checkpoint.dir: its newest version (by the round
 * its agent was in, then by the time the record reached the launcher), its size and SHA-256,
 * and which nodes hold that version; each record is an event in events.jsonl. It never sees a
 * file's bytes: each new version is copied by K other live nodes' agents straight from its
 * holder (the next nodes in node order, spares included), and again to others when a holder is
 * lost. A record from a node counted lost is fenced: never copied nor restored.
 *
 * Before a round's ranks start, each member is sent the whole manifest as a restore (its agent
 * holds the START until its folder matches: a copy already that version stays, any other is
 * fetched from a holder, checked against the record; removed files are removed), and each
 * spare the same without the hold. A file no member could get a valid copy of fails the job
 * (status 1, naming the files), or with checkpoint.on_corrupt: restart is removed everywhere and
 * the round started again without it. The restore's bytes and time are the recovery timeline's
 * "checkpoint restored" phase; the replication's lag shows in `ddprun status`.
 *
 * With rendezvous: {backend: etcd} the records are also in the job's folder in etcd, written
 * before the agent's frame is acknowledged, so a launcher that takes the job over goes on with
 * them (ddp__ck_load).
 */
#ifndef DDP_CLI_SUPERVISOR_CKPT_H
#define DDP_CLI_SUPERVISOR_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ddp_job;
struct ddp__nodes;

/* What the caller (the supervisor's policy) must do after a frame. */
enum ddp__ck_action {
    DDP__CK_NONE,
    DDP__CK_FAIL_JOB,   /* fail the job with status 1 and why */
    DDP__CK_FAIL_ROUND, /* restart the round (on_corrupt: restart), why said */
};

void ddp__ck_init(const struct ddp_job *job, struct ddp__nodes *nodes);
void ddp__ck_release(void);
bool ddp__ck_on(void);
/* Node i joined: its agent is told to watch and serve the folder (CKPT_OPEN). */
void ddp__ck_joined(int i);
/* Taking a job over (cli/supervisor/takeover.c): the records the last launcher kept in etcd
 * (rendezvous: {backend: etcd}; each written there as it changes). */
void ddp__ck_load(void);
/* Node i was counted lost: its copies no longer count, and the files it held are copied again
 * from the holders left. */
void ddp__ck_lost(int i);
/* A CKPT_* frame from node i: true when it was one (why set for an action). */
bool ddp__ck_frame(int i, uint8_t type, const uint8_t *body, size_t len, enum ddp__ck_action *act,
                   char *why, size_t whyn);
/* The round's restore: member(i) says which nodes are its members; sent before their STARTs.
 * DDP__CK_FAIL_JOB with why when a file has no holder left (and on_corrupt is fail): then
 * nothing was sent. */
enum ddp__ck_action ddp__ck_restore(bool (*member)(int), char *why, size_t whyn);
/* Node i is let go (the job's end): no copy is asked of it any more. */
void ddp__ck_closed(int i);
/* Copies asked for and not answered yet. */
bool ddp__ck_copying(void);
/* The replication's lag in seconds: node -1 the job's (since the oldest file short of its
 * copies was recorded), else node's (since the oldest file it is copying now was); 0 when
 * nothing is short; -1 when replication is off. */
double ddp__ck_lag_s(int node);
/* The replication's state for `ddprun status` (one line, no newline); 0 when off. */
int ddp__ck_line(char *buf, size_t n);

#endif
