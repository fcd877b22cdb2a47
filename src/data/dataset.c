/* Data sets: the samples of any reader (IDX, NumPy, CSV, safetensors, image folders) as one
 * storage of fixed-size records plus targets, viewed whole or through an index (a held-out
 * split), normalised per channel while a batch is gathered. See data.h for the contract. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/array.h"
#include "tandem/data.h"

/* The held-out split's shuffle: a constant, so a run's --seed does not move samples between
 * the training and the validation set (a resume or another seed holds out the same ones). */
#define SPLIT_SEED 0x53504c4954000001ull /* "SPLIT" */

/* The records and targets, shared by a data set and the splits made from it. */
typedef struct {
    int refs;
    char *source;       /* the path(s), for errors and describe */
    const char *format; /* static string */
    uint64_t count;     /* records */
    int c, h, w;        /* per-sample shape */
    size_t elems;       /* c * h * w */
    td_dtype dtype;     /* of the features */
    size_t rec_bytes;   /* elems * dtype size */
    uint8_t *mem;       /* in-memory records, or NULL */
    int fd;             /* file-backed records: the open file, else -1 */
    char *path;         /* file-backed: its path */
    uint64_t offset;    /* file-backed: byte offset of record 0 */
    int32_t *labels;    /* class targets [count], or NULL */
    float *targets;     /* real targets [count * target_dim], or NULL */
    int target_dim;
    int num_classes;
    bool finite; /* every feature value was checked finite when read into memory */
} storage;

struct td_dataset {
    storage *st;
    uint64_t count;
    uint64_t *index; /* sample i is record index[i]; NULL: record i */
    float *mean, *std;
    float *lut; /* uint8 features: [c][256] bytes to normalised floats */
    char desc[600];
};

/* ---- storage ---- */

static storage *storage_new(const char *format, const char *source) {
    storage *st = td_xcalloc(1, sizeof *st);
    st->refs = 1;
    st->fd = -1;
    st->format = format;
    st->source = td_xstrdup(source);
    return st;
}

static void storage_unref(storage *st) {
    if (!st || --st->refs > 0) return;
    free(st->source);
    free(st->mem);
    if (st->fd >= 0) close(st->fd);
    free(st->path);
    free(st->labels);
    free(st->targets);
    free(st);
}

static void set_norm(td_dataset_t *ds, const float *mean, const float *std, int n);

static td_dataset_t *dataset_over(storage *st) {
    td_dataset_t *ds = td_xcalloc(1, sizeof *ds);
    ds->st = st;
    ds->count = st->count;
    ds->mean = td_xmalloc((size_t)st->c * sizeof(float));
    ds->std = td_xmalloc((size_t)st->c * sizeof(float));
    if (st->dtype == TD_DTYPE_U8) ds->lut = td_xmalloc((size_t)st->c * 256 * sizeof(float));
    static const float zero = 0.0f, one = 1.0f; /* until the trainer sets the normalisation */
    set_norm(ds, &zero, &one, 1);
    return ds;
}

void td_dataset_free(td_dataset_t *ds) {
    if (!ds) return;
    storage_unref(ds->st);
    free(ds->index);
    free(ds->mean);
    free(ds->std);
    free(ds->lut);
    free(ds);
}

/* The per-sample shape of a features array [n, ...]: [k] is a table row, [h, w] one channel,
 * [c, h, w] NCHW. */
static td_status shape_of(const char *what, const td_array *x, int *c, int *h, int *w) {
    *c = *h = *w = 1;
    uint64_t d[3] = {1, 1, 1};
    switch (x->ndim) {
    case 1:
        break;
    case 2:
        d[0] = x->shape[1];
        break;
    case 3:
        d[1] = x->shape[1], d[2] = x->shape[2];
        break;
    case 4:
        d[0] = x->shape[1], d[1] = x->shape[2], d[2] = x->shape[3];
        break;
    default:
        return td_error(TD_ERR_FORMAT,
                        "%s: features of %d dimensions; expected [samples], [samples, features], "
                        "[samples, height, width] or [samples, channels, height, width] (NCHW; "
                        "for NHWC images use x.transpose(0, 3, 1, 2))",
                        what, x->ndim);
    }
    if (d[0] * d[1] * d[2] > (1u << 28) || d[0] > TD_DATA_MAX_CHANNELS)
        return td_error(TD_ERR_FORMAT,
                        "%s: %llu x %llu x %llu values per sample is more than tandem takes "
                        "(at most %d channels and 2^28 values)",
                        what, (unsigned long long)d[0], (unsigned long long)d[1],
                        (unsigned long long)d[2], TD_DATA_MAX_CHANNELS);
    if (!d[0] || !d[1] || !d[2])
        return td_error(TD_ERR_FORMAT, "%s: samples of zero values; the array is empty", what);
    *c = (int)d[0], *h = (int)d[1], *w = (int)d[2];
    return TD_OK;
}

static bool dtype_is_int(td_dtype t) {
    return !td_dtype_is_float(t) && t != TD_DTYPE_BOOL;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (!man) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do man <<= 1, e++;
        while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Element i of a little-endian array of dtype t as a double (exact for every dtype but i64
 * beyond 2^53). */
static double element(const uint8_t *p, td_dtype t, size_t i) {
/* element i of type T, unaligned */
#define LOAD(T)                                                                                    \
    {                                                                                              \
        T v;                                                                                       \
        memcpy(&v, p + sizeof(T) * i, sizeof(T));                                                  \
        return (double)v;                                                                          \
    }
    switch (t) {
    case TD_DTYPE_U8:
    case TD_DTYPE_BOOL:
        return p[i];
    case TD_DTYPE_I8:
        LOAD(int8_t)
    case TD_DTYPE_U16:
        LOAD(uint16_t)
    case TD_DTYPE_I16:
        LOAD(int16_t)
    case TD_DTYPE_I32:
        LOAD(int32_t)
    case TD_DTYPE_I64:
        LOAD(int64_t)
    case TD_DTYPE_F32:
        LOAD(float)
    case TD_DTYPE_F64:
        LOAD(double)
    case TD_DTYPE_F16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return half_to_float(v);
    }
    case TD_DTYPE_BF16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        uint32_t bits = (uint32_t)v << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    }
#undef LOAD
    return 0;
}

/* Record r's first value that is not finite (or beyond float32, which every value becomes), as
 * TD_ERR_FORMAT naming the source, the sample and where in it; TD_OK when all are fine. Integer
 * dtypes hold nothing to check. */
static td_status check_record(const storage *st, const char *what, const uint8_t *rec,
                              uint64_t r) {
    if (!td_dtype_is_float(st->dtype)) return TD_OK;
    for (size_t e = 0; e < st->elems; e++) {
        double v = element(rec, st->dtype, e);
        if (isfinite(v) && fabs(v) <= FLT_MAX) continue;
        char where[96];
        size_t plane = (size_t)st->h * (size_t)st->w;
        if (plane == 1)
            snprintf(where, sizeof where, "feature %zu", e);
        else
            snprintf(where, sizeof where, "channel %zu, row %zu, column %zu", e / plane,
                     e % plane / (size_t)st->w, e % (size_t)st->w);
        return td_error(TD_ERR_FORMAT,
                        "%s: sample %llu holds %g at element %zu (%s)%s; tandem trains on finite "
                        "float32 values: drop or fill in those samples (NumPy: keep "
                        "np.isfinite(x).reshape(len(x), -1).all(axis=1))",
                        what, (unsigned long long)r, v, e, where,
                        isfinite(v) ? ", beyond float32's range (3.4e38)" : "");
    }
    return TD_OK;
}

