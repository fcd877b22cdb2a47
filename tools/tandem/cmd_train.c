/* tandem train: parse the flags, run the trainer, map the outcome to an exit code
 * (0 ok, 1 failure, 2 usage, 143/130 stopped by SIGTERM/SIGINT: after a checkpoint once training
 * has started, at once before it, when there is nothing to checkpoint). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "tandem/os.h"
#include "tandem/track.h"
#include "tandem/train.h"

enum {
    OPT_MODEL = 1,
    OPT_DATA,
    OPT_EPOCHS,
    OPT_STEPS,
    OPT_BATCH,
    OPT_ACCUM,
    OPT_OPTIMIZER,
    OPT_LR,
    OPT_MOMENTUM,
    OPT_DAMPENING,
    OPT_NESTEROV,
    OPT_WEIGHT_DECAY,
    OPT_SEED,
    OPT_THREADS,
    OPT_DEVICE,
    OPT_PRECISION,
    OPT_SAVE,
    OPT_CKPT_DIR,
    OPT_CKPT_EVERY,
    OPT_RESUME,
    OPT_EVAL_EPOCH,
    OPT_NO_EVAL_EPOCH,
    OPT_PROGRESS,
    OPT_NO_PROGRESS,
    OPT_LOG_EVERY,
    OPT_JSON,
    OPT_PROFILE,
    OPT_NPROC,
    OPT_NONDET_OK,
    OPT_VAL_DATA,
    OPT_VAL_FRACTION,
    OPT_DATA_FORMAT,
    OPT_TARGET,
    OPT_LOSS,
    OPT_MEAN,
    OPT_STD,
    OPT_IMAGE_SIZE,
    OPT_CHANNELS,
};

static const cli_opt train_opts[] = {
    {OPT_MODEL, "model", 0, "NAME|PATH",
     "basicnet, mlp7, mlp, resnet-small, or a YAML model spec;\n"
     "built for the data's shape and outputs (default basicnet)",
     0},
    {OPT_DATA, "data", 0, "PATH",
     "a directory of IDX files, an image folder (class subfolders,\n"
     "or train/ and test/ of them), FILE.csv, FILE.npz,\n"
     "FILE.safetensors or X.npy,Y.npy (docs/data.md; default\n"
     "/usr/share/datasets/fashion-mnist)",
     0},
    {OPT_DATA_FORMAT, "data-format", 0, "F",
     "idx, images, csv, npy, npz or safetensors (default: from\nthe path)", 0},
    {OPT_VAL_DATA, "val-data", 0, "PATH", "the held-out set, in any --data form", 0},
    {OPT_VAL_FRACTION, "val-fraction", 0, "F",
     "hold out this fraction of --data instead (a fixed shuffle,\nthe same for every seed)", 0},
    {OPT_TARGET, "target", 0, "COL|KEY",
     "CSV: the target column, by header name or 0-based index\n"
     "(default the last); npz/safetensors: the targets' array",
     0},
    {OPT_LOSS, "loss", 0, "L",
     "cross-entropy (class targets; default), mse (real values)\nor bce (0/1 labels)", 0},
    {OPT_MEAN, "mean", 0, "M[,M...]",
     "input normalisation per channel (per feature for tables),\n"
     "on x/255 for uint8 data; default: computed over the\ntraining set",
     0},
    {OPT_STD, "std", 0, "S[,S...]", "the matching standard deviations", 0},
    {OPT_IMAGE_SIZE, "image-size", 0, "H[xW]",
     "image folders: resize every image to this (default: the\nfirst image's size)", 0},
    {OPT_CHANNELS, "channels", 0, "1|3", "image folders: grey or RGB (default: the first image's)",
     0},
    {OPT_EPOCHS, "epochs", 0, "N", "how long to train (default 1 epoch)...", 0},
    {OPT_STEPS, "steps", 0, "N", "...or how many optimizer steps; give one of the two", 0},
    {OPT_BATCH, "batch", 0, "B", "samples per micro-batch per rank (default 64)", 0},
    {OPT_ACCUM, "accum", 0, "M",
     "micro-batches per step (default 1); global batch = B x M x WORLD_SIZE", 0},
    {OPT_OPTIMIZER, "optimizer", 0, "adamw|sgd", "the optimizer (default adamw)", 0},
    {OPT_LR, "lr", 0, "F", "learning rate (default 1e-3)", 0},
    {OPT_MOMENTUM, "momentum", 0, "F", "SGD momentum (default 0)", 0},
    {OPT_DAMPENING, "dampening", 0, "F", "SGD dampening (default 0)", 0},
    {OPT_NESTEROV, "nesterov", 0, NULL, "SGD Nesterov momentum", 0},
    {OPT_WEIGHT_DECAY, "weight-decay", 0, "F", "default 0.01 for adamw, 0 for sgd", 0},
    {OPT_SEED, "seed", 0, "S", "data order, init and dropout (default 0)", 0},
    {OPT_THREADS, "threads", 0, "T", "compute threads (default TANDEM_NUM_THREADS or all cores)",
     0},
    {OPT_DEVICE, "device", 0, "cpu|cuda[:N]",
     "where to train (default cpu); cuda takes GPU N, or the\n"
     "local rank modulo the GPUs present (several workers may\n"
     "share one); TANDEM_CUDA_GRAPH=0 launches the step kernel\n"
     "by kernel instead of replaying it as a CUDA graph",
     0},
    {OPT_PRECISION, "precision", 0, "P",
     "cuda: fp32 (default), or tf32 or bf16 tensor-core gemms\n"
     "with fp32 accumulation; weights, optimizer state and\n"
     "checkpoints stay fp32 (docs/gpu.md)",
     0},
    {OPT_SAVE, "save", 0, "FILE", "write the final weights as safetensors", 0},
    {OPT_CKPT_DIR, "checkpoint-dir", 0, "DIR", "write checkpoints there (the last 2 are kept)", 0},
    {OPT_CKPT_EVERY, "checkpoint-every", 0, "N",
     "also every N steps (default: epoch ends, the end, and on\nSIGTERM)", 0},
    {OPT_RESUME, "resume", 0, NULL, "continue from the newest valid checkpoint in the directory",
     0},
    {OPT_EVAL_EPOCH, "eval-every-epoch", 0, NULL, "test accuracy after every epoch (default)", 0},
    {OPT_NO_EVAL_EPOCH, "no-eval-every-epoch", 0, NULL, "test accuracy only at the end", 0},
    {OPT_PROGRESS, "progress", 0, NULL, "force the progress bar on (default: on a tty)", 0},
    {OPT_NO_PROGRESS, "no-progress", 0, NULL, "force the progress bar off", 0},
    {OPT_LOG_EVERY, "log-every", 0, "N", "steps between log lines when there is no bar", 0},
    {OPT_JSON, "json", 0, NULL, "end stdout with one JSON line of results", 0},
    {OPT_PROFILE, "profile", 0, NULL,
     "after training, where a step's time went (each layer's\n"
     "forward and backward, loss, optimizer, data, gradient\n"
     "wait; GFLOP/s of conv and linear layers), over the steps\n"
     "after the first 10; with --json, also as \"profile\"",
     0},
    {OPT_NPROC, "nproc-per-node", 0, "K",
     "start K local workers through 'tandem launch --standalone'", 0},
    {OPT_NONDET_OK, "nondeterministic-ok", 0, NULL,
     "train even where ranks run different float kernels\n"
     "(OpenBLAS core, instruction set): a warning, not an error",
     0},
    {0},
};

static const cli_command train_cmd = {
    .name = "tandem train",
    .usage = "--model NAME|SPEC.yaml --data PATH [options]",
    .opts = train_opts,
    .epilog =
        "Under 'tandem launch' (WORLD_SIZE > 1) each worker trains its shard of every global\n"
        "batch and gradients are averaged by the ddp reducer. TANDEM_CHECKPOINT_DIR and\n"
        "TANDEM_RESUME=1 (set by 'tandem run') stand for --checkpoint-dir and --resume;\n"
        "a launcher restart (TANDEM_RESTART_COUNT > 0) resumes too when checkpoints are on.\n"
        "TANDEM_PROGRESS=1|0 stands for --progress/--no-progress. TANDEM_METRICS=FILE\n"
        "receives the metrics as JSON lines.\n",
};

/* A usage error in cli_error's form: "tandem train: <what>" and the --help hint. */
static int usage_error(const char *fmt, ...) TD_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cli_error(&train_cmd, "%s", msg);
}

