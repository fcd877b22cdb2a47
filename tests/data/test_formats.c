/* data: the readers of the formats users bring (src/data/npy.c, safetensors_read.c, csv.c,
 * image.c). Files with known contents are written here byte by byte, with libpng and libjpeg,
 * and (tests/data/formats_fixtures.py) by the real NumPy and PIL; each reader must return
 * exactly those contents, leave stored data in the file when asked, and refuse damaged files
 * with an error naming the file (and the CSV line, the archive member). */
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <jpeglib.h> /* after stdio.h: it uses FILE and size_t */

#include "tandem/data.h"
#include "test.h"

static char tmpdir[] = "/tmp/td_test_formats_XXXXXX";
static char fixdir[300]; /* NumPy/PIL fixtures, "" when NumPy is missing */
static bool have_pil;

static char *tmp_path(const char *name) {
    return td_xasprintf("%s/%s", tmpdir, name);
}

static char *write_file(const char *name, const void *bytes, size_t n) {
    char *p = tmp_path(name);
    FILE *f = fopen(p, "wb");
    ASSERT(f);
    if (n) ASSERT_EQ(fwrite(bytes, 1, n, f), n);
    ASSERT_EQ(fclose(f), 0);
    return p;
}

static char *write_text(const char *name, const char *text) {
    return write_file(name, text, strlen(text));
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) TEST_FAIL("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    ASSERT(b);
    ASSERT_EQ(fread(b, 1, (size_t)len, f), len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* ---- .npy written by hand ---- */

/* A .npy of the given version with header dict `dict` (padded to 64 bytes as NumPy does). */
static char *write_npy(const char *name, int major, const char *dict, const void *data,
                       size_t nbytes) {
    size_t pre = major == 1 ? 10 : 12, dlen = strlen(dict);
    size_t total = (pre + dlen + 1 + 63) / 64 * 64;
    uint8_t *b = calloc(1, total + nbytes);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (uint8_t)major;
    b[7] = 0;
    size_t hl = total - pre;
    b[8] = (uint8_t)hl;
    b[9] = (uint8_t)(hl >> 8);
    memcpy(b + pre, dict, dlen);
    memset(b + pre + dlen, ' ', hl - dlen - 1);
    b[total - 1] = '\n';
    if (nbytes) memcpy(b + total, data, nbytes);
    char *p = write_file(name, b, total + nbytes);
    free(b);
    return p;
}

static void test_npy_handwritten(void) {
    float f[6] = {0, 1.5f, -2, 3.25f, 4, 1e-3f};
    td_array a;
    /* variants of the dict NumPy and other writers produce */
    const char *dicts[] = {
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        "{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(2,3)}",
        "{'shape': (2L, 3L), 'fortran_order': False, 'descr': '<f4'}",
        "{ 'descr' : '=f4' ,\n 'fortran_order' : False , 'shape' : ( 2 , 3 , ) }",
    };
    for (int i = 0; i < 4; i++) {
        char *p = write_npy("h.npy", i == 0 ? 1 : 2, dicts[i], f, sizeof f);
        ASSERT_OK(td_npy_read(p, false, &a));
        ASSERT_EQ(a.dtype, TD_DTYPE_F32);
        ASSERT_EQ(a.ndim, 2);
        ASSERT_EQ(a.shape[0], 2);
        ASSERT_EQ(a.shape[1], 3);
        ASSERT_EQ(td_array_count(&a), 6);
        ASSERT(a.data && !a.path);
        ASSERT_EQ(memcmp(a.data, f, sizeof f), 0);
        td_array_free(&a);
        /* file-backed: nothing read, the elements at offset (the 64-byte header) */
        ASSERT_OK(td_npy_read(p, true, &a));
        ASSERT(!a.data);
        ASSERT_STREQ(a.path, p);
        ASSERT_EQ(a.offset, (size_t)((i == 0 ? 10 : 12) + strlen(dicts[i]) + 1 + 63) / 64 * 64);
        td_array_free(&a);
        free(p);
    }
    /* a 1-D Fortran-order array is the same bytes as C order */
    char *p = write_npy("f1.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (6,), }", f,
                        sizeof f);
    ASSERT_OK(td_npy_read(p, false, &a));
    ASSERT_EQ(a.ndim, 1);
    td_array_free(&a);
    free(p);
    /* a big-endian single byte is just a byte */
    uint8_t u[3] = {7, 8, 9};
    p = write_npy("u1.npy", 1, "{'descr': '>u1', 'fortran_order': False, 'shape': (3,), }", u, 3);
    ASSERT_OK(td_npy_read(p, false, &a));
    ASSERT_EQ(a.dtype, TD_DTYPE_U8);
    ASSERT_EQ(((uint8_t *)a.data)[2], 9);
    td_array_free(&a);
    free(p);

    struct {
        const char *name, *dict;
        size_t nbytes;
        td_status st;
        const char *needle;
    } bad[] = {
        {"be.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", 24,
         TD_ERR_UNSUPPORTED, "newbyteorder('<')"},
        {"fo.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24,
         TD_ERR_UNSUPPORTED, "np.ascontiguousarray"},
        {"obj.npy", "{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", 24,
         TD_ERR_UNSUPPORTED, "object array"},
        {"struct.npy", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", 24,
         TD_ERR_UNSUPPORTED, "structured"},
        {"c16.npy", "{'descr': '<c16', 'fortran_order': False, 'shape': (1,), }", 16,
         TD_ERR_UNSUPPORTED, "complex"},
        {"short.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (7,), }", 24,
         TD_ERR_FORMAT, "is truncated"},
        {"long.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 24, TD_ERR_FORMAT,
         "extra data"},
        /* a tiny file promising 2^40 elements: refused before anything is allocated */
        {"huge.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776,), }", 24,
         TD_ERR_FORMAT, "is truncated"},
        {"ovf.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
         24, TD_ERR_FORMAT, "overflows"},
        {"nokey.npy", "{'descr': '<f4', 'shape': (6,), }", 24, TD_ERR_FORMAT, "fortran_order"},
        {"extra.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", 24,
         TD_ERR_FORMAT, "unexpected key 'x'"},
        {"garbage.npy", "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (6,), }", 24,
         TD_ERR_FORMAT, "cannot parse"},
        {"dims.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,6), }", 24,
         TD_ERR_UNSUPPORTED, "dimensions"},
    };
    uint8_t zeros[64] = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = write_npy(bad[i].name, 1, bad[i].dict, zeros, bad[i].nbytes);
        ASSERT_STATUS(td_npy_read(p, false, &a), bad[i].st);
        ASSERT_CONTAINS(td_error_msg(), p);
        ASSERT_CONTAINS(td_error_msg(), bad[i].needle);
        ASSERT(!a.data && !a.path);
        free(p);
    }
    p = write_text("notnpy.npy", "hello, this is not numpy");
    ASSERT_STATUS(td_npy_read(p, false, &a), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "np.save");
    ASSERT_CONTAINS(td_error_msg(), p);
    free(p);
    uint8_t v4[16] = {0x93, 'N', 'U', 'M', 'P', 'Y', 4, 0, 0, 0};
    p = write_file("v4.npy", v4, sizeof v4);
    ASSERT_STATUS(td_npy_read(p, false, &a), TD_ERR_UNSUPPORTED);
    ASSERT_CONTAINS(td_error_msg(), "version 4.0");
    free(p);
    p = tmp_path("missing.npy");
    ASSERT_STATUS(td_npy_read(p, false, &a), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), p);
    free(p);
}

