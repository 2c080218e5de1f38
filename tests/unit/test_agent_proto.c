/*
 * The launcher-agent frames a new launcher depends on (cli/proto/agent_proto.c): JOIN with its
 * takeover wait, and STATE, what a rejoined agent says of its ranks. Each decodes to what was
 * encoded, and every shorter or longer body is refused.
 */
#include "cli/proto/agent_proto.h"
#include "common/err.h"
#include "common/util.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

/* The body of the one frame in b (after the type byte), checking the type. */
static const uint8_t *body_of(struct ddp_buf *b, uint8_t want, size_t *len)
{
    uint8_t type;
    const uint8_t *body;
    if (ddp__agent_next(b, &type, &body, len) != 1 || type != want)
        return NULL;
    return body;
}

TEST(state_round_trips_and_refuses_any_other_length)
{
    struct ddp__agent_state_rank rk[3] = {
        {.pid = 4242, .exited = 1, .code = -9, .runtime_ms = 1234567},
        {.pid = 0, .exited = 1, .exec_failed = 1, .code = 127, .runtime_ms = 3},
        {.pid = 77, .exited = 0}};
    struct ddp__agent_state s = {.node_index = 5,
                                 .incarnation = 3,
                                 .have_start = 1,
                                 .done = 0,
                                 .round = 2,
                                 .rank_offset = 12,
                                 .nlocal = 3,
                                 .ranks = rk,
                                 .dropped = 99};
    struct ddp_buf b;
    ddp_buf_init(&b);
    ASSERT_OK(ddp__agent_put_state(&b, &s));
    size_t len;
    const uint8_t *body = body_of(&b, DDP__AG_STATE, &len);
    ASSERT_TRUE(body != NULL);
    struct ddp__agent_state g;
    ASSERT_OK(ddp__agent_get_state(body, len, &g));
    ASSERT_EQ(g.node_index, 5);
    ASSERT_EQ(g.incarnation, 3);
    ASSERT_EQ(g.have_start, 1);
    ASSERT_EQ(g.done, 0);
    ASSERT_EQ(g.round, 2);
    ASSERT_EQ(g.rank_offset, 12);
    ASSERT_EQ(g.nlocal, 3);
    ASSERT_EQ(g.dropped, 99);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(g.ranks[i].pid, rk[i].pid);
        ASSERT_EQ(g.ranks[i].exited, rk[i].exited);
        ASSERT_EQ(g.ranks[i].exec_failed, rk[i].exec_failed);
        ASSERT_EQ(g.ranks[i].code, rk[i].code);
        ASSERT_EQ(g.ranks[i].runtime_ms, rk[i].runtime_ms);
    }
    free(g.ranks);
    for (size_t k = 0; k < len; k++)
        ASSERT_ERR(ddp__agent_get_state(body, k, &g), DDP_EPROTO);
    uint8_t longer[512];
    memcpy(longer, body, len);
    longer[len] = 0;
    ASSERT_ERR(ddp__agent_get_state(longer, len + 1, &g), DDP_EPROTO);
    /* A rank count the body cannot hold is refused before anything is allocated. */
    memcpy(longer, body, len);
    longer[21] = 0xff; /* nlocal (bytes 18..21, little-endian): its top byte */
    ASSERT_ERR(ddp__agent_get_state(longer, len, &g), DDP_EPROTO);
    ddp_buf_release(&b);
}

TEST(an_idle_agent_says_so_without_ranks)
{
    struct ddp__agent_state s = {.node_index = 1, .incarnation = 1, .nlocal = 4};
    struct ddp_buf b;
    ddp_buf_init(&b);
    ASSERT_OK(ddp__agent_put_state(&b, &s));
    size_t len;
    const uint8_t *body = body_of(&b, DDP__AG_STATE, &len);
    ASSERT_TRUE(body != NULL);
    struct ddp__agent_state g;
    ASSERT_OK(ddp__agent_get_state(body, len, &g));
    ASSERT_EQ(g.have_start, 0);
    ASSERT_EQ(g.nlocal, 0);
    ASSERT_TRUE(g.ranks == NULL);
    ddp_buf_release(&b);
}

