/* Sequential models with residual blocks: building with shape checks, the flat
 * parameter/gradient buffers, and the forward/backward executor.
 *
 * A residual block is flat in the layer list: the body's layers, the shortcut's (whose first
 * layer reads the block's input: td_layer.src), then a TD_LAYER_RESIDUAL layer that adds the two
 * branches. Backward walks the list last to first like any other model; the gradient buffers
 * are picked at finalize so a branch never overwrites a gradient the other still needs, and the
 * block input's two parts are added in one fixed order (assign_grad_buffers).
 *
 * Execution: consecutive per-sample layers (conv, pool, activations, dropout, flatten,
 * layernorm, residual sums, log_softmax) form a segment that runs chunk by chunk (TD_NN_CHUNK
 * samples) through all its layers while the chunk is in cache; Linear layers run as batch-level
 * gemms split over fixed column blocks, batchnorm as batch-level passes over the same chunks.
 * Neither split depends on the thread count, and conv / layernorm weight gradients and
 * batchnorm's sums are summed per chunk and then added in chunk order, so every thread count
 * gives the same bits. Chunks and blocks are
 * handed out dynamically: which thread runs one never matters, and on a shared machine a
 * descheduled thread then delays only its current chunk, not a fixed half of the batch. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nn_internal.h"

static const char *kind_prefix(td_layer_kind kind) {
    switch (kind) {
    case TD_LAYER_LINEAR:
        return "fc";
    case TD_LAYER_CONV2D:
        return "conv";
    case TD_LAYER_MAXPOOL2D:
        return "pool";
    case TD_LAYER_LAYERNORM:
        return "ln";
    case TD_LAYER_BATCHNORM:
        return "bn";
    default:
        return td_layer_kind_name(kind);
    }
}

const char *td_layer_kind_name(td_layer_kind kind) {
    switch (kind) {
    case TD_LAYER_LINEAR:
        return "linear";
    case TD_LAYER_CONV2D:
        return "conv2d";
    case TD_LAYER_MAXPOOL2D:
        return "maxpool2d";
    case TD_LAYER_RELU:
        return "relu";
    case TD_LAYER_DROPOUT:
        return "dropout";
    case TD_LAYER_FLATTEN:
        return "flatten";
    case TD_LAYER_LOG_SOFTMAX:
        return "log_softmax";
    case TD_LAYER_GELU:
        return "gelu";
    case TD_LAYER_TANH:
        return "tanh";
    case TD_LAYER_SIGMOID:
        return "sigmoid";
    case TD_LAYER_LAYERNORM:
        return "layernorm";
    case TD_LAYER_BATCHNORM:
        return "batchnorm";
    case TD_LAYER_AVGPOOL2D:
        return "avgpool2d";
    case TD_LAYER_GLOBAL_AVGPOOL:
        return "global_avgpool";
    case TD_LAYER_RESIDUAL:
        return "residual";
    }
    return "layer";
}

td_model_t *td_model_new(int in_c, int in_h, int in_w) {
    if (in_c <= 0 || in_h <= 0 || in_w <= 0) {
        td_error(TD_ERR_INVALID, "model input shape [%d, %d, %d] must be positive", in_c, in_h,
                 in_w);
        return NULL;
    }
    td_model_t *m = td_xcalloc(1, sizeof(*m));
    m->in_c = m->cur_c = in_c;
    m->in_h = m->cur_h = in_h;
    m->in_w = m->cur_w = in_w;
    return m;
}

void td_model_free(td_model_t *m) {
    if (!m) return;
    for (int i = 0; i < m->num_layers; i++) {
        td_layer *l = &m->layers[i];
        if (!l->out_alias) free(l->out);
        free(l->aux);
        free(l->partial);
        free(l->stats);
        free(l->dpart);
        free(l->psum);
        free(l->wino_u);
        free(l->taps);
    }
    for (int t = 0; t < m->scratch_threads; t++) free(m->scratch[t]);
    free(m->scratch);
    free(m->lin_t);
    free(m->prof);
    free(m->layers);
    free(m->params);
    free(m->grads);
    for (int b = 0; b < m->nbuf; b++) free(m->gbuf[b]);
    free(m->gbuf);
    free(m->buffers);
    free(m->batch_stats);
    free(m->acts);
    free(m);
}

static void shape_str(char *buf, size_t n, int c, int h, int w) {
    if (h == 1 && w == 1)
        snprintf(buf, n, "[%d]", c);
    else
        snprintf(buf, n, "[%d, %d, %d]", c, h, w);
}

/* Appends a layer whose input is the current output shape. */
static td_status push(td_model_t *m, td_layer_kind kind, td_layer **out) {
    if (!m) return td_error(TD_ERR_INVALID, "model is NULL (td_model_new failed?)");
    if (m->finalized)
        return td_error(TD_ERR_INVALID, "cannot add a %s layer: the model is already finalized",
                        kind_prefix(kind));
    if (m->num_layers == m->cap_layers) {
        m->cap_layers = m->cap_layers ? 2 * m->cap_layers : 16;
        m->layers = td_xrealloc(m->layers, sizeof(td_layer) * (size_t)m->cap_layers);
    }
    td_layer *l = &m->layers[m->num_layers];
    memset(l, 0, sizeof(*l));
    l->kind = kind;
    /* the current shape: the previous layer's output, or a block's input for a shortcut */
    l->in_c = m->cur_c, l->in_h = m->cur_h, l->in_w = m->cur_w;
    l->src = m->cur_src;
    l->src2 = -1;
    l->out_c = l->in_c, l->out_h = l->in_h, l->out_w = l->in_w;
    int same = 0;
    for (int i = 0; i < m->num_layers; i++) same += m->layers[i].kind == kind;
    snprintf(l->name, sizeof(l->name), "%s%d", kind_prefix(kind), same + 1);
    l->param_offset = m->num_params;
    *out = l;
    return TD_OK;
}

static void commit(td_model_t *m, td_layer *l) {
    l->in_size = (size_t)l->in_c * l->in_h * l->in_w;
    l->out_size = (size_t)l->out_c * l->out_h * l->out_w;
    m->num_params += l->param_count;
    m->num_layers++;
    m->cur_c = l->out_c, m->cur_h = l->out_h, m->cur_w = l->out_w;
    m->cur_src = m->num_layers;
}

td_status td_model_add_linear(td_model_t *m, int out_features) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_LINEAR, &l));
    char in[64];
    shape_str(in, sizeof in, l->in_c, l->in_h, l->in_w);
    if (l->in_h != 1 || l->in_w != 1)
        return td_error(TD_ERR_INVALID,
                        "layer %d (%s, linear): input shape %s is not flat; add a flatten layer "
                        "before it",
                        m->num_layers, l->name, in);
    if (out_features <= 0)
        return td_error(TD_ERR_INVALID, "layer %d (%s, linear): out_features=%d must be positive",
                        m->num_layers, l->name, out_features);
    l->out_c = out_features;
    l->weight_count = (size_t)out_features * l->in_c;
    l->param_count = l->weight_count + (size_t)out_features;
    l->flops_fwd = 2.0 * (double)l->weight_count;
    commit(m, l);
    return TD_OK;
}