/* ---- NumPy's own files ---- */

static char *fix(const char *name) {
    return td_xasprintf("%s/%s", fixdir, name);
}

static double element(const td_array *a, uint64_t i) {
    switch (a->dtype) {
    case TD_DTYPE_U8:
    case TD_DTYPE_BOOL:
        return ((uint8_t *)a->data)[i];
    case TD_DTYPE_I8:
        return ((int8_t *)a->data)[i];
    case TD_DTYPE_U16:
        return ((uint16_t *)a->data)[i];
    case TD_DTYPE_I16:
        return ((int16_t *)a->data)[i];
    case TD_DTYPE_I32:
        return ((int32_t *)a->data)[i];
    case TD_DTYPE_I64:
        return (double)((int64_t *)a->data)[i];
    case TD_DTYPE_F32:
        return ((float *)a->data)[i];
    case TD_DTYPE_F64:
        return ((double *)a->data)[i];
    case TD_DTYPE_F16: { /* 0..11 are exact in half precision: decode normal numbers */
        uint16_t h = ((uint16_t *)a->data)[i];
        int e = (h >> 10) & 31, m = h & 1023;
        return e ? ldexp(1 + m / 1024.0, e - 15) * ((h >> 15) ? -1 : 1) : 0;
    }
    default:
        TEST_FAIL("dtype %s in element()", td_dtype_name(a->dtype));
    }
}

static void test_npy_numpy(void) {
    const struct {
        const char *dt;
        td_dtype t;
        int offset;
    } types[] = {
        {"uint8", TD_DTYPE_U8, 0},    {"int8", TD_DTYPE_I8, -6},    {"uint16", TD_DTYPE_U16, 0},
        {"int16", TD_DTYPE_I16, -6},  {"int32", TD_DTYPE_I32, -6},  {"int64", TD_DTYPE_I64, -6},
        {"float16", TD_DTYPE_F16, 0}, {"float32", TD_DTYPE_F32, 0}, {"float64", TD_DTYPE_F64, 0},
    };
    td_array a;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        char name[64];
        snprintf(name, sizeof name, "t_%s.npy", types[k].dt);
        char *p = fix(name);
        ASSERT_OK(td_npy_read(p, false, &a));
        ASSERT_EQ(a.dtype, types[k].t);
        ASSERT_STREQ(td_dtype_name(a.dtype), types[k].dt);
        ASSERT_EQ(a.ndim, 2);
        ASSERT_EQ(a.shape[0], 3);
        ASSERT_EQ(a.shape[1], 4);
        for (int i = 0; i < 12; i++) ASSERT_NEAR(element(&a, (uint64_t)i), i + types[k].offset, 0);
        td_array_free(&a);
        free(p);
    }
    char *p = fix("t_bool.npy");
    ASSERT_OK(td_npy_read(p, false, &a));
    ASSERT_EQ(a.dtype, TD_DTYPE_BOOL);
    for (int i = 0; i < 12; i++) ASSERT_EQ(element(&a, (uint64_t)i), i % 3 == 0);
    td_array_free(&a);
    free(p);
    p = fix("scalar.npy");
    ASSERT_OK(td_npy_read(p, false, &a));
    ASSERT_EQ(a.ndim, 0);
    ASSERT_EQ(td_array_count(&a), 1);
    ASSERT_NEAR(element(&a, 0), 2.5, 0);
    td_array_free(&a);
    free(p);
    p = fix("empty.npy");
    ASSERT_OK(td_npy_read(p, false, &a));
    ASSERT_EQ(a.shape[0], 0);
    ASSERT_EQ(a.shape[1], 5);
    ASSERT_EQ(td_array_count(&a), 0);
    td_array_free(&a);
    free(p);
    for (int v = 1; v <= 3; v++) {
        char name[32];
        snprintf(name, sizeof name, "v%d.npy", v);
        p = fix(name);
        ASSERT_OK(td_npy_read(p, false, &a));
        ASSERT_EQ(a.dtype, TD_DTYPE_F32);
        ASSERT_EQ(a.shape[0] * 10 + a.shape[1], 23);
        for (int i = 0; i < 6; i++) ASSERT_NEAR(element(&a, (uint64_t)i), i, 0);
        td_array_free(&a);
        /* file-backed: the bytes at path/offset are the elements */
        ASSERT_OK(td_npy_read(p, true, &a));
        float got[6];
        FILE *f = fopen(a.path, "rb");
        ASSERT(f);
        fseek(f, (long)a.offset, SEEK_SET);
        ASSERT_EQ(fread(got, sizeof got, 1, f), 1);
        fclose(f);
        for (int i = 0; i < 6; i++) ASSERT_NEAR(got[i], i, 0);
        td_array_free(&a);
        free(p);
    }
    struct {
        const char *name, *needle;
    } bad[] = {
        {"fortran.npy", "np.ascontiguousarray"}, {"bigendian.npy", "big-endian"},
        {"object.npy", "object array"},          {"strings.npy", "strings"},
        {"uint32.npy", "astype(np.int64)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = fix(bad[i].name);
        ASSERT_STATUS(td_npy_read(p, false, &a), TD_ERR_UNSUPPORTED);
        ASSERT_CONTAINS(td_error_msg(), p);
        ASSERT_CONTAINS(td_error_msg(), bad[i].needle);
        free(p);
    }
}

