/*
 * The reduction kernels built for each instruction set (worker/reduce.c: baseline, AVX2,
 * AVX-512): every set this CPU has, every dtype, op and form of a kernel, at lengths around
 * each vector width and at misaligned starts, against a reference written here one element at
 * a time, on values that include infinities, signed zeros, subnormals and NaNs. A set that
 * vectorized an operation differently (a fused multiply-add, a reassociated average, a max
 * that picks the other operand on a NaN) differs from the reference. The choice of a set:
 * DDP_PG_REDUCE_ISA and its fallback.
 */
#include "tests/unit/test.h"
#include "worker/coll.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const sets[] = {"baseline", "avx2", "avx512"};
static const enum ddp_dtype dtypes[] = {DDP_F32, DDP_F64, DDP_I32, DDP_I64, DDP_BF16, DDP_F16};
static const enum ddp_redop ops[] = {DDP_SUM, DDP_AVG, DDP_MAX, DDP_MIN};
static const size_t lens[] = {0,  1,  3,  7,  8,  15,  16,  17,   31,
                              32, 33, 63, 64, 65, 127, 129, 1000, 4099};
#define MAXN 4099
#define PAD 8 /* elements: starts misaligned by 0..3 */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* A value for element i: mostly ordinary numbers, some of each special kind. */
static double special(uint64_t r)
{
    switch (r % 16) {
    case 0:
        return INFINITY;
    case 1:
        return -INFINITY;
    case 2:
        return 0.0;
    case 3:
        return -0.0;
    case 4:
        return NAN;
    case 5:
        return 1e-40; /* subnormal in float32 */
    case 6:
        return 3e38;
    default:
        return ((double)(int64_t)(r >> 11) / (double)(1ull << 50)) * ((r >> 3) % 7 ? 1.0 : 1e6);
    }
}

static void fill(void *p, size_t n, enum ddp_dtype dt)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = next_u64();
        double v = special(r);
        switch (dt) {
        case DDP_F32:
            ((float *)p)[i] = (float)v;
            break;
        case DDP_F64:
            ((double *)p)[i] = r % 16 == 5 ? 1e-310 : v;
            break;
        case DDP_I32:
            ((int32_t *)p)[i] = (int32_t)(uint32_t)r; /* sums wrap */
            break;
        case DDP_I64:
            ((int64_t *)p)[i] = (int64_t)r;
            break;
        case DDP_BF16:
            ((uint16_t *)p)[i] = ddp__f32_to_bf16((float)v);
            break;
        case DDP_F16:
            ((uint16_t *)p)[i] =
                r % 16 == 5 ? (uint16_t)(r >> 20 & 0x83ff) : ddp__f32_to_f16((float)v);
            break;
        }
    }
}

/* The conversions as they were written first, one case at a time with branches (the
 * reference for worker/half.h's, which have none). */
static float ref_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t ref_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

static float ref_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t ref_f32_to_f16(float x)
{
    uint32_t f;
    memcpy(&f, &x, 4);
    uint32_t sign = (f >> 16) & 0x8000u, exp = (f >> 23) & 0xffu, mant = f & 0x7fffffu;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        int shift = 14 - e;
        uint32_t half = 1u << (shift - 1), rem = mant & ((1u << shift) - 1), r = mant >> shift;
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1)))
        r++; /* a carry into the exponent is right, up to infinity */
    return (uint16_t)(sign | r);
}

/* op(l, r) with l the left operand, as the kernels define it: r if r > l (MAX) else l. */
#define OP(op, l, r)                                                                               \
    ((op) == DDP_MAX   ? ((r) > (l) ? (r) : (l))                                                   \
     : (op) == DDP_MIN ? ((r) < (l) ? (r) : (l))                                                   \
                       : (l) + (r))

/* d[i] = op(l[i], r[i]), then / world for AVG: one element at a time. */
static void reference(void *d, const void *l, const void *r, size_t n, enum ddp_dtype dt,
                      enum ddp_redop op, int world)
{
    for (size_t i = 0; i < n; i++) {
        switch (dt) {
        case DDP_F32: {
            float x = OP(op, ((const float *)l)[i], ((const float *)r)[i]);
            ((float *)d)[i] = op == DDP_AVG ? x / (float)world : x;
        } break;
        case DDP_F64: {
            double x = OP(op, ((const double *)l)[i], ((const double *)r)[i]);
            ((double *)d)[i] = op == DDP_AVG ? x / (double)world : x;
        } break;
        case DDP_I32: {
            int32_t a = ((const int32_t *)l)[i], b = ((const int32_t *)r)[i];
            int32_t x = op == DDP_MAX   ? (b > a ? b : a)
                        : op == DDP_MIN ? (b < a ? b : a)
                                        : (int32_t)((uint32_t)a + (uint32_t)b);
            ((int32_t *)d)[i] = op == DDP_AVG ? x / world : x;
        } break;
        case DDP_I64: {
            int64_t a = ((const int64_t *)l)[i], b = ((const int64_t *)r)[i];
            int64_t x = op == DDP_MAX   ? (b > a ? b : a)
                        : op == DDP_MIN ? (b < a ? b : a)
                                        : (int64_t)((uint64_t)a + (uint64_t)b);
            ((int64_t *)d)[i] = op == DDP_AVG ? x / world : x;
        } break;
        case DDP_BF16:
        case DDP_F16: {
            bool bf = dt == DDP_BF16;
            float a = bf ? ref_bf16_to_f32(((const uint16_t *)l)[i])
                         : ref_f16_to_f32(((const uint16_t *)l)[i]);
            float b = bf ? ref_bf16_to_f32(((const uint16_t *)r)[i])
                         : ref_f16_to_f32(((const uint16_t *)r)[i]);
            uint16_t h = bf ? ref_f32_to_bf16(OP(op, a, b)) : ref_f32_to_f16(OP(op, a, b));
            if (op == DDP_AVG) { /* two passes: the sum rounded to the type, then the division */
                float s = bf ? ref_bf16_to_f32(h) : ref_f16_to_f32(h);
                h = bf ? ref_f32_to_bf16(s / (float)world) : ref_f32_to_f16(s / (float)world);
            }
            ((uint16_t *)d)[i] = h;
        } break;
        }
    }
}

