/* nn internals: the layer record and the model struct shared by model.c, layers.c, spec.c. */
#ifndef TANDEM_NN_INTERNAL_H
#define TANDEM_NN_INTERNAL_H

#include "tandem/nn.h"
#include "tandem/tensor.h"
#include "conv_winograd.h"

/* Vectors of four and eight floats (and eight int32 lanes, a comparison's mask) in GCC's vector
 * extension, lowered to what the build's vector unit has, for the shuffles of the Winograd
 * transforms and 2x2 pooling. The float ones may point into any float array, unaligned:
 * `*(const v8f *)p` is an unaligned load. Below AVX, GCC warns that passing a 32-byte vector by
 * value has no fixed ABI: the helpers taking them are static and always inlined, so no call
 * ever passes one. */
typedef float v4f __attribute__((vector_size(16), aligned(4), may_alias));
typedef float v8f __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t v8i __attribute__((vector_size(32)));
#pragma GCC diagnostic ignored "-Wpsabi"

/* Samples per chunk for per-sample layers. A constant (never derived from the thread count) so
 * that per-chunk partial sums, combined in chunk order, give the same bits on any team size. */
#define TD_NN_CHUNK 4
/* The smallest block of feature columns per task of a Linear layer's gemms (model.c, linear_cols);
 * also thread-count independent. */
#define TD_NN_LINEAR_COLS 64
/* A max pool's largest kernel (td_model_add_maxpool2d): its argmax tap, ki k + kj, is a byte. */
#define TD_MAX_POOL_KERNEL 15
#define TD_MAX_POOL_TAPS   (TD_MAX_POOL_KERNEL * TD_MAX_POOL_KERNEL)

typedef struct {
    td_layer_kind kind;
    char name[32];
    int in_c, in_h, in_w;
    int out_c, out_h, out_w;
    size_t in_size, out_size; /* floats per sample */
    int kernel, stride, pad;  /* conv2d, maxpool2d, avgpool2d */
    float p;                  /* dropout */
    float eps, momentum;      /* layernorm, batchnorm */
    /* Data flow: the input is acts[src] (src = own index except a shortcut's first layer);
     * a residual layer also reads acts[src2]. */
    int src, src2;
    size_t buf_offset; /* batchnorm: running mean[C], var[C] in the model's buffers */
    size_t param_offset, param_count, weight_count;
    double flops_fwd;
    bool need_din;   /* a layer upstream has parameters, so the input gradient is needed */
    bool need_din2;  /* residual: the same for the second input */
    bool out_alias;  /* output is the input buffer (flatten; relu in place) */
    bool relu_fused; /* relu: done by a neighbour (maxpool relu_in / linear, batchnorm relu_out) */
    bool relu_out;   /* linear, batchnorm: applies the following relu itself */
    bool noop;       /* nothing to do forward or backward (fused relu, in-place flatten) */
    bool relu_in;    /* maxpool: applies the preceding relu itself */
    /* A residual sum taken by the batchnorm feeding it: the normalising pass writes bn(x) +
     * skip into the residual's output (one pass over the batch's activations fewer). */
    int sum_into;    /* batchnorm: that residual layer's index, 0 for none */
    bool sum_by_bn;  /* residual: its forward is done by the batchnorm before it */
    int gout, gin;   /* backward: gradient buffers (-1 = caller's dout, >= 0 = model's gbuf) */
    int gin2;        /* residual: gradient buffer of the second input */
    int gadd, gadd2; /* >= 0: the input's gradient already holds another consumer's part (a
                      * residual's two branches): din += gbuf[gadd] after this layer's din */
    int seg_end;     /* first layer after this one's segment (set on segment heads) */
    float *out;      /* own output buffer [max_batch * out_size] unless out_alias */
    uint8_t *aux;    /* maxpool argmax / dropout keep mask, [max_batch * out_size] */
    float *partial;  /* conv2d, layernorm: per-chunk parameter-gradient partial sums */
    float *stats;    /* layernorm: per-sample mean, 1/std [max_batch][2]; batchnorm: the last
                      * forward's mean[C], 1/std[C] */
    double *dpart;   /* batchnorm: per-chunk partial sums [nchunks][2C] */
    double *psum;    /* batchnorm: per-sample sums of x and x^2 per channel [max_batch][2C] */
    bool psum_fresh; /* batchnorm: psum holds this forward's rows (td__bn_sample_sums) */
    bool wino;       /* conv2d: Winograd F(4x4,3x3) forward and both gradients (conv_winograd.c) */
    ptrdiff_t *taps; /* conv2d read in place (layers.c, conv_implicit): each lowered row's offset
                      * in the padded image, then the weight gradient's (td__conv_prepare) */
    int tap_groups, tap_singles; /* ... its gemm's rows of g taps, and of one (conv_tap_group) */
    float *wino_u;   /* transformed filter [36 slots, out_c, in_c], refreshed by every forward
                      * and read by the backward that follows it */
} td_layer;

