/* Normalisation layers. LayerNorm is per sample (chunked like conv, with per-chunk parameter
 * gradient partials). BatchNorm's statistics span the batch, so it runs batch-level: the forward's
 * sums are taken per sample (in double; each plane in 8 fixed lanes, below) and added in sample
 * order, the backward's per TD_NN_CHUNK chunk of samples and added in chunk order, which gives
 * the same bits for any thread count. Running statistics are not touched here
 * (td_model_update_running_stats; nn.h says why). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

/* Sums over a run of n values (a batchnorm plane, a layernorm row) in double, in 8 fixed
 * lanes: lane j takes elements e with e % 8 == j, and the lanes are added in one fixed tree at
 * the end. The order depends only on n, never on threads or vector width, and the lanes are
 * independent, so the loops vectorise (`omp simd` over j: the build's -O2 does not otherwise)
 * where a single running double could not: batchnorm's statistics took 3x the time that way
 * (docs/benchmarks.md). */
#define BN_LANES 8

static double lanes_total(const double *acc) {
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* sum of x (center == NULL) or of (x - center)^2 */
static double plane_sum(const float *x, size_t n, const double *center) {
    double acc[BN_LANES] = {0};
    size_t e = 0;
    if (center) {
        double c = *center;
        for (; e + BN_LANES <= n; e += BN_LANES)
#pragma omp simd
            for (int j = 0; j < BN_LANES; j++) {
                double d = (double)x[e + j] - c;
                acc[j] += d * d;
            }
        for (int j = 0; e < n; e++, j++) acc[j] += ((double)x[e] - c) * ((double)x[e] - c);
    } else {
        for (; e + BN_LANES <= n; e += BN_LANES)
#pragma omp simd
            for (int j = 0; j < BN_LANES; j++) acc[j] += (double)x[e + j];
        for (int j = 0; e < n; e++, j++) acc[j] += (double)x[e];
    }
    return lanes_total(acc);
}

/* Batchnorm's output before a folded ReLU, from xhat = (x - mu) rstd: one explicit fused
 * multiply-add, so that the backward recomputes the forward's value bit for bit (a contraction
 * left to the compiler could differ between the two loops). */
static inline __attribute__((always_inline)) float bn_affine(float xhat, float gamma, float beta) {
    return fmaf(xhat, gamma, beta);
}

/* The gradient reaching batchnorm's output: dy, or with a folded ReLU (gate) dy where the output
 * v = bn_affine(xhat) is positive, else 0: what ReLU's backward would have written. v is
 * recomputed from x rather than read back from the output, one stream fewer from L3 in both
 * backward passes. gate is a constant where this is inlined, so the loops stay branch-free and
 * vectorised. */
static inline __attribute__((always_inline)) float gated(float d, float v, bool gate) {
    if (!gate) return d;
    /* a bit mask, not a select: gcc turns the select into a branch here and gives up on the
     * loop (the sums then took 3x as long) */
    uint32_t bits;
    memcpy(&bits, &d, sizeof bits);
    bits &= -(uint32_t)(v > 0.0f);
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* sum of g and of g * xhat, xhat = (x - mu) r, g = gated(dy, bn_affine(xhat, gm, bt), gate),
 * over one plane. Inlined with gate constant. */
static inline __attribute__((always_inline)) void plane_dy_sums(const float *x, const float *dy,
                                                                bool gate, size_t n, float mu,
                                                                float r, float gm, float bt,
                                                                double *sdy, double *sdyx) {
    double a[BN_LANES] = {0}, b[BN_LANES] = {0};
    size_t e = 0;
    for (; e + BN_LANES <= n; e += BN_LANES)
#pragma omp simd
        for (int j = 0; j < BN_LANES; j++) {
            float xh = (x[e + j] - mu) * r, g = gated(dy[e + j], bn_affine(xh, gm, bt), gate);
            a[j] += (double)g;
            b[j] += (double)g * (double)xh;
        }
    for (int j = 0; e < n; e++, j++) {
        float xh = (x[e] - mu) * r, g = gated(dy[e], bn_affine(xh, gm, bt), gate);
        a[j] += (double)g;
        b[j] += (double)g * (double)xh;
    }
    *sdy = lanes_total(a), *sdyx = lanes_total(b);
}

/* layernorm backward: sum of g = dy w and of g xhat, xhat = (x - mu) rstd, over one row */
static void row_g_sums(const float *x, const float *dy, const float *w, size_t n, float mu,
                       float rstd, double *sg, double *sgx) {
    double a[BN_LANES] = {0}, b[BN_LANES] = {0};
    size_t e = 0;
    for (; e + BN_LANES <= n; e += BN_LANES)
#pragma omp simd
        for (int j = 0; j < BN_LANES; j++) {
            float g = dy[e + j] * w[e + j], xh = (x[e + j] - mu) * rstd;
            a[j] += (double)g;
            b[j] += (double)g * (double)xh;
        }
    for (int j = 0; e < n; e++, j++) {
        float g = dy[e] * w[e], xh = (x[e] - mu) * rstd;
        a[j] += (double)g;
        b[j] += (double)g * (double)xh;
    }
    *sg = lanes_total(a), *sgx = lanes_total(b);
}

/* ---- layernorm: y = (x - mean) / sqrt(var + eps) * w + b over the sample's D values ---- */

void td__ln_forward_rows(td_model_t *m, td_layer *l, int s0, int s1) {
    size_t d = l->in_size;
    const float *w = m->params + l->param_offset, *b = w + d;
    for (int s = s0; s < s1; s++) {
        const float *x = m->acts[l->src] + (size_t)s * d;
        float *y = l->out + (size_t)s * d;
        double mean = plane_sum(x, d, NULL) / (double)d;
        double sq = plane_sum(x, d, &mean); /* two passes: no cancellation */
        float mu = (float)mean, rstd = (float)(1.0 / sqrt(sq / (double)d + l->eps));
        l->stats[2 * s] = mu, l->stats[2 * s + 1] = rstd;
#pragma omp simd
        for (size_t e = 0; e < d; e++) y[e] = (x[e] - mu) * rstd * w[e] + b[e];
    }
}

/* dw, db of the chunk's rows go to its partial slot (overwritten by the chunk's first row);
 * dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w. */
void td__ln_backward_rows(td_model_t *m, td_layer *l, int s0, int s1, int chunk, const float *dout,
                          size_t ldo, float *din, size_t ldi) {
    size_t d = l->in_size;
    const float *w = m->params + l->param_offset;
    float *pw = l->partial + (size_t)chunk * l->param_count, *pb = pw + d;
    for (int s = s0; s < s1; s++) {
        const float *x = m->acts[l->src] + (size_t)s * d, *dy = dout + (size_t)s * ldo;
        float mu = l->stats[2 * s], rstd = l->stats[2 * s + 1];
        if (s == s0) {
#pragma omp simd
            for (size_t e = 0; e < d; e++) pw[e] = dy[e] * ((x[e] - mu) * rstd), pb[e] = dy[e];
        } else {
#pragma omp simd
            for (size_t e = 0; e < d; e++) pw[e] += dy[e] * ((x[e] - mu) * rstd), pb[e] += dy[e];
        }
        if (!l->need_din) continue;
        double sg, sgx;
        row_g_sums(x, dy, w, d, mu, rstd, &sg, &sgx);
        float mg = (float)(sg / (double)d), mgx = (float)(sgx / (double)d);
        float *dx = din + (size_t)s * ldi;
        /* dx may not alias dy: layernorm is not an in-place layer */
#pragma omp simd
        for (size_t e = 0; e < d; e++) {
            float xh = (x[e] - mu) * rstd;
            dx[e] = rstd * (dy[e] * w[e] - mg - xh * mgx);
        }
    }
}

/* ---- batchnorm: per channel over n = batch x H x W values ---- */

static int nchunks_of(int batch) {
    return (batch + TD_NN_CHUNK - 1) / TD_NN_CHUNK;
}

/* Sum of x and of x^2 over one plane of n values, in double, in the 8 fixed lanes. */
static void plane_sums(const float *x, size_t n, double *sum, double *sq) {
    double a[BN_LANES] = {0}, b[BN_LANES] = {0};
    size_t e = 0;
    for (; e + BN_LANES <= n; e += BN_LANES)
#pragma omp simd
        for (int j = 0; j < BN_LANES; j++) {
            double d = (double)x[e + j];
            a[j] += d;
            b[j] += d * d;
        }
    for (int j = 0; e < n; e++, j++) a[j] += (double)x[e], b[j] += (double)x[e] * (double)x[e];
    *sum = lanes_total(a), *sq = lanes_total(b);
}

/* One pass per sample: psum[s] = (sum of x per channel [C], sum of x^2 per channel [C]). A
 * float's square is exact in double and the sums run in double, so E[x^2] - mean^2 loses about
 * (|mean| / std)^2 x 1e-16 relative, below a float's rounding up to |mean| = 1e4 std
 * (tests/nn/test_bn_stats checks there against a two-pass reference; batchnorm's inputs are
 * conv or linear outputs, nowhere near). The forward calls this right after the layer before
 * writes the rows (td_model_forward), while they are still in L2: the two passes over the
 * whole batch's activations that the statistics took (the mean, then the squares about it)
 * were a fifth of resnet-small's batchnorm time, all of it waiting on L3. */
void td__bn_sample_sums(td_model_t *m, int li, int s0, int s1) {
    td_layer *l = &m->layers[li];
    int C = l->in_c;
    size_t hw = (size_t)l->in_h * l->in_w;
    for (int s = s0; s < s1; s++) {
        const float *x = m->acts[l->src] + (size_t)s * l->in_size;
        double *p = l->psum + (size_t)s * 2 * C;
        if (hw == 1) /* after a linear layer: the plane is one value (plane_sums' bits too) */
#pragma omp simd
            for (int ch = 0; ch < C; ch++) p[ch] = (double)x[ch], p[C + ch] = (double)x[ch] * x[ch];
        else
            for (int ch = 0; ch < C; ch++) plane_sums(x + (size_t)ch * hw, hw, p + ch, p + C + ch);
    }
}

void td__bn_forward(td_model_t *m, int li, int batch, int nt) {
    td_layer *l = &m->layers[li];
    int C = l->in_c, nch = nchunks_of(batch);
    size_t hw = (size_t)l->in_h * l->in_w;
    const float *x0 = m->acts[l->src], *gamma = m->params + l->param_offset, *beta = gamma + C;
    float *mean = l->stats, *rstd = l->stats + C;
    if (m->training) {
        /* unless td_model_forward took them as the layer before wrote its rows (psum_fresh):
         * the same per-sample sums, here */
        if (!l->psum_fresh) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nch > 1)
            for (int c = 0; c < nch; c++) {
                td__bn_sample_sums(m, li, c * TD_NN_CHUNK, TD_MIN(batch, (c + 1) * TD_NN_CHUNK));
            }
        }
        l->psum_fresh = false;
        /* the samples' sums added in sample order: the same bits for any thread count */
        double n = (double)batch * (double)hw, *tot = l->dpart;
        for (int ch = 0; ch < 2 * C; ch++) tot[ch] = 0;
        for (int s = 0; s < batch; s++) {
            const double *p = l->psum + (size_t)s * 2 * C;
#pragma omp simd
            for (int ch = 0; ch < 2 * C; ch++) tot[ch] += p[ch];
        }
        float *bs = m->batch_stats + l->buf_offset;
        for (int ch = 0; ch < C; ch++) {
            double mu = tot[ch] / n, var = TD_MAX(0.0, tot[C + ch] / n - mu * mu);
            mean[ch] = (float)mu;
            rstd[ch] = (float)(1.0 / sqrt(var + l->eps));
            bs[ch] = (float)mu;
            bs[C + ch] = (float)(n > 1 ? var * n / (n - 1) : var); /* unbiased, as torch keeps */
        }
    } else {
        const float *rm = m->buffers + l->buf_offset, *rv = rm + C;
        for (int ch = 0; ch < C; ch++) {
            mean[ch] = rm[ch];
            rstd[ch] = (float)(1.0 / sqrt((double)rv[ch] + l->eps));
        }
    }
    /* the residual sum this pass takes (sum_into): written to the residual's output, as
     * bn_affine(..) + skip, the residual's own a + b */
    const td_layer *res = l->sum_into ? &m->layers[l->sum_into] : NULL;
    float *y0 = res ? res->out : l->out;
    const float *skip0 = res ? m->acts[res->src2] : NULL;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nch > 1)
    for (int c = 0; c < nch; c++) {
        int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
        if (hw == 1) { /* after a linear layer: a row of C values, vectorised across channels */
            for (int s = s0; s < s1; s++) {
                const float *x = x0 + (size_t)s * l->in_size;
                float *y = y0 + (size_t)s * l->out_size;
                const float *k = skip0 ? skip0 + (size_t)s * l->out_size : NULL;
                if (k)
#pragma omp simd
                    for (int ch = 0; ch < C; ch++)
                        y[ch] = bn_affine((x[ch] - mean[ch]) * rstd[ch], gamma[ch], beta[ch]) +
                                k[ch];
                else if (l->relu_out)
#pragma omp simd
                    for (int ch = 0; ch < C; ch++) {
                        float v = bn_affine((x[ch] - mean[ch]) * rstd[ch], gamma[ch], beta[ch]);
                        y[ch] = v > 0.0f ? v : 0.0f;
                    }
                else
#pragma omp simd
                    for (int ch = 0; ch < C; ch++)
                        y[ch] = bn_affine((x[ch] - mean[ch]) * rstd[ch], gamma[ch], beta[ch]);
            }
            continue;
        }
        for (int s = s0; s < s1; s++)
            for (int ch = 0; ch < C; ch++) {
                const float *x = x0 + (size_t)s * l->in_size + (size_t)ch * hw;
                float *y = y0 + (size_t)s * l->out_size + (size_t)ch * hw;
                float mu = mean[ch], r = rstd[ch], g = gamma[ch], b = beta[ch];
                if (skip0) {
                    const float *k = skip0 + (size_t)s * l->out_size + (size_t)ch * hw;
#pragma omp simd
                    for (size_t e = 0; e < hw; e++) y[e] = bn_affine((x[e] - mu) * r, g, b) + k[e];
                } else if (l->relu_out) /* the folded ReLU: the same bits as its own pass */
#pragma omp simd
                    for (size_t e = 0; e < hw; e++) {
                        float v = bn_affine((x[e] - mu) * r, g, b);
                        y[e] = v > 0.0f ? v : 0.0f;
                    }
                else
#pragma omp simd
                    for (size_t e = 0; e < hw; e++) y[e] = bn_affine((x[e] - mu) * r, g, b);
            }
    }
}

