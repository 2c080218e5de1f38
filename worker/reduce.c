/* Element-wise reduction kernels for every dtype and op (half types reduced in float32), built
 * for each vector width an x86-64 CPU may have, the widest it has chosen at the first use. */
#include "worker/coll.h"
#include "common/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

/* x86-64 compilers that build a function for an instruction set beyond the build's own */
#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 8))
#define DDP_REDUCE_X86 1
#else
#define DDP_REDUCE_X86 0
#endif

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
        uint16_t *restrict d_ = (uint16_t *)(d);                                                   \
        const uint16_t *restrict s_ = (const uint16_t *)(s);                                       \
        (void)s_;                                                                                  \
        switch (op) { /* a loop per op, so each vectorizes */                                      \
        case DDP_SUM:                                                                              \
        case DDP_AVG:                                                                              \
            for (size_t i = 0; i < (n); i++)                                                       \
                d_[i] = FROM_F(TO_F(A[i]) + TO_F(B[i]));                                           \
            break;                                                                                 \
        case DDP_MAX:                                                                              \
            for (size_t i = 0; i < (n); i++) {                                                     \
                float l_ = TO_F(A[i]), r_ = TO_F(B[i]);                                            \
                d_[i] = FROM_F(r_ > l_ ? r_ : l_);                                                 \
            }                                                                                      \
            break;                                                                                 \
        case DDP_MIN:                                                                              \
            for (size_t i = 0; i < (n); i++) {                                                     \
                float l_ = TO_F(A[i]), r_ = TO_F(B[i]);                                            \
                d_[i] = FROM_F(r_ < l_ ? r_ : l_);                                                 \
            }                                                                                      \
            break;                                                                                 \
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

/* buf[i] /= world (ddp__scale_avg). */
#define SCALE_AVG(buf, n, dt, world)                                                               \
    do {                                                                                           \
        switch (dt) {                                                                              \
        case DDP_F32:                                                                              \
            AVG_LOOP(float, buf, NULL, n, world, d_, s_);                                          \
            break;                                                                                 \
        case DDP_F64:                                                                              \
            AVG_LOOP(double, buf, NULL, n, world, d_, s_);                                         \
            break;                                                                                 \
        case DDP_I32:                                                                              \
            for (size_t i = 0; i < (n); i++)                                                       \
                ((int32_t *)(buf))[i] /= (world);                                                  \
            break;                                                                                 \
        case DDP_I64:                                                                              \
            for (size_t i = 0; i < (n); i++)                                                       \
                ((int64_t *)(buf))[i] /= (world);                                                  \
            break;                                                                                 \
        case DDP_BF16:                                                                             \
            for (size_t i = 0; i < (n); i++) {                                                     \
                uint16_t *p_ = (uint16_t *)(buf) + i;                                              \
                *p_ = ddp__f32_to_bf16(ddp__bf16_to_f32(*p_) / (float)(world));                    \
            }                                                                                      \
            break;                                                                                 \
        case DDP_F16:                                                                              \
            for (size_t i = 0; i < (n); i++) {                                                     \
                uint16_t *p_ = (uint16_t *)(buf) + i;                                              \
                *p_ = ddp__f32_to_f16(ddp__f16_to_f32(*p_) / (float)(world));                      \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* The three forms of it, as REDUCE_ALL's: float types in one pass (AVG_LOOP), the others as
 * the reduction TWO_PASS then the division SCALE. */
#define AVG_ALL(dt, dst, a, src, n, world, A, B, TWO_PASS, SCALE)                                  \
    do {                                                                                           \
        if ((dt) == DDP_F32) {                                                                     \
            LEFT(float, a);                                                                        \
            AVG_LOOP(float, dst, src, n, world, A, B);                                             \
        } else if ((dt) == DDP_F64) {                                                              \
            LEFT(double, a);                                                                       \
            AVG_LOOP(double, dst, src, n, world, A, B);                                            \
        } else {                                                                                   \
            TWO_PASS;                                                                              \
            SCALE(dst, n, dt, world);                                                              \
        }                                                                                          \
    } while (0)

/*
 * Every kernel compiled once for each instruction set (ATTR: its target attribute), under
 * names ending in sfx, and the set's table. The kernels are element-wise: a vector of any
 * width does each element's arithmetic alone and in the same order (and this file is compiled
 * with -ffp-contract=off, so no a * b + c becomes a fused multiply-add in one set and not in
 * another), so every set gives the same bits; tests/unit/test_reduce_isa.c checks it.
 */
struct kernels {
    const char *name;
    void (*reduce)(void *, const void *, size_t, enum ddp_dtype, enum ddp_redop);
    void (*reduce_to)(void *, const void *, const void *, size_t, enum ddp_dtype, enum ddp_redop);
    void (*reduce_rev)(void *, const void *, size_t, enum ddp_dtype, enum ddp_redop);
    void (*scale_avg)(void *, size_t, enum ddp_dtype, int);
    void (*reduce_avg)(void *, const void *, size_t, enum ddp_dtype, int);
    void (*reduce_avg_to)(void *, const void *, const void *, size_t, enum ddp_dtype, int);
    void (*reduce_avg_rev)(void *, const void *, size_t, enum ddp_dtype, int);
    void (*to_half)(uint16_t *, const float *, size_t, enum ddp_dtype, float);
    void (*from_half)(float *, const uint16_t *, size_t, enum ddp_dtype);
};

#define KERNEL_SET(sfx, ATTR)                                                                      \
    ATTR static void reduce_##sfx(void *dst, const void *src, size_t n, enum ddp_dtype dt,         \
                                  enum ddp_redop op)                                               \
    {                                                                                              \
        REDUCE_ALL(dt, dst, NULL, src, n, op, d_, s_);                                             \
    }                                                                                              \
    ATTR static void reduce_to_##sfx(void *dst, const void *a, const void *b, size_t n,            \
                                     enum ddp_dtype dt, enum ddp_redop op)                         \
    {                                                                                              \
        REDUCE_ALL(dt, dst, a, b, n, op, a_, s_);                                                  \
    }                                                                                              \
    ATTR static void reduce_rev_##sfx(void *dst, const void *a, size_t n, enum ddp_dtype dt,       \
                                      enum ddp_redop op)                                           \
    {                                                                                              \
        REDUCE_ALL(dt, dst, a, NULL, n, op, a_, d_);                                               \
    }                                                                                              \
    ATTR static void scale_avg_##sfx(void *buf, size_t n, enum ddp_dtype dt, int world)            \
    {                                                                                              \
        SCALE_AVG(buf, n, dt, world);                                                              \
    }                                                                                              \
    ATTR static void reduce_avg_##sfx(void *dst, const void *src, size_t n, enum ddp_dtype dt,     \
                                      int world)                                                   \
    {                                                                                              \
        AVG_ALL(dt, dst, NULL, src, n, world, d_, s_, reduce_##sfx(dst, src, n, dt, DDP_AVG),      \
                scale_avg_##sfx);                                                                  \
    }                                                                                              \
    ATTR static void reduce_avg_to_##sfx(void *dst, const void *a, const void *b, size_t n,        \
                                         enum ddp_dtype dt, int world)                             \
    {                                                                                              \
        AVG_ALL(dt, dst, a, b, n, world, a_, s_, reduce_to_##sfx(dst, a, b, n, dt, DDP_AVG),       \
                scale_avg_##sfx);                                                                  \
    }                                                                                              \
    ATTR static void reduce_avg_rev_##sfx(void *dst, const void *a, size_t n, enum ddp_dtype dt,   \
                                          int world)                                               \
    {                                                                                              \
        AVG_ALL(dt, dst, a, NULL, n, world, a_, d_, reduce_rev_##sfx(dst, a, n, dt, DDP_AVG),      \
                scale_avg_##sfx);                                                                  \
    }                                                                                              \
    ATTR static void to_half_##sfx(uint16_t *restrict d, const float *restrict s, size_t n,        \
                                   enum ddp_dtype dt, float scale)                                 \
    {                                                                                              \
        if (dt == DDP_F16)                                                                         \
            for (size_t i = 0; i < n; i++)                                                         \
                d[i] = ddp__f32_to_f16(s[i] * scale);                                              \
        else                                                                                       \
            for (size_t i = 0; i < n; i++)                                                         \
                d[i] = ddp__f32_to_bf16(s[i] * scale);                                             \
    }                                                                                              \
    ATTR static void from_half_##sfx(float *restrict d, const uint16_t *restrict s, size_t n,      \
                                     enum ddp_dtype dt)                                            \
    {                                                                                              \
        if (dt == DDP_F16)                                                                         \
            for (size_t i = 0; i < n; i++)                                                         \
                d[i] = ddp__f16_to_f32(s[i]);                                                      \
        else                                                                                       \
            for (size_t i = 0; i < n; i++)                                                         \
                d[i] = ddp__bf16_to_f32(s[i]);                                                     \
    }                                                                                              \
    static const struct kernels kernels_##sfx = {#sfx,                                             \
                                                 reduce_##sfx,                                     \
                                                 reduce_to_##sfx,                                  \
                                                 reduce_rev_##sfx,                                 \
                                                 scale_avg_##sfx,                                  \
                                                 reduce_avg_##sfx,                                 \
                                                 reduce_avg_to_##sfx,                              \
                                                 reduce_avg_rev_##sfx,                             \
                                                 to_half_##sfx,                                    \
                                                 from_half_##sfx}

