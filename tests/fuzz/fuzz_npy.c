/* Array files: NumPy's (src/data/npy.c) and safetensors (src/data/safetensors_read.c, the data
 * reader). The input is read as a .npy, as a .npz and as a safetensors file (every member or
 * tensor listed is read, in memory and file-backed); then the input wrapped as member "a.npy" of a
 * well-formed zip, stored and then deflated, with the right CRC-32 and sizes, so header mutations
 * reach the .npy parser through both of the archive's paths. */
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

/* A one-member zip: "a.npy" holding body (method 0) or its deflate stream (method 8). */
static size_t make_zip(const uint8_t *data, size_t size, int method, uint8_t **out) {
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
    size_t total = 30 + 5 + blen + 46 + 5 + 22;
    uint8_t *z = calloc(1, total), *p = z;
    FUZZ_ASSERT(z, "%s", "calloc");
    put32(p, 0x04034b50), put16(p + 4, 20), put16(p + 8, (unsigned)method), put32(p + 14, crc);
    put32(p + 18, (uint32_t)blen), put32(p + 22, (uint32_t)size), put16(p + 26, 5);
    memcpy(p + 30, "a.npy", 5);
    memcpy(p + 35, body, blen);
    p += 35 + blen;
    put32(p, 0x02014b50), put16(p + 4, 20), put16(p + 6, 20), put16(p + 10, (unsigned)method);
    put32(p + 16, crc), put32(p + 20, (uint32_t)blen), put32(p + 24, (uint32_t)size);
    put16(p + 28, 5);
    memcpy(p + 46, "a.npy", 5);
    p += 51;
    put32(p, 0x06054b50), put16(p + 8, 1), put16(p + 10, 1), put32(p + 12, 51);
    put32(p + 16, (uint32_t)(35 + blen));
    if (body != data) free(body);
    *out = z;
    return total;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    input_size = size;
    read_all(fuzz_file(data, size));
    for (int method = 0; method <= 8; method += 8) {
        uint8_t *z;
        input_size = make_zip(data, size, method, &z);
        const char *path = fuzz_file(z, input_size);
        td_array a;
        td_status st = td_npz_read(path, "a", method == 0, &a);
        if (st == TD_OK) check(&a, path);
        td_array_free(&a);
        expect_named(st, path);
        free(z);
    }
    return 0;
}
