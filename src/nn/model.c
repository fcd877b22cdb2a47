/* Sequential models: building with shape checks, the flat parameter/gradient buffers, and the
 * forward/backward executor.
 *
 * Execution: consecutive per-sample layers (conv, pool, relu, dropout, flatten, log_softmax) form
 * a segment that runs chunk by chunk (TD_NN_CHUNK samples) through all its layers while the
 * chunk is in cache; Linear layers run as batch-level gemms split over fixed column blocks.
 * Neither split depends on the thread count, and conv weight gradients are summed per chunk and
 * then added in chunk order, so every thread count gives the same bits. Chunks and blocks are
 * handed out dynamically: which thread runs one never matters, and on a shared machine a
 * descheduled thread then delays only its current chunk, not a fixed half of the batch. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
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
    case TD_LAYER_RELU:
        return "relu";
    case TD_LAYER_DROPOUT:
        return "dropout";
    case TD_LAYER_FLATTEN:
        return "flatten";
    case TD_LAYER_LOG_SOFTMAX:
        return "log_softmax";
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
    m->in_c = in_c;
    m->in_h = in_h;
    m->in_w = in_w;
    return m;
}

void td_model_free(td_model_t *m) {
    if (!m) return;
    for (int i = 0; i < m->num_layers; i++) {
        td_layer *l = &m->layers[i];
        if (!l->out_alias) free(l->out);
        free(l->aux);
        free(l->partial);
        free(l->wino_u);
        free(l->wino_ub);
    }
    for (int t = 0; t < m->scratch_threads; t++) free(m->scratch[t]);
    free(m->scratch);
    free(m->layers);
    free(m->params);
    free(m->grads);
    free(m->gbuf[0]);
    free(m->gbuf[1]);
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
    if (m->num_layers == 0) {
        l->in_c = m->in_c, l->in_h = m->in_h, l->in_w = m->in_w;
    } else {
        td_layer *p = &m->layers[m->num_layers - 1];
        l->in_c = p->out_c, l->in_h = p->out_h, l->in_w = p->out_w;
    }
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
    if (kernel <= 0 || kernel > 15)
        return td_error(TD_ERR_INVALID, "layer %d (%s, maxpool2d): kernel=%d must be in 1..15",
                        m->num_layers, l->name, kernel);
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

static float *alloc_floats(size_t n) {
    float *p = td_xmalloc_aligned(sizeof(float) * (n ? n : 1));
    memset(p, 0, sizeof(float) * (n ? n : 1));
    return p;
}

/* What finalize is about to allocate for batches of max_batch (outputs, masks, the two gradient
 * buffers, conv partial sums): checked against the machine's memory first, because the
 * allocators abort (core.h's policy) and a user's --batch must get an error instead. */
static double finalize_bytes(const td_model_t *m, int max_batch) {
    double b = (double)max_batch, total = 0, gmax = (double)m->in_c * m->in_h * m->in_w;
    for (int i = 0; i < m->num_layers; i++) {
        const td_layer *l = &m->layers[i];
        total += b * (double)l->out_size * 5; /* float output, byte mask (an upper bound) */
        total += (b / TD_NN_CHUNK + 1) * (double)l->param_count * 4 * (l->kind == TD_LAYER_CONV2D);
        gmax = TD_MAX(gmax, (double)TD_MAX(l->in_size, l->out_size));
    }
    return total + 2 * b * gmax * 4 + 2.0 * (double)m->num_params * 4;
}

