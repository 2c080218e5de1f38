/*
 * The process group: what a training program uses to talk to its peers.
 * ddp_pg_init_env() forms the group from the environment ddprun gives each
 * rank; collectives then run on a background communication thread, so every
 * operation has a non-blocking form that returns a work handle.
 *
 * Ordering contract: every rank must issue the same collectives in the same
 * order (same op, count, dtype and root). They are executed, and complete,
 * in that order on every rank. A rank that issues a different sequence makes
 * the group fail or hang until the timeout; nothing checks it at run time.
 *
 * Failure: every operation has a deadline (ddp_pg_opts.timeout_ms). When a
 * peer dies or stops answering, the operation fails with an error naming the
 * peer's rank and host, the group is aborted, and every later operation fails
 * at once with DDP_EABORTED. Nothing hangs. The first failure is recorded in
 * the store, so ranks that fail because of the abort report the root cause.
 */
#ifndef DDP_WORKER_PG_H
#define DDP_WORKER_PG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ddp_pg;
struct ddp_work;
struct ddp_store;

enum ddp_dtype {
    DDP_F32 = 0,
    DDP_F64 = 1,
    DDP_BF16 = 2, /* reduced in float32, rounded to nearest even */
    DDP_F16 = 3,  /* reduced in float32, rounded to nearest even */
    DDP_I32 = 4,
    DDP_I64 = 5,
};

enum ddp_redop {
    DDP_SUM = 0,
    DDP_AVG = 1, /* sum divided by the world size (integers: truncated toward zero) */
    DDP_MAX = 2,
    DDP_MIN = 3,
};

/* Bytes per element of a dtype, or 0 for an unknown one. */
size_t ddp_dtype_size(enum ddp_dtype dt);

enum ddp_pg_backend {
    DDP_PG_BACKEND_DEFAULT = 0, /* ddp_pg_init_env: DDPRUN_BACKEND ("cpu" or "nccl"), else cpu */
    DDP_PG_BACKEND_CPU = 1,     /* host memory: TCP and shared memory */
    DDP_PG_BACKEND_NCCL = 2,    /* CUDA device memory: NCCL on the group's own stream */
};

struct ddp_pg_opts {
    int timeout_ms;              /* per operation; 0 = DDP_PG_TIMEOUT_MS or 300000 */
    const char *name;            /* distinguishes several groups in one job; NULL = "default" */
    size_t small_bytes;          /* all-reduce at or below this uses recursive doubling instead of
                                    the ring; 0 = DDP_PG_SMALL_BYTES or the measured default */
    enum ddp_pg_backend backend; /* NCCL: each rank uses CUDA device LOCAL_RANK */
    bool p2p;                    /* point-to-point (ddp_pg_send/recv): a second connection per
                                    pair; also DDP_PG_P2P=1. Alike on every rank. */
};

/*
 * Forms the group from RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * GROUP_RANK, DDPRUN_STORE_ADDR and the job token (DDPRUN_TOKEN_FD or
 * DDPRUN_TOKEN_FILE): joins the store, publishes this rank's listening
 * address, learns the others' and connects to every peer. A missing or
 * inconsistent variable is one error naming it (DDP_EINVAL). opts may be NULL.
 * With the NCCL backend (DDPRUN_BACKEND=nccl, as ddprun sets for backend: nccl)
 * rank 0 creates the NCCL unique id and shares it through the store, and every
 * rank joins the communicator on CUDA device LOCAL_RANK; collectives then take
 * device pointers. DDP_ENOTSUP when libddp was built without NCCL or no device
 * is visible.
 */
int ddp_pg_init_env(const struct ddp_pg_opts *opts, struct ddp_pg **out);

/* The same with explicit values and a connected store (borrowed: it must outlive the group,
 * which uses it to record why the group failed, so every rank can report the root cause). */
int ddp_pg_init(struct ddp_store *store, int rank, int world_size, int local_rank,
                int local_world_size, int node_rank, const struct ddp_pg_opts *opts,
                struct ddp_pg **out);

/* Stops the communication thread (pending work fails with DDP_EABORTED), closes every
 * connection and frees the group. NULL is a no-op. */
void ddp_pg_free(struct ddp_pg *pg);

