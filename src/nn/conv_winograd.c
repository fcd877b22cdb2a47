/* Winograd F(4x4, 3x3) (Lavin & Gray 2015) for 3x3 stride-1 convolutions.
 *
 * Every 4x4 output tile is computed from a 6x6 input tile d as A^T [(G g G^T) . (B^T d B)] A,
 * so the channel sums become 36 independent gemms, one per position xi of the 6x6 tile:
 *     M[xi] [k, T] = U[xi] [k, c] x V[xi] [c, T]
 * with T the tiles of one pass (see pass_samples). 36 * c * k multiplies per 16 outputs instead
 * of 144 * c * k: 4x fewer in the gemms, and the transforms move 2.25 floats per output and
 * channel where F(2x2, 3x3) moved 4 (the step that bounded resnet-small). The interpolation
 * points are 0, +-1, +-2 and infinity; the constants (4, 5, 8, 1/6, 1/24) make it less exact
 * than F(2x2): ~1e-6 relative against a float64 direct conv where F(2x2) is ~2e-7
 * (docs/benchmarks.md), far inside what the comparisons with PyTorch allow. The transforms are
 * fixed sequences per element, as deterministic as the gemm calls themselves.
 *
 * Each 2-D transform runs as two 1-D passes, each a flat loop over every tile of the pass (so
 * vectorised however few tiles a row has: resnet-small's 8x8 planes have two): the plane is
 * split so that the six columns of a tile, and its rows, lie at the same index of different
 * slots (transform_input, grad_tiles), the 1-D transforms are then elementwise across slots.
 * Output sizes that are not a multiple of 4 pad the tile grid with zeros; the output transform
 * drops what lies outside. */
#include <string.h>

#include "nn_internal.h" /* conv_winograd.h, tensor.h, the vector types */

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

enum { TILE = 4 }; /* outputs per tile side (a tile reads TILE + 2 inputs a side) */

/* Samples per pass (transforms + 36 gemms), from the tiles of one sample, so the same on every
 * rank and thread count: small planes batch samples until a pass has PASS_TILES tiles (the
 * 16x16 and 8x8 stages of resnet-small have 16 and 4 tiles a sample), so that the gemms are not
 * all edge. */
#ifndef PASS_TILES
#define PASS_TILES 64
#endif
static int tiles(int n) {
    return (n + TILE - 1) / TILE;
}
static int pass_samples(int oh, int ow) {
    return TD_MAX(1, PASS_TILES / (tiles(oh) * tiles(ow)));
}

static size_t round16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* Distance in floats between the tile-position slots of V, M, dU and H, each holding n floats:
 * rounded up to whole cache lines, and to an odd number of them. The transforms write (or
 * read) several slots at once; slots a multiple of 4 KiB apart (every power-of-two shape) put
 * all the streams into one L1 set, more than it has ways, and resnet-small's transforms ran ~2x
 * slower for it. An odd number of lines puts them in different sets. Only addresses change: the
 * same bits. */
static size_t slot_floats(size_t n) {
    size_t s = round16(n);
    return (s / 16) % 2 ? s : s + 16;
}

/* The 1-D transforms, each a fixed sequence; B^T and A^T take floats or vectors of them. */

/* G g: 3 filter taps to 6 */
#define WINO_G(g0, g1, g2, t)                                                                    \
    do {                                                                                         \
        float s_ = -(1.0f / 6) * ((g0) + (g2)), q_ = (1.0f / 24) * (g0) + (1.0f / 6) * (g2);    \
        (t)[0] = 0.25f * (g0), (t)[1] = s_ - (1.0f / 6) * (g1), (t)[2] = s_ + (1.0f / 6) * (g1); \
        (t)[3] = q_ + (1.0f / 12) * (g1), (t)[4] = q_ - (1.0f / 12) * (g1), (t)[5] = (g2);      \
    } while (0)

/* B^T d: 6 inputs to 6 */
#define WINO_BT(d0, d1, d2, d3, d4, d5, o0, o1, o2, o3, o4, o5)                                  \
    do {                                                                                         \
        __typeof__((d0) + 0.0f) p_ = (d4) - 4.0f * (d2), q_ = (d3) - 4.0f * (d1);                \
        __typeof__((d0) + 0.0f) r_ = (d4) - (d2), u_ = 2.0f * ((d3) - (d1));                     \
        o0 = 4.0f * (d0) - 5.0f * (d2) + (d4);                                                   \
        o1 = p_ + q_, o2 = p_ - q_, o3 = r_ + u_, o4 = r_ - u_;                                  \
        o5 = 4.0f * (d1) - 5.0f * (d3) + (d5);                                                   \
    } while (0)

/* A^T m: 6 to 4 outputs */
#define WINO_AT(m0, m1, m2, m3, m4, m5, o0, o1, o2, o3)                                          \
    do {                                                                                         \
        __typeof__((m0) + 0.0f) a_ = (m1) + (m2), b_ = (m1) - (m2), c_ = (m3) + (m4),            \
                                e_ = (m3) - (m4);                                                \
        o0 = (m0) + a_ + c_, o1 = b_ + 2.0f * e_, o2 = a_ + 4.0f * c_;                           \
        o3 = b_ + 8.0f * e_ + (m5);                                                              \
    } while (0)

