/* The GPU backend's own kernels (the gemms are cuBLAS's, in engine.cu). Each output element is
 * owned by one thread, or by one block that sums in a fixed shared-memory tree: no atomics, so
 * every launch gives the same bits. Arithmetic that must equal the CPU's bit for bit (dropout
 * masks, the normalisation table, the optimizers) uses the explicitly rounded intrinsics
 * (__fmul_rn, __fadd_rn, __fmaf_rn, ...), which the compiler never contracts or reorders. */
#include "kernels.h"

#include <math.h>

#define THREADS 256

/* Launch shapes never exceed the device's limits, whatever the batch: grid.x is at most 2^31 - 1
 * blocks and grid.y at most 65,535 (CUDA's limits on every architecture tandem builds for), and
 * every kernel strides over the blocks its grid does not cover. So a batch of 16,384 (2^19
 * channel planes in a pool's backward) is the same kernels with the same bits, only looped. */
#define GRID_X_MAX 2147483647u
#define GRID_Y_MAX 65535u

static unsigned grid_x(size_t blocks) {
    return (unsigned)(blocks < 1 ? 1 : blocks > GRID_X_MAX ? GRID_X_MAX : blocks);
}
static unsigned grid_y(size_t blocks) {
    return (unsigned)(blocks < 1 ? 1 : blocks > GRID_Y_MAX ? GRID_Y_MAX : blocks);
}
static unsigned blocks_for(size_t n) {
    return grid_x((n + THREADS - 1) / THREADS);
}

/* Where a thread is in its launch. The bodies of the gather, lowering and pooling kernels below
 * take it as an argument, so the same code runs on the host over every (block, thread):
 * tests/gpu/test_gpu_kernels_host.cu checks their index arithmetic that way, in any CUDA build,
 * without a GPU (the loss's row body too, against nn/loss.c). */
typedef struct {
    unsigned bx, by, gx, gy, tx, bd;
} tix;
#define TIX()                                                                                      \
    tix {                                                                                          \
        blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, threadIdx.x, blockDim.x                      \
    }

/* ---- data ---- */
/* Element i of sample id, normalised as data.h's gather does: a byte through its channel's
 * table, a float as (v - mean) / std (IEEE division: nvcc's default, as the CPU's). */
__host__ __device__ static inline float source_value(const td_gpu_source &d, uint64_t id,
                                                     int size, int i) {
    int ch = i / d.plane;
    if (d.u8) return d.lut[ch * 256 + ((const uint8_t *)d.values)[id * (uint64_t)size + i]];
    return (((const float *)d.values)[id * (uint64_t)size + i] - d.mean[ch]) / d.std[ch];
}

/* One thread of a gather: grid.x over a sample's values, grid.y over rows (strided past 65,535).
 * Row `row` takes sample id, held at record rec of the source (id itself, or its place in a
 * streamed window), when valid, or zeros (a short slot's padding rows); block x = 0 also copies
 * its targets (the threads over the target row) and thread 0 its label and id. */
__host__ __device__ static inline void gather_row_thread(tix t, const td_gpu_source &d, int row,
                                                         bool valid, uint64_t id, uint64_t rec,
                                                         int size, float *x, int32_t *y,
                                                         float *tg, uint64_t *ids) {
    float *dst = x + (size_t)row * size;
    for (int i = (int)(t.bx * t.bd + t.tx); i < size; i += (int)(t.gx * t.bd))
        dst[i] = valid ? source_value(d, rec, size, i) : 0.0f;
    if (t.bx != 0) return;
    if (d.targets) {
        int k = d.target_dim;
        for (int j = (int)t.tx; j < k; j += (int)t.bd)
            tg[(size_t)row * k + j] = valid ? d.targets[rec * (uint64_t)k + j] : 0.0f;
    }
    if (t.tx == 0) {
        if (d.labels) y[row] = valid ? d.labels[rec] : 0;
        ids[row] = id;
    }
}

__host__ __device__ static inline void gather_step_thread(tix t, const td_gpu_source &d,
                                                          const uint64_t *perm,
                                                          const td_gpu_args *a, int slot,
                                                          int batch, int size, float *x,
                                                          int32_t *y, float *tg, uint64_t *ids) {
    int rows = TD_GPU_SLOT_ROWS(a, slot, batch);
    for (int row = (int)t.by; row < batch; row += (int)t.gy) {
        bool valid = row < rows;
        uint64_t id = valid ? perm[a->base + (int64_t)slot * batch + row] : 0;
        uint64_t rec = d.window ? (uint64_t)(slot - d.window_slot0) * batch + row : id;
        gather_row_thread(t, d, row, valid, id, rec, size, x, y, tg, ids);
    }
}

__global__ void gather_step_kernel(td_gpu_source d, const uint64_t *perm, const td_gpu_args *a,
                                   int slot, int batch, int size, float *x, int32_t *y, float *tg,
                                   uint64_t *ids) {
    gather_step_thread(TIX(), d, perm, a, slot, batch, size, x, y, tg, ids);
}

/* Threads a gather block: a sample's values, and at least its target row in block x = 0. */
static dim3 gather_grid(const td_gpu_source *d, int batch, int size) {
    return dim3(blocks_for((size_t)(size > d->target_dim ? size : d->target_dim)),
                grid_y((size_t)batch));
}

void td_gpu_gather_step(cudaStream_t s, const td_gpu_source *d, const uint64_t *perm,
                        const td_gpu_args *a, int slot, int batch, int size, float *x, int32_t *y,
                        float *t, uint64_t *ids) {
    gather_step_kernel<<<gather_grid(d, batch, size), THREADS, 0, s>>>(*d, perm, a, slot, batch,
                                                                        size, x, y, t, ids);
}

__host__ __device__ static inline void gather_range_thread(tix t, const td_gpu_source &d,
                                                           uint64_t first, int batch, int size,
                                                           float *x, int32_t *y, float *tg,
                                                           uint64_t *ids) {
    for (int row = (int)t.by; row < batch; row += (int)t.gy)
        gather_row_thread(t, d, row, true, first + (uint64_t)row,
                          d.window ? (uint64_t)row : first + (uint64_t)row, size, x, y, tg, ids);
}

__global__ void gather_range_kernel(td_gpu_source d, uint64_t first, int batch, int size, float *x,
                                    int32_t *y, float *tg, uint64_t *ids) {
    gather_range_thread(TIX(), d, first, batch, size, x, y, tg, ids);
}

void td_gpu_gather_range(cudaStream_t s, const td_gpu_source *d, uint64_t first, int batch,
                         int size, float *x, int32_t *y, float *t, uint64_t *ids) {
    gather_range_kernel<<<gather_grid(d, batch, size), THREADS, 0, s>>>(*d, first, batch, size, x,
                                                                         y, t, ids);
}

/* ---- convolution lowering, "CN" layout ----
 * col [c * k * k][batch * oh * ow]: row (ci * k + ki) * k + kj, column b * oh * ow + oy * ow + ox,
 * so that a convolution over the whole batch is one gemm (W [out_c, c*k*k] x col) and its
 * output, [out_c][batch * oh * ow], is "CN": channel-major, then sample, then pixel.
 *
 * These kernels are pure data movement, so what bounds them is how many loads each SM keeps in
 * flight. A block takes one row (a tap, or a channel) and a group of SPB samples; a thread takes a
 * pixel, works out its indices once, then moves that pixel for all SPB samples in an unrolled
 * loop: SPB independent loads in flight per thread, consecutive threads on consecutive pixels.
 * (One load per thread, the earlier shape, ran at about 1 TB/s on an H200 whatever the bytes; a
 * warp per output row, tried on 2026-11-26, was 3x slower still.) */
#define SPB 8
/* Unrolled on the device; the host pass (tests/gpu/test_gpu_kernels_host.cu) knows no such pragma.
 */
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

static dim3 rows_grid(int rows, int batch) {
    return dim3(grid_x((size_t)rows), grid_y((size_t)(batch + SPB - 1) / SPB));
}
/* Threads for a row of n pixels: the fewest passes of at most 256 threads, then the fewest
 * warps that cover n in that many passes (576 pixels: 3 passes of 192, not 2.25 of 256). */