/*
 * Forms a sub-group of pg (torch.distributed.new_group): ranks[0..n) of pg, in that order, are
 * ranks 0..n-1 of the new group, which has connections, shared memory and a communication
 * thread of its own, so its collectives run beside pg's (the replicas of one pipeline stage
 * reduce their gradients on theirs). Every rank of pg calls it with the same name and list (a
 * difference is DDP_EINVAL on every rank); members get the group in *out, the other ranks
 * NULL. name (at most 63 characters) tells the groups of one job apart. Free sub-groups before
 * pg: they use its store.
 */
int ddp_pg_new_group(struct ddp_pg *pg, const int *ranks, int n, const char *name,
                     struct ddp_pg **out);

int ddp_pg_rank(const struct ddp_pg *pg);
int ddp_pg_world_size(const struct ddp_pg *pg);
/* The ranks of this group on this rank's node (LOCAL_WORLD_SIZE at forming). */
int ddp_pg_local_world_size(const struct ddp_pg *pg);
/* True until an operation failed and aborted the group. */
bool ddp_pg_is_alive(const struct ddp_pg *pg);

/*
 * Collectives. The _start forms queue the operation for the communication
 * thread and return a work handle at once; the buffers must stay valid and
 * untouched until the work completes. The plain forms start and wait.
 *
 * allreduce: buf[count] in place, reduced with op across all ranks.
 * broadcast: buf[count] from root to every rank.
 * allgather: send[count] from each rank into recv[count * world] (rank order).
 * reduce_scatter: send[count * world] reduced; rank r receives block r in recv[count]; recv
 *   may be send's own block (send + r * count elements: in place).
 * barrier: returns once every rank has entered it.
 */
int ddp_pg_allreduce_start(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                           enum ddp_redop op, struct ddp_work **work);
int ddp_pg_broadcast_start(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt, int root,
                           struct ddp_work **work);
int ddp_pg_allgather_start(struct ddp_pg *pg, const void *send, void *recv, size_t count,
                           enum ddp_dtype dt, struct ddp_work **work);
int ddp_pg_reduce_scatter_start(struct ddp_pg *pg, const void *send, void *recv, size_t count,
                                enum ddp_dtype dt, enum ddp_redop op, struct ddp_work **work);
int ddp_pg_barrier_start(struct ddp_pg *pg, struct ddp_work **work);
/* ddp_pg_allreduce_start for a gradient bucket: the flight recorder notes its index. */
int ddp_pg_allreduce_start_bucket(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                                  enum ddp_redop op, int bucket, struct ddp_work **work);

/* count elements at data: one piece of a buffer in pieces. */
struct ddp_piece {
    void *data;
    size_t count;
};
/*
 * The all-reduce of the concatenation of n pieces (a bucket of gradients where they lie),
 * each piece left holding its part of the result: the same values, bit for bit, as an
 * all-reduce of one buffer holding them back to back. Through the node's shared memory the
 * pieces are read and written in place (no copy into a contiguous buffer); over TCP alone the
 * communication thread gathers them into a staging buffer and scatters the result back.
 * Host memory only: DDP_ENOTSUP on an NCCL group. The array is copied; the pieces must not
 * overlap and must stay untouched until the work completes. bucket as above (or -1).
 */
int ddp_pg_allreduce_pieces_start(struct ddp_pg *pg, const struct ddp_piece *pieces, size_t n,
                                  enum ddp_dtype dt, enum ddp_redop op, int bucket,
                                  struct ddp_work **work);

int ddp_pg_allreduce(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                     enum ddp_redop op);
/* The blocking forms of the two bucket calls above (inline in the caller when the group is
 * idle, as every blocking form: no hand-off to the communication thread). */
int ddp_pg_allreduce_bucket(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                            enum ddp_redop op, int bucket);
int ddp_pg_allreduce_pieces(struct ddp_pg *pg, const struct ddp_piece *pieces, size_t n,
                            enum ddp_dtype dt, enum ddp_redop op, int bucket);
int ddp_pg_broadcast(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt, int root);
int ddp_pg_allgather(struct ddp_pg *pg, const void *send, void *recv, size_t count,
                     enum ddp_dtype dt);
int ddp_pg_reduce_scatter(struct ddp_pg *pg, const void *send, void *recv, size_t count,
                          enum ddp_dtype dt, enum ddp_redop op);
