/* nn: forward+backward give the same bits with 1 and 2 threads (and 3 for batchnorm, layernorm
 * and residual models, with their batch statistics); dropout masks depend on
 * (seed, step, global sample id, element, layer) only, never on batch position; the grad-ready
 * hook fires last layer first with final gradients. */
#include "nn_internal.h"
#include "test.h"

typedef struct {
    float *out, *grads;
} run_result;

static run_result run(const char *name, int threads, int batch) {
    td_set_num_threads(threads);
    td_model_t *m;
    ASSERT_OK(td_model_load(name, &m));
    ASSERT_OK(td_model_finalize(m, batch));
    td_model_init_params(m, 11);
    int in = td_model_input_size(m), nout = td_model_output_size(m) * batch;
    float *x = malloc(sizeof(float) * (size_t)batch * in), *dout = malloc(sizeof(float) * nout);
    td_rng_fill_uniform(5, 0, -1.0f, 1.0f, x, (size_t)batch * in);
    uint64_t ids[64];
    int32_t labels[64];
    for (int i = 0; i < batch; i++) ids[i] = 500 + 3 * (uint64_t)i, labels[i] = i % 10;
    td_forward_ctx ctx = {.training = true, .seed = 3, .step = 17, .sample_ids = ids};
    td_model_zero_grads(m);
    const float *out = td_model_forward(m, x, batch, &ctx);
    ASSERT(out);
    td_nll_loss(out, labels, batch, 10, 1.0f / batch, dout);
    td_model_backward(m, dout, batch);
    run_result r = {malloc(sizeof(float) * nout), malloc(sizeof(float) * td_model_num_params(m))};
    memcpy(r.out, out, sizeof(float) * nout);
    memcpy(r.grads, td_model_grads(m), sizeof(float) * td_model_num_params(m));
    free(x), free(dout);
    td_model_free(m);
    return r;
}

static void check_thread_invariance(const char *name, int batch, size_t np) {
    run_result a = run(name, 1, batch), b = run(name, 2, batch);
    size_t nout = (size_t)batch * 10, diff_out = 0, diff_g = 0;
    for (size_t i = 0; i < nout; i++) diff_out += memcmp(&a.out[i], &b.out[i], 4) != 0;
    for (size_t i = 0; i < np; i++) diff_g += memcmp(&a.grads[i], &b.grads[i], 4) != 0;
    printf("  %s batch %d: outputs differing 1 vs 2 threads: %zu, gradients differing: %zu\n", name,
           batch, diff_out, diff_g);
    ASSERT_EQ(diff_out, 0);
    ASSERT_EQ(diff_g, 0);
    double norm = 0;
    for (size_t i = 0; i < np; i++) norm += fabs(a.grads[i]);
    ASSERT(norm > 0); /* not vacuously equal */
    free(a.out), free(a.grads), free(b.out), free(b.grads);
}

/* Models built for a shape: forward (training) + backward with a fixed dout; outputs, gradients
 * and batchnorm batch statistics must not depend on the thread count. */
typedef struct {
    float *out, *grads, *stats;
} run2_result;

static td_model_t *build_ln_gelu(void) {
    td_model_t *m = td_model_new(2, 6, 6);
    ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
    ASSERT_OK(td_model_add_layernorm(m, 1e-5f));
    ASSERT_OK(td_model_add_gelu(m));
    ASSERT_OK(td_model_add_avgpool2d(m, 2, 2));
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 16));
    ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
    ASSERT_OK(td_model_add_sigmoid(m));
    ASSERT_OK(td_model_add_linear(m, 10));
    return m;
}