td_status td_model_add_conv2d(td_model_t *m, int out_channels, int kernel, int stride,
                              int padding) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_CONV2D, &l));
    char in[64];
    shape_str(in, sizeof in, l->in_c, l->in_h, l->in_w);
    if (out_channels <= 0 || kernel <= 0 || stride <= 0 || padding < 0)
        return td_error(TD_ERR_INVALID,
                        "layer %d (%s, conv2d): out_channels=%d kernel=%d stride=%d padding=%d: "
                        "need out_channels, kernel, stride >= 1 and padding >= 0",
                        m->num_layers, l->name, out_channels, kernel, stride, padding);
    int oh = td_conv_out_size(l->in_h, kernel, stride, padding);
    int ow = td_conv_out_size(l->in_w, kernel, stride, padding);
    if (oh <= 0 || ow <= 0)
        return td_error(TD_ERR_INVALID,
                        "layer %d (%s, conv2d): kernel %d with padding %d does not fit input %s",
                        m->num_layers, l->name, kernel, padding, in);
    l->kernel = kernel, l->stride = stride, l->pad = padding;
    l->out_c = out_channels, l->out_h = oh, l->out_w = ow;
    l->weight_count = (size_t)out_channels * l->in_c * kernel * kernel;
    l->param_count = l->weight_count + (size_t)out_channels;
    l->flops_fwd = 2.0 * (double)l->weight_count * oh * ow;
    commit(m, l);
    return TD_OK;
}

td_status td_model_add_maxpool2d(td_model_t *m, int kernel, int stride) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_MAXPOOL2D, &l));
    char in[64];
    shape_str(in, sizeof in, l->in_c, l->in_h, l->in_w);
    if (stride <= 0) stride = kernel;
    if (kernel <= 0 || kernel > TD_MAX_POOL_KERNEL)
        return td_error(TD_ERR_INVALID, "layer %d (%s, maxpool2d): kernel=%d must be in 1..%d",
                        m->num_layers, l->name, kernel, TD_MAX_POOL_KERNEL);
    int oh = td_conv_out_size(l->in_h, kernel, stride, 0);
    int ow = td_conv_out_size(l->in_w, kernel, stride, 0);
    if (oh <= 0 || ow <= 0)
        return td_error(TD_ERR_INVALID, "layer %d (%s, maxpool2d): kernel %d does not fit input %s",
                        m->num_layers, l->name, kernel, in);
    l->kernel = kernel, l->stride = stride;
    l->out_h = oh, l->out_w = ow;
    commit(m, l);
    return TD_OK;
}

td_status td_model_add_relu(td_model_t *m) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_RELU, &l));
    commit(m, l);
    return TD_OK;
}

td_status td_model_add_dropout(td_model_t *m, float p) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_DROPOUT, &l));
    if (!(p >= 0.0f && p < 1.0f))
        return td_error(TD_ERR_INVALID, "layer %d (%s, dropout): p=%g must be in [0, 1)",
                        m->num_layers, l->name, (double)p);
    l->p = p;
    commit(m, l);
    return TD_OK;
}

td_status td_model_add_flatten(td_model_t *m) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_FLATTEN, &l));
    l->out_c = l->in_c * l->in_h * l->in_w, l->out_h = 1, l->out_w = 1;
    commit(m, l);
    return TD_OK;
}

td_status td_model_add_log_softmax(td_model_t *m) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_LOG_SOFTMAX, &l));
    commit(m, l);
    return TD_OK;
}

static td_status add_simple(td_model_t *m, td_layer_kind kind) {
    td_layer *l;
    TD_CHECK(push(m, kind, &l));
    commit(m, l);
    return TD_OK;
}

td_status td_model_add_gelu(td_model_t *m) {
    return add_simple(m, TD_LAYER_GELU);
}
td_status td_model_add_tanh(td_model_t *m) {
    return add_simple(m, TD_LAYER_TANH);
}
td_status td_model_add_sigmoid(td_model_t *m) {
    return add_simple(m, TD_LAYER_SIGMOID);
}

td_status td_model_add_layernorm(td_model_t *m, float eps) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_LAYERNORM, &l));
    if (!(eps > 0.0f && eps < 1.0f))
        return td_error(TD_ERR_INVALID, "layer %d (%s, layernorm): eps=%g must be in (0, 1)",
                        m->num_layers, l->name, (double)eps);
    size_t d = (size_t)l->in_c * l->in_h * l->in_w;
    l->eps = eps;
    l->weight_count = d;
    l->param_count = 2 * d;
    l->flops_fwd = 8.0 * (double)d;
    commit(m, l);
    return TD_OK;
}

td_status td_model_add_batchnorm(td_model_t *m, float eps, float momentum) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_BATCHNORM, &l));
    if (!(eps > 0.0f && eps < 1.0f) || !(momentum >= 0.0f && momentum <= 1.0f))
        return td_error(TD_ERR_INVALID,
                        "layer %d (%s, batchnorm): eps=%g must be in (0, 1) and momentum=%g in "
                        "[0, 1]",
                        m->num_layers, l->name, (double)eps, (double)momentum);
    l->eps = eps, l->momentum = momentum;
    l->weight_count = (size_t)l->in_c;
    l->param_count = 2 * (size_t)l->in_c;
    l->buf_offset = m->num_buffers;
    m->num_buffers += 2 * (size_t)l->in_c;
    l->flops_fwd = 8.0 * (double)l->in_c * l->in_h * l->in_w;
    commit(m, l);
    return TD_OK;
}

td_status td_model_add_avgpool2d(td_model_t *m, int kernel, int stride) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_AVGPOOL2D, &l));
    char in[64];
    shape_str(in, sizeof in, l->in_c, l->in_h, l->in_w);
    if (stride <= 0) stride = kernel;
    if (kernel <= 0)
        return td_error(TD_ERR_INVALID, "layer %d (%s, avgpool2d): kernel=%d must be positive",
                        m->num_layers, l->name, kernel);
    int oh = td_conv_out_size(l->in_h, kernel, stride, 0);
    int ow = td_conv_out_size(l->in_w, kernel, stride, 0);
    if (oh <= 0 || ow <= 0)
        return td_error(TD_ERR_INVALID, "layer %d (%s, avgpool2d): kernel %d does not fit input %s",
                        m->num_layers, l->name, kernel, in);
    l->kernel = kernel, l->stride = stride;
    l->out_h = oh, l->out_w = ow;
    commit(m, l);
    return TD_OK;
}

td_status td_model_add_global_avgpool(td_model_t *m) {
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_GLOBAL_AVGPOOL, &l));
    l->out_h = l->out_w = 1;
    commit(m, l);
    return TD_OK;
}