/* The features array becomes the storage's records: moved when in memory, opened when
 * file-backed. */
static td_status take_features(storage *st, const char *what, td_array *x) {
    TD_CHECK(shape_of(what, x, &st->c, &st->h, &st->w));
    if (x->dtype == TD_DTYPE_BOOL || x->dtype == TD_DTYPE_I64)
        TD_LOG_DEBUG("%s: %s features are converted to float32 as batches are gathered", what,
                     td_dtype_name(x->dtype));
    st->count = x->ndim ? x->shape[0] : 0;
    st->elems = (size_t)st->c * (size_t)st->h * (size_t)st->w;
    st->dtype = x->dtype;
    st->rec_bytes = st->elems * td_dtype_size(x->dtype);
    if (x->data) {
        /* at read time, naming the sample: a NaN found later only shows as a NaN mean, or as
         * NaN weights when --mean/--std are given */
        for (uint64_t r = 0; r < st->count; r++)
            TD_CHECK(check_record(st, what, (const uint8_t *)x->data + r * st->rec_bytes, r));
        st->finite = true;
        st->mem = x->data;
        x->data = NULL;
        return TD_OK;
    }
    int fd = open(x->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return td_error_errno(TD_ERR_IO, "%s: cannot open %s", what, x->path);
    st->fd = fd;
    st->path = x->path;
    x->path = NULL;
    st->offset = x->offset;
    return TD_OK;
}

/* The class count st->labels imply (largest + 1) against the labels seen (data.h,
 * TD_DATA_SPARSE_CLASSES): a few stray large labels must not size the model. lines: CSV rows'
 * lines for the error, else NULL (samples are named by index). */
static td_status check_classes(const storage *st, const char *what, const uint64_t *lines) {
    int k = st->num_classes;
    if (k <= TD_DATA_SPARSE_CLASSES) return TD_OK;
    uint8_t *seen = td_xcalloc((size_t)k, 1);
    uint64_t distinct = 0, at = 0;
    for (uint64_t i = 0; i < st->count; i++) {
        int32_t l = st->labels[i];
        distinct += !seen[l];
        seen[l] = 1;
        if (l == k - 1 && st->labels[at] != k - 1) at = i;
    }
    free(seen);
    if ((uint64_t)k <= (uint64_t)TD_DATA_SPARSE_FACTOR * distinct) return TD_OK;
    char where[48];
    if (lines)
        snprintf(where, sizeof where, "line %llu", (unsigned long long)lines[at]);
    else
        snprintf(where, sizeof where, "sample %llu", (unsigned long long)at);
    return td_error(TD_ERR_FORMAT,
                    "%s: label %d (%s) makes %d classes, but only %llu distinct labels appear; "
                    "class indices must run from 0 to the number of classes - 1 (above %d "
                    "classes, at most %d times the labels seen): remap them (NumPy: "
                    "np.unique(y, return_inverse=True)[1]; pandas: "
                    "df[col].astype('category').cat.codes), fix the stray label, or for values "
                    "to predict use --loss mse",
                    what, k - 1, where, k, (unsigned long long)distinct, TD_DATA_SPARSE_CLASSES,
                    TD_DATA_SPARSE_FACTOR);
}

/* Targets: class indices (integers in [0, TD_DATA_MAX_CLASSES), or integral floats when
 * class_targets) or real values [n] / [n, k]. */
static td_status take_targets(storage *st, const char *what, const td_array *y,
                              bool class_targets) {
    if (!y->data) return td_error(TD_ERR_INVALID, "%s: targets must be read into memory", what);
    uint64_t n = y->ndim ? y->shape[0] : 0;
    if (n != st->count)
        return td_error(TD_ERR_FORMAT,
                        "%s: %llu samples of features but %llu targets; both arrays must hold "
                        "the same samples in the same order",
                        what, (unsigned long long)st->count, (unsigned long long)n);
    uint64_t k = 1;
    if (y->ndim == 2) k = y->shape[1];
    if (y->ndim > 2 || k == 0 || k > (1u << 20))
        return td_error(TD_ERR_FORMAT,
                        "%s: targets of shape %d-D; expected [samples] (class indices or one "
                        "value) or [samples, k] (k values per sample)",
                        what, y->ndim);
    const uint8_t *p = y->data;
    if (class_targets && td_dtype_is_float(y->dtype))
        return td_error(TD_ERR_FORMAT,
                        "%s: the targets are %s, and class indices are integers (as PyTorch's "
                        "CrossEntropyLoss takes them): for regression pass --loss mse (or --loss "
                        "bce for 0/1 labels); for classes store them as integers "
                        "(y.astype(np.int64))",
                        what, td_dtype_name(y->dtype));
    if (class_targets) {
        if (k != 1)
            return td_error(TD_ERR_FORMAT,
                            "%s: %llu target values per sample are not one class index; for "
                            "multi-label 0/1 targets use --loss bce, for regression --loss mse",
                            what, (unsigned long long)k);
        st->labels = td_xmalloc((n ? n : 1) * sizeof(int32_t));
        int32_t hi = -1;
        for (uint64_t i = 0; i < n; i++) {
            double v = element(p, y->dtype, i);
            if (!(v >= 0 && v < TD_DATA_MAX_CLASSES && v == floor(v))) {
                if (dtype_is_int(y->dtype) || v == floor(v))
                    return td_error(TD_ERR_FORMAT,
                                    "%s: target %g of sample %llu is not a class index (0 to "
                                    "%d); fix the labels",
                                    what, v, (unsigned long long)i, TD_DATA_MAX_CLASSES - 1);
                return td_error(TD_ERR_FORMAT,
                                "%s: target %g of sample %llu is not a class index; for "
                                "regression pass --loss mse (or --loss bce for 0/1 labels)",
                                what, v, (unsigned long long)i);
            }
            st->labels[i] = (int32_t)v;
            if (st->labels[i] > hi) hi = st->labels[i];
        }
        st->num_classes = hi + 1;
        return check_classes(st, what, NULL);
    }
    st->target_dim = (int)k;
    st->targets = td_xmalloc((n * k > 0 ? n * k : 1) * sizeof(float));
    for (uint64_t i = 0; i < n * k; i++) {
        double v = element(p, y->dtype, i);
        if (!isfinite(v))
            return td_error(TD_ERR_FORMAT, "%s: target %llu of sample %llu is %g; fix the data",
                            what, (unsigned long long)(i % k), (unsigned long long)(i / k), v);
        st->targets[i] = (float)v;
    }
    return TD_OK;
}

static td_status from_arrays(const char *format, const char *source, td_array *x, td_array *y,
                             bool class_targets, td_dataset_t **out) {
    storage *st = storage_new(format, source);
    td_status rc = take_features(st, source, x);
    if (rc == TD_OK) rc = take_targets(st, source, y, class_targets);
    if (rc != TD_OK) {
        storage_unref(st);
        return rc;
    }
    *out = dataset_over(st);
    return TD_OK;
}

/* ---- the formats ---- */

/* The flag a path came from, for errors. */
#define FLAG(o) ((o)->flag ? (o)->flag : "--data")

static td_status refuse_special(const char *path, const td_data_options *o);

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcasecmp(s + n - k, suffix);
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Whether an uncompressed array in `path` may stay there (TANDEM_DATA_IN_MEMORY). */
static bool file_backed_ok(const char *path) {
    const char *mode = td_env_str(TD_ENV_DATA_IN_MEMORY);
    if (!strcmp(mode, "1")) return false;
    if (!strcmp(mode, "0")) return true;
    struct stat sb;
    return stat(path, &sb) == 0 && (uint64_t)sb.st_size >= TD_DATA_STREAM_BYTES;
}

static td_status open_npy_pair(const char *spec, const td_data_options *o, td_dataset_t **out) {
    const char *comma = strchr(spec, ',');
    if (!comma || strchr(comma + 1, ','))
        return td_error(TD_ERR_INVALID,
                        "%s %s: NumPy data is a pair of files, features then targets: "
                        "X.npy,Y.npy (or one .npz holding x and y)",
                        FLAG(o), spec);
    char *xp = td_xstrndup(spec, (size_t)(comma - spec));
    const char *yp = comma + 1;
    td_array x = {0}, y = {0};
    td_status rc = td_npy_read(xp, file_backed_ok(xp), &x);
    if (rc == TD_OK) rc = td_npy_read(yp, false, &y);
    if (rc == TD_OK) rc = from_arrays("npy", spec, &x, &y, o->class_targets, out);
    td_array_free(&x);
    td_array_free(&y);
    free(xp);
    return rc;
}

/* The features and targets keys of an npz or safetensors file. */
static const char *const X_KEYS[] = {"x", "X", "data", "features", "inputs", "images"};
static const char *const Y_KEYS[] = {"y", "Y", "target", "targets", "labels", "label"};

static int find_name(char **names, int n, const char *want) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], want)) return i;
    return -1;
}

