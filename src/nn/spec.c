/* YAML model specs (docs/model-spec.md), parsed with libyaml's document API so that every error
 * names file:line:column of the offending node and the field. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "nn_internal.h"

typedef struct {
    const char *path;
    yaml_document_t *doc;
    int outputs; /* the data's output count for `out: outputs`; 0 when unknown */
} spec_ctx;

/* An error at node n: "path:line:col: field: message". */
static td_status at(const spec_ctx *c, const yaml_node_t *n, const char *field, const char *fmt,
                    ...) TD_PRINTF(4, 5);
static td_status at(const spec_ctx *c, const yaml_node_t *n, const char *field, const char *fmt,
                    ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return td_error(TD_ERR_FORMAT, "%s:%zu:%zu: %s: %s", c->path, n->start_mark.line + 1,
                    n->start_mark.column + 1, field, msg);
}

static const char *scalar(const yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static td_status get_int(const spec_ctx *c, const yaml_node_t *n, const char *field, int lo,
                         int *out) {
    const char *s = scalar(n);
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > 1000000) {
        char d[160];
        snprintf(d, sizeof d, "%s (expected an integer >= %d)", s ? s : "not a scalar", lo);
        return at(c, n, field, "bad value %s", d);
    }
    *out = (int)v;
    return TD_OK;
}

/* `out:` of linear and conv2d: an integer, or the word outputs (the data's output count). */
static td_status get_out(const spec_ctx *c, const yaml_node_t *n, const char *field, int *out) {
    const char *s = scalar(n);
    if (s && !strcmp(s, "outputs")) {
        if (c->outputs <= 0)
            return at(c, n, field,
                      "'outputs' means the data's output count, which is not known here; load "
                      "the spec with its data (tandem train --data ...) or write a number");
        *out = c->outputs;
        return TD_OK;
    }
    return get_int(c, n, field, 1, out);
}

/* A number in (lo, hi) / [lo, hi], open or closed at either end as said. */
static td_status get_range(const spec_ctx *c, const yaml_node_t *n, const char *field, double lo,
                           bool lo_open, double hi, bool hi_open, float *out) {
    const char *s = scalar(n);
    char *end;
    double v = s ? strtod(s, &end) : 0;
    bool ok = s && *s && !*end && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (!ok) {
        char d[200];
        snprintf(d, sizeof d, "%s (expected a number in %c%g, %g%c)", s ? s : "not a scalar",
                 lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
        return at(c, n, field, "bad value %s", d);
    }
    *out = (float)v;
    return TD_OK;
}

static td_status get_float(const spec_ctx *c, const yaml_node_t *n, const char *field, float *out) {
    const char *s = scalar(n);
    char *end;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || !(v >= 0.0 && v < 1.0)) {
        char d[160];
        snprintf(d, sizeof d, "%s (expected a number in [0, 1))", s ? s : "not a scalar");
        return at(c, n, field, "bad value %s", d);
    }
    *out = (float)v;
    return TD_OK;
}

/* Layer arguments: every known field with its default; -1 = required. */
typedef struct {
    const char *kind;
    td_layer_kind k;
    const char *fields[5];
} layer_def;

static const layer_def defs[] = {
    {"linear", TD_LAYER_LINEAR, {"out", "name"}},
    {"conv2d", TD_LAYER_CONV2D, {"out", "kernel", "stride", "padding", "name"}},
    {"maxpool2d", TD_LAYER_MAXPOOL2D, {"kernel", "stride", "name"}},
    {"relu", TD_LAYER_RELU, {"name"}},
    {"dropout", TD_LAYER_DROPOUT, {"p", "name"}},
    {"flatten", TD_LAYER_FLATTEN, {"name"}},
    {"log_softmax", TD_LAYER_LOG_SOFTMAX, {"name"}},
    {"gelu", TD_LAYER_GELU, {"name"}},
    {"tanh", TD_LAYER_TANH, {"name"}},
    {"sigmoid", TD_LAYER_SIGMOID, {"name"}},
    {"layernorm", TD_LAYER_LAYERNORM, {"eps", "name"}},
    {"batchnorm", TD_LAYER_BATCHNORM, {"eps", "momentum", "name"}},
    {"avgpool2d", TD_LAYER_AVGPOOL2D, {"kernel", "stride", "name"}},
    {"global_avgpool", TD_LAYER_GLOBAL_AVGPOOL, {"name"}},
    {"residual", TD_LAYER_RESIDUAL, {"layers", "shortcut", "name"}},
};