/* An integer flag value in [lo, hi]; prints the usage error itself. */
static int int_flag(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (td_parse_i64(flag, s, out) != TD_OK || *out < lo || *out > hi)
        return usage_error("%s '%s': must be an integer from %lld to %lld", flag, s, (long long)lo,
                           (long long)hi);
    return 0;
}

static int real_flag(const char *flag, const char *s, double *out) {
    if (td_parse_f64(flag, s, out) != TD_OK || *out < 0)
        return usage_error("%s '%s': must be a finite number >= 0", flag, s);
    return 0;
}

/* --mean / --std: one value, or one per channel. */
static int floats_flag(const char *flag, const char *s, float *out, int *n) {
    *n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || !isfinite(v) || (*end && *end != ',') || *n >= TD_DATA_MAX_CHANNELS)
            return usage_error("%s '%s': expected numbers separated by commas, one per channel",
                               flag, s);
        out[(*n)++] = (float)v;
        if (!*end) return 0;
        p = end + 1;
    }
}

/* --image-size H or HxW */
static int size_flag(const char *s, int *h, int *w) {
    int a = 0, b = 0, used = 0;
    if (sscanf(s, "%d%n", &a, &used) == 1 && !s[used])
        b = a;
    else if (sscanf(s, "%dx%d%n", &a, &b, &used) != 2 || s[used])
        a = 0;
    if (a < 1 || b < 1 || a > 4096 || b > 4096)
        return usage_error("--image-size '%s': use H or HxW, each 1 to 4096", s);
    *h = a, *w = b;
    return 0;
}