static td_status open_keyed(const char *spec, const td_data_options *o, bool npz,
                            td_dataset_t **train, td_dataset_t **test) {
    char **names = NULL;
    int n = 0;
    TD_CHECK(npz ? td_npz_list(spec, &names, &n) : td_safetensors_list(spec, &names, &n));
    const char *xk = NULL, *yk = NULL, *xt = NULL, *yt = NULL;
    td_status rc = TD_OK;
    if (find_name(names, n, "x_train") >= 0 && find_name(names, n, "y_train") >= 0) {
        xk = "x_train", yk = "y_train";
        if (find_name(names, n, "x_test") >= 0 && find_name(names, n, "y_test") >= 0)
            xt = "x_test", yt = "y_test";
        else if (find_name(names, n, "x_val") >= 0 && find_name(names, n, "y_val") >= 0)
            xt = "x_val", yt = "y_val";
    } else {
        for (size_t i = 0; i < TD_ARRAY_LEN(X_KEYS) && !xk; i++)
            if (find_name(names, n, X_KEYS[i]) >= 0) xk = X_KEYS[i];
        for (size_t i = 0; i < TD_ARRAY_LEN(Y_KEYS) && !yk; i++)
            if (find_name(names, n, Y_KEYS[i]) >= 0) yk = Y_KEYS[i];
    }
    if (o->target) {
        if (find_name(names, n, o->target) < 0) {
            rc = td_error(TD_ERR_NOTFOUND, "--target %s: %s has no array of that name", o->target,
                          spec);
            goto out;
        }
        yk = o->target;
        if (!xk && n == 2) xk = names[strcmp(names[0], o->target) ? 0 : 1];
    }
    if (!xk || !yk) {
        char list[512] = "";
        for (int i = 0; i < n; i++) {
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", names[i]);
        }
        rc = td_error(TD_ERR_FORMAT,
                      "%s holds %s; tandem looks for the features as x (or X, data, features, "
                      "inputs, images) and the targets as y (or Y, target, targets, labels), or "
                      "x_train/y_train with x_test/y_test; rename the arrays or name the targets "
                      "with --target",
                      spec, n ? list : "no arrays");
        goto out;
    }
    const char *fmt = npz ? "npz" : "safetensors";
    for (int pass = 0; pass < 2 && rc == TD_OK; pass++) {
        const char *kx = pass ? xt : xk, *ky = pass ? yt : yk;
        if (!kx) break;
        td_array x = {0}, y = {0};
        char *src = td_xasprintf("%s[%s,%s]", spec, kx, ky);
        rc = npz ? td_npz_read(spec, kx, file_backed_ok(spec), &x)
                 : td_safetensors_read(spec, kx, file_backed_ok(spec), &x);
        if (rc == TD_OK)
            rc = npz ? td_npz_read(spec, ky, false, &y) : td_safetensors_read(spec, ky, false, &y);
        if (rc == TD_OK) rc = from_arrays(fmt, src, &x, &y, o->class_targets, pass ? test : train);
        td_array_free(&x);
        td_array_free(&y);
        free(src);
    }
out:
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

static td_status open_csv(const char *spec, const td_data_options *o, td_dataset_t **out) {
    td_csv csv;
    TD_CHECK(td_csv_read(spec, o->target, &csv));
    td_status rc = TD_OK;
    if (csv.cols > TD_DATA_MAX_CHANNELS) {
        rc = td_error(TD_ERR_FORMAT,
                      "CSV file %s has %d feature columns; tandem takes at most %d features per "
                      "sample (each has its own mean and std): select or combine features "
                      "(e.g. PCA) down to %d",
                      spec, csv.cols, TD_DATA_MAX_CHANNELS, TD_DATA_MAX_CHANNELS);
        td_csv_free(&csv);
        return rc;
    }
    storage *st = storage_new("csv", spec);
    st->finite = true; /* td_csv_read refuses nan, inf and values beyond float32 */
    st->count = csv.rows;
    st->c = csv.cols, st->h = 1, st->w = 1;
    st->elems = (size_t)csv.cols;
    st->dtype = TD_DTYPE_F32;
    st->rec_bytes = st->elems * 4;
    st->mem = (uint8_t *)csv.features;
    csv.features = NULL;
    uint64_t n = csv.rows;
    if (o->class_targets) {
        st->labels = td_xmalloc((n ? n : 1) * sizeof(int32_t));
        for (uint64_t i = 0; i < n && rc == TD_OK; i++) {
            double v = csv.target[i];
            if (!(v >= 0 && v < TD_DATA_MAX_CLASSES && v == floor(v)))
                rc = td_error(TD_ERR_FORMAT,
                              "%s:%llu: target column %s holds %g, not a class index (0 to %d) "
                              "or name; for regression pass --loss mse",
                              spec, (unsigned long long)csv.lines[i],
                              csv.target_name ? csv.target_name : "?", v,
                              TD_DATA_MAX_CLASSES - 1);
            else
                st->labels[i] = (int32_t)v;
            if (rc == TD_OK && st->labels[i] + 1 > st->num_classes)
                st->num_classes = st->labels[i] + 1;
        }
        if (csv.num_class_names > st->num_classes) st->num_classes = csv.num_class_names;
        if (rc == TD_OK) rc = check_classes(st, spec, csv.lines);
        if (rc == TD_OK && !csv.num_class_names && st->num_classes > 100 &&
            (uint64_t)st->num_classes * 4 > n)
            TD_LOG_WARN("%s: target column %s gives %d classes for %llu rows; if it holds values "
                        "to predict, not classes, pass --loss mse",
                        spec, csv.target_name ? csv.target_name : "?", st->num_classes,
                        (unsigned long long)n);
    } else if (csv.num_class_names) {
        rc = td_error(TD_ERR_FORMAT,
                      "%s: target column %s holds names (%s, ...), which are classes; use "
                      "--loss cross-entropy, or numbers for --loss mse/bce",
                      spec, csv.target_name ? csv.target_name : "?", csv.class_names[0]);
    } else {
        st->target_dim = 1;
        st->targets = td_xmalloc((n ? n : 1) * sizeof(float));
        for (uint64_t i = 0; i < n; i++) st->targets[i] = (float)csv.target[i];
    }
    td_csv_free(&csv);
    if (rc != TD_OK) {
        storage_unref(st);
        return rc;
    }
    *out = dataset_over(st);
    return TD_OK;
}

static td_status open_image_dir(const char *dir, const td_data_options *o, td_dataset_t **out) {
    td_array x = {0};
    int32_t *labels = NULL;
    char **classes = NULL;
    int nclasses = 0;
    TD_CHECK(td_image_folder_read(dir, o->channels, o->height, o->width, &x, &labels, &classes,
                                  &nclasses));
    for (int i = 0; i < nclasses; i++) free(classes[i]);
    free(classes);
    td_status rc = TD_OK;
    if (!o->class_targets)
        rc = td_error(TD_ERR_INVALID,
                      "%s is an image folder, whose targets are classes (its subfolders); use "
                      "--loss cross-entropy",
                      dir);
    storage *st = storage_new("images", dir);
    if (rc == TD_OK) rc = take_features(st, dir, &x);
    td_array_free(&x);
    if (rc != TD_OK) {
        free(labels);
        storage_unref(st);
        return rc;
    }
    st->labels = labels;
    st->num_classes = nclasses;
    *out = dataset_over(st);
    return TD_OK;
}

/* IDX: <prefix>train-images-idx3-ubyte[.gz] and the matching labels, and the test split as
 * t10k-* or test-* (MNIST, Fashion-MNIST, KMNIST; EMNIST's emnist-<set>-train-*). */
static char *find_idx(const char *dir, const char *split, const char *what, int *matches) {
    DIR *d = opendir(dir);
    char *found = NULL;
    *matches = 0;
    if (!d) return NULL;
    char want[64];
    snprintf(want, sizeof want, "%s-%s", split, what);
    for (struct dirent *e; (e = readdir(d));) {
        const char *name = e->d_name;
        size_t n = strlen(name);
        size_t base = has_suffix(name, ".gz") ? n - 3 : n;
        size_t k = strlen(want);
        if (base < k || strncmp(name + base - k, want, k)) continue;
        if (base > k && name[base - k - 1] != '-') continue;
        (*matches)++;
        if (!found || strcmp(name, found + strlen(dir) + 1) < 0) {
            free(found);
            found = td_xasprintf("%s/%s", dir, name);
        }
    }
    closedir(d);
    return found;
}

static td_status open_idx_files(const char *images, const char *labels, const char *source,
                                bool class_targets, td_dataset_t **out) {
    td_idx xi = {0}, yi = {0};
    td_data_options o = {0}; /* the files inside a --data directory: a FIFO would block too */
    td_status rc = refuse_special(images, &o);
    if (rc == TD_OK) rc = refuse_special(labels, &o);
    if (rc == TD_OK) rc = td_idx_read(images, TD_IDX_MAGIC_IMAGES, &xi);
    if (rc == TD_OK) rc = td_idx_read(labels, TD_IDX_MAGIC_LABELS, &yi);
    if (rc == TD_OK) {
        td_array x = {.dtype = TD_DTYPE_U8, .ndim = 3, .data = xi.data};
        td_array y = {.dtype = TD_DTYPE_U8, .ndim = 1, .data = yi.data};
        x.shape[0] = xi.dims[0], x.shape[1] = xi.dims[1], x.shape[2] = xi.dims[2];
        y.shape[0] = yi.dims[0];
        xi.data = yi.data = NULL;
        if (x.shape[0] != y.shape[0])
            rc = td_error(TD_ERR_FORMAT,
                          "dataset: %s holds %llu images but %s holds %llu labels; the two "
                          "files must come from the same split (train with train, t10k with t10k)",
                          images, (unsigned long long)x.shape[0], labels,
                          (unsigned long long)y.shape[0]);
        if (rc == TD_OK) rc = from_arrays("idx", source, &x, &y, class_targets, out);
        td_array_free(&x);
        td_array_free(&y);
    }
    td_idx_free(&xi);
    td_idx_free(&yi);
    return rc;
}

static td_status open_idx_dir(const char *dir, const td_data_options *o, td_dataset_t **train,
                              td_dataset_t **test) {
    int m1, m2;
    td_status rc = TD_OK;
    char *xi = find_idx(dir, "train", "images-idx3-ubyte", &m1);
    char *yi = find_idx(dir, "train", "labels-idx1-ubyte", &m2);
    if (!xi || !yi || m1 > 1 || m2 > 1) {
        rc = td_error(!xi || !yi ? TD_ERR_NOTFOUND : TD_ERR_INVALID,
                      "%s %s: %s; an IDX directory holds one train-images-idx3-ubyte[.gz] "
                      "and train-labels-idx1-ubyte[.gz] (with any prefix) and their t10k- or "
                      "test- pair (Debian: apt-get install dataset-fashion-mnist installs "
                      "/usr/share/datasets/fashion-mnist)",
                      FLAG(o), dir,
                      !xi || !yi ? "no training images and labels found"
                                 : "several training sets found; give a directory with one");
        goto out;
    }
    rc = open_idx_files(xi, yi, dir, o->class_targets, train);
    if (rc != TD_OK) goto out;
    const char *splits[] = {"t10k", "test"};
    for (int i = 0; i < 2 && !*test && rc == TD_OK; i++) {
        char *xt = find_idx(dir, splits[i], "images-idx3-ubyte", &m1);
        char *yt = find_idx(dir, splits[i], "labels-idx1-ubyte", &m2);
        if (xt && yt) rc = open_idx_files(xt, yt, dir, o->class_targets, test);
        free(xt);
        free(yt);
    }
out:
    free(xi);
    free(yi);
    return rc;
}

static bool dir_has_idx(const char *dir) {
    int m;
    char *p = find_idx(dir, "train", "images-idx3-ubyte", &m);
    free(p);
    return m > 0;
}

static const char *detect(const char *spec) {
    if (strchr(spec, ',') && access(spec, F_OK) != 0) return "npy";
    if (is_dir(spec)) return dir_has_idx(spec) ? "idx" : "images";
    if (has_suffix(spec, ".csv")) return "csv";
    if (has_suffix(spec, ".npz")) return "npz";
    if (has_suffix(spec, ".npy")) return "npy";
    if (has_suffix(spec, ".safetensors")) return "safetensors";
    return NULL;
}

/* A FIFO, device or socket given as data: opening one for reading can wait forever for a
 * writer, and the readers read a file more than once and at offsets. Refused before anything
 * opens it. */
static td_status refuse_special(const char *path, const td_data_options *o) {
    struct stat sb;
    if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode)) return TD_OK;
    const char *kind = S_ISFIFO(sb.st_mode)   ? "a FIFO (named pipe)"
                       : S_ISSOCK(sb.st_mode) ? "a socket"
                       : S_ISCHR(sb.st_mode)  ? "a character device"
                       : S_ISBLK(sb.st_mode)  ? "a block device"
                                              : "not a regular file";
    return td_error(TD_ERR_INVALID,
                    "%s %s is %s; tandem reads data from regular files (more than once, and at "
                    "offsets): save the stream to a file and give that",
                    FLAG(o), path, kind);
}

