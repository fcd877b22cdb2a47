/* Float kernels: sgemm through CBLAS, convolution lowering, elementwise ops and reductions with
 * a fixed summation order (so a sum never depends on how work was split).
 * `omp simd` marks elementwise loops: the build's -O2 does not vectorise them otherwise, and
 * elementwise results do not depend on vector width. Reductions are never left to the compiler's
 * vectoriser, whose order could depend on alignment. */
#include <cblas.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "tandem/tensor.h"

void td_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

int td_conv_out_size(int in, int kernel, int stride, int pad) {
    if (stride <= 0 || kernel <= 0) return 0;
    int span = in + 2 * pad - kernel;
    return span < 0 ? 0 : span / stride + 1;
}

/* The valid output range [lo, hi) along one axis for kernel offset ki: positions whose input
 * coordinate o * stride - pad + ki lies in [0, in). */
static void valid_range(int in, int out, int stride, int pad, int ki, int *lo, int *hi) {
    int off = ki - pad;
    int l = off >= 0 ? 0 : (-off + stride - 1) / stride;
    int h = (in - 1 - off) >= 0 ? (in - 1 - off) / stride + 1 : 0;
    if (h > out) h = out;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* Rows of n floats, n often 8-30 (a tap's row of a small plane: LeNet-5's conv2 has 10, BasicNet's
 * conv1 26), moved eight at a time: a loop of runtime length that short spent its time in the
 * vectoriser's prologue and scalar tail (td_im2col was 23% of LeNet-5's step). The copy covers
 * the ragged end with one more eight-float move ending at n, over floats already written (the
 * same values). */
typedef float td__v8f __attribute__((vector_size(32), aligned(4), may_alias));
#pragma GCC diagnostic ignored "-Wpsabi"

static inline __attribute__((always_inline)) void copy_row(float *d, const float *s, int n) {
    if (n < 8) {
        for (int j = 0; j < n; j++) d[j] = s[j];
        return;
    }
    for (int j = 0; j + 8 < n; j += 8) *(td__v8f *)(d + j) = *(const td__v8f *)(s + j);
    *(td__v8f *)(d + n - 8) = *(const td__v8f *)(s + n - 8);
}

void td_im2col(const float *x, int c, int h, int w, int kh, int kw, int stride, int pad, int oh,
               int ow, float *col) {
    size_t plane = (size_t)oh * ow;
    for (int ci = 0; ci < c; ci++) {
        const float *xc = x + (size_t)ci * h * w;
        for (int ki = 0; ki < kh; ki++) {
            int ylo, yhi;
            valid_range(h, oh, stride, pad, ki, &ylo, &yhi);
            for (int kj = 0; kj < kw; kj++) {
                float *dst = col + ((size_t)(ci * kh + ki) * kw + kj) * plane;
                int xlo, xhi;
                valid_range(w, ow, stride, pad, kj, &xlo, &xhi);
                if (ylo > 0) memset(dst, 0, sizeof(float) * (size_t)ylo * ow);
                if (stride == 1 && ow == w && yhi > ylo && xhi > xlo) {
                    /* rows as long as x's ('same' padding): the tap is x shifted by a constant,
                     * one run from its first valid value to its last, then the columns that
                     * fell outside x (a neighbouring row's values in the run) zeroed */
                    float *d = dst + (size_t)ylo * ow + xlo;
                    const float *sx = xc + (size_t)(ylo - pad + ki) * w + (xlo - pad + kj);
                    size_t run = (size_t)(yhi - ylo - 1) * ow + (size_t)(xhi - xlo);
#pragma omp simd
                    for (size_t e = 0; e < run; e++) d[e] = sx[e];
                    for (int oy = ylo; oy < yhi; oy++) {
                        float *r = dst + (size_t)oy * ow;
                        for (int ox = 0; ox < xlo; ox++) r[ox] = 0.0f;
                        for (int ox = xhi; ox < ow; ox++) r[ox] = 0.0f;
                    }
                } else
                for (int oy = ylo; oy < yhi; oy++) {
                    float *d = dst + (size_t)oy * ow;
                    const float *srow = xc + (size_t)(oy * stride - pad + ki) * w;
                    for (int ox = 0; ox < xlo; ox++) d[ox] = 0.0f;
                    if (stride == 1) { /* rows are short (26 floats for basicnet): no memcpy call */
                        copy_row(d + xlo, srow - pad + kj + xlo, xhi - xlo);
                    } else { /* other strides (stride 2 has td_im2col_s2): gathers, one copy each */
                        const float *sx = srow - pad + kj;
#pragma omp simd
                        for (int ox = xlo; ox < xhi; ox++) d[ox] = sx[ox * stride];
                    }
                    for (int ox = xhi; ox < ow; ox++) d[ox] = 0.0f;
                }
                if (yhi < oh)
                    memset(dst + (size_t)yhi * ow, 0, sizeof(float) * (size_t)(oh - yhi) * ow);
            }
        }
    }
}

