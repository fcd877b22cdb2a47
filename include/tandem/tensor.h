/* tandem tensor: thread control and the float kernels the nn layer is built from.
 *
 * Threading model (the determinism contract): tandem runs its own OpenMP team of
 * td_get_num_threads() threads and partitions work into fixed-size chunks whose boundaries never
 * depend on the thread count; OpenBLAS is kept single-threaded and called from inside those
 * chunks. OpenBLAS's own threading is not bitwise stable (measured: 64x576x288 sgemm differs
 * between 1 and 2 OpenBLAS threads), so it is never used for training math.
 *
 * All matrices are row-major float32. Buffers need no particular alignment, but 64-byte aligned
 * ones (td_xmalloc_aligned) are faster.
 */
#ifndef TANDEM_TENSOR_H
#define TANDEM_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- threads ----
 * n <= 0 means the number of cores. Sets the OpenMP team size tandem's kernels use and pins
 * OpenBLAS to one thread (tandem parallelises around BLAS calls, see above). Until the first call,
 * the team size comes from TANDEM_NUM_THREADS (0 = cores). */
void td_set_num_threads(int n);
int td_get_num_threads(void);

/* ---- numerics: what decides a step's bits on this CPU ----
 * Two processes given the same inputs compute the same bits only if they run the same kernels:
 * OpenBLAS's core (picked when the library loads, from the CPU or from OPENBLAS_CORETYPE, and
 * fixed for the process's life) and the instruction set tandem's own kernels were compiled for
 * (-march decides FMA contraction and vector width) by which compiler. The thread count does not
 * matter (see above). Nor do tandem's own kernels, which change from build to build: kernels
 * is a hash of the sources that decide a step's bits, taken when tandem is built (CMakeLists.txt).
 * Ranks compare these before their first step (train.h), and `tandem launch` pins every node's
 * workers to node 0's OpenBLAS core and to the lowest x86-64 level of the nodes (launch.h). */
#define TD_NUMERICS_FIELD 64
typedef struct {
    char blas_core[TD_NUMERICS_FIELD]; /* OpenBLAS's core: "Haswell", "SkylakeX", "Zen", ... */
    char isa[TD_NUMERICS_FIELD];       /* tandem's kernels: "x86-64-v3 avx2 fma", "aarch64 fma" */
    char compiler[TD_NUMERICS_FIELD];  /* "gcc 12.2.0" */
    char kernels[TD_NUMERICS_FIELD];   /* the sources' hash, 12 hex digits: "3f2a9c1d04be" */
} td_numerics;
void td_numerics_get(td_numerics *out);
/* The x86-64 level tandem's kernels were compiled for, as -march names it ("x86-64",
 * "x86-64-v2", "x86-64-v3", "x86-64-v4"; "aarch64" elsewhere): the first word of isa. A portable
 * install carries one build per level and runs the best the CPU takes (TANDEM_ISA pins one). */
const char *td_isa_level(void);
/* "OpenBLAS core Haswell, kernels for x86-64-v3 avx2 fma, gcc 12.2.0, tandem kernels 3f2a9c1d04be" */
void td_numerics_describe(const td_numerics *n, char *buf, size_t cap);
/* Whether a and b differ; buf[cap] (cap may be 0) says in what: "the OpenBLAS core differs",
 * "the OpenBLAS core and the compiler differ", "tandem's kernels differ", or nothing when they
 * are the same. */
bool td_numerics_diff(const td_numerics *a, const td_numerics *b, char *buf, size_t cap);

/* The OpenBLAS core a CPU should run where OpenBLAS did not know it. OpenBLAS picks its core
 * from the CPU's family and model; one it does not know by name it runs on its SSE3 kernels,
 * "Prescott", 4-5x slower than its AVX-512 ones (Debian 12's 0.3.21 on an Intel Xeon of model
 * 207, Emerald Rapids: sgemm 26 against 120-130 GFLOP/s). Given the core OpenBLAS picked and the
 * CPU's features, this names the core of the CPU's class: "Cooperlake" (AVX-512 with BF16),
 * "SkylakeX" (AVX-512), "Haswell" (AVX2 with FMA); NULL where OpenBLAS's pick stands (any core
 * but Prescott, or a CPU of none of those classes). */
enum { TD_CPU_AVX2_FMA = 1, TD_CPU_AVX512 = 2 /* x86-64-v4 */, TD_CPU_AVX512_BF16 = 4 };
const char *td_blas_core_for(const char *picked, unsigned features);
/* That core for this process, or NULL: NULL too where OPENBLAS_CORETYPE is set (the user's core
 * stands) or OpenBLAS cannot switch (not a DYNAMIC_ARCH build). OpenBLAS reads the variable only
 * as it loads, so a program runs itself again under OPENBLAS_CORETYPE set to it (tandem's CLI:
 * tools/tandem/isa.c; the benches: bench/blas_core.h). */
const char *td_blas_core_wanted(void);
/* OpenBLAS's own pick for this process ("Cooperlake", "Prescott", ...). */
const char *td_blas_core(void);

/* ---- BLAS ----
 * c[m x n] = alpha * op(a) * op(b) + beta * c, row-major; op(a) is m x k, op(b) is k x n.
 * Runs on the calling thread only. */
void td_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc);

