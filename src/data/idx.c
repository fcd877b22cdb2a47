/* IDX reader: the big-endian header (magic, dims), then raw unsigned bytes. zlib's gzread reads
 * gzip and plain files alike, so Debian's .gz files and unpacked copies both work. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "tandem/data.h"

/* Far above any IDX dataset we train on; guards the size product against nonsense headers. */
#define IDX_MAX_BYTES ((uint64_t)1 << 36)
/* The data buffer's first size; it doubles while more data arrives. */
#define IDX_FIRST_CHUNK ((uint64_t)1 << 20)

static uint32_t be32(const uint8_t *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Reads up to nbytes; returns the count read (short only at end of file) or -1 on a zlib error. */
static int64_t read_full(gzFile gz, uint8_t *buf, uint64_t nbytes) {
    uint64_t got = 0;
    while (got < nbytes) {
        uint64_t want = nbytes - got;
        unsigned chunk = want > (1u << 30) ? (1u << 30) : (unsigned)want;
        int n = gzread(gz, buf + got, chunk);
        if (n < 0) return -1;
        if (n == 0) break;
        got += (uint64_t)n;
    }
    return (int64_t)got;
}

static const char *gz_errtext(gzFile gz) {
    int errnum = 0;
    const char *msg = gzerror(gz, &errnum);
    return msg && *msg ? msg : "unknown zlib error";
}

static const char *kind_of(uint32_t magic) {
    switch (magic) {
    case TD_IDX_MAGIC_LABELS:
        return "a labels file (idx1)";
    case TD_IDX_MAGIC_IMAGES:
        return "an images file (idx3)";
    default:
        return "not an IDX file of unsigned bytes";
    }
}

td_status td_idx_read(const char *path, uint32_t expected_magic, td_idx *out) {
    td_status rc = TD_OK;
    memset(out, 0, sizeof *out);
    gzFile gz = NULL;
    uint8_t *data = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return td_error_errno(TD_ERR_NOTFOUND,
                                  "IDX file %s does not exist; check --data (Debian installs "
                                  "Fashion-MNIST in /usr/share/datasets/fashion-mnist with "
                                  "apt-get install dataset-fashion-mnist)",
                                  path);
        return td_error_errno(TD_ERR_IO, "cannot open IDX file %s", path);
    }
    gz = gzdopen(fd, "rb");
    if (!gz) {
        close(fd);
        return td_error(TD_ERR_NOMEM, "cannot open IDX file %s: zlib could not allocate", path);
    }
    uint8_t head[16];
    int64_t n = read_full(gz, head, 4);
    if (n < 0) {
        rc = td_error(TD_ERR_FORMAT,
                      "IDX file %s: cannot decompress: %s; the file is damaged, "
                      "reinstall or re-download it",
                      path, gz_errtext(gz));
        goto out;
    }
    if (n < 4) {
        rc = td_error(TD_ERR_FORMAT,
                      "IDX file %s is truncated: %lld bytes, shorter than the 4-byte magic; "
                      "reinstall or re-download it",
                      path, (long long)n);
        goto out;
    }
    uint32_t magic = be32(head);
    if (magic != expected_magic) {
        rc = td_error(TD_ERR_FORMAT,
                      "IDX file %s: bad magic 0x%08x, expected 0x%08x (%s); it is %s - check "
                      "that the images and labels paths are not swapped and the file is IDX",
                      path, magic, expected_magic, kind_of(expected_magic), kind_of(magic));
        goto out;
    }
    int ndims = (int)(magic & 0xff);
    if (ndims < 1 || ndims > 3) {
        rc = td_error(TD_ERR_FORMAT, "IDX file %s: %d dimensions, only 1 to 3 are supported", path,
                      ndims);
        goto out;
    }
    n = read_full(gz, head + 4, (uint64_t)ndims * 4);
    if (n != ndims * 4) {
        rc = td_error(TD_ERR_FORMAT,
                      "IDX file %s is truncated inside its header (%d dimensions need %d bytes, "
                      "found %lld); reinstall or re-download it",
                      path, ndims, ndims * 4, (long long)(n < 0 ? 0 : n));
        goto out;
    }
    uint64_t total = 1;
    for (int i = 0; i < ndims; i++) {
        out->dims[i] = be32(head + 4 + 4 * i);
        total *= out->dims[i];
        if (total > IDX_MAX_BYTES) {
            rc = td_error(TD_ERR_FORMAT,
                          "IDX file %s: dimensions imply more than %llu bytes; "
                          "the header is corrupt",
                          path, (unsigned long long)IDX_MAX_BYTES);
            goto out;
        }
    }
    out->ndims = ndims;
    /* The header's size is only a promise: the buffer grows as the data arrives, so a corrupt
     * 16-byte header cannot make us allocate gigabytes for a file that is not there (found by
     * tests/fuzz/fuzz_idx.c; gzip hides the real size until the end). Doubling keeps the
     * copying linear. */
    uint64_t cap = total < IDX_FIRST_CHUNK ? total : IDX_FIRST_CHUNK, have = 0;
    data = td_xmalloc(cap ? cap : 1);
    for (;;) {
        n = read_full(gz, data + have, cap - have);
        if (n < 0) {
            rc = td_error(TD_ERR_FORMAT,
                          "IDX file %s: cannot decompress the data: %s; the file is damaged, "
                          "reinstall or re-download it",
                          path, gz_errtext(gz));
            goto out;
        }
        have += (uint64_t)n;
        if (have < cap || cap == total) break; /* end of file, or all of it */
        cap = cap * 2 < total ? cap * 2 : total;
        data = td_xrealloc(data, cap);
    }
    if (have < total) {
        rc = td_error(TD_ERR_FORMAT,
                      "IDX file %s is truncated: its header promises %llu data bytes but only "
                      "%llu are there; reinstall or re-download it",
                      path, (unsigned long long)total, (unsigned long long)have);
        goto out;
    }
    uint8_t extra;
    if (read_full(gz, &extra, 1) == 1) {
        rc = td_error(TD_ERR_FORMAT,
                      "IDX file %s has data after the %llu bytes its header promises; the "
                      "header or the file is wrong, reinstall or re-download it",
                      path, (unsigned long long)total);
        goto out;
    }
    out->data = data;
    out->nbytes = total;
    data = NULL;
out:
    free(data);
    gzclose(gz); /* closes fd */
    if (rc != TD_OK) memset(out, 0, sizeof *out);
    return rc;
}

void td_idx_free(td_idx *idx) {
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