/* A residual block being built (td_model_begin_residual .. td_model_add_residual). */
typedef struct {
    int start;      /* acts index of the block's input x */
    int c, h, w;    /* x's shape */
    int body_end;   /* acts index of the body's output once the shortcut began, else -1 */
    int bc, bh, bw; /* the body's output shape */
} td_block;

#define TD_NN_MAX_DEPTH 16

struct td_model {
    int in_c, in_h, in_w;
    int cur_c, cur_h, cur_w, cur_src; /* building: shape and acts index of the next input */
    td_block blocks[TD_NN_MAX_DEPTH];
    int depth;
    td_layer *layers;
    int num_layers, cap_layers;
    size_t num_params;
    int max_batch;
    bool finalized;
    float *params, *grads;
    float **gbuf; /* backward gradient buffers, nbuf of [max_batch, gstride] */
    int nbuf;
    float *buffers, *batch_stats; /* batchnorm running and last micro-batch statistics */
    size_t num_buffers;
    int64_t batches_tracked;
    size_t gstride;    /* floats between samples in gbuf */
    size_t col_floats; /* per-thread im2col scratch */
    float **scratch;
    int scratch_threads;
    float *lin_t; /* the linear layers' transposes: x^T and y^T, or W^T (model.c) */
    /* state of the last forward */
    const float *input;
    const float **acts; /* [num_layers + 1]: acts[0] input, acts[i + 1] output of layer i */
    int batch;
    bool training;
    uint64_t seed, step;
    const uint64_t *sample_ids;
    td_grad_ready_fn hook;
    void *hook_user;
    /* td_model_set_profiling: per thread (rows of prof_stride doubles, whole cache lines apart),
     * thread-seconds of each layer's forward [2 i] and backward [2 i + 1] */
    bool prof_on;
    double *prof;
    int prof_threads;
    size_t prof_stride;
};

/* Per-sample layers (everything but Linear) over rows [s0, s1) of the batch; tid indexes the
 * per-thread scratch. chunk is the chunk number, which picks conv2d's partial-sum slot.
 * Gradient rows are ldo / ldi floats apart: the model's two gradient buffers use one row stride
 * for every layer, so sample s always owns the same bytes and a chunk never overwrites rows
 * another chunk still has to read. */
void td__layer_forward_rows(td_model_t *m, int li, int s0, int s1, int tid);
void td__layer_backward_rows(td_model_t *m, int li, int s0, int s1, int chunk, int tid,
                             const float *dout, size_t ldo, float *din, size_t ldi);
/* A conv2d's per-thread scratch: its column matrix (rounded to whole cache lines), then for
 * stride 2 the parity planes it is built from. */
size_t td__conv_scratch_floats(const td_layer *l);
/* A conv layer's tables once its algorithm is chosen (l->wino): the implicit gemm's tap offsets. */
void td__conv_prepare(td_layer *l);
/* Layers that run over the whole batch at once (model.c, norm.c), not chunk by chunk. */
static inline bool td__batch_level(td_layer_kind k) {
    return k == TD_LAYER_LINEAR || k == TD_LAYER_BATCHNORM;
}
/* Batchnorm over the whole batch (norm.c); nt threads over fixed chunks of TD_NN_CHUNK. */
void td__bn_forward(td_model_t *m, int li, int batch, int nt);
/* Batchnorm li's per-sample statistics sums of rows [s0, s1) of its input, into l->psum
 * (training forward; td__bn_forward combines them in sample order). */
void td__bn_sample_sums(td_model_t *m, int li, int s0, int s1);
void td__bn_backward(td_model_t *m, int li, int batch, int nt, const float *dout, size_t ldo,
                     float *din, size_t ldi);
/* Layernorm over rows [s0, s1) (norm.c). */
void td__ln_forward_rows(td_model_t *m, td_layer *l, int s0, int s1);
void td__ln_backward_rows(td_model_t *m, td_layer *l, int s0, int s1, int chunk, const float *dout,
                          size_t ldo, float *din, size_t ldi);
/* din[s] += gbuf[l->gadd][s] for rows [s0, s1) when the layer has a gadd. */
void td__grad_add_rows(td_model_t *m, const td_layer *l, int s0, int s1, float *din, size_t ldi);
/* Gives the most recently added layer a name (YAML `name:`); TD_ERR_INVALID when taken. */
td_status td__model_name_last(td_model_t *m, const char *name);
/* Builds a model from a YAML spec file (spec.c). shape: the data's [c, h, w], or NULL when
 * unknown (input: is then required); outputs: the data's output count, or 0 when unknown. */
td_status td__model_load_spec(const char *path, const int *shape, int outputs, td_model_t **out);
#endif