KERNEL_SET(baseline, );
#if DDP_REDUCE_X86
KERNEL_SET(avx2, __attribute__((target("avx2"))));
KERNEL_SET(avx512, __attribute__((target("avx512f"))));
#endif

/*
 * The set a process uses, chosen at its first reduction: DDP_PG_REDUCE_ISA names one (baseline,
 * avx2, avx512), or auto (the default) takes the widest this CPU has, but AVX2 on CPUs with
 * AVX-512 and without AVX512-VBMI (Skylake and Cascade Lake servers), which lower a core's
 * clock for its 512-bit instructions (glibc keeps its own string functions off them there
 * too). Measured on a 2-vCPU Intel Xeon VM with AVX-512 (BENCHMARKS.md, "Reduction kernels
 * for the CPU's vector width"): the one-node 2-rank all-reduce of an ordinary buffer 1.02-1.24x
 * the baseline set's speed from 1 MiB (1.14x at 64 MiB), of registered memory 1.12-1.20x.
 */
static _Atomic(const struct kernels *) chosen;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

static const struct kernels *find(const char *name)
{
    if (strcmp(name, "baseline") == 0)
        return &kernels_baseline;
#if DDP_REDUCE_X86
    __builtin_cpu_init();
    if (strcmp(name, "avx2") == 0)
        return __builtin_cpu_supports("avx2") ? &kernels_avx2 : NULL;
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") ? &kernels_avx512 : NULL;
#endif
    return NULL;
}

