/* Address ranges (cli/sys/cidr.h). */
#include "cli/sys/cidr.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

int ddp__cidr_parse(const char *s, struct ddp__cidr *out)
{
    char a[64];
    const char *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : strlen(s);
    if (n == 0 || n >= sizeof(a))
        return -1;
    memcpy(a, s, n);
    a[n] = '\0';
    memset(out, 0, sizeof(*out));
    if (inet_pton(AF_INET, a, out->addr) == 1) {
        out->family = AF_INET;
        out->bits = 32;
    } else if (inet_pton(AF_INET6, a, out->addr) == 1) {
        out->family = AF_INET6;
        out->bits = 128;
    } else {
        return -1;
    }
    if (slash) {
        char *end;
        long b = strtol(slash + 1, &end, 10);
        if (!slash[1] || *end || b < 0 || b > out->bits)
            return -1;
        out->bits = (int)b;
    }
    return 0;
}

static bool prefix_eq(const uint8_t *a, const uint8_t *b, int bits)
{
    int whole = bits / 8, rest = bits % 8;
    if (memcmp(a, b, (size_t)whole) != 0)
        return false;
    if (!rest)
        return true;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

bool ddp__cidr_match(const struct ddp__cidr *c, int n, const struct sockaddr_storage *peer)
{
    uint8_t v4[4], v6[16];
    bool is4 = false, is6 = false;
    if (peer->ss_family == AF_INET) {
        memcpy(v4, &((const struct sockaddr_in *)peer)->sin_addr, 4);
        is4 = true;
    } else if (peer->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)peer)->sin6_addr;
        memcpy(v6, a, 16);
        is6 = true;
        if (IN6_IS_ADDR_V4MAPPED(a)) {
            memcpy(v4, v6 + 12, 4);
            is4 = true;
        }
    }
    for (int k = 0; k < n; k++) {
        if (c[k].family == AF_INET && is4 && prefix_eq(c[k].addr, v4, c[k].bits))
            return true;
        if (c[k].family == AF_INET6 && is6 && prefix_eq(c[k].addr, v6, c[k].bits))
            return true;
    }
    return false;
}

bool ddp__host_is_loopback(const char *host)
{
    uint8_t a[16];
    if (strcmp(host, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, host, a) == 1)
        return a[0] == 127;
    if (inet_pton(AF_INET6, host, a) == 1)
        return IN6_IS_ADDR_LOOPBACK((const struct in6_addr *)a);
    return false;
}
