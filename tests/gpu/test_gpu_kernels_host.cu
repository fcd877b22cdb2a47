/* gpu: the index arithmetic of the convolution lowering and pooling kernels, on the host.
 *
 * Their bodies (kernels.cu, *_thread) take the thread's place in the launch as an argument, so
 * this runs them over every (block, thread) of the launch shapes engine.cu uses, with grid.y
 * capped as a large batch caps it (65,535, and 3 and 1 to force the strided loops), and compares
 * the result byte for byte with direct loops: im2col (stride, padding, widths past a warp),
 * col2im (the adjoint, with and without the folded ReLU gate) and the max pool's backward
 * (2x2, overlapping windows, and the 2x2 tiling path), the conv output's return to NCHW. Built with
 * the CUDA backend; needs no GPU. BatchNorm's chunked sums too, against direct sums. */
#include "kernels.cu"
#include "tandem/nn.h"
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstring>
static int fails = 0;
static float rndf(unsigned &s) {
    s = s * 1664525u + 1013904223u;
    return ((s >> 8) & 0xffff) / 65536.0f - 0.5f;
}
static void check_conv(int batch, int c, int h, int w, int k, int stride, int pad,
                       unsigned gy_cap) {
    int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1, n = oh * ow;
    std::vector<float> x((size_t)batch * c * h * w), col((size_t)c * k * k * batch * n, -99.f),
        ref(col.size());
    unsigned s = 1;
    for (auto &v : x) v = rndf(s);
    for (int r = 0; r < c * k * k; r++) {
        int ci = r / (k * k), ki = r / k % k, kj = r % k;
        for (int b = 0; b < batch; b++)
            for (int p = 0; p < n; p++) {
                int oy = p / ow, ox = p % ow, iy = oy * stride - pad + ki,
                    ix = ox * stride - pad + kj;
                bool in = iy >= 0 && iy < h && ix >= 0 && ix < w;
                ref[((size_t)r * batch + b) * n + p] =
                    in ? x[((size_t)b * c + ci) * h * w + iy * w + ix] : 0.f;
            }
    }
    unsigned gy = (unsigned)((batch + SPB - 1) / SPB);
    if (gy > gy_cap) gy = gy_cap;
    for (int pp = 1; pp <= 2; pp++) { // one pixel per thread, and pairs (even rows only)
        if (pp == 2 && n % 2) continue;
        std::fill(col.begin(), col.end(), -99.f);
        unsigned th = row_threads(n / pp);
        for (unsigned bx = 0; bx < (unsigned)(c * k * k); bx++)
            for (unsigned by = 0; by < gy; by++)
                for (unsigned tx = 0; tx < th; tx++) {
                    tix t{bx, by, (unsigned)(c * k * k), gy, tx, th};
                    if (pp == 1)
                        im2col_thread<1, float>(t, x.data(), c, h, w, k, stride, pad, oh, ow, batch,
                                                col.data());
                    else
                        im2col_thread<2, float>(t, x.data(), c, h, w, k, stride, pad, oh, ow, batch,
                                                col.data());
                }
        if (memcmp(col.data(), ref.data(), col.size() * 4)) {
            printf("FAIL im2col (%d per thread) b%d c%d %dx%d k%d s%d p%d\n", pp, batch, c, h, w, k,
                   stride, pad);
            fails++;
        }
    }
    // col2im: adjoint, gather order ki then kj; with and without gate
    std::vector<float> dcol(col.size()), dx((size_t)batch * c * h * w, -99.f), dref(dx.size()),
        gate(dx.size());
    for (auto &v : dcol) v = rndf(s);
    for (auto &v : gate) v = rndf(s);
    for (int g = 0; g < 2; g++) {
        for (int b = 0; b < batch; b++)
            for (int ci = 0; ci < c; ci++)
                for (int iy = 0; iy < h; iy++)
                    for (int ix = 0; ix < w; ix++) {
                        float acc = 0;
                        for (int ki = 0; ki < k; ki++)
                            for (int kj = 0; kj < k; kj++) {
                                int ty = iy + pad - ki, tx = ix + pad - kj;
                                if (ty < 0 || tx < 0 || ty % stride || tx % stride) continue;
                                int oy = ty / stride, ox = tx / stride;
                                if (oy >= oh || ox >= ow) continue;
                                acc += dcol[((size_t)((ci * k + ki) * k + kj) * batch + b) * n +
                                            oy * ow + ox];
                            }
                        size_t o = ((size_t)b * c + ci) * h * w + iy * w + ix;
                        dref[o] = g && !(gate[o] > 0) ? 0.f : acc;
                    }
        unsigned th2 = row_threads(h * w);
        for (unsigned bx = 0; bx < (unsigned)c; bx++)
            for (unsigned by = 0; by < gy; by++)
                for (unsigned tx = 0; tx < th2; tx++)
                    col2im_thread<float>(tix{bx, by, (unsigned)c, gy, tx, th2}, dcol.data(), c, h,
                                         w, k, stride, pad, oh, ow, batch,
                                         g ? gate.data() : nullptr, dx.data());
        if (memcmp(dx.data(), dref.data(), dx.size() * 4)) {
            printf("FAIL col2im gate%d b%d c%d %dx%d k%d s%d p%d\n", g, batch, c, h, w, k, stride,
                   pad);
            fails++;
        }
    }
}
// The conv gemm's output [c][batch * n] back to NCHW with bias and (optionally) ReLU.
static void check_cn_bias_act(int batch, int c, int n, unsigned gy_cap) {
    std::vector<float> y((size_t)c * batch * n), bias(c), out((size_t)batch * c * n, -99.f),
        ref(out.size());
    unsigned s = 3;
    for (auto &v : y) v = rndf(s);
    for (auto &v : bias) v = rndf(s);
    for (int relu = 0; relu < 2; relu++) {
        for (int b = 0; b < batch; b++)
            for (int ch = 0; ch < c; ch++)
                for (int p = 0; p < n; p++) {
                    float v = y[((size_t)ch * batch + b) * n + p] + bias[ch];
                    ref[((size_t)b * c + ch) * n + p] = relu && v < 0 ? 0.f : v;
                }
        unsigned th = row_threads(n), groups = (unsigned)((batch + SPB - 1) / SPB),
                 gy = groups > gy_cap ? gy_cap : groups;
        for (unsigned bx = 0; bx < (unsigned)c; bx++)
            for (unsigned by = 0; by < gy; by++)
                for (unsigned tx = 0; tx < th; tx++)
                    cn_bias_act_thread(tix{bx, by, (unsigned)c, gy, tx, th}, y.data(), bias.data(),
                                       c, n, batch, relu, out.data());
        if (memcmp(out.data(), ref.data(), out.size() * 4)) {
            printf("FAIL cn_bias_act relu%d b%d c%d n%d\n", relu, batch, c, n);
            fails++;
        }
    }
}
static void check_pool(int batch, int c, int h, int w, int k, int stride, unsigned gx_cap) {
    int oh = (h - k) / stride + 1, ow = (w - k) / stride + 1;
    size_t planes = (size_t)batch * c;
    std::vector<float> x(planes * h * w), dy(planes * oh * ow), dx(x.size(), -99.f), ref(x.size());
    std::vector<uint8_t> am(dy.size());
    unsigned s = 7;
    for (auto &v : x) v = rndf(s);
    for (auto &v : dy) v = rndf(s);
    // argmax as the forward computes it
    for (size_t pl = 0; pl < planes; pl++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                const float *win = &x[pl * h * w + oy * stride * w + ox * stride];
                float best = win[0];
                int arg = 0;
                for (int ki = 0; ki < k; ki++)
                    for (int kj = 0; kj < k; kj++)
                        if (win[ki * w + kj] > best) {
                            best = win[ki * w + kj];
                            arg = ki * k + kj;
                        }
                am[pl * oh * ow + oy * ow + ox] = (uint8_t)arg;
            }
    for (int g = 0; g < 2; g++) {
        std::fill(ref.begin(), ref.end(), 0.f);
        for (size_t pl = 0; pl < planes; pl++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    int a = am[pl * oh * ow + oy * ow + ox];
                    ref[pl * h * w + (oy * stride + a / k) * w + ox * stride + a % k] +=
                        dy[pl * oh * ow + oy * ow + ox];
                }
        if (g)
            for (size_t i = 0; i < ref.size(); i++)
                if (!(x[i] > 0)) ref[i] = 0;
        unsigned th = row_threads(h * w), gx = (unsigned)((h * w + th - 1) / th),
                 groups = (unsigned)((planes + SPB - 1) / SPB),
                 gy = groups > gx_cap ? gx_cap : groups;
        for (unsigned bx = 0; bx < gx; bx++)
            for (unsigned by = 0; by < gy; by++)
                for (unsigned tx = 0; tx < th; tx++)
                    maxpool_backward_thread(tix{bx, by, gx, gy, tx, th}, dy.data(), am.data(),
                                            x.data(), g, planes, h, w, k, stride, oh, ow,
                                            dx.data());
        // the reference scatter adds in (oy, ox) order; the gather too: compare bits
        if (memcmp(dx.data(), ref.data(), dx.size() * 4)) {
            printf("FAIL maxpool_backward gate%d b%d c%d %dx%d k%d s%d\n", g, batch, c, h, w, k,
                   stride);
            fails++;
        }
        if (k == 2 && stride == 2 && h == 2 * oh && w == 2 * ow) { // windows tile the input
            // NCHW, and CN ([c][batch * h*w]: the conv before the pool takes its dy so)
            std::vector<float> ref_cn(ref.size());
            for (int b = 0; b < batch; b++)
                for (int ci = 0; ci < c; ci++)
                    memcpy(&ref_cn[((size_t)ci * batch + b) * h * w],
                           &ref[((size_t)b * c + ci) * h * w], (size_t)h * w * 4);
            for (int cn = 0; cn < 2; cn++) {
                std::fill(dx.begin(), dx.end(), -99.f);
                unsigned th2 = row_threads(oh * ow), gx2 = (unsigned)((oh * ow + th2 - 1) / th2);
                for (unsigned bx = 0; bx < gx2; bx++)
                    for (unsigned by = 0; by < gy; by++)
                        for (unsigned tx = 0; tx < th2; tx++)
                            maxpool2_backward_thread(tix{bx, by, gx2, gy, tx, th2}, dy.data(),
                                                     am.data(), x.data(), g, batch, c, oh, ow, cn,
                                                     dx.data(), nullptr);
                if (memcmp(dx.data(), cn ? ref_cn.data() : ref.data(), dx.size() * 4)) {
                    printf("FAIL maxpool2_backward%s gate%d b%d c%d %dx%d\n", cn ? " (CN)" : "", g,
                           batch, c, h, w);
                    fails++;
                }
            }
        }
    }
}
/* The gathers (a step's slot, an evaluation range) over every (block, thread): x normalised as
 * data.h's gather does (a byte through its channel's table, a float as (v - mean) / std), the
 * labels or target rows and ids of each row's sample, zeros past a short slot's samples. gx_cap
 * below the launch's grid.x forces the strided loop; tdim 300 needs more threads than a block.
 * window: the source is a streamed set's window holding only slots 1 and 2 (window_slot0 1; the
 * evaluation batch's samples from record 0), its padding records poison: the same results. */
