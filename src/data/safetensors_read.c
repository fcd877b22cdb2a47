/* safetensors reader: an 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [3, 4], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {...}}
 * then the data, each tensor at [begin, end) counted from the end of the header. Every offset
 * is checked against the file and against shape x dtype size before anything is read, so a
 * tensor can be left in the file (file-backed) and read later without surprises.
 * (src/train/safetensors.c writes model weights in this format; this is the data reader.) */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/array.h"

/* The format's own limit on the header: the safetensors crate (the reference reader) refuses a
 * header length above 100,000,000 bytes (decimal, not MiB) as "header too large". */
#define ST_MAX_HEADER 100000000u

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

typedef struct {
    int fd;
    uint64_t flen, data_start;
    json_t *header; /* the parsed object */
} st_file;

static void st_close(st_file *f) {
    if (f->fd >= 0) close(f->fd);
    json_decref(f->header);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

/* Every dtype the safetensors crate knows, with its size in bits (F4 and F6 pack elements), so
 * that a file is checked whole even when it holds tensors tandem does not read. */
static const struct {
    const char *name;
    unsigned bits;
} st_layouts[] = {
    {"BOOL", 8},         {"F4", 4},          {"F6_E2M3", 6},     {"F6_E3M2", 6},
    {"U8", 8},           {"I8", 8},          {"F8_E5M2", 8},     {"F8_E4M3", 8},
    {"F8_E8M0", 8},      {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
    {"U16", 16},         {"F16", 16},        {"BF16", 16},       {"I32", 32},
    {"U32", 32},         {"F32", 32},        {"C64", 64},        {"F64", 64},
    {"I64", 64},         {"U64", 64},
};

typedef struct {
    const char *name;
    uint64_t begin, end;
} st_span;

static int cmp_span(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Entry i of a tensor's "shape" list, a non-negative integer, as the safetensors library wants. */
static td_status shape_entry(const char *path, const char *name, json_t *shape, size_t i,
                             uint64_t *out) {
    json_t *d = json_array_get(shape, i);
    if (!json_is_integer(d) || json_integer_value(d) < 0)
        return td_error(TD_ERR_FORMAT,
                        "safetensors file %s: tensor '%s': shape entry %zu is not a "
                        "non-negative integer; the header is damaged",
                        path, name, i);
    *out = (uint64_t)json_integer_value(d);
    return TD_OK;
}

/* One header entry's layout as the crate checks it: an object with "dtype" (a dtype it knows),
 * "shape" (non-negative integers) and "data_offsets" (two non-negative integers) whose span is
 * exactly the elements' bytes. Other fields are ignored, as the crate ignores them. */
static td_status st_layout(const char *path, const char *name, json_t *e, uint64_t room,
                           st_span *out) {
    json_t *dt = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape");
    json_t *offs = json_object_get(e, "data_offsets");
    if (!json_is_object(e) || !json_is_string(dt) || !json_is_array(shape) ||
        !json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)) ||
        json_integer_value(json_array_get(offs, 0)) < 0 ||
        json_integer_value(json_array_get(offs, 1)) < 0)
        return td_error(TD_ERR_FORMAT,
                        "safetensors file %s: tensor '%s' needs \"dtype\" (a string), \"shape\" "
                        "(a list) and \"data_offsets\" ([begin, end], non-negative integers); the "
                        "header is damaged",
                        path, name);
    const char *dts = json_string_value(dt);
    unsigned bits = 0;
    for (size_t i = 0; i < sizeof st_layouts / sizeof st_layouts[0]; i++)
        if (strcmp(dts, st_layouts[i].name) == 0) bits = st_layouts[i].bits;
    if (!bits)
        return td_error(TD_ERR_UNSUPPORTED,
                        "safetensors file %s: tensor '%s' has dtype \"%.20s\", which neither "
                        "tandem nor the safetensors library knows, so the file's layout cannot "
                        "be checked; convert the tensor (e.g. t.to(torch.float32)) and save again",
                        path, name, dts);
    /* elements x bits, with overflow checked: the crate refuses what overflows its usize */
    uint64_t nbits = bits;
    bool zero = false, overflow = false;
    for (size_t i = 0; i < json_array_size(shape); i++) {
        uint64_t v;
        TD_CHECK(shape_entry(path, name, shape, i, &v));
        if (v == 0) zero = true;
        if (v && nbits > (UINT64_MAX >> 1) / v) overflow = true;
        if (!overflow) nbits *= v;
    }
    if (zero) nbits = 0, overflow = false;
    if (overflow)
        return td_error(TD_ERR_FORMAT,
                        "safetensors file %s: tensor '%s': its shape overflows 64-bit sizes; "
                        "the header is damaged",
                        path, name);
    out->name = name;
    out->begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
    out->end = (uint64_t)json_integer_value(json_array_get(offs, 1));
    if (nbits % 8 != 0)
        return td_error(TD_ERR_FORMAT,
                        "safetensors file %s: tensor '%s' (%s) holds %llu bits, not a whole "
                        "number of bytes; the header is damaged",
                        path, name, dts, (unsigned long long)nbits);
    if (out->end < out->begin || out->end > room)
        return td_error(TD_ERR_FORMAT,
                        "safetensors file %s: tensor '%s': data_offsets [%llu, %llu] are not "
                        "within the %llu data bytes after the header; the file is truncated or "
                        "damaged, write it again",
                        path, name, (unsigned long long)out->begin, (unsigned long long)out->end,
                        (unsigned long long)room);
    if (out->end - out->begin != nbits / 8) {
        char s[160];
        uint64_t shp[TD_ARRAY_MAX_DIMS];
        size_t nd = json_array_size(shape);
        for (size_t i = 0; i < nd && i < TD_ARRAY_MAX_DIMS; i++)
            shp[i] = (uint64_t)json_integer_value(json_array_get(shape, i));
        return td_error(TD_ERR_FORMAT,
                        "safetensors file %s: tensor '%s' is %s %s%s (%llu bytes) but its "
                        "data_offsets [%llu, %llu] span %llu bytes; the header is damaged, write "
                        "it again",
                        path, name, dts,
                        td__shape_str(nd < TD_ARRAY_MAX_DIMS ? (int)nd : TD_ARRAY_MAX_DIMS, shp,
                                      s, sizeof s),
                        nd > TD_ARRAY_MAX_DIMS ? "..." : "", (unsigned long long)(nbits / 8),
                        (unsigned long long)out->begin, (unsigned long long)out->end,
                        (unsigned long long)(out->end - out->begin));
    }
    return TD_OK;
}

/* The whole header (after the tensor asked for, whose own error is the more useful one), as the
 * safetensors crate (the format's reference reader) checks it before
 * handing out any tensor: "__metadata__" absent, null, or an object of strings; every other entry
 * a tensor whose layout fits; and the tensors' byte ranges, sorted, tiling the data section
 * exactly: the first at 0, each beginning where the one before ends (no gap, no overlap) and the
 * last ending at the end of the file. Overlapping tensors would make writing one change another,
 * and a gap or trailing bytes mean the file is not what its writer wrote; the reference refuses
 * all of them, so a file tandem trains on is one that every other reader reads the same. One
 * difference, stricter: a key given twice is refused (jansson), where the crate keeps one. */
static td_status st_validate(const char *path, const st_file *f) {
    td_status rc = TD_OK;
    size_t n = 0;
    uint64_t room = f->flen - f->data_start;
    st_span *sp = td_xcalloc(json_object_size(f->header) + 1, sizeof *sp);
    const char *key;
    json_t *v;
    json_object_foreach(f->header, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            bool ok = json_is_null(v) || json_is_object(v);
            const char *mk;
            json_t *mv;
            if (json_is_object(v)) json_object_foreach(v, mk, mv) ok = ok && json_is_string(mv);
            if (!ok) {
                rc = td_error(TD_ERR_FORMAT,
                              "safetensors file %s: \"__metadata__\" must be an object whose "
                              "values are strings (the format's rule); the header is damaged, "
                              "write it again",
                              path);
                goto out;
            }
            continue;
        }
        TD_CHECK_GOTO(st_layout(path, key, v, room, &sp[n]), rc, out);
        n++;
    }
    qsort(sp, n, sizeof *sp, cmp_span);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (sp[i].begin != at) {
            rc = td_error(TD_ERR_FORMAT,
                          "safetensors file %s: tensor '%s' has data_offsets [%llu, %llu], but "
                          "the tensors before it (in offset order) end at %llu: %s; the format "
                          "requires the tensors to tile the data exactly, write the file again",
                          path, sp[i].name, (unsigned long long)sp[i].begin,
                          (unsigned long long)sp[i].end, (unsigned long long)at,
                          sp[i].begin < at ? "it overlaps them" : "a gap of unclaimed bytes");
            goto out;
        }
        at = sp[i].end;
    }
    if (at != room)
        rc = td_error(TD_ERR_FORMAT,
                      "safetensors file %s: its tensors cover %llu data bytes but the file holds "
                      "%llu after the header; %s, write it again",
                      path, (unsigned long long)at, (unsigned long long)room,
                      at > room ? "the file is truncated" : "the file has bytes no tensor claims");
