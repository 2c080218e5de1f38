/*
 * PyTorch's TCPStore requests put into the store's own (cli/agent/torch_proxy.c), for the node's
 * store proxy (cli/agent/store_proxy.h): a PyTorch rank's TCPStore client (MASTER_ADDR and
 * MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True) talks to its agent, whose proxy sends the
 * store what the launcher's TCPStore port would have done with it (rendezvous/server_torch.c):
 * the same keys, under "torch/<round>/", the same answers, both numberings. So the ranks'
 * barriers, waits and reads are combined with the node's others, and the launcher's store sees
 * the agent's connections only.
 *
 * A request becomes one or more of the store's, sent one at a time: SET, GET, ADD, CHECK, WAIT
 * (for ever), MULTI_GET, DELETE and NUM_KEYS (with the round's prefix) one each; MULTI_SET one
 * SET per pair; TCPStore's COMPARE_SET a CAS (and a second where an empty expected value meets a
 * present empty one); APPEND a GET and a CAS, again until the CAS swaps. VALIDATE, PING and
 * CANCEL_WAIT are answered here. Keys go up with the round's prefix, at most the store's 4 KiB.
 */
#ifndef DDP_CLI_AGENT_TORCH_PROXY_H
#define DDP_CLI_AGENT_TORCH_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "rendezvous/torch_wire.h"

/* One TCPStore client's connection: its numbering, its round's key space, the request in hand. */
struct ddp__tp {
    struct ddp__tconn w;
    char prefix[32]; /* "torch/<round>/" */
    uint32_t plen;
    bool active; /* a request is being answered */
    enum ddp__top op;
    int stage;
    uint64_t left;  /* MULTI_SET: SETs not answered yet; MULTI_GET: its keys */
    uint8_t *key;   /* CAS and APPEND: the key (prefixed), */
    uint8_t *a, *b; /* APPEND's suffix, or CAS's expected and desired values */
    uint32_t kl, al, bl;
};

/* A connection in round's key space. */
void ddp__tp_init(struct ddp__tp *t, int round);
void ddp__tp_free(struct ddp__tp *t);

/*
 * Takes the request at the front of in[0, len) when it is whole and none is in hand: 1 with
 * *used its bytes, the store's requests it needs appended to frames (ids 0) and an answer that
 * needs none to out; 0 when it is not whole yet; -1 with *why when the connection must end.
 */
int ddp__tp_request(struct ddp__tp *t, const uint8_t *in, size_t len, size_t *used,
                    struct ddp_buf *frames, struct ddp_buf *out, const char **why);

/*
 * The store's answer (status, payload) to the request last taken from frames: the client's
 * answer to out once the request is done, or the next of the store's requests to frames; 0, or
 * -1 with *why when the connection must end.
 */
int ddp__tp_reply(struct ddp__tp *t, int status, const uint8_t *p, size_t n, struct ddp_buf *frames,
                  struct ddp_buf *out, const char **why);

/* A WAIT is in hand: a request after it means the client gave it up (1.13's clients say no
 * more); the caller forgets the store's WAIT, and this the request. */
bool ddp__tp_waiting(const struct ddp__tp *t);
void ddp__tp_give_up(struct ddp__tp *t);

#endif