static unsigned row_threads(int n) {
    int passes = (n + 255) / 256;
    int per = (n + passes - 1) / passes;
    return (unsigned)((per + 31) / 32 * 32);
}

/* The col buffer holds fp32, or bf16 under --precision bf16 (half the bytes of the largest
 * buffer of a convolution's step, written once and read twice). */
__host__ __device__ static inline void store(float *p, float v) {
    *p = v;
}
__device__ static inline void store(__nv_bfloat16 *p, float v) {
    *p = __float2bfloat16_rn(v);
}
__host__ __device__ static inline float load(const float *p) {
    return *p;
}
__device__ static inline float load(const __nv_bfloat16 *p) {
    return __bfloat162float(*p);
}
__host__ __device__ static inline int imin(int a, int b) {
    return a < b ? a : b;
}

/* The sample groups of a rows_grid block: first sample b0 = g * SPB of groups g = t.by,
 * t.by + t.gy, ... (more than one only past 65,535 groups), nb = the samples in the group. */
#define FOR_GROUPS(t, b0, nb, batch)                                                               \
    for (int g_ = (int)(t).by, b0, nb; b0 = g_ * SPB, nb = imin(SPB, (batch)-b0), b0 < (batch);    \
         g_ += (int)(t).gy)

/* Two adjacent entries of a row, p even and the row even-sized: one 8-byte (fp32) or 4-byte (bf16)
 * store, so a warp writes 256 or 128 contiguous bytes per instruction instead of half that. */
__host__ __device__ static inline void store2(float *p, float a, float b) {
#ifdef __CUDA_ARCH__
    *(float2 *)p = make_float2(a, b);
#else
    p[0] = a, p[1] = b;
#endif
}
__device__ static inline void store2(__nv_bfloat16 *p, float a, float b) {
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b);
}

/* A thread takes PP adjacent pixels (PP = 2 where the row length is even, for the paired
 * stores) for each of its group's samples. */
template <int PP, typename T>
__host__ __device__ static inline void im2col_thread(tix t, const float *x, int c, int h, int w,
                                                     int k, int stride, int pad, int oh, int ow,
                                                     int batch, T *col) {
    int r = (int)t.bx, n = oh * ow;
    int ci = r / (k * k), ki = r / k % k, kj = r % k;
    size_t xs = (size_t)c * h * w; /* one sample's stride in x */
    FOR_GROUPS(t, b0, nb, batch) {
        const float *xp = x + ((size_t)b0 * c + ci) * h * w;
        T *dst = col + ((size_t)r * batch + b0) * n;
        for (int p = (int)t.tx * PP; p < n; p += (int)t.bd * PP) {
            int off[PP];
            bool in[PP];
            UNROLL
            for (int j = 0; j < PP; j++) {
                int oy = (p + j) / ow, ox = p + j - oy * ow;
                int iy = oy * stride - pad + ki, ix = ox * stride - pad + kj;
                in[j] = iy >= 0 && iy < h && ix >= 0 && ix < w;
                off[j] = in[j] ? iy * w + ix : 0;
            }
            float v[SPB][PP];
            UNROLL
            for (int s = 0; s < SPB; s++) UNROLL
            for (int j = 0; j < PP; j++) v[s][j] = in[j] && s < nb ? xp[s * xs + off[j]] : 0.0f;
            UNROLL
            for (int s = 0; s < SPB; s++) {
                if (s >= nb) break;
                if (PP == 2)
                    store2(dst + (size_t)s * n + p, v[s][0], v[s][PP - 1]);
                else
                    store(dst + (size_t)s * n + p, v[s][0]);
            }
        }
    }
}

template <int PP, typename T>
__global__ void im2col_kernel(const float *x, int c, int h, int w, int k, int stride, int pad,
                              int oh, int ow, int batch, T *col) {
    im2col_thread<PP>(TIX(), x, c, h, w, k, stride, pad, oh, ow, batch, col);
}

template <typename T>
static void im2col_launch(cudaStream_t s, const float *x, int batch, int c, int h, int w, int k,
                          int stride, int pad, int oh, int ow, T *col) {
    int n = oh * ow;
    if (n % 2 == 0 && (uintptr_t)col % (2 * sizeof(T)) == 0)
        im2col_kernel<2><<<rows_grid(c * k * k, batch), row_threads(n / 2), 0, s>>>(
            x, c, h, w, k, stride, pad, oh, ow, batch, col);
    else
        im2col_kernel<1><<<rows_grid(c * k * k, batch), row_threads(n), 0, s>>>(
            x, c, h, w, k, stride, pad, oh, ow, batch, col);
}

void td_gpu_im2col(cudaStream_t s, const float *x, int batch, int c, int h, int w, int k,
                   int stride, int pad, int oh, int ow, float *col) {
    im2col_launch(s, x, batch, c, h, w, k, stride, pad, oh, ow, col);
}

void td_gpu_im2col_bf16(cudaStream_t s, const float *x, int batch, int c, int h, int w, int k,
                        int stride, int pad, int oh, int ow, __nv_bfloat16 *col) {
    im2col_launch(s, x, batch, c, h, w, k, stride, pad, oh, ow, col);
}

/* The adjoint, as a gather: input cell (b, ci, iy, ix) sums the col entries that read it, ki then
 * kj, in fp32. A block per (ci, sample group); each thread keeps SPB sums, one per sample. With
 * gate (the layer's input is a ReLU's output), that ReLU's backward is applied here: cells not
 * > 0 get 0. */
template <typename T>
__host__ __device__ static inline void col2im_thread(tix t, const T *col, int c, int h, int w,
                                                     int k, int stride, int pad, int oh, int ow,
                                                     int batch, const float *gate, float *x) {
    int ci = (int)t.bx, n = oh * ow, hw = h * w;
    size_t tap = (size_t)batch * n, xs = (size_t)c * hw; /* strides of a col row, an x sample */
    FOR_GROUPS(t, b0, nb, batch) {
        const T *cp = col + (size_t)b0 * n;
        size_t xo = ((size_t)b0 * c + ci) * hw;
        for (int p = (int)t.tx; p < hw; p += (int)t.bd) {
            int iy = p / w, ix = p - iy * w;
            float acc[SPB];
            UNROLL
            for (int s = 0; s < SPB; s++) acc[s] = 0.0f;
            for (int ki = 0; ki < k; ki++) {
                int ty = iy + pad - ki;
                if (ty < 0) break;
                int oy = stride == 1 ? ty : ty / stride;
                if (oy * stride != ty || oy >= oh) continue;
                for (int kj = 0; kj < k; kj++) {
                    int tx = ix + pad - kj;
                    if (tx < 0) break;
                    int ox = stride == 1 ? tx : tx / stride;
                    if (ox * stride != tx || ox >= ow) continue;
                    const T *src = cp + (size_t)((ci * k + ki) * k + kj) * tap + oy * ow + ox;
                    UNROLL
                    for (int s = 0; s < SPB; s++)
                        if (s < nb) acc[s] += load(src + (size_t)s * n);
                }
            }
            UNROLL
            for (int s = 0; s < SPB; s++) {
                if (s >= nb) break;
                size_t o = xo + s * xs + p;
                x[o] = gate && !(gate[o] > 0.0f) ? 0.0f : acc[s];
            }
        }
    }
}

template <typename T>
__global__ void col2im_kernel(const T *col, int c, int h, int w, int k, int stride, int pad, int oh,
                              int ow, int batch, const float *gate, float *x) {
    col2im_thread(TIX(), col, c, h, w, k, stride, pad, oh, ow, batch, gate, x);
}

void td_gpu_col2im(cudaStream_t s, const float *col, int batch, int c, int h, int w, int k,
                   int stride, int pad, int oh, int ow, const float *gate, float *x) {
    col2im_kernel<<<rows_grid(c, batch), row_threads(h * w), 0, s>>>(col, c, h, w, k, stride, pad,
                                                                     oh, ow, batch, gate, x);
}

