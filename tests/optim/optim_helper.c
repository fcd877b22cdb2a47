/* Runs tandem's optimizer over raw float files so test_optim_torch.py can compare it with
 * torch.optim on the same numbers.
 * usage: optim_helper sgd|adamw LR WD MOMENTUM DAMPENING NESTEROV STEPS N PARAMS GRADS OUT
 *   PARAMS: N floats; GRADS: STEPS*N floats (one gradient per step);
 *   OUT: N final params followed by the optimizer state (td_optim_state_count floats). */
#include <stdlib.h>

#include "tandem/optim.h"
#include "test.h"

static float *read_floats(const char *path, size_t count) {
    float *buf = td_xmalloc(count * sizeof(float));
    FILE *f = fopen(path, "rb");
    if (!f || fread(buf, sizeof(float), count, f) != count) TEST_FAIL("cannot read %s", path);
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 12) TEST_FAIL("usage: optim_helper KIND LR WD MOM DAMP NESTEROV STEPS N P G OUT");
    td_optim_kind kind;
    ASSERT_OK(td_optim_parse_kind(argv[1], &kind));
    td_optim_config cfg = td_optim_defaults(kind);
    double v;
    ASSERT_OK(td_parse_f64("lr", argv[2], &cfg.lr));
    ASSERT_OK(td_parse_f64("wd", argv[3], &cfg.weight_decay));
    ASSERT_OK(td_parse_f64("momentum", argv[4], &cfg.momentum));
    ASSERT_OK(td_parse_f64("dampening", argv[5], &cfg.dampening));
    ASSERT_OK(td_parse_f64("nesterov", argv[6], &v));
    cfg.nesterov = v != 0;
    int64_t steps, n;
    ASSERT_OK(td_parse_i64("steps", argv[7], &steps));
    ASSERT_OK(td_parse_i64("n", argv[8], &n));
    float *params = read_floats(argv[9], (size_t)n);
    float *grads = read_floats(argv[10], (size_t)(steps * n));
    td_optim_t *opt;
    ASSERT_OK(td_optim_new(&cfg, (size_t)n, &opt));
    for (int64_t s = 0; s < steps; s++) td_optim_step(opt, params, grads + s * n);
    ASSERT_EQ(td_optim_step_count(opt), steps);
    FILE *f = fopen(argv[11], "wb");
    ASSERT(f);
    ASSERT_EQ(fwrite(params, sizeof(float), (size_t)n, f), (size_t)n);
    size_t sc = td_optim_state_count(opt);
    if (sc) ASSERT_EQ(fwrite(td_optim_state(opt), sizeof(float), sc, f), sc);
    ASSERT_EQ(fclose(f), 0);
    td_optim_free(opt);
    free(params);
    free(grads);
    return 0;
}
