/* CSV reader: the whole file is read in one go and tokenised in place (a quoted field's ""
 * collapses to " inside the buffer, each field is NUL-terminated where its delimiter was), so a
 * 100 MB file costs one buffer and no per-field allocation.
 *
 * Rules (docs/data-formats.md): RFC 4180 quotes, CRLF or LF (a lone CR ends a line too), a UTF-8
 * byte-order mark skipped, blank lines skipped. The first row is a header when one of its fields
 * is not a number where the second row's field in that column is (or, with no second row, when
 * all of them are not numbers), or when the target is given by a name the first row holds.
 * Numbers go through strtod in the C locale tandem runs in. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/array.h"

typedef struct {
    char *p, *end;
    uint64_t line; /* the physical line p is on, 1-based */
} tokenizer;

typedef struct {
    char **f; /* NUL-terminated fields, in the buffer */
    int n, cap;
    uint64_t line; /* where the row starts */
} row;

/* The next field from t into f. Returns 1 when it ends the row, 0 when more follow, -1 for an
 * unterminated quote. */
static int next_field(tokenizer *t, char **f) {
    char *s = t->p, *w = s;
    *f = s;
    int last = 1;
    if (s < t->end && *s == '"') {
        /* quoted: "" is one quote; newlines inside are part of the value */
        s++;
        for (;;) {
            if (s >= t->end) return -1;
            char c = *s++;
            if (c == '"') {
                if (s < t->end && *s == '"') {
                    *w++ = '"';
                    s++;
                    continue;
                }
                break;
            }
            if (c == '\n') t->line++;
            *w++ = c;
        }
    }
    /* unquoted, or what follows a closing quote (kept, as Python's csv module does) */
    for (;;) {
        if (s >= t->end) break;
        char c = *s;
        if (c == ',') {
            s++;
            last = 0;
            break;
        }
        if (c == '\n' || c == '\r') {
            s++;
            if (c == '\r' && s < t->end && *s == '\n') s++;
            t->line++;
            break;
        }
        *w++ = c;
        s++;
    }
    *w = '\0'; /* w is at most where the delimiter was, or the spare byte after the buffer */
    t->p = s;
    return last;
}

/* The next non-blank row, or 0 at the end of the file; -1 for an unterminated quote. */
static int next_row(tokenizer *t, row *r) {
    for (;;) {
        if (t->p >= t->end) return 0;
        r->n = 0;
        r->line = t->line;
        bool blank = *t->p == '\n' || *t->p == '\r';
        int end;
        do {
            char *f;
            end = next_field(t, &f);
            if (end < 0) return -1;
            if (r->n == r->cap) {
                r->cap = r->cap ? r->cap * 2 : 16;
                r->f = td_xrealloc(r->f, (size_t)r->cap * sizeof *r->f);
            }
            r->f[r->n++] = f;
        } while (end == 0);
        if (!blank) return 1;
    }
}

static void row_copy(row *dst, const row *src) {
    dst->n = src->n;
    dst->line = src->line;
    dst->cap = src->n;
    dst->f = td_xmalloc((size_t)(src->n ? src->n : 1) * sizeof *dst->f);
    memcpy(dst->f, src->f, (size_t)src->n * sizeof *dst->f);
}

/* Clinger's fast path: [-+]digits[.digits][e[-+]digits] with at most 19 significant digits
 * whose value is m * 10^e with m < 2^53 and |e| <= 22 is one correctly rounded IEEE operation,
 * so it equals strtod's result exactly, several times faster. Returns false for anything else,
 * which strtod then parses. */
static bool parse_simple(const char *s, double *v) {
    static const double pow10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                     1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                     1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    while (*s == ' ' || *s == '\t') s++;
    bool neg = *s == '-';
    if (*s == '-' || *s == '+') s++;
    uint64_t m = 0;
    int digits = 0, exp10 = 0;
    const char *start = s;
    while (*s >= '0' && *s <= '9') {
        if (digits < 19)
            m = m * 10 + (uint64_t)(*s - '0');
        else
            exp10++;
        if (m) digits++;
        s++;
    }
    bool any = s != start;
    if (*s == '.') {
        s++;
        const char *f = s;
        while (*s >= '0' && *s <= '9') {
            if (digits < 19) {
                m = m * 10 + (uint64_t)(*s - '0');
                exp10--;
                if (m) digits++;
            }
            s++;
        }
        any = any || s != f;
    }
    if (!any) return false;
    if (*s == 'e' || *s == 'E') {
        s++;
        bool eneg = *s == '-';
        if (*s == '-' || *s == '+') s++;
        if (*s < '0' || *s > '9') return false;
        int e = 0;
        while (*s >= '0' && *s <= '9') {
            if (e > 1000) return false;
            e = e * 10 + (*s++ - '0');
        }
        exp10 += eneg ? -e : e;
    }
    while (*s == ' ' || *s == '\t') s++;
    if (*s != '\0' || digits >= 19 || m >= ((uint64_t)1 << 53) || exp10 < -22 || exp10 > 22)
        return false;
    double d = (double)m;
    d = exp10 < 0 ? d / pow10[-exp10] : d * pow10[exp10];
    *v = neg ? -d : d;
    return true;
}

