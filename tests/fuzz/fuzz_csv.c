/* CSV files (src/data/csv.c): the input read with the target as the last column, as column 0,
 * and as the first header name the last read reported. A table that loads is consistent; an
 * error names the file. Then the input opened as a data set (src/data/dataset.c), with class
 * targets and with real ones, the way `tandem train --data` opens it: what opens is within the
 * limits the trainer's arrays assume (at most TD_DATA_MAX_CHANNELS features, classes within
 * TD_DATA_MAX_CLASSES), its statistics are finite and its last samples gather, labels in range. */
#include "fuzz.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/data.h"

static void check(const td_csv *c) {
    FUZZ_ASSERT(c->rows > 0 && c->cols >= 1, "%llu rows, %d cols", (unsigned long long)c->rows,
                c->cols);
    FUZZ_ASSERT(c->target_name && c->target, "%s", "no target");
    for (int j = 0; j < c->cols; j++) FUZZ_ASSERT(c->feature_names[j], "feature name %d", j);
    for (uint64_t i = 0; i < c->rows * (uint64_t)c->cols; i++)
        FUZZ_ASSERT(isfinite(c->features[i]), "feature %llu is %g", (unsigned long long)i,
                    (double)c->features[i]);
    if (c->class_names) {
        FUZZ_ASSERT(c->num_class_names >= 1, "%d classes", c->num_class_names);
        for (int k = 1; k < c->num_class_names; k++)
            FUZZ_ASSERT(strcmp(c->class_names[k - 1], c->class_names[k]) < 0,
                        "class names not sorted and distinct at %d", k);
        for (uint64_t i = 0; i < c->rows; i++)
            FUZZ_ASSERT(c->target[i] >= 0 && c->target[i] < c->num_class_names &&
                            c->target[i] == floor(c->target[i]),
                        "class index %g of %d", c->target[i], c->num_class_names);
    } else {
        for (uint64_t i = 0; i < c->rows; i++)
            FUZZ_ASSERT(isfinite(c->target[i]), "target %llu is %g", (unsigned long long)i,
                        c->target[i]);
    }
}

static void open_as_dataset(const char *path, bool classes) {
    td_data_options o = {.format = "csv", .class_targets = classes};
    td_dataset_t *train = NULL, *test = NULL;
    if (td_dataset_open(path, &o, &train, &test) != TD_OK) {
        FUZZ_ASSERT(strstr(td_error_msg(), path), "error without the path: %s", td_error_msg());
        FUZZ_ASSERT(!train && !test, "%s", "a data set left after an error");
        td_error_clear();
        return;
    }
    int c = td_dataset_channels(train);
    FUZZ_ASSERT(c >= 1 && c <= TD_DATA_MAX_CHANNELS, "%d features", c);
    FUZZ_ASSERT(!classes || (td_dataset_num_classes(train) >= 1 &&
                             td_dataset_num_classes(train) <= TD_DATA_MAX_CLASSES),
                "%d classes", td_dataset_num_classes(train));
    const int32_t *labels = td_dataset_labels(train);
    int k = td_dataset_num_classes(train);
    if (labels && k > TD_DATA_SPARSE_CLASSES) { /* a class count the labels seen justify */
        uint8_t *seen = calloc((size_t)k, 1);
        uint64_t distinct = 0;
        FUZZ_ASSERT(seen, "%s", "calloc");
        for (uint64_t i = 0; i < td_dataset_count(train); i++)
            distinct += !seen[labels[i]], seen[labels[i]] = 1;
        free(seen);
        FUZZ_ASSERT((uint64_t)k <= TD_DATA_SPARSE_FACTOR * distinct, "%d classes, %llu labels", k,
                    (unsigned long long)distinct);
    }
    float *mean = malloc((size_t)c * sizeof *mean), *sd = malloc((size_t)c * sizeof *sd);
    FUZZ_ASSERT(mean && sd, "%s", "malloc");
    td_dataset_compute_norm(train, mean, sd);
    for (int j = 0; j < c; j++)
        FUZZ_ASSERT(isfinite(mean[j]) && isfinite(sd[j]) && sd[j] > 0, "feature %d: %g, %g", j,
                    (double)mean[j], (double)sd[j]);
    FUZZ_ASSERT(td_dataset_set_norm(train, mean, sd, c) == TD_OK, "%s", td_error_msg());
    enum { N = 4 };
    uint64_t ids[N];
    int n = (int)(td_dataset_count(train) < N ? td_dataset_count(train) : N);
    for (int i = 0; i < n; i++) ids[i] = td_dataset_count(train) - 1 - (uint64_t)i;
    float *x = malloc((size_t)N * (size_t)c * sizeof *x), t[N];
    int32_t y[N];
    FUZZ_ASSERT(x, "%s", "malloc");
    FUZZ_ASSERT(td_dataset_gather(train, ids, n, x, classes ? y : NULL, classes ? NULL : t) ==
                    TD_OK,
                "%s", td_error_msg());
    /* x is read, not asserted finite: (x - mean) in float32 overflows for values near 3.4e38
     * far from their column's mean, which is arithmetic the trainer shares, not a reader bug */
    float sum = 0;
    for (int i = 0; i < n * c; i++) sum += x[i];
    (void)sum;
    for (int i = 0; classes && i < n; i++)
        FUZZ_ASSERT(y[i] >= 0 && y[i] < td_dataset_num_classes(train), "label %d", y[i]);
    free(x);
    free(mean);
    free(sd);
    td_dataset_free(train);
    td_dataset_free(test);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    const char *path = fuzz_file(data, size);
    open_as_dataset(path, true);
    open_as_dataset(path, false);
    char *name = NULL;
    const char *targets[3] = {NULL, "0", NULL};
    for (int k = 0; k < 3; k++) {
        if (k == 2 && !name) break;
        td_csv c;
        td_status st = td_csv_read(path, k == 2 ? name : targets[k], &c);
        if (st == TD_OK) {
            check(&c);
            if (!name && c.cols > 0) name = strdup(c.feature_names[0]);
        } else if (st != TD_ERR_INVALID || k != 2) {
            FUZZ_ASSERT(strstr(td_error_msg(), path), "error without the path: %s", td_error_msg());
        }
        td_csv_free(&c);
        td_error_clear();
    }
    free(name);
    return 0;
}