void td_gpu_col2im_bf16(cudaStream_t s, const __nv_bfloat16 *col, int batch, int c, int h, int w,
                        int k, int stride, int pad, int oh, int ow, const float *gate, float *x) {
    col2im_kernel<<<rows_grid(c, batch), row_threads(h * w), 0, s>>>(col, c, h, w, k, stride, pad,
                                                                     oh, ow, batch, gate, x);
}

/* out [batch][c][n] (NCHW) = act(y [c][batch * n] (CN) + bias[c]). */
__host__ __device__ static inline void cn_bias_act_thread(tix t, const float *y, const float *bias,
                                                          int c, int n, int batch, bool relu,
                                                          float *out) {
    int ch = (int)t.bx;
    float bc = bias[ch];
    size_t os = (size_t)c * n; /* one sample's stride in out */
    FOR_GROUPS(t, b0, nb, batch) {
        const float *src = y + ((size_t)ch * batch + b0) * n;
        float *dst = out + ((size_t)b0 * c + ch) * n;
        for (int p = (int)t.tx; p < n; p += (int)t.bd) {
            float v[SPB];
            UNROLL
            for (int s = 0; s < SPB; s++) v[s] = s < nb ? src[(size_t)s * n + p] : 0.0f;
            UNROLL
            for (int s = 0; s < SPB; s++) {
                if (s >= nb) break;
                float u = v[s] + bc; /* one add: never contracted, the CPU's bits */
                dst[s * os + p] = relu ? fmaxf(u, 0.0f) : u;
            }
        }
    }
}

__global__ void cn_bias_act_kernel(const float *y, const float *bias, int c, int n, int batch,
                                   bool relu, float *out) {
    cn_bias_act_thread(TIX(), y, bias, c, n, batch, relu, out);
}

void td_gpu_cn_bias_act(cudaStream_t s, const float *y, const float *bias, int batch, int c, int n,
                        bool relu, float *out) {
    cn_bias_act_kernel<<<rows_grid(c, batch), row_threads(n), 0, s>>>(y, bias, c, n, batch, relu,
                                                                      out);
}

/* y [c][batch * n] (CN) = x [batch][c][n] (NCHW), and its bf16 rounding into y16 when given. */
__global__ void nchw_to_cn_kernel(const float *x, int c, int n, int batch, float *y,
                                  __nv_bfloat16 *y16) {
    tix t = TIX();
    int ch = (int)t.bx;
    size_t xs = (size_t)c * n;
    FOR_GROUPS(t, b0, nb, batch) {
        const float *src = x + ((size_t)b0 * c + ch) * n;
        size_t o = ((size_t)ch * batch + b0) * n;
        for (int p = (int)t.tx; p < n; p += (int)t.bd) {
            float v[SPB];
            UNROLL
            for (int s = 0; s < SPB; s++) v[s] = s < nb ? src[s * xs + p] : 0.0f;
            UNROLL
            for (int s = 0; s < SPB; s++) {
                if (s >= nb) break;
                y[o + (size_t)s * n + p] = v[s];
                if (y16) y16[o + (size_t)s * n + p] = __float2bfloat16_rn(v[s]);
            }
        }
    }
}

void td_gpu_nchw_to_cn(cudaStream_t s, const float *x, int batch, int c, int n, float *y,
                       __nv_bfloat16 *y16) {
    nchw_to_cn_kernel<<<rows_grid(c, batch), row_threads(n), 0, s>>>(x, c, n, batch, y, y16);
}

__global__ void to_bf16_kernel(const float *x, size_t n, __nv_bfloat16 *y) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

void td_gpu_to_bf16(cudaStream_t s, const float *x, size_t n, __nv_bfloat16 *y) {
    to_bf16_kernel<<<blocks_for(n), THREADS, 0, s>>>(x, n, y);
}

/* ---- bias and activation ---- */
__global__ void bias_act_kernel(const float *y, const float *bias, int batch, int channels, int hw,
                                bool relu, float *out) {
    size_t n = (size_t)batch * channels * hw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)((i / (size_t)hw) % (size_t)channels);
        float v = __fadd_rn(y[i], bias[c]);
        out[i] = relu ? fmaxf(v, 0.0f) : v;
    }
}

void td_gpu_bias_act(cudaStream_t s, const float *y, const float *bias, int batch, int channels,
                     int hw, bool relu, float *out) {
    size_t n = (size_t)batch * channels * hw;
    bias_act_kernel<<<blocks_for(n), THREADS, 0, s>>>(y, bias, batch, channels, hw, relu, out);
}

/* rs[r] = sum of row r's n values, one warp per row: lane l adds elements l, l + 32, ... in
 * order, then the 32 partials meet in a fixed butterfly. */
__global__ void row_sums_kernel(const float *x, int rows, int n, float *rs) {
    int warp = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (warp >= rows) return;
    const float *r = x + (size_t)warp * n;
    float acc = 0.0f;
    for (int i = lane; i < n; i += 32) acc += r[i];
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) rs[warp] = acc;
}

void td_gpu_row_sums(cudaStream_t s, const float *x, int rows, int n, float *rs) {
    row_sums_kernel<<<blocks_for((size_t)rows * 32), THREADS, 0, s>>>(x, rows, n, rs);
}

__global__ void relu_kernel(const float *x, size_t n, float *y) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = fmaxf(x[i], 0.0f);
}

void td_gpu_relu(cudaStream_t s, const float *x, size_t n, float *y) {
    relu_kernel<<<blocks_for(n), THREADS, 0, s>>>(x, n, y);
}

__global__ void relu_backward_kernel(const float *y, const float *dy, size_t n, float *dx) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void td_gpu_relu_backward(cudaStream_t s, const float *y, const float *dy, size_t n, float *dx) {
    relu_backward_kernel<<<blocks_for(n), THREADS, 0, s>>>(y, dy, n, dx);
}

/* ---- max pooling: argmax = ki * k + kj of the first maximal element, as on the CPU ---- */
__global__ void maxpool_kernel(const float *x, int batch, int c, int h, int w, int k, int stride,
                               int oh, int ow, float *y, uint8_t *argmax) {
    size_t n = (size_t)batch * c * oh * ow;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ox = (int)(i % ow);
        size_t t = i / ow;
        int oy = (int)(t % oh);
        size_t plane = t / oh; /* b * c + ci */
        const float *win = x + plane * h * w + (size_t)oy * stride * w + (size_t)ox * stride;
        float best = win[0];
        int arg = 0;
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                float v = win[(size_t)ki * w + kj];
                if (v > best) {
                    best = v;
                    arg = ki * k + kj;
                }
            }
        y[i] = best;
        argmax[i] = (uint8_t)arg;
    }
}

void td_gpu_maxpool(cudaStream_t s, const float *x, int batch, int c, int h, int w, int k,
                    int stride, int oh, int ow, float *y, uint8_t *argmax) {
    size_t n = (size_t)batch * c * oh * ow;
    maxpool_kernel<<<blocks_for(n), THREADS, 0, s>>>(x, batch, c, h, w, k, stride, oh, ow, y,
                                                     argmax);
}

/* Gather: each input cell sums the gradients of the windows whose argmax it is (oy, ox in
 * increasing order, as the CPU's scatter adds them). With gate, the pool's input is a ReLU's
 * output and the ReLU's backward is folded in: cells that are not positive get 0. Grid (pixel
 * blocks, groups of SPB planes b * c + ci, strided past 65,535); a thread takes one pixel of
 * each plane of its group, unrolled, so its loads are in flight together. */
__host__ __device__ static inline float maxpool_backward_cell(const float *dyp, const uint8_t *amp,
                                                              int iy, int ix, int k, int stride,
                                                              int oh, int ow) {
    float acc = 0.0f;
    if (k == 2 && stride == 2) { /* one window per cell */
        int oy = iy >> 1, ox = ix >> 1;
        if (oy < oh && ox < ow && amp[oy * ow + ox] == ((iy & 1) << 1 | (ix & 1)))
            acc = dyp[oy * ow + ox];
        return acc;
    }
    int oy0 = iy >= k ? (iy - k) / stride + 1 : 0, oy1 = imin(iy / stride, oh - 1);
    int ox0 = ix >= k ? (ix - k) / stride + 1 : 0, ox1 = imin(ix / stride, ow - 1);
    for (int oy = oy0; oy <= oy1; oy++)
        for (int ox = ox0; ox <= ox1; ox++) {
            int a = amp[oy * ow + ox];
            if (oy * stride + a / k == iy && ox * stride + a % k == ix) acc += dyp[oy * ow + ox];
        }
    return acc;
}

