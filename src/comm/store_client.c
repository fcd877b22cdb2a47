/* The rendezvous store client: one blocking TCP connection, one request in flight. */
#include "tandem/comm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/store_proto.h"
#include "comm/store_internal.h"
#include "tandem/os.h"

struct td_store {
    int fd;
    int io_timeout_ms; /* for a reply to an ordinary request */
    char addr[300];
};

int td__store_set_io_timeout(td_store_t *store, int ms) {
    int old = store->io_timeout_ms;
    store->io_timeout_ms = ms;
    return old;
}

int td__store_fd(const td_store_t *store) {
    return store->fd;
}

const char *td__store_addr(const td_store_t *store) {
    return store->addr;
}

/* Extra time the client allows beyond a server-side wait, so the server answers TIMEOUT first. */
#define REPLY_SLACK_MS 30000

static int remaining_ms(uint64_t deadline_ns) {
    if (deadline_ns == 0) return -1;
    uint64_t now = td_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

static td_status io_all(td_store_t *s, bool writing, void *buf, size_t n, uint64_t deadline_ns) {
    uint8_t *p = buf;
    while (n) {
        ssize_t r = writing ? send(s->fd, p, n, MSG_NOSIGNAL) : recv(s->fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return td_error(TD_ERR_PEER,
                            "store %s closed the connection (server stopped, or it "
                            "dropped this client for a protocol violation)",
                            s->addr);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return td_error_errno(TD_ERR_PEER, "store %s: connection failed", s->addr);
        struct pollfd pfd = {.fd = s->fd, .events = writing ? POLLOUT : POLLIN};
        int ms = remaining_ms(deadline_ns);
        if (ms == 0) return td_error(TD_ERR_TIMEOUT, "store %s did not answer in time", s->addr);
        poll(&pfd, 1, ms);
    }
    return TD_OK;
}

static const char *op_name(uint8_t op) {
    static const char *const names[] = {"?", "set", "get", "add", "wait", "compare_set", "delete"};
    return op < TD_ARRAY_LEN(names) ? names[op] : "?";
}

/* The server refused the request at one of its limits; its sentence names the limit and its value
 * (escaped: it came off the wire). A value over the limit is the caller's mistake (as when the
 * client catches it); a full store is TD_ERR_NOSPACE. */
static td_status limit_error(const td_store_t *s, uint8_t op, const char *key,
                             const td_store_resp *r, const uint8_t *text) {
    char safe_text[600], safe_key[200];
    td_escape_text(safe_text, sizeof(safe_text), text, r->len);
    td_escape_text(safe_key, sizeof(safe_key), key ? key : "", key ? strlen(key) : 0);
    td_status st = r->num == TD_STORE_LIMIT_VALUE ? TD_ERR_INVALID : TD_ERR_NOSPACE;
    if (!key || !*key) /* a wait names its keys in its body */
        return td_error(st, "store %s refused %s: %s", s->addr, op_name(op), safe_text);
    return td_error(st, "store %s refused %s '%s': %s", s->addr, op_name(op), safe_key, safe_text);
}

static td_status rpc(td_store_t *s, uint8_t op, uint8_t flags, const char *key, const void *a,
                     size_t a_len, const void *b, size_t b_len, int64_t arg, int wait_ms,
                     td_store_resp *resp, void **data) {
    size_t klen = key ? strlen(key) : 0;
    if (klen > TD_STORE_MAX_KEY)
        return td_error(TD_ERR_INVALID, "store key of %zu bytes is longer than the limit %u", klen,
                        TD_STORE_MAX_KEY);
    if (a_len > TD_STORE_MAX_VALUE || b_len > TD_STORE_MAX_VALUE)
        return td_error(TD_ERR_INVALID,
                        "store value for key '%s' is %zu bytes; the limit is %u bytes per value "
                        "(keep large data elsewhere, e.g. a file, and store its path)",
                        key ? key : "", TD_MAX(a_len, b_len), TD_STORE_MAX_VALUE);
    td_store_req q = {.magic = TD_STORE_MAGIC_REQ,
                      .op = op,
                      .flags = flags,
                      .key_len = (uint32_t)klen,
                      .a_len = a_len,
                      .b_len = b_len,
                      .arg = arg};
    uint64_t io_deadline = td_now_ns() + (uint64_t)s->io_timeout_ms * 1000000ull;
    if (data) *data = NULL;
    /* The socket is non-blocking; header and small bodies go out in one send. */
    if (klen + a_len + b_len <= 4096) {
        uint8_t msg[sizeof(q) + 4096];
        size_t n = 0;
        memcpy(msg, &q, sizeof(q));
        n += sizeof(q);
        if (klen) memcpy(msg + n, key, klen);
        n += klen;
        if (a_len) memcpy(msg + n, a, a_len);
        n += a_len;
        if (b_len) memcpy(msg + n, b, b_len);
        n += b_len;
        TD_CHECK(io_all(s, true, msg, n, io_deadline));
    } else {
        TD_CHECK(io_all(s, true, &q, sizeof(q), io_deadline));
        if (klen) TD_CHECK(io_all(s, true, (void *)key, klen, io_deadline));
        if (a_len) TD_CHECK(io_all(s, true, (void *)a, a_len, io_deadline));
        if (b_len) TD_CHECK(io_all(s, true, (void *)b, b_len, io_deadline));
    }
    uint64_t slack = wait_ms > 0 ? REPLY_SLACK_MS : (uint64_t)s->io_timeout_ms;
    uint64_t reply_deadline =
        wait_ms < 0 ? 0 : td_now_ns() + ((uint64_t)wait_ms + slack) * 1000000ull;
    TD_CHECK(io_all(s, false, resp, sizeof(*resp), reply_deadline));
    if (resp->magic != TD_STORE_MAGIC_RESP || resp->len > TD_STORE_MAX_VALUE + (1u << 20))
        return td_error(TD_ERR_PROTOCOL,
                        "store %s sent a malformed reply (is it a tandem "
                        "store of the same version?)",
                        s->addr);
    uint8_t *buf = td_xmalloc(resp->len + 1);
    td_status st = io_all(s, false, buf, resp->len, io_deadline + 60000000000ull);
    if (st != TD_OK) {
        free(buf);
        TD_CHECK(st);
    }
    buf[resp->len] = 0;
    if (resp->status == TD_STORE_R_LIMIT) {
        st = limit_error(s, op, key, resp, buf);
        free(buf);
        return st;
    }
    if (data)
        *data = buf;
    else
        free(buf);
    return TD_OK;
}

/* *refused: worth another try (not listening yet, unreachable for now, the resolver's
 * temporary failure). deadline_s: td_now_s's clock, 0: the kernel's own timeout. */
static td_status connect_once(const char *host, int port, double deadline_s, int *fd_out,
                              bool *refused) {
    /* a try near the deadline still gets a second: the retry loop's deadline decides whether to
     * dial again, and loopback answers in microseconds, but not always before a zero wait */
    if (deadline_s > 0) deadline_s = TD_MAX(deadline_s, td_now_s() + 1.0);
    td_connect_opts o = {.deadline_s = deadline_s, .peer = "the store"};
    td_connect_result how;
    td_status st = td_connect_tcp(host, port, &o, fd_out, &how);
    *refused = how == TD_CONNECT_REFUSED || how == TD_CONNECT_RESOLVE_AGAIN;
    return st;
}

static td_status full_error(const td_store_t *s, uint32_t limit) {
    return td_error(TD_ERR_NOSPACE,
                    "store %s is full: %u clients are connected, its limit of connections; close "
                    "store connections that are no longer needed (each td_store_connect holds one "
                    "until td_store_close)",
                    s->addr, limit);
}

/* Challenge-response: both sides prove they hold the token without sending it. *retry: the
 * server turned this client away for now (at its connection limit, or it closed the connection
 * before answering: it drops the oldest of too many connections still authenticating), so a new
 * connection may succeed. */
static td_status handshake(td_store_t *s, const char *token, uint64_t deadline, bool *retry) {
    td_store_hello h;
    td_store_auth au = {.magic = TD_STORE_MAGIC_HELLO, .version = TD_STORE_VERSION};
    td_store_auth_reply rep;
    uint8_t expect[TD_STORE_MAC_BYTES];
    *retry = false;
    td_status st = io_all(s, false, &h, sizeof(h), deadline);
    if (st == TD_OK && h.magic == TD_STORE_MAGIC_HELLO && h.flags & TD_STORE_HELLO_FULL) {
        uint32_t limit;
        memcpy(&limit, h.nonce, sizeof(limit));
        *retry = true;
        return full_error(s, limit);
    }
    if (st == TD_OK) {
        if (h.magic != TD_STORE_MAGIC_HELLO || h.version != TD_STORE_VERSION)
            return td_error(TD_ERR_PROTOCOL,
                            "%s is not a tandem store (or speaks another version: "
                            "magic 0x%08x version %u)",
                            s->addr, h.magic, h.version);
        if (td__random_bytes(au.nonce, sizeof(au.nonce)) != 0)
            return td_error_errno(TD_ERR_SYS, "getrandom");
        td__store_mac(token, "tandem-store-client", h.nonce, au.nonce, au.mac);
        st = io_all(s, true, &au, sizeof(au), deadline);
    }
    if (st == TD_OK) st = io_all(s, false, &rep, sizeof(rep), deadline);
    if (st == TD_ERR_PEER) {
        char why[512];
        snprintf(why, sizeof(why), "%s", td_error_msg());
        *retry = true;
        return td_error(TD_ERR_PEER,
                        "store %s closed the connection during the handshake (too many "
                        "connections authenticating at once, or it stopped): %s",
                        s->addr, why);
    }
    TD_CHECK(st);
    if (rep.status == TD_STORE_AUTH_FULL) {
        uint32_t limit;
        memcpy(&limit, rep.mac, sizeof(limit));
        *retry = true;
        return full_error(s, limit);
    }
    if (rep.status != TD_STORE_AUTH_OK)
        return td_error(TD_ERR_AUTH,
                        "store %s refused this client's token (TANDEM_TOKEN differs "
                        "from the job's)",
                        s->addr);
    td__store_mac(token, "tandem-store-server", au.nonce, h.nonce, expect);
    if (!td__store_mac_equal(expect, rep.mac))
        return td_error(TD_ERR_AUTH,
                        "the server at %s could not prove it knows the job token "
                        "(a different job's store on that port?)",
                        s->addr);
    return TD_OK;
}

td_status td_store_connect(const char *host, int port, const char *token, int timeout_ms,
                           td_store_t **out) {
    *out = NULL;
    if (!token || !*token)
        return td_error(TD_ERR_INVALID, "store client: empty token; set TANDEM_TOKEN to the "
                                        "job's token");
    if (!host || !*host) host = "127.0.0.1";
    if (timeout_ms < 0) timeout_ms = (int)td_env_int(TD_ENV_STORE_TIMEOUT_MS);
    uint64_t deadline = td_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    bool warned = false;
    for (unsigned attempt = 0;; attempt++) {
        bool refused, retry = false;
        int fd = -1;
        td_status st =
            connect_once(host, port, timeout_ms > 0 ? (double)deadline * 1e-9 : 0, &fd, &refused);
        if (st == TD_OK) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            /* Non-blocking, so every read and write honours its deadline through poll. */
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            td_store_t *s = td_xcalloc(1, sizeof(*s));
            s->fd = fd;
            s->io_timeout_ms = 60000;
            snprintf(s->addr, sizeof(s->addr), "%s:%d", host, port);
            uint64_t hs_deadline = td_now_ns() + (uint64_t)TD_MAX(timeout_ms, 10000) * 1000000ull;
            st = handshake(s, token, hs_deadline, &retry);
            if (st == TD_OK) {
                *out = s;
                return TD_OK;
            }
            td_store_close(s);
            if (!retry) return st;
            if (!warned && st == TD_ERR_NOSPACE && timeout_ms > 0) {
                TD_LOG_WARN("%s; trying again for up to %d ms", td_error_msg(), timeout_ms);
                warned = true;
            }
        } else if (!refused) {
            return st;
        }
        if (td_now_ns() >= deadline) {
            if (retry) return st; /* the server's reason, recorded above */
            return td_error(TD_ERR_TIMEOUT,
                            "store at %s:%d did not accept a connection "
                            "within %d ms (is the server running?)",
                            host, port, timeout_ms);
        }
        usleep(TD_MIN(10000u << TD_MIN(attempt, 4u), 100000u));
    }
}

void td_store_close(td_store_t *store) {
    if (!store) return;
    if (store->fd >= 0) close(store->fd);
    free(store);
}

static td_status check_key(const char *key) {
    if (!key || !*key) return td_error(TD_ERR_INVALID, "store: empty key");
    return TD_OK;
}

td_status td_store_set(td_store_t *store, const char *key, const void *value, size_t nbytes) {
    td_store_resp r;
    TD_CHECK(check_key(key));
    TD_CHECK(rpc(store, TD_STORE_OP_SET, 0, key, value, nbytes, NULL, 0, 0, 0, &r, NULL));
    if (r.status != TD_STORE_R_OK)
        return td_error(TD_ERR_PROTOCOL, "store set '%s' failed with code %u", key, r.status);
    return TD_OK;
}

static int resolve_timeout(int timeout_ms) {
    return timeout_ms < 0 ? (int)td_env_int(TD_ENV_STORE_TIMEOUT_MS) : timeout_ms;
}

td_status td_store_get(td_store_t *store, const char *key, void **value, size_t *nbytes,
                       int timeout_ms) {
    td_store_resp r;
    void *data;
    *value = NULL;
    if (nbytes) *nbytes = 0;
    TD_CHECK(check_key(key));
    timeout_ms = resolve_timeout(timeout_ms);
    TD_CHECK(
        rpc(store, TD_STORE_OP_GET, 0, key, NULL, 0, NULL, 0, timeout_ms, timeout_ms, &r, &data));
    if (r.status == TD_STORE_R_OK) {
        *value = data;
        if (nbytes) *nbytes = r.len;
        return TD_OK;
    }
    free(data);
    if (r.status == TD_STORE_R_NOTFOUND || (r.status == TD_STORE_R_TIMEOUT && timeout_ms == 0))
        return td_error(TD_ERR_NOTFOUND, "store key '%s' does not exist", key);
    if (r.status == TD_STORE_R_TIMEOUT)
        return td_error(TD_ERR_TIMEOUT, "store key '%s' did not appear within %d ms", key,
                        timeout_ms);
    return td_error(TD_ERR_PROTOCOL, "store get '%s' failed with code %u", key, r.status);
}

td_status td_store_add(td_store_t *store, const char *key, int64_t delta, int64_t *result) {
    td_store_resp r;
    TD_CHECK(check_key(key));
    TD_CHECK(rpc(store, TD_STORE_OP_ADD, 0, key, NULL, 0, NULL, 0, delta, 0, &r, NULL));
    if (r.status == TD_STORE_R_INVALID)
        return td_error(TD_ERR_INVALID,
                        "store add '%s': the key holds a value that is not a "
                        "decimal integer",
                        key);
    if (r.status != TD_STORE_R_OK)
        return td_error(TD_ERR_PROTOCOL, "store add '%s' failed with code %u", key, r.status);
    if (result) *result = r.num;
    return TD_OK;
}

td_status td_store_wait(td_store_t *store, const char *const *keys, int nkeys, int timeout_ms) {
    if (nkeys <= 0) return TD_OK;
    size_t len = 0;
    for (int i = 0; i < nkeys; i++) {
        TD_CHECK(check_key(keys[i]));
        len += 4 + strlen(keys[i]);
    }
    if (len > TD_STORE_MAX_WAIT_BLOB)
        return td_error(TD_ERR_INVALID,
                        "store wait: %d keys (%zu bytes) exceed the %u-byte "
                        "limit of one wait",
                        nkeys, len, TD_STORE_MAX_WAIT_BLOB);
    uint8_t *blob = td_xmalloc(len);
    size_t off = 0;
    for (int i = 0; i < nkeys; i++) {
        uint32_t kl = (uint32_t)strlen(keys[i]);
        memcpy(blob + off, &kl, 4);
        memcpy(blob + off + 4, keys[i], kl);
        off += 4 + kl;
    }
    timeout_ms = resolve_timeout(timeout_ms);
    td_store_resp r;
    void *data = NULL;
    td_status st = rpc(store, TD_STORE_OP_WAIT, 0, NULL, blob, len, NULL, 0, timeout_ms, timeout_ms,
                       &r, &data);
    free(blob);
    TD_CHECK(st);
    if (r.status == TD_STORE_R_OK) {
        st = TD_OK;
    } else if (r.status == TD_STORE_R_TIMEOUT) {
        /* data: the missing keys, one per line (escaped: they came off the wire) */
        char missing[2048];
        for (char *p = data; *p; p++)
            if (*p == '\n') *p = ',';
        td_escape_text(missing, sizeof(missing), data, r.len);
        st = td_error(TD_ERR_TIMEOUT, "store wait: key(s) %s did not appear within %d ms", missing,
                      timeout_ms);
    } else {
        st = td_error(TD_ERR_PROTOCOL, "store wait failed with code %u", r.status);
    }
    free(data);
    return st;
}

td_status td_store_compare_set(td_store_t *store, const char *key, const void *expected,
                               size_t expected_nbytes, const void *desired, size_t desired_nbytes,
                               void **actual, size_t *actual_nbytes) {
    td_store_resp r;
    void *data;
    TD_CHECK(check_key(key));
    uint8_t flags = (!expected && expected_nbytes == 0) ? TD_STORE_CAS_EXPECT_ABSENT : 0;
    TD_CHECK(rpc(store, TD_STORE_OP_CAS, flags, key, expected, expected_nbytes, desired,
                 desired_nbytes, 0, 0, &r, &data));
    if (r.status != TD_STORE_R_OK) {
        free(data);
        return td_error(TD_ERR_PROTOCOL, "store compare_set '%s' failed with code %u", key,
                        r.status);
    }
    if (actual) {
        if (r.num & 1) {
            *actual = data;
        } else {
            *actual = NULL;
            free(data);
        }
    } else {
        free(data);
    }
    if (actual_nbytes) *actual_nbytes = (r.num & 1) ? r.len : 0;
    return TD_OK;
}

td_status td_store_delete(td_store_t *store, const char *key, bool *existed) {
    td_store_resp r;
    TD_CHECK(check_key(key));
    TD_CHECK(rpc(store, TD_STORE_OP_DELETE, 0, key, NULL, 0, NULL, 0, 0, 0, &r, NULL));
    if (r.status != TD_STORE_R_OK)
        return td_error(TD_ERR_PROTOCOL, "store delete '%s' failed with code %u", key, r.status);
    if (existed) *existed = r.num != 0;
    return TD_OK;
}
