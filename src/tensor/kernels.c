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

/* ---- stride 2 through parity planes ----
 * The zero-padded image xp [h + 2 pad, w + 2 pad] split into its four (row, column) parity
 * planes, P[q][ci][a][b] = xp[2a + (q >> 1)][2b + (q & 1)], each [ph, pw] = half the padded size
 * rounded up. Kernel tap (ki, kj) then reads plane q = 2 (ki & 1) + (kj & 1) shifted by
 * (ki >> 1, kj >> 1): contiguous runs, where td_im2col gathers every other float for each of
 * the k * k taps. A 1x1 kernel reads only plane 0. */
typedef struct {
    int ph, pw, nq; /* plane size; planes used (1 for a 1x1 kernel, else 4) */
    size_t plane;   /* floats per channel of one parity */
} parity;

static parity parity_of(int h, int w, int k, int pad) {
    parity p;
    p.ph = (h + 2 * pad + 1) / 2, p.pw = (w + 2 * pad + 1) / 2, p.nq = k > 1 ? 4 : 1;
    p.plane = (size_t)p.ph * p.pw;
    return p;
}

size_t td_parity_floats(int c, int h, int w, int k, int pad) {
    parity p = parity_of(h, w, k, pad);
    return (size_t)p.nq * c * p.plane;
}

/* The valid part of an even / odd parity row: b with 2b - pad (even) or 2b + 1 - pad (odd)
 * inside [0, w). */
static int even_lo(int pad) { return (pad + 1) / 2; }
static int even_hi(int w, int pad) { return (w + pad + 1) / 2; }
static int odd_lo(int pad) { return pad / 2; }
static int odd_hi(int w, int pad) { return (w + pad) / 2; }

/* Row xr [w] into its even and odd parity rows (odd may be NULL: a 1x1 kernel reads only even
 * columns), each read once: an unpacking loop over column pairs. */
static void split_row(const float *xr, int w, int pad, int pw, float *even, float *odd) {
    for (int b = 0; b < even_lo(pad); b++) even[b] = 0.0f;
    for (int b = even_hi(w, pad); b < pw; b++) even[b] = 0.0f;
    int ix = 0;
    if (odd) {
        for (int b = 0; b < odd_lo(pad); b++) odd[b] = 0.0f;
        for (int b = odd_hi(w, pad); b < pw; b++) odd[b] = 0.0f;
        if (pad & 1) odd[pad >> 1] = xr[0], ix = 1; /* column 0 is odd in the padded row */
    } else if (pad & 1) {
        ix = 1;
    }
    int b0 = (ix + pad) >> 1, pairs = (w - ix) / 2;
    const float *s = xr + ix;
    float *e = even + b0;
    if (odd) {
        float *o = odd + b0;
#pragma omp simd
        for (int j = 0; j < pairs; j++) e[j] = s[2 * j], o[j] = s[2 * j + 1];
    } else {
#pragma omp simd
        for (int j = 0; j < pairs; j++) e[j] = s[2 * j];
    }
    if ((w - ix) & 1) e[pairs] = xr[w - 1];
}

/* The adjoint's last step: row xr [w] from its parity rows (odd NULL: zeros). Each value
 * gets + 0.0f: td_col2im's sums start from a zeroed x, so a lone -0.0 term comes out +0.0;
 * the planes' own sums already did that (adding the zero again changes no other value). */
static void merge_row(const float *even, const float *odd, int w, int pad, float *xr) {
    int ix = 0;
    if (pad & 1) xr[0] = odd ? odd[pad >> 1] + 0.0f : 0.0f, ix = 1;
    int b0 = (ix + pad) >> 1, pairs = (w - ix) / 2;
    const float *e = even + b0;
    float *d = xr + ix;
    if (odd) {
        const float *o = odd + b0;
#pragma omp simd
        for (int j = 0; j < pairs; j++) d[2 * j] = e[j] + 0.0f, d[2 * j + 1] = o[j] + 0.0f;
    } else {
#pragma omp simd
        for (int j = 0; j < pairs; j++) d[2 * j] = e[j] + 0.0f, d[2 * j + 1] = 0.0f;
    }
    if ((w - ix) & 1) xr[w - 1] = e[pairs] + 0.0f;
}

