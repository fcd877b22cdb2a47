/* Device and precision names, in every build (with or without the CUDA backend). */
#include <string.h>

#include "tandem/gpu.h"

td_status td_device_parse(const char *name, td_device *out) {
    if (!strcmp(name, "cpu"))
        *out = TD_DEVICE_CPU;
    else if (!strcmp(name, "cuda") || !strcmp(name, "gpu"))
        *out = TD_DEVICE_CUDA;
    else
        return td_error(TD_ERR_INVALID, "device '%s': use cpu or cuda", name);
    return TD_OK;
}

const char *td_device_name(td_device d) {
    return d == TD_DEVICE_CUDA ? "cuda" : "cpu";
}

td_status td_precision_parse(const char *name, td_precision *out) {
    if (!strcmp(name, "fp32"))
        *out = TD_PRECISION_FP32;
    else if (!strcmp(name, "tf32"))
        *out = TD_PRECISION_TF32;
    else if (!strcmp(name, "bf16"))
        *out = TD_PRECISION_BF16;
    else
        return td_error(TD_ERR_INVALID, "precision '%s': use fp32, tf32 or bf16", name);
    return TD_OK;
}

const char *td_precision_name(td_precision p) {
    return p == TD_PRECISION_TF32 ? "tf32" : p == TD_PRECISION_BF16 ? "bf16" : "fp32";
}