static bool is_nan(const void *p, size_t i, enum ddp_dtype dt)
{
    switch (dt) {
    case DDP_F32:
        return isnan(((const float *)p)[i]);
    case DDP_F64:
        return isnan(((const double *)p)[i]);
    case DDP_BF16:
        return (((const uint16_t *)p)[i] & 0x7fffu) > 0x7f80u;
    case DDP_F16:
        return (((const uint16_t *)p)[i] & 0x7fffu) > 0x7c00u;
    default:
        return false;
    }
}

/* The same bits, a NaN's payload aside (an addition's operands may be swapped). */
static void expect_same(const char *set, const char *form, const void *got, const void *want,
                        size_t n, enum ddp_dtype dt, enum ddp_redop op, size_t off)
{
    size_t esz = ddp_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        const unsigned char *g = (const unsigned char *)got + i * esz,
                            *w = (const unsigned char *)want + i * esz;
        if (memcmp(g, w, esz) == 0 || (is_nan(got, i, dt) && is_nan(want, i, dt)))
            continue;
        unsigned long long gv = 0, wv = 0;
        memcpy(&gv, g, esz);
        memcpy(&wv, w, esz);
        FAIL_AT("set %s, %s: dtype %d op %d n %zu start %zu: element %zu is 0x%llx, the "
                "reference's 0x%llx",
                set, form, (int)dt, (int)op, n, off, i, gv, wv);
    }
}

/* Every form of every kernel of the current set against the reference. */
static void check_set(const char *set)
{
    size_t big = (MAXN + PAD) * 8;
    char *a = malloc(big), *b = malloc(big), *d = malloc(big), *want = malloc(big);
    ASSERT_TRUE(a && b && d && want);
    for (size_t t = 0; t < sizeof(dtypes) / sizeof(dtypes[0]); t++)
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
            for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
                for (size_t off = 0; off < 4; off++) {
                    enum ddp_dtype dt = dtypes[t];
                    enum ddp_redop op = ops[o];
                    size_t n = lens[k], esz = ddp_dtype_size(dt);
                    int world = 2 + (int)((k + off) % 3); /* 2, 3 and 4 ranks' averages */
                    char *pa = a + off * esz, *pb = b + off * esz, *pd = d + off * esz;
                    fill(pa, n, dt);
                    fill(pb, n, dt);
                    bool avg = op == DDP_AVG;
                    /* in place: d = op(d, b) */
                    reference(want, pa, pb, n, dt, op, world);
                    memcpy(pd, pa, n * esz);
                    if (avg)
                        ddp__reduce_avg(pd, pb, n, dt, world);
                    else
                        ddp__reduce(pd, pb, n, dt, op);
                    expect_same(set, avg ? "reduce_avg" : "reduce", pd, want, n, dt, op, off);
                    /* into a third buffer: d = op(a, b) */
                    memset(pd, 0x5a, n * esz);
                    if (avg)
                        ddp__reduce_avg_to(pd, pa, pb, n, dt, world);
                    else
                        ddp__reduce_to(pd, pa, pb, n, dt, op);
                    expect_same(set, avg ? "reduce_avg_to" : "reduce_to", pd, want, n, dt, op, off);
                    /* in place on the right: d = op(a, d) with d holding b */
                    memcpy(pd, pb, n * esz);
                    if (avg)
                        ddp__reduce_avg_rev(pd, pa, n, dt, world);
                    else
                        ddp__reduce_rev(pd, pa, n, dt, op);
                    expect_same(set, avg ? "reduce_avg_rev" : "reduce_rev", pd, want, n, dt, op,
                                off);
                    /* DDP_AVG as its two passes: the sum, then the division */
                    if (avg) {
                        memcpy(pd, pa, n * esz);
                        ddp__reduce(pd, pb, n, dt, DDP_AVG);
                        ddp__scale_avg(pd, n, dt, world);
                        expect_same(set, "reduce+scale_avg", pd, want, n, dt, op, off);
                    }
                }
    /* the compression hooks' conversions: float32 x scale to each half type and back */
    float *f = (float *)a, *g = (float *)b;
    uint16_t *h = (uint16_t *)d, *hw = (uint16_t *)want;
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
        for (int half = 0; half < 2; half++) {
            enum ddp_dtype dt = half ? DDP_F16 : DDP_BF16;
            size_t n = lens[k];
            fill(f, n, DDP_F32);
            float scale = k % 2 ? 0.25f : 1.0f / 3.0f;
            ddp__f32_to_half(h, f, n, dt, scale);
            for (size_t i = 0; i < n; i++)
                hw[i] = half ? ref_f32_to_f16(f[i] * scale) : ref_f32_to_bf16(f[i] * scale);
            expect_same(set, "f32_to_half", h, hw, n, dt, DDP_SUM, 0);
            ddp__half_to_f32(g, h, n, dt);
            for (size_t i = 0; i < n; i++)
                f[i] = half ? ref_f16_to_f32(h[i]) : ref_bf16_to_f32(h[i]);
            expect_same(set, "half_to_f32", g, f, n, DDP_F32, DDP_SUM, 0);
        }
    free(a);
    free(b);
    free(d);
    free(want);
}