td_status td_model_begin_residual(td_model_t *m) {
    if (!m) return td_error(TD_ERR_INVALID, "model is NULL (td_model_new failed?)");
    if (m->finalized)
        return td_error(TD_ERR_INVALID, "cannot begin a residual block: the model is finalized");
    if (m->depth == TD_NN_MAX_DEPTH)
        return td_error(TD_ERR_INVALID, "residual blocks nest more than %d deep", TD_NN_MAX_DEPTH);
    td_block *b = &m->blocks[m->depth++];
    b->start = m->cur_src;
    b->c = m->cur_c, b->h = m->cur_h, b->w = m->cur_w;
    b->body_end = -1;
    return TD_OK;
}

td_status td_model_begin_shortcut(td_model_t *m) {
    if (!m || !m->depth)
        return td_error(TD_ERR_INVALID, "begin_shortcut without an open residual block; call "
                                        "td_model_begin_residual first");
    td_block *b = &m->blocks[m->depth - 1];
    if (b->body_end >= 0)
        return td_error(TD_ERR_INVALID,
                        "the residual block opened at layer %d already has a "
                        "shortcut",
                        b->start);
    if (m->cur_src == b->start)
        return td_error(TD_ERR_INVALID,
                        "the residual block opened at layer %d has an empty body; "
                        "add the body's layers before the shortcut",
                        b->start);
    b->body_end = m->cur_src;
    b->bc = m->cur_c, b->bh = m->cur_h, b->bw = m->cur_w;
    /* the shortcut reads the block's input */
    m->cur_src = b->start;
    m->cur_c = b->c, m->cur_h = b->h, m->cur_w = b->w;
    return TD_OK;
}

td_status td_model_add_residual(td_model_t *m) {
    if (!m || !m->depth)
        return td_error(TD_ERR_INVALID, "add_residual without an open residual block; call "
                                        "td_model_begin_residual first");
    td_block b = m->blocks[m->depth - 1];
    bool shortcut = b.body_end >= 0;
    if (shortcut && m->cur_src == b.start)
        return td_error(TD_ERR_INVALID,
                        "the residual block opened at layer %d has an empty "
                        "shortcut; leave the shortcut out for the identity",
                        b.start);
    if (!shortcut && m->cur_src == b.start)
        return td_error(TD_ERR_INVALID, "the residual block opened at layer %d has an empty body",
                        b.start);
    /* the other branch: the body's output when there is a shortcut, else x itself */
    int oc = shortcut ? b.bc : b.c, oh = shortcut ? b.bh : b.h, ow = shortcut ? b.bw : b.w;
    if (oc != m->cur_c || oh != m->cur_h || ow != m->cur_w) {
        char s1[64], s2[64];
        shape_str(s1, sizeof s1, oc, oh, ow);
        shape_str(s2, sizeof s2, m->cur_c, m->cur_h, m->cur_w);
        return td_error(TD_ERR_INVALID,
                        shortcut ? "residual block opened at layer %d: the body's output %s and "
                                   "the shortcut's output %s differ; make them the same shape"
                                 : "residual block opened at layer %d: the input %s and the "
                                   "body's output %s differ; add a shortcut (e.g. a 1x1 conv2d "
                                   "with the body's stride) that maps one to the other",
                        b.start, s1, s2);
    }
    td_layer *l;
    TD_CHECK(push(m, TD_LAYER_RESIDUAL, &l));
    l->src2 = shortcut ? b.body_end : b.start;
    l->flops_fwd = (double)oc * oh * ow;
    m->depth--;
    commit(m, l);
    return TD_OK;
}

td_status td__model_name_last(td_model_t *m, const char *name) {
    if (!m->num_layers) return td_error(TD_ERR_INVALID, "no layer to name '%s'", name);
    if (!name[0] || strlen(name) >= sizeof(m->layers[0].name))
        return td_error(TD_ERR_INVALID, "layer name '%s' must be 1..%zu characters", name,
                        sizeof(m->layers[0].name) - 1);
    for (int i = 0; i < m->num_layers - 1; i++)
        if (!strcmp(m->layers[i].name, name))
            return td_error(TD_ERR_INVALID, "layer name '%s' is already used by layer %d", name, i);
    snprintf(m->layers[m->num_layers - 1].name, sizeof(m->layers[0].name), "%s", name);
    return TD_OK;
}

/* Buffers of a megabyte or more (a batch's activations and gradients: 1-4 MB each at
 * resnet-small's shapes, ~130 MB in all at batch 64) sit on 2 MiB pages where the kernel gives
 * them (transparent huge pages, asked for with madvise: the usual setting). On 4 KiB pages they
 * spanned far more than the second-level TLB covers (8 MB), and the layers' streaming passes
 * waited on page walks as well as on L3: resnet-small's CPU per step fell ~15% with this. Only
 * addresses change: the same bits. */
enum { HUGE_PAGE = 2 << 20, HUGE_MIN = 1 << 20 };

