/* nn: batchnorm's training statistics (td_model_batch_stats: each channel's micro-batch mean and
 * unbiased variance) against a two-pass long double reference computed here, for inputs whose
 * mean lies 0, 1e2 and 1e4 standard deviations from zero (the sums are one pass, E[x^2] -
 * mean^2 in double: this is where that would lose digits), on both routes the sums take:
 *   - inside the chunks of the segment before (conv -> batchnorm: td_model_forward takes each
 *     sample's sums while the conv's rows are in cache), through the gemm conv (1x1) and the
 *     Winograd one (3x3, 8 channels);
 *   - in td__bn_forward itself (a batchnorm reading the model's input).
 * The two routes give the same bits on the same values (a 1x1 identity conv hands batchnorm
 * the input unchanged), and 1 and 2 threads give the same bits. Odd planes (7 x 9) and a
 * partial last chunk (batch 10) exercise the lane tails and the chunking. Also: the backward of a
 * relu folded into batchnorm (its gate recomputed from x) against the formulas. */
#include <math.h>

#include "nn_internal.h"
#include "test.h"

enum { BATCH = 10, H = 7, W = 9 };

/* kernel 0: batchnorm only; otherwise conv(C -> C, kernel, pad kernel / 2), then batchnorm
 * unless conv_only. */
static td_model_t *build(int c, int kernel, bool conv_only) {
    td_model_t *m = td_model_new(c, H, W);
    if (kernel) ASSERT_OK(td_model_add_conv2d(m, c, kernel, 1, kernel / 2));
    if (!conv_only) ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
    ASSERT_OK(td_model_finalize(m, BATCH));
    td_model_init_params(m, 7);
    return m;
}

/* A 1x1 conv's weight set to the identity and its bias to 0: its output is its input, bit for
 * bit (the gemm adds exact zeros). */
static void make_identity(td_model_t *m, int c) {
    td_layer_info li = td_model_layer(m, 0);
    float *p = td_model_params(m) + li.param_offset;
    memset(p, 0, sizeof(float) * li.param_count);
    for (int i = 0; i < c; i++) p[(size_t)i * c + i] = 1.0f;
}

static const float *forward(td_model_t *m, const float *x, int threads) {
    td_set_num_threads(threads);
    td_forward_ctx ctx = {.training = true, .seed = 1, .step = 0, .sample_ids = NULL};
    const float *y = td_model_forward(m, x, BATCH, &ctx);
    ASSERT(y);
    return y;
}

/* mean and unbiased variance per channel of v [BATCH, c, H, W], two passes in long double */
static void reference(const float *v, int c, long double *mean, long double *var) {
    size_t hw = (size_t)H * W, n = BATCH * hw;
    for (int ch = 0; ch < c; ch++) {
        long double s = 0, q = 0;
        for (int b = 0; b < BATCH; b++)
            for (size_t e = 0; e < hw; e++) s += v[((size_t)b * c + ch) * hw + e];
        mean[ch] = s / n;
        for (int b = 0; b < BATCH; b++)
            for (size_t e = 0; e < hw; e++) {
                long double d = v[((size_t)b * c + ch) * hw + e] - mean[ch];
                q += d * d;
            }
        var[ch] = q / (n - 1);
    }
}

/* stats (mean[c], var[c]) within float rounding of the reference: the mean to 1e-6 of the
 * larger of |mean| and std, the variance to 1e-5 relative */
static void check_stats(const char *what, const float *stats, const long double *mean,
                        const long double *var, int c) {
    double worst_m = 0, worst_v = 0;
    for (int ch = 0; ch < c; ch++) {
        double sd = sqrt((double)var[ch]);
        double em = fabs(stats[ch] - (double)mean[ch]) / fmax(fabs((double)mean[ch]), sd);
        double ev = fabs(stats[c + ch] - (double)var[ch]) / (double)var[ch];
        worst_m = fmax(worst_m, em), worst_v = fmax(worst_v, ev);
    }
    printf("  %-34s mean err %.2e, variance err %.2e\n", what, worst_m, worst_v);
    ASSERT(worst_m <= 1e-6);
    ASSERT(worst_v <= 1e-5);
}

