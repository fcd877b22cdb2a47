/* NumPy .npy and .npz readers.
 *
 * .npy: the magic "\x93NUMPY", a version, a little-endian header length, then a Python dict
 * literal {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } padded with spaces, then
 * the elements. The dict is parsed by a small lexer that accepts what NumPy's writers produce
 * (either quote, any spacing, trailing commas, Python 2's "3L") and nothing that would need an
 * interpreter.
 *
 * .npz: a zip of .npy members. The central directory is parsed here rather than through a zip
 * library so that a stored member (np.savez) can stay in the file, file-backed, at its data
 * offset; a deflated one (np.savez_compressed) is inflated into memory with zlib and its CRC-32
 * and sizes checked. ZIP64 records and extra fields are honoured: NumPy writes the ZIP64 extra
 * field into every member's local header (force_zip64), and archives past 4 GiB need the rest.
 *
 * Every size a header states is checked against the file (or the member) before anything is
 * allocated from it, so a damaged or hostile file costs an error, not memory.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data/array.h"

/* NumPy itself refuses headers over 10,000 bytes by default; this leaves room for odd writers. */
#define NPY_MAX_HEADER (1u << 20)
/* deflate's best ratio is about 1032:1, so a member declaring more is lying about its size. */
#define DEFLATE_MAX_RATIO 1032u
#define ZIP_READ_CHUNK    (1u << 20)
/* A deflated member's buffer starts at this size and doubles as output arrives. */
#define INFLATE_FIRST_CHUNK (64u << 10)

static uint16_t le16(const uint8_t *b) {
    return (uint16_t)(b[0] | b[1] << 8);
}
static uint32_t le32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static uint64_t le64(const uint8_t *b) {
    return (uint64_t)le32(b) | (uint64_t)le32(b + 4) << 32;
}

static td_status read_error(const char *what, uint64_t n, uint64_t off) {
    if (errno == 0)
        return td_error(TD_ERR_FORMAT,
                        "%s is truncated: %llu bytes at offset %llu are past its end; "
                        "the file is damaged, write it again",
                        what, (unsigned long long)n, (unsigned long long)off);
    return td_error_errno(TD_ERR_IO, "cannot read %s", what);
}

/* ---- the .npy header ---- */

typedef struct {
    td_dtype dtype;
    int ndim;
    uint64_t shape[TD_ARRAY_MAX_DIMS];
    uint64_t header_bytes; /* where the elements start, from the start of the .npy */
    uint64_t nbytes;       /* the elements' bytes */
} npy_info;

typedef struct {
    const char *p, *end;
} lexer;

static void skip_space(lexer *l) {
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r'))
        l->p++;
}

static bool eat(lexer *l, char c) {
    skip_space(l);
    if (l->p < l->end && *l->p == c) {
        l->p++;
        return true;
    }
    return false;
}

/* A quoted string without escapes (NumPy's keys and dtype strings have none). */
static bool lex_string(lexer *l, char *buf, size_t cap) {
    skip_space(l);
    if (l->p >= l->end || (*l->p != '\'' && *l->p != '"')) return false;
    char q = *l->p++;
    size_t n = 0;
    while (l->p < l->end && *l->p != q) {
        if (*l->p == '\\' || n + 1 >= cap) return false;
        buf[n++] = *l->p++;
    }
    if (l->p >= l->end) return false;
    l->p++;
    buf[n] = '\0';
    return true;
}

static bool lex_word(lexer *l, const char *w) {
    skip_space(l);
    size_t n = strlen(w);
    if ((size_t)(l->end - l->p) < n || memcmp(l->p, w, n) != 0) return false;
    l->p += n;
    return true;
}

/* (3, 4) or (3,) or (): non-negative integers, Python 2's "3L" accepted. */
static bool lex_shape(lexer *l, npy_info *info, bool *too_many) {
    if (!eat(l, '(')) return false;
    info->ndim = 0;
    for (;;) {
        if (eat(l, ')')) return true;
        skip_space(l);
        if (l->p >= l->end || *l->p < '0' || *l->p > '9') return false;
        uint64_t v = 0;
        while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
            if (v > ((uint64_t)1 << 62) / 10) return false;
            v = v * 10 + (uint64_t)(*l->p++ - '0');
        }
        if (l->p < l->end && *l->p == 'L') l->p++;
        if (info->ndim == TD_ARRAY_MAX_DIMS) {
            *too_many = true;
            return false;
        }
        info->shape[info->ndim++] = v;
        if (eat(l, ',')) continue;
        if (eat(l, ')')) return true;
        return false;
    }
}

