/* A tiny test runner: each TEST runs in its own forked process with a timeout; assertions print
 * both sides. */
#ifndef DDP_TESTS_UNIT_TEST_H
#define DDP_TESTS_UNIT_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

typedef void (*ddp_test_fn)(void);
void ddp_test_register(const char *name, ddp_test_fn fn);

#define TEST(name)                                                                                 \
    static void test_##name(void);                                                                 \
    __attribute__((constructor)) static void register_##name(void)                                 \
    {                                                                                              \
        ddp_test_register(#name, test_##name);                                                     \
    }                                                                                              \
    static void test_##name(void)

#define FAIL_AT(...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                            \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

#define ASSERT_TRUE(x)                                                                             \
    do {                                                                                           \
        if (!(x))                                                                                  \
            FAIL_AT("ASSERT_TRUE(%s) failed", #x);                                                 \
    } while (0)

#define ASSERT_EQ(a, b)                                                                            \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ != b_)                                                                              \
            FAIL_AT("ASSERT_EQ(%s, %s) failed: %lld != %lld", #a, #b, a_, b_);                     \
    } while (0)

#define ASSERT_GE(a, b)                                                                            \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ < b_)                                                                               \
            FAIL_AT("ASSERT_GE(%s, %s) failed: %lld < %lld", #a, #b, a_, b_);                      \
    } while (0)

#define ASSERT_LE(a, b)                                                                            \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (a_ > b_)                                                                               \
            FAIL_AT("ASSERT_LE(%s, %s) failed: %lld > %lld", #a, #b, a_, b_);                      \
    } while (0)

/* Expects a DDP_E* result; prints the names of both codes. */
#define ASSERT_ERR(expr, want)                                                                     \
    do {                                                                                           \
        int r_ = (expr), w_ = (want);                                                              \
        if (r_ != w_)                                                                              \
            FAIL_AT("%s returned %s, expected %s", #expr, ddp_err_name(r_), ddp_err_name(w_));     \
    } while (0)
#define ASSERT_OK(expr) ASSERT_ERR(expr, 0)

#define ASSERT_STREQ(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (!a_ || !b_ || strcmp(a_, b_) != 0)                                                     \
            FAIL_AT("ASSERT_STREQ(%s, %s) failed: \"%s\" != \"%s\"", #a, #b, a_ ? a_ : "(null)",   \
                    b_ ? b_ : "(null)");                                                           \
    } while (0)

#define ASSERT_MEMEQ(a, b, n)                                                                      \
    do {                                                                                           \
        if (memcmp((a), (b), (n)) != 0)                                                            \
            FAIL_AT("ASSERT_MEMEQ(%s, %s, %zu) failed", #a, #b, (size_t)(n));                      \
    } while (0)

#endif
