/* tensor: thread control, sgemm against a naive product, im2col against its definition and
 * col2im as its exact adjoint, reductions. */
#include "tandem/tensor.h"
#include "test.h"

static float rnd(uint64_t i) {
    return td_rng_uniform(99, 0, i) * 2.0f - 1.0f;
}

static void check_im2col(int c, int h, int w, int k, int stride, int pad) {
    int oh = td_conv_out_size(h, k, stride, pad), ow = td_conv_out_size(w, k, stride, pad);
    ASSERT_GT(oh, 0);
    size_t nx = (size_t)c * h * w, ncol = (size_t)c * k * k * oh * ow;
    float *x = malloc(sizeof(float) * nx), *col = malloc(sizeof(float) * ncol);
    float *r = malloc(sizeof(float) * ncol), *back = calloc(nx, sizeof(float));
    for (size_t i = 0; i < nx; i++) x[i] = rnd(i);
    for (size_t i = 0; i < ncol; i++) r[i] = rnd(10000 + i);
    for (size_t i = 0; i < ncol; i += 7) r[i] = -0.0f; /* comes out +0.0 from a zeroed x */
    td_im2col(x, c, h, w, k, k, stride, pad, oh, ow, col);
    /* col against its definition; and col2im's reference, each input's terms of r added in
     * (channel, tap, output position) order from 0, the order the training bits are made in */
    float *ref = calloc(nx, sizeof(float));
    /* ... and into an x that is not zero (td_col2im adds to it), -0 among its values: an input
     * no term reaches, or reached by -0 terms only, keeps its -0 */
    float *start = malloc(sizeof(float) * nx), *ref_start = malloc(sizeof(float) * nx);
    for (size_t i = 0; i < nx; i++) start[i] = i % 3 ? rnd(20000 + i) : -0.0f;
    memcpy(ref_start, start, sizeof(float) * nx);
    for (int ci = 0; ci < c; ci++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++)
                for (int oy = 0; oy < oh; oy++)
                    for (int ox = 0; ox < ow; ox++) {
                        int iy = oy * stride - pad + ki, ix = ox * stride - pad + kj;
                        bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
                        float want = inside ? x[((size_t)ci * h + iy) * w + ix] : 0.0f;
                        size_t row = ((size_t)ci * k + ki) * k + kj;
                        size_t at = row * oh * ow + (size_t)oy * ow + ox;
                        if (inside) ref[((size_t)ci * h + iy) * w + ix] += r[at];
                        if (inside) ref_start[((size_t)ci * h + iy) * w + ix] += r[at];
                        float got = col[at];
                        if (got != want)
                            TEST_FAIL(
                                "im2col c=%d h=%d k=%d s=%d p=%d at (%d,%d,%d,%d,%d): %g vs %g", c,
                                h, k, stride, pad, ci, ki, kj, oy, ox, got, want);
                    }
    /* adjoint: <col2im(r), x> == <r, im2col(x)> */
    td_col2im(r, c, h, w, k, k, stride, pad, oh, ow, back);
    double lhs = td_dot_f64(back, x, nx), rhs = td_dot_f64(r, col, ncol);
    ASSERT_NEAR(lhs, rhs, 1e-4 * (1 + fabs(rhs)));
    /* and bit for bit, against the reference above */
    for (size_t i = 0; i < nx; i++)
        if (memcmp(&back[i], &ref[i], sizeof(float)))
            TEST_FAIL("col2im c=%d h=%d w=%d k=%d s=%d p=%d at %zu: %a vs the ordered sum %a", c, h,
                      w, k, stride, pad, i, (double)back[i], (double)ref[i]);
    td_col2im(r, c, h, w, k, k, stride, pad, oh, ow, start);
    for (size_t i = 0; i < nx; i++)
        if (memcmp(&start[i], &ref_start[i], sizeof(float)))
            TEST_FAIL("col2im into x c=%d h=%d w=%d k=%d s=%d p=%d at %zu: %a vs the ordered sum "
                      "%a",
                      c, h, w, k, stride, pad, i, (double)start[i], (double)ref_start[i]);
    free(ref), free(start), free(ref_start);
    if (stride == 2) { /* the parity-plane path: the same col, and col2im's very bits */
        size_t np = td_parity_floats(c, h, w, k, pad);
        float *planes = malloc(sizeof(float) * np), *col2 = malloc(sizeof(float) * ncol);
        float *back2 = malloc(sizeof(float) * nx);
        for (size_t i = 0; i < np; i++) planes[i] = NAN; /* scratch holds anything */
        for (size_t i = 0; i < nx; i++) back2[i] = NAN;  /* written, not added to */
        td_im2col_s2(x, c, h, w, k, pad, oh, ow, planes, col2);
        ASSERT(memcmp(col2, col, sizeof(float) * ncol) == 0);
        for (size_t i = 0; i < np; i++) planes[i] = NAN;
        td_col2im_s2(r, c, h, w, k, pad, oh, ow, planes, back2);
        for (size_t i = 0; i < nx; i++)
            if (memcmp(&back2[i], &back[i], sizeof(float)))
                TEST_FAIL("col2im_s2 c=%d h=%d w=%d k=%d p=%d at %zu: %.9g vs td_col2im %.9g", c,
                          h, w, k, pad, i, back2[i], back[i]);
        free(planes), free(col2), free(back2);
    }
    free(x), free(col), free(r), free(back);
}

