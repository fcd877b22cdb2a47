/* optim: validation messages, state layout, step counting, thread-count independence. */
#include <stdlib.h>

#include "tandem/optim.h"
#include "test.h"

int main(void) {
    td_optim_config c = td_optim_defaults(TD_OPTIM_ADAMW);
    ASSERT_NEAR(c.beta1, 0.9, 0);
    ASSERT_NEAR(c.beta2, 0.999, 0);
    ASSERT_NEAR(c.eps, 1e-8, 0);
    ASSERT_NEAR(c.weight_decay, 0.01, 0);
    ASSERT_NEAR(td_optim_defaults(TD_OPTIM_SGD).weight_decay, 0, 0);

    td_optim_kind k;
    ASSERT_OK(td_optim_parse_kind("sgd", &k));
    ASSERT_EQ(k, TD_OPTIM_SGD);
    ASSERT_STATUS(td_optim_parse_kind("adam", &k), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "'adam'");

    td_optim_t *o = NULL;
    td_optim_config bad = c;
    bad.lr = -1;
    ASSERT_STATUS(td_optim_new(&bad, 10, &o), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "learning rate -1");
    bad = c;
    bad.beta2 = 1.0;
    ASSERT_STATUS(td_optim_new(&bad, 10, &o), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "beta2 1");
    bad = td_optim_defaults(TD_OPTIM_SGD);
    bad.nesterov = true;
    ASSERT_STATUS(td_optim_validate(&bad), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "nesterov");

    /* state sizes */
    ASSERT_OK(td_optim_new(&c, 100, &o));
    ASSERT_EQ(td_optim_state_count(o), 200);
    td_optim_free(o);
    td_optim_config sgd = td_optim_defaults(TD_OPTIM_SGD);
    ASSERT_OK(td_optim_new(&sgd, 100, &o));
    ASSERT_EQ(td_optim_state_count(o), 0);
    td_optim_free(o);
    sgd.momentum = 0.9;
    ASSERT_OK(td_optim_new(&sgd, 100, &o));
    ASSERT_EQ(td_optim_state_count(o), 100);
    td_optim_free(o);

    /* a large buffer (parallel path) gives the same bits as element-by-element small runs, and
     * restoring state + step count continues exactly (what a checkpoint relies on) */
    enum { N = 300001 };
    float *p1 = td_xmalloc(N * sizeof(float)), *p2 = td_xmalloc(N * sizeof(float));
    float *g = td_xmalloc(N * sizeof(float));
    td_rng_fill_uniform(1, 0, -1, 1, p1, N);
    memcpy(p2, p1, N * sizeof(float));
    td_optim_t *a, *b;
    ASSERT_OK(td_optim_new(&c, N, &a));
    ASSERT_OK(td_optim_new(&c, N, &b));
    for (int s = 0; s < 3; s++) {
        td_rng_fill_uniform(2, (uint64_t)s, -0.1f, 0.1f, g, N);
        td_optim_step(a, p1, g);
        if (s < 2) td_optim_step(b, p2, g);
    }
    /* b "resumes" at step 2 from a copy of its state into a fresh optimizer */
    td_optim_t *b2;
    ASSERT_OK(td_optim_new(&c, N, &b2));
    memcpy(td_optim_state(b2), td_optim_state(b), 2 * N * sizeof(float));
    td_optim_set_step_count(b2, td_optim_step_count(b));
    td_rng_fill_uniform(2, 2, -0.1f, 0.1f, g, N);
    td_optim_step(b2, p2, g);
    ASSERT_EQ(memcmp(p1, p2, N * sizeof(float)), 0);
    ASSERT_EQ(memcmp(td_optim_state(a), td_optim_state(b2), 2 * N * sizeof(float)), 0);
    ASSERT_EQ(td_optim_step_count(b2), 3);
    td_optim_free(a);
    td_optim_free(b);
    td_optim_free(b2);
    free(p1);
    free(p2);
    free(g);
    TEST_PASS();
}