int ddp_pg_barrier(struct ddp_pg *pg);

/*
 * Point-to-point, on a group formed with opts.p2p (or DDP_PG_P2P=1): bytes from buf to rank
 * peer, received there by the receive with the same sender and tag; messages with the same
 * sender and tag match in the order they were sent, others in any order. Sends and receives
 * run on an engine thread of their own, beside the group's collectives, and never wait for
 * each other: a message that arrives before its receive is held until it is posted. A receive
 * of another size than the message's fails (DDP_EPROTO); a peer that dies fails what is
 * pending with it (DDP_ECLOSED); each fails after the group's timeout (DDP_ETIMEDOUT), naming
 * the peer and tag. DDP_ENOTSUP on a group without p2p. The buffers must stay valid until the
 * work completes.
 */
int ddp_pg_send_start(struct ddp_pg *pg, const void *buf, size_t bytes, int peer, uint32_t tag,
                      struct ddp_work **work);
int ddp_pg_recv_start(struct ddp_pg *pg, void *buf, size_t bytes, int peer, uint32_t tag,
                      struct ddp_work **work);
int ddp_pg_send(struct ddp_pg *pg, const void *buf, size_t bytes, int peer, uint32_t tag);
int ddp_pg_recv(struct ddp_pg *pg, void *buf, size_t bytes, int peer, uint32_t tag);
/* True for a group formed with point-to-point connections (opts.p2p or DDP_PG_P2P=1). */
bool ddp_pg_has_p2p(const struct ddp_pg *pg);

/*
 * Posts the all-reduce that the program will call next on this group (the same buffer, count,
 * dtype and op), now that buf holds this rank's final input: where it will go single-copy
 * (registered memory on one node), buf is published to the node's ranks at once, so that a
 * rank that called it already sums its chunks while this one is still computing (the reducer
 * posts its first bucket when backward fills it, without overlap). buf belongs to the
 * all-reduce from here on. Returns 0 posted, 1 not posted (nothing happened; call it as
 * usual), or a DDP_E* code. If another collective is called first, the posted all-reduce runs
 * before it.
 */
int ddp_pg_allreduce_post(struct ddp_pg *pg, void *buf, size_t count, enum ddp_dtype dt,
                          enum ddp_redop op);
/*
 * The same for the all-reduce of n pieces that the program will call next (with
 * ddp_pg_allreduce_pieces or its _start form: the same pieces, dtype and op), posted before
 * its data is complete: the first ready elements of the pieces' concatenation are final. Where
 * the pieces go in claimed chunks (every local rank's in registered memory, on one node), the
 * ranks that called the all-reduce sum the chunks up to where every rank's data is final, and
 * wait there for more. ddp_pg_post_ready(pg, ready) says that more of it is final (from the
 * thread that posted; ready never goes back). Calling the all-reduce says that all of it is.
 * The array must stay valid until the all-reduce is called: a piece that starts at or past
 * ready may still move in it (the same count, elsewhere in registered memory) until
 * ddp_pg_post_ready or the call makes it final, which read it again. At least two pieces: 1
 * for one (post it with ddp_pg_allreduce_post). Returns as ddp_pg_allreduce_post; if another
 * collective is called first, all the data must be final by then. The reducer streams its
 * buckets so, without overlap: an early rank sums each gradient as soon as every rank's
 * backward has filled it.
 */
int ddp_pg_allreduce_pieces_post(struct ddp_pg *pg, const struct ddp_piece *pieces, size_t n,
                                 enum ddp_dtype dt, enum ddp_redop op, size_t ready);
/* 0; 1 where no all-reduce of pieces is posted (nothing to do); DDP_EINVAL where a piece made
 * final now lies outside registered memory (nothing changes). */
int ddp_pg_post_ready(struct ddp_pg *pg, size_t ready);
/* Whether bytes at p lie in this group's registered memory (ddp_pg_mem_alloc's arena): where
 * the node's other ranks can read them in place. */
bool ddp_pg_mem_registered(struct ddp_pg *pg, const void *p, size_t bytes);
/* Whether an all-reduce of pieces of count elements of dt would be posted (in at least two
 * pieces): the same answer on every rank of the group (its setup decides it), so that every
 * rank may shape its collectives by it. */
