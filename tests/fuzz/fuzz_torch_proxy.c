/*
 * libFuzzer target for the agents' TCPStore proxy (cli/agent/torch_proxy.c): an input is a
 * client's bytes, then (after the first "\n--\n", if any) the store's answers. Each request the
 * proxy takes must become store requests that the store's own parser accepts; each is answered
 * with the next answer of the input (u8 selects a status, u8 length, then that many payload
 * bytes), hostile or not, until the input ends. Nothing may crash, leak or loop, and bytes are
 * consumed only as whole requests.
 */
#include "cli/agent/torch_proxy.h"
#include "common/err.h"
#include "rendezvous/proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static const int statuses[] = {0, DDP_ENOKEY, DDP_ENOTINT, DDP_EINVAL, DDP_ECONNECT, DDP_ETIMEDOUT};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *sep = NULL;
    for (size_t i = 0; i + 4 <= size; i++)
        if (!memcmp(data + i, "\n--\n", 4)) {
            sep = data + i;
            break;
        }
    size_t cn = sep ? (size_t)(sep - data) : size;
    const uint8_t *ans = sep ? sep + 4 : data + size;
    size_t an = (size_t)(data + size - ans), ao = 0;
    struct ddp__tp t;
    ddp__tp_init(&t, data[0] % 3);
    struct ddp_buf frames, out;
    ddp_buf_init(&frames);
    ddp_buf_init(&out);
    size_t off = 0;
    for (int guard = 0; guard < 100000; guard++) {
        if (ddp_buf_pending(&frames) == 0) {
            frames.len = frames.off = 0;
            size_t used = 0;
            const char *why = NULL;
            int r = ddp__tp_request(&t, data + off, cn - off, &used, &frames, &out, &why);
            if (r < 0 && !why)
                abort(); /* the connection ends with a reason */
            if (r <= 0)
                break;
            if (used == 0 || used > cn - off)
                abort();
            off += used;
            continue;
        }
        long sz = ddp__proto_frame_size(frames.data + frames.off, ddp_buf_pending(&frames),
                                        DDP__MAX_FRAME);
        struct ddp__req q;
        if (sz <= 0 || ddp__proto_parse_req(frames.data + frames.off, (size_t)sz, &q) != 0)
            abort(); /* what the proxy sends, the store must accept */
        frames.off += (size_t)sz;
        if (ao + 2 > an)
            break; /* the store never answers: the connection ends with the request in hand */
        int st = statuses[ans[ao] % (sizeof(statuses) / sizeof(statuses[0]))];
        size_t pl = ans[ao + 1];
        ao += 2;
        if (pl > an - ao)
            pl = an - ao;
        const char *why = NULL;
        int r = ddp__tp_reply(&t, st, ans + ao, pl, &frames, &out, &why);
        ao += pl;
        if (r < 0) {
            if (!why)
                abort();
            break;
        }
        if (ddp_buf_pending(&frames) == 0 && ddp__tp_waiting(&t))
            abort(); /* answered, yet still waiting */
    }
    ddp__tp_free(&t);
    ddp_buf_release(&frames);
    ddp_buf_release(&out);
    return 0;
}
