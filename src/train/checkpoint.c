/* Checkpoints: a fixed little-endian header, a JSON description of the run, then the raw float
 * buffers. A CRC-32 over everything but the CRC field catches any flipped or missing byte.
 * Format: docs/checkpoint-format.md. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/train.h"
#include "tandem/ckpt.h"
#include "tandem/os.h"

#define CKPT_MAGIC          "TDCKPT\r\n" /* \r\n catches text-mode mangling, like PNG's signature */
#define CKPT_VERSION        1u
#define CKPT_HEADER_BYTES   64u
#define CKPT_MAX_META_BYTES (1u << 20)

/* Header layout (all little-endian):
 *   0  magic[8]   8 version u32   12 header_bytes u32   16 meta_bytes u32   20 crc32 u32
 *   24 num_params u64   32 optim_state_count u64   40 payload_bytes u64   48 reserved[16] = 0 */
enum {
    OFF_VERSION = 8,
    OFF_HEADER_BYTES = 12,
    OFF_META_BYTES = 16,
    OFF_CRC = 20,
    OFF_NUM_PARAMS = 24,
    OFF_STATE_COUNT = 32,
    OFF_PAYLOAD_BYTES = 40,
};

static void put32(uint8_t *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *b) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)b[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static char *meta_json(const td_checkpoint *ck) {
    json_t *o = json_object();
    json_t *opt = json_object();
    json_object_set_new(opt, "kind", json_string(td_optim_kind_name(ck->optim.kind)));
    json_object_set_new(opt, "lr", json_real(ck->optim.lr));
    json_object_set_new(opt, "weight_decay", json_real(ck->optim.weight_decay));
    json_object_set_new(opt, "momentum", json_real(ck->optim.momentum));
    json_object_set_new(opt, "dampening", json_real(ck->optim.dampening));
    json_object_set_new(opt, "nesterov", json_boolean(ck->optim.nesterov));
    json_object_set_new(opt, "beta1", json_real(ck->optim.beta1));
    json_object_set_new(opt, "beta2", json_real(ck->optim.beta2));
    json_object_set_new(opt, "eps", json_real(ck->optim.eps));
    json_object_set_new(opt, "steps", json_integer((json_int_t)ck->optim_steps));
    json_object_set_new(o, "format", json_string("tandem-checkpoint"));
    json_object_set_new(o, "model", json_string(ck->model));
    json_object_set_new(o, "num_params", json_integer((json_int_t)ck->num_params));
    json_object_set_new(o, "batch", json_integer(ck->batch));
    json_object_set_new(o, "accum", json_integer(ck->accum));
    json_object_set_new(o, "world_size", json_integer(ck->world_size));
    json_object_set_new(o, "seed", json_integer((json_int_t)ck->seed));
    json_object_set_new(o, "step", json_integer(ck->step));
    json_object_set_new(o, "epoch", json_integer(ck->epoch));
    json_object_set_new(o, "step_in_epoch", json_integer(ck->step_in_epoch));
    json_object_set_new(o, "optimizer", opt);
    /* BatchNorm's running statistics follow the optimizer state; older files have none */
    if (ck->buffer_count) {
        json_object_set_new(o, "buffers", json_integer((json_int_t)ck->buffer_count));
        json_object_set_new(o, "batches_tracked", json_integer(ck->batches_tracked));
    }
    if (ck->norm_count > 0) {
        json_t *mean = json_array(), *std = json_array(), *norm = json_object();
        for (int i = 0; i < ck->norm_count; i++) {
            json_array_append_new(mean, json_real(ck->norm_mean[i]));
            json_array_append_new(std, json_real(ck->norm_std[i]));
        }
        json_object_set_new(norm, "mean", mean);
        json_object_set_new(norm, "std", std);
        json_object_set_new(o, "normalization", norm);
    }
    /* %.17g reals round-trip exactly, so hyperparameters compare equal after a load */
    char *s = json_dumps(o, JSON_SORT_KEYS | JSON_INDENT(1) | JSON_REAL_PRECISION(17));
    json_decref(o);
    return s;
}

/* Removes what killed writers left in dir: .ckpt-<step>.tdck.tmp.<pid> files (24-45 MB for the
 * presets) whose writer is gone (td_remove_stale_tmp says how that is told). Called where a
 * trainer first opens a directory (the resume's search, or its first save): a live process's own
 * writes leave nothing behind, so once per directory is enough. Best effort: a directory that
 * cannot be listed is reported by the save or the search itself. */
static void remove_stale_temporaries(const char *dir) {
    static char *swept; /* the directory this process swept last */
    if (swept && !strcmp(swept, dir)) return;
    free(swept);
    swept = td_xstrdup(dir);
    if (td_remove_stale_tmp(dir, "ckpt-", ".tdck", NULL) != TD_OK) {
        TD_LOG_WARN("checkpoint directory %s: %s", dir, td_error_msg());
        td_error_clear();
    }
}

/* Steps of the committed ckpt-<step>.tdck files in dir (the contract: tandem/ckpt.h), newest
 * first. */
static int64_t *list_steps(const char *dir, size_t *count) {
    int n;
    td_ckpt_entry *v = td_ckpt_list(dir, TD_CKPT_TDCK, &n);
    int64_t *steps = td_xmalloc(((size_t)n + 1) * sizeof *steps);
    for (int i = 0; i < n; i++) steps[i] = v[i].n.step;
    td_ckpt_list_free(v, n);
    *count = (size_t)n;
    return steps;
}

/* dir/ckpt-<step>.tdck, named by the contract. */
static char *ckpt_path(const char *dir, int64_t step) {
    char name[64];
    td_ckpt_build(TD_CKPT_TDCK, step, name, sizeof name);
    return td_xasprintf("%s/%s", dir, name);
}

td_status td_checkpoint_save(const char *dir, const td_checkpoint *ck, int keep) {
    char name[64];
    if (!td_ckpt_build(TD_CKPT_TDCK, ck->step, name, sizeof name))
        return td_error(TD_ERR_INVALID, "cannot save a checkpoint of step %lld in %s: steps run "
                        "from 0 to 999999999999999999", (long long)ck->step, dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return td_error_errno(TD_ERR_IO, "cannot create checkpoint directory %s", dir);
    remove_stale_temporaries(dir);
    char *meta = meta_json(ck);
    size_t meta_len = strlen(meta);
    size_t meta_bytes = (meta_len + 1 + 7) & ~(size_t)7; /* newline, then space padding to 8 */
    char *meta_padded = td_xmalloc(meta_bytes);
    memset(meta_padded, ' ', meta_bytes);
    memcpy(meta_padded, meta, meta_len);
    meta_padded[meta_len] = '\n';
    free(meta);
    size_t params_bytes = ck->num_params * sizeof(float);
    size_t state_bytes = ck->optim_state_count * sizeof(float);
    size_t buffer_bytes = ck->buffer_count * sizeof(float);
    uint8_t head[CKPT_HEADER_BYTES] = {0};
    memcpy(head, CKPT_MAGIC, 8);
    put32(head + OFF_VERSION, CKPT_VERSION);
    put32(head + OFF_HEADER_BYTES, CKPT_HEADER_BYTES);
    put32(head + OFF_META_BYTES, (uint32_t)meta_bytes);
    put64(head + OFF_NUM_PARAMS, ck->num_params);
    put64(head + OFF_STATE_COUNT, ck->optim_state_count);
    put64(head + OFF_PAYLOAD_BYTES, meta_bytes + params_bytes + state_bytes + buffer_bytes);
    uint32_t crc = td_crc32(0, head, CKPT_HEADER_BYTES); /* CRC field still 0 */
    crc = td_crc32(crc, meta_padded, meta_bytes);
    crc = td_crc32(crc, ck->params, params_bytes);
    if (state_bytes) crc = td_crc32(crc, ck->optim_state, state_bytes);
    if (buffer_bytes) crc = td_crc32(crc, ck->buffers, buffer_bytes);
    put32(head + OFF_CRC, crc);
    td_chunk chunks[5] = {
        {head, sizeof head}, {meta_padded, meta_bytes}, {ck->params, params_bytes}};
    int nchunks = 3;
    if (state_bytes) chunks[nchunks++] = (td_chunk){ck->optim_state, state_bytes};
    if (buffer_bytes) chunks[nchunks++] = (td_chunk){ck->buffers, buffer_bytes};
    char *path = td_xasprintf("%s/%s", dir, name);
    td_status rc = td_write_atomic(path, "checkpoint", chunks, nchunks);
    free(meta_padded);
    if (rc == TD_OK && keep > 0) {
        size_t n;
        int64_t *steps = list_steps(dir, &n);
        for (size_t i = (size_t)keep; i < n; i++) {
            char *old = ckpt_path(dir, steps[i]);
            if (steps[i] != ck->step && unlink(old) != 0 && errno != ENOENT)
                TD_LOG_WARN("cannot delete old checkpoint %s: %s", old, strerror(errno));
            free(old);
        }
        free(steps);
    }
    free(path);
    TD_CHECK(rc);
    return TD_OK;
}

static td_status meta_int(json_t *o, const char *key, const char *path, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        return td_error(TD_ERR_FORMAT, "checkpoint %s: metadata lacks integer \"%s\"", path, key);
    *out = (int64_t)json_integer_value(v);
    return TD_OK;
}

static td_status meta_real(json_t *o, const char *key, const char *path, double *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        return td_error(TD_ERR_FORMAT, "checkpoint %s: metadata lacks number \"%s\"", path, key);
    *out = json_number_value(v);
    return TD_OK;
}

static td_status parse_meta(const char *path, const char *text, size_t len, td_checkpoint *ck) {
    td_status rc = TD_OK;
    json_error_t jerr;
    json_t *o = json_loadb(text, len, JSON_DISABLE_EOF_CHECK, &jerr);
    if (!o || !json_is_object(o)) {
        rc = td_error(TD_ERR_FORMAT, "checkpoint %s: metadata is not a JSON object: %s", path,
                      jerr.text);
        goto out;
    }
    json_t *model = json_object_get(o, "model");
    if (!json_is_string(model) || strlen(json_string_value(model)) >= sizeof ck->model) {
        rc = td_error(TD_ERR_FORMAT, "checkpoint %s: metadata lacks \"model\"", path);
        goto out;
    }
    snprintf(ck->model, sizeof ck->model, "%s", json_string_value(model));
    int64_t v;
    TD_CHECK_GOTO(meta_int(o, "batch", path, &ck->batch), rc, out);
    TD_CHECK_GOTO(meta_int(o, "accum", path, &ck->accum), rc, out);
    TD_CHECK_GOTO(meta_int(o, "world_size", path, &ck->world_size), rc, out);
    TD_CHECK_GOTO(meta_int(o, "seed", path, &v), rc, out);
    ck->seed = (uint64_t)v;
    TD_CHECK_GOTO(meta_int(o, "step", path, &ck->step), rc, out);
    char name[64];
    if (!td_ckpt_build(TD_CKPT_TDCK, ck->step, name, sizeof name)) { /* a step no file is named by */
        rc = td_error(TD_ERR_FORMAT,
                      "checkpoint %s: \"step\" %lld is not a step (0 to 999999999999999999); the "
                      "file is damaged or not tandem's",
                      path, (long long)ck->step);
        goto out;
    }
    TD_CHECK_GOTO(meta_int(o, "epoch", path, &ck->epoch), rc, out);
    TD_CHECK_GOTO(meta_int(o, "step_in_epoch", path, &ck->step_in_epoch), rc, out);
    json_t *opt = json_object_get(o, "optimizer");
    json_t *kind = json_object_get(opt, "kind");
    if (!json_is_object(opt) || !json_is_string(kind) ||
        td_optim_parse_kind(json_string_value(kind), &ck->optim.kind) != TD_OK) {
        rc = td_error(TD_ERR_FORMAT, "checkpoint %s: metadata lacks a valid \"optimizer\"", path);
        goto out;
    }
    TD_CHECK_GOTO(meta_real(opt, "lr", path, &ck->optim.lr), rc, out);
    TD_CHECK_GOTO(meta_real(opt, "weight_decay", path, &ck->optim.weight_decay), rc, out);
    TD_CHECK_GOTO(meta_real(opt, "momentum", path, &ck->optim.momentum), rc, out);
    TD_CHECK_GOTO(meta_real(opt, "dampening", path, &ck->optim.dampening), rc, out);
    TD_CHECK_GOTO(meta_real(opt, "beta1", path, &ck->optim.beta1), rc, out);
    TD_CHECK_GOTO(meta_real(opt, "beta2", path, &ck->optim.beta2), rc, out);
    TD_CHECK_GOTO(meta_real(opt, "eps", path, &ck->optim.eps), rc, out);
    ck->optim.nesterov = json_is_true(json_object_get(opt, "nesterov"));
    TD_CHECK_GOTO(meta_int(opt, "steps", path, &v), rc, out);
    ck->optim_steps = (uint64_t)v;
    json_t *nb = json_object_get(o, "buffers");
    if (nb && (!json_is_integer(nb) || json_integer_value(nb) < 0)) {
        rc = td_error(TD_ERR_FORMAT, "checkpoint %s: \"buffers\" is not a count", path);
        goto out;
    }
    ck->buffer_count = nb ? (uint64_t)json_integer_value(nb) : 0;
    json_t *bt = json_object_get(o, "batches_tracked");
    ck->batches_tracked = json_is_integer(bt) ? (int64_t)json_integer_value(bt) : 0;
    json_t *norm = json_object_get(o, "normalization");
    if (norm) {
        json_t *mean = json_object_get(norm, "mean"), *std = json_object_get(norm, "std");
        size_t n = json_array_size(mean);
        if (!json_is_array(mean) || !json_is_array(std) || n != json_array_size(std) || n == 0 ||
            n > TD_DATA_MAX_CHANNELS) {
            rc = td_error(TD_ERR_FORMAT,
                          "checkpoint %s: \"normalization\" lacks equal mean and std arrays", path);
            goto out;
        }
        ck->norm_mean = td_xmalloc(n * sizeof(float));
        ck->norm_std = td_xmalloc(n * sizeof(float));
        ck->norm_count = (int)n;
        for (size_t i = 0; i < n; i++) {
            json_t *m = json_array_get(mean, i), *sd = json_array_get(std, i);
            if (!json_is_number(m) || !json_is_number(sd) || !(json_number_value(sd) > 0)) {
                rc = td_error(TD_ERR_FORMAT,
                              "checkpoint %s: normalization value %zu is not a number (std > 0)",
                              path, i);
                goto out;
            }
            ck->norm_mean[i] = (float)json_number_value(m);
            ck->norm_std[i] = (float)json_number_value(sd);
        }
    }
out:
    json_decref(o);
    return rc;
}

td_status td_checkpoint_load(const char *path, td_checkpoint *out) {
    memset(out, 0, sizeof *out);
    td_status rc = TD_OK;
    uint8_t *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return td_error_errno(TD_ERR_NOTFOUND, "checkpoint %s does not exist", path);
        return td_error_errno(TD_ERR_IO, "cannot open checkpoint %s", path);
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        rc = td_error_errno(TD_ERR_IO, "cannot stat checkpoint %s", path);
        goto out;
    }
    size_t size = (size_t)sb.st_size;
    const char *name = base_name(path);
    if (size < CKPT_HEADER_BYTES) {
        rc = td_error(TD_ERR_FORMAT,
                      "checkpoint %s is corrupt: %zu bytes, shorter than its "
                      "%u-byte header (an interrupted copy?)",
                      name, size, CKPT_HEADER_BYTES);
        goto out;
    }
    buf = td_xmalloc(size);
    if (fread(buf, 1, size, f) != size) {
        rc = td_error_errno(TD_ERR_IO, "cannot read checkpoint %s", path);
        goto out;
    }
    if (memcmp(buf, CKPT_MAGIC, 8) != 0) {
        rc = td_error(TD_ERR_FORMAT,
                      "checkpoint %s is corrupt: bad magic (not a tandem "
                      "checkpoint)",
                      name);
        goto out;
    }
    uint32_t version = get32(buf + OFF_VERSION);
    if (version != CKPT_VERSION || get32(buf + OFF_HEADER_BYTES) != CKPT_HEADER_BYTES) {
        rc = td_error(TD_ERR_FORMAT,
                      "checkpoint %s has format version %u; this tandem reads "
                      "version %u",
                      name, version, CKPT_VERSION);
        goto out;
    }
    uint64_t meta_bytes = get32(buf + OFF_META_BYTES);
    uint64_t nparams = get64(buf + OFF_NUM_PARAMS), nstate = get64(buf + OFF_STATE_COUNT);
    uint64_t payload = get64(buf + OFF_PAYLOAD_BYTES);
    if (size - CKPT_HEADER_BYTES != payload) {
        rc = td_error(TD_ERR_FORMAT,
                      "checkpoint %s is corrupt: %zu bytes, its header says %llu "
                      "(truncated or padded)",
                      name, size, (unsigned long long)(payload + CKPT_HEADER_BYTES));
        goto out;
    }
    uint32_t stored = get32(buf + OFF_CRC);
    put32(buf + OFF_CRC, 0);
    uint32_t actual = td_crc32(td_crc32(0, buf, CKPT_HEADER_BYTES), buf + CKPT_HEADER_BYTES,
                               size - CKPT_HEADER_BYTES);
    if (actual != stored) {
        rc = td_error(TD_ERR_FORMAT,
                      "checkpoint %s is corrupt: checksum 0x%08x != 0x%08x stored "
                      "in its header",
                      name, actual, stored);
        goto out;
    }
    if (meta_bytes > CKPT_MAX_META_BYTES || nparams > payload / 4 || nstate > payload / 4 ||
        meta_bytes + 4 * (nparams + nstate) > payload) {
        rc = td_error(TD_ERR_FORMAT, "checkpoint %s is corrupt: section sizes do not add up", name);
        goto out;
    }
    TD_CHECK_GOTO(parse_meta(name, (const char *)buf + CKPT_HEADER_BYTES, meta_bytes, out), rc,
                  out);
    if (meta_bytes + 4 * (nparams + nstate + out->buffer_count) != payload ||
        out->buffer_count > payload / 4) {
        rc = td_error(TD_ERR_FORMAT, "checkpoint %s is corrupt: section sizes do not add up", name);
        goto out;
    }
    out->num_params = nparams;
    out->optim_state_count = nstate;
    out->params = td_xmalloc_aligned((nparams ? nparams : 1) * sizeof(float));
    memcpy(out->params, buf + CKPT_HEADER_BYTES + meta_bytes, nparams * sizeof(float));
    out->optim_state = td_xmalloc_aligned((nstate ? nstate : 1) * sizeof(float));
    memcpy(out->optim_state, buf + CKPT_HEADER_BYTES + meta_bytes + nparams * sizeof(float),
           nstate * sizeof(float));
    uint64_t nbuf = out->buffer_count;
    out->buffers = td_xmalloc((nbuf ? nbuf : 1) * sizeof(float));
    memcpy(out->buffers, buf + CKPT_HEADER_BYTES + meta_bytes + (nparams + nstate) * sizeof(float),
           nbuf * sizeof(float));
out:
    fclose(f);
    free(buf);
    if (rc != TD_OK) td_checkpoint_free(out);
    return rc;
}

void td_checkpoint_free(td_checkpoint *ck) {
    if (!ck) return;
    free(ck->params);
    free(ck->optim_state);
    free(ck->buffers);
    free(ck->norm_mean);
    free(ck->norm_std);
    ck->params = NULL;
    ck->optim_state = NULL;
    ck->buffers = ck->norm_mean = ck->norm_std = NULL;
    ck->norm_count = 0;
}

td_status td_checkpoint_find_latest(const char *dir, char **path_out, td_checkpoint *out) {
    *path_out = NULL;
    memset(out, 0, sizeof *out);
    remove_stale_temporaries(dir);
    size_t n;
    int64_t *steps = list_steps(dir, &n);
    td_status rc = TD_OK, first_rc = TD_OK;
    char first_msg[2048] = "";
    char *first_name = NULL;
    for (size_t i = 0; i < n; i++) {
        char *path = ckpt_path(dir, steps[i]);
        rc = td_checkpoint_load(path, out);
        if (rc == TD_OK) {
            if (first_rc != TD_OK)
                TD_LOG_WARN("%s; resuming from the older %s instead", first_msg, base_name(path));
            *path_out = path;
            goto out;
        }
        if (first_rc == TD_OK) {
            first_rc = rc;
            snprintf(first_msg, sizeof first_msg, "%s", td_error_msg());
            first_name = td_xasprintf("%s", base_name(path));
        } else {
            TD_LOG_WARN("%s", td_error_msg());
        }
        free(path);
    }
    rc = first_rc;
    if (rc != TD_OK)
        td_error(rc,
                 "%s; delete it to start again from step 0%s (no older valid checkpoint in "
                 "%s)",
                 first_msg, n > 1 ? ", together with the other corrupt ones" : "", dir);
out:
    free(first_name);
    free(steps);
    return rc;
}
