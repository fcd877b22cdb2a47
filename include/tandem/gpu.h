/* tandem gpu: the CUDA backend of the engine.
 *
 * A td_gpu_t mirrors a finalized td_model_t on one CUDA device: the same layers, the same flat
 * parameter layout (nn.h), so a bucket, a checkpoint and a safetensors file see the same floats
 * whichever device trained them. Parameters, gradients and optimizer state are one contiguous
 * device buffer each; the data set lives on the device as its uint8 pixels and every step
 * gathers its batch there from the sampler's permutation.
 *
 * One training step is the engine's unit of work: the M micro-batches of this rank (gather,
 * forward, fused loss, backward), their gradients summed in the trainer's pairwise tree
 * (train.h), and, on one rank, the optimizer. It is captured once as a CUDA graph and replayed:
 * what changes from step to step (step number, permutation window, gradient scale, optimizer
 * coefficients) reaches the graph through a small argument block copied in ahead of each replay,
 * so nothing inside the step waits for the host.
 *
 * Determinism: no atomics in any reduction and fixed summation orders, so two runs give the same
 * bits, and a micro-batch's gradient does not depend on which rank computes it: 1, 2 or 4
 * workers at one global batch give the same weights. The optimizer is the CPU's arithmetic
 * operation for operation (bitwise equal on equal inputs); layers agree with the CPU engine to
 * float rounding (different summation orders). Dropout masks are the CPU's, bit for bit.
 *
 * Where tandem was built without CUDA (TANDEM_CUDA=OFF, or no nvcc at build time) every entry
 * point fails with TD_ERR_UNSUPPORTED saying so; td_gpu_available says why before anything runs.
 */
#ifndef TANDEM_GPU_H
#define TANDEM_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"
#include "tandem/nn.h"
#include "tandem/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TD_DEVICE_CPU, TD_DEVICE_CUDA } td_device;

/* "cpu" or "cuda"; TD_ERR_INVALID naming the value otherwise. */
td_status td_device_parse(const char *name, td_device *out);
const char *td_device_name(td_device d);

/* The arithmetic of the engine's gemms (every convolution and linear layer, forward and
 * backward). Parameters, gradients, optimizer state, checkpoints and every other kernel stay
 * IEEE fp32 in all three, so a checkpoint resumes on the CPU whichever precision wrote it.
 *   fp32  fp32 products and sums (TF32 off): agrees with the CPU engine to float rounding.
 *   tf32  tensor-core gemms on TF32 inputs (10-bit mantissa), fp32 accumulation.
 *   bf16  tensor-core gemms on bf16 inputs (7-bit mantissa), fp32 accumulation: PyTorch's
 *         float32_matmul_precision("medium"); activations are stored in fp32, not bf16.
 * Each is deterministic: a micro-batch's gemms have the same shapes and the same cuBLAS
 * kernels whichever rank computes them, so 1, 2 and 4 workers give the same bits. */
typedef enum { TD_PRECISION_FP32, TD_PRECISION_TF32, TD_PRECISION_BF16 } td_precision;

/* "fp32", "tf32" or "bf16"; TD_ERR_INVALID naming the value otherwise. */
td_status td_precision_parse(const char *name, td_precision *out);
const char *td_precision_name(td_precision p);

/* Whether this build has the CUDA backend and a device can be used; why not in why[cap]. */
bool td_gpu_available(char *why, size_t cap);
/* CUDA devices visible to this process (0 without a driver or without the backend). */
int td_gpu_device_count(void);

typedef struct td_gpu td_gpu_t;

typedef struct {
    int device;           /* CUDA ordinal; -1: LOCAL_RANK modulo the devices present */
    int batch;            /* B: samples per micro-batch */
    int accum;            /* M: micro-batches per step on this rank */
    int rank, world_size; /* this rank's global micro-batch slots are rank*M .. rank*M+M-1 */
    int max_eval_batch;   /* largest evaluation batch */
    uint64_t seed;        /* dropout key */
    bool graph;           /* replay the step as a CUDA graph (false: launch kernel by kernel) */
    td_precision precision;
    td_loss_kind loss; /* cross-entropy on class labels; mse, bce on real targets (nn.h) */
} td_gpu_config;

