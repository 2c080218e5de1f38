/* Base64 (RFC 4648, with padding): how etcd's JSON gateway carries keys and values. */
#ifndef DDP_COMMON_BASE64_H
#define DDP_COMMON_BASE64_H

#include <stddef.h>

/* The encoded length of n bytes, with its NUL. */
static inline size_t ddp_b64_size(size_t n)
{
    return (n + 2) / 3 * 4 + 1;
}

/* Encodes src[0..n) into out (ddp_b64_size(n) bytes), NUL-terminated; the length. */
size_t ddp_b64_encode(const void *src, size_t n, char *out);
/* Decodes s[0..n) into out (at least n / 4 * 3 bytes); the length, or -1 when s is not
 * base64. */
long ddp_b64_decode(const char *s, size_t n, void *out);

#endif
