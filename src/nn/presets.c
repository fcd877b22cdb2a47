/* The built-in models, built for the data's shape, and td_model_load's dispatch. */
#include <string.h>

#include "nn_internal.h"

/* PyTorch's examples/mnist Net: 1,199,882 parameters on [1, 28, 28] with 10 outputs. fc1 takes
 * whatever flatten gives, fc2 gives the data's outputs. */
static td_status build_basicnet(td_model_t *m, int outputs) {
    TD_CHECK(td_model_add_conv2d(m, 32, 3, 1, 0));
    TD_CHECK(td_model_add_relu(m));
    TD_CHECK(td_model_add_conv2d(m, 64, 3, 1, 0));
    TD_CHECK(td_model_add_relu(m));
    TD_CHECK(td_model_add_maxpool2d(m, 2, 2));
    TD_CHECK(td_model_add_dropout(m, 0.25f));
    TD_CHECK(td_model_add_flatten(m));
    TD_CHECK(td_model_add_linear(m, 128));
    TD_CHECK(td_model_add_relu(m));
    TD_CHECK(td_model_add_dropout(m, 0.5f));
    TD_CHECK(td_model_add_linear(m, outputs));
    TD_CHECK(td_model_add_log_softmax(m));
    return TD_OK;
}

/* in-1024-1024-1024-512-512-256-outputs with ReLU between: 3,824,394 parameters on MNIST. */
static td_status build_mlp7(td_model_t *m, int outputs) {
    static const int widths[] = {1024, 1024, 1024, 512, 512, 256};
    TD_CHECK(td_model_add_flatten(m));
    for (size_t i = 0; i < TD_ARRAY_LEN(widths); i++) {
        TD_CHECK(td_model_add_linear(m, widths[i]));
        TD_CHECK(td_model_add_relu(m));
    }
    TD_CHECK(td_model_add_linear(m, outputs));
    TD_CHECK(td_model_add_log_softmax(m));
    return TD_OK;
}

/* A tabular baseline: in-128-128-outputs with ReLU between, raw outputs (logits for
 * cross-entropy or BCE, values for MSE). */
static td_status build_mlp(td_model_t *m, int outputs) {
    TD_CHECK(td_model_add_flatten(m));
    TD_CHECK(td_model_add_linear(m, 128));
    TD_CHECK(td_model_add_relu(m));
    TD_CHECK(td_model_add_linear(m, 128));
    TD_CHECK(td_model_add_relu(m));
    TD_CHECK(td_model_add_linear(m, outputs));
    return TD_OK;
}

/* conv3x3 + batchnorm (+ relu); stride s, padding 1. */
static td_status conv_bn(td_model_t *m, int out, int stride, bool relu) {
    TD_CHECK(td_model_add_conv2d(m, out, 3, stride, 1));
    TD_CHECK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
    if (relu) TD_CHECK(td_model_add_relu(m));
    return TD_OK;
}

/* A basic residual block, then relu: body conv-bn-relu-conv-bn; a 1x1 conv + bn shortcut where
 * the shape changes, else the identity. */
static td_status basic_block(td_model_t *m, int out, int stride, bool project) {
    TD_CHECK(td_model_begin_residual(m));
    TD_CHECK(conv_bn(m, out, stride, true));
    TD_CHECK(conv_bn(m, out, 1, false));
    if (project) {
        TD_CHECK(td_model_begin_shortcut(m));
        TD_CHECK(td_model_add_conv2d(m, out, 1, stride, 0));
        TD_CHECK(td_model_add_batchnorm(m, 1e-5f, 0.1f));
    }
    TD_CHECK(td_model_add_residual(m));
    TD_CHECK(td_model_add_relu(m));
    return TD_OK;
}

/* A small ResNet for 32x32 colour images (CIFAR-10 sized; any image of 4x4 or more): conv 16,
 * stages of 16, 32 (stride 2), 64 (stride 2) channels with one basic block each, global average
 * pool, linear. Convs keep their bias (PyTorch's ResNets drop it before a batchnorm; here it
 * is merely redundant). */
