/* The CUDA engine: a finalized model's device mirror, the training step as one CUDA graph, the
 * optimizer over the flat buffers, evaluation, and the cross-rank reduce (CUDA IPC or the host).
 *
 * A step on the device (enqueue_step):
 *   for each micro-batch slot j of this rank: gather -> forward -> fused loss -> backward into
 *   gradient buffer j (the last slot writes the model's grads buffer itself);
 *   the pairwise tree of train.h sums the slots into grads (adds in place, "left + right");
 *   step statistics (loss sum, correct, samples);
 *   the optimizer (one rank) -- or, between ranks, the step stops at the rank's gradient and the
 *   ranks sum it through CUDA IPC (td_gpu_ipc_*) or the host reducer (ddp, over shm/tcp).
 * Everything reads its per-step values from one td_gpu_args block in device memory, so the
 * sequence is captured once and replayed: one cudaMemcpyAsync of the block, one graph launch,
 * one copy of three doubles back, per step. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "tandem/gpu.h"

#define RING                                                                                       \
    4 /* steps whose statistics can be in flight; slot RING serves evaluation and tests            \
       */

#define CU_CHECK(call)                                                                             \
    do {                                                                                           \
        cudaError_t cu__e = (call);                                                                \
        if (cu__e != cudaSuccess)                                                                  \
            return td_error(TD_ERR_SYS, "CUDA: %s failed: %s (%s)", #call,                         \
                            cudaGetErrorString(cu__e), cudaGetErrorName(cu__e));                   \
    } while (0)

#define BLAS_CHECK(call)                                                                           \
    do {                                                                                           \
        cublasStatus_t bl__e = (call);                                                             \
        if (bl__e != CUBLAS_STATUS_SUCCESS)                                                        \
            return td_error(TD_ERR_SYS, "cuBLAS: %s failed: %s", #call,                            \
                            cublasGetStatusString(bl__e));                                         \
    } while (0)

/* A kernel launch's configuration errors surface here, naming the layer that launched it. */
#define LAUNCHED(what)                                                                             \
    do {                                                                                           \
        cudaError_t cu__e = cudaGetLastError();                                                    \
        if (cu__e != cudaSuccess)                                                                  \
            return td_error(TD_ERR_SYS, "CUDA kernel launch (%s) failed: %s", (what),              \
                            cudaGetErrorString(cu__e));                                            \
    } while (0)

typedef struct glayer {
    td_layer_info info;
    size_t in_size, out_size;
    float *out;   /* [max_batch * out_size]; flatten: NULL (aliases its input) */
    float *din;   /* [max_batch * in_size] input gradient, when needed */
    uint8_t *aux; /* maxpool argmax / dropout keep mask */
    /* conv: im2col [kk][max_batch * oh*ow], fp32, or bf16 under --precision bf16 (then the
     * weights' bf16 copy w16 and dy's, cn16, are the gemms' other operands) */
    void *col;
    float *cn;           /* conv: the gemm's output [out_c][max_batch * oh*ow]; in backward, dy */
    void *dcol;          /* conv: the input gradient before col2im, like col (when need_din) */
    __nv_bfloat16 *cn16; /* conv, bf16: dy in the CN layout, rounded */
    __nv_bfloat16 *w16;  /* conv, bf16: the weights, rounded at each forward */
    bool relu_next;      /* conv/linear: the following ReLU is folded into the bias kernel */
    bool fused;          /* relu: forward done by the layer before */
    bool into_pool;      /* relu: backward folded into the max pool after it */
    bool into_conv;      /* relu: backward folded into the col2im of the conv after it */
    bool gate_din;       /* conv: its input is a ReLU's output; col2im applies its backward */
    bool gate;           /* maxpool: its input is a ReLU's output; applies that ReLU's backward */
    struct glayer *din_conv; /* maxpool: writes its input gradient as this conv's dy, in its cn
                                (and cn16) layout, so the conv needs no layout change of dy */
    bool dy_in_cn;           /* conv: its dy arrives in cn already (the pool after it wrote it) */
    bool need_din;           /* a layer upstream of its input has parameters */
    bool need_din2;          /* residual: the same for its second input */
    float *din2;             /* residual: its second input's gradient (a copy of dy) */
    float *red;              /* batchnorm: [2C] the backward's means of dy and dy xhat */
    double *part;            /* batchnorm: its sums' per-chunk partials (forward and backward) */
    int dropout_idx;         /* dropout: index into td_gpu_args.dropout_key */
    float *stats; /* layernorm: [max_batch][2] (mean, rstd) of the last forward; batchnorm: [2C] */
} glayer;

/* A data set on the device: src's values, labels (or targets) and norm are its allocations
 * (norm: the lut [channels][256], or mean [channels] then std [channels]). A streamed set's
 * src is a window of samples (a step's slots, or an evaluation batch) in one allocation,
 * values then labels or targets, filled from `host`: pinned staging of the same layout, one per
 * ring slot (training) or one (evaluation), filled by fill. */
typedef struct {
    td_gpu_source src;
    float *norm;
    uint64_t count;
    bool stream;
    td_gpu_fill_fn fill;
    void *fill_user;
    size_t rec_bytes, labels_off, window_bytes; /* a sample's values; the window's layout */
    void *window, *host;
} gdata;

struct td_gpu {
    td_model_t *model;
    td_optim_config optim;
    td_gpu_config cfg;
    int device;
    char desc[320];
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    /* Backward forks each parametered layer's weight gradient onto a side stream (its own
     * cuBLAS handle and workspace) while the input gradient goes on: the two only read shared
     * buffers, and the side joins at the end of the backward. */
    cudaStream_t side;
    cublasHandle_t blas_side;
    void *blas_side_ws;
    cudaEvent_t *fork; /* [nl] */
    cudaEvent_t join;
    int nl, classes, in_size, max_batch;
    bool bf16; /* --precision bf16: conv operands stored in bf16 */
    size_t num_params;
    glayer *layers;
    td_gpu_loss_kind loss; /* cfg.loss; cross-entropy is NLL where the model ends in log_softmax */
    /* A chain (no residual block): every activation has one consumer, and the fusions across
     * neighbours (a ReLU into the conv or linear before it, into the pool or conv after it, the
     * pool's backward into the conv's gemm layout) apply. Otherwise each layer runs on its own
     * and an activation's gradient is the sum over its consumers (backward). */
    bool chain;
    const float **acts; /* [nl + 1] the last forward's activations: acts[i + 1] = layer i's out */
    float **dacts;      /* [nl + 1] backward: the gradient buffer of each activation, or NULL */
    float *gtmp;        /* a layer's input gradient before it is added to another consumer's */
    /* BatchNorm: running statistics (the model's buffers, uploaded), and each micro-batch slot's
     * batch statistics [accum][nbuf], copied to bn_host [RING + 1][accum][nbuf] after a step */
    size_t nbuf;
    float *buffers, *bn_dev, *bn_host;
    /* flat buffers */
    float *params, *grads, *state;
    size_t state_count;
    uint64_t optim_steps;
    float **slot_grads; /* [accum]: slot j's gradient; the last is grads */
    /* batch buffers, one set per slot so a slot's ids survive until its backward */
    float *x;
    int32_t *y; /* labels (cross-entropy) */
    float *t;   /* real targets [accum][max_batch][classes] (mse, bce) */
    uint64_t *ids;
    float *dout;
    double *row_loss, *row_correct;
    double *stats;  /* [3] the step's statistics */
    double *evsums; /* [3] evaluation sums */
    float *ones;    /* [max_batch] 1.0f: column sums as a gemv */
    float *rowsum;  /* conv bias gradient: per (channel, sample) sums of dy */
    gdata train, test;
    uint64_t *perm;
    uint64_t perm_count;
    uint64_t *perm_host; /* a streamed training set: the epoch's permutation, for fill's ids */
    uint64_t *fill_ids;  /* [max(accum * batch, max_eval_batch)] */
    td_gpu_args *args;      /* device */
    td_gpu_args *args_host; /* pinned, RING slots */
    double *stats_host;     /* pinned, RING x 3 */
    cudaEvent_t done[RING];
    int64_t ring_step[RING];
    cudaGraphExec_t graph[2]; /* [apply_optimizer] */
    /* CUDA IPC between the ranks of one host: every rank's gradient buffer, opened here */
    int ipc_world, ipc_rank;
    float *ipc_peer[TD_GPU_IPC_MAX_RANKS]; /* opened handles (NULL for this rank) */
    const float **ipc_src;                 /* device array [ipc_world]: the ranks' buffers */
    float *rgrads;                         /* the tree sum over ranks */
    size_t device_bytes;
    bool host_registered;
};

/* ---- device memory ---- */
static td_status dalloc(td_gpu_t *g, void **p, size_t nbytes) {
    *p = NULL;
    if (!nbytes) return TD_OK;
    cudaError_t e = cudaMalloc(p, nbytes);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return td_error(TD_ERR_NOMEM,
                        "CUDA device %d: cannot allocate %zu MiB (%s); %zu of %zu MiB are free. "
                        "Use a smaller --batch, or fewer workers on this GPU",
                        g->device, nbytes >> 20, cudaGetErrorString(e), free_b >> 20,
                        total_b >> 20);
    }
    g->device_bytes += nbytes;
    /* zeroed on the engine's stream and waited for: a memset on another stream could land after
     * the engine's first write to the buffer */
    if (cudaMemsetAsync(*p, 0, nbytes, g->stream) != cudaSuccess ||
        cudaStreamSynchronize(g->stream) != cudaSuccess)
        return td_error(TD_ERR_SYS, "CUDA: zeroing a new %zu-byte buffer failed", nbytes);
    return TD_OK;
}
#define DALLOC(g, ptr, nbytes) dalloc((g), (void **)&(ptr), (nbytes))

