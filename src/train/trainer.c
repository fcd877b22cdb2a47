/* The trainer loop: global batches over the sampler's permutation, micro-batch accumulation in
 * a fixed pairwise tree, the reducer hook, the optimizer, evaluation, progress, checkpoints and
 * the stop signal. See train.h and docs/training.md for the contracts. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tandem/data.h"
#include "tandem/tensor.h"
#include "tandem/train.h"
#include "tandem/ckpt.h"
#include "tandem/os.h"
#include "train/prefetch.h"

#define CKPT_KEEP         2
#define EVAL_BATCH        128
#define PROGRESS_REDRAW_S 0.1
/* Steps of a process that samples_per_s_steady leaves out: the first steps pay one-time costs
 * (on a GPU: library loading, graph capture; on a CPU: page faults), as a peer's warm-up does. */
#define WARM_STEPS 10

/* ---- signals: the handler only records; the loop decides ---- */
static volatile sig_atomic_t stop_signal;
static struct timespec stop_signal_at; /* when the first arrived (CLOCK_MONOTONIC) */

/* A second signal means "now", unless it comes within a second of the first: one stop request
 * often arrives twice in a burst (a launcher signalling the worker's process group and the
 * worker, wrappers such as timeout(1) and srun), and the checkpoint it asked for must be
 * written. The launcher's agent applies the same rule (launch.c on_signal). */
static void on_stop_signal(int sig) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now); /* async-signal-safe */
    if (stop_signal) {
        double since = (double)(now.tv_sec - stop_signal_at.tv_sec) +
                       1e-9 * (double)(now.tv_nsec - stop_signal_at.tv_nsec);
        if (since < 1.0) return;
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_signal_at = now;
    stop_signal = sig;
}

void td_train_install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGTERM); /* one handler at a time: the burst check reads its time */
    sigaddset(&sa.sa_mask, SIGINT);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int td_train_stop_signal(void) {
    return stop_signal;
}

void td_train_config_defaults(td_train_config *c) {
    memset(c, 0, sizeof *c);
    c->model = "basicnet";
    c->data_dir = "/usr/share/datasets/fashion-mnist";
    c->loss = TD_LOSS_CROSS_ENTROPY;
    c->epochs = 1;
    c->batch = 64;
    c->accum = 1;
    c->optim = td_optim_defaults(TD_OPTIM_ADAMW);
    c->eval_every_epoch = true;
    c->world_size = 1;
    c->progress = -1;
    c->gpu_device = -1;
}

/* ---- the trainer's state ---- */
typedef struct {
    const td_train_config *cfg;
    const td_train_reducer *reducer;
    td_model_t *model;
    td_optim_t *opt;
    td_dataset_t *train, *test; /* test: the held-out set, or NULL (no evaluation) */
    td_sampler_t *sampler;
    size_t num_params;
    int in_size, outputs;        /* outputs: classes, or target values per sample */
    bool log_softmax_out;        /* the model ends in log_softmax: NLL loss; else cross-entropy */
    bool has_acc;                /* classification or multi-label: an accuracy to report */
    float *norm_mean, *norm_std; /* [channels]: the normalisation trained with */
    bool norm_restored;          /* a resume took the checkpoint's: apply it everywhere */
    /* BatchNorm: each micro-batch slot's statistics, {count, stats[S]} per slot; a step's slots
     * of every rank are gathered and applied in slot order, so the running statistics are the
     * same for any number of ranks (nn.h, td_model_update_running_stats) */
    size_t bn_size;
    float *bn_local, *bn_all;
    int64_t G; /* global batch */
    int64_t steps_per_epoch, total_steps, epochs;
    /* accumulation: level k holds the sum of one complete block of 2^k micro-batches */
    int nlevels;
    float **level;
    bool *occupied;
    bool *layer_done;
    /* batch buffers */
    float *x, *dout, *tgt; /* tgt: real targets [max_batch, outputs] (mse, bce) */
    prefetcher *pf;        /* a file-backed training set: the next micro-batch is read ahead */
    uint64_t *pf_ids;
    int32_t *y;
    uint64_t *ids;
    /* progress */
    bool bar;
    double t_start, t_last_draw;
    int64_t log_every;
    int64_t start_step;
    int64_t step;         /* optimizer steps done */
    int64_t samples_done; /* global samples trained in this process */
    double train_s;       /* seconds inside training steps (evaluation and checkpoints excluded) */
    double warm_s;        /* train_s and samples_done after this process's first WARM_STEPS */
    int64_t warm_samples;
    /* --profile, from the step after the warm-up on: seconds of the phases outside the model */
    bool prof_on;
    double prof_data_s, prof_loss_s, prof_wait_s, prof_optim_s, prof_t0;
    int64_t prof_step0;
    int64_t ckpt_steps[2]; /* the steps of the last two checkpoints written (-1: none) */
    /* --device cuda: the engine, the epoch whose order it holds, steps enqueued so far */
    td_gpu_t *gpu;
    int64_t gpu_epoch;
    int64_t gpu_launched;
    bool gpu_ipc; /* ranks reduce on the device through CUDA IPC, not through the host */
} trainer;

/* grads[off..off+count) = level[k] + grads, for the occupied levels from the lowest up. Together
 * with push() this sums the M micro-batch gradients in the pairwise tree of docs/training.md. */
static void fold_range(trainer *t, size_t off, size_t count) {
    float *restrict g = td_model_grads(t->model);
    for (int k = 0; k < t->nlevels; k++) {
        if (!t->occupied[k]) continue;
        const float *restrict lv = t->level[k];
        for (size_t i = off; i < off + count; i++) g[i] = lv[i] + g[i];
    }
}

/* A finished (not last) micro-batch's gradient enters the binary-counter stack: it merges with
 * equal-sized complete blocks (left + right) as a carry propagates in binary addition. */
static void push(trainer *t) {
    float *restrict g = td_model_grads(t->model);
    int k = 0;
    while (t->occupied[k]) {
        const float *restrict lv = t->level[k];
        for (size_t i = 0; i < t->num_params; i++) g[i] = lv[i] + g[i];
        t->occupied[k] = false;
        k++;
    }
    memcpy(t->level[k], g, t->num_params * sizeof(float));
    t->occupied[k] = true;
}

static void on_grad_ready(void *user, int layer, size_t off, size_t count) {
    trainer *t = user;
    if (t->layer_done[layer]) return;
    fold_range(t, off, count);
    t->layer_done[layer] = true;
    const td_train_reducer *r = t->reducer;
    if (r) r->layer_ready(r->user, layer);
}

/* Layers whose hook did not run (an empty last micro-batch has no backward) are folded and
 * reported here, last layer first like a backward would. */
static void finish_layers(trainer *t) {
    for (int i = td_model_num_layers(t->model) - 1; i >= 0; i--) {
        td_layer_info li = td_model_layer(t->model, i);
        if (li.param_count) on_grad_ready(t, i, li.param_offset, li.param_count);
    }
}

const char *td_loss_name(td_loss_kind k) {
    switch (k) {
    case TD_LOSS_CROSS_ENTROPY:
        return "cross-entropy";
    case TD_LOSS_MSE:
        return "mse";
    case TD_LOSS_BCE:
        return "bce";
    }
    return "?";
}

td_status td_loss_parse(const char *s, td_loss_kind *out) {
    for (int k = TD_LOSS_CROSS_ENTROPY; k <= TD_LOSS_BCE; k++)
        if (!strcmp(s, td_loss_name((td_loss_kind)k))) {
            *out = (td_loss_kind)k;
            return TD_OK;
        }
    return td_error(TD_ERR_INVALID,
                    "--loss '%s': use cross-entropy (class indices), mse (real values) or bce "
                    "(0/1 labels)",
                    s);
}

static double loss_and_grad(trainer *t, const float *out, int n, float scale) {
    switch (t->cfg->loss) {
    case TD_LOSS_MSE:
        return td_mse_loss(out, t->tgt, n, t->outputs, scale, t->dout);
    case TD_LOSS_BCE:
        return td_bce_with_logits(out, t->tgt, n, t->outputs, scale, t->dout);
    case TD_LOSS_CROSS_ENTROPY:
        break;
    }
    if (t->log_softmax_out) return td_nll_loss(out, t->y, n, t->outputs, scale, t->dout);
    return td_cross_entropy(out, t->y, n, t->outputs, scale, t->dout);
}

/* Correct predictions: rows whose argmax is the class, or the fraction of right labels summed
 * over rows (bce); regression has none. */
static double count_correct(trainer *t, const float *out, int n) {
    switch (t->cfg->loss) {
    case TD_LOSS_MSE:
        return 0;
    case TD_LOSS_BCE:
        return td_count_correct_multilabel(out, t->tgt, n, t->outputs);
    case TD_LOSS_CROSS_ENTROPY:
        break;
    }
    return td_count_correct(out, t->y, n, t->outputs);
}

static void emit(trainer *t, const char *key, int64_t step, double value) {
    const td_train_callbacks *cb = &t->cfg->callbacks;
    if (cb->metric) cb->metric(cb->user, key, step, value);
}

