/* tandem's own gemm for the linear layers (td_gemm_ordered, tensor.h).
 *
 * Why not OpenBLAS: at a training batch of 64 rows its sgemm ran mlp7's layers at 158-164
 * GFLOP/s on a Zen 5 core whose large-matrix peak is 237: it packs both operands on every call
 * and its kernels are tuned for large M. Here one operand is read as it lies (a row of b is
 * `width` contiguous floats, loaded as vectors) and the other is broadcast one element at a time;
 * a panel of b is copied only where its rows would share a few cache sets (or end ragged), and a
 * caller whose tasks share one b packs it once (td_gemm_pack_b).
 *
 * The bits: every output is its start value (0, or c itself) plus a(r, 0) b[0][j], then
 * a(r, 1) b[1][j], ... in p order, one multiply-add each (fused wherever the build has FMA:
 * -ffp-contract=fast, the GNU C default). The tile shape, the vector width, the blocking of p
 * and how the caller splits rows or columns over threads only change which outputs are computed
 * together, never an output's sequence of operations, so the bits are the same for any thread
 * count and for the AVX2 and AVX-512 builds alike (and unlike OpenBLAS, for any BLAS core).
 *
 * Shape: a tile of RT rows x JV vectors lives in registers (AVX-512: 6 x 4 zmm = 24 of 32) and
 * runs over a panel of PC rows of b (32 KiB, within L1) before moving on, so the panel is read
 * from L1 by every row tile that uses it. */
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "tandem/tensor.h"

#if defined(__AVX512F__)
enum { VW = 16, JV = 4 }; /* 24 accumulators, 4 loads of b, one broadcast: 29 of 32 zmm */
#elif defined(__AVX__)
enum { VW = 8, JV = 2 }; /* 12 accumulators, 2 loads, one broadcast: 15 of 16 ymm */
#else
enum { VW = 4, JV = 2 }; /* SSE: 15 of 16 xmm */
#endif
enum { RT = 6, JB = VW * JV, PC = 8192 / JB };

typedef float vec __attribute__((vector_size(VW * sizeof(float))));