td_status td_dataset_open(const char *spec, const td_data_options *o, td_dataset_t **train,
                          td_dataset_t **test) {
    *train = NULL;
    *test = NULL;
    td_data_options defaults = {.class_targets = true};
    if (!o) o = &defaults;
    TD_CHECK(refuse_special(spec, o));
    const char *comma = strchr(spec, ',');
    if (comma && access(spec, F_OK) != 0) { /* X.npy,Y.npy: each of the pair */
        char *x = td_xstrndup(spec, (size_t)(comma - spec));
        td_status rc = refuse_special(x, o);
        free(x);
        TD_CHECK(rc);
        TD_CHECK(refuse_special(comma + 1, o));
    }
    const char *fmt = o->format && strcmp(o->format, "auto") ? o->format : detect(spec);
    if (!fmt || (strcmp(fmt, "npy") && access(spec, F_OK) != 0)) {
        if (access(spec, F_OK) != 0)
            return td_error(TD_ERR_NOTFOUND,
                            "%s %s does not exist; give a directory of IDX files (Debian's "
                            "dataset-fashion-mnist installs train-images-idx3-ubyte.gz and the "
                            "rest in /usr/share/datasets/fashion-mnist), an image folder, a "
                            ".csv, .npz or .safetensors file, or X.npy,Y.npy",
                            FLAG(o), spec);
        return td_error(TD_ERR_INVALID,
                        "%s %s: cannot tell the format from the name; tandem reads a "
                        "directory of IDX files, an image folder, .csv, .npz, .safetensors and "
                        "X.npy,Y.npy pairs: rename the file or name the format with "
                        "--data-format idx|images|csv|npy|npz|safetensors",
                        FLAG(o), spec);
    }
    td_status rc;
    if (!strcmp(fmt, "idx")) {
        rc = open_idx_dir(spec, o, train, test);
    } else if (!strcmp(fmt, "images")) {
        char *tr = td_xasprintf("%s/train", spec), *te = NULL;
        if (is_dir(tr)) {
            te = td_xasprintf("%s/test", spec);
            if (!is_dir(te)) {
                free(te);
                te = td_xasprintf("%s/val", spec);
                if (!is_dir(te)) free(te), te = NULL;
            }
        }
        if (te) {
            rc = open_image_dir(tr, o, train);
            td_data_options same = *o;
            if (rc == TD_OK) { /* the held-out images take the training set's size */
                same.channels = td_dataset_channels(*train);
                same.height = td_dataset_rows(*train), same.width = td_dataset_cols(*train);
                rc = open_image_dir(te, &same, test);
            }
        } else {
            rc = open_image_dir(spec, o, train);
        }
        free(tr);
        free(te);
    } else if (!strcmp(fmt, "csv")) {
        rc = open_csv(spec, o, train);
    } else if (!strcmp(fmt, "npy")) {
        rc = open_npy_pair(spec, o, train);
    } else if (!strcmp(fmt, "npz") || !strcmp(fmt, "safetensors")) {
        rc = open_keyed(spec, o, !strcmp(fmt, "npz"), train, test);
    } else {
        return td_error(TD_ERR_INVALID,
                        "--data-format %s: use idx, images, csv, npy, npz or safetensors", fmt);
    }
    if (rc == TD_OK && *test) rc = td_dataset_check_pair(*train, *test, "its test split");
    if (rc == TD_OK && (*train)->st->count == 0)
        rc = td_error(TD_ERR_FORMAT, "%s %s holds no samples", FLAG(o), spec);
    if (rc != TD_OK) {
        td_dataset_free(*train);
        td_dataset_free(*test);
        *train = *test = NULL;
        return rc;
    }
    /* class counts cover both splits: a class seen only in the test set still has an output */
    if (*test && (*train)->st->labels) {
        int k = TD_MAX((*train)->st->num_classes, (*test)->st->num_classes);
        (*train)->st->num_classes = (*test)->st->num_classes = k;
    }
    return TD_OK;
}