/* Values per sample in the input and in every layer's output: the builder counts a shape in
 * int (a flatten of [1000000, 1000000, 1000000] overflowed, found by tests/fuzz/fuzz_spec.c), and
 * 2^28 floats (1 GiB) per sample is far beyond any model that trains. Kept at every layer, the
 * bound also keeps the next layer's own arithmetic (a conv's padded size) in range. */
#define SPEC_MAX_VALUES (1 << 28)

static td_status add_layers(const spec_ctx *c, td_model_t *m, const char *prefix,
                            const yaml_node_t *list);

static td_status add_layer(const spec_ctx *c, td_model_t *m, const char *prefix, int idx,
                           const yaml_node_t *item) {
    char field[160];
    snprintf(field, sizeof field, "%s[%d]", prefix, idx);
    const char *kind = NULL;
    const yaml_node_t *args = NULL;
    if (item->type == YAML_SCALAR_NODE) {
        kind = scalar(item);
    } else if (item->type == YAML_MAPPING_NODE &&
               item->data.mapping.pairs.top - item->data.mapping.pairs.start == 1) {
        yaml_node_pair_t *p = item->data.mapping.pairs.start;
        kind = scalar(yaml_document_get_node(c->doc, p->key));
        args = yaml_document_get_node(c->doc, p->value);
        if (args && args->type == YAML_SCALAR_NODE && !*scalar(args)) args = NULL; /* `relu:` */
    } else {
        return at(
            c, item, field,
            "expected a layer name (relu) or a one-key mapping (conv2d: {out: 32, kernel: 3})");
    }
    const layer_def *def = NULL;
    for (size_t i = 0; kind && i < TD_ARRAY_LEN(defs); i++)
        if (!strcmp(kind, defs[i].kind)) def = &defs[i];
    if (!def) {
        char d[300];
        snprintf(d, sizeof d,
                 "'%.60s' (expected linear, conv2d, maxpool2d, avgpool2d, global_avgpool, relu, "
                 "gelu, tanh, sigmoid, dropout, flatten, layernorm, batchnorm, residual or "
                 "log_softmax)",
                 kind ? kind : "?");
        return at(c, item, field, "unknown layer kind %s", d);
    }
    snprintf(field, sizeof field, "%s[%d].%s", prefix, idx, def->kind);
    const yaml_node_t *vals[5] = {0};
    if (args) {
        if (args->type != YAML_MAPPING_NODE)
            return at(c, args, field, "expected a mapping of arguments ({key: value, ...})");
        for (yaml_node_pair_t *p = args->data.mapping.pairs.start; p < args->data.mapping.pairs.top;
             p++) {
            const yaml_node_t *kn = yaml_document_get_node(c->doc, p->key);
            const char *key = scalar(kn);
            int found = -1;
            for (int f = 0; f < 5 && def->fields[f]; f++)
                if (key && !strcmp(key, def->fields[f])) found = f;
            if (found < 0) {
                /* The known fields first, then the key cut to fit: appending after the key let
                 * a long key push the write position past the end of d (a stack overflow found
                 * by tests/fuzz/fuzz_safetensors.c). */
                char names[64] = "", d[200];
                size_t used = 0;
                for (int f = 0; f < 5 && def->fields[f] && used < sizeof names; f++)
                    used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
                                             f ? ", " : " ", def->fields[f]);
                snprintf(d, sizeof d, "'%.100s' (expected%s)", key ? key : "?", names);
                return at(c, kn, field, "unknown field %s", d);
            }
            vals[found] = yaml_document_get_node(c->doc, p->value);
        }
    }
    char sub[200];
