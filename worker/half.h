/*
 * Private to worker/ and its users: conversions between float32 and the 16-bit float types,
 * bfloat16 and IEEE binary16, rounding to nearest, ties to even, as IEEE 754 prescribes
 * (subnormals and infinities included; a NaN stays a NaN). Inline and without branches, so
 * that a loop over them (the reduction kernels of the half types in worker/reduce.c, the
 * reducer's compression hooks) vectorizes instead of calling a function per element: as
 * out-of-line functions with branches, a bfloat16 sum ran 0.36 GB/s and a binary16 sum 0.19 on
 * a 2-vCPU Xeon, 45-85x slower than float32's (BENCHMARKS.md, "Half-precision kernels").
 * tests/unit/test_reduce_isa.c checks every half value and every rounding point against the
 * earlier one-case-at-a-time code.
 */
#ifndef DDP_WORKER_HALF_H
#define DDP_WORKER_HALF_H

#include <stdint.h>

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

static inline uint16_t ddp__f32_to_f16(float x)
{
    uint32_t f = ddp__f32_bits(x), sign = (f >> 16) & 0x8000u, a = f & 0x7fffffffu;
    /* normal: rebias the exponent, add just under half of the last kept bit's weight plus
     * that bit (ties to even), keep the top bits (a carry into the exponent is right, up to
     * infinity) */
    uint32_t rn = (a + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* subnormal or zero: adding 0.5f, whose last mantissa bit weighs binary16's least
     * subnormal (2^-24), has the FPU round to nearest even (its default mode, which nothing
     * here changes; denormals-are-zero and flush-to-zero touch neither operand nor the sum);
     * the low bits are the result. Values from 2^-14 on take the integer path above. */
    const uint32_t magic = (uint32_t)((127 - 15) + (23 - 10) + 1) << 23;
    uint32_t rs = ddp__f32_bits(ddp__bits_f32(a) + ddp__bits_f32(magic)) - magic;
    uint32_t r = ddp__pick(a < (uint32_t)(127 - 14) << 23, rs, rn);
    r = ddp__pick(a >= (uint32_t)(127 + 16) << 23, a > 0x7f800000u ? 0x7e00u : 0x7c00u, r);
    return (uint16_t)(sign | r);
}

#endif
