/* The JSON Lines writer: see jsonl.h. */
#include "track/jsonl.h"

#include <inttypes.h>
#include <jansson.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void td_jsonl_begin(td_jsonl *j) {
    j->line[0] = '{';
    j->len = 1;
    j->nfields = 0;
    j->overflow = 0;
    j->bad_utf8 = NULL;
}

static size_t room(const td_jsonl *j) {
    return sizeof j->line - j->len;
}

static void put(td_jsonl *j, const char *s, size_t n) {
    if (j->overflow || n > room(j)) {
        j->overflow = 1;
        return;
    }
    memcpy(j->line + j->len, s, n);
    j->len += n;
}

/* A JSON string. Printable ASCII other than '"' and '\\' is what every encoder copies as it is,
 * and nearly every key is only that: copied here without jansson's allocation. */
static void put_string(td_jsonl *j, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = 0;
    while (p[n] >= 0x20 && p[n] < 0x7f && p[n] != '"' && p[n] != '\\') n++;
    if (p[n] == '\0') {
        if (j->overflow || n + 2 > room(j)) {
            j->overflow = 1;
            return;
        }
        j->line[j->len] = '"';
        memcpy(j->line + j->len + 1, s, n);
        j->line[j->len + 1 + n] = '"';
        j->len += n + 2;
        return;
    }
    json_t *js = json_string(s); /* NULL: not UTF-8 */
    size_t need =
        js ? json_dumpb(js, j->line + j->len, j->overflow ? 0 : room(j), JSON_ENCODE_ANY) : 0;
    json_decref(js);
    if (!js || need == 0) {
        if (!j->bad_utf8) j->bad_utf8 = s;
        return;
    }
    if (j->overflow || need > room(j))
        j->overflow = 1;
    else
        j->len += need;
}

static void put_key(td_jsonl *j, const char *key) {
    if (j->nfields++) put(j, ", ", 2);
    put_string(j, key);
    put(j, ": ", 2);
}

void td_jsonl_int(td_jsonl *j, const char *key, int64_t value) {
    put_key(j, key);
    char num[24];
    int n = snprintf(num, sizeof num, "%" PRId64, value);
    put(j, num, (size_t)n);
}

/* %g writes the locale's decimal point: a process that set LC_NUMERIC to a comma locale would
 * write "0,5", which is no JSON number. Put a '.' in its place (as jansson's own dtostr does). */
static size_t fix_decimal_point(char *num, size_t n) {
    size_t i = 0;
    while (i < n && ((num[i] >= '0' && num[i] <= '9') || num[i] == '-' || num[i] == '+' ||
                     num[i] == '.' || num[i] == 'e'))
        i++;
    if (i == n) return n; /* only what a "C" locale writes: the common case */
    const char *point = localeconv()->decimal_point;
    size_t plen = point ? strlen(point) : 0;
    char *at = plen ? strstr(num, point) : NULL;
    if (!at) return n;
    *at = '.';
    memmove(at + 1, at + plen, n - (size_t)(at - num) - plen + 1);
    return n - plen + 1;
}

void td_jsonl_real(td_jsonl *j, const char *key, double value, int digits) {
    put_key(j, key);
    if (!isfinite(value)) {
        put(j, "null", 4);
        return;
    }
    char num[40];
    int n = snprintf(num, sizeof num, "%.*g", digits, value);
    put(j, num, fix_decimal_point(num, (size_t)n));
}

void td_jsonl_str(td_jsonl *j, const char *key, const char *value) {
    put_key(j, key);
    put_string(j, value);
}

/* s for an error message: printable ASCII as it is, any other byte as \xNN, at most 64 bytes of
 * s. */
static void printable(const char *s, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; s[i] && i < 64 && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f)
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    out[o] = '\0';
}

td_status td_jsonl_end(td_jsonl *j, const char **line, size_t *nbytes) {
    *line = NULL;
    *nbytes = 0;
    if (j->bad_utf8) {
        char shown[400];
        printable(j->bad_utf8, shown, sizeof shown);
        return td_error(TD_ERR_INVALID,
                        "\"%s\" is not UTF-8 text, which JSON lines must be; use UTF-8 for "
                        "metric names",
                        shown);
    }
    put(j, "}\n", 2);
    if (j->overflow)
        return td_error(TD_ERR_INVALID, "a JSON line is longer than %d bytes", TD_JSONL_MAX_BYTES);
    *line = j->line;
    *nbytes = j->len;
    return TD_OK;
}
