/* gpu: the CUDA engine against the CPU engine on the same inputs.
 *
 *  - every layer kind (conv with stride and padding, overlapping max pooling, relu folded and
 *    not, dropout, flatten, linear, log_softmax, GELU, tanh, sigmoid, average and global average
 *    pooling, LayerNorm) and the presets: forward output and every parameter gradient within
 *    float tolerance of the CPU's; and within TF32's and bf16's rounding under --precision tf32
 *    and bf16 (bf16 convolutions store their operands in bf16);
 *  - dropout masks: a dropout-only model's output equals the CPU's bit for bit;
 *  - the GPU kernels pass a finite-difference gradient check on their own;
 *  - AdamW and SGD (momentum, nesterov, weight decay) give the CPU's bits, step after step;
 *  - a whole device step (gather from a uint8 data set of 1 or 3 channels or a float table,
 *    forward, NLL after log_softmax or the fused cross-entropy on logits, MSE and BCE on real
 *    targets, backward, accumulation over 2 micro-batches, a short last micro-batch) matches the
 *    CPU's loss and gradients, and the same step streamed (a fill function asked for the
 *    slots' samples) gives the resident step's bits.
 * Skips (exit 77) where there is no CUDA device or no CUDA backend, printing why. */
#include <math.h>

#include "tandem/gpu.h"
#include "tandem/nn.h"
#include "tandem/optim.h"
#include "tandem/tensor.h"
#include "test.h"

static float rnd(uint64_t stream, uint64_t i) {
    return td_rng_uniform(4321, stream, i) * 2.0f - 1.0f;
}

/* The gemms' precision of the engines engine_for builds. */
static td_precision precision = TD_PRECISION_FP32;

static double rel_err(const float *got, const float *ref, size_t n) {
    double worst = 0, scale = 1e-12;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)got[i] - ref[i]));
        scale = fmax(scale, fabs((double)ref[i]));
    }
    return worst / scale;
}

/* ||got - ref|| / ||ref||: where rounded gemm inputs flip a ReLU or a pool's argmax, a few
 * gradient entries move by a whole contribution; this norm sees those as the few they are. */
