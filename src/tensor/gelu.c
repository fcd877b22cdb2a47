/* GELU (the exact, erf form PyTorch's nn.GELU() computes): y = x Phi(x) and
 * dx = dy (Phi(x) + x phi(x)), vectorised.
 *
 * Bits: every element goes through one loop of BLOCK lanes (gelu_block), whatever its position:
 * full blocks and the zero-padded tail alike are copied into aligned locals first, so the
 * compiler has one loop to vectorise, no alignment peel and no scalar remainder whose rounding
 * or FMA contraction could differ from the vector body's. An element's result is then a
 * function of its value alone: not of the offset, the length, the chunking or the thread count
 * (tests/tensor/test_gelu.c checks this and the accuracy).
 *
 * Phi(x) = 1/2 erfc(-x / sqrt 2). With a = |x| / sqrt 2, erfc(a) = t exp(-a^2 + P(t)),
 * t = 1 / (1 + a/2): Numerical Recipes' erfcc (Chebyshev fit, relative error < 1.2e-7 for every
 * a >= 0), one formula for the whole line, so no branches, and its relative accuracy carries
 * into the left tail where 1 + erf(x) would cancel. exp is split as exp(-a^2) exp(P(t)) so that
 * exp(-a^2) = exp(-x^2 / 2) is also the normal density's factor: forward and backward share it.
 * Measured accuracy (test_gelu.c, against glibc's double erf over [-10, 10]): see the test. */
#include <string.h>

#include "tandem/tensor.h"

/* Elements per call of gelu_block: four AVX-512 registers (eight AVX2 ones). Each element is a
 * chain of ~40 dependent operations; a call over one register left the core waiting on that
 * chain, four independent ones per call let it overlap them (1.6x faster). */
enum { BLOCK = 64, LANES = 16 };

/* exp(x) for x in [-87, 88] (clamped), float, no table: 2^n exp(r) with n = round(x / ln 2)
 * (the 1.5 * 2^23 trick, exact in round-to-nearest), r = x - n ln 2 in two parts (Cody-Waite),
 * exp(r) by its Taylor series to degree 7 (|r| <= 0.347: truncation < 6e-9 relative). */
static inline float exp_clamped(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float shifter = 12582912.0f; /* 1.5 * 2^23 */
    float n = (x * 1.44269504088896341f + shifter) - shifter;
    float r = x - n * 0.693145751953125f; /* ln 2's first 16 bits: n * hi is exact */
    r = r - n * 1.42860682030941723212e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23; /* 2^n, n in [-126, 127] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* cdf[j] = Phi(x[j]) and der[j] = Phi(x[j]) + x[j] phi(x[j]) (GELU's derivative) for the BLOCK
 * values of one aligned block. noinline: one copy of this loop in the program, the one every
 * element runs through; the callers only multiply (one correctly rounded op, whatever the
 * compiler makes of their loops). */
static __attribute__((noinline)) void gelu_block(const float *restrict xb, float *restrict cdf,
                                                 float *restrict der) {
    const float *x = __builtin_assume_aligned(xb, 64);
    float *c = __builtin_assume_aligned(cdf, 64), *d = __builtin_assume_aligned(der, 64);
#pragma omp simd simdlen(LANES)
    for (int j = 0; j < BLOCK; j++) {
        float a = (x[j] < 0.0f ? -x[j] : x[j]) * 0.70710678118654752f;
        float t = 1.0f / (1.0f + 0.5f * a);
        float q = 0.17087277f;
        q = q * t - 0.82215223f;
        q = q * t + 1.48851587f;
        q = q * t - 1.13520398f;
        q = q * t + 0.27886807f;
        q = q * t - 0.18628806f;
        q = q * t + 0.09678418f;
        q = q * t + 0.37409196f;
        q = q * t + 1.00002368f;
        q = q * t - 1.26551223f;
        float g = exp_clamped(-a * a); /* exp(-x^2 / 2) */
        float half_erfc = 0.5f * t * g * exp_clamped(q);
        float phi = x[j] < 0.0f ? half_erfc : 1.0f - half_erfc;
        c[j] = phi;
        d[j] = phi + x[j] * (0.3989422804014327f * g); /* pdf = exp(-x^2 / 2) / sqrt(2 pi) */
    }
}

/* The callers copy each block into aligned locals (so gelu_block's loop has no alignment peel)
 * and only multiply afterwards: full blocks in loops of constant length, which vectorise; the
 * last, partial block zero-padded, its products one at a time (a product rounds the same in
 * either form). */
void td_gelu(float *y, const float *x, size_t n) {
    _Alignas(64) float xb[BLOCK], cdf[BLOCK], der[BLOCK];
    size_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        memcpy(xb, x + i, sizeof xb);
        gelu_block(xb, cdf, der);
#pragma omp simd
        for (int j = 0; j < BLOCK; j++) y[i + j] = xb[j] * cdf[j];
    }
    if (i == n) return;
    memset(xb, 0, sizeof xb);
    memcpy(xb, x + i, sizeof(float) * (n - i));
    gelu_block(xb, cdf, der);
    for (size_t j = 0; i + j < n; j++) y[i + j] = xb[j] * cdf[j];
}

void td_gelu_backward(float *dx, const float *x, const float *dy, size_t n) {
    _Alignas(64) float xb[BLOCK], cdf[BLOCK], der[BLOCK];
    size_t i = 0;
    /* dx may be dy: each element is read before it is written */
    for (; i + BLOCK <= n; i += BLOCK) {
        memcpy(xb, x + i, sizeof xb);
        gelu_block(xb, cdf, der);
#pragma omp simd
        for (int j = 0; j < BLOCK; j++) dx[i + j] = dy[i + j] * der[j];
    }
    if (i == n) return;
    memset(xb, 0, sizeof xb);
    memcpy(xb, x + i, sizeof(float) * (n - i));
    gelu_block(xb, cdf, der);
    for (size_t j = 0; i + j < n; j++) dx[i + j] = dy[i + j] * der[j];
}