/* "[features]" for a table's rows, "[c, h, w]" otherwise. */
static void shape_str(const storage *st, char *buf, size_t n) {
    if (st->h == 1 && st->w == 1)
        snprintf(buf, n, "[%d]", st->c);
    else
        snprintf(buf, n, "[%d, %d, %d]", st->c, st->h, st->w);
}

td_status td_dataset_check_pair(const td_dataset_t *ds, const td_dataset_t *o, const char *what) {
    const storage *a = ds->st, *b = o->st;
    char sa[64], sb[64];
    shape_str(a, sa, sizeof sa);
    shape_str(b, sb, sizeof sb);
    if (a->c != b->c || a->h != b->h || a->w != b->w)
        return td_error(TD_ERR_FORMAT,
                        "%s (%s) has samples of shape %s but the training set (%s) %s; both "
                        "must hold the same kind of sample",
                        what, b->source, sb, a->source, sa);
    if (!a->labels != !b->labels || a->target_dim != b->target_dim)
        return td_error(TD_ERR_FORMAT,
                        "%s (%s) has other targets than the training set (%s): %d vs %d values "
                        "per sample",
                        what, b->source, a->source, b->target_dim, a->target_dim);
    return TD_OK;
}

/* ---- the held-out split ---- */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static td_dataset_t *view(const td_dataset_t *ds, uint64_t *index, uint64_t n) {
    ds->st->refs++;
    td_dataset_t *v = dataset_over(ds->st);
    v->index = index;
    v->count = n;
    return v;
}