static double rel_l2(const float *got, const float *ref, size_t n) {
    double d = 0, r = 1e-30;
    for (size_t i = 0; i < n; i++) {
        d += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return sqrt(d / r);
}

/* How far from the CPU's fp32 a GPU result may be: fp32 by the largest entry (max |diff| /
 * max |cpu|); TF32 (10-bit mantissa) and bf16 (7-bit) round the gemms' inputs, so by the
 * relative L2 norm, with the largest entry only bounded (a flipped ReLU or argmax). */
static bool close_enough(const float *got, const float *ref, size_t n, double tol, double *e) {
    if (precision == TD_PRECISION_FP32) {
        *e = rel_err(got, ref, n);
        return *e <= tol;
    }
    *e = rel_l2(got, ref, n);
    return *e <= tol && rel_err(got, ref, n) <= 0.5;
}

/* An engine for model m with its current parameters; seed keys the step's dropout. */
/* The loss of the engines engine_for builds (check_step sets it). */
static td_loss_kind loss_kind = TD_LOSS_CROSS_ENTROPY;

static td_gpu_t *engine_for(td_model_t *m, int batch, int accum, const td_optim_config *o,
                            uint64_t seed, bool graph) {
    td_gpu_config gc = {.device = -1,
                        .batch = batch,
                        .accum = accum,
                        .world_size = 1,
                        .max_eval_batch = batch,
                        .seed = seed,
                        .graph = graph,
                        .precision = precision,
                        .loss = loss_kind};
    td_gpu_t *g = NULL;
    ASSERT_OK(td_gpu_new(m, o, &gc, &g));
    ASSERT_OK(td_gpu_upload_state(g, td_model_params(m), NULL, 0));
    return g;
}

/* Forward and backward of model m (finalized for batch) on both devices. */
static void compare_model(const char *what, td_model_t *m, int batch, bool training, double tol) {
    int in = td_model_input_size(m), out = td_model_output_size(m);
    size_t np = td_model_num_params(m), nx = (size_t)batch * in, ny = (size_t)batch * out;
    float *x = malloc(sizeof(float) * nx), *dy = malloc(sizeof(float) * ny);
    float *y_gpu = malloc(sizeof(float) * ny), *y_cpu = malloc(sizeof(float) * ny);
    float *g_gpu = malloc(sizeof(float) * (np ? np : 1));
    for (size_t i = 0; i < nx; i++) x[i] = rnd(1, i);
    for (size_t i = 0; i < ny; i++) dy[i] = rnd(2, i);
    uint64_t *ids = malloc(sizeof(uint64_t) * (size_t)batch);
    for (int i = 0; i < batch; i++) ids[i] = 5000 + 13 * (uint64_t)i;
    td_forward_ctx ctx = {.training = training, .seed = 11, .step = 3, .sample_ids = ids};
    td_optim_config o = td_optim_defaults(TD_OPTIM_ADAMW);
    td_gpu_t *g = engine_for(m, batch, 1, &o, 7, false);
    ASSERT_OK(td_gpu_model_forward(g, x, batch, &ctx, y_gpu));
    ASSERT_OK(td_gpu_model_backward(g, dy, batch, g_gpu));
    td_gpu_free(g);
    td_model_zero_grads(m);
    const float *y = td_model_forward(m, x, batch, &ctx);
    ASSERT(y != NULL);
    memcpy(y_cpu, y, sizeof(float) * ny);
    td_model_backward(m, dy, batch);
    const char *metric =
        precision == TD_PRECISION_FP32 ? "max|diff|/max|cpu|" : "|diff|/|cpu| (L2)";
    double e;
    bool ok = close_enough(y_gpu, y_cpu, ny, tol, &e);
    printf("  %-34s %s forward  %s %.2e\n", what, td_precision_name(precision), metric, e);
    if (!ok) TEST_FAIL("%s: GPU forward differs from the CPU's: %.3g > %.1g", what, e, tol);
    for (int i = 0; i < td_model_num_layers(m); i++) {
        td_layer_info li = td_model_layer(m, i);
        if (!li.param_count) continue;
        ok = close_enough(g_gpu + li.param_offset, td_model_grads(m) + li.param_offset,
                          li.param_count, tol, &e);
        printf("  %-34s %s %-8s grad %s %.2e\n", what, td_precision_name(precision), li.name,
               metric, e);
        if (!ok)
            TEST_FAIL("%s: GPU gradient of %s differs from the CPU's: %.3g > %.1g", what, li.name,
                      e, tol);
    }
    free(x), free(dy), free(y_gpu), free(y_cpu), free(g_gpu), free(ids);
}

static td_model_t *finalized(td_model_t *m, int batch) {
    ASSERT_OK(td_model_finalize(m, batch));
    td_model_init_params(m, 3);
    return m;
}

/* tol: how far from the CPU (close_enough) the small models may be, deep_tol the deeper presets
 * and the large batch: fp32 1e-5 and 1e-4 (max entry); TF32 and bf16, by the relative L2 norm,
 * their inputs' rounding (2^-11, 2^-8) and the ReLUs and argmaxes it flips, which compound over
 * BasicNet's layers (TF32 measured on an H200: 6e-4 on the small models, 1.7e-2 at BasicNet's
 * conv1): a wrong operand or layout is off by 1 or more. */
static void test_layers(double tol, double deep_tol) {
    /* conv with stride and padding behind a conv (so its input gradient is used), overlapping
     * max pooling, an unfolded relu (after pooling), log_softmax */
    td_model_t *m = td_model_new(2, 9, 9);
    ASSERT_OK(td_model_add_conv2d(m, 3, 3, 1, 0));
    ASSERT_OK(td_model_add_conv2d(m, 4, 3, 2, 1));
    ASSERT_OK(td_model_add_maxpool2d(m, 3, 1));
    ASSERT_OK(td_model_add_relu(m));
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 6));
    ASSERT_OK(td_model_add_log_softmax(m));
    compare_model("conv s1/s2 p1, maxpool k3 s1, relu", finalized(m, 5), 5, false, tol);
    td_model_free(m);

    /* folded relus after conv and linear, 2x2 pooling, dropout in training mode */
    m = td_model_new(1, 12, 12);
    ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
    ASSERT_OK(td_model_add_relu(m));
    ASSERT_OK(td_model_add_conv2d(m, 5, 5, 2, 2));
    ASSERT_OK(td_model_add_relu(m));
    ASSERT_OK(td_model_add_maxpool2d(m, 2, 2));
    ASSERT_OK(td_model_add_dropout(m, 0.3f));
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 16));
    ASSERT_OK(td_model_add_relu(m));
    ASSERT_OK(td_model_add_dropout(m, 0.5f));
    ASSERT_OK(td_model_add_linear(m, 10));
    compare_model("conv+relu, pool, dropout, linear", finalized(m, 7), 7, true, tol);
    td_model_free(m);

    /* a large batch (weight gradients reduced over 432,000 and 300,000 entries); a relu whose
     * backward is folded into the col2im of the conv after it */
    m = td_model_new(1, 12, 12);
    ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
    ASSERT_OK(td_model_add_relu(m));
    ASSERT_OK(td_model_add_conv2d(m, 6, 3, 1, 0));
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 10));
    compare_model("conv, relu, conv at batch 3000", finalized(m, 3000), 3000, false, deep_tol);
    td_model_free(m);

    /* the layers of the user's models: GELU, overlapping average pooling, LayerNorm over
     * [C, H, W], tanh, global average pooling, sigmoid, on three input channels */
    m = td_model_new(3, 9, 9);
    ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
    ASSERT_OK(td_model_add_gelu(m));
    ASSERT_OK(td_model_add_avgpool2d(m, 3, 2));
    ASSERT_OK(td_model_add_layernorm(m, 1e-5f));
    ASSERT_OK(td_model_add_conv2d(m, 5, 3, 1, 1));
    ASSERT_OK(td_model_add_tanh(m));
    ASSERT_OK(td_model_add_global_avgpool(m));
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 8));
    ASSERT_OK(td_model_add_sigmoid(m));
    ASSERT_OK(td_model_add_linear(m, 4));
    compare_model("gelu, avgpool, layernorm, tanh, gap", finalized(m, 6), 6, false, tol);
    td_model_free(m);

    /* a table's MLP: LayerNorm over features, GELU */
    m = td_model_new(13, 1, 1);
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 32));
    ASSERT_OK(td_model_add_layernorm(m, 1e-5f));
    ASSERT_OK(td_model_add_gelu(m));
    ASSERT_OK(td_model_add_linear(m, 3));
    compare_model("table: linear, layernorm, gelu", finalized(m, 40), 40, false, tol);
    td_model_free(m);

    /* residual blocks: an identity one (BatchNorm, its ReLU, the sum), a projection one whose
     * shortcut reads the block's input (an activation with two consumers: its gradient is the
     * sum of both), BatchNorm after a linear layer; training (batch statistics) and eval mode
     * (the running ones) */
    /* Under TF32 and bf16 in eval mode only: the training-mode batchnorm backward subtracts
     * the means of dy and dy xhat, and what is left of a layer's few gamma and beta gradients
     * is mostly the inputs' rounding (bf16: 41% (L2) at bn2 on an H200), not a test of the
     * kernels; fp32 checks that path */
    for (int training = 0; training < (precision == TD_PRECISION_FP32 ? 2 : 1); training++) {
        m = td_model_new(2, 8, 8);
        ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
        ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
        ASSERT_OK(td_model_add_relu(m));
        ASSERT_OK(td_model_begin_residual(m));
        ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
        ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
        ASSERT_OK(td_model_add_relu(m));
        ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
        ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
        ASSERT_OK(td_model_add_residual(m));
        ASSERT_OK(td_model_add_relu(m));
        ASSERT_OK(td_model_begin_residual(m));
        ASSERT_OK(td_model_add_conv2d(m, 6, 3, 2, 1));
        ASSERT_OK(td_model_add_gelu(m));
        ASSERT_OK(td_model_begin_shortcut(m));
        ASSERT_OK(td_model_add_conv2d(m, 6, 1, 2, 0));
        ASSERT_OK(td_model_add_residual(m));
        ASSERT_OK(td_model_add_global_avgpool(m));
        ASSERT_OK(td_model_add_flatten(m));
        ASSERT_OK(td_model_add_linear(m, 8));
        ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
        ASSERT_OK(td_model_add_relu(m));
        ASSERT_OK(td_model_add_linear(m, 3));
        ASSERT_OK(td_model_add_log_softmax(m));
        double t = precision == TD_PRECISION_FP32 ? tol : deep_tol; /* six layers deep */
        compare_model(training ? "residual, batchnorm (training)" : "residual, batchnorm (eval)",
                      finalized(m, 9), 9, training, t);
        td_model_free(m);
    }
    /* fp32 only: nine convs and batchnorms deep, TF32's rounding alone moved conv1's gradient
     * by 5.6% (L2) on an H200; the reduced precisions are checked on the shallower models */
    if (precision == TD_PRECISION_FP32) {
        ASSERT_OK(td_model_load_for("resnet-small", 3, 16, 16, 10, &m));
        compare_model("resnet-small", finalized(m, 12), 12, true, deep_tol);
        td_model_free(m);
    }

    const char *presets[] = {"basicnet", "mlp7"};
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(td_model_load(presets[i], &m));
        compare_model(presets[i], finalized(m, 16), 16, true, deep_tol);
        td_model_free(m);
    }
}

