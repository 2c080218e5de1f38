/*
 * PyTorch's TCPStore requests, parsed (rendezvous/torch_wire.c): for the store's TCPStore port
 * (rendezvous/server_torch.c) and for the node agents that relay their ranks' TCPStore requests
 * to the store (cli/agent/torch_proxy.c).
 *
 * The protocol (written from its description in ../shared/reference, read in torch's c10d
 * sources): no framing, no authentication; a request is a 1-byte op and its fields, integers
 * little-endian, strings as a u64 length and the bytes. Two numberings: torch 1.13's (SET 0 ...
 * DELETE_KEY 8, which 2.0 and 2.1 extend with APPEND 9 ... CANCEL_WAIT 12) and that of torch 2.2
 * and later, whose clients begin with VALIDATE (0 and the magic 0x3C85F7CE); the first request
 * tells which.
 */
#ifndef DDP_RENDEZVOUS_TORCH_WIRE_H
#define DDP_RENDEZVOUS_TORCH_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DDP__TORCH_MAGIC 0x3C85F7CEu
#define DDP__TORCH_MAX_KEY 8192u
#define DDP__TORCH_MAX_VALUE (16u << 20)
#define DDP__TORCH_MAX_KEYS 65536u
/* A whole request: any one SET fits; a request still not whole past it is refused, so that one
 * connection never holds more than this in its input. */
#define DDP__TORCH_MAX_REQUEST (DDP__TORCH_MAX_VALUE + (1u << 20))

enum ddp__top {
    DDP__T_SET,
    DDP__T_CAS,
    DDP__T_GET,
    DDP__T_ADD,
    DDP__T_CHECK,
    DDP__T_WAIT,
    DDP__T_NUMKEYS,
    DDP__T_DELETE,
    DDP__T_APPEND,
    DDP__T_MULTI_GET,
    DDP__T_MULTI_SET,
    DDP__T_CANCEL_WAIT,
    DDP__T_PING,
    DDP__T_VALIDATE,
};

/* A connection's numbering, learnt from its first request. */
struct ddp__tconn {
    bool known, v22;
};

/* One whole request; pointers refer into the bytes it was parsed from. */
struct ddp__treq {
    enum ddp__top op;
    const uint8_t *k, *v, *v2; /* the key; SET and APPEND's value, CAS's expected; CAS's desired */
    uint32_t kl, vl, v2l;
    uint32_t u32; /* PING's nonce */
    uint64_t u64; /* ADD's delta (two's complement); the keys of CHECK, WAIT and MULTI_GET, or
                   * the pairs of MULTI_SET */
    const uint8_t *list; /* those keys, or key and value pairs, each a u64 length and the bytes */
    size_t len;          /* the request's bytes */
};

/*
 * The request at the front of p[0, len): 1 with q filled, 0 when it is not whole yet, -1 with
 * *why when the connection must end (an op not served, a field over its limit, VALIDATE with
 * another magic, a request not whole within DDP__TORCH_MAX_REQUEST).
 */
int ddp__torch_parse(struct ddp__tconn *t, const uint8_t *p, size_t len, struct ddp__treq *q,
                     const char **why);

/* The next string of q's list from *off (0 first): its bytes, the offset moved past it. */
void ddp__torch_list_next(const struct ddp__treq *q, size_t *off, const uint8_t **s, uint32_t *n);

#endif
