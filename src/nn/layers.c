/* Forward and backward of the per-sample layers over a range of batch rows. Linear layers are
 * batch-level gemms and live in model.c. Shapes are per sample unless said otherwise. */
#include <math.h>
#include <string.h>

#include "nn_internal.h"

uint64_t td_dropout_key(uint64_t seed, uint64_t step, int li) {
    return td_mix64(seed ^ td_mix64(step) ^ td_mix64(0x64726f70ull + (uint64_t)li));
}

static bool conv_is_pointwise(const td_layer *l) {
    return l->kernel == 1 && l->stride == 1 && l->pad == 0;
}

static size_t conv_col_floats(const td_layer *l) {
    size_t n = (size_t)l->in_c * l->kernel * l->kernel * l->out_h * l->out_w;
    return (n + 15) & ~(size_t)15;
}

/* Stride 2 lowers through parity planes where taps overlap; a 1x1 kernel (a projection
 * shortcut) reads every other float of every other row once, which td_im2col's strided copy
 * does without splitting the whole image first (resnet-small's shortcuts ran at 40-64 GFLOP/s
 * with the planes). */
static bool conv_uses_parity(const td_layer *l) {
    return l->stride == 2 && l->kernel > 1;
}

/* Floats of a sample's lowering in scratch: the column matrix, then the parity planes for
 * stride 2 ... */
static size_t conv_lowered_floats(const td_layer *l) {
    size_t n = conv_col_floats(l);
    if (conv_uses_parity(l)) n += td_parity_floats(l->in_c, l->in_h, l->in_w, l->kernel, l->pad);
    return n;
}

/* A lowered conv's three gemms per sample are tandem's own (td_gemm_ordered) where the lowered
 * depth kk = in_c k k is 64 or more (resnet-small's stride-2 convs, kk = 144 and 288: 5-9%
 * faster than OpenBLAS's at 110-135 GFLOP/s on Zen 5), OpenBLAS's below it (a 3-channel first
 * layer, kk = 27, and the 1x1 shortcuts, 16 and 32, where its small-matrix kernels were as fast
 * or faster). By the shape alone: the same choice on every rank. */
static bool conv_own_gemm(const td_layer *l) {
    return l->in_c * l->kernel * l->kernel >= 64;
}

/* The weight gradient dW [out_c, kk] = the sum over samples and positions of dy [out_c, n] x
 * col^T: both operands run along the summed positions, and tandem's gemm reads its second
 * operand position-major, so the smaller of dy and col is transposed. With dy transposed the
 * product is dW^T [kk, out_c], kept over the chunk's samples and transposed into dW at the end.
 * Either way each weight is one chain of multiply-adds over (sample, position) in order, and a
 * product's operands commute exactly: the same bits. */
static bool conv_transposes_dy(const td_layer *l) {
    return l->out_c < l->in_c * l->kernel * l->kernel;
}

/* ... then, for tandem's gemm, the transposed operand [out_h * out_w, out_c or kk] and
 * dW^T [kk, out_c]. */
static size_t conv_wgrad_floats(const td_layer *l) {
    if (!conv_own_gemm(l)) return 0;
    int kk = l->in_c * l->kernel * l->kernel;
    size_t n = (size_t)l->out_h * l->out_w;
    return ((n * (size_t)TD_MIN(kk, l->out_c) + 15) & ~(size_t)15) + (size_t)kk * l->out_c;
}

/* A stride-1 conv with tandem's gemm reads its input where it lies instead of lowering it
 * (td_gemm_indirect): row t = (c, ki, kj) of the column matrix is the image, padded to
 * [in_c, in_h + 2 pad, wp = in_w + 2 pad], read from (c, ki, kj) on, at the flat positions
 * f = oy wp + ox. The k - 1 positions past a row's last output (ox >= out_w) are computed and
 * dropped forward, and given zero gradients for the weight gradient, which adds exact zeros to
 * each weight's chain: the same bits as the lowered gemm. im2col wrote kk x n floats a sample
 * (LeNet-5's 5x5 convs: 24% of its step) for a gemm that reads each of them once; the padded
 * copy is in_c (h + 2 pad) (w + 2 pad), none at all without padding. */
static int conv_flat(const td_layer *l);

static bool conv_implicit(const td_layer *l) {
    if (l->stride != 1 || l->kernel == 1 || l->wino) return false;
    /* Below kk = 64 the forward too where there are fewer than 16 output channels: OpenBLAS's
     * small-matrix kernel ran LeNet-5's conv1 (6 x 784 x 25) at 0.21 ms a batch with its
     * im2col, the implicit gemm at 0.13 (its weight gradient stays lowered: dY^T's transposes
     * cost more there than they save) */
    int kk = l->in_c * l->kernel * l->kernel;
    if (!conv_own_gemm(l) && !(kk >= 16 && l->out_c < 16)) return false;
    /* ... where the dropped positions cost the gemm less than im2col's copy: the copy costs
     * ~18 times a position's multiply-adds per output channel (Zen 5: 0.18 ns a float against
     * 0.01 ns a multiply-add), so (flat - n) out_c <= 16 n. A 5x5 'same' conv of 64 channels
     * on 16x16 (23% more positions) is 7% faster forward; on 8x8 (44%) it would be slower. */
    size_t n = (size_t)l->out_h * l->out_w;
    return ((size_t)conv_flat(l) - n) * (size_t)l->out_c <= 16 * n;
}

/* ... the weight gradient too where it is dW^T = col dy^T (conv_transposes_dy: col is then
 * td_gemm_indirect's listed a); otherwise it lowers x as before. */
static bool conv_implicit_wgrad(const td_layer *l) {
    return conv_implicit(l) && conv_own_gemm(l) && conv_transposes_dy(l);
}

static int conv_padded_w(const td_layer *l) {
    return l->in_w + 2 * l->pad;
}

/* Flat positions of the implicit gemm: out_h rows of wp, the last one cut at out_w. */
static int conv_flat(const td_layer *l) {
    return (l->out_h - 1) * conv_padded_w(l) + l->out_w;
}

static size_t round16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

static size_t conv_padded_floats(const td_layer *l) {
    return l->pad ? round16((size_t)l->in_c * (l->in_h + 2 * l->pad) * conv_padded_w(l)) : 0;
}

/* The implicit weight gradient's taps per row of its gemm: a conv of few output channels gives
 * dW^T rows of out_c columns, a sixth of an AVX-512 tile's width for the CIFAR tutorial's conv1
 * (6). g consecutive taps (c, ki, kj .. kj + g - 1) of one kernel row share a row instead:
 * tap kj + i reads x i floats on from kj, so its column block multiplies x[f'] by dY^T's row
 * f' - i (zero outside), over f' < flat + g - 1: a row of g out_c columns that is a window of
 * dY^T itself, rows f' - g + 1 .. f' (no copy). Each weight's chain gains exact zeros at its
 * start and end, nothing else: the same bits. g = 32 / out_c, at most k, by the shape alone
 * (the same on every build); the taps left over at a kernel row's end (k % g) have a row each.
 * Rows of 64 columns were no faster for 16 channels and slower for 32 (the left-over taps'
 * rows are narrow). */
