/* tandem train: the trainer loop, checkpoints, safetensors export, signals.
 *
 * One optimizer step covers one global batch of G = B x M x W samples (B per micro-batch, M
 * micro-batches per rank, W ranks). Step s of an epoch takes positions [s*G, (s+1)*G) of that
 * epoch's permutation (data.h); global micro-batch slot k = rank*M + j takes the B positions
 * s*G + k*B ... The last, partial global batch of an epoch is split over the same slots in
 * order, empty slots contribute zero gradient, and its gradient scale is 1/n: no sample is
 * dropped or repeated, and the arithmetic depends on B and G only, not on how G splits into
 * M and W. A rank's M micro-batch gradients are summed in a fixed pairwise tree; docs/training.md
 * describes the tree and the reducer hook.
 *
 * Library code never exits and never handles a signal itself beyond setting a flag: the loop
 * finishes the step it is in, writes a checkpoint (when a directory is set) and returns
 * TD_ERR_INTERRUPTED; main turns that into exit code 143 (SIGTERM) or 130 (SIGINT).
 */
#ifndef TANDEM_TRAIN_H
#define TANDEM_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"
#include "tandem/data.h"
#include "tandem/gpu.h"
#include "tandem/nn.h"
#include "tandem/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the data-parallel hook ----
 * What the trainer needs from a gradient reducer (the ddp layer adapts td_ddp_t to it). For
 * the step's last micro-batch the trainer calls begin_backward, then installs its own grad-ready
 * hook on the model; that hook folds the earlier micro-batches' partial sums into the layer's
 * slice (the slice is then this rank's final gradient) and calls layer_ready(layer). After the
 * backward, wait() must return with grads holding the sum over all ranks. A NULL reducer means
 * one process. Every pointer but layer_ready and wait may be NULL. */
typedef struct td_train_reducer {
    void *user;
    void (*begin_backward)(void *user);
    void (*layer_ready)(void *user, int layer);
    td_status (*wait)(void *user);
    /* Sums vals[0..n) over ranks in place: the step's loss/accuracy counts and the stop flag, so
     * every rank logs the global numbers and all ranks stop at the same step. */
    td_status (*allreduce_sum)(void *user, double *vals, int n);
    /* Copies nbytes at buf from rank root to every rank (a resume: rank 0's optimizer state
     * and step, so that only rank 0 reads the checkpoint). */
    td_status (*broadcast)(void *user, void *buf, size_t nbytes, int root);
    /* Makes every rank's parameters equal rank 0's (after init, and after a resume). */
    td_status (*sync_params)(void *user);
    /* After each optimizer step: compare replicas cheaply (every rank, same step). */
    td_status (*check_params)(void *user, int64_t step);
    /* check_params looks at the parameters only at steps that are multiples of this (0: every
     * step); a GPU trainer copies the parameters to the host for it only then. */
    int64_t check_every;
    /* For the GPU's CUDA IPC reduce (may be NULL: then the host path): every rank's `nbytes`
     * gathered in rank order, and a barrier. */
    td_status (*allgather)(void *user, const void *in, void *out, size_t nbytes);
    td_status (*barrier)(void *user);
} td_train_reducer;

/* Metrics as they happen, for the tracking layer: "train/loss", "train/acc" (percent), and
 * "train/samples_per_s" per step; "test/acc" (percent) and "test/loss" after each evaluation;
 * step is the optimizer step count after the step. Called on every rank. */
typedef struct {
    void *user;
    void (*metric)(void *user, const char *key, int64_t step, double value);
    /* Training continues from a checkpoint at `step`: metrics of later steps are void. */
    void (*resumed)(void *user, int64_t step);
    /* Set-up is done (data loaded, model built, device ready) and the first step begins. */
    void (*started)(void *user);
    /* What the data decided, once set-up is done (and again after a resume that restores another
     * normalisation): `data` is td_dataset_describe's line, outputs the model's output count,
     * mean/std the per-channel normalisation (n values). */
    void (*configured)(void *user, const char *data, int outputs, int n, const float *mean,
                       const float *std);
} td_train_callbacks;

/* td_loss_kind (nn.h): the data's targets must fit, see td_dataset_open's class_targets. */
const char *td_loss_name(td_loss_kind k); /* "cross-entropy", "mse", "bce" */
td_status td_loss_parse(const char *s, td_loss_kind *out);

typedef struct {
    const char *model; /* a preset (basicnet, mlp7, mlp, resnet-small) or a YAML spec path */
    /* The data (data.h, td_dataset_open): a directory of IDX files, an image folder, .csv, .npz,
     * .safetensors or "X.npy,Y.npy"; the held-out set is val_data, or the last val_fraction of
     * a fixed shuffle of the data, or the source's own test split; none of these: no eval. */
    const char *data_dir;
    const char *val_data;
    double val_fraction;
    td_data_options data_options; /* format, CSV target, image size; class_targets is set from
                                   * the loss */
    td_loss_kind loss;            /* cross-entropy (NLL after log_softmax), mse or bce */
    /* Per-channel normalisation (x * scale - mean) / std: norm_count values (1 or one per
     * channel), or 0 to compute it over the training set (a resume keeps the checkpoint's). */
    int norm_count;
    const float *norm_mean, *norm_std;
    int64_t epochs; /* used when steps == 0; 0 means 1 */
    int64_t steps;  /* > 0: exactly this many optimizer steps (across epochs) */
    int batch;      /* per rank, per micro-batch */
    int accum;      /* micro-batches per step */
    td_optim_config optim;
    uint64_t seed;
    int threads;                /* 0: TANDEM_NUM_THREADS, else all cores */
    td_device device;           /* where the math runs: TD_DEVICE_CPU (default) or CUDA */
    int gpu_device;             /* CUDA ordinal; -1: LOCAL_RANK modulo the GPUs present */
    bool gpu_no_graph;          /* CUDA: launch the step kernel by kernel, not as a graph */
    td_precision precision;     /* CUDA: the gemms' arithmetic (gpu.h); the CPU is fp32 only */
    bool nondeterministic_ok;   /* CPU ranks whose numerics differ (tensor.h) train anyway,
                                 * with a warning, instead of stopping before the first step */
    const char *save_path;      /* final weights as safetensors; NULL: none */
    bool profile; /* time each layer and phase of the steps after the first 10 (out->profile) */
    const char *checkpoint_dir; /* NULL: no checkpoints */
    int64_t checkpoint_every;   /* steps; 0: at epoch ends (and on a stop signal) only */
    bool resume;                /* continue from the newest valid checkpoint, if any */
    bool eval_every_epoch;      /* test accuracy after each epoch (always at the end) */
    int world_size, rank;       /* 1, 0 for one process */
    int progress;               /* 1: redraw a bar on stderr, 0: log lines, -1: bar if a tty */
    int64_t log_every;          /* steps between log lines without a bar; 0: about 20 a run */
    /* The reducer, or a factory for one that needs the model (ddp buckets over its gradient
     * buffer): called once after the model is built and initialised, before any resume. */
    const td_train_reducer *reducer;
    td_status (*make_reducer)(void *user, td_model_t *model, const td_train_reducer **out);
    void *make_reducer_user;
    td_train_callbacks callbacks;
} td_train_config;

/* --profile: where a step's time goes, over the steps after this process's first 10 (the
 * warm-up samples_per_s_steady leaves out too). One row per layer (nn.h's profile: thread time
 * of its forward and backward) and per phase of the step outside the model. */
typedef struct {
    char name[48];  /* the layer's name ("conv1"), or the phase: "loss", "optimizer", "data",
                     * "gradient wait" (the reducer's allreduce left after the backward) */
    char kind[24];  /* the layer's kind ("conv2d", "linear"...); the optimizer's name; "" */
    double fwd_ms;  /* per step: thread milliseconds of the layer's forward, or of the phase */
    double bwd_ms;  /* per step: of the layer's backward (0 for a phase) */
    double flops;   /* per step: the layer's forward + backward FLOPs over the batch (nn.h) */
} td_train_profile_row;

typedef struct {
    int64_t steps;        /* optimizer steps done, including those before a resume */
    int64_t start_step;   /* where this process started (checkpoint step, or 0) */
    int64_t epochs;       /* planned epochs (partial last one counts) */
    int64_t global_batch; /* G = B x M x W */
    int world_size;
    size_t num_params;
    double final_loss; /* mean loss of the last step */
    double final_acc;  /* training accuracy of the last step, fraction */
    double test_acc;   /* percent, from the last evaluation; NaN if none ran */
    double test_loss;
    int64_t samples;             /* global samples trained in this process's steps (all ranks) */
    double samples_per_s;        /* global samples per second over this process's steps */
    double samples_per_s_steady; /* the same after the process's first 10 steps (warm-up) */
    double wall_s;               /* this process, from start to return */
    int stop_signal;             /* the signal that stopped training, or 0 */
    double flops_per_sample;     /* forward + backward multiply-adds x2 (nn.h) */
    /* The normalisation trained with (stated, computed or from the checkpoint) and the data */
    int norm_count;
    float norm_mean[TD_DATA_MAX_CHANNELS], norm_std[TD_DATA_MAX_CHANNELS];
    int outputs; /* classes, or target values per sample */
    /* --profile: rows (malloc'd; td_train_result_release frees them), the steps they cover, the
     * threads, and the wall milliseconds of one of those steps; NULL / 0 when not profiled */
    td_train_profile_row *profile;
    int profile_rows;
    int64_t profile_steps;
    int profile_threads;
    double profile_step_ms;
} td_train_result;

void td_train_result_release(td_train_result *r);

/* Defaults: adamw lr 1e-3, batch 64, accum 1, seed 0, 1 epoch, eval every epoch, W=1. */
void td_train_config_defaults(td_train_config *cfg);

/* Trains as configured. On a stop signal: finishes the step, checkpoints, fills *out and
 * returns TD_ERR_INTERRUPTED. */
td_status td_train_run(const td_train_config *cfg, td_train_result *out);

/* SIGTERM and SIGINT set a flag the loop checks after each step (SA_RESTART; nothing else); a
 * second one more than a second after the first kills the process. */
void td_train_install_signal_handlers(void);
/* The signal received since install, 0 if none. */
int td_train_stop_signal(void);

/* ---- data parallelism from the launcher's environment ----
 * td_train_dist_from_env joins the process group the launcher describes (RANK, WORLD_SIZE,
 * TANDEM_STORE_ADDR, TANDEM_TOKEN, ...); td_train_dist_make_reducer is a make_reducer factory
 * (pass the dist as make_reducer_user) that builds the ddp reducer over the model's gradients. */
typedef struct td_train_dist td_train_dist;
td_status td_train_dist_from_env(td_train_dist **out);
int td_train_dist_rank(const td_train_dist *d);
int td_train_dist_world_size(const td_train_dist *d);
td_status td_train_dist_make_reducer(void *user, td_model_t *model, const td_train_reducer **out);
/* Buckets, comm-thread time and the non-overlapped wait so far (zeros before make_reducer). */
void td_train_dist_stats(const td_train_dist *d, int *num_buckets, double *comm_s, double *wait_s,
                         uint64_t *steps);
void td_train_dist_free(td_train_dist *d);

/* ---- checkpoints (docs/checkpoint-format.md) ---- */
typedef struct {
    /* the config a resume must match */
    char model[256];
    uint64_t num_params;
    int64_t batch, accum, world_size;
    td_optim_config optim;
    uint64_t seed;
    /* progress */
    int64_t step;          /* optimizer steps done */
    int64_t epoch;         /* epoch the next step belongs to */
    int64_t step_in_epoch; /* steps of that epoch already done */
    uint64_t optim_steps;  /* the optimizer's own step count */
    /* buffers (owned by the caller when saving; by the struct after a load, free with
     * td_checkpoint_free) */
    float *params;      /* [num_params] */
    float *optim_state; /* [optim_state_count] */
    uint64_t optim_state_count;
    float *buffers; /* [buffer_count]: BatchNorm's running statistics (nn.h) */
    uint64_t buffer_count;
    int64_t batches_tracked; /* BatchNorm's num_batches_tracked */
    /* the input normalisation trained with: norm_count per-channel values (0: none recorded) */
    int norm_count;
    float *norm_mean, *norm_std;
} td_checkpoint;

/* Writes dir/ckpt-<step>.tdck atomically (temporary file in dir, fsync, rename, fsync dir),
 * then deletes all but the newest `keep` checkpoints. On failure (ENOSPC: TD_ERR_NOSPACE) the
 * temporary file is removed and existing checkpoints are untouched. */
td_status td_checkpoint_save(const char *dir, const td_checkpoint *ck, int keep);
/* Reads and verifies one file (magic, version, length, CRC-32). TD_ERR_FORMAT naming the file
 * and what is wrong. */
td_status td_checkpoint_load(const char *path, td_checkpoint *out);
void td_checkpoint_free(td_checkpoint *ck);
/* The newest valid checkpoint in dir: *path_out is NULL (and TD_OK) when there is none at all.
 * A newer corrupt one is skipped with a warning naming it; when every one is corrupt the newest
 * one's error is returned (TD_ERR_FORMAT). *path_out is malloc'd. */
td_status td_checkpoint_find_latest(const char *dir, char **path_out, td_checkpoint *out);

/* ---- safetensors ----
 * The model's parameters as PyTorch state_dict names (conv1.weight, conv1.bias, ...), float32,
 * in forward order; the header is JSON with sorted keys and no whitespace, padded with spaces
 * to 8 bytes, so the bytes depend only on the weights. Written atomically. */
td_status td_save_safetensors(const char *path, td_model_t *model);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_TRAIN_H */
