/* In-memory image datasets: the IDX pixels as uint8, labels as int32, normalised per batch. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tandem/data.h"

struct td_dataset {
    uint64_t count;
    int rows, cols;
    int num_classes;
    float mean, std;
    uint8_t *pixels;
    int32_t *labels;
    float lut[256]; /* pixel byte -> normalised float, so gathering is a table lookup */
};

td_status td_dataset_load_idx(const char *images_path, const char *labels_path, int num_classes,
                              float mean, float std, td_dataset_t **out) {
    *out = NULL;
    td_status rc = TD_OK;
    td_idx images = {0}, labels = {0};
    if (num_classes < 1 || !(std > 0))
        return td_error(TD_ERR_INVALID, "dataset: num_classes %d and std %g must be positive",
                        num_classes, (double)std);
    TD_CHECK_GOTO(td_idx_read(images_path, TD_IDX_MAGIC_IMAGES, &images), rc, out);
    TD_CHECK_GOTO(td_idx_read(labels_path, TD_IDX_MAGIC_LABELS, &labels), rc, out);
    if (images.dims[0] != labels.dims[0]) {
        rc = td_error(TD_ERR_FORMAT,
                      "dataset: %s holds %u images but %s holds %u labels; the two files must "
                      "come from the same split (train with train, t10k with t10k)",
                      images_path, images.dims[0], labels_path, labels.dims[0]);
        goto out;
    }
    for (uint32_t i = 0; i < labels.dims[0]; i++) {
        if (labels.data[i] >= num_classes) {
            rc = td_error(TD_ERR_FORMAT,
                          "dataset: %s: label %u of sample %u is out of range [0, %d); the "
                          "labels file is corrupt or belongs to another dataset",
                          labels_path, labels.data[i], i, num_classes);
            goto out;
        }
    }
    td_dataset_t *ds = td_xcalloc(1, sizeof *ds);
    ds->count = images.dims[0];
    ds->rows = (int)images.dims[1];
    ds->cols = (int)images.dims[2];
    ds->num_classes = num_classes;
    ds->mean = mean;
    ds->std = std;
    ds->pixels = images.data;
    images.data = NULL;
    ds->labels = td_xmalloc((ds->count ? ds->count : 1) * sizeof(int32_t));
    for (uint64_t i = 0; i < ds->count; i++) ds->labels[i] = labels.data[i];
    for (int v = 0; v < 256; v++) ds->lut[v] = ((float)v / 255.0f - mean) / std;
    *out = ds;
out:
    td_idx_free(&images);
    td_idx_free(&labels);
    return rc;
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
    TD_CHECK(rc);
    return TD_OK;
}

void td_dataset_free(td_dataset_t *ds) {
    if (!ds) return;
    free(ds->pixels);
    free(ds->labels);
    free(ds);
}

uint64_t td_dataset_count(const td_dataset_t *ds) {
    return ds->count;
}
int td_dataset_sample_size(const td_dataset_t *ds) {
    return ds->rows * ds->cols;
}
int td_dataset_rows(const td_dataset_t *ds) {
    return ds->rows;
}
int td_dataset_cols(const td_dataset_t *ds) {
    return ds->cols;
}
int td_dataset_num_classes(const td_dataset_t *ds) {
    return ds->num_classes;
}
void td_dataset_lut(const td_dataset_t *ds, float lut[256]) {
    memcpy(lut, ds->lut, sizeof ds->lut);
}

const uint8_t *td_dataset_pixels(const td_dataset_t *ds) {
    return ds->pixels;
}
const int32_t *td_dataset_labels(const td_dataset_t *ds) {
    return ds->labels;
}

void td_dataset_gather(const td_dataset_t *ds, const uint64_t *ids, int n, float *x, int32_t *y) {
    size_t size = (size_t)ds->rows * (size_t)ds->cols;
    for (int i = 0; i < n; i++) {
        const uint8_t *src = ds->pixels + ids[i] * size;
        float *dst = x + (size_t)i * size;
        for (size_t k = 0; k < size; k++) dst[k] = ds->lut[src[k]];
        if (y) y[i] = ds->labels[ids[i]];
    }
}