#define FIELD(i) (snprintf(sub, sizeof sub, "%s.%s", field, def->fields[i]), sub)
#define REQUIRE(i)                                                                                 \
    do {                                                                                           \
        if (!vals[i]) return at(c, item, FIELD(i), "missing required field");                      \
    } while (0)
    td_status st = TD_OK;
    const char *name = NULL;
    int name_idx = -1;
    for (int f = 0; f < 5 && def->fields[f]; f++)
        if (!strcmp(def->fields[f], "name")) name_idx = f;
    if (name_idx >= 0 && vals[name_idx]) {
        name = scalar(vals[name_idx]);
        if (!name) return at(c, vals[name_idx], FIELD(name_idx), "expected a string");
    }
    switch (def->k) {
    case TD_LAYER_LINEAR: {
        int out;
        REQUIRE(0);
        TD_CHECK(get_out(c, vals[0], FIELD(0), &out));
        st = td_model_add_linear(m, out);
        break;
    }
    case TD_LAYER_CONV2D: {
        int out, k, s = 1, p = 0;
        REQUIRE(0);
        REQUIRE(1);
        TD_CHECK(get_out(c, vals[0], FIELD(0), &out));
        TD_CHECK(get_int(c, vals[1], FIELD(1), 1, &k));
        if (vals[2]) TD_CHECK(get_int(c, vals[2], FIELD(2), 1, &s));
        if (vals[3]) TD_CHECK(get_int(c, vals[3], FIELD(3), 0, &p));
        st = td_model_add_conv2d(m, out, k, s, p);
        break;
    }
    case TD_LAYER_MAXPOOL2D: {
        int k, s = 0;
        REQUIRE(0);
        TD_CHECK(get_int(c, vals[0], FIELD(0), 1, &k));
        if (vals[1]) TD_CHECK(get_int(c, vals[1], FIELD(1), 1, &s));
        st = td_model_add_maxpool2d(m, k, s ? s : k);
        break;
    }
    case TD_LAYER_DROPOUT: {
        float p = 0.5f;
        if (vals[0]) TD_CHECK(get_float(c, vals[0], FIELD(0), &p));
        st = td_model_add_dropout(m, p);
        break;
    }
    case TD_LAYER_RELU:
        st = td_model_add_relu(m);
        break;
    case TD_LAYER_FLATTEN:
        st = td_model_add_flatten(m);
        break;
    case TD_LAYER_LOG_SOFTMAX:
        st = td_model_add_log_softmax(m);
        break;
    case TD_LAYER_GELU:
        st = td_model_add_gelu(m);
        break;
    case TD_LAYER_TANH:
        st = td_model_add_tanh(m);
        break;
    case TD_LAYER_SIGMOID:
        st = td_model_add_sigmoid(m);
        break;
    case TD_LAYER_LAYERNORM: {
        float eps = 1e-5f;
        if (vals[0]) TD_CHECK(get_range(c, vals[0], FIELD(0), 0, true, 1, true, &eps));
        st = td_model_add_layernorm(m, eps);
        break;
    }
    case TD_LAYER_BATCHNORM: {
        float eps = 1e-5f, mo = 0.1f;
        if (vals[0]) TD_CHECK(get_range(c, vals[0], FIELD(0), 0, true, 1, true, &eps));
        if (vals[1]) TD_CHECK(get_range(c, vals[1], FIELD(1), 0, false, 1, false, &mo));
        st = td_model_add_batchnorm(m, eps, mo);
        break;
    }
    case TD_LAYER_AVGPOOL2D: {
        int k, s = 0;
        REQUIRE(0);
        TD_CHECK(get_int(c, vals[0], FIELD(0), 1, &k));
        if (vals[1]) TD_CHECK(get_int(c, vals[1], FIELD(1), 1, &s));
        st = td_model_add_avgpool2d(m, k, s ? s : k);
        break;
    }
    case TD_LAYER_GLOBAL_AVGPOOL:
        st = td_model_add_global_avgpool(m);
        break;
    case TD_LAYER_RESIDUAL: {
        /* errors inside the block name themselves; the block's own are reported below */
        REQUIRE(0);
        st = td_model_begin_residual(m);
        if (st != TD_OK) break;
        TD_CHECK(add_layers(c, m, FIELD(0), vals[0]));
        if (vals[1]) {
            st = td_model_begin_shortcut(m);
            if (st != TD_OK) break;
            TD_CHECK(add_layers(c, m, FIELD(1), vals[1]));
        }
        st = td_model_add_residual(m);
        break;
    }
    }
