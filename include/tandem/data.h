/* tandem data: the formats users bring (IDX, NumPy, CSV, safetensors, PNG/JPEG folders), data
 * sets in memory or read from their file as needed, the global sampler and batching.
 *
 * The sampler's order for an epoch is a pure function of (seed, epoch, dataset size): any rank,
 * any restart, any world size sees the same permutation, and slicing it is the trainer's job.
 */
#ifndef TANDEM_DATA_H
#define TANDEM_DATA_H

#include <stdbool.h>
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

/* ---- arrays and the file formats users bring (npy.c, npz in npy.c, csv.c, image.c,
 * safetensors_read.c) ----
 * Every reader names the file, and where it can the record, line or member, in its errors, and
 * says what to do. Nothing is trusted: sizes are checked against the file before anything is
 * allocated from them. */
typedef enum {
    TD_DTYPE_U8,
    TD_DTYPE_I8,
    TD_DTYPE_U16,
    TD_DTYPE_I16,
    TD_DTYPE_I32,
    TD_DTYPE_I64,
    TD_DTYPE_F16,
    TD_DTYPE_BF16,
    TD_DTYPE_F32,
    TD_DTYPE_F64,
    TD_DTYPE_BOOL,
} td_dtype;
size_t td_dtype_size(td_dtype t);
const char *td_dtype_name(td_dtype t); /* "uint8", "float32", ... (NumPy's names) */
bool td_dtype_is_float(td_dtype t);

#define TD_ARRAY_MAX_DIMS 8

/* An n-dimensional array of little-endian elements in C order, as a format holds it: either in
 * memory (data), or file-backed: left in an uncompressed file at byte `offset` (path), to be read
 * a record at a time with pread, so a data set larger than memory costs no resident memory. */
typedef struct {
    td_dtype dtype;
    int ndim;
    uint64_t shape[TD_ARRAY_MAX_DIMS];
    void *data;      /* malloc'd elements, or NULL when file-backed */
    char *path;      /* file-backed: the file (malloc'd), else NULL */
    uint64_t offset; /* file-backed: byte offset of element 0 */
} td_array;
uint64_t td_array_count(const td_array *a); /* elements: the product of the shape */
void td_array_free(td_array *a);

/* NumPy .npy, format versions 1.0, 2.0 and 3.0: dtypes |u1 |i1 <u2 <i2 <i4 <i8 <f2 <f4 <f8 |b1
 * in C order. Fortran order, big-endian and object arrays are errors that say how to convert.
 * file_backed_ok: the array stays in the file (path/offset) rather than being read. */
td_status td_npy_read(const char *path, bool file_backed_ok, td_array *out);
/* One member `name` (without ".npy") of a .npz, NumPy's zip of .npy files, members stored or
 * deflated (np.savez / np.savez_compressed), ZIP64 included. A stored member may stay in the
 * file when file_backed_ok. */
td_status td_npz_read(const char *path, const char *name, bool file_backed_ok, td_array *out);
/* The member names (without ".npy") in archive order; free each and the array. */
td_status td_npz_list(const char *path, char ***names, int *count);
/* A safetensors file's tensor `name` (file-backed when file_backed_ok), and its tensor names in
 * header order (the "__metadata__" entry is not a tensor). */
td_status td_safetensors_read(const char *path, const char *name, bool file_backed_ok,
                              td_array *out);
td_status td_safetensors_list(const char *path, char ***names, int *count);

/* CSV as spreadsheets and pandas write it: comma-separated, RFC 4180 quotes, CRLF or LF, an
 * optional header (a first row with a non-numeric field over numeric rows). Every feature
 * column must be numeric; an empty, NaN or non-numeric feature is an error naming the line and
 * the column. The target column may hold numbers or class names.
 * A NUL byte is an error naming its line and column; a FIFO, device or socket is refused unopened. */
typedef struct {
    uint64_t rows;
    int cols;             /* feature columns (every column but the target) */
    float *features;      /* [rows, cols] */
    char **feature_names; /* [cols]: the header's names, or "column <i>" without a header */
    char *target_name;
    double *target;     /* [rows]: the value, or the class index when class_names is set */
    char **class_names; /* non-numeric targets: the distinct values, sorted; index = class */
    int num_class_names;
    uint64_t *lines; /* [rows]: the physical line (1-based) each data row starts on, for errors */
} td_csv;
/* target: the target column's header name, or its 0-based index; NULL: the last column. */
td_status td_csv_read(const char *path, const char *target, td_csv *out);
void td_csv_free(td_csv *c);