static int conv_tap_group(const td_layer *l) {
    return conv_implicit_wgrad(l) ? TD_MAX(1, TD_MIN(32 / l->out_c, l->kernel)) : 1;
}

/* Implicit scratch: [the wide output (forward) or the column gradient (backward) | the padded
 * image (none without padding) | dy^T on the flat positions, g - 1 zero rows either side
 * (conv_tap_group)], then dW^T as for the lowered path. conv_padded_at: where the padded image
 * starts, the wide output or column gradient before it. */
static size_t conv_padded_at(const td_layer *l) {
    return TD_MAX(conv_col_floats(l), round16((size_t)l->out_c * conv_flat(l)));
}

static size_t conv_implicit_floats(const td_layer *l) {
    size_t dyt = (size_t)l->out_c * (conv_flat(l) + 2 * (conv_tap_group(l) - 1));
    return conv_padded_at(l) + conv_padded_floats(l) + round16(dyt) +
           (size_t)l->in_c * l->kernel * l->kernel * l->out_c;
}

size_t td__conv_scratch_floats(const td_layer *l) {
    size_t n = conv_lowered_floats(l) + conv_wgrad_floats(l);
    return conv_implicit(l) ? TD_MAX(n, conv_implicit_floats(l)) : n;
}

/* l->taps: [kk] each lowered row's offset in the padded image, in order (c, ki, kj); then, for
 * the weight gradient, [groups] the first tap's offset of each group of g, [singles] those of
 * the taps left over, and [kk] which tap each row of its dW^T holds (a group's g taps in a row
 * of g out_c columns count as g rows). */
void td__conv_prepare(td_layer *l) {
    if (!conv_implicit(l)) return;
    int k = l->kernel, hp = l->in_h + 2 * l->pad, wp = conv_padded_w(l);
    int kk = l->in_c * k * k, g = conv_tap_group(l), per_row = k / g;
    l->tap_groups = l->in_c * k * per_row;
    l->tap_singles = l->in_c * k * (k - per_row * g);
    l->taps = td_xmalloc(sizeof(ptrdiff_t) * (size_t)(2 * kk + l->tap_groups + l->tap_singles));
    ptrdiff_t *groups = l->taps + kk, *singles = groups + l->tap_groups;
    ptrdiff_t *row_tap = singles + l->tap_singles;
    for (int c = 0, t = 0, q = 0, u = 0; c < l->in_c; c++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++, t++) {
                l->taps[t] = ((ptrdiff_t)c * hp + ki) * wp + kj;
                if (kj < per_row * g) { /* its columns in the group's row: last tap first */
                    if (kj % g == 0) groups[q++] = l->taps[t];
                    row_tap[(q - 1) * g + g - 1 - kj % g] = t;
                } else {
                    singles[u] = l->taps[t];
                    row_tap[l->tap_groups * g + u++] = t;
                }
            }
}

/* x, padded with zeros into buf for the implicit gemm (x itself without padding). */
static const float *conv_pad(const td_layer *l, const float *x, float *buf) {
    if (!l->pad) return x;
    int p = l->pad, hp = l->in_h + 2 * p, wp = conv_padded_w(l);
    for (int c = 0; c < l->in_c; c++) {
        float *d = buf + (size_t)c * hp * wp;
        memset(d, 0, sizeof(float) * ((size_t)p * wp + p));
        for (int i = 0; i < l->in_h; i++) {
            memcpy(d + (size_t)(p + i) * wp + p, x + ((size_t)c * l->in_h + i) * l->in_w,
                   sizeof(float) * l->in_w);
            /* this row's right padding and the next row's left */
            memset(d + (size_t)(p + i) * wp + p + l->in_w, 0, sizeof(float) * 2 * p);
        }
        memset(d + (size_t)(p + l->in_h) * wp + p, 0, sizeof(float) * ((size_t)p * wp - p));
    }
    return buf;
}

/* One sample's column matrix into col; stride 2 builds it from parity planes kept after it. */
static void lower(const td_layer *l, const float *x, float *col) {
    if (conv_uses_parity(l))
        td_im2col_s2(x, l->in_c, l->in_h, l->in_w, l->kernel, l->pad, l->out_h, l->out_w,
                     col + conv_col_floats(l), col);
    else
        td_im2col(x, l->in_c, l->in_h, l->in_w, l->kernel, l->kernel, l->stride, l->pad,
                  l->out_h, l->out_w, col);
}

/* lower's adjoint: one sample's input gradient dx written from the column gradient col (the
 * parity planes after col again for stride 2). */
static void lift(const td_layer *l, float *col, float *dx) {
    if (conv_uses_parity(l)) {
        td_col2im_s2(col, l->in_c, l->in_h, l->in_w, l->kernel, l->pad, l->out_h, l->out_w,
                     col + conv_col_floats(l), dx);
        return;
    }
    memset(dx, 0, sizeof(float) * l->in_size);
    td_col2im(col, l->in_c, l->in_h, l->in_w, l->kernel, l->kernel, l->stride, l->pad, l->out_h,
              l->out_w, dx);
}

/* x [in_c, in_h, in_w] -> y [out_c, out_h * out_w]; W [out_c, in_c * k * k], b [out_c]. */
static void conv_forward(td_model_t *m, td_layer *l, int s0, int s1, int tid) {
    const float *w = m->params + l->param_offset, *bias = w + l->weight_count;
    int kk = l->in_c * l->kernel * l->kernel, n = l->out_h * l->out_w;
    const float *x0 = m->acts[l->src];
    if (l->wino) { /* the whole chunk at once: its tiles batched into each gemm */
        td__wino_conv(x0 + (size_t)s0 * l->in_size, l->in_size, s1 - s0, l->in_c, l->in_h, l->in_w,
                      l->pad, l->wino_u, l->out_c, l->out_h, l->out_w, bias,
                      l->out + (size_t)s0 * l->out_size, l->out_size, m->scratch[tid]);
        return;
    }
    if (conv_implicit(l)) {
        float *wide = m->scratch[tid];
        float *pad = wide + conv_padded_at(l);
        int f = conv_flat(l), wp = conv_padded_w(l);
        for (int s = s0; s < s1; s++) {
            const float *xp = conv_pad(l, x0 + (size_t)s * l->in_size, pad);
            float *y = l->out + (size_t)s * l->out_size;
            td_gemm_indirect(l->out_c, f, kk, w, NULL, kk, 1, xp, l->taps, 0, wide, (size_t)f,
                             false);
            for (int oc = 0; oc < l->out_c; oc++)
                for (int oy = 0; oy < l->out_h; oy++) {
                    float bv = bias[oc], *yr = y + ((size_t)oc * l->out_h + oy) * l->out_w;
                    const float *wr = wide + (size_t)oc * f + (size_t)oy * wp;
#pragma omp simd
                    for (int ox = 0; ox < l->out_w; ox++) yr[ox] = wr[ox] + bv;
                }
        }
        return;
    }
    for (int s = s0; s < s1; s++) {
        const float *x = x0 + (size_t)s * l->in_size;
        float *y = l->out + (size_t)s * l->out_size;
        const float *col = x;
        if (!conv_is_pointwise(l)) {
            lower(l, x, m->scratch[tid]);
            col = m->scratch[tid];
        }
        if (conv_own_gemm(l))
            td_gemm_ordered(l->out_c, n, kk, w, kk, 1, col, (size_t)n, y, (size_t)n, false);
        else
            td_sgemm(false, false, l->out_c, n, kk, 1.0f, w, kk, col, n, 0.0f, y, n);
        for (int oc = 0; oc < l->out_c; oc++) {
            float bv = bias[oc], *yr = y + (size_t)oc * n;
#pragma omp simd
            for (int i = 0; i < n; i++) yr[i] += bv;
        }
    }
}

