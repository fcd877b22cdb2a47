/* The GPU layer of a build without the CUDA backend (TANDEM_CUDA=OFF, or no nvcc at configure
 * time): nothing can run on a GPU, and every entry point says so and how to get one. */
#include <stdio.h>

#include "tandem/gpu.h"

#define NO_CUDA                                                                                    \
    "this tandem was built without the CUDA backend (no nvcc at configure time, or "               \
    "-DTANDEM_CUDA=OFF); rebuild with the CUDA toolkit installed (cmake -DTANDEM_CUDA=ON), or "    \
    "train with --device cpu"

bool td_gpu_available(char *why, size_t cap) {
    snprintf(why, cap, "%s", NO_CUDA);
    return false;
}

int td_gpu_device_count(void) {
    return 0;
}

td_status td_gpu_new(td_model_t *model, const td_optim_config *optim, const td_gpu_config *cfg,
                     td_gpu_t **out) {
    (void)model, (void)optim, (void)cfg;
    *out = NULL;
    return td_error(TD_ERR_UNSUPPORTED, "--device cuda: %s", NO_CUDA);
}

/* Unreachable without an engine (td_gpu_new never returns one); kept so callers link. */
void td_gpu_free(td_gpu_t *g) {
    (void)g;
}
const char *td_gpu_describe(const td_gpu_t *g) {
    (void)g;
    return "no CUDA backend";
}
size_t td_gpu_memory_bytes(const td_gpu_t *g) {
    (void)g;
    return 0;
}
size_t td_gpu_free_memory(td_gpu_t *g) {
    (void)g;
    return 0;
}

#define UNSUPPORTED return td_error(TD_ERR_UNSUPPORTED, "%s", NO_CUDA)
td_status td_gpu_set_dataset(td_gpu_t *g, int which, const td_gpu_dataset *d) {
    (void)g, (void)which, (void)d;
    UNSUPPORTED;
}
td_status td_gpu_set_epoch(td_gpu_t *g, const uint64_t *perm, uint64_t count) {
    (void)g, (void)perm, (void)count;
    UNSUPPORTED;
}
td_status td_gpu_upload_state(td_gpu_t *g, const float *params, const float *optim_state,
                              uint64_t optim_steps) {
    (void)g, (void)params, (void)optim_state, (void)optim_steps;
    UNSUPPORTED;
}
td_status td_gpu_download_state(td_gpu_t *g, float *params, float *optim_state) {
    (void)g, (void)params, (void)optim_state;
    UNSUPPORTED;
}
td_status td_gpu_step(td_gpu_t *g, const td_gpu_step_args *a, bool apply_optimizer) {
    (void)g, (void)a, (void)apply_optimizer;
    UNSUPPORTED;
}
td_status td_gpu_step_stats(td_gpu_t *g, int64_t step, double sums[3]) {
    (void)g, (void)step, (void)sums;
    UNSUPPORTED;
}
td_status td_gpu_step_bn_stats(td_gpu_t *g, int64_t step, float *out, size_t ld) {
    (void)g, (void)step, (void)out, (void)ld;
    UNSUPPORTED;
}
td_status td_gpu_batch_stats(td_gpu_t *g, float *out) {
    (void)g, (void)out;
    UNSUPPORTED;
}
td_status td_gpu_upload_buffers(td_gpu_t *g) {
    (void)g;
    UNSUPPORTED;
}
td_status td_gpu_grads_to_host(td_gpu_t *g) {
    (void)g;
    UNSUPPORTED;
}
td_status td_gpu_apply(td_gpu_t *g) {
    (void)g;
    UNSUPPORTED;
}
td_status td_gpu_evaluate(td_gpu_t *g, uint64_t lo, uint64_t hi, double sums[3]) {
    (void)g, (void)lo, (void)hi, (void)sums;
    UNSUPPORTED;
}
td_status td_gpu_model_forward(td_gpu_t *g, const float *x, int batch, const td_forward_ctx *ctx,
                               float *y) {
    (void)g, (void)x, (void)batch, (void)ctx, (void)y;
    UNSUPPORTED;
}
td_status td_gpu_model_backward(td_gpu_t *g, const float *dy, int batch, float *grads) {
    (void)g, (void)dy, (void)batch, (void)grads;
    UNSUPPORTED;
}
td_status td_gpu_optim_step(td_gpu_t *g, float *params, const float *grads) {
    (void)g, (void)params, (void)grads;
    UNSUPPORTED;
}
td_status td_gpu_ipc_export(td_gpu_t *g, void *handle) {
    (void)g, (void)handle;
    UNSUPPORTED;
}
td_status td_gpu_ipc_open(td_gpu_t *g, int world_size, int rank, const void *handles) {
    (void)g, (void)world_size, (void)rank, (void)handles;
    UNSUPPORTED;
}
td_status td_gpu_ipc_reduce(td_gpu_t *g) {
    (void)g;
    UNSUPPORTED;
}
td_status td_gpu_ipc_apply(td_gpu_t *g) {
    (void)g;
    UNSUPPORTED;
}
