/*
 * The reducer's overlap rule (reducer/overlap.c) on machine shapes this test machine is not:
 * when a bucket's all-reduce starts during backward, and DDP_REDUCER_OVERLAP's say.
 */
#include "reducer/overlap.h"
#include "tests/unit/test.h"

TEST(overlap_pays_with_a_device_a_network_or_a_core_to_spare)
{
    /* one node, CPU: only with 2 cores per local rank */
    ASSERT_TRUE(!ddp__overlap_pays(false, 2, 2, 2, 2)); /* this VM: 2 ranks on 2 cores */
    ASSERT_TRUE(!ddp__overlap_pays(false, 2, 2, 2, 1));
    ASSERT_TRUE(!ddp__overlap_pays(false, 8, 8, 8, 15));
    ASSERT_TRUE(ddp__overlap_pays(false, 2, 2, 2, 4));
    ASSERT_TRUE(ddp__overlap_pays(false, 8, 8, 8, 64));
    ASSERT_TRUE(ddp__overlap_pays(false, 1, 1, 1, 2));
    /* a GPU group, or ranks on other nodes (a network to wait for): always */
    ASSERT_TRUE(ddp__overlap_pays(true, 8, 8, 8, 1));
    ASSERT_TRUE(ddp__overlap_pays(false, 4, 2, 2, 2));
    /* bound (--bind-to core): the rank's own CPUs, shared with nobody or a few */
    ASSERT_TRUE(!ddp__overlap_pays(false, 2, 2, 1, 1)); /* this VM: a core each */
    ASSERT_TRUE(ddp__overlap_pays(false, 8, 8, 1, 2));
    ASSERT_TRUE(!ddp__overlap_pays(false, 8, 8, 2, 2)); /* oversubscribed: two on a core pair */
}