/* G^T u: 6 to 3 (the adjoint of G, for the weight gradient) */
#define WINO_GT(u0, u1, u2, u3, u4, u5, o0, o1, o2)                                              \
    do {                                                                                         \
        float a_ = (u1) + (u2), b_ = (u3) + (u4);                                                \
        o0 = 0.25f * (u0) - (1.0f / 6) * a_ + (1.0f / 24) * b_;                                  \
        o1 = (1.0f / 6) * ((u2) - (u1)) + (1.0f / 12) * ((u3) - (u4));                          \
        o2 = (1.0f / 6) * (b_ - a_) + (u5);                                                      \
    } while (0)

/* A g: 4 output gradients to 6 (the adjoint of A^T) */
#define WINO_A(g0, g1, g2, g3, o0, o1, o2, o3, o4, o5)                                           \
    do {                                                                                         \
        float p_ = (g0) + (g2), q_ = (g1) + (g3);                                                \
        float r_ = (g0) + 4.0f * (g2), u_ = 2.0f * (g1) + 8.0f * (g3);                          \
        o0 = (g0), o1 = p_ + q_, o2 = p_ - q_, o3 = r_ + u_, o4 = r_ - u_, o5 = (g3);           \
    } while (0)

/* B m: 6 to 6 (the adjoint of B^T, for the input gradient) */
#define WINO_B(m0, m1, m2, m3, m4, m5, o0, o1, o2, o3, o4, o5)                                   \
    do {                                                                                         \
        __typeof__((m0) + 0.0f) a_ = (m1) + (m2), b_ = (m2) - (m1), c_ = (m3) + (m4),            \
                                d_ = (m3) - (m4);                                                \
        o0 = 4.0f * (m0), o1 = 4.0f * (b_ + (m5)) - 2.0f * d_;                                   \
        o2 = -5.0f * (m0) - 4.0f * a_ - c_, o3 = 2.0f * d_ - b_ - 5.0f * (m5);                   \
        o4 = (m0) + a_ + c_, o5 = (m5);                                                          \
    } while (0)

/* U = G g G^T per filter, vectorised over a block of filters: their taps are gathered into
 * g[9][BLOCK], then each of the 36 positions is stored for the whole block, contiguous in U.
 * U's slots lie slot_floats apart (at 64 x 64 channels, 16 KiB apart, the 36 stores of a block
 * all went to one L1 set: the transform took 3.5% of resnet-small's step). */
size_t td__wino_filter_floats(int oc, int ic) {
    return TD_WINO_POS * slot_floats((size_t)oc * ic);
}

void td__wino_filter(const float *w, int oc, int ic, float *u) {
    enum { BLOCK = 16 };
    size_t plane = (size_t)oc * ic, us = slot_floats(plane);
    for (size_t f0 = 0; f0 < plane; f0 += BLOCK) {
        int n = (int)TD_MIN((size_t)BLOCK, plane - f0);
        float g[9][BLOCK];
        for (int l = 0; l < n; l++)
            for (int e = 0; e < 9; e++) g[e][l] = w[(f0 + l) * 9 + e];
#pragma omp simd
        for (int l = 0; l < n; l++) {
            float gg[6][3], t[6];
#pragma GCC unroll 3
            for (int j = 0; j < 3; j++) {
                WINO_G(g[j][l], g[3 + j][l], g[6 + j][l], t);
#pragma GCC unroll 6
                for (int i = 0; i < 6; i++) gg[i][j] = t[i];
            }
#pragma GCC unroll 6
            for (int i = 0; i < 6; i++) {
                WINO_G(gg[i][0], gg[i][1], gg[i][2], t);
#pragma GCC unroll 6
                for (int j = 0; j < 6; j++) u[(6 * i + j) * us + f0 + l] = t[j];
            }
        }
    }
}

/* Scratch layout shared by the entry points: dU [36, k, c], V [36, c, T], M [36, k, T], then the
 * split planes P [24, ...] and the half-transformed tiles H [24, ...] (slots ps apart), the
 * padded input planes [ns][4 (th + 1)][4 (tw + 1)], and a table of where each tile of a pass
 * starts (`at`: in the planes, or in y). */
typedef struct {
    int th, tw;
    size_t tps, t;          /* tiles per sample, in the pass */
    size_t sps;             /* floats of one sample in a P or H slot: (th + 1) * tw */
    size_t vs, ms, us, ps;  /* slot distances of V, M (or Z), dU, P and H (slot_floats) */
    size_t pw, rows;        /* the padded plane's row length and rows */
    size_t floats;          /* all of it */
    float *v, *m, *du, *p, *h, *plane;
    size_t *at;             /* ns * sps entries (>= t) */
} wino_ws;

/* The layout of a pass of ns samples; with scratch == NULL only the sizes. */
static wino_ws workspace(int ns, int c, int k, int oh, int ow, float *scratch) {
    wino_ws ws = {0};
    ws.th = tiles(oh), ws.tw = tiles(ow);
    ws.tps = (size_t)ws.th * ws.tw, ws.t = (size_t)ns * ws.tps;
    ws.sps = (size_t)(ws.th + 1) * ws.tw;
    ws.vs = slot_floats((size_t)c * ws.t), ws.ms = slot_floats((size_t)k * ws.t);
    ws.us = slot_floats((size_t)k * c), ws.ps = slot_floats((size_t)ns * ws.sps);
    ws.pw = (size_t)TILE * (ws.tw + 1), ws.rows = (size_t)TILE * (ws.th + 1);
    /* dU first: its place must not depend on the tile count */
    size_t v = TD_WINO_POS * ws.us, m = v + TD_WINO_POS * ws.vs, p = m + TD_WINO_POS * ws.ms;
    size_t h = p + 24 * ws.ps, plane = h + 24 * ws.ps;
    size_t at = round16(plane + (size_t)ns * ws.rows * ws.pw);
    ws.floats = at + (size_t)ns * ws.sps * (sizeof(size_t) / sizeof(float));
    if (scratch) {
        ws.du = scratch, ws.v = scratch + v, ws.m = scratch + m, ws.p = scratch + p;
        ws.h = scratch + h, ws.plane = scratch + plane, ws.at = (size_t *)(scratch + at);
    }
    return ws;
}