/* Weight and bias gradients of rows [s0, s1) go to this chunk's partial slot (overwritten, not
 * accumulated: the model adds the slots into grads in chunk order afterwards). */
static void conv_backward(td_model_t *m, td_layer *l, int s0, int s1, int chunk, int tid,
                          const float *dout, size_t ldo, float *din, size_t ldi) {
    const float *w = m->params + l->param_offset;
    float *pw = l->partial + (size_t)chunk * l->param_count, *pb = pw + l->weight_count;
    int kk = l->in_c * l->kernel * l->kernel, n = l->out_h * l->out_w;
    const float *x0 = m->acts[l->src];
    bool pointwise = conv_is_pointwise(l);
    if (l->wino) { /* weight gradient of the whole chunk as 36 gemms over its tiles */
        for (int s = s0; s < s1; s++)
            for (int oc = 0; oc < l->out_c; oc++) {
                float g = td_sum(dout + (size_t)s * ldo + (size_t)oc * n, (size_t)n);
                pb[oc] = s == s0 ? g : pb[oc] + g;
            }
        td__wino_backward(x0 + (size_t)s0 * l->in_size, l->in_size, s1 - s0, l->in_c, l->in_h,
                          l->in_w, l->pad, dout + (size_t)s0 * ldo, ldo, l->out_c, l->out_h,
                          l->out_w, l->wino_u, pw, l->need_din ? din + (size_t)s0 * ldi : NULL,
                          ldi, m->scratch[tid]);
        return;
    }
    float *dwt = conv_own_gemm(l) /* dW^T, the last of scratch (conv_wgrad_floats) */
                     ? m->scratch[tid] + td__conv_scratch_floats(l) - (size_t)kk * l->out_c
                     : NULL;
    int f = conv_flat(l), wp = conv_padded_w(l);
    for (int s = s0; s < s1; s++) {
        const float *x = x0 + (size_t)s * l->in_size;
        const float *dy = dout + (size_t)s * ldo;
        float *col = m->scratch[tid];
        const float *xcol = x;
        if (!pointwise && !conv_implicit_wgrad(l)) {
            lower(l, x, col);
            xcol = col;
        }
        /* dW (+)= dy x col^T (conv_own_gemm, conv_transposes_dy; t: the transposed operand) */
        float *t = col + conv_lowered_floats(l);
        if (conv_implicit_wgrad(l)) { /* dW^T (+)= col dy^T, col read from the padded x */
            float *pad = col + conv_padded_at(l);
            const float *xp = conv_pad(l, x, pad);
            /* dY^T on the flat positions, g - 1 zero rows before and after it */
            int g = conv_tap_group(l), gw = g * l->out_c;
            float *dyt_pad = pad + conv_padded_floats(l);
            t = dyt_pad + (size_t)(g - 1) * l->out_c;
            memset(dyt_pad, 0, sizeof(float) * (size_t)(g - 1) * l->out_c);
            memset(t + (size_t)f * l->out_c, 0, sizeof(float) * (size_t)(g - 1) * l->out_c);
            for (int oy = 0; oy < l->out_h; oy++) {
                float *tr = t + (size_t)oy * wp * l->out_c;
                td_transpose(dy + (size_t)oy * l->out_w, l->out_c, l->out_w, (size_t)n, tr,
                             (size_t)l->out_c, l->out_c);
                if (oy + 1 < l->out_h)
                    memset(tr + (size_t)l->out_w * l->out_c, 0,
                           sizeof(float) * (size_t)(wp - l->out_w) * l->out_c);
            }
            /* a group's row f' reads dY^T's rows f' - g + 1 .. f', g out_c floats from
             * dyt_pad's row f': one tap's rows after another, the group's last tap first */
            const ptrdiff_t *groups = l->taps + kk, *singles = groups + l->tap_groups;
            td_gemm_indirect(l->tap_groups, gw, f + g - 1, xp, groups, 0, 1, dyt_pad, NULL,
                             (size_t)l->out_c, dwt, (size_t)gw, s > s0);
            td_gemm_indirect(l->tap_singles, l->out_c, f, xp, singles, 0, 1, t, NULL,
                             (size_t)l->out_c, dwt + (size_t)l->tap_groups * gw,
                             (size_t)l->out_c, s > s0);
        } else if (!conv_own_gemm(l)) {
            td_sgemm(false, true, l->out_c, kk, n, 1.0f, dy, n, xcol, n, s == s0 ? 0.0f : 1.0f,
                     pw, kk);
        } else if (conv_transposes_dy(l)) {
            td_transpose(dy, l->out_c, n, (size_t)n, t, (size_t)l->out_c, l->out_c);
            td_gemm_ordered(kk, l->out_c, n, xcol, n, 1, t, (size_t)l->out_c, dwt,
                            (size_t)l->out_c, s > s0);
        } else {
            td_transpose(xcol, kk, n, (size_t)n, t, (size_t)kk, kk);
            td_gemm_ordered(l->out_c, kk, n, dy, n, 1, t, (size_t)kk, pw, (size_t)kk, s > s0);
        }
        for (int oc = 0; oc < l->out_c; oc++) {
            float g = td_sum(dy + (size_t)oc * n, (size_t)n);
            pb[oc] = s == s0 ? g : pb[oc] + g;
        }
        if (!l->need_din) continue;
        float *dx = din + (size_t)s * ldi;
        /* the column gradient W^T dy, straight into dx for a pointwise conv */
        float *g = pointwise ? dx : col;
        if (conv_own_gemm(l))
            td_gemm_ordered(kk, n, l->out_c, w, 1, kk, dy, (size_t)n, g, (size_t)n, false);
        else
            td_sgemm(true, false, kk, n, l->out_c, 1.0f, w, kk, dy, n, 0.0f, g, n);
        if (!pointwise) lift(l, col, dx);
    }
    if (conv_implicit_wgrad(l) && conv_tap_group(l) > 1) { /* dW^T's rows are taps in groups */
        const ptrdiff_t *row_tap = l->taps + kk + l->tap_groups + l->tap_singles;
        for (int r = 0; r < kk; r++)
            for (int oc = 0; oc < l->out_c; oc++)
                pw[(size_t)oc * kk + row_tap[r]] = dwt[(size_t)r * l->out_c + oc];
    } else if (conv_own_gemm(l) && conv_transposes_dy(l)) {
        td_transpose(dwt, kk, l->out_c, (size_t)l->out_c, pw, (size_t)kk, kk);
    }
}

