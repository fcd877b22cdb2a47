/* The HTTP side of `tandem ui`: libmicrohttpd with a thread per connection (an event stream's
 * reader may then block until the poller has something for it), the access rules, the page's
 * embedded files, and the request plumbing the JSON API (api.c) is written against. Slow and
 * idle clients are bounded by guard.c.
 *
 * Paths are decoded here, segment by segment, and never joined onto a directory: an asset is
 * found by exact name in the compiled-in table, a log by its rank, an artifact by its registered
 * name. MHD's own unescaping is turned off so that an encoded '/' or NUL cannot change a path's
 * shape before it is split. */
#include "ui_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tandem/os.h"

/* A POST body is never read (the one POST takes no body): more than this is refused. */
#define MAX_BODY_BYTES (64 * 1024)
/* Connections at once; each is a thread and two descriptors (its socket and guard.c's dup), so
 * fewer when the descriptor limit is low (see connection_limit). */
#define MAX_CONNECTIONS 1024
/* Seconds without a byte either way before libmicrohttpd closes a connection: a client that
 * stops reading its answer. Event streams send a ping every 15 s, so a live one never idles
 * this long. */
#define IDLE_TIMEOUT_S 60

const char *const td__ui_default_keys[] = {"train/loss", "test/acc"};
const size_t td__ui_ndefault_keys = TD_ARRAY_LEN(td__ui_default_keys);

const td__ui_asset *td__ui_asset_find(const char *name) {
    for (size_t i = 0; i < td__ui_nassets; i++)
        if (!strcmp(td__ui_assets[i].name, name)) return &td__ui_assets[i];
    return NULL;
}

/* ---- the reader pool ---- */

td_rundb *td__ui_db_acquire(td_ui *ui) {
    td_rundb *db = NULL;
    pthread_mutex_lock(&ui->pool_lock);
    while (!ui->nidle && ui->nopen >= TD__UI_MAX_READERS)
        pthread_cond_wait(&ui->pool_cond, &ui->pool_lock);
    if (ui->nidle) {
        db = ui->readers[--ui->nidle];
    } else {
        ui->nopen++;
        pthread_mutex_unlock(&ui->pool_lock);
        /* The writer's paths are fixed; opening only reads them. */
        td_status st = td_rundb_open_reader(ui->writer, &db);
        pthread_mutex_lock(&ui->pool_lock);
        if (st != TD_OK) {
            ui->nopen--;
            db = NULL;
            pthread_cond_signal(&ui->pool_cond);
        }
    }
    pthread_mutex_unlock(&ui->pool_lock);
    return db;
}

void td__ui_db_release(td_ui *ui, td_rundb *db) {
    if (!db) return;
    pthread_mutex_lock(&ui->pool_lock);
    ui->readers[ui->nidle++] = db;
    pthread_cond_signal(&ui->pool_cond);
    pthread_mutex_unlock(&ui->pool_lock);
}

/* ---- replies ---- */

const char *td__ui_arg_get(const td__ui_request *req, const char *name) {
    for (size_t i = 0; i < req->nargs; i++)
        if (!strcmp(req->args[i].name, name)) return req->args[i].value;
    return NULL;
}

void td__ui_reply_json(td__ui_reply *rep, int status, json_t *obj) {
    char *text = json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(obj);
    if (!text) { /* only out of memory: td_x* would have aborted anyway */
        text = strdup("{\"error\":\"the reply could not be encoded\"}");
        status = 500;
    }
    free(rep->body);
    rep->status = status;
    rep->content_type = "application/json";
    rep->body = text;
    rep->nbytes = strlen(text);
}

void td__ui_reply_error(td__ui_reply *rep, int status, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    td__ui_reply_json(rep, status, json_pack("{s:o}", "error", td__ui_json_text(msg, strlen(msg))));
}

/* ---- decoding ---- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decodes s[0..n) into a new string. NULL (with *why) for a NUL byte or a malformed
 * escape: neither has a meaning in a path or a parameter here. */
