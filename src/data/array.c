/* td_array and td_dtype, and the file helpers the format readers share (array.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/array.h"

size_t td_dtype_size(td_dtype t) {
    switch (t) {
    case TD_DTYPE_U8:
    case TD_DTYPE_I8:
    case TD_DTYPE_BOOL:
        return 1;
    case TD_DTYPE_U16:
    case TD_DTYPE_I16:
    case TD_DTYPE_F16:
    case TD_DTYPE_BF16:
        return 2;
    case TD_DTYPE_I32:
    case TD_DTYPE_F32:
        return 4;
    case TD_DTYPE_I64:
    case TD_DTYPE_F64:
        return 8;
    }
    return 0;
}

const char *td_dtype_name(td_dtype t) {
    switch (t) {
    case TD_DTYPE_U8:
        return "uint8";
    case TD_DTYPE_I8:
        return "int8";
    case TD_DTYPE_U16:
        return "uint16";
    case TD_DTYPE_I16:
        return "int16";
    case TD_DTYPE_I32:
        return "int32";
    case TD_DTYPE_I64:
        return "int64";
    case TD_DTYPE_F16:
        return "float16";
    case TD_DTYPE_BF16:
        return "bfloat16";
    case TD_DTYPE_F32:
        return "float32";
    case TD_DTYPE_F64:
        return "float64";
    case TD_DTYPE_BOOL:
        return "bool";
    }
    return "unknown";
}

bool td_dtype_is_float(td_dtype t) {
    return t == TD_DTYPE_F16 || t == TD_DTYPE_BF16 || t == TD_DTYPE_F32 || t == TD_DTYPE_F64;
}

uint64_t td_array_count(const td_array *a) {
    uint64_t n = 1;
    for (int i = 0; i < a->ndim; i++) n *= a->shape[i];
    return n;
}

void td_array_free(td_array *a) {
    if (!a) return;
    free(a->data);
    free(a->path);
    memset(a, 0, sizeof *a);
}

td_status td__file_open(const char *path, const char *what, int *fd, uint64_t *nbytes) {
    *fd = -1;
    *nbytes = 0;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever, before
     * the check below could refuse it (on a regular file the flag changes nothing) */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0) {
        if (errno == ENOENT)
            return td_error_errno(TD_ERR_NOTFOUND, "%s %s does not exist; check the path", what,
                                  path);
        return td_error_errno(TD_ERR_IO, "cannot open %s %s", what, path);
    }
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        close(f);
        return td_error_errno(TD_ERR_IO, "cannot stat %s %s", what, path);
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        return td_error(TD_ERR_IO,
                        "%s %s is not a regular file (a directory, FIFO, device or socket); give "
                        "the file",
                        what, path);
    }
    *fd = f;
    *nbytes = (uint64_t)sb.st_size;
    return TD_OK;
}

int td__pread_full(int fd, void *buf, uint64_t n, uint64_t off) {
    uint8_t *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t got = pread(fd, p, chunk, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return -1;
        if (got == 0) {
            errno = 0;
            return -1;
        }
        p += got;
        off += (uint64_t)got;
        n -= (uint64_t)got;
    }
    return 0;
}

bool td__shape_nbytes(td_dtype t, int ndim, const uint64_t *shape, uint64_t *nbytes) {
    /* any zero dimension makes it empty, whatever the others claim */
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) {
            *nbytes = 0;
            return true;
        }
    uint64_t n = td_dtype_size(t);
    const uint64_t limit = (uint64_t)1 << 63;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] > limit / n) return false;
        n *= shape[i];
    }
    *nbytes = n;
    return true;
}

const char *td__shape_str(int ndim, const uint64_t *shape, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    len += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%llu", i ? ", " : "",
                                (unsigned long long)shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}