size_t td__wino_scratch_floats(int ns, int c, int k, int h, int w, int oh, int ow) {
    (void)h, (void)w;
    return workspace(TD_MIN(ns, pass_samples(oh, ow)), c, k, oh, ow, NULL).floats;
}

/* at[g] for the n tiles of a pass, per_sample a sample, tw a tile row: where tile g starts,
 * sample_step a sample and row_step a tile row apart (in the padded planes for the input's split,
 * in y or dy for the output and its gradient). */
static void tile_places(size_t *at, size_t n, size_t per_sample, int tw, size_t sample_step,
                        size_t row_step) {
    for (size_t g = 0; g < n; g++)
        at[g] = g / per_sample * sample_step + g % per_sample / tw * row_step + g % tw * TILE;
}

/* Eight tiles' six columns into P: tile q's columns 0-3 are the four floats at t[q], columns
 * 4 and 5 the two after them (the next tile's first two), each stored at d[b] + at. The
 * stride-4 gather is two in-lane 4 x 4 transposes: the 128-bit halves of A..D hold tiles
 * (0, 4), (1, 5), (2, 6), (3, 7), so unpacking pairs and then halves of pairs leaves column b
 * of tiles 0-7 in order; columns 4 and 5 the same from t[q] + 4. Only lane-local shuffles, which
 * every x86 level has (the scalar gather this replaced was a third of the input transform). */

static inline __attribute__((always_inline)) v8f pair(const float *lo, const float *hi) {
    return __builtin_shufflevector(*(const v4f *)lo, *(const v4f *)hi, 0, 1, 2, 3, 4, 5, 6, 7);
}

static inline __attribute__((always_inline)) void split8(const float *const t[8], int from,
                                                         float *const d[6], size_t at) {
    v8f a = pair(t[0] + from, t[4] + from), b = pair(t[1] + from, t[5] + from);
    v8f c = pair(t[2] + from, t[6] + from), e = pair(t[3] + from, t[7] + from);
    v8f ab0 = __builtin_shufflevector(a, b, 0, 8, 1, 9, 4, 12, 5, 13);
    v8f ce0 = __builtin_shufflevector(c, e, 0, 8, 1, 9, 4, 12, 5, 13);
    *(v8f *)(d[from] + at) = __builtin_shufflevector(ab0, ce0, 0, 1, 8, 9, 4, 5, 12, 13);
    *(v8f *)(d[from + 1] + at) = __builtin_shufflevector(ab0, ce0, 2, 3, 10, 11, 6, 7, 14, 15);
    if (from) return; /* columns 4 and 5: two of the four */
    v8f ab1 = __builtin_shufflevector(a, b, 2, 10, 3, 11, 6, 14, 7, 15);
    v8f ce1 = __builtin_shufflevector(c, e, 2, 10, 3, 11, 6, 14, 7, 15);
    *(v8f *)(d[2] + at) = __builtin_shufflevector(ab1, ce1, 0, 1, 8, 9, 4, 5, 12, 13);
    *(v8f *)(d[3] + at) = __builtin_shufflevector(ab1, ce1, 2, 3, 10, 11, 6, 7, 14, 15);
}

/* V = B^T d B of every input tile of ns samples. The padded planes of the pass's samples are
 * split by row mod 4 (qr) and by the six columns of a tile (b): P[qr * 6 + b][s * sps + ry * tw
 * + tx] = padded[s][4 ry + qr][4 tx + b] (columns 4tx + 4, 4tx + 5 are the next tile's first
 * two, stored twice), so that both 1-D passes below are flat loops over all tiles: B^T across
 * (H[qr * 6 + j] from P[qr * 6 + 0..5] at the same place), then B^T down (rows 4 ty + 4,
 * 4 ty + 5 are row phases 0 and 1 one tile row, tw, further on). P's index runs over samples,
 * tile rows and tiles alike, so the split takes eight tiles at a time across row and sample
 * boundaries (resnet-small's 8x8 planes have two tiles a row); every place of P is written from
 * the planes, padding rows included, so nothing is cleared. */
/* n floats from src to dst (apart), eight at a time inline, the last eight overlapping the
 * ones before where n is not a multiple (the same values written twice). A row is 8 to 32
 * floats here and there are tens of thousands a step: memcpy's call and size dispatch were most
 * of the copy (5% of resnet-small's step). */
static inline void copy_row(float *restrict dst, const float *restrict src, int n) {
    if (n < 8) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
        return;
    }
    int i = 0;
    for (; i + 8 <= n; i += 8) memcpy(dst + i, src + i, 8 * sizeof(float));
    if (i < n) memcpy(dst + n - 8, src + n - 8, 8 * sizeof(float));
}

