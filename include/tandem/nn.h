/* tandem nn: layers as forward/backward pairs over one contiguous parameter buffer and one
 * gradient buffer, sequential models with residual blocks, presets built for the data's shape,
 * a YAML model spec, losses (classification, regression, multi-label).
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
    TD_LAYER_GELU, /* exact erf form, nn.GELU() */
    TD_LAYER_TANH,
    TD_LAYER_SIGMOID,
    TD_LAYER_LAYERNORM, /* over each sample's whole C*H*W vector, weight and bias that size */
    TD_LAYER_BATCHNORM, /* per channel over the batch (and H, W): BatchNorm1d / BatchNorm2d */
    TD_LAYER_AVGPOOL2D,
    TD_LAYER_GLOBAL_AVGPOOL, /* mean over H, W: [C, H, W] -> [C, 1, 1] */
    TD_LAYER_RESIDUAL,       /* end of a residual block: body(x) + shortcut(x) */
} td_layer_kind;

/* "linear", "conv2d", ..., "residual": the spec's name of a kind. */
const char *td_layer_kind_name(td_layer_kind kind);

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
    const char *kind_name;   /* td_layer_kind_name(kind) */
    float eps, momentum;     /* layernorm (eps), batchnorm (eps, momentum) */
    size_t buffer_offset;    /* batchnorm: first float of its running mean in td_model_buffers */
    size_t buffer_count;     /* batchnorm: 2 * channels (mean[C] then var[C]); 0 otherwise */
    /* Data flow. Layer i reads the output of layer input_from - 1 (the model's input when
     * input_from == 0); that is i, the previous layer, except for a residual shortcut's first
     * layer, which reads the block's input. A residual layer adds the outputs of layers i - 1
     * and input2_from - 1 (input2_from = -1 for other kinds). */
    int input_from, input2_from;
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
td_status td_model_add_gelu(td_model_t *m);
td_status td_model_add_tanh(td_model_t *m);
td_status td_model_add_sigmoid(td_model_t *m);
/* nn.LayerNorm(normalized_shape = the per-sample shape, eps): weight = 1, bias = 0. */
td_status td_model_add_layernorm(td_model_t *m, float eps);
/* BatchNorm over the channels (features for a flat input): weight = 1, bias = 0, running mean 0
 * and variance 1. Training forwards normalise with the micro-batch's mean and biased variance;
 * eval forwards with the running statistics, which only td_model_update_running_stats changes. */
td_status td_model_add_batchnorm(td_model_t *m, float eps, float momentum);
td_status td_model_add_avgpool2d(td_model_t *m, int kernel, int stride); /* padding 0 */
td_status td_model_add_global_avgpool(td_model_t *m);
/* Residual blocks: begin_residual, the body's layers, optionally begin_shortcut and the
 * shortcut's layers, then add_residual, which adds a TD_LAYER_RESIDUAL layer whose output is
 * body(x) + shortcut(x) (x itself without a shortcut; the shapes must match). Blocks nest. */
td_status td_model_begin_residual(td_model_t *m);
td_status td_model_begin_shortcut(td_model_t *m);
td_status td_model_add_residual(td_model_t *m);
/* Allocates params, grads and activations for batches of up to max_batch samples. */
td_status td_model_finalize(td_model_t *m, int max_batch);
void td_model_free(td_model_t *m);

/* A model for data of per-sample shape [in_c, in_h, in_w] (a flat vector of F features is
 * [F, 1, 1]) with `outputs` values per sample: a preset, built for that shape ("basicnet", "mlp7",
 * "mlp", "resnet-small"; an error names the preset, the shape and a preset that fits when it does
 * not), or a path to a YAML spec (docs/model-spec.md), whose `input:` may then be left out and
 * whose `out: outputs` means `outputs`. Not finalized. */
td_status td_model_load_for(const char *name_or_path, int in_c, int in_h, int in_w, int outputs,
                            td_model_t **out);
/* td_model_load_for a preset with the shape of (Fashion-)MNIST: [1, 28, 28], 10 outputs. A
 * spec must then give its input: and cannot use `out: outputs`. */
td_status td_model_load(const char *name_or_path, td_model_t **out);

/* ---- inspection ---- */
size_t td_model_num_params(const td_model_t *m);
int td_model_num_layers(const td_model_t *m);
td_layer_info td_model_layer(const td_model_t *m, int i);
int td_model_output_size(const td_model_t *m);         /* floats per sample of the last layer */
int td_model_input_size(const td_model_t *m);          /* floats per sample of the input */
double td_model_flops_per_sample(const td_model_t *m); /* forward + backward */
/* Layer i's part of it: its forward's, or its backward's (the weight gradient's for a layer with
 * parameters, and the input gradient's when a layer before it has parameters too). */