static float *alloc_floats(size_t n) {
    size_t nbytes = sizeof(float) * (n ? n : 1);
    void *p = NULL;
    if (nbytes >= HUGE_MIN) {
        size_t rounded = (nbytes + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
        if (posix_memalign(&p, HUGE_PAGE, rounded) != 0) p = NULL;
#ifdef MADV_HUGEPAGE
        if (p) (void)madvise(p, rounded, MADV_HUGEPAGE); /* a hint: 4 KiB pages still work */
#endif
    }
    if (!p) p = td_xmalloc_aligned(nbytes);
    memset(p, 0, nbytes);
    return p;
}

/* A linear layer's forward runs tandem's own gemm (td_gemm_ordered) over one operand as it lies
 * and the other transposed: x^T (then y^T comes out, transposed back) when that copies fewer
 * floats than W^T, as for layers wider than the batch; else W^T. Either way each output is the
 * same sum in the same order, so the choice (by the batch, too) never changes a bit. */
static size_t pad16(int n) {
    return ((size_t)n + 15) & ~(size_t)15;
}

/* Columns of x (or W) per thread's share of a transpose or packing: a multiple of 64, so
 * that slices start on td_gemm_pack_b's blocks. */
#define LINEAR_SLICE 256

/* The largest batch whose forward goes through x^T. */
static int linear_xt_batch(const td_layer *l) {
    return (int)((size_t)l->in_c * (size_t)l->out_c / ((size_t)l->in_c + (size_t)l->out_c));
}

static bool linear_by_xt(const td_layer *l, int batch) {
    return batch <= linear_xt_batch(l);
}

/* Whether the weight gradient reads x packed once for all its tasks, which then stream through
 * the gradient's rows once: where that gradient outgrows L2 (256 KiB and more: mlp7's 1024-wide
 * layers' took 10-20% longer walked down column blocks), at batches of up to 256 (a larger
 * batch's copy would cost memory, and its depth is several panels anyway). A small layer's x is
 * read as it lies (the copy cost a 26k-parameter MLP 4% of its step). */
static bool linear_packs_x(const td_layer *l, int batch) {
    return batch <= 256 && (size_t)l->in_c * (size_t)l->out_c >= 65536;
}

/* lin_t's floats for a layer at batches up to max_batch: x^T and y^T or W^T in the forward,
 * the packed x in the backward, whichever batch asks for the most. */
static size_t linear_t_floats(const td_layer *l, int max_batch) {
    int xt_batch = TD_MIN(max_batch, linear_xt_batch(l)), xp_batch = TD_MIN(max_batch, 256);
    size_t xt = ((size_t)l->in_c + (size_t)l->out_c) * pad16(xt_batch);
    size_t wt = max_batch > xt_batch ? (size_t)l->in_c * pad16(l->out_c) : 0;
    size_t xp = linear_packs_x(l, xp_batch) ? td_gemm_packed_floats(xp_batch, l->in_c) : 0;
    return TD_MAX(TD_MAX(xt, wt), xp);
}

/* What finalize is about to allocate for batches of max_batch (outputs, masks, the gradient
 * buffers, conv partial sums): checked against the machine's memory first, because the
 * allocators abort (core.h's policy) and a user's --batch must get an error instead. */
static double finalize_bytes(const td_model_t *m, int max_batch) {
    double b = (double)max_batch, total = 0, lin_t = 0, gmax = (double)m->in_c * m->in_h * m->in_w;
    int residuals = 0;
    for (int i = 0; i < m->num_layers; i++) {
        const td_layer *l = &m->layers[i];
        total += b * (double)l->out_size * 5; /* float output, byte mask (an upper bound) */
        bool partial = l->kind == TD_LAYER_CONV2D || l->kind == TD_LAYER_LAYERNORM;
        total += (b / TD_NN_CHUNK + 1) * (double)l->param_count * 4 * partial;
        gmax = TD_MAX(gmax, (double)TD_MAX(l->in_size, l->out_size));
        residuals += l->kind == TD_LAYER_RESIDUAL;
        if (l->kind == TD_LAYER_LINEAR)
            lin_t = TD_MAX(lin_t, (double)linear_t_floats(l, max_batch) * 4);
    }
    return lin_t + total + (2 + 2 * residuals) * b * gmax * 4 + 2.0 * (double)m->num_params * 4;
}

/* Picks the backward gradient buffers. gid[k] is the buffer that holds the gradient of acts[k]
 * (the model's input for k = 0, else layer k-1's output); walking layers last to first, a layer
 * reads gid of its output and writes gid of its input. A buffer is live while some acts[k] it
 * holds has not been read by its producer yet. A layer works in place where it can and its
 * output gradient is not live elsewhere, else takes the lowest free buffer; an input that
 * already has a gradient (a residual block's input, reached through both branches) gets a
 * fresh buffer and the older part added in (gadd). For a plain chain this alternates 0 and 1,
 * skipping in-place layers, exactly as before residual blocks existed. */
static bool is_live(const int *gid, int b, int upto) {
    for (int k = 0; k <= upto; k++)
        if (gid[k] == b) return true;
    return false;
}

static int fresh_buffer(const int *gid, int avoid, int upto, int *nbuf) {
    int b = 0;
    while (b == avoid || is_live(gid, b, upto)) b++;
    *nbuf = TD_MAX(*nbuf, b + 1);
    return b;
}

static void assign_grad_buffers(td_model_t *m) {
    int L = m->num_layers, nbuf = 0;
    int *gid = td_xmalloc(sizeof(int) * (size_t)(L + 1));
    for (int k = 0; k <= L; k++) gid[k] = -2;
    gid[L] = -1;
    for (int i = L - 1; i >= 0; i--) {
        td_layer *l = &m->layers[i];
        int g = gid[i + 1];
        l->gout = g;
        l->gadd = l->gadd2 = -1;
        l->gin2 = -1;
        if (l->kind == TD_LAYER_RESIDUAL) {
            /* both inputs get the output's gradient: the first as it is (nothing to do), the
             * second as a copy (its branch runs later and may work in place) */
            l->gin = g;
            gid[l->src] = g;
            if (l->need_din2) {
                l->gin2 = fresh_buffer(gid, g, i, &nbuf);
                if (gid[l->src2] != -2) l->gadd2 = gid[l->src2];
                gid[l->src2] = l->gin2;
            }
            continue;
        }
        bool inplace = l->kind == TD_LAYER_RELU || l->kind == TD_LAYER_DROPOUT ||
                       l->kind == TD_LAYER_FLATTEN || l->kind == TD_LAYER_GELU ||
                       l->kind == TD_LAYER_TANH || l->kind == TD_LAYER_SIGMOID;
        bool taken = gid[l->src] != -2;
        if (inplace && g >= 0 && !taken && !is_live(gid, g, i))
            l->gin = g;
        else
            l->gin = fresh_buffer(gid, g, i, &nbuf);
        if (taken) l->gadd = gid[l->src];
        gid[l->src] = l->gin;
    }
    free(gid);
    m->nbuf = TD_MAX(nbuf, 1);
}

td_status td_model_finalize(td_model_t *m, int max_batch) {
    if (!m) return td_error(TD_ERR_INVALID, "model is NULL");
    if (m->finalized) return td_error(TD_ERR_INVALID, "model is already finalized");
    if (m->num_layers == 0) return td_error(TD_ERR_INVALID, "model has no layers; add some first");
    if (m->depth)
        return td_error(TD_ERR_INVALID,
                        "the residual block opened at layer %d is not closed; end it with "
                        "td_model_add_residual",
                        m->blocks[m->depth - 1].start);
    if (max_batch <= 0) return td_error(TD_ERR_INVALID, "max_batch=%d must be positive", max_batch);
    double need = finalize_bytes(m, max_batch);
    double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (have > 0 && need > have)
        return td_error(TD_ERR_NOMEM,
                        "the model needs %.1f GiB for batches of %d (activations and gradients), "
                        "more than this machine's %.1f GiB of memory; use a smaller --batch "
                        "(and --accum to keep the global batch)",
                        need / 1073741824.0, max_batch, have / 1073741824.0);
    m->max_batch = max_batch;
    m->params = alloc_floats(m->num_params);
    m->grads = alloc_floats(m->num_params);
    m->buffers = alloc_floats(m->num_buffers);
    m->batch_stats = alloc_floats(m->num_buffers);
    size_t nchunks = (size_t)(max_batch + TD_NN_CHUNK - 1) / TD_NN_CHUNK;
    size_t gmax = (size_t)m->in_c * m->in_h * m->in_w;
    int L = m->num_layers;
    /* consumers of every activation, and whether parameters lie upstream of it (then its
     * gradient is needed) */
    int *ncons = td_xcalloc((size_t)L + 1, sizeof(int));
    bool *up = td_xcalloc((size_t)L + 1, sizeof(bool));
    for (int i = 0; i < L; i++) {
        td_layer *l = &m->layers[i];
        ncons[l->src]++;
        l->need_din = up[l->src];
        up[i + 1] = up[l->src] || l->param_count > 0;
        if (l->kind == TD_LAYER_RESIDUAL) {
            ncons[l->src2]++;
            l->need_din2 = up[l->src2];
            up[i + 1] |= up[l->src2];
        }
    }
    for (int i = 0; i < L; i++) {
        td_layer *l = &m->layers[i];
        /* relu overwrites its input only when that is the own output of a layer whose
         * backward does not read its output (so never the caller's x or log_softmax's y), and
         * nothing else reads it (a residual block's input) */
        td_layer_kind prev = i > 0 ? m->layers[i - 1].kind : TD_LAYER_FLATTEN;
        bool prev_ok = prev == TD_LAYER_CONV2D || prev == TD_LAYER_LINEAR ||
                       prev == TD_LAYER_MAXPOOL2D || prev == TD_LAYER_DROPOUT ||
                       prev == TD_LAYER_BATCHNORM || prev == TD_LAYER_RESIDUAL ||
                       prev == TD_LAYER_AVGPOOL2D || prev == TD_LAYER_GLOBAL_AVGPOOL;
        prev_ok = prev_ok && l->src == i && ncons[i] == 1;
        l->out_alias = l->kind == TD_LAYER_FLATTEN || (l->kind == TD_LAYER_RELU && prev_ok);
        if (!l->out_alias) l->out = alloc_floats((size_t)max_batch * l->out_size);
        if (l->kind == TD_LAYER_MAXPOOL2D || l->kind == TD_LAYER_DROPOUT)
            l->aux = td_xcalloc((size_t)max_batch * l->out_size, 1);
        if (l->kind == TD_LAYER_LAYERNORM) {
            l->partial = alloc_floats(nchunks * l->param_count);
            l->stats = alloc_floats(2 * (size_t)max_batch);
        }
        if (l->kind == TD_LAYER_BATCHNORM) {
            l->stats = alloc_floats(2 * (size_t)l->in_c);
            l->dpart = td_xcalloc(nchunks * 2 * (size_t)l->in_c, sizeof(double));
            l->psum = td_xcalloc((size_t)max_batch * 2 * (size_t)l->in_c, sizeof(double));
        }
        if (l->kind == TD_LAYER_CONV2D) {
            l->partial = alloc_floats(nchunks * l->param_count);
            td_status st = td__conv_use_winograd(l->in_c, l->kernel, l->stride, &l->wino);
            if (st != TD_OK) { /* a bad TANDEM_CONV_ALGO: td_model_free releases the rest */
                free(ncons);
                free(up);
                return st;
            }
            td__conv_prepare(l);
            m->col_floats = TD_MAX(m->col_floats, td__conv_scratch_floats(l));
            if (l->wino) {
                l->wino_u = alloc_floats(td__wino_filter_floats(l->out_c, l->in_c));
                m->col_floats =
                    TD_MAX(m->col_floats, td__wino_scratch_floats(TD_NN_CHUNK, l->in_c, l->out_c,
                                                                  l->in_h, l->in_w, l->out_h,
                                                                  l->out_w));
            }
        }
        if (l->kind == TD_LAYER_DROPOUT) m->col_floats = TD_MAX(m->col_floats, l->out_size + 4);
        gmax = TD_MAX(gmax, TD_MAX(l->in_size, l->out_size));
    }
    m->gstride = (gmax + 15) & ~(size_t)15; /* keep rows 64-byte aligned */
    /* Backward buffers: layers that can work in place keep the gradient where it is, except
     * that the caller's dout is never written. */
    assign_grad_buffers(m);
    m->gbuf = td_xcalloc((size_t)m->nbuf, sizeof(float *));
    for (int b = 0; b < m->nbuf; b++) m->gbuf[b] = alloc_floats((size_t)max_batch * m->gstride);
    size_t lin_t = 0;
    for (int i = 0; i < L; i++)
        if (m->layers[i].kind == TD_LAYER_LINEAR)
            lin_t = TD_MAX(lin_t, linear_t_floats(&m->layers[i], max_batch));
    if (lin_t) m->lin_t = alloc_floats(lin_t);
    /* An in-place relu is folded into the maxpool after it (4x fewer elements touched) or the
     * linear or batchnorm before it (no separate pass over the activations or their gradients,
     * no parallel region), when that neighbour is its only reader or writer. */
    for (int i = 0; i < L; i++) {
        td_layer *l = &m->layers[i];
        if (l->kind != TD_LAYER_RELU || !l->out_alias || l->gin != l->gout || l->gout < 0) continue;
        if (i + 1 < L && m->layers[i + 1].kind == TD_LAYER_MAXPOOL2D &&
            m->layers[i + 1].src == i + 1 && ncons[i + 1] == 1)
            l->relu_fused = m->layers[i + 1].relu_in = true;
        else if (i > 0 && (m->layers[i - 1].kind == TD_LAYER_LINEAR ||
                           m->layers[i - 1].kind == TD_LAYER_BATCHNORM))
            l->relu_fused = m->layers[i - 1].relu_out = true;
    }
    /* A residual whose first input is a batchnorm's output and nothing else's: the batchnorm's
     * normalising pass adds the skip as it writes, when the skip is ready by then */
    for (int i = 0; i < L; i++) {
        td_layer *l = &m->layers[i], *bn = &m->layers[TD_MAX(l->src - 1, 0)];
        if (l->kind != TD_LAYER_RESIDUAL || l->src < 1 || bn->kind != TD_LAYER_BATCHNORM ||
            ncons[l->src] != 1 || bn->relu_out || l->src2 > l->src - 1)
            continue;
        bn->sum_into = i;
        l->sum_by_bn = true;
    }
    free(ncons);
    free(up);
    for (int i = 0; i < L; i++) {
        td_layer *l = &m->layers[i];
        l->noop = l->relu_fused || (l->kind == TD_LAYER_FLATTEN && l->gin == l->gout);
    }
    /* Segments of per-sample layers: each layer records its segment's end; seg_end of a
     * batch-level layer is itself + 1. */
    for (int i = L - 1; i >= 0; i--) {
        td_layer *l = &m->layers[i];
        if (td__batch_level(l->kind) || i == L - 1 || td__batch_level(m->layers[i + 1].kind))
            l->seg_end = i + 1;
        else
            l->seg_end = m->layers[i + 1].seg_end;
    }
    m->acts = td_xcalloc((size_t)L + 1, sizeof(float *));
    m->finalized = true;
    td_model_init_params(m, 0);
    return TD_OK;
}

/* ---- inspection ---- */
size_t td_model_num_params(const td_model_t *m) {
    return m->num_params;
}
int td_model_num_layers(const td_model_t *m) {
    return m->num_layers;
}
td_layer_info td_model_layer(const td_model_t *m, int i) {
    td_layer_info info = {0};
    if (i < 0 || i >= m->num_layers) return info;
    const td_layer *l = &m->layers[i];
    info.kind = l->kind;
    info.name = l->name;
    info.param_offset = l->param_offset;
    info.param_count = l->param_count;
    info.weight_count = l->weight_count;
    info.in_c = l->in_c, info.in_h = l->in_h, info.in_w = l->in_w;
    info.out_c = l->out_c, info.out_h = l->out_h, info.out_w = l->out_w;
    info.kernel = l->kernel, info.stride = l->stride, info.pad = l->pad;
    info.p = l->p;
    info.flops_fwd = l->flops_fwd;
    info.kind_name = td_layer_kind_name(l->kind);
    info.eps = l->eps, info.momentum = l->momentum;
    info.buffer_offset = l->buf_offset;
    info.buffer_count = l->kind == TD_LAYER_BATCHNORM ? 2 * (size_t)l->in_c : 0;
    info.input_from = l->src;
    info.input2_from = l->kind == TD_LAYER_RESIDUAL ? l->src2 : -1;
    return info;
}
int td_model_output_size(const td_model_t *m) {
    if (!m->num_layers) return m->in_c * m->in_h * m->in_w;
    const td_layer *l = &m->layers[m->num_layers - 1];
    return l->out_c * l->out_h * l->out_w;
}
int td_model_input_size(const td_model_t *m) {
    return m->in_c * m->in_h * m->in_w;
}
double td_model_layer_flops(const td_model_t *m, int i, bool backward) {
    if (i < 0 || i >= m->num_layers) return 0;
    const td_layer *l = &m->layers[i];
    if (!backward) return l->flops_fwd;
    bool params_before = false;
    for (int j = 0; j < i; j++) params_before |= m->layers[j].param_count > 0;
    double f = 0;
    if (l->param_count) f += l->flops_fwd;                  /* weight gradient */
    if (l->param_count && params_before) f += l->flops_fwd; /* input gradient */
    return f;
}

double td_model_flops_per_sample(const td_model_t *m) {
    double f = 0;
    for (int i = 0; i < m->num_layers; i++)
        f += td_model_layer_flops(m, i, false) + td_model_layer_flops(m, i, true);
    return f;
}
float *td_model_params(td_model_t *m) {
    return m->params;
}
float *td_model_grads(td_model_t *m) {
    return m->grads;
}

void td_model_init_params(td_model_t *m, uint64_t seed) {
    if (!m->params) return;
    for (int i = 0; i < m->num_layers; i++) {
        td_layer *l = &m->layers[i];
        if (!l->param_count) continue;
        if (l->kind == TD_LAYER_LAYERNORM || l->kind == TD_LAYER_BATCHNORM) {
            float *w = m->params + l->param_offset;
            for (size_t j = 0; j < l->weight_count; j++) w[j] = 1.0f;
            memset(w + l->weight_count, 0, sizeof(float) * (l->param_count - l->weight_count));
            if (l->kind == TD_LAYER_BATCHNORM) {
                float *rm = m->buffers + l->buf_offset, *rv = rm + l->in_c;
                for (int c = 0; c < l->in_c; c++) rm[c] = 0.0f, rv[c] = 1.0f;
            }
            continue;
        }
        size_t fan_in = l->weight_count / (size_t)l->out_c;
        float bound = (float)(1.0 / sqrt((double)fan_in));
        td_rng_fill_uniform(seed, (uint64_t)i, -bound, bound, m->params + l->param_offset,
                            l->param_count);
    }
    m->batches_tracked = 0;
}

size_t td_model_num_buffers(const td_model_t *m) {
    return m->num_buffers;
}
float *td_model_buffers(td_model_t *m) {
    return m->num_buffers ? m->buffers : NULL;
}
size_t td_model_batch_stats_size(const td_model_t *m) {
    return m->num_buffers;
}
const float *td_model_batch_stats(const td_model_t *m) {
    return m->num_buffers ? m->batch_stats : NULL;
}
void td_model_update_running_stats(td_model_t *m, const float *batch_stats) {
    if (!m->buffers || !m->num_buffers) return;
    for (int i = 0; i < m->num_layers; i++) {
        const td_layer *l = &m->layers[i];
        if (l->kind != TD_LAYER_BATCHNORM) continue;
        float *r = m->buffers + l->buf_offset, mo = l->momentum;
        const float *b = batch_stats + l->buf_offset;
        for (int j = 0; j < 2 * l->in_c; j++) r[j] = (1.0f - mo) * r[j] + mo * b[j];
    }
    m->batches_tracked++;
}
int64_t td_model_batches_tracked(const td_model_t *m) {
    return m->batches_tracked;
}
void td_model_set_batches_tracked(td_model_t *m, int64_t n) {
    m->batches_tracked = n;
}

void td_model_set_grad_ready_hook(td_model_t *m, td_grad_ready_fn fn, void *user) {
    m->hook = fn;
    m->hook_user = user;
}

void td_model_zero_grads(td_model_t *m) {
    if (m->grads) memset(m->grads, 0, sizeof(float) * m->num_params);
}

/* ---- execution ---- */
static void ensure_scratch(td_model_t *m, int nt) {
    if (m->prof_on && nt > m->prof_threads) {
        m->prof = td_xrealloc(m->prof, sizeof(double) * m->prof_stride * (size_t)nt);
        memset(m->prof + m->prof_stride * (size_t)m->prof_threads, 0,
               sizeof(double) * m->prof_stride * (size_t)(nt - m->prof_threads));
        m->prof_threads = nt;
    }
    if (nt <= m->scratch_threads) return;
    m->scratch = td_xrealloc(m->scratch, sizeof(float *) * (size_t)nt);
    for (int t = m->scratch_threads; t < nt; t++) m->scratch[t] = alloc_floats(m->col_floats);
    m->scratch_threads = nt;
}

static int ntasks(int n, int per) {
    return (n + per - 1) / per;
}

/* ---- profiling: one branch per layer when off ---- */
void td_model_set_profiling(td_model_t *m, bool on) {
    m->prof_on = on;
    if (!on || m->prof_stride) return;
    m->prof_stride = ((size_t)2 * (size_t)m->num_layers + 7) / 8 * 8; /* whole cache lines */
    ensure_scratch(m, td_get_num_threads());
}

void td_model_profile(const td_model_t *m, double *fwd_s, double *bwd_s) {
    for (int i = 0; i < m->num_layers; i++) {
        fwd_s[i] = bwd_s[i] = 0;
        for (int t = 0; t < m->prof_threads; t++) {
            fwd_s[i] += m->prof[(size_t)t * m->prof_stride + 2 * (size_t)i];
            bwd_s[i] += m->prof[(size_t)t * m->prof_stride + 2 * (size_t)i + 1];
        }
    }
}

static inline double prof_now(const td_model_t *m) {
    return m->prof_on ? td_now_s() : 0.0;
}

/* Layer li's forward (bwd 0) or backward (1) took the time since t0 on `threads` threads. */
static inline void prof_add(td_model_t *m, int tid, int li, int bwd, double t0, int threads) {
    if (m->prof_on)
        m->prof[(size_t)tid * m->prof_stride + 2 * (size_t)li + (size_t)bwd] +=
            (td_now_s() - t0) * threads;
}

/* Output features per task of a linear layer's gemms (forward, weight gradient): wider layers
 * take wider blocks (fewer passes over the shared operand), up to 256, while a layer keeps 8
 * tasks for the threads where it can. A function of the shape alone; and the bits do not depend
 * on it (each output's sum runs over all of `in` in order either way). */
static int linear_cols(int out) {
    int cols = (out / 8) / TD_NN_LINEAR_COLS * TD_NN_LINEAR_COLS;
    return TD_MAX(TD_NN_LINEAR_COLS, TD_MIN(4 * TD_NN_LINEAR_COLS, cols));
}

/* Whether a linear layer's gemms are worth a parallel region: under 2^21 multiply-adds (about
 * 10 us of gemm) the fork, the barrier and the threads' wake-ups cost more than the second
 * thread saves (a 26k-parameter MLP's step took 1.6x longer on 2 threads than on 1). Only
 * where the blocks run changes, never the blocks: the same bits. */
static bool linear_parallel(int batch, const td_layer *l) {
    return (int64_t)batch * l->in_c * l->out_c >= (int64_t)1 << 21;
}

/* The threads a linear layer's time is charged to in the profile: those it ran on. */
static int linear_threads(int batch, const td_layer *l, int nt) {
    return linear_parallel(batch, l) ? nt : 1;
}

/* y [B, out] = x [B, in] W^T + b, split over blocks of output features; each output is
 * sum_k x[s][k] W[j][k] in k order (td_gemm_ordered), then + b[j]. */
static void linear_forward(td_model_t *m, int li, int batch, int nt) {
    td_layer *l = &m->layers[li];
    const float *x = m->acts[l->src], *w = m->params + l->param_offset, *b = w + l->weight_count;
    int in = l->in_c, out = l->out_c, cols = linear_cols(out), nb = ntasks(out, cols);
    bool par = nt > 1 && nb > 1 && linear_parallel(batch, l);
    bool by_xt = linear_by_xt(l, batch);
    size_t bp = pad16(batch), op = pad16(out);
    float *xt = m->lin_t, *yt = m->lin_t + (size_t)in * bp, *wt = m->lin_t;
    int slices = ntasks(in, LINEAR_SLICE);
#pragma omp parallel num_threads(nt) if (par)
    {
        /* x^T [in, bp] (y^T [out, bp] comes out of the gemm), or W^T [in, op], by columns */
#pragma omp for schedule(static)
        for (int c = 0; c < slices; c++) {
            int c0 = c * LINEAR_SLICE, cw = TD_MIN(LINEAR_SLICE, in - c0);
            if (by_xt)
                td_transpose(x + c0, batch, cw, (size_t)in, xt + c0 * bp, bp, (int)bp);
            else
                td_transpose(w + c0, out, cw, (size_t)in, wt + c0 * op, op, (int)op);
        }
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < nb; t++) {
            int j0 = t * cols, nf = TD_MIN(cols, out - j0);
            float *y = l->out + j0;
            if (by_xt) {
                td_gemm_ordered(nf, (int)bp, in, w + (size_t)j0 * in, in, 1, xt, bp,
                                yt + j0 * bp, bp, false);
                td_transpose(yt + j0 * bp, nf, batch, bp, y, (size_t)out, nf);
            } else {
                td_gemm_ordered(batch, nf, in, x, in, 1, wt + j0, op, y, (size_t)out, false);
            }
            for (int s = 0; s < batch; s++) {
                float *yr = y + (size_t)s * out;
#pragma omp simd
                for (int j = 0; j < nf; j++) yr[j] += b[j0 + j];
                if (l->relu_out) td_relu(yr, yr, (size_t)nf);
            }
        }
    }
}