out:
    free(sp);
    return rc;
}

static td_status st_open(const char *path, st_file *f) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    TD_CHECK(td__file_open(path, "safetensors file", &f->fd, &f->flen));
    td_status rc = TD_OK;
    char *text = NULL;
    uint8_t lenb[8];
    if (f->flen < 8) {
        rc = td_error(TD_ERR_FORMAT,
                      "safetensors file %s is %llu bytes, shorter than the 8-byte header "
                      "length; it is not a safetensors file or it is truncated",
                      path, (unsigned long long)f->flen);
        goto out;
    }
    if (td__pread_full(f->fd, lenb, 8, 0) != 0) {
        rc = td_error_errno(TD_ERR_IO, "cannot read safetensors file %s", path);
        goto out;
    }
    uint64_t n = le64(lenb);
    if (n > ST_MAX_HEADER || n > f->flen - 8) {
        rc = td_error(TD_ERR_FORMAT,
                      "safetensors file %s: its header length is %llu bytes, but %s; it is not "
                      "a safetensors file or it is truncated",
                      path, (unsigned long long)n,
                      n > ST_MAX_HEADER ? "the format allows at most 100,000,000 bytes"
                                        : "the file is shorter");
        goto out;
    }
    text = td_xmalloc((size_t)n + 1);
    if (td__pread_full(f->fd, text, n, 8) != 0) {
        rc = td_error_errno(TD_ERR_IO, "cannot read safetensors file %s", path);
        goto out;
    }
    json_error_t err;
    f->header = json_loadb(text, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (!f->header) {
        rc = td_error(TD_ERR_FORMAT,
                      "safetensors file %s: its JSON header does not parse (column %d: %s); "
                      "the file is damaged, write it again",
                      path, err.column, err.text);
        goto out;
    }
    if (!json_is_object(f->header)) {
        rc = td_error(TD_ERR_FORMAT,
                      "safetensors file %s: its header is not a JSON object; the file is damaged",
                      path);
        goto out;
    }
    f->data_start = 8 + n;
out:
    free(text);
    if (rc != TD_OK) st_close(f);
    return rc;
}