__host__ __device__ static inline void
maxpool_backward_thread(tix t, const float *dy, const uint8_t *argmax, const float *x, bool gate,
                        size_t planes, int h, int w, int k, int stride, int oh, int ow, float *dx) {
    int p = (int)(t.bx * t.bd + t.tx);
    if (p >= h * w) return;
    int iy = p / w, ix = p - iy * w;
    size_t in = (size_t)h * w, out = (size_t)oh * ow;
    for (size_t p0 = (size_t)t.by * SPB; p0 < planes; p0 += (size_t)t.gy * SPB) {
        float acc[SPB];
        UNROLL
        for (int s = 0; s < SPB; s++)
            acc[s] = p0 + s < planes
                         ? maxpool_backward_cell(dy + (p0 + s) * out, argmax + (p0 + s) * out, iy,
                                                 ix, k, stride, oh, ow)
                         : 0.0f;
        UNROLL
        for (int s = 0; s < SPB; s++) {
            if (p0 + s >= planes) break;
            size_t o = (p0 + s) * in + p;
            dx[o] = gate && !(x[o] > 0.0f) ? 0.0f : acc[s];
        }
    }
}

__global__ void maxpool_backward_kernel(const float *dy, const uint8_t *argmax, const float *x,
                                        bool gate, size_t planes, int h, int w, int k, int stride,
                                        int oh, int ow, float *dx) {
    maxpool_backward_thread(TIX(), dy, argmax, x, gate, planes, h, w, k, stride, oh, ow, dx);
}

/* The common case, 2x2 windows of stride 2 that tile the input exactly (h = 2 oh, w = 2 ow): a
 * thread takes one window (one dy, one argmax byte) of each plane of its group and writes its
 * four cells as two pairs. The same bits as the gather: each cell gets its window's dy or 0. */
__host__ __device__ static inline void load2(const float *p, float *a, float *b) {
#ifdef __CUDA_ARCH__
    float2 v = *(const float2 *)p;
    *a = v.x, *b = v.y;
#else
    *a = p[0], *b = p[1];
#endif
}

__host__ __device__ static inline void
maxpool2_backward_thread(tix t, const float *dy, const uint8_t *argmax, const float *x, bool gate,
                         int batch, int c, int oh, int ow, bool cn, float *dx,
                         __nv_bfloat16 *dx16) {
    int q = (int)(t.bx * t.bd + t.tx);
    if (q >= oh * ow) return;
    int oy = q / ow, ox = q - oy * ow, w = 2 * ow;
    size_t planes = (size_t)batch * c;
    size_t in = (size_t)4 * oh * ow, out = (size_t)oh * ow, c0 = (size_t)2 * oy * w + 2 * ox;
    for (size_t p0 = (size_t)t.by * SPB; p0 < planes; p0 += (size_t)t.gy * SPB) {
        float g[SPB];
        int a[SPB];
        UNROLL
        for (int s = 0; s < SPB; s++) {
            bool here = p0 + s < planes;
            g[s] = here ? dy[(p0 + s) * out + q] : 0.0f;
            a[s] = here ? argmax[(p0 + s) * out + q] : 0;
        }
        UNROLL
        for (int s = 0; s < SPB; s++) {
            if (p0 + s >= planes) break;
            size_t plane = p0 + s, o = plane * in + c0; /* NCHW: where the gate is */
            float v[4];
            UNROLL
            for (int j = 0; j < 4; j++) v[j] = a[s] == j ? g[s] : 0.0f;
            if (gate) {
                float x0, x1, x2, x3;
                load2(x + o, &x0, &x1);
                load2(x + o + w, &x2, &x3);
                v[0] = x0 > 0.0f ? v[0] : 0.0f, v[1] = x1 > 0.0f ? v[1] : 0.0f;
                v[2] = x2 > 0.0f ? v[2] : 0.0f, v[3] = x3 > 0.0f ? v[3] : 0.0f;
            }
            /* CN: channel-major, then sample: the conv gemm's layout, for the conv before */
            size_t d = cn ? ((size_t)(plane % c) * batch + plane / c) * in + c0 : o;
            store2(dx + d, v[0], v[1]);
            store2(dx + d + w, v[2], v[3]);
#ifdef __CUDA_ARCH__
            if (dx16) {
                store2(dx16 + d, v[0], v[1]);
                store2(dx16 + d + w, v[2], v[3]);
            }
#else
            (void)dx16; /* the host pass checks the fp32 layout only */
#endif
        }
    }
}

__global__ void maxpool2_backward_kernel(const float *dy, const uint8_t *argmax, const float *x,
                                         bool gate, int batch, int c, int oh, int ow, bool cn,
                                         float *dx, __nv_bfloat16 *dx16) {
    maxpool2_backward_thread(TIX(), dy, argmax, x, gate, batch, c, oh, ow, cn, dx, dx16);
}

bool td_gpu_maxpool_backward_tiles(int h, int w, int k, int stride, int oh, int ow) {
    return k == 2 && stride == 2 && h == 2 * oh && w == 2 * ow;
}

static void maxpool2_backward(cudaStream_t s, const float *dy, const uint8_t *argmax,
                              const float *x, bool gate, int batch, int c, int oh, int ow, bool cn,
                              float *dx, __nv_bfloat16 *dx16) {
    unsigned threads = row_threads(oh * ow);
    dim3 grid(grid_x((size_t)(oh * ow + threads - 1) / threads),
              grid_y(((size_t)batch * c + SPB - 1) / SPB));
    maxpool2_backward_kernel<<<grid, threads, 0, s>>>(dy, argmax, x, gate, batch, c, oh, ow, cn, dx,
                                                      dx16);
}

void td_gpu_maxpool_backward_cn(cudaStream_t s, const float *dy, const uint8_t *argmax,
                                const float *x, bool gate, int batch, int c, int oh, int ow,
                                float *dx_cn, __nv_bfloat16 *dx16_cn) {
    maxpool2_backward(s, dy, argmax, x, gate, batch, c, oh, ow, true, dx_cn, dx16_cn);
}

void td_gpu_maxpool_backward(cudaStream_t s, const float *dy, const uint8_t *argmax, const float *x,
                             bool gate, int batch, int c, int h, int w, int k, int stride, int oh,
                             int ow, float *dx) {
    if (td_gpu_maxpool_backward_tiles(h, w, k, stride, oh, ow) &&
        ((uintptr_t)dx | (uintptr_t)x) % sizeof(float2) == 0) {
        maxpool2_backward(s, dy, argmax, x, gate, batch, c, oh, ow, false, dx, NULL);
        return;
    }
    size_t planes = (size_t)batch * c;
    unsigned threads = row_threads(h * w);
    dim3 grid(grid_x((size_t)(h * w + threads - 1) / threads), grid_y((planes + SPB - 1) / SPB));
    maxpool_backward_kernel<<<grid, threads, 0, s>>>(dy, argmax, x, gate, planes, h, w, k, stride,
                                                     oh, ow, dx);
}

/* ---- dropout: the CPU's Philox4x32-10 stream (core/rng.c), bit for bit ---- */
__device__ static float philox_uniform(uint64_t key, uint64_t stream, uint64_t index) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    uint64_t blk = index >> 2;
    uint32_t c0 = (uint32_t)blk, c1 = (uint32_t)(blk >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    UNROLL
    for (int r = 0; r < 10; r++) {
        uint32_t hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
        uint32_t hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c1 = lo1, c3 = lo0, c0 = n0, c2 = n2;
        k0 += W0, k1 += W1;
    }
    uint32_t lane = (uint32_t)(index & 3);
    uint32_t v = lane == 0 ? c0 : lane == 1 ? c1 : lane == 2 ? c2 : c3;
    return __fmul_rn((float)(v >> 8), 1.0f / 16777216.0f);
}