static char *pct_decode(const char *s, size_t n, const char **why) {
    char *out = td_xmalloc(n + 1);
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            out[j++] = s[i];
            continue;
        }
        int hi = i + 2 < n ? hexval(s[i + 1]) : -1, lo = i + 2 < n ? hexval(s[i + 2]) : -1;
        if (hi >= 0 && lo >= 0) {
            if (hi == 0 && lo == 0) {
                *why = "an encoded NUL byte (%00)";
                free(out);
                return NULL;
            }
            out[j++] = (char)(hi * 16 + lo);
            i += 2;
            continue;
        }
        *why = "a malformed percent escape";
        free(out);
        return NULL;
    }
    out[j] = '\0';
    return out;
}

static void request_free(td__ui_request *req) {
    for (size_t i = 0; i < req->nsegs; i++) free(req->segs[i]);
    free(req->segs);
    for (size_t i = 0; i < req->nargs; i++) {
        free(req->args[i].name);
        free(req->args[i].value);
    }
    free(req->args);
}

/* Splits the raw path on '/' (the first one dropped) and decodes each segment. */
static int parse_path(const char *path, td__ui_request *req, const char **why) {
    if (path[0] != '/') {
        *why = "a path that does not start with '/'";
        return -1;
    }
    const char *p = path + 1;
    size_t cap = 0;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        char *seg = pct_decode(p, n, why);
        if (!seg) return -1;
        if (req->nsegs == cap) {
            cap = cap ? 2 * cap : 8;
            req->segs = td_xrealloc(req->segs, cap * sizeof *req->segs);
        }
        req->segs[req->nsegs++] = seg; /* "/" gives one empty segment, "/a/" ends in one */
        if (!slash) break;
        p = slash + 1;
    }
    return 0;
}

struct arg_walk {
    td__ui_request *req;
    const char *why;
    char *bad_name;
};

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
    (void)kind;
    struct arg_walk *w = cls;
    if (w->why) return MHD_NO;
    const char *why = NULL;
    char *name = pct_decode(key, strlen(key), &why);
    char *val = name && value ? pct_decode(value, strlen(value), &why) : NULL;
    if (name && !val && !why) val = td_xstrdup("");
    if (!name || !val) {
        w->why = why;
        w->bad_name = td_xstrdup(name ? name : key);
        free(name);
        return MHD_NO;
    }
    w->req->args = td_xrealloc(w->req->args, (w->req->nargs + 1) * sizeof *w->req->args);
    w->req->args[w->req->nargs++] = (td__ui_arg){name, val};
    return MHD_YES;
}

/* MHD would decode the path before we split it (an encoded '/' would become a separator, an
 * encoded NUL would cut it short): keep it raw; parse_path and collect_arg decode. */
static size_t keep_raw(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls;
    (void)c;
    return strlen(s);
}

/* ---- access ---- */

static int token_equal(const char *a, const char *b) {
    if (!a || !b) return 0;
    size_t na = strlen(a), nb = strlen(b);
    unsigned diff = na != nb;
    for (size_t i = 0; i < nb; i++)
        diff |= (unsigned char)(i < na ? a[i] : 0) ^ (unsigned char)b[i];
    return diff == 0;
}

/* The host part of a Host header: "127.0.0.1:8080" -> 127.0.0.1, "[::1]:80" -> ::1. */
static void host_name(const char *host, char *out, size_t cap) {
    const char *b = host, *e;
    if (*b == '[') {
        b++;
        e = strchr(b, ']');
        if (!e) e = b + strlen(b);
    } else {
        e = strchr(b, ':');
        if (!e) e = b + strlen(b);
    }
    size_t n = (size_t)(e - b) < cap - 1 ? (size_t)(e - b) : cap - 1;
    memcpy(out, b, n);
    out[n] = '\0';
}

/* Whether a Host header names this machine's loopback: a page served to another site's name
 * (DNS rebinding: evil.example resolving to 127.0.0.1) must not read the API without the token. */
static int host_is_loopback(const char *host) {
    if (!host) return 1; /* HTTP/1.0 without Host: not a browser */
    char name[256];
    host_name(host, name, sizeof name);
    if (!strcasecmp(name, "localhost")) return 1;
    size_t n = strlen(name);
    if (n > 10 && !strcasecmp(name + n - 10, ".localhost")) return 1;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, name, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, name, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
    return 0;
}

