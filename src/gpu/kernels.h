/* The CUDA kernels of the GPU backend, launched by engine.cu. Every kernel is deterministic: no
 * atomics, and each output element is computed by one thread (or one block's fixed tree) in a
 * fixed order, so the same inputs give the same bits on every launch.
 *
 * Layouts are the CPU engine's (nn.h): activations NCHW float32, batch-major; parameters flat,
 * weight then bias per layer. */
#ifndef TANDEM_GPU_KERNELS_H
#define TANDEM_GPU_KERNELS_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "tandem/optim.h"

#define TD_GPU_MAX_DROPOUT 16

/* What changes from step to step, copied to the device ahead of each (graph) step. */
typedef struct {
    int64_t step, base, n; /* optimizer step; permutation window [base, base + n) */
    float scale;           /* gradient scale 1/n */
    int training;
    uint64_t dropout_key[TD_GPU_MAX_DROPOUT]; /* per dropout layer (in model order) */
    td_optim_coefs coefs;
} td_gpu_args;

/* Rows of micro-batch slot k that hold samples: clamp(n - k*B, 0, B). */
#define TD_GPU_SLOT_ROWS(a, k, B)                                                                  \
    ((int)max((int64_t)0, min((int64_t)(B), (a)->n - (int64_t)(k) * (B))))

/* A data set on the device (td_gpu_dataset): values [count, size] bytes or float32, the
 * targets (class labels [count], or real targets [count, target_dim]) and the normalisation
 * (lut [channels][256], or mean/std [channels]); plane = size / channels. */
typedef struct {
    const void *values;
    bool u8;
    const int32_t *labels; /* or NULL */
    const float *targets;  /* or NULL */
    int target_dim;
    const float *lut, *mean, *std;
    int plane;
    /* A streamed set's window (td_gpu_fill_fn): values, labels and targets hold only the
     * samples of this step's slots, slot window_slot0 + k's row r at record k * batch + r (an
     * evaluation batch's row r at record r); the ids still come from the permutation. */
    bool window;
    int window_slot0;
} td_gpu_source;

/* x [batch, size] = the normalised samples perm[base + slot*batch + row] of the step (rows past
 * the slot's get 0), their targets (y [batch] labels, or t [batch, target_dim] real targets, as
 * the source has them), ids their indices; gather_range: samples first + row. */
void td_gpu_gather_step(cudaStream_t s, const td_gpu_source *d, const uint64_t *perm,
                        const td_gpu_args *a, int slot, int batch, int size, float *x, int32_t *y,
                        float *t, uint64_t *ids);
void td_gpu_gather_range(cudaStream_t s, const td_gpu_source *d, uint64_t first, int batch,
                         int size, float *x, int32_t *y, float *t, uint64_t *ids);

/* Convolution lowering in the "CN" layout: col [c*k*k][batch * oh*ow] (row (ci*k + ki)*k + kj),
 * so one gemm convolves the whole batch into [out_c][batch * oh*ow]. col2im is the adjoint
 * (it writes x, gathering every tap in a fixed order); gate, when not NULL, is the layer's input
 * as a ReLU's output, whose backward col2im applies (cells not > 0 get 0). */
void td_gpu_im2col(cudaStream_t s, const float *x, int batch, int c, int h, int w, int k,
                   int stride, int pad, int oh, int ow, float *col);
void td_gpu_col2im(cudaStream_t s, const float *col, int batch, int c, int h, int w, int k,
                   int stride, int pad, int oh, int ow, const float *gate, float *x);
/* The same with col in bf16 (--precision bf16): im2col rounds to bf16, col2im sums the bf16
 * entries in fp32. */
void td_gpu_im2col_bf16(cudaStream_t s, const float *x, int batch, int c, int h, int w, int k,
                        int stride, int pad, int oh, int ow, __nv_bfloat16 *col);
void td_gpu_col2im_bf16(cudaStream_t s, const __nv_bfloat16 *col, int batch, int c, int h, int w,
                        int k, int stride, int pad, int oh, int ow, const float *gate, float *x);
/* y[i] = x[i] rounded to bf16 */
void td_gpu_to_bf16(cudaStream_t s, const float *x, size_t n, __nv_bfloat16 *y);
/* out [batch][c][n] = act(y [c][batch*n] + bias[c]): the conv gemm's output back to NCHW. */
void td_gpu_cn_bias_act(cudaStream_t s, const float *y, const float *bias, int batch, int c, int n,
                        bool relu, float *out);
