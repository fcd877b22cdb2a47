/* nn: Winograd F(4x4,3x3) convolution against the im2col path on the same weights and data:
 * forward output, every parameter gradient (weight gradient of the Winograd layer) and, through
 * a pointwise front layer, its input gradient. Shapes cover odd and even sizes, padding 0..3
 * (the input-gradient conv then has padding 2..-1) and a partial last chunk. Also checks the
 * TANDEM_CONV_ALGO selection rules. */
#include "tandem/nn.h"
#include "tandem/tensor.h"
#include "test.h"

#include "conv_winograd.h"

typedef struct {
    int c0, c, k, h, w, pad, batch;
} shape;

typedef struct {
    float *out, *grads;
    size_t nout, np;
} result;

/* front 1x1 conv c0 -> c (im2col always: pointwise), then the 3x3 stride-1 conv c -> k. */
static result run(const shape *s, const char *algo) {
    setenv("TANDEM_CONV_ALGO", algo, 1);
    td_model_t *m = td_model_new(s->c0, s->h, s->w);
    ASSERT_OK(td_model_add_conv2d(m, s->c, 1, 1, 0));
    ASSERT_OK(td_model_add_conv2d(m, s->k, 3, 1, s->pad));
    ASSERT_OK(td_model_finalize(m, s->batch));
    unsetenv("TANDEM_CONV_ALGO");
    td_model_init_params(m, 42);
    size_t nin = (size_t)s->batch * td_model_input_size(m);
    result r = {.nout = (size_t)s->batch * td_model_output_size(m), .np = td_model_num_params(m)};
    float *x = malloc(sizeof(float) * nin), *dy = malloc(sizeof(float) * r.nout);
    for (size_t i = 0; i < nin; i++) x[i] = td_rng_uniform(5, 1, i) * 2.0f - 1.0f;
    for (size_t i = 0; i < r.nout; i++) dy[i] = td_rng_uniform(5, 2, i) * 2.0f - 1.0f;
    td_model_zero_grads(m);
    const float *out = td_model_forward(m, x, s->batch, NULL);
    ASSERT(out != NULL);
    r.out = malloc(sizeof(float) * r.nout);
    memcpy(r.out, out, sizeof(float) * r.nout);
    td_model_backward(m, dy, s->batch);
    r.grads = malloc(sizeof(float) * r.np);
    memcpy(r.grads, td_model_grads(m), sizeof(float) * r.np);
    free(x), free(dy);
    td_model_free(m);
    return r;
}

/* max |a - b| / max |b| over a range: Winograd reorders the float sums, so not bitwise. */
static void compare(const char *what, const float *a, const float *b, size_t n, double tol) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        err = TD_MAX(err, fabs((double)a[i] - b[i]));
        scale = TD_MAX(scale, fabs((double)b[i]));
    }
    ASSERT(scale > 0);
    if (!(err <= tol * scale))
        TEST_FAIL("%s: winograd vs im2col max abs error %.3g > %.1g * max |im2col| %.3g", what, err,
                  tol, scale);
}

static bool uses_winograd(int in_c, const char *algo) {
    setenv("TANDEM_CONV_ALGO", algo, 1);
    bool w = false;
    ASSERT_OK(td__conv_use_winograd(in_c, 3, 1, &w));
    unsetenv("TANDEM_CONV_ALGO");
    return w;
}

int main(void) {
    td_set_num_threads(2);
    const shape shapes[] = {
        {2, 8, 6, 7, 9, 1, 6},    /* odd sizes, 'same' padding, 4 + 2 samples */
        {3, 9, 4, 6, 5, 0, 5},    /* valid conv, odd output width */
        {1, 4, 5, 5, 6, 2, 4},    /* input-gradient padding 0 */
        {2, 3, 2, 4, 3, 3, 3},    /* input-gradient padding -1 (cropping) */
        {4, 32, 16, 12, 12, 0, 4}, /* basicnet-like channel counts */
        /* resnet-small's 16x16 and 8x8 stages (power-of-two planes: slot_floats' spacing) with
         * a partial last chunk, an odd 17x17 plane (two samples a pass: two passes a chunk) and
         * basicnet's conv2 plane (26x26 -> 24x24: 36 tiles, one sample a pass, the weight
         * gradient added over four passes) */
        {16, 32, 32, 16, 16, 1, 5},
        {32, 64, 64, 8, 8, 1, 6},
        {3, 8, 5, 17, 17, 1, 4},
        {4, 16, 8, 26, 26, 0, 5},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(shapes); i++) {
        const shape *s = &shapes[i];
        result a = run(s, "winograd"), b = run(s, "im2col");
        ASSERT_EQ(a.nout, b.nout);
        char what[128];
        snprintf(what, sizeof what, "c=%d k=%d %dx%d pad %d: output", s->c, s->k, s->h, s->w,
                 s->pad);
        compare(what, a.out, b.out, a.nout, 1e-5);
        /* layer 0's parameters get their gradient through the tested layer's input gradient */
        size_t n0 = (size_t)s->c * s->c0 + (size_t)s->c;
        snprintf(what, sizeof what, "c=%d k=%d %dx%d pad %d: front grads (via input grad)", s->c,
                 s->k, s->h, s->w, s->pad);
        compare(what, a.grads, b.grads, n0, 1e-5);
        snprintf(what, sizeof what, "c=%d k=%d %dx%d pad %d: 3x3 weight+bias grads", s->c, s->k,
                 s->h, s->w, s->pad);
        compare(what, a.grads + n0, b.grads + n0, a.np - n0, 1e-5);
        printf("  shape %zu (c=%d k=%d %dx%d pad %d batch %d): winograd == im2col within 1e-5\n", i,
               s->c, s->k, s->h, s->w, s->pad, s->batch);
        free(a.out), free(a.grads), free(b.out), free(b.grads);
    }

    /* selection: auto needs in_c >= 8, winograd forces, im2col never; bad value fails */
    ASSERT(!uses_winograd(1, "auto"));
    ASSERT(uses_winograd(8, "auto"));
    ASSERT(uses_winograd(1, "winograd"));
    ASSERT(!uses_winograd(32, "im2col"));
    setenv("TANDEM_CONV_ALGO", "winograd", 1);
    bool w = true;
    ASSERT_OK(td__conv_use_winograd(32, 3, 2, &w)); /* stride 2: never eligible */
    ASSERT(!w);
    ASSERT_OK(td__conv_use_winograd(32, 5, 1, &w));
    ASSERT(!w);
    setenv("TANDEM_CONV_ALGO", "fft", 1);
    td_model_t *m = td_model_new(8, 5, 5);
    ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
    ASSERT_EQ(td_model_finalize(m, 2), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "TANDEM_CONV_ALGO=fft");
    td_model_free(m);
    unsetenv("TANDEM_CONV_ALGO");
    TEST_PASS();
}