/* ---- availability ---- */
extern "C" bool td_gpu_available(char *why, size_t cap) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, cap, "no usable CUDA driver or device: %s", cudaGetErrorString(e));
        return false;
    }
    if (n == 0) {
        snprintf(why, cap, "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)");
        return false;
    }
    snprintf(why, cap, "%d CUDA device%s", n, n == 1 ? "" : "s");
    return true;
}

extern "C" int td_gpu_device_count(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

extern "C" const char *td_gpu_describe(const td_gpu_t *g) {
    return g->desc;
}

extern "C" size_t td_gpu_memory_bytes(const td_gpu_t *g) {
    return g->device_bytes;
}

/* ---- cuBLAS in row-major terms ----
 * C[m x n] = op(A) op(B) (+ beta C), row-major with row strides lda, ldb, ldc: column-major
 * cuBLAS computes C^T = op(B)^T op(A)^T on the same buffers. */
static td_status gemm(const td_gpu_t *g, cublasHandle_t h, bool ta, bool tb, int m, int n, int k,
                      const float *a, int lda, const float *b, int ldb, float beta, float *c,
                      int ldc) {
    const float one = 1.0f;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (g->cfg.precision == TD_PRECISION_FP32) {
        BLAS_CHECK(cublasSgemm(h, opb, opa, n, m, k, &one, b, ldb, a, lda, &beta, c, ldc));
        return TD_OK;
    }
    /* fp32 in memory, tensor-core products on TF32 or bf16 inputs, fp32 accumulation */
    cublasComputeType_t compute = g->cfg.precision == TD_PRECISION_TF32
                                      ? CUBLAS_COMPUTE_32F_FAST_TF32
                                      : CUBLAS_COMPUTE_32F_FAST_16BF;
    BLAS_CHECK(cublasGemmEx(h, opb, opa, n, m, k, &one, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda,
                            &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
    return TD_OK;
}

/* The same on typed operands (bf16 conv operands; C fp32 or bf16), fp32 accumulation. */
static td_status gemm_ex(cublasHandle_t h, bool ta, bool tb, int m, int n, int k, const void *a,
                         int lda, const void *b, int ldb, void *c, cudaDataType_t ctype, int ldc) {
    const float one = 1.0f, zero = 0.0f;
    BLAS_CHECK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                            k, &one, b, CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda, &zero, c, ctype, ldc,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return TD_OK;
}

/* out[n] = sum over the rows of a [rows x n] (row-major): a^T ones, one cuBLAS gemv in its
 * fixed order (no atomics). */
static td_status colsum(td_gpu_t *g, cublasHandle_t h, const float *a, int rows, int n,
                        float *out) {
    const float one = 1.0f, zero = 0.0f;
    BLAS_CHECK(cublasSgemv(h, CUBLAS_OP_N, n, rows, &one, a, n, g->ones, 1, &zero, out, 1));
    return TD_OK;
}

/* out[r] = sum of a [rows x cols] (row-major) row r: a ones, one cuBLAS gemv. */
static td_status rowsum_gemv(td_gpu_t *g, cublasHandle_t h, const float *a, int rows, int cols,
                             float *out) {
    const float one = 1.0f, zero = 0.0f;
    BLAS_CHECK(cublasSgemv(h, CUBLAS_OP_T, cols, rows, &one, a, cols, g->ones, 1, &zero, out, 1));
    return TD_OK;
}

/* ---- building the mirror ---- */
static td_status pick_device(const td_gpu_config *cfg, int *out) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return td_error(TD_ERR_UNSUPPORTED,
                        "--device cuda: no CUDA device can be used here (%s); train with "
                        "--device cpu, or run on a machine with an NVIDIA GPU and driver",
                        e != cudaSuccess ? cudaGetErrorString(e) : "0 devices visible");
    int d = cfg->device;
    if (d < 0) {
        const char *lr = getenv("LOCAL_RANK");
        d = lr ? atoi(lr) : 0;
        d = (d % n + n) % n; /* several workers may share one GPU */
    } else if (d >= n) {
        return td_error(TD_ERR_INVALID, "CUDA device %d does not exist: %d device%s visible", d, n,
                        n == 1 ? " is" : "s are");
    }
    *out = d;
    return TD_OK;
}

static td_status build_layers(td_gpu_t *g) {
    td_model_t *m = g->model;
    g->nl = td_model_num_layers(m);
    g->layers = (glayer *)td_xcalloc((size_t)g->nl, sizeof(glayer));
    int B = g->max_batch, ndrop = 0;
    g->chain = true;
    for (int i = 0; i < g->nl; i++)
        if (td_model_layer(m, i).kind == TD_LAYER_RESIDUAL) g->chain = false;
    bool *up = (bool *)td_xcalloc((size_t)g->nl + 1, sizeof(bool)); /* parameters upstream */
    size_t gmax = 0;
    for (int i = 0; i < g->nl; i++) {
        glayer *l = &g->layers[i];
        l->info = td_model_layer(m, i);
        const td_layer_info *f = &l->info;
        l->in_size = (size_t)f->in_c * f->in_h * f->in_w;
        l->out_size = (size_t)f->out_c * f->out_h * f->out_w;
        l->need_din = up[f->input_from];
        up[i + 1] = up[f->input_from] || f->param_count > 0;
        if (f->kind == TD_LAYER_RESIDUAL) {
            l->need_din2 = up[f->input2_from];
            up[i + 1] = up[i + 1] || up[f->input2_from];
            if (l->need_din2) TD_CHECK(DALLOC(g, l->din2, (size_t)B * l->out_size * 4));
        }
        gmax = TD_MAX(gmax, l->in_size);
        bool next_relu =
            g->chain && i + 1 < g->nl && td_model_layer(m, i + 1).kind == TD_LAYER_RELU;
        if ((f->kind == TD_LAYER_CONV2D || f->kind == TD_LAYER_LINEAR) && next_relu) {
            l->relu_next = true;
            g->layers[i + 1].fused = true; /* set before layer i+1 is visited; kept below */
        }
        if (f->kind != TD_LAYER_FLATTEN) TD_CHECK(DALLOC(g, l->out, (size_t)B * l->out_size * 4));
        if (f->kind == TD_LAYER_MAXPOOL2D || f->kind == TD_LAYER_DROPOUT)
            TD_CHECK(DALLOC(g, l->aux, (size_t)B * l->out_size));
        if (f->kind == TD_LAYER_LAYERNORM) TD_CHECK(DALLOC(g, l->stats, (size_t)B * 2 * 4));
        if (f->kind == TD_LAYER_BATCHNORM) {
            TD_CHECK(DALLOC(g, l->stats, (size_t)f->in_c * 2 * 4));
            TD_CHECK(DALLOC(g, l->red, (size_t)f->in_c * 2 * 4));
            TD_CHECK(DALLOC(g, l->part, td_gpu_batchnorm_part_doubles(B, f->in_c) * 8));
        }
        if (f->kind == TD_LAYER_DROPOUT) {
            if (ndrop == TD_GPU_MAX_DROPOUT)
                return td_error(TD_ERR_UNSUPPORTED,
                                "layer %d (%s): the CUDA engine supports at most %d dropout layers",
                                i, f->name, TD_GPU_MAX_DROPOUT);
            l->dropout_idx = ndrop++;
        }
        if (f->kind == TD_LAYER_CONV2D) {
            size_t kk = (size_t)f->in_c * f->kernel * f->kernel, n = (size_t)f->out_h * f->out_w;
            /* cuBLAS takes int dimensions: batch * out_h * out_w is the gemm's n */
            if (kk > 65535 || (size_t)B * n > INT32_MAX)
                return td_error(TD_ERR_UNSUPPORTED,
                                "layer %d (%s): the CUDA conv supports in_c*k*k <= 65535 and "
                                "batch * out_h * out_w < 2^31 (have %zu and %zu); use a smaller "
                                "--batch and --accum for the same global batch",
                                i, f->name, kk, (size_t)B * n);
            size_t elem = g->bf16 ? 2 : 4;
            TD_CHECK(DALLOC(g, l->col, (size_t)B * kk * n * elem));
            TD_CHECK(DALLOC(g, l->cn, (size_t)B * f->out_c * n * 4));
            if (l->need_din) TD_CHECK(DALLOC(g, l->dcol, (size_t)B * kk * n * elem));
            if (g->bf16) {
                TD_CHECK(DALLOC(g, l->cn16, (size_t)B * f->out_c * n * 2));
                TD_CHECK(DALLOC(g, l->w16, (size_t)f->weight_count * 2));
            }
        }
        if (g->chain && f->kind == TD_LAYER_RELU && i + 1 < g->nl &&
            td_model_layer(m, i + 1).kind == TD_LAYER_MAXPOOL2D && i > 0) {
            l->into_pool = true; /* the pool's gradient gate is this relu's backward */
            g->layers[i + 1].gate = true;
        }
        /* a conv after a relu, with parameters before both: the conv's col2im writes the
         * relu's input gradient (one pass over it instead of two) */
        if (g->chain && f->kind == TD_LAYER_RELU && i + 1 < g->nl &&
            td_model_layer(m, i + 1).kind == TD_LAYER_CONV2D && l->need_din) {
            l->into_conv = true;
            g->layers[i + 1].gate_din = true;
        }
    }
    /* conv -> relu -> 2x2 pool: the pool's backward writes the conv's dy in the conv's gemm
     * layout (and its bf16 copy) directly, one pass instead of two */
    for (int i = 2; i < g->nl; i++) {
        glayer *p = &g->layers[i], *c = &g->layers[i - 2];
        const td_layer_info *f = &p->info;
        if (f->kind == TD_LAYER_MAXPOOL2D && p->gate && c->info.kind == TD_LAYER_CONV2D &&
            c->relu_next &&
            td_gpu_maxpool_backward_tiles(f->in_h, f->in_w, f->kernel, f->stride, f->out_h,
                                          f->out_w)) {
            p->din_conv = c;
            c->dy_in_cn = true;
        }
    }
    free(up);
    /* input gradients: where parameters lie upstream (flatten and a residual's first input pass
     * their dy on) */
    for (int i = 0; i < g->nl; i++) {
        glayer *l = &g->layers[i];
        td_layer_kind k = l->info.kind;
        if (l->need_din && k != TD_LAYER_FLATTEN && k != TD_LAYER_RESIDUAL)
            TD_CHECK(DALLOC(g, l->din, (size_t)B * l->in_size * 4));
    }
    g->acts = (const float **)td_xcalloc((size_t)g->nl + 1, sizeof(float *));
    g->dacts = (float **)td_xcalloc((size_t)g->nl + 1, sizeof(float *));
    if (!g->chain) TD_CHECK(DALLOC(g, g->gtmp, (size_t)B * gmax * 4));
    g->nbuf = td_model_num_buffers(m);
    if (g->nbuf) {
        TD_CHECK(DALLOC(g, g->buffers, g->nbuf * 4));
        TD_CHECK(DALLOC(g, g->bn_dev, (size_t)g->cfg.accum * g->nbuf * 4));
        CU_CHECK(cudaMallocHost((void **)&g->bn_host,
                                (RING + 1) * (size_t)g->cfg.accum * g->nbuf * sizeof(float)));
    }
    return TD_OK;
}

static td_status init(td_gpu_t *g, td_model_t *model, const td_optim_config *optim,
                      const td_gpu_config *cfg) {
    int dev = g->device;
    cudaDeviceProp prop;
    CU_CHECK(cudaGetDeviceProperties(&prop, dev));
    snprintf(g->desc, sizeof g->desc, "%s (device %d, sm_%d%d, %d SMs), %s gemms", prop.name, dev,
             prop.major, prop.minor, prop.multiProcessorCount, td_precision_name(cfg->precision));
    if (cfg->precision != TD_PRECISION_FP32 && prop.major < 8)
        return td_error(TD_ERR_UNSUPPORTED,
                        "--precision %s needs the tensor cores of compute capability 8.0 (Ampere) "
                        "or newer; %s is sm_%d%d: use --precision fp32",
                        td_precision_name(cfg->precision), prop.name, prop.major, prop.minor);
    /* A blocking stream: the synchronous cudaMemcpy calls of uploads and downloads (legacy
     * default stream) are ordered with it, so no copy can overtake the kernels or vice versa. */
    CU_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamDefault));
    BLAS_CHECK(cublasCreate(&g->blas));
    BLAS_CHECK(cublasSetStream(g->blas, g->stream));
    /* The default math mode: TF32 and bf16 products only where gemm() asks for them by compute
     * type (td_precision), never behind fp32's back; and a fixed workspace so that graph capture
     * never allocates */
    BLAS_CHECK(cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH));
    TD_CHECK(DALLOC(g, g->blas_ws, 32u << 20));
    BLAS_CHECK(cublasSetWorkspace(g->blas, g->blas_ws, 32u << 20));
    CU_CHECK(cudaStreamCreateWithFlags(&g->side, cudaStreamDefault));
    BLAS_CHECK(cublasCreate(&g->blas_side));
    BLAS_CHECK(cublasSetStream(g->blas_side, g->side));
    BLAS_CHECK(cublasSetMathMode(g->blas_side, CUBLAS_DEFAULT_MATH));
    TD_CHECK(DALLOC(g, g->blas_side_ws, 32u << 20));
    BLAS_CHECK(cublasSetWorkspace(g->blas_side, g->blas_side_ws, 32u << 20));
    g->fork = (cudaEvent_t *)td_xcalloc((size_t)td_model_num_layers(model), sizeof(cudaEvent_t));
    for (int i = 0; i < td_model_num_layers(model); i++)
        CU_CHECK(cudaEventCreateWithFlags(&g->fork[i], cudaEventDisableTiming));
    CU_CHECK(cudaEventCreateWithFlags(&g->join, cudaEventDisableTiming));
    int nl = td_model_num_layers(model);
    bool nll = nl > 0 && td_model_layer(model, nl - 1).kind == TD_LAYER_LOG_SOFTMAX;
    g->loss = cfg->loss == TD_LOSS_MSE   ? TD_GPU_LOSS_MSE
              : cfg->loss == TD_LOSS_BCE ? TD_GPU_LOSS_BCE
              : nll                      ? TD_GPU_LOSS_NLL
                                         : TD_GPU_LOSS_CE;
    TD_CHECK(build_layers(g));
    size_t P = g->num_params, B = (size_t)g->max_batch, M = (size_t)cfg->accum;
    TD_CHECK(DALLOC(g, g->params, P * 4));
    TD_CHECK(DALLOC(g, g->grads, P * 4));
    g->state_count = optim->kind == TD_OPTIM_ADAMW ? 2 * P : optim->momentum != 0 ? P : 0;
    TD_CHECK(DALLOC(g, g->state, g->state_count * 4));
    g->slot_grads = (float **)td_xcalloc(M, sizeof(float *));
    for (size_t j = 0; j + 1 < M; j++) TD_CHECK(DALLOC(g, g->slot_grads[j], P * 4));
    g->slot_grads[M - 1] = g->grads;
    TD_CHECK(DALLOC(g, g->x, M * B * (size_t)g->in_size * 4));
    TD_CHECK(DALLOC(g, g->y, M * B * 4));
    if (g->loss == TD_GPU_LOSS_MSE || g->loss == TD_GPU_LOSS_BCE)
        TD_CHECK(DALLOC(g, g->t, M * B * (size_t)g->classes * 4));
    TD_CHECK(DALLOC(g, g->ids, M * B * 8));
    TD_CHECK(DALLOC(g, g->dout, B * (size_t)g->classes * 4));
    TD_CHECK(DALLOC(g, g->row_loss, M * B * 8));
    TD_CHECK(DALLOC(g, g->row_correct, M * B * 8));
    TD_CHECK(DALLOC(g, g->stats, 3 * 8));
    TD_CHECK(DALLOC(g, g->evsums, 3 * 8));
    TD_CHECK(DALLOC(g, g->ones, B * 4));
    {
        float *ones = (float *)td_xmalloc(B * 4);
        for (size_t i = 0; i < B; i++) ones[i] = 1.0f;
        cudaError_t e = cudaMemcpy(g->ones, ones, B * 4, cudaMemcpyHostToDevice);
        free(ones);
        CU_CHECK(e);
    }
    size_t channels = 1;
    for (int i = 0; i < g->nl; i++)
        if (g->layers[i].info.kind == TD_LAYER_CONV2D)
            channels = TD_MAX(channels, (size_t)g->layers[i].info.out_c);
    TD_CHECK(DALLOC(g, g->rowsum, B * channels * 4));
    TD_CHECK(DALLOC(g, g->args, sizeof(td_gpu_args)));
    CU_CHECK(cudaMallocHost((void **)&g->args_host, (RING + 1) * sizeof(td_gpu_args)));
    CU_CHECK(cudaMallocHost((void **)&g->stats_host, (RING + 1) * 3 * sizeof(double)));
    for (int r = 0; r < RING; r++)
        CU_CHECK(cudaEventCreateWithFlags(&g->done[r], cudaEventDisableTiming));
    /* the host mirror's buffers are the staging area: page-locked, copies run at full speed */
    if (cudaHostRegister(td_model_params(model), P * 4, cudaHostRegisterDefault) == cudaSuccess &&
        cudaHostRegister(td_model_grads(model), P * 4, cudaHostRegisterDefault) == cudaSuccess)
        g->host_registered = true;
    else
        cudaGetLastError(); /* pageable copies still work */
    return TD_OK;
}

