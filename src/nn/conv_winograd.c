/* Winograd F(2x2, 3x3) (Lavin & Gray 2015) for 3x3 stride-1 convolutions.
 *
 * Every 2x2 output tile is computed from a 4x4 input tile d as A^T [(G g G^T) . (B^T d B)] A,
 * so the channel sums become 16 independent gemms, one per position xi of the 4x4 tile:
 *     M[xi] [k, T] = U[xi] [k, c] x V[xi] [c, T]
 * with T the tiles of one pass (see pass_samples). 16 * c * k
 * multiplies per 4 outputs instead of 36 * c * k: 2.25x fewer in the gemms. The transforms use
 * only adds (and halves in G), are fixed sequences per element, and so are as deterministic as
 * the gemm calls themselves. Odd output sizes pad the tile grid: the input plane is copied into
 * a zero-padded buffer covering every tile, and the output transform drops what lies outside. */
#include <string.h>

#include "conv_winograd.h"
#include "tandem/tensor.h"

td_status td__conv_use_winograd(int in_c, int kernel, int stride, bool *out) {
    const char *algo = td_env_str(TD_ENV_CONV_ALGO);
    bool eligible = kernel == 3 && stride == 1;
    if (!strcmp(algo, "auto"))
        *out = eligible && in_c >= 8;
    else if (!strcmp(algo, "winograd"))
        *out = eligible;
    else if (!strcmp(algo, "im2col"))
        *out = false;
    else
        return td_error(TD_ERR_INVALID, "TANDEM_CONV_ALGO=%s: use auto, im2col or winograd", algo);
    return TD_OK;
}

enum { VEC = 8 }; /* tiles per vectorised block: one AVX2 register of floats */
/* Samples per pass (transforms + 16 gemms), from the tiles of one sample, so the same on every
 * rank and thread count. One for large planes: conv2 of basicnet then keeps its transformed
 * tiles (16 x 144 x 32 floats) and gemm results (16 x 144 x 64) near L2 size; a whole 4-sample
 * chunk (3.5 MB) measured ~6% slower end to end on the 1 MiB-L2 EPYC. Small planes batch
 * samples until a pass has PASS_TILES tiles: resnet-small's 8x8 stage has 16 tiles a sample,
 * gemms of N = 16 and weight-gradient gemms of K = 16. */
#ifndef PASS_TILES
#define PASS_TILES 256
#endif
static int pass_samples(int oh, int ow) {
    int tps = ((oh + 1) / 2) * ((ow + 1) / 2);
    return TD_MAX(1, PASS_TILES / tps);
}

static size_t round16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* Distance in floats between the 16 tile-position slots of V, M and dU, each holding n floats:
 * rounded up to whole cache lines, and to an odd number of them. The transforms write (or
 * read) all 16 slots at once; slots a multiple of 4 KiB apart (c x T = 16 x 256 floats for a
 * 32x32 plane, 32 x 64 for 16x16: every power-of-two shape) put all 16 streams into one L1 set,
 * more than it has ways, and resnet-small's transforms ran ~2x slower for it. An odd number of
 * lines puts the 16 slots in 16 different sets. Only addresses change: the same bits. */
static size_t slot_floats(size_t n) {
    size_t s = round16(n);
    return (s / 16) % 2 ? s : s + 16;
}

size_t td__wino_scratch_floats(int ns, int c, int k, int h, int w, int oh, int ow) {
    ns = TD_MIN(ns, pass_samples(oh, ow));
    size_t th = (size_t)(oh + 1) / 2, tw = (size_t)(ow + 1) / 2, t = (size_t)ns * th * tw;
    size_t plane = (2 * th + 2) * (2 * tw + 2);
    (void)h, (void)w;
    return TD_WINO_POS * (slot_floats((size_t)c * t) + slot_floats((size_t)k * t) +
                          slot_floats((size_t)c * k)) +
           round16(plane);
}

/* u [4][4] = G g G^T, g [3][3] read with row stride rs and column stride cs (negative strides
 * read it rotated). */
