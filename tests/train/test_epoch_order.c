/* train: each epoch trains on that epoch's sample order, td_sampler_permutation(seed, epoch),
 * not epoch 0's again.
 *
 * The trainer runs 3 epochs of batch 1 with SGD at lr 0 on the tiny data set (tiny_train.h): the
 * parameters never change, so the loss a step reports is a function of its one sample only, and
 * the same sample gives the same bits on this machine whatever the OpenBLAS kernel (the test
 * pins no number a kernel decides; it compares this machine with itself). Epoch 0's losses,
 * read through perm(seed, 0), give each sample's loss; every step of epochs 1 and 2 must then
 * report the loss of perm(seed, e)[s]. A trainer that ignores the epoch repeats epoch 0's
 * sequence, which differs at most positions (checked: the test has the power to see it). */
#include <stdlib.h>

#include "tandem/data.h"
#include "tandem/train.h"
#include "test.h"
#include "tiny_train.h"

enum { N = 48, EPOCHS = 3, SEED = 11 };

typedef struct {
    double loss[N * EPOCHS + 1]; /* by step (1-based, as the trainer numbers them) */
    int seen[N * EPOCHS + 1];
} capture;

static void on_metric(void *user, const char *key, int64_t step, double value) {
    capture *c = user;
    if (strcmp(key, "train/loss")) return;
    ASSERT(step >= 1 && step <= N * EPOCHS);
    c->loss[step] = value;
    c->seen[step]++;
}

int main(void) {
    char *spec;
    const char *dir = tiny_setup(N, 3, &spec);

    static capture cap;
    td_train_config cfg;
    td_train_config_defaults(&cfg);
    cfg.model = spec;
    cfg.data_dir = dir;
    cfg.epochs = EPOCHS;
    cfg.batch = 1;
    cfg.optim = td_optim_defaults(TD_OPTIM_SGD);
    cfg.optim.lr = 0; /* the weights stay as initialised: a step's loss is its sample's */
    cfg.seed = SEED;
    cfg.threads = 1;
    cfg.progress = 0;
    cfg.eval_every_epoch = false;
    cfg.callbacks.user = &cap;
    cfg.callbacks.metric = on_metric;
    td_train_result res;
    ASSERT_OK(td_train_run(&cfg, &res));
    ASSERT_EQ(res.steps, N * EPOCHS);
    ASSERT_EQ(res.epochs, EPOCHS);
    for (int s = 1; s <= N * EPOCHS; s++) ASSERT_EQ(cap.seen[s], 1);

    uint64_t perm[EPOCHS][N];
    for (int e = 0; e < EPOCHS; e++) td_sampler_permutation(SEED, (uint64_t)e, N, perm[e]);

    /* each sample's loss, from epoch 0 (step s of epoch e is trainer step e*N + s + 1) */
    double sample_loss[N];
    int have[N] = {0};
    for (int s = 0; s < N; s++) {
        ASSERT(perm[0][s] < N);
        sample_loss[perm[0][s]] = cap.loss[s + 1];
        have[perm[0][s]]++;
    }
    for (int i = 0; i < N; i++) ASSERT_EQ(have[i], 1); /* epoch 0 saw every sample once */

    for (int e = 1; e < EPOCHS; e++) {
        int tell = 0; /* positions where epoch e's sample has another loss than epoch 0's */
        for (int s = 0; s < N; s++) {
            double want = sample_loss[perm[e][s]], got = cap.loss[e * N + s + 1];
            if (want != sample_loss[perm[0][s]]) tell++;
            if (got != want)
                TEST_FAIL("epoch %d step %d (trainer step %d): loss %.9g is not that of sample "
                          "%llu = perm(seed %d, epoch %d)[%d], %.9g%s",
                          e, s, e * N + s + 1, got, (unsigned long long)perm[e][s], SEED, e, s,
                          want,
                          got == sample_loss[perm[0][s]]
                              ? "; it is epoch 0's sample at that position: the epoch's order "
                                "was not used"
                              : "");
        }
        /* the check above could not have passed with epoch 0's order in place of epoch e's */
        if (tell < N / 2)
            TEST_FAIL("epoch %d: only %d of %d positions tell the orders apart", e, tell, N);
        printf("epoch %d: all %d steps trained on perm(seed, %d) (%d positions differ from epoch "
               "0's order)\n",
               e, N, e, tell);
    }
    free(spec);
    printf("every epoch trained on its own sample order\n");
    return 0;
}
