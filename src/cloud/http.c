/* The client and its one HTTP round trip: sign (sigv4.c), send with libcurl, retry throttling,
 * 5xx and network failures with jittered exponential backoff, parse and classify AWS errors. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "cloud/cloud_internal.h"

/* ---- the AWS error codes tandem knows: X(code, kind, retryable, capacity, what to do) ---- */
#define TD_AWS_CODE_MAP(X)                                                                         \
    X("AuthFailure", AUTH, 0, 0, "check the access key, its secret and the region")                \
    X("UnauthorizedOperation", AUTH, 0, 0,                                                         \
      "the IAM identity may not do this: add the action to its policy")                            \
    X("SignatureDoesNotMatch", AUTH, 0, 0, "the secret access key does not match the key id")      \
    X("InvalidClientTokenId", AUTH, 0, 0, "the access key id is unknown: check it")                \
    X("InvalidAccessKeyId", AUTH, 0, 0, "the access key id is unknown: check it")                  \
    X("AccessDenied", AUTH, 0, 0,                                                                  \
      "the IAM identity may not do this: add the action to its policy")                            \
    X("ExpiredToken", AUTH, 0, 0, "the session token expired: get new temporary credentials")      \
    X("InvalidToken", AUTH, 0, 0, "the session token is invalid: get new temporary credentials")   \
    X("RequestExpired", AUTH, 0, 0, "the request's time is off: check this machine's clock")       \
    X("RequestTimeTooSkewed", AUTH, 0, 0, "this machine's clock is off: sync it (chrony, ntp)")    \
    X("OptInRequired", AUTH, 0, 0, "the account is not subscribed to this service or region")      \
    X("InsufficientInstanceCapacity", CAPACITY, 1, 1,                                              \
      "AWS has no capacity of this type in this zone now: try another instance type, zone, or "    \
      "later")                                                                                     \
    X("InsufficientHostCapacity", CAPACITY, 1, 1, "try another zone or later")                     \
    X("InsufficientAddressCapacity", CAPACITY, 1, 1, "try another zone or later")                  \
    X("InsufficientFreeAddressesInSubnet", CAPACITY, 0, 1, "the subnet is full: use another")      \
    X("InstanceLimitExceeded", CAPACITY, 0, 1,                                                     \
      "the account's instance quota is reached: terminate instances or request a higher quota")    \
    X("VcpuLimitExceeded", CAPACITY, 0, 1,                                                         \
      "the account's vCPU quota is reached: terminate instances or request a higher quota")        \
    X("MaxSpotInstanceCountExceeded", CAPACITY, 0, 1,                                              \
      "the account's spot quota is reached: request a higher quota or use on-demand")              \
    X("SpotMaxPriceTooLow", CAPACITY, 0, 1,                                                        \
      "the spot max price is below the current spot price: raise it, or leave it unset")           \
    X("Unsupported", INVALID, 0, 1, "this zone does not offer it: try another zone or type")       \
    X("InvalidKeyPair.NotFound", NOTFOUND, 0, 0,                                                   \
      "create the key pair in this region (aws ec2 import-key-pair) or change key_name")           \
    X("InvalidAMIID.NotFound", NOTFOUND, 0, 0, "the image does not exist in this region")          \
    X("InvalidInstanceType.NotFound", INVALID, 0, 0, "no such instance type: check its spelling")  \
    X("InvalidInstanceType", INVALID, 0, 0, "no such instance type: check its spelling")           \
    X("InvalidParameterValue", INVALID, 0, 0, "fix the value named in the message")                \
    X("InvalidParameterCombination", INVALID, 0, 0, "fix the combination named in the message")    \
    X("MissingParameter", INVALID, 0, 0, "add the parameter named in the message")                 \
    X("Throttling", THROTTLE, 1, 0, "")                                                            \
    X("ThrottlingException", THROTTLE, 1, 0, "")                                                   \
    X("RequestLimitExceeded", THROTTLE, 1, 0, "")                                                  \
    X("RequestThrottled", THROTTLE, 1, 0, "")                                                      \
    X("EC2ThrottledException", THROTTLE, 1, 0, "")                                                 \
    X("SlowDown", THROTTLE, 1, 0, "")                                                              \
    X("TooManyRequestsException", THROTTLE, 1, 0, "")                                              \
    X("InternalError", SERVER, 1, 0, "")                                                           \
    X("InternalFailure", SERVER, 1, 0, "")                                                         \
    X("ServiceUnavailable", SERVER, 1, 0, "")                                                      \
    X("Unavailable", SERVER, 1, 0, "")                                                             \
    X("RequestTimeout", NETWORK, 1, 0, "")                                                         \
    X("NoSuchBucket", NOTFOUND, 0, 0, "create the bucket or fix its name (and region)")            \
    X("NoSuchKey", NOTFOUND, 0, 0, "")                                                             \
    X("NoSuchUpload", NOTFOUND, 0, 0, "the multipart upload was aborted or completed")             \
    X("NotFound", NOTFOUND, 0, 0, "")                                                              \
    X("XAmzContentSHA256Mismatch", INTEGRITY, 0, 0, "the bytes changed while being sent")          \
    X("BadDigest", INTEGRITY, 0, 0, "the bytes changed while being sent")                          \
    X("InvalidDigest", INTEGRITY, 0, 0, "")                                                        \
    X("PermanentRedirect", INVALID, 0, 0,                                                          \
      "the bucket is in another region: set AWS_REGION to the bucket's region")