static size_t bits_differing(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

static void check_offset(int c, float offset) {
    size_t n = (size_t)BATCH * c * H * W;
    float *x = malloc(sizeof(float) * n);
    td_rng_fill_uniform(21, (uint64_t)offset, offset - 1.7f, offset + 1.7f, x, n);
    /* a different spread per channel, so that a channel mix-up shows */
    for (size_t i = 0; i < n; i++) {
        int ch = (int)(i / ((size_t)H * W) % (size_t)c);
        x[i] = offset + (x[i] - offset) * (1.0f + 0.5f * (float)ch);
    }
    long double mean[16], var[16];
    char what[80];
    printf("inputs %g std from zero, %d channels:\n", (double)offset, c);

    /* batchnorm on the input: its own sums */
    td_model_t *bn = build(c, 0, false);
    const float *y_bn = forward(bn, x, 1);
    reference(x, c, mean, var);
    check_stats("batchnorm on the input", td_model_batch_stats(bn), mean, var, c);

    /* 1x1 identity conv -> batchnorm: the sums in the conv's chunks, the same bits */
    td_model_t *id = build(c, 1, true), *idbn = build(c, 1, false);
    make_identity(id, c), make_identity(idbn, c);
    ASSERT_EQ(bits_differing(forward(id, x, 1), x, n), 0); /* the identity holds */
    const float *y_idbn = forward(idbn, x, 1);
    check_stats("1x1 conv -> batchnorm", td_model_batch_stats(idbn), mean, var, c);
    size_t ds = bits_differing(td_model_batch_stats(bn), td_model_batch_stats(idbn), 2 * (size_t)c);
    size_t dy = bits_differing(y_bn, y_idbn, n);
    printf("  the two routes: statistics differing %zu, outputs differing %zu\n", ds, dy);
    ASSERT_EQ(ds, 0);
    ASSERT_EQ(dy, 0);

    /* 3x3 conv -> batchnorm (Winograd from 8 channels), against the conv's own output */
    td_model_t *cv = build(c, 3, true), *cvbn = build(c, 3, false);
    reference(forward(cv, x, 1), c, mean, var);
    forward(cvbn, x, 1);
    const float *stats1 = td_model_batch_stats(cvbn);
    snprintf(what, sizeof what, "3x3 conv (%s) -> batchnorm",
             cvbn->layers[0].wino ? "winograd" : "im2col");
    check_stats(what, stats1, mean, var, c);
    float s1[32], *y1 = malloc(sizeof(float) * n);
    memcpy(s1, stats1, sizeof(float) * 2 * (size_t)c);
    memcpy(y1, forward(cvbn, x, 1), sizeof(float) * n);
    const float *y2 = forward(cvbn, x, 2);
    size_t dt = bits_differing(s1, td_model_batch_stats(cvbn), 2 * (size_t)c);
    size_t dty = bits_differing(y1, y2, n);
    printf("  1 vs 2 threads: statistics differing %zu, outputs differing %zu\n", dt, dty);
    ASSERT_EQ(dt, 0);
    ASSERT_EQ(dty, 0);

    free(y1);
    td_model_free(bn), td_model_free(id), td_model_free(idbn), td_model_free(cv);
    td_model_free(cvbn);
    free(x);
}

/* The backward of 1x1 identity conv -> batchnorm -> relu (the relu folded into batchnorm, whose
 * backward recomputes the relu's gate from x), with a non-zero beta and a negative gamma so the
 * gate cuts through every channel: batchnorm's gamma and beta gradients and the conv's weight
 * and bias gradients (which carry batchnorm's input gradient) against the formulas in long
 * double, the gate taken from the reference's own output. */
static void check_relu_backward(void) {
    enum { C = 3 };
    size_t hw = (size_t)H * W, n = (size_t)BATCH * C * hw;
    td_model_t *m = td_model_new(C, H, W);
    ASSERT_OK(td_model_add_conv2d(m, C, 1, 1, 0));
    ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
    ASSERT_OK(td_model_add_relu(m));
    /* an identity after it, so the relu's gradient lives in the model's buffers and the relu is
     * folded (a last layer's gradient is the caller's, never written) */
    ASSERT_OK(td_model_add_dropout(m, 0.0f));
    ASSERT_OK(td_model_finalize(m, BATCH));
    td_model_init_params(m, 7);
    ASSERT(m->layers[1].relu_out); /* the route under test: relu folded into batchnorm */
    make_identity(m, C);
    const float gamma[C] = {1.3f, -0.7f, 0.9f}, beta[C] = {0.4f, -0.2f, 0.1f};
    td_layer_info cl = td_model_layer(m, 0), bl = td_model_layer(m, 1);
    memcpy(td_model_params(m) + bl.param_offset, gamma, sizeof gamma);
    memcpy(td_model_params(m) + bl.param_offset + C, beta, sizeof beta);
    float *x = malloc(sizeof(float) * n), *dout = malloc(sizeof(float) * n);
    td_rng_fill_uniform(31, 0, -2.0f, 2.0f, x, n);
    td_rng_fill_uniform(32, 0, -1.0f, 1.0f, dout, n);
    td_model_zero_grads(m);
    forward(m, x, 1);
    td_model_backward(m, dout, BATCH);
    const float *grads = td_model_grads(m);

    long double *dx = calloc(n, sizeof(long double)), dgam[C], dbet[C], dw[C][C], db[C];
    for (int ch = 0; ch < C; ch++) {
        long double s = 0, q = 0, cnt = (long double)BATCH * hw;
        for (int b = 0; b < BATCH; b++)
            for (size_t e = 0; e < hw; e++) s += x[((size_t)b * C + ch) * hw + e];
        long double mu = s / cnt;
        for (int b = 0; b < BATCH; b++)
            for (size_t e = 0; e < hw; e++) {
                long double d = x[((size_t)b * C + ch) * hw + e] - mu;
                q += d * d;
            }
        long double r = 1.0L / sqrtl(q / cnt + 1e-5L), sg = 0, sgx = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int b = 0; b < BATCH; b++)
                for (size_t e = 0; e < hw; e++) {
                    size_t i = ((size_t)b * C + ch) * hw + e;
                    long double xh = (x[i] - mu) * r;
                    long double g = gamma[ch] * xh + beta[ch] > 0 ? dout[i] : 0.0L;
                    if (pass == 0)
                        sg += g, sgx += g * xh;
                    else
                        dx[i] = gamma[ch] * r * (g - sg / cnt - xh * sgx / cnt);
                }
        dgam[ch] = sgx, dbet[ch] = sg;
    }
    for (int o = 0; o < C; o++) {
        db[o] = 0;
        for (int i = 0; i < C; i++) dw[o][i] = 0;
        for (int b = 0; b < BATCH; b++)
            for (size_t e = 0; e < hw; e++) {
                long double d = dx[((size_t)b * C + o) * hw + e];
                db[o] += d;
                for (int i = 0; i < C; i++) dw[o][i] += d * x[((size_t)b * C + i) * hw + e];
            }
    }
    double scale = 0, err_bn = 0, err_conv = 0;
    for (int ch = 0; ch < C; ch++) scale = fmax(scale, fabs((double)dgam[ch]));
    for (int ch = 0; ch < C; ch++) {
        err_bn = fmax(err_bn, fabs(grads[bl.param_offset + ch] - (double)dgam[ch]) / scale);
        err_bn = fmax(err_bn, fabs(grads[bl.param_offset + C + ch] - (double)dbet[ch]) / scale);
    }
    double cscale = 0;
    for (int o = 0; o < C; o++) {
        cscale = fmax(cscale, fabs((double)db[o]));
        for (int i = 0; i < C; i++) cscale = fmax(cscale, fabs((double)dw[o][i]));
    }
    const float *gw = grads + cl.param_offset, *gbias = gw + cl.weight_count;
    for (int o = 0; o < C; o++) {
        err_conv = fmax(err_conv, fabs(gbias[o] - (double)db[o]));
        for (int i = 0; i < C; i++)
            err_conv = fmax(err_conv, fabs(gw[(size_t)o * C + i] - (double)dw[o][i]));
    }
    err_conv /= cscale;
    printf("batchnorm + folded relu backward: gamma/beta grad err %.2e, conv grad err %.2e "
           "(of max |ref| %.3g, %.3g)\n",
           err_bn, err_conv, scale, cscale);
    ASSERT(err_bn <= 1e-4);
    ASSERT(err_conv <= 1e-3); /* dx sums to ~0 per channel: the conv's sums cancel */
    free(dx), free(x), free(dout);
    td_model_free(m);
}

int main(void) {
    check_relu_backward();
    const float offsets[] = {0.0f, 1e2f, 1e4f};
    for (size_t i = 0; i < TD_ARRAY_LEN(offsets); i++) {
        check_offset(3, offsets[i]);
        check_offset(8, offsets[i]); /* 8 channels: the 3x3 conv is Winograd */
    }
    printf("ok\n");
    return 0;
}
