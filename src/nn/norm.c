/* Normalisation layers. LayerNorm is per sample (chunked like conv, with per-chunk parameter
 * gradient partials). BatchNorm's statistics span the batch, so it runs batch-level: every sum
 * over the batch is taken per TD_NN_CHUNK chunk of samples (in double; each sample's plane in 8
 * fixed lanes, below) and the chunks are added in chunk order, which gives the same bits for any
 * thread count. Running statistics are not touched here (td_model_update_running_stats; nn.h
 * says why). */
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

/* The gradient reaching batchnorm's output: dy, or with a folded ReLU (gate: relu_out) dy where
 * the output y is positive, else 0: what ReLU's backward would have written. Both loads are
 * unconditional and gate is a constant where this is inlined, so the loops stay branch-free
 * and vectorised. */
static inline __attribute__((always_inline)) float gated(const float *dy, const float *y, bool gate,
                                                         size_t e) {
    float d = dy[e];
    if (!gate) return d;
    /* a bit mask, not a select: gcc turns the select into a branch here and gives up on the
     * loop (the sums then took 3x as long) */
    uint32_t bits;
    memcpy(&bits, &d, sizeof bits);
    bits &= -(uint32_t)(y[e] > 0.0f);
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* sum of g and of g * xhat, xhat = (x - mu) r, g = gated(dy, y, gate), over one plane. Inlined
 * with gate constant. */
static inline __attribute__((always_inline)) void plane_dy_sums(const float *x, const float *dy,
                                                                const float *y, bool gate,
                                                                size_t n, float mu, float r,
                                                                double *sdy, double *sdyx) {
    double a[BN_LANES] = {0}, b[BN_LANES] = {0};
    size_t e = 0;
    for (; e + BN_LANES <= n; e += BN_LANES)
#pragma omp simd
        for (int j = 0; j < BN_LANES; j++) {
            float g = gated(dy, y, gate, e + j);
            a[j] += (double)g;
            b[j] += (double)g * (double)((x[e + j] - mu) * r);
        }
    for (int j = 0; e < n; e++, j++) {
        float g = gated(dy, y, gate, e);
        a[j] += (double)g;
        b[j] += (double)g * (double)((x[e] - mu) * r);
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

/* part[c][0..C) = sum over chunk c's rows of x (center == NULL) or of (x - center)^2; each
 * plane's lane sum is added in row order. */
static void bn_chunk_sums(const td_layer *l, const float *x0, int batch, int nt,
                          const double *center, double *part) {
    int C = l->in_c, nch = nchunks_of(batch);
    size_t hw = (size_t)l->in_h * l->in_w;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nch > 1)
    for (int c = 0; c < nch; c++) {
        int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
        double *p = part + (size_t)c * 2 * C;
        if (hw == 1) { /* after a linear layer: rows of C values, summed across rows in order */
            for (int ch = 0; ch < C; ch++) p[ch] = 0;
            for (int s = s0; s < s1; s++) {
                const float *x = x0 + (size_t)s * l->in_size;
                if (center)
#pragma omp simd
                    for (int ch = 0; ch < C; ch++)
                        p[ch] += ((double)x[ch] - center[ch]) * ((double)x[ch] - center[ch]);
                else
#pragma omp simd
                    for (int ch = 0; ch < C; ch++) p[ch] += (double)x[ch];
            }
            continue;
        }
        for (int ch = 0; ch < C; ch++) {
            double acc = 0;
            for (int s = s0; s < s1; s++)
                acc += plane_sum(x0 + (size_t)s * l->in_size + (size_t)ch * hw, hw,
                                 center ? center + ch : NULL);
            p[ch] = acc;
        }
    }
}

void td__bn_forward(td_model_t *m, int li, int batch, int nt) {
    td_layer *l = &m->layers[li];
    int C = l->in_c, nch = nchunks_of(batch);
    size_t hw = (size_t)l->in_h * l->in_w;
    const float *x0 = m->acts[l->src], *gamma = m->params + l->param_offset, *beta = gamma + C;
    float *mean = l->stats, *rstd = l->stats + C;
    if (m->training) {
        double n = (double)batch * (double)hw, mu[4096], *mup = C <= 4096 ? mu : NULL;
        double *heap = NULL;
        if (!mup) mup = heap = td_xmalloc(sizeof(double) * (size_t)C);
        bn_chunk_sums(l, x0, batch, nt, NULL, l->dpart);
        for (int ch = 0; ch < C; ch++) {
            double acc = 0;
            for (int c = 0; c < nch; c++) acc += l->dpart[(size_t)c * 2 * C + ch];
            mup[ch] = acc / n;
        }
        bn_chunk_sums(l, x0, batch, nt, mup, l->dpart); /* two passes: no cancellation */
        float *bs = m->batch_stats + l->buf_offset;
        for (int ch = 0; ch < C; ch++) {
            double acc = 0;
            for (int c = 0; c < nch; c++) acc += l->dpart[(size_t)c * 2 * C + ch];
            double var = acc / n;
            mean[ch] = (float)mup[ch];
            rstd[ch] = (float)(1.0 / sqrt(var + l->eps));
            bs[ch] = (float)mup[ch];
            bs[C + ch] = (float)(n > 1 ? var * n / (n - 1) : var); /* unbiased, as torch keeps */
        }
        free(heap);
    } else {
        const float *rm = m->buffers + l->buf_offset, *rv = rm + C;
        for (int ch = 0; ch < C; ch++) {
            mean[ch] = rm[ch];
            rstd[ch] = (float)(1.0 / sqrt((double)rv[ch] + l->eps));
        }
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nch > 1)
    for (int c = 0; c < nch; c++) {
        int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
        for (int s = s0; s < s1; s++)
            for (int ch = 0; ch < C; ch++) {
                const float *x = x0 + (size_t)s * l->in_size + (size_t)ch * hw;
                float *y = l->out + (size_t)s * l->out_size + (size_t)ch * hw;
                float mu = mean[ch], r = rstd[ch], g = gamma[ch], b = beta[ch];
                if (l->relu_out) /* the folded ReLU: the same bits as its own pass */
#pragma omp simd
                    for (size_t e = 0; e < hw; e++) {
                        float v = (x[e] - mu) * r * g + b;
                        y[e] = v > 0.0f ? v : 0.0f;
                    }
                else
#pragma omp simd
                    for (size_t e = 0; e < hw; e++) y[e] = (x[e] - mu) * r * g + b;
            }
    }
}

/* dgamma += sum(dy xhat), dbeta += sum(dy); training: dx = gamma rstd (dy - mean(dy) -
 * xhat mean(dy xhat)) (the batch statistics depend on x); eval: dx = gamma rstd dy. With a
 * folded ReLU (relu_out) dy is first gated by the output, element by element as it is read. */
void td__bn_backward(td_model_t *m, int li, int batch, int nt, const float *dout, size_t ldo,
                     float *din, size_t ldi) {
    td_layer *l = &m->layers[li];
    int C = l->in_c, nch = nchunks_of(batch);
    size_t hw = (size_t)l->in_h * l->in_w;
    const float *x0 = m->acts[l->src], *gamma = m->params + l->param_offset;
    float *gg = m->grads + l->param_offset, *gb = gg + C;
    const float *mean = l->stats, *rstd = l->stats + C;
    const float *y0 = l->relu_out ? l->out : NULL; /* the gate of a folded ReLU */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nch > 1)
    for (int c = 0; c < nch; c++) {
        int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
        double *p = l->dpart + (size_t)c * 2 * C;
        if (hw == 1) { /* rows of C values, as in bn_chunk_sums */
            for (int ch = 0; ch < 2 * C; ch++) p[ch] = 0;
            for (int s = s0; s < s1; s++) {
                const float *x = x0 + (size_t)s * l->in_size, *dy = dout + (size_t)s * ldo;
                const float *y = y0 ? y0 + (size_t)s * l->out_size : dy;
                if (y0)
#pragma omp simd
                    for (int ch = 0; ch < C; ch++) {
                        float g = gated(dy, y, true, (size_t)ch);
                        p[ch] += (double)g;
                        p[C + ch] += (double)g * (double)((x[ch] - mean[ch]) * rstd[ch]);
                    }
                else
#pragma omp simd
                    for (int ch = 0; ch < C; ch++) {
                        float g = gated(dy, y, false, (size_t)ch);
                        p[ch] += (double)g;
                        p[C + ch] += (double)g * (double)((x[ch] - mean[ch]) * rstd[ch]);
                    }
            }
            continue;
        }
        for (int ch = 0; ch < C; ch++) {
            double sdy = 0, sdyx = 0;
            float mu = mean[ch], r = rstd[ch];
            for (int s = s0; s < s1; s++) {
                double a, b;
                const float *x = x0 + (size_t)s * l->in_size + (size_t)ch * hw;
                const float *dy = dout + (size_t)s * ldo + (size_t)ch * hw;
                if (y0)
                    plane_dy_sums(x, dy, y0 + (size_t)s * l->out_size + (size_t)ch * hw, true, hw,
                                  mu, r, &a, &b);
                else
                    plane_dy_sums(x, dy, dy, false, hw, mu, r, &a, &b);
                sdy += a, sdyx += b;
            }
            p[ch] = sdy, p[C + ch] = sdyx;
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
            for (int s = s0; s < s1; s++)
                for (int ch = 0; ch < C; ch++) {
                    const float *x = x0 + (size_t)s * l->in_size + (size_t)ch * hw;
                    const float *dy = dout + (size_t)s * ldo + (size_t)ch * hw;
                    float *dx = din + (size_t)s * ldi + (size_t)ch * hw;
                    float mu = mean[ch], r = rstd[ch], k = gamma[ch] * r;
                    float md = mdy[ch], mdx = mdyx[ch]; /* locals: dx could alias them */
                    /* element-wise (dx may be dy: each element is read before it is written) */
                    if (y0) {
                        const float *y = y0 + (size_t)s * l->out_size + (size_t)ch * hw;
#pragma omp simd
                        for (size_t e = 0; e < hw; e++) {
                            float xh = (x[e] - mu) * r;
                            dx[e] = k * (gated(dy, y, true, e) - md - xh * mdx);
                        }
                    } else {
#pragma omp simd
                        for (size_t e = 0; e < hw; e++) {
                            float xh = (x[e] - mu) * r;
                            dx[e] = k * (dy[e] - md - xh * mdx);
                        }
                    }
                }
        }
    }
    if (mdy != ady) free(mdy);
    if (mdyx != adyx) free(mdyx);
}