td_status td_model_finalize(td_model_t *m, int max_batch) {
    if (!m) return td_error(TD_ERR_INVALID, "model is NULL");
    if (m->finalized) return td_error(TD_ERR_INVALID, "model is already finalized");
    if (m->num_layers == 0) return td_error(TD_ERR_INVALID, "model has no layers; add some first");
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
    size_t nchunks = (size_t)(max_batch + TD_NN_CHUNK - 1) / TD_NN_CHUNK;
    size_t gmax = (size_t)m->in_c * m->in_h * m->in_w;
    bool params_before = false;
    for (int i = 0; i < m->num_layers; i++) {
        td_layer *l = &m->layers[i];
        l->need_din = params_before;
        params_before |= l->param_count > 0;
        /* relu overwrites its input only when that is the own output of a layer whose
         * backward does not read its output (so never the caller's x or log_softmax's y) */
        td_layer_kind prev = i > 0 ? m->layers[i - 1].kind : TD_LAYER_FLATTEN;
        bool prev_ok = prev == TD_LAYER_CONV2D || prev == TD_LAYER_LINEAR ||
                       prev == TD_LAYER_MAXPOOL2D || prev == TD_LAYER_DROPOUT;
        l->out_alias = l->kind == TD_LAYER_FLATTEN || (l->kind == TD_LAYER_RELU && prev_ok);
        if (!l->out_alias) l->out = alloc_floats((size_t)max_batch * l->out_size);
        if (l->kind == TD_LAYER_MAXPOOL2D || l->kind == TD_LAYER_DROPOUT)
            l->aux = td_xcalloc((size_t)max_batch * l->out_size, 1);
        if (l->kind == TD_LAYER_CONV2D) {
            l->partial = alloc_floats(nchunks * l->param_count);
            size_t col = (size_t)l->in_c * l->kernel * l->kernel * l->out_h * l->out_w;
            m->col_floats = TD_MAX(m->col_floats, col);
            TD_CHECK(td__conv_use_winograd(l->in_c, l->kernel, l->stride, &l->wino));
            if (l->wino) {
                l->wino_u = alloc_floats(TD_WINO_POS * (size_t)l->in_c * l->out_c);
                l->wino_ub = alloc_floats(TD_WINO_POS * (size_t)l->in_c * l->out_c);
                size_t f = td__wino_scratch_floats(TD_NN_CHUNK, l->in_c, l->out_c, l->in_h, l->in_w,
                                                   l->out_h, l->out_w);
                size_t b = td__wino_scratch_floats(TD_NN_CHUNK, l->out_c, l->in_c, l->out_h,
                                                   l->out_w, l->in_h, l->in_w);
                m->col_floats = TD_MAX(m->col_floats, TD_MAX(f, b));
            }
        }
        if (l->kind == TD_LAYER_DROPOUT) m->col_floats = TD_MAX(m->col_floats, l->out_size + 4);
        gmax = TD_MAX(gmax, TD_MAX(l->in_size, l->out_size));
    }
    m->gstride = (gmax + 15) & ~(size_t)15; /* keep rows 64-byte aligned */
    m->gbuf[0] = alloc_floats((size_t)max_batch * m->gstride);
    m->gbuf[1] = alloc_floats((size_t)max_batch * m->gstride);
    /* Backward buffers: layers that can work in place keep the gradient where it is, except
     * that the caller's dout is never written. */
    int g = -1;
    for (int i = m->num_layers - 1; i >= 0; i--) {
        td_layer *l = &m->layers[i];
        bool inplace =
            l->kind == TD_LAYER_RELU || l->kind == TD_LAYER_DROPOUT || l->kind == TD_LAYER_FLATTEN;
        l->gout = g;
        l->gin = (inplace && g >= 0) ? g : (g == 0 ? 1 : 0);
        g = l->gin;
    }
    /* An in-place relu is folded into the maxpool after it (4x fewer elements touched) or the
     * linear before it (no separate pass, no parallel region). */
    for (int i = 0; i < m->num_layers; i++) {
        td_layer *l = &m->layers[i];
        if (l->kind != TD_LAYER_RELU || !l->out_alias || l->gin != l->gout || l->gout < 0) continue;
        if (i + 1 < m->num_layers && m->layers[i + 1].kind == TD_LAYER_MAXPOOL2D)
            l->relu_fused = m->layers[i + 1].relu_in = true;
        else if (i > 0 && m->layers[i - 1].kind == TD_LAYER_LINEAR)
            l->relu_fused = m->layers[i - 1].relu_out = true;
    }
    for (int i = 0; i < m->num_layers; i++) {
        td_layer *l = &m->layers[i];
        l->noop = l->relu_fused || (l->kind == TD_LAYER_FLATTEN && l->gin == l->gout);
    }
    /* Segments of per-sample layers: each layer records its segment's end; seg_end of a linear
     * layer is itself + 1. */
    for (int i = m->num_layers - 1; i >= 0; i--) {
        td_layer *l = &m->layers[i];
        if (l->kind == TD_LAYER_LINEAR || i == m->num_layers - 1 ||
            m->layers[i + 1].kind == TD_LAYER_LINEAR)
            l->seg_end = i + 1;
        else
            l->seg_end = m->layers[i + 1].seg_end;
    }
    m->acts = td_xcalloc((size_t)m->num_layers + 1, sizeof(float *));
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
double td_model_flops_per_sample(const td_model_t *m) {
    double f = 0;
    bool params_before = false;
    for (int i = 0; i < m->num_layers; i++) {
        const td_layer *l = &m->layers[i];
        f += l->flops_fwd;                                      /* forward */
        if (l->param_count) f += l->flops_fwd;                  /* weight gradient */
        if (l->param_count && params_before) f += l->flops_fwd; /* input gradient */
        params_before |= l->param_count > 0;
    }
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
        size_t fan_in = l->weight_count / (size_t)l->out_c;
        float bound = (float)(1.0 / sqrt((double)fan_in));
        td_rng_fill_uniform(seed, (uint64_t)i, -bound, bound, m->params + l->param_offset,
                            l->param_count);
    }
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
    if (nt <= m->scratch_threads) return;
    m->scratch = td_xrealloc(m->scratch, sizeof(float *) * (size_t)nt);
    for (int t = m->scratch_threads; t < nt; t++) m->scratch[t] = alloc_floats(m->col_floats);
    m->scratch_threads = nt;
}

