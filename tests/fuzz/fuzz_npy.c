/* Array files: NumPy's (src/data/npy.c) and safetensors (src/data/safetensors_read.c, the data
 * reader). The input is read as a .npy, as a .npz and as a safetensors file (every member or
 * tensor listed is read, in memory and file-backed); then the input wrapped as member "a.npy" of a
 * well-formed zip, stored and then deflated, with the right CRC-32 and sizes, so header mutations
 * reach the .npy parser through both of the archive's paths, and of the zips that broke the
 * reader (issue 29): the member twice, the sizes in a ZIP64 extra field, and a directory that
 * claims more uncompressed bytes than the member holds (each must be refused); last, the input as
 * the JSON header of a safetensors file over 64 data bytes, so mutations reach its offset rules. */
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "tandem/data.h"

static size_t input_size;

/* An array that loads is exactly what its shape says: in memory every byte readable (ASan
 * checks), file-backed its elements inside the file. */
static void check(const td_array *a, const char *path) {
    FUZZ_ASSERT(a->ndim >= 0 && a->ndim <= TD_ARRAY_MAX_DIMS, "ndim %d", a->ndim);
    uint64_t nbytes = td_array_count(a) * td_dtype_size(a->dtype);
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] == 0) nbytes = 0;
    if (a->data) {
        FUZZ_ASSERT(!a->path, "%s", "both data and path");
        unsigned sum = 0;
        for (uint64_t i = 0; i < nbytes; i++) sum += ((const uint8_t *)a->data)[i];
        (void)sum;
    } else {
        FUZZ_ASSERT(a->path && strcmp(a->path, path) == 0, "file-backed path %s",
                    a->path ? a->path : "(null)");
        FUZZ_ASSERT(a->offset <= input_size && nbytes <= input_size - a->offset,
                    "elements [%llu, +%llu) outside the %zu-byte file",
                    (unsigned long long)a->offset, (unsigned long long)nbytes, input_size);
    }
}

static void expect_named(td_status st, const char *path) {
    if (st != TD_OK)
        FUZZ_ASSERT(strstr(td_error_msg(), path), "error without the path: %s", td_error_msg());
    td_error_clear();
}

static void read_all(const char *path) {
    td_array a;
    for (int backed = 0; backed < 2; backed++) {
        td_status st = td_npy_read(path, backed, &a);
        if (st == TD_OK) check(&a, path);
        td_array_free(&a);
        expect_named(st, path);
    }
    for (int format = 0; format < 2; format++) {
        char **names;
        int n;
        td_status st =
            format == 0 ? td_npz_list(path, &names, &n) : td_safetensors_list(path, &names, &n);
        expect_named(st, path);
        if (st != TD_OK) continue;
        for (int i = 0; i < n && i < 8; i++)
            for (int backed = 0; backed < 2; backed++) {
                st = format == 0 ? td_npz_read(path, names[i], backed, &a)
                                 : td_safetensors_read(path, names[i], backed, &a);
                if (st == TD_OK) check(&a, path);
                td_array_free(&a);
                /* a zip member's name may hold a NUL, which cuts the name asked for */
                if (st != TD_ERR_NOTFOUND || format == 1) expect_named(st, path);
                td_error_clear();
            }
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
    }
}

static void put16(uint8_t *b, unsigned v) {
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *b, uint32_t v) {
    put16(b, v & 0xffff);
    put16(b + 2, v >> 16);
}

static void put64(uint8_t *b, uint64_t v) {
    put32(b, (uint32_t)v);
    put32(b + 4, (uint32_t)(v >> 32));
}

/* How make_zip bends the archive, for the paths that broke (issue 29). */
enum {
    ZIP_PLAIN = 0,
    ZIP_DUP = 1,   /* the member twice: two local headers and two directory entries */
    ZIP_64 = 2,    /* the directory's sizes in a ZIP64 extra field (32-bit fields all ones) */
    ZIP_LIE = 4,   /* the directory claims more uncompressed bytes than the member holds */
};