/* Prefetch the planes of ns samples (ld floats apart) of `floats` floats each at p, for writing
 * when `write`: a channel's plane, the next one to be read or written. A 32x32 plane is one
 * 4 KiB page, where the hardware prefetcher stops. */
static void prefetch_planes(const float *p, size_t ld, int ns, size_t floats, bool write) {
    for (int s = 0; s < ns; s++) {
        const char *q = (const char *)(p + s * ld);
        for (size_t b = 0; b < sizeof(float) * floats; b += 64) {
            if (write)
                __builtin_prefetch(q + b, 1);
            else
                __builtin_prefetch(q + b);
        }
    }
}

static void transform_input(const wino_ws *ws, const float *x, size_t ldx, int ns, int c, int h,
                            int w, int pad) {
    int tw = ws->tw;
    size_t ps = ws->ps, sps = ws->sps, n = (size_t)ns * sps;
    /* the padded planes [ns][4 (th + 1)][pw]: x's rows copied in (all of them first: splitting
     * each row straight after its copy stalled the loads on the copy's unaligned stores), the
     * zeros around them set once here */
    size_t pw = ws->pw, rows = ws->rows, one = rows * pw;
    int r0 = TD_MAX(0, pad), r1 = TD_MIN((int)rows, h + pad); /* padded rows holding x's rows */
    int c0 = TD_MAX(0, -pad), c1 = TD_MIN(w, (int)pw - pad);  /* x's columns that land inside */
    float *plane = ws->plane;
    memset(plane, 0, sizeof(float) * (size_t)ns * one);
    /* tile f = (s, ry, tx) of the split reads plane s from row 4 ry + qr, column 4 tx */
    const size_t *at = ws->at;
    tile_places(ws->at, n, sps, tw, one, TILE * pw);
    for (int ci = 0; ci < c; ci++) {
        /* the next channel's planes on their way while this one is split and transformed (in
         * the weight gradient x comes from memory: the forward wrote it long before) */
        if (ci + 1 < c) prefetch_planes(x + (size_t)(ci + 1) * h * w, ldx, ns, (size_t)h * w, false);
        for (int s = 0; s < ns && c1 > c0; s++) {
            const float *xp = x + s * ldx + (size_t)ci * h * w;
            for (int r = r0; r < r1; r++)
                copy_row(plane + s * one + (size_t)r * pw + c0 + pad,
                         xp + (size_t)(r - pad) * w + c0, c1 - c0);
        }
        for (int qr = 0; qr < TILE; qr++) {
            float *d[6];
            for (int b = 0; b < 6; b++) d[b] = ws->p + (size_t)(qr * 6 + b) * ps;
            const float *row = plane + (size_t)qr * pw, *t[8];
            size_t f = 0;
            for (; f + 8 <= n; f += 8) {
                for (int q = 0; q < 8; q++) t[q] = row + at[f + q];
                split8(t, 0, d, f);
                split8(t, 4, d, f);
            }
            for (; f < n; f++)
                for (int b = 0; b < 6; b++) d[b][f] = row[at[f] + b];
        }
        for (int qr = 0; qr < TILE; qr++) {
            const float *b0 = ws->p + (size_t)qr * 6 * ps, *b1 = b0 + ps, *b2 = b1 + ps,
                        *b3 = b2 + ps, *b4 = b3 + ps, *b5 = b4 + ps;
            float *o0 = ws->h + (size_t)qr * 6 * ps, *o1 = o0 + ps, *o2 = o1 + ps, *o3 = o2 + ps,
                  *o4 = o3 + ps, *o5 = o4 + ps;
#pragma omp simd
            for (size_t f = 0; f < n; f++)
                WINO_BT(b0[f], b1[f], b2[f], b3[f], b4[f], b5[f], o0[f], o1[f], o2[f], o3[f],
                        o4[f], o5[f]);
        }
        size_t vs = ws->vs, tps = ws->tps;
        int s = 0;
        /* four tiles a sample (8x8 planes): two samples a vector, the loop below ran scalar */
        for (; tps == 4 && s + 2 <= ns; s += 2)
            for (int j = 0; j < 6; j++) {
                const float *h0 = ws->h + (size_t)j * ps + s * sps, *h1 = h0 + 6 * ps,
                            *h2 = h1 + 6 * ps, *h3 = h2 + 6 * ps, *h4 = h0 + tw, *h5 = h1 + tw;
                float *v0 = ws->v + (size_t)j * vs + (size_t)ci * ws->t + s * tps;
                v8f o0, o1, o2, o3, o4, o5;
                WINO_BT(pair(h0, h0 + sps), pair(h1, h1 + sps), pair(h2, h2 + sps),
                        pair(h3, h3 + sps), pair(h4, h4 + sps), pair(h5, h5 + sps), o0, o1, o2,
                        o3, o4, o5);
                *(v8f *)v0 = o0, *(v8f *)(v0 + 6 * vs) = o1, *(v8f *)(v0 + 12 * vs) = o2;
                *(v8f *)(v0 + 18 * vs) = o3, *(v8f *)(v0 + 24 * vs) = o4;
                *(v8f *)(v0 + 30 * vs) = o5;
            }
        for (; s < ns; s++)
            for (int j = 0; j < 6; j++) {
                const float *h0 = ws->h + (size_t)j * ps + s * sps, *h1 = h0 + 6 * ps,
                            *h2 = h1 + 6 * ps, *h3 = h2 + 6 * ps, *h4 = h0 + tw, *h5 = h1 + tw;
                float *v0 = ws->v + (size_t)j * vs + (size_t)ci * ws->t + s * tps;
                float *v1 = v0 + 6 * vs, *v2 = v1 + 6 * vs, *v3 = v2 + 6 * vs, *v4 = v3 + 6 * vs,
                      *v5 = v4 + 6 * vs;
#pragma omp simd
                for (size_t i = 0; i < tps; i++)
                    WINO_BT(h0[i], h1[i], h2[i], h3[i], h4[i], h5[i], v0[i], v1[i], v2[i], v3[i],
                            v4[i], v5[i]);
            }
    }
}

