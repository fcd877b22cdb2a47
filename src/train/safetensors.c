/* safetensors export: 8-byte little-endian header length, a JSON header, then the tensors'
 * bytes. The data section is the model's flat parameter buffer as it is (forward order, weight
 * then bias per layer), so the offsets are the layers' param offsets. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/train.h"
#include "train/fileio.h"

static int is_square(size_t v, size_t *root) {
    size_t r = (size_t)(sqrt((double)v) + 0.5);
    if (r * r != v) return 0;
    *root = r;
    return 1;
}

/* nn.h describes a layer by its output shape and parameter counts; a conv weight's
 * [out_c, in_c, k, k] shape follows from the previous layer's channels (or, for the first
 * layer, from the input size: the one in_c for which both the input and the kernel are
 * square). */
static td_status weight_shape(td_model_t *m, int i, json_int_t shape[4], int *ndims) {
    td_layer_info li = td_model_layer(m, i);
    size_t per_out = li.weight_count / (size_t)li.out_c;
    if (li.kind == TD_LAYER_LINEAR) {
        shape[0] = li.out_c;
        shape[1] = (json_int_t)per_out;
        *ndims = 2;
        return TD_OK;
    }
    if (li.kind != TD_LAYER_CONV2D)
        return td_error(TD_ERR_UNSUPPORTED,
                        "safetensors: layer %s has parameters but is not "
                        "linear or conv2d",
                        li.name);
    size_t in_c = 0, k = 0;
    if (i > 0) {
        in_c = (size_t)td_model_layer(m, i - 1).out_c;
        if (per_out % in_c || !is_square(per_out / in_c, &k)) in_c = 0;
    } else {
        size_t in = (size_t)td_model_input_size(m), root;
        for (size_t c = 1; c <= per_out && !in_c; c++)
            if (per_out % c == 0 && in % c == 0 && is_square(per_out / c, &k) &&
                is_square(in / c, &root))
                in_c = c;
    }
    if (!in_c)
        return td_error(TD_ERR_UNSUPPORTED,
                        "safetensors: cannot tell the kernel shape of conv layer %s (%zu weights "
                        "for %d output channels)",
                        li.name, li.weight_count, li.out_c);
    shape[0] = li.out_c;
    shape[1] = (json_int_t)in_c;
    shape[2] = shape[3] = (json_int_t)k;
    *ndims = 4;
    return TD_OK;
}

static json_t *tensor_entry(const json_int_t *shape, int ndims, size_t begin, size_t end) {
    json_t *t = json_object();
    json_t *s = json_array();
    for (int d = 0; d < ndims; d++) json_array_append_new(s, json_integer(shape[d]));
    json_object_set_new(t, "dtype", json_string("F32"));
    json_object_set_new(t, "shape", s);
    json_t *off = json_array();
    json_array_append_new(off, json_integer((json_int_t)begin));
    json_array_append_new(off, json_integer((json_int_t)end));
    json_object_set_new(t, "data_offsets", off);
    return t;
}

td_status td_save_safetensors(const char *path, td_model_t *m) {
    td_status rc = TD_OK;
    char *text = NULL, *header = NULL;
    json_t *root = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    for (int i = 0; i < td_model_num_layers(m); i++) {
        td_layer_info li = td_model_layer(m, i);
        if (!li.param_count) continue;
        json_int_t shape[4] = {0};
        int ndims = 0;
        TD_CHECK_GOTO(weight_shape(m, i, shape, &ndims), rc, out);
        size_t w0 = li.param_offset * 4, w1 = (li.param_offset + li.weight_count) * 4;
        size_t b1 = (li.param_offset + li.param_count) * 4;
        char *key = td_xasprintf("%s.weight", li.name);
        json_object_set_new(root, key, tensor_entry(shape, ndims, w0, w1));
        free(key);
        if (li.param_count > li.weight_count) {
            json_int_t bshape[1] = {(json_int_t)(li.param_count - li.weight_count)};
            key = td_xasprintf("%s.bias", li.name);
            json_object_set_new(root, key, tensor_entry(bshape, 1, w1, b1));
            free(key);
        }
    }
    text = json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT);
    size_t len = strlen(text);
    size_t padded = (len + 7) & ~(size_t)7; /* the spec pads the header with spaces to 8 */
    header = td_xmalloc(padded);
    memcpy(header, text, len);
    memset(header + len, ' ', padded - len);
    uint8_t len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (uint8_t)((uint64_t)padded >> (8 * b));
    td__chunk chunks[3] = {
        {len8, 8}, {header, padded}, {td_model_params(m), td_model_num_params(m) * sizeof(float)}};
    TD_CHECK_GOTO(td__write_atomic(path, "safetensors file", chunks, 3), rc, out);
out:
    json_decref(root);
    free(text);
    free(header);
    return rc;
}