/* A dropout-only model: the GPU's masks and scaling are the CPU's, bit for bit. */
static void test_dropout_bits(void) {
    td_model_t *m = td_model_new(3, 7, 5);
    ASSERT_OK(td_model_add_dropout(m, 0.4f));
    ASSERT_OK(td_model_add_flatten(m));
    finalized(m, 9);
    size_t n = 9 * 105;
    float *x = malloc(sizeof(float) * n), *yg = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = rnd(3, i);
    uint64_t ids[9];
    for (int i = 0; i < 9; i++) ids[i] = 59990 + (uint64_t)i * 1000003;
    td_forward_ctx ctx = {.training = true, .seed = 123, .step = 456, .sample_ids = ids};
    td_optim_config o = td_optim_defaults(TD_OPTIM_SGD);
    td_gpu_t *g = engine_for(m, 9, 1, &o, 7, false);
    ASSERT_OK(td_gpu_model_forward(g, x, 9, &ctx, yg));
    td_gpu_free(g);
    const float *yc = td_model_forward(m, x, 9, &ctx);
    size_t zeros = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&yg[i], &yc[i], 4))
            TEST_FAIL("dropout element %zu: GPU %.9g vs CPU %.9g", i, yg[i], yc[i]);
        zeros += yc[i] == 0.0f;
    }
    printf("  dropout masks: %zu elements equal bit for bit (%zu dropped)\n", n, zeros);
    ASSERT(zeros > n / 4 && zeros < n / 2 + n / 10); /* p = 0.4 really drops */
    td_model_free(m);
    free(x), free(yg);
}

