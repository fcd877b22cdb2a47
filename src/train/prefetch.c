/* One gathering thread and one job slot: the trainer asks for the next micro-batch as soon as
 * it has taken the current one, so one slot is all the overlap there is to have. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "train/prefetch.h"

struct prefetcher {
    const td_dataset_t *ds;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit;
    int64_t tag; /* the job's micro-batch; -1: none */
    bool pending, done;
    int n, nhint;
    float *x, *t;
    int32_t *y;
    uint64_t *ids, *hint;
    td_status rc;
    char err[1024];
};

static void *run(void *arg) {
    prefetcher *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && !p->pending) pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit) break;
        p->pending = false;
        pthread_mutex_unlock(&p->mu);
        td_status rc = td_dataset_gather(p->ds, p->ids, p->n, p->x, p->y, p->t);
        td_dataset_will_need(p->ds, p->hint, p->nhint);
        pthread_mutex_lock(&p->mu);
        p->rc = rc;
        if (rc != TD_OK) snprintf(p->err, sizeof p->err, "%s", td_error_msg());
        p->done = true;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

prefetcher *prefetch_new(const td_dataset_t *ds, int max_batch, int sample_size, int target_dim) {
    prefetcher *p = td_xcalloc(1, sizeof *p);
    p->ds = ds;
    p->tag = -1;
    p->x = td_xmalloc_aligned((size_t)max_batch * (size_t)sample_size * sizeof(float));
    p->t =
        td_xmalloc((size_t)max_batch * (size_t)(target_dim > 0 ? target_dim : 1) * sizeof(float));
    p->y = td_xmalloc((size_t)max_batch * sizeof(int32_t));
    p->ids = td_xmalloc((size_t)max_batch * sizeof(uint64_t));
    p->hint = td_xmalloc((size_t)max_batch * sizeof(uint64_t));
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->thread, NULL, run, p) != 0) {
        TD_LOG_WARN("batch prefetch: cannot start its thread; batches are read in the step");
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p->x), free(p->t), free(p->y), free(p->ids), free(p->hint), free(p);
        return NULL;
    }
    return p;
}

/* Waits for the running job, if any (the lock is held). */
static void wait_job(prefetcher *p) {
    while (p->tag >= 0 && !p->done) pthread_cond_wait(&p->cv, &p->mu);
}

void prefetch_start(prefetcher *p, int64_t tag, const uint64_t *ids, int n, const uint64_t *hint,
                    int nhint) {
    pthread_mutex_lock(&p->mu);
    wait_job(p);
    memcpy(p->ids, ids, (size_t)n * sizeof *ids);
    memcpy(p->hint, hint, (size_t)nhint * sizeof *hint);
    p->n = n;
    p->nhint = nhint;
    p->tag = tag;
    p->done = false;
    p->pending = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

bool prefetch_take(prefetcher *p, int64_t tag, float **x, int32_t **y, float **t, uint64_t **ids,
                   td_status *rc) {
    pthread_mutex_lock(&p->mu);
    if (p->tag != tag) {
        pthread_mutex_unlock(&p->mu);
        return false;
    }
    wait_job(p);
    float *tx = *x, *tt = *t;
    int32_t *ty = *y;
    uint64_t *tids = *ids;
    *x = p->x, *y = p->y, *t = p->t, *ids = p->ids;
    p->x = tx, p->y = ty, p->t = tt, p->ids = tids;
    *rc = p->rc;
    if (p->rc != TD_OK) td_error(p->rc, "%s", p->err);
    p->tag = -1;
    pthread_mutex_unlock(&p->mu);
    return true;
}

void prefetch_free(prefetcher *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    wait_job(p);
    p->quit = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->x), free(p->t), free(p->y), free(p->ids), free(p->hint);
    free(p);
}
