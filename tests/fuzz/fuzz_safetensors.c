/* safetensors (src/train/safetensors.c). tandem writes safetensors and never reads them, so the
 * outside input that reaches this code is the model: the input is a YAML model spec, and every
 * model that loads (and is small enough to allocate quickly) is exported to a file in memory.
 * The file is then read back as a reader would and checked against the model: an 8-byte
 * little-endian header length, a JSON header padded with spaces to 8 bytes, one F32 tensor per
 * weight and bias with the layer's shape and byte range, and a data section holding exactly the
 * model's parameters; and tandem's data reader (src/data/safetensors_read.c, whose offset rules
 * are the safetensors library's) must take every tensor back, byte for byte. */
#include "fuzz.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/data.h"
#include "tandem/nn.h"
#include "tandem/train.h"

/* Larger models are valid too, but allocating and writing them would make each input slow. */
#define MAX_FLOATS (1u << 18)

static uint8_t *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    FUZZ_ASSERT(f, "cannot open %s", path);
    struct stat sb;
    FUZZ_ASSERT(fstat(fileno(f), &sb) == 0, "%s", "fstat");
    *size = (size_t)sb.st_size;
    uint8_t *buf = malloc(*size ? *size : 1);
    FUZZ_ASSERT(buf && fread(buf, 1, *size, f) == *size, "cannot read %s", path);
    fclose(f);
    return buf;
}

/* The header entry `name` must be a dtype_want tensor of the given shape at bytes [begin, end). */
static void check_tensor(json_t *root, const char *name, const char *dtype_want,
                         const int64_t *shape, int ndims, size_t begin, size_t end) {
    json_t *t = json_object_get(root, name);
    FUZZ_ASSERT(json_is_object(t), "no tensor %s in the header", name);
    json_t *dtype = json_object_get(t, "dtype"), *dims = json_object_get(t, "shape");
    json_t *off = json_object_get(t, "data_offsets");
    FUZZ_ASSERT(json_is_string(dtype) && !strcmp(json_string_value(dtype), dtype_want) &&
                    json_is_array(dims) && json_is_array(off) && json_array_size(off) == 2,
                "tensor %s: malformed entry", name);
    char got[128] = "", want[128] = "";
    size_t glen = 0, wlen = 0;
    for (size_t d = 0; d < json_array_size(dims) && glen < sizeof got; d++)
        glen += (size_t)snprintf(got + glen, sizeof got - glen, " %lld",
                                 (long long)json_integer_value(json_array_get(dims, d)));
    for (int d = 0; d < ndims && wlen < sizeof want; d++)
        wlen += (size_t)snprintf(want + wlen, sizeof want - wlen, " %lld", (long long)shape[d]);
    FUZZ_ASSERT(!strcmp(got, want), "tensor %s: shape [%s ] where the layer has [%s ]", name, got,
                want);
    FUZZ_ASSERT((size_t)json_integer_value(json_array_get(off, 0)) == begin &&
                    (size_t)json_integer_value(json_array_get(off, 1)) == end,
                "tensor %s: bytes [%lld, %lld), the layer's are [%zu, %zu)", name,
                (long long)json_integer_value(json_array_get(off, 0)),
                (long long)json_integer_value(json_array_get(off, 1)), begin, end);
}

/* The file must hold PyTorch's state_dict of the model, and nothing else: each layer's weight
 * (Linear [out, in], Conv2d [out_c, in_c, k, k], BatchNorm2d [C], LayerNorm the per-sample shape,
 * [C] or [C, H, W]) and bias (LayerNorm's: the weight's shape) at the layer's slice of the flat
 * parameter buffer; then each BatchNorm's running_mean and running_var [C] at its slice of the
 * buffers, after the parameters; then one I64 num_batches_tracked scalar per BatchNorm. */