/* Central differences of L = sum(out * r) through the GPU engine alone. */
static void test_gradcheck(void) {
    td_model_t *m = td_model_new(2, 8, 8);
    ASSERT_OK(td_model_add_conv2d(m, 3, 3, 2, 1));
    ASSERT_OK(td_model_add_conv2d(m, 3, 3, 1, 1));
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 4));
    ASSERT_OK(td_model_add_log_softmax(m));
    int batch = 3;
    finalized(m, batch);
    size_t np = td_model_num_params(m), nx = (size_t)batch * 128, ny = (size_t)batch * 4;
    float *x = malloc(sizeof(float) * nx), *r = malloc(sizeof(float) * ny);
    float *y = malloc(sizeof(float) * ny), *ana = malloc(sizeof(float) * np);
    float *p = malloc(sizeof(float) * np);
    for (size_t i = 0; i < nx; i++) x[i] = rnd(4, i);
    for (size_t i = 0; i < ny; i++) r[i] = rnd(5, i);
    memcpy(p, td_model_params(m), sizeof(float) * np);
    td_optim_config o = td_optim_defaults(TD_OPTIM_ADAMW);
    td_gpu_t *g = engine_for(m, batch, 1, &o, 7, false);
    ASSERT_OK(td_gpu_model_forward(g, x, batch, NULL, y));
    ASSERT_OK(td_gpu_model_backward(g, r, batch, ana));
    double worst = 0;
    const float eps = 1e-2f;
    for (size_t j = 0; j < np; j += 3) {
        double f[2];
        for (int side = 0; side < 2; side++) {
            float keep = p[j];
            p[j] = keep + (side ? -eps : eps);
            ASSERT_OK(td_gpu_upload_state(g, p, NULL, 0));
            ASSERT_OK(td_gpu_model_forward(g, x, batch, NULL, y));
            f[side] = td_dot_f64(y, r, ny);
            p[j] = keep;
        }
        double num = (f[0] - f[1]) / (2.0 * eps), err = fabs(num - ana[j]);
        if (!(err <= 2e-3 + 2e-2 * fabs(num)))
            TEST_FAIL("GPU d loss / d param[%zu]: analytic %.7g vs finite difference %.7g", j,
                      ana[j], num);
        worst = fmax(worst, err);
    }
    printf("  gradient check: %zu of %zu parameters, worst abs error %.2e\n", (np + 2) / 3, np,
           worst);
    td_gpu_free(g);
    td_model_free(m);
    free(x), free(r), free(y), free(ana), free(p);
}