/* The token a request carries: header, then cookie, then ?token=; *from_query says which. The
 * cookie is named for the port (tandem_token_8080, as Jupyter names its cookies): a browser
 * keeps one cookie per name and host whatever the port, so two servers on 127.0.0.1 (two
 * projects) would otherwise overwrite each other's, and the first page's event streams and
 * downloads would lose their access. */
static const char *request_token(const td_ui *ui, struct MHD_Connection *c, int allow_query,
                                 int *from_query) {
    *from_query = 0;
    const char *t = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Tandem-Token");
    if (t) return t;
    t = MHD_lookup_connection_value(c, MHD_COOKIE_KIND, ui->cookie_name);
    if (t) return t;
    if (!allow_query) return NULL;
    t = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "token");
    if (t) *from_query = 1;
    return t;
}

/* ---- sending ---- */

static void add_common_headers(struct MHD_Response *r) {
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    /* The token may be in the page's URL: never hand it to another site. */
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    /* No other site may frame the page (and its Stop button). */
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    return td__ui_stream_read(cls, buf, max);
}

static void stream_done(void *cls) {
    td__ui_stream_release(cls);
}

static enum MHD_Result send_reply(struct MHD_Connection *c, td__ui_reply *rep,
                                  const char *set_cookie) {
    struct MHD_Response *r = NULL;
    if (rep->stream) {
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader,
                                              rep->stream, stream_done);
        if (!r) {
            td__ui_stream_release(rep->stream);
            rep->stream = NULL;
            return MHD_NO;
        }
        rep->stream = NULL;
        MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
        /* Proxies (nginx) would hold the stream back in a buffer. */
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
    } else if (rep->fd >= 0) {
        r = MHD_create_response_from_fd64(rep->fd_nbytes, rep->fd);
        if (!r) return MHD_NO;
        rep->fd = -1; /* MHD closes it */
        MHD_add_response_header(r, "Content-Type", "application/octet-stream");
        if (rep->disposition) MHD_add_response_header(r, "Content-Disposition", rep->disposition);
    } else {
        r = MHD_create_response_from_buffer(rep->nbytes, rep->body, MHD_RESPMEM_MUST_FREE);
        if (!r) return MHD_NO;
        rep->body = NULL;
        if (rep->content_type) MHD_add_response_header(r, "Content-Type", rep->content_type);
    }
    add_common_headers(r);
    if (rep->allow) MHD_add_response_header(r, "Allow", rep->allow);
    if (rep->etag) MHD_add_response_header(r, "ETag", rep->etag);
    if (set_cookie) MHD_add_response_header(r, "Set-Cookie", set_cookie);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)rep->status, r);
    MHD_destroy_response(r);
    return ok;
}

static void reply_clear(td__ui_reply *rep) {
    free(rep->body);
    free(rep->disposition);
    if (rep->fd >= 0) close(rep->fd);
    if (rep->stream) td__ui_stream_release(rep->stream);
    memset(rep, 0, sizeof *rep);
    rep->fd = -1;
}

static void serve_asset(const td__ui_asset *a, struct MHD_Connection *c, td__ui_reply *rep) {
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match");
    int not_modified = inm && strstr(inm, a->etag) != NULL;
    rep->status = not_modified ? 304 : 200;
    rep->etag = a->etag;
    rep->content_type = a->content_type;
    if (!not_modified) {
        rep->body = td_xmalloc(a->nbytes + 1);
        memcpy(rep->body, a->data, a->nbytes);
        rep->nbytes = a->nbytes;
    }
}

