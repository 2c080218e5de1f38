/*
 * The reduction kernels alone (worker/reduce.c): an in-place sum of 256 Ki elements (in the L2)
 * for float32, bfloat16 and binary16, with each instruction set this CPU has
 * (DDP_PG_REDUCE_ISA's baseline, avx2, avx512), and the reducer's compression conversions
 * (float32 x scale to the half type and back). Best of 30 calls; elements per nanosecond.
 *   reduce_kernels
 */
#include "common/util.h"
#include "worker/coll.h"

#include <stdio.h>
#include <stdlib.h>

#define N ((size_t)1 << 18)

static float *fa, *fb;
static uint16_t *ha, *hb;
static enum ddp_dtype cur;

static void sum_f32(void)
{
    ddp__reduce(fa, fb, N, DDP_F32, DDP_SUM);
}
static void sum_half(void)
{
    ddp__reduce(ha, hb, N, cur, DDP_SUM);
}
static void to_half(void)
{
    ddp__f32_to_half(ha, fa, N, cur, 0.5f);
}
static void from_half(void)
{
    ddp__half_to_f32(fa, ha, N, cur);
}

static double gelems(void (*fn)(void))
{
    for (size_t i = 0; i < N; i++) { /* ordinary numbers */
        fa[i] = 1.0f + (float)i * 1e-3f;
        fb[i] = 0.5f;
    }
    ddp__f32_to_half(ha, fa, N, cur, 1.0f);
    ddp__f32_to_half(hb, fb, N, cur, 1.0f);
    double best = 1e18;
    for (int r = 0; r < 30; r++) {
        int64_t t0 = ddp_now_ns();
        fn();
        double t = (double)(ddp_now_ns() - t0);
        if (t < best)
            best = t;
    }
    return (double)N / best; /* elements per ns */
}

int main(void)
{
    const char *sets[] = {"baseline", "avx2", "avx512"};
    fa = malloc(N * 4);
    fb = malloc(N * 4);
    ha = malloc(N * 2);
    hb = malloc(N * 2);
    if (!fa || !fb || !ha || !hb)
        return 1;
    printf("G elements/s, %zu elements (in the L2), best of 30 calls\n\n", N);
    printf("| set | sum f32 | sum bf16 | sum f16 | f32 to bf16 | f32 to f16 | bf16 to f32 | f16 to "
           "f32 |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int s = 0; s < 3; s++) {
        if (ddp__reduce_isa(sets[s]) != 0)
            continue;
        cur = DDP_BF16;
        double sf = gelems(sum_f32), sb = gelems(sum_half), tb = gelems(to_half),
               fbv = gelems(from_half);
        cur = DDP_F16;
        double sh = gelems(sum_half), th = gelems(to_half), fh = gelems(from_half);
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", sets[s], sf, sb, sh, tb,
               th, fbv, fh);
    }
    free(fa);
    free(fb);
    free(ha);
    free(hb);
    return 0;
}