#if defined(__AVX__)
typedef int32_t td__v8i __attribute__((vector_size(32)));

/* td_col2im at stride 1 by eight-float chunks of x's rows: a chunk is loaded once, gets every
 * tap's contribution in td_col2im's order (ki, then kj, ascending) in a register, and is stored
 * once. Adding each tap's row into x in turn stored and reloaded each float k^2 times, on small
 * planes each load overlapping a store still in flight by all but one float, which store-to-load
 * forwarding cannot serve (td_col2im was 10% of LeNet-5's step with its 5x5 conv's input
 * gradient). Which lanes of a chunk tap kj reaches depends on the chunk and kj alone: a masked
 * load per tap (no fault where the lanes would run off col), its other lanes -0, since x + -0 is
 * x for every x, -0 included. The same sums, term by term: the same bits. */
enum { COL2IM_ROWS_MAX_K = 16 };

static void col2im_rows(const float *col, int c, int h, int w, int kh, int kw, int pad, int oh,
                        int ow, float *x) {
    const td__v8i iota = {0, 1, 2, 3, 4, 5, 6, 7}, sign = (td__v8i){0} | INT32_MIN; /* -0 */
    size_t plane = (size_t)oh * ow;
    for (int ix0 = 0; ix0 < w; ix0 += 8) {
        int n = TD_MIN(8, w - ix0);
        td__v8i in[COL2IM_ROWS_MAX_K], out[COL2IM_ROWS_MAX_K];
        for (int kj = 0; kj < kw; kj++) { /* lane i adds the tap's row at ix0 + i + pad - kj */
            int off = ix0 + pad - kj;
            in[kj] = (iota >= -off) & (iota < ow - off) & (iota < n);
            out[kj] = ~in[kj] & sign;
        }
        for (int ci = 0; ci < c; ci++)
            for (int iy = 0; iy < h; iy++) {
                float *xr = x + ((size_t)ci * h + iy) * w + ix0;
                td__v8f acc = (td__v8f)_mm256_maskload_ps(xr, (__m256i)(iota < n));
                for (int ki = 0; ki < kh; ki++) {
                    int oy = iy + pad - ki;
                    if (oy < 0 || oy >= oh) continue;
                    const float *src = col + (size_t)(ci * kh + ki) * kw * plane + (size_t)oy * ow +
                                       ix0 + pad;
                    for (int kj = 0; kj < kw; kj++, src += plane - 1)
                        acc += (td__v8f)((td__v8i)_mm256_maskload_ps(src, (__m256i)in[kj]) |
                                         out[kj]);
                }
                _mm256_maskstore_ps(xr, (__m256i)(iota < n), (__m256)acc);
            }
    }
}
#endif