static void check_optim(const char *what, td_optim_config cfg) {
    td_model_t *m = td_model_new(1, 1, 300);
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 70)); /* 21070 parameters */
    finalized(m, 1);
    size_t np = td_model_num_params(m);
    float *pc = malloc(sizeof(float) * np), *pg = malloc(sizeof(float) * np);
    float *gr = malloc(sizeof(float) * np);
    memcpy(pc, td_model_params(m), sizeof(float) * np);
    memcpy(pg, pc, sizeof(float) * np);
    td_optim_t *cpu;
    ASSERT_OK(td_optim_new(&cfg, np, &cpu));
    td_gpu_t *g = engine_for(m, 1, 1, &cfg, 7, false);
    for (int step = 0; step < 5; step++) {
        for (size_t i = 0; i < np; i++) gr[i] = rnd(10 + (uint64_t)step, i) * 0.1f;
        td_optim_step(cpu, pc, gr);
        ASSERT_OK(td_gpu_optim_step(g, pg, gr));
        for (size_t i = 0; i < np; i++)
            if (memcmp(&pc[i], &pg[i], 4))
                TEST_FAIL("%s step %d param %zu: GPU %.9g vs CPU %.9g", what, step + 1, i, pg[i],
                          pc[i]);
    }
    printf("  %-34s 5 steps over %zu parameters: bitwise equal to the CPU\n", what, np);
    td_gpu_free(g);
    td_optim_free(cpu);
    td_model_free(m);
    free(pc), free(pg), free(gr);
}

static void test_optimizers(void) {
    check_optim("adamw (defaults)", td_optim_defaults(TD_OPTIM_ADAMW));
    td_optim_config s = td_optim_defaults(TD_OPTIM_SGD);
    s.lr = 0.05;
    check_optim("sgd", s);
    s.momentum = 0.9, s.weight_decay = 1e-3, s.dampening = 0.1;
    check_optim("sgd momentum, dampening, wd", s);
    s.dampening = 0, s.nesterov = true;
    check_optim("sgd nesterov", s);
}

/* A streamed data set's fill (td_gpu_fill_fn) over check_step's arrays: the packed form. */
typedef struct {
    const void *values;
    size_t rec; /* bytes a sample */
    const int32_t *labels;
    const float *targets;
    int tdim;
    int calls;
} test_source;