td_status td_dataset_split(td_dataset_t *ds, double fraction, td_dataset_t **train,
                           td_dataset_t **val) {
    *train = *val = NULL;
    uint64_t n = ds->count;
    uint64_t nval = (uint64_t)ceil(fraction * (double)n);
    if (!(fraction > 0 && fraction < 1) || nval >= n) {
        td_dataset_free(ds);
        return td_error(TD_ERR_INVALID,
                        "--val-fraction %g: must be in (0, 1) and leave training samples "
                        "(the data set has %llu)",
                        fraction, (unsigned long long)n);
    }
    uint64_t *perm = td_xmalloc(n * sizeof *perm);
    td_sampler_permutation(SPLIT_SEED, 0, n, perm);
    for (uint64_t i = 0; i < n; i++) /* through the parent's own index */
        if (ds->index) perm[i] = ds->index[perm[i]];
    uint64_t *vi = td_xmalloc(nval * sizeof *vi), *ti = td_xmalloc((n - nval) * sizeof *ti);
    memcpy(ti, perm, (n - nval) * sizeof *ti);
    memcpy(vi, perm + (n - nval), nval * sizeof *vi);
    free(perm);
    /* record order within each part: a file-backed set is read front to back per epoch */
    qsort(ti, n - nval, sizeof *ti, cmp_u64);
    qsort(vi, nval, sizeof *vi, cmp_u64);
    *train = view(ds, ti, n - nval);
    *val = view(ds, vi, nval);
    td_dataset_free(ds);
    return TD_OK;
}

/* ---- reading records ---- */

static uint64_t record_of(const td_dataset_t *ds, uint64_t id) {
    return ds->index ? ds->index[id] : id;
}

static td_status read_records(const storage *st, uint64_t first, uint64_t n, uint8_t *dst) {
    uint64_t off = st->offset + first * st->rec_bytes;
    if (td__pread_full(st->fd, dst, n * st->rec_bytes, off) == 0) return TD_OK;
    if (errno)
        return td_error_errno(TD_ERR_IO, "reading %s at byte %llu (sample %llu)", st->path,
                              (unsigned long long)off, (unsigned long long)first);
    return td_error(TD_ERR_IO,
                    "%s ended inside samples %llu..%llu; the file was truncated after it was "
                    "opened",
                    st->path, (unsigned long long)first, (unsigned long long)(first + n - 1));
}

static void normalise_f32(const td_dataset_t *ds, float *x);

/* Record bytes -> normalised floats. */
static void convert(const td_dataset_t *ds, const uint8_t *src, float *dst) {
    const storage *st = ds->st;
    size_t plane = (size_t)st->h * (size_t)st->w;
    if (st->dtype == TD_DTYPE_U8) {
        for (int ch = 0; ch < st->c; ch++) {
            const float *lut = ds->lut + (size_t)ch * 256;
            const uint8_t *s = src + (size_t)ch * plane;
            float *d = dst + (size_t)ch * plane;
            for (size_t k = 0; k < plane; k++) d[k] = lut[s[k]];
        }
        return;
    }
    if (st->dtype == TD_DTYPE_F32) {
        memcpy(dst, src, st->rec_bytes);
        normalise_f32(ds, dst);
        return;
    }
    for (int ch = 0; ch < st->c; ch++) {
        const float m = ds->mean[ch], sd = ds->std[ch];
        for (size_t k = 0; k < plane; k++) {
            size_t e = (size_t)ch * plane + k;
            dst[e] = ((float)element(src, st->dtype, e) - m) / sd;
        }
    }
}

/* Normalises float32 values in place: the file-backed path reads a float32 record straight into
 * the batch, which saves a copy per sample. The same arithmetic as convert(). */
static void normalise_f32(const td_dataset_t *ds, float *x) {
    const storage *st = ds->st;
    size_t plane = (size_t)st->h * (size_t)st->w;
    for (int ch = 0; ch < st->c; ch++) {
        const float m = ds->mean[ch], sd = ds->std[ch];
        float *d = x + (size_t)ch * plane;
        for (size_t k = 0; k < plane; k++) d[k] = (d[k] - m) / sd;
    }
}

void td_dataset_will_need(const td_dataset_t *ds, const uint64_t *ids, int n) {
    const storage *st = ds->st;
    if (st->fd < 0) return;
    for (int i = 0; i < n; i++) {
        uint64_t off = st->offset + record_of(ds, ids[i]) * st->rec_bytes;
        (void)posix_fadvise(st->fd, (off_t)off, (off_t)st->rec_bytes, POSIX_FADV_WILLNEED);
    }
}

td_status td_dataset_gather(const td_dataset_t *ds, const uint64_t *ids, int n, float *x,
                            int32_t *y, float *t) {
    const storage *st = ds->st;
    uint8_t *buf = NULL;
    bool direct = st->dtype == TD_DTYPE_F32;
    if (st->fd >= 0 && x && !direct) buf = td_xmalloc(st->rec_bytes);
    for (int i = 0; i < n; i++) {
        uint64_t r = record_of(ds, ids[i]);
        float *dst = x ? x + (size_t)i * st->elems : NULL;
        if (x && st->mem) {
            convert(ds, st->mem + r * st->rec_bytes, dst);
        } else if (x) {
            td_status rc = read_records(st, r, 1, direct ? (uint8_t *)dst : buf);
            /* a file-backed set is not read through when opened: each record as it comes */
            if (rc == TD_OK) rc = check_record(st, st->path, direct ? (uint8_t *)dst : buf, r);
            if (rc != TD_OK) {
                free(buf);
                return rc;
            }
            if (direct)
                normalise_f32(ds, dst);
            else
                convert(ds, buf, dst);
        }
        if (y && st->labels) y[i] = st->labels[r];
        if (t && st->targets)
            memcpy(t + (size_t)i * (size_t)st->target_dim,
                   st->targets + r * (uint64_t)st->target_dim,
                   (size_t)st->target_dim * sizeof(float));
    }
    free(buf);
    return TD_OK;
}

/* ---- normalisation ---- */

td_status td_dataset_set_norm(td_dataset_t *ds, const float *mean, const float *std, int n) {
    const storage *st = ds->st;
    if (n != 1 && n != st->c)
        return td_error(TD_ERR_INVALID,
                        "--mean/--std: %d values, but %s has %d channels (features); give one "
                        "value for all or one per channel",
                        n, st->source, st->c);
    for (int i = 0; i < n; i++)
        if (!isfinite(mean[i]) || !(std[i] > 0) || !isfinite(std[i]))
            return td_error(TD_ERR_INVALID,
                            "--mean %g / --std %g: the mean must be finite and the std > 0",
                            (double)mean[i], (double)std[i]);
    set_norm(ds, mean, std, n);
    return TD_OK;
}

