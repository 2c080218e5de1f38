/*
 * PipeDream's profile format and planner (pipeline/): graph.txt read and written as graph.py
 * does, errors at file:line:col, the antichain states of a branching graph as graph.py builds
 * them (the reference printed by the released graph.py for the same file), and the planner
 * against an exhaustive search over every split and replication of random chains.
 */
#include "pipeline/plan.h"
#include "pipeline/profile.h"
#include "test.h"

#include <math.h>

static const char diamond[] =
    "node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
    "activation_size=100.0, parameter_size=0.000\n"
    "node2 -- Linear(a) -- forward_compute_time=1.000, backward_compute_time=2.000, "
    "activation_size=10.0, parameter_size=1000.000\n"
    "node3 -- Linear(b) -- forward_compute_time=3.000, backward_compute_time=4.000, "
    "activation_size=20.0, parameter_size=2000.000\r\n"
    "\n"
    "node4 -- Linear(c) -- forward_compute_time=5.000, backward_compute_time=6.000, "
    "activation_size=[30.0; 5.0], parameter_size=3000.000 -- stage_id=1\n"
    "node5 -- Add -- forward_compute_time=7.000, backward_compute_time=8.000, "
    "activation_size=40.0, parameter_size=0.000\n"
    "node6 -- __getitem__(0) -- forward_compute_time=0.000, backward_compute_time=0.000, "
    "activation_size=40.0, parameter_size=0.000\n"
    "\tnode1 -- node2\n\tnode2 -- node3\n\tnode2 -- node4\n\tnode3 -- node5\n"
    "\tnode4 -- node5\n\tnode5 -- node6";

static int parse(const char *text, struct ddp_profile *p, char *err, size_t n)
{
    return ddp__profile_parse(text, strlen(text), "g.txt", p, err, n);
}

TEST(profile_reads_graph_py_format)
{
    struct ddp_profile p;
    char err[512];
    ASSERT_OK(parse(diamond, &p, err, sizeof(err)));
    ASSERT_EQ(p.nlayers, 6);
    ASSERT_EQ(p.nedges, 6);
    ASSERT_STREQ(p.layers[3].id, "node4");
    ASSERT_STREQ(p.layers[3].desc, "Linear(c)");
    ASSERT_TRUE(p.layers[3].act_bytes == 35.0); /* a list is its sum */
    ASSERT_EQ(p.layers[3].stage, 1);
    ASSERT_EQ(p.layers[2].stage, -1);
    ASSERT_EQ(p.layers[3].line, 5);
    ASSERT_TRUE(p.layers[4].fwd_ms == 7.0 && p.layers[4].bwd_ms == 8.0);
    ASSERT_EQ(p.edges[2][0], 1);
    ASSERT_EQ(p.edges[2][1], 3);
    ddp__profile_release(&p);
}

static const char *parse_error(const char *text)
{
    static char err[512];
    struct ddp_profile p;
    if (parse(text, &p, err, sizeof(err)) == 0) {
        ddp__profile_release(&p);
        return "(parsed)";
    }
    ASSERT_EQ(p.nlayers, 0);
    return err;
}