/* Builds the device mirror of a finalized model with an optimizer of the given config. The
 * model's host buffers (params, grads) stay the staging area of uploads, downloads and the
 * host-side gradient reduce; they are page-locked for the engine's lifetime. */
td_status td_gpu_new(td_model_t *model, const td_optim_config *optim, const td_gpu_config *cfg,
                     td_gpu_t **out);
void td_gpu_free(td_gpu_t *g);
/* "NVIDIA H100 80GB HBM3 (device 0, sm_90, 132 SMs)" */
const char *td_gpu_describe(const td_gpu_t *g);

/* A data set streamed to the device (one too large for its memory): the engine asks for the
 * samples ids[0..n) in the packed form below (values [n, sample_size], labels [n] or targets
 * [n, target_dim]), each step's before the step (and each evaluation batch's), and copies them
 * into a window on the device in stream order: the same samples, the same bits as a resident
 * set. data.h's td_dataset_pack_ids is one. Called on the thread that calls td_gpu_step. */
typedef td_status (*td_gpu_fill_fn)(void *user, const uint64_t *ids, int n, void *values,
                                    int32_t *labels, float *targets);

/* A data set as the device holds it (td_dataset_pack): values [count, sample_size], bytes when
 * u8 (each normalised through its channel's table, lut [channels][256]) or float32 (normalised
 * as (v - mean[ch]) / std[ch]), the channel being element / (sample_size / channels), and the
 * targets: class labels [count] (cross-entropy) or real targets [count, target_dim] (mse, bce;
 * target_dim the model's outputs): data.h's arithmetic, so the device computes the CPU's floats. */
typedef struct {
    const void *values;
    bool u8;
    const int32_t *labels;  /* class targets, or NULL */
    const float *targets;   /* real targets, or NULL */
    int target_dim;
    uint64_t count;
    int sample_size, channels;
    const float *lut;        /* u8: [channels][256] */
    const float *mean, *std; /* float32: [channels] */
    /* Streamed instead (values, labels and targets NULL): fill gives the samples as asked. */
    td_gpu_fill_fn fill;
    void *fill_user;
} td_gpu_dataset;

/* Uploads a data set (or sets up its streaming); which: 0 training set, 1 test set. A resident
 * set larger than the device's free memory is TD_ERR_NOMEM, naming the sizes. */
td_status td_gpu_set_dataset(td_gpu_t *g, int which, const td_gpu_dataset *d);
/* Device memory free now, bytes (cudaMemGetInfo): what decides resident or streamed. */
size_t td_gpu_free_memory(td_gpu_t *g);
/* The permutation of the epoch the next steps belong to (data.h sampler), [count] indices. */
td_status td_gpu_set_epoch(td_gpu_t *g, const uint64_t *perm, uint64_t count);

/* Host -> device: parameters, optimizer state (may be NULL when it has none) and the optimizer's
 * step count. Device -> host (waits for the device): the same. */
td_status td_gpu_upload_state(td_gpu_t *g, const float *params, const float *optim_state,
                              uint64_t optim_steps);
td_status td_gpu_download_state(td_gpu_t *g, float *params, float *optim_state);

/* One step's arguments, from the trainer's plan (train.h): global batch positions
 * [base, base + n) of the epoch's permutation, the gradient scale 1/n. */
typedef struct {
    int64_t step; /* optimizer step (0-based), the dropout key */
    int64_t base; /* first position in the epoch's permutation */
    int64_t n;    /* samples in this global batch (< G only for an epoch's tail) */
    float scale;  /* 1 / n */
} td_gpu_step_args;

/* Enqueues a step and returns without waiting. With apply_optimizer the parameters are updated
 * on the device; without it the step stops at this rank's summed gradient (td_gpu_apply follows
 * once the gradients are reduced across ranks). */