extern "C" td_status td_gpu_new(td_model_t *model, const td_optim_config *optim,
                                const td_gpu_config *cfg, td_gpu_t **out) {
    *out = NULL;
    if (cfg->batch < 1 || cfg->accum < 1)
        return td_error(TD_ERR_INVALID, "CUDA engine: batch %d and accum %d must be >= 1",
                        cfg->batch, cfg->accum);
    TD_CHECK(td_optim_validate(optim));
    int dev = 0;
    TD_CHECK(pick_device(cfg, &dev));
    CU_CHECK(cudaSetDevice(dev));
    td_gpu_t *g = (td_gpu_t *)td_xcalloc(1, sizeof *g);
    g->model = model;
    g->optim = *optim;
    g->cfg = *cfg;
    g->device = dev;
    g->num_params = td_model_num_params(model);
    g->classes = td_model_output_size(model);
    g->in_size = td_model_input_size(model);
    g->max_batch = TD_MAX(cfg->batch, TD_MAX(cfg->max_eval_batch, 1));
    g->bf16 = cfg->precision == TD_PRECISION_BF16;
    for (int r = 0; r < RING; r++) g->ring_step[r] = -1;
    td_status rc = init(g, model, optim, cfg);
    if (rc != TD_OK) {
        td_gpu_free(g);
        return rc;
    }
    *out = g;
    return TD_OK;
}