/* descr ('<f4', '|u1', ...) to a dtype, or an error that says how to convert the array. */
static td_status parse_descr(const char *where, const char *descr, td_dtype *out) {
    const char *t = descr;
    char order = '=';
    if (*t == '<' || *t == '>' || *t == '|' || *t == '=') order = *t++;
    static const struct {
        const char *code;
        td_dtype dtype;
    } known[] = {
        {"u1", TD_DTYPE_U8},  {"i1", TD_DTYPE_I8},  {"b1", TD_DTYPE_BOOL}, {"u2", TD_DTYPE_U16},
        {"i2", TD_DTYPE_I16}, {"i4", TD_DTYPE_I32}, {"i8", TD_DTYPE_I64},  {"f2", TD_DTYPE_F16},
        {"f4", TD_DTYPE_F32}, {"f8", TD_DTYPE_F64}, {"?", TD_DTYPE_BOOL},  {"B", TD_DTYPE_U8},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(t, known[i].code) != 0) continue;
        if (order == '>' && td_dtype_size(known[i].dtype) > 1)
            return td_error(TD_ERR_UNSUPPORTED,
                            "%s: big-endian dtype '%s'; tandem reads little-endian arrays: "
                            "convert with a = a.astype(a.dtype.newbyteorder('<')) and save again",
                            where, descr);
        *out = known[i].dtype;
        return TD_OK;
    }
    const char *why = "an unsupported dtype";
    const char *fix = "convert it with a.astype(np.float32) (or np.int64 for labels)";
    switch (*t) {
    case 'O':
        why = "an object array (pickled Python objects)";
        fix = "save a numeric array instead: np.save(path, np.asarray(a, dtype=np.float32))";
        break;
    case 'U':
    case 'S':
    case 'a':
        why = "an array of strings";
        fix = "encode them as class indices: names, idx = np.unique(a, return_inverse=True)";
        break;
    case 'V':
        why = "a structured or void dtype";
        fix = "save each field as its own array (np.savez(path, x=a['x'], y=a['y']))";
        break;
    case 'c':
        why = "a complex dtype";
        fix = "save the real and imaginary parts as float arrays";
        break;
    case 'M':
    case 'm':
        why = "a datetime dtype";
        fix = "convert it with a.astype(np.int64)";
        break;
    case 'u':
        fix = "convert it with a.astype(np.int64)";
        break;
    default:
        break;
    }
    return td_error(TD_ERR_UNSUPPORTED,
                    "%s: dtype '%s' is %s; tandem reads uint8, int8, uint16, int16, int32, int64, "
                    "float16, float32, float64 and bool: %s",
                    where, descr, why, fix);
}

/* The 10- or 12-byte preamble: b holds min(len, 12) bytes of a .npy stream of len bytes. Sets
 * the offset where the header dict ends. */
static td_status npy_preamble(const char *where, const uint8_t *b, uint64_t len,
                              uint64_t *header_end) {
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return td_error(
            TD_ERR_FORMAT, "%s is not a NumPy .npy file (%s); write it with np.save(path, array)",
            where, len < 10 ? "shorter than the 10-byte preamble" : "no \\x93NUMPY magic");
    int major = b[6], minor = b[7];
    uint64_t start, hlen;
    if (major == 1) {
        start = 10;
        hlen = le16(b + 8);
    } else if (major == 2 || major == 3) {
        if (len < 12)
            return td_error(TD_ERR_FORMAT, "%s is truncated inside its preamble (%llu bytes)",
                            where, (unsigned long long)len);
        start = 12;
        hlen = le32(b + 8);
    } else {
        return td_error(TD_ERR_UNSUPPORTED,
                        "%s: .npy format version %d.%d; tandem reads versions 1.0, 2.0 and 3.0 "
                        "(save it with a NumPy release that writes them, e.g. np.save)",
                        where, major, minor);
    }
    if (hlen > NPY_MAX_HEADER)
        return td_error(TD_ERR_FORMAT,
                        "%s: its header claims %llu bytes, more than the %u any NumPy writes; "
                        "the file is damaged",
                        where, (unsigned long long)hlen, NPY_MAX_HEADER);
    if (start + hlen > len)
        return td_error(TD_ERR_FORMAT,
                        "%s is truncated: its header needs %llu bytes, the file has %llu", where,
                        (unsigned long long)(start + hlen), (unsigned long long)len);
    *header_end = start + hlen;
    return TD_OK;
}

/* Parses the header dict b[start..header_end) (b holds the whole preamble and header) and checks
 * that the .npy stream of len bytes holds exactly the elements it describes. in_zip: len is the
 * member's uncompressed size from the archive's central directory (not bytes seen yet), which the
 * error then says, since nothing beyond the header has been read or allocated. */