/* ---- tandem's own gemm, in a fixed order (gemm.c; the linear layers') ----
 * c[r][j] = (accumulate ? c[r][j] : 0) + sum over p = 0, 1, ..., depth - 1 of
 * a[r * a_row + p * a_step] * b[p * ldb + j], for r < rows and j < width: each term one
 * multiply-add (fused where the build has FMA), in p order. The bits therefore depend on neither
 * the thread count, nor how a caller splits rows or columns, nor the vector width (AVX2 and
 * AVX-512 builds agree), nor the BLAS core. a's strides make it either operand's layout:
 * a = x (a_row = ld, a_step = 1) or a = x^T (a_row = 1, a_step = ld). Calling thread only. */
void td_gemm_ordered(int rows, int width, int depth, const float *a, ptrdiff_t a_row,
                     ptrdiff_t a_step, const float *b, size_t ldb, float *c, size_t ldc,
                     bool accumulate);
/* td_gemm_ordered with the rows of a, or of b, at listed offsets instead of a stride: a's row r
 * starts at a + a_rows[r] (its elements a_step apart), b's row p at b + b_rows[p]; NULL for the
 * stride (a_row, ldb), and one of the two at most. An indirect gemm: a stride-1 convolution's
 * column matrix row t (channel, kernel row, kernel column) is the padded image read from t's
 * offset on, so the gemm reads the image where im2col would copy it. The same bits as
 * td_gemm_ordered on the copy. */
void td_gemm_indirect(int rows, int width, int depth, const float *a, const ptrdiff_t *a_rows,
                      ptrdiff_t a_row, ptrdiff_t a_step, const float *b, const ptrdiff_t *b_rows,
                      size_t ldb, float *c, size_t ldc, bool accumulate);
/* td_gemm_ordered with b packed once for several calls (tasks sharing one b, as a weight
 * gradient's tasks share the layer's input): td_gemm_pack_b writes b [depth, width] into
 * packed, of td_gemm_packed_floats(depth, width) floats; the calls for [j_from, j_to) ranges that
 * cover [0, width) at multiples of 64 split that work (0, width: all of it). The same bits as
 * td_gemm_ordered. */
size_t td_gemm_packed_floats(int depth, int width);
void td_gemm_pack_b(const float *b, int depth, int width, size_t ldb, float *packed, int j_from,
                    int j_to);
void td_gemm_ordered_packed(int rows, int width, int depth, const float *a, ptrdiff_t a_row,
                            ptrdiff_t a_step, const float *packed, float *c, size_t ldc,
                            bool accumulate);
/* t[j][i] = x[i][j] for i < rows, j < cols, and t[j][i] = 0 for rows <= i < rows_to. */
void td_transpose(const float *x, int rows, int cols, size_t ldx, float *t, size_t ldt,
                  int rows_to);

/* ---- convolution lowering, one image ----
 * x: [c, h, w]; col: [c * kh * kw, oh * ow] with row (ci * kh + ki) * kw + kj, column
 * oy * ow + ox holding x[ci][oy * stride - pad + ki][ox * stride - pad + kj] (0 outside).
 * td_col2im is the adjoint: it *adds* col's entries back into x (zero x first for a plain copy). */
void td_im2col(const float *x, int c, int h, int w, int kh, int kw, int stride, int pad, int oh,
               int ow, float *col);
void td_col2im(const float *col, int c, int h, int w, int kh, int kw, int stride, int pad, int oh,
               int ow, float *x);
/* Stride 2 (square kernel k, padding pad): td_im2col's col, and td_col2im's bits, from x split
 * once into its four (row, column) parity planes, from which every kernel tap is a contiguous
 * copy; planes is scratch of td_parity_floats(c, h, w, k, pad). td_col2im_s2 *writes* x (no
 * need to zero it first). */
size_t td_parity_floats(int c, int h, int w, int k, int pad);
void td_im2col_s2(const float *x, int c, int h, int w, int k, int pad, int oh, int ow,
                  float *planes, float *col);
void td_col2im_s2(const float *col, int c, int h, int w, int k, int pad, int oh, int ow,
                  float *planes, float *x);
/* Output size of a convolution or pooling window along one axis; <= 0 when it does not fit. */
int td_conv_out_size(int in, int kernel, int stride, int pad);

/* ---- elementwise (y and x may alias where both are listed) ---- */
void td_fill(float *y, size_t n, float v);
void td_add(float *y, const float *x, size_t n);                             /* y += x */
void td_scale(float *y, size_t n, float s);                                  /* y *= s */
void td_relu(float *y, const float *x, size_t n);                            /* y = max(x, 0) */
void td_relu_backward(float *dx, const float *y, const float *dy, size_t n); /* dx = y>0 ? dy : 0 */
/* The smooth activations, vectorised, and an element's bits depend on its value alone (never on
 * its offset, n, or the thread count): every element runs through the same vector code
 * (src/tensor/activation.c). Accuracy against double precision: tests/tensor/test_activation.c.
 * GELU, the exact (erf) form: y = x Phi(x); backward dx = dy (Phi(x) + x phi(x)), dx may be dy.
 * tanh and the logistic sigmoid 1 / (1 + exp(-x)): their backward is from y (1 - y^2, y (1 - y)),
 * one multiply per element, left to the caller. */
void td_gelu(float *y, const float *x, size_t n);
void td_gelu_backward(float *dx, const float *x, const float *dy, size_t n);
void td_tanh(float *y, const float *x, size_t n);
void td_sigmoid(float *y, const float *x, size_t n);

/* ---- reductions (fixed summation order: same bits for the same input, always) ---- */
float td_sum(const float *x, size_t n);
float td_max(const float *x, size_t n);
size_t td_argmax(const float *x, size_t n); /* first maximal element; 0 when n == 0 */
double td_dot_f64(const float *x, const float *y, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_TENSOR_H */
