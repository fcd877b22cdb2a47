/* nn: LayerNorm (src/nn/norm.c) against torch.nn.functional.layer_norm where eps matters.
 * y = (x - mean) / sqrt(var + eps) * w + b; putting eps outside the root, (x - mean) /
 * (sqrt(var) + eps), changes y by under eps / (2 sqrt(var)) relative, invisible at unit variance
 * (5e-6 at eps 1e-5) but a factor of 1.4 at var = eps and of 30 at var = 1e-8. So the rows here
 * have variances from 1e-2 down to 0, with eps = 1e-5 and eps = 1e-3, and every row's output,
 * input gradient and weight and bias gradients must match PyTorch computed in float64 on the
 * same float32 values (tests/nn/layernorm_ref.py, run by Debian's /usr/bin/python3) to a
 * relative 1e-5 of the row's largest reference value.
 *
 * The model is linear (identity weight, zero bias: its output is x exactly) then layernorm, so
 * the linear layer's bias gradient is layernorm's input gradient (td_model_backward leaves the
 * first layer's input gradient uncomputed). One sample per forward/backward gives each row's
 * own parameter gradients. Without torch the test prints why and passes, as its peers do. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/nn.h"
#include "tandem/tensor.h"
#include "test.h"

#define D    64
#define ROWS 8
#define RTOL 1e-5

static char tmpdir[] = "/tmp/td_test_layernorm_eps_XXXXXX";

static void write_f32(const char *name, const float *v, size_t count) {
    char *p = td_xasprintf("%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(v, sizeof *v, count, f) != count || fclose(f)) TEST_FAIL("cannot write %s", p);
    free(p);
}

static void read_f64(const char *name, double *v, size_t count) {
    char *p = td_xasprintf("%s/%s", tmpdir, name);
    FILE *f = fopen(p, "rb");
    if (!f || fread(v, sizeof *v, count, f) != count) TEST_FAIL("cannot read %s", p);
    fclose(f);
    free(p);
}

/* Row r's values: mean + sd * z with z a fixed pattern of about unit variance. |mean| / sd stays
 * below 50: float32 rounds x and the mean to 6e-8 of |mean|, which must stay well under RTOL
 * of the spread for any float32 layernorm to agree with float64. */
static void make_rows(float *x, float *dy, float *w, float *b) {
    static const double sd[ROWS] = {1e-1, 1e-2, 3.16e-3, 1e-3, 3e-4, 1e-4, 1e-6, 0};
    static const double mean[ROWS] = {0.5, -0.25, 0.01, 0, -0.002, 0.003, 2e-6, 0.125};
    for (int r = 0; r < ROWS; r++)
        for (int e = 0; e < D; e++) {
            double z = sin(0.37 * e + 1.3 * r) + 0.5 * cos(1.91 * e * e + r);
            x[r * D + e] = (float)(mean[r] + sd[r] * z);
            dy[r * D + e] = (float)(cos(0.77 * e - 0.4 * r) + 0.1 * r);
        }
    for (int e = 0; e < D; e++) {
        w[e] = (float)(0.75 + 0.5 * sin(0.13 * e));
        b[e] = (float)(0.05 * cos(0.29 * e));
    }
}

/* max over the row of |got - ref|, relative to the row's max |ref| (1e-30 at least). */
static void compare(const char *what, float eps, int r, double var, const float *got,
                    const double *ref) {
    double scale = 1e-30, err = 0;
    int worst = 0;
    for (int e = 0; e < D; e++) scale = fmax(scale, fabs(ref[e]));
    for (int e = 0; e < D; e++)
        if (fabs(got[e] - ref[e]) > err) err = fabs(got[e] - ref[e]), worst = e;
    if (err / scale > RTOL)
        TEST_FAIL("layernorm eps=%g row %d (variance %.3g): %s[%d] = %.9g, torch (float64) "
                  "says %.9g: max|diff|/max|ref| = %.3g > %.0e",
                  (double)eps, r, var, what, worst, (double)got[worst], ref[worst], err / scale,
                  RTOL);
}

