/* The data-parallel reducer: gradient buckets, a comm thread that allreduces each bucket as soon
 * as backward has filled it, and replica checksums. See include/tandem/ddp.h for the journey of
 * a gradient; this file is steps 2-4. */
#include "tandem/ddp.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t offset;               /* first float of the bucket in the grad buffer */
    size_t count;                /* floats */
    int first_layer, last_layer; /* inclusive layer range, forward order */
    int layers_total;            /* parametered layers in the bucket */
    int layers_pending;          /* reset every step */
} bucket;

struct td_ddp {
    td_pg_t *pg;
    td_model_t *model;
    float *grads;
    int num_layers;
    int *layer_bucket; /* layer -> bucket index, -1 for layers without parameters */
    bucket *buckets;
    int num_buckets;
    int check_every;

    /* Buckets are launched strictly in index order (last layers first), the same order on every
     * rank, because collectives must be called in the same order everywhere. */
    int next_to_launch;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int queue[64]; /* bucket indices waiting for the comm thread; ring */
    int queue_head, queue_len;
    int done; /* buckets reduced this step */
    int stopping;
    td_status error; /* first comm error of the step, with its detail copied from the thread */
    char error_msg[1024];
    td_ddp_stats stats;
};

static void *comm_thread_main(void *arg) {
    td_ddp_t *ddp = arg;
    pthread_mutex_lock(&ddp->mu);
    for (;;) {
        while (!ddp->stopping && ddp->queue_len == 0) pthread_cond_wait(&ddp->cv, &ddp->mu);
        if (ddp->stopping) break;
        int b = ddp->queue[ddp->queue_head];
        ddp->queue_head = (ddp->queue_head + 1) % (int)TD_ARRAY_LEN(ddp->queue);
        ddp->queue_len--;
        int skip = ddp->error != TD_OK; /* after a failure, later buckets are not sent */
        pthread_mutex_unlock(&ddp->mu);

        td_status st = TD_OK;
        double t0 = td_now_s();
        if (!skip)
            st = td_allreduce(ddp->pg, ddp->grads + ddp->buckets[b].offset, ddp->buckets[b].count,
                              TD_REDUCE_SUM);
        double dt = td_now_s() - t0;

        pthread_mutex_lock(&ddp->mu);
        ddp->stats.comm_s += dt;
        if (st != TD_OK && ddp->error == TD_OK) {
            ddp->error = st;
            /* The detail lives in this thread's error slot; carry it to the training thread. */
            snprintf(ddp->error_msg, sizeof ddp->error_msg, "gradient bucket %d (%zu floats): %s",
                     b, ddp->buckets[b].count, td_error_msg());
        }
        ddp->done++;
        ddp->stats.buckets_reduced = ddp->done;
        pthread_cond_broadcast(&ddp->cv);
    }
    pthread_mutex_unlock(&ddp->mu);
    return NULL;
}

/* Caller holds mu. Queues every bucket from next_to_launch on whose layers are all ready. */
static void launch_ready_locked(td_ddp_t *ddp, int force) {
    while (ddp->next_to_launch < ddp->num_buckets) {
        bucket *bk = &ddp->buckets[ddp->next_to_launch];
        if (bk->layers_pending > 0 && !force) break;
        int tail = (ddp->queue_head + ddp->queue_len) % (int)TD_ARRAY_LEN(ddp->queue);
        ddp->queue[tail] = ddp->next_to_launch;
        ddp->queue_len++;
        ddp->next_to_launch++;
        pthread_cond_broadcast(&ddp->cv);
    }
}

static void grad_ready_hook(void *user, int layer, size_t param_offset, size_t param_count) {
    (void)param_offset;
    (void)param_count;
    td_ddp_layer_ready(user, layer);
}

void td_ddp_layer_ready(td_ddp_t *ddp, int layer) {
    if (layer < 0 || layer >= ddp->num_layers || ddp->layer_bucket[layer] < 0) return;
    pthread_mutex_lock(&ddp->mu);
    ddp->buckets[ddp->layer_bucket[layer]].layers_pending--;
    launch_ready_locked(ddp, 0);
    pthread_mutex_unlock(&ddp->mu);
}