/* A data set's device buffers (a resident set's, or a streamed one's window and staging). */
static void free_data(gdata *gd) {
    if (gd->stream) {
        cudaFree(gd->window);
        if (gd->host) cudaFreeHost(gd->host);
    } else {
        cudaFree((void *)gd->src.values), cudaFree((void *)gd->src.labels);
        cudaFree((void *)gd->src.targets);
    }
    cudaFree(gd->norm);
    memset(gd, 0, sizeof *gd);
}

extern "C" void td_gpu_free(td_gpu_t *g) {
    if (!g) return;
    cudaSetDevice(g->device);
    if (g->stream) cudaStreamSynchronize(g->stream);
    if (g->side) cudaStreamSynchronize(g->side);
    for (int i = 0; i < 2; i++)
        if (g->graph[i]) cudaGraphExecDestroy(g->graph[i]);
    if (g->layers)
        for (int i = 0; i < g->nl; i++) {
            glayer *l = &g->layers[i];
            cudaFree(l->out), cudaFree(l->din), cudaFree(l->aux), cudaFree(l->col);
            cudaFree(l->cn), cudaFree(l->dcol), cudaFree(l->cn16), cudaFree(l->w16);
            cudaFree(l->stats), cudaFree(l->din2), cudaFree(l->red), cudaFree(l->part);
        }
    free(g->layers);
    free(g->acts), free(g->dacts);
    cudaFree(g->gtmp), cudaFree(g->buffers), cudaFree(g->bn_dev);
    if (g->bn_host) cudaFreeHost(g->bn_host);
    if (g->slot_grads)
        for (int j = 0; j + 1 < g->cfg.accum; j++) cudaFree(g->slot_grads[j]);
    free(g->slot_grads);
    void *bufs[] = {g->params, g->grads,    g->state,       g->x,     g->y,      g->t,
                    g->ids,    g->dout,     g->row_loss,    g->row_correct, g->stats, g->evsums,
                    g->ones,   g->rowsum,   g->perm,        g->args,  g->blas_ws};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cudaFree(bufs[i]);
    free_data(&g->train), free_data(&g->test);
    free(g->perm_host), free(g->fill_ids);
    cudaFreeHost(g->args_host);
    cudaFreeHost(g->stats_host);
    for (int r = 0; r < RING; r++)
        if (g->done[r]) cudaEventDestroy(g->done[r]);
    if (g->host_registered) {
        cudaHostUnregister(td_model_params(g->model));
        cudaHostUnregister(td_model_grads(g->model));
    }
    for (int r = 0; r < TD_GPU_IPC_MAX_RANKS; r++)
        if (g->ipc_peer[r]) cudaIpcCloseMemHandle(g->ipc_peer[r]);
    cudaFree(g->ipc_src), cudaFree(g->rgrads);
    if (g->fork)
        for (int i = 0; i < td_model_num_layers(g->model); i++)
            if (g->fork[i]) cudaEventDestroy(g->fork[i]);
    free(g->fork);
    if (g->join) cudaEventDestroy(g->join);
    cudaFree(g->blas_side_ws);
    if (g->blas_side) cublasDestroy(g->blas_side);
    if (g->side) cudaStreamDestroy(g->side);
    if (g->blas) cublasDestroy(g->blas);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g);
}

/* ---- data ---- */

extern "C" size_t td_gpu_free_memory(td_gpu_t *g) {
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(g->device) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        return 0;
    return free_b;
}

/* A streamed set's window on the device and its pinned staging: rows samples (values, then
 * labels or targets from labels_off), `copies` staging copies. */
static td_status stream_setup(td_gpu_t *g, gdata *gd, const td_gpu_dataset *d, bool real,
                              int rows, int copies) {
    gd->stream = true;
    gd->fill = d->fill, gd->fill_user = d->fill_user;
    gd->rec_bytes = (size_t)d->sample_size * (d->u8 ? 1 : 4);
    gd->labels_off = ((size_t)rows * gd->rec_bytes + 15) & ~(size_t)15;
    gd->window_bytes = gd->labels_off + (size_t)rows * (real ? (size_t)d->target_dim * 4 : 4);
    TD_CHECK(DALLOC(g, gd->window, gd->window_bytes));
    CU_CHECK(cudaMallocHost(&gd->host, (size_t)copies * gd->window_bytes));
    gd->src.values = gd->window;
    if (real)
        gd->src.targets = (const float *)((char *)gd->window + gd->labels_off);
    else
        gd->src.labels = (const int32_t *)((char *)gd->window + gd->labels_off);
    gd->src.window = true;
    return TD_OK;
}

/* Fills staging copy `copy` of a streamed set from fill: n samples ids at window record `at`. */
static td_status stream_fill(gdata *gd, int copy, int at, const uint64_t *ids, int n) {
    if (n <= 0) return TD_OK;
    char *h = (char *)gd->host + (size_t)copy * gd->window_bytes;
    bool real = gd->src.targets != NULL;
    int k = gd->src.target_dim;
    return gd->fill(gd->fill_user, ids, n, h + (size_t)at * gd->rec_bytes,
                    real ? NULL : (int32_t *)(h + gd->labels_off) + at,
                    real ? (float *)(h + gd->labels_off) + (size_t)at * k : NULL);
}

extern "C" td_status td_gpu_set_dataset(td_gpu_t *g, int which, const td_gpu_dataset *d) {
    if (d->sample_size != g->in_size)
        return td_error(TD_ERR_INVALID,
                        "data set samples have %d values but the model takes %d inputs",
                        d->sample_size, g->in_size);
    if (d->channels < 1 || d->sample_size % d->channels)
        return td_error(TD_ERR_INVALID, "data set: %d channels do not divide %d values a sample",
                        d->channels, d->sample_size);
    bool streamed = d->values == NULL;
    if (streamed && !d->fill)
        return td_error(TD_ERR_INVALID, "CUDA engine: a data set needs values or a fill function");
    CU_CHECK(cudaSetDevice(g->device));
    CU_CHECK(cudaStreamSynchronize(g->stream));
    gdata *gd = which ? &g->test : &g->train;
    bool real = g->loss == TD_GPU_LOSS_MSE || g->loss == TD_GPU_LOSS_BCE;
    bool has_targets = streamed ? d->target_dim > 0 : d->targets != NULL;
    bool fits = real ? has_targets && d->target_dim == g->classes
                     : !has_targets && (streamed || d->labels);
    if (!fits) {
        char has[64] = "class labels";
        if (has_targets) snprintf(has, sizeof has, "%d real targets a sample", d->target_dim);
        return td_error(TD_ERR_INVALID,
                        "CUDA engine: the %s set has %s, but the loss (%s) needs %s",
                        which ? "held-out" : "training", has,
                        real ? "mse or bce" : "cross-entropy",
                        real ? "one real target per model output" : "class labels");
    }
    free_data(gd);
    size_t nnorm = (size_t)d->channels * (d->u8 ? 256 : 2);
    gd->src.target_dim = real ? d->target_dim : 0;
    if (streamed) {
        int rows = which ? TD_MAX(g->cfg.max_eval_batch, 1) : g->cfg.accum * g->cfg.batch;
        TD_CHECK(stream_setup(g, gd, d, real, rows, which ? 1 : RING));
        gd->src.window_slot0 = g->cfg.rank * g->cfg.accum;
        TD_CHECK(DALLOC(g, gd->norm, nnorm * 4));
    } else {
        size_t bytes = d->count * (size_t)d->sample_size * (d->u8 ? 1 : 4);
        size_t free_b = 0, total_b = 0;
        CU_CHECK(cudaMemGetInfo(&free_b, &total_b));
        size_t tbytes = real ? d->count * (size_t)d->target_dim * 4 : d->count * 4;
        if (bytes + tbytes > free_b)
            return td_error(TD_ERR_NOMEM,
                            "the %s set (%llu samples, %zu MiB on the device) does not fit in CUDA "
                            "device %d's free memory (%zu of %zu MiB); stream it "
                            "(TANDEM_GPU_DATA=stream) or train it with --device cpu",
                            which ? "held-out" : "training", (unsigned long long)d->count,
                            bytes >> 20, g->device, free_b >> 20, total_b >> 20);
        void *values = NULL, *targets = NULL;
        td_status st = DALLOC(g, values, bytes);
        gd->src.values = values; /* owned from here on: td_gpu_free or the next upload frees it */
        if (st == TD_OK) st = DALLOC(g, targets, tbytes);
        if (real)
            gd->src.targets = (const float *)targets;
        else
            gd->src.labels = (const int32_t *)targets;
        if (st == TD_OK) st = DALLOC(g, gd->norm, nnorm * 4);
        TD_CHECK(st);
        CU_CHECK(cudaMemcpy(values, d->values, bytes, cudaMemcpyHostToDevice));
        CU_CHECK(cudaMemcpy(targets, real ? (const void *)d->targets : (const void *)d->labels,
                            tbytes, cudaMemcpyHostToDevice));
    }
    if (d->u8) {
        CU_CHECK(cudaMemcpy(gd->norm, d->lut, nnorm * 4, cudaMemcpyHostToDevice));
    } else {
        size_t c = (size_t)d->channels;
        CU_CHECK(cudaMemcpy(gd->norm, d->mean, c * 4, cudaMemcpyHostToDevice));
        CU_CHECK(cudaMemcpy(gd->norm + c, d->std, c * 4, cudaMemcpyHostToDevice));
    }
    gd->count = d->count;
    gd->src.u8 = d->u8;
    gd->src.lut = d->u8 ? gd->norm : NULL;
    gd->src.mean = d->u8 ? NULL : gd->norm;
    gd->src.std = d->u8 ? NULL : gd->norm + d->channels;
    gd->src.plane = d->sample_size / d->channels;
    if (streamed && !g->fill_ids)
        g->fill_ids = (uint64_t *)td_xmalloc(
            (size_t)TD_MAX(g->cfg.accum * g->cfg.batch, TD_MAX(g->cfg.max_eval_batch, 1)) * 8);
    return TD_OK;
}