static const struct kernels *widest(void)
{
#if DDP_REDUCE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vbmi"))
        return &kernels_avx512;
    if (__builtin_cpu_supports("avx2"))
        return &kernels_avx2;
#endif
    return &kernels_baseline;
}

static void choose(void)
{
    const char *v = getenv("DDP_PG_REDUCE_ISA");
    const struct kernels *k = NULL;
    if (v && *v && strcmp(v, "auto") != 0 && !(k = find(v)))
        DDP_WARN(PG,
                 "DDP_PG_REDUCE_ISA='%s' is not auto, baseline, avx2 or avx512 on this CPU; "
                 "using auto",
                 v);
    if (!k)
        k = widest();
    atomic_store_explicit(&chosen, k, memory_order_release);
    DDP_DEBUG(PG, "reduction kernels: %s", k->name);
}

static const struct kernels *K(void)
{
    const struct kernels *k = atomic_load_explicit(&chosen, memory_order_acquire);
    if (k)
        return k;
    pthread_once(&chosen_once, choose);
    return atomic_load_explicit(&chosen, memory_order_acquire);
}

int ddp__reduce_isa(const char *name)
{
    const struct kernels *k = find(name);
    if (!k)
        return -1;
    pthread_once(&chosen_once, choose); /* so that a later first use does not undo this */
    atomic_store_explicit(&chosen, k, memory_order_release);
    return 0;
}

const char *ddp__reduce_isa_name(void)
{
    return K()->name;
}

void ddp__reduce(void *dst, const void *src, size_t n, enum ddp_dtype dt, enum ddp_redop op)
{
    K()->reduce(dst, src, n, dt, op);
}

void ddp__reduce_to(void *dst, const void *a, const void *b, size_t n, enum ddp_dtype dt,
                    enum ddp_redop op)
{
    K()->reduce_to(dst, a, b, n, dt, op);
}

void ddp__reduce_rev(void *dst, const void *a, size_t n, enum ddp_dtype dt, enum ddp_redop op)
{
    K()->reduce_rev(dst, a, n, dt, op);
}

void ddp__scale_avg(void *buf, size_t n, enum ddp_dtype dt, int world)
{
    K()->scale_avg(buf, n, dt, world);
}

/*
 * dst = (dst + src) / world in one pass: the last step of an average, the same two
 * operations per element as ddp__reduce then ddp__scale_avg (so the same bits), reading and
 * writing the shard once instead of twice. Float types; the others take the two passes.
 */
void ddp__reduce_avg(void *dst, const void *src, size_t n, enum ddp_dtype dt, int world)
{
    K()->reduce_avg(dst, src, n, dt, world);
}

void ddp__reduce_avg_to(void *dst, const void *a, const void *b, size_t n, enum ddp_dtype dt,
                        int world)
{
    K()->reduce_avg_to(dst, a, b, n, dt, world);
}

void ddp__reduce_avg_rev(void *dst, const void *a, size_t n, enum ddp_dtype dt, int world)
{
    K()->reduce_avg_rev(dst, a, n, dt, world);
}

void ddp__f32_to_half(uint16_t *dst, const float *src, size_t n, enum ddp_dtype dt, float scale)
{
    K()->to_half(dst, src, n, dt, scale);
}

void ddp__half_to_f32(float *dst, const uint16_t *src, size_t n, enum ddp_dtype dt)
{
    K()->from_half(dst, src, n, dt);
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
