/* nn: every layer's backward (input and parameter gradients) and the losses against central
 * finite differences; residual blocks (identity and projection shortcuts, nested); batchnorm in
 * training (batch statistics, whose gradient flows through the mean and variance) and eval.
 *
 * The loss is L = sum(out * r) for a fixed random r, so dout = r. Each model puts a parametered
 * layer in front of the layer under test: the gradient w.r.t. that layer's parameters flows
 * through the tested layer's input gradient, so checking all parameter gradients checks both.
 * Models built only from conv/linear are linear in any single parameter, so central
 * differences are exact up to rounding; relu and maxpool are fed values kept away from their
 * kinks (identity front layer, well-separated inputs) so no perturbation crosses one. */
#include "tandem/nn.h"
#include "tandem/tensor.h"
#include "test.h"

static float rnd(uint64_t stream, uint64_t i) {
    return td_rng_uniform(1234, stream, i) * 2.0f - 1.0f;
}

typedef struct {
    const char *what;
    int batch;
    float eps;
    double atol, rtol;
    bool training;
    float *x; /* input, batch * input_size */
} check_cfg;

static double loss_of(td_model_t *m, const check_cfg *c, const float *r, const uint64_t *ids) {
    td_forward_ctx ctx = {.training = c->training, .seed = 9, .step = 4, .sample_ids = ids};
    const float *out = td_model_forward(m, c->x, c->batch, &ctx);
    ASSERT(out != NULL);
    return td_dot_f64(out, r, (size_t)c->batch * td_model_output_size(m));
}

static void check(td_model_t *m, const check_cfg *c) {
    size_t nout = (size_t)c->batch * td_model_output_size(m), np = td_model_num_params(m);
    float *r = malloc(sizeof(float) * nout);
    for (size_t i = 0; i < nout; i++) r[i] = rnd(77, i);
    uint64_t ids[16];
    for (int i = 0; i < c->batch; i++) ids[i] = 1000 + 7 * (uint64_t)i;
    td_model_zero_grads(m);
    loss_of(m, c, r, ids);
    td_model_backward(m, r, c->batch);
    float *ana = malloc(sizeof(float) * np);
    memcpy(ana, td_model_grads(m), sizeof(float) * np);
    float *p = td_model_params(m);
    double worst = 0;
    size_t stride = np > 600 ? np / 300 : 1, checked = 0;
    for (size_t j = 0; j < np; j += stride) {
        float keep = p[j];
        p[j] = keep + c->eps;
        double fp = loss_of(m, c, r, ids);
        p[j] = keep - c->eps;
        double fm = loss_of(m, c, r, ids);
        p[j] = keep;
        double num = (fp - fm) / (2.0 * c->eps), err = fabs(num - ana[j]);
        double tol = c->atol + c->rtol * fabs(num);
        if (!(err <= tol))
            TEST_FAIL("%s: d loss / d param[%zu]: analytic %.7g vs finite difference %.7g "
                      "(err %.3g > tol %.3g)",
                      c->what, j, ana[j], num, err, tol);
        worst = TD_MAX(worst, err / (c->atol + c->rtol * fabs(num)));
        checked++;
    }
    printf("  %-34s %zu params checked, worst err/tol %.3f\n", c->what, checked, worst);
    free(r), free(ana);
}

static float *rand_input(size_t n, uint64_t stream) {
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = rnd(stream, i);
    return x;
}

/* Sets layer li's weight to the identity (square) and its bias to zero. */
static void set_identity(td_model_t *m, int li, int n) {
    td_layer_info in = td_model_layer(m, li);
    float *w = td_model_params(m) + in.param_offset;
    memset(w, 0, sizeof(float) * in.param_count);
    for (int i = 0; i < n; i++) w[(size_t)i * n + i] = 1.0f;
}

/* Gives layer li's parameters random values in [0.5, 1.5) (weights) and [-0.5, 0.5) (biases):
 * norm layers start at weight 1, bias 0, which would hide a swapped weight and bias. */
static void randomize_layer(td_model_t *m, int li, uint64_t stream) {
    td_layer_info in = td_model_layer(m, li);
    float *w = td_model_params(m) + in.param_offset;
    for (size_t i = 0; i < in.param_count; i++)
        w[i] = rnd(stream, i) * 0.5f + (i < in.weight_count ? 1.0f : 0.0f);
}

