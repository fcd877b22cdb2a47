/* tandem nn: layers as forward/backward pairs over one contiguous parameter buffer and one
 * gradient buffer, sequential models, presets, a YAML model spec, losses.
 *
 * Memory layout (the contract ddp and optim rely on):
 *   params[0 .. num_params) and grads[0 .. num_params) are single 64-byte-aligned buffers.
 *   Layer i owns the slice [param_offset, param_offset + param_count) of both, laid out in
 *   forward order; within a layer, weight first, then bias, in PyTorch's shapes
 *   (Linear: weight [out, in], bias [out]; Conv2d: weight [out_c, in_c, kh, kw], bias [out_c]).
 *   So a checkpoint, a safetensors file, a gradient bucket and the optimizer all see the same
 *   flat float array.
 * Activations are NCHW float32, batch-major, in buffers the model owns (sized at finalize for
 * max_batch). Backward accumulates into grads; zeroing is explicit (td_model_zero_grads).
 *
 * Determinism: forward and backward of one sample batch give the same bits whatever the number
 * of threads, and dropout masks depend only on (seed, step, global sample id, element), never on
 * rank, batch position or thread. Buckets and the collective rely on it.
 */
#ifndef TANDEM_NN_H
#define TANDEM_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_model td_model_t;

typedef enum {
    TD_LAYER_LINEAR,
    TD_LAYER_CONV2D,
    TD_LAYER_MAXPOOL2D,
    TD_LAYER_RELU,
    TD_LAYER_DROPOUT,
    TD_LAYER_FLATTEN,
    TD_LAYER_LOG_SOFTMAX,
} td_layer_kind;

typedef struct {
    td_layer_kind kind;
    const char *name;        /* "conv1", "fc2", ... unique within the model; used in safetensors */
    size_t param_offset;     /* first float of this layer in params/grads */
    size_t param_count;      /* floats; 0 for layers without parameters */
    size_t weight_count;     /* floats of the weight; bias follows it */
    int in_c, in_h, in_w;    /* input shape per sample */
    int out_c, out_h, out_w; /* output shape per sample (out_h = out_w = 1 for vectors) */
    int kernel, stride, pad; /* conv2d, maxpool2d */
    float p;                 /* dropout probability */
    double flops_fwd;        /* forward multiply-adds x2 per sample, for GFLOP/s reports */
} td_layer_info;

/* ---- building a model in C ----
 * Start with the per-sample input shape, add layers in order, then finalize. Shapes are checked
 * as layers are added; a mismatch is TD_ERR_INVALID naming the layer and both shapes. */
td_model_t *td_model_new(int in_c, int in_h, int in_w);
td_status td_model_add_linear(td_model_t *m, int out_features);
td_status td_model_add_conv2d(td_model_t *m, int out_channels, int kernel, int stride, int padding);
td_status td_model_add_maxpool2d(td_model_t *m, int kernel, int stride);
td_status td_model_add_relu(td_model_t *m);
td_status td_model_add_dropout(td_model_t *m, float p);
td_status td_model_add_flatten(td_model_t *m);
td_status td_model_add_log_softmax(td_model_t *m);
/* Allocates params, grads and activations for batches of up to max_batch samples. */
td_status td_model_finalize(td_model_t *m, int max_batch);
void td_model_free(td_model_t *m);

/* "basicnet", "mlp7", or a path to a YAML spec (see docs/model-spec.md); not finalized. */
td_status td_model_load(const char *name_or_path, td_model_t **out);

/* ---- inspection ---- */
size_t td_model_num_params(const td_model_t *m);
int td_model_num_layers(const td_model_t *m);
td_layer_info td_model_layer(const td_model_t *m, int i);
int td_model_output_size(const td_model_t *m);         /* floats per sample of the last layer */
int td_model_input_size(const td_model_t *m);          /* floats per sample of the input */
double td_model_flops_per_sample(const td_model_t *m); /* forward + backward */
float *td_model_params(td_model_t *m);
float *td_model_grads(td_model_t *m);

/* PyTorch's default initialisation: kaiming_uniform(a=sqrt(5)) for weights, i.e.
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for biases,
 * drawn from Philox with key seed and stream = layer index, element = index in the layer. */
void td_model_init_params(td_model_t *m, uint64_t seed);

/* ---- running ---- */
typedef struct {
    bool training;              /* dropout active */
    uint64_t seed;              /* run seed */
    uint64_t step;              /* optimizer step, part of the dropout key */
    const uint64_t *sample_ids; /* [batch] global sample index of each row; dropout key */
} td_forward_ctx;

/* x: [batch, in_c, in_h, in_w]; returns the model's output [batch, output_size], owned by the
 * model and valid until the next forward. batch <= max_batch. Returns NULL (td_error set) when
 * the model is not finalized or batch is out of range. ctx NULL means eval; in training mode a
 * NULL sample_ids uses the row index as the sample id. */
const float *td_model_forward(td_model_t *m, const float *x, int batch, const td_forward_ctx *ctx);

/* dout: [batch, output_size], gradient of the loss w.r.t. the last forward's output (not
 * modified). Accumulates parameter gradients into grads, last layer first. The first layer's
 * input gradient is not computed (nothing needs it). batch must equal the last forward's batch
 * (otherwise an error is logged and grads are left unchanged). */
void td_model_backward(td_model_t *m, const float *dout, int batch);

/* Called during backward right after layer `layer`'s parameter gradients are final for this
 * backward pass, with that layer's slice of grads. The ddp reducer uses it to launch a bucket's
 * allreduce while earlier layers are still computing. */
typedef void (*td_grad_ready_fn)(void *user, int layer, size_t param_offset, size_t param_count);
void td_model_set_grad_ready_hook(td_model_t *m, td_grad_ready_fn fn, void *user);

void td_model_zero_grads(td_model_t *m);

/* The Philox key of dropout layer `layer`'s masks at optimizer step `step`: element e of the
 * sample with global id s keeps its value iff uniform(key, stream s, element e) >= p, with
 * uniform as td_rng_uniform (core.h). Every engine (CPU, CUDA) draws the same masks from it. */
uint64_t td_dropout_key(uint64_t seed, uint64_t step, int layer);

/* ---- losses ----
 * Both return the *sum* of per-sample losses over the batch (as double) and write
 * dinput = grad_scale * d(sum of losses)/d(input). The trainer passes grad_scale = 1/global_batch
 * so every micro-batch's gradient is already scaled for the mean over the global batch and
 * micro-batches sum without a later division (that keeps N workers bitwise equal to one). */
double td_nll_loss(const float *logp, const int32_t *labels, int batch, int classes,
                   float grad_scale, float *dlogp);
/* Fused log_softmax + NLL over raw logits. */
double td_cross_entropy(const float *logits, const int32_t *labels, int batch, int classes,
                        float grad_scale, float *dlogits);
/* Number of rows whose argmax equals the label. */
int td_count_correct(const float *out, const int32_t *labels, int batch, int classes);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_NN_H */
