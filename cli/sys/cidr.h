/* Address ranges for the ports ddprun serves to other machines (metrics.allow): "10.0.0.0/8",
 * "fd00::/8", or one address ("192.0.2.7", "::1"). */
#ifndef DDP_CLI_SYS_CIDR_H
#define DDP_CLI_SYS_CIDR_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

struct ddp__cidr {
    int family; /* AF_INET or AF_INET6 */
    uint8_t addr[16];
    int bits;
};

/* 0, or -1 when s is not an address or range (numeric, the prefix within the family's bits). */
int ddp__cidr_parse(const char *s, struct ddp__cidr *out);
/* Whether the peer's address is in one of the n ranges (an IPv4 peer on an IPv6 socket,
 * ::ffff:a.b.c.d, is matched as IPv4). */
bool ddp__cidr_match(const struct ddp__cidr *c, int n, const struct sockaddr_storage *peer);
/* Whether host (numeric, or "localhost") is a loopback address. */
bool ddp__host_is_loopback(const char *host);

#endif