#define L1 "n1 -- A -- forward_compute_time=1, backward_compute_time=2, activation_size=3, "
TEST(profile_errors_name_line_and_column)
{
    ASSERT_STREQ(parse_error(""), "g.txt:1:1: no layers: a profile has a line per layer");
    ASSERT_STREQ(parse_error("n1 -- A\n"),
                 "g.txt:1:1: a layer line has 3 to 5 fields separated by ' -- ' (ID -- "
                 "DESCRIPTION -- forward_compute_time=..., ...[ -- stage_id=K[ -- replicas=R]]), "
                 "this one has 2");
    ASSERT_STREQ(parse_error(L1 "parameter_size=x\n"),
                 "g.txt:1:95: parameter_size: 'x' is not a number from 0 to 1e18");
    ASSERT_STREQ(parse_error(L1 "parameter_size=-4\n"),
                 "g.txt:1:95: parameter_size: '-4' is not a number from 0 to 1e18");
    ASSERT_STREQ(parse_error(L1 "parameter_size=nan\n"),
                 "g.txt:1:95: parameter_size: 'nan' is not a number from 0 to 1e18");
    ASSERT_STREQ(parse_error(L1 "weights=4\n"), "g.txt:1:80: expected 'parameter_size=' here");
    ASSERT_STREQ(parse_error("n1 -- A -- forward_compute_time=1, backward_compute_time=2, "
                             "activation_size=[1; x], parameter_size=0\n"),
                 "g.txt:1:77: activation_size: '[1; x]' is not a number from 0 to 1e18 (or a "
                 "list [A; B] of such, summing to at most 1e18)");
    /* found by the fuzzer: two layers of 1e308 ms summed to inf, and the speedup to nan */
    ASSERT_STREQ(parse_error(L1 "parameter_size=1.1e18\n"),
                 "g.txt:1:95: parameter_size: '1.1e18' is not a number from 0 to 1e18");
    ASSERT_STREQ(parse_error("n1 -- A -- forward_compute_time=1, backward_compute_time=2, "
                             "activation_size=[6e17; 6e17], parameter_size=0\n"),
                 "g.txt:1:77: activation_size: '[6e17; 6e17]' is not a number from 0 to 1e18 (or "
                 "a list [A; B] of such, summing to at most 1e18)");
    ASSERT_STREQ(parse_error(L1 "parameter_size=4 -- stage=1\n"),
                 "g.txt:1:100: expected stage_id=K (K >= 0)");
    ASSERT_STREQ(parse_error(L1 "parameter_size=4 -- stage_id=1 -- replicas=0\n"),
                 "g.txt:1:114: expected replicas=R (R >= 1: the workers of the layer's stage)");
    ASSERT_STREQ(parse_error(L1 "parameter_size=4 -- stage_id=1 -- replicas=2 -- x=1\n"),
                 "g.txt:1:1: a layer line has 3 to 5 fields separated by ' -- ' (ID -- "
                 "DESCRIPTION -- forward_compute_time=..., ...[ -- stage_id=K[ -- replicas=R]]), "
                 "this one has more");
    ASSERT_STREQ(parse_error(L1 "parameter_size=4\n" L1 "parameter_size=4\n"),
                 "g.txt:2:1: layer 'n1' is defined twice");
    ASSERT_STREQ(parse_error(L1 "parameter_size=4\n\tn1 -- n2\n"),
                 "g.txt:2:8: edge names layer 'n2', which no line before it defines");
    ASSERT_STREQ(parse_error(L1 "parameter_size=4\n\tn1 n2\n"),
                 "g.txt:2:2: an edge line is '<TAB>FROM -- TO'");
    ASSERT_STREQ(parse_error(L1 "parameter_size=4\n"
                                "n2 -- B -- forward_compute_time=1, backward_compute_time=2, "
                                "activation_size=3, parameter_size=4\n\tn1 -- n2\n\tn2 -- n1\n"),
                 "g.txt:1:1: the edges make a cycle through layer 'n1'");
    char nul[200];
    size_t n = (size_t)snprintf(nul, sizeof(nul), "%s", L1 "parameter_size=4\n");
    nul[5] = '\0';
    struct ddp_profile p;
    char err[256];
    ASSERT_ERR(ddp__profile_parse(nul, n, "g.txt", &p, err, sizeof(err)), DDP_EINVAL);
    ASSERT_STREQ(err, "g.txt:1:1: a NUL byte: this is not a text file");
}

TEST(python_float_repr)
{
    static const struct {
        double v;
        const char *want;
    } cases[] = {{1605632.0, "1605632.0"},
                 {0.0, "0.0"},
                 {35.0, "35.0"},
                 {0.1, "0.1"},
                 {123.456, "123.456"},
                 {1e16, "1e+16"},
                 {1e15, "1000000000000000.0"},
                 {0.0001, "0.0001"},
                 {1.5e-05, "1.5e-05"},
                 {205520896.5, "205520896.5"},
                 {1.0 / 3, "0.3333333333333333"},
                 {1.25e22, "1.25e+22"}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char out[64];
        ddp__profile_pyfloat(cases[k].v, out, sizeof(out));
        ASSERT_STREQ(out, cases[k].want);
    }
}