static const struct {
    const char *name;
    td_dtype dtype;
} st_dtypes[] = {
    {"U8", TD_DTYPE_U8},   {"I8", TD_DTYPE_I8},   {"U16", TD_DTYPE_U16},   {"I16", TD_DTYPE_I16},
    {"I32", TD_DTYPE_I32}, {"I64", TD_DTYPE_I64}, {"F16", TD_DTYPE_F16},   {"BF16", TD_DTYPE_BF16},
    {"F32", TD_DTYPE_F32}, {"F64", TD_DTYPE_F64}, {"BOOL", TD_DTYPE_BOOL},
};

/* One entry of the header: dtype, shape and offsets checked. */
static td_status st_entry(const char *path, const st_file *f, const char *name, json_t *e,
                          td_array *out, uint64_t *begin) {
    json_t *dt = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape");
    json_t *offs = json_object_get(e, "data_offsets");
    if (!json_is_object(e) || !json_is_string(dt) || !json_is_array(shape) ||
        !json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)))
        return td_error(TD_ERR_FORMAT,
                        "safetensors file %s: tensor '%s' needs \"dtype\" (a string), \"shape\" "
                        "(a list) and \"data_offsets\" ([begin, end]); the header is damaged",
                        path, name);
    const char *dts = json_string_value(dt);
    bool known = false;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(dts, st_dtypes[i].name) == 0) {
            out->dtype = st_dtypes[i].dtype;
            known = true;
        }
    if (!known)
        return td_error(TD_ERR_UNSUPPORTED,
                        "safetensors file %s: tensor '%s' has dtype \"%.20s\"; tandem reads U8, "
                        "I8, U16, I16, I32, I64, F16, BF16, F32, F64 and BOOL: convert it (e.g. "
                        "t.to(torch.float32)) and save again",
                        path, name, dts);
    size_t nd = json_array_size(shape);
    if (nd > TD_ARRAY_MAX_DIMS)
        return td_error(TD_ERR_UNSUPPORTED,
                        "safetensors file %s: tensor '%s' has %zu dimensions, more than %d; "
                        "reshape it first",
                        path, name, nd, TD_ARRAY_MAX_DIMS);
    out->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        TD_CHECK(shape_entry(path, name, shape, i, &out->shape[i]));
    }
    json_int_t b = json_integer_value(json_array_get(offs, 0));
    json_int_t en = json_integer_value(json_array_get(offs, 1));
    uint64_t nbytes, room = f->flen - f->data_start;
    char s[160];
    if (!td__shape_nbytes(out->dtype, out->ndim, out->shape, &nbytes))
        return td_error(TD_ERR_FORMAT,
                        "safetensors file %s: tensor '%s': its shape overflows 64-bit sizes; "
                        "the header is damaged",
                        path, name);
    if (b < 0 || en < b || (uint64_t)en > room)
        return td_error(TD_ERR_FORMAT,
                        "safetensors file %s: tensor '%s': data_offsets [%lld, %lld] are not "
                        "within the %llu data bytes after the header; the file is truncated or "
                        "damaged, write it again",
                        path, name, (long long)b, (long long)en, (unsigned long long)room);
    if ((uint64_t)(en - b) != nbytes)
        return td_error(TD_ERR_FORMAT,
                        "safetensors file %s: tensor '%s' is %s %s (%llu bytes) but its "
                        "data_offsets span %llu bytes; the header is damaged, write it again",
                        path, name, dts, td__shape_str(out->ndim, out->shape, s, sizeof s),
                        (unsigned long long)nbytes, (unsigned long long)(en - b));
    *begin = f->data_start + (uint64_t)b;
    return TD_OK;
}