static void grad_ready(td_model_t *m, int li) {
    td_layer *l = &m->layers[li];
    if (m->hook) m->hook(m->hook_user, li, l->param_offset, l->param_count);
}

/* dW += dy^T x and db += colsum(dy) (hook), then dx = dy W; each a sum in sample order, and
 * over the output features in order, from td_gemm_ordered. */
static void linear_backward(td_model_t *m, int li, int batch, int nt, float *dy, size_t ldo,
                            float *dx, size_t ldi) {
    td_layer *l = &m->layers[li];
    const float *x = m->acts[l->src], *w = m->params + l->param_offset;
    float *gw = m->grads + l->param_offset, *gb = gw + l->weight_count;
    int in = l->in_c, out = l->out_c, cols = linear_cols(out), nb = ntasks(out, cols);
    bool par = nt > 1 && nb > 1 && linear_parallel(batch, l);
    float *xp = linear_packs_x(l, batch) ? m->lin_t : NULL; /* x packed for every task */
    int slices = xp ? ntasks(in, LINEAR_SLICE) : 0;
#pragma omp parallel num_threads(nt) if (par)
    {
#pragma omp for schedule(static)
        for (int c = 0; c < slices; c++)
            td_gemm_pack_b(x, batch, in, (size_t)in, xp, c * LINEAR_SLICE, (c + 1) * LINEAR_SLICE);
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < nb; t++) {
            int j0 = t * cols, nf = TD_MIN(cols, out - j0);
            if (l->relu_out) /* the folded relu's backward, in place (its gin == gout) */
                for (int s = 0; s < batch; s++)
                    td_relu_backward(dy + (size_t)s * ldo + j0, l->out + (size_t)s * out + j0,
                                     dy + (size_t)s * ldo + j0, (size_t)nf);
            /* gw[j][k] += sum_s dy[s][j] x[s][k]: a = dy^T */
            if (xp)
                td_gemm_ordered_packed(nf, in, batch, dy + j0, 1, (ptrdiff_t)ldo, xp,
                                       gw + (size_t)j0 * in, (size_t)in, true);
            else
                td_gemm_ordered(nf, in, batch, dy + j0, 1, (ptrdiff_t)ldo, x, (size_t)in,
                                gw + (size_t)j0 * in, (size_t)in, true);
            /* db: each feature's sum over the batch in sample order from 0, as one loop per
             * feature did, but vectorised across the block's features (rows read in order) */
            float sum[4 * TD_NN_LINEAR_COLS];
            for (int j = 0; j < nf; j++) sum[j] = 0.0f;
            for (int b = 0; b < batch; b++) {
                const float *r = dy + (size_t)b * ldo + j0;
#pragma omp simd
                for (int j = 0; j < nf; j++) sum[j] += r[j];
            }
            for (int j = 0; j < nf; j++) gb[j0 + j] += sum[j];
        }
    }
    grad_ready(m, li);
    if (!l->need_din) return;
    int dcols = 4 * TD_NN_LINEAR_COLS, nc = ntasks(in, dcols);
    par = nt > 1 && nc > 1 && linear_parallel(batch, l);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (par)
    for (int t = 0; t < nc; t++) {
        int c0 = t * dcols, n = TD_MIN(dcols, in - c0);
        td_gemm_ordered(batch, n, out, dy, (ptrdiff_t)ldo, 1, w + c0, (size_t)in, dx + c0, ldi,
                        false);
    }
    td__grad_add_rows(m, l, 0, batch, dx, ldi);
}