/* A zip of member "a.npy" holding body (method 0) or its deflate stream (method 8). */
static size_t make_zip(const uint8_t *data, size_t size, int method, int how, uint8_t **out) {
    uint8_t *body = (uint8_t *)(uintptr_t)data;
    size_t blen = size;
    if (method == 8) {
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        FUZZ_ASSERT(deflateInit2(&zs, 1, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK, "%s",
                    "deflateInit2");
        uLong cap = deflateBound(&zs, (uLong)size) + 16;
        body = malloc(cap);
        FUZZ_ASSERT(body, "%s", "malloc");
        zs.next_in = (Bytef *)(uintptr_t)data;
        zs.avail_in = (uInt)size;
        zs.next_out = body;
        zs.avail_out = (uInt)cap;
        FUZZ_ASSERT(deflate(&zs, Z_FINISH) == Z_STREAM_END, "%s", "deflate");
        blen = cap - zs.avail_out;
        deflateEnd(&zs);
    }
    uint32_t crc = (uint32_t)crc32(0, data, (uInt)size);
    /* a lie of up to deflate's ratio (a larger one is refused before anything else) */
    uint64_t usize = how & ZIP_LIE ? size + 1 + (uint64_t)blen * 1000 : size;
    int copies = how & ZIP_DUP ? 2 : 1;
    size_t xlen = how & ZIP_64 ? 20 : 0;
    size_t local = 30 + 5 + blen, central = 46 + 5 + xlen;
    size_t total = copies * (local + central) + 22;
    uint8_t *z = calloc(1, total), *p = z;
    FUZZ_ASSERT(z, "%s", "calloc");
    for (int c = 0; c < copies; c++, p += local) {
        put32(p, 0x04034b50), put16(p + 4, 20), put16(p + 8, (unsigned)method), put32(p + 14, crc);
        put32(p + 18, (uint32_t)blen), put32(p + 22, (uint32_t)size), put16(p + 26, 5);
        memcpy(p + 30, "a.npy", 5);
        memcpy(p + 35, body, blen);
    }
    for (int c = 0; c < copies; c++, p += central) {
        put32(p, 0x02014b50), put16(p + 4, 45), put16(p + 6, 45), put16(p + 10, (unsigned)method);
        put32(p + 16, crc), put32(p + 20, (uint32_t)blen), put32(p + 24, (uint32_t)usize);
        put16(p + 28, 5), put32(p + 42, (uint32_t)(c * local));
        memcpy(p + 46, "a.npy", 5);
        if (how & ZIP_64) { /* usize then csize, as the extra field orders them */
            put32(p + 20, 0xffffffffu), put32(p + 24, 0xffffffffu), put16(p + 30, 20);
            put16(p + 51, 1), put16(p + 53, 16), put64(p + 55, usize), put64(p + 63, blen);
        }
    }
    put32(p, 0x06054b50), put16(p + 8, (unsigned)copies), put16(p + 10, (unsigned)copies);
    put32(p + 12, (uint32_t)(copies * central)), put32(p + 16, (uint32_t)(copies * local));
    if (body != data) free(body);
    *out = z;
    return total;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    input_size = size;
    read_all(fuzz_file(data, size));
    for (int how = 0; how < 8; how++)
        for (int method = 0; method <= 8; method += 8) {
            /* a stored member's lie is a size disagreement, refused the same way */
            uint8_t *z;
            input_size = make_zip(data, size, method, how, &z);
            const char *path = fuzz_file(z, input_size);
            td_array a;
            td_status st = td_npz_read(path, "a", method == 0, &a);
            if (st == TD_OK) check(&a, path);
            td_array_free(&a);
            /* a name twice, or a directory that promises more than the member holds, never
             * loads: there is no array both np.load and tandem would agree on */
            if (how & (ZIP_DUP | ZIP_LIE))
                FUZZ_ASSERT(st != TD_OK, "zip variant %d (method %d) loaded", how, method);
            if (how & ZIP_DUP)
                FUZZ_ASSERT(st == TD_ERR_FORMAT && strstr(td_error_msg(), "twice"),
                            "duplicate member not refused as such: %s", td_error_msg());
            expect_named(st, path);
            free(z);
        }
    /* the input as a safetensors header over 64 data bytes, so mutations of offsets, shapes and
     * dtypes reach the layout check without first having to guess a length prefix */
    size_t st_len = 8 + size + 64;
    uint8_t *st = calloc(1, st_len);
    FUZZ_ASSERT(st, "%s", "calloc");
    put64(st, size);
    memcpy(st + 8, data, size);
    input_size = st_len;
    const char *path = fuzz_file(st, st_len);
    char **names;
    int n;
    td_status rc = td_safetensors_list(path, &names, &n);
    expect_named(rc, path);
    if (rc == TD_OK) {
        for (int i = 0; i < n && i < 8; i++)
            for (int backed = 0; backed < 2; backed++) {
                td_array a;
                rc = td_safetensors_read(path, names[i], backed, &a);
                if (rc == TD_OK) check(&a, path);
                td_array_free(&a);
                td_error_clear();
            }
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
    }
    free(st);
    return 0;
}
