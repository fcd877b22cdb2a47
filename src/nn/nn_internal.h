/* nn internals: the layer record and the model struct shared by model.c, layers.c, spec.c. */
#ifndef TANDEM_NN_INTERNAL_H
#define TANDEM_NN_INTERNAL_H

#include "tandem/nn.h"
#include "tandem/tensor.h"
#include "conv_winograd.h"

/* Samples per chunk for per-sample layers. A constant (never derived from the thread count) so
 * that per-chunk partial sums, combined in chunk order, give the same bits on any team size. */
#define TD_NN_CHUNK 4
/* Feature columns per task for Linear layers' gemm partitions; also thread-count independent. */
#define TD_NN_LINEAR_COLS 64

typedef struct {
    td_layer_kind kind;
    char name[32];
    int in_c, in_h, in_w;
    int out_c, out_h, out_w;
    size_t in_size, out_size; /* floats per sample */
    int kernel, stride, pad;  /* conv2d, maxpool2d */
    float p;                  /* dropout */
    size_t param_offset, param_count, weight_count;
    double flops_fwd;
    bool need_din;   /* some earlier layer has parameters, so the input gradient is needed */
    bool out_alias;  /* output is the input buffer (flatten; relu in place) */
    bool relu_fused; /* relu: done by a neighbour (maxpool relu_in / linear relu_out) */
    bool relu_out;   /* linear: applies the following relu itself */
    bool noop;       /* nothing to do forward or backward (fused relu, in-place flatten) */
    bool relu_in;    /* maxpool: applies the preceding relu itself */
    int gout, gin;   /* backward: gradient buffers (-1 = caller's dout, 0/1 = model's) */
    int seg_end;     /* first layer after this one's segment (set on segment heads) */
    float *out;      /* own output buffer [max_batch * out_size] unless out_alias */
    uint8_t *aux;    /* maxpool argmax / dropout keep mask, [max_batch * out_size] */
    float *partial;  /* conv2d: per-chunk parameter-gradient partial sums */
    bool wino;       /* conv2d: Winograd F(2x2,3x3) forward and input gradient (conv_winograd.c) */
    float *wino_u;   /* transformed filter [16, out_c, in_c], refreshed by every forward */
    float *wino_ub;  /* input-gradient filter [16, in_c, out_c], refreshed by every backward */
} td_layer;

struct td_model {
    int in_c, in_h, in_w;
    td_layer *layers;
    int num_layers, cap_layers;
    size_t num_params;
    int max_batch;
    bool finalized;
    float *params, *grads;
    float *gbuf[2];
    size_t gstride;    /* floats between samples in gbuf */
    size_t col_floats; /* per-thread im2col scratch */
    float **scratch;
    int scratch_threads;
    /* state of the last forward */
    const float *input;
    const float **acts; /* [num_layers + 1]: acts[0] input, acts[i + 1] output of layer i */
    int batch;
    bool training;
    uint64_t seed, step;
    const uint64_t *sample_ids;
    td_grad_ready_fn hook;
    void *hook_user;
};

/* Per-sample layers (everything but Linear) over rows [s0, s1) of the batch; tid indexes the
 * per-thread scratch. chunk is the chunk number, which picks conv2d's partial-sum slot.
 * Gradient rows are ldo / ldi floats apart: the model's two gradient buffers use one row stride
 * for every layer, so sample s always owns the same bytes and a chunk never overwrites rows
 * another chunk still has to read. */
void td__layer_forward_rows(td_model_t *m, int li, int s0, int s1, int tid);
void td__layer_backward_rows(td_model_t *m, int li, int s0, int s1, int chunk, int tid,
                             const float *dout, size_t ldo, float *din, size_t ldi);
/* Gives the most recently added layer a name (YAML `name:`); TD_ERR_INVALID when taken. */
td_status td__model_name_last(td_model_t *m, const char *name);
/* Builds a model from a YAML spec file (spec.c). */
td_status td__model_load_spec(const char *path, td_model_t **out);
#endif