static void check_xy(const char *p, bool file_backed) {
    td_array a;
    ASSERT_OK(td_npz_read(p, "x", file_backed, &a));
    ASSERT_EQ(a.dtype, TD_DTYPE_F32);
    ASSERT_EQ(a.ndim, 3);
    ASSERT_EQ(a.shape[0] * 100 + a.shape[1] * 10 + a.shape[2], 234);
    float xs[24];
    if (file_backed) {
        ASSERT(!a.data && a.path);
        FILE *f = fopen(a.path, "rb");
        ASSERT(f);
        fseek(f, (long)a.offset, SEEK_SET);
        ASSERT_EQ(fread(xs, sizeof xs, 1, f), 1);
        fclose(f);
    } else {
        ASSERT(a.data && !a.path);
        memcpy(xs, a.data, sizeof xs);
    }
    for (int i = 0; i < 24; i++) ASSERT_NEAR(xs[i], i / 4.0, 0);
    td_array_free(&a);
    ASSERT_OK(td_npz_read(p, "y", false, &a));
    ASSERT_EQ(a.dtype, TD_DTYPE_I64);
    ASSERT_EQ(a.shape[0], 5);
    int64_t want[5] = {3, 1, 4, 1, 5};
    ASSERT_EQ(memcmp(a.data, want, sizeof want), 0);
    td_array_free(&a);
}

static void test_npz(void) {
    char *stored = fix("stored.npz"), *deflated = fix("deflated.npz");
    char *z64 = fix("zip64.npz"), *z64d = fix("zip64_deflated.npz");
    char **names;
    int n;
    ASSERT_OK(td_npz_list(deflated, &names, &n));
    ASSERT_EQ(n, 3);
    ASSERT_STREQ(names[0], "x");
    ASSERT_STREQ(names[1], "y");
    ASSERT_STREQ(names[2], "big");
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    check_xy(stored, false);
    check_xy(stored, true);
    check_xy(z64, false);
    check_xy(z64, true);
    check_xy(deflated, false);
    check_xy(z64d, false);
    /* a deflated member cannot stay in the file: it comes back in memory */
    td_array a;
    ASSERT_OK(td_npz_read(deflated, "x", true, &a));
    ASSERT(a.data && !a.path);
    td_array_free(&a);
    ASSERT_OK(td_npz_read(deflated, "big", false, &a));
    ASSERT_EQ(a.shape[0], 100000);
    for (int i = 0; i < 100000; i += 997) ASSERT_EQ(((int32_t *)a.data)[i], i % 1000);
    td_array_free(&a);
    /* the member's full name works too */
    ASSERT_OK(td_npz_read(stored, "y.npy", false, &a));
    td_array_free(&a);

    ASSERT_STATUS(td_npz_read(stored, "z", false, &a), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), stored);
    ASSERT_CONTAINS(td_error_msg(), "'x', 'y'");

    /* damage: a flipped byte in each member's data, a cut-off archive, not a zip */
    size_t len;
    uint8_t *b = slurp(stored, &len);
    /* the last member's last data byte sits just before the central directory */
    uint32_t cd_off = (uint32_t)b[len - 6] | (uint32_t)b[len - 5] << 8 |
                      (uint32_t)b[len - 4] << 16 | (uint32_t)b[len - 3] << 24;
    b[cd_off - 1] ^= 0x40;
    char *p = write_file("crc.npz", b, len);
    ASSERT_STATUS(td_npz_read(p, "y", false, &a), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "CRC-32");
    ASSERT_CONTAINS(td_error_msg(), "member y.npy");
    ASSERT_CONTAINS(td_error_msg(), p);
    ASSERT_OK(td_npz_read(p, "x", false, &a)); /* the other member is intact */
    td_array_free(&a);
    free(p);
    p = write_file("cut.npz", b, len / 2);
    ASSERT_STATUS(td_npz_read(p, "x", false, &a), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), p);
    ASSERT_STATUS(td_npz_list(p, &names, &n), TD_ERR_FORMAT);
    free(p);
    free(b);
    b = slurp(deflated, &len);
    for (size_t i = 100; i < 140; i++) b[i] ^= 0xa5; /* inside x.npy's deflate stream */
    p = write_file("bad-deflate.npz", b, len);
    ASSERT_STATUS(td_npz_read(p, "x", false, &a), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "member x.npy");
    ASSERT_CONTAINS(td_error_msg(), p);
    free(p);
    free(b);
    char *npy = fix("v1.npy");
    ASSERT_STATUS(td_npz_read(npy, "x", false, &a), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "not a NumPy .npz");
    free(npy);
    free(stored);
    free(deflated);
    free(z64);
    free(z64d);
}

/* ---- safetensors ---- */

static char *write_st(const char *name, const char *json, const void *data, size_t nbytes) {
    size_t hl = strlen(json);
    uint8_t *b = malloc(8 + hl + nbytes);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    if (nbytes) memcpy(b + 8 + hl, data, nbytes);
    char *p = write_file(name, b, 8 + hl + nbytes);
    free(b);
    return p;
}

