/* AWS Signature Version 4, computed here as a pure function of its inputs.
 *
 * Why not libcurl's CURLOPT_AWS_SIGV4: its canonical query and header handling has changed from
 * release to release (Debian 12 ships 7.88, whose S3 signing mishandles query strings without
 * '=' like "?uploads" and cannot sign a precomputed payload hash for a body read from a file),
 * and it cannot be unit-tested without a server. Signing here is ~150 lines over nettle's
 * SHA-256/HMAC (already a tandem dependency), testable against botocore's own signer with fixed
 * inputs (tests/cloud/test_sigv4.c), and the same code signs EC2 and S3. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nettle/hmac.h>
#include <nettle/sha2.h>

#include "cloud/cloud_internal.h"

static void hex(const uint8_t *d, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * n] = '\0';
}

void td_aws_sha256_hex(const void *buf, size_t nbytes, char hex_out[65]) {
    struct sha256_ctx ctx;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&ctx);
    sha256_update(&ctx, nbytes, buf);
    sha256_digest(&ctx, sizeof d, d);
    hex(d, sizeof d, hex_out);
}

td_status td_aws_sha256_file(const char *path, int64_t offset, int64_t nbytes, char hex_out[65]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return td_error_errno(TD_ERR_IO, "cannot open %s to hash it", path);
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    uint8_t *buf = td_xmalloc(1 << 20);
    int64_t done = 0;
    td_status st = TD_OK;
    while (nbytes < 0 || done < nbytes) {
        size_t want = 1 << 20;
        if (nbytes >= 0 && (int64_t)want > nbytes - done) want = (size_t)(nbytes - done);
        ssize_t got = pread(fd, buf, want, offset + done);
        if (got < 0) {
            if (errno == EINTR) continue;
            st = td_error_errno(TD_ERR_IO, "cannot read %s to hash it", path);
            break;
        }
        if (got == 0) {
            if (nbytes >= 0)
                st = td_error(TD_ERR_IO, "%s ended at byte %lld, expected %lld bytes from %lld",
                              path, (long long)(offset + done), (long long)nbytes,
                              (long long)offset);
            break;
        }
        sha256_update(&ctx, (size_t)got, buf);
        done += got;
    }
    free(buf);
    close(fd);
    if (st != TD_OK) return st;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(&ctx, sizeof d, d);
    hex(d, sizeof d, hex_out);
    return TD_OK;
}

static void hmac(const uint8_t *key, size_t keylen, const char *msg, size_t msglen,
                 uint8_t out[SHA256_DIGEST_SIZE]) {
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, keylen, key);
    hmac_sha256_update(&ctx, msglen, (const uint8_t *)msg);
    hmac_sha256_digest(&ctx, SHA256_DIGEST_SIZE, out);
}

char *td__uri_encode(const char *s, int keep_slash) {
    size_t n = strlen(s);
    char *out = td_xmalloc(3 * n + 1), *p = out;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/'))
            *p++ = (char)c;
        else
            p += sprintf(p, "%%%02X", c);
    }
    *p = '\0';
    return out;
}

void td__query_add(char **q, const char *key, const char *value) {
    char *k = td__uri_encode(key, 0), *v = td__uri_encode(value, 0);
    char *next = td_xasprintf("%s%s%s=%s", *q ? *q : "", *q && **q ? "&" : "", k, v);
    free(k);
    free(v);
    free(*q);
    *q = next;
}

void td__query_addf(char **q, const char *key, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    td__query_add(q, key, buf);
}

char *td__base64(const void *buf, size_t nbytes) {
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const uint8_t *s = buf;
    char *out = td_xmalloc(4 * ((nbytes + 2) / 3) + 1), *p = out;
    size_t i = 0;
    for (; i + 2 < nbytes; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        *p++ = tbl[v >> 18];
        *p++ = tbl[(v >> 12) & 63];
        *p++ = tbl[(v >> 6) & 63];
        *p++ = tbl[v & 63];
    }
    if (i < nbytes) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < nbytes ? (uint32_t)s[i + 1] << 8 : 0);
        *p++ = tbl[v >> 18];
        *p++ = tbl[(v >> 12) & 63];
        *p++ = i + 1 < nbytes ? tbl[(v >> 6) & 63] : '=';
        *p++ = '=';
    }
    *p = '\0';
    return out;
}

/* ---- the canonical request ---- */

