/* Normalisation layers. LayerNorm is per sample (chunked like conv, with per-chunk parameter
 * gradient partials). BatchNorm's statistics span the batch, so it runs batch-level: every sum
 * over the batch is taken per TD_NN_CHUNK chunk of samples (in double) and the chunks are added
 * in chunk order, which gives the same bits for any thread count. Running statistics are not
 * touched here (td_model_update_running_stats; nn.h says why). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

/* ---- layernorm: y = (x - mean) / sqrt(var + eps) * w + b over the sample's D values ---- */

void td__ln_forward_rows(td_model_t *m, td_layer *l, int s0, int s1) {
    size_t d = l->in_size;
    const float *w = m->params + l->param_offset, *b = w + d;
    for (int s = s0; s < s1; s++) {
        const float *x = m->acts[l->src] + (size_t)s * d;
        float *y = l->out + (size_t)s * d;
        double sum = 0, sq = 0;
        for (size_t e = 0; e < d; e++) sum += x[e];
        double mean = sum / (double)d;
        for (size_t e = 0; e < d; e++) sq += (x[e] - mean) * (x[e] - mean);
        float mu = (float)mean, rstd = (float)(1.0 / sqrt(sq / (double)d + l->eps));
        l->stats[2 * s] = mu, l->stats[2 * s + 1] = rstd;
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
        double sg = 0, sgx = 0;
        for (size_t e = 0; e < d; e++) {
            float xh = (x[e] - mu) * rstd;
            if (s == s0)
                pw[e] = dy[e] * xh, pb[e] = dy[e];
            else
                pw[e] += dy[e] * xh, pb[e] += dy[e];
            float g = dy[e] * w[e];
            sg += g, sgx += (double)g * xh;
        }
        if (!l->need_din) continue;
        float mg = (float)(sg / (double)d), mgx = (float)(sgx / (double)d);
        float *dx = din + (size_t)s * ldi;
        /* dx may not alias dy: layernorm is not an in-place layer */
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

/* part[c][0..C) = sum over chunk c's rows of x (center == NULL) or of (x - center)^2. */
static void bn_chunk_sums(const td_layer *l, const float *x0, int batch, int nt,
                          const double *center, double *part) {
    int C = l->in_c, nch = nchunks_of(batch);
    size_t hw = (size_t)l->in_h * l->in_w;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nch > 1)
    for (int c = 0; c < nch; c++) {
        int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
        double *p = part + (size_t)c * 2 * C;
        for (int ch = 0; ch < C; ch++) {
            double acc = 0;
            for (int s = s0; s < s1; s++) {
                const float *x = x0 + (size_t)s * l->in_size + (size_t)ch * hw;
                if (center)
                    for (size_t e = 0; e < hw; e++)
                        acc += (x[e] - center[ch]) * (x[e] - center[ch]);
                else
                    for (size_t e = 0; e < hw; e++) acc += x[e];
            }
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
                for (size_t e = 0; e < hw; e++) y[e] = (x[e] - mu) * r * g + b;
            }
    }
}

/* dgamma += sum(dy xhat), dbeta += sum(dy); training: dx = gamma rstd (dy - mean(dy) -
 * xhat mean(dy xhat)) (the batch statistics depend on x); eval: dx = gamma rstd dy. */
void td__bn_backward(td_model_t *m, int li, int batch, int nt, const float *dout, size_t ldo,
                     float *din, size_t ldi) {
    td_layer *l = &m->layers[li];
    int C = l->in_c, nch = nchunks_of(batch);
    size_t hw = (size_t)l->in_h * l->in_w;
    const float *x0 = m->acts[l->src], *gamma = m->params + l->param_offset;
    float *gg = m->grads + l->param_offset, *gb = gg + C;
    const float *mean = l->stats, *rstd = l->stats + C;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nch > 1)
    for (int c = 0; c < nch; c++) {
        int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
        double *p = l->dpart + (size_t)c * 2 * C;
        for (int ch = 0; ch < C; ch++) {
            double sdy = 0, sdyx = 0;
            float mu = mean[ch], r = rstd[ch];
            for (int s = s0; s < s1; s++) {
                const float *x = x0 + (size_t)s * l->in_size + (size_t)ch * hw;
                const float *dy = dout + (size_t)s * ldo + (size_t)ch * hw;
                for (size_t e = 0; e < hw; e++) {
                    sdy += dy[e];
                    sdyx += (double)dy[e] * ((x[e] - mu) * r);
                }
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
                    for (size_t e = 0; e < hw; e++) {
                        float xh = (x[e] - mu) * r;
                        dx[e] = k * (dy[e] - mdy[ch] - xh * mdyx[ch]);
                    }
                }
        }
    }
    if (mdy != ady) free(mdy);
    if (mdyx != adyx) free(mdyx);
}
