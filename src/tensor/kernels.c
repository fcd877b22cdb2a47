/* Float kernels: sgemm through CBLAS, convolution lowering, elementwise ops and reductions with
 * a fixed summation order (so a sum never depends on how work was split).
 * `omp simd` marks elementwise loops: the build's -O2 does not vectorise them otherwise, and
 * elementwise results do not depend on vector width. Reductions are never left to the compiler's
 * vectoriser, whose order could depend on alignment. */
#include <cblas.h>
#include <string.h>

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
                for (int oy = ylo; oy < yhi; oy++) {
                    float *d = dst + (size_t)oy * ow;
                    const float *srow = xc + (size_t)(oy * stride - pad + ki) * w;
                    for (int ox = 0; ox < xlo; ox++) d[ox] = 0.0f;
                    if (stride == 1) { /* rows are short (24 floats for basicnet): no memcpy call */
                        const float *sx = srow - pad + kj;
#pragma omp simd
                        for (int ox = xlo; ox < xhi; ox++) d[ox] = sx[ox];
                    } else if (stride == 2) { /* a constant stride: two loads and a permute
                                                * per vector (a variable one was 8 scalar
                                                * loads and inserts, 8% of resnet-small) */
                        const float *sx = srow - pad + kj;
#pragma omp simd
                        for (int ox = xlo; ox < xhi; ox++) d[ox] = sx[2 * ox];
                    } else { /* other strides: gathers, still one copy each */
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

void td_col2im(const float *col, int c, int h, int w, int kh, int kw, int stride, int pad, int oh,
               int ow, float *x) {
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
                for (int oy = ylo; oy < yhi; oy++) {
                    const float *s = src + (size_t)oy * ow;
                    float *drow = xc + (size_t)(oy * stride - pad + ki) * w;
                    if (stride == 1) {
                        float *d = drow - pad + kj;
#pragma omp simd
                        for (int ox = xlo; ox < xhi; ox++) d[ox] += s[ox];
                    } else { /* distinct targets for distinct ox (stride >= 1): no conflict */
                        float *d = drow - pad + kj;
#pragma omp simd
                        for (int ox = xlo; ox < xhi; ox++) d[ox * stride] += s[ox];
                    }
                }
            }
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
