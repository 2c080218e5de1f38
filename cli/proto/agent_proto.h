/*
 * Frames between ddprun (the launcher) and a node agent, over the link the
 * agent dials back to the launcher (cli/proto/agent_wire.h: sealed records).
 * Each frame: u32 len (of what follows) | u8 type | body, little-endian,
 * strings as u32 length + bytes (common/buf.h). The link's end means "stop
 * now, with the grace period from START".
 */
#ifndef DDP_CLI_AGENT_PROTO_H
#define DDP_CLI_AGENT_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/sys/devices.h"
#include "common/buf.h"

#define DDP__AGENT_MAX_FRAME (1u << 20)
/* The frames' protocol: 7 since CKPT_FILE is kept until acknowledged; 6 since the replicated
 * checkpoints' frames (cli/proto/ckpt_proto.h: 0x0F, 0x10, 0x8E-0x90); 5 since PREPARE; 4 since
 * STARTED says warm; 3 since the SSH tree's frames (cli/proto/agent_tree.h); 2 since each end says
 * HELLO first, with ERROR (1: the ones before). Raised whenever a frame changes; the ends of a link
 * must speak the same one. */
#define DDP__AGENT_PROTO 7u
#define DDP__AGENT_VERSION_MAX 64       /* a HELLO's version string, bytes */
#define DDP__AGENT_MAX_LINE (64u << 10) /* longer output lines are split */

enum ddp__agent_msg {
    /* launcher -> agent */
    DDP__AG_START = 1,  /* the node's share of the job (struct ddp__agent_start) */
    DDP__AG_STOP = 2,   /* u64 grace_ms [, u8 signal]: stop the workers (see below) */
    DDP__AG_JOIN = 3,   /* first frame: join the job's store (struct ddp__agent_join) */
    DDP__AG_SIGNAL = 4, /* u8 signal: pass it to every running worker (SIGUSR1, ...) */
    DDP__AG_STACKS = 5, /* u32 request, u32 n, n x u32 local_rank (n 0: every running one):
                           gather their native stacks */
    DDP__AG_BYE = 6,    /* the job is done with this agent: at EOF it stops and exits, even
                           where it would wait for a new launcher (takeover_ms) */
    DDP__AG_ACK = 7,    /* u64 n: the launcher has shown the first n OUTPUT, ERROR and
                           CKPT_FILE frames this link carried (sent only with a takeover wait: the
                           agent keeps    the others for a new launcher, cli/agent/link.h) */
    DDP__AG_HELLO = 8,  /* the first frame each end sends on a link (AGENT_HELLO the agent's):
                           u32 protocol, str ddprun version (printable, 1-64 bytes); a later
                           protocol may add fields after them. A first frame that is not HELLO,
                           or another protocol, ends the link: the launcher names both
                           versions; an agent says so only to a launcher that sent no HELLO
                           (one that did names the mismatch itself) */

    /* A spare's START as it would be were the node taken in now (the running round's values):
     * its agent makes warm interpreters for its slots (cli/agent/warm.h) and starts nothing; the
     * next START or PREPARE replaces it. (0x09-0x0D: agent_wire.h, agent_tree.h.) */
    DDP__AG_PREPARE = 0x0E,

    /* agent -> launcher */
    DDP__AG_STARTED = 0x81,      /* u32 local_rank, u32 pid, u8 warm (1: from a warm
                                    interpreter, cli/agent/warm.h) */
    DDP__AG_OUTPUT = 0x82,       /* u32 local_rank, u8 stream (1 out, 2 err; | OUT_PROGRESS),
                                    str line */
    DDP__AG_EXITED = 0x83,       /* u32 local_rank, i32 code (>= 0) or -signal, u64 runtime_ms,
                                    u8 exec_failed */
    DDP__AG_DONE = 0x84,         /* every worker of the last START reaped; the agent waits for
                                    the next START, and exits at EOF on its stdin */
    DDP__AG_JOINED = 0x85,       /* u64 lease: connected to the store, heartbeating */
    DDP__AG_STACKS_REPLY = 0x86, /* u32 request, u32 n, n x (u32 local_rank, u32 pid,
                                    str text): the stacks STACKS asked for */
    DDP__AG_STATE = 0x87,        /* the first frame of an agent a new launcher rejoined
                                    (`ddprun agent --rejoin`) after its HELLO and the OUTPUT
                                    frames the last
                                    launcher had not acknowledged: where it stood when its
                                    launcher went (struct ddp__agent_state); the frames it held
                                    since follow in order */
    DDP__AG_AGENT_HELLO = 0x88,  /* as HELLO: the first frame on every link, also before
                                    what a rejoined agent held (STATE above); after the
                                    version, the counts of its node (cli/sys/devices.h: i32
                                    SLURM_GPUS_ON_NODE, i32 CUDA_VISIBLE_DEVICES's devices,
                                    -1 unset; u32 driver GPUs, u32 CPUs), which count the
                                    slots of nproc_per_node gpu|cpu|auto (absent from an
                                    agent before them); then u32 a port free on its node,
                                    MASTER_PORT where it is node 0 with rendezvous.torch_store
                                    rank0 (absent from an agent before it) */
    DDP__AG_ERROR = 0x89,        /* u32 local_rank, str message, str traceback (may be ""):
                                    what a failed rank wrote to its TORCHELASTIC_ERROR_FILE
                                    (cli/agent/errfile.h), sent before its EXITED */
};