static run2_result run2(const char *name, int threads, int batch) {
    td_set_num_threads(threads);
    td_model_t *m;
    if (name)
        ASSERT_OK(td_model_load_for(name, 3, 12, 12, 10, &m));
    else
        m = build_ln_gelu();
    ASSERT_OK(td_model_finalize(m, batch));
    td_model_init_params(m, 11);
    size_t in = (size_t)td_model_input_size(m), nout = (size_t)td_model_output_size(m) * batch;
    size_t np = td_model_num_params(m), nb = td_model_num_buffers(m);
    float *x = malloc(sizeof(float) * batch * in), *dout = malloc(sizeof(float) * nout);
    td_rng_fill_uniform(5, 0, -1.0f, 1.0f, x, batch * in);
    td_rng_fill_uniform(6, 0, -1.0f, 1.0f, dout, nout);
    td_forward_ctx ctx = {.training = true, .seed = 3, .step = 17};
    td_model_zero_grads(m);
    const float *out = td_model_forward(m, x, batch, &ctx);
    ASSERT(out);
    td_model_backward(m, dout, batch);
    run2_result r = {malloc(sizeof(float) * nout), malloc(sizeof(float) * np),
                     malloc(sizeof(float) * (nb ? nb : 1))};
    memcpy(r.out, out, sizeof(float) * nout);
    memcpy(r.grads, td_model_grads(m), sizeof(float) * np);
    if (nb) memcpy(r.stats, td_model_batch_stats(m), sizeof(float) * nb);
    free(x), free(dout);
    td_model_free(m);
    return r;
}

static void check_thread_invariance2(const char *name, int batch) {
    td_model_t *m;
    if (name)
        ASSERT_OK(td_model_load_for(name, 3, 12, 12, 10, &m));
    else
        m = build_ln_gelu();
    size_t np = td_model_num_params(m), nb = td_model_num_buffers(m), nout = (size_t)batch * 10;
    ASSERT_GT(nb, 0);
    td_model_free(m);
    run2_result a = run2(name, 1, batch);
    for (int t = 2; t <= 3; t++) {
        run2_result b = run2(name, t, batch);
        size_t d_out = 0, d_g = 0, d_s = 0;
        for (size_t i = 0; i < nout; i++) d_out += memcmp(&a.out[i], &b.out[i], 4) != 0;
        for (size_t i = 0; i < np; i++) d_g += memcmp(&a.grads[i], &b.grads[i], 4) != 0;
        for (size_t i = 0; i < nb; i++) d_s += memcmp(&a.stats[i], &b.stats[i], 4) != 0;
        printf("  %s batch %d: 1 vs %d threads: outputs differing %zu, gradients %zu, batch "
               "statistics %zu\n",
               name ? name : "conv-layernorm-gelu-avgpool-linear-batchnorm-sigmoid", batch, t,
               d_out, d_g, d_s);
        ASSERT_EQ(d_out, 0);
        ASSERT_EQ(d_g, 0);
        ASSERT_EQ(d_s, 0);
        free(b.out), free(b.grads), free(b.stats);
    }
    double norm = 0, snorm = 0;
    for (size_t i = 0; i < np; i++) norm += fabs(a.grads[i]);
    for (size_t i = 0; i < nb; i++) snorm += fabs(a.stats[i]);
    ASSERT(norm > 0 && snorm > 0); /* not vacuously equal */
    free(a.out), free(a.grads), free(a.stats);
}

enum { N = 300 };

/* A model of just dropout layers over ones: the output row is the product of the scaled masks. */
static void dropout_rows(td_model_t *m, const uint64_t *ids, int batch, uint64_t step, float *out) {
    static float ones[8 * N];
    for (int i = 0; i < 8 * N; i++) ones[i] = 1.0f;
    td_forward_ctx ctx = {.training = true, .seed = 42, .step = step, .sample_ids = ids};
    const float *y = td_model_forward(m, ones, batch, &ctx);
    memcpy(out, y, sizeof(float) * (size_t)batch * N);
}

typedef struct {
    int calls, layers[8];
    size_t offsets[8];
    float *snap[8];
    td_model_t *m;
} hook_log;

static void on_ready(void *user, int layer, size_t off, size_t count) {
    hook_log *h = user;
    ASSERT_LT(h->calls, 8);
    h->layers[h->calls] = layer;
    h->offsets[h->calls] = off;
    h->snap[h->calls] = malloc(sizeof(float) * count);
    memcpy(h->snap[h->calls], td_model_grads(h->m) + off, sizeof(float) * count);
    h->calls++;
}