static void filter_tile(const float *g, int rs, int cs, float u[16]) {
    float gg[4][3];
    for (int j = 0; j < 3; j++) {
        float g0 = g[j * cs], g1 = g[rs + j * cs], g2 = g[2 * rs + j * cs];
        gg[0][j] = g0;
        gg[1][j] = 0.5f * (g0 + g1 + g2);
        gg[2][j] = 0.5f * (g0 - g1 + g2);
        gg[3][j] = g2;
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = gg[i][0];
        u[4 * i + 1] = 0.5f * (gg[i][0] + gg[i][1] + gg[i][2]);
        u[4 * i + 2] = 0.5f * (gg[i][0] - gg[i][1] + gg[i][2]);
        u[4 * i + 3] = gg[i][2];
    }
}

void td__wino_filter(const float *w, int oc, int ic, bool backward, float *u) {
    size_t plane = (size_t)oc * ic;
    for (int o = 0; o < oc; o++)
        for (int i = 0; i < ic; i++) {
            const float *g = w + ((size_t)o * ic + i) * 9;
            float t[16];
            size_t at;
            if (backward) {
                filter_tile(g + 8, -3, -1, t); /* rot180 */
                at = (size_t)i * oc + o;
            } else {
                filter_tile(g, 3, 1, t);
                at = (size_t)o * ic + i;
            }
            for (int xi = 0; xi < TD_WINO_POS; xi++) u[xi * plane + at] = t[xi];
        }
}

/* Copies plane x [h, w] into the zero-padded plane p [ph, pw], p[py][px] = x[py - pad][px - pad],
 * with each row split into its even columns then its odd columns (pw / 2 each), so that the
 * tile transforms below read only contiguous runs. */
static void pad_plane(const float *x, int h, int w, int pad, float *p, int ph, int pw) {
    int half = pw / 2;
    for (int py = 0; py < ph; py++) {
        float *pe = p + (size_t)py * pw, *po = pe + half;
        int iy = py - pad;
        if (iy < 0 || iy >= h) {
            memset(pe, 0, sizeof(float) * (size_t)pw);
            continue;
        }
        const float *xr = x + (size_t)iy * w;
        /* [lo, hi): both columns 2i - pad and 2i - pad + 1 inside the row, copied without a
         * test per element; the few columns at the edges take the checked loop */
        int lo = TD_MIN((pad + 1) / 2, half), hi = TD_MAX(lo, TD_MIN(half, (w + pad) / 2));
        for (int i = 0; i < half; i++) {
            if (i == lo) i = hi;
            if (i >= half) break;
            int j0 = 2 * i - pad, j1 = j0 + 1;
            pe[i] = j0 >= 0 && j0 < w ? xr[j0] : 0.0f;
            po[i] = j1 >= 0 && j1 < w ? xr[j1] : 0.0f;
        }
#pragma omp simd
        for (int i = lo; i < hi; i++) pe[i] = xr[2 * i - pad], po[i] = xr[2 * i - pad + 1];
    }
}

/* V[xi][ty * tw + tx] = (B^T d B)[xi] of the tile at (ty, tx) of the split padded plane p; vs is
 * the distance between xi slots. Row tile columns 2tx..2tx+3 are e[tx], o[tx], e[tx+1],
 * o[tx+1] of the even/odd halves. */
