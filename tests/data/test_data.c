/* data: IDX reader errors (each names the file), dataset loading and normalisation, the real
 * Fashion-MNIST when installed, and the sampler's permutation properties. */
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include "tandem/data.h"
#include "test.h"

static char tmpdir[] = "/tmp/td_test_data_XXXXXX";

static void put_be32(uint8_t *b, uint32_t v) {
    b[0] = (uint8_t)(v >> 24);
    b[1] = (uint8_t)(v >> 16);
    b[2] = (uint8_t)(v >> 8);
    b[3] = (uint8_t)v;
}

/* Writes an IDX file: magic, dims, then `nbytes` data bytes (pattern i*7+label-ish); gz or plain.
 */
static char *write_idx(const char *name, int gz, uint32_t magic, int ndims, const uint32_t *dims,
                       const uint8_t *data, size_t nbytes) {
    char *path = td_xasprintf("%s/%s", tmpdir, name);
    uint8_t head[16];
    put_be32(head, magic);
    for (int i = 0; i < ndims; i++) put_be32(head + 4 + 4 * i, dims[i]);
    size_t head_bytes = 4 + 4 * (size_t)ndims;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ASSERT(f);
        ASSERT_EQ(gzwrite(f, head, (unsigned)head_bytes), head_bytes);
        if (nbytes) ASSERT_EQ(gzwrite(f, data, (unsigned)nbytes), nbytes);
        ASSERT_EQ(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        ASSERT(f);
        ASSERT_EQ(fwrite(head, 1, head_bytes, f), head_bytes);
        if (nbytes) ASSERT_EQ(fwrite(data, 1, nbytes, f), nbytes);
        ASSERT_EQ(fclose(f), 0);
    }
    return path;
}