void td__grad_add_rows(td_model_t *m, const td_layer *l, int s0, int s1, float *din, size_t ldi) {
    if (l->gadd < 0 || !l->need_din) return;
    const float *g = m->gbuf[l->gadd];
    for (int s = s0; s < s1; s++) {
        float *d = din + (size_t)s * ldi;
        const float *a = g + (size_t)s * m->gstride;
#pragma omp simd
        for (size_t e = 0; e < l->in_size; e++) d[e] += a[e];
    }
}

/* grads += partial[0] + partial[1] + ... in chunk order, for every element. */
static void reduce_partials(td_model_t *m, td_layer *l, int nchunks, int nt) {
    float *g = m->grads + l->param_offset;
    size_t n = l->param_count;
    const float *p = l->partial;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && n >= 4096)
    for (size_t j = 0; j < n; j++) {
        float acc = p[j];
        for (int c = 1; c < nchunks; c++) acc += p[(size_t)c * n + j];
        g[j] += acc;
    }
}

const float *td_model_forward(td_model_t *m, const float *x, int batch, const td_forward_ctx *ctx) {
    if (!m || !m->finalized) {
        td_error(TD_ERR_INVALID, "td_model_forward: model is not finalized");
        return NULL;
    }
    if (batch <= 0 || batch > m->max_batch) {
        td_error(TD_ERR_INVALID, "td_model_forward: batch=%d outside 1..max_batch=%d", batch,
                 m->max_batch);
        return NULL;
    }
    int nt = td_get_num_threads();
    ensure_scratch(m, nt);
    m->batch = batch;
    m->training = ctx && ctx->training;
    m->seed = ctx ? ctx->seed : 0;
    m->step = ctx ? ctx->step : 0;
    m->sample_ids = ctx ? ctx->sample_ids : NULL;
    m->acts[0] = x;
    for (int i = 0; i < m->num_layers; i++)
        m->acts[i + 1] = m->layers[i].out_alias ? m->acts[m->layers[i].src] : m->layers[i].out;
    /* in-place relu writes its input buffer, which is the previous layer's own output */
    for (int i = 0; i < m->num_layers; i++)
        if (m->layers[i].out_alias && m->layers[i].kind == TD_LAYER_RELU)
            m->layers[i].out = (float *)m->acts[m->layers[i].src];
    int nchunks = ntasks(batch, TD_NN_CHUNK);
    /* Winograd filters follow the parameters, which the optimizer changed since last time */
    for (int i = 0; i < m->num_layers; i++)
        if (m->layers[i].wino) {
            double t0 = prof_now(m);
            td__wino_filter(m->params + m->layers[i].param_offset, m->layers[i].out_c,
                            m->layers[i].in_c, m->layers[i].wino_u);
            prof_add(m, 0, i, 0, t0, 1);
        }
    for (int i = 0; i < m->num_layers;) {
        td_layer *l = &m->layers[i];
        if (l->kind == TD_LAYER_LINEAR || l->kind == TD_LAYER_BATCHNORM) {
            double t0 = prof_now(m);
            if (l->kind == TD_LAYER_LINEAR)
                linear_forward(m, i, batch, nt);
            else
                td__bn_forward(m, i, batch, nt);
            prof_add(m, 0, i, 0, t0,
                     l->kind == TD_LAYER_LINEAR ? linear_threads(batch, l, nt) : nt);
            i++;
            continue;
        }
        int end = l->seg_end;
        bool work = false;
        for (int j = i; j < end; j++) work |= !m->layers[j].noop;
        /* a training batchnorm right after the segment, reading its output: its statistics'
         * sums are taken chunk by chunk here, while the rows are still in cache */
        bool bn_sums = work && m->training && end < m->num_layers &&
                       m->layers[end].kind == TD_LAYER_BATCHNORM && m->layers[end].src == end;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nchunks > 1 && work)
        for (int c = 0; c < (work ? nchunks : 0); c++) {
            int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
            int tid = omp_get_thread_num();
            for (int j = i; j < end; j++) {
                double t0 = prof_now(m);
                td__layer_forward_rows(m, j, s0, s1, tid);
                prof_add(m, tid, j, 0, t0, 1);
            }
            if (bn_sums) {
                double t0 = prof_now(m);
                td__bn_sample_sums(m, end, s0, s1);
                prof_add(m, tid, end, 0, t0, 1);
            }
        }
        if (bn_sums) m->layers[end].psum_fresh = true;
        i = end;
    }
    return m->acts[m->num_layers];
}

