/* S3's REST API: objects put (one request, or a multipart upload that is aborted on any
 * failure), got atomically and checked, listed, headed, deleted. Path-style addressing when an
 * endpoint is given (a local server), virtual-hosted otherwise. Every body sent carries its
 * SHA-256 (x-amz-content-sha256, which S3 checks against the bytes) and its MD5 (Content-MD5);
 * the object's own SHA-256 travels as x-amz-meta-tandem-sha256, checked on download. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nettle/md5.h>
#include <nettle/sha2.h>

#include "cloud/cloud_internal.h"

#define META_SHA "x-amz-meta-tandem-sha256"

/* ---- s3:// URLs ---- */

static int valid_bucket(const char *b, size_t n, const char **why) {
    if (n < 3 || n > 63) return *why = "a bucket name has 3 to 63 characters", 0;
    for (size_t i = 0; i < n; i++) {
        char c = b[i];
        if (!(islower((unsigned char)c) || isdigit((unsigned char)c) || c == '.' || c == '-'))
            return *why = "a bucket name has only lowercase letters, digits, '.' and '-'", 0;
    }
    if (!isalnum((unsigned char)b[0]) || !isalnum((unsigned char)b[n - 1]))
        return *why = "a bucket name starts and ends with a letter or digit", 0;
    return 1;
}

td_status td_s3_url_parse(const char *url, td_s3_url *out) {
    memset(out, 0, sizeof *out);
    if (!url || strncmp(url, "s3://", 5))
        return td_error(TD_ERR_INVALID, "'%s' is not an S3 URL: write s3://BUCKET/PREFIX",
                        url ? url : "");
    const char *b = url + 5;
    const char *slash = strchr(b, '/');
    size_t n = slash ? (size_t)(slash - b) : strlen(b);
    const char *why = NULL;
    if (!valid_bucket(b, n, &why))
        return td_error(TD_ERR_INVALID, "'%s': bucket '%.*s' is not a valid name: %s", url,
                        (int)TD_MIN(n, 200), b, why);
    /* The key is tandem's own prefix (checkpoints, artifacts), made into object keys by
     * appending: a "." or ".." segment would be resolved by some HTTP stacks (libcurl, before
     * CURLOPT_PATH_AS_IS) into another prefix or bucket, and an empty one is a typo that S3
     * would keep as a distinct key. Refused here, where the user's text is, not sent. */
    const char *key = slash ? slash + 1 : "";
    size_t kn = strlen(key);
    while (kn && key[kn - 1] == '/') kn--; /* "s3://b/p/" is "s3://b/p" */
    for (size_t i = 0; i < kn; i++)
        if ((unsigned char)key[i] < 0x20 || key[i] == 0x7f)
            return td_error(TD_ERR_INVALID,
                            "'%s': the prefix has a control character (byte 0x%02x at %zu); "
                            "write s3://BUCKET/PREFIX with printable characters",
                            url, (unsigned char)key[i], i);
    for (size_t i = 0; i < kn;) {
        size_t len = strcspn(key + i, "/");
        if (len > kn - i) len = kn - i;
        int dots = (len == 1 && key[i] == '.') || (len == 2 && !strncmp(key + i, "..", 2));
        if (len == 0 || dots)
            return td_error(TD_ERR_INVALID,
                            "'%s': the prefix has %s segment%s%.*s%s; S3 prefixes are used "
                            "as written, never resolved: write s3://BUCKET/PREFIX without "
                            "'.', '..' or '//' (for another bucket, name it: s3://OTHER/...)",
                            url, len ? "a" : "an empty", len ? " '" : " ('//')", (int)len,
                            key + i, len ? "'" : "");
        i += len + 1;
    }
    out->bucket = td_xasprintf("%.*s", (int)n, b);
    out->key = td_xasprintf("%.*s", (int)kn, key);
    return TD_OK;
}

void td_s3_url_free(td_s3_url *u) {
    if (!u) return;
    free(u->bucket);
    free(u->key);
    u->bucket = u->key = NULL;
}