/* Eight tiles' four output rows q0..q3 (lane q: tile q) stored as four floats at y + at[q]:
 * split8's transposes the other way round. */
static inline __attribute__((always_inline)) void store8(v8f q0, v8f q1, v8f q2, v8f q3,
                                                         float *y, const size_t *at) {
    v8f u0 = __builtin_shufflevector(q0, q1, 0, 8, 1, 9, 4, 12, 5, 13);
    v8f u1 = __builtin_shufflevector(q0, q1, 2, 10, 3, 11, 6, 14, 7, 15);
    v8f u2 = __builtin_shufflevector(q2, q3, 0, 8, 1, 9, 4, 12, 5, 13);
    v8f u3 = __builtin_shufflevector(q2, q3, 2, 10, 3, 11, 6, 14, 7, 15);
    v8f r[4] = {__builtin_shufflevector(u0, u2, 0, 1, 8, 9, 4, 5, 12, 13),
                __builtin_shufflevector(u0, u2, 2, 3, 10, 11, 6, 7, 14, 15),
                __builtin_shufflevector(u1, u3, 0, 1, 8, 9, 4, 5, 12, 13),
                __builtin_shufflevector(u1, u3, 2, 3, 10, 11, 6, 7, 14, 15)};
    for (int q = 0; q < 4; q++) { /* r[q] holds tiles q and q + 4 */
        *(v4f *)(y + at[q]) = __builtin_shufflevector(r[q], r[q], 0, 1, 2, 3);
        *(v4f *)(y + at[q + 4]) = __builtin_shufflevector(r[q], r[q], 4, 5, 6, 7);
    }
}

/* Where tile g of a pass starts in y (sample s at y + s * ldy), for output_tiles and
 * grad_tiles. */
static void output_places(const wino_ws *ws, size_t ldy, int ow) {
    tile_places(ws->at, ws->t, ws->tps, ws->tw, ldy, (size_t)TILE * ow);
}

/* y = A^T m A + b of output channel ko's tiles (M at m, slots ms apart): A^T down the columns
 * over the whole pass into H[r * 6 + j], then A^T across each row, written into y's rows; the
 * parts of edge tiles beyond oh / ow are dropped. Where every tile is whole, the second pass is
 * flat over the pass's tiles too, eight at a time, each stored at its place (output_places). */
static void output_tiles(const wino_ws *ws, const float *m, size_t ms, int ns, float b, float *y,
                         size_t ldy, int oh, int ow) {
    size_t hs = ws->ps, t = ws->t; /* H's slots */
    int tw = ws->tw, full = ow / TILE; /* tiles whose four columns are all inside */
    for (int j = 0; j < 6; j++) {
        const float *m0 = m + (size_t)j * ms, *m1 = m0 + 6 * ms, *m2 = m1 + 6 * ms,
                    *m3 = m2 + 6 * ms, *m4 = m3 + 6 * ms, *m5 = m4 + 6 * ms;
        float *o0 = ws->h + (size_t)j * hs, *o1 = o0 + 6 * hs, *o2 = o1 + 6 * hs,
              *o3 = o2 + 6 * hs;
#pragma omp simd
        for (size_t i = 0; i < t; i++)
            WINO_AT(m0[i], m1[i], m2[i], m3[i], m4[i], m5[i], o0[i], o1[i], o2[i], o3[i]);
    }
    if (oh % TILE == 0 && ow % TILE == 0) {
        for (int a = 0; a < TILE; a++) { /* output row 4 ty + a of every tile */
            const float *a0 = ws->h + (size_t)a * 6 * hs, *a1 = a0 + hs, *a2 = a1 + hs,
                        *a3 = a2 + hs, *a4 = a3 + hs, *a5 = a4 + hs;
            float *ya = y + (size_t)a * ow;
            size_t g = 0;
            for (; g + 8 <= t; g += 8) {
                v8f q0, q1, q2, q3;
                WINO_AT(*(const v8f *)(a0 + g), *(const v8f *)(a1 + g), *(const v8f *)(a2 + g),
                        *(const v8f *)(a3 + g), *(const v8f *)(a4 + g), *(const v8f *)(a5 + g),
                        q0, q1, q2, q3);
                store8(q0 + b, q1 + b, q2 + b, q3 + b, ya, ws->at + g);
            }
            for (; g < t; g++) {
                float *yt = ya + ws->at[g];
                WINO_AT(a0[g], a1[g], a2[g], a3[g], a4[g], a5[g], yt[0], yt[1], yt[2], yt[3]);
                yt[0] += b, yt[1] += b, yt[2] += b, yt[3] += b;
            }
        }
        return;
    }
    for (int s = 0; s < ns; s++)
        for (int oy = 0; oy < oh; oy++) {
            const float *a0 = ws->h + (size_t)(oy % TILE) * 6 * hs + s * ws->tps +
                              (size_t)(oy / TILE) * tw;
            const float *a1 = a0 + hs, *a2 = a1 + hs, *a3 = a2 + hs, *a4 = a3 + hs,
                        *a5 = a4 + hs;
            float *yr = y + s * ldy + (size_t)oy * ow;
#pragma omp simd
            for (int tx = 0; tx < full; tx++) {
                float q0, q1, q2, q3;
                WINO_AT(a0[tx], a1[tx], a2[tx], a3[tx], a4[tx], a5[tx], q0, q1, q2, q3);
                yr[4 * tx] = q0 + b, yr[4 * tx + 1] = q1 + b;
                yr[4 * tx + 2] = q2 + b, yr[4 * tx + 3] = q3 + b;
            }
            if (full < tw) { /* ow % 4 columns of a last, clipped tile */
                float q[4];
                WINO_AT(a0[full], a1[full], a2[full], a3[full], a4[full], a5[full], q[0], q[1],
                        q[2], q[3]);
                for (int cx = 0; cx < ow - TILE * full; cx++) yr[TILE * full + cx] = q[cx] + b;
            }
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
            td_sgemm(false, false, k, (int)ws.t, c, 1.0f, u + xi * ws.us, c, ws.v + xi * vs,
                     (int)ws.t, 0.0f, ws.m + xi * ms, (int)ws.t);
        output_places(&ws, ldy, ow);
        for (int ko = 0; ko < k; ko++) {
            if (ko + 1 < k)
                prefetch_planes(y + s0 * ldy + (size_t)(ko + 1) * oh * ow, ldy, nb,
                                (size_t)oh * ow, true);
            output_tiles(&ws, ws.m + (size_t)ko * ws.t, ms, nb, bias ? bias[ko] : 0.0f,
                         y + s0 * ldy + (size_t)ko * oh * ow, ldy, oh, ow);
        }
    }
}