/* Where row a of parity q, channel ci starts in the planes. */
static size_t parity_row(parity p, int c, int q, int ci, int a) {
    return ((size_t)q * c + ci) * p.plane + (size_t)a * p.pw;
}

/* Where kernel tap (ki, kj) of channel ci reads its first value: plane 2 (ki & 1) + (kj & 1),
 * shifted by (ki >> 1, kj >> 1). */
static size_t tap_at(parity p, int c, int ci, int ki, int kj) {
    return parity_row(p, c, 2 * (ki & 1) + (kj & 1), ci, ki >> 1) + (size_t)(kj >> 1);
}

static void split_parities(const float *x, int c, int h, int w, int pad, parity p, float *planes) {
    for (int ci = 0; ci < c; ci++)
        for (int py = 0; py < 2 * p.ph; py++) {
            int r = py & 1, a = py >> 1, iy = py - pad;
            if (r && p.nq == 1) continue;
            float *even = planes + parity_row(p, c, 2 * r, ci, a);
            float *odd = p.nq == 4 ? planes + parity_row(p, c, 2 * r + 1, ci, a) : NULL;
            if (iy < 0 || iy >= h) {
                memset(even, 0, sizeof(float) * (size_t)p.pw);
                if (odd) memset(odd, 0, sizeof(float) * (size_t)p.pw);
                continue;
            }
            split_row(x + ((size_t)ci * h + iy) * w, w, pad, p.pw, even, odd);
        }
}

void td_im2col_s2(const float *x, int c, int h, int w, int k, int pad, int oh, int ow,
                  float *planes, float *col) {
    parity p = parity_of(h, w, k, pad);
    if (k == 1) { /* the column matrix is plane 0 itself ([c][oh][ow]): no copy */
        split_parities(x, c, h, w, pad, p, col);
        return;
    }
    split_parities(x, c, h, w, pad, p, planes);
    size_t n = (size_t)oh * ow;
    for (int ci = 0; ci < c; ci++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                const float *src = planes + tap_at(p, c, ci, ki, kj);
                float *dst = col + ((size_t)(ci * k + ki) * k + kj) * n;
                for (int oy = 0; oy < oh; oy++) {
                    const float *s = src + (size_t)oy * p.pw;
                    float *d = dst + (size_t)oy * ow;
#pragma omp simd
                    for (int ox = 0; ox < ow; ox++) d[ox] = s[ox];
                }
            }
}

/* The sums into the parity planes, in td_col2im's order (ci, ki, kj): every element of x gets
 * its terms in the same order, from the same zero, so the bits are td_col2im's; taps landing
 * in the padding add into it and are dropped by the merge. */
static void add_taps(const float *col, int c, int k, int oh, int ow, parity p, float *planes) {
    memset(planes, 0, sizeof(float) * (size_t)p.nq * c * p.plane);
    size_t n = (size_t)oh * ow;
    for (int ci = 0; ci < c; ci++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                float *dst = planes + tap_at(p, c, ci, ki, kj);
                const float *src = col + ((size_t)(ci * k + ki) * k + kj) * n;
                for (int oy = 0; oy < oh; oy++) {
                    float *d = dst + (size_t)oy * p.pw;
                    const float *s = src + (size_t)oy * ow;
#pragma omp simd
                    for (int ox = 0; ox < ow; ox++) d[ox] += s[ox];
                }
            }
}

void td_col2im_s2(const float *col, int c, int h, int w, int k, int pad, int oh, int ow,
                  float *planes, float *x) {
    parity p = parity_of(h, w, k, pad);
    const float *sums = col; /* a 1x1 kernel: one term per element, col is plane 0 itself */
    if (k > 1) {
        add_taps(col, c, k, oh, ow, p, planes);
        sums = planes;
    }
    for (int ci = 0; ci < c; ci++)
        for (int iy = 0; iy < h; iy++) {
            int r = (iy + pad) & 1, a = (iy + pad) >> 1;
            float *xr = x + ((size_t)ci * h + iy) * w;
            if (r && p.nq == 1) { /* a 1x1 kernel never reads odd rows */
                memset(xr, 0, sizeof(float) * (size_t)w);
                continue;
            }
            merge_row(sums + parity_row(p, c, 2 * r, ci, a),
                      p.nq == 4 ? sums + parity_row(p, c, 2 * r + 1, ci, a) : NULL, w, pad, xr);
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