typedef struct {
    const char *code;
    td_aws_errkind kind;
    int retryable, capacity;
    const char *hint;
} code_info;

static const code_info code_table[] = {
#define TD__AWS_CODE(c, k, r, cap, h) {c, TD_AWS_ERRK_##k, r, cap, h},
    TD_AWS_CODE_MAP(TD__AWS_CODE)
#undef TD__AWS_CODE
};

static const code_info *code_lookup(const char *code) {
    for (size_t i = 0; i < TD_ARRAY_LEN(code_table); i++)
        if (!strcmp(code_table[i].code, code)) return &code_table[i];
    return NULL;
}

const char *td_aws_errkind_name(td_aws_errkind k) {
    static const char *const names[] = {"none",     "auth",   "notfound", "invalid",   "capacity",
                                        "throttle", "server", "network",  "integrity", "other"};
    return (unsigned)k < TD_ARRAY_LEN(names) ? names[k] : "?";
}

void td_aws_error_classify(td_aws_error *e) {
    const code_info *ci = e->code[0] ? code_lookup(e->code) : NULL;
    if (ci) {
        e->kind = ci->kind;
        e->retryable = ci->retryable;
        e->capacity = ci->capacity;
        return;
    }
    size_t n = strlen(e->code);
    e->capacity = 0;
    if (n > 9 && !strcmp(e->code + n - 9, ".NotFound"))
        e->kind = TD_AWS_ERRK_NOTFOUND;
    else if (n > 10 && !strcmp(e->code + n - 10, ".Malformed"))
        e->kind = TD_AWS_ERRK_INVALID;
    else if (!strncmp(e->code, "Invalid", 7))
        e->kind = TD_AWS_ERRK_INVALID;
    else if (e->http_status == 401 || e->http_status == 403)
        e->kind = TD_AWS_ERRK_AUTH;
    else if (e->http_status == 404)
        e->kind = TD_AWS_ERRK_NOTFOUND;
    else if (e->http_status == 429)
        e->kind = TD_AWS_ERRK_THROTTLE;
    else if (e->http_status >= 500)
        e->kind = TD_AWS_ERRK_SERVER;
    else if (e->http_status == 0)
        e->kind = TD_AWS_ERRK_NETWORK;
    else if (e->http_status == 400)
        e->kind = TD_AWS_ERRK_INVALID;
    else
        e->kind = TD_AWS_ERRK_OTHER;
    e->retryable = e->kind == TD_AWS_ERRK_THROTTLE || e->kind == TD_AWS_ERRK_SERVER ||
                   e->kind == TD_AWS_ERRK_NETWORK;
}

static const char *code_hint(const char *code) {
    const code_info *ci = code_lookup(code);
    return ci ? ci->hint : "";
}

