/* Internals shared by the data layer's file-format readers (npy.c, safetensors_read.c,
 * array.c): opening a file with errors that name it, positioned reads, and overflow-checked
 * sizes, so each reader checks a header's promises against the file the same way. */
#ifndef TANDEM_DATA_ARRAY_H
#define TANDEM_DATA_ARRAY_H

#include <stdint.h>

#include "tandem/data.h"

/* Opens path read-only and returns its size. what names the format in errors ("NumPy file").
 * TD_ERR_NOTFOUND / TD_ERR_IO (also for a directory). */
td_status td__file_open(const char *path, const char *what, int *fd, uint64_t *nbytes);
/* Reads exactly n bytes at off; returns 0, or -1 with errno set (0 for end of file). */
int td__pread_full(int fd, void *buf, uint64_t n, uint64_t off);
/* elements * dtype size of shape[0..ndim), false when the product overflows 2^63. */
bool td__shape_nbytes(td_dtype t, int ndim, const uint64_t *shape, uint64_t *nbytes);
/* "[3, 4]" into buf (cut to fit). */
const char *td__shape_str(int ndim, const uint64_t *shape, char *buf, size_t cap);

#endif