td_status td_safetensors_read(const char *path, const char *name, bool file_backed_ok,
                              td_array *out) {
    memset(out, 0, sizeof *out);
    st_file f;
    TD_CHECK(st_open(path, &f));
    td_status rc = TD_OK;
    json_t *e = strcmp(name, "__metadata__") == 0 ? NULL : json_object_get(f.header, name);
    if (!e) {
        char list[400];
        size_t len = 0;
        const char *key;
        json_t *v;
        list[0] = '\0';
        json_object_foreach(f.header, key, v) {
            if (strcmp(key, "__metadata__") == 0 || len + 1 >= sizeof list) continue;
            len += (size_t)snprintf(list + len, sizeof list - len, "%s'%s'", len ? ", " : "", key);
        }
        TD_CHECK_GOTO(st_validate(path, &f), rc, out);
        rc = td_error(TD_ERR_NOTFOUND, "safetensors file %s has no tensor '%s'; it holds %s", path,
                      name, len ? list : "no tensors");
        goto out;
    }
    uint64_t begin = 0;
    TD_CHECK_GOTO(st_entry(path, &f, name, e, out, &begin), rc, out);
    TD_CHECK_GOTO(st_validate(path, &f), rc, out);
    if (file_backed_ok) {
        out->path = td_xstrdup(path);
        out->offset = begin;
        goto out;
    }
    uint64_t nbytes;
    td__shape_nbytes(out->dtype, out->ndim, out->shape, &nbytes);
    out->data = nbytes <= SIZE_MAX ? malloc(nbytes ? (size_t)nbytes : 1) : NULL;
    if (!out->data) {
        rc = td_error(TD_ERR_NOMEM,
                      "safetensors file %s: cannot allocate %llu bytes for tensor '%s'; free "
                      "memory or read it file-backed",
                      path, (unsigned long long)nbytes, name);
        goto out;
    }
    if (td__pread_full(f.fd, out->data, nbytes, begin) != 0)
        rc =
            td_error_errno(TD_ERR_IO, "cannot read tensor '%s' of safetensors file %s", name, path);
out:
    st_close(&f);
    if (rc != TD_OK) td_array_free(out);
    return rc;
}

td_status td_safetensors_list(const char *path, char ***names, int *count) {
    *names = NULL;
    *count = 0;
    st_file f;
    TD_CHECK(st_open(path, &f));
    td_status rc = st_validate(path, &f);
    if (rc != TD_OK) {
        st_close(&f);
        return rc;
    }
    char **out = td_xcalloc(json_object_size(f.header) + 1, sizeof *out);
    int n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(f.header, key, v) {
        if (strcmp(key, "__metadata__") != 0) out[n++] = td_xstrdup(key);
    }
    st_close(&f);
    *names = out;
    *count = n;
    return TD_OK;
}
