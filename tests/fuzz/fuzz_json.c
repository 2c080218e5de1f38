/*
 * libFuzzer target for the JSON reader (common/json.c) and base64 (common/base64.c), what the
 * etcd client reads every answer with: arbitrary bytes must parse or be refused, never crash;
 * a parse's tokens lie inside the input, each token's `next` lies after it, and every string
 * unescapes into a buffer of its own size.
 */
#include "common/base64.h"
#include "common/json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ddp_json j;
    if (ddp_json_parse((const char *)data, size, &j) == 0) {
        if (j.n == 0 || j.tok[0].next != j.n)
            abort();
        for (uint32_t t = 0; t < j.n; t++) {
            const struct ddp_jtok *k = &j.tok[t];
            if (k->start > k->end || k->end > size || k->next <= t || k->next > j.n)
                abort();
            if (k->type == DDP_J_STRING) {
                size_t cap = (size_t)(k->end - k->start) + 1;
                char *s = malloc(cap);
                if (s && ddp_json_str(&j, (int)t, s, cap) < 0)
                    abort(); /* unescaping never makes a string longer */
                free(s);
            }
            int64_t v;
            (void)ddp_json_i64(&j, (int)t, &v);
            if (k->type == DDP_J_OBJECT)
                (void)ddp_json_get(&j, (int)t, "key");
            if (k->type == DDP_J_ARRAY && k->count)
                if (ddp_json_at(&j, (int)t, k->count - 1) < 0)
                    abort();
        }
        ddp_json_free(&j);
    }
    uint8_t *out = malloc(size / 4 * 3 + 1);
    long n = out ? ddp_b64_decode((const char *)data, size, out) : -1;
    if (n > (long)(size / 4 * 3))
        abort();
    if (n >= 0) { /* what decodes encodes back to the same text */
        char *enc = malloc(ddp_b64_size((size_t)n));
        if (enc && (ddp_b64_encode(out, (size_t)n, enc) != size || memcmp(enc, data, size)))
            abort();
        free(enc);
    }
    free(out);
    return 0;
}