TEST(join_carries_the_takeover_wait)
{
    struct ddp__agent_join j = {.token = "t0k",
                                .store_addr = "etcd",
                                .job_id = "job-1",
                                .host_label = "n1",
                                .node_index = 2,
                                .incarnation = 7,
                                .heartbeat_interval_ms = 500,
                                .heartbeat_timeout_ms = 2000,
                                .grace_ms = 10000,
                                .etcd_endpoints = "http://h:2379",
                                .etcd_prefix = "/ddprun/job-1/",
                                .takeover_ms = 60000};
    struct ddp_buf b;
    ddp_buf_init(&b);
    ASSERT_OK(ddp__agent_put_join(&b, &j));
    size_t len;
    const uint8_t *body = body_of(&b, DDP__AG_JOIN, &len);
    ASSERT_TRUE(body != NULL);
    struct ddp__agent_join g;
    ASSERT_OK(ddp__agent_get_join(body, len, &g));
    ASSERT_EQ(g.takeover_ms, 60000);
    ASSERT_EQ(g.incarnation, 7);
    ASSERT_STREQ(g.etcd_prefix, "/ddprun/job-1/");
    ddp__agent_join_release(&g);
    /* the JOIN of an older launcher, without the field, is refused rather than misread */
    ASSERT_ERR(ddp__agent_get_join(body, len - 8, &g), DDP_EPROTO);
    ddp_buf_release(&b);
}

TEST(hello_says_protocol_and_version_and_refuses_what_cannot_be_shown)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    ASSERT_OK(ddp__agent_put_hello(&b, DDP__AG_AGENT_HELLO, "0.1.0", NULL, 0));
    size_t len;
    const uint8_t *body = body_of(&b, DDP__AG_AGENT_HELLO, &len);
    ASSERT_TRUE(body != NULL);
    uint32_t proto = 0;
    char ver[DDP__AGENT_VERSION_MAX + 1];
    ASSERT_OK(ddp__agent_get_hello(body, len, &proto, ver, sizeof(ver)));
    ASSERT_EQ(proto, DDP__AGENT_PROTO);
    ASSERT_STREQ(ver, "0.1.0");
    /* a later protocol's fields after the version are skipped: its number can still be read */
    uint8_t later[64];
    memcpy(later, body, len);
    memcpy(later + len, "more", 4);
    ASSERT_OK(ddp__agent_get_hello(later, len + 4, &proto, ver, sizeof(ver)));
    /* cut anywhere, it is refused */
    for (size_t k = 0; k < len; k++)
        ASSERT_ERR(ddp__agent_get_hello(body, k, &proto, ver, sizeof(ver)), DDP_EPROTO);
    ddp_buf_release(&b);
    /* versions a message could not show: empty, a control byte, a space, too long (65) */
    char long_ver[DDP__AGENT_VERSION_MAX + 2];
    memset(long_ver, '7', sizeof(long_ver) - 1);
    long_ver[sizeof(long_ver) - 1] = '\0';
    const char *bad[] = {"", "0.1\n", "0 1", long_ver};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ddp_buf_init(&b);
        ASSERT_OK(ddp__agent_put_hello(&b, DDP__AG_HELLO, bad[i], NULL, 0));
        body = body_of(&b, DDP__AG_HELLO, &len);
        ASSERT_TRUE(body != NULL);
        ASSERT_ERR(ddp__agent_get_hello(body, len, &proto, ver, sizeof(ver)), DDP_EPROTO);
        ddp_buf_release(&b);
    }
}