static int ntasks(int n, int per) {
    return (n + per - 1) / per;
}

/* y [B, out] = x [B, in] W^T + b, split over blocks of output features. */
static void linear_forward(td_model_t *m, int li, int batch, int nt) {
    td_layer *l = &m->layers[li];
    const float *x = m->acts[li], *w = m->params + l->param_offset, *b = w + l->weight_count;
    int in = l->in_c, out = l->out_c, nb = ntasks(out, TD_NN_LINEAR_COLS);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nb > 1)
    for (int t = 0; t < nb; t++) {
        int j0 = t * TD_NN_LINEAR_COLS, nf = TD_MIN(TD_NN_LINEAR_COLS, out - j0);
        float *y = l->out + j0;
        td_sgemm(false, true, batch, nf, in, 1.0f, x, in, w + (size_t)j0 * in, in, 0.0f, y, out);
        for (int s = 0; s < batch; s++) {
            float *yr = y + (size_t)s * out;
#pragma omp simd
            for (int j = 0; j < nf; j++) yr[j] += b[j0 + j];
            if (l->relu_out) td_relu(yr, yr, (size_t)nf);
        }
    }
}

static void grad_ready(td_model_t *m, int li) {
    td_layer *l = &m->layers[li];
    if (m->hook) m->hook(m->hook_user, li, l->param_offset, l->param_count);
}