static td_status npy_header(const char *where, const uint8_t *b, uint64_t header_end, uint64_t len,
                            bool in_zip, npy_info *info) {
    memset(info, 0, sizeof *info);
    uint64_t start = b[6] == 1 ? 10 : 12;
    lexer l = {(const char *)b + start, (const char *)b + header_end};
    char key[32], descr[40];
    bool have_descr = false, have_order = false, have_shape = false, fortran = false;
    bool too_many = false;
    const char *bad = NULL;
    if (!eat(&l, '{')) {
        bad = "it does not start with '{'";
        goto malformed;
    }
    for (;;) {
        if (eat(&l, '}')) break;
        if (!lex_string(&l, key, sizeof key) || !eat(&l, ':')) {
            bad = "expected a quoted key and ':'";
            goto malformed;
        }
        if (strcmp(key, "descr") == 0) {
            skip_space(&l);
            if (l.p < l.end && *l.p == '[')
                return td_error(TD_ERR_UNSUPPORTED,
                                "%s: a structured array (its descr is a list of fields); save "
                                "each field as its own array (np.savez(path, x=a['x'], ...))",
                                where);
            if (!lex_string(&l, descr, sizeof descr)) {
                bad = "'descr' is not a short quoted string";
                goto malformed;
            }
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (lex_word(&l, "True"))
                fortran = true;
            else if (lex_word(&l, "False"))
                fortran = false;
            else {
                bad = "'fortran_order' is neither True nor False";
                goto malformed;
            }
            have_order = true;
        } else if (strcmp(key, "shape") == 0) {
            if (!lex_shape(&l, info, &too_many)) {
                if (too_many)
                    return td_error(TD_ERR_UNSUPPORTED,
                                    "%s: more than %d dimensions; reshape the array first", where,
                                    TD_ARRAY_MAX_DIMS);
                bad = "'shape' is not a tuple of non-negative integers";
                goto malformed;
            }
            have_shape = true;
        } else {
            return td_error(TD_ERR_FORMAT,
                            "%s: unexpected key '%s' in the header (NumPy writes only 'descr', "
                            "'fortran_order' and 'shape'); the file is damaged or not from np.save",
                            where, key);
        }
        if (eat(&l, ',')) continue;
        if (eat(&l, '}')) break;
        bad = "expected ',' or '}' after a value";
        goto malformed;
    }
    if (!have_descr || !have_order || !have_shape)
        return td_error(TD_ERR_FORMAT, "%s: the header lacks '%s'; the file is damaged", where,
                        !have_descr   ? "descr"
                        : !have_order ? "fortran_order"
                                      : "shape");
    TD_CHECK(parse_descr(where, descr, &info->dtype));
    int big = 0;
    for (int i = 0; i < info->ndim; i++) big += info->shape[i] > 1;
    if (fortran && big > 1)
        return td_error(TD_ERR_UNSUPPORTED,
                        "%s: the array is in Fortran (column-major) order; tandem reads C order: "
                        "save np.ascontiguousarray(a) instead",
                        where);
    if (!td__shape_nbytes(info->dtype, info->ndim, info->shape, &info->nbytes))
        return td_error(TD_ERR_FORMAT,
                        "%s: its shape overflows 64-bit sizes; the header is damaged", where);
    info->header_bytes = header_end;
    if (len - header_end != info->nbytes) {
        char s[160];
        if (in_zip)
            return td_error(TD_ERR_FORMAT,
                            "%s: its .npy header says %s %s (%llu bytes of elements) but the "
                            "archive's central directory gives the member %llu bytes (%llu after "
                            "the %llu-byte header); refused before reading or allocating them: "
                            "the archive is damaged, write it again with np.savez",
                            where, td_dtype_name(info->dtype),
                            td__shape_str(info->ndim, info->shape, s, sizeof s),
                            (unsigned long long)info->nbytes, (unsigned long long)len,
                            (unsigned long long)(len - header_end),
                            (unsigned long long)header_end);
        return td_error(TD_ERR_FORMAT,
                        "%s %s: its header says %s %s (%llu bytes) but %llu bytes follow the "
                        "header; write it again with np.save",
                        where, len - header_end < info->nbytes ? "is truncated" : "has extra data",
                        td_dtype_name(info->dtype),
                        td__shape_str(info->ndim, info->shape, s, sizeof s),
                        (unsigned long long)info->nbytes, (unsigned long long)(len - header_end));
    }
    return TD_OK;
malformed:
    return td_error(TD_ERR_FORMAT,
                    "%s: cannot parse its header dict (%s); the file is damaged or not written "
                    "by np.save",
                    where, bad);
}

static void fill_array(td_array *out, const npy_info *info) {
    out->dtype = info->dtype;
    out->ndim = info->ndim;
    memcpy(out->shape, info->shape, sizeof info->shape);
}

static void *alloc_data(const char *where, uint64_t nbytes) {
    void *p = nbytes <= SIZE_MAX ? malloc(nbytes ? (size_t)nbytes : 1) : NULL;
    if (!p)
        td_error(TD_ERR_NOMEM,
                 "%s: cannot allocate %llu bytes for its elements; free memory or read it "
                 "file-backed (stored, not compressed)",
                 where, (unsigned long long)nbytes);
    return p;
}

/* The .npy stream at [off, off + len) of an open file: header parsed, elements read or left in
 * the file. crc: when non-NULL, the CRC-32 of the whole stream is checked against it (only when
 * the elements are read). */