/* y [c][batch*n] = x [batch][c][n], and y16 = y rounded to bf16 where y16 is not NULL */
void td_gpu_nchw_to_cn(cudaStream_t s, const float *x, int batch, int c, int n, float *y,
                       __nv_bfloat16 *y16);
/* out[b][c][p] = act(y[b][c][p] + bias[c]) over [batch, channels, hw]. */
void td_gpu_bias_act(cudaStream_t s, const float *y, const float *bias, int batch, int channels,
                     int hw, bool relu, float *out);
/* rs[r] = sum of x[r][0..n), rows of n floats, in a fixed order (a warp per row). */
void td_gpu_row_sums(cudaStream_t s, const float *x, int rows, int n, float *rs);
void td_gpu_relu(cudaStream_t s, const float *x, size_t n, float *y);
void td_gpu_relu_backward(cudaStream_t s, const float *y, const float *dy, size_t n, float *dx);
void td_gpu_maxpool(cudaStream_t s, const float *x, int batch, int c, int h, int w, int k,
                    int stride, int oh, int ow, float *y, uint8_t *argmax);
/* gate: x (the pool's input) is a ReLU's output whose backward is folded in here. */
void td_gpu_maxpool_backward(cudaStream_t s, const float *dy, const uint8_t *argmax, const float *x,
                             bool gate, int batch, int c, int h, int w, int k, int stride, int oh,
                             int ow, float *dx);
/* Whether the pool's windows tile its input (2x2, stride 2, h = 2 oh, w = 2 ow): the case
 * td_gpu_maxpool_backward_cn takes. */
bool td_gpu_maxpool_backward_tiles(int h, int w, int k, int stride, int oh, int ow);
/* The same backward for tiling windows, written in the CN layout ([c][batch * h*w], the conv
 * gemm's) of the conv before the pool, and its bf16 rounding into dx16_cn when not NULL: that
 * conv's backward then needs no layout change of its dy. dx_cn (and dx16_cn) 8-byte aligned. */
void td_gpu_maxpool_backward_cn(cudaStream_t s, const float *dy, const uint8_t *argmax,
                                const float *x, bool gate, int batch, int c, int oh, int ow,
                                float *dx_cn, __nv_bfloat16 *dx16_cn);
/* Training (a->training): y = u >= p ? x * 1/(1-p) : 0 with u the Philox uniform of
 * (a->dropout_key[idx], sample id, element); otherwise y = x. */
void td_gpu_dropout(cudaStream_t s, const float *x, const uint64_t *ids, const td_gpu_args *a,
                    int idx, float p, int batch, size_t size, float *y, uint8_t *mask);
void td_gpu_dropout_backward(cudaStream_t s, const float *dy, const uint8_t *mask,
                             const td_gpu_args *a, float p, size_t n, float *dx);
void td_gpu_log_softmax(cudaStream_t s, const float *x, int batch, int classes, float *y);
void td_gpu_log_softmax_backward(cudaStream_t s, const float *y, const float *dy, int batch,
                                 int classes, float *dx);
/* The loss a model's output is trained with: cross-entropy on logits (log_softmax fused) or on
 * log-probabilities (NLL, a model ending in log_softmax) against labels; mean squared error or
 * binary cross-entropy on logits against real targets. nn/loss.c's formulas and precisions. */
typedef enum { TD_GPU_LOSS_CE, TD_GPU_LOSS_NLL, TD_GPU_LOSS_MSE, TD_GPU_LOSS_BCE } td_gpu_loss_kind;

/* Loss over rows of a micro-batch: out [batch, dim], labels [batch] (CE, NLL) or targets
 * [batch, dim] (MSE, BCE). With a (training): rows = TD_GPU_SLOT_ROWS(a, slot, batch) and scale
 * a->scale; else rows and scale as given. Rows past `rows` get zero gradient and no loss. Writes
 * row_loss[batch] and row_correct[batch]: 1 or 0 for the argmax against the label, the fraction
 * of right labels (BCE), 0 (MSE), as the CPU counts. */
void td_gpu_loss(cudaStream_t s, td_gpu_loss_kind kind, const float *out, const int32_t *labels,
                 const float *targets, int batch, int dim, const td_gpu_args *a, int slot,
                 int rows, float scale, float *dout, double *row_loss, double *row_correct);
/* stats[0..3) = {loss sum, correct, samples} over the step's slots (a: rows per slot), or,
 * for evaluation (a NULL), stats += {correct, loss, rows} of one batch of `rows` rows. */