static void check_file(const char *path, td_model_t *m) {
    size_t size;
    uint8_t *buf = slurp(path, &size);
    FUZZ_ASSERT(size >= 8, "%zu bytes", size);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)buf[i] << (8 * i);
    FUZZ_ASSERT(hlen % 8 == 0 && hlen <= size - 8, "header length %llu of a %zu-byte file",
                (unsigned long long)hlen, size);
    size_t nbn = 0;
    for (int i = 0; i < td_model_num_layers(m); i++)
        nbn += td_model_layer(m, i).kind == TD_LAYER_BATCHNORM;
    size_t params_bytes = td_model_num_params(m) * sizeof(float);
    size_t buffers_bytes = td_model_num_buffers(m) * sizeof(float);
    size_t data_bytes = size - 8 - hlen;
    FUZZ_ASSERT(data_bytes == params_bytes + buffers_bytes + 8 * nbn,
                "data section %zu bytes for %zu params, %zu buffers, %zu batchnorm counters",
                data_bytes, td_model_num_params(m), td_model_num_buffers(m), nbn);
    FUZZ_ASSERT(!memcmp(buf + 8 + hlen, td_model_params(m), params_bytes), "%s",
                "the data section does not start with the parameters");
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, hlen, 0, &jerr);
    FUZZ_ASSERT(json_is_object(root), "header is not a JSON object: %s", jerr.text);
    size_t tensors = 0, bn_seen = 0;
    for (int i = 0; i < td_model_num_layers(m); i++) {
        td_layer_info li = td_model_layer(m, i);
        if (!li.param_count) continue;
        char name[128];
        int64_t shape[4] = {li.out_c, li.in_c, li.kernel, li.kernel};
        int ndims = 4;
        if (li.kind == TD_LAYER_LINEAR) {
            shape[1] = (int64_t)li.in_c * li.in_h * li.in_w;
            ndims = 2;
        } else if (li.kind == TD_LAYER_BATCHNORM) {
            shape[0] = li.in_c;
            ndims = 1;
        } else if (li.kind == TD_LAYER_LAYERNORM) {
            shape[0] = li.in_c, shape[1] = li.in_h, shape[2] = li.in_w;
            ndims = li.in_h == 1 && li.in_w == 1 ? 1 : 3;
        }
        size_t w0 = li.param_offset * 4, w1 = w0 + li.weight_count * 4;
        snprintf(name, sizeof name, "%s.weight", li.name);
        check_tensor(root, name, "F32", shape, ndims, w0, w1);
        tensors++;
        if (li.param_count > li.weight_count) {
            int64_t bias[1] = {(int64_t)(li.param_count - li.weight_count)};
            snprintf(name, sizeof name, "%s.bias", li.name);
            if (li.kind == TD_LAYER_LAYERNORM)
                check_tensor(root, name, "F32", shape, ndims, w1, (li.param_offset + li.param_count) * 4);
            else
                check_tensor(root, name, "F32", bias, 1, w1, (li.param_offset + li.param_count) * 4);
            tensors++;
        }
        if (li.kind == TD_LAYER_BATCHNORM) {
            int64_t c[1] = {li.in_c};
            size_t r0 = params_bytes + li.buffer_offset * 4, r1 = r0 + (size_t)li.in_c * 4;
            snprintf(name, sizeof name, "%s.running_mean", li.name);
            check_tensor(root, name, "F32", c, 1, r0, r1);
            snprintf(name, sizeof name, "%s.running_var", li.name);
            check_tensor(root, name, "F32", c, 1, r1, r1 + (size_t)li.in_c * 4);
            size_t t0 = params_bytes + buffers_bytes + bn_seen * 8;
            snprintf(name, sizeof name, "%s.num_batches_tracked", li.name);
            check_tensor(root, name, "I64", NULL, 0, t0, t0 + 8);
            tensors += 3;
            bn_seen++;
        }
    }
    FUZZ_ASSERT(json_object_size(root) == tensors + 1 &&
                    json_is_object(json_object_get(root, "__metadata__")),
                "%zu header entries for %zu tensors and __metadata__", json_object_size(root),
                tensors);
    /* and tandem's own data reader, which checks the file as the safetensors library does
     * (offsets tiling the data exactly, metadata of strings), takes every tensor back */
    char **names;
    int n;
    FUZZ_ASSERT(td_safetensors_list(path, &names, &n) == TD_OK,
                "the data reader refuses the export: %s", td_error_msg());
    FUZZ_ASSERT((size_t)n == tensors, "the data reader lists %d tensors of %zu", n, tensors);
    for (int i = 0; i < n; i++) {
        td_array a;
        FUZZ_ASSERT(td_safetensors_read(path, names[i], false, &a) == TD_OK,
                    "the data reader cannot read %s: %s", names[i], td_error_msg());
        json_t *off = json_object_get(json_object_get(root, names[i]), "data_offsets");
        size_t b = (size_t)json_integer_value(json_array_get(off, 0));
        size_t e = (size_t)json_integer_value(json_array_get(off, 1));
        FUZZ_ASSERT(!memcmp(a.data, buf + 8 + hlen + b, e - b), "tensor %s: other bytes", names[i]);
        td_array_free(&a);
        free(names[i]);
    }
    free(names);
    json_decref(root);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    td_model_t *m = NULL;
    if (td_model_load(fuzz_file(data, size), &m) != TD_OK) {
        td_error_clear();
        return 0;
    }
    size_t floats = td_model_num_params(m);
    for (int i = 0; i < td_model_num_layers(m); i++) {
        td_layer_info li = td_model_layer(m, i);
        floats += (size_t)li.out_c * (size_t)li.out_h * (size_t)li.out_w;
    }
    if (floats <= MAX_FLOATS && td_model_finalize(m, 1) == TD_OK) {
        td_model_init_params(m, 1);
        char path[512];
        snprintf(path, sizeof path, "%s/model.safetensors", fuzz_dir());
        /* every model that trains exports */
        FUZZ_ASSERT(td_save_safetensors(path, m) == TD_OK, "export failed: %s", td_error_msg());
        check_file(path, m);
        unlink(path);
    }
    td_error_clear();
    td_model_free(m);
    return 0;
}