double td_model_layer_flops(const td_model_t *m, int i, bool backward);
float *td_model_params(td_model_t *m);
float *td_model_grads(td_model_t *m);

/* ---- profile ----
 * td_model_set_profiling(m, true) starts per-layer timers (from zero the first time; false
 * pauses them, an evaluation's forwards say, and keeps the sums): each layer's forward
 * and backward (its Winograd filter transform, im2col, gemms, the partial sums' reduction...)
 * add the thread time their work takes. A layer run across T threads at once (linear,
 * batchnorm) counts its wall time T times; layers run sample by sample count each thread's time
 * per chunk of samples, and a thread idle at such a segment's end counts for no layer. Off (the
 * default): one branch per layer and chunk. */
void td_model_set_profiling(td_model_t *m, bool on);
/* Thread-seconds per layer since profiling was turned on: fwd_s[i] and bwd_s[i], num_layers
 * each. */
void td_model_profile(const td_model_t *m, double *fwd_s, double *bwd_s);

/* ---- batchnorm state ----
 * Buffers: every batchnorm layer's running mean[C] then running variance[C], in layer order
 * (td_layer_info.buffer_offset); contiguous, part of a checkpoint. Running statistics are never
 * updated inside a forward, so that N workers stay bitwise equal to one: after a training
 * forward, td_model_batch_stats holds each batchnorm layer's micro-batch mean[C] and unbiased
 * variance[C] (n/(n-1) x biased; biased when n == 1; n = batch x H x W) in the buffers' layout,
 * and the trainer applies every micro-batch's statistics of a global batch in one fixed order
 * with td_model_update_running_stats. All are 0 / NULL for a model without batchnorm. */
size_t td_model_num_buffers(const td_model_t *m);
float *td_model_buffers(td_model_t *m);
size_t td_model_batch_stats_size(const td_model_t *m); /* == td_model_num_buffers */
const float *td_model_batch_stats(const td_model_t *m);
/* running = (1 - momentum) * running + momentum * stat per batchnorm layer (PyTorch's update),
 * and one more batch tracked. */
void td_model_update_running_stats(td_model_t *m, const float *batch_stats);
/* PyTorch's num_batches_tracked (the same for every batchnorm layer here): the number of
 * td_model_update_running_stats calls since finalize or the last set; written to safetensors.
 * A checkpoint keeps it with the buffers. */
int64_t td_model_batches_tracked(const td_model_t *m);
void td_model_set_batches_tracked(td_model_t *m, int64_t n);

/* PyTorch's default initialisation: kaiming_uniform(a=sqrt(5)) for weights, i.e.
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for biases,
 * drawn from Philox with key seed and stream = layer index, element = index in the layer.
 * Layernorm and batchnorm: weight 1, bias 0; batchnorm buffers: running mean 0, variance 1, and
 * batches tracked 0. */
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
 * What the model's output is trained against: class indices (cross-entropy; NLL when the
 * model ends in log_softmax), real values (mean squared error) or 0/1 labels (binary
 * cross-entropy on logits). Every engine computes the same three. */
typedef enum { TD_LOSS_CROSS_ENTROPY, TD_LOSS_MSE, TD_LOSS_BCE } td_loss_kind;

/*
 * All return the *sum* of per-sample losses over the batch (as double) and write
 * dinput = grad_scale * d(sum of losses)/d(input). The trainer passes grad_scale = 1/global_batch
 * so every micro-batch's gradient is already scaled for the mean over the global batch and
 * micro-batches sum without a later division (that keeps N workers bitwise equal to one).
 * The gradient pointer may be NULL (evaluation). */
double td_nll_loss(const float *logp, const int32_t *labels, int batch, int classes,
                   float grad_scale, float *dlogp);
/* Fused log_softmax + NLL over raw logits. */
double td_cross_entropy(const float *logits, const int32_t *labels, int batch, int classes,
                        float grad_scale, float *dlogits);
/* Number of rows whose argmax equals the label. */
int td_count_correct(const float *out, const int32_t *labels, int batch, int classes);
/* Regression: per-sample loss = mean over dim of (out - target)^2, so the sum / batch equals
 * torch.nn.MSELoss(). */
double td_mse_loss(const float *out, const float *target, int batch, int dim, float grad_scale,
                   float *dout);
/* Multi-label: per-sample loss = mean over dim of max(x, 0) - x t + log1p(exp(-|x|)) (the stable
 * form of torch.nn.BCEWithLogitsLoss), so the sum / batch equals BCEWithLogitsLoss(). */
double td_bce_with_logits(const float *logits, const float *target, int batch, int dim,
                          float grad_scale, float *dlogits);
/* Sum over samples of the fraction of labels where (logit > 0) == (target > 0.5). */
double td_count_correct_multilabel(const float *logits, const float *target, int batch, int dim);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_NN_H */