TEST(profile_written_as_graph_py_writes_it)
{
    struct ddp_profile p;
    char err[512];
    ASSERT_OK(parse(diamond, &p, err, sizeof(err)));
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ASSERT_OK(ddp__profile_write(&p, f));
    fclose(f);
    ASSERT_STREQ(text,
                 "node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
                 "activation_size=100.0, parameter_size=0.000\n"
                 "node2 -- Linear(a) -- forward_compute_time=1.000, backward_compute_time=2.000, "
                 "activation_size=10.0, parameter_size=1000.000\n"
                 "node3 -- Linear(b) -- forward_compute_time=3.000, backward_compute_time=4.000, "
                 "activation_size=20.0, parameter_size=2000.000\n"
                 "node4 -- Linear(c) -- forward_compute_time=5.000, backward_compute_time=6.000, "
                 "activation_size=35.0, parameter_size=3000.000 -- stage_id=1\n"
                 "node5 -- Add -- forward_compute_time=7.000, backward_compute_time=8.000, "
                 "activation_size=40.0, parameter_size=0.000\n"
                 "node6 -- __getitem__(0) -- forward_compute_time=0.000, "
                 "backward_compute_time=0.000, activation_size=40.0, parameter_size=0.000\n"
                 "\tnode1 -- node2\n\tnode2 -- node3\n\tnode2 -- node4\n\tnode3 -- node5\n"
                 "\tnode4 -- node5\n\tnode5 -- node6\n");
    /* and it reads back the same */
    struct ddp_profile q;
    ASSERT_OK(parse(text, &q, err, sizeof(err)));
    ASSERT_EQ(q.nlayers, p.nlayers);
    for (size_t k = 0; k < p.nlayers; k++)
        ASSERT_TRUE(q.layers[k].act_bytes == p.layers[k].act_bytes &&
                    q.layers[k].param_bytes == p.layers[k].param_bytes);
    free(text);
    ddp__profile_release(&p);
    ddp__profile_release(&q);
}

/*
 * The reference, printed by the released graph.py (msr-fiddle/pipedream) for the same graph:
 * Input and __getitem__ left out; states in the order of its topological_sort, each with its
 * augmented antichain, the compute time of everything up to it and the activations leaving it:
 *   antichain_0 ['node2'] 0.003 10.0 []
 *   antichain_2 ['node2', 'node4'] 0.014 45.0 ['antichain_0']
 *   antichain_1 ['node2', 'node3'] 0.01 30.0 ['antichain_0']
 *   antichain_3 ['node2', 'node3', 'node4'] 0.021 65.0 [0, 1, 2]
 *   antichain_4 ['node5'] 0.036 40.0 [0, 1, 2, 3]
 */