static void test_safetensors(void) {
    struct {
        int64_t b[3];
        float w[6];
    } data = {{7, -8, 9}, {0.5f, 1, 2, 3, 4, 5}};
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"zeta\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
                       "\"alpha\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,48]}}";
    char *p = write_st("t.safetensors", json, &data, sizeof data);
    char **names;
    int n;
    ASSERT_OK(td_safetensors_list(p, &names, &n));
    ASSERT_EQ(n, 2); /* header order, not sorted; no __metadata__ */
    ASSERT_STREQ(names[0], "zeta");
    ASSERT_STREQ(names[1], "alpha");
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    td_array a;
    ASSERT_OK(td_safetensors_read(p, "alpha", false, &a));
    ASSERT_EQ(a.dtype, TD_DTYPE_F32);
    ASSERT_EQ(a.ndim, 2);
    ASSERT_EQ(a.shape[1], 3);
    ASSERT_EQ(memcmp(a.data, data.w, sizeof data.w), 0);
    td_array_free(&a);
    ASSERT_OK(td_safetensors_read(p, "zeta", true, &a));
    ASSERT(!a.data);
    ASSERT_STREQ(a.path, p);
    ASSERT_EQ(a.offset, 8 + strlen(json));
    td_array_free(&a);
    ASSERT_STATUS(td_safetensors_read(p, "__metadata__", false, &a), TD_ERR_NOTFOUND);
    ASSERT_STATUS(td_safetensors_read(p, "beta", false, &a), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "'zeta', 'alpha'");
    free(p);

    struct {
        const char *json;
        td_status st;
        const char *needle;
    } bad[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,72]}}", TD_ERR_FORMAT,
         "not within"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,24]}}", TD_ERR_FORMAT,
         "span 24 bytes"},
        {"{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", TD_ERR_UNSUPPORTED,
         "F8_E4M3"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", TD_ERR_FORMAT,
         "non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", TD_ERR_FORMAT, "data_offsets"},
        {"{\"a\": [1, 2", TD_ERR_FORMAT, "does not parse"},
        {"[1]", TD_ERR_FORMAT, "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = write_st("bad.safetensors", bad[i].json, &data, sizeof data);
        ASSERT_STATUS(td_safetensors_read(p, "a", false, &a), bad[i].st);
        ASSERT_CONTAINS(td_error_msg(), p);
        ASSERT_CONTAINS(td_error_msg(), bad[i].needle);
        free(p);
    }
    uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{', '}'};
    p = write_file("huge.safetensors", huge, sizeof huge);
    ASSERT_STATUS(td_safetensors_read(p, "a", false, &a), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "header length");
    free(p);
}

/* ---- CSV ---- */