void td_model_backward(td_model_t *m, const float *dout, int batch) {
    if (!m || !m->finalized || batch != m->batch) {
        TD_LOG_ERROR("td_model_backward: batch=%d does not match the last forward's batch=%d; "
                     "gradients left unchanged",
                     batch, m ? m->batch : -1);
        return;
    }
    int nt = td_get_num_threads();
    ensure_scratch(m, nt);
    int first = 0; /* layers before the first parametered layer need no backward */
    while (first < m->num_layers && !m->layers[first].param_count) first++;
    int nchunks = ntasks(batch, TD_NN_CHUNK);
#define GBUF(id) ((id) < 0 ? (float *)dout : m->gbuf[id]) /* -2 (never used) reads as dout */
#define GLD(id)  ((id) < 0 ? (size_t)td_model_output_size(m) : m->gstride)
    for (int i = m->num_layers - 1; i >= first;) {
        td_layer *l = &m->layers[i];
        if (l->kind == TD_LAYER_LINEAR) {
            double t0 = prof_now(m);
            linear_backward(m, i, batch, nt, GBUF(l->gout), GLD(l->gout), GBUF(l->gin),
                            GLD(l->gin));
            prof_add(m, 0, i, 1, t0, linear_threads(batch, l, nt));
            i--;
            continue;
        }
        if (l->kind == TD_LAYER_BATCHNORM) {
            /* (td__bn_backward adds gadd's part itself, chunk by chunk) */
            double t0 = prof_now(m);
            td__bn_backward(m, i, batch, nt, GBUF(l->gout), GLD(l->gout), GBUF(l->gin),
                            GLD(l->gin));
            prof_add(m, 0, i, 1, t0, nt);
            grad_ready(m, i);
            i--;
            continue;
        }
        int begin = i;
        while (begin > first && !td__batch_level(m->layers[begin - 1].kind)) begin--;
        bool work = false;
        for (int j = begin; j <= i; j++) work |= !m->layers[j].noop;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nchunks > 1 && work)
        for (int c = 0; c < (work ? nchunks : 0); c++) {
            int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
            int tid = omp_get_thread_num();
            for (int j = i; j >= begin; j--) {
                td_layer *lj = &m->layers[j];
                double t0 = prof_now(m);
                td__layer_backward_rows(m, j, s0, s1, c, tid, GBUF(lj->gout), GLD(lj->gout),
                                        GBUF(lj->gin), GLD(lj->gin));
                prof_add(m, tid, j, 1, t0, 1);
            }
        }
        for (int j = i; j >= begin; j--) {
            if (!m->layers[j].partial) continue;
            double t0 = prof_now(m);
            reduce_partials(m, &m->layers[j], nchunks, nt);
            prof_add(m, 0, j, 1, t0, nt);
            grad_ready(m, j);
        }
        i = begin - 1;
    }
#undef GBUF
#undef GLD
}