td_status td_gpu_step(td_gpu_t *g, const td_gpu_step_args *a, bool apply_optimizer);
/* Waits for the step enqueued with this step number and returns this rank's {loss sum, correct,
 * samples} of it (correct as the CPU counts: rows whose argmax is the label, the fraction of
 * right labels summed over rows for bce, 0 for mse). Steps must be asked for in the order
 * they were enqueued; the last few (4) can be asked for. */
td_status td_gpu_step_stats(td_gpu_t *g, int64_t step, double sums[3]);
/* After td_gpu_step_stats of the same step: the BatchNorm statistics of each of this rank's
 * micro-batch slots, slot j's td_model_num_buffers floats at out + j * ld (nn.h's
 * td_model_batch_stats layout; a slot without samples holds nothing meaningful: its count is the
 * caller's to know). */
td_status td_gpu_step_bn_stats(td_gpu_t *g, int64_t step, float *out, size_t ld);
/* The BatchNorm statistics of the last td_gpu_model_forward in training mode, out [nbuf]. */
td_status td_gpu_batch_stats(td_gpu_t *g, float *out);
/* The model's BatchNorm running statistics (td_model_buffers) to the device, for evaluation;
 * td_gpu_upload_state does it too. */
td_status td_gpu_upload_buffers(td_gpu_t *g);
/* Waits for the device, then copies this rank's step gradient into the model's host grads. */
td_status td_gpu_grads_to_host(td_gpu_t *g);
/* Uploads the model's host grads (the cross-rank sum) and updates the parameters. */
td_status td_gpu_apply(td_gpu_t *g);

/* ---- between processes of one host: CUDA IPC ----
 * Each rank exports its step-gradient buffer as an IPC handle (TD_GPU_IPC_HANDLE_BYTES bytes);
 * once every rank has opened every other's (td_gpu_ipc_open with all handles in rank order),
 * td_gpu_ipc_reduce sums the ranks' gradients on the device in comm's fixed tree (adjacent pairs
 * level by level, an odd one carried up: td_allreduce's order), so every rank computes the bits
 * the host path would, and td_gpu_ipc_apply runs the optimizer on that sum. Works for ranks on
 * one GPU and, with peer access, on several. The caller orders the ranks: every rank's step is
 * done before anyone reduces, and everyone has reduced before any rank's next step (barriers). */
#define TD_GPU_IPC_HANDLE_BYTES 64
#define TD_GPU_IPC_MAX_RANKS    16
td_status td_gpu_ipc_export(td_gpu_t *g, void *handle);
td_status td_gpu_ipc_open(td_gpu_t *g, int world_size, int rank, const void *handles);
/* Enqueues the tree sum and waits for it (the barrier after it must see it done). */
td_status td_gpu_ipc_reduce(td_gpu_t *g);
td_status td_gpu_ipc_apply(td_gpu_t *g);

/* Evaluates test samples [lo, hi) in batches of up to max_eval_batch; sums = {correct, loss sum,
 * count}. Waits for the device. */
td_status td_gpu_evaluate(td_gpu_t *g, uint64_t lo, uint64_t hi, double sums[3]);

/* ---- one pass on host arrays, for tests and tools ----
 * Forward of the whole model on x [batch, in] (training mode and dropout keys from ctx, as in
 * nn.h; NULL: evaluation) writes the output [batch, out] to y. Backward from dy [batch, out] of
 * that forward writes the parameter gradient [num_params] to grads. */
td_status td_gpu_model_forward(td_gpu_t *g, const float *x, int batch, const td_forward_ctx *ctx,
                               float *y);
td_status td_gpu_model_backward(td_gpu_t *g, const float *dy, int batch, float *grads);
/* The optimizer alone: one update of params (device copy of the host array) from grads. */
td_status td_gpu_optim_step(td_gpu_t *g, float *params, const float *grads);

/* Device memory the engine holds, bytes. */
size_t td_gpu_memory_bytes(const td_gpu_t *g);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_GPU_H */