/* A finite number with nothing but spaces around it. */
static bool parse_number(const char *s, double *v) {
    if (parse_simple(s, v)) return true;
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    if (end == s) return false;
    while (*end == ' ' || *end == '\t') end++;
    return *end == '\0';
}

static bool is_number(const char *s) {
    double v;
    return parse_number(s, &v) && isfinite(v);
}

static char *trimmed(const char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    char *o = td_xmalloc(n + 1);
    memcpy(o, s, n);
    o[n] = '\0';
    return o;
}

/* A value for an error message: at most 40 bytes, quoted. */
static const char *shown(const char *s, char *buf, size_t cap) {
    snprintf(buf, cap, "'%.40s%s'", s, strlen(s) > 40 ? "..." : "");
    return buf;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct {
    const char *path;
    td_csv *out;
    int ncols, tcol;
    uint64_t cap_rows;
    char **tvals; /* [rows] the target fields, in the buffer */
} reader;

/* Appends one data row: features converted, the target kept as text until all are seen. */
static td_status add_row(reader *rd, const row *r) {
    td_csv *c = rd->out;
    char b[64];
    if (r->n != rd->ncols)
        return td_error(TD_ERR_FORMAT,
                        "%s:%llu: %d fields, but the first row has %d; every row needs the same "
                        "number (a value containing a comma must be in double quotes)",
                        rd->path, (unsigned long long)r->line, r->n, rd->ncols);
    if (c->rows == rd->cap_rows) {
        rd->cap_rows = rd->cap_rows ? rd->cap_rows * 2 : 1024;
        c->features = td_xrealloc(c->features, rd->cap_rows * (size_t)c->cols * sizeof(float));
        rd->tvals = td_xrealloc(rd->tvals, rd->cap_rows * sizeof *rd->tvals);
        c->lines = td_xrealloc(c->lines, rd->cap_rows * sizeof *c->lines);
    }
    float *x = c->features + c->rows * (uint64_t)c->cols;
    int k = 0;
    for (int j = 0; j < r->n; j++) {
        if (j == rd->tcol) continue;
        const char *s = r->f[j];
        double v;
        const char *name = c->feature_names[k];
        if (!parse_number(s, &v)) {
            const char *p = s;
            while (*p == ' ' || *p == '\t') p++;
            if (*p == '\0')
                return td_error(TD_ERR_FORMAT,
                                "%s:%llu: column %s is empty; fill in the missing value or drop "
                                "the row (pandas: df.dropna())",
                                rd->path, (unsigned long long)r->line, name);
            return td_error(TD_ERR_FORMAT,
                            "%s:%llu: column %s: %s is not a number; every feature column must "
                            "be numeric: encode it (e.g. one-hot with pd.get_dummies), drop the "
                            "column, or make it the target",
                            rd->path, (unsigned long long)r->line, name, shown(s, b, sizeof b));
        }
        if (!isfinite(v))
            return td_error(TD_ERR_FORMAT,
                            "%s:%llu: column %s is %s; fill in the missing value or drop the row "
                            "(pandas: df.dropna())",
                            rd->path, (unsigned long long)r->line, name, shown(s, b, sizeof b));
        if (fabs(v) > FLT_MAX)
            return td_error(TD_ERR_FORMAT,
                            "%s:%llu: column %s: %s is beyond float32's range (3.4e38); scale the "
                            "column down",
                            rd->path, (unsigned long long)r->line, name, shown(s, b, sizeof b));
        x[k++] = (float)v;
    }
    const char *t = r->f[rd->tcol];
    const char *p = t;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '\0')
        return td_error(TD_ERR_FORMAT,
                        "%s:%llu: the target column %s is empty; fill it in or drop the row",
                        rd->path, (unsigned long long)r->line, c->target_name);
    double v;
    if (parse_number(t, &v) && !isfinite(v))
        return td_error(TD_ERR_FORMAT,
                        "%s:%llu: the target column %s is %s; drop the row (pandas: df.dropna())",
                        rd->path, (unsigned long long)r->line, c->target_name,
                        shown(t, b, sizeof b));
    c->lines[c->rows] = r->line;
    rd->tvals[c->rows++] = (char *)t;
    return TD_OK;
}