extern "C" td_status td_gpu_set_epoch(td_gpu_t *g, const uint64_t *perm, uint64_t count) {
    if (!g->perm || g->perm_count != count) {
        CU_CHECK(cudaStreamSynchronize(g->stream));
        cudaFree(g->perm);
        g->perm = NULL;
        TD_CHECK(DALLOC(g, g->perm, count * 8));
        g->perm_count = count;
    }
    /* stream-ordered: steps already enqueued read the previous epoch's order */
    CU_CHECK(cudaMemcpyAsync(g->perm, perm, count * 8, cudaMemcpyHostToDevice, g->stream));
    CU_CHECK(cudaStreamSynchronize(g->stream)); /* perm is pageable host memory, reused */
    if (g->train.stream) { /* the steps' fills name their samples from it on the host */
        g->perm_host = (uint64_t *)td_xrealloc(g->perm_host, count * 8);
        memcpy(g->perm_host, perm, count * 8);
    }
    return TD_OK;
}

/* ---- state ---- */
extern "C" td_status td_gpu_upload_state(td_gpu_t *g, const float *params, const float *optim_state,
                                         uint64_t optim_steps) {
    CU_CHECK(cudaStreamSynchronize(g->stream));
    CU_CHECK(cudaMemcpy(g->params, params, g->num_params * 4, cudaMemcpyHostToDevice));
    if (g->state_count && optim_state)
        CU_CHECK(cudaMemcpy(g->state, optim_state, g->state_count * 4, cudaMemcpyHostToDevice));
    else if (g->state_count)
        CU_CHECK(cudaMemset(g->state, 0, g->state_count * 4));
    g->optim_steps = optim_steps;
    return td_gpu_upload_buffers(g);
}

extern "C" td_status td_gpu_download_state(td_gpu_t *g, float *params, float *optim_state) {
    CU_CHECK(cudaStreamSynchronize(g->stream));
    if (params) CU_CHECK(cudaMemcpy(params, g->params, g->num_params * 4, cudaMemcpyDeviceToHost));
    if (optim_state && g->state_count)
        CU_CHECK(cudaMemcpy(optim_state, g->state, g->state_count * 4, cudaMemcpyDeviceToHost));
    return TD_OK;
}

/* ---- forward and backward over one batch ---- */

static int act_kind(td_layer_kind k) {
    return k == TD_LAYER_GELU ? TD_GPU_ACT_GELU : k == TD_LAYER_TANH ? TD_GPU_ACT_TANH
                                                                     : TD_GPU_ACT_SIGMOID;
}

/* x: [batch, in_size] on the device; ids: the batch's sample ids (dropout key); slot: the
 * training step's micro-batch slot (its rows that hold samples, for BatchNorm's statistics), or
 * -1 for all rows; bn_out: where the BatchNorm layers write this batch's statistics ([nbuf], in
 * the buffers' layout). Returns the output in *out; g->acts holds every layer's input for the
 * backward. */
static td_status forward(td_gpu_t *g, const float *x, const uint64_t *ids, int batch, int slot,
                         float *bn_out, const float **out) {
    cudaStream_t s = g->stream;
    const float **acts = g->acts;
    const float *params = g->params;
    acts[0] = x;
    for (int i = 0; i < g->nl; i++) {
        glayer *l = &g->layers[i];
        const td_layer_info *f = &l->info;
        const float *in = acts[f->input_from];
        const float *w = params + f->param_offset, *bias = w + f->weight_count;
        size_t n_out = (size_t)batch * l->out_size;
        switch (f->kind) {
        case TD_LAYER_LINEAR: {
            /* y [B, out] = x [B, in] W^T, then bias (and the folded ReLU) */
            TD_CHECK(gemm(g, g->blas, false, true, batch, f->out_c, f->in_c, in, f->in_c, w,
                          f->in_c, 0.0f, l->out, f->out_c));
            float *dst = l->relu_next ? g->layers[i + 1].out : l->out;
            td_gpu_bias_act(s, l->out, bias, batch, f->out_c, 1, l->relu_next, dst);
            LAUNCHED(f->name);
            break;
        }
        case TD_LAYER_CONV2D: {
            int k = f->kernel, kk = f->in_c * k * k, n = f->out_h * f->out_w;
            /* the whole batch: y [out_c, B*n] = W [out_c, kk] col [kk, B*n] */
            if (g->bf16) {
                td_gpu_to_bf16(s, w, f->weight_count, l->w16);
                td_gpu_im2col_bf16(s, in, batch, f->in_c, f->in_h, f->in_w, k, f->stride, f->pad,
                                   f->out_h, f->out_w, (__nv_bfloat16 *)l->col);
                LAUNCHED(f->name);
                TD_CHECK(gemm_ex(g->blas, false, false, f->out_c, batch * n, kk, l->w16, kk, l->col,
                                 batch * n, l->cn, CUDA_R_32F, batch * n));
            } else {
                td_gpu_im2col(s, in, batch, f->in_c, f->in_h, f->in_w, k, f->stride, f->pad,
                              f->out_h, f->out_w, (float *)l->col);
                LAUNCHED(f->name);
                TD_CHECK(gemm(g, g->blas, false, false, f->out_c, batch * n, kk, w, kk,
                              (const float *)l->col, batch * n, 0.0f, l->cn, batch * n));
            }
            float *dst = l->relu_next ? g->layers[i + 1].out : l->out;
            td_gpu_cn_bias_act(s, l->cn, bias, batch, f->out_c, n, l->relu_next, dst);
            LAUNCHED(f->name);
            break;
        }
        case TD_LAYER_RELU:
            if (!l->fused) td_gpu_relu(s, in, n_out, l->out);
            break;
        case TD_LAYER_MAXPOOL2D:
            td_gpu_maxpool(s, in, batch, f->in_c, f->in_h, f->in_w, f->kernel, f->stride, f->out_h,
                           f->out_w, l->out, l->aux);
            break;
        case TD_LAYER_DROPOUT:
            td_gpu_dropout(s, in, ids, g->args, l->dropout_idx, f->p, batch, l->out_size, l->out,
                           l->aux);
            break;
        case TD_LAYER_FLATTEN:
            break;
        case TD_LAYER_LOG_SOFTMAX:
            td_gpu_log_softmax(s, in, batch, (int)l->out_size, l->out);
            break;
        case TD_LAYER_GELU:
        case TD_LAYER_TANH:
        case TD_LAYER_SIGMOID:
            td_gpu_act(s, act_kind(f->kind), in, n_out, l->out);
            break;
        case TD_LAYER_AVGPOOL2D:
            td_gpu_avgpool(s, in, batch, f->in_c, f->in_h, f->in_w, f->kernel, f->stride, f->out_h,
                           f->out_w, l->out);
            break;
        case TD_LAYER_GLOBAL_AVGPOOL:
            td_gpu_global_avgpool(s, in, batch, f->in_c, f->in_h * f->in_w, l->out);
            break;
        case TD_LAYER_LAYERNORM:
            td_gpu_layernorm(s, in, w, bias, batch, (int)l->in_size, f->eps, l->out, l->stats);
            break;
        case TD_LAYER_BATCHNORM:
            td_gpu_batchnorm(s, in, w, bias, batch, slot, f->in_c, f->in_h * f->in_w, f->eps,
                             g->args, g->buffers + f->buffer_offset, l->part, l->stats,
                             bn_out + f->buffer_offset, l->out);
            break;
        case TD_LAYER_RESIDUAL:
            td_gpu_sum(s, in, acts[f->input2_from], n_out, l->out);
            break;
        }
        LAUNCHED(f->name);
        acts[i + 1] = f->kind == TD_LAYER_FLATTEN ? in : l->out;
    }
    *out = acts[g->nl];
    return TD_OK;
}

/* Gives the gradient dx of activation k (the input of a layer) to its buffer: the first
 * consumer's (the last layer reading k, as the backward goes) becomes it, the others' are added
 * to it in layer order, so the sum has the same bits on every launch. */