static td_status evaluate_model(trainer *t, int64_t step, double *acc_pct, double *loss) {
    const td_train_config *cfg = t->cfg;
    const td_train_reducer *r = t->reducer;
    *acc_pct = *loss = NAN;
    if (!t->test) return TD_OK; /* no held-out set: nothing to evaluate on */
    uint64_t n = td_dataset_count(t->test);
    uint64_t lo = 0, hi = n;
    bool shard = r && r->allreduce_sum && cfg->world_size > 1;
    if (shard) {
        lo = n * (uint64_t)cfg->rank / (uint64_t)cfg->world_size;
        hi = n * (uint64_t)(cfg->rank + 1) / (uint64_t)cfg->world_size;
    }
    int max_batch = TD_MAX(cfg->batch, EVAL_BATCH);
    double sums[3] = {0, 0, 0}; /* correct, loss, count */
    if (t->gpu && t->bn_size) TD_CHECK(td_gpu_upload_buffers(t->gpu));
    if (t->gpu) TD_CHECK(td_gpu_evaluate(t->gpu, lo, hi, sums));
    td_forward_ctx ctx = {.training = false, .seed = cfg->seed, .step = (uint64_t)step};
    for (uint64_t b = lo; b < hi && !t->gpu; b += (uint64_t)max_batch) {
        int cnt = (int)TD_MIN((uint64_t)max_batch, hi - b);
        for (int i = 0; i < cnt; i++) t->ids[i] = b + (uint64_t)i;
        TD_CHECK(td_dataset_gather(t->test, t->ids, cnt, t->x, t->y, t->tgt));
        ctx.sample_ids = t->ids;
        const float *out = td_model_forward(t->model, t->x, cnt, &ctx);
        if (!out) return TD_ERR_INVALID;
        sums[0] += count_correct(t, out, cnt);
        sums[1] += loss_and_grad(t, out, cnt, 0.0f);
        sums[2] += cnt;
    }
    if (shard) TD_CHECK(r->allreduce_sum(r->user, sums, 3));
    *acc_pct = sums[2] > 0 && t->has_acc ? 100.0 * sums[0] / sums[2] : NAN;
    *loss = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    if (t->has_acc) emit(t, "test/acc", step, *acc_pct);
    emit(t, "test/loss", step, *loss);
    return TD_OK;
}

/* An evaluation's forwards are no training step's: --profile's layer timers pause for them. */
static td_status evaluate(trainer *t, int64_t step, double *acc_pct, double *loss) {
    if (t->prof_on) td_model_set_profiling(t->model, false);
    td_status st = evaluate_model(t, step, acc_pct, loss);
    if (t->prof_on) td_model_set_profiling(t->model, true);
    return st;
}

static td_status save_checkpoint(trainer *t, int64_t step) {
    const td_train_config *cfg = t->cfg;
    if (!cfg->checkpoint_dir || cfg->rank != 0) return TD_OK;
    if (t->gpu)
        TD_CHECK(td_gpu_download_state(t->gpu, td_model_params(t->model), td_optim_state(t->opt)));
    td_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    snprintf(ck.model, sizeof ck.model, "%s", cfg->model);
    ck.num_params = t->num_params;
    ck.batch = cfg->batch;
    ck.accum = cfg->accum;
    ck.world_size = cfg->world_size;
    ck.optim = *td_optim_get_config(t->opt);
    ck.seed = cfg->seed;
    ck.step = step;
    ck.epoch = step / t->steps_per_epoch;
    ck.step_in_epoch = step % t->steps_per_epoch;
    ck.optim_steps = td_optim_step_count(t->opt);
    ck.params = td_model_params(t->model);
    ck.optim_state = td_optim_state(t->opt);
    ck.optim_state_count = td_optim_state_count(t->opt);
    ck.buffers = td_model_buffers(t->model);
    ck.buffer_count = td_model_num_buffers(t->model);
    ck.batches_tracked = td_model_batches_tracked(t->model);
    ck.norm_count = td_dataset_channels(t->train);
    ck.norm_mean = t->norm_mean;
    ck.norm_std = t->norm_std;
    TD_CHECK(td_checkpoint_save(cfg->checkpoint_dir, &ck, CKPT_KEEP));
    t->ckpt_steps[1] = t->ckpt_steps[0];
    t->ckpt_steps[0] = step;
    char ckname[64];
    td_ckpt_build(TD_CKPT_TDCK, step, ckname, sizeof ckname);
    TD_LOG_DEBUG("checkpoint written: %s/%s", cfg->checkpoint_dir, ckname);
    return TD_OK;
}

static bool same_real(double a, double b) {
    return a == b || (isnan(a) && isnan(b));
}

/* A resume continues bit for bit only with the same arithmetic: same model, batch split,
 * world size, optimizer and seed. */
static td_status check_resume(trainer *t, const char *path, const td_checkpoint *ck) {
    const td_train_config *cfg = t->cfg;
    const td_optim_config *o = &cfg->optim;
    const char *fix = "resume with the same settings, or use another --checkpoint-dir";
#define MISMATCH(fmt, ...)                                                                         \
    td_error(TD_ERR_MISMATCH, "checkpoint %s was written with " fmt "; %s", path, __VA_ARGS__, fix)
    if (strcmp(ck->model, cfg->model))
        return MISMATCH("--model %s but this run has --model %s", ck->model, cfg->model);
    if (ck->num_params != t->num_params)
        return MISMATCH("%llu parameters but this model has %zu",
                        (unsigned long long)ck->num_params, t->num_params);
    if (ck->batch != cfg->batch)
        return MISMATCH("--batch %lld but this run has --batch %d", (long long)ck->batch,
                        cfg->batch);
    if (ck->accum != cfg->accum)
        return MISMATCH("--accum %lld but this run has --accum %d", (long long)ck->accum,
                        cfg->accum);
    if (ck->world_size != cfg->world_size)
        return MISMATCH("world size %lld but this run has world size %d", (long long)ck->world_size,
                        cfg->world_size);
    if (ck->seed != cfg->seed)
        return MISMATCH("--seed %llu but this run has --seed %llu", (unsigned long long)ck->seed,
                        (unsigned long long)cfg->seed);
    if (ck->optim.kind != o->kind)
        return MISMATCH("--optimizer %s but this run has --optimizer %s",
                        td_optim_kind_name(ck->optim.kind), td_optim_kind_name(o->kind));
    if (!same_real(ck->optim.lr, o->lr) || !same_real(ck->optim.weight_decay, o->weight_decay) ||
        !same_real(ck->optim.momentum, o->momentum) ||
        !same_real(ck->optim.dampening, o->dampening) || ck->optim.nesterov != o->nesterov ||
        !same_real(ck->optim.beta1, o->beta1) || !same_real(ck->optim.beta2, o->beta2) ||
        !same_real(ck->optim.eps, o->eps))
        return MISMATCH("optimizer hyperparameters lr %g, weight decay %g, momentum %g but this "
                        "run has lr %g, weight decay %g, momentum %g",
                        ck->optim.lr, ck->optim.weight_decay, ck->optim.momentum, o->lr,
                        o->weight_decay, o->momentum);
    if (ck->buffer_count != td_model_num_buffers(t->model))
        return MISMATCH("%llu BatchNorm statistics but this model has %zu",
                        (unsigned long long)ck->buffer_count, td_model_num_buffers(t->model));
    if (ck->norm_count && ck->norm_count != td_dataset_channels(t->train))
        return MISMATCH("a normalisation of %d channels but this data has %d", ck->norm_count,
                        td_dataset_channels(t->train));
    if (ck->optim_state_count != td_optim_state_count(t->opt))
        return MISMATCH("%llu optimizer state floats but this optimizer has %zu",
                        (unsigned long long)ck->optim_state_count, td_optim_state_count(t->opt));
    if (ck->step != ck->epoch * t->steps_per_epoch + ck->step_in_epoch)
        return MISMATCH("step %lld = epoch %lld + %lld steps, which does not fit %lld steps per "
                        "epoch",
                        (long long)ck->step, (long long)ck->epoch, (long long)ck->step_in_epoch,
                        (long long)t->steps_per_epoch);
#undef MISMATCH
    return TD_OK;
}

static void fmt_duration(char *buf, size_t cap, double s) {
    if (!isfinite(s) || s < 0) s = 0;
    long v = (long)(s + 0.5);
    if (v >= 3600)
        snprintf(buf, cap, "%ld:%02ld:%02ld", v / 3600, v / 60 % 60, v % 60);
    else
        snprintf(buf, cap, "%ld:%02ld", v / 60, v % 60);
}

static void report_progress(trainer *t, int64_t step, double loss, double acc, bool force) {
    const td_train_config *cfg = t->cfg;
    if (cfg->rank != 0) return;
    double now = td_now_s();
    double elapsed = t->train_s;
    double rate = elapsed > 0 ? (double)t->samples_done / elapsed : 0;
    int64_t done = step - t->start_step;
    double eta = done > 0 ? elapsed / (double)done * (double)(t->total_steps - step) : 0;
    char eta_s[32];
    fmt_duration(eta_s, sizeof eta_s, eta);
    int64_t epoch = (step - 1) / t->steps_per_epoch + 1;
    char accs[32] = "", bar_accs[32] = ""; /* regression has no accuracy */
    if (t->has_acc) snprintf(accs, sizeof accs, " acc %.1f%%", 100.0 * acc);
    if (t->has_acc) snprintf(bar_accs, sizeof bar_accs, " | acc %5.1f%%", 100.0 * acc);
    if (t->bar) {
        if (!force && now - t->t_last_draw < PROGRESS_REDRAW_S) return;
        t->t_last_draw = now;
        int width = 24;
        int filled = (int)((double)width * (double)step / (double)t->total_steps);
        char barbuf[64];
        for (int i = 0; i < width; i++) barbuf[i] = i < filled ? '#' : '.';
        barbuf[width] = '\0';
        fprintf(stderr,
                "\r[%s] step %lld/%lld | epoch %lld/%lld | loss %.4f%s | %.0f samples/s | "
                "ETA %s\033[K",
                barbuf, (long long)step, (long long)t->total_steps, (long long)epoch,
                (long long)t->epochs, loss, bar_accs, rate, eta_s);
        fflush(stderr);
    } else if (force || step % t->log_every == 0) {
        TD_LOG_INFO("step %lld/%lld epoch %lld/%lld loss %.4f%s %.0f samples/s ETA %s",
                    (long long)step, (long long)t->total_steps, (long long)epoch,
                    (long long)t->epochs, loss, accs, rate, eta_s);
    }
}