/* Z = A g A^T of the 4x4 output-gradient tiles of ns samples' channel ko (g zero beyond oh / ow),
 * into z (slots zs apart). The plane is split into P[a * 4 + b][s * tps + ty * tw + tx] =
 * dy[4 ty + a][4 tx + b] (the tiles do not overlap), then A across into H[a * 6 + j] and A down,
 * both flat over the pass's tiles. Whole tiles are split eight at a time from their places in dy
 * (output_places); otherwise row by row, P's zeros beyond oh / ow set once per call (`clear`). */
static void grad_tiles(const wino_ws *ws, const float *dy, size_t ldy, int ns, int oh, int ow,
                       bool clear, float *z, size_t zs) {
    int tw = ws->tw, full = ow / TILE;
    size_t ps = ws->ps, t = ws->t;
    if (oh % TILE == 0 && ow % TILE == 0) { /* whole tiles: eight at a time, at output_places */
        for (int a = 0; a < TILE; a++) {
            float *d[6] = {NULL};
            for (int b = 0; b < TILE; b++) d[b] = ws->p + (size_t)(a * 4 + b) * ps;
            const float *ga = dy + (size_t)a * ow, *t8[8];
            size_t g = 0;
            for (; g + 8 <= t; g += 8) {
                for (int q = 0; q < 8; q++) t8[q] = ga + ws->at[g + q];
                split8(t8, 0, d, g);
            }
            for (; g < t; g++)
                for (int b = 0; b < TILE; b++) d[b][g] = ga[ws->at[g] + b];
        }
    } else {
        if (clear) memset(ws->p, 0, sizeof(float) * 16 * ps);
        for (int s = 0; s < ns; s++)
            for (int r = 0; r < oh; r++) {
                const float *g = dy + s * ldy + (size_t)r * ow;
                float *d0 = ws->p + (size_t)(r % TILE) * 4 * ps + s * ws->tps +
                            (size_t)(r / TILE) * tw;
                float *d1 = d0 + ps, *d2 = d1 + ps, *d3 = d2 + ps;
#pragma omp simd
                for (int tx = 0; tx < full; tx++) {
                    const float *gt = g + TILE * tx;
                    d0[tx] = gt[0], d1[tx] = gt[1], d2[tx] = gt[2], d3[tx] = gt[3];
                }
                for (int cx = TILE * full; cx < ow; cx++) d0[(cx % TILE) * ps + full] = g[cx];
            }
    }
    for (int a = 0; a < TILE; a++) {
        const float *g0 = ws->p + (size_t)a * 4 * ps, *g1 = g0 + ps, *g2 = g1 + ps, *g3 = g2 + ps;
        float *o0 = ws->h + (size_t)a * 6 * ps, *o1 = o0 + ps, *o2 = o1 + ps, *o3 = o2 + ps,
              *o4 = o3 + ps, *o5 = o4 + ps;
#pragma omp simd
        for (size_t i = 0; i < t; i++)
            WINO_A(g0[i], g1[i], g2[i], g3[i], o0[i], o1[i], o2[i], o3[i], o4[i], o5[i]);
    }
    for (int j = 0; j < 6; j++) {
        const float *g0 = ws->h + (size_t)j * ps, *g1 = g0 + 6 * ps, *g2 = g1 + 6 * ps,
                    *g3 = g2 + 6 * ps;
        float *z0 = z + (size_t)j * zs, *z1 = z0 + 6 * zs, *z2 = z1 + 6 * zs, *z3 = z2 + 6 * zs,
              *z4 = z3 + 6 * zs, *z5 = z4 + 6 * zs;
#pragma omp simd
        for (size_t i = 0; i < t; i++)
            WINO_A(g0[i], g1[i], g2[i], g3[i], z0[i], z1[i], z2[i], z3[i], z4[i], z5[i]);
    }
}