static void check_gather(bool u8, int tdim, int batch, int size, unsigned gy_cap,
                         unsigned gx_cap, bool window) {
    const int count = 23, channels = 2;
    std::vector<uint8_t> vb((size_t)count * size);
    std::vector<float> vf((size_t)count * size), lut(channels * 256), mean{0.25f, -1.5f},
        sd{0.5f, 3.0f}, targets((size_t)count * (tdim ? tdim : 1));
    std::vector<int32_t> labels(count);
    unsigned s = 7;
    for (size_t i = 0; i < vb.size(); i++) vb[i] = (uint8_t)(i * 37 % 251), vf[i] = rndf(s) * 9;
    for (auto &v : lut) v = rndf(s);
    for (auto &v : targets) v = rndf(s);
    for (int i = 0; i < count; i++) labels[i] = (i * 5 + 3) % 7; // a padding row's id 0: not 0
    td_gpu_source d{};
    d.values = u8 ? (const void *)vb.data() : (const void *)vf.data();
    d.u8 = u8;
    d.labels = tdim ? NULL : labels.data();
    d.targets = tdim ? targets.data() : NULL;
    d.target_dim = tdim;
    d.lut = lut.data(), d.mean = mean.data(), d.std = sd.data();
    d.plane = size / channels;
    std::vector<uint64_t> perm(count);
    for (int i = 0; i < count; i++) perm[i] = (uint64_t)(i * 11 % count); // 11 is prime to 23
    td_gpu_args a{};
    a.base = 3, a.n = batch + batch / 2; // slot 0 full, slot 1 short, slot 2 empty
    dim3 grid = gather_grid(&d, batch, size);
    unsigned gx = grid.x < gx_cap ? grid.x : gx_cap, gy = grid.y < gy_cap ? grid.y : gy_cap;
    int k = tdim ? tdim : 1;
    td_gpu_source full = d;
    for (int slot = -1; slot < 3; slot++) { // -1: gather_range from sample 5
        if (window && slot == 0) continue;  // not in the window
        d = full;
        std::vector<uint8_t> wb(vb.size(), 0x5a);
        std::vector<float> wf(vf.size(), NAN), wt(targets.size(), NAN);
        std::vector<int32_t> wl(labels.size(), -7);
        if (window) { // records w * batch + r: slot 1 + w's row r (evaluation: sample 5 + r)
            for (int w = 0; w < 2; w++)
                for (int r = 0; r < batch; r++) {
                    int sl = 1 + w, rec = w * batch + r;
                    if (slot < 0 ? w > 0 : r >= TD_GPU_SLOT_ROWS(&a, sl, batch)) continue;
                    uint64_t id = slot < 0 ? 5 + (uint64_t)r : perm[a.base + sl * batch + r];
                    memcpy(&wb[(size_t)rec * size], &vb[id * size], size);
                    memcpy(&wf[(size_t)rec * size], &vf[id * size], size * 4);
                    if (tdim) memcpy(&wt[(size_t)rec * tdim], &targets[id * tdim], tdim * 4);
                    wl[rec] = labels[id];
                }
            d.values = u8 ? (const void *)wb.data() : (const void *)wf.data();
            d.labels = tdim ? NULL : wl.data();
            d.targets = tdim ? wt.data() : NULL;
            d.window = true, d.window_slot0 = 1;
        }
        std::vector<float> x((size_t)batch * size, -99.f), t((size_t)batch * k, -99.f),
            xr(x.size()), tr(t.size(), -99.f);
        std::vector<int32_t> y(batch, -99), yr(batch, -99);
        std::vector<uint64_t> ids(batch, 99), idr(batch);
        int rows = slot < 0 ? batch : TD_GPU_SLOT_ROWS(&a, slot, batch);
        for (int r = 0; r < batch; r++) {
            bool valid = r < rows;
            uint64_t id = slot < 0 ? 5 + (uint64_t)r : valid ? perm[a.base + slot * batch + r] : 0;
            for (int i = 0; i < size; i++) {
                int ch = i / d.plane;
                size_t e = id * (size_t)size + i;
                xr[(size_t)r * size + i] = !valid ? 0.f
                                           : u8   ? lut[ch * 256 + vb[e]]
                                                  : (vf[e] - mean[ch]) / sd[ch];
            }
            if (tdim)
                for (int j = 0; j < tdim; j++)
                    tr[(size_t)r * tdim + j] = valid ? targets[id * tdim + j] : 0.f;
            else
                yr[r] = valid ? labels[id] : 0;
            idr[r] = id;
        }
        for (unsigned bx = 0; bx < gx; bx++)
            for (unsigned by = 0; by < gy; by++)
                for (unsigned tx = 0; tx < THREADS; tx++) {
                    tix th{bx, by, gx, gy, tx, THREADS};
                    if (slot < 0)
                        gather_range_thread(th, d, 5, batch, size, x.data(), y.data(), t.data(),
                                            ids.data());
                    else
                        gather_step_thread(th, d, perm.data(), &a, slot, batch, size, x.data(),
                                           y.data(), t.data(), ids.data());
                }
        if (memcmp(x.data(), xr.data(), x.size() * 4) ||
            memcmp(t.data(), tr.data(), t.size() * 4) || y != yr || ids != idr) {
            printf("FAIL gather u8 %d tdim %d batch %d size %d slot %d gy %u gx %u window %d\n",
                   u8, tdim, batch, size, slot, gy, gx, window);
            fails++;
        }
    }
}

