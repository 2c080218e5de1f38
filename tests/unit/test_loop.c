/* Unit tests for common/loop.c (timers, fd callbacks) and common/htab.c. */
#include "common/htab.h"
#include "common/util.h"
#include "common/loop.h"
#include "tests/unit/test.h"

#include <unistd.h>

#include "common/banned.h"

struct rec {
    struct ddp_timer t;
    int id;
    int *order;
    int *n;
};

static void fire(struct ddp_loop *l, struct ddp_timer *t)
{
    (void)l;
    struct rec *r = (struct rec *)t;
    r->order[(*r->n)++] = r->id;
}

TEST(timers_fire_in_deadline_order_and_stop_works)
{
    struct ddp_loop *l;
    ASSERT_OK(ddp_loop_new(&l));
    int order[8], n = 0;
    struct rec r[5];
    int ms[5] = {40, 10, 30, 20, 50};
    for (int i = 0; i < 5; i++) {
        r[i].id = i;
        r[i].order = order;
        r[i].n = &n;
        ddp_timer_init(&r[i].t, fire);
        ASSERT_OK(ddp_timer_start(l, &r[i].t, ms[i]));
    }
    ddp_timer_stop(l, &r[2].t); /* 30 ms one never fires */
    ASSERT_TRUE(!ddp_timer_armed(&r[2].t));
    int64_t t0 = ddp_now_ms();
    while (n < 4 && ddp_now_ms() - t0 < 2000)
        ASSERT_OK(ddp_loop_run_once(l, 100));
    ASSERT_EQ(n, 4);
    ASSERT_EQ(order[0], 1);
    ASSERT_EQ(order[1], 3);
    ASSERT_EQ(order[2], 0);
    ASSERT_EQ(order[3], 4);
    ASSERT_GE(ddp_now_ms() - t0, 45);
    ddp_loop_free(l);
}

static void on_readable(struct ddp_loop *l, int fd, unsigned mask, void *arg)
{
    char c;
    ASSERT_TRUE(mask & DDP_LOOP_READ);
    ASSERT_EQ(read(fd, &c, 1), 1);
    *(char *)arg = c;
    ddp_loop_stop(l);
}

TEST(fd_callback_and_del)
{
    struct ddp_loop *l;
    int p[2];
    char got = 0;
    ASSERT_OK(ddp_loop_new(&l));
    ASSERT_EQ(pipe(p), 0);
    ASSERT_OK(ddp_loop_add(l, p[0], DDP_LOOP_READ, on_readable, &got));
    ASSERT_EQ(write(p[1], "x", 1), 1);
    ASSERT_OK(ddp_loop_run(l));
    ASSERT_EQ(got, 'x');
    ddp_loop_del(l, p[0]);
    ASSERT_EQ(write(p[1], "y", 1), 1);
    got = 0;
    ASSERT_OK(ddp_loop_run_once(l, 50)); /* removed: the callback must not run */
    ASSERT_EQ(got, 0);
    ASSERT_ERR(ddp_loop_modify(l, p[0], DDP_LOOP_READ), DDP_EINVAL);
    close(p[0]);
    close(p[1]);
    ddp_loop_free(l);
}

struct item {
    struct ddp_hnode h;
    char key[16];
    int v;
};

static void count_cb(struct ddp_hnode *n, void *arg)
{
    (void)n;
    (*(int *)arg)++;
}

TEST(htab_insert_find_remove_grow)
{
    struct ddp_htab t;
    ASSERT_OK(ddp_htab_init(&t));
    enum { N = 5000 };
    struct item *items = calloc(N, sizeof(*items));
    for (int i = 0; i < N; i++) {
        int kl = snprintf(items[i].key, sizeof(items[i].key), "key-%d", i);
        items[i].h.key = (const uint8_t *)items[i].key;
        items[i].h.klen = (uint32_t)kl;
        items[i].v = i;
        ASSERT_OK(ddp_htab_insert(&t, &items[i].h));
    }
    ASSERT_EQ(t.count, N);
    ASSERT_GE(t.nslots, N);
    for (int i = 0; i < N; i += 7) {
        char k[16];
        int kl = snprintf(k, sizeof(k), "key-%d", i);
        struct ddp_hnode *h = ddp_htab_find(&t, k, (size_t)kl);
        ASSERT_TRUE(h != NULL);
        ASSERT_EQ(((struct item *)h)->v, i);
    }
    ASSERT_TRUE(ddp_htab_find(&t, "key-", 4) == NULL);
    ASSERT_TRUE(ddp_htab_find(&t, "key-5000", 8) == NULL);
    for (int i = 0; i < N; i += 2)
        ddp_htab_remove(&t, &items[i].h);
    ASSERT_EQ(t.count, N / 2);
    ASSERT_TRUE(ddp_htab_find(&t, "key-2", 5) == NULL);
    ASSERT_TRUE(ddp_htab_find(&t, "key-3", 5) != NULL);
    int visited = 0;
    ddp_htab_foreach(&t, count_cb, &visited);
    ASSERT_EQ(visited, N / 2);
    ddp_htab_release(&t);
    free(items);
}

TEST(parse_hostport)
{
    char h[64];
    int p;
    ASSERT_OK(ddp_parse_hostport("127.0.0.1:29500", h, sizeof(h), &p));
    ASSERT_STREQ(h, "127.0.0.1");
    ASSERT_EQ(p, 29500);
    ASSERT_OK(ddp_parse_hostport("[::1]:0", h, sizeof(h), &p));
    ASSERT_STREQ(h, "::1");
    ASSERT_EQ(p, 0);
    ASSERT_ERR(ddp_parse_hostport("nohost", h, sizeof(h), &p), DDP_EINVAL);
    ASSERT_ERR(ddp_parse_hostport(":80", h, sizeof(h), &p), DDP_EINVAL);
    ASSERT_ERR(ddp_parse_hostport("h:99999", h, sizeof(h), &p), DDP_EINVAL);
    ASSERT_ERR(ddp_parse_hostport("h:8x", h, sizeof(h), &p), DDP_EINVAL);
    ASSERT_ERR(ddp_parse_hostport("[::1]80", h, sizeof(h), &p), DDP_EINVAL);
}