static td_status npy_from_file(const char *path, const char *where, int fd, uint64_t off,
                               uint64_t len, bool file_backed_ok, const uint32_t *crc,
                               td_array *out) {
    td_status rc = TD_OK;
    uint8_t pre[12];
    uint8_t *head = NULL;
    uint64_t header_end;
    uint64_t n = len < sizeof pre ? len : sizeof pre;
    if (td__pread_full(fd, pre, n, off) != 0) return read_error(where, n, off);
    TD_CHECK(npy_preamble(where, pre, len, &header_end));
    head = td_xmalloc((size_t)header_end);
    if (td__pread_full(fd, head, header_end, off) != 0) {
        rc = read_error(where, header_end, off);
        goto out;
    }
    npy_info info;
    TD_CHECK_GOTO(npy_header(where, head, header_end, len, crc != NULL, &info), rc, out);
    fill_array(out, &info);
    if (file_backed_ok) {
        out->path = td_xstrdup(path);
        out->offset = off + info.header_bytes;
        goto out;
    }
    out->data = alloc_data(where, info.nbytes);
    if (!out->data) {
        rc = TD_ERR_NOMEM;
        goto out;
    }
    if (td__pread_full(fd, out->data, info.nbytes, off + info.header_bytes) != 0) {
        rc = read_error(where, info.nbytes, off + info.header_bytes);
        goto out;
    }
    if (crc) {
        uint32_t c = (uint32_t)crc32_z(0, head, (z_size_t)header_end);
        c = (uint32_t)crc32_z(c, out->data, (z_size_t)info.nbytes);
        if (c != *crc)
            rc = td_error(TD_ERR_FORMAT,
                          "%s: CRC-32 mismatch (0x%08x, the archive says 0x%08x); the archive is "
                          "damaged, write it again",
                          where, c, *crc);
    }
out:
    free(head);
    if (rc != TD_OK) td_array_free(out);
    return rc;
}

td_status td_npy_read(const char *path, bool file_backed_ok, td_array *out) {
    memset(out, 0, sizeof *out);
    int fd;
    uint64_t len;
    TD_CHECK(td__file_open(path, "NumPy file", &fd, &len));
    char *where = td_xasprintf("NumPy file %s", path);
    td_status rc = npy_from_file(path, where, fd, 0, len, file_backed_ok, NULL, out);
    free(where);
    close(fd);
    return rc;
}

/* ---- .npz: the zip container ---- */

typedef struct {
    char *name; /* as stored, e.g. "x.npy" */
    uint32_t name_len; /* the stored name may hold a NUL */
    uint64_t csize, usize, local_offset;
    uint32_t crc;
    uint16_t method, flags;
} zip_member;

typedef struct {
    zip_member *m;
    int count;
} zip_dir;

static void zip_dir_free(zip_dir *d) {
    for (int i = 0; i < d->count; i++) free(d->m[i].name);
    free(d->m);
    memset(d, 0, sizeof *d);
}

#define ZIP_EOCD_SIG      0x06054b50u
#define ZIP64_LOCATOR_SIG 0x07064b50u
#define ZIP64_EOCD_SIG    0x06064b50u
#define ZIP_CENTRAL_SIG   0x02014b50u
#define ZIP_LOCAL_SIG     0x04034b50u

/* The zip64 extra field (id 1) holds, in this order, those of the sizes and the offset whose
 * 32-bit fields are all ones. */
static bool zip64_extra(const uint8_t *x, uint32_t xlen, zip_member *m, bool need_u, bool need_c,
                        bool need_off) {
    uint32_t p = 0;
    while (p + 4 <= xlen) {
        uint16_t id = le16(x + p), sz = le16(x + p + 2);
        if (p + 4 + sz > xlen) return false;
        if (id == 1) {
            const uint8_t *f = x + p + 4;
            uint32_t q = 0;
            if (need_u) {
                if (q + 8 > sz) return false;
                m->usize = le64(f + q), q += 8;
            }
            if (need_c) {
                if (q + 8 > sz) return false;
                m->csize = le64(f + q), q += 8;
            }
            if (need_off) {
                if (q + 8 > sz) return false;
                m->local_offset = le64(f + q);
            }
            return true;
        }
        p += 4 + (uint32_t)sz;
    }
    return !need_u && !need_c && !need_off;
}

/* "x.npy" -> "x"; other names as they are (np.load's NpzFile keys). */
static char *member_key(const char *name) {
    size_t n = strlen(name);
    if (n > 4 && strcmp(name + n - 4, ".npy") == 0) {
        char *k = td_xmalloc(n - 3);
        memcpy(k, name, n - 4);
        k[n - 4] = '\0';
        return k;
    }
    return td_xstrdup(name);
}

static bool is_dir_entry(const zip_member *m) {
    size_t n = strlen(m->name);
    return n == 0 || m->name[n - 1] == '/';
}

typedef struct {
    char *key;
    int index;
} zip_key;