/* --device cpu | cuda | cuda:N */
static int device_flag(const char *s, td_train_config *cfg) {
    char name[16];
    const char *colon = strchr(s, ':');
    size_t len = colon ? (size_t)(colon - s) : strlen(s);
    if (len >= sizeof name) return usage_error("--device '%s': use cpu, cuda or cuda:N", s);
    memcpy(name, s, len);
    name[len] = '\0';
    if (td_device_parse(name, &cfg->device) != TD_OK)
        return usage_error("--device '%s': use cpu, cuda or cuda:N", s);
    cfg->gpu_device = -1;
    if (colon) {
        int64_t n;
        if (cfg->device != TD_DEVICE_CUDA || td_parse_i64("--device", colon + 1, &n) != TD_OK ||
            n < 0 || n > 1023)
            return usage_error("--device '%s': use cuda:N with N a GPU index from 0", s);
        cfg->gpu_device = (int)n;
    }
    return 0;
}

/* WORLD_SIZE / RANK as torchrun and `tandem launch` set them; 1 / 0 without. */
static int env_rank(td_var var, int64_t def, int64_t *out) {
    const char *name = td_var_name(var), *v = td_var_get(var);
    *out = def;
    if (!v || !*v) return 0;
    if (td_parse_i64(name, v, out) != TD_OK || *out < 0 || *out > 1 << 20) {
        fprintf(stderr, "tandem train: environment variable %s='%s' is not a valid count\n", name,
                v);
        return 2;
    }
    return 0;
}

/* An environment variable holding an integer > 0. */
static bool env_positive(td_var var) {
    const char *name = td_var_name(var), *v = td_var_get(var);
    int64_t n;
    return v && *v && td_parse_i64(name, v, &n) == TD_OK && n > 0;
}

/* Where the trainer's metrics go: the TANDEM_METRICS sink (rank 0 only: the numbers are already
 * reduced over ranks) and the evaluations, kept for the JSON summary. */
typedef struct {
    td_metrics_sink *sink;
    json_t *evals;  /* [{step, wall_s, train_s, test_acc}] */
    double t0;      /* the command's start: wall_s counts loading and set-up too */
    double t_train; /* the first step's start: train_s counts training and evaluations */
    const td_train_config *cfg;
} metrics_ctx;

static void on_metric(void *user, const char *key, int64_t step, double value) {
    metrics_ctx *m = user;
    td_status st = m->sink ? td_metrics_sink_log1(m->sink, step, key, value) : TD_OK;
    if (st == TD_ERR_NOSPACE) {
        td_error_clear(); /* the sink said so once, and writes again when there is room */
    } else if (st != TD_OK) {
        TD_LOG_WARN("metrics sink: %s; metrics are no longer recorded", td_error_msg());
        td_metrics_sink_close(m->sink);
        m->sink = NULL;
    }
    if (!strcmp(key, "test/acc")) {
        json_t *e = json_object();
        json_object_set_new(e, "step", json_integer(step));
        json_object_set_new(e, "wall_s", json_real(td_now_s() - m->t0));
        json_object_set_new(e, "train_s", json_real(m->t_train > 0 ? td_now_s() - m->t_train : 0));
        json_object_set_new(e, "test_acc", json_real(value));
        json_array_append_new(m->evals, e);
    }
}

/* Before the first step (reading the data, which can take minutes; waiting for peers; loading a
 * checkpoint) a stop has nothing to save: SIGTERM or SIGINT ends the process at once, with the
 * code a stop after a checkpoint has, so a launcher treats both alike and a resume simply starts
 * (or continues) from the checkpoints there are. _exit is async-signal-safe; no --json line. */
static void exit_before_training(int sig) {
    _exit(128 + sig);
}

static void on_started(void *user) {
    metrics_ctx *m = user;
    m->t_train = td_now_s();
    /* from the first step on, the trainer's handlers: finish the step, checkpoint, return */
    td_train_install_signal_handlers();
}