void td_s3_object_free(td_s3_object *o) {
    if (!o) return;
    free(o->key);
    memset(o, 0, sizeof *o);
}

void td_s3_list_free(td_s3_list *l) {
    if (!l) return;
    for (int i = 0; i < l->count; i++) td_s3_object_free(&l->items[i]);
    free(l->items);
    l->items = NULL;
    l->count = 0;
}

/* ---- addressing ---- */

typedef struct {
    char *base; /* scheme://host[:port] */
    char *path; /* /[bucket/]key, encoded */
    char what[600];
} target;

static void target_of(td_aws_t *a, const char *bucket, const char *key, target *t) {
    char *enc = td__uri_encode(key ? key : "", 1);
    /* path-style for a given endpoint, and for dotted names (a wildcard certificate covers one
     * label); virtual-hosted otherwise */
    if (a->s3_custom || strchr(bucket, '.')) {
        t->base = td_xstrdup(a->endpoint_s3);
        t->path = key ? td_xasprintf("/%s/%s", bucket, enc) : td_xasprintf("/%s", bucket);
    } else {
        t->base = td_xasprintf("https://%s.s3.%s.amazonaws.com", bucket, a->region);
        t->path = td_xasprintf("/%s", enc);
    }
    snprintf(t->what, sizeof t->what, "s3://%s/%.500s", bucket, key ? key : "");
    free(enc);
}

static void target_free(target *t) {
    free(t->base);
    free(t->path);
}

/* ---- digests of a byte range ---- */

typedef struct {
    char sha_hex[65];
    char *md5_b64;
} digests;

/* SHA-256 and MD5 of [offset, offset+nbytes) of fd; also fed to whole (may be NULL). */
static td_status digest_range(int fd, const char *path, int64_t offset, int64_t nbytes, digests *d,
                              struct sha256_ctx *whole) {
    struct sha256_ctx sha;
    struct md5_ctx md5;
    sha256_init(&sha);
    md5_init(&md5);
    uint8_t *buf = td_xmalloc(1 << 20);
    int64_t done = 0;
    while (done < nbytes) {
        size_t want = (size_t)TD_MIN((int64_t)1 << 20, nbytes - done);
        ssize_t got = pread(fd, buf, want, offset + done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            free(buf);
            if (got == 0)
                return td_error(TD_ERR_IO, "%s shrank while being uploaded (ended at byte %lld)",
                                path, (long long)(offset + done));
            return td_error_errno(TD_ERR_IO, "cannot read %s", path);
        }
        sha256_update(&sha, (size_t)got, buf);
        md5_update(&md5, (size_t)got, buf);
        if (whole) sha256_update(whole, (size_t)got, buf);
        done += got;
    }
    free(buf);
    uint8_t s[SHA256_DIGEST_SIZE], m[MD5_DIGEST_SIZE];
    sha256_digest(&sha, sizeof s, s);
    md5_digest(&md5, sizeof m, m);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) sprintf(d->sha_hex + 2 * i, "%02x", s[i]);
    d->md5_b64 = td__base64(m, sizeof m);
    return TD_OK;
}

static void strip_quotes(char *dst, size_t cap, const char *etag) {
    size_t n = strlen(etag);
    if (n >= 2 && etag[0] == '"' && etag[n - 1] == '"')
        snprintf(dst, cap, "%.*s", (int)n - 2, etag + 1);
    else
        snprintf(dst, cap, "%s", etag);
}

/* ---- PutObject ---- */

static td_status put_single(td_aws_t *a, const char *bucket, const char *key, const void *buf,
                            int fd, int64_t nbytes, const digests *d) {
    target t;
    target_of(a, bucket, key, &t);
    td_http_header h[] = {{"content-md5", d->md5_b64},
                          {"content-type", "application/octet-stream"},
                          {META_SHA, d->sha_hex}};
    td__http_req req = {.service = "s3",
                        .action = "PutObject",
                        .what = t.what,
                        .method = "PUT",
                        .base_url = t.base,
                        .path = t.path,
                        .headers = h,
                        .nheaders = 3,
                        .body = buf,
                        .body_nbytes = (size_t)nbytes,
                        .body_fd = fd,
                        .payload_sha256 = d->sha_hex,
                        .sink_fd = -1};
    td__http_resp resp;
    td_status st = td__aws_request(a, &req, &resp);
    td__http_resp_free(&resp);
    target_free(&t);
    return st;
}

