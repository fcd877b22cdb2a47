/* nn: YAML model specs build the expected models; malformed specs fail with file:line:column and
 * the field; preset names and builder shape errors. */
#include "tandem/nn.h"
#include "test.h"

static char dir[] = "/tmp/tandem-spec-XXXXXX";

static const char *write_spec(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Loading must fail with `st` and a message containing each needle. */
static void expect_error(const char *text, td_status st, const char *n1, const char *n2) {
    td_model_t *m = (td_model_t *)1;
    ASSERT_STATUS(td_model_load(write_spec("bad.yaml", text), &m), st);
    ASSERT(m == NULL);
    printf("  error: %s\n", td_error_msg());
    ASSERT_CONTAINS(td_error_msg(), n1);
    if (n2) ASSERT_CONTAINS(td_error_msg(), n2);
}

int main(void) {
    ASSERT(mkdtemp(dir));
    td_model_t *m;
    /* the shipped example */
    ASSERT_OK(td_model_load(TANDEM_SOURCE_DIR "/examples/models/mlp-small.yaml", &m));
    ASSERT_EQ(td_model_num_params(m), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
    ASSERT_STREQ(td_model_layer(m, 6).name, "head");
    ASSERT_STREQ(td_model_layer(m, 1).name, "fc1");
    ASSERT_OK(td_model_finalize(m, 2));
    td_model_free(m);

    /* basicnet written as a spec equals the preset */
    const char *basic = "input: [1, 28, 28]\n"
                        "layers:\n"
                        "  - conv2d: {out: 32, kernel: 3}\n"
                        "  - relu\n"
                        "  - conv2d: {out: 64, kernel: 3, stride: 1, padding: 0}\n"
                        "  - relu:\n"
                        "  - maxpool2d: {kernel: 2}\n"
                        "  - dropout: {p: 0.25}\n"
                        "  - flatten\n"
                        "  - linear:\n"
                        "      out: 128\n"
                        "  - relu\n"
                        "  - dropout: {p: 0.5}\n"
                        "  - linear: {out: 10}\n"
                        "  - log_softmax\n";
    ASSERT_OK(td_model_load(write_spec("basic.yaml", basic), &m));
    ASSERT_EQ(td_model_num_params(m), 1199882);
    ASSERT_EQ(td_model_num_layers(m), 12);
    ASSERT_STREQ(td_model_layer(m, 2).name, "conv2");
    ASSERT_EQ(td_model_layer(m, 4).out_h, 12);
    td_model_free(m);

    /* errors name file:line:column and the field */
    expect_error("input: [1, 28, 28]\nlayers:\n  - flatten\n  - linaer: {out: 3}\n", TD_ERR_FORMAT,
                 "bad.yaml:4:5: layers[1]: unknown layer kind 'linaer'", NULL);
    expect_error("input: [1, 28, 28]\nlayers:\n  - conv2d: {out: 8, kernal: 3}\n", TD_ERR_FORMAT,
                 "bad.yaml:3:22: layers[0].conv2d: unknown field 'kernal'", "kernel");
    expect_error("input: [1, 28, 28]\nlayers:\n  - conv2d: {out: 8}\n", TD_ERR_FORMAT,
                 "bad.yaml:3:5: layers[0].conv2d.kernel: missing required field", NULL);
    expect_error("input: [1, 28, 28]\nlayers:\n  - flatten\n  - linear: {out: -4}\n", TD_ERR_FORMAT,
                 "bad.yaml:4:19: layers[1].linear.out: bad value -4", NULL);
    expect_error("input: [1, 28, 28]\nlayers:\n  - dropout: {p: 1.5}\n", TD_ERR_FORMAT,
                 "bad.yaml:3:18: layers[0].dropout.p: bad value 1.5", NULL);
    expect_error("input: [1, 28, 28]\nlayers:\n  - linear: {out: 10}\n", TD_ERR_FORMAT,
                 "bad.yaml:3:5: layers[0].linear", "add a flatten layer");
    expect_error("input: [1, 4, 4]\nlayers:\n  - conv2d: {out: 2, kernel: 5}\n", TD_ERR_FORMAT,
                 "bad.yaml:3:5", "does not fit input [1, 4, 4]");
    expect_error("input: [1, 28]\nlayers:\n  - relu\n", TD_ERR_FORMAT, "bad.yaml:1:8: input", NULL);
    expect_error("layers:\n  - relu\n", TD_ERR_FORMAT, "bad.yaml:1:1: input: missing", NULL);
    expect_error("input: [1, 28, 28]\nlayers: []\n", TD_ERR_FORMAT, "bad.yaml:2:9: layers", NULL);
    expect_error("input: [1, 28, 28]\nlayrs:\n  - relu\n", TD_ERR_FORMAT,
                 "bad.yaml:2:1: spec: unknown field 'layrs'", NULL);
    expect_error("input: [1, 28, 28]\nlayers:\n  - conv2d: {out: 8, kernel: 3\n  - relu\n",
                 TD_ERR_FORMAT, "bad.yaml:5:1: YAML syntax error", "started at 3:13");
    expect_error("input: [1, 28, 28]\nlayers:\n  - linear: {out: 3, name: x}\n", TD_ERR_FORMAT,
                 "bad.yaml:3:5", "flatten");
    expect_error("input: [4]\nlayers:\n  - linear: {out: 3, name: a}\n  - linear: {out: 3, name: "
                 "a}\n",
                 TD_ERR_FORMAT, "bad.yaml:4:5", "'a' is already used");

    /* issue 8: 100,000 nested brackets took 46 s (libyaml's loader is quadratic in the depth);
     * now refused at the 33rd level, naming where, in well under a second */
    {
        size_t n = 100000;
        char *deep = malloc(2 * n + 64);
        size_t len = (size_t)snprintf(deep, 64, "input: [1, 28, 28]\nlayers: ");
        for (size_t i = 0; i < n; i++) deep[len++] = '[';
        for (size_t i = 0; i < n; i++) deep[len++] = ']';
        deep[len++] = '\n';
        deep[len] = '\0';
        double t0 = td_now_s();
        ASSERT_STATUS(td_model_load(write_spec("deep.yaml", deep), &m), TD_ERR_FORMAT);
        double dt = td_now_s() - t0;
        ASSERT_CONTAINS(td_error_msg(), "deep.yaml:2:");
        ASSERT_CONTAINS(td_error_msg(), "nested more than 32 levels");
        printf("100000 nested brackets refused in %.3f s\n", dt);
        free(deep);
    }

    /* presets and names */
    ASSERT_STATUS(td_model_load("resnet", &m), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "unknown model 'resnet'");
    ASSERT_STATUS(td_model_load("/nonexistent/spec.yaml", &m), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "/nonexistent/spec.yaml");

    /* builder shape checks */
    m = td_model_new(3, 8, 8);
    ASSERT_STATUS(td_model_add_conv2d(m, 4, 9, 1, 0), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "conv1");
    ASSERT_OK(td_model_add_conv2d(m, 4, 3, 1, 1));
    ASSERT_STATUS(td_model_add_maxpool2d(m, 0, 0), TD_ERR_INVALID);
    ASSERT_STATUS(td_model_add_dropout(m, 1.0f), TD_ERR_INVALID);
    ASSERT_EQ(td_model_num_layers(m), 1);
    ASSERT_OK(td_model_add_flatten(m));
    ASSERT_OK(td_model_add_linear(m, 5));
    ASSERT_EQ(td_model_output_size(m), 5);
    ASSERT_OK(td_model_finalize(m, 2));
    ASSERT_STATUS(td_model_add_relu(m), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "finalized");
    td_model_free(m);
    ASSERT(td_model_new(0, 1, 1) == NULL);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ASSERT_EQ(system(cmd), 0);
    TEST_PASS();
}