static td_status test_fill(void *user, const uint64_t *ids, int n, void *values, int32_t *labels,
                           float *targets) {
    test_source *src = user;
    src->calls++;
    for (int i = 0; i < n; i++) {
        memcpy((char *)values + (size_t)i * src->rec,
               (const char *)src->values + ids[i] * src->rec, src->rec);
        if (labels) labels[i] = src->labels[ids[i]];
        if (targets)
            memcpy(targets + (size_t)i * src->tdim, src->targets + ids[i] * src->tdim,
                   sizeof(float) * src->tdim);
    }
    return TD_OK;
}

/* One device step (accum 2) against the CPU doing the same by hand; m is not finalized yet.
 * The data set: uint8 values through one table per channel, or float32 values (floats)
 * normalised by each channel's mean and std, as data.h's gather computes them. */
static void check_step(const char *model, td_model_t *m, int batch, bool floats,
                       td_loss_kind loss_k) {
    finalized(m, batch);
    bool real = loss_k != TD_LOSS_CROSS_ENTROPY;
    int in = td_model_input_size(m), classes = td_model_output_size(m);
    int C = td_model_layer(m, 0).in_c, plane = in / C;
    bool nll = td_model_layer(m, td_model_num_layers(m) - 1).kind == TD_LAYER_LOG_SOFTMAX;
    const uint64_t count = 100;
    uint8_t *pixels = malloc(count * (size_t)in);
    float *values = malloc(sizeof(float) * count * (size_t)in);
    int32_t *labels = malloc(sizeof(int32_t) * count);
    float *targets = malloc(sizeof(float) * count * (size_t)classes); /* mse, bce */
    uint64_t perm[100];
    for (size_t i = 0; i < count * (size_t)in; i++) {
        pixels[i] = (uint8_t)(td_rng_uniform(8, 0, i) * 256.0f);
        values[i] = td_rng_uniform(8, 2, i) * 40.0f - 7.0f;
    }
    for (uint64_t i = 0; i < count; i++) {
        labels[i] = (int32_t)(td_rng_uniform(8, 1, i) * (float)classes);
        perm[i] = (i * 37 + 11) % count;
    }
    static const float soft[] = {0.0f, 1.0f, 0.3f}; /* bce: hard and soft labels */
    for (size_t i = 0; i < count * (size_t)classes; i++)
        targets[i] = loss_k == TD_LOSS_BCE ? soft[(i * 7 + i / 5) % 3]
                                           : td_rng_uniform(8, 3, i) * 4.0f - 2.0f;
    float *lut = malloc(sizeof(float) * 256 * (size_t)C), *mean = malloc(sizeof(float) * C);
    float *std = malloc(sizeof(float) * C);
    for (int c = 0; c < C; c++) {
        mean[c] = 13.0f - 0.5f * (float)c, std[c] = 11.5f + 0.25f * (float)c;
        for (int v = 0; v < 256; v++)
            lut[c * 256 + v] = ((float)v / 255.0f - (0.2860f + 0.01f * (float)c)) / 0.3530f;
    }
    const int M = 2;
    const int64_t step = 6, base = 30, n = 2 * batch - 3; /* a short last micro-batch */
    const float scale = 1.0f / (float)n;
    td_optim_config o = td_optim_defaults(TD_OPTIM_ADAMW);
    loss_kind = loss_k;
    td_gpu_t *g = engine_for(m, batch, M, &o, 99, true);
    loss_kind = TD_LOSS_CROSS_ENTROPY;
    td_gpu_dataset d = {.values = floats ? (const void *)values : pixels, .u8 = !floats,
                        .labels = real ? NULL : labels, .targets = real ? targets : NULL,
                        .target_dim = real ? classes : 0, .count = count, .sample_size = in,
                        .channels = C, .lut = lut, .mean = mean, .std = std};
    ASSERT_OK(td_gpu_set_dataset(g, 0, &d));
    ASSERT_OK(td_gpu_set_epoch(g, perm, count));
    td_gpu_step_args a = {.step = step, .base = base, .n = n, .scale = scale};
    ASSERT_OK(td_gpu_step(g, &a, false));
    double sums[3];
    ASSERT_OK(td_gpu_step_stats(g, step, sums));
    ASSERT_OK(td_gpu_grads_to_host(g));
    size_t np = td_model_num_params(m);
    float *gpu_grads = malloc(sizeof(float) * np), *acc = calloc(np, sizeof(float));
    memcpy(gpu_grads, td_model_grads(m), sizeof(float) * np);
    td_gpu_free(g);
    /* the same step streamed (fill asked for the slots' samples): the resident step's bits */
    test_source src = {.values = d.values, .rec = (size_t)in * (floats ? 4 : 1),
                       .labels = labels, .targets = targets, .tdim = classes};
    loss_kind = loss_k;
    g = engine_for(m, batch, M, &o, 99, true);
    loss_kind = TD_LOSS_CROSS_ENTROPY;
    td_gpu_dataset ds = d;
    ds.values = NULL, ds.labels = NULL, ds.targets = NULL;
    ds.fill = test_fill, ds.fill_user = &src;
    ASSERT_OK(td_gpu_set_dataset(g, 0, &ds));
    ASSERT_OK(td_gpu_set_epoch(g, perm, count));
    ASSERT_OK(td_gpu_step(g, &a, false));
    double ssums[3];
    ASSERT_OK(td_gpu_step_stats(g, step, ssums));
    ASSERT_OK(td_gpu_grads_to_host(g));
    ASSERT(src.calls >= 2); /* a fill per slot with samples */
    if (memcmp(ssums, sums, sizeof sums) ||
        memcmp(td_model_grads(m), gpu_grads, sizeof(float) * np))
        TEST_FAIL("%s: the streamed step differs from the resident one (loss %.9g vs %.9g)", model,
                  ssums[0], sums[0]);
    printf("  %-8s step streamed: the resident step's bits\n", model);
    td_gpu_free(g);
    /* the CPU, micro-batch by micro-batch */
    float *x = malloc(sizeof(float) * (size_t)batch * in);
    float *dout = malloc(sizeof(float) * (size_t)batch * classes);
    int32_t y[64];
    float *t = malloc(sizeof(float) * (size_t)batch * classes);
    uint64_t ids[64];
    double loss = 0, correct = 0;
    for (int j = 0; j < M; j++) {
        int rows = (int)TD_MIN((int64_t)batch, n - (int64_t)j * batch);
        for (int r = 0; r < rows; r++) {
            ids[r] = perm[base + j * batch + r];
            y[r] = labels[ids[r]];
            memcpy(t + (size_t)r * classes, targets + ids[r] * classes, sizeof(float) * classes);
            for (int k = 0; k < in; k++) {
                size_t e = ids[r] * in + k;
                int c = k / plane;
                x[(size_t)r * in + k] = floats ? (values[e] - mean[c]) / std[c]
                                               : lut[c * 256 + pixels[e]];
            }
        }
        td_forward_ctx ctx = {.training = true, .seed = 99, .step = step, .sample_ids = ids};
        const float *out = td_model_forward(m, x, rows, &ctx);
        if (loss_k == TD_LOSS_MSE) {
            loss += td_mse_loss(out, t, rows, classes, scale, dout);
        } else if (loss_k == TD_LOSS_BCE) {
            loss += td_bce_with_logits(out, t, rows, classes, scale, dout);
            correct += td_count_correct_multilabel(out, t, rows, classes);
        } else {
            loss += nll ? td_nll_loss(out, y, rows, classes, scale, dout)
                        : td_cross_entropy(out, y, rows, classes, scale, dout);
            correct += td_count_correct(out, y, rows, classes);
        }
        td_model_zero_grads(m);
        td_model_backward(m, dout, rows);
        for (size_t i = 0; i < np; i++) acc[i] += td_model_grads(m)[i];
    }
    printf("  %-8s step (%s): loss %.6f (GPU %.6f), correct %.2f (GPU %.2f), samples %.0f\n",
           model, (const char *[]){"cross-entropy", "mse", "bce"}[loss_k], loss, sums[0], correct,
           sums[1], sums[2]);
    ASSERT_NEAR(sums[0], loss, 1e-4 * fabs(loss));
    ASSERT(fabs(sums[1] - correct) <= 1);
    ASSERT_NEAR(sums[2], (double)n, 0);
    double e = rel_err(gpu_grads, acc, np);
    printf("  %-8s step: gradient max|diff|/max|cpu| %.2e\n", model, e);
    if (!(e <= 1e-4)) TEST_FAIL("%s: device step gradient differs from the CPU's: %.3g", model, e);
    td_model_free(m);
    free(pixels), free(values), free(labels), free(targets), free(t), free(gpu_grads), free(acc);
    free(x), free(dout);
    free(lut), free(mean), free(std);
}