td_status td_ddp_new(td_pg_t *pg, td_model_t *model, const td_ddp_options *opts, td_ddp_t **out) {
    td_ddp_options o = opts ? *opts : (td_ddp_options){0};
    size_t cap_bytes = o.bucket_bytes ? o.bucket_bytes : (size_t)25 << 20;
    size_t first_cap_bytes = o.first_bucket_bytes ? o.first_bucket_bytes : (size_t)1 << 20;

    td_ddp_t *ddp = td_xcalloc(1, sizeof *ddp);
    ddp->pg = pg;
    ddp->model = model;
    ddp->grads = td_model_grads(model);
    ddp->num_layers = td_model_num_layers(model);
    ddp->check_every = o.check_every > 0 ? o.check_every : 100;
    ddp->layer_bucket = td_xmalloc(sizeof(int) * (size_t)(ddp->num_layers ? ddp->num_layers : 1));
    ddp->buckets = td_xcalloc((size_t)(ddp->num_layers ? ddp->num_layers : 1), sizeof(bucket));

    /* Walk layers last to first (the order backward finishes them) and cut a new bucket when
     * the next layer would overflow the cap. A layer never spans buckets, so a bucket is ready
     * exactly when its layers are. */
    bucket *cur = NULL;
    for (int i = ddp->num_layers - 1; i >= 0; i--) {
        td_layer_info li = td_model_layer(model, i);
        ddp->layer_bucket[i] = -1;
        if (li.param_count == 0) continue;
        /* While bucket 0 is filling, the small cap applies; every later bucket gets the big one. */
        size_t cap = ddp->num_buckets == 1 ? first_cap_bytes : cap_bytes;
        if (!cur || (cur->count + li.param_count) * sizeof(float) > cap) {
            cur = &ddp->buckets[ddp->num_buckets++];
            cur->last_layer = i;
        }
        cur->first_layer = i;
        cur->offset = li.param_offset;
        cur->count += li.param_count;
        cur->layers_total++;
        ddp->layer_bucket[i] = (int)(cur - ddp->buckets);
    }
    ddp->stats.num_buckets = ddp->num_buckets;
    if (ddp->num_buckets > (int)TD_ARRAY_LEN(ddp->queue)) {
        free(ddp->layer_bucket);
        free(ddp->buckets);
        free(ddp);
        return td_error(TD_ERR_UNSUPPORTED,
                        "the model needs more than %d gradient buckets; raise "
                        "the bucket size",
                        (int)TD_ARRAY_LEN(ddp->queue));
    }
    for (int b = 0; b < ddp->num_buckets; b++) ddp->buckets[b].layers_pending = 0;
    ddp->next_to_launch = ddp->num_buckets; /* nothing in flight until begin_backward */
    ddp->done = ddp->num_buckets;

    pthread_mutex_init(&ddp->mu, NULL);
    pthread_cond_init(&ddp->cv, NULL);
    if (pthread_create(&ddp->thread, NULL, comm_thread_main, ddp) != 0) {
        pthread_mutex_destroy(&ddp->mu);
        pthread_cond_destroy(&ddp->cv);
        free(ddp->layer_bucket);
        free(ddp->buckets);
        free(ddp);
        return td_error(TD_ERR_SYS, "could not start the ddp comm thread");
    }
    *out = ddp;
    return TD_OK;
}

void td_ddp_free(td_ddp_t *ddp) {
    if (!ddp) return;
    pthread_mutex_lock(&ddp->mu);
    ddp->stopping = 1;
    pthread_cond_broadcast(&ddp->cv);
    pthread_mutex_unlock(&ddp->mu);
    pthread_join(ddp->thread, NULL);
    pthread_mutex_destroy(&ddp->mu);
    pthread_cond_destroy(&ddp->cv);
    /* The model is not touched: its owner may have freed it already (the trainer frees its
     * model before the process group and reducer go). td_ddp_wait removed the hook. */
    free(ddp->layer_bucket);
    free(ddp->buckets);
    free(ddp);
}