/* A tracked run (TANDEM_RUN_DIR) records what the data decided as its config, through the file
 * the store reads for it (RUN/sdk.json, docs/runs.md): tandem show and the run page list it. */
static void on_configured(void *user, const char *data, int outputs, int n, const float *mean,
                          const float *std) {
    metrics_ctx *m = user;
    const char *run_dir = td_var_get(TD_VAR_TANDEM_RUN_DIR);
    if (!m->cfg || m->cfg->rank != 0 || !run_dir || !*run_dir) return;
    const td_train_config *cfg = m->cfg;
    json_t *config = json_object(), *jm = json_array(), *js = json_array();
    for (int i = 0; i < n; i++) {
        json_array_append_new(jm, json_real(mean[i]));
        json_array_append_new(js, json_real(std[i]));
    }
    json_object_set_new(config, "data", json_string(data));
    json_object_set_new(config, "data_path", json_string(cfg->data_dir));
    if (cfg->val_data) json_object_set_new(config, "val_data", json_string(cfg->val_data));
    if (cfg->val_fraction > 0)
        json_object_set_new(config, "val_fraction", json_real(cfg->val_fraction));
    json_object_set_new(config, "model", json_string(cfg->model));
    json_object_set_new(config, "loss", json_string(td_loss_name(cfg->loss)));
    json_object_set_new(config, "outputs", json_integer(outputs));
    json_object_set_new(config, "norm_mean", jm);
    json_object_set_new(config, "norm_std", js);
    json_object_set_new(config, "batch", json_integer(cfg->batch));
    json_object_set_new(config, "accum", json_integer(cfg->accum));
    json_object_set_new(config, "world_size", json_integer(cfg->world_size));
    json_object_set_new(config, "optimizer", json_string(td_optim_kind_name(cfg->optim.kind)));
    json_object_set_new(config, "lr", json_real(cfg->optim.lr));
    json_object_set_new(config, "seed", json_integer((json_int_t)cfg->seed));
    json_t *doc = json_object();
    json_object_set_new(doc, "format", json_integer(1));
    json_object_set_new(doc, "config", config);
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(doc);
    char *path = td_run_path(run_dir, TD_RUN_PATH_SDK);
    td_chunk chunk = {text, strlen(text)};
    if (td_write_atomic(path, "the run's config", &chunk, 1) != TD_OK) {
        TD_LOG_WARN("%s; the run's page lacks the data's config", td_error_msg());
        td_error_clear();
    }
    free(path);
    free(text);
}

static void on_resumed(void *user, int64_t step) {
    metrics_ctx *m = user;
    if (m->sink) td_metrics_sink_resume(m->sink, step);
}

/* `tandem train --nproc-per-node K ARGS` is `tandem launch --standalone --nproc-per-node K --
 * tandem train ARGS`: replace this process with the launcher. Returns only on failure. */
static int exec_launcher(int argc, char **argv, const char *nproc) {
    /* The launcher pipes the workers' output: tell rank 0 the user is watching a terminal. */
    if (isatty(STDERR_FILENO)) setenv(td_var_name(TD_VAR_TANDEM_PROGRESS), "1", 0);
    char **args = td_xcalloc((size_t)argc + 8, sizeof(char *));
    int n = 0;
    args[n++] = "/proc/self/exe";
    args[n++] = "launch";
    args[n++] = "--standalone";
    args[n++] = "--nproc-per-node";
    args[n++] = (char *)nproc;
    args[n++] = "--";
    args[n++] = "/proc/self/exe";
    args[n++] = "train";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc-per-node")) {
            i++;
            continue;
        }
        if (!strncmp(argv[i], "--nproc-per-node=", 17)) continue;
        args[n++] = argv[i];
    }
    execv("/proc/self/exe", args);
    fprintf(stderr, "tandem train: could not start 'tandem launch': %s\n", strerror(errno));
    free(args);
    return 1;
}

/* Whether a row is a layer whose work is a gemm (conv, linear): the compute-bound ones. */
static bool gemm_row(const td_train_profile_row *p) {
    return !strcmp(p->kind, "conv2d") || !strcmp(p->kind, "linear");
}

/* --profile's table, on stderr: rows with a share of the step's thread time, then the conv and
 * linear layers together (what the sgemm peak bounds). */
