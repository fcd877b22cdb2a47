/* train: the short last step of an epoch averages over the n samples it has, not over the global
 * batch G (train.h: "its gradient scale is 1/n").
 *
 * Comparing 1 worker with N cannot see a wrong tail scale (every split of G shares it), so this
 * test checks the update against a reference computed here, independently of the trainer: the
 * model of tiny_train.h is one linear layer trained with cross-entropy and plain SGD (lr 0.5, no
 * momentum, no weight decay), whose step is, in double precision,
 *     W -= lr/n * sum_i (softmax(W x_i + b) - onehot(y_i)) x_i^T,  b -= lr/n * sum_i (...)
 * over the step's samples i = perm(seed, 0)[s*G ...]. The trainer's parameters before and after
 * a step come from its checkpoints. The first (full) step validates the reference; the tail step
 * of 22 samples must use n = 22 mod G. Tolerance 2e-5 against float rounding; a 1/G scale is off
 * by lr * |g| * (1 - n/G), which the test checks is well above it. Two splits: G = 4 x 1 (tail
 * of 2 in one micro-batch) and G = 3 x 2 accumulated micro-batches (tail of 4 = 3 + 1). */
#include <dirent.h>
#include <stdlib.h>

#include "tandem/data.h"
#include "tandem/train.h"
#include "test.h"
#include "tiny_train.h"

enum { N = 22, SEED = 5, NP = TINY_CLASSES * TINY_IN + TINY_CLASSES };
static const double LR = 0.5, TOL = 2e-5;

static td_checkpoint load_step(const char *dir, int64_t step) {
    char *path = td_xasprintf("%s/ckpt-%lld.tdck", dir, (long long)step);
    td_checkpoint ck;
    ASSERT_OK(td_checkpoint_load(path, &ck));
    ASSERT_EQ(ck.num_params, NP);
    ASSERT_EQ(ck.step, step);
    free(path);
    return ck;
}

static void train(const char *spec, const char *data, int batch, int accum, int64_t steps,
                  const char *ckdir) {
    td_train_config cfg;
    td_train_config_defaults(&cfg);
    cfg.model = spec;
    cfg.data_dir = data;
    cfg.batch = batch;
    cfg.accum = accum;
    if (steps > 0)
        cfg.steps = steps;
    else
        cfg.epochs = 1;
    cfg.optim = td_optim_defaults(TD_OPTIM_SGD);
    cfg.optim.lr = LR;
    cfg.seed = SEED;
    cfg.threads = 1;
    cfg.progress = 0;
    cfg.eval_every_epoch = false;
    cfg.checkpoint_dir = ckdir;
    cfg.checkpoint_every = 1;
    /* the reference gathers through td_dataset_load_fashion_mnist's fixed normalisation */
    static const float mean = TD_FASHION_MNIST_MEAN, std = TD_FASHION_MNIST_STD;
    cfg.norm_count = 1, cfg.norm_mean = &mean, cfg.norm_std = &std;
    td_train_result res;
    ASSERT_OK(td_train_run(&cfg, &res));
}

/* after = before - lr * mean gradient over samples ids[0..n), computed in double. Returns the
 * largest |lr * g| (what a wrong scale would be off by, times 1 - n/G). */
static double reference_step(const td_dataset_t *ds, const uint64_t *ids, int n,
                             const float *before, double *after) {
    double g[NP] = {0};
    const float *w = before, *b = before + TINY_CLASSES * TINY_IN;
    float x[TINY_IN];
    int32_t y;
    for (int i = 0; i < n; i++) {
        ASSERT_OK(td_dataset_gather(ds, &ids[i], 1, x, &y, NULL));
        double z[TINY_CLASSES], zmax = -INFINITY, sum = 0;
        for (int c = 0; c < TINY_CLASSES; c++) {
            z[c] = b[c];
            for (int k = 0; k < TINY_IN; k++) z[c] += (double)w[c * TINY_IN + k] * x[k];
            zmax = fmax(zmax, z[c]);
        }
        for (int c = 0; c < TINY_CLASSES; c++) sum += exp(z[c] - zmax);
        for (int c = 0; c < TINY_CLASSES; c++) {
            double d = exp(z[c] - zmax) / sum - (c == y ? 1.0 : 0.0);
            for (int k = 0; k < TINY_IN; k++) g[c * TINY_IN + k] += d * x[k];
            g[TINY_CLASSES * TINY_IN + c] += d;
        }
    }
    double big = 0;
    for (int p = 0; p < NP; p++) {
        double u = LR * g[p] / n;
        after[p] = (double)before[p] - u;
        big = fmax(big, fabs(u));
    }
    return big;
}

