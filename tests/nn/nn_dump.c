/* nn_dump: runs one forward (dropout off) + NLL loss (mean) + backward of a model and writes
 * everything as raw little-endian files for test_torch_compare.py:
 *   params.bin grads.bin out.bin (float32), x.bin (float32), labels.bin (int32), loss.bin (f64)
 * usage: nn_dump MODEL SEED BATCH OUTDIR [THREADS [cpu|cuda [C,H,W,OUTPUTS [train]]]]
 * With cuda the forward and backward run on the CUDA engine (exit 77 when there is none).
 * C,H,W,OUTPUTS loads MODEL with td_model_load_for for that data shape; train runs the forward
 * in training mode (batchnorm on batch statistics) and then also writes batch_stats.bin and
 * buffers.bin (the running statistics after one td_model_update_running_stats) and
 * model.safetensors (td_save_safetensors: parameters, running statistics, batches tracked). Every
 * run also writes target.bin and mse.bin / bce.bin (f64 loss, then float32 gradient) of the output
 * against it, for the losses' comparison. */
#include <stdlib.h>
#include <string.h>

#include "tandem/gpu.h"

#include "tandem/nn.h"
#include "tandem/tensor.h"
#include "tandem/train.h"

static int write_file(const char *dir, const char *name, const void *data, size_t nbytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, nbytes, f) != nbytes || fclose(f)) {
        fprintf(stderr, "nn_dump: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: nn_dump MODEL SEED BATCH OUTDIR [THREADS]\n");
        return 2;
    }
    uint64_t seed = strtoull(argv[2], NULL, 10);
    int batch = atoi(argv[3]);
    const char *dir = argv[4];
    td_set_num_threads(argc > 5 ? atoi(argv[5]) : 0);
    td_model_t *m;
    int c = 0, h = 0, w = 0, outputs = 0;
    bool train = argc > 8 && !strcmp(argv[8], "train");
    td_status st;
    if (argc > 7 && sscanf(argv[7], "%d,%d,%d,%d", &c, &h, &w, &outputs) == 4)
        st = td_model_load_for(argv[1], c, h, w, outputs, &m);
    else
        st = td_model_load(argv[1], &m);
    if (st == TD_OK) st = td_model_finalize(m, batch);
    if (st != TD_OK) {
        td_error_print(st);
        return 1;
    }
    td_model_init_params(m, seed);
    int in = td_model_input_size(m), classes = td_model_output_size(m);
    float *x = malloc(sizeof(float) * (size_t)batch * in);
    float *dout = malloc(sizeof(float) * (size_t)batch * classes);
    int32_t *labels = malloc(sizeof(int32_t) * (size_t)batch);
    td_rng_fill_uniform(seed + 1000, 0, -1.0f, 1.0f, x, (size_t)batch * in);
    for (int i = 0; i < batch; i++)
        labels[i] = (int32_t)(td_rng_uniform(seed + 2000, 0, (uint64_t)i) * (float)classes);
    size_t np = td_model_num_params(m);
    int rc = write_file(dir, "params.bin", td_model_params(m), sizeof(float) * np);
    td_forward_ctx ctx = {.training = train, .seed = seed, .step = 1};
    td_model_zero_grads(m);
    bool cuda = argc > 6 && !strcmp(argv[6], "cuda");
    td_gpu_t *g = NULL;
    float *gout = malloc(sizeof(float) * (size_t)batch * classes);
    const float *out;
    if (cuda) {
        char why[512];
        if (!td_gpu_available(why, sizeof why)) {
            printf("SKIP: %s\n", why);
            return 77;
        }
        td_optim_config o = td_optim_defaults(TD_OPTIM_ADAMW);
        td_gpu_config gc = {
            .device = -1, .batch = batch, .accum = 1, .world_size = 1, .max_eval_batch = batch};
        st = td_gpu_new(m, &o, &gc, &g);
        if (st == TD_OK) st = td_gpu_upload_state(g, td_model_params(m), NULL, 0);
        if (st == TD_OK) st = td_gpu_model_forward(g, x, batch, &ctx, gout);
        if (st != TD_OK) {
            td_error_print(st);
            return 1;
        }
        out = gout;
    } else {
        out = td_model_forward(m, x, batch, &ctx);
    }
    double loss = td_nll_loss(out, labels, batch, classes, 1.0f / batch, dout) / batch;
    rc |= write_file(dir, "out.bin", out, sizeof(float) * (size_t)batch * classes);
    {
        size_t n = (size_t)batch * classes;
        float *target = malloc(sizeof(float) * n), *grad = malloc(sizeof(float) * n);
        td_rng_fill_uniform(seed + 3000, 0, 0.0f, 1.0f, target, n);
        rc |= write_file(dir, "target.bin", target, sizeof(float) * n);
        for (int k = 0; k < 2; k++) {
            double l = (k ? td_bce_with_logits : td_mse_loss)(out, target, batch, classes,
                                                              1.0f / batch, grad) /
                       batch;
            char *buf = malloc(sizeof l + sizeof(float) * n);
            memcpy(buf, &l, sizeof l);
            memcpy(buf + sizeof l, grad, sizeof(float) * n);
            rc |= write_file(dir, k ? "bce.bin" : "mse.bin", buf, sizeof l + sizeof(float) * n);
            free(buf);
        }
        free(target), free(grad);
    }
    size_t nb = td_model_num_buffers(m);
    if (train && nb) {
        const float *bstats = td_model_batch_stats(m);
        float *gstats = NULL;
        if (cuda) { /* the device's statistics, as the trainer takes them (td_gpu_step_bn_stats) */
            gstats = malloc(sizeof(float) * nb);
            st = td_gpu_batch_stats(g, gstats);
            if (st != TD_OK) {
                td_error_print(st);
                return 1;
            }
            bstats = gstats;
        }
        rc |= write_file(dir, "batch_stats.bin", bstats, sizeof(float) * nb);
        td_model_update_running_stats(m, bstats);
        free(gstats);
        rc |= write_file(dir, "buffers.bin", td_model_buffers(m), sizeof(float) * nb);
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        td_status sst = td_save_safetensors(path, m);
        if (sst != TD_OK) {
            td_error_print(sst);
            rc = 1;
        }
    }
    if (cuda) {
        st = td_gpu_model_backward(g, dout, batch, td_model_grads(m));
        td_gpu_free(g);
        if (st != TD_OK) {
            td_error_print(st);
            return 1;
        }
    } else {
        td_model_backward(m, dout, batch);
    }
    free(gout);
    rc |= write_file(dir, "x.bin", x, sizeof(float) * (size_t)batch * in);
    rc |= write_file(dir, "labels.bin", labels, sizeof(int32_t) * (size_t)batch);
    rc |= write_file(dir, "loss.bin", &loss, sizeof loss);
    rc |= write_file(dir, "grads.bin", td_model_grads(m), sizeof(float) * np);
    printf("nn_dump: %s on %s params=%zu batch=%d loss=%.6f\n", argv[1], cuda ? "cuda" : "cpu", np,
           batch, loss);
    free(x), free(dout), free(labels);
    td_model_free(m);
    return rc;
}