__global__ void dropout_kernel(const float *x, const uint64_t *ids, const td_gpu_args *a, int idx,
                               float p, float scale, int batch, size_t size, float *y,
                               uint8_t *mask) {
    size_t n = (size_t)batch * size;
    bool training = a->training && p != 0.0f;
    uint64_t key = a->dropout_key[idx];
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        if (!training) {
            y[i] = x[i];
            continue;
        }
        size_t b = i / size, e = i % size;
        bool keep = philox_uniform(key, ids[b], e) >= p;
        mask[i] = keep;
        y[i] = keep ? __fmul_rn(x[i], scale) : 0.0f;
    }
}

void td_gpu_dropout(cudaStream_t s, const float *x, const uint64_t *ids, const td_gpu_args *a,
                    int idx, float p, int batch, size_t size, float *y, uint8_t *mask) {
    size_t n = (size_t)batch * size;
    float scale = 1.0f / (1.0f - p);
    dropout_kernel<<<blocks_for(n), THREADS, 0, s>>>(x, ids, a, idx, p, scale, batch, size, y,
                                                     mask);
}

__global__ void dropout_backward_kernel(const float *dy, const uint8_t *mask, const td_gpu_args *a,
                                        float p, float scale, size_t n, float *dx) {
    bool training = a->training && p != 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dx[i] = !training ? dy[i] : mask[i] ? __fmul_rn(dy[i], scale) : 0.0f;
}

void td_gpu_dropout_backward(cudaStream_t s, const float *dy, const uint8_t *mask,
                             const td_gpu_args *a, float p, size_t n, float *dx) {
    float scale = 1.0f / (1.0f - p);
    dropout_backward_kernel<<<blocks_for(n), THREADS, 0, s>>>(dy, mask, a, p, scale, n, dx);
}

/* ---- log_softmax and the losses: one thread per row (classes are few) ---- */
__global__ void log_softmax_kernel(const float *x, int batch, int classes, float *y) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= batch) return;
    const float *xr = x + (size_t)r * classes;
    float *yr = y + (size_t)r * classes;
    float mx = xr[0];
    for (int j = 1; j < classes; j++) mx = xr[j] > mx ? xr[j] : mx;
    double se = 0;
    for (int j = 0; j < classes; j++) se += exp((double)(xr[j] - mx));
    float lse = mx + (float)log(se);
    for (int j = 0; j < classes; j++) yr[j] = xr[j] - lse;
}

void td_gpu_log_softmax(cudaStream_t s, const float *x, int batch, int classes, float *y) {
    log_softmax_kernel<<<blocks_for((size_t)batch), THREADS, 0, s>>>(x, batch, classes, y);
}

__global__ void log_softmax_backward_kernel(const float *y, const float *dy, int batch, int classes,
                                            float *dx) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= batch) return;
    const float *yr = y + (size_t)r * classes, *dyr = dy + (size_t)r * classes;
    float *dxr = dx + (size_t)r * classes;
    double sum = 0;
    for (int j = 0; j < classes; j++) sum += dyr[j];
    for (int j = 0; j < classes; j++) dxr[j] = dyr[j] - expf(yr[j]) * (float)sum;
}

void td_gpu_log_softmax_backward(cudaStream_t s, const float *y, const float *dy, int batch,
                                 int classes, float *dx) {
    log_softmax_backward_kernel<<<blocks_for((size_t)batch), THREADS, 0, s>>>(y, dy, batch, classes,
                                                                              dx);
}

/* One row's loss, its correct count and its gradient dx [dim] (scaled by scale): nn/loss.c's
 * formulas in its precisions and order (per-row sums in double; the gradient's last operation
 * a float multiply, as the CPU's), so the device writes the CPU's gradient bits where exp and
 * log agree. y: the label (CE, NLL); t: the target row (MSE, BCE). */
__host__ __device__ static inline void loss_row(td_gpu_loss_kind kind, const float *x, int dim,
                                                int y, const float *t, float scale, float *dx,
                                                double *loss, double *correct) {
    if (kind == TD_GPU_LOSS_MSE) { /* mean over dim of (x - t)^2; d/dx = 2 (x - t) / dim */
        float k = 2.0f * scale / (float)dim;
        double s = 0;
        for (int j = 0; j < dim; j++) {
            double d = (double)x[j] - t[j];
            s += d * d;
            dx[j] = k * (x[j] - t[j]);
        }
        *loss = s / dim, *correct = 0;
        return;
    }
    if (kind == TD_GPU_LOSS_BCE) { /* max(x, 0) - x t + log1p(exp(-|x|)); d/dx = sigmoid(x) - t */
        float k = scale / (float)dim;
        double s = 0;
        int hits = 0;
        for (int j = 0; j < dim; j++) {
            double xj = x[j];
            s += (xj > 0 ? xj : 0) - xj * t[j] + log1p(exp(-fabs(xj)));
            double sig = xj >= 0 ? 1.0 / (1.0 + exp(-xj)) : exp(xj) / (1.0 + exp(xj));
            dx[j] = k * (float)(sig - t[j]);
            hits += (x[j] > 0.0f) == (t[j] > 0.5f);
        }
        *loss = s / dim, *correct = (double)hits / dim;
        return;
    }
    int best = 0;
    for (int j = 1; j < dim; j++)
        if (x[j] > x[best]) best = j;
    *correct = best == y;
    if (y < 0 || y >= dim) { /* a bad label is loud: NaN loss, zero gradient */
        for (int j = 0; j < dim; j++) dx[j] = 0.0f;
        *loss = nan("");
        return;
    }
    if (kind == TD_GPU_LOSS_NLL) {
        for (int j = 0; j < dim; j++) dx[j] = j == y ? -scale : 0.0f;
        *loss = -(double)x[y];
        return;
    }
    float mx = x[0];
    for (int j = 1; j < dim; j++) mx = x[j] > mx ? x[j] : mx;
    double se = 0;
    for (int j = 0; j < dim; j++) se += exp((double)x[j] - mx);
    double lse = mx + log(se);
    *loss = lse - x[y];
    for (int j = 0; j < dim; j++) dx[j] = scale * (float)exp((double)x[j] - lse);
    dx[y] -= scale;
}

__global__ void loss_kernel(td_gpu_loss_kind kind, const float *out, const int32_t *labels,
                            const float *targets, int batch, int dim, const td_gpu_args *a,
                            int slot, int rows, float scale, float *dout, double *row_loss,
                            double *row_correct) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= batch) return;
    if (a) {
        rows = TD_GPU_SLOT_ROWS(a, slot, batch);
        scale = a->scale;
    }
    float *dx = dout + (size_t)r * dim;
    if (r >= rows) {
        for (int j = 0; j < dim; j++) dx[j] = 0.0f;
        row_loss[r] = 0;
        row_correct[r] = 0;
        return;
    }
    loss_row(kind, out + (size_t)r * dim, dim, labels ? labels[r] : 0,
             targets ? targets + (size_t)r * dim : NULL, scale, dx, &row_loss[r], &row_correct[r]);
}

void td_gpu_loss(cudaStream_t s, td_gpu_loss_kind kind, const float *out, const int32_t *labels,
                 const float *targets, int batch, int dim, const td_gpu_args *a, int slot,
                 int rows, float scale, float *dout, double *row_loss, double *row_correct) {
    loss_kernel<<<blocks_for((size_t)batch), THREADS, 0, s>>>(
        kind, out, labels, targets, batch, dim, a, slot, rows, scale, dout, row_loss, row_correct);
}

/* One warp: lane l adds rows l, l + 32, ... of each slot, then a fixed butterfly. */
__global__ void step_stats_kernel(const double *row_loss, const double *row_correct,
                                  const td_gpu_args *a, int first_slot, int slots, int batch,
                                  double *stats) {
    int lane = threadIdx.x;
    double loss = 0, correct = 0, count = 0;
    for (int j = 0; j < slots; j++) {
        int rows = TD_GPU_SLOT_ROWS(a, first_slot + j, batch);
        double l = 0, c = 0;
        for (int r = lane; r < rows; r += 32) {
            l += row_loss[(size_t)j * batch + r];
            c += row_correct[(size_t)j * batch + r];
        }
        for (int off = 16; off > 0; off /= 2) {
            l += __shfl_xor_sync(0xffffffffu, l, off);
            c += __shfl_xor_sync(0xffffffffu, c, off);
        }
        loss += l, correct += c, count += rows;
    }
    if (lane == 0) stats[0] = loss, stats[1] = correct, stats[2] = count;
}