static void check_idx_errors(int gz) {
    enum { N = 5, R = 4, C = 3 };
    uint8_t pixels[N * R * C], labels[N];
    for (int i = 0; i < N * R * C; i++) pixels[i] = (uint8_t)(i * 7);
    for (int i = 0; i < N; i++) labels[i] = (uint8_t)(i % 10);
    uint32_t idims[3] = {N, R, C}, ldims[1] = {N};
    const char *sfx = gz ? ".gz" : "";
    char name[64];

    /* good pair: loads, normalises, gathers in the requested order */
    snprintf(name, sizeof name, "good-images%s", sfx);
    char *img = write_idx(name, gz, TD_IDX_MAGIC_IMAGES, 3, idims, pixels, sizeof pixels);
    snprintf(name, sizeof name, "good-labels%s", sfx);
    char *lab = write_idx(name, gz, TD_IDX_MAGIC_LABELS, 1, ldims, labels, sizeof labels);
    td_dataset_t *ds = NULL;
    ASSERT_OK(td_dataset_load_idx(img, lab, 10, 0.5f, 0.25f, &ds));
    ASSERT_EQ(td_dataset_count(ds), N);
    ASSERT_EQ(td_dataset_sample_size(ds), R * C);
    uint64_t ids[2] = {3, 1};
    float x[2 * R * C];
    int32_t y[2];
    ASSERT_OK(td_dataset_gather(ds, ids, 2, x, y, NULL));
    ASSERT_EQ(y[0], 3);
    ASSERT_EQ(y[1], 1);
    for (int k = 0; k < R * C; k++) {
        ASSERT_NEAR(x[k], ((float)pixels[3 * R * C + k] / 255.0f - 0.5f) / 0.25f, 1e-6);
        ASSERT_NEAR(x[R * C + k], ((float)pixels[1 * R * C + k] / 255.0f - 0.5f) / 0.25f, 1e-6);
    }
    td_dataset_free(ds);

    /* truncated data */
    snprintf(name, sizeof name, "short-images%s", sfx);
    char *bad = write_idx(name, gz, TD_IDX_MAGIC_IMAGES, 3, idims, pixels, sizeof pixels - 5);
    ASSERT_STATUS(td_dataset_load_idx(bad, lab, 10, 0.5f, 0.25f, &ds), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), bad);
    ASSERT_CONTAINS(td_error_msg(), "truncated");
    ASSERT(ds == NULL);
    free(bad);

    /* truncated inside the header */
    snprintf(name, sizeof name, "tiny%s", sfx);
    bad = write_idx(name, gz, TD_IDX_MAGIC_IMAGES, 1, idims, NULL, 0);
    td_idx idx;
    ASSERT_STATUS(td_idx_read(bad, TD_IDX_MAGIC_IMAGES, &idx), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), bad);
    ASSERT_CONTAINS(td_error_msg(), "truncated");
    free(bad);

    /* wrong magic: a labels file where images belong */
    ASSERT_STATUS(td_dataset_load_idx(lab, lab, 10, 0.5f, 0.25f, &ds), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), lab);
    ASSERT_CONTAINS(td_error_msg(), "bad magic 0x00000801, expected 0x00000803");
    snprintf(name, sizeof name, "junk%s", sfx);
    bad = write_idx(name, gz, 0x12345678u, 0, idims, pixels, 8);
    ASSERT_STATUS(td_idx_read(bad, TD_IDX_MAGIC_LABELS, &idx), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), bad);
    ASSERT_CONTAINS(td_error_msg(), "bad magic 0x12345678");
    free(bad);

    /* image/label count mismatch */
    uint32_t ldims4[1] = {N - 1};
    snprintf(name, sizeof name, "four-labels%s", sfx);
    bad = write_idx(name, gz, TD_IDX_MAGIC_LABELS, 1, ldims4, labels, N - 1);
    ASSERT_STATUS(td_dataset_load_idx(img, bad, 10, 0.5f, 0.25f, &ds), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), img);
    ASSERT_CONTAINS(td_error_msg(), bad);
    ASSERT_CONTAINS(td_error_msg(), "5 images");
    ASSERT_CONTAINS(td_error_msg(), "4 labels");
    free(bad);

    /* a label out of range */
    uint8_t badlabels[N] = {0, 1, 2, 10, 4};
    snprintf(name, sizeof name, "label10%s", sfx);
    bad = write_idx(name, gz, TD_IDX_MAGIC_LABELS, 1, ldims, badlabels, N);
    ASSERT_STATUS(td_dataset_load_idx(img, bad, 10, 0.5f, 0.25f, &ds), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), bad);
    ASSERT_CONTAINS(td_error_msg(), "label 10 of sample 3");
    free(bad);

    /* trailing garbage is as wrong as missing data */
    uint32_t ldims3[1] = {N - 2};
    snprintf(name, sizeof name, "long-labels%s", sfx);
    bad = write_idx(name, gz, TD_IDX_MAGIC_LABELS, 1, ldims3, labels, N);
    ASSERT_STATUS(td_idx_read(bad, TD_IDX_MAGIC_LABELS, &idx), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), bad);
    free(bad);

    /* missing file */
    char *missing = td_xasprintf("%s/nope%s", tmpdir, sfx);
    ASSERT_STATUS(td_dataset_load_idx(img, missing, 10, 0.5f, 0.25f, &ds), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), missing);
    ASSERT_CONTAINS(td_error_msg(), "does not exist");
    free(missing);
    free(img);
    free(lab);
}