/* 2x2/2 pooling eight outputs at a time (v8f, nn_internal.h): it reads every other float, and
 * a row of BasicNet's pool has 12 outputs, fewer than an AVX-512 loop's 16 lanes, so `omp simd`
 * left it to the scalar remainder (the pool was 12% of BasicNet's step). The even and odd
 * inputs are split by shuffles. */

/* g ? b : a, lane by lane, for a comparison's mask g (all ones or zero) */
static inline __attribute__((always_inline)) v8f pool_pick(v8i g, v8f b, v8f a) {
    return (v8f)((g & (v8i)b) | (~g & (v8i)a));
}

/* Outputs [0, 8) of a row pair: the scalar loop's comparisons, in lanes. */
static inline __attribute__((always_inline)) void maxpool2_block8(const float *r0, const float *r1,
                                                                  float *yr, uint8_t *ar) {
    v8f t0 = *(const v8f *)r0, t1 = *(const v8f *)(r0 + 8);
    v8f u0 = *(const v8f *)r1, u1 = *(const v8f *)(r1 + 8);
    v8f a = __builtin_shufflevector(t0, t1, 0, 2, 4, 6, 8, 10, 12, 14);
    v8f b = __builtin_shufflevector(t0, t1, 1, 3, 5, 7, 9, 11, 13, 15);
    v8f c = __builtin_shufflevector(u0, u1, 0, 2, 4, 6, 8, 10, 12, 14);
    v8f d = __builtin_shufflevector(u0, u1, 1, 3, 5, 7, 9, 11, 13, 15);
    v8i g1 = b > a, g2 = d > c;
    v8f m1 = pool_pick(g1, b, a), m2 = pool_pick(g2, d, c);
    v8i g3 = m2 > m1;
    *(v8f *)yr = pool_pick(g3, m2, m1);
    /* the masks are -1 or 0: g3 ? 2 + g2 : g1 as 0..3 */
    v8i code = (g3 & (2 - g2)) | (~g3 & -g1);
    for (int i = 0; i < 8; i++) ar[i] = (uint8_t)code[i];
}

/* 2x2 windows, stride 2: the common case. Branch-free: window maxima of ReLU inputs are coin
 * flips a branch predictor cannot learn. */
static void maxpool2_plane(const float *x, int w, int oh, int ow, float *y, uint8_t *am,
                           bool relu) {
    for (int oy = 0; oy < oh; oy++) {
        const float *r0 = x + (size_t)(2 * oy) * w, *r1 = r0 + w;
        float *yr = y + (size_t)oy * ow;
        uint8_t *ar = am + (size_t)oy * ow;
        int ox0 = 0;
        for (; ox0 + 8 <= ow; ox0 += 8)
            maxpool2_block8(r0 + 2 * ox0, r1 + 2 * ox0, yr + ox0, ar + ox0);
#pragma omp simd
        for (int ox = ox0; ox < ow; ox++) { /* < 8 outputs: scalar below AVX-512 is fine */
            float a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];
            int g1 = b > a, g2 = d > c;
            float m1 = g1 ? b : a, m2 = g2 ? d : c;
            int g3 = m2 > m1;
            yr[ox] = g3 ? m2 : m1;
            ar[ox] = (uint8_t)(g3 * (2 + g2) + (1 - g3) * g1);
        }
        if (relu) td_relu(yr, yr, (size_t)ow);
    }
}

/* One output row of the 2x2/2 backward: every input cell is written, the argmax gets the
 * gradient (gated by the folded ReLU), the others 0. Inlined with relu constant. */
static inline __attribute__((always_inline)) void maxpool2_back_row(float *d0, float *d1,
                                                                    const float *dy, const float *y,
                                                                    const uint8_t *am, int ow,
                                                                    bool relu) {
    int ox0 = 0;
    for (; ox0 + 8 <= ow; ox0 += 8) { /* eight outputs, their four inputs interleaved back */
        v8f g = *(const v8f *)(dy + ox0);
        if (relu) g = pool_pick(*(const v8f *)(y + ox0) > 0.0f, g, (v8f){0});
        const uint8_t *c = am + ox0;
        v8i a = {c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]};
        v8i gb = (v8i)g;
        v8f v0 = (v8f)(gb & (a == 0)), v1 = (v8f)(gb & (a == 1));
        v8f v2 = (v8f)(gb & (a == 2)), v3 = (v8f)(gb & (a == 3));
        *(v8f *)(d0 + 2 * ox0) = __builtin_shufflevector(v0, v1, 0, 8, 1, 9, 2, 10, 3, 11);
        *(v8f *)(d0 + 2 * ox0 + 8) = __builtin_shufflevector(v0, v1, 4, 12, 5, 13, 6, 14, 7, 15);
        *(v8f *)(d1 + 2 * ox0) = __builtin_shufflevector(v2, v3, 0, 8, 1, 9, 2, 10, 3, 11);
        *(v8f *)(d1 + 2 * ox0 + 8) = __builtin_shufflevector(v2, v3, 4, 12, 5, 13, 6, 14, 7, 15);
    }
#pragma omp simd
    for (int ox = ox0; ox < ow; ox++) {
        float g = dy[ox];
        if (relu) g = y[ox] > 0.0f ? g : 0.0f;
        uint32_t a = am[ox], gb;
        memcpy(&gb, &g, sizeof gb);
        /* bit masks instead of selects: gcc turns the selects into branches here */
        uint32_t v0 = gb & -(uint32_t)(a == 0), v1 = gb & -(uint32_t)(a == 1);
        uint32_t v2 = gb & -(uint32_t)(a == 2), v3 = gb & -(uint32_t)(a == 3);
        memcpy(&d0[2 * ox], &v0, 4);
        memcpy(&d0[2 * ox + 1], &v1, 4);
        memcpy(&d1[2 * ox], &v2, 4);
        memcpy(&d1[2 * ox + 1], &v3, 4);
    }
}

/* Max pooling other than 2x2/2 with stride 1 or 2 (a ResNet stem's 3x3/2, a 3x3/1), eight
 * outputs at a time: the window's taps in (ki, kj) order, each a vector of the eight outputs'
 * values, with the loop per output's strict comparisons as selects, so the same maximum and the
 * same first argmax. For stride 2, tap kj of outputs o .. o + 7 is the even (kj even) or odd
 * floats of the sixteen from column 2 o + kj (rounded down to even). A loop per output branched
 * on every comparison: a 3x3/2 pool of 64 channels at 32x32 took 5.8 ms of a 44 ms step. */
static bool pool_block8_fits(int w, int k, int st, int o) {
    /* the last float loaded: stride 1, o + (k - 1) + 7; stride 2, 2 o + (k - 1 & ~1) + 15 */
    return st == 1 ? o + k + 7 <= w : 2 * o + ((k - 1) & ~1) + 16 <= w;
}

