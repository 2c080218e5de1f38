/*
 * The replicated checkpoints' records in etcd (rendezvous: {backend: etcd}; cli/supervisor/ckpt.h
 * keeps them): what a launcher that takes the job over (cli/supervisor/takeover.c) starts from.
 * Under the job's folder, "ckpt/<path>" holds each file's record and "ckpt-ports" each node's
 * replication port. A record is text:
 *
 *     ddprun-ckpt 1
 *     v SEQ ROUND SIZE SHA256 REMOVED ORIGIN PENDING HOLDERS
 *     p SEQ ROUND SIZE SHA256 REMOVED HOLDERS          (the version before, while held)
 *
 * HOLDERS the node indexes (in the job's node order) holding that version, comma-separated, or
 * "-". Written only by the launcher that holds the job's lease; the folder goes with the job.
 */
#ifndef DDP_CLI_SUPERVISOR_CKPT_STORE_H
#define DDP_CLI_SUPERVISOR_CKPT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A version of a file. */
struct ddp__ck_version {
    uint32_t round;
    int64_t recv_ms; /* (ddp_now_ms; not in the record) */
    uint64_t size;
    uint8_t sha[32];
    bool removed;
    unsigned seq; /* changes with each new version; 0: none */
};

/* One file's record; holder and pholder are nn flags each (pv.seq 0: no version before). */
struct ddp__ck_record {
    const char *rel;
    struct ddp__ck_version v, pv;
    int origin;
    bool pending; /* short of its copies */
    bool *holder, *pholder;
};

/* The records go to etcd: an etcd job whose launcher holds the job's lease. */
bool ddp__cks_on(void);
/* Writes r's record unless *saved (the last one written, replaced) says it is there; a failure
 * warns once. */
void ddp__cks_put_file(const struct ddp__ck_record *r, size_t nn, char **saved);
/* Writes the ports' record (addr[nn], NULL where none) the same way. */
void ddp__cks_put_ports(char *const *addr, size_t nn, char **saved);
/* Reads every file's record into take (r's arrays of nn flags live for the call; val is the
 * record, for its saved copy) and the ports into addr[nn] (where NULL; malloc'd). Malformed
 * records are left out with one warning. -1 after a warning when etcd cannot be read. */
int ddp__cks_load(size_t nn,
                  void (*take)(void *arg, const struct ddp__ck_record *r, const char *val),
                  void *arg, char **addr);

#endif