/* Ends the bar's line so the next message starts on its own. */
static void bar_newline(trainer *t) {
    if (t->bar && t->cfg->rank == 0) fputc('\n', stderr);
}

/* The loss of step `step` (1-based) is not finite: its forward ran on the parameters after step
 * step-1, so the last checkpoint that can be trusted is one from before that. */
static td_status diverged(trainer *t, int64_t step, double loss) {
    const td_train_config *cfg = t->cfg;
    int64_t good = -1;
    for (int i = 0; i < 2; i++)
        if (t->ckpt_steps[i] >= 0 && t->ckpt_steps[i] < step - 1) {
            good = t->ckpt_steps[i];
            break;
        }
    char where[4200] = "none (no --checkpoint-dir, or none written early enough)";
    char ckname[64];
    if (good >= 0 && td_ckpt_build(TD_CKPT_TDCK, good, ckname, sizeof ckname))
        snprintf(where, sizeof where, "%s/%s", cfg->checkpoint_dir, ckname);
    else if (t->start_step > 0 && t->start_step < step - 1)
        snprintf(where, sizeof where, "the one this run resumed from (step %lld)",
                 (long long)t->start_step);
    bar_newline(t);
    return td_error(TD_ERR_DIVERGED,
                    "the loss is not finite (%g) at step %lld: training diverged (learning rate "
                    "%g too high?) and was stopped; the last good checkpoint %s; nothing was saved "
                    "with --save",
                    loss, (long long)step, cfg->optim.lr, where);
}

static td_status validate(const td_train_config *c) {
    if (c->batch < 1) return td_error(TD_ERR_INVALID, "--batch %d: must be at least 1", c->batch);
    if (c->accum < 1) return td_error(TD_ERR_INVALID, "--accum %d: must be at least 1", c->accum);
    if (c->epochs < 0 || c->steps < 0)
        return td_error(TD_ERR_INVALID, "--epochs %lld / --steps %lld: must not be negative",
                        (long long)c->epochs, (long long)c->steps);
    if (c->checkpoint_every < 0)
        return td_error(TD_ERR_INVALID, "--checkpoint-every %lld: must not be negative",
                        (long long)c->checkpoint_every);
    if (c->world_size < 1 || c->rank < 0 || c->rank >= c->world_size)
        return td_error(TD_ERR_INVALID, "rank %d / world size %d: need 0 <= rank < world size",
                        c->rank, c->world_size);
    if (c->world_size > 1 && !c->reducer && !c->make_reducer)
        return td_error(TD_ERR_INVALID,
                        "world size %d needs a gradient reducer (ddp); this "
                        "trainer was given none",
                        c->world_size);
    if (c->resume && !c->checkpoint_dir)
        return td_error(TD_ERR_INVALID, "--resume needs --checkpoint-dir");
    if (c->precision != TD_PRECISION_FP32 && c->device != TD_DEVICE_CUDA)
        return td_error(TD_ERR_INVALID,
                        "--precision %s is for --device cuda: the CPU engine trains in fp32",
                        td_precision_name(c->precision));
    TD_CHECK(td_optim_validate(&c->optim));
    return TD_OK;
}

/* ---- --device cuda: the step runs on the engine of gpu.h ---- */

/* Between the ranks of one host (the launcher's LOCAL_WORLD_SIZE is the world size) the ranks
 * reduce on the device through CUDA IPC, unless TANDEM_GPU_REDUCE=host; where any rank cannot
 * open the others' buffers, all of them stay on the host path, with a warning. Collective: every
 * rank takes the same branch. */
static td_status gpu_ipc_setup(trainer *t) {
    const td_train_config *cfg = t->cfg;
    const td_train_reducer *r = t->reducer;
    const char *mode = td_env_str(TD_ENV_GPU_REDUCE);
    if (!r || cfg->world_size < 2 || !r->allgather || !r->barrier || !r->allreduce_sum)
        return TD_OK;
    if (strcmp(mode, "auto") && strcmp(mode, "ipc") && strcmp(mode, "host"))
        return td_error(TD_ERR_INVALID, "TANDEM_GPU_REDUCE='%s': use auto, ipc or host", mode);
    const char *lws = td_var_get(TD_VAR_LOCAL_WORLD_SIZE);
    bool one_host = lws && atoi(lws) == cfg->world_size;
    if (!strcmp(mode, "host") || (!strcmp(mode, "auto") && !one_host)) return TD_OK;
    if (!one_host)
        return td_error(TD_ERR_INVALID,
                        "TANDEM_GPU_REDUCE=ipc needs every rank on this host (LOCAL_WORLD_SIZE=%s, "
                        "WORLD_SIZE=%d); use auto or host",
                        lws ? lws : "unset", cfg->world_size);
    size_t hb = TD_GPU_IPC_HANDLE_BYTES;
    unsigned char mine[TD_GPU_IPC_HANDLE_BYTES];
    unsigned char *all = td_xmalloc(hb * (size_t)cfg->world_size);
    td_status st = td_gpu_ipc_export(t->gpu, mine);
    double ok = st == TD_OK;
    if (st != TD_OK) memset(mine, 0, hb);
    td_status rc = r->allgather(r->user, mine, all, hb);
    if (rc == TD_OK && ok) {
        st = td_gpu_ipc_open(t->gpu, cfg->world_size, cfg->rank, all);
        ok = st == TD_OK;
    }
    free(all);
    if (rc != TD_OK) return rc;
    char why[512];
    snprintf(why, sizeof why, "%s", ok ? "" : td_error_msg());
    TD_CHECK(r->allreduce_sum(r->user, &ok, 1));
    t->gpu_ipc = ok == cfg->world_size;
    if (!t->gpu_ipc && why[0]) TD_LOG_WARN("gradients go through the host: %s", why);
    if (t->gpu_ipc && cfg->rank == 0)
        TD_LOG_INFO("%d ranks reduce gradients on the device through CUDA IPC", cfg->world_size);
    return TD_OK;
}
/* A streamed set's samples, as the engine asks for them (td_gpu_fill_fn). */
static td_status gpu_fill(void *user, const uint64_t *ids, int n, void *values, int32_t *labels,
                          float *targets) {
    return td_dataset_pack_ids(user, ids, n, values, labels, targets);
}

/* The training and test sets to the device with their normalisation (again after a resume
 * restores another one), packed in sample order so a split or a file-backed set goes too. Each
 * goes whole (resident) where it fits in the free memory with room to spare (a tenth, and at
 * least 1 GiB, for what cuBLAS and the graphs allocate later), else it streams: the engine asks
 * td_dataset_pack_ids for each step's samples (TANDEM_GPU_DATA). */
static td_status gpu_upload_data(trainer *t) {
    const char *mode = td_env_str(TD_ENV_GPU_DATA);
    if (strcmp(mode, "auto") && strcmp(mode, "resident") && strcmp(mode, "stream"))
        return td_error(TD_ERR_INVALID, "TANDEM_GPU_DATA=%s: use auto, resident or stream", mode);
    td_dataset_t *sets[2] = {t->train, t->test};
    for (int i = 0; i < 2 && sets[i]; i++) {
        td_dataset_t *ds = sets[i];
        int C = td_dataset_channels(ds), tdim = td_dataset_target_dim(ds);
        uint64_t count = td_dataset_count(ds);
        size_t bytes = count * (td_dataset_packed_bytes(ds) + (tdim ? (size_t)tdim * 4 : 4));
        size_t free_b = td_gpu_free_memory(t->gpu), spare = TD_MAX(free_b / 10, (size_t)1 << 30);
        bool stream = !strcmp(mode, "stream") ||
                      (!strcmp(mode, "auto") && bytes + spare > free_b);
        float *lut = td_xmalloc((size_t)C * 256 * sizeof(float));
        td_dataset_lut(ds, lut);
        td_gpu_dataset d = {.u8 = td_dataset_dtype(ds) == TD_DTYPE_U8, .target_dim = tdim,
                            .count = count, .sample_size = td_dataset_sample_size(ds),
                            .channels = C, .lut = lut, .mean = td_dataset_mean(ds),
                            .std = td_dataset_std(ds)};
        void *values = NULL;
        int32_t *labels = NULL;
        float *targets = NULL;
        td_status rc = TD_OK;
        if (stream) {
            d.fill = gpu_fill, d.fill_user = ds;
            TD_LOG_INFO("the %s set streams to the device a step at a time (%zu MiB; %zu MiB "
                        "free there%s)",
                        i ? "held-out" : "training", bytes >> 20, free_b >> 20,
                        strcmp(mode, "stream") ? "" : "; TANDEM_GPU_DATA=stream");
        } else {
            rc = td_dataset_pack(ds, &values, &d.u8, &labels, &targets);
            d.values = values, d.labels = labels, d.targets = targets;
        }
        if (rc == TD_OK) rc = td_gpu_set_dataset(t->gpu, i, &d);
        free(values), free(labels), free(targets), free(lut);
        TD_CHECK(rc);
    }
    return TD_OK;
}