/* dgamma += sum(dy xhat), dbeta += sum(dy); training: dx = gamma rstd (dy - mean(dy) -
 * xhat mean(dy xhat)) (the batch statistics depend on x); eval: dx = gamma rstd dy. With a
 * folded ReLU (relu_out) dy is first gated by the output (recomputed from x), element by
 * element as it is read. */
void td__bn_backward(td_model_t *m, int li, int batch, int nt, const float *dout, size_t ldo,
                     float *din, size_t ldi) {
    td_layer *l = &m->layers[li];
    int C = l->in_c, nch = nchunks_of(batch);
    size_t hw = (size_t)l->in_h * l->in_w;
    const float *x0 = m->acts[l->src], *gamma = m->params + l->param_offset, *beta = gamma + C;
    float *gg = m->grads + l->param_offset, *gb = gg + C;
    const float *mean = l->stats, *rstd = l->stats + C;
    bool gate = l->relu_out; /* a folded ReLU */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nch > 1)
    for (int c = 0; c < nch; c++) {
        int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
        double *p = l->dpart + (size_t)c * 2 * C;
        if (hw == 1) { /* rows of C values (after a linear layer), vectorised across channels */
            for (int ch = 0; ch < 2 * C; ch++) p[ch] = 0;
            for (int s = s0; s < s1; s++) {
                const float *x = x0 + (size_t)s * l->in_size, *dy = dout + (size_t)s * ldo;
                if (gate)
#pragma omp simd
                    for (int ch = 0; ch < C; ch++) {
                        float xh = (x[ch] - mean[ch]) * rstd[ch];
                        float g = gated(dy[ch], bn_affine(xh, gamma[ch], beta[ch]), true);
                        p[ch] += (double)g;
                        p[C + ch] += (double)g * (double)xh;
                    }
                else
#pragma omp simd
                    for (int ch = 0; ch < C; ch++) {
                        float xh = (x[ch] - mean[ch]) * rstd[ch];
                        p[ch] += (double)dy[ch];
                        p[C + ch] += (double)dy[ch] * (double)xh;
                    }
            }
            continue;
        }
        /* Sample by sample, its channels in memory order: one stream through x and dy that the
         * prefetcher follows (channel-major, every 4 KiB plane of a 32x32 layer started cold at
         * a page boundary: this pass took 3.5x the dx pass over the same bytes). Each plane's
         * sums and their order over the samples are unchanged, so are the bits. */
        for (int ch = 0; ch < 2 * C; ch++) p[ch] = 0;
        for (int s = s0; s < s1; s++)
            for (int ch = 0; ch < C; ch++) {
                double a, b;
                const float *x = x0 + (size_t)s * l->in_size + (size_t)ch * hw;
                const float *dy = dout + (size_t)s * ldo + (size_t)ch * hw;
                if (gate)
                    plane_dy_sums(x, dy, true, hw, mean[ch], rstd[ch], gamma[ch], beta[ch], &a,
                                  &b);
                else
                    plane_dy_sums(x, dy, false, hw, mean[ch], rstd[ch], gamma[ch], beta[ch], &a,
                                  &b);
                p[ch] += a, p[C + ch] += b;
            }
    }
    double n = (double)batch * (double)hw;
    float ady[4096], adyx[4096];
    float *mdy = C <= 4096 ? ady : td_xmalloc(sizeof(float) * (size_t)C);
    float *mdyx = C <= 4096 ? adyx : td_xmalloc(sizeof(float) * (size_t)C);
    for (int ch = 0; ch < C; ch++) {
        double sdy = 0, sdyx = 0;
        for (int c = 0; c < nch; c++) {
            sdy += l->dpart[(size_t)c * 2 * C + ch];
            sdyx += l->dpart[(size_t)c * 2 * C + C + ch];
        }
        gg[ch] += (float)sdyx;
        gb[ch] += (float)sdy;
        mdy[ch] = m->training ? (float)(sdy / n) : 0.0f;
        mdyx[ch] = m->training ? (float)(sdyx / n) : 0.0f;
    }
    if (l->need_din) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nch > 1)
        for (int c = 0; c < nch; c++) {
            int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
            for (int s = s0; hw == 1 && s < s1; s++) { /* rows of C values, as above */
                const float *x = x0 + (size_t)s * l->in_size, *dy = dout + (size_t)s * ldo;
                float *dx = din + (size_t)s * ldi;
                if (gate)
#pragma omp simd
                    for (int ch = 0; ch < C; ch++) {
                        float r = rstd[ch], xh = (x[ch] - mean[ch]) * r;
                        float g = gated(dy[ch], bn_affine(xh, gamma[ch], beta[ch]), true);
                        dx[ch] = gamma[ch] * r * (g - mdy[ch] - xh * mdyx[ch]);
                    }
                else
#pragma omp simd
                    for (int ch = 0; ch < C; ch++) {
                        float r = rstd[ch], xh = (x[ch] - mean[ch]) * r;
                        dx[ch] = gamma[ch] * r * (dy[ch] - mdy[ch] - xh * mdyx[ch]);
                    }
            }
            for (int s = s0; hw > 1 && s < s1; s++)
                for (int ch = 0; ch < C; ch++) {
                    const float *x = x0 + (size_t)s * l->in_size + (size_t)ch * hw;
                    const float *dy = dout + (size_t)s * ldo + (size_t)ch * hw;
                    float *dx = din + (size_t)s * ldi + (size_t)ch * hw;
                    float mu = mean[ch], r = rstd[ch], k = gamma[ch] * r;
                    float gm = gamma[ch], bt = beta[ch];
                    float md = mdy[ch], mdx = mdyx[ch]; /* locals: dx could alias them */
                    /* element-wise (dx may be dy: each element is read before it is written) */
                    if (gate) {
#pragma omp simd
                        for (size_t e = 0; e < hw; e++) {
                            float xh = (x[e] - mu) * r;
                            dx[e] = k * (gated(dy[e], bn_affine(xh, gm, bt), true) - md - xh * mdx);
                        }
                    } else {
#pragma omp simd
                        for (size_t e = 0; e < hw; e++) {
                            float xh = (x[e] - mu) * r;
                            dx[e] = k * (dy[e] - md - xh * mdx);
                        }
                    }
                }
            /* the other consumer's part of the input gradient (a residual block's input),
             * added while these rows are in cache */
            td__grad_add_rows(m, l, s0, s1, din, ldi);
        }
    }
    if (mdy != ady) free(mdy);
    if (mdyx != adyx) free(mdyx);
}