static int cmp_zip_key(const void *a, const void *b) {
    const zip_key *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* Two members that are the same array ("x.npy" twice, or "x" and "x.npy") are refused. A zip may
 * hold a name twice (appending to an archive does that), and readers disagree on which one wins:
 * np.load goes through zipfile, whose name table keeps the LAST central-directory entry, while a
 * first-match search finds the first. Rather than train on an array NumPy would not have loaded,
 * the archive is refused, naming both entries. Sorted, so a hostile directory of a million
 * entries costs n log n, not n^2. */
static td_status zip_refuse_duplicates(const char *path, const zip_dir *dir) {
    td_status rc = TD_OK;
    zip_key *k = td_xcalloc(dir->count ? (size_t)dir->count : 1, sizeof *k);
    int n = 0;
    for (int i = 0; i < dir->count; i++) {
        if (is_dir_entry(&dir->m[i])) continue;
        k[n].key = member_key(dir->m[i].name);
        k[n++].index = i;
    }
    qsort(k, (size_t)n, sizeof *k, cmp_zip_key);
    for (int i = 1; i < n && rc == TD_OK; i++) {
        if (strcmp(k[i - 1].key, k[i].key) != 0) continue;
        const zip_member *a = &dir->m[k[i - 1].index], *b = &dir->m[k[i].index];
        if (a->name_len == b->name_len && memcmp(a->name, b->name, a->name_len) == 0)
            rc = td_error(TD_ERR_FORMAT,
                          "NumPy archive %s holds member '%s' twice (central directory entries "
                          "%d and %d); np.load would read the last one and another reader the "
                          "first, so tandem refuses to guess: write the archive again with "
                          "np.savez, one array per name",
                          path, a->name, k[i - 1].index, k[i].index);
        else
            rc = td_error(TD_ERR_FORMAT,
                          "NumPy archive %s: members '%s' (entry %d) and '%s' (entry %d) are both "
                          "array '%s'; tandem refuses to guess which one is meant: write the "
                          "archive again with np.savez, one array per name",
                          path, a->name, k[i - 1].index, b->name, k[i].index, k[i].key);
    }
    for (int i = 0; i < n; i++) free(k[i].key);
    free(k);
    return rc;
}

static td_status zip_read_dir(const char *path, int fd, uint64_t flen, zip_dir *dir) {
    td_status rc = TD_OK;
    uint8_t *tail = NULL, *cd = NULL;
    memset(dir, 0, sizeof *dir);
    /* the end-of-central-directory record: 22 bytes and a comment of at most 65535 */
    uint64_t tail_len = flen < 22 + 65535 ? flen : 22 + 65535;
    if (flen < 22) goto not_zip;
    tail = td_xmalloc((size_t)tail_len);
    if (td__pread_full(fd, tail, tail_len, flen - tail_len) != 0) {
        rc = td_error_errno(TD_ERR_IO, "cannot read NumPy archive %s", path);
        goto out;
    }
    int64_t at = -1;
    for (int64_t i = (int64_t)tail_len - 22; i >= 0; i--)
        if (le32(tail + i) == ZIP_EOCD_SIG && (uint64_t)i + 22 + le16(tail + i + 20) <= tail_len) {
            at = i;
            break;
        }
    if (at < 0) goto not_zip;
    const uint8_t *e = tail + at;
    uint64_t eocd = flen - tail_len + (uint64_t)at;
    uint64_t entries = le16(e + 10), cd_size = le32(e + 12), cd_off = le32(e + 16);
    uint64_t cd_limit = eocd; /* the central directory ends before the records that follow it */
    bool wants64 = le16(e + 4) == 0xffff || le16(e + 6) == 0xffff || entries == 0xffff ||
                   cd_size == 0xffffffffu || cd_off == 0xffffffffu;
    uint8_t loc[20], z64[56];
    if (eocd >= 20 && td__pread_full(fd, loc, 20, eocd - 20) == 0 &&
        le32(loc) == ZIP64_LOCATOR_SIG) {
        uint64_t z64_off = le64(loc + 8);
        if (z64_off > eocd - 20 || eocd - 20 - z64_off < 56 ||
            td__pread_full(fd, z64, 56, z64_off) != 0 || le32(z64) != ZIP64_EOCD_SIG) {
            rc = td_error(TD_ERR_FORMAT,
                          "NumPy archive %s: its ZIP64 locator points to no ZIP64 end record; "
                          "the archive is damaged, write it again",
                          path);
            goto out;
        }
        if (le32(z64 + 16) != 0 || le32(z64 + 20) != 0) goto multi_disk;
        entries = le64(z64 + 32);
        cd_size = le64(z64 + 40);
        cd_off = le64(z64 + 48);
        cd_limit = z64_off;
    } else if (wants64) {
        rc = td_error(TD_ERR_FORMAT,
                      "NumPy archive %s: its end record defers to a ZIP64 record that is not "
                      "there; the archive is damaged or truncated, write it again",
                      path);
        goto out;
    } else if (le16(e + 4) != 0 || le16(e + 6) != 0) {
        goto multi_disk;
    }
    if (cd_off > cd_limit || cd_size > cd_limit - cd_off || entries > cd_size / 46) {
        rc = td_error(TD_ERR_FORMAT,
                      "NumPy archive %s: its central directory (%llu entries, %llu bytes at "
                      "offset %llu) does not fit before its end record at %llu; the archive is "
                      "damaged or truncated, write it again",
                      path, (unsigned long long)entries, (unsigned long long)cd_size,
                      (unsigned long long)cd_off, (unsigned long long)cd_limit);
        goto out;
    }
    cd = td_xmalloc(cd_size ? (size_t)cd_size : 1);
    if (td__pread_full(fd, cd, cd_size, cd_off) != 0) {
        rc = td_error_errno(TD_ERR_IO, "cannot read NumPy archive %s's central directory", path);
        goto out;
    }
    dir->m = td_xcalloc(entries ? (size_t)entries : 1, sizeof *dir->m);
    uint64_t p = 0;
    for (uint64_t k = 0; k < entries; k++) {
        const uint8_t *c = cd + p;
        if (cd_size - p < 46 || le32(c) != ZIP_CENTRAL_SIG) {
            rc = td_error(TD_ERR_FORMAT,
                          "NumPy archive %s: central directory entry %llu is damaged (no "
                          "signature at offset %llu); write the archive again",
                          path, (unsigned long long)k, (unsigned long long)(cd_off + p));
            goto out;
        }
        uint32_t nlen = le16(c + 28), xlen = le16(c + 30), clen = le16(c + 32);
        if (cd_size - p - 46 < (uint64_t)nlen + xlen + clen) {
            rc = td_error(TD_ERR_FORMAT,
                          "NumPy archive %s: central directory entry %llu runs past the "
                          "directory's end; write the archive again",
                          path, (unsigned long long)k);
            goto out;
        }
        zip_member *m = &dir->m[dir->count];
        m->flags = le16(c + 8);
        m->method = le16(c + 10);
        m->crc = le32(c + 16);
        m->csize = le32(c + 20);
        m->usize = le32(c + 24);
        m->local_offset = le32(c + 42);
        m->name = td_xmalloc(nlen + 1);
        memcpy(m->name, c + 46, nlen);
        m->name[nlen] = '\0';
        m->name_len = nlen;
        dir->count++;
        if (!zip64_extra(c + 46 + nlen, xlen, m, m->usize == 0xffffffffu, m->csize == 0xffffffffu,
                         m->local_offset == 0xffffffffu)) {
            rc = td_error(TD_ERR_FORMAT,
                          "NumPy archive %s: member '%s' lacks the ZIP64 sizes its entry defers "
                          "to; write the archive again",
                          path, m->name);
            goto out;
        }
        p += 46 + (uint64_t)nlen + xlen + clen;
    }
    rc = zip_refuse_duplicates(path, dir);
    goto out;
multi_disk:
    rc =
        td_error(TD_ERR_UNSUPPORTED,
                 "NumPy archive %s spans several disks (a split zip); join it into one file", path);
    goto out;
not_zip:
    rc = td_error(TD_ERR_FORMAT,
                  "%s is not a NumPy .npz archive (no zip end-of-central-directory record); write "
                  "it with np.savez or np.savez_compressed, or read a .npy with td_npy_read",
                  path);
out:
    free(tail);
    free(cd);
    if (rc != TD_OK) zip_dir_free(dir);
    return rc;
}

/* Inflates member m (raw deflate at data_off): *out gets exactly m->usize bytes, *info the .npy
 * header parsed from them. The central directory's usize is a claim, not a fact: the buffer
 * starts small and doubles only as output actually arrives, and the .npy header is checked
 * against usize as soon as it has been inflated, so a small archive that promises a gigabyte
 * costs an error after a few kilobytes, not a gigabyte's allocation. */
static td_status inflate_member(const char *where, int fd, const zip_member *m, uint64_t data_off,
                                uint8_t **out, npy_info *info) {
    td_status rc = TD_OK;
    *out = NULL;
    if (m->usize > m->csize * DEFLATE_MAX_RATIO + 1024)
        return td_error(TD_ERR_FORMAT,
                        "%s: claims to inflate %llu bytes to %llu, beyond deflate's ratio; the "
                        "archive is damaged, write it again",
                        where, (unsigned long long)m->csize, (unsigned long long)m->usize);
    if (m->usize > SIZE_MAX) {
        alloc_data(where, m->usize); /* sets the error */
        return TD_ERR_NOMEM;
    }
    uint64_t cap = m->usize < INFLATE_FIRST_CHUNK ? m->usize : INFLATE_FIRST_CHUNK;
    uint8_t *dst = alloc_data(where, cap);
    if (!dst) return TD_ERR_NOMEM;
    uint8_t *in = td_xmalloc(ZIP_READ_CHUNK);
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, -15) != Z_OK) {
        free(in);
        free(dst);
        return td_error(TD_ERR_NOMEM, "%s: zlib could not start inflating", where);
    }
    uint64_t in_done = 0, out_done = 0, header_end = 0;
    bool have_header = false;
    int zr;
    for (;;) {
        if (zs.avail_in == 0 && in_done < m->csize) {
            uint64_t n = m->csize - in_done < ZIP_READ_CHUNK ? m->csize - in_done : ZIP_READ_CHUNK;
            if (td__pread_full(fd, in, n, data_off + in_done) != 0) {
                rc = read_error(where, n, data_off + in_done);
                goto out;
            }
            in_done += n;
            zs.next_in = in;
            zs.avail_in = (uInt)n;
        }
        if (out_done == cap && cap < m->usize) { /* full, and real output asks for more */
            uint64_t grown = cap * 2 < m->usize ? cap * 2 : m->usize;
            uint8_t *p = realloc(dst, (size_t)grown);
            if (!p) {
                rc = td_error(TD_ERR_NOMEM,
                              "%s: cannot allocate %llu bytes to inflate it into; free memory",
                              where, (unsigned long long)grown);
                goto out;
            }
            dst = p;
            cap = grown;
        }
        uint64_t room = cap - out_done;
        uint8_t spare; /* output past the stated size lands here, and is an error */
        zs.next_out = room ? dst + out_done : &spare;
        zs.avail_out = room == 0 ? 1 : room > (1u << 30) ? (1u << 30) : (uInt)room;
        uInt before = zs.avail_out;
        zr = inflate(&zs, Z_NO_FLUSH);
        if (room == 0 && zs.avail_out == 0) {
            rc = td_error(TD_ERR_FORMAT,
                          "%s: inflates to more than the %llu bytes the archive says; the "
                          "archive is damaged, write it again",
                          where, (unsigned long long)m->usize);
            goto out;
        }
        if (room) out_done += before - zs.avail_out;
        /* the .npy header, checked against the directory's size before the buffer grows for
         * elements that may never come */
        if (!header_end && out_done >= (m->usize < 12 ? m->usize : 12))
            TD_CHECK_GOTO(npy_preamble(where, dst, m->usize, &header_end), rc, out);
        if (header_end && !have_header && out_done >= header_end) {
            TD_CHECK_GOTO(npy_header(where, dst, header_end, m->usize, true, info), rc, out);
            have_header = true;
        }
        if (zr == Z_STREAM_END) break;
        /* no progress possible: the input is used up (a cut-off stream) */
        if (zr == Z_BUF_ERROR && zs.avail_in == 0 && in_done == m->csize) break;
        if (zr != Z_OK && zr != Z_BUF_ERROR) {
            rc = td_error(TD_ERR_FORMAT,
                          "%s: its deflate stream is damaged (zlib: %s); write the archive again",
                          where, zs.msg ? zs.msg : "error");
            goto out;
        }
    }
    if (zr != Z_STREAM_END || out_done != m->usize || !have_header) {
        rc = td_error(TD_ERR_FORMAT,
                      "%s: its deflate stream %s after %llu of the %llu bytes the archive says; "
                      "the archive is damaged or truncated, write it again",
                      where, zr == Z_STREAM_END ? "ends" : "is cut off",
                      (unsigned long long)out_done, (unsigned long long)m->usize);
        goto out;
    }
    uint32_t c = (uint32_t)crc32_z(0, dst, (z_size_t)m->usize);
    if (c != m->crc) {
        rc = td_error(TD_ERR_FORMAT,
                      "%s: CRC-32 mismatch (0x%08x, the archive says 0x%08x); the archive is "
                      "damaged, write it again",
                      where, c, m->crc);
        goto out;
    }
    *out = dst;
    dst = NULL;