static double row_var(const float *x) {
    double m = 0, v = 0;
    for (int e = 0; e < D; e++) m += x[e];
    m /= D;
    for (int e = 0; e < D; e++) v += (x[e] - m) * (x[e] - m);
    return v / D;
}

/* 1: compared; 0: torch missing. */
static int check_eps(float eps) {
    static float x[ROWS * D], dy[ROWS * D], w[D], b[D];
    static double ry[ROWS * D], rdx[ROWS * D], rdw[ROWS * D], rdb[ROWS * D];
    make_rows(x, dy, w, b);
    write_f32("x.bin", x, ROWS * D);
    write_f32("dy.bin", dy, ROWS * D);
    write_f32("w.bin", w, D);
    write_f32("b.bin", b, D);
    char *script = td_xasprintf("%s", __FILE__);
    char *slash = strrchr(script, '/');
    char *helper = td_xasprintf("%.*s/layernorm_ref.py", slash ? (int)(slash - script) : 1,
                                slash ? script : ".");
    const char *py = getenv("PYTHON") ? getenv("PYTHON") : "/usr/bin/python3";
    if (access(helper, R_OK) != 0) TEST_FAIL("%s is missing", helper);
    char *cmd = td_xasprintf("%s %s %s %d %d %.9g", py, helper, tmpdir, ROWS, D, (double)eps);
    int rc = access(py, X_OK) == 0 ? system(cmd) : -1;
    if (rc == -1 || (WIFEXITED(rc) && WEXITSTATUS(rc) == 77)) {
        printf("NOTE: no torch (%s): the comparison with PyTorch is skipped\n", py);
        free(cmd), free(helper), free(script);
        return 0;
    }
    if (rc != 0) TEST_FAIL("%s failed (status %d)", cmd, rc);
    free(cmd), free(helper), free(script);
    read_f64("y.ref", ry, ROWS * D);
    read_f64("dx.ref", rdx, ROWS * D);
    read_f64("dw.ref", rdw, ROWS * D);
    read_f64("db.ref", rdb, ROWS * D);

    td_model_t *m = td_model_new(D, 1, 1);
    ASSERT(m);
    ASSERT_OK(td_model_add_linear(m, D));
    ASSERT_OK(td_model_add_layernorm(m, eps));
    ASSERT_OK(td_model_finalize(m, 1));
    ASSERT_EQ(td_model_num_layers(m), 2);
    td_layer_info lin = td_model_layer(m, 0), ln = td_model_layer(m, 1);
    ASSERT_EQ(ln.kind, TD_LAYER_LAYERNORM);
    ASSERT_EQ(ln.param_count, 2 * D);
    ASSERT_EQ(lin.param_count, D * D + D);
    float *params = td_model_params(m), *grads = td_model_grads(m);
    memset(params, 0, sizeof(float) * td_model_num_params(m));
    for (int i = 0; i < D; i++) params[lin.param_offset + (size_t)i * D + i] = 1.0f;
    memcpy(params + ln.param_offset, w, sizeof w);
    memcpy(params + ln.param_offset + D, b, sizeof b);
    for (int r = 0; r < ROWS; r++) {
        td_model_zero_grads(m);
        const float *y = td_model_forward(m, x + r * D, 1, NULL);
        ASSERT(y);
        double var = row_var(x + r * D);
        printf("eps %g row %d: variance %.3g\n", (double)eps, r, var);
        compare("y", eps, r, var, y, ry + r * D);
        td_model_backward(m, dy + r * D, 1);
        compare("dx", eps, r, var, grads + lin.param_offset + D * D, rdx + r * D);
        compare("dweight", eps, r, var, grads + ln.param_offset, rdw + r * D);
        compare("dbias", eps, r, var, grads + ln.param_offset + D, rdb + r * D);
    }
    td_model_free(m);
    return 1;
}

int main(void) {
    ASSERT(mkdtemp(tmpdir));
    td_set_num_threads(1);
    if (check_eps(1e-5f)) check_eps(1e-3f);
    char *cmd = td_xasprintf("rm -rf %s", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