/* One row's loss body (the device's loss_row) against nn/loss.c, the CPU engine's losses: the
 * gradient bit for bit, the loss sum to double rounding, the correct count exactly; a short
 * batch's rows past `rows` are the kernel's (zeros), not the body's. */
static void check_loss(td_gpu_loss_kind kind, int batch, int dim) {
    std::vector<float> x((size_t)batch * dim), t(x.size()), dx(x.size()), ref(x.size());
    std::vector<int32_t> y(batch);
    unsigned s = 11;
    for (size_t i = 0; i < x.size(); i++) x[i] = i % 5 == 2 ? 0.f : rndf(s) * 12; // some 0 logits
    static const float soft[] = {0.f, 1.f, 0.3f, 0.7f, 0.5f}; // BCE: hard and soft labels
    for (size_t i = 0; i < t.size(); i++)
        t[i] = kind == TD_GPU_LOSS_BCE ? soft[(i * 3 + i / 7) % 5] : rndf(s) * 4;
    for (int r = 0; r < batch; r++) y[r] = (r * 7) % dim;
    if (kind == TD_GPU_LOSS_NLL) // log-probabilities: x - logsumexp(x) per row
        for (int r = 0; r < batch; r++) {
            double se = 0;
            for (int j = 0; j < dim; j++) se += exp((double)x[(size_t)r * dim + j]);
            for (int j = 0; j < dim; j++) x[(size_t)r * dim + j] -= (float)log(se);
        }
    const float scale = 1.0f / 3.0f;
    double loss = 0, correct = 0;
    for (int r = 0; r < batch; r++) {
        double l, c;
        loss_row(kind, &x[(size_t)r * dim], dim, y[r], &t[(size_t)r * dim], scale,
                 &dx[(size_t)r * dim], &l, &c);
        loss += l, correct += c;
    }
    double rl = 0, rc = 0;
    switch (kind) {
    case TD_GPU_LOSS_CE:
        rl = td_cross_entropy(x.data(), y.data(), batch, dim, scale, ref.data());
        rc = td_count_correct(x.data(), y.data(), batch, dim);
        break;
    case TD_GPU_LOSS_NLL:
        rl = td_nll_loss(x.data(), y.data(), batch, dim, scale, ref.data());
        rc = td_count_correct(x.data(), y.data(), batch, dim);
        break;
    case TD_GPU_LOSS_MSE:
        rl = td_mse_loss(x.data(), t.data(), batch, dim, scale, ref.data());
        break;
    case TD_GPU_LOSS_BCE:
        rl = td_bce_with_logits(x.data(), t.data(), batch, dim, scale, ref.data());
        rc = td_count_correct_multilabel(x.data(), t.data(), batch, dim);
        break;
    }
    if (memcmp(dx.data(), ref.data(), dx.size() * 4) || fabs(loss - rl) > 1e-12 * fabs(rl) ||
        correct != rc) {
        printf("FAIL loss kind %d batch %d dim %d: loss %.17g vs %.17g, correct %g vs %g\n",
               (int)kind, batch, dim, loss, rl, correct, rc);
        fails++;
    }
}