void td_col2im(const float *col, int c, int h, int w, int kh, int kw, int stride, int pad, int oh,
               int ow, float *x) {
#if defined(__AVX__)
    if (stride == 1 && kw <= COL2IM_ROWS_MAX_K) {
        col2im_rows(col, c, h, w, kh, kw, pad, oh, ow, x);
        return;
    }
#endif
    size_t plane = (size_t)oh * ow;
    for (int ci = 0; ci < c; ci++) {
        float *xc = x + (size_t)ci * h * w;
        for (int ki = 0; ki < kh; ki++) {
            int ylo, yhi;
            valid_range(h, oh, stride, pad, ki, &ylo, &yhi);
            for (int kj = 0; kj < kw; kj++) {
                const float *src = col + ((size_t)(ci * kh + ki) * kw + kj) * plane;
                int xlo, xhi;
                valid_range(w, ow, stride, pad, kj, &xlo, &xhi);
                for (int oy = ylo; oy < yhi; oy++) { /* distinct targets for distinct ox */
                    const float *s = src + (size_t)oy * ow;
                    float *d = xc + (size_t)(oy * stride - pad + ki) * w - pad + kj;
#pragma omp simd
                    for (int ox = xlo; ox < xhi; ox++) d[ox * stride] += s[ox];
                }
            }
        }
    }
}

/* ---- stride 2 through parity planes ----
 * The zero-padded image xp [2 ph, 2 pw] (h + 2 pad by w + 2 pad, rounded up to even, zeros
 * around) split by column parity: E[ci] = xp's even columns and O[ci] = its odd ones, each
 * [2 ph, pw]. The (row, column) parity plane (r, t) is every other row of E (t = 0) or O (t = 1)
 * from row r: P[r][t][ci][a][b] = xp[2a + r][2b + t], rows 2 pw floats apart. Kernel tap (ki, kj)
 * then reads the column-parity half kj & 1 from row ki and column kj >> 1: contiguous runs, where
 * td_im2col gathers every other float for each of the k * k taps.
 * A whole padded plane is split in one long loop (even / odd floats of a row of even length
 * stay even / odd across rows): per-row loops over 16 pairs ran mostly in their scalar tails. */
typedef struct {
    int ph, pw;   /* a parity plane's size: half the padded image, rounded up */
    size_t half;  /* floats of E (or O) per channel: 2 ph * pw */
} parity;

static parity parity_of(int h, int w, int pad) {
    parity p;
    p.ph = (h + 2 * pad + 1) / 2, p.pw = (w + 2 * pad + 1) / 2;
    p.half = (size_t)2 * p.ph * p.pw;
    return p;
}

/* E and O of every channel, then one channel's padded image (the split's and merge's buffer). */
size_t td_parity_floats(int c, int h, int w, int k, int pad) {
    (void)k;
    parity p = parity_of(h, w, pad);
    return (size_t)2 * c * p.half + 2 * p.half;
}

/* Where tap (ki, kj) of channel ci reads its first value (rows 2 pw apart). */
static size_t tap_at(parity p, int ci, int ki, int kj) {
    return (size_t)(2 * ci + (kj & 1)) * p.half + (size_t)ki * p.pw + (size_t)(kj >> 1);
}

/* Channel xc [h, w] into its E and O (eo: E, then O). */
static void split_channel(const float *xc, int h, int w, int pad, parity p, float *xp,
                          float *eo) {
    size_t wp = (size_t)2 * p.pw, n = p.half;
    for (size_t i = 0; i < wp * (size_t)pad; i++) xp[i] = 0.0f;
    for (int iy = 0; iy < h; iy++) { /* short rows (32 floats): loops, not memcpy calls */
        float *r = xp + (size_t)(iy + pad) * wp;
        const float *sr = xc + (size_t)iy * w;
        for (int i = 0; i < pad; i++) r[i] = 0.0f;
#pragma omp simd
        for (int i = 0; i < w; i++) r[pad + i] = sr[i];
        for (size_t i = (size_t)(w + pad); i < wp; i++) r[i] = 0.0f;
    }
    for (size_t i = (size_t)(h + pad) * wp; i < (size_t)2 * p.ph * wp; i++) xp[i] = 0.0f;
    float *e = eo, *o = eo + n;
#pragma omp simd
    for (size_t i = 0; i < n; i++) e[i] = xp[2 * i], o[i] = xp[2 * i + 1];
}

/* A tap's rows, n floats each, pitch apart in the planes and dense in col: copied out, or added
 * back in, with the width a constant where it is one vector or two, as resnet-small's 8- and
 * 16-wide outputs are (a loop of runtime width spent most of its time in its prologue and tail). */
static inline __attribute__((always_inline)) void rows_out(const float *s, size_t pitch, float *d,
                                                           int rows, int n) {
    for (int r = 0; r < rows; r++, s += pitch, d += n)
#pragma omp simd
        for (int i = 0; i < n; i++) d[i] = s[i];
}

