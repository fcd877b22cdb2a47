/* IDX files (src/data/idx.c): the input as a plain file, then the same bytes gzip-compressed, each
 * read as an images file and as a labels file. Mutating compressed bytes mostly breaks the
 * deflate stream, so the second pass is how header mutations reach the parser through zlib's
 * gzip path; damaged gzip comes from the first pass (the corpus holds real .gz files). */
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "tandem/data.h"

static void read_as(const char *path, uint32_t magic) {
    td_idx idx;
    td_status st = td_idx_read(path, magic, &idx);
    if (st == TD_OK) {
        uint64_t total = 1;
        for (int i = 0; i < idx.ndims; i++) total *= idx.dims[i];
        FUZZ_ASSERT(idx.ndims == (int)(magic & 0xff) && idx.nbytes == total,
                    "%d dims, %zu bytes for a product of %llu", idx.ndims, idx.nbytes,
                    (unsigned long long)total);
        unsigned sum = 0; /* every promised byte is there (ASan checks the reads) */
        for (size_t i = 0; i < idx.nbytes; i++) sum += idx.data[i];
        (void)sum;
        td_idx_free(&idx);
    } else {
        /* errors name the file, so a user knows which one to replace */
        FUZZ_ASSERT(strstr(td_error_msg(), path), "error without the path: %s", td_error_msg());
    }
    td_error_clear();
}

static void read_both(const char *path) {
    read_as(path, TD_IDX_MAGIC_IMAGES);
    read_as(path, TD_IDX_MAGIC_LABELS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    read_both(fuzz_file(data, size));

    z_stream zs;
    memset(&zs, 0, sizeof zs);
    FUZZ_ASSERT(deflateInit2(&zs, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK, "%s",
                "deflateInit2 (gzip)");
    uLong cap = deflateBound(&zs, (uLong)size) + 32;
    uint8_t *gz = malloc(cap);
    FUZZ_ASSERT(gz, "%s", "malloc");
    zs.next_in = (Bytef *)(uintptr_t)data;
    zs.avail_in = (uInt)size;
    zs.next_out = gz;
    zs.avail_out = (uInt)cap;
    FUZZ_ASSERT(deflate(&zs, Z_FINISH) == Z_STREAM_END, "%s", "deflate");
    size_t gz_len = cap - zs.avail_out;
    deflateEnd(&zs);
    read_both(fuzz_file(gz, gz_len));
    free(gz);
    return 0;
}