TEST(antichain_states_of_a_branching_graph)
{
    struct ddp_profile p;
    struct ddp_pstates s;
    char err[512];
    ASSERT_OK(parse(diamond, &p, err, sizeof(err)));
    ASSERT_OK(ddp__pipe_states(&p, &s, err, sizeof(err)));
    ASSERT_EQ(s.n, 5);
    static const char *const anti[5] = {"node2", "node2 node4", "node2 node3", "node2 node3 node4",
                                        "node5"};
    static const double compute[5] = {0.003, 0.014, 0.010, 0.021, 0.036};
    static const double out[5] = {10, 45, 30, 65, 40};
    static const unsigned preds[5] = {0x0, 0x1, 0x1, 0x7, 0xf};
    for (size_t k = 0; k < 5; k++) {
        char got[128] = "";
        size_t o = 0;
        /* as a sorted list, the way the reference prints it */
        for (size_t q = 0; q < p.nlayers; q++)
            for (size_t a = 0; a < s.st[k].nanti; a++)
                if (s.st[k].anti[a] == q)
                    o += (size_t)snprintf(got + o, sizeof(got) - o, "%s%s", o ? " " : "",
                                          p.layers[q].id);
        ASSERT_STREQ(got, anti[k]);
        ASSERT_TRUE(fabs(s.st[k].compute_s - compute[k]) < 1e-15);
        ASSERT_TRUE(s.st[k].out_bytes == out[k]);
        ASSERT_EQ(s.preds[k * s.swords], preds[k]);
    }
    ASSERT_TRUE(s.input[0] && s.dropped[5] && !s.input[1] && !s.dropped[4]);
    /* two machines, a straight pipeline: of the cuts after {a}, {c}, {b} and {b, c} (33, 22,
     * 26 and 15 ms after them) the last is best; every layer gets a stage, the input the first,
     * __getitem__ its feeder's */
    struct ddp_plan_opts o = {.levels = 1, .machines = {2}, .bandwidth = {1e9}, .straight = true};
    struct ddp_plan pl;
    ASSERT_OK(ddp__pipe_plan(&p, &s, &o, &pl, err, sizeof(err)));
    ASSERT_EQ(pl.nstages, 2);
    ASSERT_TRUE(fabs(pl.pipeline_s - 0.021) < 1e-15);
    ASSERT_EQ(pl.layer_stage[0], 0);
    ASSERT_EQ(pl.layer_stage[1], 0);
    ASSERT_EQ(pl.layer_stage[2], 0);
    ASSERT_EQ(pl.layer_stage[3], 0);
    ASSERT_EQ(pl.layer_stage[4], 1);
    ASSERT_EQ(pl.layer_stage[5], 1);
    ddp__pipe_plan_release(&pl);
    ddp__pipe_states_release(&s);
    ddp__profile_release(&p);
}

/* Every number at the profile's bound, on the slowest link accepted: the plan stays finite. */
TEST(largest_profile_plans_finitely)
{
    char text[4096];
    size_t o = 0;
    for (int k = 0; k < 8; k++)
        o += (size_t)snprintf(text + o, sizeof(text) - o,
                              "n%d -- L -- forward_compute_time=1e18, backward_compute_time=1e18, "
                              "activation_size=[1e18], parameter_size=1e18\n",
                              k);
    for (int k = 0; k + 1 < 8; k++)
        o += (size_t)snprintf(text + o, sizeof(text) - o, "\tn%d -- n%d\n", k, k + 1);
    struct ddp_profile p;
    struct ddp_pstates s;
    char err[512];
    ASSERT_OK(ddp__profile_parse(text, o, "g.txt", &p, err, sizeof(err)));
    ASSERT_OK(ddp__pipe_states(&p, &s, err, sizeof(err)));
    double slow;
    ASSERT_TRUE(ddp__pipe_parse_rate("1bit", &slow));
    struct ddp_plan_opts opt = {
        .levels = 2, .machines = {4, 4}, .bandwidth = {slow, slow}, .act_ratio = 1};
    struct ddp_plan pl;
    ASSERT_OK(ddp__pipe_plan(&p, &s, &opt, &pl, err, sizeof(err)));
    ASSERT_TRUE(isfinite(pl.pipeline_s) && isfinite(pl.dp_s) && pl.pipeline_s > 0);
    ddp__pipe_plan_release(&pl);
    ddp__pipe_states_release(&s);
    ddp__profile_release(&p);
}

/* ---- the planner against an exhaustive search on chains ---- */

struct chain {
    int n, M;
    double f[8], b[8], act[8], par[8];
    double B, ratio, mem;
    bool straight;
    /* prefix sums over the layers in order, as the states hold them */
    double C[8], A[8], P[8];
};

static double rng(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (double)((*s >> 8) & 0xffff) / 65536.0;
}

static double range(const double *x, int i, int j)
{
    return i == 0 ? x[j] : x[j] - x[i - 1];
}

/* one stage of states i..j on r machines, cum machines up to it included; NAN if it does not
 * fit in memory: the same arithmetic as the planner's */
static double stage_time(const struct chain *c, int i, int j, int r, int cum)
{
    double W = range(c->P, i, j), Act = range(c->A, i, j);
    double stashed = (Act + W) * ceil((double)(c->M - cum) / r);
    if (c->mem > 0 && stashed > c->mem)
        return NAN;
    double t = (range(c->C, i, j) + (4.0 * (r - 1) * W) / (c->B * r)) / r;
    if (c->ratio > 0 && i > 0) {
        t = fmax(t, (2.0 * c->act[i - 1]) / (c->B * r) / c->ratio);
        if (j < c->n - 1)
            t = fmax(t, (2.0 * c->act[j]) / (c->B * r) / c->ratio);
    }
    return t;
}