/* dx of ns samples from the gradient of V (in V's place, [36, c, T]): transform_input run
 * backwards, channel by channel, every pass flat over the pass's tiles. B down each tile's
 * columns (E[r * 6 + j], in H then P), B across (D[r * 6 + b], in V's place: D[r][b] is the
 * gradient of the tile's padded-input value at row r, column b). A tile overlaps its right and
 * lower neighbours by two columns and rows: columns 4 and 5 are added onto the next tile's 0 and
 * 1 (all six rows), then rows 4 and 5 onto the lower tile's 0 and 1, so that D[0..3][0..3] is
 * each tile's share of the padded planes, stored in place (split8's transposes the other way
 * round: store8); the last tile row's rows 4 and 5 and the last column's columns 4 and 5 fill
 * the planes' last four rows and columns. dx is the planes without their border. Each value is
 * a sum in one fixed order. */
static void input_grad(const wino_ws *ws, int ns, int c, int h, int w, int pad, float *dx,
                       size_t lddx) {
    int th = ws->th, tw = ws->tw;
    size_t ps = ws->ps, tps = ws->tps, vs = ws->vs, t = ws->t;
    size_t pw = ws->pw, rows = ws->rows, one = rows * pw;
    /* the planes' rows and columns past the tiles' first four that dx reads (at most 4; the
     * planes, 4 (th + 1) >= h + 2 pad + 2 rows and as many columns, hold all of dx's) */
    int rows_past = TD_MIN(TILE, pad + h - TILE * th);
    int cols_past = TD_MIN(TILE, pad + w - TILE * tw);
    float *plane = ws->plane, *e[36];
    for (int q = 0; q < 36; q++) e[q] = q < 24 ? ws->h + (size_t)q * ps : ws->p + (q - 24) * ps;
    /* which tiles have a left and an upper neighbour (P's slots 12 and 13) */
    float *left = ws->p + 12 * ps, *up = ws->p + 13 * ps;
    for (size_t g = 0; g < t; g++) left[g] = g % tw != 0, up[g] = g % tps >= (size_t)tw;
    tile_places(ws->at, t, tps, tw, one, TILE * pw); /* tile g's place in the planes */
    for (int ci = 0; ci < c; ci++) {
        float *d[36];
        for (int q = 0; q < 36; q++) d[q] = ws->v + (size_t)q * vs + (size_t)ci * t;
        for (int j = 0; j < 6; j++) {
            const float *m0 = d[j], *m1 = d[6 + j], *m2 = d[12 + j], *m3 = d[18 + j],
                        *m4 = d[24 + j], *m5 = d[30 + j];
            float *o0 = e[j], *o1 = e[6 + j], *o2 = e[12 + j], *o3 = e[18 + j], *o4 = e[24 + j],
                  *o5 = e[30 + j];
#pragma omp simd
            for (size_t g = 0; g < t; g++)
                WINO_B(m0[g], m1[g], m2[g], m3[g], m4[g], m5[g], o0[g], o1[g], o2[g], o3[g],
                       o4[g], o5[g]);
        }
        for (int r = 0; r < 6; r++) {
            float *const *er = e + 6 * r, *const *dr = d + 6 * r;
#pragma omp simd
            for (size_t g = 0; g < t; g++)
                WINO_B(er[0][g], er[1][g], er[2][g], er[3][g], er[4][g], er[5][g], dr[0][g],
                       dr[1][g], dr[2][g], dr[3][g], dr[4][g], dr[5][g]);
            for (int b = 0; b < 2; b++) { /* columns 4, 5 onto the right neighbour's 0, 1 */
                float *to = dr[b];
                const float *from = dr[4 + b];
#pragma omp simd
                for (size_t g = 1; g < t; g++) to[g] += left[g] != 0.0f ? from[g - 1] : 0.0f;
            }
        }
        for (int r = 0; r < 2; r++) /* rows 4, 5 onto the lower neighbour's 0, 1 */
            for (int b = 0; b < TILE; b++) {
                float *to = d[6 * r + b];
                const float *from = d[6 * (4 + r) + b];
#pragma omp simd
                for (size_t g = (size_t)tw; g < t; g++)
                    to[g] += up[g] != 0.0f ? from[g - tw] : 0.0f;
            }
        for (int r = 0; r < TILE; r++) {
            const float *d0 = d[6 * r], *d1 = d[6 * r + 1], *d2 = d[6 * r + 2],
                        *d3 = d[6 * r + 3];
            float *row = plane + (size_t)r * pw;
            size_t g = 0;
            for (; g + 8 <= t; g += 8)
                store8(*(const v8f *)(d0 + g), *(const v8f *)(d1 + g), *(const v8f *)(d2 + g),
                       *(const v8f *)(d3 + g), row, ws->at + g);
            for (; g < t; g++) {
                float *o = row + ws->at[g];
                o[0] = d0[g], o[1] = d1[g], o[2] = d2[g], o[3] = d3[g];
            }
        }
        for (int s = 0; s < ns; s++) { /* the last columns and rows that dx reads */
            float *ps0 = plane + s * one;
            size_t g0 = s * tps, gb = g0 + (size_t)(th - 1) * tw; /* the last tile row */
            for (int ty = 0; ty < th; ty++) {
                size_t gl = g0 + (size_t)ty * tw + tw - 1;
                for (int r = 0; r < TILE; r++) {
                    float *o = ps0 + (size_t)(TILE * ty + r) * pw + (size_t)TILE * tw;
                    for (int b = 0; b < TD_MIN(cols_past, 2); b++)
                        o[b] = d[6 * r + 4 + b][gl] +
                               (r < 2 && ty > 0 ? d[6 * (4 + r) + 4 + b][gl - tw] : 0.0f);
                    for (int b = 2; b < cols_past; b++) o[b] = 0.0f;
                }
            }
            for (int r = 0; r < rows_past; r++) {
                float *o = ps0 + (size_t)(TILE * th + r) * pw;
                if (r >= 2) {
                    memset(o, 0, sizeof(float) * (size_t)(TILE * tw + TD_MAX(cols_past, 0)));
                    continue;
                }
                float *const *dr = d + 6 * (4 + r);
                for (int tx = 0; tx < tw; tx++)
                    for (int b = 0; b < TILE; b++) o[TILE * tx + b] = dr[b][gb + tx];
                for (int b = 0; b < cols_past; b++)
                    o[TILE * tw + b] = b < 2 ? dr[4 + b][gb + tw - 1] : 0.0f;
            }
        }
        for (int s = 0; s < ns; s++)
            for (int r = 0; r < h; r++)
                copy_row(dx + s * lddx + ((size_t)ci * h + r) * w,
                         plane + s * one + (size_t)(r + pad) * pw + pad, w);
    }
}

