/* The instance metadata service, IMDSv2 only: a session token from PUT /latest/api/token on
 * every request, renewed before its TTL ends; the spot notices' documents parsed. One client for
 * the instance role's credentials (creds.c) and the node agent's spot watch (launch). */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "cloud/cloud_internal.h"

#define IMDS_DEFAULT_ENDPOINT "http://169.254.169.254"
#define IMDS_TTL_MAX_S        21600
/* The AWS tools' timeouts: on a machine that is no EC2 instance, nothing answers at the
 * link-local address, and asking must not hold anything up. */
#define IMDS_CONNECT_TIMEOUT_MS 1000L
#define IMDS_TIMEOUT_MS         2000L
#define IMDS_BODY_MAX           (1 << 20) /* its answers are small */

struct td_imds {
    char *base; /* scheme://host[:port], no trailing slash */
    int ttl_s;
    char *token;      /* NULL: none yet, or dropped after a 401 */
    double renew_at;  /* monotonic seconds: fetch a new token from then on */
    CURL *curl;       /* kept between calls: one connection, kept alive */
    atomic_bool stop; /* td_imds_cancel */
};

typedef struct {
    char *buf;
    size_t n;
} membuf;

static size_t mem_write(char *p, size_t size, size_t nmemb, void *ud) {
    membuf *m = ud;
    size_t n = size * nmemb;
    if (m->n + n > IMDS_BODY_MAX) return 0;
    m->buf = td_xrealloc(m->buf, m->n + n + 1);
    memcpy(m->buf + m->n, p, n);
    m->n += n;
    m->buf[m->n] = '\0';
    return n;
}

/* libcurl asks this often during a transfer: a nonzero answer aborts it (td_imds_cancel). */
static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)dt, (void)dn, (void)ut, (void)un;
    return atomic_load(&((td_imds_t *)ud)->stop) ? 1 : 0;
}

static void wipe_free(char *s) {
    if (!s) return;
    memset(s, 0, strlen(s));
    free(s);
}

td_status td_imds_new(const td_imds_opts *opts, td_imds_t **out) {
    *out = NULL;
    TD_CHECK(td__curl_global_init());
    const char *ep = opts && opts->endpoint ? opts->endpoint : NULL;
    bool from_env = false;
    if (!ep) {
        ep = td_aws_env_get(TD_AWS_ENV_AWS_EC2_METADATA_SERVICE_ENDPOINT);
        from_env = ep != NULL;
    }
    if (!ep) ep = IMDS_DEFAULT_ENDPOINT;
    int ttl = opts && opts->token_ttl_s ? opts->token_ttl_s : IMDS_TTL_MAX_S;
    if (ttl < 1 || ttl > IMDS_TTL_MAX_S)
        return td_error(TD_ERR_INVALID, "IMDS token TTL %d s: IMDSv2 takes 1..%d", ttl,
                        IMDS_TTL_MAX_S);
    char *base = td_xstrdup(ep);
    size_t n = strlen(base);
    while (n && base[n - 1] == '/') base[--n] = '\0';
    /* every path asked for starts at /latest: the endpoint has none of its own */
    if (strncmp(base, "http://", 7) || !base[7] || strchr(base + 7, '/')) {
        free(base);
        return td_error(TD_ERR_INVALID,
                        "the instance metadata endpoint '%s'%s is not http://host[:port]; give "
                        "e.g. http://169.254.169.254 (or unset the variable)",
                        ep, from_env ? " (AWS_EC2_METADATA_SERVICE_ENDPOINT)" : "");
    }
    CURL *curl = curl_easy_init();
    if (!curl) {
        free(base);
        return td_error(TD_ERR_NOMEM, "libcurl: cannot create a handle for IMDS");
    }
    td_imds_t *c = td_xcalloc(1, sizeof *c);
    c->base = base;
    c->ttl_s = ttl;
    c->curl = curl;
    atomic_init(&c->stop, false);
    *out = c;
    return TD_OK;
}

void td_imds_free(td_imds_t *c) {
    if (!c) return;
    wipe_free(c->token);
    curl_easy_cleanup(c->curl);
    free(c->base);
    free(c);
}

const char *td_imds_endpoint(const td_imds_t *c) {
    return c->base;
}

void td_imds_cancel(td_imds_t *c) {
    atomic_store(&c->stop, true);
}

/* One request: method on path with header hdr. *status 0 when nothing answered. The body is
 * returned for 200 only. */
static td_status call(td_imds_t *c, const char *method, const char *path, const char *hdr,
                      membuf *body, long *status) {
    *status = 0;
    body->buf = NULL;
    body->n = 0;
    if (atomic_load(&c->stop))
        return td_error(TD_ERR_INTERRUPTED, "IMDS %s %s%s: cancelled", method, c->base, path);
    CURL *h = c->curl;
    curl_easy_reset(h);
    char *url = td_xasprintf("%s%s", c->base, path);
    struct curl_slist *hl = curl_slist_append(NULL, hdr);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (!strcmp(method, "PUT")) {
        /* an empty body, sent as such (no "Expect: 100-continue" wait) */
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, mem_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, IMDS_CONNECT_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, IMDS_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*"); /* the link-local service is never proxied */
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, c);
    CURLcode cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(hl);
    td_status st = TD_OK;
    if (cc == CURLE_ABORTED_BY_CALLBACK)
        st = td_error(TD_ERR_INTERRUPTED, "IMDS %s %s: cancelled", method, url);
    else if (cc == CURLE_OPERATION_TIMEDOUT)
        st = td_error(TD_ERR_TIMEOUT, "IMDS %s %s: no answer within %ld ms (curl: %s)", method, url,
                      IMDS_TIMEOUT_MS, curl_easy_strerror(cc));
    else if (cc != CURLE_OK)
        st = td_error(TD_ERR_PEER, "IMDS %s %s: %s (curl:%d)", method, url, curl_easy_strerror(cc),
                      (int)cc);
    if (cc != CURLE_OK) *status = 0;
    free(url);
    if (st != TD_OK || *status != 200) {
        if (body->buf) wipe_free(body->buf);
        body->buf = NULL;
        body->n = 0;
    } else if (!body->buf) {
        body->buf = td_xstrdup("");
    }
    return st;
}