td_status td_s3_put_buffer(td_aws_t *a, const char *bucket, const char *key, const void *buf,
                           size_t nbytes) {
    struct md5_ctx md5;
    uint8_t m[MD5_DIGEST_SIZE];
    md5_init(&md5);
    md5_update(&md5, nbytes, buf);
    md5_digest(&md5, sizeof m, m);
    digests d;
    td_aws_sha256_hex(buf, nbytes, d.sha_hex);
    d.md5_b64 = td__base64(m, sizeof m);
    td_status st = put_single(a, bucket, key, nbytes ? buf : "", -1, (int64_t)nbytes, &d);
    free(d.md5_b64);
    return st;
}

/* ---- multipart ---- */

static td_status s3_simple(td_aws_t *a, const char *action, const char *method, const target *t,
                           const char *query, const td_http_header *h, int nh, const char *body,
                           td__http_resp *resp) {
    td__http_req req = {.service = "s3",
                        .action = action,
                        .what = t->what,
                        .method = method,
                        .base_url = t->base,
                        .path = t->path,
                        .query = query,
                        .headers = h,
                        .nheaders = nh,
                        .body = body,
                        .body_nbytes = body ? strlen(body) : 0,
                        .body_fd = -1,
                        .sink_fd = -1,
                        .head = !strcmp(method, "HEAD")};
    return td__aws_request(a, &req, resp);
}

static void abort_upload(td_aws_t *a, const target *t, const char *upload_q) {
    /* keep the error that made us abort: the abort's own goes to the log */
    char saved[2048];
    snprintf(saved, sizeof saved, "%s", td_error_msg());
    td_aws_error last = a->last;
    td__http_resp resp;
    td_status st =
        s3_simple(a, "AbortMultipartUpload", "DELETE", t, upload_q, NULL, 0, NULL, &resp);
    if (st != TD_OK)
        TD_LOG_WARN("could not abort the multipart upload of %s (%s): its parts stay until a "
                    "lifecycle rule removes them",
                    t->what, td_error_msg());
    td__http_resp_free(&resp);
    a->last = last;
    td_error(TD_ERR_IO, "%s (the multipart upload was aborted)", saved); /* the detail again */
}