/* the best slowest stage over every split of states start..n-1 using exactly M - used machines */
static double search(const struct chain *c, int start, int used)
{
    if (start == c->n)
        return used == c->M ? 0 : NAN;
    double best = NAN;
    for (int j = start; j < c->n; j++)
        for (int r = 1; used + r <= c->M && (r == 1 || !c->straight); r++) {
            double t = stage_time(c, start, j, r, used + r);
            if (isnan(t))
                continue;
            double rest = search(c, j + 1, used + r);
            if (isnan(rest))
                continue;
            double v = fmax(t, rest);
            if (isnan(best) || v < best)
                best = v;
        }
    return best;
}

static void make_profile(struct chain *c, char *text, size_t cap)
{
    size_t o = 0;
    o += (size_t)snprintf(text + o, cap - o,
                          "node0 -- Input0 -- forward_compute_time=0.000, "
                          "backward_compute_time=0.000, activation_size=7.0, "
                          "parameter_size=0.000\n");
    for (int k = 0; k < c->n; k++)
        o += (size_t)snprintf(text + o, cap - o,
                              "node%d -- L%d -- forward_compute_time=%.3f, "
                              "backward_compute_time=%.3f, activation_size=%.1f, "
                              "parameter_size=%.1f\n",
                              k + 1, k, c->f[k], c->b[k], c->act[k], c->par[k]);
    for (int k = 0; k < c->n; k++)
        o += (size_t)snprintf(text + o, cap - o, "\tnode%d -- node%d\n", k, k + 1);
}

/* the layers as the profile holds them (3 decimals), and their prefix sums */
static void take_profile(struct chain *c, const struct ddp_profile *p)
{
    for (int k = 0; k < c->n; k++) {
        const struct ddp_layer *L = &p->layers[k + 1];
        c->f[k] = L->fwd_ms;
        c->b[k] = L->bwd_ms;
        c->act[k] = L->act_bytes;
        c->par[k] = L->param_bytes;
        c->C[k] = (k ? c->C[k - 1] : 0) + (L->fwd_ms + L->bwd_ms) / 1000.0;
        c->A[k] = (k ? c->A[k - 1] : 0) + L->act_bytes;
        c->P[k] = (k ? c->P[k - 1] : 0) + L->param_bytes;
    }
}