bool ddp_pg_can_post_pieces(struct ddp_pg *pg, size_t count, enum ddp_dtype dt);

/*
 * Registered memory: bytes of zero-filled memory that the other ranks of this node read in
 * place, so an all-reduce of a buffer in it (from DDP_PG_DIRECT_BYTES up; by default from
 * 1 MiB on one node where trials say it pays) costs one copy between processes, none through
 * the node's segment. It is ordinary memory (calloc) when the group has none
 * (DDP_PG_DIRECT_BYTES=0, one rank per node, several nodes by default, a TCP-only or NCCL
 * group, no memory for an arena):
 * callers need not care. NULL only when out of memory. Free it with ddp_pg_mem_free (which
 * frees memory from malloc too) before ddp_pg_free, which unmaps it.
 */
void *ddp_pg_mem_alloc(struct ddp_pg *pg, size_t bytes);
void ddp_pg_mem_free(struct ddp_pg *pg, void *p);

/*
 * NCCL groups. Buffers are CUDA device memory, and collectives are stream-ordered: each _start
 * records an event on the group's compute stream (set below; by default the legacy default
 * stream, NULL) and the collective runs on the group's own communication stream after it, so
 * it sees everything the program queued on the compute stream before the call. The host never
 * waits for the device to start one. ddp_work_stream_wait() makes the compute stream wait for
 * a collective on the device; ddp_work_wait() waits on the host.
 */
void ddp_pg_set_compute_stream(struct ddp_pg *pg, void *stream); /* a cudaStream_t */
void *ddp_pg_compute_stream(const struct ddp_pg *pg);
/* The communication stream (a cudaStream_t); NULL for CPU groups. */
void *ddp_pg_comm_stream(struct ddp_pg *pg);
/* True for a group whose buffers are CUDA device memory (the NCCL backend). */
bool ddp_pg_is_cuda(const struct ddp_pg *pg);

/* Waits for the work and returns its result (0 or a DDP_E* code). */
int ddp_work_wait(struct ddp_work *work);
/* True once the work has completed; *result (optional) receives its result. */
bool ddp_work_test(struct ddp_work *work, int *result);
/*
 * NCCL groups: makes the compute stream the work was started under wait for it on the device
 * and returns without waiting on the host (0, or the error of a collective that already
 * failed). A collective that fails later aborts the group; the next operation reports it.
 * CPU groups: the same as ddp_work_wait().
 */
int ddp_work_stream_wait(struct ddp_work *work);
/* Frees a work handle; waits for it first if it is still running (NCCL groups: only until it
 * is on the communication stream; order later uses of its buffers with
 * ddp_work_stream_wait()). NULL is a no-op. */
void ddp_work_free(struct ddp_work *work);

/* Aborts the group from the program's side (for an error the collectives cannot see, such as
 * ranks disagreeing about their parameters): why is recorded in the store as the root cause
 * (if no failure was recorded first) and every connection is shut, so the peers' current and
 * later operations fail at once, reporting it, instead of waiting out their timeouts. */
void ddp_pg_abort(struct ddp_pg *pg, const char *why);

/*
 * Elastic jobs: tells ddprun where this restart of the job resumed (the global step read
 * from the checkpoint, 0 for a fresh start), through the store key
 * "ddprun/resume/<TORCHELASTIC_RESTART_COUNT>"; ddprun shows it and logs a "resumed"
 * event. Call it from one rank (rank 0) once training can go on. Does nothing (returns 0)
 * outside ddprun. 0 or a DDP_E* code.
 */
int ddp_pg_report_resume(struct ddp_pg *pg, int64_t step);

/* The last error's description ("peer rank 3 (host-b) closed the connection during
 * allreduce"), valid until the group is freed. */
const char *ddp_pg_last_error(const struct ddp_pg *pg);

/*
 * The flight recorder: every group keeps its last 1024 collectives (operation, dtype, bytes,
 * bucket, when each was issued, began and finished). Prints the last n, oldest first, a line
 * each. Under ddprun the first group's recorder is also read by the node agent (for `ddprun
 * status`, `ddprun stacks` and the hang report). DDP_FLIGHT_RECORDER=0 turns it off.
 */
void ddp_pg_dump_recorder(const struct ddp_pg *pg, FILE *f, unsigned n);

#ifdef __cplusplus
}
#endif

#endif