static inline __attribute__((always_inline)) void rows_in(float *d, size_t pitch, const float *s,
                                                          int rows, int n) {
    for (int r = 0; r < rows; r++, d += pitch, s += n)
#pragma omp simd
        for (int i = 0; i < n; i++) d[i] += s[i];
}

#define BY_WIDTH(f, n, ...)                                                                      \
    switch (n) {                                                                                 \
    case 8: f(__VA_ARGS__, 8); break;                                                            \
    case 16: f(__VA_ARGS__, 16); break;                                                          \
    default: f(__VA_ARGS__, n);                                                                  \
    }

void td_im2col_s2(const float *x, int c, int h, int w, int k, int pad, int oh, int ow,
                  float *planes, float *col) {
    parity p = parity_of(h, w, pad);
    float *xp = planes + (size_t)2 * c * p.half;
    for (int ci = 0; ci < c; ci++)
        split_channel(x + (size_t)ci * h * w, h, w, pad, p, xp, planes + (size_t)2 * ci * p.half);
    size_t n = (size_t)oh * ow, pitch = (size_t)2 * p.pw;
    for (int ci = 0; ci < c; ci++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                const float *src = planes + tap_at(p, ci, ki, kj);
                float *dst = col + ((size_t)(ci * k + ki) * k + kj) * n;
                BY_WIDTH(rows_out, ow, src, pitch, dst, oh)
            }
}

/* The sums into E and O, in td_col2im's order (ci, ki, kj): every element of x gets its terms
 * in the same order, from the same zero, so the bits are td_col2im's; taps landing in the
 * padding add into it and are dropped by the merge. */
static void add_taps(const float *col, int c, int k, int oh, int ow, parity p, float *planes) {
    memset(planes, 0, sizeof(float) * (size_t)2 * c * p.half);
    size_t n = (size_t)oh * ow, pitch = (size_t)2 * p.pw;
    for (int ci = 0; ci < c; ci++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                float *dst = planes + tap_at(p, ci, ki, kj);
                const float *src = col + ((size_t)(ci * k + ki) * k + kj) * n;
                BY_WIDTH(rows_in, ow, dst, pitch, src, oh)
            }
}

/* Each value gets + 0.0f: td_col2im's sums start from a zeroed x, so a lone -0.0 term comes out
 * +0.0; the planes' own sums already did that (adding the zero again changes no other value). */
void td_col2im_s2(const float *col, int c, int h, int w, int k, int pad, int oh, int ow,
                  float *planes, float *x) {
    parity p = parity_of(h, w, pad);
    add_taps(col, c, k, oh, ow, p, planes);
    float *xp = planes + (size_t)2 * c * p.half;
    size_t wp = (size_t)2 * p.pw, n = p.half;
    for (int ci = 0; ci < c; ci++) {
        const float *e = planes + (size_t)2 * ci * p.half, *o = e + n;
#pragma omp simd
        for (size_t i = 0; i < n; i++) xp[2 * i] = e[i] + 0.0f, xp[2 * i + 1] = o[i] + 0.0f;
        for (int iy = 0; iy < h; iy++) {
            float *d = x + ((size_t)ci * h + iy) * w;
            const float *sr = xp + (size_t)(iy + pad) * wp + pad;
#pragma omp simd
            for (int i = 0; i < w; i++) d[i] = sr[i];
        }
    }
}

void td_fill(float *y, size_t n, float v) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] = v;
}

void td_add(float *y, const float *x, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void td_scale(float *y, size_t n, float s) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] *= s;
}

void td_relu(float *y, const float *x, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void td_relu_backward(float *dx, const float *y, const float *dy, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

/* Eight interleaved partial sums combined pairwise: vectorisable, and the order is a property
 * of n alone. */
float td_sum(const float *x, size_t n) {
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += x[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

float td_max(const float *x, size_t n) {
    float m = n ? x[0] : 0.0f;
    for (size_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

size_t td_argmax(const float *x, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

double td_dot_f64(const float *x, const float *y, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * y[i];
    return s;
}