int main(void) {
    td_set_num_threads(2);
    ASSERT_EQ(td_get_num_threads(), 2);
    td_set_num_threads(0);
    ASSERT_GE(td_get_num_threads(), 1);

    /* sgemm, all transpose combinations, against a double-precision naive product */
    int m = 7, n = 9, k = 5;
    float a[64], b[64], c[64];
    for (int i = 0; i < 64; i++) a[i] = rnd((uint64_t)i), b[i] = rnd(100 + (uint64_t)i);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = ta ? m : k, ldb = tb ? k : n;
            for (int i = 0; i < m * n; i++) c[i] = 1.0f;
            td_sgemm(ta, tb, m, n, k, 2.0f, a, lda, b, ldb, 0.5f, c, n);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    double s = 0;
                    for (int p = 0; p < k; p++)
                        s += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                             (tb ? b[j * ldb + p] : b[p * ldb + j]);
                    ASSERT_NEAR(c[i * n + j], 2 * s + 0.5, 1e-5);
                }
        }

    /* the OpenBLAS core for a CPU OpenBLAS does not know (it picked Prescott, its SSE3
     * fallback): the class's core, by the features; any core it picked by name stands */
    const unsigned v4 = TD_CPU_AVX2_FMA | TD_CPU_AVX512, bf16 = v4 | TD_CPU_AVX512_BF16;
    ASSERT_STREQ(td_blas_core_for("Prescott", bf16), "Cooperlake");
    ASSERT_STREQ(td_blas_core_for("PRESCOTT", v4), "SkylakeX");
    ASSERT_STREQ(td_blas_core_for("Prescott", TD_CPU_AVX2_FMA), "Haswell");
    ASSERT(td_blas_core_for("Prescott", 0) == NULL);
    ASSERT(td_blas_core_for("Haswell", bf16) == NULL);
    ASSERT(td_blas_core_for("Zen", bf16) == NULL);
    ASSERT(td_blas_core_for(NULL, bf16) == NULL);
    /* the user's core stands */
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    ASSERT(td_blas_core_wanted() == NULL);
    unsetenv("OPENBLAS_CORETYPE");

    check_im2col(1, 5, 5, 3, 1, 0);
    check_im2col(3, 7, 6, 3, 1, 1);
    /* stride 1 with rows of 8 or more floats that are not the input's ('valid' and other
     * paddings): eight at a time, the ragged end overlapping (LeNet-5's conv2: 10; BasicNet's
     * conv1: 26; 8, 16, 17 and 18 across the vector edges) */
    check_im2col(2, 14, 14, 5, 1, 0);
    check_im2col(1, 28, 28, 3, 1, 0);
    check_im2col(2, 12, 20, 3, 1, 0);
    check_im2col(1, 11, 16, 2, 1, 1);
    check_im2col(2, 9, 15, 3, 1, 2);
    check_im2col(1, 10, 10, 3, 1, 0);
    check_im2col(1, 6, 18, 3, 1, 0);
    check_im2col(3, 5, 7, 2, 1, 0);
    /* col2im at stride 1 by eight-float chunks of x's rows: 5x5 kernels, padding 0-3, rows of
     * 3, 9 and 21 floats (chunks that taps reach in part, at either end) */
    check_im2col(2, 6, 9, 5, 1, 2);
    check_im2col(1, 4, 3, 5, 1, 3);
    check_im2col(3, 5, 21, 5, 1, 1);
    check_im2col(2, 8, 8, 3, 2, 1);
    /* stride 2 at resnet-small's shapes (3x3 pad 1, 1x1 shortcut), also through parity planes */
    check_im2col(3, 32, 32, 3, 2, 1);
    check_im2col(4, 16, 17, 1, 2, 0);
    check_im2col(2, 9, 7, 4, 3, 2);
    /* the parity-plane stride-2 path: odd and even sizes, kernels 1-5, padding 0-2 */
    for (int k2 = 1; k2 <= 5; k2++)
        for (int p2 = 0; p2 <= 2; p2++) {
            check_im2col(2, 7, 9, k2, 2, p2);
            check_im2col(3, 8, 6, k2, 2, p2);
            check_im2col(1, 5, 5, k2, 2, p2);
        }
    check_im2col(3, 16, 16, 3, 2, 1);
    check_im2col(2, 16, 16, 1, 2, 0);
    check_im2col(4, 5, 5, 1, 1, 0);
    /* stride 1, rows as long as x's (one run per tap): resnet-small's conv1, a kernel wider than
     * the image (taps with no valid column, or row), and a 5x5 with padding 2 */
    check_im2col(3, 32, 32, 3, 1, 1);
    check_im2col(2, 4, 1, 3, 1, 1);
    check_im2col(2, 1, 3, 3, 1, 1);
    check_im2col(2, 6, 7, 5, 1, 2);
    ASSERT_EQ(td_conv_out_size(28, 3, 1, 0), 26);
    ASSERT_EQ(td_conv_out_size(2, 5, 1, 0), 0);

    /* elementwise and reductions */
    float v[37], y[37];
    double exact = 0;
    for (int i = 0; i < 37; i++) v[i] = rnd(500 + (uint64_t)i), exact += v[i];
    ASSERT_NEAR(td_sum(v, 37), exact, 1e-5);
    ASSERT(td_sum(v, 37) == td_sum(v, 37));
    td_relu(y, v, 37);
    for (int i = 0; i < 37; i++) ASSERT(y[i] == (v[i] > 0 ? v[i] : 0));
    size_t am = td_argmax(v, 37);
    ASSERT(v[am] == td_max(v, 37));
    td_relu_backward(y, v, v, 37);
    for (int i = 0; i < 37; i++) ASSERT(y[i] == (v[i] > 0 ? v[i] : 0));
    td_fill(y, 37, 2.0f);
    td_add(y, v, 37);
    td_scale(y, 37, 0.5f);
    ASSERT_NEAR(y[3], (2.0f + v[3]) * 0.5f, 1e-7);
    TEST_PASS();
}