static void test_csv(void) {
    td_csv c;
    /* header, numeric target (the last column), CRLF, a BOM, blank lines, spaces */
    char *p = write_text("num.csv", "\xef\xbb\xbf"
                                    "a, b ,y\r\n1,2,0.5\r\n\r\n 3 ,-4e1,1.5 \r\n");
    ASSERT_OK(td_csv_read(p, NULL, &c));
    ASSERT_EQ(c.rows, 2);
    ASSERT_EQ(c.cols, 2);
    ASSERT_STREQ(c.feature_names[0], "a");
    ASSERT_STREQ(c.feature_names[1], "b");
    ASSERT_STREQ(c.target_name, "y");
    ASSERT(!c.class_names);
    float want[4] = {1, 2, 3, -40};
    for (int i = 0; i < 4; i++) ASSERT_NEAR(c.features[i], want[i], 0);
    ASSERT_NEAR(c.target[0], 0.5, 0);
    ASSERT_NEAR(c.target[1], 1.5, 0);
    td_csv_free(&c);
    /* the target by name and by index; the rest stay in file order */
    ASSERT_OK(td_csv_read(p, "a", &c));
    ASSERT_STREQ(c.target_name, "a");
    ASSERT_STREQ(c.feature_names[0], "b");
    ASSERT_STREQ(c.feature_names[1], "y");
    ASSERT_NEAR(c.target[1], 3, 0);
    ASSERT_NEAR(c.features[1], 0.5, 0);
    td_csv_free(&c);
    ASSERT_OK(td_csv_read(p, "1", &c));
    ASSERT_STREQ(c.target_name, "b");
    ASSERT_NEAR(c.target[1], -40, 0);
    td_csv_free(&c);
    ASSERT_STATUS(td_csv_read(p, "c", &c), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "no column named 'c'");
    ASSERT_CONTAINS(td_error_msg(), "'a', ' b ', 'y'");
    ASSERT_STATUS(td_csv_read(p, "3", &c), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "0 to 2");
    free(p);

    /* no header; class names as the target (iris-like), LF without a final newline */
    p = write_text("iris.csv", "5.1,3.5,setosa\n7.0,3.2,versicolor\n6.3,3.3,virginica\n"
                               "4.9,3.0,setosa");
    ASSERT_OK(td_csv_read(p, NULL, &c));
    ASSERT_EQ(c.rows, 4);
    ASSERT_STREQ(c.feature_names[0], "column 0");
    ASSERT_STREQ(c.target_name, "column 2");
    ASSERT_EQ(c.num_class_names, 3);
    ASSERT_STREQ(c.class_names[0], "setosa");
    ASSERT_STREQ(c.class_names[1], "versicolor");
    ASSERT_STREQ(c.class_names[2], "virginica");
    double classes[4] = {0, 1, 2, 0};
    for (int i = 0; i < 4; i++) ASSERT_NEAR(c.target[i], classes[i], 0);
    ASSERT_NEAR(c.features[2], 7.0, 1e-6);
    td_csv_free(&c);
    ASSERT_STATUS(td_csv_read(p, "species", &c), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "no header");
    free(p);

    /* RFC 4180 quotes: commas, "" and a newline inside; numbers in quotes; one numeric-looking
     * target among names makes it a class name too */
    p = write_text("quoted.csv", "\"x,1\",\"say \"\"hi\"\"\",label\n"
                                 "\"1.5\",2,\"two\nlines\"\n"
                                 "3,4,7\n");
    ASSERT_OK(td_csv_read(p, NULL, &c));
    ASSERT_STREQ(c.feature_names[0], "x,1");
    ASSERT_STREQ(c.feature_names[1], "say \"hi\"");
    ASSERT_EQ(c.rows, 2);
    ASSERT_NEAR(c.features[0], 1.5, 0);
    ASSERT_EQ(c.num_class_names, 2);
    ASSERT_STREQ(c.class_names[0], "7");
    ASSERT_STREQ(c.class_names[1], "two\nlines");
    ASSERT_NEAR(c.target[0], 1, 0);
    td_csv_free(&c);
    free(p);

    /* errors name the file, the line (counting lines inside quotes) and the column */
    struct {
        const char *text, *needle1, *needle2;
    } bad[] = {
        {"a,b,y\n1,2,3\n4,oops,5\n", ":3: column b", "'oops' is not a number"},
        {"a,b,y\n1,2,\"q\nq\"\n4,,z\n", ":4: column b is empty", "dropna"},
        {"a,b,y\n1,2,3\nnan,2,3\n", ":3: column a is 'nan'", "drop the row"},
        {"a,b,y\n1,2,3\n1e300,2,3\n", ":3: column a: '1e300' is beyond float32", "scale"},
        {"a,b,y\n1,2,3\n4,5\n", ":3: 2 fields, but the first row has 3", "double quotes"},
        {"1,2,3\n4,5,6,7\n", ":2: 4 fields", "3"},
        {"a,b,y\n1,2,\n", ":2: the target column y is empty", "fill it in"},
        {"a,b,y\n1,2,3\n\"4,5,6\n", ":3: a quoted field", "never closed"},
        {"a,b,y\n", "has a header but no data rows", ""},
        {"", "has no rows", ""},
        {"\n\n", "has no rows", ""},
        {"y\n1\n2\n", "has one column", "feature"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = write_text("bad.csv", bad[i].text);
        ASSERT_STATUS(td_csv_read(p, NULL, &c), TD_ERR_FORMAT);
        ASSERT_CONTAINS(td_error_msg(), p);
        ASSERT_CONTAINS(td_error_msg(), bad[i].needle1);
        ASSERT_CONTAINS(td_error_msg(), bad[i].needle2);
        ASSERT_EQ(c.rows, 0);
        free(p);
    }
    /* numbers: csv.c's fast decimal path must give exactly strtod's value, for short and long
     * mantissas, leading zeros, signs, exponents in and out of its range */
    enum { NUM = 3000 };
    char *text = malloc(NUM * 64 + 16), *w = text;
    char(*vals)[48] = malloc(NUM * sizeof *vals);
    w += sprintf(w, "v,y\n");
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < NUM; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int digits = 1 + (int)(r >> 59) % 20, point = (int)(r >> 40) % (digits + 2);
        int ex = (int)((r >> 20) % 41) - 30; /* within float32 */
        char *v = vals[i];
        int n = 0;
        if (r & 1) v[n++] = '-';
        if (r & 2) v[n++] = '0';
        for (int k = 0; k < digits; k++) {
            if (k == point) v[n++] = '.';
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            v[n++] = (char)('0' + (r >> 60) % 10);
        }
        if (r & 4) n += sprintf(v + n, "e%d", ex);
        v[n] = '\0';
        w += sprintf(w, "%s,%s\n", v, v); /* the target keeps the double */
    }
    p = write_text("numbers.csv", text);
    ASSERT_OK(td_csv_read(p, NULL, &c));
    ASSERT_EQ(c.rows, NUM);
    for (int i = 0; i < NUM; i++)
        if (c.target[i] != strtod(vals[i], NULL) || c.features[i] != (float)c.target[i])
            TEST_FAIL("'%s' read as %.17g and %.9g, strtod says %.17g", vals[i], c.target[i],
                      (double)c.features[i], strtod(vals[i], NULL));
    td_csv_free(&c);
    free(p);
    free(text);
    free(vals);

    p = tmp_path("missing.csv");
    ASSERT_STATUS(td_csv_read(p, NULL, &c), TD_ERR_NOTFOUND);
    free(p);
}

/* ---- images ---- */

static char *write_png(const char *name, int w, int h, int color_type, int depth,
                       const uint8_t *rows_data, size_t stride, const png_color *palette,
                       int npalette) {
    char *p = tmp_path(name);
    FILE *f = fopen(p, "wb");
    ASSERT(f);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    ASSERT(png && info);
    if (setjmp(png_jmpbuf(png))) TEST_FAIL("libpng failed writing %s", p);
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, color_type, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (palette) png_set_PLTE(png, info, palette, npalette);
    png_write_info(png, info);
    if (depth == 16) png_set_swap(png); /* our rows hold little-endian uint16 */
    for (int y = 0; y < h; y++) png_write_row(png, rows_data + (size_t)y * stride);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    fclose(f);
    return p;
}

static char *write_jpeg(const char *name, int w, int h, int comps, const uint8_t *pix,
                        int quality) {
    char *p = tmp_path(name);
    FILE *f = fopen(p, "wb");
    ASSERT(f);
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&ci);
    jpeg_stdio_dest(&ci, f);
    ci.image_width = (JDIMENSION)w;
    ci.image_height = (JDIMENSION)h;
    ci.input_components = comps;
    ci.in_color_space = comps == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, quality, TRUE);
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW row = (JSAMPROW)(pix + (size_t)ci.next_scanline * (size_t)w * (size_t)comps);
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    fclose(f);
    return p;
}

static void decode_file(const char *p, td_image *img) {
    size_t n;
    uint8_t *b = slurp(p, &n);
    ASSERT_OK(td_image_decode(b, n, p, img));
    free(b);
}