/* Unchecked: one value for every channel (n == 1) or one each; the uint8 table follows. */
static void set_norm(td_dataset_t *ds, const float *mean, const float *std, int n) {
    const storage *st = ds->st;
    for (int ch = 0; ch < st->c; ch++) /* element ch reads index ch or 0: safe in place */
        ds->mean[ch] = mean[n == 1 ? 0 : ch], ds->std[ch] = std[n == 1 ? 0 : ch];
    if (ds->lut) /* the formula of the Fashion-MNIST LUT before per-channel statistics */
        for (int ch = 0; ch < st->c; ch++)
            for (int v = 0; v < 256; v++)
                ds->lut[ch * 256 + v] = ((float)v / 255.0f - ds->mean[ch]) / ds->std[ch];
}

/* Visits every sample's record r in order, in blocks (a file-backed set is read sequentially). */
typedef void (*record_fn)(void *user, const uint8_t *rec, uint64_t r);

static void each_record(const td_dataset_t *ds, record_fn fn, void *user) {
    const storage *st = ds->st;
    enum { BLOCK_BYTES = 4 << 20 };
    uint64_t per = TD_MAX((uint64_t)1, BLOCK_BYTES / st->rec_bytes);
    uint8_t *buf = st->mem ? NULL : td_xmalloc(per * st->rec_bytes);
    for (uint64_t i = 0; i < ds->count;) {
        if (st->mem) {
            fn(user, st->mem + record_of(ds, i) * st->rec_bytes, record_of(ds, i));
            i++;
            continue;
        }
        uint64_t r = record_of(ds, i), k = 1; /* a run of consecutive records */
        while (k < per && i + k < ds->count && record_of(ds, i + k) == r + k) k++;
        if (read_records(st, r, k, buf) != TD_OK) {
            TD_LOG_WARN("normalisation statistics: %s; they cover the samples read before it",
                        td_error_msg());
            break;
        }
        for (uint64_t j = 0; j < k; j++) fn(user, buf + j * st->rec_bytes, r + j);
        i += k;
    }
    free(buf);
}

typedef struct {
    const storage *st;
    uint64_t *hist; /* uint8: [c][256] */
    double *sum;    /* others: [c], then the squared deviations' sums */
    const double *mean;
} stats_acc;

static void hist_rec(void *user, const uint8_t *rec, uint64_t r) {
    (void)r;
    stats_acc *a = user;
    size_t plane = (size_t)a->st->h * (size_t)a->st->w;
    for (int ch = 0; ch < a->st->c; ch++) {
        uint64_t *h = a->hist + (size_t)ch * 256;
        const uint8_t *s = rec + (size_t)ch * plane;
        for (size_t k = 0; k < plane; k++) h[s[k]]++;
    }
}

static void sum_rec(void *user, const uint8_t *rec, uint64_t r) {
    (void)r;
    stats_acc *a = user;
    size_t plane = (size_t)a->st->h * (size_t)a->st->w;
    for (int ch = 0; ch < a->st->c; ch++) {
        double s = 0, m = a->mean ? a->mean[ch] : 0;
        for (size_t k = 0; k < plane; k++) {
            double v = element(rec, a->st->dtype, (size_t)ch * plane + k) - m;
            s += a->mean ? v * v : v;
        }
        a->sum[ch] += s;
    }
}

void td_dataset_compute_norm(const td_dataset_t *ds, float *mean, float *std) {
    const storage *st = ds->st;
    double n = (double)ds->count * (double)st->h * (double)st->w;
    stats_acc a = {.st = st};
    if (st->dtype == TD_DTYPE_U8) { /* exact: a histogram per channel */
        a.hist = td_xcalloc((size_t)st->c * 256, sizeof *a.hist);
        each_record(ds, hist_rec, &a);
        for (int ch = 0; ch < st->c; ch++) {
            const uint64_t *h = a.hist + (size_t)ch * 256;
            double s = 0, q = 0;
            for (int v = 0; v < 256; v++) s += (double)h[v] * v;
            double m = n > 0 ? s / n / 255.0 : 0;
            for (int v = 0; v < 256; v++) q += (double)h[v] * (v / 255.0 - m) * (v / 255.0 - m);
            double sd = n > 0 ? sqrt(q / n) : 0;
            mean[ch] = (float)m;
            std[ch] = sd > 0 ? (float)sd : 1.0f; /* a constant channel: as StandardScaler */
        }
        free(a.hist);
        return;
    }
    double *sum = td_xcalloc((size_t)st->c, sizeof *sum), *m = td_xcalloc((size_t)st->c, 8);
    a.sum = sum;
    each_record(ds, sum_rec, &a); /* two passes: the mean, then the squared deviations */
    for (int ch = 0; ch < st->c; ch++) m[ch] = n > 0 ? sum[ch] / n : 0, sum[ch] = 0;
    a.mean = m;
    each_record(ds, sum_rec, &a);
    for (int ch = 0; ch < st->c; ch++) {
        double sd = n > 0 ? sqrt(sum[ch] / n) : 0;
        mean[ch] = (float)m[ch];
        std[ch] = sd > 0 && (float)sd > 0 ? (float)sd : 1.0f;
    }
    free(sum);
    free(m);
}

typedef struct {
    const storage *st;
    td_status rc;
} finite_acc;

static void finite_rec(void *user, const uint8_t *rec, uint64_t r) {
    finite_acc *a = user;
    if (a->rc == TD_OK) a->rc = check_record(a->st, a->st->path, rec, r);
}

td_status td_dataset_check_finite(const td_dataset_t *ds) {
    const storage *st = ds->st;
    if (st->finite || !td_dtype_is_float(st->dtype)) return TD_OK;
    finite_acc a = {.st = st, .rc = TD_OK};
    each_record(ds, finite_rec, &a);
    return a.rc;
}

/* ---- Fashion-MNIST, as before ---- */

td_status td_dataset_load_idx(const char *images_path, const char *labels_path, int num_classes,
                              float mean, float std, td_dataset_t **out) {
    *out = NULL;
    if (num_classes < 1 || !(std > 0))
        return td_error(TD_ERR_INVALID, "dataset: num_classes %d and std %g must be positive",
                        num_classes, (double)std);
    TD_CHECK(open_idx_files(images_path, labels_path, images_path, true, out));
    storage *st = (*out)->st;
    if (st->num_classes > num_classes) {
        for (uint64_t i = 0; i < st->count; i++)
            if (st->labels[i] >= num_classes) {
                td_status rc =
                    td_error(TD_ERR_FORMAT,
                             "dataset: %s: label %d of sample %llu is out of range "
                             "[0, %d); the labels file belongs to another dataset",
                             labels_path, st->labels[i], (unsigned long long)i, num_classes);
                td_dataset_free(*out);
                *out = NULL;
                return rc;
            }
    }
    st->num_classes = num_classes;
    return td_dataset_set_norm(*out, &mean, &std, 1);
}

/* dir/name.gz if it exists, else dir/name if that exists, else the .gz path (for the error). */
static char *find_file(const char *dir, const char *name) {
    char *gz = td_xasprintf("%s/%s.gz", dir, name);
    if (access(gz, F_OK) == 0) return gz;
    char *plain = td_xasprintf("%s/%s", dir, name);
    if (access(plain, F_OK) == 0) {
        free(gz);
        return plain;
    }
    free(plain);
    return gz;
}