td_status td_aws_error_parse(const char *xml, size_t nbytes, int http_status, td_aws_error *e) {
    memset(e, 0, sizeof *e);
    e->http_status = http_status;
    td__xml *root = NULL;
    TD_CHECK(td__xml_parse(xml, nbytes, &root));
    td_status st = TD_OK;
    const td__xml *err = NULL;
    if (!strcmp(root->name, "Response") || !strcmp(root->name, "ErrorResponse")) {
        /* EC2: Response/Errors/Error; the Query protocol of IAM and STS (and moto's EC2 auth
         * errors): ErrorResponse/Error or ErrorResponse/Errors/Error */
        err = td__xml_path(root, "Errors/Error");
        if (!err) err = td__xml_child(root, "Error");
        td__xml_copy(e->request_id, sizeof e->request_id, root, "RequestID");
        if (!e->request_id[0]) td__xml_copy(e->request_id, sizeof e->request_id, root, "RequestId");
    } else if (!strcmp(root->name, "Error")) { /* S3 */
        err = root;
        td__xml_copy(e->request_id, sizeof e->request_id, root, "RequestId");
    }
    if (!err || !*td__xml_text(err, "Code")) {
        st = td_error(TD_ERR_FORMAT,
                      "an AWS error answer without Response/Errors/Error/Code "
                      "or Error/Code (root element <%s>)",
                      root->name);
    } else {
        td__xml_copy(e->code, sizeof e->code, err, "Code");
        td__xml_copy(e->message, sizeof e->message, err, "Message");
        td_aws_error_classify(e);
    }
    td__xml_free(root);
    return st;
}

/* ---- the client ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

td_status td__curl_global_init(void) {
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return td_error(TD_ERR_SYS, "libcurl: global init failed: %s",
                        curl_easy_strerror(curl_init_rc));
    return TD_OK;
}

static char *endpoint_for(const char *service, const char *region, int *custom) {
    td_aws_env var =
        !strcmp(service, "s3") ? TD_AWS_ENV_AWS_ENDPOINT_URL_S3 : TD_AWS_ENV_AWS_ENDPOINT_URL_EC2;
    const char *v = td_aws_env_get(var);
    if (!v) v = td_aws_env_get(TD_AWS_ENV_AWS_ENDPOINT_URL);
    *custom = v != NULL;
    char *ep = v ? td_xstrdup(v) : td_xasprintf("https://%s.%s.amazonaws.com", service, region);
    size_t n = strlen(ep);
    while (n && ep[n - 1] == '/') ep[--n] = '\0';
    return ep;
}

static td_status check_endpoint(const char *ep, const char *service) {
    if (strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8))
        return td_error(TD_ERR_INVALID,
                        "the %s endpoint '%s' (AWS_ENDPOINT_URL%s) is not an http:// or "
                        "https:// URL",
                        service, ep, !strcmp(service, "s3") ? "_S3" : "_EC2");
    const char *host = strstr(ep, "://") + 3;
    if (strchr(host, '/'))
        return td_error(TD_ERR_INVALID,
                        "the %s endpoint '%s' has a path; give scheme://host[:port] only", service,
                        ep);
    return TD_OK;
}

td_status td_aws_new(const td_aws_opts *opts, td_aws_t **out) {
    *out = NULL;
    td_aws_opts none = {0};
    if (!opts) opts = &none;
    TD_CHECK(td__curl_global_init());
    td_aws_t *a = td_xcalloc(1, sizeof *a);
    td_status st = TD_OK;
    a->profile = opts->profile ? td_xstrdup(opts->profile) : NULL;
    if (opts->region)
        a->region = td_xstrdup(opts->region);
    else
        TD_CHECK_GOTO(td_aws_region_load(opts->profile, &a->region), st, fail);
    if (opts->creds) {
        a->creds.access_key_id = td_xstrdup(opts->creds->access_key_id);
        a->creds.secret_access_key = td_xstrdup(opts->creds->secret_access_key);
        a->creds.session_token =
            opts->creds->session_token ? td_xstrdup(opts->creds->session_token) : NULL;
        snprintf(a->creds.source, sizeof a->creds.source, "%s", opts->creds->source);
        a->creds.expires_wall_s = opts->creds->expires_wall_s;
    } else {
        TD_CHECK_GOTO(td_aws_creds_load(opts->profile, &a->creds), st, fail);
        a->creds_refreshable =
            a->creds.expires_wall_s > 0 && !strncmp(a->creds.source, "instance", 8);
    }
    a->endpoint_ec2 = endpoint_for("ec2", a->region, &a->ec2_custom);
    a->endpoint_s3 = endpoint_for("s3", a->region, &a->s3_custom);
    TD_CHECK_GOTO(check_endpoint(a->endpoint_ec2, "ec2"), st, fail);
    TD_CHECK_GOTO(check_endpoint(a->endpoint_s3, "s3"), st, fail);
    a->max_attempts = opts->max_attempts > 0 ? opts->max_attempts : 5;
    a->backoff_ms = opts->backoff_ms > 0 ? opts->backoff_ms : 200;
    a->connect_timeout_ms = opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 10000;
    a->low_speed_timeout_s = opts->low_speed_timeout_s > 0 ? opts->low_speed_timeout_s : 30;
    a->ec2_page_size = opts->ec2_page_size > 0 ? opts->ec2_page_size : 1000;
    if (a->ec2_page_size < 5 || a->ec2_page_size > 1000) {
        st = td_error(TD_ERR_INVALID, "EC2 page size %d: DescribeInstances takes 5..1000",
                      a->ec2_page_size);
        goto fail;
    }
    a->multipart_part_nbytes =
        opts->multipart_part_nbytes > 0 ? opts->multipart_part_nbytes : 16 << 20;
    if (a->multipart_part_nbytes < 5 << 20) {
        st = td_error(TD_ERR_INVALID,
                      "multipart part size %lld bytes is below S3's minimum of 5 MiB (5242880)",
                      (long long)a->multipart_part_nbytes);
        goto fail;
    }
    a->multipart_threshold =
        opts->multipart_threshold > 0 ? opts->multipart_threshold : (int64_t)64 << 20;
    a->curl = curl_easy_init();
    if (!a->curl) {
        st = td_error(TD_ERR_NOMEM, "libcurl: cannot create a handle");
        goto fail;
    }
    TD_LOG_DEBUG("aws: region %s, credentials from %s, ec2 %s, s3 %s%s", a->region, a->creds.source,
                 a->endpoint_ec2, a->endpoint_s3, a->s3_custom ? " (path-style)" : "");
    *out = a;
    return TD_OK;
fail:
    td_aws_free(a);
    return st;
}

void td_aws_free(td_aws_t *a) {
    if (!a) return;
    td_aws_creds_free(&a->creds);
    if (a->curl) curl_easy_cleanup(a->curl);
    free(a->profile);
    free(a->region);
    free(a->endpoint_ec2);
    free(a->endpoint_s3);
    free(a);
}

const char *td_aws_region(const td_aws_t *a) {
    return a->region;
}

const char *td_aws_endpoint(const td_aws_t *a, const char *service) {
    return !strcmp(service, "s3") ? a->endpoint_s3 : a->endpoint_ec2;
}

const td_aws_error *td_aws_last_error(const td_aws_t *a) {
    return &a->last;
}

/* ---- one request ---- */