static void input_tiles(const float *p, int pw, int th, int tw, float *v, size_t vs) {
    int half = pw / 2;
    for (int ty = 0; ty < th; ty++) {
        const float *e0 = p + (size_t)(2 * ty) * pw, *e1 = e0 + pw, *e2 = e1 + pw, *e3 = e2 + pw;
        const float *o0 = e0 + half, *o1 = e1 + half, *o2 = e2 + half, *o3 = e3 + half;
        float *vo = v + (size_t)ty * tw;
        float *v0 = vo, *v1 = v0 + vs, *v2 = v1 + vs, *v3 = v2 + vs, *v4 = v3 + vs;
        float *v5 = v4 + vs, *v6 = v5 + vs, *v7 = v6 + vs, *v8 = v7 + vs, *v9 = v8 + vs;
        float *v10 = v9 + vs, *v11 = v10 + vs, *v12 = v11 + vs, *v13 = v12 + vs;
        float *v14 = v13 + vs, *v15 = v14 + vs;
        /* blocks of VEC tiles; the last one overlaps its predecessor rather than running a
         * scalar tail (tw is 12 or 13 for a 24..26-wide plane): it rewrites the same values */
        for (int tb = 0; tb < tw; tb += VEC) {
            int t0 = tw >= VEC ? TD_MIN(tb, tw - VEC) : tb, n = TD_MIN(VEC, tw - t0);
#pragma omp simd simdlen(VEC)
            for (int tx = t0; tx < t0 + n; tx++) {
                /* B^T d (rows d0 - d2, d1 + d2, d2 - d1, d1 - d3) for tile columns e, o, e+, o+ */
                float a0 = e0[tx] - e2[tx], a1 = e1[tx] + e2[tx], a2 = e2[tx] - e1[tx],
                      a3 = e1[tx] - e3[tx];
                float b0 = o0[tx] - o2[tx], b1 = o1[tx] + o2[tx], b2 = o2[tx] - o1[tx],
                      b3 = o1[tx] - o3[tx];
                float c0 = e0[tx + 1] - e2[tx + 1], c1 = e1[tx + 1] + e2[tx + 1],
                      c2 = e2[tx + 1] - e1[tx + 1], c3 = e1[tx + 1] - e3[tx + 1];
                float d0 = o0[tx + 1] - o2[tx + 1], d1 = o1[tx + 1] + o2[tx + 1],
                      d2 = o2[tx + 1] - o1[tx + 1], d3 = o1[tx + 1] - o3[tx + 1];
                /* (.) B: the same on columns */
                v0[tx] = a0 - c0, v1[tx] = b0 + c0, v2[tx] = c0 - b0, v3[tx] = b0 - d0;
                v4[tx] = a1 - c1, v5[tx] = b1 + c1, v6[tx] = c1 - b1, v7[tx] = b1 - d1;
                v8[tx] = a2 - c2, v9[tx] = b2 + c2, v10[tx] = c2 - b2, v11[tx] = b2 - d2;
                v12[tx] = a3 - c3, v13[tx] = b3 + c3, v14[tx] = c3 - b3, v15[tx] = b3 - d3;
            }
        }
    }
}

/* y [oh, ow] = A^T m A + b for every tile, m read from M[xi][ty * tw + tx] (slots ms apart);
 * the parts of edge tiles beyond oh / ow are dropped. */
static void output_tiles(const float *m, size_t ms, int th, int tw, float b, float *y, int oh,
                         int ow) {
    int full = ow / 2; /* tiles whose two columns are both inside */
    for (int ty = 0; ty < th; ty++) {
        const float *m0 = m + (size_t)ty * tw, *m1 = m0 + ms, *m2 = m1 + ms, *m3 = m2 + ms;
        const float *m4 = m3 + ms, *m5 = m4 + ms, *m6 = m5 + ms, *m7 = m6 + ms, *m8 = m7 + ms;
        const float *m9 = m8 + ms, *m10 = m9 + ms, *m11 = m10 + ms, *m12 = m11 + ms;
        const float *m13 = m12 + ms, *m14 = m13 + ms, *m15 = m14 + ms;
        float *y0 = y + (size_t)(2 * ty) * ow;
        /* a clipped bottom row goes to a dummy, then the real row 0 */
        float dummy[2 * VEC + 2];
        bool two = 2 * ty + 1 < oh;
        for (int tb = 0; tb < tw; tb += VEC) {
            int b0 = tw >= VEC ? TD_MIN(tb, tw - VEC) : tb, n = TD_MIN(VEC, tw - b0);
            float r[4][VEC];
#pragma omp simd simdlen(VEC)
            for (int i = 0; i < n; i++) {
                int tx = b0 + i;
                /* A^T m: rows m0 + m1 + m2 and m1 - m2 - m3, for the 4 columns */
                float a0 = m0[tx] + m4[tx] + m8[tx], a1 = m1[tx] + m5[tx] + m9[tx];
                float a2 = m2[tx] + m6[tx] + m10[tx], a3 = m3[tx] + m7[tx] + m11[tx];
                float c0 = m4[tx] - m8[tx] - m12[tx], c1 = m5[tx] - m9[tx] - m13[tx];
                float c2 = m6[tx] - m10[tx] - m14[tx], c3 = m7[tx] - m11[tx] - m15[tx];
                r[0][i] = a0 + a1 + a2 + b, r[1][i] = a1 - a2 - a3 + b;
                r[2][i] = c0 + c1 + c2 + b, r[3][i] = c1 - c2 - c3 + b;
            }
            int pairs = TD_MAX(0, TD_MIN(n, full - b0)); /* tiles of this block fully inside */
            for (int q = 0; q < 2; q++) {
                float *yr = q == 0 ? y0 : two ? y0 + ow : dummy - 2 * b0;
                const float *ev = r[2 * q], *od = r[2 * q + 1];
#pragma omp simd
                for (int i = 0; i < pairs; i++) {
                    yr[2 * (b0 + i)] = ev[i];
                    yr[2 * (b0 + i) + 1] = od[i];
                }
                if (pairs < n) yr[2 * (b0 + pairs)] = ev[pairs]; /* odd ow: the last column */
            }
        }
    }
}