void td_gpu_stats_kernel(cudaStream_t s, const double *row_loss, const double *row_correct,
                         const td_gpu_args *a, int first_slot, int slots, int batch,
                         double *stats) {
    step_stats_kernel<<<1, 32, 0, s>>>(row_loss, row_correct, a, first_slot, slots, batch, stats);
}

__global__ void eval_accumulate_kernel(const double *row_loss, const double *row_correct,
                                       int rows, double *sums) {
    double l = 0, c = 0;
    for (int r = 0; r < rows; r++) {
        l += row_loss[r];
        c += row_correct[r];
    }
    sums[0] += c, sums[1] += l, sums[2] += rows;
}

void td_gpu_eval_accumulate(cudaStream_t s, const double *row_loss, const double *row_correct,
                            int rows, double *sums) {
    eval_accumulate_kernel<<<1, 1, 0, s>>>(row_loss, row_correct, rows, sums);
}

__global__ void tree_sum_kernel(const float *const *src, int count, size_t n, float *out) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v[16];
        for (int j = 0; j < count; j++) v[j] = src[j][i];
        for (int m = count; m > 1; m = (m + 1) / 2) {
            for (int j = 0; j < m / 2; j++) v[j] = __fadd_rn(v[2 * j], v[2 * j + 1]);
            if (m & 1) v[m / 2] = v[m - 1];
        }
        out[i] = v[0];
    }
}

void td_gpu_tree_sum(cudaStream_t s, const float *const *src, int count, size_t n, float *out) {
    tree_sum_kernel<<<blocks_for(n), THREADS, 0, s>>>(src, count, n, out);
}

__global__ void add_kernel(const float *a, float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        b[i] = __fadd_rn(a[i], b[i]);
}

void td_gpu_add(cudaStream_t s, const float *a, float *b, size_t n) {
    add_kernel<<<blocks_for(n), THREADS, 0, s>>>(a, b, n);
}

/* ---- optimizers: src/optim/optim.c's loops, rounding for rounding ---- */
__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n,
                             const td_gpu_args *a) {
    const td_optim_coefs k = a->coefs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float pi = __fmul_rn(p[i], k.decay);
        float mi = __fmaf_rn(gi, k.omb1, __fmul_rn(m[i], k.b1));
        float vi = __fmaf_rn(__fmul_rn(k.omb2, gi), gi, __fmul_rn(v[i], k.b2));
        m[i] = mi;
        v[i] = vi;
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(k.neg_step, mi), denom));
    }
}

void td_gpu_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n,
                  const td_gpu_args *a) {
    adamw_kernel<<<blocks_for(n), THREADS, 0, s>>>(p, g, m, v, n, a);
}

__global__ void sgd_kernel(float *p, const float *g, float *buf, size_t n, const td_gpu_args *a) {
    const td_optim_coefs k = a->coefs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float d = k.use_wd ? __fmaf_rn(p[i], k.wd, g[i]) : g[i];
        if (buf) {
            float b = k.first ? d : __fmaf_rn(d, k.damp, __fmul_rn(buf[i], k.mom));
            buf[i] = b;
            d = k.nesterov ? __fmaf_rn(b, k.mom, d) : b;
        }
        p[i] = __fmaf_rn(d, k.neg_lr, p[i]);
    }
}

void td_gpu_sgd(cudaStream_t s, float *p, const float *g, float *buf, size_t n,
                const td_gpu_args *a) {
    sgd_kernel<<<blocks_for(n), THREADS, 0, s>>>(p, g, buf, n, a);
}

/* ---- element-wise activations (nn.h: GELU's exact erf form, tanh, sigmoid) ---- */
__device__ __forceinline__ float act_value(int kind, float x) {
    if (kind == TD_GPU_ACT_GELU) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    if (kind == TD_GPU_ACT_TANH) return tanhf(x);
    return 1.0f / (1.0f + expf(-x));
}

__global__ void act_kernel(int kind, const float *x, size_t n, float *y) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = act_value(kind, x[i]);
}

void td_gpu_act(cudaStream_t s, int kind, const float *x, size_t n, float *y) {
    act_kernel<<<blocks_for(n), THREADS, 0, s>>>(kind, x, n, y);
}

/* dx = dy f'(x): GELU from the input (Phi(x) + x phi(x)), tanh (1 - y^2) and sigmoid
 * (y (1 - y)) from the output */
__global__ void act_backward_kernel(int kind, const float *x, const float *y, const float *dy,
                                    size_t n, float *dx) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float d;
        if (kind == TD_GPU_ACT_GELU) {
            float v = x[i];
            float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
            float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
            d = cdf + v * pdf;
        } else if (kind == TD_GPU_ACT_TANH) {
            d = 1.0f - y[i] * y[i];
        } else {
            d = y[i] * (1.0f - y[i]);
        }
        dx[i] = dy[i] * d;
    }
}

void td_gpu_act_backward(cudaStream_t s, int kind, const float *x, const float *y,
                         const float *dy, size_t n, float *dx) {
    act_backward_kernel<<<blocks_for(n), THREADS, 0, s>>>(kind, x, y, dy, n, dx);
}

/* ---- average pooling, k x k windows, stride st, no padding ---- */
__global__ void avgpool_kernel(const float *x, int batch, int c, int h, int w, int k, int st,
                               int oh, int ow, float *y) {
    size_t n = (size_t)batch * c * oh * ow;
    float inv = 1.0f / (float)(k * k);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ox = (int)(i % ow);
        size_t t = i / ow;
        int oy = (int)(t % oh);
        size_t plane = t / oh;
        const float *win = x + plane * h * w + (size_t)oy * st * w + (size_t)ox * st;
        float sum = 0.0f;
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) sum += win[(size_t)ki * w + kj];
        y[i] = sum * inv;
    }
}

void td_gpu_avgpool(cudaStream_t s, const float *x, int batch, int c, int h, int w, int k,
                    int stride, int oh, int ow, float *y) {
    avgpool_kernel<<<blocks_for((size_t)batch * c * oh * ow), THREADS, 0, s>>>(x, batch, c, h, w, k,
                                                                              stride, oh, ow, y);
}

/* The adjoint as a gather: input cell (iy, ix) adds dy / k^2 of every window that covers it,
 * windows in (oy, ox) order; cells no window covers get 0. */
__global__ void avgpool_backward_kernel(const float *dy, int batch, int c, int h, int w, int k,
                                        int st, int oh, int ow, float *dx) {
    size_t n = (size_t)batch * c * h * w;
    float inv = 1.0f / (float)(k * k);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ix = (int)(i % w);
        size_t t = i / w;
        int iy = (int)(t % h);
        size_t plane = t / h;
        int oy0 = iy - k + 1 > 0 ? (iy - k + 1 + st - 1) / st : 0, oy1 = min(iy / st, oh - 1);
        int ox0 = ix - k + 1 > 0 ? (ix - k + 1 + st - 1) / st : 0, ox1 = min(ix / st, ow - 1);
        const float *d = dy + plane * oh * ow;
        float sum = 0.0f;
        for (int oy = oy0; oy <= oy1; oy++)
            for (int ox = ox0; ox <= ox1; ox++) sum += d[oy * ow + ox] * inv;
        dx[i] = sum;
    }
}

void td_gpu_avgpool_backward(cudaStream_t s, const float *dy, int batch, int c, int h, int w,
                             int k, int stride, int oh, int ow, float *dx) {
    avgpool_backward_kernel<<<blocks_for((size_t)batch * c * h * w), THREADS, 0, s>>>(
        dy, batch, c, h, w, k, stride, oh, ow, dx);
}