/* Images: PNG through libpng and JPEG through libjpeg-turbo, told apart by their magic bytes. */
typedef struct {
    int width, height, channels; /* channels 1 (grey), 2 (grey+alpha), 3 (RGB), 4 (RGBA) */
    uint8_t *pixels;             /* [height, width, channels], 8 bits per channel */
} td_image;
/* name is for errors (the file's path). 16-bit PNGs are reduced to 8 bits, palettes expanded. */
td_status td_image_decode(const uint8_t *bytes, size_t n, const char *name, td_image *out);
void td_image_free(td_image *img);
/* Writes img as channels x h x w uint8 (CHW): 1 channel is the luma (ITU-R 601 weights, as PIL's
 * "L"), 3 is RGB (grey repeated), alpha is dropped; a different size is resampled with a box
 * filter when shrinking and bilinearly when growing. */
void td_image_convert(const td_image *img, int channels, int h, int w, uint8_t *dst);
/* An image folder as torchvision's ImageFolder reads it: one subfolder per class, classes in
 * sorted name order, the files of each (.png .jpg .jpeg, any case) in sorted name order.
 * channels, h, w: what every image is converted to; 0 takes it from the first image.
 * x comes back as uint8 [n, channels, h, w] in memory. */
td_status td_image_folder_read(const char *dir, int channels, int h, int w, td_array *x,
                               int32_t **labels, char ***class_names, int *num_classes);

/* ---- data sets ----
 * A data set is `count` samples of a per-sample shape [c, h, w] (tables: [features, 1, 1]) and
 * their targets: class indices, or `target_dim` real values per sample (regression, multi-label).
 * Features keep the dtype of the file (uint8 images stay bytes) and are converted while a batch
 * is gathered: x' = (x * scale - mean[ch]) / std[ch], scale 1/255 for uint8 and 1 otherwise, one
 * mean and std per channel (per feature for tables). Every rank and every replay computes the
 * same floats from the same bytes.
 *
 * Storage is in memory, or file-backed: an uncompressed array (.npy, a stored .npz member,
 * safetensors) in a file of at least TD_DATA_STREAM_BYTES is left there and each
 * gathered sample is read with pread, so a worker's resident memory holds its batches, not the
 * data set, and only the samples of its own micro-batches are ever read. */
typedef struct td_dataset td_dataset_t;

/* Files at least this large keep their arrays (TANDEM_DATA_IN_MEMORY=1 reads them anyway, =0
 * leaves every uncompressed array in its file). */
#define TD_DATA_STREAM_BYTES ((uint64_t)256 << 20)
/* Channels per sample (features per row for tables): one mean and std each. A wider CSV or
 * array is refused when opened, naming the file, its width and this limit. */
#define TD_DATA_MAX_CHANNELS 4096
/* Class indices are integers below TD_DATA_MAX_CLASSES. A class count (largest index + 1) above
 * TD_DATA_SPARSE_CLASSES must be at most TD_DATA_SPARSE_FACTOR times the number of distinct
 * labels: one stray label (999999 in a file of classes 0-9) would otherwise make a model with a
 * million outputs. The error names the label, where it is, and says to remap the labels. */
#define TD_DATA_MAX_CLASSES    1000000
#define TD_DATA_SPARSE_CLASSES 1024
#define TD_DATA_SPARSE_FACTOR  4

typedef struct {
    const char *format; /* idx, images, csv, npy, npz, safetensors; NULL or "auto": from the path */
    const char *target; /* CSV: the target column (name or index); npz/safetensors: the key */
    bool class_targets; /* targets must be class indices (cross-entropy); else real values */
    int channels, height, width; /* image folders: what each image becomes (0: the first one's) */
    const char *flag;            /* the flag the path came from, for errors (NULL: "--data") */
} td_data_options;

/* Opens the data at `spec`: a directory of IDX files, an image folder (class subfolders, or
 * train/ and test|val/ of them), FILE.csv, FILE.npz, FILE.safetensors, or "X.npy,Y.npy".
 * *test is set when the source holds its own held-out split (IDX t10k/test files, npz/safetensors
 * x_test/y_test, an image folder's test/ or val/), else NULL. Errors name the path and the fix. */
td_status td_dataset_open(const char *spec, const td_data_options *o, td_dataset_t **train,
                          td_dataset_t **test);
/* The last `fraction` of a fixed shuffle of ds (independent of the run's seed, so every run and
 * every rank holds out the same samples) becomes *val, the rest *train. ds is consumed. */
td_status td_dataset_split(td_dataset_t *ds, double fraction, td_dataset_t **train,
                           td_dataset_t **val);
/* Per-channel mean and standard deviation (ddof 0) of x * scale over every sample, in double,
 * in sample order (the same bits on every rank). mean/std: [td_dataset_channels]. */
void td_dataset_compute_norm(const td_dataset_t *ds, float *mean, float *std);
/* Checks that every feature value is finite and within float32's range: TD_ERR_FORMAT naming the
 * file, the sample and the element of the first that is not. In-memory data was checked when it
 * was opened (TD_OK at once); a file-backed set is read through, so call it only when something
 * is wrong (the trainer does when the statistics come out non-finite). Gathering checks every
 * file-backed record it reads as well. */