static td_status gpu_setup(trainer *t, int max_batch) {
    const td_train_config *cfg = t->cfg;
    td_gpu_config gc = {
        .device = cfg->gpu_device,
        .batch = cfg->batch,
        .accum = cfg->accum,
        .rank = cfg->rank,
        .world_size = cfg->world_size,
        .max_eval_batch = max_batch,
        .seed = cfg->seed,
        .graph = !cfg->gpu_no_graph && td_env_int(TD_ENV_CUDA_GRAPH) != 0,
        .precision = cfg->precision,
        .loss = cfg->loss,
    };
    TD_CHECK(td_gpu_new(t->model, &cfg->optim, &gc, &t->gpu));
    TD_CHECK(gpu_upload_data(t));
    t->gpu_epoch = -1;
    return gpu_ipc_setup(t);
}

static td_status gpu_launch(trainer *t, int64_t step) {
    int64_t epoch = step / t->steps_per_epoch, s = step % t->steps_per_epoch;
    if (epoch != t->gpu_epoch) {
        const uint64_t *perm = td_sampler_epoch(t->sampler, (uint64_t)epoch);
        TD_CHECK(td_gpu_set_epoch(t->gpu, perm, td_sampler_count(t->sampler)));
        t->gpu_epoch = epoch;
    }
    int64_t N = (int64_t)td_sampler_count(t->sampler), base = s * t->G;
    int64_t n = TD_MIN(t->G, N - base);
    td_gpu_step_args a = {.step = step, .base = base, .n = n, .scale = 1.0f / (float)n};
    TD_LOG_DEBUG("step %lld: global batch positions %lld..%lld of epoch %lld, rank %d of %d",
                 (long long)step, (long long)base, (long long)(base + n - 1), (long long)epoch,
                 t->cfg->rank, t->cfg->world_size);
    TD_CHECK(td_gpu_step(t->gpu, &a, t->reducer == NULL));
    t->gpu_launched = step + 1;
    return TD_OK;
}

/* Whether step `next` may be enqueued before the statistics of step next-1 are read: only when
 * nothing between the two reads the parameters (an evaluation or a checkpoint after next-1),
 * no stop was asked for, and one process owns the optimizer. It keeps the device busy while the
 * host logs the previous step. */
static bool gpu_may_run_ahead(const trainer *t, int64_t next) {
    const td_train_config *cfg = t->cfg;
    if (t->reducer || next >= t->total_steps || td_train_stop_signal()) return false;
    if (next % t->steps_per_epoch == 0) return false;
    if (cfg->checkpoint_every > 0 && next % cfg->checkpoint_every == 0) return false;
    return true;
}

/* A debug line per step that tells where two runs' gradients part: FNV-1a of the bytes. */
static void grads_digest(trainer *t, int64_t step, const char *what) {
    const unsigned char *b = (const unsigned char *)td_model_grads(t->model);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < t->num_params * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    TD_LOG_DEBUG("step %lld: %s digest %016llx", (long long)step, what, (unsigned long long)h);
}

static td_status update_running_stats(trainer *t);
static int micro_batch_count(const trainer *t, int64_t step, int j);
static void bn_slot_set(trainer *t, int j, int cnt, const float *stats);

/* BatchNorm on the device: its slots' statistics come back with the step's, into bn_local's
 * slots, and the running statistics follow them on the host as the CPU's do
 * (update_running_stats), every rank alike; they go to the device before an evaluation. */
static td_status gpu_running_stats(trainer *t, int64_t step) {
    TD_CHECK(td_gpu_step_bn_stats(t->gpu, step, t->bn_local + 1, t->bn_size + 1));
    for (int j = 0; j < t->cfg->accum; j++) bn_slot_set(t, j, micro_batch_count(t, step, j), NULL);
    return update_running_stats(t);
}

/* One step on the device. Between ranks the rank's gradient comes to the host, the ddp reducer
 * sums it over the transports (the fixed tree), and the sum goes back for the update. */
static td_status train_step_gpu(trainer *t, int64_t step, double sums[4]) {
    const td_train_reducer *r = t->reducer;
    if (t->gpu_launched <= step) TD_CHECK(gpu_launch(t, step));
    if (t->gpu_launched == step + 1 && gpu_may_run_ahead(t, step + 1))
        TD_CHECK(gpu_launch(t, step + 1));
    bool ahead = t->gpu_launched > step + 1;
    TD_CHECK(td_gpu_step_stats(t->gpu, step, sums));
    /* a stop lands after the last enqueued step, so the checkpoint holds what was trained */
    sums[3] = !ahead && td_train_stop_signal() ? 1 : 0;
    if (r && t->gpu_ipc) {
        /* the sums' allreduce doubles as the barrier "every rank's gradient is final"; the
         * barrier after the tree sum keeps every buffer until all ranks have read it */
        if (r->allreduce_sum) TD_CHECK(r->allreduce_sum(r->user, sums, 4));
        TD_CHECK(td_gpu_ipc_reduce(t->gpu));
        TD_CHECK(r->barrier(r->user));
        TD_CHECK(td_gpu_ipc_apply(t->gpu));
    } else if (r) {
        TD_CHECK(td_gpu_grads_to_host(t->gpu));
        if (td_log_enabled(TD_LOG_DEBUG)) grads_digest(t, step, "this rank's gradient");
        if (r->begin_backward) r->begin_backward(r->user);
        for (int i = td_model_num_layers(t->model) - 1; i >= 0; i--)
            if (td_model_layer(t->model, i).param_count) r->layer_ready(r->user, i);
        TD_CHECK(r->wait(r->user));
        if (r->allreduce_sum) TD_CHECK(r->allreduce_sum(r->user, sums, 4));
        if (td_log_enabled(TD_LOG_DEBUG)) grads_digest(t, step, "reduced gradient");
        TD_CHECK(td_gpu_apply(t->gpu));
    }
    if (r && r->check_params) { /* the host copy of the parameters only when it is compared */
        if (r->check_every <= 0 || (step + 1) % r->check_every == 0)
            TD_CHECK(td_gpu_download_state(t->gpu, td_model_params(t->model), NULL));
        TD_CHECK(r->check_params(r->user, step + 1));
    }
    if (t->bn_size) TD_CHECK(gpu_running_stats(t, step));
    td_optim_set_step_count(t->opt, td_optim_step_count(t->opt) + 1);
    return TD_OK;
}

/* Before the first step, CPU ranks show each other what decides their bits (tensor.h,
 * numerics): the same weights for any number of workers holds only if every rank runs the same
 * kernels, and a node whose environment or CPU picks another OpenBLAS core would break it without
 * a word. Every rank sees the same gathered records, so all stop together, naming the ranks, what
 * differs and how to pin it; --nondeterministic-ok makes it a warning. */
static td_status numerics_agree(trainer *t) {
    const td_train_config *cfg = t->cfg;
    const td_train_reducer *r = t->reducer;
    int world = cfg->world_size;
    td_numerics mine;
    td_numerics_get(&mine);
    td_numerics *all = td_xcalloc((size_t)world, sizeof *all);
    td_status st = r->allgather(r->user, &mine, all, sizeof mine);
    if (st != TD_OK) {
        free(all);
        return st;
    }
    char ranks[160] = "", what[128] = "", ref[256], other[256];
    int odd = 0, first = -1;
    for (int i = 1; i < world; i++) {
        if (!td_numerics_diff(&all[0], &all[i], first < 0 ? what : NULL,
                              first < 0 ? sizeof what : 0))
            continue;
        if (first < 0) first = i;
        size_t len = strlen(ranks);
        if (odd < 8)
            snprintf(ranks + len, sizeof ranks - len, "%s%d", odd ? ", " : "", i);
        else if (odd == 8)
            snprintf(ranks + len, sizeof ranks - len, ", ...");
        odd++;
    }
    td_numerics_describe(&all[0], ref, sizeof ref);
    if (!odd) {
        TD_LOG_DEBUG("numerics: all %d ranks run %s", world, ref);
        free(all);
        return TD_OK;
    }
    td_numerics_describe(&all[first], other, sizeof other);
    char fix[384];
    if (strcmp(all[0].blas_core, all[first].blas_core))
        snprintf(fix, sizeof fix,
                 "pin one BLAS kernel: OPENBLAS_CORETYPE=%s in every worker's environment (tandem "
                 "launch sets node 0's on every node)",
                 all[0].blas_core);
    else if (strcmp(all[0].kernels, all[first].kernels))
        snprintf(fix, sizeof fix,
                 "run one tandem build everywhere: these were built from different sources "
                 "(`tandem --version` names the kernels of each)");
    else if (strcmp(all[0].isa, all[first].isa)) {
        /* the lower level of the two (the first word: "x86-64" < "x86-64-v2" < ...), which
         * both CPUs run */
        char a[TD_NUMERICS_FIELD], b[TD_NUMERICS_FIELD];
        sscanf(all[0].isa, "%63s", a);
        sscanf(all[first].isa, "%63s", b);
        snprintf(fix, sizeof fix,
                 "run one build of tandem's kernels: TANDEM_ISA=%s in every worker's environment "
                 "(the portable wheel carries one per x86-64 level; tandem launch sets the nodes' "
                 "lowest), or one tandem build everywhere",
                 strcmp(a, b) <= 0 ? a : b);
    } else
        snprintf(fix, sizeof fix, "run one tandem build everywhere (the compilers differ)");
    free(all);
    if (cfg->nondeterministic_ok) {
        TD_LOG_WARN("ranks will not compute the same bits (--nondeterministic-ok): rank 0 runs "
                    "%s; rank%s %s run%s %s (%s)",
                    ref, odd > 1 ? "s" : "", ranks, odd > 1 ? "" : "s", other, what);
        return TD_OK;
    }
    return td_error(TD_ERR_INVALID,
                    "ranks would not compute the same bits: rank 0 runs %s; rank%s %s run%s %s "
                    "(%s). To fix, %s; or pass --nondeterministic-ok to train anyway",
                    ref, odd > 1 ? "s" : "", ranks, odd > 1 ? "" : "s", other, what, fix);
}