static td_status put_multipart(td_aws_t *a, const char *bucket, const char *key, int fd,
                               const char *path, int64_t size, const char *whole_sha) {
    target t;
    target_of(a, bucket, key, &t);
    td_http_header ch[] = {{"content-type", "application/octet-stream"}, {META_SHA, whole_sha}};
    td__http_resp resp;
    td_status st = s3_simple(a, "CreateMultipartUpload", "POST", &t, "uploads", ch, 2, NULL, &resp);
    char upload_id[1024] = "";
    if (st == TD_OK) {
        td__xml *root = NULL;
        st = td__xml_parse(resp.body, resp.body_nbytes, &root);
        if (st == TD_OK) td__xml_copy(upload_id, sizeof upload_id, root, "UploadId");
        td__xml_free(root);
        if (st == TD_OK && !upload_id[0])
            st = td_error(TD_ERR_FORMAT,
                          "aws s3 CreateMultipartUpload %s: no UploadId in the "
                          "answer",
                          t.what);
    }
    td__http_resp_free(&resp);
    if (st != TD_OK) {
        target_free(&t);
        return st;
    }
    char *enc_id = td__uri_encode(upload_id, 0);
    char *upload_q = td_xasprintf("uploadId=%s", enc_id);
    int64_t part = a->multipart_part_nbytes;
    int nparts = (int)((size + part - 1) / part);
    if (nparts > 10000) {
        st = td_error(TD_ERR_INVALID,
                      "%s: %lld bytes in parts of %lld bytes is %d parts, over S3's 10000: "
                      "raise multipart_part_nbytes",
                      path, (long long)size, (long long)part, nparts);
        abort_upload(a, &t, upload_q);
        goto out;
    }
    char(*etags)[128] = td_xcalloc((size_t)nparts, sizeof *etags);
    struct sha256_ctx whole;
    sha256_init(&whole);
    for (int i = 0; i < nparts && st == TD_OK; i++) {
        int64_t off = (int64_t)i * part, n = TD_MIN(part, size - off);
        digests d = {0};
        st = digest_range(fd, path, off, n, &d, &whole);
        if (st != TD_OK) break;
        char *q = td_xasprintf("partNumber=%d&uploadId=%s", i + 1, enc_id);
        char what[700];
        snprintf(what, sizeof what, "%s (part %d of %d)", t.what, i + 1, nparts);
        td_http_header ph[] = {{"content-md5", d.md5_b64}};
        td__http_req req = {.service = "s3",
                            .action = "UploadPart",
                            .what = what,
                            .method = "PUT",
                            .base_url = t.base,
                            .path = t.path,
                            .query = q,
                            .headers = ph,
                            .nheaders = 1,
                            .body_nbytes = (size_t)n,
                            .body_fd = fd,
                            .body_offset = off,
                            .payload_sha256 = d.sha_hex,
                            .sink_fd = -1};
        st = td__aws_request(a, &req, &resp);
        if (st == TD_OK && !td__http_resp_header(&resp, "etag", etags[i], sizeof etags[i]))
            st = td_error(TD_ERR_FORMAT, "aws s3 UploadPart %s: no ETag in the answer", what);
        td__http_resp_free(&resp);
        free(q);
        free(d.md5_b64);
    }
    if (st == TD_OK) {
        uint8_t s[SHA256_DIGEST_SIZE];
        char hexs[65];
        sha256_digest(&whole, sizeof s, s);
        for (int i = 0; i < SHA256_DIGEST_SIZE; i++) sprintf(hexs + 2 * i, "%02x", s[i]);
        if (strcmp(hexs, whole_sha))
            st = td_error(TD_ERR_IO,
                          "%s changed while being uploaded to %s (SHA-256 %s before, %s while "
                          "sending): upload it again once nothing writes it",
                          path, t.what, whole_sha, hexs);
    }
    if (st == TD_OK) {
        size_t cap = 64 + (size_t)nparts * 200;
        char *body = td_xmalloc(cap), *p = body;
        p += sprintf(p, "<CompleteMultipartUpload>");
        for (int i = 0; i < nparts; i++)
            p += sprintf(p, "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>", i + 1,
                         etags[i]);
        sprintf(p, "</CompleteMultipartUpload>");
        td_http_header xh[] = {{"content-type", "application/xml"}};
        st = s3_simple(a, "CompleteMultipartUpload", "POST", &t, upload_q, xh, 1, body, &resp);
        free(body);
        /* S3 may answer 200 and put the error in the body */
        if (st == TD_OK && resp.body_nbytes && strstr(resp.body, "<Error>")) {
            td_aws_error e;
            if (td_aws_error_parse(resp.body, resp.body_nbytes, 200, &e) == TD_OK) {
                a->last = e;
                st = td_error(TD_ERR_PEER, "aws s3 CompleteMultipartUpload %s failed: %s: %s",
                              t.what, e.code, e.message);
            }
        }
        td__http_resp_free(&resp);
    }
    if (st != TD_OK) abort_upload(a, &t, upload_q);
    free(etags);
out:
    free(enc_id);
    free(upload_q);
    target_free(&t);
    return st;
}