/* All numbers: the values; otherwise every value is a class name. */
static void finish_target(reader *rd) {
    td_csv *c = rd->out;
    c->target = td_xmalloc((c->rows ? c->rows : 1) * sizeof *c->target);
    bool numeric = true;
    for (uint64_t i = 0; i < c->rows && numeric; i++)
        numeric = parse_number(rd->tvals[i], &c->target[i]);
    if (numeric) return;
    char **sorted = td_xmalloc(c->rows * sizeof *sorted);
    memcpy(sorted, rd->tvals, c->rows * sizeof *sorted);
    qsort(sorted, c->rows, sizeof *sorted, cmp_str);
    uint64_t n = 0;
    for (uint64_t i = 0; i < c->rows; i++)
        if (n == 0 || strcmp(sorted[n - 1], sorted[i]) != 0) sorted[n++] = sorted[i];
    c->num_class_names = (int)n;
    c->class_names = td_xmalloc(n * sizeof *c->class_names);
    for (uint64_t i = 0; i < n; i++) c->class_names[i] = td_xstrdup(sorted[i]);
    for (uint64_t i = 0; i < c->rows; i++) {
        char **hit = bsearch(&rd->tvals[i], sorted, n, sizeof *sorted, cmp_str);
        c->target[i] = (double)(hit - sorted);
    }
    free(sorted);
}

static td_status read_file(const char *path, char **buf, size_t *len) {
    int fd;
    uint64_t n;
    struct stat sb; /* before opening: opening a FIFO for reading waits for a writer */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode))
        return td_error(TD_ERR_INVALID,
                        "CSV file %s is not a regular file (a FIFO, device or socket); save the "
                        "data to a file and give that",
                        path);
    TD_CHECK(td__file_open(path, "CSV file", &fd, &n));
    char *b = n + 1 <= SIZE_MAX ? malloc((size_t)n + 1) : NULL;
    if (!b) {
        close(fd);
        return td_error(TD_ERR_NOMEM, "CSV file %s: cannot allocate %llu bytes to read it", path,
                        (unsigned long long)n);
    }
    if (td__pread_full(fd, b, n, 0) != 0) {
        td_status rc = errno ? td_error_errno(TD_ERR_IO, "cannot read CSV file %s", path)
                             : td_error(TD_ERR_IO, "CSV file %s shrank while being read", path);
        free(b);
        close(fd);
        return rc;
    }
    close(fd);
    b[n] = '\0';
    *buf = b;
    *len = (size_t)n;
    return TD_OK;
}

/* A NUL byte would end the field it is in (fields are NUL-terminated in place), cutting a value
 * or merging two class names: refused, as Python's csv module refuses it ("line contains NUL").
 * Lines are counted as the tokenizer counts them outside quotes. */
static td_status refuse_nul(const char *path, const char *buf, size_t len) {
    const char *nul = memchr(buf, '\0', len);
    if (!nul) return TD_OK;
    uint64_t line = 1;
    const char *start = buf;
    for (const char *p = buf; p < nul; p++)
        if (*p == '\n' || (*p == '\r' && p[1] != '\n')) /* p[1] is at most the NUL */
            line++, start = p + 1;
    return td_error(TD_ERR_FORMAT,
                    "%s:%llu:%llu: a NUL byte; a CSV file is text (one saved as UTF-16 has a NUL "
                    "in every other byte: save it as UTF-8)",
                    path, (unsigned long long)line, (unsigned long long)(nul - start + 1));
}