static void give_gradient(td_gpu_t *g, int k, float *dx, size_t n) {
    if (g->dacts[k])
        td_gpu_add(g->stream, dx, g->dacts[k], n);
    else
        g->dacts[k] = dx;
}

/* dout: [batch, classes]; writes the parameter gradient of this batch into grads (every
 * parametered layer's slice is overwritten, so no zeroing is needed); slot as forward's. */
static td_status backward(td_gpu_t *g, const float *dout, int batch, int slot, float *grads) {
    cudaStream_t s = g->stream;
    const float **acts = g->acts;
    for (int k = 0; k < g->nl; k++) g->dacts[k] = NULL;
    g->dacts[g->nl] = (float *)dout;
    for (int i = g->nl - 1; i >= 0; i--) {
        glayer *l = &g->layers[i];
        const td_layer_info *f = &l->info;
        const float *dy = g->dacts[i + 1];
        if (!dy || (!l->need_din && !l->need_din2 && !f->param_count))
            continue; /* no gradient flows here */
        const float *in = acts[f->input_from];
        const float *w = g->params + f->param_offset;
        float *gw = grads + f->param_offset, *gb = gw + f->weight_count;
        size_t n_in = (size_t)batch * l->in_size, n_out = (size_t)batch * l->out_size;
        /* this layer's input gradient: its own buffer, or scratch that is then added to the
         * buffer another consumer of the same activation wrote */
        float *dx = g->dacts[f->input_from] ? g->gtmp : l->din;
        switch (f->kind) {
        case TD_LAYER_LINEAR:
            /* side stream: dW [out, in] = dy^T [out, B] x [B, in], db = column sums;
             * this stream: dx [B, in] = dy W, and on to the layers before */
            CU_CHECK(cudaEventRecord(g->fork[i], s));
            CU_CHECK(cudaStreamWaitEvent(g->side, g->fork[i], 0));
            TD_CHECK(gemm(g, g->blas_side, true, false, f->out_c, f->in_c, batch, dy, f->out_c, in,
                          f->in_c, 0.0f, gw, f->in_c));
            TD_CHECK(colsum(g, g->blas_side, dy, batch, f->out_c, gb));
            if (l->need_din)
                TD_CHECK(gemm(g, g->blas, false, false, batch, f->in_c, f->out_c, dy, f->out_c, w,
                              f->in_c, 0.0f, dx, f->in_c));
            break;
        case TD_LAYER_CONV2D: {
            int k = f->kernel, kk = f->in_c * k * k, n = f->out_h * f->out_w, bn = batch * n;
            /* dy to the gemm's layout; side stream: dW [out_c, kk] = dy [out_c, B*n] col^T and
             * db = row sums; this stream: dcol [kk, B*n] = W^T dy, col2im into dx */
            if (!l->dy_in_cn) td_gpu_nchw_to_cn(s, dy, batch, f->out_c, n, l->cn, l->cn16);
            LAUNCHED(f->name);
            CU_CHECK(cudaEventRecord(g->fork[i], s));
            CU_CHECK(cudaStreamWaitEvent(g->side, g->fork[i], 0));
            if (g->bf16)
                TD_CHECK(gemm_ex(g->blas_side, false, true, f->out_c, kk, bn, l->cn16, bn, l->col,
                                 bn, gw, CUDA_R_32F, kk));
            else
                TD_CHECK(gemm(g, g->blas_side, false, true, f->out_c, kk, bn, l->cn, bn,
                              (const float *)l->col, bn, 0.0f, gw, kk));
            td_gpu_row_sums(g->side, l->cn, f->out_c * batch, n, g->rowsum);
            LAUNCHED(f->name);
            TD_CHECK(rowsum_gemv(g, g->blas_side, g->rowsum, f->out_c, batch, gb));
            const float *gate = l->gate_din ? in : NULL; /* the relu before it */
            if (l->need_din && g->bf16) {
                TD_CHECK(gemm_ex(g->blas, true, false, kk, bn, f->out_c, l->w16, kk, l->cn16, bn,
                                 l->dcol, CUDA_R_16BF, bn));
                td_gpu_col2im_bf16(s, (const __nv_bfloat16 *)l->dcol, batch, f->in_c, f->in_h,
                                   f->in_w, k, f->stride, f->pad, f->out_h, f->out_w, gate, dx);
            } else if (l->need_din) {
                TD_CHECK(gemm(g, g->blas, true, false, kk, bn, f->out_c, w, kk, l->cn, bn, 0.0f,
                              (float *)l->dcol, bn));
                td_gpu_col2im(s, (const float *)l->dcol, batch, f->in_c, f->in_h, f->in_w, k,
                              f->stride, f->pad, f->out_h, f->out_w, gate, dx);
            }
            break;
        }
        case TD_LAYER_RELU:
            if (l->into_pool || l->into_conv)
                dx = (float *)dy; /* the pool or conv after it gated the gradient already */
            else
                td_gpu_relu_backward(s, acts[i + 1], dy, n_out, dx);
            break;
        case TD_LAYER_MAXPOOL2D:
            if (l->din_conv) { /* into the conv's dy, two layers back (the relu passes it on) */
                td_gpu_maxpool_backward_cn(s, dy, l->aux, in, l->gate, batch, f->in_c, f->out_h,
                                           f->out_w, l->din_conv->cn, l->din_conv->cn16);
                dx = l->din_conv->cn;
                break;
            }
            td_gpu_maxpool_backward(s, dy, l->aux, in, l->gate, batch, f->in_c, f->in_h, f->in_w,
                                    f->kernel, f->stride, f->out_h, f->out_w, dx);
            break;
        case TD_LAYER_DROPOUT:
            td_gpu_dropout_backward(s, dy, l->aux, g->args, f->p, n_out, dx);
            break;
        case TD_LAYER_FLATTEN:
            dx = (float *)dy; /* same bytes, new shape */
            break;
        case TD_LAYER_LOG_SOFTMAX:
            td_gpu_log_softmax_backward(s, l->out, dy, batch, (int)l->out_size, dx);
            break;
        case TD_LAYER_GELU:
        case TD_LAYER_TANH:
        case TD_LAYER_SIGMOID:
            td_gpu_act_backward(s, act_kind(f->kind), in, l->out, dy, n_out, dx);
            break;
        case TD_LAYER_AVGPOOL2D:
            td_gpu_avgpool_backward(s, dy, batch, f->in_c, f->in_h, f->in_w, f->kernel, f->stride,
                                    f->out_h, f->out_w, dx);
            break;
        case TD_LAYER_GLOBAL_AVGPOOL:
            td_gpu_global_avgpool_backward(s, dy, batch, f->in_c, f->in_h * f->in_w, dx);
            break;
        case TD_LAYER_LAYERNORM:
            /* side stream: dw, db; this stream: dx */
            CU_CHECK(cudaEventRecord(g->fork[i], s));
            CU_CHECK(cudaStreamWaitEvent(g->side, g->fork[i], 0));
            td_gpu_layernorm_backward(s, g->side, in, dy, w, l->stats, batch, (int)l->in_size,
                                      l->need_din ? dx : NULL, gw, gb);
            break;
        case TD_LAYER_BATCHNORM:
            td_gpu_batchnorm_backward(s, in, dy, w, l->stats, batch, slot, f->in_c,
                                      f->in_h * f->in_w, g->args, l->part, l->red,
                                      l->need_din ? dx : NULL, gw, gb);
            break;
        case TD_LAYER_RESIDUAL:
            /* both inputs get dy: the second a copy (its branch's layers write their own
             * buffers, but another consumer may add to it), the first dy itself */
            if (l->need_din2) {
                if (g->dacts[f->input2_from]) {
                    td_gpu_add(s, dy, g->dacts[f->input2_from], n_out);
                } else {
                    CU_CHECK(cudaMemcpyAsync(l->din2, dy, n_out * 4, cudaMemcpyDeviceToDevice, s));
                    g->dacts[f->input2_from] = l->din2;
                }
            }
            dx = (float *)dy;
            break;
        }
        LAUNCHED(f->name);
        if (l->need_din) give_gradient(g, f->input_from, dx, n_in);
        LAUNCHED(f->name);
    }
    /* the side stream's weight gradients join before anything reads them or reuses a buffer */
    CU_CHECK(cudaEventRecord(g->join, g->side));
    CU_CHECK(cudaStreamWaitEvent(s, g->join, 0));
    return TD_OK;
}

/* ---- the step ---- */
static td_status optimizer(td_gpu_t *g, const float *grads) {
    if (g->optim.kind == TD_OPTIM_ADAMW)
        td_gpu_adamw(g->stream, g->params, grads, g->state, g->state + g->num_params, g->num_params,
                     g->args);
    else
        td_gpu_sgd(g->stream, g->params, grads, g->state_count ? g->state : NULL, g->num_params,
                   g->args);
    LAUNCHED("optimizer");
    return TD_OK;
}

/* The pairwise tree of train.h over the slots' gradients, as the CPU's binary-counter stack
 * does it: a finished slot merges with complete blocks of equal size, and the last slot folds
 * in the remaining blocks from the smallest up. The sum ends in grads (the last slot's buffer). */