typedef struct {
    char *name;  /* lowercase */
    char *value; /* trimmed, inner runs of spaces collapsed */
} canon_header;

static int cmp_header(const void *a, const void *b) {
    return strcmp(((const canon_header *)a)->name, ((const canon_header *)b)->name);
}

typedef struct {
    const char *s;
    size_t klen; /* bytes of the key */
    size_t len;  /* bytes of the whole pair */
} qpair;

static int cmp_qpair(const void *a, const void *b) {
    const qpair *x = a, *y = b;
    size_t k = TD_MIN(x->klen, y->klen);
    int c = memcmp(x->s, y->s, k);
    if (c) return c;
    if (x->klen != y->klen) return x->klen < y->klen ? -1 : 1;
    /* equal keys: by value */
    const char *xv = x->s + x->klen, *yv = y->s + y->klen;
    size_t xl = x->len - x->klen, yl = y->len - y->klen;
    if (xl && *xv == '=') xv++, xl--;
    if (yl && *yv == '=') yv++, yl--;
    c = memcmp(xv, yv, TD_MIN(xl, yl));
    if (c) return c;
    return xl < yl ? -1 : xl > yl;
}

/* botocore's rule: split on '&', each "k=v" (a pair without '=' is "k="), sorted. */
static char *canonical_query(const char *query) {
    if (!query || !*query) return td_xstrdup("");
    size_t n = 1;
    for (const char *p = query; *p; p++) n += *p == '&';
    qpair *pairs = td_xcalloc(n, sizeof *pairs);
    size_t count = 0;
    const char *p = query;
    while (1) {
        const char *end = strchr(p, '&');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len) {
            const char *eq = memchr(p, '=', len);
            pairs[count].s = p;
            pairs[count].len = len;
            pairs[count].klen = eq ? (size_t)(eq - p) : len;
            count++;
        }
        if (!end) break;
        p = end + 1;
    }
    qsort(pairs, count, sizeof *pairs, cmp_qpair);
    char *out = td_xmalloc(strlen(query) + count + 1), *o = out;
    for (size_t i = 0; i < count; i++) {
        if (i) *o++ = '&';
        memcpy(o, pairs[i].s, pairs[i].len);
        o += pairs[i].len;
        if (pairs[i].klen == pairs[i].len) *o++ = '=';
    }
    *o = '\0';
    free(pairs);
    return out;
}

static char *canon_value(const char *v) {
    while (*v == ' ' || *v == '\t') v++;
    char *out = td_xstrdup(v), *o = out;
    int space = 0;
    for (const char *p = v; *p; p++) {
        if (*p == ' ' || *p == '\t') {
            space = 1;
            continue;
        }
        if (space && o != out) *o++ = ' ';
        space = 0;
        *o++ = *p;
    }
    *o = '\0';
    return out;
}