static void test_image_decode(void) {
    td_image img;
    uint8_t rgb[2 * 3 * 3] = {10, 20, 30, 40, 50, 60, 70, 80, 90, 200, 0, 255, 1, 2, 3, 4, 5, 6};
    char *p = write_png("rgb.png", 3, 2, PNG_COLOR_TYPE_RGB, 8, rgb, 9, NULL, 0);
    decode_file(p, &img);
    ASSERT_EQ(img.width, 3);
    ASSERT_EQ(img.height, 2);
    ASSERT_EQ(img.channels, 3);
    ASSERT_EQ(memcmp(img.pixels, rgb, sizeof rgb), 0);
    td_image_free(&img);
    free(p);
    /* 1-bit grey expands to 0/255; 16-bit keeps the high byte; palettes expand to RGB */
    uint8_t bits[2] = {0xa0, 0x40}; /* rows 1010, 0100 */
    p = write_png("bits.png", 4, 2, PNG_COLOR_TYPE_GRAY, 1, bits, 1, NULL, 0);
    decode_file(p, &img);
    ASSERT_EQ(img.channels, 1);
    uint8_t want_bits[8] = {255, 0, 255, 0, 0, 255, 0, 0};
    ASSERT_EQ(memcmp(img.pixels, want_bits, 8), 0);
    td_image_free(&img);
    free(p);
    uint16_t g16[3] = {0x1234, 0xff01, 0x00ff};
    p = write_png("g16.png", 3, 1, PNG_COLOR_TYPE_GRAY, 16, (uint8_t *)g16, 6, NULL, 0);
    decode_file(p, &img);
    ASSERT_EQ(img.channels, 1);
    ASSERT_EQ(img.pixels[0], 0x12);
    ASSERT_EQ(img.pixels[1], 0xff);
    ASSERT_EQ(img.pixels[2], 0x00);
    td_image_free(&img);
    free(p);
    png_color pal[2] = {{1, 2, 3}, {250, 251, 252}};
    uint8_t idx[3] = {1, 0, 1};
    p = write_png("pal.png", 3, 1, PNG_COLOR_TYPE_PALETTE, 8, idx, 3, pal, 2);
    decode_file(p, &img);
    ASSERT_EQ(img.channels, 3);
    uint8_t want_pal[9] = {250, 251, 252, 1, 2, 3, 250, 251, 252};
    ASSERT_EQ(memcmp(img.pixels, want_pal, 9), 0);
    td_image_free(&img);
    free(p);
    uint8_t ga[4] = {9, 128, 7, 255};
    p = write_png("ga.png", 2, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga, 4, NULL, 0);
    decode_file(p, &img);
    ASSERT_EQ(img.channels, 2);
    ASSERT_EQ(memcmp(img.pixels, ga, 4), 0);
    td_image_free(&img);
    free(p);

    /* JPEG: a flat grey at quality 100 comes back within 1; RGB flat colour within 2 */
    uint8_t flat[16 * 8];
    memset(flat, 77, sizeof flat);
    p = write_jpeg("grey.jpg", 16, 8, 1, flat, 100);
    decode_file(p, &img);
    ASSERT_EQ(img.channels, 1);
    ASSERT_EQ(img.width, 16);
    for (int i = 0; i < 16 * 8; i++) ASSERT_NEAR(img.pixels[i], 77, 1);
    td_image_free(&img);
    uint8_t col[8 * 8 * 3];
    for (int i = 0; i < 64; i++) col[3 * i] = 200, col[3 * i + 1] = 100, col[3 * i + 2] = 30;
    char *pc = write_jpeg("colour.jpg", 8, 8, 3, col, 100);
    decode_file(pc, &img);
    ASSERT_EQ(img.channels, 3);
    for (int i = 0; i < 64 * 3; i++) ASSERT_NEAR(img.pixels[i], col[i], 2);
    td_image_free(&img);

    /* damaged: cut in half, garbage, a header promising 100000 x 1 pixels */
    size_t n;
    uint8_t *b = slurp(p, &n);
    ASSERT_STATUS(td_image_decode(b, n / 2, "cut.jpg", &img), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "cut.jpg");
    ASSERT_CONTAINS(td_error_msg(), "JPEG");
    ASSERT(!img.pixels);
    /* cut short but properly ended (an EOI marker mid-scan): libjpeg would fill in grey */
    b[n / 2] = 0xff, b[n / 2 + 1] = 0xd9;
    ASSERT_STATUS(td_image_decode(b, n / 2 + 2, "short.jpg", &img), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "short.jpg");
    free(b);
    free(p);
    free(pc);
    p = write_png("cutme.png", 3, 2, PNG_COLOR_TYPE_RGB, 8, rgb, 9, NULL, 0);
    b = slurp(p, &n);
    ASSERT_STATUS(td_image_decode(b, n - 20, "cut.png", &img), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "cut.png");
    ASSERT_CONTAINS(td_error_msg(), "PNG");
    /* width field of IHDR (offset 16) set to 100000, its CRC fixed */
    b[16] = 0, b[17] = 0x01, b[18] = 0x86, b[19] = 0xa0;
    uint32_t crc = (uint32_t)crc32(0, b + 12, 17);
    b[29] = (uint8_t)(crc >> 24), b[30] = (uint8_t)(crc >> 16), b[31] = (uint8_t)(crc >> 8),
    b[32] = (uint8_t)crc;
    ASSERT_NE(td_image_decode(b, n, "wide.png", &img), TD_OK);
    ASSERT_CONTAINS(td_error_msg(), "wide.png");
    free(b);
    free(p);
    ASSERT_STATUS(td_image_decode((const uint8_t *)"GIF89a..", 8, "x.gif", &img), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "x.gif is neither PNG nor JPEG");
}