/* The training set, the held-out set (--val-data, --val-fraction, or the source's own split)
 * and the output count they imply. */
static td_status setup_data(trainer *t) {
    const td_train_config *cfg = t->cfg;
    td_data_options o = cfg->data_options;
    o.class_targets = cfg->loss == TD_LOSS_CROSS_ENTROPY;
    td_dataset_t *train = NULL, *test = NULL;
    /* said before the load, which may take minutes: a stop signal now ends the process at once
     * (tandem train's handler before training starts), and the tests wait for this line */
    if (cfg->rank == 0) TD_LOG_INFO("data: reading %s", cfg->data_dir);
    TD_CHECK(td_dataset_open(cfg->data_dir, &o, &train, &test));
    t->train = train;
    if (cfg->val_data) {
        td_dataset_free(test);
        test = NULL;
        td_dataset_t *own_test = NULL;
        o.channels = td_dataset_channels(train); /* images become the training set's size */
        o.height = td_dataset_rows(train), o.width = td_dataset_cols(train);
        o.flag = "--val-data";
        TD_CHECK(td_dataset_open(cfg->val_data, &o, &test, &own_test));
        td_dataset_free(own_test);
        t->test = test;
        TD_CHECK(td_dataset_check_pair(train, test, "--val-data"));
    } else if (cfg->val_fraction > 0) {
        td_dataset_free(test);
        t->train = NULL;
        TD_CHECK(td_dataset_split(train, cfg->val_fraction, &t->train, &t->test));
    } else {
        t->test = test;
    }
    if (cfg->loss == TD_LOSS_CROSS_ENTROPY) {
        t->outputs = td_dataset_num_classes(t->train);
        if (t->test) t->outputs = TD_MAX(t->outputs, td_dataset_num_classes(t->test));
        if (t->outputs < 2)
            return td_error(TD_ERR_FORMAT,
                            "%s: every target is class 0; classification needs at least 2 "
                            "classes (for regression pass --loss mse)",
                            td_dataset_describe(t->train));
    } else {
        t->outputs = td_dataset_target_dim(t->train);
    }
    t->has_acc = cfg->loss != TD_LOSS_MSE;
    /* the result and the checkpoint hold one mean and std per channel in arrays of this size;
     * the readers refuse wider data, and this keeps any other source from writing past them */
    if (td_dataset_channels(t->train) > TD_DATA_MAX_CHANNELS)
        return td_error(TD_ERR_FORMAT, "%s: %d channels; tandem takes at most %d",
                        td_dataset_describe(t->train), td_dataset_channels(t->train),
                        TD_DATA_MAX_CHANNELS);
    if (cfg->rank == 0) {
        TD_LOG_INFO("data: %s", td_dataset_describe(t->train));
        if (t->test)
            TD_LOG_INFO("held out: %s", td_dataset_describe(t->test));
        else
            TD_LOG_INFO("no held-out set (--val-data or --val-fraction): test metrics are not "
                        "computed");
    }
    return TD_OK;
}

/* The input normalisation: stated, or computed over the training set by rank 0 and sent to the
 * others (every rank would compute the same bits, but a file-backed set is read once, not once
 * per rank). Applied to the held-out set too. */
static td_status setup_norm(trainer *t) {
    const td_train_config *cfg = t->cfg;
    const td_train_reducer *r = t->reducer;
    int C = td_dataset_channels(t->train);
    t->norm_mean = td_xmalloc((size_t)C * sizeof(float));
    t->norm_std = td_xmalloc((size_t)C * sizeof(float));
    bool from_root = r && r->broadcast && cfg->world_size > 1;
    if (cfg->norm_count) {
        TD_CHECK(td_dataset_set_norm(t->train, cfg->norm_mean, cfg->norm_std, cfg->norm_count));
        memcpy(t->norm_mean, td_dataset_mean(t->train), (size_t)C * sizeof(float));
        memcpy(t->norm_std, td_dataset_std(t->train), (size_t)C * sizeof(float));
    } else {
        if (!from_root || cfg->rank == 0)
            td_dataset_compute_norm(t->train, t->norm_mean, t->norm_std);
        if (from_root) {
            TD_CHECK(r->broadcast(r->user, t->norm_mean, (size_t)C * sizeof(float), 0));
            TD_CHECK(r->broadcast(r->user, t->norm_std, (size_t)C * sizeof(float), 0));
        }
        /* in-memory data was checked finite when read; a file-backed set shows a NaN or an
         * infinity here first: find it and name it, rather than blame a --mean never given */
        for (int i = 0; i < C; i++)
            if (!isfinite(t->norm_mean[i]) || !isfinite(t->norm_std[i])) {
                TD_CHECK(td_dataset_check_finite(t->train));
                return td_error(TD_ERR_FORMAT,
                                "%s: the mean and std of channel %d come out %g and %g; pass "
                                "--mean and --std",
                                td_dataset_describe(t->train), i, (double)t->norm_mean[i],
                                (double)t->norm_std[i]);
            }
    }
    return TD_OK;
}

static td_status apply_norm(trainer *t) {
    int C = td_dataset_channels(t->train);
    TD_CHECK(td_dataset_set_norm(t->train, t->norm_mean, t->norm_std, C));
    if (t->test) TD_CHECK(td_dataset_set_norm(t->test, t->norm_mean, t->norm_std, C));
    if (t->cfg->rank == 0 && C <= 4) {
        char m[96] = "", sd[96] = "";
        for (int i = 0; i < C; i++) {
            size_t a = strlen(m), b = strlen(sd);
            snprintf(m + a, sizeof m - a, "%s%.5g", i ? "," : "", (double)t->norm_mean[i]);
            snprintf(sd + b, sizeof sd - b, "%s%.5g", i ? "," : "", (double)t->norm_std[i]);
        }
        TD_LOG_INFO("normalisation: --mean %s --std %s", m, sd);
    }
    return TD_OK;
}