#undef REQUIRE
#undef FIELD
    if (st == TD_OK && name) st = td__model_name_last(m, name);
    if (st != TD_OK) {
        char detail[512];
        snprintf(detail, sizeof detail, "%s", td_error_msg());
        return at(c, item, field, "%s", detail);
    }
    return TD_OK;
}

static void shape_text(char *buf, size_t n, const int *s) {
    if (s[1] == 1 && s[2] == 1)
        snprintf(buf, n, "[%d]", s[0]);
    else
        snprintf(buf, n, "[%d, %d, %d]", s[0], s[1], s[2]);
}

/* The layers of a list (the spec's layers:, a residual's layers: or shortcut:), in order; every
 * layer added is checked against SPEC_MAX_VALUES. */
static td_status add_layers(const spec_ctx *c, td_model_t *m, const char *prefix,
                            const yaml_node_t *list) {
    if (list->type != YAML_SEQUENCE_NODE ||
        list->data.sequence.items.top == list->data.sequence.items.start)
        return at(c, list, prefix, "expected a non-empty list of layers");
    int idx = 0;
    for (yaml_node_item_t *it = list->data.sequence.items.start; it < list->data.sequence.items.top;
         it++, idx++) {
        const yaml_node_t *item = yaml_document_get_node(c->doc, *it);
        int before = td_model_num_layers(m);
        TD_CHECK(add_layer(c, m, prefix, idx, item));
        for (int li = before; li < td_model_num_layers(m); li++) {
            td_layer_info info = td_model_layer(m, li);
            size_t values = (size_t)info.out_c * (size_t)info.out_h * (size_t)info.out_w;
            if (values > SPEC_MAX_VALUES)
                return at(c, item, prefix,
                          "layer %d's output [%d, %d, %d] holds %zu values per sample, more than "
                          "the %d a spec allows; use a smaller out, kernel, stride or padding",
                          li, info.out_c, info.out_h, info.out_w, values, SPEC_MAX_VALUES);
        }
    }
    return TD_OK;
}