static void test_image_convert(void) {
    /* 4x2 RGB: luma by PIL's fixed-point ITU-R 601-2 weights */
    uint8_t px[2 * 4 * 3];
    for (int i = 0; i < 24; i++) px[i] = (uint8_t)(i * 10);
    td_image img = {.width = 4, .height = 2, .channels = 3, .pixels = px};
    uint8_t out[3 * 2 * 4];
    td_image_convert(&img, 1, 2, 4, out);
    for (int i = 0; i < 8; i++) {
        const uint8_t *q = px + 3 * i;
        ASSERT_EQ(out[i], (q[0] * 19595 + q[1] * 38470 + q[2] * 7471 + 0x8000) >> 16);
    }
    /* CHW order */
    td_image_convert(&img, 3, 2, 4, out);
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 8; i++) ASSERT_EQ(out[c * 8 + i], px[3 * i + c]);
    /* shrinking 4x2 -> 2x1: the mean of each 2x2 block */
    td_image_convert(&img, 3, 1, 2, out);
    for (int c = 0; c < 3; c++)
        for (int bx = 0; bx < 2; bx++) {
            int s = px[3 * (2 * bx) + c] + px[3 * (2 * bx + 1) + c] + px[3 * (4 + 2 * bx) + c] +
                    px[3 * (4 + 2 * bx + 1) + c];
            ASSERT_EQ(out[c * 2 + bx], (s + 2) / 4);
        }
    /* growing a grey 2x1 [0, 100] to 4x1: bilinear between pixel centres */
    uint8_t g[2] = {0, 100};
    td_image grey = {.width = 2, .height = 1, .channels = 1, .pixels = g};
    td_image_convert(&grey, 1, 1, 4, out);
    ASSERT_EQ(out[0], 0);
    ASSERT_EQ(out[1], 25);
    ASSERT_EQ(out[2], 75);
    ASSERT_EQ(out[3], 100);
    /* grey to RGB repeats; alpha is dropped */
    td_image_convert(&grey, 3, 1, 2, out);
    ASSERT_EQ(out[0], 0);
    ASSERT_EQ(out[3], 100);
    ASSERT_EQ(out[5], 100);
    uint8_t rgba[4] = {1, 2, 3, 0};
    td_image one = {.width = 1, .height = 1, .channels = 4, .pixels = rgba};
    td_image_convert(&one, 3, 1, 1, out);
    ASSERT_EQ(out[0] * 100 + out[1] * 10 + out[2], 123);
}

/* The same files decoded by PIL (the same libjpeg underneath): identical pixels. */
static void test_images_pil(void) {
    const char *names[] = {"pil_rgb.jpg", "pil_rgb_prog.jpg", "pil_grey.jpg", "pil_pal.png",
                           "pil_rgba.png"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char *p = fix(names[k]);
        char *raw = td_xasprintf("%s.raw", p);
        td_image img;
        decode_file(p, &img);
        size_t n;
        uint8_t *want = slurp(raw, &n);
        ASSERT_EQ(img.width, 37);
        ASSERT_EQ(img.height, 23);
        ASSERT_EQ((size_t)img.width * img.height * img.channels, n);
        size_t diff = 0;
        for (size_t i = 0; i < n; i++) diff += img.pixels[i] != want[i];
        if (diff) TEST_FAIL("%s: %zu of %zu bytes differ from PIL's decoding", p, diff, n);
        free(want);
        td_image_free(&img);
        free(raw);
        free(p);
    }
    char *p = fix("pil_grey16.png");
    td_image img;
    decode_file(p, &img);
    ASSERT_EQ(img.channels, 1);
    ASSERT_EQ(img.pixels[5 * 37 + 3], (5 * 1000 + 3) >> 8); /* the high byte */
    td_image_free(&img);
    free(p);
    /* luma and resampling against PIL's convert('L') and resize(BOX / BILINEAR) */
    p = fix("pil_rgb.png");
    decode_file(p, &img);
    const struct {
        const char *raw;
        int c, h, w;
        int tol;
    } conv[] = {{"pil_rgb_L.raw", 1, 23, 37, 0},
                {"pil_rgb_box_10x7.raw", 3, 7, 10, 1},
                {"pil_rgb_bilinear_80x50.raw", 3, 50, 80, 1}};
    for (size_t k = 0; k < sizeof conv / sizeof conv[0]; k++) {
        char *r = fix(conv[k].raw);
        size_t n;
        uint8_t *want = slurp(r, &n); /* HWC */
        ASSERT_EQ(n, (size_t)conv[k].c * conv[k].h * conv[k].w);
        uint8_t *got = malloc(n);
        td_image_convert(&img, conv[k].c, conv[k].h, conv[k].w, got);
        int worst = 0;
        for (int c = 0; c < conv[k].c; c++)
            for (int i = 0; i < conv[k].h * conv[k].w; i++) {
                int d = abs(got[c * conv[k].h * conv[k].w + i] - want[i * conv[k].c + c]);
                worst = d > worst ? d : worst;
            }
        if (worst > conv[k].tol)
            TEST_FAIL("%s: td_image_convert differs from PIL by %d (tolerance %d)", conv[k].raw,
                      worst, conv[k].tol);
        free(got);
        free(want);
        free(r);
    }
    td_image_free(&img);
    free(p);
}

