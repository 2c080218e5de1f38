/* Base64 (common/base64.h). */
#include "common/base64.h"

#include <stdbool.h>
#include <stdint.h>

#include "common/banned.h"

static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t ddp_b64_encode(const void *src, size_t n, char *out)
{
    const uint8_t *s = src;
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        out[o++] = abc[v >> 18];
        out[o++] = abc[v >> 12 & 63];
        out[o++] = abc[v >> 6 & 63];
        out[o++] = abc[v & 63];
    }
    if (n - i) {
        uint32_t v = (uint32_t)s[i] << 16 | (n - i == 2 ? (uint32_t)s[i + 1] << 8 : 0);
        out[o++] = abc[v >> 18];
        out[o++] = abc[v >> 12 & 63];
        out[o++] = n - i == 2 ? abc[v >> 6 & 63] : '=';
        out[o++] = '=';
    }
    out[o] = '\0';
    return o;
}

static int val(char c)
{
    return c >= 'A' && c <= 'Z'   ? c - 'A'
           : c >= 'a' && c <= 'z' ? c - 'a' + 26
           : c >= '0' && c <= '9' ? c - '0' + 52
           : c == '+'             ? 62
           : c == '/'             ? 63
                                  : -1;
}

long ddp_b64_decode(const char *s, size_t n, void *out)
{
    uint8_t *o = out;
    size_t len = 0;
    if (n % 4)
        return -1;
    for (size_t i = 0; i < n; i += 4) {
        int a = val(s[i]), b = val(s[i + 1]), c = val(s[i + 2]), d = val(s[i + 3]);
        bool last = i + 4 == n;
        if (a < 0 || b < 0)
            return -1;
        if (c < 0 && !(last && s[i + 2] == '=' && s[i + 3] == '='))
            return -1;
        if (d < 0 && !(last && s[i + 3] == '='))
            return -1;
        /* the bits a padded group leaves unused must be 0: one text per byte string */
        if ((c < 0 && (b & 15)) || (c >= 0 && d < 0 && (c & 3)))
            return -1;
        uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)(c < 0 ? 0 : c) << 6 |
                     (uint32_t)(d < 0 ? 0 : d);
        o[len++] = (uint8_t)(v >> 16);
        if (c >= 0)
            o[len++] = (uint8_t)(v >> 8);
        if (d >= 0)
            o[len++] = (uint8_t)v;
    }
    return (long)len;
}