TEST(an_agents_hello_carries_its_nodes_counts)
{
    struct ddp_buf b;
    ddp_buf_init(&b);
    struct ddp__node_counts in = {.slurm_gpus = -1, .cvd_gpus = 3, .driver_gpus = 8, .cpus = 96},
                            out;
    ASSERT_OK(ddp__agent_put_hello(&b, DDP__AG_AGENT_HELLO, "0.1.0", &in, 23456));
    size_t len;
    const uint8_t *body = body_of(&b, DDP__AG_AGENT_HELLO, &len);
    ASSERT_TRUE(body != NULL);
    uint32_t proto;
    char ver[DDP__AGENT_VERSION_MAX + 1];
    ASSERT_OK(ddp__agent_get_hello(body, len, &proto, ver, sizeof(ver)));
    ASSERT_STREQ(ver, "0.1.0");
    memset(&out, 0x55, sizeof(out));
    ASSERT_OK(ddp__agent_get_hello_counts(body, len, &out));
    ASSERT_EQ(out.slurm_gpus, -1);
    ASSERT_EQ(out.cvd_gpus, 3);
    ASSERT_EQ(out.driver_gpus, 8u);
    ASSERT_EQ(out.cpus, 96u);
    /* CUDA_VISIBLE_DEVICES=1,2,3 wins over the driver's 8 (as CUDA shows them to the ranks),
     * SLURM_GPUS_ON_NODE over both */
    ASSERT_EQ(ddp__counts_gpus(&out), 3);
    ASSERT_EQ(ddp__counts_slots(&out, DDP_NPROC_AUTO), 3);
    ASSERT_EQ(ddp__counts_slots(&out, DDP_NPROC_CPU), 96);
    out.slurm_gpus = 2;
    ASSERT_EQ(ddp__counts_slots(&out, DDP_NPROC_GPU), 2);
    out.slurm_gpus = -1;
    out.cvd_gpus = 0; /* CUDA_VISIBLE_DEVICES="" or -1: none, whatever the driver has */
    ASSERT_EQ(ddp__counts_slots(&out, DDP_NPROC_GPU), 0);
    ASSERT_EQ(ddp__counts_slots(&out, DDP_NPROC_AUTO), 96); /* torchrun's auto: the CPUs */
    /* the port free on its node, after the counts */
    uint32_t port = 0;
    ASSERT_OK(ddp__agent_get_hello_port(body, len, &port));
    ASSERT_EQ(port, 23456u);
    /* cut inside the counts: refused; the version alone: no counts (an older agent) */
    size_t bare = len - 20;
    ASSERT_EQ(ddp__agent_get_hello_counts(body, bare, &out), 1);
    ASSERT_EQ(ddp__agent_get_hello_port(body, bare, &port), 1);
    for (size_t k = bare + 1; k < bare + 16; k++) {
        ASSERT_ERR(ddp__agent_get_hello_counts(body, k, &out), DDP_EPROTO);
        ASSERT_ERR(ddp__agent_get_hello_port(body, k, &port), DDP_EPROTO);
    }
    /* the counts without the port (an agent before it): counts, and no port */
    ASSERT_OK(ddp__agent_get_hello_counts(body, bare + 16, &out));
    ASSERT_EQ(ddp__agent_get_hello_port(body, bare + 16, &port), 1);
    for (size_t k = bare + 17; k < len; k++)
        ASSERT_ERR(ddp__agent_get_hello_port(body, k, &port), DDP_EPROTO);
    /* a later protocol's fields after the port are skipped */
    uint8_t later[128];
    memcpy(later, body, len);
    memcpy(later + len, "more", 4);
    ASSERT_OK(ddp__agent_get_hello_counts(later, len + 4, &out));
    ASSERT_EQ(out.cpus, 96u);
    ASSERT_OK(ddp__agent_get_hello_port(later, len + 4, &port));
    ASSERT_EQ(port, 23456u);
    /* no port at all, or past 65535: refused */
    memcpy(later, body, len);
    memset(later + len - 4, 0, 4);
    ASSERT_ERR(ddp__agent_get_hello_port(later, len, &port), DDP_EPROTO);
    later[len - 2] = 1; /* 65536 in little-endian, 256 Ki in the other order */
    ASSERT_ERR(ddp__agent_get_hello_port(later, len, &port), DDP_EPROTO);
    /* counts no node has: refused */
    memcpy(later, body, len);
    later[bare + 4] = 0x7f; /* CUDA_VISIBLE_DEVICES's count: above 4096 in either byte order */
    later[bare + 5] = 0x7f;
    ASSERT_ERR(ddp__agent_get_hello_counts(later, len, &out), DDP_EPROTO);
    ddp_buf_release(&b);
}

TEST(counts_from_the_variables_as_cuda_and_slurm_give_them)
{
    ASSERT_EQ(ddp__cvd_gpus_of(NULL), -1);
    ASSERT_EQ(ddp__cvd_gpus_of(""), 0);
    ASSERT_EQ(ddp__cvd_gpus_of("-1"), 0);
    ASSERT_EQ(ddp__cvd_gpus_of("0"), 1);
    ASSERT_EQ(ddp__cvd_gpus_of("GPU-8e1f2a44-aaaa,GPU-77b0c1d2-bbbb"), 2);
    ASSERT_EQ(ddp__slurm_gpus_of(NULL), -1);
    ASSERT_EQ(ddp__slurm_gpus_of("4"), 4);
    ASSERT_EQ(ddp__slurm_gpus_of("0"), -1);
    ASSERT_EQ(ddp__slurm_gpus_of("4x"), -1);
    ASSERT_EQ(ddp__slurm_gpus_of("99999"), -1);
    struct ddp__node_counts c;
    ddp__counts_here(&c);
    ASSERT_TRUE(c.cpus >= 1);
    ASSERT_STREQ(ddp__nproc_kind_name(DDP_NPROC_AUTO), "auto");
}

TEST(utf8_prefix_ends_between_characters)
{
    /* the cut of an error's message for the launcher's one-line reports (common/util.h) */
    const char *s = "ab\xc3\xa9\xe2\x82\xac!"; /* a b e-acute euro ! */
    size_t want[] = {0, 1, 2, 2, 4, 4, 4, 7, 8, 8};
    for (size_t max = 0; max < sizeof(want) / sizeof(want[0]); max++)
        ASSERT_EQ(ddp_utf8_prefix(s, max), want[max]);
}