/* Scratch layout shared by the entry points: dU [16, k, c], V [16, c, T], M [16, k, T], plane. */
typedef struct {
    int th, tw;
    size_t tps, t;      /* tiles per sample, in the call */
    size_t vs, ms, us;  /* slot distances of V, M (or Z), dU (slot_floats) */
    float *v, *m, *du, *p;
} wino_ws;

static wino_ws workspace(int ns, int c, int k, int oh, int ow, float *scratch) {
    wino_ws ws;
    ws.th = (oh + 1) / 2, ws.tw = (ow + 1) / 2;
    ws.tps = (size_t)ws.th * ws.tw, ws.t = (size_t)ns * ws.tps;
    ws.vs = slot_floats((size_t)c * ws.t), ws.ms = slot_floats((size_t)k * ws.t);
    ws.us = slot_floats((size_t)k * c);
    ws.du = scratch; /* first: its place must not depend on the tile count */
    ws.v = ws.du + TD_WINO_POS * ws.us;
    ws.m = ws.v + TD_WINO_POS * ws.vs;
    ws.p = ws.m + TD_WINO_POS * ws.ms;
    return ws;
}

/* V = B^T d B of every input tile of ns samples. */
static void transform_input(const wino_ws *ws, const float *x, size_t ldx, int ns, int c, int h,
                            int w, int pad) {
    int ph = 2 * ws->th + 2, pw = 2 * ws->tw + 2;
    for (int s = 0; s < ns; s++)
        for (int ci = 0; ci < c; ci++) {
            pad_plane(x + s * ldx + (size_t)ci * h * w, h, w, pad, ws->p, ph, pw);
            input_tiles(ws->p, pw, ws->th, ws->tw, ws->v + (size_t)ci * ws->t + (size_t)s * ws->tps,
                        ws->vs);
        }
}

void td__wino_conv(const float *x, size_t ldx, int ns, int c, int h, int w, int pad, const float *u,
                   int k, int oh, int ow, const float *bias, float *y, size_t ldy, float *scratch) {
    int pass = pass_samples(oh, ow);
    for (int s0 = 0; s0 < ns; s0 += pass) {
        int nb = TD_MIN(pass, ns - s0);
        wino_ws ws = workspace(nb, c, k, oh, ow, scratch);
        size_t vs = ws.vs, ms = ws.ms;
        transform_input(&ws, x + s0 * ldx, ldx, nb, c, h, w, pad);
        for (int xi = 0; xi < TD_WINO_POS; xi++)
            td_sgemm(false, false, k, (int)ws.t, c, 1.0f, u + (size_t)xi * k * c, c, ws.v + xi * vs,
                     (int)ws.t, 0.0f, ws.m + xi * ms, (int)ws.t);
        for (int s = 0; s < nb; s++)
            for (int ko = 0; ko < k; ko++)
                output_tiles(ws.m + (size_t)ko * ws.t + (size_t)s * ws.tps, ms, ws.th, ws.tw,
                             bias ? bias[ko] : 0.0f, y + (s0 + s) * ldy + (size_t)ko * oh * ow, oh,
                             ow);
    }
}

/* Z[xi][ty * tw + tx] = (A g A^T)[xi] of the 2x2 output-gradient tiles of the split plane p
 * [2 th, 2 tw] (the adjoint of the output transform); zs is the distance between xi slots. */
