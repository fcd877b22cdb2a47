/* The trainer's data-parallel glue: a process group from the launcher's environment and the ddp
 * reducer adapted to td_train_reducer. Lives in train (not ddp) because it speaks the trainer's
 * interface; ddp knows nothing of the trainer. */
#include "tandem/ddp.h"
#include "tandem/train.h"

#include <stdlib.h>
#include <string.h>

struct td_train_dist {
    td_store_t *store;
    td_pg_t *pg;
    td_ddp_t *ddp;
    td_ddp_options ddp_opts;
    td_train_reducer reducer;
};

static void dist_begin_backward(void *user) {
    td_train_dist *d = user;
    td_ddp_begin_backward(d->ddp);
}

static void dist_layer_ready(void *user, int layer) {
    td_train_dist *d = user;
    td_ddp_layer_ready(d->ddp, layer);
}

static td_status dist_wait(void *user) {
    td_train_dist *d = user;
    return td_ddp_wait(d->ddp);
}

/* Logging sums (loss, correct, samples, stop flag) in double and exactly: gather every rank's
 * values and add them in rank order, so all ranks print and decide the same. */
static td_status dist_allreduce_sum(void *user, double *vals, int n) {
    td_train_dist *d = user;
    int world = td_pg_world_size(d->pg);
    double *all = td_xmalloc(sizeof(double) * (size_t)n * (size_t)world);
    td_status st = td_allgather(d->pg, vals, all, sizeof(double) * (size_t)n);
    if (st == TD_OK)
        for (int i = 0; i < n; i++) {
            double s = 0;
            for (int r = 0; r < world; r++) s += all[(size_t)r * (size_t)n + (size_t)i];
            vals[i] = s;
        }
    free(all);
    return st;
}

static td_status dist_allgather(void *user, const void *in, void *out, size_t nbytes) {
    td_train_dist *d = user;
    return td_allgather(d->pg, in, out, nbytes);
}

static td_status dist_barrier(void *user) {
    td_train_dist *d = user;
    return td_barrier(d->pg);
}

static td_status dist_broadcast(void *user, void *buf, size_t nbytes, int root) {
    td_train_dist *d = user;
    return td_broadcast(d->pg, buf, nbytes, root);
}

static td_status dist_sync_params(void *user) {
    td_train_dist *d = user;
    return td_ddp_broadcast_params(d->ddp);
}

static td_status dist_check_params(void *user, int64_t step) {
    td_train_dist *d = user;
    return td_ddp_check_params(d->ddp, (uint64_t)step);
}

td_status td_train_dist_from_env(td_train_dist **out) {
    *out = NULL;
    td_train_dist *d = td_xcalloc(1, sizeof *d);
    td_status rc;
    TD_CHECK_GOTO(td_pg_init_from_env(&d->pg, &d->store), rc, fail);
    *out = d;
    return TD_OK;
fail:
    free(d);
    return rc;
}

int td_train_dist_rank(const td_train_dist *d) {
    return td_pg_rank(d->pg);
}

int td_train_dist_world_size(const td_train_dist *d) {
    return td_pg_world_size(d->pg);
}

td_status td_train_dist_make_reducer(void *user, td_model_t *model, const td_train_reducer **out) {
    td_train_dist *d = user;
    TD_CHECK(td_ddp_new(d->pg, model, &d->ddp_opts, &d->ddp));
    d->reducer = (td_train_reducer){
        .user = d,
        .begin_backward = dist_begin_backward,
        .layer_ready = dist_layer_ready,
        .wait = dist_wait,
        .allreduce_sum = dist_allreduce_sum,
        .broadcast = dist_broadcast,
        .sync_params = dist_sync_params,
        .check_params = dist_check_params,
        .check_every = d->ddp_opts.check_every > 0 ? d->ddp_opts.check_every : 100,
        .allgather = dist_allgather,
        .barrier = dist_barrier,
    };
    *out = &d->reducer;
    return TD_OK;
}

void td_train_dist_stats(const td_train_dist *d, int *num_buckets, double *comm_s, double *wait_s,
                         uint64_t *steps) {
    td_ddp_stats s = {0};
    if (d->ddp) s = td_ddp_get_stats(d->ddp);
    *num_buckets = s.num_buckets;
    *comm_s = s.comm_s;
    *wait_s = s.wait_s;
    *steps = s.steps;
}

void td_train_dist_free(td_train_dist *d) {
    if (!d) return;
    td_ddp_free(d->ddp);
    td_pg_free(d->pg);
    td_store_close(d->store);
    free(d);
}