static void check_fashion_mnist(void) {
    const char *dir = "/usr/share/datasets/fashion-mnist";
    if (access(dir, F_OK) != 0) {
        printf("note: %s not installed; skipping the real-dataset checks\n", dir);
        return;
    }
    td_dataset_t *train = NULL, *test = NULL;
    ASSERT_OK(td_dataset_load_fashion_mnist(dir, "train", &train));
    ASSERT_OK(td_dataset_load_fashion_mnist(dir, "t10k", &test));
    ASSERT_EQ(td_dataset_count(train), 60000);
    ASSERT_EQ(td_dataset_count(test), 10000);
    ASSERT_EQ(td_dataset_rows(train), 28);
    ASSERT_EQ(td_dataset_cols(train), 28);
    /* the documented normalisation constants are the training set's statistics */
    const uint8_t *px = td_dataset_pixels(train);
    size_t n = (size_t)60000 * 784;
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) {
        double v = px[i] / 255.0;
        sum += v;
        sq += v * v;
    }
    double mean = sum / (double)n, std = sqrt(sq / (double)n - mean * mean);
    ASSERT_NEAR(mean, TD_FASHION_MNIST_MEAN, 5e-4);
    ASSERT_NEAR(std, TD_FASHION_MNIST_STD, 5e-4);
    int counts[10] = {0};
    for (int i = 0; i < 60000; i++) counts[td_dataset_labels(train)[i]]++;
    for (int c = 0; c < 10; c++) ASSERT_EQ(counts[c], 6000);
    td_dataset_t *none = NULL;
    ASSERT_STATUS(td_dataset_load_fashion_mnist(tmpdir, "train", &none), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "train-images-idx3-ubyte.gz");
    ASSERT(none == NULL);
    td_dataset_free(train);
    td_dataset_free(test);
}

static void check_permutation(const uint64_t *perm, uint64_t n) {
    uint8_t *seen = td_xcalloc(n, 1);
    for (uint64_t i = 0; i < n; i++) {
        ASSERT_LT(perm[i], n);
        ASSERT_EQ(seen[perm[i]], 0);
        seen[perm[i]] = 1;
    }
    free(seen);
}

static void check_sampler(void) {
    enum { N = 60000 };
    uint64_t *a = td_xmalloc(N * sizeof *a), *b = td_xmalloc(N * sizeof *b);
    td_sampler_permutation(7, 0, N, a);
    check_permutation(a, N);
    td_sampler_t *s = td_sampler_new(N, 7);
    ASSERT_EQ(memcmp(td_sampler_epoch(s, 0), a, N * sizeof *a),
              0); /* a function of (seed, epoch) */
    td_sampler_permutation(7, 1, N, b);
    check_permutation(b, N);
    ASSERT_EQ(memcmp(td_sampler_epoch(s, 1), b, N * sizeof *b), 0);
    ASSERT_EQ(memcmp(td_sampler_epoch(s, 0), a, N * sizeof *a), 0); /* going back recomputes */
    int same = 0, fixed = 0;
    for (int i = 0; i < N; i++) {
        same += a[i] == b[i];
        fixed += a[i] == (uint64_t)i;
    }
    ASSERT_LT(same, 20);  /* epochs differ (expected ~1 coincidence) */
    ASSERT_LT(fixed, 20); /* and it is shuffled at all */
    td_sampler_permutation(8, 0, N, b);
    same = 0;
    for (int i = 0; i < N; i++) same += a[i] == b[i];
    ASSERT_LT(same, 20); /* seeds differ */
    /* the first element is roughly uniform over 10 slots across epochs */
    int hist[10] = {0};
    uint64_t p[10];
    for (uint64_t e = 0; e < 2000; e++) {
        td_sampler_permutation(3, e, 10, p);
        check_permutation(p, 10);
        hist[p[0]]++;
    }
    for (int i = 0; i < 10; i++) ASSERT(hist[i] > 130 && hist[i] < 270);
    td_sampler_permutation(3, 0, 1, p);
    ASSERT_EQ(p[0], 0);
    td_sampler_permutation(3, 0, 0, p); /* empty is fine */
    td_sampler_free(s);
    free(a);
    free(b);
}

int main(void) {
    ASSERT(mkdtemp(tmpdir));
    check_idx_errors(0);
    check_idx_errors(1);
    check_fashion_mnist();
    check_sampler();
    char *cmd = td_xasprintf("rm -rf %s", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
