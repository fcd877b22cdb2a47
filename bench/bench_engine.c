/* bench_engine: samples/s and GFLOP/s of a training step (forward, NLL loss, backward, plain SGD
 * update) for the built-in models at batch 64, next to the sgemm peak measured in the same run.
 *
 *   bench_engine [--models basicnet,mlp7] [--threads 1,2] [--seconds S] [--batch B]
 *                [--input CxHxW] [--json]
 *
 * --input: the image shape the models are built for (default 1x28x28; resnet-small is made
 * for 3x32x32). Besides samples/s (wall clock) each row gives cpu_ms_per_step, the process's
 * CPU time per step: on a shared machine a 1-thread run's CPU time moves far less with the
 * load than its wall time, so before/after comparisons of a kernel change read it first.
 *
 * --models '' measures only the sgemm peak (bench_train.sh's use: the training itself is
 * `tandem train`'s AdamW step there).
 */
#include <cblas.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>

#include "tandem/nn.h"
#include "tandem/tensor.h"

#include "blas_core.h"

void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void); /* the kernel set OpenBLAS picked for this CPU: the CPU class */

static double sgemm_peak(int threads, double seconds) {
    const int n = 1536;
    float *a = td_xmalloc_aligned(sizeof(float) * n * n),
          *b = td_xmalloc_aligned(sizeof(float) * n * n),
          *c = td_xmalloc_aligned(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    int it = 0;
    double t0 = td_now_s(), t;
    do {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        it++;
    } while ((t = td_now_s() - t0) < seconds);
    td_set_num_threads(td_get_num_threads()); /* back to single-threaded BLAS */
    free(a), free(b), free(c);
    return 2.0 * n * n * (double)n * it / t * 1e-9;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static td_status bench_model(const char *name, const int *shape, int threads, int batch,
                             double seconds, bool json, double peak) {
    td_model_t *m;
    TD_CHECK(td_model_load_for(name, shape[0], shape[1], shape[2], 10, &m));
    td_status st = td_model_finalize(m, batch);
    if (st != TD_OK) {
        td_model_free(m);
        return st;
    }
    td_model_init_params(m, 1);
    td_set_num_threads(threads);
    int in = td_model_input_size(m), classes = td_model_output_size(m);
    float *x = td_xmalloc_aligned(sizeof(float) * (size_t)batch * in);
    float *dout = td_xmalloc_aligned(sizeof(float) * (size_t)batch * classes);
    int32_t *labels = td_xmalloc(sizeof(int32_t) * (size_t)batch);
    uint64_t *ids = td_xmalloc(sizeof(uint64_t) * (size_t)batch);
    td_rng_fill_uniform(7, 0, 0.0f, 1.0f, x, (size_t)batch * in);
    float *p = td_model_params(m), *g = td_model_grads(m);
    size_t np = td_model_num_params(m);
    int steps = 0;
    double t0 = 0, elapsed = 0, c0 = 0;
    for (int it = 0;; it++) {
        if (it == 3) t0 = td_now_s(), c0 = cpu_s(); /* warm-up: first touches, OpenMP team */
        for (int i = 0; i < batch; i++) {
            ids[i] = (uint64_t)it * batch + i;
            labels[i] = (int32_t)(ids[i] % (uint64_t)classes);
        }
        td_forward_ctx ctx = {.training = true, .seed = 1, .step = (uint64_t)it, .sample_ids = ids};
        td_model_zero_grads(m);
        const float *out = td_model_forward(m, x, batch, &ctx);
        td_nll_loss(out, labels, batch, classes, 1.0f / batch, dout);
        td_model_backward(m, dout, batch);
        for (size_t i = 0; i < np; i++) p[i] -= 0.01f * g[i];
        if (it >= 3) {
            steps++;
            elapsed = td_now_s() - t0;
            if (elapsed >= seconds && steps >= 5) break;
        }
    }
    double sps = steps * (double)batch / elapsed, cpu_ms = 1e3 * (cpu_s() - c0) / steps;
    double gflops = sps * td_model_flops_per_sample(m) * 1e-9;
    if (json)
        printf("{\"kind\": \"train_step\", \"model\": \"%s\", \"threads\": %d, \"batch\": %d, "
               "\"steps\": %d, \"samples_per_s\": %.1f, \"gflops\": %.2f, \"mflop_per_sample\": "
               "%.2f, \"pct_of_sgemm_peak\": %.1f, \"cpu_ms_per_step\": %.2f}\n",
               name, threads, batch, steps, sps, gflops, td_model_flops_per_sample(m) * 1e-6,
               peak > 0 ? 100.0 * gflops / peak : 0.0, cpu_ms);
    else
        printf("%-12s threads=%d batch=%d  %8.1f samples/s  %6.1f GFLOP/s (%4.1f%% of sgemm "
               "peak)  %7.2f CPU ms/step  [%d steps, %.1f MFLOP/sample]\n",
               name, threads, batch, sps, gflops, peak > 0 ? 100.0 * gflops / peak : 0.0, cpu_ms,
               steps, td_model_flops_per_sample(m) * 1e-6);
    fflush(stdout);
    free(x), free(dout), free(labels), free(ids);
    td_model_free(m);
    return TD_OK;
}

int main(int argc, char **argv) {
    bench_use_tandems_blas_core(argv);
    const char *models = "basicnet,mlp7", *threads = "1,2";
    double seconds = 2.0;
    int batch = 64, shape[3] = {1, 28, 28};
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--models") && i + 1 < argc)
            models = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = argv[++i];
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--input") && i + 1 < argc) {
            if (sscanf(argv[++i], "%dx%dx%d", &shape[0], &shape[1], &shape[2]) != 3 ||
                shape[0] < 1 || shape[1] < 1 || shape[2] < 1) {
                fprintf(stderr, "%s: --input %s: give the image shape as CxHxW, e.g. 3x32x32\n",
                        argv[0], argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--json"))
            json = true;
        else {
            fprintf(stderr,
                    "usage: %s [--models basicnet,mlp7] [--threads 1,2] [--seconds S] "
                    "[--batch B] [--input CxHxW] [--json]\n",
                    argv[0]);
            return 2;
        }
    }
    char tbuf[64];
    snprintf(tbuf, sizeof tbuf, "%s", threads);
    double peak[65] = {0};
    for (char *save, *t = strtok_r(tbuf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int n = atoi(t);
        if (n < 1 || n > 64) continue;
        peak[n] = sgemm_peak(n, TD_MIN(seconds, 1.0));
        if (json)
            printf("{\"kind\": \"sgemm_peak\", \"threads\": %d, \"n\": 1536, \"gflops\": %.2f, "
                   "\"openblas_core\": \"%s\"}\n",
                   n, peak[n], openblas_get_corename());
        else
            printf("sgemm n=1536 threads=%d  %6.1f GFLOP/s (OpenBLAS core %s)\n", n, peak[n],
                   openblas_get_corename());
    }
    char mbuf[256];
    snprintf(mbuf, sizeof mbuf, "%s", models);
    for (char *s1, *mname = strtok_r(mbuf, ",", &s1); mname; mname = strtok_r(NULL, ",", &s1)) {
        snprintf(tbuf, sizeof tbuf, "%s", threads);
        for (char *s2, *t = strtok_r(tbuf, ",", &s2); t; t = strtok_r(NULL, ",", &s2)) {
            int n = atoi(t);
            if (n < 1 || n > 64) continue;
            td_status st = bench_model(mname, shape, n, batch, seconds, json, peak[n]);
            if (st != TD_OK) {
                td_error_print(st);
                return 1;
            }
        }
    }
    return 0;
}