int main(void) {
    check_thread_invariance("basicnet", 22, 1199882);
    check_thread_invariance("mlp7", 22, 3824394);
    check_thread_invariance2("resnet-small", 22); /* batchnorm, residual blocks */
    check_thread_invariance2(NULL, 22);           /* layernorm, gelu, avgpool, batchnorm1d */

    /* dropout masks */
    td_model_t *m = td_model_new(N, 1, 1);
    ASSERT_OK(td_model_add_dropout(m, 0.5f));
    ASSERT_OK(td_model_finalize(m, 8));
    float a[8 * N], b[8 * N];
    uint64_t ids_a[4] = {10, 11, 12, 13}, ids_b[3] = {99, 12, 10};
    dropout_rows(m, ids_a, 4, 7, a);
    td_set_num_threads(1);
    dropout_rows(m, ids_b, 3, 7, b);
    td_set_num_threads(2);
    ASSERT(memcmp(a + 2 * N, b + 1 * N, sizeof(float) * N) == 0); /* id 12: row 2 vs row 1 */
    ASSERT(memcmp(a + 0 * N, b + 2 * N, sizeof(float) * N) == 0); /* id 10: row 0 vs row 2 */
    ASSERT(memcmp(a + 0 * N, a + 1 * N, sizeof(float) * N) != 0); /* ids 10 and 11 differ */
    int kept = 0;
    for (int e = 0; e < N; e++) {
        /* the documented formula: keep iff td_rng_uniform(key, id, e) >= p, scaled by 2 */
        float u = td_rng_uniform(td_dropout_key(42, 7, 0), 12, (uint64_t)e);
        ASSERT(a[2 * N + e] == (u >= 0.5f ? 2.0f : 0.0f));
        kept += a[2 * N + e] != 0;
    }
    ASSERT_GT(kept, N / 2 - 45);
    ASSERT_LT(kept, N / 2 + 45);
    dropout_rows(m, ids_a, 4, 8, b); /* next step: new masks */
    ASSERT(memcmp(a, b, sizeof(float) * N) != 0);
    td_model_free(m);
    /* two dropout layers draw independent masks: keep rate 1/4, not 1/2 */
    m = td_model_new(N, 1, 1);
    ASSERT_OK(td_model_add_dropout(m, 0.5f));
    ASSERT_OK(td_model_add_dropout(m, 0.5f));
    ASSERT_OK(td_model_finalize(m, 8));
    uint64_t ids8[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    dropout_rows(m, ids8, 8, 0, a);
    kept = 0;
    for (int i = 0; i < 8 * N; i++) kept += a[i] != 0;
    printf("  two stacked dropout(0.5) layers keep %d of %d elements\n", kept, 8 * N);
    ASSERT_GT(kept, 8 * N / 4 - 120);
    ASSERT_LT(kept, 8 * N / 4 + 120);
    td_model_free(m);

    /* grad-ready hook: last parametered layer first, with the gradients it will end up with */
    ASSERT_OK(td_model_load("basicnet", &m));
    ASSERT_OK(td_model_finalize(m, 8));
    hook_log h = {.m = m};
    td_model_set_grad_ready_hook(m, on_ready, &h);
    float x[8 * 784], dout[80];
    td_rng_fill_uniform(1, 1, 0.0f, 1.0f, x, 8 * 784);
    td_rng_fill_uniform(1, 2, -1.0f, 1.0f, dout, 80);
    td_model_zero_grads(m);
    td_forward_ctx ctx = {.training = false};
    ASSERT(td_model_forward(m, x, 8, &ctx));
    td_model_backward(m, dout, 8);
    int want[4] = {10, 7, 2, 0};
    ASSERT_EQ(h.calls, 4);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(h.layers[i], want[i]);
        td_layer_info li = td_model_layer(m, want[i]);
        ASSERT_EQ(h.offsets[i], li.param_offset);
        ASSERT(memcmp(h.snap[i], td_model_grads(m) + li.param_offset,
                      sizeof(float) * li.param_count) == 0);
        free(h.snap[i]);
    }
    td_model_free(m);
    TEST_PASS();
}