void td_gpu_stats_kernel(cudaStream_t s, const double *row_loss, const double *row_correct,
                         const td_gpu_args *a, int first_slot, int slots, int batch, double *stats);
void td_gpu_eval_accumulate(cudaStream_t s, const double *row_loss, const double *row_correct,
                            int rows, double *sums);
/* out = the fixed-tree sum of src[0..count) (device array of device pointers), count <= 16:
 * adjacent pairs level by level, an odd one carried up, as comm's td_allreduce adds. */
void td_gpu_tree_sum(cudaStream_t s, const float *const *src, int count, size_t n, float *out);
/* b[i] = a[i] + b[i] */
void td_gpu_add(cudaStream_t s, const float *a, float *b, size_t n);
void td_gpu_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n,
                  const td_gpu_args *a);
void td_gpu_sgd(cudaStream_t s, float *p, const float *g, float *buf, size_t n,
                const td_gpu_args *a);

/* Element-wise activations: kind TD_GPU_ACT_*. The backward reads the input x (GELU) or the
 * output y (tanh, sigmoid); dx may be dy. */
enum { TD_GPU_ACT_GELU, TD_GPU_ACT_TANH, TD_GPU_ACT_SIGMOID };
void td_gpu_act(cudaStream_t s, int kind, const float *x, size_t n, float *y);
void td_gpu_act_backward(cudaStream_t s, int kind, const float *x, const float *y,
                         const float *dy, size_t n, float *dx);
/* Average pooling, k x k windows, stride, no padding; the backward overwrites every cell of dx. */
void td_gpu_avgpool(cudaStream_t s, const float *x, int batch, int c, int h, int w, int k,
                    int stride, int oh, int ow, float *y);
void td_gpu_avgpool_backward(cudaStream_t s, const float *dy, int batch, int c, int h, int w,
                             int k, int stride, int oh, int ow, float *dx);
/* Global average pooling: y [batch, c] = the means of x's [batch, c, hw] planes. */
void td_gpu_global_avgpool(cudaStream_t s, const float *x, int batch, int c, int hw, float *y);
void td_gpu_global_avgpool_backward(cudaStream_t s, const float *dy, int batch, int c, int hw,
                                    float *dx);
/* LayerNorm over each sample's d values with weight and bias [d]: y = (x - mu) rstd w + b;
 * stats [batch][2] = (mu, rstd) for the backward. The backward's dw, db (overwritten) go on
 * `side`, dx (when not NULL) on s; both only read x, dy and stats. */
void td_gpu_layernorm(cudaStream_t s, const float *x, const float *w, const float *b, int batch,
                      int d, float eps, float *y, float *stats);
void td_gpu_layernorm_backward(cudaStream_t s, cudaStream_t side, const float *x, const float *dy,
                               const float *w, const float *stats, int batch, int d, float *dx,
                               float *dw, float *db);

/* out = a + b (a residual block's sum) */
void td_gpu_sum(cudaStream_t s, const float *a, const float *b, size_t n, float *out);
/* BatchNorm per channel over [batch, c, hw]: in training (a->training) the mean and biased
 * variance of the rows that hold samples (slot >= 0: TD_GPU_SLOT_ROWS of that micro-batch slot;
 * slot < 0: all), also written as batch_stats (mean[c], unbiased variance[c]) for the running
 * statistics; in evaluation the running ones (running: mean[c], variance[c]). stats [2c] =
 * (mean, rstd) for the backward; y = xhat gamma + beta. */
void td_gpu_batchnorm(cudaStream_t s, const float *x, const float *gamma, const float *beta,
                      int batch, int slot, int c, int hw, float eps, const td_gpu_args *a,
                      const float *running, double *part, float *stats, float *batch_stats,
                      float *y);
/* dgamma, dbeta (overwritten) over the same rows and, when dx is not NULL, dx = gamma rstd (dy -
 * mean(dy) - xhat mean(dy xhat)) (those means 0 in evaluation), 0 in the padding rows; red: [2c]
 * scratch. */
void td_gpu_batchnorm_backward(cudaStream_t s, const float *x, const float *dy,
                               const float *gamma, const float *stats, int batch, int slot, int c,
                               int hw, const td_gpu_args *a, double *part, float *red, float *dx,
                               float *dgamma, float *dbeta);
/* part, both functions' scratch for a layer of c channels: this many doubles covers every batch
 * up to max_batch (the per-chunk sums; kernels.cu says how the channel's values are cut) */
size_t td_gpu_batchnorm_part_doubles(int max_batch, int c);

#endif