static td_status setup(trainer *t, const td_train_config *cfg) {
    td_status rc = TD_OK;
    TD_CHECK(setup_data(t));
    TD_CHECK(td_model_load_for(cfg->model, td_dataset_channels(t->train), td_dataset_rows(t->train),
                               td_dataset_cols(t->train), t->outputs, &t->model));
    t->in_size = td_model_input_size(t->model);
    if (t->in_size != td_dataset_sample_size(t->train))
        return td_error(TD_ERR_INVALID,
                        "model %s takes %d inputs per sample but the data's samples have %d "
                        "values (%s)",
                        cfg->model, t->in_size, td_dataset_sample_size(t->train),
                        td_dataset_describe(t->train));
    if (td_model_output_size(t->model) != t->outputs)
        return td_error(TD_ERR_INVALID,
                        "model %s has %d outputs but the data has %d %s; write `out: outputs` "
                        "in the spec's last layer to follow the data",
                        cfg->model, td_model_output_size(t->model), t->outputs,
                        cfg->loss == TD_LOSS_CROSS_ENTROPY ? "classes" : "target values");
    int nl = td_model_num_layers(t->model);
    t->log_softmax_out = nl > 0 && td_model_layer(t->model, nl - 1).kind == TD_LAYER_LOG_SOFTMAX;
    if (t->log_softmax_out && cfg->loss != TD_LOSS_CROSS_ENTROPY)
        return td_error(TD_ERR_INVALID,
                        "model %s ends in log_softmax, which only cross-entropy takes; remove it "
                        "for --loss %s",
                        cfg->model, td_loss_name(cfg->loss));
    int max_batch = TD_MAX(cfg->batch, EVAL_BATCH);
    TD_CHECK(td_model_finalize(t->model, max_batch));
    t->num_params = td_model_num_params(t->model);
    td_model_init_params(t->model, cfg->seed);
    TD_CHECK(td_optim_new(&cfg->optim, t->num_params, &t->opt));
    t->reducer = cfg->reducer;
    if (!t->reducer && cfg->make_reducer)
        TD_CHECK(cfg->make_reducer(cfg->make_reducer_user, t->model, &t->reducer));
    if (t->reducer && (!t->reducer->layer_ready || !t->reducer->wait))
        return td_error(TD_ERR_INVALID, "the gradient reducer lacks layer_ready or wait");
    if (t->reducer && t->reducer->allgather && cfg->world_size > 1 && cfg->device == TD_DEVICE_CPU)
        TD_CHECK(numerics_agree(t));
    TD_CHECK(setup_norm(t));
    TD_CHECK(apply_norm(t));
    if (cfg->device == TD_DEVICE_CUDA) TD_CHECK(gpu_setup(t, max_batch));

    t->G = (int64_t)cfg->batch * cfg->accum * cfg->world_size;
    int64_t n = (int64_t)td_dataset_count(t->train);
    if (n == 0) return td_error(TD_ERR_INVALID, "the training set in %s is empty", cfg->data_dir);
    if (t->test && td_dataset_count(t->test) == 0) {
        td_dataset_free(t->test);
        t->test = NULL;
    }
    t->steps_per_epoch = (n + t->G - 1) / t->G;
    int64_t epochs = cfg->epochs > 0 ? cfg->epochs : 1;
    t->total_steps = cfg->steps > 0 ? cfg->steps : epochs * t->steps_per_epoch;
    t->epochs = (t->total_steps + t->steps_per_epoch - 1) / t->steps_per_epoch;
    t->sampler = td_sampler_new((uint64_t)n, cfg->seed);

    if (cfg->accum > 1) {
        while ((1 << t->nlevels) <= cfg->accum) t->nlevels++; /* floor(log2(M)) + 1 */
        t->level = td_xcalloc((size_t)t->nlevels, sizeof *t->level);
        for (int k = 0; k < t->nlevels; k++)
            t->level[k] = td_xmalloc_aligned(t->num_params * sizeof(float));
    }
    t->occupied = td_xcalloc((size_t)t->nlevels + 1, sizeof *t->occupied);
    t->layer_done = td_xcalloc((size_t)nl + 1, sizeof *t->layer_done);
    t->x = td_xmalloc_aligned((size_t)max_batch * (size_t)t->in_size * sizeof(float));
    t->dout = td_xmalloc_aligned((size_t)max_batch * (size_t)t->outputs * sizeof(float));
    t->tgt = td_xmalloc((size_t)max_batch * (size_t)t->outputs * sizeof(float));
    t->y = td_xmalloc((size_t)max_batch * sizeof(int32_t));
    t->bn_size = td_model_batch_stats_size(t->model);
    if (t->bn_size) {
        size_t slot = t->bn_size + 1;
        t->bn_local = td_xmalloc((size_t)cfg->accum * slot * sizeof(float));
        t->bn_all = td_xmalloc((size_t)cfg->accum * (size_t)cfg->world_size * slot * sizeof(float));
    }
    t->ids = td_xmalloc((size_t)max_batch * sizeof(uint64_t));
    if (td_dataset_file_backed(t->train) && cfg->device == TD_DEVICE_CPU) {
        t->pf = prefetch_new(t->train, max_batch, t->in_size, t->outputs);
        t->pf_ids = td_xmalloc(2 * (size_t)cfg->batch * sizeof(uint64_t));
    }
    return rc;
}

/* A resume trains on with the normalisation its checkpoint was trained with: the data may have
 * grown or a --mean/--std been dropped since, and the weights only fit the old one. */
static void restore_norm(trainer *t, const td_checkpoint *ck) {
    t->norm_restored = false;
    int C = td_dataset_channels(t->train);
    if (ck->norm_count != C) return; /* an older checkpoint: none recorded */
    size_t nb = (size_t)C * sizeof(float);
    if (!memcmp(ck->norm_mean, t->norm_mean, nb) && !memcmp(ck->norm_std, t->norm_std, nb)) return;
    TD_LOG_INFO("the checkpoint was trained with another input normalisation than this run's "
                "data gives (channel 0: mean %g std %g, now %g %g): resuming with the "
                "checkpoint's",
                (double)ck->norm_mean[0], (double)ck->norm_std[0], (double)t->norm_mean[0],
                (double)t->norm_std[0]);
    memcpy(t->norm_mean, ck->norm_mean, nb);
    memcpy(t->norm_std, ck->norm_std, nb);
    t->norm_restored = true;
}

static void teardown(trainer *t) {
    prefetch_free(t->pf); /* first: its thread reads the data set into its own buffers */
    free(t->pf_ids);
    td_gpu_free(t->gpu); /* before the model: it unpins the model's host buffers */
    td_model_free(t->model);
    td_optim_free(t->opt);
    td_dataset_free(t->train);
    td_dataset_free(t->test);
    td_sampler_free(t->sampler);
    for (int k = 0; k < t->nlevels; k++) free(t->level[k]);
    free(t->level);
    free(t->occupied);
    free(t->layer_done);
    free(t->x);
    free(t->dout);
    free(t->tgt);
    free(t->y);
    free(t->norm_mean);
    free(t->norm_std);
    free(t->bn_local);
    free(t->bn_all);
    free(t->ids);
}

/* Micro-batch slot j's BatchNorm statistics in bn_local: {count, stats}, the stats copied from
 * `stats` (NULL: already in place) where the slot held samples, zeros where it held none. */
static void bn_slot_set(trainer *t, int j, int cnt, const float *stats) {
    float *slot = t->bn_local + (size_t)j * (t->bn_size + 1);
    slot[0] = (float)cnt;
    if (cnt == 0)
        memset(slot + 1, 0, t->bn_size * sizeof(float));
    else if (stats)
        memcpy(slot + 1, stats, t->bn_size * sizeof(float));
}

/* BatchNorm's running statistics follow every micro-batch of the global batch in slot order
 * (slot k = rank * M + j), on every rank alike: the same update as one process taking the
 * micro-batches one after another, whatever the number of ranks. */
static td_status update_running_stats(trainer *t) {
    const td_train_config *cfg = t->cfg;
    const td_train_reducer *r = t->reducer;
    size_t slot = t->bn_size + 1, mine = (size_t)cfg->accum * slot;
    const float *all = t->bn_local;
    int slots = cfg->accum;
    if (r && cfg->world_size > 1) {
        if (!r->allgather)
            return td_error(TD_ERR_UNSUPPORTED,
                            "BatchNorm across ranks needs the reducer's allgather, which this "
                            "one lacks");
        TD_CHECK(r->allgather(r->user, t->bn_local, t->bn_all, mine * sizeof(float)));
        all = t->bn_all;
        slots *= cfg->world_size;
    }
    for (int k = 0; k < slots; k++)
        if (all[(size_t)k * slot] > 0)
            td_model_update_running_stats(t->model, all + (size_t)k * slot + 1);
    return TD_OK;
}

/* One optimizer step: M micro-batches, the fold, the reducer, the update. sums gets this
 * rank's {loss sum, correct, samples, stop flag}, summed over ranks when a reducer can. */
/* The samples in step `step`'s global batch: G, less only for an epoch's tail. */
static int64_t step_samples(const trainer *t, int64_t step) {
    int64_t N = (int64_t)td_sampler_count(t->sampler);
    return TD_MIN(t->G, N - step % t->steps_per_epoch * t->G);
}

/* How many samples this rank's micro-batch j of `step` has (0 for an empty tail slot); train.h:
 * slot k = rank * M + j takes positions k*B... of the step's global batch. */
static int micro_batch_count(const trainer *t, int64_t step, int j) {
    const int B = t->cfg->batch;
    int64_t k = (int64_t)t->cfg->rank * t->cfg->accum + j;
    return (int)TD_MAX((int64_t)0, TD_MIN((int64_t)B, step_samples(t, step) - k * B));
}

/* That micro-batch's sample ids; returns their count. */
static int micro_batch_ids(trainer *t, int64_t step, int j, uint64_t *ids) {
    const int B = t->cfg->batch;
    int64_t epoch = step / t->steps_per_epoch, base = step % t->steps_per_epoch * t->G;
    const uint64_t *perm = td_sampler_epoch(t->sampler, (uint64_t)epoch);
    int64_t k = (int64_t)t->cfg->rank * t->cfg->accum + j;
    int cnt = micro_batch_count(t, step, j);
    for (int i = 0; i < cnt; i++) ids[i] = perm[base + k * B + i];
    return cnt;
}

/* Micro-batch j of `step` into t->x/y/tgt/ids: taken from the prefetcher when it read it ahead,
 * else gathered now; then the prefetcher starts on the one after it. */
static td_status gather_micro_batch(trainer *t, int64_t step, int j, int cnt) {
    const int M = t->cfg->accum;
    td_status rc = TD_OK;
    if (!t->pf || !prefetch_take(t->pf, step * M + j, &t->x, &t->y, &t->tgt, &t->ids, &rc)) {
        micro_batch_ids(t, step, j, t->ids);
        rc = td_dataset_gather(t->train, t->ids, cnt, t->x, t->y, t->tgt);
    }
    TD_CHECK(rc);
    if (!t->pf) return TD_OK;
    int64_t ns = j + 1 < M ? step : step + 1;
    int nj = j + 1 < M ? j + 1 : 0;
    if (ns >= t->total_steps) return TD_OK;
    /* the ids of the micro-batch after it, a hint for the disk (prefetch.h); both lists are
     * copied by prefetch_start, so these buffers are scratch */
    uint64_t *next = t->pf_ids, *hint = t->pf_ids + t->cfg->batch;
    int ncnt = micro_batch_ids(t, ns, nj, next), nhint = 0;
    int64_t ns2 = nj + 1 < M ? ns : ns + 1;
    int nj2 = nj + 1 < M ? nj + 1 : 0;
    if (ns2 < t->total_steps) nhint = micro_batch_ids(t, ns2, nj2, hint);
    if (ncnt > 0) prefetch_start(t->pf, ns * M + nj, next, ncnt, hint, nhint);
    return TD_OK;
}