static inline __attribute__((always_inline)) vec load(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void store(float *p, vec v) {
    memcpy(p, &v, sizeof v);
}

/* The first n < VW lanes of a vector, the others zero on load and left alone on store: a ragged
 * block's last vector, read and written in place. Faults are suppressed in the masked lanes, so
 * a row's end may be the end of a mapping. Without AVX (the SSE build) there are no masked
 * moves, and ragged blocks go through a padded copy instead (MASKED 0). */
#if defined(__AVX512F__)
enum { MASKED = 1 };
static inline __attribute__((always_inline)) vec load_part(const float *p, int n) {
    return (vec)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
static inline __attribute__((always_inline)) void store_part(float *p, vec v, int n) {
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
}
#elif defined(__AVX__)
enum { MASKED = 1 };
static const int32_t lane_masks[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
static inline __attribute__((always_inline)) vec load_part(const float *p, int n) {
    return (vec)_mm256_maskload_ps(p, _mm256_loadu_si256((const __m256i *)(lane_masks + 8 - n)));
}
static inline __attribute__((always_inline)) void store_part(float *p, vec v, int n) {
    _mm256_maskstore_ps(p, _mm256_loadu_si256((const __m256i *)(lane_masks + 8 - n)), (__m256)v);
}
#else
enum { MASKED = 0 };
static inline vec load_part(const float *p, int n) {
    vec v = {0};
    memcpy(&v, p, sizeof(float) * (size_t)n);
    return v;
}
static inline void store_part(float *p, vec v, int n) {
    memcpy(p, &v, sizeof(float) * (size_t)n);
}
#endif

/* Every lane x: x - 0 is x for every x, -0 included (0 + x would turn -0 into +0), so the
 * compiler emits a plain broadcast. */
static inline __attribute__((always_inline)) vec splat(float x) {
    return x - (vec){0};
}

/* Where the operands lie: a(r, p) = a[row_r + p a_step] with row_r = a_rows[r] where a_rows is
 * given, else r a_row; b's row p starts at b + b_rows[p] where b_rows is given, else p ldb
 * (td_gemm_indirect). */
typedef struct {
    const float *a;
    const ptrdiff_t *a_rows;
    ptrdiff_t a_row, a_step;
    const float *b;
    const ptrdiff_t *b_rows;
    size_t ldb;
} operands;

/* The operands from row r0 of a, depth p0 and column j0 of b on. */
static operands operands_at(const operands *o, int r0, int p0, int j0) {
    operands v = *o;
    if (v.a_rows)
        v.a_rows += r0;
    else
        v.a += r0 * v.a_row;
    v.a += p0 * v.a_step;
    if (v.b_rows)
        v.b_rows += p0;
    else
        v.b += (size_t)p0 * v.ldb;
    v.b += j0;
    return v;
}

static inline __attribute__((always_inline)) const float *b_row(const operands *o, int p) {
    return o->b_rows ? o->b + o->b_rows[p] : o->b + (size_t)p * o->ldb;
}

/* Which operand a tile reads through a list of row offsets (operands): neither, b or a. */
enum { PLAIN, B_LISTED, A_LISTED };

/* c[r][0, jv VW) (=|+=) sum over p < pc of a(r, p) b(p, [0, jv VW)), for r < rt. rt, jv, ragged
 * and mode are constants at every call (tile_any), so the accumulators are registers. ragged:
 * the last vector has only `tail` columns, moved with masks (the others' lanes are zeros, and
 * dropped). */
static inline __attribute__((always_inline)) void tile(const int rt, const int jv,
                                                       const bool ragged, const int mode,
                                                       int tail, int pc, const operands *o,
                                                       float *c, size_t ldc, bool zero) {
    vec acc[RT][JV];
    ptrdiff_t ar[RT], a_row = o->a_row, a_step = o->a_step; /* a(r, p) = a[row r] after p steps */
    const float *a = o->a, *b = o->b;
    const ptrdiff_t *b_rows = o->b_rows;
    size_t ldb = o->ldb;
#pragma GCC unroll 8
    for (int r = 0; r < rt; r++) ar[r] = mode == A_LISTED ? o->a_rows[r] : 0;
#pragma GCC unroll 8
    for (int r = 0; r < rt; r++)
#pragma GCC unroll 8
        for (int v = 0; v < jv; v++)
            acc[r][v] = zero                         ? splat(0.0f)
                        : ragged && v == jv - 1 ? load_part(c + r * ldc + v * VW, tail)
                                                : load(c + r * ldc + v * VW);
    for (int p = 0; p < pc; p++) {
        const float *bp = mode == B_LISTED ? b + b_rows[p] : b;
        vec bv[JV];
#pragma GCC unroll 8
        for (int v = 0; v < jv; v++)
            bv[v] = ragged && v == jv - 1 ? load_part(bp + v * VW, tail) : load(bp + v * VW);
#pragma GCC unroll 8
        for (int r = 0; r < rt; r++) {
            vec s = splat(mode == A_LISTED ? a[ar[r]] : a[r * a_row]);
#pragma GCC unroll 8
            for (int v = 0; v < jv; v++) acc[r][v] += s * bv[v];
        }
        a += a_step;
        if (mode != B_LISTED) b += ldb;
    }
#pragma GCC unroll 8
    for (int r = 0; r < rt; r++)
#pragma GCC unroll 8
        for (int v = 0; v < jv; v++)
            if (ragged && v == jv - 1)
                store_part(c + r * ldc + v * VW, acc[r][v], tail);
            else
                store(c + r * ldc + v * VW, acc[r][v]);
}

/* tile with rt, jv, raggedness and mode as constants: one specialised copy per shape. tail: the
 * columns of the last vector (VW: a whole one). */
static void tile_any(int rt, int jv, int tail, int pc, const operands *o, float *c, size_t ldc,
                     bool zero) {
#define TD__TILE_AS(R, V, M)                                                                       \
    if (MASKED && tail < VW)                                                                       \
        tile(R, V, true, M, tail, pc, o, c, ldc, zero);                                            \
    else                                                                                           \
        tile(R, V, false, M, VW, pc, o, c, ldc, zero);
#define TD__TILE(R, V)                                                                             \
    case (R) * 8 + (V):                                                                            \
        if (o->b_rows) {                                                                           \
            TD__TILE_AS(R, V, B_LISTED)                                                            \
        } else if (o->a_rows) {                                                                    \
            TD__TILE_AS(R, V, A_LISTED)                                                            \
        } else {                                                                                   \
            TD__TILE_AS(R, V, PLAIN)                                                               \
        }                                                                                          \
        return;
#define TD__TILE_ROW(R)                                                                            \
    TD__TILE(R, 1)                                                                                 \
    TD__TILE(R, 2) TD__TILE_WIDE(R)
#if defined(__AVX512F__)
#define TD__TILE_WIDE(R) TD__TILE(R, 3) TD__TILE(R, 4)
#else
#define TD__TILE_WIDE(R)
#endif
    switch (rt * 8 + jv) {
        TD__TILE_ROW(1)
        TD__TILE_ROW(2)
        TD__TILE_ROW(3)
        TD__TILE_ROW(4)
        TD__TILE_ROW(5)
        TD__TILE_ROW(6)
    default:
        return; /* unreachable: rt <= RT, jv <= JV */
    }
#undef TD__TILE_AS
#undef TD__TILE
#undef TD__TILE_ROW
#undef TD__TILE_WIDE
}

_Static_assert(RT == 6 && (JV == 2 || JV == 4), "tile_any's cases cover RT x JV");

/* c's rows [0, rt) x columns [0, jw) of one block, over b's rows [0, pc). A ragged jw is read
 * and written in place with masks; without them (MASKED 0) b must be padded to whole vectors
 * (pack_panel), and c goes through a whole-vector copy. */
static void block(int rt, int jw, int pc, const operands *o, float *c, size_t ldc, bool zero) {
    int jv = (jw + VW - 1) / VW, tail = jw - (jv - 1) * VW;
    if (jw == jv * VW || MASKED) {
        tile_any(rt, jv, tail, pc, o, c, ldc, zero);
        return;
    }
    float t[RT * JB];
    for (int r = 0; r < rt; r++)
        if (!zero) memcpy(t + r * JB, c + (size_t)r * ldc, sizeof(float) * jw);
    tile_any(rt, jv, VW, pc, o, t, JB, zero);
    for (int r = 0; r < rt; r++) memcpy(c + (size_t)r * ldc, t + r * JB, sizeof(float) * jw);
}

/* b's rows [0, pc) x columns [0, jw) copied into panel [pc, JB] (pc may exceed PC for a caller's
 * buffer), each row padded to whole vectors with zeros (lanes whose results are dropped, but
 * stale bytes could be slow denormals). */
static const float *pack_panel(const operands *o, int pc, int jw, float *panel) {
    const float *b = o->b;
    const ptrdiff_t *rows = o->b_rows;
    size_t ldb = o->ldb;
    if (jw == JB && !rows) { /* whole vectors, inline (a call of memcpy per 64-byte row cost
                              * AVX2's 16-float panels a fifth of their time) */
        for (int p = 0; p < pc; p++)
#pragma GCC unroll 4
            for (int v = 0; v < JV; v++)
                store(panel + (size_t)p * JB + v * VW, load(b + (size_t)p * ldb + v * VW));
        return panel;
    }
    int jp = (jw + VW - 1) / VW * VW;
    for (int p = 0; p < pc; p++) {
        memcpy(panel + (size_t)p * JB, rows ? b + rows[p] : b + (size_t)p * ldb,
               sizeof(float) * jw);
        memset(panel + (size_t)p * JB + jw, 0, sizeof(float) * (jp - jw));
    }
    return panel;
}

/* Operands on their way into cache while a tile computes. The next row tile's stretch of a
 * row-major a (rt rows, pc columns): a weight matrix comes from memory a panel deep at a time,
 * too short a stream for the hardware prefetcher to get ahead of. */
enum { LINE = 64 / sizeof(float) };

static void prefetch_a(const float *a, ptrdiff_t a_row, int rt, int pc) {
    for (int r = 0; r < rt; r++)
        for (int p = 0; p < pc; p += LINE) __builtin_prefetch(a + r * a_row + p);
}

/* The next row tile's rows of c, for writing (a weight gradient's rows, 4 KiB apart in a
 * 1024-wide layer). */
static void prefetch_c(float *c, size_t ldc, int rt, int jw) {
    for (int r = 0; r < rt; r++)
        for (int j = 0; j < jw; j += LINE) __builtin_prefetch(c + r * ldc + j, 1);
}

static void gemm(int rows, int width, int depth, const operands *o, float *c, size_t ldc,
                 bool accumulate) {
    if (rows <= 0 || width <= 0) return;
    if (depth <= 0) {
        if (!accumulate)
            for (int r = 0; r < rows; r++) memset(c + (size_t)r * ldc, 0, sizeof(float) * width);
        return;
    }
    /* b's panel, copied to be contiguous (32 KiB of stack) where its rows lie a multiple of
     * 1 KiB apart (a 1024-wide layer's weights or inputs): they fall into a few cache sets, and
     * every row tile would read the panel from L2. Skipped for a single row tile. A ragged
     * panel is padded where there are no masked moves. */
    float panel[PC * JB];
    for (int j0 = 0; j0 < width; j0 += JB) {
        int jw = TD_MIN(JB, width - j0);
        for (int p0 = 0; p0 < depth; p0 += PC) {
            int pc = TD_MIN(PC, depth - p0);
            bool zero = p0 == 0 && !accumulate;
            operands at = operands_at(o, 0, p0, j0);
            if ((!MASKED && jw % VW) || (rows > RT && !o->b_rows && o->ldb % 256 == 0)) {
                at.b = pack_panel(&at, pc, jw, panel);
                at.b_rows = NULL;
                at.ldb = JB;
            }
            /* the next panel of b (the next rows, else the next columns), a share of its rows
             * per row tile: a layer's weights come from memory a panel at a time, in rows of 256
             * bytes 4 KiB apart, a pattern the hardware prefetcher does not follow */
            int np0 = p0 + PC < depth ? p0 + PC : 0, nj0 = p0 + PC < depth ? j0 : j0 + JB;
            int npc = TD_MIN(PC, depth - np0), njw = TD_MIN(JB, width - nj0);
            int tiles = (rows + RT - 1) / RT, share = (npc + tiles - 1) / tiles;
            for (int r0 = 0, t = 0; r0 < rows; r0 += RT, t++) {
                int rt = TD_MIN(RT, rows - r0), next = TD_MIN(RT, rows - r0 - RT);
                operands tile_at = operands_at(&at, r0, 0, 0);
                float *cp = c + (size_t)r0 * ldc + j0;
                if (next > 0 && o->a_step == 1 && !o->a_rows) /* (a^T's tile: a few lines, used
                                                                * by every tile) */
                    prefetch_a(tile_at.a + RT * o->a_row, o->a_row, next, pc);
                if (next > 0) prefetch_c(cp + RT * ldc, ldc, next, jw);
                if (njw > 0 && rows > RT)
                    for (int p = t * share; p < TD_MIN(npc, (t + 1) * share); p++)
                        for (int j = 0; j < njw; j += LINE)
                            __builtin_prefetch(b_row(o, np0 + p) + nj0 + j);
                block(rt, jw, pc, &tile_at, cp, ldc, zero);
            }
        }
    }
}

void td_gemm_ordered(int rows, int width, int depth, const float *a, ptrdiff_t a_row,
                     ptrdiff_t a_step, const float *b, size_t ldb, float *c, size_t ldc,
                     bool accumulate) {
    operands o = {a, NULL, a_row, a_step, b, NULL, ldb};
    gemm(rows, width, depth, &o, c, ldc, accumulate);
}

void td_gemm_indirect(int rows, int width, int depth, const float *a, const ptrdiff_t *a_rows,
                      ptrdiff_t a_row, ptrdiff_t a_step, const float *b, const ptrdiff_t *b_rows,
                      size_t ldb, float *c, size_t ldc, bool accumulate) {
    operands o = {a, a_rows, a_row, a_step, b, b_rows, ldb};
    gemm(rows, width, depth, &o, c, ldc, accumulate);
}

size_t td_gemm_packed_floats(int depth, int width) {
    return (size_t)((width + JB - 1) / JB) * JB * (size_t)TD_MAX(depth, 0);
}

void td_gemm_pack_b(const float *b, int depth, int width, size_t ldb, float *packed, int j_from,
                    int j_to) {
    for (int j0 = (TD_MAX(j_from, 0) + JB - 1) / JB * JB; j0 < TD_MIN(width, j_to); j0 += JB) {
        operands o = {NULL, NULL, 0, 0, b + j0, NULL, ldb};
        pack_panel(&o, depth, TD_MIN(JB, width - j0), packed + (size_t)(j0 / JB) * JB * depth);
    }
}

void td_gemm_ordered_packed(int rows, int width, int depth, const float *a, ptrdiff_t a_row,
                            ptrdiff_t a_step, const float *packed, float *c, size_t ldc,
                            bool accumulate) {
    if (rows <= 0 || width <= 0) return;
    if (depth <= 0) {
        td_gemm_ordered(rows, width, depth, a, a_row, a_step, packed, JB, c, ldc, accumulate);
        return;
    }
    /* Row tiles outside: c streams row by row, once (a weight gradient: its rows 4 KiB apart
     * in a 1024-wide layer, too far for the prefetchers when walked down a column block), and
     * b's panels, contiguous, come from L2 */
    float slab[PC * RT]; /* a row tile's stretch of a, contiguous: [p][r] */
    for (int r0 = 0; r0 < rows; r0 += RT) {
        int rt = TD_MIN(RT, rows - r0), next = TD_MIN(RT, rows - r0 - RT);
        float *cr = c + (size_t)r0 * ldc;
        if (next > 0) prefetch_c(cr + RT * ldc, ldc, next, TD_MIN(width, 4 * JB));
        for (int p0 = 0; p0 < depth; p0 += PC) {
            int pc = TD_MIN(PC, depth - p0);
            /* copied once for every column block (a weight gradient's a is dy^T: its rows a
             * gradient row apart, often 4 KiB, in a few cache sets) */
            for (int p = 0; p < pc; p++)
                for (int r = 0; r < rt; r++)
                    slab[p * RT + r] = a[(r0 + r) * a_row + (p0 + p) * a_step];
            for (int j0 = 0; j0 < width; j0 += JB) {
                operands o = {slab, NULL, 1, RT,
                              packed + (size_t)(j0 / JB) * JB * depth + (size_t)p0 * JB, NULL, JB};
                block(rt, TD_MIN(JB, width - j0), pc, &o, cr + j0, ldc, p0 == 0 && !accumulate);
            }
        }
    }
}

#if defined(__AVX__)
/* An 8 x 8 block, x's rows to t's columns, in registers: 24 shuffles for 64 floats (a scalar
 * transpose took 1.7 cycles a float, 10% of a 1024-wide layer's forward). */
static inline void transpose8(const float *x, size_t ldx, float *t, size_t ldt) {
    __m256 r[8], u[8], v[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(x + i * ldx);
    for (int i = 0; i < 8; i += 2) {
        u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        v[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44);
        v[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xee);
        v[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44);
        v[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(t + i * ldt, _mm256_permute2f128_ps(v[i], v[i + 4], 0x20));
        _mm256_storeu_ps(t + (i + 4) * ldt, _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
    }
}
enum { TB = 8 };
#else
static inline void transpose8(const float *x, size_t ldx, float *t, size_t ldt) {
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) t[j * ldt + i] = x[i * ldx + j];
}
enum { TB = 8 };
#endif

void td_transpose(const float *x, int rows, int cols, size_t ldx, float *t, size_t ldt,
                  int rows_to) {
    int r8 = rows / TB * TB, c8 = cols / TB * TB;
    /* The side with the longer rows is walked row by row: its lines, 4 KiB apart for a
     * 1024-wide layer, all fall in one cache set, and a walk down its columns would evict them
     * before their second half is used. */
    if (ldx >= ldt) {
        for (int i0 = 0; i0 < r8; i0 += TB)
            for (int j0 = 0; j0 < c8; j0 += TB)
                transpose8(x + (size_t)i0 * ldx + j0, ldx, t + (size_t)j0 * ldt + i0, ldt);
    } else {
        for (int j0 = 0; j0 < c8; j0 += TB)
            for (int i0 = 0; i0 < r8; i0 += TB)
                transpose8(x + (size_t)i0 * ldx + j0, ldx, t + (size_t)j0 * ldt + i0, ldt);
    }
    for (int i = 0; i < r8; i++) /* the ragged columns */
        for (int j = c8; j < cols; j++) t[(size_t)j * ldt + i] = x[(size_t)i * ldx + j];
    for (int j = 0; j < cols; j++) { /* the ragged rows, then the zero padding */
        float *d = t + (size_t)j * ldt;
        for (int i = r8; i < rows; i++) d[i] = x[(size_t)i * ldx + j];
        for (int i = rows; i < rows_to; i++) d[i] = 0.0f;
    }
}