static void test_step(void) {
    td_model_t *m;
    ASSERT_OK(td_model_load("basicnet", &m)); /* ends in log_softmax: NLL */
    check_step("basicnet", m, 16, false, TD_LOSS_CROSS_ENTROPY);
    m = td_model_new(1, 28, 28); /* ends in logits: the fused cross-entropy */
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 96));
    ASSERT_OK(td_model_add_relu(m));
    ASSERT_OK(td_model_add_dropout(m, 0.2f));
    ASSERT_OK(td_model_add_linear(m, 10));
    check_step("mlp, CE", m, 32, false, TD_LOSS_CROSS_ENTROPY);
    /* three uint8 channels, each through its own table; the new layers in a device step */
    m = td_model_new(3, 8, 8);
    ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
    ASSERT_OK(td_model_add_gelu(m));
    ASSERT_OK(td_model_add_avgpool2d(m, 2, 2));
    ASSERT_OK(td_model_add_layernorm(m, 1e-5f));
    ASSERT_OK(td_model_add_global_avgpool(m));
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 5));
    check_step("rgb", m, 16, false, TD_LOSS_CROSS_ENTROPY);
    /* a table of float features with per-feature mean and std (a CSV's) */
    m = td_model_new(13, 1, 1);
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 24));
    ASSERT_OK(td_model_add_tanh(m));
    ASSERT_OK(td_model_add_layernorm(m, 1e-5f));
    ASSERT_OK(td_model_add_linear(m, 3));
    check_step("table", m, 24, true, TD_LOSS_CROSS_ENTROPY);
    /* real targets: regression (mse) on a float table, multi-label (bce, soft labels too) on
     * images, each gathered with its rows on the device */
    m = td_model_new(13, 1, 1);
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 24));
    ASSERT_OK(td_model_add_gelu(m));
    ASSERT_OK(td_model_add_linear(m, 3));
    check_step("table", m, 24, true, TD_LOSS_MSE);
    m = td_model_new(3, 8, 8);
    ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
    ASSERT_OK(td_model_add_relu(m));
    ASSERT_OK(td_model_add_global_avgpool(m));
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 4));
    check_step("rgb", m, 16, false, TD_LOSS_BCE);
    /* BatchNorm's statistics per micro-batch, residual blocks */
    ASSERT_OK(td_model_load_for("resnet-small", 3, 12, 12, 10, &m));
    check_step("resnet-small", m, 8, false, TD_LOSS_CROSS_ENTROPY);
}

int main(void) {
    char why[512];
    if (!td_gpu_available(why, sizeof why)) {
        printf("SKIP: no GPU for the CUDA engine tests: %s\n", why);
        return 77;
    }
    td_set_num_threads(1);
    /* The CPU's 3x3 convs as im2col + gemm, the GPU's lowering: the CPU's Winograd rounds
     * differently (tests/nn/test_conv_winograd.c bounds it at 1e-5), and in BasicNet those
     * differences move max-pool argmaxes, which puts whole contributions into the comparison */
    setenv("TANDEM_CONV_ALGO", "im2col", 1);
    printf("CUDA: %s\n", why);
    test_layers(1e-5, 1e-4);
    precision = TD_PRECISION_TF32;
    test_layers(5e-3, 5e-2);
    precision = TD_PRECISION_BF16;
    test_layers(3e-2, 2.5e-1);
    precision = TD_PRECISION_FP32;
    test_dropout_bits();
    test_gradcheck();
    test_optimizers();
    test_step();
    printf("gpu engine: all checks passed\n");
    return 0;
}