td_status td_s3_put_file(td_aws_t *a, const char *bucket, const char *key, const char *path,
                         char sha256_out[65]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return td_error_errno(TD_ERR_IO, "cannot open %s to upload it", path);
    struct stat sb;
    td_status st = TD_OK;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        st = td_error(TD_ERR_INVALID, "%s is not a regular file: only files are uploaded", path);
        goto out;
    }
    int64_t size = (int64_t)sb.st_size;
    if (size <= a->multipart_threshold) {
        digests d = {0};
        TD_CHECK_GOTO(digest_range(fd, path, 0, size, &d, NULL), st, out);
        st = put_single(a, bucket, key, NULL, fd, size, &d);
        if (st == TD_OK && sha256_out) memcpy(sha256_out, d.sha_hex, 65);
        free(d.md5_b64);
    } else {
        char sha[65];
        TD_CHECK_GOTO(td_aws_sha256_file(path, 0, size, sha), st, out);
        st = put_multipart(a, bucket, key, fd, path, size, sha);
        if (st == TD_OK && sha256_out) memcpy(sha256_out, sha, 65);
    }
out:
    close(fd);
    return st;
}

/* ---- HeadObject, GetObject ---- */

static void object_from_headers(const td__http_resp *r, const char *key, td_s3_object *o) {
    memset(o, 0, sizeof *o);
    o->key = td_xstrdup(key);
    char v[128];
    o->nbytes = -1;
    if (td__http_resp_header(r, "content-length", v, sizeof v)) o->nbytes = strtoll(v, NULL, 10);
    if (td__http_resp_header(r, "etag", v, sizeof v)) strip_quotes(o->etag, sizeof o->etag, v);
    td__http_resp_header(r, "last-modified", o->last_modified, sizeof o->last_modified);
    if (td__http_resp_header(r, META_SHA, v, sizeof v) && strlen(v) == 64)
        memcpy(o->sha256_hex, v, 65);
}

td_status td_s3_head(td_aws_t *a, const char *bucket, const char *key, td_s3_object *out) {
    memset(out, 0, sizeof *out);
    target t;
    target_of(a, bucket, key, &t);
    td__http_resp resp;
    td_status st = s3_simple(a, "HeadObject", "HEAD", &t, NULL, NULL, 0, NULL, &resp);
    if (st == TD_OK) object_from_headers(&resp, key, out);
    td__http_resp_free(&resp);
    target_free(&t);
    return st;
}

td_status td_s3_get_file(td_aws_t *a, const char *bucket, const char *key, const char *path,
                         td_s3_object *info_out) {
    char *tmp = td_xasprintf("%s.tdpart.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        td_status e =
            td_error_errno(TD_ERR_IO, "cannot create a file beside %s for the download", path);
        free(tmp);
        return e;
    }
    target t;
    target_of(a, bucket, key, &t);
    td__http_req req = {.service = "s3",
                        .action = "GetObject",
                        .what = t.what,
                        .method = "GET",
                        .base_url = t.base,
                        .path = t.path,
                        .body_fd = -1,
                        .sink_fd = fd};
    td__http_resp resp;
    td_s3_object info = {0};
    td_status st = td__aws_request(a, &req, &resp);
    if (st == TD_OK) {
        object_from_headers(&resp, key, &info);
        struct stat sb;
        char sha[65];
        if (fsync(fd) < 0 || fstat(fd, &sb) < 0) {
            st = td_error_errno(TD_ERR_IO, "cannot write %s", tmp);
        } else if (info.nbytes >= 0 && sb.st_size != info.nbytes) {
            st = td_error(TD_ERR_IO, "aws s3 GetObject %s: got %lld bytes, expected %lld", t.what,
                          (long long)sb.st_size, (long long)info.nbytes);
        } else if ((st = td_aws_sha256_file(tmp, 0, -1, sha)) == TD_OK && info.sha256_hex[0] &&
                   strcmp(sha, info.sha256_hex)) {
            a->last.kind = TD_AWS_ERRK_INTEGRITY;
            st = td_error(TD_ERR_FORMAT,
                          "aws s3 GetObject %s: the bytes' SHA-256 %s differs from the one stored "
                          "with the object (%s): not written to %s",
                          t.what, sha, info.sha256_hex, path);
        } else if (st == TD_OK && rename(tmp, path) < 0) {
            st = td_error_errno(TD_ERR_IO, "cannot rename %s to %s", tmp, path);
        }
        if (st == TD_OK) {
            snprintf(info.sha256_hex, sizeof info.sha256_hex, "%s", sha);
        }
    }
    td__http_resp_free(&resp);
    close(fd);
    if (st != TD_OK) unlink(tmp);
    if (st == TD_OK && info_out)
        *info_out = info;
    else
        td_s3_object_free(&info);
    free(tmp);
    target_free(&t);
    return st;
}