typedef struct {
    const td__http_req *req;
    int64_t sent;
    CURL *curl;
    char *body;
    size_t body_nbytes;
    size_t body_cap;
    char *headers;
    size_t headers_nbytes;
    int sink_failed;
    int sink_errno;
    int64_t sunk;
} xfer;

static size_t on_read(char *dst, size_t size, size_t nmemb, void *ud) {
    xfer *x = ud;
    const td__http_req *r = x->req;
    int64_t left = (int64_t)r->body_nbytes - x->sent;
    size_t n = size * nmemb;
    if ((int64_t)n > left) n = (size_t)left;
    if (n == 0) return 0;
    if (r->body_fd >= 0) {
        ssize_t got;
        do got = pread(r->body_fd, dst, n, r->body_offset + x->sent);
        while (got < 0 && errno == EINTR);
        if (got <= 0) return CURL_READFUNC_ABORT;
        n = (size_t)got;
    } else {
        memcpy(dst, (const char *)r->body + x->sent, n);
    }
    x->sent += (int64_t)n;
    return n;
}

static int on_seek(void *ud, curl_off_t offset, int origin) {
    xfer *x = ud;
    if (origin != SEEK_SET || offset < 0 || offset > (curl_off_t)x->req->body_nbytes)
        return CURL_SEEKFUNC_CANTSEEK;
    x->sent = offset;
    return CURL_SEEKFUNC_OK;
}