/* dW += dy^T x and db += colsum(dy) (hook), then dx = dy W. */
static void linear_backward(td_model_t *m, int li, int batch, int nt, float *dy, size_t ldo,
                            float *dx, size_t ldi) {
    td_layer *l = &m->layers[li];
    const float *x = m->acts[li], *w = m->params + l->param_offset;
    float *gw = m->grads + l->param_offset, *gb = gw + l->weight_count;
    int in = l->in_c, out = l->out_c, nb = ntasks(out, TD_NN_LINEAR_COLS);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nb > 1)
    for (int t = 0; t < nb; t++) {
        int j0 = t * TD_NN_LINEAR_COLS, nf = TD_MIN(TD_NN_LINEAR_COLS, out - j0);
        if (l->relu_out) /* the folded relu's backward, in place (its gin == gout) */
            for (int s = 0; s < batch; s++)
                td_relu_backward(dy + (size_t)s * ldo + j0, l->out + (size_t)s * out + j0,
                                 dy + (size_t)s * ldo + j0, (size_t)nf);
        td_sgemm(true, false, nf, in, batch, 1.0f, dy + j0, (int)ldo, x, in, 1.0f,
                 gw + (size_t)j0 * in, in);
        for (int j = j0; j < j0 + nf; j++) {
            float s = 0.0f;
            for (int b = 0; b < batch; b++) s += dy[(size_t)b * ldo + j];
            gb[j] += s;
        }
    }
    grad_ready(m, li);
    if (!l->need_din) return;
    int cols = 4 * TD_NN_LINEAR_COLS, nc = ntasks(in, cols);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nc > 1)
    for (int t = 0; t < nc; t++) {
        int c0 = t * cols, n = TD_MIN(cols, in - c0);
        td_sgemm(false, false, batch, n, out, 1.0f, dy, (int)ldo, w + c0, in, 0.0f, dx + c0,
                 (int)ldi);
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
        m->acts[i + 1] = m->layers[i].out_alias ? m->acts[i] : m->layers[i].out;
    /* in-place relu writes its input buffer, which is the previous layer's own output */
    for (int i = 0; i < m->num_layers; i++)
        if (m->layers[i].out_alias && m->layers[i].kind == TD_LAYER_RELU)
            m->layers[i].out = (float *)m->acts[i];
    int nchunks = ntasks(batch, TD_NN_CHUNK);
    /* Winograd filters follow the parameters, which the optimizer changed since last time */
    for (int i = 0; i < m->num_layers; i++)
        if (m->layers[i].wino)
            td__wino_filter(m->params + m->layers[i].param_offset, m->layers[i].out_c,
                            m->layers[i].in_c, false, m->layers[i].wino_u);
    for (int i = 0; i < m->num_layers;) {
        td_layer *l = &m->layers[i];
        if (l->kind == TD_LAYER_LINEAR) {
            linear_forward(m, i, batch, nt);
            i++;
            continue;
        }
        int end = l->seg_end;
        bool work = false;
        for (int j = i; j < end; j++) work |= !m->layers[j].noop;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nchunks > 1 && work)
        for (int c = 0; c < (work ? nchunks : 0); c++) {
            int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
            int tid = omp_get_thread_num();
            for (int j = i; j < end; j++) td__layer_forward_rows(m, j, s0, s1, tid);
        }
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
    for (int i = first; i < m->num_layers; i++)
        if (m->layers[i].wino && m->layers[i].need_din)
            td__wino_filter(m->params + m->layers[i].param_offset, m->layers[i].out_c,
                            m->layers[i].in_c, true, m->layers[i].wino_ub);
#define GBUF(id) ((id) < 0 ? (float *)dout : m->gbuf[id])
#define GLD(id)  ((id) < 0 ? (size_t)td_model_output_size(m) : m->gstride)
    for (int i = m->num_layers - 1; i >= first;) {
        td_layer *l = &m->layers[i];
        if (l->kind == TD_LAYER_LINEAR) {
            linear_backward(m, i, batch, nt, GBUF(l->gout), GLD(l->gout), GBUF(l->gin),
                            GLD(l->gin));
            i--;
            continue;
        }
        int begin = i;
        while (begin > first && m->layers[begin - 1].kind != TD_LAYER_LINEAR) begin--;
        bool work = false;
        for (int j = begin; j <= i; j++) work |= !m->layers[j].noop;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && nchunks > 1 && work)
        for (int c = 0; c < (work ? nchunks : 0); c++) {
            int s0 = c * TD_NN_CHUNK, s1 = TD_MIN(batch, s0 + TD_NN_CHUNK);
            int tid = omp_get_thread_num();
            for (int j = i; j >= begin; j--) {
                td_layer *lj = &m->layers[j];
                td__layer_backward_rows(m, j, s0, s1, c, tid, GBUF(lj->gout), GLD(lj->gout),
                                        GBUF(lj->gin), GLD(lj->gin));
            }
        }
        for (int j = i; j >= begin; j--) {
            if (m->layers[j].kind != TD_LAYER_CONV2D) continue;
            reduce_partials(m, &m->layers[j], nchunks, nt);
            grad_ready(m, j);
        }
        i = begin - 1;
    }
#undef GBUF
#undef GLD
}
