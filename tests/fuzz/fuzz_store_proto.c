/*
 * libFuzzer target for the store's frame parser: arbitrary bytes are cut into
 * frames exactly as the server's read path does (pre- and post-auth limits)
 * and every frame is parsed; a valid parse must describe bytes inside the input.
 */
#include "common/buf.h"
#include "common/err.h"
#include "rendezvous/proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static void check_inside(const uint8_t *base, size_t len, const uint8_t *p, size_t n)
{
    if (n && (p < base || p + n > base + len))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    int frames = 0;
    while (off < size) {
        uint32_t max = frames == 0 ? DDP__MAX_PREAUTH_FRAME : DDP__MAX_FRAME;
        long fs = ddp__proto_frame_size(data + off, size - off, max);
        if (fs <= 0)
            break;
        if ((size_t)fs > size - off || fs < DDP__FRAME_HDR)
            abort();
        /* Copy into an exact-size buffer so ASan catches any read past the frame. */
        uint8_t *f = malloc((size_t)fs);
        memcpy(f, data + off, (size_t)fs);
        struct ddp__req q;
        if (ddp__proto_parse_req(f, (size_t)fs, &q) == 0) {
            check_inside(f, (size_t)fs, q.key, q.klen);
            check_inside(f, (size_t)fs, q.val, q.vlen);
            check_inside(f, (size_t)fs, q.exp, q.elen);
            if (q.op == DDP__OP_HELLO)
                check_inside(f, (size_t)fs, q.nonce, DDP__NONCE_LEN);
            if (q.op == DDP__OP_AUTH)
                check_inside(f, (size_t)fs, q.mac, DDP__MAC_LEN);
            /* The server re-walks key lists without error checks: they must all parse. */
            if (q.nkeys) {
                struct ddp_rd r = q.keys;
                for (uint32_t i = 0; i < q.nkeys; i++) {
                    const uint8_t *k;
                    uint32_t kl;
                    if (ddp_rd_str(&r, DDP__MAX_KEY, &k, &kl) != 0)
                        abort();
                    check_inside(f, (size_t)fs, k, kl);
                }
            }
        }
        free(f);
        off += (size_t)fs;
        frames++;
    }
    return 0;
}
