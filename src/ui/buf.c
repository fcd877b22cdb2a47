/* Text helpers of the ui layer: a growable buffer with JSON numbers written the shortest way
 * that reads back exactly (series and event payloads are built by hand: a million-point chart
 * should not pay for a JSON tree), valid-UTF-8 strings from arbitrary bytes (logs), and URL
 * segments; and reading a growing file at an offset. */
#include "ui_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int td__ui_pread_all(int fd, char *buf, size_t n, int64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, buf + got, n - got, (off_t)(off + (int64_t)got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

json_t *td__ui_json_text(const char *text, size_t nbytes) {
    /* Valid UTF-8 goes through as is; anything else is copied with each bad byte replaced. */
    json_t *s = json_stringn(text, nbytes);
    if (s) return s;
    char *out = td_xmalloc(nbytes * 3 + 1);
    size_t j = 0;
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < nbytes;) {
        unsigned c = p[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + len <= nbytes && c != 0;
        for (size_t k = 1; ok && k < len; k++) ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && len > 1) { /* reject overlong forms and surrogates, as jansson does */
            uint32_t cp = len == 2 ? ((c & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu)
                          : len == 3
                              ? ((c & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu)
                              : ((c & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) |
                                    ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu);
            ok = (len == 2 && cp >= 0x80) ||
                 (len == 3 && cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) ||
                 (len == 4 && cp >= 0x10000 && cp <= 0x10FFFF);
        }
        if (ok) {
            memcpy(out + j, p + i, len);
            j += len;
            i += len;
        } else {
            memcpy(out + j, "\xEF\xBF\xBD", 3); /* U+FFFD */
            j += 3;
            i++;
        }
    }
    s = json_stringn(out, j);
    free(out);
    return s ? s : json_string("");
}

char *td__ui_url_segment(const char *s) {
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s);
    char *out = td_xmalloc(3 * n + 1), *o = out;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '-' || *p == '_' || *p == '.' || *p == '~') {
            *o++ = (char)*p;
        } else {
            *o++ = '%';
            *o++ = hex[*p >> 4];
            *o++ = hex[*p & 15];
        }
    }
    *o = '\0';
    return out;
}

void td__ui_buf_put(td__ui_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        while (b->n + n + 1 > b->cap) b->cap = b->cap ? 2 * b->cap : 4096;
        b->p = td_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void td__ui_buf_str(td__ui_buf *b, const char *s) {
    td__ui_buf_put(b, s, strlen(s));
}

void td__ui_buf_num(td__ui_buf *b, double v) {
    char t[40];
    if (!isfinite(v)) {
        td__ui_buf_str(b, "null");
        return;
    }
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        snprintf(t, sizeof t, "%.0f", v == 0 ? 0.0 : v); /* no "-0" */
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(t, sizeof t, "%.*g", prec, v);
            if (strtod(t, NULL) == v) break;
        }
    }
    td__ui_buf_str(b, t);
}

void td__ui_buf_json(td__ui_buf *b, json_t *v) {
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(v);
    td__ui_buf_str(b, t ? t : "null");
    free(t);
}