static void test_image_folder(void) {
    char *root = tmp_path("folder");
    ASSERT_EQ(mkdir(root, 0700), 0);
    char *d;
    const char *dirs[] = {"dog", "cat", ".git", "cat/sub"};
    for (int i = 0; i < 4; i++) {
        d = td_xasprintf("%s/%s", root, dirs[i]);
        ASSERT_EQ(mkdir(d, 0700), 0);
        free(d);
    }
    /* cat: b.png (white 2x2), A.JPG (grey 4x4, sorts first: 'A' < 'b'), .hidden.png, notes.txt;
     * dog: x.png (RGB 2x2) */
    uint8_t white[4] = {255, 255, 255, 255}, grey[16 * 3];
    memset(grey, 100, sizeof grey);
    uint8_t dog[12] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
    free(write_png("folder/cat/b.png", 2, 2, PNG_COLOR_TYPE_GRAY, 8, white, 2, NULL, 0));
    free(write_jpeg("folder/cat/A.JPG", 4, 4, 1, grey, 100));
    free(write_text("folder/cat/.hidden.png", "not an image"));
    free(write_text("folder/cat/notes.txt", "not an image"));
    free(write_text("folder/README", "top-level files are not classes"));
    free(write_png("folder/dog/x.png", 2, 2, PNG_COLOR_TYPE_RGB, 8, dog, 6, NULL, 0));
    td_array x;
    int32_t *labels;
    char **classes;
    int nc;
    ASSERT_OK(td_image_folder_read(root, 0, 0, 0, &x, &labels, &classes, &nc));
    ASSERT_EQ(nc, 2);
    ASSERT_STREQ(classes[0], "cat");
    ASSERT_STREQ(classes[1], "dog");
    ASSERT_EQ(x.dtype, TD_DTYPE_U8);
    ASSERT_EQ(x.ndim, 4);
    ASSERT_EQ(x.shape[0], 3);
    ASSERT_EQ(x.shape[1], 1); /* from the first image (A.JPG, grey 4x4) */
    ASSERT_EQ(x.shape[2], 4);
    ASSERT_EQ(x.shape[3], 4);
    ASSERT_EQ(labels[0], 0);
    ASSERT_EQ(labels[1], 0);
    ASSERT_EQ(labels[2], 1);
    const uint8_t *px = x.data;
    for (int i = 0; i < 16; i++) ASSERT_NEAR(px[i], 100, 1); /* A.JPG */
    for (int i = 0; i < 16; i++) ASSERT_EQ(px[16 + i], 255); /* b.png, grown */
    ASSERT_EQ(px[32], (255 * 19595 + 0x8000) >> 16);         /* dog's red pixel as luma */
    td_array_free(&x);
    free(labels);
    for (int i = 0; i < nc; i++) free(classes[i]);
    free(classes);
    /* a size and channel count asked for */
    ASSERT_OK(td_image_folder_read(root, 3, 1, 1, &x, &labels, &classes, &nc));
    ASSERT_EQ(x.shape[1] * 100 + x.shape[2] * 10 + x.shape[3], 311);
    px = x.data;
    ASSERT_EQ(px[6], (255 + 0 + 0 + 10 + 2) / 4); /* dog, red channel, the 2x2 mean */
    td_array_free(&x);
    free(labels);
    for (int i = 0; i < nc; i++) free(classes[i]);
    free(classes);

    /* errors: a corrupt image names the file, an empty class names the folder */
    char *bad = write_text("folder/dog/y.png", "\x89PNG\r\n\x1a\nbroken");
    ASSERT_STATUS(td_image_folder_read(root, 0, 0, 0, &x, &labels, &classes, &nc), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), bad);
    ASSERT(!x.data && !labels && !classes);
    ASSERT_EQ(unlink(bad), 0);
    free(bad);
    d = td_xasprintf("%s/empty", root);
    ASSERT_EQ(mkdir(d, 0700), 0);
    ASSERT_STATUS(td_image_folder_read(root, 0, 0, 0, &x, &labels, &classes, &nc), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "class folder 'empty' holds no");
    ASSERT_EQ(rmdir(d), 0);
    free(d);
    d = td_xasprintf("%s/dog", root); /* images, no subfolders */
    ASSERT_STATUS(td_image_folder_read(d, 0, 0, 0, &x, &labels, &classes, &nc), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "no class subfolders");
    ASSERT_CONTAINS(td_error_msg(), "<class>/<image>.png");
    free(d);
    ASSERT_STATUS(td_image_folder_read(root, 2, 0, 0, &x, &labels, &classes, &nc), TD_ERR_INVALID);
    free(root);
}

/* NumPy (and PIL) write their fixtures with Debian's python3; without NumPy those parts are
 * skipped, and said so. */
static void make_fixtures(void) {
    const char *py = "/usr/bin/python3";
    char *script = td_xasprintf("%s", __FILE__);
    char *slash = strrchr(script, '/');
    char *src = td_xasprintf("%.*s/formats_fixtures.py", slash ? (int)(slash - script) : 1,
                             slash ? script : ".");
    snprintf(fixdir, sizeof fixdir, "%s/fixtures", tmpdir);
    ASSERT_EQ(mkdir(fixdir, 0700), 0);
    char *cmd = td_xasprintf("%s %s %s", py, src, fixdir);
    if (access(src, R_OK) != 0) TEST_FAIL("%s is missing", src);
    int rc = access(py, X_OK) == 0 ? system(cmd) : -1;
    /* exit 77: NumPy is not installed; any other failure is the script's, and fails the test */
    if (rc != -1 && !(WIFEXITED(rc) && WEXITSTATUS(rc) == 77) && rc != 0)
        TEST_FAIL("%s failed (status %d)", cmd, rc);
    if (rc != 0) {
        printf("NOTE: no NumPy (%s): skipping the checks against NumPy's and PIL's files\n", py);
        fixdir[0] = '\0';
    } else {
        char *pil = td_xasprintf("%s/pil_rgb.jpg", fixdir);
        have_pil = access(pil, R_OK) == 0;
        if (!have_pil) printf("NOTE: PIL is missing: skipping the comparisons with PIL\n");
        free(pil);
    }
    free(cmd);
    free(src);
    free(script);
}

int main(void) {
    ASSERT(mkdtemp(tmpdir));
    test_npy_handwritten();
    test_safetensors();
    test_csv();
    test_image_decode();
    test_image_convert();
    test_image_folder();
    make_fixtures();
    if (fixdir[0]) {
        test_npy_numpy();
        test_npz();
        if (have_pil) test_images_pil();
    }
    char *cmd = td_xasprintf("rm -rf %s", tmpdir);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
