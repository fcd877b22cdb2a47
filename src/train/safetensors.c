/* safetensors export: 8-byte little-endian header length, a JSON header, then the tensors'
 * bytes. The data section is the model's flat parameter buffer as it is (forward order, weight
 * then bias per layer), so the offsets are the layers' param offsets; then the batchnorm
 * buffers (running_mean, running_var per layer, float32) and each batchnorm layer's
 * num_batches_tracked (int64 little-endian scalars), the keys PyTorch's state_dict has. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/train.h"
#include "tandem/os.h"

/* PyTorch's shape of layer i's weight, from the layer's own description (nn.h): Linear
 * [out, in], Conv2d [out_c, in_c, k, k]. (It used to be inferred from the weight count, which
 * took a first conv over several channels for one channel with a larger kernel: input
 * [4, 14, 14], kernel 3 was written as [out, 1, 6, 6]; found by tests/fuzz/fuzz_safetensors.c.) */
static td_status weight_shape(td_model_t *m, int i, json_int_t shape[4], int *ndims) {
    td_layer_info li = td_model_layer(m, i);
    if (li.kind == TD_LAYER_BATCHNORM) { /* weight [C], bias [C] */
        shape[0] = li.in_c;
        *ndims = 1;
        return TD_OK;
    }
    if (li.kind == TD_LAYER_LAYERNORM) { /* normalized_shape: the per-sample shape */
        shape[0] = li.in_c, shape[1] = li.in_h, shape[2] = li.in_w;
        *ndims = li.in_h == 1 && li.in_w == 1 ? 1 : 3;
        return TD_OK;
    }
    if (li.kind == TD_LAYER_LINEAR) {
        shape[0] = li.out_c;
        shape[1] = (json_int_t)(li.weight_count / (size_t)li.out_c);
        *ndims = 2;
        return TD_OK;
    }
    if (li.kind != TD_LAYER_CONV2D ||
        (size_t)li.out_c * (size_t)li.in_c * (size_t)li.kernel * (size_t)li.kernel !=
            li.weight_count)
        return td_error(TD_ERR_UNSUPPORTED,
                        "safetensors: layer %s has %zu weights but is not a linear or conv2d "
                        "layer tandem can describe",
                        li.name, li.weight_count);
    shape[0] = li.out_c;
    shape[1] = li.in_c;
    shape[2] = shape[3] = li.kernel;
    *ndims = 4;
    return TD_OK;
}

static json_t *tensor_entry_typed(const char *dtype, const json_int_t *shape, int ndims,
                                  size_t begin, size_t end) {
    json_t *t = json_object();
    json_t *s = json_array();
    for (int d = 0; d < ndims; d++) json_array_append_new(s, json_integer(shape[d]));
    json_object_set_new(t, "dtype", json_string(dtype));
    json_object_set_new(t, "shape", s);
    json_t *off = json_array();
    json_array_append_new(off, json_integer((json_int_t)begin));
    json_array_append_new(off, json_integer((json_int_t)end));
    json_object_set_new(t, "data_offsets", off);
    return t;
}

static json_t *tensor_entry(const json_int_t *shape, int ndims, size_t begin, size_t end) {
    return tensor_entry_typed("F32", shape, ndims, begin, end);
}

td_status td_save_safetensors(const char *path, td_model_t *m) {
    td_status rc = TD_OK;
    char *text = NULL, *header = NULL;
    uint8_t *tracked = NULL;
    size_t params_bytes = td_model_num_params(m) * sizeof(float);
    size_t buffers_bytes = td_model_num_buffers(m) * sizeof(float);
    int nbn = 0;
    for (int i = 0; i < td_model_num_layers(m); i++)
        nbn += td_model_layer(m, i).kind == TD_LAYER_BATCHNORM;
    tracked = td_xcalloc((size_t)nbn + 1, 8);
    json_t *root = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    int bn_seen = 0;
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
            json_int_t bshape[4] = {(json_int_t)(li.param_count - li.weight_count)};
            int bdims = 1;
            if (li.kind == TD_LAYER_LAYERNORM) { /* bias: the weight's shape */
                memcpy(bshape, shape, sizeof bshape);
                bdims = ndims;
            }
            key = td_xasprintf("%s.bias", li.name);
            json_object_set_new(root, key, tensor_entry(bshape, bdims, w1, b1));
            free(key);
        }
        if (li.kind == TD_LAYER_BATCHNORM) {
            /* running statistics after the parameters, num_batches_tracked after those */
            json_int_t c[1] = {li.in_c};
            size_t r0 = params_bytes + li.buffer_offset * 4, r1 = r0 + (size_t)li.in_c * 4;
            char *k1 = td_xasprintf("%s.running_mean", li.name);
            char *k2 = td_xasprintf("%s.running_var", li.name);
            char *k3 = td_xasprintf("%s.num_batches_tracked", li.name);
            json_object_set_new(root, k1, tensor_entry(c, 1, r0, r1));
            json_object_set_new(root, k2, tensor_entry(c, 1, r1, r1 + (size_t)li.in_c * 4));
            size_t t0 = params_bytes + buffers_bytes + (size_t)bn_seen * 8;
            json_object_set_new(root, k3, tensor_entry_typed("I64", NULL, 0, t0, t0 + 8));
            uint64_t n = (uint64_t)td_model_batches_tracked(m);
            for (int b = 0; b < 8; b++) tracked[(size_t)bn_seen * 8 + b] = (uint8_t)(n >> (8 * b));
            bn_seen++;
            free(k1), free(k2), free(k3);
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
    td_chunk chunks[5] = {{len8, 8},
                          {header, padded},
                          {td_model_params(m), params_bytes},
                          {td_model_buffers(m), buffers_bytes},
                          {tracked, (size_t)nbn * 8}};
    int nchunks = 3 + (buffers_bytes > 0) + (nbn > 0);
    TD_CHECK_GOTO(td_write_atomic(path, "safetensors file", chunks, nchunks), rc, out);
out:
    json_decref(root);
    free(text);
    free(header);
    free(tracked);
    return rc;
}