TEST(planner_finds_the_best_split_of_random_chains)
{
    unsigned seed = 12345;
    int plans = 0, infeasible = 0;
    for (int trial = 0; trial < 600; trial++) {
        struct chain c = {.n = 1 + (int)(rng(&seed) * 7), .M = 1 + (int)(rng(&seed) * 5)};
        for (int k = 0; k < c.n; k++) {
            c.f[k] = 1 + rng(&seed) * 50;
            c.b[k] = 1 + rng(&seed) * 100;
            c.act[k] = rng(&seed) * 4e7;
            c.par[k] = rng(&seed) < 0.3 ? 0 : rng(&seed) * 4e8;
        }
        c.B = (rng(&seed) < 0.5 ? 1.25e8 : 1.25e9) * (0.5 + rng(&seed));
        double u = rng(&seed);
        c.ratio = u < 0.3 ? 0 : u < 0.7 ? 1 : 0.5 + rng(&seed) * 4;
        c.straight = rng(&seed) < 0.2;
        c.mem = rng(&seed) < 0.25 ? 2e8 + rng(&seed) * 2e9 : 0;
        char text[4096], err[512];
        make_profile(&c, text, sizeof(text));
        struct ddp_profile p;
        struct ddp_pstates s;
        struct ddp_plan pl;
        ASSERT_OK(parse(text, &p, err, sizeof(err)));
        take_profile(&c, &p);
        ASSERT_OK(ddp__pipe_states(&p, &s, err, sizeof(err)));
        ASSERT_EQ(s.n, c.n);
        for (int k = 0; k < c.n; k++)
            ASSERT_TRUE(s.st[k].compute_s == c.C[k] && s.st[k].param_bytes == c.P[k]);
        struct ddp_plan_opts o = {.levels = 1,
                                  .machines = {c.M},
                                  .bandwidth = {c.B},
                                  .act_ratio = c.ratio,
                                  .straight = c.straight,
                                  .memory_bytes = c.mem};
        double want = search(&c, 0, 0);
        int r = ddp__pipe_plan(&p, &s, &o, &pl, err, sizeof(err));
        if (isnan(want)) {
            ASSERT_ERR(r, DDP_EINVAL);
            ASSERT_TRUE(strstr(err, "no plan fits") != NULL);
            infeasible++;
        } else {
            ASSERT_OK(r);
            plans++;
            /* the same arithmetic in a different order of max(): equal but for the last bit */
            if (fabs(pl.pipeline_s - want) > 1e-12 * want)
                FAIL_AT("trial %d: planner %.17g, exhaustive search %.17g", trial, pl.pipeline_s,
                        want);
            /* its stages cover the chain, use every machine and give that time */
            int used = 0;
            double worst = 0;
            for (size_t g = 0; g < pl.nstages; g++) {
                const struct ddp_plan_stage *st = &pl.stages[g];
                ASSERT_EQ(st->start, g ? pl.stages[g - 1].end : 0);
                used += st->workers;
                if (c.straight)
                    ASSERT_EQ(st->workers, 1);
                worst = fmax(worst,
                             stage_time(&c, (int)st->start, (int)st->end - 1, st->workers, used));
            }
            ASSERT_EQ(pl.stages[pl.nstages - 1].end, c.n);
            ASSERT_EQ(used, c.M);
            ASSERT_TRUE(fabs(worst - pl.pipeline_s) <= 1e-12 * worst);
            /* data parallelism: compute plus the ring all-reduce of every parameter, per machine */
            double dp = (c.C[c.n - 1] + (4.0 * (c.M - 1) * c.P[c.n - 1]) / (c.B * c.M)) / c.M;
            ASSERT_TRUE(fabs(pl.dp_s - dp) <= 1e-12 * dp);
            ddp__pipe_plan_release(&pl);
        }
        ddp__pipe_states_release(&s);
        ddp__profile_release(&p);
    }
    /* both kinds of outcome were exercised */
    ASSERT_GE(plans, 300);
    ASSERT_GE(infeasible, 20);
}

TEST(rates_and_sizes)
{
    double v;
    ASSERT_TRUE(ddp__pipe_parse_rate("10Gbit", &v) && v == 1.25e9);
    ASSERT_TRUE(ddp__pipe_parse_rate("100Mbit/s", &v) && v == 1.25e7);
    ASSERT_TRUE(ddp__pipe_parse_rate("1gbps", &v) && v == 1.25e8);
    ASSERT_TRUE(ddp__pipe_parse_rate("1.25GB/s", &v) && v == 1.25e9);
    ASSERT_TRUE(ddp__pipe_parse_rate("1250000000", &v) && v == 1.25e9);
    ASSERT_TRUE(!ddp__pipe_parse_rate("10Gb", &v));   /* bits or bytes? */
    ASSERT_TRUE(!ddp__pipe_parse_rate("10GBps", &v)); /* B is bytes, bps bits */
    ASSERT_TRUE(!ddp__pipe_parse_rate("0", &v));
    ASSERT_TRUE(!ddp__pipe_parse_rate("-1Gbit", &v));
    ASSERT_TRUE(!ddp__pipe_parse_rate(" 1Gbit", &v));
    ASSERT_TRUE(!ddp__pipe_parse_rate("1e-300", &v)); /* below a bit per second */
    ASSERT_TRUE(ddp__pipe_parse_rate("1bit", &v) && v == 0.125);
    ASSERT_TRUE(ddp__pipe_parse_bytes("16GiB", &v) && v == 17179869184.0);
    ASSERT_TRUE(ddp__pipe_parse_bytes("16GB", &v) && v == 16e9);
    ASSERT_TRUE(!ddp__pipe_parse_bytes("16Gbit", &v));
}