static void finish(td_model_t *m, check_cfg *c, uint64_t seed) {
    ASSERT_OK(td_model_finalize(m, c->batch));
    td_model_init_params(m, seed);
}

int main(void) {
    td_set_num_threads(2);
    const double atol = 2e-3, rtol = 2e-3;

    { /* linear as first layer (parameter gradients only) and linear's input gradient */
        td_model_t *m = td_model_new(7, 1, 1);
        ASSERT_OK(td_model_add_linear(m, 6));
        ASSERT_OK(td_model_add_linear(m, 4));
        check_cfg c = {"linear -> linear", 5, 0.05f, atol, rtol, false, rand_input(35, 1)};
        finish(m, &c, 1);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* conv: padding, stride 2, pointwise; input gradients of the 2nd and 3rd; 6 samples
       * so the last chunk is partial */
        td_model_t *m = td_model_new(2, 7, 6);
        ASSERT_OK(td_model_add_conv2d(m, 3, 3, 1, 1));
        ASSERT_OK(td_model_add_conv2d(m, 4, 3, 2, 1));
        ASSERT_OK(td_model_add_conv2d(m, 2, 1, 1, 0));
        ASSERT_OK(td_model_add_conv2d(m, 3, 2, 1, 0));
        check_cfg c = {
            "conv k3p1 -> k3s2p1 -> k1 -> k2", 6, 0.05f, atol, rtol, false, rand_input(6 * 84, 2)};
        finish(m, &c, 2);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    for (int algo = 0; algo < 2; algo++) {
        /* 3x3 stride-1 convs with padding 1, 0, 2 and 3 on odd sizes (7x5 -> 7x5 -> 5x3 -> 7x5
         * -> 11x9), forced through both algorithms: Winograd's forward, weight gradient and
         * (from the 2nd layer on) input gradient, whose padding 2 - p is -1 for the last */
        setenv("TANDEM_CONV_ALGO", algo ? "winograd" : "im2col", 1);
        td_model_t *m = td_model_new(3, 7, 5);
        ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
        ASSERT_OK(td_model_add_conv2d(m, 3, 3, 1, 0));
        ASSERT_OK(td_model_add_conv2d(m, 3, 3, 1, 2));
        ASSERT_OK(td_model_add_conv2d(m, 2, 3, 1, 3));
        check_cfg c = {algo ? "conv3x3 p1,p0,p2,p3 (winograd)" : "conv3x3 p1,p0,p2,p3 (im2col)",
                       6,
                       0.05f,
                       atol,
                       rtol,
                       false,
                       rand_input(6 * 105, 9)};
        finish(m, &c, 9);
        check(m, &c);
        free(c.x), td_model_free(m);
        unsetenv("TANDEM_CONV_ALGO");
    }
    { /* 5x5 stride-1 convs of 64 lowered rows or more, read in place (implicit gemm): padding
       * 2, 1, 3 and 2 on odd sizes (5x21 -> 5x21 -> 3x19 -> 5x21 -> 5x21); the first three
       * have fewer channels out than lowered rows (the weight gradient read in place too, taps
       * in rows of 4, the fifth alone, then rows of 5), the last more (its weight gradient
       * lowered); input gradients from the second on */
        td_model_t *m = td_model_new(3, 5, 21);
        ASSERT_OK(td_model_add_conv2d(m, 8, 5, 1, 2));
        ASSERT_OK(td_model_add_conv2d(m, 3, 5, 1, 1));
        ASSERT_OK(td_model_add_conv2d(m, 3, 5, 1, 3));
        ASSERT_OK(td_model_add_conv2d(m, 76, 5, 1, 2));
        check_cfg c = {"conv5x5 p2,p1,p3,p2 (implicit)", 6, 0.05f, atol, rtol, false,
                       rand_input(6 * 315, 10)};
        finish(m, &c, 10);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* relu: identity front layer and |x| >= 0.3 keep pre-activations away from 0 */
        td_model_t *m = td_model_new(4, 1, 1);
        ASSERT_OK(td_model_add_linear(m, 4));
        ASSERT_OK(td_model_add_relu(m));
        ASSERT_OK(td_model_add_linear(m, 3));
        check_cfg c = {
            "linear(I) -> relu -> linear", 5, 0.05f, atol, rtol, false, rand_input(20, 3)};
        for (int i = 0; i < 20; i++) c.x[i] = (c.x[i] < 0 ? -0.3f : 0.3f) + 0.7f * c.x[i];
        finish(m, &c, 3);
        set_identity(m, 0, 4);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    /* maxpool 2/2, overlapping 3/2, and (eight outputs at a time, the last block overlapping the
     * one before, a scalar remainder) 3/2 on a row of 17 outputs and 3/1 on one of 18 */
    for (int variant = 0; variant < 4; variant++) {
        static const int hs[] = {6, 7, 5, 4}, ws[] = {6, 7, 35, 20}, ks[] = {2, 3, 3, 3};
        static const int sts[] = {2, 2, 2, 1};
        static const char *const names[] = {
            "conv1x1(I) -> maxpool2/2 -> linear", "conv1x1(I) -> maxpool3/2 -> linear",
            "conv1x1(I) -> maxpool3/2, 17 wide", "conv1x1(I) -> maxpool3/1, 18 wide"};
        int h = hs[variant], w = ws[variant], k = ks[variant];
        td_model_t *m = td_model_new(2, h, w);
        ASSERT_OK(td_model_add_conv2d(m, 2, 1, 1, 0));
        ASSERT_OK(td_model_add_maxpool2d(m, k, sts[variant]));
        ASSERT_OK(td_model_add_flatten(m));
        ASSERT_OK(td_model_add_linear(m, 3));
        size_t n = (size_t)5 * 2 * h * w;
        check_cfg c = {names[variant],
                       5,
                       0.01f,
                       atol,
                       rtol,
                       false,
                       malloc(sizeof(float) * n)};
        /* distinct values 0.0125 apart in a scrambled order (7919 is prime, so i -> 7919 i
         * mod n is a permutation): no ties, and no eps-perturbation reorders a window */
        for (size_t i = 0; i < n; i++)
            c.x[i] = 0.0125f * (float)((i * 7919) % n) - 0.00625f * (float)n;
        finish(m, &c, 4);
        set_identity(m, 0, 2);
        c.eps = 0.002f;
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    /* avgpool in eight-output blocks: 2/2 on 5 x 19 (a row of 9 outputs, eight in lanes, one
     * after, and an odd row and column no window covers, whose gradient is 0), overlapping 3/2
     * on the same, and 3/1 on 4 x 20 (18 outputs: forward blocks overlapping at the end,
     * backward blocks of eight adding in output order, then two one at a time) */
    for (int variant = 0; variant < 3; variant++) {
        static const char *const names[] = {"conv1x1(I) -> avgpool2/2 -> linear",
                                            "conv1x1(I) -> avgpool3/2 -> linear",
                                            "conv1x1(I) -> avgpool3/1 -> linear"};
        int h = variant == 2 ? 4 : 5, w = variant == 2 ? 20 : 19, k = variant ? 3 : 2;
        td_model_t *m = td_model_new(2, h, w);
        ASSERT_OK(td_model_add_conv2d(m, 2, 1, 1, 0));
        ASSERT_OK(td_model_add_avgpool2d(m, k, variant == 2 ? 1 : 2));
        ASSERT_OK(td_model_add_flatten(m));
        ASSERT_OK(td_model_add_linear(m, 3));
        check_cfg c = {names[variant],
                       4,
                       0.05f,
                       atol,
                       rtol,
                       false,
                       rand_input(4 * 2 * h * w, 7)};
        finish(m, &c, 6);
        set_identity(m, 0, 2);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* dropout in training mode: a fixed mask makes it linear */
        td_model_t *m = td_model_new(5, 1, 1);
        ASSERT_OK(td_model_add_linear(m, 8));
        ASSERT_OK(td_model_add_dropout(m, 0.4f));
        ASSERT_OK(td_model_add_linear(m, 3));
        check_cfg c = {"linear -> dropout(0.4, training) -> linear",
                       6,
                       0.05f,
                       atol,
                       rtol,
                       true,
                       rand_input(30, 5)};
        finish(m, &c, 5);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* log_softmax (smooth: O(eps^2) truncation) and flatten */
        td_model_t *m = td_model_new(2, 2, 2);
        ASSERT_OK(td_model_add_conv2d(m, 3, 1, 1, 0));
        ASSERT_OK(td_model_add_flatten(m));
        ASSERT_OK(td_model_add_linear(m, 6));
        ASSERT_OK(td_model_add_log_softmax(m));
        check_cfg c = {"conv -> flatten -> linear -> log_softmax",
                       4,
                       0.01f,
                       atol,
                       5e-3,
                       false,
                       rand_input(32, 6)};
        finish(m, &c, 6);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* gelu, tanh, sigmoid: smooth, so central differences are O(eps^2) accurate */
        td_status (*add[3])(td_model_t *) = {td_model_add_gelu, td_model_add_tanh,
                                             td_model_add_sigmoid};
        const char *what[3] = {"linear -> gelu -> linear", "linear -> tanh -> linear",
                               "linear -> sigmoid -> linear"};
        for (int a = 0; a < 3; a++) {
            td_model_t *m = td_model_new(6, 1, 1);
            ASSERT_OK(td_model_add_linear(m, 7));
            ASSERT_OK(add[a](m));
            ASSERT_OK(td_model_add_linear(m, 3));
            check_cfg c = {what[a], 6, 0.01f, atol, rtol, false, rand_input(36, 20 + a)};
            for (int i = 0; i < 36; i++) c.x[i] *= 2.5f; /* reach the curved parts */
            finish(m, &c, 20 + a);
            check(m, &c);
            free(c.x), td_model_free(m);
        }
    }
    { /* layernorm over a [3, 2, 2] map with non-trivial weight and bias */
        td_model_t *m = td_model_new(2, 2, 2);
        ASSERT_OK(td_model_add_conv2d(m, 3, 1, 1, 0));
        ASSERT_OK(td_model_add_layernorm(m, 1e-5f));
        ASSERT_OK(td_model_add_flatten(m));
        ASSERT_OK(td_model_add_linear(m, 4));
        check_cfg c = {
            "conv -> layernorm -> linear", 6, 0.01f, atol, 5e-3, false, rand_input(48, 30)};
        finish(m, &c, 30);
        randomize_layer(m, 1, 31);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    for (int train = 1; train >= 0; train--) { /* batchnorm2d, batch statistics and running */
        td_model_t *m = td_model_new(2, 3, 3);
        ASSERT_OK(td_model_add_conv2d(m, 3, 2, 1, 0));
        ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
        ASSERT_OK(td_model_add_flatten(m));
        ASSERT_OK(td_model_add_linear(m, 4));
        check_cfg c = {train ? "conv -> batchnorm2d (training) -> linear"
                             : "conv -> batchnorm2d (eval) -> linear",
                       6,
                       0.01f,
                       atol,
                       5e-3,
                       train,
                       rand_input(6 * 18, 32)};
        finish(m, &c, 32);
        randomize_layer(m, 1, 33);
        float *buf = td_model_buffers(m); /* running mean, var */
        for (int i = 0; i < 3; i++) buf[i] = 0.1f * (float)i, buf[3 + i] = 0.5f + 0.3f * (float)i;
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* batchnorm1d between linears, 9 samples: chunks of 4, 4, 1 */
        td_model_t *m = td_model_new(5, 1, 1);
        ASSERT_OK(td_model_add_linear(m, 4));
        ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
        ASSERT_OK(td_model_add_linear(m, 3));
        check_cfg c = {"linear -> batchnorm1d (training) -> linear",
                       9,
                       0.01f,
                       atol,
                       5e-3,
                       true,
                       rand_input(45, 34)};
        finish(m, &c, 34);
        randomize_layer(m, 1, 35);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    for (int variant = 0; variant < 2; variant++) { /* avgpool 2/2 and overlapping 3/2 */
        td_model_t *m = td_model_new(2, 7, 7);
        ASSERT_OK(td_model_add_conv2d(m, 2, 1, 1, 0));
        ASSERT_OK(td_model_add_avgpool2d(m, variant ? 3 : 2, 2));
        ASSERT_OK(td_model_add_flatten(m));
        ASSERT_OK(td_model_add_linear(m, 3));
        check_cfg c = {variant ? "conv -> avgpool3/2 -> linear" : "conv -> avgpool2/2 -> linear",
                       5,
                       0.05f,
                       atol,
                       rtol,
                       false,
                       rand_input(5 * 98, 36)};
        finish(m, &c, 36);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* global average pool straight into linear (no flatten needed: [C, 1, 1]) */
        td_model_t *m = td_model_new(2, 5, 4);
        ASSERT_OK(td_model_add_conv2d(m, 3, 3, 1, 1));
        ASSERT_OK(td_model_add_global_avgpool(m));
        ASSERT_OK(td_model_add_linear(m, 2));
        check_cfg c = {"conv -> global_avgpool -> linear",
                       5,
                       0.05f,
                       atol,
                       rtol,
                       false,
                       rand_input(5 * 40, 37)};
        finish(m, &c, 37);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* residual, identity shortcut, after a parametered layer (so both branches' input
       * gradients are summed) and with a relu as the body's first layer (which must not
       * overwrite the block's input in place) */
        td_model_t *m = td_model_new(6, 1, 1);
        ASSERT_OK(td_model_add_linear(m, 6));
        ASSERT_OK(td_model_begin_residual(m));
        ASSERT_OK(td_model_add_relu(m));
        ASSERT_OK(td_model_add_linear(m, 6));
        ASSERT_OK(td_model_add_tanh(m));
        ASSERT_OK(td_model_add_residual(m));
        ASSERT_OK(td_model_add_linear(m, 3));
        check_cfg c = {"linear(I) -> residual[relu, linear, tanh] -> linear",
                       6,
                       0.01f,
                       atol,
                       rtol,
                       false,
                       rand_input(36, 38)};
        for (int i = 0; i < 36; i++) c.x[i] = (c.x[i] < 0 ? -0.3f : 0.3f) + 0.7f * c.x[i];
        finish(m, &c, 38);
        set_identity(m, 0, 6); /* keeps relu inputs away from 0 */
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* a residual block on the model's input (no input gradient needed anywhere), with
       * parameters in both branches */
        td_model_t *m = td_model_new(2, 4, 4);
        ASSERT_OK(td_model_begin_residual(m));
        ASSERT_OK(td_model_add_conv2d(m, 3, 3, 1, 1));
        ASSERT_OK(td_model_add_sigmoid(m));
        ASSERT_OK(td_model_begin_shortcut(m));
        ASSERT_OK(td_model_add_conv2d(m, 3, 1, 1, 0));
        ASSERT_OK(td_model_add_residual(m));
        ASSERT_OK(td_model_add_flatten(m));
        ASSERT_OK(td_model_add_linear(m, 3));
        check_cfg c = {"residual[conv, sigmoid] + [conv1x1] on the input -> linear",
                       5,
                       0.01f,
                       atol,
                       rtol,
                       false,
                       rand_input(5 * 32, 42)};
        finish(m, &c, 42);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* resnet-style: projection shortcut (1x1 conv stride 2 + batchnorm), body with a stride-2
       * conv, batchnorm, tanh; a nested identity block inside the body; training mode */
        td_model_t *m = td_model_new(2, 6, 6);
        ASSERT_OK(td_model_add_conv2d(m, 3, 3, 1, 1));
        ASSERT_OK(td_model_begin_residual(m));
        ASSERT_OK(td_model_add_conv2d(m, 4, 3, 2, 1));
        ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
        ASSERT_OK(td_model_add_tanh(m));
        ASSERT_OK(td_model_begin_residual(m));
        ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
        ASSERT_OK(td_model_add_residual(m));
        ASSERT_OK(td_model_begin_shortcut(m));
        ASSERT_OK(td_model_add_conv2d(m, 4, 1, 2, 0));
        ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
        ASSERT_OK(td_model_add_residual(m));
        ASSERT_OK(td_model_add_global_avgpool(m));
        ASSERT_OK(td_model_add_linear(m, 3));
        check_cfg c = {"conv -> residual[conv s2, bn, tanh, residual[conv]] + [conv1x1 s2, bn]",
                       6,
                       0.01f,
                       atol,
                       5e-3,
                       true,
                       rand_input(6 * 72, 39)};
        finish(m, &c, 39);
        check(m, &c);
        free(c.x), td_model_free(m);
    }
    { /* mse and bce-with-logits: gradients, hand-computed values, NULL dout */
        enum { B = 3, D = 4 };
        float x[B * D], t[B * D], d[B * D];
        for (int i = 0; i < B * D; i++)
            x[i] = 3.0f * rnd(40, (uint64_t)i), t[i] = (rnd(41, i) + 1) / 2;
        for (int which = 0; which < 2; which++) {
            double (*f)(const float *, const float *, int, int, float, float *) =
                which ? td_bce_with_logits : td_mse_loss;
            f(x, t, B, D, 0.25f, d);
            for (int i = 0; i < B * D; i++) {
                float keep = x[i], eps = 1e-2f;
                x[i] = keep + eps;
                double fp = f(x, t, B, D, 0.25f, NULL);
                x[i] = keep - eps;
                double fm = f(x, t, B, D, 0.25f, NULL);
                x[i] = keep;
                ASSERT_NEAR(d[i], 0.25 * (fp - fm) / (2 * eps), 1e-4);
            }
        }
        /* by hand: mse of ([1, 2] - [0, 4]) = (1 + 4) / 2 = 2.5 per sample; dout = 2 (o - t)/2 */
        float o2[4] = {1, 2, 0, 0}, t2[4] = {0, 4, 0, 1}, d2[4];
        ASSERT_NEAR(td_mse_loss(o2, t2, 2, 2, 1.0f, d2), 2.5 + 0.5, 1e-12);
        ASSERT_NEAR(d2[0], 1.0, 1e-7);
        ASSERT_NEAR(d2[1], -2.0, 1e-7);
        ASSERT_NEAR(d2[3], -1.0, 1e-7);
        /* bce: x = 0 gives log 2 whatever t; x = 30, t = 1 ~ 0; x = -30, t = 1 = 30 (stable) */
        float lg[3] = {0.0f, 30.0f, -30.0f}, tg[3] = {0.3f, 1.0f, 1.0f};
        ASSERT_NEAR(td_bce_with_logits(lg, tg, 1, 1, 1.0f, NULL), log(2.0), 1e-12);
        ASSERT_NEAR(td_bce_with_logits(lg + 1, tg + 1, 1, 1, 1.0f, NULL), 0.0, 1e-12);
        ASSERT_NEAR(td_bce_with_logits(lg + 2, tg + 2, 1, 1, 1.0f, d2), 30.0, 1e-9);
        ASSERT_NEAR(d2[0], -1.0, 1e-7); /* sigmoid(-30) - 1 */
        ASSERT_NEAR(td_bce_with_logits(lg, tg, 1, 3, 1.0f, NULL), (log(2.0) + 30.0) / 3, 1e-9);
        /* multilabel accuracy: row 0 2 of 3 right, row 1 all right */
        float ml[6] = {1.0f, -1.0f, 0.5f, -2.0f, 3.0f, -0.1f};
        float mt[6] = {1.0f, 1.0f, 1.0f, 0.0f, 1.0f, 0.0f};
        ASSERT_NEAR(td_count_correct_multilabel(ml, mt, 2, 3), 2.0 / 3 + 1.0, 1e-12);
        printf("  losses: mse and bce_with_logits gradients and values ok\n");
    }
    { /* losses: d(sum loss)/d input * grad_scale */
        enum { B = 3, C = 5 };
        float logits[B * C], d[B * C];
        int32_t labels[B] = {0, 4, 2};
        for (int i = 0; i < B * C; i++) logits[i] = 2.0f * rnd(8, (uint64_t)i);
        for (int which = 0; which < 2; which++) {
            double (*f)(const float *, const int32_t *, int, int, float, float *) =
                which ? td_cross_entropy : td_nll_loss;
            f(logits, labels, B, C, 0.5f, d);
            for (int i = 0; i < B * C; i++) {
                float keep = logits[i], eps = 1e-2f;
                logits[i] = keep + eps;
                double fp = f(logits, labels, B, C, 0.5f, NULL);
                logits[i] = keep - eps;
                double fm = f(logits, labels, B, C, 0.5f, NULL);
                logits[i] = keep;
                ASSERT_NEAR(d[i], 0.5 * (fp - fm) / (2 * eps), 1e-4);
            }
        }
        /* cross entropy == nll(log_softmax) */
        double ce = td_cross_entropy(logits, labels, B, C, 1.0f, NULL), ref = 0;
        for (int i = 0; i < B; i++) {
            double se = 0;
            for (int j = 0; j < C; j++) se += exp(logits[i * C + j]);
            ref += log(se) - logits[i * C + labels[i]];
        }
        ASSERT_NEAR(ce, ref, 1e-5);
        int32_t bad[B] = {0, 5, 1};
        ASSERT(isnan(td_cross_entropy(logits, bad, B, C, 1.0f, d)));
        float out[6] = {0.1f, 0.9f, 0.5f, 0.2f, 0.0f, 0.0f};
        int32_t lab[3] = {1, 0, 1};
        ASSERT_EQ(td_count_correct(out, lab, 3, 2), 2); /* ties go to the first class */
        printf("  losses: nll and cross_entropy gradients ok\n");
    }
    TEST_PASS();
}
