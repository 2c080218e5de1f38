/*
 * Private to worker/ and its users: conversions between float32 and the 16-bit float types,
 * bfloat16 and IEEE binary16, rounding to nearest, ties to even, as IEEE 754 prescribes
 * (subnormals and infinities included; a NaN stays a NaN). Inline and without branches, so
 * that a loop over them (the reduction kernels of the half types in worker/reduce.c, the
 * reducer's compression hooks) vectorizes instead of calling a function per element: as
 * out-of-line functions with branches, a bfloat16 sum ran 0.36 GB/s and a binary16 sum 0.19 on
 * a 2-vCPU Xeon, 45-85x slower than float32's (BENCHMARKS.md, "Half-precision kernels").
 * tests/unit/test_reduce_isa.c checks every half value and every rounding case against the
 * earlier one-case-at-a-time code.
 */
#ifndef DDP_WORKER_HALF_H
#define DDP_WORKER_HALF_H

#include <stdint.h>
#include <string.h>

/* Bits of a float and back (a union: the vectorizer takes it where it does not take memcpy). */
static inline uint32_t ddp__f32_bits(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    return v.u;
}

static inline float ddp__bits_f32(uint32_t u)
{
    union {
        float f;
        uint32_t u;
    } v = {.u = u};
    return v.f;
}

/* c ? a : b as masks, so that the compiler keeps every operand computed and the loop without
 * branches (a choice between computed values it would turn back into a branch around the
 * computation of the one not taken, which the vectorizer cannot follow). */
static inline uint32_t ddp__pick(uint32_t c, uint32_t a, uint32_t b)
{
    uint32_t k = 0u - c;
    return (a & k) | (b & ~k);
}

static inline float ddp__bf16_to_f32(uint16_t h)
{
    return ddp__bits_f32((uint32_t)h << 16);
}

static inline uint16_t ddp__f32_to_bf16(float f)
{
    uint32_t u = ddp__f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u; /* a NaN stays a (quiet) NaN */
    return (uint16_t)ddp__pick((u & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

static inline float ddp__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t normal = sign | ((exp + 127u - 15u) << 23) | (mant << 13);
    uint32_t inf_nan = sign | 0x7f800000u | (mant << 13);
    /* a subnormal (or zero) is mant x 2^-24, exact in float32 */
    uint32_t sub = sign | ddp__f32_bits((float)(int32_t)mant * 0x1p-24f);
    return ddp__bits_f32(ddp__pick(exp == 0, sub, ddp__pick(exp == 31, inf_nan, normal)));
}

/* Rounding to nearest, ties to even: up where the bits cut off (rem) exceed half of the last
 * kept bit's weight, or equal it and the kept value (r) is odd. */
static inline uint32_t ddp__round_even(uint32_t r, uint32_t rem, uint32_t half)
{
    return r + (uint32_t)(rem + (r & 1u) > half);
}

/* float32 to binary16 one case at a time: the faster where the loop is not vectorized (its
 * branches are taken alike for most values; 2.3 ns against 7.4 for the one below, scalar, on a
 * 2-vCPU Xeon), where ddp__f32_to_f16_vec, without branches, is the one that vectorizes
 * (with AVX2's shifts by a count per element). The same result for every float. */
static inline uint16_t ddp__f32_to_f16(float x)
{
    uint32_t f = ddp__f32_bits(x);
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

static inline uint16_t ddp__f32_to_f16_vec(float x)
{
    uint32_t f = ddp__f32_bits(x);
    uint32_t sign = (f >> 16) & 0x8000u, exp = (f >> 23) & 0xffu, mant = f & 0x7fffffu;
    int32_t e = (int32_t)exp - 127 + 15; /* binary16's biased exponent */
    /* normal: the top 10 bits of the mantissa, rounded on the 13 below (a carry into the
     * exponent is right, up to infinity) */
    uint32_t rn = ddp__round_even(((uint32_t)e << 10) | (mant >> 13), mant & 0x1fffu, 0x1000u);
    /* subnormal (e from -10 to 0): the mantissa with its implicit bit, shifted 14 - e */
    int32_t es = e < -10 ? -10 : e;
    es = es > 0 ? 0 : es;
    uint32_t shift = (uint32_t)(14 - es), m = mant | 0x800000u;
    uint32_t rs = ddp__round_even(m >> shift, m & ((1u << shift) - 1u), 1u << (shift - 1u));
    uint32_t nan = 0x7c00u | (uint32_t)(mant != 0) << 9;
    uint32_t r = ddp__pick(e > 0, rn, rs & ((uint32_t)(e < -10) - 1u)); /* below: a zero */
    r = ddp__pick(e >= 31, 0x7c00u, r);
    r = ddp__pick(exp == 0xffu, nan, r);
    return (uint16_t)(sign | r);
}

#endif