/* ---- global average pooling: [c, h, w] -> [c], each plane summed in double ---- */
__global__ void global_avgpool_kernel(const float *x, size_t planes, int hw, float *y) {
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < planes;
         p += (size_t)gridDim.x * blockDim.x) {
        const float *xp = x + p * hw;
        double sum = 0;
        for (int e = 0; e < hw; e++) sum += xp[e];
        y[p] = (float)(sum / (double)hw);
    }
}

void td_gpu_global_avgpool(cudaStream_t s, const float *x, int batch, int c, int hw, float *y) {
    size_t planes = (size_t)batch * c;
    global_avgpool_kernel<<<blocks_for(planes), THREADS, 0, s>>>(x, planes, hw, y);
}

__global__ void global_avgpool_backward_kernel(const float *dy, size_t n, int hw, float *dx) {
    float inv = 1.0f / (float)hw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dx[i] = dy[i / hw] * inv;
}

void td_gpu_global_avgpool_backward(cudaStream_t s, const float *dy, int batch, int c, int hw,
                                    float *dx) {
    size_t n = (size_t)batch * c * hw;
    global_avgpool_backward_kernel<<<blocks_for(n), THREADS, 0, s>>>(dy, n, hw, dx);
}

/* ---- layer normalisation over each sample's d values ----
 * One block per sample; each sum is THREADS strided partials in double, then a fixed tree in
 * shared memory: the same bits on every launch. */
__device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int off = blockDim.x / 2; off > 0; off >>= 1) {
        if (threadIdx.x < off) sh[threadIdx.x] += sh[threadIdx.x + off];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

__global__ void layernorm_kernel(const float *x, const float *w, const float *b, int batch, int d,
                                 float eps, float *y, float *stats) {
    __shared__ double sh[THREADS];
    for (int s = blockIdx.x; s < batch; s += gridDim.x) {
        const float *xs = x + (size_t)s * d;
        double acc = 0;
        for (int e = threadIdx.x; e < d; e += blockDim.x) acc += xs[e];
        double mean = block_sum(acc, sh) / (double)d;
        acc = 0;
        for (int e = threadIdx.x; e < d; e += blockDim.x) {
            double t = (double)xs[e] - mean;
            acc += t * t;
        }
        double sq = block_sum(acc, sh);
        float mu = (float)mean, rstd = (float)(1.0 / sqrt(sq / (double)d + (double)eps));
        if (threadIdx.x == 0) stats[2 * s] = mu, stats[2 * s + 1] = rstd;
        for (int e = threadIdx.x; e < d; e += blockDim.x)
            y[(size_t)s * d + e] = (xs[e] - mu) * rstd * w[e] + b[e];
    }
}

void td_gpu_layernorm(cudaStream_t s, const float *x, const float *w, const float *b, int batch,
                      int d, float eps, float *y, float *stats) {
    layernorm_kernel<<<grid_x((size_t)batch), THREADS, 0, s>>>(x, w, b, batch, d, eps, y, stats);
}

/* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, one block per sample */
__global__ void layernorm_dx_kernel(const float *x, const float *dy, const float *w,
                                    const float *stats, int batch, int d, float *dx) {
    __shared__ double sh[THREADS];
    for (int s = blockIdx.x; s < batch; s += gridDim.x) {
        const float *xs = x + (size_t)s * d, *dys = dy + (size_t)s * d;
        float mu = stats[2 * s], rstd = stats[2 * s + 1];
        double a = 0, c = 0;
        for (int e = threadIdx.x; e < d; e += blockDim.x) {
            float g = dys[e] * w[e], xh = (xs[e] - mu) * rstd;
            a += (double)g;
            c += (double)g * (double)xh;
        }
        float mg = (float)(block_sum(a, sh) / (double)d);
        float mgx = (float)(block_sum(c, sh) / (double)d);
        for (int e = threadIdx.x; e < d; e += blockDim.x) {
            float xh = (xs[e] - mu) * rstd;
            dx[(size_t)s * d + e] = rstd * (dys[e] * w[e] - mg - xh * mgx);
        }
    }
}

/* dw[e] = sum over samples of dy xhat, db[e] = sum of dy: a thread per e, samples in order */
__global__ void layernorm_dw_kernel(const float *x, const float *dy, const float *stats, int batch,
                                    int d, float *dw, float *db) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (size_t)d;
         e += (size_t)gridDim.x * blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (int s = 0; s < batch; s++) {
            size_t i = (size_t)s * d + e;
            sw += dy[i] * ((x[i] - stats[2 * s]) * stats[2 * s + 1]);
            sb += dy[i];
        }
        dw[e] = sw, db[e] = sb;
    }
}

void td_gpu_layernorm_backward(cudaStream_t s, cudaStream_t side, const float *x, const float *dy,
                               const float *w, const float *stats, int batch, int d, float *dx,
                               float *dw, float *db) {
    layernorm_dw_kernel<<<blocks_for((size_t)d), THREADS, 0, side>>>(x, dy, stats, batch, d, dw,
                                                                     db);
    if (dx) layernorm_dx_kernel<<<grid_x((size_t)batch), THREADS, 0, s>>>(x, dy, w, stats, batch, d,
                                                                          dx);
}

/* ---- residual: out = a + b ---- */
__global__ void sum_kernel(const float *a, const float *b, size_t n, float *out) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

void td_gpu_sum(cudaStream_t s, const float *a, const float *b, size_t n, float *out) {
    sum_kernel<<<blocks_for(n), THREADS, 0, s>>>(a, b, n, out);
}

/* ---- batch normalisation, per channel over batch x hw values ----
 * The sums are taken in double, as the CPU takes them, and in a fixed order whatever the
 * scheduling: block (ch, j) covers rows [j R, j R + R) of channel ch's planes, each thread every
 * bd-th value of that range into partials of its own, the block's tree (block_sum) sums those
 * into part[ch][j], and one thread per channel adds the chunks j in order. The chunks depend on
 * the batch and the channels alone, never on the slot's valid rows (read on the device: a graph
 * replays one launch for every slot), so every rank takes the same sums for the same micro-batch.
 * Blocks number about BN_TARGET_BLOCKS: one block per channel left most of the SMs idle (16-64
 * blocks for resnet-small, whose two BatchNorm sums were 62% of the step on an H200). */
#define BN_TARGET_BLOCKS 512
#define BN_MAX_CHUNKS 64

/* The rows of a batch that hold samples: a training step's slot may be short (the epoch's tail)
 * and its padding rows must not enter the statistics; slot < 0: all of them. */
__device__ __forceinline__ int valid_rows(const td_gpu_args *a, int slot, int batch) {
    return a->training && slot >= 0 ? TD_GPU_SLOT_ROWS(a, slot, batch) : batch;
}

/* the most chunks for a batch of `batch` rows and c channels */
static int bn_max_chunks(int batch, int c) {
    int j = (BN_TARGET_BLOCKS + c - 1) / c;
    j = j > BN_MAX_CHUNKS ? BN_MAX_CHUNKS : j;
    return j > batch ? (batch > 0 ? batch : 1) : j;
}

/* rows per chunk; *chunks: how many chunks (at most bn_max_chunks: the rows round up) */
static int bn_rows_per_chunk(int batch, int c, int *chunks) {
    int j = bn_max_chunks(batch, c), rows = (batch + j - 1) / j;
    *chunks = rows > 0 ? (batch + rows - 1) / rows : 1;
    return rows > 0 ? rows : 1;
}

/* bn_max_chunks grows with the batch, and the chunks never exceed it */
size_t td_gpu_batchnorm_part_doubles(int max_batch, int c) {
    return (size_t)c * bn_max_chunks(max_batch, c) * 2;
}

/* Thread t's partial sums over its block's chunk (t.bx the channel, t.by the chunk) of the first
 * `rows` rows: with dy NULL, sum x and sum x^2; else sum dy and sum dy xhat, xhat = (x - mu) r
 * rounded to float as the forward's. The value index advances without a division. */