/* The frames an agent keeps until its launcher acknowledges them (ACK counts them), and a new
 * launcher holds until STATE: a rank's output and its error, and a checkpoint file's record
 * (CKPT_FILE, 0x8F in cli/proto/ckpt_proto.h: one in flight when a launcher died reaches the
 * next, which records it in etcd before its ACK). */
#define DDP__AG_ACKED_CKPT_FILE 0x8Fu
static inline bool ddp__agent_acked(uint8_t type)
{
    return type == DDP__AG_OUTPUT || type == DDP__AG_ERROR || type == DDP__AG_ACKED_CKPT_FILE;
}

/* In OUTPUT's stream byte: the line is one the worker rewrites in place after a carriage
 * return (a progress bar): the text after its last '\r', sent before the line ends. */
#define DDP__AG_OUT_PROGRESS 0x10
/* In OUTPUT's stream byte: the line was cut at DDP__AGENT_MAX_LINE, and goes on in the next
 * OUTPUT of the stream. */
#define DDP__AG_OUT_CUT 0x20

/*
 * STOP: the signal (default SIGTERM) goes to the workers' process group at once; when it is
 * not SIGTERM (SIGINT, for an interrupt: Python's KeyboardInterrupt and finally blocks run),
 * SIGTERM follows after half of grace_ms; SIGKILL after grace_ms. A second STOP with
 * grace_ms 0 kills at once.
 */

/*
 * What an agent needs to join the job: it connects to the store, takes a lease
 * of heartbeat_timeout_ms, sets "ddprun/nodes/<node_index>.<incarnation>" bound to
 * it, renews it every heartbeat_interval_ms, and answers JOINED. Should the lease
 * be lost, or the store stay unreachable for heartbeat_timeout_ms, the agent stops
 * its workers and exits: the launcher has counted the node lost by then.
 */
struct ddp__agent_join {
    char *token;
    char *store_addr;
    char *job_id;
    char *host_label;
    uint32_t node_index, incarnation;
    uint64_t heartbeat_interval_ms, heartbeat_timeout_ms, grace_ms;
    /* rendezvous: {backend: etcd}: its endpoints (comma-separated; "" for the built-in store),
     * the job's key prefix ("<prefix><job id>/") and TLS files ("" for none) */
    char *etcd_endpoints, *etcd_prefix, *etcd_ca, *etcd_cert, *etcd_key;
    /* 0: EOF on stdin without BYE (the launcher died) stops the node now. Else the workers run
     * on and the agent waits this long for a new launcher to rejoin it (ddprun attach --etcd),
     * holding what it would have sent; then it stops them. */
    uint64_t takeover_ms;
};

/* STATE: what the dead launcher had been told. Each rank's pid is 0 until STARTED went out;
 * exited is set once EXITED went out (code, runtime_ms and exec_failed with it). */
struct ddp__agent_state_rank {
    uint32_t pid;
    uint8_t exited, exec_failed;
    int32_t code;
    uint64_t runtime_ms;
};
struct ddp__agent_state {
    uint32_t node_index, incarnation;
    uint8_t have_start;          /* a round's workers */
    uint8_t done;                /* and DONE went out for them */
    uint32_t round, rank_offset; /* with have_start: its START's restart_count and offset */
    uint32_t nlocal;
    struct ddp__agent_state_rank *ranks; /* nlocal of them */
    uint64_t dropped;                    /* output lines it could not hold */
};
int ddp__agent_put_state(struct ddp_buf *b, const struct ddp__agent_state *s);
/* Parses STATE; ranks is allocated (free it). 0, or DDP_EPROTO/ENOMEM. */
int ddp__agent_get_state(const uint8_t *body, size_t len, struct ddp__agent_state *s);