/* Per-connection state between MHD's calls for one request (a POST's body arrives in parts). */
struct request_state {
    size_t body_bytes;
};

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **state) {
    (void)version;
    (void)upload;
    td_ui *ui = cls;
    int is_post = !strcmp(method, "POST");
    if (!*state) {
        *state = td_xcalloc(1, sizeof(struct request_state));
        return MHD_YES; /* headers only so far */
    }
    struct request_state *rs = *state;
    if (*upload_size) { /* a body: counted and dropped */
        rs->body_bytes += *upload_size;
        *upload_size = 0;
        return MHD_YES;
    }
    td__ui_reply rep = {.fd = -1};
    td__ui_request req = {.method = method};
    char *cookie = NULL;
    const char *why = NULL;
    enum MHD_Result ok;
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");

    if (parse_path(url, &req, &why) != 0) {
        td__ui_reply_error(&rep, 400, "the path %s has %s; ask for a plain path such as /api/runs",
                           url, why);
        goto send;
    }
    struct arg_walk w = {&req, NULL, NULL};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_arg, &w);
    if (w.why) {
        td__ui_reply_error(&rep, 400, "parameter '%s' has %s", w.bad_name, w.why);
        free(w.bad_name);
        goto send;
    }
    if (!is_get && !is_post) {
        rep.allow = "GET, HEAD, POST";
        td__ui_reply_error(&rep, 405, "method %s is not supported; the API takes GET and POST",
                           method);
        goto send;
    }
    if (rs->body_bytes > MAX_BODY_BYTES) {
        td__ui_reply_error(&rep, 413, "request body of %zu bytes; the API takes none",
                           rs->body_bytes);
        goto send;
    }

    /* Access. GET: the token, whatever the address: on a shared machine every local user can
     * reach a loopback port, and the runs' logs and artifacts are no less private than the
     * project directory's mode says. Only a server started with no_token (--no-token) serves
     * GETs without it, on a loopback listener, for a loopback Host. POST: the token (header or
     * cookie, never only the URL) and, when the browser says where the request comes from, our
     * own origin: another site's page cannot stop a run. */
    int from_query = 0;
    const char *token = request_token(ui, c, is_get, &from_query);
    int token_ok = token_equal(token, ui->token);
    if (from_query && !token_ok && is_get) {
        /* A stale ?token= (a previous start's): the header or cookie may still be right. */
        const char *other = request_token(ui, c, 0, &from_query);
        if (other) {
            token = other;
            token_ok = token_equal(token, ui->token);
        }
    }
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (is_get) {
        if (!token_ok && ui->no_token && !host_is_loopback(host)) {
            td__ui_reply_error(&rep, 401,
                               "a request for host '%s' needs the access token (without it this "
                               "server answers only to localhost and 127.0.0.1): open the URL "
                               "'tandem ui' printed (it ends in ?token=...)",
                               host);
            goto send;
        }
        if (!token_ok && !ui->no_token) {
            if (token)
                td__ui_reply_error(&rep, 401,
                                   "the access token of this request is not this server's (a new "
                                   "one is made at every start): open the URL 'tandem ui' printed "
                                   "last (it ends in ?token=...)");
            else
                td__ui_reply_error(&rep, 401,
                                   "%s needs the access token: open the URL 'tandem ui' printed "
                                   "(it ends in ?token=...), or send the header X-Tandem-Token "
                                   "(docs/ui-api.md, \"Access\")",
                                   url);
            goto send;
        }
        if (token_ok && from_query)
            cookie = td_xasprintf("%s=%s; HttpOnly; SameSite=Strict; Path=/", ui->cookie_name,
                                  ui->token);
    } else {
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        if (!token_ok) {
            td__ui_reply_error(&rep, 401,
                               "%s needs the access token (header X-Tandem-Token or the %s "
                               "cookie): open the URL 'tandem ui' printed",
                               url, ui->cookie_name);
            goto send;
        }
        if (origin) {
            char *own = td_xasprintf("http://%s", host ? host : "");
            int same = !strcasecmp(origin, own);
            free(own);
            if (!same) {
                td__ui_reply_error(&rep, 403,
                                   "a request from origin %s may not act on this server (%s); "
                                   "use the page it serves",
                                   origin, host ? host : "no Host header");
                goto send;
            }
        }
    }

    /* Routing: the page, its assets, the API. */
    if (req.nsegs == 1 && !strcmp(req.segs[0], "")) {
        if (!is_get) {
            rep.allow = "GET, HEAD";
            td__ui_reply_error(&rep, 405, "/ takes GET");
        } else {
            serve_asset(td__ui_asset_find("index.html"), c, &rep);
        }
    } else if (req.nsegs == 2 && !strcmp(req.segs[0], "assets")) {
        const td__ui_asset *a =
            strcmp(req.segs[1], "index.html") ? td__ui_asset_find(req.segs[1]) : NULL;
        if (!is_get) {
            rep.allow = "GET, HEAD";
            td__ui_reply_error(&rep, 405, "/assets/ takes GET");
        } else if (!a) {
            td__ui_reply_error(&rep, 404,
                               "no asset '%s'; the page's assets are app.js, style.css, "
                               "uPlot.iife.min.js and uPlot.min.css",
                               req.segs[1]);
        } else {
            serve_asset(a, c, &rep);
        }
    } else if (req.nsegs >= 1 && !strcmp(req.segs[0], "api")) {
        req.last_event_id = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
        td__ui_api(ui, &req, &rep);
    } else {
        td__ui_reply_error(&rep, 404,
                           "no page at %s; the dashboard is at / and the API under /api/ "
                           "(docs/ui-api.md)",
                           url);
    }