void td__wino_backward(const float *x, size_t ldx, int ns, int c, int h, int w, int pad,
                       const float *dy, size_t ldy, int k, int oh, int ow, const float *u,
                       float *dw, float *dx, size_t lddx, float *scratch) {
    size_t us = slot_floats((size_t)k * c), kc = (size_t)k * c;
    float *du = scratch;
    int pass = pass_samples(oh, ow);
    for (int s0 = 0; s0 < ns; s0 += pass) {
        int nb = TD_MIN(pass, ns - s0);
        wino_ws ws = workspace(nb, c, k, oh, ow, scratch);
        size_t vs = ws.vs, zs = ws.ms;
        transform_input(&ws, x + s0 * ldx, ldx, nb, c, h, w, pad);
        output_places(&ws, ldy, ow);
        for (int ko = 0; ko < k; ko++) {
            if (ko + 1 < k)
                prefetch_planes(dy + s0 * ldy + (size_t)(ko + 1) * oh * ow, ldy, nb,
                                (size_t)oh * ow, false);
            grad_tiles(&ws, dy + s0 * ldy + (size_t)ko * oh * ow, ldy, nb, oh, ow, ko == 0,
                       ws.m + (size_t)ko * ws.t, zs);
        }
        /* dU[xi] [k, c] += Z[xi] [k, T] x V[xi]^T: the sum over tiles is the gemm's K; then
         * V's gradient U[xi]^T [c, k] x Z[xi] in V's place, for dx */
        for (int xi = 0; xi < TD_WINO_POS; xi++) {
            td_sgemm(false, true, k, c, (int)ws.t, 1.0f, ws.m + xi * zs, (int)ws.t, ws.v + xi * vs,
                     (int)ws.t, s0 ? 1.0f : 0.0f, du + xi * us, c);
            if (dx)
                td_sgemm(true, false, c, (int)ws.t, k, 1.0f, u + xi * us, c, ws.m + xi * zs,
                         (int)ws.t, 0.0f, ws.v + xi * vs, (int)ws.t);
        }
        if (dx) input_grad(&ws, nb, c, h, w, pad, dx + s0 * lddx, lddx);
    }
    /* dW = G^T dU G, vectorised over filters: a slot holds filter f's value at
     * du[xi * us + f]; dW's nine taps of each filter are interleaved at the end of a block */
    enum { BLOCK = 16 };
    for (size_t f0 = 0; f0 < kc; f0 += BLOCK) {
        int n = (int)TD_MIN((size_t)BLOCK, kc - f0);
        float g[9][BLOCK];
#pragma omp simd
        for (int l = 0; l < n; l++) {
            const float *uf = du + f0 + l;
            float r[3][6];
#pragma GCC unroll 6
            for (int j = 0; j < 6; j++)
                WINO_GT(uf[j * us], uf[(6 + j) * us], uf[(12 + j) * us], uf[(18 + j) * us],
                        uf[(24 + j) * us], uf[(30 + j) * us], r[0][j], r[1][j], r[2][j]);
#pragma GCC unroll 3
            for (int i = 0; i < 3; i++)
                WINO_GT(r[i][0], r[i][1], r[i][2], r[i][3], r[i][4], r[i][5], g[3 * i][l],
                        g[3 * i + 1][l], g[3 * i + 2][l]);
        }
        for (int l = 0; l < n; l++)
            for (int e = 0; e < 9; e++) dw[(f0 + l) * 9 + e] = g[e][l];
    }
}