td_status td_sigv4_sign(const td_sigv4_in *in, td_sigv4_out *out) {
    memset(out, 0, sizeof *out);
    if (!in->access_key_id || !*in->access_key_id || !in->secret_access_key ||
        !*in->secret_access_key)
        return td_error(TD_ERR_INVALID, "sigv4: no access key id or secret access key");
    if (!in->region || !*in->region || !in->service || !in->method || !in->path ||
        !in->payload_sha256_hex)
        return td_error(TD_ERR_INVALID, "sigv4: region, service, method, path and payload hash "
                                        "are required");
    time_t t = (time_t)in->time_s;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out->amz_date, sizeof out->amz_date, "%Y%m%dT%H%M%SZ", &tm);
    char date[9];
    memcpy(date, out->amz_date, 8);
    date[8] = '\0';

    int with_token = in->session_token && *in->session_token;
    int nh = in->nheaders + 1 + with_token;
    canon_header *h = td_xcalloc((size_t)nh, sizeof *h);
    int count = 0;
    for (int i = 0; i < in->nheaders; i++) {
        char *name = td_xstrdup(in->headers[i].name);
        for (char *c = name; *c; c++) *c = (char)tolower((unsigned char)*c);
        if (!strcmp(name, "x-amz-date") || (with_token && !strcmp(name, "x-amz-security-token"))) {
            free(name); /* set below */
            continue;
        }
        h[count].name = name;
        h[count].value = canon_value(in->headers[i].value ? in->headers[i].value : "");
        count++;
    }
    h[count].name = td_xstrdup("x-amz-date");
    h[count++].value = td_xstrdup(out->amz_date);
    if (with_token) {
        h[count].name = td_xstrdup("x-amz-security-token");
        h[count++].value = td_xstrdup(in->session_token);
    }
    qsort(h, (size_t)count, sizeof *h, cmp_header);

    size_t cap = 64;
    for (int i = 0; i < count; i++) cap += strlen(h[i].name) * 2 + strlen(h[i].value) + 3;
    char *headers_c = td_xmalloc(cap), *signed_h = td_xmalloc(cap);
    headers_c[0] = signed_h[0] = '\0';
    char *hp = headers_c, *sp = signed_h;
    for (int i = 0; i < count; i++) {
        hp += sprintf(hp, "%s:%s\n", h[i].name, h[i].value);
        sp += sprintf(sp, "%s%s", i ? ";" : "", h[i].name);
    }
    char *query = canonical_query(in->query);
    out->canonical_request = td_xasprintf("%s\n%s\n%s\n%s\n%s\n%s", in->method, in->path, query,
                                          headers_c, signed_h, in->payload_sha256_hex);
    free(query);
    free(headers_c);

    char creq_hash[65];
    td_aws_sha256_hex(out->canonical_request, strlen(out->canonical_request), creq_hash);
    char *scope = td_xasprintf("%s/%s/%s/aws4_request", date, in->region, in->service);
    out->string_to_sign =
        td_xasprintf("AWS4-HMAC-SHA256\n%s\n%s\n%s", out->amz_date, scope, creq_hash);

    /* kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request") */
    size_t slen = strlen(in->secret_access_key);
    uint8_t *k0 = td_xmalloc(slen + 4);
    memcpy(k0, "AWS4", 4);
    memcpy(k0 + 4, in->secret_access_key, slen);
    uint8_t k1[32], k2[32], k3[32], k4[32], sig[32];
    hmac(k0, slen + 4, date, 8, k1);
    memset(k0, 0, slen + 4);
    free(k0);
    hmac(k1, 32, in->region, strlen(in->region), k2);
    hmac(k2, 32, in->service, strlen(in->service), k3);
    hmac(k3, 32, "aws4_request", 12, k4);
    hmac(k4, 32, out->string_to_sign, strlen(out->string_to_sign), sig);
    hex(sig, 32, out->signature);
    memset(k1, 0, 32);
    memset(k2, 0, 32);
    memset(k3, 0, 32);
    memset(k4, 0, 32);

    out->authorization =
        td_xasprintf("AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                     in->access_key_id, scope, signed_h, out->signature);
    free(scope);
    free(signed_h);
    for (int i = 0; i < count; i++) {
        free(h[i].name);
        free(h[i].value);
    }
    free(h);
    return TD_OK;
}

void td_sigv4_out_free(td_sigv4_out *out) {
    free(out->canonical_request);
    free(out->string_to_sign);
    free(out->authorization);
    memset(out, 0, sizeof *out);
}