td_status td_dataset_check_finite(const td_dataset_t *ds);
/* Sets the normalisation: n values each (n == channels, or 1 for all channels). */
td_status td_dataset_set_norm(td_dataset_t *ds, const float *mean, const float *std, int n);
/* Checks that `other` (a held-out set) fits ds: the same sample shape, target kind and size. */
td_status td_dataset_check_pair(const td_dataset_t *ds, const td_dataset_t *other,
                                const char *what);
void td_dataset_free(td_dataset_t *ds);

uint64_t td_dataset_count(const td_dataset_t *ds);
int td_dataset_sample_size(const td_dataset_t *ds); /* floats per sample: c * h * w */
int td_dataset_channels(const td_dataset_t *ds);
int td_dataset_rows(const td_dataset_t *ds);
int td_dataset_cols(const td_dataset_t *ds);
int td_dataset_num_classes(const td_dataset_t *ds); /* class targets: classes; else 0 */
int td_dataset_target_dim(const td_dataset_t *ds);  /* real targets: values per sample; else 0 */
td_dtype td_dataset_dtype(const td_dataset_t *ds);
bool td_dataset_file_backed(const td_dataset_t *ds);
const char *td_dataset_describe(const td_dataset_t *ds); /* "csv wine/train.csv: 133 x [13]" */
const float *td_dataset_mean(const td_dataset_t *ds);    /* [channels] */
const float *td_dataset_std(const td_dataset_t *ds);
/* A single-channel uint8 set held in memory, unsplit (IDX, a grayscale image folder): the pixels
 * [count, h*w] and labels in place, or NULL when the data set is anything else (the tests read
 * Fashion-MNIST through it; td_dataset_pack serves every kind). */
const uint8_t *td_dataset_pixels(const td_dataset_t *ds);
const int32_t *td_dataset_labels(const td_dataset_t *ds); /* class targets; NULL otherwise */
/* The tables td_dataset_gather maps the bytes of uint8 features through, [channels][256]:
 * lut[ch][v] = (v / 255 - mean[ch]) / std[ch]. An engine on another device gathers with the same
 * tables and so computes the same floats. Nothing is written for other dtypes. */
void td_dataset_lut(const td_dataset_t *ds, float *lut);
/* For an engine on another device: every sample's features in sample order (a split's index
 * and a file-backed set resolved), *values [count, c*h*w] of uint8 when *u8, else of float32
 * (the file's values as floats, not normalised: x' = (x - mean[ch]) / std[ch] remains, as
 * td_dataset_gather computes it), and its targets: class indices *labels [count] (targets
 * NULL), or real values *targets [count, target_dim] (labels NULL). All malloc'ed. I/O errors as
 * td_dataset_gather's. */
td_status td_dataset_pack(const td_dataset_t *ds, void **values, bool *u8, int32_t **labels,
                          float **targets);
/* The same for samples ids[0..n) into the caller's buffers: values [n, td_dataset_packed_bytes],
 * labels [n] (class targets) or targets [n, target_dim] (real ones; either may be NULL). What a
 * device streams a data set too large for its memory with, a step's samples at a time. */
td_status td_dataset_pack_ids(const td_dataset_t *ds, const uint64_t *ids, int n, void *values,
                              int32_t *labels, float *targets);
size_t td_dataset_packed_bytes(const td_dataset_t *ds); /* a sample's packed values, bytes */

/* Gathers samples ids[0..n) into x [n, c*h*w] (normalised float32) and their targets: y [n] for
 * class targets, t [n, target_dim] for real ones (either may be NULL). Every id must be < count.
 * File-backed samples are read with pread; an I/O error is TD_ERR_IO naming the file. */
td_status td_dataset_gather(const td_dataset_t *ds, const uint64_t *ids, int n, float *x,
                            int32_t *y, float *t);

/* Asks the kernel to start reading the records of ids[0..n) of a file-backed data set
 * (posix_fadvise WILLNEED), so the reads of a gather that follows overlap; nothing otherwise. */
void td_dataset_will_need(const td_dataset_t *ds, const uint64_t *ids, int n);

/* Kept for the tests and tools that read Fashion-MNIST directly: a pair of IDX files with the
 * given class count and one mean/std, and Fashion-MNIST's split "train" or "t10k" from dir
 * (<split>-images-idx3-ubyte[.gz]) normalised with TD_FASHION_MNIST_MEAN/STD. */
td_status td_dataset_load_idx(const char *images_path, const char *labels_path, int num_classes,
                              float mean, float std, td_dataset_t **out);
td_status td_dataset_load_fashion_mnist(const char *dir, const char *split, td_dataset_t **out);

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
