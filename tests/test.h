/* Minimal test harness: assertions that print both sides and where (libuv's ASSERT_EQ habit).
 * A failing assertion prints and exits 1, so each test executable is one pass/fail for ctest.
 * Tests may use exit(); library code may not. */
#ifndef TANDEM_TEST_H
#define TANDEM_TEST_H

#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* stderr of the calls between test_capture_begin(path) and test_capture_end(), so a test can check
 * the warnings they print; test_capture_end returns the text (free it) and echoes it to stderr,
 * so it still shows in the test's output. */
static int test__saved_stderr = -1;
static const char *test__capture_path;

static inline void test_capture_begin(const char *path) {
    fflush(stderr);
    test__capture_path = path;
    test__saved_stderr = dup(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT(fd >= 0 && test__saved_stderr >= 0);
    dup2(fd, 2);
    close(fd);
}

static inline char *test_capture_end(void) {
    fflush(stderr);
    dup2(test__saved_stderr, 2);
    close(test__saved_stderr);
    FILE *f = fopen(test__capture_path, "r");
    ASSERT(f);
    char *text = calloc(1 << 16, 1);
    ASSERT(text);
    size_t n = fread(text, 1, (1 << 16) - 1, f);
    text[n] = '\0';
    fclose(f);
    fputs(text, stderr);
    return text;
}

/* How often needle occurs in hay. */
static inline size_t test_count(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

#endif