static void print_profile(const td_train_result *r, int batch) {
    if (!r->profile_rows || r->profile_steps <= 0) return;
    double total = 0, gemm_ms = 0, gemm_flops = 0;
    for (int i = 0; i < r->profile_rows; i++) {
        const td_train_profile_row *p = &r->profile[i];
        total += p->fwd_ms + p->bwd_ms;
        if (gemm_row(p)) gemm_ms += p->fwd_ms + p->bwd_ms, gemm_flops += p->flops;
    }
    fprintf(stderr,
            "profile: %lld steps after the first 10, batch %d, %d thread%s; a step took %.2f ms "
            "(wall), %.2f ms of thread time below\n",
            (long long)r->profile_steps, batch, r->profile_threads,
            r->profile_threads == 1 ? "" : "s", r->profile_step_ms, total);
    fprintf(stderr, "  %-20s %-12s %10s %10s %10s %6s %8s\n", "layer", "kind", "fwd ms",
            "bwd ms", "total ms", "%", "GFLOP/s");
    for (int i = 0; i < r->profile_rows; i++) {
        const td_train_profile_row *p = &r->profile[i];
        double ms = p->fwd_ms + p->bwd_ms;
        char gf[16] = "";
        if (p->flops > 0 && ms > 0) snprintf(gf, sizeof gf, "%.1f", p->flops / ms * 1e-6);
        char bwd[16] = "";
        if (p->bwd_ms > 0 || p->flops > 0) snprintf(bwd, sizeof bwd, "%.3f", p->bwd_ms);
        fprintf(stderr, "  %-20s %-12s %10.3f %10s %10.3f %5.1f%% %8s\n", p->name, p->kind,
                p->fwd_ms, bwd, ms, total > 0 ? 100.0 * ms / total : 0.0, gf);
    }
    if (gemm_ms > 0)
        fprintf(stderr,
                "  %-20s %-12s %10s %10s %10.3f %5.1f%% %8.1f   (GFLOP/s per thread: FLOPs of "
                "a direct conv, so Winograd's count as saved)\n",
                "conv + linear", "", "", "", gemm_ms, total > 0 ? 100.0 * gemm_ms / total : 0.0,
                gemm_flops / gemm_ms * 1e-6);
}

static void print_json(const td_train_config *cfg, const td_train_result *r, td_status st,
                       const td_train_dist *dist, json_t *evals) {
    json_t *o = json_object();
    json_object_set(o, "evals", evals);
    if (dist) {
        int buckets;
        double comm_s, wait_s;
        uint64_t steps;
        td_train_dist_stats(dist, &buckets, &comm_s, &wait_s, &steps);
        json_object_set_new(o, "buckets", json_integer(buckets));
        json_object_set_new(o, "comm_s_per_step", json_real(steps ? comm_s / (double)steps : 0));
        json_object_set_new(o, "comm_wait_s_per_step",
                            json_real(steps ? wait_s / (double)steps : 0));
    }
    json_object_set_new(o, "steps", json_integer(r->steps));
    json_object_set_new(o, "world_size", json_integer(r->world_size));
    json_object_set_new(o, "samples", json_integer(r->samples));
    json_object_set_new(o, "samples_per_s", json_real(r->samples_per_s));
    json_object_set_new(o, "samples_per_s_steady", json_real(r->samples_per_s_steady));
    json_object_set_new(o, "final_loss",
                        isfinite(r->final_loss) ? json_real(r->final_loss) : json_null());
    json_object_set_new(o, "final_train_acc",
                        isfinite(r->final_acc) ? json_real(100.0 * r->final_acc) : json_null());
    json_object_set_new(o, "test_acc",
                        isfinite(r->test_acc) ? json_real(r->test_acc) : json_null());
    json_object_set_new(o, "test_loss",
                        isfinite(r->test_loss) ? json_real(r->test_loss) : json_null());
    json_object_set_new(o, "wall_s", json_real(r->wall_s));
    json_object_set_new(o, "epochs", json_integer(r->epochs));
    json_object_set_new(o, "global_batch", json_integer(r->global_batch));
    json_object_set_new(o, "batch", json_integer(cfg->batch));
    json_object_set_new(o, "accum", json_integer(cfg->accum));
    json_object_set_new(o, "params", json_integer((json_int_t)r->num_params));
    json_object_set_new(o, "rank", json_integer(cfg->rank));
    json_object_set_new(o, "start_step", json_integer(r->start_step));
    json_object_set_new(o, "model", json_string(cfg->model));
    json_object_set_new(o, "device", json_string(td_device_name(cfg->device)));
    json_object_set_new(o, "precision", json_string(td_precision_name(cfg->precision)));
    if (r->flops_per_sample > 0)
        json_object_set_new(o, "flops_per_sample", json_real(r->flops_per_sample));
    json_object_set_new(o, "optimizer", json_string(td_optim_kind_name(cfg->optim.kind)));
    json_object_set_new(o, "loss", json_string(td_loss_name(cfg->loss)));
    json_object_set_new(o, "outputs", json_integer(r->outputs));
    if (r->norm_count > 0) {
        json_t *m = json_array(), *sd = json_array();
        for (int i = 0; i < r->norm_count; i++) {
            json_array_append_new(m, json_real(r->norm_mean[i]));
            json_array_append_new(sd, json_real(r->norm_std[i]));
        }
        json_object_set_new(o, "norm_mean", m);
        json_object_set_new(o, "norm_std", sd);
    }
    if (r->profile_rows) {
        json_t *rows = json_array();
        for (int i = 0; i < r->profile_rows; i++) {
            const td_train_profile_row *p = &r->profile[i];
            json_array_append_new(rows, json_pack("{s:s, s:s, s:f, s:f, s:f}", "name", p->name,
                                                  "kind", p->kind, "fwd_ms", p->fwd_ms, "bwd_ms",
                                                  p->bwd_ms, "flops", p->flops));
        }
        json_object_set_new(o, "profile",
                            json_pack("{s:I, s:i, s:f, s:o}", "steps", (json_int_t)r->profile_steps,
                                      "threads", r->profile_threads, "step_ms", r->profile_step_ms,
                                      "rows", rows));
    }
    json_object_set_new(o, "status",
                        json_string(st == TD_OK                ? "ok"
                                    : st == TD_ERR_INTERRUPTED ? "stopped"
                                                               : "failed"));
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(10));
    printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(o);
}