out:
    inflateEnd(&zs);
    free(in);
    free(dst);
    return rc;
}

static td_status read_member(const char *path, int fd, uint64_t flen, const zip_member *m,
                             bool file_backed_ok, td_array *out) {
    td_status rc = TD_OK;
    char *where = td_xasprintf("NumPy archive %s, member %s", path, m->name);
    uint8_t lh[30], *buf = NULL;
    char *lname = NULL;
    if (m->flags & 1) {
        rc = td_error(TD_ERR_UNSUPPORTED, "%s is encrypted; write the archive without a password",
                      where);
        goto out;
    }
    if (m->method != 0 && m->method != 8) {
        rc = td_error(TD_ERR_UNSUPPORTED,
                      "%s uses zip compression method %u; tandem reads stored (np.savez) and "
                      "deflated (np.savez_compressed) members",
                      where, m->method);
        goto out;
    }
    if (m->local_offset > flen || flen - m->local_offset < 30 ||
        td__pread_full(fd, lh, 30, m->local_offset) != 0 || le32(lh) != ZIP_LOCAL_SIG) {
        rc = td_error(TD_ERR_FORMAT,
                      "%s: no local header at offset %llu; the archive is damaged, write it again",
                      where, (unsigned long long)m->local_offset);
        goto out;
    }
    /* zipfile (np.load) refuses a local header whose name is not the directory's; so does this,
     * so that two directory entries cannot smuggle different data under one name */
    uint32_t lnlen = le16(lh + 26);
    if (lnlen != m->name_len || flen - m->local_offset - 30 < lnlen) {
        rc = td_error(TD_ERR_FORMAT,
                      "%s: its local header names a %u-byte file, the central directory a %u-byte "
                      "one; the archive is damaged, write it again",
                      where, lnlen, m->name_len);
        goto out;
    }
    lname = td_xmalloc(lnlen ? lnlen : 1);
    if (td__pread_full(fd, lname, lnlen, m->local_offset + 30) != 0 ||
        memcmp(lname, m->name, lnlen) != 0) {
        rc = td_error(TD_ERR_FORMAT,
                      "%s: its local header at offset %llu names another file than the central "
                      "directory; the archive is damaged, write it again",
                      where, (unsigned long long)m->local_offset);
        goto out;
    }
    uint64_t data_off = m->local_offset + 30 + lnlen + le16(lh + 28);
    if (data_off > flen || m->csize > flen - data_off) {
        rc = td_error(TD_ERR_FORMAT,
                      "%s: its %llu bytes at offset %llu run past the archive's end (%llu "
                      "bytes); the archive is truncated, write it again",
                      where, (unsigned long long)m->csize, (unsigned long long)data_off,
                      (unsigned long long)flen);
        goto out;
    }
    if (m->method == 0) {
        if (m->csize != m->usize) {
            rc = td_error(TD_ERR_FORMAT,
                          "%s is stored but its sizes differ (%llu and %llu); the archive is "
                          "damaged, write it again",
                          where, (unsigned long long)m->csize, (unsigned long long)m->usize);
            goto out;
        }
        rc = npy_from_file(path, where, fd, data_off, m->usize, file_backed_ok, &m->crc, out);
        goto out;
    }
    npy_info info;
    TD_CHECK_GOTO(inflate_member(where, fd, m, data_off, &buf, &info), rc, out);
    fill_array(out, &info);
    /* the elements to the front, and the header's bytes given back */
    memmove(buf, buf + info.header_bytes, (size_t)info.nbytes);
    uint8_t *shrunk = realloc(buf, info.nbytes ? (size_t)info.nbytes : 1);
    out->data = shrunk ? shrunk : buf;
    buf = NULL;
out:
    free(buf);
    free(lname);
    free(where);
    if (rc != TD_OK) td_array_free(out);
    return rc;
}