/* How many of a row's ow outputs the eight-output blocks take: all of them when the last eight's
 * loads fit (the blocks then start at 0, 8, ... and the last at ow - 8, overlapping the one
 * before: the same outputs again, the same values), else the blocks from 0 whose loads fit,
 * leaving the rest to the loop per output. None for other strides. */
static int pool_blocks8_end(int w, int k, int st, int ow) {
    if (st > 2 || ow < 8) return 0;
    if (pool_block8_fits(w, k, st, ow - 8)) return ow;
    int end = 0;
    while (end + 8 <= ow && pool_block8_fits(w, k, st, end)) end += 8;
    return end;
}

/* Tap column kj of eight outputs from input row r (stride 1 or 2). */
static inline __attribute__((always_inline)) v8f pool_tap8(const float *r, int st, int kj) {
    if (st == 1) return *(const v8f *)(r + kj);
    const float *p = r + (kj & ~1);
    v8f t0 = *(const v8f *)p, t1 = *(const v8f *)(p + 8);
    return kj & 1 ? __builtin_shufflevector(t0, t1, 1, 3, 5, 7, 9, 11, 13, 15)
                  : __builtin_shufflevector(t0, t1, 0, 2, 4, 6, 8, 10, 12, 14);
}

static void maxpool_block8(const float *x, int w, int k, int st, bool relu_in, float *y,
                           uint8_t *am) {
    v8f best = {0};
    v8i arg = {0};
    for (int ki = 0; ki < k; ki++)
        for (int kj = 0; kj < k; kj++) {
            v8f v = pool_tap8(x + (size_t)ki * w, st, kj);
            if (ki == 0 && kj == 0) {
                best = v;
                continue;
            }
            v8i up = v > best;
            best = pool_pick(up, v, best);
            arg = (up & (ki * k + kj)) | (~up & arg);
        }
    if (relu_in) best = pool_pick(best > 0.0f, best, (v8f){0});
    *(v8f *)y = best;
    for (int i = 0; i < 8; i++) am[i] = (uint8_t)arg[i];
}

/* x [c, h, w] -> y [c, out_h, out_w], aux = argmax offset ki * k + kj within each window.
 * With relu_in the preceding ReLU is folded in: max(relu(x)) = relu(max(x)), and the gradient
 * reaches the argmax only where that max is positive, as ReLU's backward would decide. */
static void maxpool_forward(td_model_t *m, td_layer *l, int s0, int s1) {
    const float *x0 = m->acts[l->src];
    int k = l->kernel, st = l->stride, blocks_end = pool_blocks8_end(l->in_w, k, st, l->out_w);
    for (int s = s0; s < s1; s++) {
        for (int c = 0; c < l->out_c; c++) {
            const float *x = x0 + (size_t)s * l->in_size + (size_t)c * l->in_h * l->in_w;
            size_t obase = (size_t)s * l->out_size + (size_t)c * l->out_h * l->out_w;
            float *y = l->out + obase;
            uint8_t *am = l->aux + obase;
            if (k == 2 && st == 2) {
                maxpool2_plane(x, l->in_w, l->out_h, l->out_w, y, am, l->relu_in);
                continue;
            }
            for (int oy = 0; oy < l->out_h; oy++) {
                const float *xr = x + (size_t)oy * st * l->in_w;
                float *yr = y + (size_t)oy * l->out_w;
                uint8_t *ar = am + (size_t)oy * l->out_w;
                int ox = 0;
                for (; ox < blocks_end; ox += 8) {
                    int o = TD_MIN(ox, blocks_end - 8);
                    maxpool_block8(xr + (size_t)o * st, l->in_w, k, st, l->relu_in, yr + o, ar + o);
                }
                for (; ox < l->out_w; ox++) {
                    const float *win = xr + (size_t)ox * st;
                    float best = win[0];
                    int arg = 0;
                    for (int ki = 0; ki < k; ki++)
                        for (int kj = 0; kj < k; kj++) {
                            float v = win[(size_t)ki * l->in_w + kj];
                            if (v > best) {
                                best = v;
                                arg = ki * k + kj;
                            }
                        }
                    yr[ox] = l->relu_in && !(best > 0.0f) ? 0.0f : best;
                    ar[ox] = (uint8_t)arg;
                }
            }
        }
    }
}

static void maxpool_backward(td_layer *l, int s0, int s1, const float *dout, size_t ldo, float *din,
                             size_t ldi) {
    int k = l->kernel, st = l->stride, w = l->in_w;
    bool tiled = k == 2 && st == 2;
    /* the argmax tap's offset in the window, ki w + kj: a table, not a division by the runtime
     * k per output (a 3x3/2 pool's backward spent most of its time dividing) */
    size_t tap_at[TD_MAX_POOL_TAPS];
    for (int a = 0; a < k * k && !tiled; a++) tap_at[a] = (size_t)(a / k) * w + (size_t)(a % k);
    for (int s = s0; s < s1; s++) {
        float *dx = din + (size_t)s * ldi;
        if (!tiled) memset(dx, 0, sizeof(float) * l->in_size);
        for (int c = 0; c < l->out_c; c++) {
            size_t plane = (size_t)c * l->out_h * l->out_w;
            const float *dy = dout + (size_t)s * ldo + plane;
            const float *y = l->out + (size_t)s * l->out_size + plane;
            const uint8_t *am = l->aux + (size_t)s * l->out_size + plane;
            float *dxc = dx + (size_t)c * l->in_h * w;
            if (tiled) { /* every input is written once: no memset */
                for (int oy = 0; oy < l->out_h; oy++) {
                    float *d0 = dxc + (size_t)(2 * oy) * w, *d1 = d0 + w;
                    const float *dyr = dy + (size_t)oy * l->out_w, *yr = y + (size_t)oy * l->out_w;
                    const uint8_t *ar = am + (size_t)oy * l->out_w;
                    if (l->relu_in)
                        maxpool2_back_row(d0, d1, dyr, yr, ar, l->out_w, true);
                    else
                        maxpool2_back_row(d0, d1, dyr, yr, ar, l->out_w, false);
                    if (w > 2 * l->out_w) d0[w - 1] = d1[w - 1] = 0.0f;
                }
                if (l->in_h > 2 * l->out_h)
                    memset(dxc + (size_t)(l->in_h - 1) * w, 0, sizeof(float) * (size_t)w);
                continue;
            }
            for (int oy = 0; oy < l->out_h; oy++) {
                float *win = dxc + (size_t)(oy * st) * w;
                for (int ox = 0; ox < l->out_w; ox++) {
                    int i = oy * l->out_w + ox;
                    float g = l->relu_in && !(y[i] > 0.0f) ? 0.0f : dy[i];
                    win[(size_t)(ox * st) + tap_at[am[i]]] += g;
                }
            }
        }
    }
}

/* u[e] = td_rng_uniform(key, stream, e) for e < n, bit for bit (the determinism test checks),
 * 16 Philox4x32-10 blocks at a time so the rounds vectorise; core's td_rng_fill_uniform does one
 * block per call. Constants and round structure are Salmon et al.'s, as in src/core/rng.c. */
