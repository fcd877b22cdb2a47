/* YAML model specs (src/nn/spec.c, docs/model-spec.md): the input as a spec file. A spec that
 * loads must describe a consistent model: each layer takes the previous one's output shape, and
 * the layers' parameter slices tile the flat buffer in order. */
#include "fuzz.h"

#include <string.h>

#include "tandem/nn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    const char *path = fuzz_file(data, size);
    td_model_t *m = NULL;
    if (td_model_load(path, &m) != TD_OK) {
        /* errors point at the file (path:line:col), so a user can find the mistake */
        FUZZ_ASSERT(strstr(td_error_msg(), path), "error without the path: %s", td_error_msg());
        td_error_clear();
        return 0;
    }
    size_t offset = 0;
    int n = td_model_num_layers(m);
    FUZZ_ASSERT(n > 0, "%s", "a model without layers loaded");
    for (int i = 0; i < n; i++) {
        td_layer_info li = td_model_layer(m, i);
        FUZZ_ASSERT(li.param_offset == offset && li.weight_count <= li.param_count,
                    "layer %d: params at %zu (expected %zu), weight %zu of %zu", i, li.param_offset,
                    offset, li.weight_count, li.param_count);
        FUZZ_ASSERT(li.out_c > 0 && li.out_h > 0 && li.out_w > 0, "layer %d: output [%d, %d, %d]",
                    i, li.out_c, li.out_h, li.out_w);
        if (i > 0) {
            td_layer_info prev = td_model_layer(m, i - 1);
            FUZZ_ASSERT(li.in_c == prev.out_c && li.in_h == prev.out_h && li.in_w == prev.out_w,
                        "layer %d's input is not layer %d's output", i, i - 1);
        }
        FUZZ_ASSERT(li.name && li.name[0], "layer %d has no name", i);
        offset += li.param_count;
    }
    FUZZ_ASSERT(offset == td_model_num_params(m), "layers hold %zu params, the model %zu", offset,
                td_model_num_params(m));
    td_model_free(m);
    return 0;
}