static void check_step(const char *what, const td_dataset_t *ds, const uint64_t *ids, int n, int G,
                       const float *before, const float *after) {
    double want[NP];
    double big = reference_step(ds, ids, n, before, want);
    double worst = 0;
    int at = 0;
    for (int p = 0; p < NP; p++) {
        double d = fabs((double)after[p] - want[p]);
        if (d > worst) worst = d, at = p;
    }
    if (worst > TOL) {
        double upd = (double)before[at] - want[at], got = (double)before[at] - after[at];
        TEST_FAIL("%s (%d samples, global batch %d): parameter %d is %.9g, the reference step "
                  "on those samples gives %.9g (diff %.3g > %.1g); the trainer's update there "
                  "is %.6g x the reference's (1/n scale: 1, 1/G scale: n/G = %.4g)",
                  what, n, G, at, (double)after[at], want[at], worst, TOL, got / upd,
                  (double)n / G);
    }
    /* a wrong scale would have shown: its error (1 - n/G) x the update dwarfs the tolerance */
    if (n < G) ASSERT(big * (1.0 - (double)n / G) > 100 * TOL);
    printf("%s: %d samples of global batch %d match the reference (max diff %.2g, largest update "
           "%.3g)\n",
           what, n, G, worst, big);
}

static void run_split(const char *root, const char *spec, const td_dataset_t *ds, int batch,
                      int accum) {
    const int G = batch * accum, spe = (N + G - 1) / G, tail = N - (spe - 1) * G;
    ASSERT(tail > 0 && tail < G);
    uint64_t perm[N];
    td_sampler_permutation(SEED, 0, N, perm);
    char *first = td_xasprintf("%s/first-%dx%d", root, batch, accum);
    char *whole = td_xasprintf("%s/epoch-%dx%d", root, batch, accum);
    train(spec, root, batch, accum, 1, first);
    train(spec, root, batch, accum, 0, whole);

    /* step 1 from the initial weights (the trainer's init, rebuilt here) */
    td_model_t *m;
    ASSERT_OK(td_model_load(spec, &m));
    ASSERT_OK(td_model_finalize(m, TD_MAX(batch, 128)));
    ASSERT_EQ(td_model_num_params(m), NP);
    td_model_init_params(m, SEED);
    td_checkpoint c1 = load_step(first, 1);
    char what[64];
    snprintf(what, sizeof what, "%dx%d step 1", batch, accum);
    check_step(what, ds, perm, G, G, td_model_params(m), c1.params);

    /* the tail: the epoch's last step, from the checkpoint of the step before it */
    td_checkpoint before = load_step(whole, spe - 1), after = load_step(whole, spe);
    snprintf(what, sizeof what, "%dx%d tail step %d", batch, accum, spe);
    check_step(what, ds, perm + (spe - 1) * G, tail, G, before.params, after.params);

    td_checkpoint_free(&c1);
    td_checkpoint_free(&before);
    td_checkpoint_free(&after);
    td_model_free(m);
    free(first);
    free(whole);
}

int main(void) {
    char *spec;
    const char *dir = tiny_setup(N, 9, &spec);
    td_dataset_t *ds;
    ASSERT_OK(td_dataset_load_fashion_mnist(dir, "train", &ds));
    ASSERT_EQ(td_dataset_count(ds), N);
    run_split(dir, spec, ds, 4, 1); /* 5 steps of 4 + a tail of 2 */
    run_split(dir, spec, ds, 3, 2); /* 3 steps of 6 + a tail of 4 = 3 + 1 */
    td_dataset_free(ds);
    free(spec);
    printf("the tail step averages over the samples it has\n");
    return 0;
}