int ddp__agent_put_join(struct ddp_buf *b, const struct ddp__agent_join *j);
int ddp__agent_get_join(const uint8_t *body, size_t len, struct ddp__agent_join *j);
void ddp__agent_join_release(struct ddp__agent_join *j);

/* What one agent needs to start its node's workers. Strings are owned. */
struct ddp__agent_start {
    char *token;
    char *store_addr;
    char *job_id;
    char *host_label; /* the node's name in the job spec */
    char *master_addr;
    uint32_t master_port;
    uint32_t node_rank, nnodes, world_size, rank_offset, nlocal;
    uint32_t restart_count, max_restarts;
    uint64_t grace_ms;
    char *workdir;
    char *backend;
    char *checkpoint_dir; /* "" when none */
    char *shell;          /* "" when argv is used */
    char **argv;          /* NULL-terminated */
    char **env;           /* "K=V" strings, NULL-terminated: the job's env, applied last */
    char **shell_env;     /* "K=V" from the launching shell (the export rule), applied first */
    uint8_t agent_store;  /* MASTER_ADDR:MASTER_PORT is the launcher's TCPStore port */
    uint8_t bind_to;      /* bind_to: 0 none, 1 core, 2 numa (cli/sys/cpubind.h) */
    uint8_t warm;         /* warm: a Python command's ranks may restart warm (cli/agent/warm.h) */
    uint8_t warm_listed;  /* warm.imports was given: a module that fails to import warns */
    char **warm_imports;  /* the modules a warm interpreter imports (NULL-terminated) */
};

/* Appends a START frame to b; _as: a frame of type (START or PREPARE) with its body. */
int ddp__agent_put_start(struct ddp_buf *b, const struct ddp__agent_start *st);
int ddp__agent_put_start_as(struct ddp_buf *b, uint8_t type, const struct ddp__agent_start *st);
/* Parses a START frame body (after the type byte). 0, or DDP_EPROTO/ENOMEM. */
int ddp__agent_get_start(const uint8_t *body, size_t len, struct ddp__agent_start *st);
void ddp__agent_start_release(struct ddp__agent_start *st);

/* Appends a HELLO frame of type (HELLO or AGENT_HELLO) with DDP__AGENT_PROTO and version, and
 * an agent's the counts of its node (NULL: none): i32 SLURM_GPUS_ON_NODE's count, i32
 * CUDA_VISIBLE_DEVICES's, u32 the driver's GPUs, u32 CPUs (cli/sys/devices.h); then, with the
 * counts, u32 port: a port free on its node for rank 0's TCPStore (ddp__free_port there). */
int ddp__agent_put_hello(struct ddp_buf *b, uint8_t type, const char *version,
                         const struct ddp__node_counts *counts, uint32_t port);
/* Parses a HELLO body: its protocol and version (NUL-terminated in version[n]; n is at least
 * DDP__AGENT_VERSION_MAX + 1). Fields after them are ignored. 0, or DDP_EPROTO. */
int ddp__agent_get_hello(const uint8_t *body, size_t len, uint32_t *proto, char *version, size_t n);
/* The node's counts after a valid HELLO's version: 0, 1 when it has none (an agent of ddprun
 * 0.1.0 before them, or the launcher's HELLO), DDP_EPROTO when they are cut short or out of
 * range. */
int ddp__agent_get_hello_counts(const uint8_t *body, size_t len, struct ddp__node_counts *c);
/* The free port after the counts: 0, 1 when it has none (an agent before it, or no counts),
 * DDP_EPROTO when it is cut short, 0, or above 65535. */
int ddp__agent_get_hello_port(const uint8_t *body, size_t len, uint32_t *port);

/* Starts and ends a frame in b (as ddp__proto_begin/end for the store). */
size_t ddp__agent_begin(struct ddp_buf *b, uint8_t type);
void ddp__agent_end(struct ddp_buf *b, size_t pos);

/*
 * Takes the next whole frame from b (pending bytes): returns 1 and sets
 * type/body/len (pointing into b), 0 if incomplete, DDP_EPROTO if the length
 * is out of range.
 */
int ddp__agent_next(struct ddp_buf *b, uint8_t *type, const uint8_t **body, size_t *len);

#endif