/* BatchNorm's sums: every (channel, chunk) block's threads over the first `rows` of `batch` rows
 * (the rest poisoned), the block's tree as block_sum takes it, the chunks in order; against
 * direct double sums. A value missed or taken twice moves a sum by ~1/n, far past 1e-12; so does
 * a padding row. The chunking covers every batch up to max and fits the scratch sized for it. */
static void block_tree(std::vector<double> &v) {
    for (size_t off = v.size() / 2; off > 0; off >>= 1)
        for (size_t t = 0; t < off; t++) v[t] += v[t + off];
}
static void check_bn(int batch, int rows, int c, int hw) {
    size_t n = (size_t)batch * c * hw;
    std::vector<float> x(n), dy(n), stats(2 * c), bstats(2 * c);
    unsigned s = 11;
    for (size_t i = 0; i < n; i++) {
        bool pad = i >= (size_t)rows * c * hw;
        x[i] = pad ? 1e30f : 2.0f + rndf(s);
        dy[i] = pad ? -1e30f : rndf(s);
    }
    int chunks, rows_per = bn_rows_per_chunk(batch, c, &chunks);
    if ((size_t)c * chunks * 2 > td_gpu_batchnorm_part_doubles(batch, c) ||
        (size_t)chunks * rows_per < (size_t)batch ||
        (size_t)(chunks - 1) * rows_per >= (size_t)batch) {
        printf("FAIL bn chunks b%d c%d: %d chunks of %d rows\n", batch, c, chunks, rows_per);
        fails++;
    }
    std::vector<double> part((size_t)c * chunks * 2);
    for (int pass = 0; pass < 2; pass++) { /* 0: the forward's sums, 1: the backward's */
        const float *d = pass ? dy.data() : NULL;
        for (unsigned ch = 0; ch < (unsigned)c; ch++)
            for (unsigned j = 0; j < (unsigned)chunks; j++) {
                std::vector<double> a(THREADS), b(THREADS);
                for (unsigned tx = 0; tx < THREADS; tx++)
                    bn_sums_thread(tix{ch, j, (unsigned)c, (unsigned)chunks, tx, THREADS},
                                   x.data(), d, stats[ch], stats[c + ch], rows, rows_per, c, hw,
                                   &a[tx], &b[tx]);
                block_tree(a), block_tree(b);
                part[bn_part_at((int)ch, (int)j, chunks)] = a[0];
                part[bn_part_at((int)ch, (int)j, chunks) + 1] = b[0];
            }
        for (int ch = 0; ch < c; ch++) {
            double r0 = 0, r1 = 0, s0, s1;
            for (int b = 0; b < rows; b++)
                for (int e = 0; e < hw; e++) {
                    size_t i = ((size_t)b * c + ch) * hw + e;
                    if (pass) {
                        float xh = (x[i] - stats[ch]) * stats[c + ch];
                        r0 += dy[i], r1 += (double)dy[i] * xh;
                    } else {
                        r0 += x[i], r1 += (double)x[i] * x[i];
                    }
                }
            bn_chunk_sums(part.data(), ch, chunks, &s0, &s1);
            if (!(fabs(s0 - r0) <= 1e-12 * (fabs(r0) + 1) &&
                  fabs(s1 - r1) <= 1e-12 * (fabs(r1) + 1))) {
                printf("FAIL bn %s sums b%d rows %d c%d hw%d ch%d: %.17g %.17g vs %.17g %.17g\n",
                       pass ? "backward" : "forward", batch, rows, c, hw, ch, s0, s1, r0, r1);
                fails++;
                return;
            }
            /* the backward's pass uses the statistics the forward's sums give */
            if (!pass && rows) bn_stats_from_sums(s0, s1, (size_t)rows * hw, c, ch, 1e-5f,
                                                  stats.data(), bstats.data());
        }
    }
}