td_status td_csv_read(const char *path, const char *target, td_csv *out) {
    memset(out, 0, sizeof *out);
    char *buf = NULL;
    size_t len = 0;
    TD_CHECK(read_file(path, &buf, &len));
    td_status rc = TD_OK;
    reader rd = {.path = path, .out = out};
    row r0 = {0}, r1 = {0}, r = {0};
    tokenizer t = {buf, buf + len, 1};
    TD_CHECK_GOTO(refuse_nul(path, buf, len), rc, out);
    if (len >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0) t.p += 3;
    int got = next_row(&t, &r);
    if (got == 0) {
        rc = td_error(TD_ERR_FORMAT, "CSV file %s has no rows; it is empty", path);
        goto out;
    }
    if (got < 0) goto unterminated;
    row_copy(&r0, &r);
    got = next_row(&t, &r);
    if (got < 0) goto unterminated;
    bool have_r1 = got > 0;
    if (have_r1) row_copy(&r1, &r);
    rd.ncols = r0.n;

    /* a header: a name above a number, or (one row) names only */
    bool header = false;
    if (have_r1) {
        for (int j = 0; j < r0.n && j < r1.n && !header; j++)
            header = r0.f[j][0] && !is_number(r0.f[j]) && is_number(r1.f[j]);
    } else {
        header = true;
        for (int j = 0; j < r0.n; j++) header = header && r0.f[j][0] && !is_number(r0.f[j]);
    }
    /* the target column: a header name first, then a 0-based index, NULL the last */
    rd.tcol = -1;
    if (target) {
        char *want = trimmed(target);
        for (int j = 0; j < r0.n && rd.tcol < 0 && (header || !is_number(want)); j++) {
            char *h = trimmed(r0.f[j]);
            if (strcmp(h, want) == 0) rd.tcol = j, header = true;
            free(h);
        }
        free(want);
        if (rd.tcol < 0) {
            char *end;
            long v = strtol(target, &end, 10);
            bool index = *target >= '0' && *target <= '9' && *end == '\0';
            if (!index || v >= rd.ncols) {
                char names[300];
                size_t n = 0;
                names[0] = '\0';
                for (int j = 0; header && j < r0.n && n + 1 < sizeof names; j++)
                    n += (size_t)snprintf(names + n, sizeof names - n, "%s'%s'", j ? ", " : "",
                                          r0.f[j]);
                if (index)
                    rc = td_error(TD_ERR_INVALID,
                                  "CSV file %s: target column %ld does not exist; it has %d "
                                  "columns (0 to %d)",
                                  path, v, rd.ncols, rd.ncols - 1);
                else if (header)
                    rc = td_error(TD_ERR_INVALID,
                                  "CSV file %s has no column named '%s'; its header has %s", path,
                                  target, names);
                else
                    rc = td_error(TD_ERR_INVALID,
                                  "CSV file %s has no header row, so there is no column named "
                                  "'%s'; give the target as a 0-based column index",
                                  path, target);
                goto out;
            }
            rd.tcol = (int)v;
        }
    } else {
        rd.tcol = rd.ncols - 1;
    }
    if (rd.ncols < 2) {
        rc = td_error(TD_ERR_FORMAT,
                      "CSV file %s has one column; it needs at least one feature column besides "
                      "the target",
                      path);
        goto out;
    }
    out->cols = rd.ncols - 1;
    out->feature_names = td_xcalloc((size_t)out->cols, sizeof *out->feature_names);
    for (int j = 0, k = 0; j < rd.ncols; j++) {
        char *name = header ? trimmed(r0.f[j]) : NULL;
        if (!name || !*name) {
            free(name);
            name = td_xasprintf("column %d", j);
        }
        if (j == rd.tcol)
            out->target_name = name;
        else
            out->feature_names[k++] = name;
    }
    if (!header) TD_CHECK_GOTO(add_row(&rd, &r0), rc, out);
    if (have_r1) TD_CHECK_GOTO(add_row(&rd, &r1), rc, out);
    while ((got = next_row(&t, &r)) > 0) TD_CHECK_GOTO(add_row(&rd, &r), rc, out);
    if (got < 0) goto unterminated;
    if (out->rows == 0) {
        rc = td_error(TD_ERR_FORMAT, "CSV file %s has a header but no data rows", path);
        goto out;
    }
    finish_target(&rd);
    goto out;
unterminated:
    rc =
        td_error(TD_ERR_FORMAT,
                 "%s:%llu: a quoted field in the row that starts on this line is never closed; add "
                 "the closing double quote (a quote inside a value is written \"\")",
                 path, (unsigned long long)r.line);
out:
    free(r0.f);
    free(r1.f);
    free(r.f);
    free(rd.tvals);
    free(buf);
    if (rc != TD_OK) td_csv_free(out);
    return rc;
}

void td_csv_free(td_csv *c) {
    if (!c) return;
    free(c->features);
    if (c->feature_names)
        for (int i = 0; i < c->cols; i++) free(c->feature_names[i]);
    free(c->feature_names);
    free(c->target_name);
    free(c->target);
    for (int i = 0; i < c->num_class_names; i++) free(c->class_names[i]);
    free(c->class_names);
    free(c->lines);
    memset(c, 0, sizeof *c);
}