void td_ddp_begin_backward(td_ddp_t *ddp) {
    pthread_mutex_lock(&ddp->mu);
    for (int b = 0; b < ddp->num_buckets; b++)
        ddp->buckets[b].layers_pending = ddp->buckets[b].layers_total;
    ddp->next_to_launch = 0;
    ddp->done = 0;
    ddp->stats.buckets_reduced = 0;
    ddp->error = TD_OK;
    ddp->error_msg[0] = '\0';
    pthread_mutex_unlock(&ddp->mu);
    td_model_set_grad_ready_hook(ddp->model, grad_ready_hook, ddp);
}

td_status td_ddp_wait(td_ddp_t *ddp) {
    double t0 = td_now_s();
    pthread_mutex_lock(&ddp->mu);
    /* Buckets whose layers never reported (a trainer that folds gradients after backward) go
     * now, still in order. */
    launch_ready_locked(ddp, 1);
    while (ddp->done < ddp->num_buckets) pthread_cond_wait(&ddp->cv, &ddp->mu);
    td_status st = ddp->error;
    char msg[sizeof ddp->error_msg];
    memcpy(msg, ddp->error_msg, sizeof msg);
    ddp->stats.wait_s += td_now_s() - t0;
    ddp->stats.steps++;
    pthread_mutex_unlock(&ddp->mu);
    td_model_set_grad_ready_hook(ddp->model, NULL, NULL);
    if (st != TD_OK) return td_error(st, "%s", msg);
    return TD_OK;
}

td_status td_ddp_broadcast_params(td_ddp_t *ddp) {
    size_t nbytes = td_model_num_params(ddp->model) * sizeof(float);
    TD_CHECK(td_broadcast(ddp->pg, td_model_params(ddp->model), nbytes, 0));
    return td_ddp_check_params(ddp, 0);
}

/* The checksum most ranks hold; a tie goes to the value rank 0 holds, then to the lowest rank's.
 * With 2 ranks that makes rank 0 the reference, which is all a pair can say. */
static uint32_t majority_crc(const uint32_t *all, int world, int *holders) {
    uint32_t best = all[0];
    int best_n = 0;
    for (int r = 0; r < world; r++) {
        int n = 0;
        for (int q = 0; q < world; q++) n += all[q] == all[r];
        if (n > best_n) {
            best = all[r];
            best_n = n;
        }
    }
    *holders = best_n;
    return best;
}

td_status td_ddp_check_params(td_ddp_t *ddp, uint64_t step) {
    if (step % (uint64_t)ddp->check_every != 0) return TD_OK;
    int world = td_pg_world_size(ddp->pg);
    uint32_t mine =
        td_crc32(0, td_model_params(ddp->model), td_model_num_params(ddp->model) * sizeof(float));
    uint32_t *all = td_xmalloc(sizeof(uint32_t) * (size_t)world);
    td_status st = td_allgather(ddp->pg, &mine, all, sizeof mine);
    if (st == TD_OK) {
        int holders = 0;
        uint32_t ref = majority_crc(all, world, &holders);
        char bad[512] = "";
        size_t used = 0;
        int nbad = 0;
        for (int r = 0; r < world; r++) {
            if (all[r] == ref) continue;
            nbad++;
            if (used + 40 < sizeof bad)
                used += (size_t)snprintf(bad + used, sizeof bad - used, "%s%d (crc 0x%08x)",
                                         used ? ", " : "", r, all[r]);
        }
        if (nbad)
            st = td_error(TD_ERR_MISMATCH,
                          "replicas drifted at step %llu: rank%s %s differ%s from the parameter "
                          "checksum 0x%08x that %d of %d ranks hold; every rank must start from "
                          "the same weights and apply the same updates (same seed, model and "
                          "optimizer flags on all ranks)",
                          (unsigned long long)step, nbad > 1 ? "s" : "", bad, nbad > 1 ? "" : "s",
                          ref, holders, world);
    }
    free(all);
    return st;
}

td_ddp_stats td_ddp_get_stats(const td_ddp_t *ddp) {
    /* The comm thread updates the counters under mu; a snapshot must not tear. */
    pthread_mutex_t *mu = (pthread_mutex_t *)&ddp->mu;
    pthread_mutex_lock(mu);
    td_ddp_stats s = ddp->stats;
    pthread_mutex_unlock(mu);
    return s;
}