send:
    if (!rep.status) td__ui_reply_error(&rep, 500, "internal error: no reply for %s", url);
    if (rep.status != 200) TD_LOG_DEBUG("tandem ui: %s %s -> %d", method, url, rep.status);
    td__ui_guard_answered(ui->guard, c);
    ok = send_reply(c, &rep, cookie);
    reply_clear(&rep);
    request_free(&req);
    free(cookie);
    return ok;
}

static void request_completed(void *cls, struct MHD_Connection *c, void **state,
                              enum MHD_RequestTerminationCode why) {
    td_ui *ui = cls;
    (void)why;
    free(*state);
    *state = NULL;
    /* Kept alive for another request: the guard's clock for it starts now. */
    td__ui_guard_waiting(ui->guard, c);
}

/* MAX_CONNECTIONS, or fewer when the descriptor limit would run out first: two descriptors a
 * connection, and room for the store's files and the event poller. */
static unsigned connection_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return MAX_CONNECTIONS;
    rlim_t spare = rl.rlim_cur > 256 ? (rl.rlim_cur - 128) / 2 : 64;
    return spare < MAX_CONNECTIONS ? (unsigned)spare : MAX_CONNECTIONS;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (!td_log_enabled(TD_LOG_DEBUG)) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0';
    TD_LOG_DEBUG("tandem ui: libmicrohttpd: %s", msg);
}

/* ---- start and stop ---- */

static int valid_token(const char *t) {
    size_t n = strlen(t);
    if (n < 16 || n > 128) return 0;
    for (const char *p = t; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '-'))
            return 0;
    return 1;
}

/* Whether the socket is bound to a loopback address (127/8, ::1, ::ffff:127.x). */
static int bound_loopback(int fd) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) return 0;
    if (a.ss_family == AF_INET)
        return (ntohl(((struct sockaddr_in *)&a)->sin_addr.s_addr) >> 24) == 127;
    if (a.ss_family == AF_INET6) {
        const struct in6_addr *x = &((struct sockaddr_in6 *)&a)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(x) || (IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127);
    }
    return 0;
}

/* The host for the printed URL: the address as given, in brackets when IPv6; this machine's
 * name when it listens on every interface. */
static char *url_host(const char *host) {
    if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !*host) {
        char name[256];
        if (gethostname(name, sizeof name) == 0) {
            name[sizeof name - 1] = '\0';
            return td_xstrdup(name);
        }
        return td_xstrdup("localhost");
    }
    if (strchr(host, ':')) return td_xasprintf("[%s]", host);
    return td_xstrdup(host);
}