static td_status train_step(trainer *t, int64_t step, double sums[4]) {
    const td_train_config *cfg = t->cfg;
    const td_train_reducer *r = t->reducer;
    const int M = cfg->accum;
    int64_t n = step_samples(t, step);
    float scale = 1.0f / (float)n;
    bool hook = M > 1 || r;
    memset(sums, 0, 4 * sizeof(double));
    for (int j = 0; j < M; j++) {
        int cnt = micro_batch_count(t, step, j);
        bool last = j == M - 1;
        td_model_zero_grads(t->model);
        if (last && hook) {
            memset(t->layer_done, 0, (size_t)td_model_num_layers(t->model) * sizeof(bool));
            if (r && r->begin_backward) r->begin_backward(r->user);
            td_model_set_grad_ready_hook(t->model, on_grad_ready, t);
        }
        if (cnt > 0) {
            double t0 = t->prof_on ? td_now_s() : 0;
            TD_CHECK(gather_micro_batch(t, step, j, cnt));
            if (t->prof_on) t->prof_data_s += td_now_s() - t0;
            td_forward_ctx ctx = {
                .training = true, .seed = cfg->seed, .step = (uint64_t)step, .sample_ids = t->ids};
            const float *out = td_model_forward(t->model, t->x, cnt, &ctx);
            if (!out) return TD_ERR_INVALID;
            if (t->prof_on) t0 = td_now_s();
            sums[0] += loss_and_grad(t, out, cnt, scale);
            sums[1] += count_correct(t, out, cnt);
            if (t->prof_on) t->prof_loss_s += td_now_s() - t0;
            sums[2] += cnt;
            td_model_backward(t->model, t->dout, cnt);
        }
        if (t->bn_size) bn_slot_set(t, j, cnt, td_model_batch_stats(t->model));
        if (!last) push(t);
    }
    if (hook) {
        finish_layers(t); /* no-op for layers the backward already reported */
        td_model_set_grad_ready_hook(t->model, NULL, NULL);
        for (int k = 0; k < t->nlevels; k++) t->occupied[k] = false;
    }
    sums[3] = td_train_stop_signal() ? 1 : 0;
    double t0 = t->prof_on ? td_now_s() : 0;
    if (r) {
        TD_CHECK(r->wait(r->user));
        if (r->allreduce_sum) TD_CHECK(r->allreduce_sum(r->user, sums, 4));
    }
    if (t->bn_size) TD_CHECK(update_running_stats(t));
    if (t->prof_on) t->prof_wait_s += td_now_s() - t0, t0 = td_now_s();
    td_optim_step(t->opt, td_model_params(t->model), td_model_grads(t->model));
    if (t->prof_on) t->prof_optim_s += td_now_s() - t0;
    if (r && r->check_params) TD_CHECK(r->check_params(r->user, step + 1));
    return TD_OK;
}

/* ---- --profile ---- */
static void start_profile(trainer *t, int64_t step) {
    td_model_set_profiling(t->model, true);
    t->prof_on = true;
    t->prof_step0 = step;
    t->prof_t0 = t->train_s;
    t->prof_data_s = t->prof_loss_s = t->prof_wait_s = t->prof_optim_s = 0;
}

static void fill_profile(trainer *t, td_train_result *out) {
    int64_t steps = t->step - t->prof_step0;
    if (steps <= 0) return;
    int nl = td_model_num_layers(t->model);
    double *fwd = td_xcalloc((size_t)nl, sizeof *fwd), *bwd = td_xcalloc((size_t)nl, sizeof *bwd);
    td_model_profile(t->model, fwd, bwd);
    td_train_profile_row *rows = td_xcalloc((size_t)nl + 4, sizeof *rows);
    double per = 1e3 / (double)steps;
    double batch = (double)t->cfg->batch * t->cfg->accum; /* this rank's samples per step */
    int n = 0;
    for (int i = 0; i < nl; i++, n++) {
        td_layer_info li = td_model_layer(t->model, i);
        snprintf(rows[n].name, sizeof rows[n].name, "%s", li.name ? li.name : "?");
        snprintf(rows[n].kind, sizeof rows[n].kind, "%s", li.kind_name);
        rows[n].fwd_ms = fwd[i] * per, rows[n].bwd_ms = bwd[i] * per;
        rows[n].flops = batch * (td_model_layer_flops(t->model, i, false) +
                                 td_model_layer_flops(t->model, i, true));
    }
    const struct {
        const char *name, *kind;
        double s;
    } phases[] = {
        {"loss", "", t->prof_loss_s},
        {"optimizer", td_optim_kind_name(t->cfg->optim.kind), t->prof_optim_s},
        {"data", "", t->prof_data_s},
        {"gradient wait", "", t->prof_wait_s},
    };
    for (size_t k = 0; k < TD_ARRAY_LEN(phases); k++, n++) {
        snprintf(rows[n].name, sizeof rows[n].name, "%s", phases[k].name);
        snprintf(rows[n].kind, sizeof rows[n].kind, "%s", phases[k].kind);
        rows[n].fwd_ms = phases[k].s * per;
    }
    free(fwd);
    free(bwd);
    out->profile = rows;
    out->profile_rows = n;
    out->profile_steps = steps;
    out->profile_threads = td_get_num_threads();
    out->profile_step_ms = (t->train_s - t->prof_t0) * per;
}

void td_train_result_release(td_train_result *r) {
    free(r->profile);
    r->profile = NULL;
    r->profile_rows = 0;
}