static void philox_uniforms(uint64_t key, uint64_t stream, float *u, size_t n) {
    enum { V = 16 };
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    size_t nblocks = (n + 3) / 4;
    for (size_t base = 0; base < nblocks; base += V) {
        uint32_t c0[V], c1[V], c2[V], c3[V];
        for (int j = 0; j < V; j++) {
            uint64_t blk = base + (size_t)j;
            c0[j] = (uint32_t)blk, c1[j] = (uint32_t)(blk >> 32);
            c2[j] = (uint32_t)stream, c3[j] = (uint32_t)(stream >> 32);
        }
        uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
        for (int r = 0; r < 10; r++) {
#pragma omp simd
            for (int j = 0; j < V; j++) {
                uint64_t p0 = (uint64_t)M0 * c0[j], p1 = (uint64_t)M1 * c2[j];
                uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[j] ^ k0;
                uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[j] ^ k1;
                c1[j] = (uint32_t)p1, c3[j] = (uint32_t)p0, c0[j] = n0, c2[j] = n2;
            }
            k0 += W0, k1 += W1;
        }
        size_t e0 = base * 4;
        float tmp[4 * V];
        for (int j = 0; j < V; j++) {
            tmp[4 * j] = (float)(c0[j] >> 8) * (1.0f / 16777216.0f);
            tmp[4 * j + 1] = (float)(c1[j] >> 8) * (1.0f / 16777216.0f);
            tmp[4 * j + 2] = (float)(c2[j] >> 8) * (1.0f / 16777216.0f);
            tmp[4 * j + 3] = (float)(c3[j] >> 8) * (1.0f / 16777216.0f);
        }
        size_t cnt = TD_MIN((size_t)(4 * V), n - e0);
        memcpy(u + e0, tmp, sizeof(float) * cnt);
    }
}

static void dropout_forward(td_model_t *m, td_layer *l, int s0, int s1, int tid) {
    const float *x0 = m->acts[l->src];
    size_t n = l->out_size;
    if (!m->training || l->p == 0.0f) {
        memcpy(l->out + (size_t)s0 * n, x0 + (size_t)s0 * n, sizeof(float) * n * (size_t)(s1 - s0));
        return;
    }
    uint64_t key = td_dropout_key(m->seed, m->step, (int)(l - m->layers));
    float p = l->p, scale = 1.0f / (1.0f - p), *u = m->scratch[tid];
    for (int s = s0; s < s1; s++) {
        uint64_t id = m->sample_ids ? m->sample_ids[s] : (uint64_t)s;
        philox_uniforms(key, id, u, n);
        const float *x = x0 + (size_t)s * n;
        float *y = l->out + (size_t)s * n;
        uint8_t *mask = l->aux + (size_t)s * n;
#pragma omp simd
        for (size_t e = 0; e < n; e++) {
            mask[e] = u[e] >= p;
            y[e] = td_pick(mask[e], x[e] * scale, 0.0f); /* td_pick: vectorises at AVX2 */
        }
    }
}

static void dropout_backward(td_model_t *m, td_layer *l, int s0, int s1, const float *dout,
                             size_t ldo, float *din, size_t ldi) {
    size_t n = l->out_size;
    bool active = m->training && l->p != 0.0f;
    float scale = 1.0f / (1.0f - l->p);
    for (int s = s0; s < s1; s++) {
        const float *dy = dout + (size_t)s * ldo;
        float *dx = din + (size_t)s * ldi;
        const uint8_t *mask = l->aux + (size_t)s * n;
        if (!active) {
            if (dx != dy) memcpy(dx, dy, sizeof(float) * n);
            continue;
        }
#pragma omp simd
        for (size_t e = 0; e < n; e++) dx[e] = td_pick(mask[e], dy[e] * scale, 0.0f);
    }
}

/* y = x - logsumexp(x) per row. */
static void log_softmax_forward(td_model_t *m, td_layer *l, int s0, int s1) {
    const float *x0 = m->acts[l->src];
    size_t n = l->out_size;
    for (int s = s0; s < s1; s++) {
        const float *x = x0 + (size_t)s * n;
        float *y = l->out + (size_t)s * n;
        float mx = td_max(x, n);
        double se = 0;
        for (size_t i = 0; i < n; i++) se += exp((double)(x[i] - mx));
        float lse = mx + (float)log(se);
        for (size_t i = 0; i < n; i++) y[i] = x[i] - lse;
    }
}

/* dx = dy - softmax * sum(dy), softmax = exp(y). */
static void log_softmax_backward(td_layer *l, int s0, int s1, const float *dout, size_t ldo,
                                 float *din, size_t ldi) {
    size_t n = l->out_size;
    for (int s = s0; s < s1; s++) {
        const float *y = l->out + (size_t)s * n, *dy = dout + (size_t)s * ldo;
        float *dx = din + (size_t)s * ldi;
        double sum = 0;
        for (size_t i = 0; i < n; i++) sum += dy[i];
        for (size_t i = 0; i < n; i++) dx[i] = dy[i] - expf(y[i]) * (float)sum;
    }
}

/* dx = dy * f'(.), from the input (gelu) or the output (tanh: 1 - y^2, sigmoid: y (1 - y));
 * dx may be dy (in place). */
static void activation_backward(td_model_t *m, td_layer *l, int s0, int s1, const float *dout,
                                size_t ldo, float *din, size_t ldi) {
    size_t n = l->out_size;
    for (int s = s0; s < s1; s++) {
        const float *dy = dout + (size_t)s * ldo, *y = l->out + (size_t)s * n;
        const float *x = m->acts[l->src] + (size_t)s * n;
        float *dx = din + (size_t)s * ldi;
        if (l->kind == TD_LAYER_GELU) {
            td_gelu_backward(dx, x, dy, n); /* d/dx [x Phi(x)] = Phi(x) + x phi(x) */
        } else if (l->kind == TD_LAYER_TANH) { /* (dx may be dy: the same element) */
#pragma omp simd
            for (size_t e = 0; e < n; e++) dx[e] = dy[e] * (1.0f - y[e] * y[e]);
        } else {
#pragma omp simd
            for (size_t e = 0; e < n; e++) dx[e] = dy[e] * y[e] * (1.0f - y[e]);
        }
    }
}

/* 2x2/2 average pooling eight outputs at a time, as maxpool2_block8 reads them: each output's
 * sum is the loop per output's, ((((0 + a) + b) + c) + d) * inv in the taps' order, in lanes
 * (LeNet-5's pools: the general loop's window of four ran 0.37 ms of its 3.0 ms step). */
