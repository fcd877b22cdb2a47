/* Device names, in every build (with or without the CUDA backend). */
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