td_status td_train_run(const td_train_config *cfg, td_train_result *out) {
    td_status rc = TD_OK;
    double t0 = td_now_s();
    trainer tr;
    trainer *t = &tr;
    memset(t, 0, sizeof *t);
    memset(out, 0, sizeof *out);
    out->test_acc = NAN;
    out->test_loss = NAN;
    out->final_loss = NAN;
    out->final_acc = NAN;
    t->cfg = cfg;
    char *resumed_path = NULL;
    td_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    TD_CHECK(validate(cfg));
    if (cfg->rank == 0) { /* before the data loads: a bad path must not cost a training run */
        if (cfg->save_path) TD_CHECK(td_check_output_file(cfg->save_path, "--save"));
        if (cfg->checkpoint_dir)
            TD_CHECK(td_check_output_dir(cfg->checkpoint_dir, "--checkpoint-dir"));
    }
    t->ckpt_steps[0] = t->ckpt_steps[1] = -1;
    td_set_num_threads(cfg->threads > 0 ? cfg->threads : (int)td_env_int(TD_ENV_NUM_THREADS));
    TD_CHECK_GOTO(setup(t, cfg), rc, out);

    if (cfg->resume) {
        /* With a broadcast, rank 0 alone reads the checkpoint and sends what it restored: the
         * other ranks' nodes need not see rank 0's checkpoint directory (an ssh executor's hosts
         * share no file system), and every rank resumes from the one checkpoint rank 0 chose,
         * even when a newer one appeared on a shared directory meanwhile. The parameters follow
         * by sync_params below. */
        const td_train_reducer *r = t->reducer;
        bool from_root = r && r->broadcast && cfg->world_size > 1;
        int64_t found = 0;
        if (!from_root || cfg->rank == 0) {
            TD_CHECK_GOTO(td_checkpoint_find_latest(cfg->checkpoint_dir, &resumed_path, &ck), rc,
                          out);
            if (resumed_path) {
                TD_CHECK_GOTO(check_resume(t, resumed_path, &ck), rc, out);
                memcpy(td_model_params(t->model), ck.params, t->num_params * sizeof(float));
                if (ck.optim_state_count)
                    memcpy(td_optim_state(t->opt), ck.optim_state,
                           ck.optim_state_count * sizeof(float));
                td_optim_set_step_count(t->opt, ck.optim_steps);
                if (ck.buffer_count)
                    memcpy(td_model_buffers(t->model), ck.buffers, ck.buffer_count * sizeof(float));
                td_model_set_batches_tracked(t->model, ck.batches_tracked);
                t->start_step = ck.step;
                found = 1;
                restore_norm(t, &ck);
            }
        }
        if (from_root) {
            int64_t head[4] = {found, t->start_step, td_optim_step_count(t->opt),
                               td_model_batches_tracked(t->model)};
            TD_CHECK_GOTO(r->broadcast(r->user, head, sizeof head, 0), rc, out);
            found = head[0];
            if (found) {
                t->start_step = head[1];
                td_optim_set_step_count(t->opt, head[2]);
                td_model_set_batches_tracked(t->model, head[3]);
                if (td_optim_state_count(t->opt))
                    TD_CHECK_GOTO(r->broadcast(r->user, td_optim_state(t->opt),
                                               td_optim_state_count(t->opt) * sizeof(float), 0),
                                  rc, out);
                if (td_model_num_buffers(t->model))
                    TD_CHECK_GOTO(r->broadcast(r->user, td_model_buffers(t->model),
                                               td_model_num_buffers(t->model) * sizeof(float), 0),
                                  rc, out);
                /* rank 0's normalisation (the checkpoint's, when restore_norm took it) */
                int C = td_dataset_channels(t->train);
                size_t nb = (size_t)C * sizeof(float);
                float *was = td_xmalloc(2 * nb);
                memcpy(was, t->norm_mean, nb);
                memcpy(was + C, t->norm_std, nb);
                rc = r->broadcast(r->user, t->norm_mean, nb, 0);
                if (rc == TD_OK) rc = r->broadcast(r->user, t->norm_std, nb, 0);
                if (memcmp(was, t->norm_mean, nb) || memcmp(was + C, t->norm_std, nb))
                    t->norm_restored = true;
                free(was);
                if (rc != TD_OK) goto out;
            }
        }
        if (t->norm_restored) { /* the data sets, and the device's copy, use the checkpoint's */
            TD_CHECK_GOTO(apply_norm(t), rc, out);
            if (t->gpu) TD_CHECK_GOTO(gpu_upload_data(t), rc, out);
        }
        /* Found or not, what the metrics hold past the step training goes on from is stale: a
         * resume that finds no checkpoint (a requeued Slurm job whose first node is another
         * machine, with no shared file system) starts again from step 0, and its steps must
         * replace what the store has, not add to it. */
        if (cfg->callbacks.resumed)
            cfg->callbacks.resumed(cfg->callbacks.user, found ? t->start_step : 0);
        if (found) {
            if (cfg->rank == 0)
                TD_LOG_INFO("resuming from %s at step %lld (epoch %lld, step %lld of it)",
                            resumed_path, (long long)ck.step, (long long)ck.epoch + 1,
                            (long long)ck.step_in_epoch);
        } else if (cfg->rank == 0) {
            TD_LOG_INFO("no checkpoint in %s yet; starting from step 0", cfg->checkpoint_dir);
        }
    }
    if (t->reducer && t->reducer->sync_params)
        TD_CHECK_GOTO(t->reducer->sync_params(t->reducer->user), rc, out);
    if (t->gpu)
        TD_CHECK_GOTO(td_gpu_upload_state(t->gpu, td_model_params(t->model), td_optim_state(t->opt),
                                          td_optim_step_count(t->opt)),
                      rc, out);

    t->bar = cfg->progress > 0 || (cfg->progress < 0 && isatty(STDERR_FILENO));
    t->log_every = cfg->log_every > 0 ? cfg->log_every : TD_MAX((int64_t)1, t->total_steps / 20);
    if (cfg->rank == 0) {
        char where[360];
        if (t->gpu)
            snprintf(where, sizeof where, "on %s", td_gpu_describe(t->gpu));
        else
            snprintf(where, sizeof where, "%d thread%s", td_get_num_threads(),
                     td_get_num_threads() == 1 ? "" : "s");
        TD_LOG_INFO("training %s (%zu parameters) for %lld step%s (%lld epoch%s of %lld step%s), "
                    "global batch %lld = %d x %d micro-batch%s x %d rank%s, %s lr %g, %s",
                    cfg->model, t->num_params, (long long)t->total_steps,
                    t->total_steps == 1 ? "" : "s", (long long)t->epochs, t->epochs == 1 ? "" : "s",
                    (long long)t->steps_per_epoch, t->steps_per_epoch == 1 ? "" : "s",
                    (long long)t->G, cfg->batch, cfg->accum, cfg->accum == 1 ? "" : "es",
                    cfg->world_size, cfg->world_size == 1 ? "" : "s",
                    td_optim_kind_name(cfg->optim.kind), cfg->optim.lr, where);
    }

    if (cfg->callbacks.configured)
        cfg->callbacks.configured(cfg->callbacks.user, td_dataset_describe(t->train), t->outputs,
                                  td_dataset_channels(t->train), t->norm_mean, t->norm_std);
    if (cfg->callbacks.started) cfg->callbacks.started(cfg->callbacks.user);
    t->t_start = td_now_s();
    int64_t step = t->start_step;
    bool evaluated_at_end = false;
    while (step < t->total_steps) {
        double sums[4];
        double ts = td_now_s();
        TD_CHECK_GOTO(t->gpu ? train_step_gpu(t, step, sums) : train_step(t, step, sums), rc, out);
        t->train_s += td_now_s() - ts;
        step++;
        t->step = step;
        t->samples_done += (int64_t)sums[2];
        if (step - t->start_step == WARM_STEPS) {
            t->warm_s = t->train_s, t->warm_samples = t->samples_done;
            if (cfg->profile && !t->gpu) start_profile(t, step);
        }
        out->final_loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
        out->final_acc = sums[2] > 0 && t->has_acc ? sums[1] / sums[2] : NAN;
        if (sums[2] > 0 && !isfinite(out->final_loss)) { /* every rank sees the same sums */
            rc = diverged(t, step, out->final_loss);
            goto out;
        }
        double elapsed = t->train_s;
        emit(t, "train/loss", step, out->final_loss);
        if (t->has_acc) emit(t, "train/acc", step, 100.0 * out->final_acc); /* percent */
        emit(t, "train/samples_per_s", step, elapsed > 0 ? (double)t->samples_done / elapsed : 0);
        bool epoch_end = step % t->steps_per_epoch == 0;
        bool stopping = sums[3] > 0;
        report_progress(t, step, out->final_loss, out->final_acc,
                        epoch_end || stopping || step == t->total_steps);
        if (stopping) {
            bar_newline(t);
            TD_CHECK_GOTO(save_checkpoint(t, step), rc, out);
            int sig = td_train_stop_signal() ? td_train_stop_signal() : SIGTERM;
            out->stop_signal = sig;
            rc = td_error(TD_ERR_INTERRUPTED, "stopped by %s after step %lld of %lld%s%s%s",
                          sig == SIGINT ? "SIGINT" : "SIGTERM", (long long)step,
                          (long long)t->total_steps,
                          cfg->checkpoint_dir ? "; checkpoint written to "
                                              : "; no checkpoint "
                                                "(no --checkpoint-dir)",
                          cfg->checkpoint_dir ? cfg->checkpoint_dir : "",
                          cfg->checkpoint_dir
                              ? ", continue with --resume (a tracked run: tandem run --resume RUN)"
                              : "");
            goto out;
        }
        bool ckpt = (cfg->checkpoint_every > 0 && step % cfg->checkpoint_every == 0) || epoch_end ||
                    step == t->total_steps;
        if (ckpt) TD_CHECK_GOTO(save_checkpoint(t, step), rc, out);
        bool last = step == t->total_steps;
        if ((epoch_end && cfg->eval_every_epoch) || last) {
            bar_newline(t);
            TD_CHECK_GOTO(evaluate(t, step, &out->test_acc, &out->test_loss), rc, out);
            long long ep = (long long)((step - 1) / t->steps_per_epoch + 1);
            if (cfg->rank == 0 && t->test && t->has_acc)
                TD_LOG_INFO("epoch %lld step %lld: test accuracy %.2f%% (loss %.4f)", ep,
                            (long long)step, out->test_acc, out->test_loss);
            else if (cfg->rank == 0 && t->test)
                TD_LOG_INFO("epoch %lld step %lld: test loss %.6g", ep, (long long)step,
                            out->test_loss);
            evaluated_at_end = last;
        } else if (epoch_end) {
            bar_newline(t);
        }
    }
    if (!evaluated_at_end) /* resumed at the very end: still report the model's accuracy */
        TD_CHECK_GOTO(evaluate(t, step, &out->test_acc, &out->test_loss), rc, out);
    if (cfg->save_path && cfg->rank == 0) {
        if (t->gpu)
            TD_CHECK_GOTO(td_gpu_download_state(t->gpu, td_model_params(t->model), NULL), rc, out);
        TD_CHECK_GOTO(td_save_safetensors(cfg->save_path, t->model), rc, out);
    }
out:
    out->steps = TD_MAX(t->step, t->start_step);
    out->samples = t->samples_done;
    out->samples_per_s = t->train_s > 0 ? (double)t->samples_done / t->train_s : 0;
    out->samples_per_s_steady = out->samples_per_s;
    if (t->warm_s > 0 && t->train_s > t->warm_s && t->samples_done > t->warm_samples)
        out->samples_per_s_steady =
            (double)(t->samples_done - t->warm_samples) / (t->train_s - t->warm_s);
    out->start_step = t->start_step;
    out->epochs = t->epochs;
    out->global_batch = t->G;
    out->world_size = cfg->world_size;
    out->num_params = t->num_params;
    out->flops_per_sample = t->model ? td_model_flops_per_sample(t->model) : 0;
    out->outputs = t->outputs;
    if (t->norm_mean && t->train && td_dataset_channels(t->train) <= TD_DATA_MAX_CHANNELS) {
        out->norm_count = td_dataset_channels(t->train);
        memcpy(out->norm_mean, t->norm_mean, (size_t)out->norm_count * sizeof(float));
        memcpy(out->norm_std, t->norm_std, (size_t)out->norm_count * sizeof(float));
    }
    if (t->prof_on) fill_profile(t, out);
    out->wall_s = td_now_s() - t0;
    free(resumed_path);
    td_checkpoint_free(&ck);
    teardown(t);
    return rc;
}