static void avgpool2_plane(const float *x, int w, int oh, int ow, float inv, float *y) {
    for (int oy = 0; oy < oh; oy++) {
        const float *r0 = x + (size_t)(2 * oy) * w, *r1 = r0 + w;
        float *yr = y + (size_t)oy * ow;
        int ox0 = 0;
        for (; ox0 + 8 <= ow; ox0 += 8) {
            const float *p0 = r0 + 2 * ox0, *p1 = r1 + 2 * ox0;
            v8f t0 = *(const v8f *)p0, t1 = *(const v8f *)(p0 + 8);
            v8f u0 = *(const v8f *)p1, u1 = *(const v8f *)(p1 + 8);
            v8f sum = (v8f){0} + __builtin_shufflevector(t0, t1, 0, 2, 4, 6, 8, 10, 12, 14);
            sum += __builtin_shufflevector(t0, t1, 1, 3, 5, 7, 9, 11, 13, 15);
            sum += __builtin_shufflevector(u0, u1, 0, 2, 4, 6, 8, 10, 12, 14);
            sum += __builtin_shufflevector(u0, u1, 1, 3, 5, 7, 9, 11, 13, 15);
            *(v8f *)(yr + ox0) = sum * inv;
        }
        for (int ox = ox0; ox < ow; ox++) {
            float sum = 0.0f;
            sum += r0[2 * ox];
            sum += r0[2 * ox + 1];
            sum += r1[2 * ox];
            sum += r1[2 * ox + 1];
            yr[ox] = sum * inv;
        }
    }
}

/* Its backward: every input cell of a window gets 0 + g (what the general loop's += into a
 * zeroed dx gives: -0 comes out +0), the row and column no window covers 0. */
static void avgpool2_back_plane(float *dx, int w, int h, const float *dy, int oh, int ow,
                                float inv) {
    for (int oy = 0; oy < oh; oy++) {
        float *d0 = dx + (size_t)(2 * oy) * w, *d1 = d0 + w;
        const float *g = dy + (size_t)oy * ow;
        int ox0 = 0;
        for (; ox0 + 8 <= ow; ox0 += 8) {
            v8f v = (v8f){0} + *(const v8f *)(g + ox0) * inv;
            v8f lo = __builtin_shufflevector(v, v, 0, 0, 1, 1, 2, 2, 3, 3);
            v8f hi = __builtin_shufflevector(v, v, 4, 4, 5, 5, 6, 6, 7, 7);
            *(v8f *)(d0 + 2 * ox0) = lo, *(v8f *)(d0 + 2 * ox0 + 8) = hi;
            *(v8f *)(d1 + 2 * ox0) = lo, *(v8f *)(d1 + 2 * ox0 + 8) = hi;
        }
        for (int ox = ox0; ox < ow; ox++) {
            float v = 0.0f + g[ox] * inv;
            d0[2 * ox] = d0[2 * ox + 1] = d1[2 * ox] = d1[2 * ox + 1] = v;
        }
        if (w > 2 * ow) d0[w - 1] = d1[w - 1] = 0.0f;
    }
    if (h > 2 * oh) memset(dx + (size_t)(2 * oh) * w, 0, sizeof(float) * (size_t)w);
}

/* Average pools other than 2x2/2, stride 1 or 2, eight outputs at a time as max pooling takes
 * them (pool_blocks8_end): the taps summed from 0 in (ki, kj) order, then times inv, as the
 * loop per output does (a 3x3/1 pool of 64 channels at 15x15: 2.5 ms a step that way). */
static void avgpool_block8(const float *x, int w, int k, int st, float inv, float *y) {
    v8f sum = {0};
    for (int ki = 0; ki < k; ki++)
        for (int kj = 0; kj < k; kj++) sum += pool_tap8(x + (size_t)ki * w, st, kj);
    *(v8f *)y = sum * inv;
}

/* Average over k x k windows, stride st, no padding: x [c, h, w] -> y [c, out_h, out_w]. */
static void avgpool_forward(td_model_t *m, td_layer *l, int s0, int s1) {
    int k = l->kernel, st = l->stride, blocks_end = pool_blocks8_end(l->in_w, k, st, l->out_w);
    float inv = 1.0f / (float)(k * k);
    for (int s = s0; s < s1; s++)
        for (int c = 0; c < l->out_c; c++) {
            const float *x =
                m->acts[l->src] + (size_t)s * l->in_size + (size_t)c * l->in_h * l->in_w;
            float *y = l->out + (size_t)s * l->out_size + (size_t)c * l->out_h * l->out_w;
            if (k == 2 && st == 2) {
                avgpool2_plane(x, l->in_w, l->out_h, l->out_w, inv, y);
                continue;
            }
            for (int oy = 0; oy < l->out_h; oy++) {
                const float *xr = x + (size_t)oy * st * l->in_w;
                float *yr = y + (size_t)oy * l->out_w;
                int ox = 0;
                for (; ox < blocks_end; ox += 8) {
                    int o = TD_MIN(ox, blocks_end - 8);
                    avgpool_block8(xr + (size_t)o * st, l->in_w, k, st, inv, yr + o);
                }
                for (; ox < l->out_w; ox++) {
                    const float *win = xr + (size_t)ox * st;
                    float sum = 0.0f;
                    for (int ki = 0; ki < k; ki++)
                        for (int kj = 0; kj < k; kj++) sum += win[(size_t)ki * l->in_w + kj];
                    yr[ox] = sum * inv;
                }
            }
        }
}

static void avgpool_backward(td_layer *l, int s0, int s1, const float *dout, size_t ldo, float *din,
                             size_t ldi) {
    int k = l->kernel, st = l->stride;
    float inv = 1.0f / (float)(k * k);
    bool tiled = k == 2 && st == 2;
    for (int s = s0; s < s1; s++) {
        float *dx = din + (size_t)s * ldi;
        if (!tiled) memset(dx, 0, sizeof(float) * l->in_size);
        for (int c = 0; c < l->out_c; c++) {
            const float *dy = dout + (size_t)s * ldo + (size_t)c * l->out_h * l->out_w;
            float *dxc = dx + (size_t)c * l->in_h * l->in_w;
            if (tiled) { /* every input is written once: no memset */
                avgpool2_back_plane(dxc, l->in_w, l->in_h, dy, l->out_h, l->out_w, inv);
                continue;
            }
            for (int oy = 0; oy < l->out_h; oy++) {
                int ox = 0;
                /* stride 1, eight outputs at a time, no overlap (these add): an input of
                 * several windows takes its terms in (oy, ox) order, as the loop per output
                 * adds them, since within a block a later ox reaches it through a smaller kj */
                if (st == 1)
                    for (; ox + 8 <= l->out_w; ox += 8) {
                        v8f g = *(const v8f *)(dy + (size_t)oy * l->out_w + ox) * inv;
                        for (int ki = 0; ki < k; ki++) {
                            float *r = dxc + (size_t)(oy + ki) * l->in_w + ox;
                            for (int kj = k - 1; kj >= 0; kj--) *(v8f *)(r + kj) += g;
                        }
                    }
                for (; ox < l->out_w; ox++) {
                    float g = dy[oy * l->out_w + ox] * inv;
                    float *win = dxc + (size_t)oy * st * l->in_w + (size_t)ox * st;
                    for (int ki = 0; ki < k; ki++)
                        for (int kj = 0; kj < k; kj++) win[(size_t)ki * l->in_w + kj] += g;
                }
            }
        }
    }
}

