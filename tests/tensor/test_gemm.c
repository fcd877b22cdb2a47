/* td_gemm_ordered, its packed variant and td_gemm_indirect (a's or b's rows at listed offsets,
 * here permuted and overlapping as an implicit convolution's are): every output, bit for bit, is
 * the sum the contract names (start, then one multiply-add per p in order, fused where the build
 * has FMA), at shapes that cross each tile, vector, ragged-block and depth-panel edge, in both
 * of a's layouts; and within a double product's error bound, an independent check of the
 * arithmetic itself. td_transpose against its definition. */
#include "tandem/tensor.h"
#include "test.h"

static float rnd(uint64_t seed, uint64_t i) {
    return td_rng_uniform(seed, 0, i) * 2.0f - 1.0f;
}

/* One term, as the contract says the kernel adds it. */
static float madd(float acc, float a, float b) {
#ifdef __FMA__
    return __builtin_fmaf(a, b, acc);
#else
    volatile float prod = a * b; /* no FMA: a rounded product, then the add */
    return acc + prod;
#endif
}

enum { PLAIN, PACKED, A_LISTED, B_LISTED };
static const char *const variant_names[] = {"", " packed", " a listed", " b listed"};

static void check(int rows, int width, int depth, bool a_transposed, bool accumulate,
                  int variant) {
    /* a is [rows, depth] with row stride lda, or stored transposed [depth, rows] */
    int lda = (a_transposed ? rows : depth) + 3, ldb = width + 5, ldc = width + 7;
    size_t na = (size_t)(a_transposed ? depth : rows) * lda + 1, nb = (size_t)depth * ldb + 1;
    size_t nc = (size_t)rows * ldc;
    float *a = malloc(sizeof(float) * na), *b = malloc(sizeof(float) * nb);
    float *c = malloc(sizeof(float) * nc), *c0 = malloc(sizeof(float) * nc);
    for (size_t i = 0; i < na; i++) a[i] = rnd(1, i);
    for (size_t i = 0; i < nb; i++) b[i] = rnd(2, i);
    for (size_t i = 0; i < nc; i++) c0[i] = rnd(3, i);
    /* signed zeros: a's -0 must stay -0 (0 + x would not), and c's -0 plus +-0 terms */
    for (size_t i = 0; i < na; i += 5) a[i] = -0.0f;
    if (rows > 1)
        for (int p = 0; p < depth; p++) /* row 1 all -0: its outputs are c plus -0 * b terms */
            a[a_transposed ? (size_t)p * lda + 1 : (size_t)lda + p] = -0.0f;
    for (size_t i = 0; i < nc; i += 3) c0[i] = -0.0f;
    ptrdiff_t a_row = a_transposed ? 1 : lda, a_step = a_transposed ? lda : 1;
    /* listed rows: a's permuted (some twice), b's permuted and every other one shifted by a
     * column, overlapping its neighbours (b has a float to spare after its last row) */
    ptrdiff_t *a_rows = malloc(sizeof(ptrdiff_t) * (size_t)rows);
    ptrdiff_t *b_rows = malloc(sizeof(ptrdiff_t) * (size_t)(depth + 1));
    for (int r = 0; r < rows; r++) a_rows[r] = (ptrdiff_t)((r * 5 + 3) % rows) * a_row;
    for (int p = 0; p < depth; p++) b_rows[p] = (ptrdiff_t)((p * 7 + 1) % depth) * ldb + p % 2;
    if (variant != A_LISTED)
        for (int r = 0; r < rows; r++) a_rows[r] = r * a_row;
    if (variant != B_LISTED)
        for (int p = 0; p < depth; p++) b_rows[p] = (ptrdiff_t)p * ldb;
    memcpy(c, c0, sizeof(float) * nc);
    if (!accumulate)
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < width; j++) c[(size_t)r * ldc + j] = NAN; /* written, not added */
    float *packed = NULL;
    if (variant == PLAIN) {
        td_gemm_ordered(rows, width, depth, a, a_row, a_step, b, (size_t)ldb, c, (size_t)ldc,
                        accumulate);
    } else if (variant == A_LISTED) {
        td_gemm_indirect(rows, width, depth, a, a_rows, 0, a_step, b, NULL, (size_t)ldb, c,
                         (size_t)ldc, accumulate);
    } else if (variant == B_LISTED) {
        td_gemm_indirect(rows, width, depth, a, NULL, a_row, a_step, b, b_rows, 0, c,
                         (size_t)ldc, accumulate);
    } else { /* b packed in two halves' calls, as threads split it */
        packed = malloc(sizeof(float) * (td_gemm_packed_floats(depth, width) + 1));
        for (size_t i = 0; i <= td_gemm_packed_floats(depth, width); i++) packed[i] = NAN;
        int half = width / 2 / 64 * 64;
        td_gemm_pack_b(b, depth, width, (size_t)ldb, packed, 0, half);
        td_gemm_pack_b(b, depth, width, (size_t)ldb, packed, half, width);
        td_gemm_ordered_packed(rows, width, depth, a, a_row, a_step, packed, c, (size_t)ldc,
                               accumulate);
    }
    for (int r = 0; r < rows; r++) {
        for (int j = 0; j < width; j++) {
            float want = accumulate ? c0[(size_t)r * ldc + j] : 0.0f;
            double exact = want, bound = 0;
            for (int p = 0; p < depth; p++) {
                float x = a[a_rows[r] + p * a_step], y = b[b_rows[p] + j];
                want = madd(want, x, y);
                exact += (double)x * y;
                bound += fabs((double)x * y);
            }
            float got = c[(size_t)r * ldc + j];
            if (memcmp(&got, &want, sizeof got))
                TEST_FAIL("rows=%d width=%d depth=%d a%s%s%s: c[%d][%d] = %a, ordered sum %a", rows,
                          width, depth, a_transposed ? "^T" : "",
                          accumulate ? " accumulate" : "", variant_names[variant], r, j, got,
                          want);
            /* n terms in float: within n ulps of the sum of |terms| (and of |c| at the start) */
            bound = (bound + fabs(c0[(size_t)r * ldc + j])) * (depth + 1) * 0x1p-24;
            ASSERT_NEAR(got, exact, bound + 1e-30);
        }
        for (int j = width; j < ldc; j++) /* the row's tail beyond width is left alone */
            ASSERT(!memcmp(&c[(size_t)r * ldc + j], &c0[(size_t)r * ldc + j], sizeof(float)));
    }
    free(a), free(b), free(c), free(c0), free(packed), free(a_rows), free(b_rows);
}