static void fold_slots(td_gpu_t *g) {
    int M = g->cfg.accum;
    if (M == 1) return;
    int level[32];
    bool occupied[32] = {false};
    for (int j = 0; j + 1 < M; j++) {
        int v = j, k = 0;
        while (occupied[k]) {
            td_gpu_add(g->stream, g->slot_grads[level[k]], g->slot_grads[v], g->num_params);
            occupied[k] = false;
            k++;
        }
        level[k] = v;
        occupied[k] = true;
    }
    for (int k = 0; k < 32; k++)
        if (occupied[k]) td_gpu_add(g->stream, g->slot_grads[level[k]], g->grads, g->num_params);
}

static td_status enqueue_step(td_gpu_t *g, bool apply) {
    if (!g->train.src.values || !g->perm)
        return td_error(TD_ERR_INVALID, "CUDA engine: set the training set and epoch first");
    int B = g->cfg.batch, M = g->cfg.accum, C = g->classes;
    TD_LOG_DEBUG("CUDA step: rank %d enqueues micro-batch slots %d..%d of %d rows each",
                 g->cfg.rank, g->cfg.rank * M, g->cfg.rank * M + M - 1, B);
    for (int j = 0; j < M; j++) {
        int slot = g->cfg.rank * M + j;
        float *x = g->x + (size_t)j * B * g->in_size;
        int32_t *y = g->y + (size_t)j * B;
        float *t = g->t ? g->t + (size_t)j * B * C : NULL;
        uint64_t *ids = g->ids + (size_t)j * B;
        td_gpu_gather_step(g->stream, &g->train.src, g->perm, g->args, slot, B, g->in_size, x, y,
                           t, ids);
        LAUNCHED("gather");
        const float *out;
        TD_CHECK(forward(g, x, ids, B, slot, g->bn_dev + (size_t)j * g->nbuf, &out));
        td_gpu_loss(g->stream, g->loss, out, y, t, B, C, g->args, slot, 0, 0.0f, g->dout,
                    g->row_loss + (size_t)j * B, g->row_correct + (size_t)j * B);
        LAUNCHED("loss");
        TD_CHECK(backward(g, g->dout, B, slot, g->slot_grads[j]));
    }
    fold_slots(g);
    td_gpu_stats_kernel(g->stream, g->row_loss, g->row_correct, g->args, g->cfg.rank * M, M, B,
                        g->stats);
    LAUNCHED("step statistics");
    if (apply) TD_CHECK(optimizer(g, g->grads));
    return TD_OK;
}

static td_status capture(td_gpu_t *g, bool apply) {
    cudaGraph_t graph;
    CU_CHECK(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
    td_status st = enqueue_step(g, apply);
    cudaError_t e = cudaStreamEndCapture(g->stream, &graph);
    if (st != TD_OK) {
        if (e == cudaSuccess) cudaGraphDestroy(graph);
        return st;
    }
    if (e != cudaSuccess)
        return td_error(TD_ERR_SYS, "CUDA: capturing the training step failed: %s",
                        cudaGetErrorString(e));
    e = cudaGraphInstantiate(&g->graph[apply], graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess)
        return td_error(TD_ERR_SYS, "CUDA: instantiating the training step's graph failed: %s",
                        cudaGetErrorString(e));
    return TD_OK;
}

static void fill_args(td_gpu_t *g, td_gpu_args *a, int64_t step, bool training) {
    memset(a, 0, sizeof *a);
    a->step = step;
    a->training = training;
    for (int i = 0; i < g->nl; i++)
        if (g->layers[i].info.kind == TD_LAYER_DROPOUT)
            a->dropout_key[g->layers[i].dropout_idx] =
                td_dropout_key(g->cfg.seed, (uint64_t)step, i);
    a->coefs = td_optim_coefs_at(&g->optim, g->optim_steps);
}

/* A streamed training set: this rank's slots' samples of the step (the permutation's positions
 * base + slot * B + row, as the gather reads them) into ring slot r's staging, then to the
 * device window, in stream order behind the steps already enqueued. */
static td_status stream_step(td_gpu_t *g, int r, const td_gpu_step_args *sa) {
    gdata *gd = &g->train;
    int B = g->cfg.batch, M = g->cfg.accum;
    for (int j = 0; j < M; j++) {
        int64_t first = (int64_t)(g->cfg.rank * M + j) * B;
        int rows = (int)TD_MAX((int64_t)0, TD_MIN((int64_t)B, sa->n - first));
        for (int i = 0; i < rows; i++) g->fill_ids[i] = g->perm_host[sa->base + first + i];
        TD_CHECK(stream_fill(gd, r, j * B, g->fill_ids, rows));
    }
    CU_CHECK(cudaMemcpyAsync(gd->window, (char *)gd->host + (size_t)r * gd->window_bytes,
                             gd->window_bytes, cudaMemcpyHostToDevice, g->stream));
    return TD_OK;
}

extern "C" td_status td_gpu_step(td_gpu_t *g, const td_gpu_step_args *sa, bool apply) {
    int r = (int)(sa->step % RING);
    /* the pinned slot was last read by the copy of step - RING: make sure it ran */
    if (g->ring_step[r] >= 0) CU_CHECK(cudaEventSynchronize(g->done[r]));
    if (g->train.stream) {
        if (!g->perm_host)
            return td_error(TD_ERR_INVALID, "CUDA engine: set the training set and epoch first");
        TD_CHECK(stream_step(g, r, sa));
    }
    td_gpu_args *a = &g->args_host[r];
    fill_args(g, a, sa->step, true);
    a->base = sa->base;
    a->n = sa->n;
    a->scale = sa->scale;
    CU_CHECK(cudaMemcpyAsync(g->args, a, sizeof *a, cudaMemcpyHostToDevice, g->stream));
    if (g->cfg.graph) {
        if (!g->graph[apply]) TD_CHECK(capture(g, apply));
        CU_CHECK(cudaGraphLaunch(g->graph[apply], g->stream));
    } else {
        TD_CHECK(enqueue_step(g, apply));
    }
    if (apply) g->optim_steps++;
    CU_CHECK(cudaMemcpyAsync(g->stats_host + 3 * r, g->stats, 3 * sizeof(double),
                             cudaMemcpyDeviceToHost, g->stream));
    if (g->nbuf) {
        size_t nb = (size_t)g->cfg.accum * g->nbuf;
        CU_CHECK(cudaMemcpyAsync(g->bn_host + (size_t)r * nb, g->bn_dev, nb * sizeof(float),
                                 cudaMemcpyDeviceToHost, g->stream));
    }
    CU_CHECK(cudaEventRecord(g->done[r], g->stream));
    g->ring_step[r] = sa->step;
    return TD_OK;
}

extern "C" td_status td_gpu_step_stats(td_gpu_t *g, int64_t step, double sums[3]) {
    int r = (int)(step % RING);
    if (g->ring_step[r] != step)
        return td_error(TD_ERR_INVALID, "CUDA engine: statistics of step %lld are not in flight",
                        (long long)step);
    cudaError_t e = cudaEventSynchronize(g->done[r]);
    if (e != cudaSuccess)
        return td_error(TD_ERR_SYS, "CUDA: training step %lld failed on the device: %s",
                        (long long)step, cudaGetErrorString(e));
    memcpy(sums, g->stats_host + 3 * r, 3 * sizeof(double));
    if (td_log_enabled(TD_LOG_DEBUG)) { /* which samples this rank's slots held, and the loss */
        for (int j = 0; j < g->cfg.accum; j++) {
            uint64_t ids[3] = {0, 0, 0};
            cudaMemcpy(ids, g->ids + (size_t)j * g->cfg.batch, sizeof ids, cudaMemcpyDeviceToHost);
            TD_LOG_DEBUG("CUDA step %lld: slot %d samples %llu, %llu, %llu, ...", (long long)step,
                         g->cfg.rank * g->cfg.accum + j, (unsigned long long)ids[0],
                         (unsigned long long)ids[1], (unsigned long long)ids[2]);
        }
        TD_LOG_DEBUG("CUDA step %lld: loss sum %.9g, correct %g, samples %g", (long long)step,
                     sums[0], sums[1], sums[2]);
    }
    return TD_OK;
}

extern "C" td_status td_gpu_step_bn_stats(td_gpu_t *g, int64_t step, float *out, size_t ld) {
    int r = (int)(step % RING);
    if (g->ring_step[r] != step)
        return td_error(TD_ERR_INVALID, "CUDA engine: statistics of step %lld are not in flight",
                        (long long)step);
    CU_CHECK(cudaEventSynchronize(g->done[r]));
    const float *ring = g->bn_host + (size_t)r * g->cfg.accum * g->nbuf;
    for (int j = 0; j < g->cfg.accum; j++)
        memcpy(out + (size_t)j * ld, ring + (size_t)j * g->nbuf, g->nbuf * sizeof(float));
    return TD_OK;
}

extern "C" td_status td_gpu_batch_stats(td_gpu_t *g, float *out) {
    if (!g->nbuf) return TD_OK;
    CU_CHECK(cudaStreamSynchronize(g->stream));
    CU_CHECK(cudaMemcpy(out, g->bn_dev, g->nbuf * 4, cudaMemcpyDeviceToHost));
    return TD_OK;
}

extern "C" td_status td_gpu_upload_buffers(td_gpu_t *g) {
    if (!g->nbuf) return TD_OK;
    CU_CHECK(cudaStreamSynchronize(g->stream));
    CU_CHECK(cudaMemcpy(g->buffers, td_model_buffers(g->model), g->nbuf * 4,
                        cudaMemcpyHostToDevice));
    return TD_OK;
}

extern "C" td_status td_gpu_grads_to_host(td_gpu_t *g) {
    CU_CHECK(cudaMemcpyAsync(td_model_grads(g->model), g->grads, g->num_params * 4,
                             cudaMemcpyDeviceToHost, g->stream));
    CU_CHECK(cudaStreamSynchronize(g->stream));
    return TD_OK;
}

extern "C" td_status td_gpu_apply(td_gpu_t *g) {
    CU_CHECK(cudaMemcpyAsync(g->grads, td_model_grads(g->model), g->num_params * 4,
                             cudaMemcpyHostToDevice, g->stream));
    /* the step's argument block already holds this step's optimizer coefficients */
    TD_CHECK(optimizer(g, g->grads));
    g->optim_steps++;
    return TD_OK;
}

/* ---- CUDA IPC between the ranks of one host ---- */
extern "C" td_status td_gpu_ipc_export(td_gpu_t *g, void *handle) {
    cudaIpcMemHandle_t h;
    static_assert(sizeof h == TD_GPU_IPC_HANDLE_BYTES, "cudaIpcMemHandle_t size");
    CU_CHECK(cudaIpcGetMemHandle(&h, g->grads));
    memcpy(handle, &h, sizeof h);
    return TD_OK;
}

extern "C" td_status td_gpu_ipc_open(td_gpu_t *g, int world, int rank, const void *handles) {
    if (world < 2 || world > TD_GPU_IPC_MAX_RANKS || rank < 0 || rank >= world)
        return td_error(TD_ERR_UNSUPPORTED,
                        "CUDA IPC reduce: world size %d (rank %d) outside 2..%d; use the host "
                        "path (TANDEM_GPU_REDUCE=host)",
                        world, rank, TD_GPU_IPC_MAX_RANKS);
    const float *src[TD_GPU_IPC_MAX_RANKS];
    for (int r = 0; r < world; r++) {
        if (r == rank) {
            src[r] = g->grads;
            continue;
        }
        cudaIpcMemHandle_t h;
        memcpy(&h, (const char *)handles + (size_t)r * TD_GPU_IPC_HANDLE_BYTES, sizeof h);
        void *p = NULL;
        cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess)
            return td_error(TD_ERR_UNSUPPORTED,
                            "CUDA IPC: rank %d cannot open rank %d's gradient buffer: %s (no "
                            "peer access between their GPUs?)",
                            rank, r, cudaGetErrorString(e));
        g->ipc_peer[r] = (float *)p;
        src[r] = (const float *)p;
    }
    g->ipc_world = world, g->ipc_rank = rank;
    TD_CHECK(DALLOC(g, g->ipc_src, (size_t)world * sizeof(float *)));
    TD_CHECK(DALLOC(g, g->rgrads, g->num_params * 4));
    CU_CHECK(cudaMemcpy(g->ipc_src, src, (size_t)world * sizeof(float *), cudaMemcpyHostToDevice));
    return TD_OK;
}

