/* Minimal test harness: assertions that print both sides and where (libuv's ASSERT_EQ habit).
 * A failing assertion prints and exits 1, so each test executable is one pass/fail for ctest.
 * Tests may use exit(); library code may not. */
#ifndef TANDEM_TEST_H
#define TANDEM_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/core.h"

#define TEST_FAIL(...)                                                                             \
    do {                                                                                           \
        fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                                      \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        exit(1);                                                                                   \
    } while (0)

#define ASSERT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) TEST_FAIL("%s", #cond);                                                       \
    } while (0)

#define ASSERT_INT_OP(a, op, b)                                                                    \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (!(a_ op b_)) TEST_FAIL("%s %s %s: %lld vs %lld", #a, #op, #b, a_, b_);                 \
    } while (0)
#define ASSERT_EQ(a, b) ASSERT_INT_OP(a, ==, b)
#define ASSERT_NE(a, b) ASSERT_INT_OP(a, !=, b)
#define ASSERT_LT(a, b) ASSERT_INT_OP(a, <, b)
#define ASSERT_LE(a, b) ASSERT_INT_OP(a, <=, b)
#define ASSERT_GT(a, b) ASSERT_INT_OP(a, >, b)
#define ASSERT_GE(a, b) ASSERT_INT_OP(a, >=, b)

#define ASSERT_NEAR(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                                 \
        if (!(fabs(a_ - b_) <= (tol)))                                                             \
            TEST_FAIL("%s ~= %s: %.9g vs %.9g (diff %.3g > tol %.3g)", #a, #b, a_, b_,             \
                      fabs(a_ - b_), (double)(tol));                                               \
    } while (0)

#define ASSERT_STREQ(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (!a_ || !b_ || strcmp(a_, b_))                                                          \
            TEST_FAIL("%s == %s: \"%s\" vs \"%s\"", #a, #b, a_ ? a_ : "(null)",                    \
                      b_ ? b_ : "(null)");                                                         \
    } while (0)

/* The haystack (e.g. td_error_msg()) must contain the needle. */
#define ASSERT_CONTAINS(hay, needle)                                                               \
    do {                                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                                    \
        if (!h_ || !strstr(h_, n_)) TEST_FAIL("\"%s\" does not contain \"%s\"", h_ ? h_ : "", n_); \
    } while (0)

/* A call that must succeed; on failure prints the library's error detail. */
#define ASSERT_OK(call)                                                                            \
    do {                                                                                           \
        td_status st_ = (call);                                                                    \
        if (st_ != TD_OK)                                                                          \
            TEST_FAIL("%s returned %s: %s", #call, td_status_name(st_), td_error_msg());           \
    } while (0)

/* A call that must fail with a given status. */
#define ASSERT_STATUS(call, expected)                                                              \
    do {                                                                                           \
        td_status st_ = (call);                                                                    \
        if (st_ != (expected))                                                                     \
            TEST_FAIL("%s returned %s, expected %s (%s)", #call, td_status_name(st_),              \
                      td_status_name(expected), td_error_msg());                                   \
    } while (0)

#define TEST_PASS()                                                                                \
    do {                                                                                           \
        printf("%s: ok\n", __FILE__);                                                              \
        return 0;                                                                                  \
    } while (0)

/* The collectives' summation contract, written independently of the library: pairs (0,1),
 * (2,3), ... added left + right per level, an odd trailing node carried up unchanged. */
static inline float test_tree_sum(const float *v, int count) {
    float a[64];
    if (count < 1 || count > 64) TEST_FAIL("test_tree_sum: count %d not in 1..64", count);
    memcpy(a, v, (size_t)count * sizeof(float));
    int m = count;
    while (m > 1) {
        int k = 0;
        for (int i = 0; i + 1 < m; i += 2) a[k++] = a[i] + a[i + 1];
        if (m & 1) a[k++] = a[m - 1];
        m = k;
    }
    return a[0];
}

#endif