static size_t on_write(char *p, size_t size, size_t nmemb, void *ud) {
    xfer *x = ud;
    size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &status);
    if (x->req->sink_fd >= 0 && status >= 200 && status < 300) {
        size_t done = 0;
        while (done < n) {
            ssize_t w = write(x->req->sink_fd, p + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                x->sink_failed = 1;
                x->sink_errno = errno;
                return 0;
            }
            done += (size_t)w;
        }
        x->sunk += (int64_t)n;
        return n;
    }
    if (x->body_nbytes + n > ((size_t)256 << 20)) return 0; /* no answer of ours is this big */
    if (x->body_nbytes + n + 1 > x->body_cap) {
        x->body_cap = TD_MAX(x->body_cap * 2, x->body_nbytes + n + 1);
        x->body = td_xrealloc(x->body, x->body_cap);
    }
    memcpy(x->body + x->body_nbytes, p, n);
    x->body_nbytes += n;
    x->body[x->body_nbytes] = '\0';
    return n;
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *ud) {
    xfer *x = ud;
    size_t n = size * nmemb;
    if (n >= 5 && !strncmp(p, "HTTP/", 5)) x->headers_nbytes = 0; /* a new answer (100, redirect) */
    x->headers = td_xrealloc(x->headers, x->headers_nbytes + n + 1);
    memcpy(x->headers + x->headers_nbytes, p, n);
    x->headers_nbytes += n;
    x->headers[x->headers_nbytes] = '\0';
    return n;
}

void td__http_resp_free(td__http_resp *r) {
    free(r->body);
    free(r->headers);
    memset(r, 0, sizeof *r);
}

int td__http_resp_header(const td__http_resp *r, const char *name, char *dst, size_t cap) {
    if (!r->headers) return 0;
    size_t nl = strlen(name);
    for (const char *line = r->headers; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > nl && line[nl] == ':' && !strncasecmp(line, name, nl)) {
            const char *v = line + nl + 1;
            while (*v == ' ' || *v == '\t') v++;
            size_t vl = (size_t)(line + len - v);
            while (vl && (v[vl - 1] == '\r' || v[vl - 1] == ' ')) vl--;
            snprintf(dst, cap, "%.*s", (int)vl, v);
            return 1;
        }
        if (!end) break;
        line = end + 1;
    }
    return 0;
}

