/* The built-in models and td_model_load's dispatch. */
#include <string.h>

#include "nn_internal.h"

/* PyTorch's examples/mnist Net: 1,199,882 parameters. */
static td_status build_basicnet(td_model_t *m) {
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
    TD_CHECK(td_model_add_linear(m, 10));
    TD_CHECK(td_model_add_log_softmax(m));
    return TD_OK;
}

/* 784-1024-1024-1024-512-512-256-10 with ReLU between: 3,824,394 parameters. */
static td_status build_mlp7(td_model_t *m) {
    static const int widths[] = {1024, 1024, 1024, 512, 512, 256, 10};
    TD_CHECK(td_model_add_flatten(m));
    for (size_t i = 0; i < TD_ARRAY_LEN(widths); i++) {
        TD_CHECK(td_model_add_linear(m, widths[i]));
        if (i + 1 < TD_ARRAY_LEN(widths)) TD_CHECK(td_model_add_relu(m));
    }
    TD_CHECK(td_model_add_log_softmax(m));
    return TD_OK;
}

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

td_status td_model_load(const char *name_or_path, td_model_t **out) {
    *out = NULL;
    if (!name_or_path) return td_error(TD_ERR_INVALID, "model name is NULL");
    td_status (*build)(td_model_t *) = NULL;
    if (!strcmp(name_or_path, "basicnet"))
        build = build_basicnet;
    else if (!strcmp(name_or_path, "mlp7"))
        build = build_mlp7;
    if (build) {
        td_model_t *m = td_model_new(1, 28, 28);
        td_status st = build(m);
        if (st != TD_OK) {
            td_model_free(m);
            return st;
        }
        *out = m;
        return TD_OK;
    }
    if (has_suffix(name_or_path, ".yaml") || has_suffix(name_or_path, ".yml") ||
        strchr(name_or_path, '/'))
        return td__model_load_spec(name_or_path, out);
    return td_error(TD_ERR_NOTFOUND,
                    "unknown model '%s': use basicnet, mlp7 or a path to a .yaml model spec "
                    "(docs/model-spec.md)",
                    name_or_path);
}
