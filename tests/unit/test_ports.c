/*
 * MASTER_PORT for rank 0's own TCPStore (cli/sys/sys.c, ddp__free_port): the ports outside the
 * kernel's ephemeral range from ip_local_port_range's text, and real draws on this machine,
 * each below (or above) the running kernel's range and bindable as TCPStore binds.
 */
#include "cli/sys/sys.h"
#include "tests/unit/test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

TEST(the_pool_lies_below_the_ephemeral_range_else_above_it)
{
    int lo = 0, hi = 0;
    ASSERT_TRUE(ddp__port_pool("32768\t60999\n", &lo, &hi));
    ASSERT_EQ(lo, DDP__PORT_POOL_FLOOR);
    ASSERT_EQ(hi, 32767);
    ASSERT_TRUE(ddp__port_pool("11000 60999", &lo, &hi)); /* exactly DDP__PORT_POOL_MIN below */
    ASSERT_EQ(lo, 10000);
    ASSERT_EQ(hi, 10999);
    ASSERT_TRUE(ddp__port_pool("10500 60999", &lo, &hi)); /* too few below: above */
    ASSERT_EQ(lo, 61000);
    ASSERT_EQ(hi, 65535);
    ASSERT_TRUE(!ddp__port_pool("1024 65000", &lo, &hi)); /* room on neither side */
    const char *bad[] = {"", "32768", "x y", "60999 32768", "0 100", "32768 70000", NULL};
    for (int i = 0; i < 7; i++)
        ASSERT_TRUE(!ddp__port_pool(bad[i], &lo, &hi));
}

/* 20 draws: each in the pool of this kernel's range, and a listener with SO_REUSEADDR can bind
 * it on every address (as TCPStore does) right after. */
TEST(drawn_ports_are_outside_the_kernels_range_and_bindable)
{
    char range[64] = "";
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    ASSERT_TRUE(f != NULL);
    ASSERT_TRUE(fgets(range, sizeof(range), f) != NULL);
    fclose(f);
    int lo, hi;
    bool pool = ddp__port_pool(range, &lo, &hi);
    for (int i = 0; i < 20; i++) {
        int p = ddp__free_port();
        ASSERT_TRUE(p > 0);
        if (pool) {
            ASSERT_GE(p, lo);
            ASSERT_LE(p, hi);
        }
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
        ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
        ASSERT_EQ(listen(fd, 1), 0);
        close(fd);
    }
}
