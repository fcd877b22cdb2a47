/* nn: PyTorch-default initialisation (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases)
 * drawn from Philox (seed, stream = layer index, element index); same seed => same bits;
 * preset sizes, names and layout. */
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
    TEST_PASS();
}