static void sleep_ms(int64_t ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

int64_t td__aws_backoff_ceiling_ms(int base_ms, int max_ms, int attempt) {
    int64_t ceiling = (int64_t)base_ms << TD_MIN(TD_MAX(attempt, 0), 20);
    return ceiling > max_ms ? max_ms : ceiling;
}

static int64_t backoff_ms(const td_aws_t *a, int attempt) {
    int64_t cap = td__aws_backoff_ceiling_ms(a->backoff_ms, TD__AWS_BACKOFF_MAX_MS, attempt);
    /* full jitter, from half to all of it, so a herd of nodes spreads out */
    uint64_t r = td_mix64(td_now_ns() ^ (uint64_t)(uintptr_t)a);
    return cap / 2 + (int64_t)(r % (uint64_t)(cap / 2 + 1));
}

static td_status refresh_creds(td_aws_t *a) {
    if (!a->creds_refreshable || a->creds.expires_wall_s - td_wall_s() > 300) return TD_OK;
    td_aws_creds fresh;
    TD_CHECK(td__imds_creds(&fresh));
    td_aws_creds_free(&a->creds);
    a->creds = fresh;
    return TD_OK;
}

static td_status status_of(td_aws_errkind k) {
    switch (k) {
    case TD_AWS_ERRK_AUTH:
        return TD_ERR_AUTH;
    case TD_AWS_ERRK_NOTFOUND:
        return TD_ERR_NOTFOUND;
    case TD_AWS_ERRK_INVALID:
        return TD_ERR_INVALID;
    case TD_AWS_ERRK_INTEGRITY:
        return TD_ERR_FORMAT;
    case TD_AWS_ERRK_NETWORK:
        return TD_ERR_PEER;
    default:
        return TD_ERR_PEER;
    }
}

/* One attempt: fills resp or err; returns whether an HTTP answer came. *stalled: the server
 * took the connection and then stopped moving bytes. */
static int attempt(td_aws_t *a, const td__http_req *r, const char *payload_hash,
                   td__http_resp *resp, td_aws_error *err, td_status *local_st, int *stalled) {
    CURL *c = a->curl;
    curl_easy_reset(c);
    *local_st = TD_OK;
    *stalled = 0;
    const char *host = strstr(r->base_url, "://") + 3;
    int s3 = !strcmp(r->service, "s3");
    /* the headers to sign: host, the content hash (S3), the request's own */
    int nh = r->nheaders + 2;
    td_http_header *h = td_xcalloc((size_t)nh, sizeof *h);
    int count = 0;
    h[count++] = (td_http_header){"host", host};
    if (s3) h[count++] = (td_http_header){"x-amz-content-sha256", payload_hash};
    for (int i = 0; i < r->nheaders; i++) h[count++] = r->headers[i];
    td_sigv4_in in = {
        .access_key_id = a->creds.access_key_id,
        .secret_access_key = a->creds.secret_access_key,
        .session_token = a->creds.session_token,
        .region = a->region,
        .service = r->service,
        .time_s = (int64_t)td_wall_s(),
        .method = r->method,
        .path = r->path,
        .query = r->query ? r->query : "",
        .headers = h,
        .nheaders = count,
        .payload_sha256_hex = payload_hash,
    };
    td_sigv4_out sig;
    td_status st = td_sigv4_sign(&in, &sig);
    if (st != TD_OK) {
        free(h);
        *local_st = st;
        return 0;
    }
    struct curl_slist *list = NULL;
    char *line;
    for (int i = 0; i < count; i++) {
        line = td_xasprintf("%s: %s", h[i].name, h[i].value);
        list = curl_slist_append(list, line);
        free(line);
    }
    line = td_xasprintf("x-amz-date: %s", sig.amz_date);
    list = curl_slist_append(list, line);
    free(line);
    if (a->creds.session_token) {
        line = td_xasprintf("x-amz-security-token: %s", a->creds.session_token);
        list = curl_slist_append(list, line);
        memset(line, 0, strlen(line));
        free(line);
    }
    line = td_xasprintf("Authorization: %s", sig.authorization);
    list = curl_slist_append(list, line);
    free(line);
    list = curl_slist_append(list, "Expect:"); /* no 100-continue round trip */
    td_sigv4_out_free(&sig);
    free(h);

    char *url = td_xasprintf("%s%s%s%s", r->base_url, r->path, r->query && *r->query ? "?" : "",
                             r->query ? r->query : "");
    xfer x = {.req = r, .curl = c};
    curl_easy_setopt(c, CURLOPT_URL, url);
    /* the path as signed, byte for byte: an S3 key may hold "." and ".." segments ("a/../b" is
     * a key of its own, as botocore sends it), and libcurl would otherwise resolve them into
     * another key, prefix or bucket (issue 29) */
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)a->connect_timeout_ms);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, (long)TD__AWS_LOW_SPEED_BPS);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)a->low_speed_timeout_s);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    int has_body = r->body_fd >= 0 || r->body_nbytes > 0;
    if (r->head) {
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (!strcmp(r->method, "PUT")) {
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(c, CURLOPT_READDATA, &x);
        curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(c, CURLOPT_SEEKDATA, &x);
        curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_nbytes);
    } else if (!strcmp(r->method, "POST")) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(c, CURLOPT_READDATA, &x);
        curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(c, CURLOPT_SEEKDATA, &x);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_nbytes);
    } else if (strcmp(r->method, "GET")) {
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, r->method);
    }
    (void)has_body;
    if (r->sink_fd >= 0) {
        if (ftruncate(r->sink_fd, 0) < 0 || lseek(r->sink_fd, 0, SEEK_SET) < 0) {
            *local_st = td_error_errno(TD_ERR_IO, "cannot truncate the download's file");
            curl_slist_free_all(list);
            free(url);
            return 0;
        }
    }
    CURLcode cc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    /* the Authorization and token lines are gone with the list; nothing else kept them */
    curl_slist_free_all(list);
    free(url);
    memset(err, 0, sizeof *err);
    if (x.sink_failed) {
        errno = x.sink_errno;
        *local_st = td_error_errno(TD_ERR_IO, "cannot write the download");
        free(x.body);
        free(x.headers);
        return 0;
    }
    if (cc != CURLE_OK) {
        err->http_status = 0;
        snprintf(err->code, sizeof err->code, "curl:%d", (int)cc);
        snprintf(err->message, sizeof err->message, "%s", curl_easy_strerror(cc));
        long request_nbytes = 0; /* > 0: connected, and the request's headers went out */
        curl_easy_getinfo(c, CURLINFO_REQUEST_SIZE, &request_nbytes);
        if (cc == CURLE_OPERATION_TIMEDOUT && request_nbytes > 0) {
            *stalled = 1;
            snprintf(err->message, sizeof err->message,
                     "the transfer stalled: under %d bytes/s for %d s after %s took the "
                     "connection (curl: %s)",
                     TD__AWS_LOW_SPEED_BPS, a->low_speed_timeout_s, host, curl_easy_strerror(cc));
        }
        err->kind = TD_AWS_ERRK_NETWORK;
        err->retryable = cc != CURLE_UNSUPPORTED_PROTOCOL && cc != CURLE_URL_MALFORMAT &&
                         cc != CURLE_ABORTED_BY_CALLBACK && cc != CURLE_READ_ERROR;
        free(x.body);
        free(x.headers);
        return 0;
    }
    resp->status = status;
    resp->body = x.body ? x.body : td_xstrdup("");
    resp->body_nbytes = x.body_nbytes;
    resp->headers = x.headers;
    if (status >= 200 && status < 300) return 1;
    if (resp->body_nbytes == 0 ||
        td_aws_error_parse(resp->body, resp->body_nbytes, (int)status, err) != TD_OK) {
        memset(err, 0, sizeof *err);
        err->http_status = (int)status;
        if (status == 404)
            snprintf(err->code, sizeof err->code, "NotFound");
        else if (status == 403)
            snprintf(err->code, sizeof err->code, "AccessDenied");
        else if (status == 503)
            snprintf(err->code, sizeof err->code, "SlowDown");
        char shown[240] = "";
        if (resp->body_nbytes) td_escape_text(shown, sizeof shown, resp->body, resp->body_nbytes);
        snprintf(err->message, sizeof err->message, "HTTP %ld%s%s", status,
                 resp->body_nbytes ? ", not an AWS error: " : "", shown);
        td_aws_error_classify(err);
        td_error_clear();
    }
    td__http_resp_header(resp, "x-amz-request-id", err->request_id, sizeof err->request_id);
    if (!err->retryable && (status == 429 || status >= 500)) err->retryable = 1;
    return 1;
}