static td_status build_resnet_small(td_model_t *m, int outputs) {
    if (m->in_h < 4 || m->in_w < 4)
        return td_error(TD_ERR_INVALID, "resnet-small needs an image of at least 4x4");
    TD_CHECK(conv_bn(m, 16, 1, true));
    TD_CHECK(basic_block(m, 16, 1, false));
    TD_CHECK(basic_block(m, 32, 2, true));
    TD_CHECK(basic_block(m, 64, 2, true));
    TD_CHECK(td_model_add_global_avgpool(m));
    TD_CHECK(td_model_add_flatten(m));
    TD_CHECK(td_model_add_linear(m, outputs));
    return TD_OK;
}

typedef struct {
    const char *name;
    td_status (*build)(td_model_t *, int outputs);
    const char *fits; /* for the error when the shape does not fit */
} preset;

static const preset presets[] = {
    {"basicnet", build_basicnet, "images of 6x6 or more"},
    {"mlp7", build_mlp7, "any input"},
    {"mlp", build_mlp, "any input"},
    {"resnet-small", build_resnet_small, "images of 4x4 or more (made for 32x32 colour)"},
};

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static void shape_text(char *buf, size_t n, int c, int h, int w) {
    if (h == 1 && w == 1)
        snprintf(buf, n, "[%d]", c);
    else
        snprintf(buf, n, "[%d, %d, %d]", c, h, w);
}

td_status td_model_load_for(const char *name_or_path, int in_c, int in_h, int in_w, int outputs,
                            td_model_t **out) {
    *out = NULL;
    if (!name_or_path) return td_error(TD_ERR_INVALID, "model name is NULL");
    if (in_c <= 0 || in_h <= 0 || in_w <= 0 || outputs <= 0)
        return td_error(TD_ERR_INVALID,
                        "model '%s' for input [%d, %d, %d] with %d outputs: every size must be "
                        "positive",
                        name_or_path, in_c, in_h, in_w, outputs);
    for (size_t i = 0; i < TD_ARRAY_LEN(presets); i++) {
        if (strcmp(name_or_path, presets[i].name)) continue;
        td_model_t *m = td_model_new(in_c, in_h, in_w);
        td_status st = presets[i].build(m, outputs);
        if (st != TD_OK) {
            char shape[64], why[512];
            shape_text(shape, sizeof shape, in_c, in_h, in_w);
            snprintf(why, sizeof why, "%s", td_error_msg());
            td_model_free(m);
            return td_error(TD_ERR_INVALID,
                            "model '%s' does not fit input %s (it is made for %s): %s; use "
                            "--model mlp for features or small inputs, or a .yaml spec "
                            "(docs/model-spec.md)",
                            presets[i].name, shape, presets[i].fits, why);
        }
        *out = m;
        return TD_OK;
    }
    if (has_suffix(name_or_path, ".yaml") || has_suffix(name_or_path, ".yml") ||
        strchr(name_or_path, '/')) {
        int shape[3] = {in_c, in_h, in_w};
        return td__model_load_spec(name_or_path, shape, outputs, out);
    }
    return td_error(TD_ERR_NOTFOUND,
                    "unknown model '%s': use basicnet, mlp7, mlp, resnet-small or a path to a "
                    ".yaml model spec (docs/model-spec.md)",
                    name_or_path);
}

td_status td_model_load(const char *name_or_path, td_model_t **out) {
    *out = NULL;
    if (name_or_path && (has_suffix(name_or_path, ".yaml") || has_suffix(name_or_path, ".yml") ||
                         strchr(name_or_path, '/')))
        return td__model_load_spec(name_or_path, NULL, 0, out);
    return td_model_load_for(name_or_path, 1, 28, 28, 10, out);
}