static void grad_tiles(const float *p, int th, int tw, float *z, size_t zs) {
    int pw = 2 * tw;
    for (int ty = 0; ty < th; ty++) {
        const float *e0 = p + (size_t)(2 * ty) * pw, *o0 = e0 + tw, *e1 = e0 + pw, *o1 = e1 + tw;
        float *z0 = z + (size_t)ty * tw, *z1 = z0 + zs, *z2 = z1 + zs, *z3 = z2 + zs;
        float *z4 = z3 + zs, *z5 = z4 + zs, *z6 = z5 + zs, *z7 = z6 + zs, *z8 = z7 + zs;
        float *z9 = z8 + zs, *z10 = z9 + zs, *z11 = z10 + zs, *z12 = z11 + zs;
        float *z13 = z12 + zs, *z14 = z13 + zs, *z15 = z14 + zs;
        for (int tb = 0; tb < tw; tb += VEC) {
            int t0 = tw >= VEC ? TD_MIN(tb, tw - VEC) : tb, n = TD_MIN(VEC, tw - t0);
#pragma omp simd simdlen(VEC)
            for (int tx = t0; tx < t0 + n; tx++) {
                /* A g: rows g0, g0 + g1, g0 - g1, -g1, for the even (x) and odd (y) column */
                float x0 = e0[tx], y0 = o0[tx], x1 = e0[tx] + e1[tx], y1 = o0[tx] + o1[tx];
                float x2 = e0[tx] - e1[tx], y2 = o0[tx] - o1[tx], x3 = -e1[tx], y3 = -o1[tx];
                /* (.) A^T: the same on columns */
                z0[tx] = x0, z1[tx] = x0 + y0, z2[tx] = x0 - y0, z3[tx] = -y0;
                z4[tx] = x1, z5[tx] = x1 + y1, z6[tx] = x1 - y1, z7[tx] = -y1;
                z8[tx] = x2, z9[tx] = x2 + y2, z10[tx] = x2 - y2, z11[tx] = -y2;
                z12[tx] = x3, z13[tx] = x3 + y3, z14[tx] = x3 - y3, z15[tx] = -y3;
            }
        }
    }
}

void td__wino_wgrad(const float *x, size_t ldx, int ns, int c, int h, int w, int pad,
                    const float *dy, size_t ldy, int k, int oh, int ow, float *dw, float *scratch) {
    size_t us = slot_floats((size_t)k * c), kc = (size_t)k * c;
    float *du = scratch;
    int pass = pass_samples(oh, ow);
    for (int s0 = 0; s0 < ns; s0 += pass) {
        int nb = TD_MIN(pass, ns - s0);
        wino_ws ws = workspace(nb, c, k, oh, ow, scratch);
        size_t vs = ws.vs, zs = ws.ms;
        transform_input(&ws, x + s0 * ldx, ldx, nb, c, h, w, pad);
        for (int s = 0; s < nb; s++)
            for (int ko = 0; ko < k; ko++) {
                pad_plane(dy + (s0 + s) * ldy + (size_t)ko * oh * ow, oh, ow, 0, ws.p, 2 * ws.th,
                          2 * ws.tw);
                grad_tiles(ws.p, ws.th, ws.tw, ws.m + (size_t)ko * ws.t + (size_t)s * ws.tps, zs);
            }
        /* dU[xi] [k, c] += Z[xi] [k, T] x V[xi]^T: the sum over tiles is the gemm's K */
        for (int xi = 0; xi < TD_WINO_POS; xi++)
            td_sgemm(false, true, k, c, (int)ws.t, 1.0f, ws.m + xi * zs, (int)ws.t, ws.v + xi * vs,
                     (int)ws.t, s0 ? 1.0f : 0.0f, du + xi * us, c);
    }
    /* dW = G^T dU G, G^T rows (1, 1/2, 1/2, 0), (0, 1/2, -1/2, 0), (0, 1/2, 1/2, 1), each of a
     * filter's 16 values read once straight from its slot (gathered into a stack array first,
     * the reloads stalled on store forwarding: ~1% of resnet-small's step) */
    for (size_t f = 0; f < kc; f++) {
        const float *uf = du + f;
        float r[3][4];
        for (int j = 0; j < 4; j++) {
            float u0 = uf[j * us], u1 = uf[(4 + j) * us], u2 = uf[(8 + j) * us],
                  u3 = uf[(12 + j) * us];
            r[0][j] = u0 + 0.5f * (u1 + u2);
            r[1][j] = 0.5f * (u1 - u2);
            r[2][j] = 0.5f * (u1 + u2) + u3;
        }
        float *g = dw + f * 9;
        for (int i = 0; i < 3; i++) {
            g[3 * i] = r[i][0] + 0.5f * (r[i][1] + r[i][2]);
            g[3 * i + 1] = 0.5f * (r[i][1] - r[i][2]);
            g[3 * i + 2] = 0.5f * (r[i][1] + r[i][2]) + r[i][3];
        }
    }
}
