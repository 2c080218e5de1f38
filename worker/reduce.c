/* Element-wise reduction kernels for every dtype and op; half types are reduced in float32. */
#include "worker/coll.h"

#include <string.h>

#include "common/banned.h"

float ddp__bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ddp__f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float ddp__f16_to_f32(uint16_t h)
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

uint16_t ddp__f32_to_f16(float x)
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

/*
 * The kernels, written once for three forms: in place, d[i] = op(d[i], s[i]) (A is d_, B s_);
 * into a third buffer, d[i] = op(a[i], s[i]) (A is a_, declared by the caller's macro), so
 * the first step of a reduction need not copy a into d first; and in place on the right,
 * d[i] = op(a[i], d[i]) (A is a_, B d_), for a rank whose own elements are the right operand
 * and already lie where the result goes. Same operations in the same order, same bits.
 */
#define REDUCE_LOOP(T, d, s, n, op, A, B)                                                          \
    do {                                                                                           \
        T *restrict d_ = (T *)(d);                                                                 \
        const T *restrict s_ = (const T *)(s);                                                     \
        (void)s_;                                                                                  \
        switch (op) {                                                                              \
        case DDP_SUM:                                                                              \
        case DDP_AVG:                                                                              \
            for (size_t i = 0; i < (n); i++)                                                       \
                d_[i] = A[i] + B[i];                                                               \
            break;                                                                                 \
        case DDP_MAX:                                                                              \
            for (size_t i = 0; i < (n); i++) {                                                     \
                T r_ = B[i];                                                                       \
                d_[i] = r_ > A[i] ? r_ : A[i];                                                     \
            }                                                                                      \
            break;                                                                                 \
        case DDP_MIN:                                                                              \
            for (size_t i = 0; i < (n); i++) {                                                     \
                T r_ = B[i];                                                                       \
                d_[i] = r_ < A[i] ? r_ : A[i];                                                     \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

#define REDUCE_HALF(d, s, n, op, TO_F, FROM_F, A, B)                                               \
    do {                                                                                           \
        uint16_t *d_ = (uint16_t *)(d);                                                            \
        const uint16_t *s_ = (const uint16_t *)(s);                                                \
        (void)s_;                                                                                  \
        for (size_t i = 0; i < (n); i++) {                                                         \
            float l_ = TO_F(A[i]), r_ = TO_F(B[i]);                                                \
            float r = (op) == DDP_MAX   ? (r_ > l_ ? r_ : l_)                                      \
                      : (op) == DDP_MIN ? (r_ < l_ ? r_ : l_)                                      \
                                        : l_ + r_;                                                 \
            d_[i] = FROM_F(r);                                                                     \
        }                                                                                          \
    } while (0)

/* Signed integer sums wrap (two's complement), as in NCCL and Gloo; done unsigned to be
 * defined behaviour. */
#define REDUCE_INT(T, UT, d, s, n, op, A, B)                                                       \
    do {                                                                                           \
        if ((op) == DDP_SUM || (op) == DDP_AVG) {                                                  \
            UT *restrict d_ = (UT *)(d);                                                           \
            const UT *restrict s_ = (const UT *)(s);                                               \
            (void)s_;                                                                              \
            for (size_t i = 0; i < (n); i++)                                                       \
                d_[i] = (UT)A[i] + (UT)B[i];                                                       \
        } else {                                                                                   \
            REDUCE_LOOP(T, d, s, n, op, A, B);                                                     \
        }                                                                                          \
    } while (0)

/* The left operand a as a_ of type T (unused where A is d_). */
#define LEFT(T, a)                                                                                 \
    const T *restrict a_ = (const T *)(a);                                                         \
    (void)a_

/* The kernels for every dtype; A names the left operand (d_ in place, a_ from a). */
#define REDUCE_ALL(dt, dst, a, src, n, op, A, B)                                                   \
    do {                                                                                           \
        switch (dt) {                                                                              \
        case DDP_F32: {                                                                            \
            LEFT(float, a);                                                                        \
            REDUCE_LOOP(float, dst, src, n, op, A, B);                                             \
        } break;                                                                                   \
        case DDP_F64: {                                                                            \
            LEFT(double, a);                                                                       \
            REDUCE_LOOP(double, dst, src, n, op, A, B);                                            \
        } break;                                                                                   \
        case DDP_I32: {                                                                            \
            LEFT(int32_t, a);                                                                      \
            REDUCE_INT(int32_t, uint32_t, dst, src, n, op, A, B);                                  \
        } break;                                                                                   \
        case DDP_I64: {                                                                            \
            LEFT(int64_t, a);                                                                      \
            REDUCE_INT(int64_t, uint64_t, dst, src, n, op, A, B);                                  \
        } break;                                                                                   \
        case DDP_BF16: {                                                                           \
            LEFT(uint16_t, a);                                                                     \
            REDUCE_HALF(dst, src, n, op, ddp__bf16_to_f32, ddp__f32_to_bf16, A, B);                \
        } break;                                                                                   \
        case DDP_F16: {                                                                            \
            LEFT(uint16_t, a);                                                                     \
            REDUCE_HALF(dst, src, n, op, ddp__f16_to_f32, ddp__f32_to_f16, A, B);                  \
        } break;                                                                                   \
        }                                                                                          \
    } while (0)

void ddp__reduce(void *dst, const void *src, size_t n, enum ddp_dtype dt, enum ddp_redop op)
{
    REDUCE_ALL(dt, dst, NULL, src, n, op, d_, s_);
}

void ddp__reduce_to(void *dst, const void *a, const void *b, size_t n, enum ddp_dtype dt,
                    enum ddp_redop op)
{
    REDUCE_ALL(dt, dst, a, b, n, op, a_, s_);
}

/*
 * d[i] = d[i] / world, or with src (d[i] + s[i]) / world, for a float type T. For a power of
 * two the division is a multiplication by its reciprocal, which is exact, so the two round the
 * same real number and give the same bits (subnormals included); a division costs several
 * times a multiplication, and this pass ran as long as the reduction itself (perf,
 * BENCHMARKS.md "Gradient reducer").
 */
#define AVG_LOOP(T, dst, src, n, world, A, B)                                                      \
    do {                                                                                           \
        T *restrict d_ = (T *)(dst), w_ = (T)(world), inv_ = (T)1 / w_;                            \
        const T *restrict s_ = (const T *)(src);                                                   \
        bool pow2_ = (world) > 0 && ((world) & ((world)-1)) == 0;                                  \
        (void)s_;                                                                                  \
        if ((B) && pow2_)                                                                          \
            for (size_t i = 0; i < (n); i++)                                                       \
                d_[i] = (A[i] + B[i]) * inv_;                                                      \
        else if (B)                                                                                \
            for (size_t i = 0; i < (n); i++)                                                       \
                d_[i] = (A[i] + B[i]) / w_;                                                        \
        else if (pow2_)                                                                            \
            for (size_t i = 0; i < (n); i++)                                                       \
                d_[i] *= inv_;                                                                     \
        else                                                                                       \
            for (size_t i = 0; i < (n); i++)                                                       \
                d_[i] /= w_;                                                                       \
    } while (0)

/* Divides by the world size. */
void ddp__scale_avg(void *buf, size_t n, enum ddp_dtype dt, int world)
{
    switch (dt) {
    case DDP_F32:
        AVG_LOOP(float, buf, NULL, n, world, d_, s_);
        break;
    case DDP_F64:
        AVG_LOOP(double, buf, NULL, n, world, d_, s_);
        break;
    case DDP_I32:
        for (size_t i = 0; i < n; i++)
            ((int32_t *)buf)[i] /= world;
        break;
    case DDP_I64:
        for (size_t i = 0; i < n; i++)
            ((int64_t *)buf)[i] /= world;
        break;
    case DDP_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t *p = (uint16_t *)buf + i;
            *p = ddp__f32_to_bf16(ddp__bf16_to_f32(*p) / (float)world);
        }
        break;
    case DDP_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t *p = (uint16_t *)buf + i;
            *p = ddp__f32_to_f16(ddp__f16_to_f32(*p) / (float)world);
        }
        break;
    }
}

size_t ddp_dtype_size(enum ddp_dtype dt)
{
    switch (dt) {
    case DDP_F32:
    case DDP_I32:
        return 4;
    case DDP_F64:
    case DDP_I64:
        return 8;
    case DDP_BF16:
    case DDP_F16:
        return 2;
    }
    return 0;
}

/* The three forms of it, as REDUCE_ALL's: float types in one pass (AVG_LOOP), the others as
 * the reduction TWO_PASS then the division. */
#define AVG_ALL(dt, dst, a, src, n, world, A, B, TWO_PASS)                                         \
    do {                                                                                           \
        if ((dt) == DDP_F32) {                                                                     \
            LEFT(float, a);                                                                        \
            AVG_LOOP(float, dst, src, n, world, A, B);                                             \
        } else if ((dt) == DDP_F64) {                                                              \
            LEFT(double, a);                                                                       \
            AVG_LOOP(double, dst, src, n, world, A, B);                                            \
        } else {                                                                                   \
            TWO_PASS;                                                                              \
            ddp__scale_avg(dst, n, dt, world);                                                     \
        }                                                                                          \
    } while (0)

/*
 * dst = (dst + src) / world in one pass: the last step of an average, the same two
 * operations per element as ddp__reduce then ddp__scale_avg (so the same bits), reading and
 * writing the shard once instead of twice. Float types; the others take the two passes.
 */
void ddp__reduce_avg(void *dst, const void *src, size_t n, enum ddp_dtype dt, int world)
{
    AVG_ALL(dt, dst, NULL, src, n, world, d_, s_, ddp__reduce(dst, src, n, dt, DDP_AVG));
}

void ddp__reduce_avg_to(void *dst, const void *a, const void *b, size_t n, enum ddp_dtype dt,
                        int world)
{
    AVG_ALL(dt, dst, a, b, n, world, a_, s_, ddp__reduce_to(dst, a, b, n, dt, DDP_AVG));
}

void ddp__reduce_rev(void *dst, const void *a, size_t n, enum ddp_dtype dt, enum ddp_redop op)
{
    REDUCE_ALL(dt, dst, a, NULL, n, op, a_, d_);
}

void ddp__reduce_avg_rev(void *dst, const void *a, size_t n, enum ddp_dtype dt, int world)
{
    AVG_ALL(dt, dst, a, NULL, n, world, a_, d_, ddp__reduce_rev(dst, a, n, dt, DDP_AVG));
}
