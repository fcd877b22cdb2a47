/* The smooth activations, vectorised: GELU (the exact, erf form PyTorch's nn.GELU() computes),
 * tanh and the logistic sigmoid. glibc's scalar erff, expf and tanhf ran at ~10 ns an element:
 * tanh took 60% of a LeNet-5's step (examples/models/lenet5.yaml), GELU 24% of the tabular
 * spec's.
 *
 * Bits: every element goes through one loop of BLOCK lanes (the *_block functions), whatever its
 * position: full blocks and the zero-padded tail alike are copied into aligned locals first, so
 * the compiler has one loop to vectorise, no alignment peel and no scalar remainder whose
 * rounding or FMA contraction could differ from the vector body's. An element's result is then a
 * function of its value alone: not of the offset, the length, the chunking or the thread count
 * (tests/tensor/test_activation.c checks this and the accuracy of each function).
 *
 * GELU: y = x Phi(x) and dx = dy (Phi(x) + x phi(x)). Phi(x) = 1/2 erfc(-x / sqrt 2). With
 * a = |x| / sqrt 2, erfc(a) = t exp(-a^2 + P(t)), t = 1 / (1 + a/2): Numerical Recipes' erfcc
 * (Chebyshev fit, relative error < 1.2e-7 for every a >= 0), one formula for the whole line, so
 * no branches, and its relative accuracy carries into the left tail where 1 + erf(x) would
 * cancel. exp is split as exp(-a^2) exp(P(t)) so that exp(-a^2) = exp(-x^2 / 2) is also the
 * normal density's factor: forward and backward share it.
 *
 * tanh(x) = sign(x) t(|x|): below |x| = 0.625 an odd polynomial, t(a) = a + a^3 Q(a^2), Q of
 * degree 5 fitted here for relative error (1.7e-10 in exact arithmetic), since (1 - E) / (1 + E)
 * with E = exp(-2a) cancels near 0; above it that quotient, where E <= 0.29 and the result >=
 * 0.55. E never overflows (the argument is <= 0), so a large |x| gives exactly 1.
 *
 * sigmoid(x) = 1 / (1 + E) for x >= 0 and E / (1 + E) for x < 0, E = exp(-|x|): one division,
 * relative accuracy in both tails, down to the float denormals (0 below x = -104).
 *
 * Measured accuracy (against glibc's double erfc, tanh and exp): see test_activation.c. */
#include <string.h>

#include "tandem/tensor.h"

/* Elements per call of gelu_block: four AVX-512 registers (eight AVX2 ones). Each element is a
 * chain of ~40 dependent operations; a call over one register left the core waiting on that
 * chain, four independent ones per call let it overlap them (1.6x faster). */
enum { BLOCK = 64, LANES = 16 };

/* Every choice in the blocks below (a clamp, the sign, which formula) is td_pick (core.h), a
 * select of bits: given a ?:, GCC branched around the side it did not need, and at AVX2 and
 * below the loops stayed scalar (GELU's too, in the x86-64-v3 build, until this). */

/* exp(r) for |r| <= ln(2) / 2 by its Taylor series to degree 7 (truncation < 6e-9 relative),
 * after the reduction x = n ln 2 + r: n = round(x / ln 2) (the 1.5 * 2^23 trick, exact in
 * round-to-nearest), r = x - n ln 2 in two parts (Cody-Waite). */
static const float SHIFTER = 12582912.0f; /* 1.5 * 2^23: (v + SHIFTER) - SHIFTER rounds v */

static inline float exp_reduced(float x, float *n_out) {
    float n = (x * 1.44269504088896341f + SHIFTER) - SHIFTER;
    float r = x - n * 0.693145751953125f; /* ln 2's first 15 bits: n * hi is exact */
    r = r - n * 1.42860682030941723212e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    *n_out = n;
    return p;
}

/* 2^n for an integral n in [-126, 127], built in the exponent field. A NaN n (from a NaN
 * input, whose result is NaN through p anyway) is taken as 0: converting it to an integer is
 * undefined in C. */