td_status td__aws_request(td_aws_t *a, const td__http_req *r, td__http_resp *resp) {
    memset(resp, 0, sizeof *resp);
    memset(&a->last, 0, sizeof a->last);
    char hash[65];
    if (r->payload_sha256)
        snprintf(hash, sizeof hash, "%s", r->payload_sha256);
    else
        td_aws_sha256_hex(r->body ? r->body : "", r->body ? r->body_nbytes : 0, hash);
    td_aws_error err = {0};
    int stalled = 0;
    for (int i = 0; i < a->max_attempts; i++) {
        TD_CHECK(refresh_creds(a));
        td__http_resp_free(resp);
        td_status local;
        int answered = attempt(a, r, hash, resp, &err, &local, &stalled);
        if (local != TD_OK) return local;
        if (answered && resp->status >= 200 && resp->status < 300) return TD_OK;
        /* a capacity error is retryable later, by the caller's choice (another type or zone):
         * here only throttling, 5xx and the network are. A stall is not: each try would wait
         * out the whole window again (5 of them held a run's end for minutes, issue 29). */
        int again = err.retryable && err.kind != TD_AWS_ERRK_CAPACITY && !stalled;
        if (!again || i + 1 == a->max_attempts) break;
        int64_t ms = backoff_ms(a, i);
        TD_LOG_DEBUG("aws %s %s: %s (%s), attempt %d of %d, retrying in %lld ms", r->service,
                     r->action, err.code, err.message, i + 1, a->max_attempts, (long long)ms);
        sleep_ms(ms);
    }
    a->last = err;
    const char *hint = err.code[0] ? code_hint(err.code) : "";
    char tried[64] = "";
    if (err.retryable && err.kind != TD_AWS_ERRK_CAPACITY && !stalled)
        snprintf(tried, sizeof tried, " after %d attempts", a->max_attempts);
    char auth_note[320] = "";
    if (err.kind == TD_AWS_ERRK_AUTH)
        snprintf(auth_note, sizeof auth_note, " (credentials from %s, access key id %.8s...)",
                 a->creds.source, a->creds.access_key_id);
    if (err.http_status == 0)
        return td_error(TD_ERR_PEER, "aws %s %s%s%s at %s failed%s: %s (%s)", r->service, r->action,
                        r->what ? " " : "", r->what ? r->what : "", r->base_url, tried, err.message,
                        err.code);
    return td_error(status_of(err.kind), "aws %s %s%s%s (%s) failed%s: %s: %s [HTTP %d%s%s]%s%s%s",
                    r->service, r->action, r->what ? " " : "", r->what ? r->what : "", a->region,
                    tried, err.code[0] ? err.code : "error", err.message, err.http_status,
                    err.request_id[0] ? ", request id " : "", err.request_id, hint[0] ? "; " : "",
                    hint, auth_note);
}
