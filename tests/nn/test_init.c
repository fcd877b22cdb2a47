/* nn: PyTorch-default initialisation (and weight 1, bias 0 for layernorm and batchnorm, with
 * batchnorm's running statistics and their update) (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights
 * and biases) drawn from Philox (seed, stream = layer index, element index); same seed => same
 * bits; preset sizes, names and layout. */
#include "tandem/nn.h"
#include "test.h"

int main(void) {
    td_model_t *m;
    ASSERT_OK(td_model_load("basicnet", &m));
    ASSERT_OK(td_model_finalize(m, 4));
    ASSERT_EQ(td_model_num_params(m), 1199882);
    ASSERT_NEAR(td_model_flops_per_sample(m) / 1e6, 71.6, 0.1);
    ASSERT_EQ((uintptr_t)td_model_params(m) % 64, 0);
    ASSERT_EQ((uintptr_t)td_model_grads(m) % 64, 0);
    const char *names[] = {"conv1", "conv2", "fc1", "fc2"};
    const int fan_in[] = {9, 288, 9216, 128};
    const size_t wcount[] = {288, 18432, 1179648, 1280};
    td_model_init_params(m, 7);
    const float *p = td_model_params(m);
    size_t expect_off = 0;
    int k = 0;
    for (int i = 0; i < td_model_num_layers(m); i++) {
        td_layer_info li = td_model_layer(m, i);
        if (!li.param_count) continue;
        ASSERT_STREQ(li.name, names[k]);
        ASSERT_EQ(li.param_offset, expect_off);
        ASSERT_EQ(li.weight_count, wcount[k]);
        expect_off += li.param_count;
        double bound = 1.0 / sqrt(fan_in[k]), sum = 0, sq = 0, mx = 0;
        for (size_t j = 0; j < li.param_count; j++) {
            double v = p[li.param_offset + j];
            ASSERT(fabs(v) <= bound);
            sum += v, sq += v * v, mx = TD_MAX(mx, fabs(v));
        }
        double n = (double)li.param_count, mean = sum / n, var = sq / n - mean * mean;
        printf("  %-6s bound %.5f  max|w| %.5f  mean %+.2e  var/(bound^2/3) %.3f\n", li.name, bound,
               mx, mean, var / (bound * bound / 3));
        ASSERT_NEAR(var / (bound * bound / 3), 1.0, 5.0 / sqrt(n) + 0.01);
        ASSERT_NEAR(mean / bound, 0.0, 4.0 / sqrt(n));
        ASSERT(mx > 0.9 * bound);
        /* element e of layer i is lo + span * td_rng_uniform(seed, i, e) */
        size_t e = li.param_count - 1;
        float lo = -(float)bound, hi = (float)bound;
        ASSERT(p[li.param_offset + e] == lo + (hi - lo) * td_rng_uniform(7, (uint64_t)i, e));
        k++;
    }
    ASSERT_EQ(k, 4);
    ASSERT_EQ(expect_off, td_model_num_params(m));
    /* same seed, same bits; another seed, other values */
    size_t np = td_model_num_params(m);
    float *copy = malloc(sizeof(float) * np);
    memcpy(copy, p, sizeof(float) * np);
    td_model_init_params(m, 7);
    ASSERT(memcmp(copy, p, sizeof(float) * np) == 0);
    td_model_init_params(m, 8);
    ASSERT(memcmp(copy, p, sizeof(float) * np) != 0);
    free(copy);
    td_model_free(m);

    ASSERT_OK(td_model_load("mlp7", &m));
    ASSERT_EQ(td_model_num_params(m), 3824394);
    ASSERT_EQ(td_model_output_size(m), 10);
    int fc = 0;
    for (int i = 0; i < td_model_num_layers(m); i++) {
        td_layer_info li = td_model_layer(m, i);
        if (li.kind != TD_LAYER_LINEAR) continue;
        char want[16];
        snprintf(want, sizeof want, "fc%d", ++fc);
        ASSERT_STREQ(li.name, want);
    }
    ASSERT_EQ(fc, 7);
    td_model_free(m);

    /* norm layers: weight 1, bias 0 (not the uniform draw); batchnorm buffers: mean 0, var 1;
     * td_model_update_running_stats is PyTorch's momentum update, one batch tracked per call */
    m = td_model_new(3, 4, 4);
    ASSERT_OK(td_model_add_conv2d(m, 2, 3, 1, 1));
    ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.25f));
    ASSERT_OK(td_model_add_layernorm(m, 1e-5f));
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 3));
    ASSERT_OK(td_model_add_batchnorm(m, 1e-5f, 0.5f));
    ASSERT_EQ(td_model_num_buffers(m), 2 * 2 + 2 * 3);
    ASSERT_EQ(td_model_batch_stats_size(m), td_model_num_buffers(m));
    ASSERT_OK(td_model_finalize(m, 4));
    td_model_init_params(m, 5);
    p = td_model_params(m);
    td_layer_info bn1 = td_model_layer(m, 1), ln1 = td_model_layer(m, 2),
                  bn2 = td_model_layer(m, 5);
    ASSERT_EQ(bn1.param_count, 4);
    ASSERT_EQ(ln1.param_count, 2 * 32);
    ASSERT_EQ(bn2.buffer_offset, 4);
    ASSERT_EQ(bn2.buffer_count, 6);
    for (size_t j = 0; j < ln1.param_count; j++)
        ASSERT(p[ln1.param_offset + j] == (j < ln1.weight_count ? 1.0f : 0.0f));
    for (size_t j = 0; j < bn2.param_count; j++)
        ASSERT(p[bn2.param_offset + j] == (j < bn2.weight_count ? 1.0f : 0.0f));
    float *buf = td_model_buffers(m);
    ASSERT(buf[0] == 0.0f && buf[1] == 0.0f && buf[2] == 1.0f && buf[3] == 1.0f);
    ASSERT(buf[4] == 0.0f && buf[6] == 0.0f && buf[7] == 1.0f && buf[9] == 1.0f);
    float stats[10] = {2, 4, 3, 5, 1, 1, 1, 9, 9, 9};
    td_model_update_running_stats(m, stats);
    ASSERT_NEAR(buf[0], 0.25 * 2, 1e-7); /* bn1: momentum 0.25 */
    ASSERT_NEAR(buf[2], 0.75 * 1 + 0.25 * 3, 1e-7);
    ASSERT_NEAR(buf[7], 0.5 * 1 + 0.5 * 9, 1e-7); /* bn2: momentum 0.5 */
    ASSERT_EQ(td_model_batches_tracked(m), 1);
    td_model_update_running_stats(m, stats);
    ASSERT_EQ(td_model_batches_tracked(m), 2);
    td_model_init_params(m, 5); /* a fresh start resets buffers too */
    ASSERT(buf[0] == 0.0f && buf[2] == 1.0f);
    ASSERT_EQ(td_model_batches_tracked(m), 0);
    td_model_free(m);
    TEST_PASS();
}