/* ---- ListObjectsV2, DeleteObject ---- */

td_status td_s3_parse_list(const char *xml, size_t nbytes, td_s3_list *out,
                           char **continuation_out) {
    if (continuation_out) *continuation_out = NULL;
    td__xml *root = NULL;
    TD_CHECK(td__xml_parse(xml, nbytes, &root));
    td_status st = TD_OK;
    if (strcmp(root->name, "ListBucketResult")) {
        st = td_error(TD_ERR_FORMAT, "a ListObjectsV2 answer <%s>, expected <ListBucketResult>",
                      root->name);
        goto out;
    }
    for (const td__xml *c = root->child; c; c = c->next) {
        if (strcmp(c->name, "Contents")) continue;
        out->items = td_xrealloc(out->items, (size_t)(out->count + 1) * sizeof *out->items);
        td_s3_object *o = &out->items[out->count++];
        memset(o, 0, sizeof *o);
        o->key = td_xstrdup(td__xml_text(c, "Key"));
        o->nbytes = strtoll(td__xml_text(c, "Size"), NULL, 10);
        strip_quotes(o->etag, sizeof o->etag, td__xml_text(c, "ETag"));
        td__xml_copy(o->last_modified, sizeof o->last_modified, c, "LastModified");
    }
    if (!strcmp(td__xml_text(root, "IsTruncated"), "true")) {
        const char *next = td__xml_text(root, "NextContinuationToken");
        if (!*next) {
            st = td_error(TD_ERR_FORMAT, "a truncated ListObjectsV2 answer without "
                                         "NextContinuationToken");
            goto out;
        }
        if (continuation_out) *continuation_out = td_xstrdup(next);
    }
out:
    td__xml_free(root);
    return st;
}

td_status td_s3_list_objects(td_aws_t *a, const char *bucket, const char *prefix, int page_size,
                             td_s3_list *out) {
    memset(out, 0, sizeof *out);
    target t;
    target_of(a, bucket, NULL, &t);
    if (!a->s3_custom && !strchr(bucket, '.')) {
        free(t.path);
        t.path = td_xstrdup("/");
    }
    snprintf(t.what, sizeof t.what, "s3://%s/%.500s", bucket, prefix ? prefix : "");
    char *next = NULL;
    td_status st = TD_OK;
    do {
        char *q = NULL;
        td__query_add(&q, "list-type", "2");
        td__query_addf(&q, "max-keys", "%d", page_size > 0 ? page_size : 1000);
        if (prefix && *prefix) td__query_add(&q, "prefix", prefix);
        if (next) {
            td__query_add(&q, "continuation-token", next);
            free(next);
            next = NULL;
        }
        td__http_resp resp;
        st = s3_simple(a, "ListObjectsV2", "GET", &t, q, NULL, 0, NULL, &resp);
        free(q);
        if (st == TD_OK) st = td_s3_parse_list(resp.body, resp.body_nbytes, out, &next);
        td__http_resp_free(&resp);
    } while (st == TD_OK && next);
    free(next);
    target_free(&t);
    if (st != TD_OK) td_s3_list_free(out);
    return st;
}

td_status td_s3_delete(td_aws_t *a, const char *bucket, const char *key) {
    target t;
    target_of(a, bucket, key, &t);
    td__http_resp resp;
    td_status st = s3_simple(a, "DeleteObject", "DELETE", &t, NULL, NULL, 0, NULL, &resp);
    td__http_resp_free(&resp);
    target_free(&t);
    return st;
}