td_status td_ui_start(const td_ui_options *opts, td_ui **out) {
    *out = NULL;
    td_status st = TD_OK;
    const char *host = opts->host && *opts->host ? opts->host : "127.0.0.1";
    if (opts->port < 0 || opts->port > 65535)
        return td_error(TD_ERR_INVALID, "port %d: expected 0 (any free port) to 65535", opts->port);
    if (opts->token && !valid_token(opts->token))
        return td_error(TD_ERR_INVALID,
                        "the access token must be 16 to 128 characters of letters, digits, '_' "
                        "and '-' (got %zu characters); leave TANDEM_UI_TOKEN unset for a "
                        "random one",
                        strlen(opts->token));
    td_ui *ui = td_xcalloc(1, sizeof *ui);
    ui->listen_fd = -1;
    pthread_mutex_init(&ui->writer_lock, NULL);
    pthread_mutex_init(&ui->pool_lock, NULL);
    pthread_cond_init(&ui->pool_cond, NULL);
    ui->host = td_xstrdup(host);
    if (opts->token)
        snprintf(ui->token, sizeof ui->token, "%s", opts->token);
    else
        TD_CHECK_GOTO(td_random_hex(ui->token, 16), st, fail);
    TD_CHECK_GOTO(td_rundb_open(opts->project_dir, &ui->writer), st, fail);
    ui->project_dir = td_xstrdup(td_rundb_project_dir(ui->writer));
    TD_CHECK_GOTO(td_listen_tcp(host, opts->port, 64, &ui->listen_fd, &ui->port), st, fail);
    ui->loopback = bound_loopback(ui->listen_fd);
    snprintf(ui->cookie_name, sizeof ui->cookie_name, "tandem_token_%d", ui->port);
    if (opts->no_token && !ui->loopback) {
        st = td_error(TD_ERR_INVALID,
                      "serving without the access token (--no-token) is allowed only on a "
                      "loopback address, and %s is not one: anyone who reaches it could read "
                      "every run; listen on 127.0.0.1 and tunnel (ssh -L), or keep the token",
                      host);
        goto fail;
    }
    ui->no_token = opts->no_token;
    char *uh = url_host(host);
    ui->url = td_xasprintf("http://%s:%d/?token=%s", uh, ui->port, ui->token);
    free(uh);
    TD_CHECK_GOTO(td__ui_events_start(ui, &ui->events), st, fail);
    TD_CHECK_GOTO(td__ui_guard_start(&ui->guard), st, fail);
    /* No MHD_OPTION_PER_IP_CONNECTION_LIMIT: on a loopback listener every local user, and
     * behind a reverse proxy every user, is one address, and a cap there would refuse the
     * token's holders along with a flood. A client without the token holds only connections
     * that have sent no whole request, and guard.c bounds those per address and in all. */
    ui->mhd = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL,
        NULL, handle, ui, MHD_OPTION_LISTEN_SOCKET, ui->listen_fd, MHD_OPTION_CONNECTION_LIMIT,
        connection_limit(), MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
        MHD_OPTION_UNESCAPE_CALLBACK, keep_raw, NULL, MHD_OPTION_NOTIFY_COMPLETED,
        request_completed, ui, MHD_OPTION_NOTIFY_CONNECTION, td__ui_guard_notify, ui->guard,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!ui->mhd) {
        st = td_error(TD_ERR_SYS,
                      "libmicrohttpd could not start serving on %s:%d (run with "
                      "TANDEM_LOG_LEVEL=debug for its reason)",
                      host, ui->port);
        goto fail;
    }
    ui->listen_fd = -1; /* MHD's now: it closes it when it stops */
    *out = ui;
    return TD_OK;
fail:
    td_ui_stop(ui);
    return st;
}

void td_ui_stop(td_ui *ui) {
    if (!ui) return;
    /* Streams first: their readers block, and MHD joins every connection thread. */
    if (ui->events) td__ui_events_stop(ui->events);
    if (ui->mhd) MHD_stop_daemon(ui->mhd);
    td__ui_guard_stop(ui->guard);
    td__ui_events_free(ui->events);
    if (ui->listen_fd >= 0) close(ui->listen_fd);
    for (size_t i = 0; i < ui->nidle; i++) td_rundb_close(ui->readers[i]);
    td_rundb_close(ui->writer);
    pthread_mutex_destroy(&ui->writer_lock);
    pthread_mutex_destroy(&ui->pool_lock);
    pthread_cond_destroy(&ui->pool_cond);
    free(ui->project_dir);
    free(ui->host);
    free(ui->url);
    free(ui);
}

int td_ui_port(const td_ui *ui) {
    return ui->port;
}

const char *td_ui_token(const td_ui *ui) {
    return ui->token;
}

const char *td_ui_url(const td_ui *ui) {
    return ui->url;
}

int td_ui_is_loopback(const td_ui *ui) {
    return ui->loopback;
}

int td_ui_needs_token(const td_ui *ui) {
    return !ui->no_token;
}