static void check_transpose(int rows, int cols, int rows_to) {
    size_t ldx = (size_t)cols + 2, ldt = (size_t)rows_to + 3;
    float *x = malloc(sizeof(float) * rows * ldx), *t = malloc(sizeof(float) * cols * ldt);
    for (size_t i = 0; i < rows * ldx; i++) x[i] = rnd(4, i);
    for (size_t i = 0; i < cols * ldt; i++) t[i] = 7.0f;
    td_transpose(x, rows, cols, ldx, t, ldt, rows_to);
    for (int j = 0; j < cols; j++) {
        for (int i = 0; i < rows_to; i++)
            ASSERT(t[j * ldt + i] == (i < rows ? x[i * ldx + j] : 0.0f));
        for (size_t i = (size_t)rows_to; i < ldt; i++) ASSERT(t[j * ldt + i] == 7.0f);
    }
    free(x), free(t);
}

int main(void) {
    /* rows across the 6-row tile; widths across 4-, 8- and 16-float vectors, the 16-, 32- and
     * 64-float blocks and ragged ends; depths across the panels (128 rows of b for 64-float
     * blocks, 512 for 16) and none at all */
    static const int rows[] = {1, 2, 5, 6, 7, 12, 13};
    static const int widths[] = {1, 3, 4, 8, 15, 16, 17, 31, 33, 64, 65, 70, 129};
    static const int depths[] = {0, 1, 2, 7, 127, 128, 129, 300};
    for (size_t r = 0; r < TD_ARRAY_LEN(rows); r++)
        for (size_t w = 0; w < TD_ARRAY_LEN(widths); w++)
            for (size_t d = 0; d < TD_ARRAY_LEN(depths); d++)
                for (int mode = 0; mode < 16; mode++)
                    check(rows[r], widths[w], depths[d], mode & 1, mode & 2, mode >> 2);
    check(6, 64, 1100, false, false, PLAIN); /* several panels at every width */
    check(6, 70, 1100, false, true, B_LISTED);
    check(13, 40, 1030, true, true, PLAIN);
    check(13, 40, 1030, false, true, A_LISTED);
    check(13, 200, 600, true, true, PACKED);
    check(64, 1024, 64, true, true, PACKED);  /* mlp7's weight gradient */
    check(64, 256, 1024, false, false, PLAIN); /* its input gradient, one task */
    check(16, 136, 150, false, false, B_LISTED); /* LeNet-5's conv2, forward */
    check(150, 16, 136, false, true, A_LISTED);  /* ... and its weight gradient */

    check_transpose(1, 1, 1);
    check_transpose(5, 3, 16);
    check_transpose(17, 33, 32);
    check_transpose(64, 784, 64);
    check_transpose(33, 20, 33);
    return 0;
}