/* Mean over each channel's plane: x [c, h, w] -> y [c]; summed in double. */
static void global_avgpool_forward(td_model_t *m, td_layer *l, int s0, int s1) {
    size_t hw = (size_t)l->in_h * l->in_w;
    for (int s = s0; s < s1; s++)
        for (int c = 0; c < l->in_c; c++) {
            const float *x = m->acts[l->src] + (size_t)s * l->in_size + (size_t)c * hw;
            double sum = 0;
            for (size_t e = 0; e < hw; e++) sum += x[e];
            l->out[(size_t)s * l->out_size + (size_t)c] = (float)(sum / (double)hw);
        }
}

static void global_avgpool_backward(td_layer *l, int s0, int s1, const float *dout, size_t ldo,
                                    float *din, size_t ldi) {
    size_t hw = (size_t)l->in_h * l->in_w;
    float inv = 1.0f / (float)hw;
    for (int s = s0; s < s1; s++)
        for (int c = 0; c < l->in_c; c++) {
            float g = dout[(size_t)s * ldo + (size_t)c] * inv;
            float *dx = din + (size_t)s * ldi + (size_t)c * hw;
            for (size_t e = 0; e < hw; e++) dx[e] = g;
        }
}

/* y = a + b, a the previous layer's output, b the other branch (the body's output or x). */
static void residual_forward(td_model_t *m, td_layer *l, int s0, int s1) {
    size_t n = l->out_size;
    const float *a = m->acts[l->src] + (size_t)s0 * n, *b = m->acts[l->src2] + (size_t)s0 * n;
    float *y = l->out + (size_t)s0 * n;
    size_t cnt = n * (size_t)(s1 - s0);
#pragma omp simd
    for (size_t e = 0; e < cnt; e++) y[e] = a[e] + b[e];
}

/* The first input's gradient is dy itself (the same buffer: nothing to do); the second gets a
 * copy of dy, plus what its other consumer already put there (gadd2). */
static void residual_backward(td_model_t *m, td_layer *l, int s0, int s1, const float *dout,
                              size_t ldo) {
    if (!l->need_din2) return;
    size_t n = l->out_size;
    for (int s = s0; s < s1; s++) {
        const float *dy = dout + (size_t)s * ldo;
        float *d2 = m->gbuf[l->gin2] + (size_t)s * m->gstride;
        if (l->gadd2 < 0) {
            memcpy(d2, dy, sizeof(float) * n);
            continue;
        }
        const float *a = m->gbuf[l->gadd2] + (size_t)s * m->gstride;
#pragma omp simd
        for (size_t e = 0; e < n; e++) d2[e] = dy[e] + a[e];
    }
}

void td__layer_forward_rows(td_model_t *m, int li, int s0, int s1, int tid) {
    td_layer *l = &m->layers[li];
    const float *x = m->acts[l->src];
    size_t n = l->out_size;
    switch (l->kind) {
    case TD_LAYER_CONV2D:
        conv_forward(m, l, s0, s1, tid);
        break;
    case TD_LAYER_MAXPOOL2D:
        maxpool_forward(m, l, s0, s1);
        break;
    case TD_LAYER_RELU:
        if (!l->relu_fused)
            td_relu(l->out + (size_t)s0 * n, x + (size_t)s0 * n, n * (size_t)(s1 - s0));
        break;
    case TD_LAYER_DROPOUT:
        dropout_forward(m, l, s0, s1, tid);
        break;
    case TD_LAYER_FLATTEN:
        break; /* same bytes, new shape */
    case TD_LAYER_LOG_SOFTMAX:
        log_softmax_forward(m, l, s0, s1);
        break;
    case TD_LAYER_GELU:
        td_gelu(l->out + (size_t)s0 * n, x + (size_t)s0 * n, n * (size_t)(s1 - s0));
        break;
    case TD_LAYER_TANH:
        td_tanh(l->out + (size_t)s0 * n, x + (size_t)s0 * n, n * (size_t)(s1 - s0));
        break;
    case TD_LAYER_SIGMOID:
        td_sigmoid(l->out + (size_t)s0 * n, x + (size_t)s0 * n, n * (size_t)(s1 - s0));
        break;
    case TD_LAYER_LAYERNORM:
        td__ln_forward_rows(m, l, s0, s1);
        break;
    case TD_LAYER_AVGPOOL2D:
        avgpool_forward(m, l, s0, s1);
        break;
    case TD_LAYER_GLOBAL_AVGPOOL:
        global_avgpool_forward(m, l, s0, s1);
        break;
    case TD_LAYER_RESIDUAL:
        if (!l->sum_by_bn) residual_forward(m, l, s0, s1);
        break;
    case TD_LAYER_LINEAR:
    case TD_LAYER_BATCHNORM:
        break; /* batch-level, model.c and norm.c */
    }
}

void td__layer_backward_rows(td_model_t *m, int li, int s0, int s1, int chunk, int tid,
                             const float *dout, size_t ldo, float *din, size_t ldi) {
    td_layer *l = &m->layers[li];
    size_t n = l->out_size;
    if (!l->param_count && !l->need_din && !l->need_din2) return; /* nothing upstream learns */
    switch (l->kind) {
    case TD_LAYER_CONV2D:
        conv_backward(m, l, s0, s1, chunk, tid, dout, ldo, din, ldi);
        break;
    case TD_LAYER_MAXPOOL2D:
        maxpool_backward(l, s0, s1, dout, ldo, din, ldi);
        break;
    case TD_LAYER_RELU:
        for (int s = s0; s < s1 && !l->relu_fused; s++)
            td_relu_backward(din + (size_t)s * ldi, m->acts[li + 1] + (size_t)s * n,
                             dout + (size_t)s * ldo, n);
        break;
    case TD_LAYER_DROPOUT:
        dropout_backward(m, l, s0, s1, dout, ldo, din, ldi);
        break;
    case TD_LAYER_FLATTEN:
        for (int s = s0; s < s1 && din != dout; s++)
            memcpy(din + (size_t)s * ldi, dout + (size_t)s * ldo, sizeof(float) * n);
        break;
    case TD_LAYER_LOG_SOFTMAX:
        log_softmax_backward(l, s0, s1, dout, ldo, din, ldi);
        break;
    case TD_LAYER_GELU:
    case TD_LAYER_TANH:
    case TD_LAYER_SIGMOID:
        activation_backward(m, l, s0, s1, dout, ldo, din, ldi);
        break;
    case TD_LAYER_LAYERNORM:
        td__ln_backward_rows(m, l, s0, s1, chunk, dout, ldo, din, ldi);
        break;
    case TD_LAYER_AVGPOOL2D:
        avgpool_backward(l, s0, s1, dout, ldo, din, ldi);
        break;
    case TD_LAYER_GLOBAL_AVGPOOL:
        global_avgpool_backward(l, s0, s1, dout, ldo, din, ldi);
        break;
    case TD_LAYER_RESIDUAL:
        residual_backward(m, l, s0, s1, dout, ldo);
        return; /* its first input's gradient is dout itself */
    case TD_LAYER_LINEAR:
    case TD_LAYER_BATCHNORM:
        return;
    }
    td__grad_add_rows(m, l, s0, s1, din, ldi);
}
