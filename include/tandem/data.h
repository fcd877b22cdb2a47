/* tandem data: IDX files (plain or gzip), in-memory image datasets, the global sampler and
 * batching.
 *
 * A dataset keeps its images as the file's uint8 pixels and normalises while gathering a batch
 * ((x / 255 - mean) / std as float32): loading stays a plain read, and every rank and every
 * replay computes the same floats from the same bytes.
 *
 * The sampler's order for an epoch is a pure function of (seed, epoch, dataset size): any rank,
 * any restart, any world size sees the same permutation, and slicing it is the trainer's job.
 */
#ifndef TANDEM_DATA_H
#define TANDEM_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* IDX magic numbers (big-endian in the file): 0x0000 0x08 (unsigned byte) <ndims>. */
#define TD_IDX_MAGIC_LABELS 0x00000801u
#define TD_IDX_MAGIC_IMAGES 0x00000803u

/* Fashion-MNIST normalisation: the training set's pixel mean and standard deviation (of x/255,
 * over all 60000x784 pixels: 0.28604, 0.35302), rounded as torchvision examples use them.
 * Fixed constants rather than a pass over the data so the test set and every rank agree. */
#define TD_FASHION_MNIST_MEAN 0.2860f
#define TD_FASHION_MNIST_STD  0.3530f

/* The contents of one IDX file of unsigned bytes. */
typedef struct {
    int ndims;
    uint32_t dims[3];
    uint8_t *data; /* dims[0] * ... * dims[ndims-1] bytes */
    size_t nbytes;
} td_idx;

/* Reads a whole IDX file (gzip-compressed or plain; zlib tells them apart) and checks that its
 * magic equals expected_magic and that the data is exactly as long as the dimensions say.
 * TD_ERR_NOTFOUND / TD_ERR_IO / TD_ERR_FORMAT with a message naming the file, what is wrong and
 * what to do. */
td_status td_idx_read(const char *path, uint32_t expected_magic, td_idx *out);
void td_idx_free(td_idx *idx);

typedef struct td_dataset td_dataset_t;

/* Loads a pair of IDX files (images [n, rows, cols], labels [n]) and checks that the counts
 * match and every label is in [0, num_classes). */
td_status td_dataset_load_idx(const char *images_path, const char *labels_path, int num_classes,
                              float mean, float std, td_dataset_t **out);
/* Fashion-MNIST split "train" or "t10k" from dir, as Debian's dataset-fashion-mnist installs it
 * (<split>-images-idx3-ubyte.gz, <split>-labels-idx1-ubyte.gz; the names without .gz work too). */
td_status td_dataset_load_fashion_mnist(const char *dir, const char *split, td_dataset_t **out);
void td_dataset_free(td_dataset_t *ds);

uint64_t td_dataset_count(const td_dataset_t *ds);
int td_dataset_sample_size(const td_dataset_t *ds); /* floats per sample (rows * cols) */
int td_dataset_rows(const td_dataset_t *ds);
int td_dataset_cols(const td_dataset_t *ds);
int td_dataset_num_classes(const td_dataset_t *ds);
const uint8_t *td_dataset_pixels(const td_dataset_t *ds); /* [count, rows * cols] */
const int32_t *td_dataset_labels(const td_dataset_t *ds); /* [count] */

/* The table td_dataset_gather maps a pixel byte through: lut[v] = (v / 255 - mean) / std. An
 * engine on another device gathers with the same table and so computes the same floats. */
void td_dataset_lut(const td_dataset_t *ds, float lut[256]);
/* Gathers samples ids[0..n) into x [n, rows*cols] (normalised float32) and y [n] (may be NULL).
 * Every id must be < count. */
void td_dataset_gather(const td_dataset_t *ds, const uint64_t *ids, int n, float *x, int32_t *y);

/* ---- the sampler ----
 * Epoch e's order is a Fisher-Yates shuffle of 0..n-1 whose draw at position i is Philox with
 * key mix(seed) and counter (i, e): a function of (seed, epoch, n) only. */
typedef struct td_sampler td_sampler_t;
td_sampler_t *td_sampler_new(uint64_t num_samples, uint64_t seed);
void td_sampler_free(td_sampler_t *s);
uint64_t td_sampler_count(const td_sampler_t *s);
/* The permutation of epoch `epoch`: [num_samples] dataset indices, owned by the sampler and valid
 * until it is asked for another epoch. Computed once per epoch. */
const uint64_t *td_sampler_epoch(td_sampler_t *s, uint64_t epoch);
/* Fills perm[0..n) with the permutation for (seed, epoch). */
void td_sampler_permutation(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t *perm);

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_DATA_H */