static td_status build(const spec_ctx *c, const int *shape, td_model_t **out) {
    yaml_node_t *root = yaml_document_get_root_node(c->doc);
    if (!root)
        return td_error(TD_ERR_FORMAT, "%s: empty model spec; see docs/model-spec.md", c->path);
    if (root->type != YAML_MAPPING_NODE)
        return at(c, root, "spec", "expected a mapping with input: and layers:");
    const yaml_node_t *input = NULL, *layers = NULL;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        const yaml_node_t *kn = yaml_document_get_node(c->doc, p->key);
        const char *key = scalar(kn);
        const yaml_node_t *vn = yaml_document_get_node(c->doc, p->value);
        if (key && !strcmp(key, "input"))
            input = vn;
        else if (key && !strcmp(key, "layers"))
            layers = vn;
        else if (!key || strcmp(key, "name")) {
            char d[160];
            snprintf(d, sizeof d, "'%s' (expected input, layers, name)", key ? key : "?");
            return at(c, kn, "spec", "unknown field %s", d);
        }
    }
    if (!input && !shape)
        return at(c, root, "input",
                  "missing required field (e.g. input: [1, 28, 28]); it may be left out only "
                  "when the model is loaded with its data");
    if (!layers) return at(c, root, "layers", "missing required field");
    int dims_in[3] = {1, 1, 1};
    if (input) {
        if (input->type != YAML_SEQUENCE_NODE)
            return at(c, input, "input", "expected [channels, height, width] or [features]");
        int dims = (int)(input->data.sequence.items.top - input->data.sequence.items.start);
        if (dims != 1 && dims != 3)
            return at(c, input, "input", "expected [channels, height, width] or [features]");
        for (int i = 0; i < dims; i++) {
            const yaml_node_t *n =
                yaml_document_get_node(c->doc, input->data.sequence.items.start[i]);
            char f[32];
            snprintf(f, sizeof f, "input[%d]", i);
            TD_CHECK(get_int(c, n, f, 1, &dims_in[i]));
        }
        if (shape && (shape[0] != dims_in[0] || shape[1] != dims_in[1] || shape[2] != dims_in[2])) {
            char a[64], b[64];
            shape_text(a, sizeof a, dims_in);
            shape_text(b, sizeof b, shape);
            return at(c, input, "input",
                      "the spec says %s but the data has %s per sample; leave input: out to "
                      "take the data's shape",
                      a, b);
        }
    } else {
        memcpy(dims_in, shape, sizeof dims_in);
    }
    if (layers->type != YAML_SEQUENCE_NODE ||
        layers->data.sequence.items.top == layers->data.sequence.items.start)
        return at(c, layers, "layers", "expected a non-empty list of layers");
    size_t values = (size_t)dims_in[0] * (size_t)dims_in[1] * (size_t)dims_in[2];
    if (values > SPEC_MAX_VALUES)
        return at(c, input ? input : root, "input",
                  "%zu values per sample, more than the %d a spec allows", values, SPEC_MAX_VALUES);
    td_model_t *m = td_model_new(dims_in[0], dims_in[1], dims_in[2]);
    td_status st = add_layers(c, m, "layers", layers);
    if (st != TD_OK) {
        td_model_free(m);
        return st;
    }
    *out = m;
    return TD_OK;
}

/* A model spec nests three levels deep; libyaml's document loader takes quadratic time in the
 * nesting depth (100,000 brackets: 46 s). A pass over the events first refuses anything deeper
 * than this, in time linear in the bytes read before the refusal. */
#define SPEC_MAX_DEPTH 32

static td_status check_depth(const char *path, FILE *f) {
    yaml_parser_t parser;
    yaml_event_t ev;
    td_status st = TD_OK;
    int depth = 0;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    for (;;) {
        if (!yaml_parser_parse(&parser, &ev)) break; /* the loader reports syntax errors */
        yaml_event_type_t type = ev.type;
        if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) {
            if (++depth > SPEC_MAX_DEPTH) {
                st = td_error(TD_ERR_FORMAT,
                              "%s:%zu:%zu: nested more than %d levels deep; a model spec needs "
                              "3 (layers: a list of mappings), 4 more per residual block",
                              path, ev.start_mark.line + 1, ev.start_mark.column + 1,
                              SPEC_MAX_DEPTH);
                yaml_event_delete(&ev);
                break;
            }
        } else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        yaml_event_delete(&ev);
        if (type == YAML_STREAM_END_EVENT) break;
    }
    yaml_parser_delete(&parser);
    rewind(f);
    return st;
}

td_status td__model_load_spec(const char *path, const int *shape, int outputs, td_model_t **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return td_error_errno(TD_ERR_NOTFOUND, "cannot open model spec %s", path);
    td_status depth_st = check_depth(path, f);
    if (depth_st != TD_OK) {
        fclose(f);
        return depth_st;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    td_status st = TD_OK;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        char ctx[160] = "";
        if (parser.context)
            snprintf(ctx, sizeof ctx, " %s (started at %zu:%zu)", parser.context,
                     parser.context_mark.line + 1, parser.context_mark.column + 1);
        st = td_error(TD_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error: %s%s", path,
                      parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                      parser.problem ? parser.problem : "unknown", ctx);
        goto out;
    }
    spec_ctx c = {path, &doc, outputs};
    st = build(&c, shape, out);
    yaml_document_delete(&doc);
out:
    yaml_parser_delete(&parser);
    fclose(f);
    return st;
}
