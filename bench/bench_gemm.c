/* bench_gemm: the linear layers' three gemms, tandem's own (td_gemm_ordered) against OpenBLAS's
 * sgemm on the same shapes in the same run, 1 thread, GFLOP/s (best of --repeats).
 *
 *   bench_gemm [--batch 64] [--shapes 784x1024,1024x1024,1024x512,512x512] [--repeats 20]
 *
 * A shape is IN x OUT of a layer at the batch. Per shape: the forward y = x W^T, the input
 * gradient dx = dy W and the weight gradient dW += dy^T x, each split as the model splits it
 * (tasks of 128 output features, 256 input features) and each called with the layer's operands
 * as the model lays them out. "warm" repeats a call on hot caches; "cold" touches 64 MB between
 * calls, as a training step's other layers and optimizer evict a layer's weights (the model's
 * case: a 1024 x 1024 layer's weights, gradient and optimizer state are 16 MB). tandem's side
 * includes its copies (x^T and y^T, the packed input). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/tensor.h"

#include "blas_core.h"

void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);

enum { FWD_COLS = 128, DX_COLS = 256, FLUSH_BYTES = 64 << 20 };

static unsigned char *junk;

static void flush(void) {
    for (size_t i = 0; i < FLUSH_BYTES; i += 64) junk[i]++;
}

static float *randoms(size_t n, uint64_t seed) {
    float *p = td_xmalloc_aligned(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = td_rng_uniform(seed, 0, i) - 0.5f;
    return p;
}

typedef struct {
    int batch, in, out;
    float *x, *w, *y, *dy, *dx, *gw, *xt, *yt, *xp;
} layer;

static void fwd_blas(layer *l) {
    for (int j0 = 0; j0 < l->out; j0 += FWD_COLS)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, l->batch,
                    TD_MIN(FWD_COLS, l->out - j0), l->in, 1, l->x, l->in,
                    l->w + (size_t)j0 * l->in, l->in, 0, l->y + j0, l->out);
}

static void fwd_own(layer *l) {
    size_t bp = ((size_t)l->batch + 15) & ~(size_t)15;
    td_transpose(l->x, l->batch, l->in, (size_t)l->in, l->xt, bp, (int)bp);
    for (int j0 = 0; j0 < l->out; j0 += FWD_COLS) {
        int nf = TD_MIN(FWD_COLS, l->out - j0);
        td_gemm_ordered(nf, (int)bp, l->in, l->w + (size_t)j0 * l->in, l->in, 1, l->xt, bp,
                        l->yt + j0 * bp, bp, false);
        td_transpose(l->yt + j0 * bp, nf, l->batch, bp, l->y + j0, (size_t)l->out, nf);
    }
}

static void dx_blas(layer *l) {
    for (int c0 = 0; c0 < l->in; c0 += DX_COLS)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, l->batch,
                    TD_MIN(DX_COLS, l->in - c0), l->out, 1, l->dy, l->out, l->w + c0, l->in, 0,
                    l->dx + c0, l->in);
}

static void dx_own(layer *l) {
    for (int c0 = 0; c0 < l->in; c0 += DX_COLS)
        td_gemm_ordered(l->batch, TD_MIN(DX_COLS, l->in - c0), l->out, l->dy, l->out, 1,
                        l->w + c0, (size_t)l->in, l->dx + c0, (size_t)l->in, false);
}

static void dw_blas(layer *l) {
    for (int j0 = 0; j0 < l->out; j0 += FWD_COLS)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, TD_MIN(FWD_COLS, l->out - j0), l->in,
                    l->batch, 1, l->dy + j0, l->out, l->x, l->in, 1, l->gw + (size_t)j0 * l->in,
                    l->in);
}

static void dw_own(layer *l) {
    td_gemm_pack_b(l->x, l->batch, l->in, (size_t)l->in, l->xp, 0, l->in);
    for (int j0 = 0; j0 < l->out; j0 += FWD_COLS)
        td_gemm_ordered_packed(TD_MIN(FWD_COLS, l->out - j0), l->in, l->batch, l->dy + j0, 1,
                               l->out, l->xp, l->gw + (size_t)j0 * l->in, (size_t)l->in, true);
}

/* The best GFLOP/s of `repeats` calls, each timed alone. */
static double rate(void (*fn)(layer *), layer *l, int repeats, int cold) {
    double best = 1e30;
    fn(l);
    for (int r = 0; r < repeats; r++) {
        if (cold) flush();
        double t0 = td_now_s();
        fn(l);
        double t = td_now_s() - t0;
        if (t < best) best = t;
    }
    return 2.0 * l->batch * l->in * l->out / best * 1e-9;
}

int main(int argc, char **argv) {
    bench_use_tandems_blas_core(argv);
    int batch = 64, repeats = 20;
    const char *shapes = "784x1024,1024x1024,1024x512,512x512";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc)
            shapes = argv[++i];
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc)
            repeats = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_gemm [--batch B] [--shapes INxOUT,...] [--repeats N]\n");
            return 2;
        }
    }
    if (batch <= 0 || repeats <= 0) {
        fprintf(stderr, "bench_gemm: --batch and --repeats must be positive\n");
        return 2;
    }
    td_set_num_threads(1);
    openblas_set_num_threads(1);
    junk = calloc(FLUSH_BYTES, 1);
    if (!junk) return 1;
    printf("OpenBLAS core %s, 1 thread, batch %d, GFLOP/s (best of %d)\n", openblas_get_corename(),
           batch, repeats);
    printf("%-11s %-5s %9s %9s %9s %9s %9s %9s\n", "in x out", "", "fwd blas", "fwd own",
           "dx blas", "dx own", "dW blas", "dW own");
    char *list = strdup(shapes), *save = NULL;
    for (char *s = strtok_r(list, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        layer l = {.batch = batch};
        if (sscanf(s, "%dx%d", &l.in, &l.out) != 2 || l.in <= 0 || l.out <= 0) {
            fprintf(stderr, "bench_gemm: shape '%s' is not INxOUT (e.g. 1024x512)\n", s);
            return 2;
        }
        size_t bp = ((size_t)batch + 15) & ~(size_t)15, xi = (size_t)batch * l.in;
        size_t wi = (size_t)l.out * l.in, yi = (size_t)batch * l.out;
        l.x = randoms(xi, 1), l.w = randoms(wi, 2), l.y = randoms(yi, 3), l.dy = randoms(yi, 4);
        l.dx = randoms(xi, 5), l.gw = randoms(wi, 6), l.xt = randoms(bp * l.in, 7);
        l.yt = randoms(bp * l.out, 8), l.xp = randoms(td_gemm_packed_floats(batch, l.in), 9);
        for (int cold = 0; cold < 2; cold++)
            printf("%5dx%-5d %-5s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n", l.in, l.out,
                   cold ? "cold" : "warm", rate(fwd_blas, &l, repeats, cold),
                   rate(fwd_own, &l, repeats, cold), rate(dx_blas, &l, repeats, cold),
                   rate(dx_own, &l, repeats, cold), rate(dw_blas, &l, repeats, cold),
                   rate(dw_own, &l, repeats, cold));
        free(l.x), free(l.w), free(l.y), free(l.dy), free(l.dx), free(l.gw), free(l.xt),
            free(l.yt), free(l.xp);
    }
    free(list);
    free(junk);
    return 0;
}