int main(void) {
    for (int kind = TD_GPU_LOSS_CE; kind <= TD_GPU_LOSS_BCE; kind++) {
        check_loss((td_gpu_loss_kind)kind, 9, 10);
        check_loss((td_gpu_loss_kind)kind, 4, 1);
        check_loss((td_gpu_loss_kind)kind, 5, 37);
    }
    unsigned caps[] = {65535, 3, 1};
    for (unsigned cap : caps)
        for (int u8 = 0; u8 < 2; u8++)
            for (unsigned gx : {1u << 30, 1u})
                for (int window = 0; window < 2; window++) {
                    check_gather(u8, 0, 6, 8, cap, gx, window);
                    check_gather(u8, 3, 6, 8, cap, gx, window);
                    check_gather(u8, 300, 4, 10, cap, gx, window); // targets wider than a block
                    check_gather(u8, 1, 5, 600, cap, gx, window);  // a sample wider than a block
                }
    for (unsigned cap : caps) {
        check_conv(5, 3, 9, 9, 3, 1, 0, cap);
        check_conv(7, 4, 9, 9, 3, 2, 1, cap);
        check_conv(3, 2, 12, 12, 5, 2, 2, cap);
        check_conv(9, 32, 26, 26, 3, 1, 0, cap);
        check_conv(2, 1, 28, 28, 3, 1, 0, cap);
        check_conv(3, 2, 40, 37, 3, 1, 1, cap); // w > 32: lanes loop
        check_conv(2, 2, 70, 70, 7, 2, 3, cap);
        check_conv(19, 2, 9, 9, 3, 1, 1, cap); // groups of 8 samples, a partial one
        check_cn_bias_act(17, 3, 576, cap);
        check_cn_bias_act(9, 2, 300, cap);
        check_pool(5, 3, 7, 7, 3, 1, cap == 65535 ? 1u << 30 : cap);
        check_pool(4, 6, 24, 24, 2, 2, cap == 65535 ? 1u << 30 : cap);
        check_pool(3, 7, 6, 10, 2, 2, cap == 65535 ? 1u << 30 : cap); // 21 planes: a partial group
        check_pool(3, 2, 9, 9, 2, 2, cap == 65535 ? 1u << 30 : cap);
        check_pool(2, 2, 40, 35, 3, 2, cap == 65535 ? 1u << 30 : cap);
    }
    check_bn(256, 256, 16, 1024); // resnet-small's first block: 32 chunks of 8 rows
    check_bn(256, 200, 64, 64);   // a short slot: rows past it poisoned
    check_bn(13, 13, 3, 300);     // hw past a block of threads, chunks of 1 row
    check_bn(37, 30, 5, 7);       // hw far below it: a thread's values cross rows
    check_bn(9, 9, 700, 1);       // a feature BatchNorm (hw 1), one chunk
    check_bn(5, 0, 4, 9);         // an empty slot
    for (int b = 1; b <= 300; b++) // the scratch sized for 300 rows covers every smaller batch
        for (int c : {1, 3, 16, 100, 600}) {
            int chunks;
            bn_rows_per_chunk(b, c, &chunks);
            if ((size_t)c * chunks * 2 > td_gpu_batchnorm_part_doubles(300, c)) {
                printf("FAIL bn scratch b%d c%d\n", b, c);
                fails++;
            }
        }
    printf(fails ? "%d FAILED\n" : "all kernel bodies agree\n", fails);
    return fails != 0;
}