static inline float pow2i(float n) {
    n = td_pick(n == n, n, 0.0f);
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* exp(x) for x in [-87, 88] (clamped), float, no table: 2^n exp(r). */
static inline float exp_clamped(float x) {
    x = td_pick(x < -87.0f, -87.0f, x);
    x = td_pick(x > 88.0f, 88.0f, x);
    float n, p = exp_reduced(x, &n);
    return p * pow2i(n);
}

/* exp(x) for x <= 0 down to the float denormals: x clamped at -104, where exp rounds to 0, and
 * n in [-150, 0] applied as two normal factors 2^(n/2) 2^(n - n/2), so that the last multiply
 * is the one rounding (into the denormals, correctly). */
static inline float exp_nonpositive(float x) {
    x = td_pick(x < -104.0f, -104.0f, x);
    float n, p = exp_reduced(x, &n);
    float n1 = (n * 0.5f + SHIFTER) - SHIFTER; /* n / 2 rounded: n1 and n - n1 in [-75, 0] */
    return (p * pow2i(n1)) * pow2i(n - n1);
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
        float a = td_pick(x[j] < 0.0f, -x[j], x[j]) * 0.70710678118654752f;
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
        float phi = td_pick(x[j] < 0.0f, half_erfc, 1.0f - half_erfc);
        c[j] = phi;
        d[j] = phi + x[j] * (0.3989422804014327f * g); /* pdf = exp(-x^2 / 2) / sqrt(2 pi) */
    }
}

/* y[j] = tanh(x[j]) for the BLOCK values of one aligned block (noinline: one copy, as above). */
static __attribute__((noinline)) void tanh_block(const float *restrict xb, float *restrict yb) {
    const float *x = __builtin_assume_aligned(xb, 64);
    float *y = __builtin_assume_aligned(yb, 64);
#pragma omp simd simdlen(LANES)
    for (int j = 0; j < BLOCK; j++) {
        float a = __builtin_fabsf(x[j]), u = a * a;
        float q = 0.0021382074940330944f; /* (tanh(a) / a - 1) / a^2 on [0, 0.625] */
        q = q * u - 0.008171768751423563f;
        q = q * u + 0.021698201656621178f;
        q = q * u - 0.053946251453983636f;
        q = q * u + 0.13333201332788042f;
        q = q * u - 0.333333306573499f;
        float small = a + (a * u) * q;
        float e = exp_nonpositive(-2.0f * a);
        float large = (1.0f - e) / (1.0f + e);
        y[j] = __builtin_copysignf(td_pick(a < 0.625f, small, large), x[j]);
    }
}

/* y[j] = 1 / (1 + exp(-x[j])) for the BLOCK values of one aligned block. */
static __attribute__((noinline)) void sigmoid_block(const float *restrict xb,
                                                    float *restrict yb) {
    const float *x = __builtin_assume_aligned(xb, 64);
    float *y = __builtin_assume_aligned(yb, 64);
#pragma omp simd simdlen(LANES)
    for (int j = 0; j < BLOCK; j++) {
        float e = exp_nonpositive(-__builtin_fabsf(x[j]));
        y[j] = td_pick(x[j] < 0.0f, e, 1.0f) / (1.0f + e);
    }
}

/* y = f(x) through one of the blocks above: each block of x copied into aligned locals (so the
 * block's loop has no alignment peel), full blocks, then the zero-padded tail. */
static void map_blocks(void (*block)(const float *restrict, float *restrict), float *y,
                       const float *x, size_t n) {
    _Alignas(64) float xb[BLOCK], yb[BLOCK];
    size_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        memcpy(xb, x + i, sizeof xb);
        block(xb, yb);
        memcpy(y + i, yb, sizeof yb);
    }
    if (i == n) return;
    memset(xb, 0, sizeof xb);
    memcpy(xb, x + i, sizeof(float) * (n - i));
    block(xb, yb);
    memcpy(y + i, yb, sizeof(float) * (n - i));
}

/* y[j] = x[j] Phi(x[j]) for the BLOCK values of one aligned block: gelu_block, then the product
 * (one correctly rounded op). */
static __attribute__((noinline)) void gelu_y_block(const float *restrict xb, float *restrict yb) {
    _Alignas(64) float cdf[BLOCK], der[BLOCK];
    gelu_block(xb, cdf, der);
#pragma omp simd
    for (int j = 0; j < BLOCK; j++) yb[j] = xb[j] * cdf[j];
}

void td_gelu(float *y, const float *x, size_t n) {
    map_blocks(gelu_y_block, y, x, n);
}

void td_tanh(float *y, const float *x, size_t n) {
    map_blocks(tanh_block, y, x, n);
}

void td_sigmoid(float *y, const float *x, size_t n) {
    map_blocks(sigmoid_block, y, x, n);
}

/* Like map_blocks, with dy: full blocks, then the zero-padded tail, whose products are taken one
 * at a time (a product rounds the same in either form). */
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