extern "C" td_status td_gpu_ipc_reduce(td_gpu_t *g) {
    if (!g->ipc_world) return td_error(TD_ERR_INVALID, "CUDA IPC reduce before td_gpu_ipc_open");
    td_gpu_tree_sum(g->stream, g->ipc_src, g->ipc_world, g->num_params, g->rgrads);
    LAUNCHED("CUDA IPC tree sum");
    CU_CHECK(cudaStreamSynchronize(g->stream));
    return TD_OK;
}

extern "C" td_status td_gpu_ipc_apply(td_gpu_t *g) {
    TD_CHECK(optimizer(g, g->rgrads));
    g->optim_steps++;
    return TD_OK;
}

/* ---- evaluation ---- */
extern "C" td_status td_gpu_evaluate(td_gpu_t *g, uint64_t lo, uint64_t hi, double sums[3]) {
    if (!g->test.src.values) return td_error(TD_ERR_INVALID, "CUDA engine: no test set uploaded");
    if (hi > g->test.count) hi = g->test.count;
    int eb = TD_MAX(g->cfg.max_eval_batch, 1);
    int r = RING; /* evaluation's own argument block: dropout off */
    CU_CHECK(cudaStreamSynchronize(g->stream));
    fill_args(g, &g->args_host[r], 0, false);
    CU_CHECK(cudaMemcpyAsync(g->args, &g->args_host[r], sizeof(td_gpu_args), cudaMemcpyHostToDevice,
                             g->stream));
    CU_CHECK(cudaMemsetAsync(g->evsums, 0, 3 * sizeof(double), g->stream));
    gdata *gd = &g->test;
    for (uint64_t b = lo; b < hi; b += (uint64_t)eb) {
        int cnt = (int)TD_MIN((uint64_t)eb, hi - b);
        if (gd->stream) { /* the batch's samples into the window; its staging is free again */
            CU_CHECK(cudaStreamSynchronize(g->stream));
            for (int i = 0; i < cnt; i++) g->fill_ids[i] = b + (uint64_t)i;
            TD_CHECK(stream_fill(gd, 0, 0, g->fill_ids, cnt));
            CU_CHECK(cudaMemcpyAsync(gd->window, gd->host, gd->window_bytes, cudaMemcpyHostToDevice,
                                     g->stream));
        }
        td_gpu_gather_range(g->stream, &g->test.src, b, cnt, g->in_size, g->x, g->y, g->t,
                            g->ids);
        LAUNCHED("gather");
        const float *out;
        TD_CHECK(forward(g, g->x, g->ids, cnt, -1, g->bn_dev, &out));
        td_gpu_loss(g->stream, g->loss, out, g->y, g->t, cnt, g->classes, NULL, 0, cnt, 0.0f,
                    g->dout, g->row_loss, g->row_correct);
        td_gpu_eval_accumulate(g->stream, g->row_loss, g->row_correct, cnt, g->evsums);
        LAUNCHED("evaluation");
    }
    CU_CHECK(cudaMemcpyAsync(g->stats_host + 3 * r, g->evsums, 3 * sizeof(double),
                             cudaMemcpyDeviceToHost, g->stream));
    CU_CHECK(cudaStreamSynchronize(g->stream));
    memcpy(sums, g->stats_host + 3 * r, 3 * sizeof(double));
    return TD_OK;
}

/* ---- single passes on host arrays, for the tests ---- */
extern "C" td_status td_gpu_model_forward(td_gpu_t *g, const float *x, int batch,
                                          const td_forward_ctx *ctx, float *y) {
    if (batch < 1 || batch > g->max_batch)
        return td_error(TD_ERR_INVALID, "batch %d outside 1..%d", batch, g->max_batch);
    CU_CHECK(cudaStreamSynchronize(g->stream));
    td_gpu_args *a = &g->args_host[RING];
    fill_args(g, a, ctx ? (int64_t)ctx->step : 0, ctx && ctx->training);
    if (ctx)
        for (int i = 0; i < g->nl; i++)
            if (g->layers[i].info.kind == TD_LAYER_DROPOUT)
                a->dropout_key[g->layers[i].dropout_idx] = td_dropout_key(ctx->seed, ctx->step, i);
    uint64_t *ids = (uint64_t *)td_xmalloc((size_t)batch * 8);
    for (int i = 0; i < batch; i++)
        ids[i] = ctx && ctx->sample_ids ? ctx->sample_ids[i] : (uint64_t)i;
    cudaError_t e = cudaMemcpy(g->ids, ids, (size_t)batch * 8, cudaMemcpyHostToDevice);
    free(ids);
    CU_CHECK(e);
    CU_CHECK(cudaMemcpy(g->args, a, sizeof *a, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(g->x, x, (size_t)batch * g->in_size * 4, cudaMemcpyHostToDevice));
    const float *out;
    TD_CHECK(forward(g, g->x, g->ids, batch, -1, g->bn_dev, &out));
    CU_CHECK(cudaStreamSynchronize(g->stream));
    CU_CHECK(cudaMemcpy(y, out, (size_t)batch * g->classes * 4, cudaMemcpyDeviceToHost));
    return TD_OK;
}

extern "C" td_status td_gpu_model_backward(td_gpu_t *g, const float *dy, int batch, float *grads) {
    CU_CHECK(cudaMemcpy(g->dout, dy, (size_t)batch * g->classes * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemset(g->grads, 0, g->num_params * 4));
    TD_CHECK(backward(g, g->dout, batch, -1, g->grads));
    CU_CHECK(cudaStreamSynchronize(g->stream));
    CU_CHECK(cudaMemcpy(grads, g->grads, g->num_params * 4, cudaMemcpyDeviceToHost));
    return TD_OK;
}

extern "C" td_status td_gpu_optim_step(td_gpu_t *g, float *params, const float *grads) {
    CU_CHECK(cudaStreamSynchronize(g->stream));
    td_gpu_args *a = &g->args_host[RING];
    fill_args(g, a, 0, false);
    CU_CHECK(cudaMemcpy(g->args, a, sizeof *a, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(g->params, params, g->num_params * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(g->grads, grads, g->num_params * 4, cudaMemcpyHostToDevice));
    TD_CHECK(optimizer(g, g->grads));
    g->optim_steps++;
    CU_CHECK(cudaStreamSynchronize(g->stream));
    CU_CHECK(cudaMemcpy(params, g->params, g->num_params * 4, cudaMemcpyDeviceToHost));
    return TD_OK;
}