static td_status fetch_token(td_imds_t *c, int *status_out) {
    char hdr[80];
    snprintf(hdr, sizeof hdr, "X-aws-ec2-metadata-token-ttl-seconds: %d", c->ttl_s);
    double t0 = td_now_s();
    membuf b;
    long status;
    td_status st = call(c, "PUT", "/latest/api/token", hdr, &b, &status);
    *status_out = (int)status;
    if (st != TD_OK) return st;
    if (status != 200)
        return td_error(status == 401 || status == 403 ? TD_ERR_AUTH : TD_ERR_PEER,
                        "IMDS PUT %s/latest/api/token: HTTP %ld, no session token (is this "
                        "IMDSv2? a 403 here means a proxy header or a hop limit too low for a "
                        "container: raise HttpPutResponseHopLimit)",
                        c->base, status);
    /* the token goes into every later request's headers: a control character in it (past a
     * final newline) would split them; refused, never shown */
    size_t n = strlen(b.buf);
    while (n && (b.buf[n - 1] == '\n' || b.buf[n - 1] == '\r')) b.buf[--n] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)b.buf[i] < 0x20 || b.buf[i] == 0x7f) {
            wipe_free(b.buf);
            return td_error(TD_ERR_PROTOCOL,
                            "IMDS PUT %s/latest/api/token: the session token has a control "
                            "character (byte %zu of %zu; the token is not shown): is something "
                            "other than the instance metadata service answering there?",
                            c->base, i, n);
        }
    if (!*b.buf) {
        wipe_free(b.buf);
        return td_error(TD_ERR_PROTOCOL, "IMDS PUT %s/latest/api/token: an empty token", c->base);
    }
    wipe_free(c->token);
    c->token = b.buf;
    /* renewed a minute (or a quarter of a short TTL) before it ends, measured from before the
     * request: the service's clock started no earlier */
    c->renew_at = t0 + c->ttl_s - TD_MIN(60.0, c->ttl_s / 4.0);
    return TD_OK;
}

td_status td_imds_get(td_imds_t *c, const char *path, char **body_out, int *http_status_out) {
    if (body_out) *body_out = NULL;
    int dummy;
    if (!http_status_out) http_status_out = &dummy;
    *http_status_out = 0;
    while (*path == '/') path++;
    char *p = td_xasprintf("/%s", path);
    td_status st = TD_OK;
    for (int attempt = 0;; attempt++) {
        bool fresh = false;
        if (!c->token || td_now_s() >= c->renew_at) {
            TD_CHECK_GOTO(fetch_token(c, http_status_out), st, out);
            fresh = true;
        }
        char *hdr = td_xasprintf("X-aws-ec2-metadata-token: %s", c->token);
        membuf b;
        long status;
        st = call(c, "GET", p, hdr, &b, &status);
        wipe_free(hdr);
        *http_status_out = (int)status;
        if (st != TD_OK) goto out;
        if (status == 401 && !fresh && attempt == 0) {
            /* the service forgot our token (it restarted): one more try with a new one */
            wipe_free(c->token);
            c->token = NULL;
            continue;
        }
        if (status == 200) {
            if (body_out)
                *body_out = b.buf;
            else
                wipe_free(b.buf);
        } else if (status != 404) {
            st = td_error(status == 401 || status == 403 ? TD_ERR_AUTH : TD_ERR_PEER,
                          "IMDS GET %s%s: HTTP %ld%s", c->base, p, status,
                          status == 401 ? " with a fresh session token" : "");
        }
        goto out;
    }
out:
    free(p);
    return st;
}

/* ---- the spot notices ---- */

static double parse_time(const char *s) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    return end ? (double)timegm(&tm) : 0;
}

static td_status notice_parse(const char *json, const char *what, const char *action_key,
                              const char *time_key, td_spot_notice *out) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *j = json_loads(json, 0, &jerr);
    if (!j || !json_is_object(j)) {
        if (j) json_decref(j);
        return td_error(TD_ERR_FORMAT, "%s: not a JSON object (%s): '%.120s'", what,
                        j ? "another type" : jerr.text, json);
    }
    const char *action = action_key ? json_string_value(json_object_get(j, action_key)) : NULL;
    const char *time_s = json_string_value(json_object_get(j, time_key));
    td_status st = TD_OK;
    if (action_key && (!action || !*action))
        st = td_error(TD_ERR_FORMAT, "%s: no string \"%s\" in '%.120s'", what, action_key, json);
    else if (!time_s || !*time_s)
        st = td_error(TD_ERR_FORMAT, "%s: no string \"%s\" in '%.120s'", what, time_key, json);
    if (st == TD_OK) {
        snprintf(out->action, sizeof out->action, "%s", action ? action : "rebalance");
        snprintf(out->time, sizeof out->time, "%s", time_s);
        out->time_wall_s = parse_time(time_s);
    }
    json_decref(j);
    return st;
}

td_status td_spot_action_parse(const char *json, td_spot_notice *out) {
    return notice_parse(json, TD_IMDS_SPOT_ACTION, "action", "time", out);
}

td_status td_spot_rebalance_parse(const char *json, td_spot_notice *out) {
    return notice_parse(json, TD_IMDS_REBALANCE, NULL, "noticeTime", out);
}