td_status td_dataset_load_fashion_mnist(const char *dir, const char *split, td_dataset_t **out) {
    *out = NULL;
    if (strcmp(split, "train") && strcmp(split, "t10k"))
        return td_error(TD_ERR_INVALID, "dataset split '%s': use train or t10k", split);
    char *images_name = td_xasprintf("%s-images-idx3-ubyte", split);
    char *labels_name = td_xasprintf("%s-labels-idx1-ubyte", split);
    char *images = find_file(dir, images_name);
    char *labels = find_file(dir, labels_name);
    td_status rc =
        td_dataset_load_idx(images, labels, 10, TD_FASHION_MNIST_MEAN, TD_FASHION_MNIST_STD, out);
    free(images_name);
    free(labels_name);
    free(images);
    free(labels);
    return rc;
}

/* ---- inspection ---- */

uint64_t td_dataset_count(const td_dataset_t *ds) {
    return ds->count;
}
int td_dataset_sample_size(const td_dataset_t *ds) {
    return (int)ds->st->elems;
}
int td_dataset_channels(const td_dataset_t *ds) {
    return ds->st->c;
}
int td_dataset_rows(const td_dataset_t *ds) {
    return ds->st->h;
}
int td_dataset_cols(const td_dataset_t *ds) {
    return ds->st->w;
}
int td_dataset_num_classes(const td_dataset_t *ds) {
    return ds->st->labels ? ds->st->num_classes : 0;
}
int td_dataset_target_dim(const td_dataset_t *ds) {
    return ds->st->target_dim;
}
td_dtype td_dataset_dtype(const td_dataset_t *ds) {
    return ds->st->dtype;
}
bool td_dataset_file_backed(const td_dataset_t *ds) {
    return ds->st->fd >= 0;
}
const float *td_dataset_mean(const td_dataset_t *ds) {
    return ds->mean;
}
const float *td_dataset_std(const td_dataset_t *ds) {
    return ds->std;
}

const char *td_dataset_describe(const td_dataset_t *ds) {
    td_dataset_t *m = (td_dataset_t *)ds; /* a cache of the description only */
    const storage *st = ds->st;
    char shape[64];
    shape_str(st, shape, sizeof shape);
    char targets[64];
    if (st->labels)
        snprintf(targets, sizeof targets, "%d classes", st->num_classes);
    else
        snprintf(targets, sizeof targets, "%d target value%s", st->target_dim,
                 st->target_dim == 1 ? "" : "s");
    snprintf(m->desc, sizeof m->desc, "%s %s: %llu samples of %s %s, %s%s", st->format, st->source,
             (unsigned long long)ds->count, shape, td_dtype_name(st->dtype), targets,
             st->fd >= 0 ? ", read from the file as needed" : "");
    return m->desc;
}

const uint8_t *td_dataset_pixels(const td_dataset_t *ds) {
    const storage *st = ds->st;
    return st->dtype == TD_DTYPE_U8 && st->c == 1 && st->mem && !ds->index ? st->mem : NULL;
}
const int32_t *td_dataset_labels(const td_dataset_t *ds) {
    return ds->index ? NULL : ds->st->labels;
}
void td_dataset_lut(const td_dataset_t *ds, float *lut) {
    if (ds->lut) memcpy(lut, ds->lut, (size_t)ds->st->c * 256 * sizeof(float));
}

size_t td_dataset_packed_bytes(const td_dataset_t *ds) {
    return ds->st->elems * (ds->st->dtype == TD_DTYPE_U8 ? 1 : sizeof(float));
}

td_status td_dataset_pack_ids(const td_dataset_t *ds, const uint64_t *ids, int n, void *values,
                              int32_t *labels, float *targets) {
    const storage *st = ds->st;
    /* uint8 and float32 records are their packed form; other dtypes convert through rec */
    bool as_is = st->dtype == TD_DTYPE_U8 || st->dtype == TD_DTYPE_F32;
    size_t rb = td_dataset_packed_bytes(ds), tdim = st->labels ? 0 : (size_t)st->target_dim;
    uint8_t *rec = st->mem || as_is ? NULL : td_xmalloc(st->rec_bytes);
    for (int i = 0; i < n; i++) {
        uint64_t r = record_of(ds, ids[i]);
        uint8_t *dst = (uint8_t *)values + (size_t)i * rb;
        const uint8_t *src = st->mem ? st->mem + r * st->rec_bytes : rec ? rec : dst;
        if (!st->mem) { /* read in place where it is already the packed form */
            td_status rc = read_records(st, r, 1, (uint8_t *)src);
            if (rc == TD_OK) rc = check_record(st, st->path, src, r);
            if (rc != TD_OK) {
                free(rec);
                return rc;
            }
        }
        if (as_is) {
            if (src != dst) memcpy(dst, src, st->rec_bytes);
        } else { /* as convert() does: the value as a float, then normalised on the device */
            for (size_t e = 0; e < st->elems; e++) {
                float f = (float)element(src, st->dtype, e);
                memcpy(dst + e * sizeof f, &f, sizeof f);
            }
        }
        if (st->labels && labels) labels[i] = st->labels[r];
        if (!st->labels && targets)
            memcpy(targets + (size_t)i * tdim, st->targets + r * tdim, tdim * sizeof(float));
    }
    free(rec);
    return TD_OK;
}

td_status td_dataset_pack(const td_dataset_t *ds, void **values, bool *u8, int32_t **labels,
                          float **targets) {
    const storage *st = ds->st;
    *values = NULL, *labels = NULL, *targets = NULL;
    *u8 = st->dtype == TD_DTYPE_U8;
    size_t rb = td_dataset_packed_bytes(ds), bytes = ds->count * rb;
    size_t tdim = st->labels ? 0 : (size_t)st->target_dim;
    void *v = malloc(bytes + 1);
    int32_t *y = st->labels ? malloc(ds->count * sizeof(int32_t) + 1) : NULL;
    float *t = st->labels ? NULL : malloc(ds->count * tdim * sizeof(float) + 1);
    if (!v || (!y && !t)) {
        free(v), free(y), free(t);
        return td_error(TD_ERR_NOMEM, "%s: no memory for a packed copy of %llu samples (%zu MiB)",
                        st->source, (unsigned long long)ds->count, bytes >> 20);
    }
    enum { CHUNK = 4096 }; /* ids 0..count-1 in runs, so no [count] id array is needed */
    uint64_t ids[CHUNK];
    for (uint64_t i0 = 0; i0 < ds->count; i0 += CHUNK) {
        int k = (int)TD_MIN((uint64_t)CHUNK, ds->count - i0);
        for (int i = 0; i < k; i++) ids[i] = i0 + (uint64_t)i;
        td_status rc = td_dataset_pack_ids(ds, ids, k, (uint8_t *)v + i0 * rb, y ? y + i0 : NULL,
                                           t ? t + i0 * tdim : NULL);
        if (rc != TD_OK) {
            free(v), free(y), free(t);
            return rc;
        }
    }
    *values = v, *labels = y, *targets = t;
    return TD_OK;
}