TEST(every_set_this_cpu_has_gives_the_reference_bits)
{
    int ran = 0;
    for (size_t s = 0; s < sizeof(sets) / sizeof(sets[0]); s++) {
        if (ddp__reduce_isa(sets[s]) != 0) {
            fprintf(stderr, "  (this CPU has no %s: not checked)\n", sets[s]);
            continue;
        }
        ASSERT_TRUE(strcmp(ddp__reduce_isa_name(), sets[s]) == 0);
        check_set(sets[s]);
        ran++;
    }
    ASSERT_GE(ran, 1); /* baseline, at least */
    ASSERT_EQ(ddp__reduce_isa("baseline"), 0);
}

TEST(the_environment_names_a_set)
{
    setenv("DDP_PG_REDUCE_ISA", "baseline", 1);
    ASSERT_TRUE(strcmp(ddp__reduce_isa_name(), "baseline") == 0);
    ASSERT_EQ(ddp__reduce_isa("sse9"), -1);
    ASSERT_EQ(ddp__reduce_isa(""), -1);
    ASSERT_TRUE(strcmp(ddp__reduce_isa_name(), "baseline") == 0);
}

/* A name that is not a set, or one this CPU lacks, falls back to auto: the widest set that
 * ddp__reduce_isa accepts, but AVX2 where AVX-512 comes without AVX512-VBMI. */
TEST(a_bad_name_falls_back_to_auto)
{
    setenv("DDP_PG_REDUCE_ISA", "avx1024", 1);
    const char *got = ddp__reduce_isa_name();
    const char *want = "baseline";
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vbmi"))
        want = "avx512";
    else if (__builtin_cpu_supports("avx2"))
        want = "avx2";
#endif
    if (strcmp(got, want) != 0)
        FAIL_AT("auto chose %s, expected %s", got, want);
}

/* Every bfloat16 and binary16 value to float32, bit for bit as the reference; float32 to each,
 * at every exponent, around every rounding point (ties both ways, one below and above, for
 * each shift a subnormal result takes), and at random. */
TEST(half_conversions_match_the_reference_bit_for_bit)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float a = ddp__bf16_to_f32((uint16_t)h), b = ref_bf16_to_f32((uint16_t)h);
        float c = ddp__f16_to_f32((uint16_t)h), d = ref_f16_to_f32((uint16_t)h);
        if (memcmp(&a, &b, 4) || memcmp(&c, &d, 4))
            FAIL_AT("half 0x%04x: bf16 %a against %a, f16 %a against %a", h, a, b, c, d);
    }
    size_t checked = 0;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t exp = 0; exp < 256; exp++)
            for (uint32_t k = 0; k < 2048; k++) {
                uint32_t mant = (uint32_t)next_u64() & 0x7fffffu;
                if (k < 25 * 6) { /* a rounding point of shift s: its low s bits */
                    uint32_t s = 1 + k / 6, half = 1u << (s - 1),
                             lo[] = {half, half - 1, half + 1, 0, (1u << s) - 1, 1};
                    mant = ((mant >> s) << s | lo[k % 6]) & 0x7fffffu;
                }
                uint32_t u = sign << 31 | exp << 23 | mant;
                float f;
                memcpy(&f, &u, 4);
                uint16_t a = ddp__f32_to_f16(f), b = ref_f32_to_f16(f);
                uint16_t c = ddp__f32_to_bf16(f), d = ref_f32_to_bf16(f);
                if (a != b || c != d)
                    FAIL_AT("float 0x%08x: f16 0x%04x against 0x%04x, bf16 0x%04x against 0x%04x",
                            u, a, b, c, d);
                checked++;
            }
    ASSERT_EQ(checked, 2 * 256 * 2048);
}
