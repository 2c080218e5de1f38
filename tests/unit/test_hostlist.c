/*
 * Slurm's host lists and count lists (cli/sys/hostlist.c). The expected expansions are those of
 * `scontrol show hostnames` (Slurm 22.05); bats 80-slurm compares with scontrol itself where
 * it is installed.
 */
#include "cli/sys/hostlist.h"
#include "test.h"

/* The expansion joined by spaces, or "ERR: why". */
static char *expand(const char *list)
{
    static char out[1 << 16];
    char **h, why[512];
    size_t n;
    if (ddp__hostlist_expand(list, &h, &n, why, sizeof(why)) < 0) {
        snprintf(out, sizeof(out), "ERR: %s", why);
        return out;
    }
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof(out) - 300; i++)
        len += (size_t)snprintf(out + len, sizeof(out) - len, "%s%s", i ? " " : "", h[i]);
    ddp__hostlist_free(h, n);
    return out;
}

TEST(host_lists_expand_as_slurm_does)
{
    ASSERT_STREQ(expand("n1"), "n1");
    ASSERT_STREQ(expand("n[1-3]"), "n1 n2 n3");
    ASSERT_STREQ(expand("x[8-11],y[009-011],z"), "x8 x9 x10 x11 y009 y010 y011 z");
    ASSERT_STREQ(expand("n[1,3-4,02]"), "n1 n3 n4 n02");
    ASSERT_STREQ(expand("n[1-010]"), "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10"); /* width of the first */
    ASSERT_STREQ(expand("n[09-10]"), "n09 n10");
    ASSERT_STREQ(expand("a[1-2]b[3-4]"), "a1b3 a1b4 a2b3 a2b4");
    ASSERT_STREQ(expand("n[1-2][3-4]"), "n13 n14 n23 n24");
    /* text after the last bracket: Slurm 22.05's scontrol refuses it, we take it */
    ASSERT_STREQ(expand("gpu[01-02]-ib,io5"), "gpu01-ib gpu02-ib io5");
    ASSERT_STREQ(expand("[1-2]"), "1 2");
    ASSERT_STREQ(expand("n[007]"), "n007");
    ASSERT_STREQ(expand("a,,b"), "a b");
    ASSERT_STREQ(expand(" a, b"), "a b");
    ASSERT_STREQ(expand("a b"), "a b");
    ASSERT_STREQ(expand("n[1-2],n[1-2]"), "n1 n2 n1 n2"); /* as Slurm: no deduplication */
    ASSERT_STREQ(expand("rack[1-2]-n[01-02]"), "rack1-n01 rack1-n02 rack2-n01 rack2-n02");
}

TEST(malformed_host_lists_say_what_is_wrong)
{
    ASSERT_STREQ(expand("n[5-3]"), "ERR: the range '5-3' in 'n[5-3]' goes down");
    ASSERT_STREQ(expand("n[1-3"), "ERR: '[' without ']' in 'n[1-3'");
    ASSERT_STREQ(expand("n[1-2]]"), "ERR: ']' without '[' in 'n[1-2]]'");
    ASSERT_STREQ(expand("n[]"), "ERR: empty brackets in 'n[]'");
    ASSERT_STREQ(expand("n[a-b]"),
                 "ERR: 'a-b' in 'n[a-b]' is not a number or a range of numbers such as 01-16");
    ASSERT_STREQ(expand("n[1-3-5]"),
                 "ERR: '1-3-5' in 'n[1-3-5]' is not a number or a range of numbers such as 01-16");
    ASSERT_STREQ(expand("n[[1]]"), "ERR: brackets inside brackets in 'n[[1]]'");
    ASSERT_STREQ(expand("n[0-70000]"), "ERR: the host list names more than 65536 hosts");
    ASSERT_STREQ(expand("a[0-999]b[0-999]"), "ERR: the host list names more than 65536 hosts");
    ASSERT_STREQ(expand("n[1-9999999999]"), "ERR: '1-9999999999' in 'n[1-9999999999]' is not a "
                                            "number or a range of numbers such as 01-16");
    ASSERT_STREQ(expand(""), "ERR: the host list is empty");
    ASSERT_STREQ(expand(" , "), "ERR: the host list is empty");
    /* exactly the limit is fine */
    char **h, why[256];
    size_t n;
    ASSERT_EQ(ddp__hostlist_expand("n[1-65536]", &h, &n, why, sizeof(why)), 0);
    ASSERT_EQ(n, 65536);
    ASSERT_STREQ(h[65535], "n65536");
    ddp__hostlist_free(h, n);
}

TEST(count_lists)
{
    int c[8], rc;
    char why[256];
    ASSERT_EQ(ddp__counts_expand("2(x3),1", c, 4, why, sizeof(why)), 0);
    ASSERT_TRUE(c[0] == 2 && c[1] == 2 && c[2] == 2 && c[3] == 1);
    ASSERT_EQ(ddp__counts_expand("4", c, 1, why, sizeof(why)), 0);
    ASSERT_EQ(c[0], 4);
    ASSERT_EQ(ddp__counts_expand("8(x2)", c, 2, why, sizeof(why)), 0);
    ASSERT_TRUE(c[0] == 8 && c[1] == 8);
    rc = ddp__counts_expand("2(x3),1", c, 3, why, sizeof(why));
    ASSERT_EQ(rc, -1);
    ASSERT_STREQ(why, "'2(x3),1' gives more than the 3 nodes of the host list");
    rc = ddp__counts_expand("2(x3)", c, 5, why, sizeof(why));
    ASSERT_EQ(rc, -1);
    ASSERT_STREQ(why, "'2(x3)' gives 3 counts for 5 nodes");
    const char *bad[] = {"", "x", "2(3)", "2(x)", "2(x3", "2,", "2(x0)", "-1", "2;1", "2(x3)x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (ddp__counts_expand(bad[i], c, 8, why, sizeof(why)) != -1)
            FAIL_AT("'%s' was taken", bad[i]);
        if (!strstr(why, "is not a count list such as 2(x3),1"))
            FAIL_AT("'%s': %s", bad[i], why);
    }
}