int cmd_train(int argc, char **argv) {
    /* A worker of tandem launch behind a wrapper (`/bin/sh -c '... tandem train ...'`) stops
     * (SIGTERM: checkpoint, exit) when the wrapper dies with the launcher, not train on alone. */
    if (td_var_get(TD_VAR_RANK) && td_var_get(TD_VAR_TANDEM_RUN_ID) &&
        td_die_with_parent(SIGTERM) != TD_OK) {
        td_error_print(TD_ERR_PEER);
        return 1;
    }
    td_train_config cfg;
    td_train_config_defaults(&cfg);
    const char *optimizer = "adamw";
    double lr = NAN, momentum = NAN, dampening = NAN, wd = NAN;
    bool nesterov = false, json = false, have_epochs = false, have_steps = false;
    const char *nproc = NULL;
    int64_t v;
    static float mean[TD_DATA_MAX_CHANNELS], std[TD_DATA_MAX_CHANNELS];
    int nmean = 0, nstd = 0;
    cli_parser p;
    cli_init(&p, &train_cmd, argc, argv);
    for (int c; (c = cli_next(&p)) != CLI_END;) {
        const char *val = p.value;
        int bad = 0;
        switch (c) {
        case CLI_EXIT:
            return p.exit_code;
        case CLI_ARG:
            return usage_error("unexpected argument '%s'", val);
        case OPT_NPROC:
            nproc = val;
            break;
        case OPT_MODEL:
            cfg.model = val;
            break;
        case OPT_DATA:
            cfg.data_dir = val;
            break;
        case OPT_DATA_FORMAT:
            cfg.data_options.format = val;
            break;
        case OPT_VAL_DATA:
            cfg.val_data = val;
            break;
        case OPT_VAL_FRACTION:
            if (td_parse_f64("--val-fraction", val, &cfg.val_fraction) != TD_OK ||
                !(cfg.val_fraction > 0 && cfg.val_fraction < 1))
                bad = usage_error("--val-fraction '%s': a fraction between 0 and 1", val);
            break;
        case OPT_TARGET:
            cfg.data_options.target = val;
            break;
        case OPT_LOSS:
            if (td_loss_parse(val, &cfg.loss) != TD_OK) bad = usage_error("%s", td_error_msg());
            break;
        case OPT_MEAN:
            bad = floats_flag("--mean", val, mean, &nmean);
            break;
        case OPT_STD:
            bad = floats_flag("--std", val, std, &nstd);
            break;
        case OPT_IMAGE_SIZE:
            bad = size_flag(val, &cfg.data_options.height, &cfg.data_options.width);
            break;
        case OPT_CHANNELS:
            if (strcmp(val, "1") && strcmp(val, "3"))
                bad = usage_error("--channels '%s': use 1 (grey) or 3 (RGB)", val);
            else
                cfg.data_options.channels = atoi(val);
            break;
        case OPT_EPOCHS:
            bad = int_flag("--epochs", val, 1, INT32_MAX, &cfg.epochs);
            have_epochs = true;
            break;
        case OPT_STEPS:
            bad = int_flag("--steps", val, 1, INT64_MAX / 2, &cfg.steps);
            have_steps = true;
            break;
        case OPT_BATCH:
            bad = int_flag("--batch", val, 1, 1 << 20, &v);
            cfg.batch = (int)v;
            break;
        case OPT_ACCUM:
            bad = int_flag("--accum", val, 1, 1 << 16, &v);
            cfg.accum = (int)v;
            break;
        case OPT_LR:
            bad = real_flag("--lr", val, &lr);
            break;
        case OPT_OPTIMIZER:
            optimizer = val;
            break;
        case OPT_MOMENTUM:
            bad = real_flag("--momentum", val, &momentum);
            break;
        case OPT_DAMPENING:
            bad = real_flag("--dampening", val, &dampening);
            break;
        case OPT_NESTEROV:
            nesterov = true;
            break;
        case OPT_WEIGHT_DECAY:
            bad = real_flag("--weight-decay", val, &wd);
            break;
        case OPT_SEED:
            bad = int_flag("--seed", val, 0, INT64_MAX, &v);
            cfg.seed = (uint64_t)v;
            break;
        case OPT_THREADS:
            bad = int_flag("--threads", val, 1, 1024, &v);
            cfg.threads = (int)v;
            break;
        case OPT_DEVICE:
            bad = device_flag(val, &cfg);
            break;
        case OPT_NONDET_OK:
            cfg.nondeterministic_ok = true;
            break;
        case OPT_PRECISION:
            if (td_precision_parse(val, &cfg.precision) != TD_OK)
                bad = usage_error("--precision '%s': use fp32, tf32 or bf16", val);
            break;
        case OPT_SAVE:
            cfg.save_path = val;
            break;
        case OPT_CKPT_DIR:
            cfg.checkpoint_dir = val;
            break;
        case OPT_CKPT_EVERY:
            bad = int_flag("--checkpoint-every", val, 1, INT64_MAX / 2, &cfg.checkpoint_every);
            break;
        case OPT_RESUME:
            cfg.resume = true;
            break;
        case OPT_JSON:
            json = true;
            break;
        case OPT_PROFILE:
            cfg.profile = true;
            break;
        case OPT_EVAL_EPOCH:
            cfg.eval_every_epoch = true;
            break;
        case OPT_NO_EVAL_EPOCH:
            cfg.eval_every_epoch = false;
            break;
        case OPT_PROGRESS:
            cfg.progress = 1;
            break;
        case OPT_NO_PROGRESS:
            cfg.progress = 0;
            break;
        case OPT_LOG_EVERY:
            bad = int_flag("--log-every", val, 1, INT64_MAX / 2, &cfg.log_every);
            break;
        }
        if (bad) return bad;
    }
    /* The flags are sound: each worker parses them again. */
    if (nproc) return exec_launcher(argc, argv, nproc);
    /* What `tandem run` passes through the environment stands for the flags when they are
     * absent. */
    const char *env_ckpt = td_var_get(TD_VAR_TANDEM_CHECKPOINT_DIR);
    if (!cfg.checkpoint_dir && env_ckpt) cfg.checkpoint_dir = env_ckpt;
    const char *env_resume = td_var_get(TD_VAR_TANDEM_RESUME);
    if (env_resume && !strcmp(env_resume, "1")) cfg.resume = true;
    /* A launcher restart (tandem launch / torchrun --max-restarts after a worker died) re-runs
     * the same command: continue from the newest checkpoint instead of redoing the steps. */
    if (cfg.checkpoint_dir && (env_positive(TD_VAR_TANDEM_RESTART_COUNT) ||
                               env_positive(TD_VAR_TORCHELASTIC_RESTART_COUNT)))
        cfg.resume = true;
    /* The launcher's output is a pipe even when the user's terminal is not: TANDEM_PROGRESS=1
     * (set by `tandem run` / `tandem train --nproc-per-node` on a terminal) asks for the bar. */
    const char *env_progress = td_var_get(TD_VAR_TANDEM_PROGRESS);
    if (cfg.progress < 0 && env_progress &&
        (!strcmp(env_progress, "1") || !strcmp(env_progress, "0")))
        cfg.progress = env_progress[0] == '1';
    if (have_epochs && have_steps)
        return usage_error("--epochs and --steps exclude each other; give one");
    if (nmean != nstd)
        return usage_error("--mean has %d value%s and --std %d; give both, with one value per "
                           "channel (or one for all)",
                           nmean, nmean == 1 ? "" : "s", nstd);
    for (int i = 0; i < nstd; i++)
        if (!(std[i] > 0)) return usage_error("--std: %g is not above 0", (double)std[i]);
    cfg.norm_count = nmean, cfg.norm_mean = mean, cfg.norm_std = std;
    if (cfg.val_data && cfg.val_fraction > 0)
        return usage_error("--val-data and --val-fraction exclude each other; give one");
    if (cfg.profile && cfg.device == TD_DEVICE_CUDA)
        return usage_error("--profile times the CPU engine's layers; for --device cuda use "
                           "nsys or ncu (docs/gpu.md)");
    if (cfg.precision != TD_PRECISION_FP32 && cfg.device != TD_DEVICE_CUDA)
        return usage_error("--precision %s is for --device cuda: the CPU engine trains in fp32 "
                           "(drop --precision, or add --device cuda)",
                           td_precision_name(cfg.precision));
    td_optim_kind kind;
    if (td_optim_parse_kind(optimizer, &kind) != TD_OK)
        return usage_error("--optimizer '%s': use adamw or sgd", optimizer);
    cfg.optim = td_optim_defaults(kind);
    if (!isnan(lr)) cfg.optim.lr = lr;
    if (!isnan(wd)) cfg.optim.weight_decay = wd;
    if (kind != TD_OPTIM_SGD && (!isnan(momentum) || !isnan(dampening) || nesterov))
        return usage_error("--momentum, --dampening and --nesterov apply to --optimizer sgd only");
    if (!isnan(momentum)) cfg.optim.momentum = momentum;
    if (!isnan(dampening)) cfg.optim.dampening = dampening;
    cfg.optim.nesterov = nesterov;
    if (nesterov && (cfg.optim.momentum <= 0 || cfg.optim.dampening != 0))
        return usage_error("--nesterov needs --momentum > 0 and --dampening 0");
    if (cfg.resume && !cfg.checkpoint_dir)
        return usage_error("--resume needs --checkpoint-dir DIR");
    int64_t world, rank;
    if (env_rank(TD_VAR_WORLD_SIZE, 1, &world) || env_rank(TD_VAR_RANK, 0, &rank)) return 2;
    if (world < 1 || rank >= world) {
        fprintf(stderr, "tandem train: RANK=%lld is not below WORLD_SIZE=%lld\n", (long long)rank,
                (long long)world);
        return 2;
    }
    cfg.world_size = (int)world;
    cfg.rank = (int)rank;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = exit_before_training;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    td_train_dist *dist = NULL;
    td_status st = TD_OK;
    if (cfg.world_size > 1) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "[rank %d] ", cfg.rank);
        td_log_set_prefix(
            td_var_get(TD_VAR_TANDEM_STORE_ADDR) ? "" : prefix); /* launch prefixes lines */
        st = td_train_dist_from_env(&dist);
        if (st != TD_OK) {
            td_error_print(st);
            return 1;
        }
        cfg.make_reducer = td_train_dist_make_reducer;
        cfg.make_reducer_user = dist;
    }
    metrics_ctx metrics = {.evals = json_array(), .t0 = td_now_s(), .cfg = &cfg};
    if (cfg.rank == 0 && td_metrics_sink_open(NULL, &metrics.sink) != TD_OK) {
        td_error_print(TD_ERR_IO);
        td_train_dist_free(dist);
        json_decref(metrics.evals);
        return 1;
    }
    cfg.callbacks = (td_train_callbacks){.user = &metrics,
                                         .metric = on_metric,
                                         .resumed = on_resumed,
                                         .started = on_started,
                                         .configured = on_configured};
    if (cfg.rank != 0) cfg.progress = 0; /* one bar per job: rank 0's */

    td_train_result res;
    st = td_train_run(&cfg, &res);
    if (st == TD_ERR_INTERRUPTED) {
        if (cfg.rank == 0) TD_LOG_INFO("%s", td_error_msg()); /* a clean stop, not an error */
    } else if (st != TD_OK) {
        td_error_print(st);
    }
    if (cfg.profile && cfg.rank == 0 && (st == TD_OK || st == TD_ERR_INTERRUPTED)) {
        if (res.profile_rows)
            print_profile(&res, cfg.batch);
        else
            TD_LOG_WARN("--profile: no step after the first 10 ran (%lld steps), nothing to show",
                        (long long)(res.steps - res.start_step));
    }
    if (json && cfg.rank == 0 && (st == TD_OK || st == TD_ERR_INTERRUPTED))
        print_json(&cfg, &res, st, dist, metrics.evals);
    td_train_result_release(&res);
    td_metrics_sink_close(metrics.sink);
    json_decref(metrics.evals);
    td_train_dist_free(dist);
    if (st == TD_ERR_INTERRUPTED) return res.stop_signal == SIGINT ? 130 : 143;
    if (st == TD_ERR_INVALID) return 2; /* a setting the trainer rejected: a usage error */
    return st == TD_OK ? 0 : 1;
}
