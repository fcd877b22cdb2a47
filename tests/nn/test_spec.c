/* nn: YAML model specs build the expected models; malformed specs fail with file:line:column and
 * the field; preset names and builder shape errors; models for the data's shape (presets, optional
 * input:, out: outputs) and the new layer kinds, residual blocks and their errors. */
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

    /* ---- models for the data's shape (issue 20) ---- */
    {
        /* every new kind, input: left out, out: outputs */
        const char *all = "layers:\n"
                          "  - conv2d: {out: 4, kernel: 3, padding: 1}\n"
                          "  - batchnorm: {eps: 0.001, momentum: 0.2}\n"
                          "  - gelu\n"
                          "  - residual:\n"
                          "      layers: [{conv2d: {out: 4, kernel: 3, padding: 1}}, tanh]\n"
                          "      name: block\n"
                          "  - residual:\n"
                          "      layers:\n"
                          "        - conv2d: {out: 8, kernel: 3, stride: 2, padding: 1}\n"
                          "        - sigmoid\n"
                          "      shortcut: [{conv2d: {out: 8, kernel: 1, stride: 2}}]\n"
                          "  - avgpool2d: {kernel: 2}\n"
                          "  - layernorm: {eps: 1.0e-6}\n"
                          "  - global_avgpool\n"
                          "  - linear: {out: outputs}\n";
        const char *path = write_spec("all.yaml", all);
        ASSERT_OK(td_model_load_for(path, 3, 8, 8, 5, &m));
        ASSERT_EQ(td_model_output_size(m), 5);
        ASSERT_EQ(td_model_num_layers(m), 14);
        const char *kinds[14] = {"conv2d",    "batchnorm", "gelu",           "conv2d", "tanh",
                                 "residual",  "conv2d",    "sigmoid",        "conv2d", "residual",
                                 "avgpool2d", "layernorm", "global_avgpool", "linear"};
        for (int i = 0; i < 14; i++) ASSERT_STREQ(td_model_layer(m, i).kind_name, kinds[i]);
        ASSERT_STREQ(td_model_layer(m, 1).name, "bn1");
        ASSERT_STREQ(td_model_layer(m, 5).name, "block");
        ASSERT_STREQ(td_model_layer(m, 9).name, "residual2");
        ASSERT_STREQ(td_model_layer(m, 11).name, "ln1");
        ASSERT_NEAR(td_model_layer(m, 1).eps, 0.001, 1e-9);
        ASSERT_NEAR(td_model_layer(m, 1).momentum, 0.2, 1e-7);
        ASSERT_NEAR(td_model_layer(m, 11).eps, 1e-6, 1e-12);
        /* data flow: the shortcut's conv reads the block's input (the first residual's output,
         * acts index 6); the second residual adds the body's output (acts index 8) */
        ASSERT_EQ(td_model_layer(m, 8).input_from, 6);
        ASSERT_EQ(td_model_layer(m, 9).input2_from, 8);
        ASSERT_EQ(td_model_layer(m, 5).input2_from, 3); /* identity: the block's input */
        ASSERT_EQ(td_model_layer(m, 8).out_h, 4);
        ASSERT_EQ(td_model_layer(m, 11).param_count, 2 * 8 * 2 * 2);
        ASSERT_EQ(td_model_num_buffers(m), 8);
        ASSERT_OK(td_model_finalize(m, 3));
        td_model_free(m);

        /* input: given and equal to the data's is fine; different is an error naming both */
        ASSERT_OK(td_model_load_for(
            write_spec("in.yaml", "input: [3, 8, 8]\nlayers:\n  - flatten\n  - linear: {out: 2}\n"),
            3, 8, 8, 2, &m));
        td_model_free(m);
        ASSERT_STATUS(td_model_load_for(write_spec("bad.yaml", "input: [1, 28, 28]\nlayers:\n"
                                                               "  - flatten\n"),
                                        3, 32, 32, 10, &m),
                      TD_ERR_FORMAT);
        ASSERT_CONTAINS(td_error_msg(), "bad.yaml:1:8: input");
        ASSERT_CONTAINS(td_error_msg(), "[1, 28, 28]");
        ASSERT_CONTAINS(td_error_msg(), "[3, 32, 32]");
        /* a flat input is [features] */
        ASSERT_STATUS(td_model_load_for(write_spec("bad.yaml", "input: [784]\nlayers: [relu]\n"),
                                        30, 1, 1, 2, &m),
                      TD_ERR_FORMAT);
        ASSERT_CONTAINS(td_error_msg(), "the spec says [784] but the data has [30]");
        /* without the data: input: is required and `outputs` has no value */
        expect_error("layers:\n  - flatten\n", TD_ERR_FORMAT, "input: missing", "with its data");
        expect_error("input: [4]\nlayers:\n  - linear: {out: outputs}\n", TD_ERR_FORMAT,
                     "bad.yaml:3:19: layers[0].linear.out", "'outputs' means the data's output");
        /* residual errors name the nested field */
        expect_error("input: [2, 4, 4]\nlayers:\n  - residual:\n      layers: [relu, "
                     "{conv2d: {out: 3, kernel: 1}}]\n",
                     TD_ERR_FORMAT, "bad.yaml:3:5: layers[0].residual",
                     "the input [2, 4, 4] and the body's output [3, 4, 4] differ; add a shortcut");
        expect_error("input: [2, 4, 4]\nlayers:\n  - residual:\n      layers: [relu]\n"
                     "      shortcut: [{conv2d: {out: 3, kernel: 1}}]\n",
                     TD_ERR_FORMAT, "layers[0].residual",
                     "the body's output [2, 4, 4] and the shortcut's output [3, 4, 4] differ");
        expect_error("input: [2, 4, 4]\nlayers:\n  - residual:\n      layers: [relu, linaer]\n",
                     TD_ERR_FORMAT,
                     "bad.yaml:4:22: layers[0].residual.layers[1]: unknown layer "
                     "kind 'linaer'",
                     NULL);
        expect_error("input: [2, 4, 4]\nlayers:\n  - residual: {layer: [relu]}\n", TD_ERR_FORMAT,
                     "unknown field 'layer'", "layers, shortcut, name");
        expect_error("input: [2, 4, 4]\nlayers:\n  - residual: {shortcut: [relu]}\n", TD_ERR_FORMAT,
                     "layers[0].residual.layers: missing required field", NULL);
        expect_error("input: [2, 4, 4]\nlayers:\n  - residual: {layers: []}\n", TD_ERR_FORMAT,
                     "layers[0].residual.layers: expected a non-empty list", NULL);
        expect_error("input: [2, 4, 4]\nlayers:\n  - batchnorm: {momentum: 1.5}\n", TD_ERR_FORMAT,
                     "layers[0].batchnorm.momentum: bad value 1.5", "[0, 1]");
        expect_error("input: [2, 4, 4]\nlayers:\n  - layernorm: {eps: 0}\n", TD_ERR_FORMAT,
                     "layers[0].layernorm.eps: bad value 0", "(0, 1)");
        expect_error("input: [2, 4, 4]\nlayers:\n  - avgpool2d: {kernel: 5}\n", TD_ERR_FORMAT,
                     "layers[0].avgpool2d", "does not fit input [2, 4, 4]");
    }
    {
        /* presets built for the data's shape */
        ASSERT_OK(td_model_load_for("basicnet", 3, 32, 32, 5, &m));
        ASSERT_EQ(td_model_layer(m, 7).in_c, 64 * 14 * 14); /* fc1 takes what flatten gives */
        ASSERT_EQ(td_model_output_size(m), 5);
        td_model_free(m);
        ASSERT_OK(td_model_load_for("mlp7", 30, 1, 1, 3, &m));
        ASSERT_EQ(td_model_layer(m, 1).in_c, 30);
        ASSERT_EQ(td_model_output_size(m), 3);
        td_model_free(m);
        ASSERT_OK(td_model_load_for("mlp", 30, 1, 1, 4, &m));
        ASSERT_EQ(td_model_num_params(m), 30 * 128 + 128 + 128 * 128 + 128 + 128 * 4 + 4);
        ASSERT_EQ(td_model_layer(m, td_model_num_layers(m) - 1).kind, TD_LAYER_LINEAR);
        td_model_free(m);
        /* resnet-small: the preset and its spec in examples/ are the same model */
        td_model_t *spec;
        ASSERT_OK(td_model_load_for("resnet-small", 3, 32, 32, 10, &m));
        ASSERT_OK(td_model_load_for(TANDEM_SOURCE_DIR "/examples/models/resnet-small.yaml", 3, 32,
                                    32, 10, &spec));
        ASSERT_EQ(td_model_num_layers(m), td_model_num_layers(spec));
        ASSERT_EQ(td_model_num_params(m), td_model_num_params(spec));
        ASSERT_EQ(td_model_num_buffers(m), td_model_num_buffers(spec));
        for (int i = 0; i < td_model_num_layers(m); i++) {
            td_layer_info a = td_model_layer(m, i), b = td_model_layer(spec, i);
            ASSERT_EQ(a.kind, b.kind);
            ASSERT_STREQ(a.name, b.name);
            ASSERT_EQ(a.input_from, b.input_from);
            ASSERT_EQ(a.input2_from, b.input2_from);
            ASSERT_EQ(a.out_c * a.out_h * a.out_w, b.out_c * b.out_h * b.out_w);
        }
        ASSERT_EQ(td_model_layer(m, td_model_num_layers(m) - 1).in_c, 64);
        printf("  resnet-small on [3, 32, 32]: %zu parameters, %d layers\n", td_model_num_params(m),
               td_model_num_layers(m));
        td_model_free(m), td_model_free(spec);
        /* the tabular example fits any feature count */
        ASSERT_OK(
            td_model_load_for(TANDEM_SOURCE_DIR "/examples/models/tabular.yaml", 13, 1, 1, 2, &m));
        ASSERT_EQ(td_model_output_size(m), 2);
        td_model_free(m);
        /* a preset that does not fit names itself, the shape and one that fits */
        ASSERT_STATUS(td_model_load_for("basicnet", 30, 1, 1, 2, &m), TD_ERR_INVALID);
        printf("  error: %s\n", td_error_msg());
        ASSERT_CONTAINS(td_error_msg(), "model 'basicnet' does not fit input [30]");
        ASSERT_CONTAINS(td_error_msg(), "--model mlp");
        ASSERT_STATUS(td_model_load_for("resnet-small", 30, 1, 1, 2, &m), TD_ERR_INVALID);
        ASSERT_CONTAINS(td_error_msg(), "model 'resnet-small' does not fit input [30]");
        ASSERT_STATUS(td_model_load_for("basicnet", 1, 28, 28, 0, &m), TD_ERR_INVALID);
        ASSERT_STATUS(td_model_load_for("resnet", 1, 28, 28, 2, &m), TD_ERR_NOTFOUND);
        ASSERT_CONTAINS(td_error_msg(), "resnet-small");
    }
    {
        /* residual builder errors */
        m = td_model_new(2, 4, 4);
        ASSERT_STATUS(td_model_begin_shortcut(m), TD_ERR_INVALID);
        ASSERT_STATUS(td_model_add_residual(m), TD_ERR_INVALID);
        ASSERT_OK(td_model_begin_residual(m));
        ASSERT_STATUS(td_model_begin_shortcut(m), TD_ERR_INVALID);
        ASSERT_CONTAINS(td_error_msg(), "empty body");
        ASSERT_OK(td_model_add_relu(m));
        ASSERT_STATUS(td_model_finalize(m, 2), TD_ERR_INVALID);
        ASSERT_CONTAINS(td_error_msg(), "not closed");
        ASSERT_OK(td_model_begin_shortcut(m));
        ASSERT_STATUS(td_model_add_residual(m), TD_ERR_INVALID);
        ASSERT_CONTAINS(td_error_msg(), "empty shortcut");
        ASSERT_OK(td_model_add_tanh(m));
        ASSERT_OK(td_model_add_residual(m));
        ASSERT_OK(td_model_finalize(m, 2));
        td_model_free(m);
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
