/* CSV files (src/data/csv.c): the input read with the target as the last column, as column 0,
 * and as the first header name the last read reported. A table that loads is consistent; an
 * error names the file. */
#include "fuzz.h"

#include <math.h>
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    const char *path = fuzz_file(data, size);
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