td_status td_npz_read(const char *path, const char *name, bool file_backed_ok, td_array *out) {
    memset(out, 0, sizeof *out);
    int fd;
    uint64_t flen;
    TD_CHECK(td__file_open(path, "NumPy archive", &fd, &flen));
    zip_dir dir;
    td_status rc = zip_read_dir(path, fd, flen, &dir);
    if (rc != TD_OK) {
        close(fd);
        return rc;
    }
    int found = -1;
    for (int i = 0; i < dir.count && found < 0; i++) {
        if (is_dir_entry(&dir.m[i])) continue;
        char *key = member_key(dir.m[i].name);
        if (strcmp(key, name) == 0 || strcmp(dir.m[i].name, name) == 0) found = i;
        free(key);
    }
    if (found >= 0) {
        rc = read_member(path, fd, flen, &dir.m[found], file_backed_ok, out);
    } else {
        char list[400];
        size_t len = 0;
        list[0] = '\0';
        for (int i = 0; i < dir.count && len + 1 < sizeof list; i++) {
            if (is_dir_entry(&dir.m[i])) continue;
            char *key = member_key(dir.m[i].name);
            len += (size_t)snprintf(list + len, sizeof list - len, "%s'%s'", len ? ", " : "", key);
            free(key);
        }
        rc = td_error(TD_ERR_NOTFOUND, "NumPy archive %s has no array '%s'; it holds %s", path,
                      name, len ? list : "no arrays");
    }
    zip_dir_free(&dir);
    close(fd);
    return rc;
}

td_status td_npz_list(const char *path, char ***names, int *count) {
    *names = NULL;
    *count = 0;
    int fd;
    uint64_t flen;
    TD_CHECK(td__file_open(path, "NumPy archive", &fd, &flen));
    zip_dir dir;
    td_status rc = zip_read_dir(path, fd, flen, &dir);
    close(fd);
    if (rc != TD_OK) return rc;
    char **out = td_xcalloc((size_t)dir.count + 1, sizeof *out);
    int n = 0;
    for (int i = 0; i < dir.count; i++)
        if (!is_dir_entry(&dir.m[i])) out[n++] = member_key(dir.m[i].name);
    zip_dir_free(&dir);
    *names = out;
    *count = n;
    return TD_OK;
}