__host__ __device__ static inline void bn_sums_thread(tix t, const float *x, const float *dy,
                                                      float mu, float r, int rows, int rows_per,
                                                      int c, int hw, double *s0, double *s1) {
    int ch = (int)t.bx, r0 = (int)t.by * rows_per, r1 = imin(r0 + rows_per, rows);
    double a = 0, b = 0;
    if (r1 > r0) {
        size_t n = (size_t)(r1 - r0) * hw;
        int q = (int)t.bd / hw, rem = (int)t.bd % hw, s = r0 + (int)t.tx / hw, e = (int)t.tx % hw;
        for (size_t k = t.tx; k < n; k += t.bd) {
            size_t i = ((size_t)s * c + ch) * hw + e;
            if (dy) {
                float xh = (x[i] - mu) * r;
                a += (double)dy[i];
                b += (double)dy[i] * (double)xh;
            } else {
                double v = x[i];
                a += v, b += v * v;
            }
            e += rem, s += q;
            if (e >= hw) e -= hw, s++;
        }
    }
    *s0 = a, *s1 = b;
}

/* where block (ch, j)'s two sums go in part */
__host__ __device__ static inline size_t bn_part_at(int ch, int j, int chunks) {
    return ((size_t)ch * chunks + j) * 2;
}

/* channel ch's sums: its chunks' partials in order */
__host__ __device__ static inline void bn_chunk_sums(const double *part, int ch, int chunks,
                                                     double *s0, double *s1) {
    double a = 0, b = 0;
    for (int j = 0; j < chunks; j++) {
        a += part[bn_part_at(ch, j, chunks)];
        b += part[bn_part_at(ch, j, chunks) + 1];
    }
    *s0 = a, *s1 = b;
}

/* mean, biased variance = E[x^2] - mean^2 (clamped at 0) of n values from their sums */
__host__ __device__ static inline void bn_stats_from_sums(double sum, double sq, size_t n, int c,
                                                          int ch, float eps, float *stats,
                                                          float *batch_stats) {
    double dn = (double)n, mu = sum / dn, var = fmax(0.0, sq / dn - mu * mu);
    stats[ch] = (float)mu;
    stats[c + ch] = (float)(1.0 / sqrt(var + (double)eps));
    batch_stats[ch] = (float)mu;
    batch_stats[c + ch] = (float)(n > 1 ? var * dn / (dn - 1) : var);
}

/* grid (c, chunks): part[ch][j] = block (ch, j)'s two sums; stats: (mean, rstd) for dy's sums */
__global__ void batchnorm_sums_kernel(const float *x, const float *dy, const float *stats,
                                      int batch, int slot, int c, int hw, int rows_per,
                                      const td_gpu_args *a, double *part) {
    __shared__ double sh[THREADS];
    if (!dy && !a->training) return; /* evaluation's forward uses the running statistics */
    int ch = (int)blockIdx.x;
    float mu = dy ? stats[ch] : 0.0f, r = dy ? stats[c + ch] : 0.0f;
    double s0, s1;
    bn_sums_thread(TIX(), x, dy, mu, r, valid_rows(a, slot, batch), rows_per, c, hw, &s0, &s1);
    s0 = block_sum(s0, sh);
    s1 = block_sum(s1, sh);
    if (threadIdx.x == 0) {
        double *p = part + bn_part_at(ch, (int)blockIdx.y, (int)gridDim.y);
        p[0] = s0, p[1] = s1;
    }
}

__global__ void batchnorm_stats_kernel(const double *part, int chunks, int batch, int slot, int c,
                                       int hw, float eps, const td_gpu_args *a,
                                       const float *running, float *stats, float *batch_stats) {
    int rows = valid_rows(a, slot, batch);
    for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x) {
        if (!a->training) { /* evaluation: the running statistics */
            stats[ch] = running[ch];
            stats[c + ch] = (float)(1.0 / sqrt((double)running[c + ch] + (double)eps));
        } else if (rows == 0) { /* a slot without samples: finite statistics, no running update */
            stats[ch] = 0.0f, stats[c + ch] = 1.0f;
            batch_stats[ch] = batch_stats[c + ch] = 0.0f;
        } else {
            double sum, sq;
            bn_chunk_sums(part, ch, chunks, &sum, &sq);
            bn_stats_from_sums(sum, sq, (size_t)rows * hw, c, ch, eps, stats, batch_stats);
        }
    }
}

__global__ void batchnorm_apply_kernel(const float *x, const float *gamma, const float *beta,
                                       const float *stats, int c, int hw, size_t n, float *y) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ch = (int)(i / hw % c);
        float xh = (x[i] - stats[ch]) * stats[c + ch];
        y[i] = __fmaf_rn(xh, gamma[ch], beta[ch]);
    }
}

void td_gpu_batchnorm(cudaStream_t s, const float *x, const float *gamma, const float *beta,
                      int batch, int slot, int c, int hw, float eps, const td_gpu_args *a,
                      const float *running, double *part, float *stats, float *batch_stats,
                      float *y) {
    int chunks, rows_per = bn_rows_per_chunk(batch, c, &chunks);
    batchnorm_sums_kernel<<<dim3(grid_x((size_t)c), chunks), THREADS, 0, s>>>(
        x, NULL, NULL, batch, slot, c, hw, rows_per, a, part);
    batchnorm_stats_kernel<<<blocks_for((size_t)c), THREADS, 0, s>>>(
        part, chunks, batch, slot, c, hw, eps, a, running, stats, batch_stats);
    size_t n = (size_t)batch * c * hw;
    batchnorm_apply_kernel<<<blocks_for(n), THREADS, 0, s>>>(x, gamma, beta, stats, c, hw, n, y);
}

/* dgamma = sum dy xhat, dbeta = sum dy (overwritten); red = the means of both over the n values
 * in training (the batch statistics depend on x), 0 in evaluation */
__global__ void batchnorm_reduce_kernel(const double *part, int chunks, int batch, int slot,
                                        int c, int hw, const td_gpu_args *a, float *dgamma,
                                        float *dbeta, float *red) {
    size_t n = (size_t)valid_rows(a, slot, batch) * hw;
    for (int ch = blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += gridDim.x * blockDim.x) {
        double sdy, sdyx;
        bn_chunk_sums(part, ch, chunks, &sdy, &sdyx);
        dgamma[ch] = (float)sdyx, dbeta[ch] = (float)sdy;
        red[ch] = a->training && n ? (float)(sdy / (double)n) : 0.0f;
        red[c + ch] = a->training && n ? (float)(sdyx / (double)n) : 0.0f;
    }
}

/* padding rows (past the slot's) get 0: nothing flows from them into the weight gradients */
__global__ void batchnorm_dx_kernel(const float *x, const float *dy, const float *gamma,
                                    const float *stats, const float *red, int batch, int slot,
                                    int c, int hw, const td_gpu_args *a, float *dx) {
    size_t n = (size_t)batch * c * hw, valid = (size_t)valid_rows(a, slot, batch) * c * hw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        if (i >= valid) {
            dx[i] = 0.0f;
            continue;
        }
        int ch = (int)(i / hw % c);
        float mu = stats[ch], r = stats[c + ch], k = gamma[ch] * r;
        float xh = (x[i] - mu) * r;
        dx[i] = k * (dy[i] - red[ch] - xh * red[c + ch]);
    }
}

void td_gpu_batchnorm_backward(cudaStream_t s, const float *x, const float *dy,
                               const float *gamma, const float *stats, int batch, int slot, int c,
                               int hw, const td_gpu_args *a, double *part, float *red, float *dx,
                               float *dgamma, float *dbeta) {
    int chunks, rows_per = bn_rows_per_chunk(batch, c, &chunks);
    batchnorm_sums_kernel<<<dim3(grid_x((size_t)c), chunks), THREADS, 0, s>>>(
        x, dy, stats, batch, slot, c, hw, rows_per, a, part);
    batchnorm_reduce_kernel<<<blocks_for((size_t)c), THREADS, 0, s>>>(part, chunks, batch, slot,
                                                                      c, hw, a, dgamma, dbeta, red);
    size_t n = (size_t)batch * c * hw;
    if (dx)
        batchnorm_dx_kernel<<<blocks_for(n), THREADS, 0, s>>>(x, dy, gamma, stats, red, batch,
                                                              slot, c, hw, a, dx);
}
