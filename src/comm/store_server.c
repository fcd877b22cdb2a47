/* The rendezvous store server: one thread, poll(2) over non-blocking sockets, a hash table of
 * keys. Requests that wait (GET with a timeout, WAIT) park their connection until the keys appear
 * or the deadline passes; every mutation re-checks the parked connections. A connection that
 * fails authentication, sends garbage or an oversize frame, or stalls mid-handshake/mid-frame is
 * logged and dropped without disturbing the others. */
#include "tandem/comm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nettle/hmac.h>
#include <nettle/memops.h>

#include "comm/store_proto.h"

/* ---------------- shared helpers (declared in store_proto.h) ---------------- */

void td__store_mac(const char *token, const char *label, const uint8_t *n1, const uint8_t *n2,
                   uint8_t out[TD_STORE_MAC_BYTES]) {
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, strlen(token), (const uint8_t *)token);
    hmac_sha256_update(&ctx, strlen(label), (const uint8_t *)label);
    hmac_sha256_update(&ctx, TD_STORE_NONCE_BYTES, n1);
    hmac_sha256_update(&ctx, TD_STORE_NONCE_BYTES, n2);
    hmac_sha256_digest(&ctx, TD_STORE_MAC_BYTES, out);
}

int td__store_mac_equal(const uint8_t *a, const uint8_t *b) {
    return memeql_sec(a, b, TD_STORE_MAC_BYTES);
}

int td__random_bytes(void *buf, size_t nbytes) {
    uint8_t *p = buf;
    while (nbytes) {
        ssize_t n = getrandom(p, nbytes, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        nbytes -= (size_t)n;
    }
    return 0;
}

/* ---------------- key table ---------------- */

typedef struct entry {
    struct entry *next;
    char *key;
    uint8_t *val;
    size_t nbytes;
} entry;

typedef struct {
    entry **buckets;
    size_t nbuckets, count;
} table;

static uint64_t hash_key(const char *k) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *k; k++) h = (h ^ (uint8_t)*k) * 1099511628211ull;
    return h;
}

static entry *table_find(table *t, const char *key) {
    for (entry *e = t->buckets[hash_key(key) & (t->nbuckets - 1)]; e; e = e->next)
        if (!strcmp(e->key, key)) return e;
    return NULL;
}

static void table_grow(table *t) {
    size_t nb = t->nbuckets * 2;
    entry **b = td_xcalloc(nb, sizeof(*b));
    for (size_t i = 0; i < t->nbuckets; i++) {
        for (entry *e = t->buckets[i], *next; e; e = next) {
            next = e->next;
            size_t h = hash_key(e->key) & (nb - 1);
            e->next = b[h];
            b[h] = e;
        }
    }
    free(t->buckets);
    t->buckets = b;
    t->nbuckets = nb;
}

/* Takes ownership of val. */
static void table_put(table *t, const char *key, uint8_t *val, size_t nbytes) {
    entry *e = table_find(t, key);
    if (e) {
        free(e->val);
        e->val = val;
        e->nbytes = nbytes;
        return;
    }
    if (t->count + 1 > t->nbuckets) table_grow(t);
    e = td_xcalloc(1, sizeof(*e));
    e->key = td_xstrdup(key);
    e->val = val;
    e->nbytes = nbytes;
    size_t h = hash_key(key) & (t->nbuckets - 1);
    e->next = t->buckets[h];
    t->buckets[h] = e;
    t->count++;
}

static bool table_delete(table *t, const char *key) {
    for (entry **pp = &t->buckets[hash_key(key) & (t->nbuckets - 1)]; *pp; pp = &(*pp)->next) {
        entry *e = *pp;
        if (!strcmp(e->key, key)) {
            *pp = e->next;
            free(e->key);
            free(e->val);
            free(e);
            t->count--;
            return true;
        }
    }
    return false;
}

static void table_free(table *t) {
    for (size_t i = 0; i < t->nbuckets; i++) {
        for (entry *e = t->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e->key);
            free(e->val);
            free(e);
        }
    }
    free(t->buckets);
}

/* ---------------- connections ---------------- */

typedef enum { C_HELLO, C_READY, C_WAITING } conn_state;

typedef struct conn {
    int fd;
    char peer[64];
    conn_state state;
    uint8_t nonce[TD_STORE_NONCE_BYTES];
    uint64_t deadline_ns; /* handshake or frame-in-progress deadline; 0 = none */
    /* input: the fixed header first, then the body it announces */
    uint8_t hdr[sizeof(td_store_auth)];
    size_t hdr_have;
    td_store_req req;
    uint8_t *body;
    size_t body_len, body_have;
    /* parked request */
    uint64_t wait_deadline_ns; /* 0 = forever */
    /* output */
    uint8_t *out;
    size_t out_len, out_off, out_cap;
} conn;

struct td_store_server {
    int listen_fd;
    int wake_fd;
    int port;
    char *token;
    pthread_t thread;
    atomic_bool stop;
    table kv;
    conn **conns;
    size_t nconns, cap_conns;
    int handshake_ms, frame_ms;
    uint64_t accept_resume_ns; /* out of descriptors: accept again from then on (0: now) */
};

#define OUT_MAX ((size_t)256 << 20) /* a client that never reads its replies is dropped */

void td__store_server_set_deadlines(td_store_server_t *srv, int handshake_ms, int frame_ms) {
    srv->handshake_ms = handshake_ms;
    srv->frame_ms = frame_ms;
}

static void conn_free(conn *c) {
    if (c->fd >= 0) close(c->fd);
    free(c->body);
    free(c->out);
    free(c);
}

static void drop(td_store_server_t *srv, size_t i, const char *why) {
    conn *c = srv->conns[i];
    if (why) TD_LOG_WARN("store: dropping connection from %s: %s", c->peer, why);
    conn_free(c);
    srv->conns[i] = srv->conns[--srv->nconns];
}

static void out_append(conn *c, const void *p, size_t n) {
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n) cap *= 2;
        c->out = td_xrealloc(c->out, cap);
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
}

static void respond(conn *c, uint32_t status, int64_t num, const void *data, size_t len) {
    td_store_resp r = {.magic = TD_STORE_MAGIC_RESP, .status = status, .len = len, .num = num};
    out_append(c, &r, sizeof(r));
    if (len) out_append(c, data, len);
}

/* Returns false when the connection broke. */
static bool flush_out(conn *c) {
    while (c->out_off < c->out_len) {
        ssize_t n =
            send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
            return false;
        }
        c->out_off += (size_t)n;
    }
    c->out_off = c->out_len = 0;
    if (c->out_cap > (1u << 20)) { /* don't keep a 64 MiB reply buffer around */
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    return true;
}

static uint64_t ms_from_now(int64_t ms) {
    return td_now_ns() + (uint64_t)ms * 1000000ull;
}

/* WAIT's key list: repeated (u32 length, bytes). Returns the number of keys or -1. */
static int wait_keys_missing(td_store_server_t *srv, const uint8_t *blob, size_t len, conn *reply) {
    size_t off = 0;
    int missing = 0;
    char key[TD_STORE_MAX_KEY + 1];
    while (off < len) {
        uint32_t kl;
        if (len - off < 4) return -1;
        memcpy(&kl, blob + off, 4);
        off += 4;
        if (kl == 0 || kl > TD_STORE_MAX_KEY || kl > len - off) return -1;
        memcpy(key, blob + off, kl);
        key[kl] = 0;
        off += kl;
        if (memchr(key, 0, kl)) return -1;
        if (!table_find(&srv->kv, key)) {
            if (reply) {
                if (missing) out_append(reply, "\n", 1);
                out_append(reply, key, kl);
            }
            missing++;
        }
    }
    return missing;
}

/* Tries to answer a parked request; returns true when it was answered. */
static bool try_complete_wait(td_store_server_t *srv, conn *c, bool timed_out) {
    const char *key = (const char *)c->body;
    if (c->req.op == TD_STORE_OP_GET) {
        entry *e = table_find(&srv->kv, key);
        if (e) {
            respond(c, TD_STORE_R_OK, 0, e->val, e->nbytes);
            return true;
        }
        if (timed_out) {
            respond(c, TD_STORE_R_TIMEOUT, 0, NULL, 0);
            return true;
        }
        return false;
    }
    /* WAIT */
    const uint8_t *blob = c->body + c->req.key_len + 1;
    int missing = wait_keys_missing(srv, blob, c->req.a_len, NULL);
    if (missing == 0) {
        respond(c, TD_STORE_R_OK, 0, NULL, 0);
        return true;
    }
    if (!timed_out) return false;
    /* The reply's data names the missing keys, one per line. */
    td_store_resp r = {.magic = TD_STORE_MAGIC_RESP, .status = TD_STORE_R_TIMEOUT};
    size_t at = c->out_len;
    out_append(c, &r, sizeof(r));
    wait_keys_missing(srv, blob, c->req.a_len, c);
    uint64_t len = c->out_len - at - sizeof(r);
    memcpy(c->out + at + offsetof(td_store_resp, len), &len, sizeof(len));
    return true;
}

static void wake_waiters(td_store_server_t *srv) {
    for (size_t i = 0; i < srv->nconns; i++) {
        conn *c = srv->conns[i];
        if (c->state == C_WAITING && try_complete_wait(srv, c, false)) {
            c->state = C_READY;
            free(c->body);
            c->body = NULL;
        }
    }
}

static bool parse_i64(const uint8_t *p, size_t n, int64_t *out) {
    char buf[32];
    if (n == 0 || n >= sizeof(buf)) return false;
    memcpy(buf, p, n);
    buf[n] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

/* Executes the complete request in c->body (key NUL-terminated, then a, then b). Returns false
 * when the request is malformed and the connection should be dropped. */
static bool execute(td_store_server_t *srv, conn *c) {
    const td_store_req *q = &c->req;
    char *key = (char *)c->body;
    uint8_t *a = c->body + q->key_len + 1;
    uint8_t *b = a + q->a_len;
    bool mutated = false;
    if (memchr(key, 0, q->key_len)) return false;
    switch (q->op) {
    case TD_STORE_OP_SET: {
        uint8_t *v = td_xmalloc(q->a_len ? q->a_len : 1);
        memcpy(v, a, q->a_len);
        table_put(&srv->kv, key, v, q->a_len);
        respond(c, TD_STORE_R_OK, 0, NULL, 0);
        mutated = true;
        break;
    }
    case TD_STORE_OP_GET:
    case TD_STORE_OP_WAIT:
        if (q->op == TD_STORE_OP_WAIT && wait_keys_missing(srv, a, q->a_len, NULL) < 0)
            return false;
        if (try_complete_wait(srv, c, q->arg == 0)) break;
        c->state = C_WAITING;
        c->wait_deadline_ns = q->arg < 0 ? 0 : ms_from_now(q->arg);
        return true; /* body kept until answered */
    case TD_STORE_OP_ADD: {
        entry *e = table_find(&srv->kv, key);
        int64_t cur = 0;
        if (e && !parse_i64(e->val, e->nbytes, &cur)) {
            respond(c, TD_STORE_R_INVALID, 0, NULL, 0);
            break;
        }
        int64_t sum = (int64_t)((uint64_t)cur + (uint64_t)q->arg);
        char *txt = td_xasprintf("%lld", (long long)sum);
        table_put(&srv->kv, key, (uint8_t *)txt, strlen(txt));
        respond(c, TD_STORE_R_OK, sum, NULL, 0);
        mutated = true;
        break;
    }
    case TD_STORE_OP_CAS: {
        entry *e = table_find(&srv->kv, key);
        bool expect_absent = q->flags & TD_STORE_CAS_EXPECT_ABSENT;
        bool match = expect_absent ? e == NULL
                                   : (e && e->nbytes == q->a_len && !memcmp(e->val, a, q->a_len));
        if (match) {
            uint8_t *v = td_xmalloc(q->b_len ? q->b_len : 1);
            memcpy(v, b, q->b_len);
            table_put(&srv->kv, key, v, q->b_len);
            mutated = true;
            e = table_find(&srv->kv, key);
        }
        if (e)
            respond(c, TD_STORE_R_OK, 1, e->val, e->nbytes);
        else
            respond(c, TD_STORE_R_OK, 0, NULL, 0);
        break;
    }
    case TD_STORE_OP_DELETE:
        respond(c, TD_STORE_R_OK, table_delete(&srv->kv, key) ? 1 : 0, NULL, 0);
        break;
    default:
        return false;
    }
    free(c->body);
    c->body = NULL;
    if (mutated) wake_waiters(srv);
    return true;
}

/* Reads what is available. Returns NULL to keep the connection, or why to drop it. */
static const char *conn_read(td_store_server_t *srv, conn *c) {
    for (;;) {
        if (c->state == C_WAITING || c->out_len) return NULL; /* one request at a time */
        uint8_t *dst;
        size_t want;
        size_t hdr_size = c->state == C_HELLO ? sizeof(td_store_auth) : sizeof(td_store_req);
        if (c->hdr_have < hdr_size) {
            dst = c->hdr + c->hdr_have;
            want = hdr_size - c->hdr_have;
        } else {
            dst = c->body + c->body_have;
            want = c->body_len - c->body_have;
        }
        ssize_t n = recv(c->fd, dst, want, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return NULL;
            return "read error";
        }
        if (n == 0) {
            if (c->state == C_HELLO) return "closed before authenticating";
            if (c->hdr_have || c->body_have) return "closed in the middle of a request";
            return ""; /* ordinary close */
        }
        if (c->hdr_have == 0 && c->state != C_HELLO) c->deadline_ns = ms_from_now(srv->frame_ms);
        if (c->hdr_have < hdr_size) {
            c->hdr_have += (size_t)n;
            if (c->hdr_have < hdr_size) continue;
            if (c->state == C_HELLO) {
                td_store_auth au;
                memcpy(&au, c->hdr, sizeof(au));
                if (au.magic != TD_STORE_MAGIC_HELLO)
                    return "not a tandem store client (bad magic)";
                if (au.version != TD_STORE_VERSION) return "unsupported protocol version";
                uint8_t expect[TD_STORE_MAC_BYTES];
                td__store_mac(srv->token, "tandem-store-client", c->nonce, au.nonce, expect);
                td_store_auth_reply rep = {.status = 1};
                if (!td__store_mac_equal(expect, au.mac)) {
                    /* Tell the client, so it can report TD_ERR_AUTH instead of a reset. */
                    send(c->fd, &rep, sizeof(rep), MSG_NOSIGNAL | MSG_DONTWAIT);
                    return "wrong token (authentication failed)";
                }
                rep.status = 0;
                td__store_mac(srv->token, "tandem-store-server", au.nonce, c->nonce, rep.mac);
                out_append(c, &rep, sizeof(rep));
                c->state = C_READY;
                c->hdr_have = 0;
                c->deadline_ns = 0;
                if (!flush_out(c)) return "write error";
                continue;
            }
            memcpy(&c->req, c->hdr, sizeof(c->req));
            const td_store_req *q = &c->req;
            if (q->magic != TD_STORE_MAGIC_REQ) return "garbage (bad request magic)";
            if (q->key_len > TD_STORE_MAX_KEY) return "oversize key";
            uint64_t amax = q->op == TD_STORE_OP_WAIT ? TD_STORE_MAX_WAIT_BLOB : TD_STORE_MAX_VALUE;
            if (q->a_len > amax || q->b_len > TD_STORE_MAX_VALUE) return "oversize value";
            if (q->op < TD_STORE_OP_SET || q->op > TD_STORE_OP_DELETE) return "unknown request";
            if (q->op != TD_STORE_OP_WAIT && q->key_len == 0) return "empty key";
            /* key + NUL + a + b, so the key can be used as a C string in place */
            c->body_len = q->key_len + q->a_len + q->b_len;
            c->body = malloc(c->body_len + 1);
            if (!c->body) return "out of memory for the request body";
            c->body_have = 0;
            if (c->body_len) continue;
        } else {
            c->body_have += (size_t)n;
            if (c->body_have < c->body_len) continue;
        }
        /* The body arrived: split the key off with a NUL by shifting a and b one byte. */
        const td_store_req *q = &c->req;
        memmove(c->body + q->key_len + 1, c->body + q->key_len, q->a_len + q->b_len);
        c->body[q->key_len] = 0;
        c->hdr_have = 0;
        c->body_have = c->body_len = 0;
        c->deadline_ns = 0;
        if (!execute(srv, c)) return "malformed request";
        if (!flush_out(c)) return "write error";
    }
}

static void accept_all(td_store_server_t *srv) {
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(srv->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* At the descriptor (or memory) limit the pending connection stays queued and the
             * listening socket readable: stop polling it for a while instead of spinning. */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                if (!srv->accept_resume_ns)
                    TD_LOG_WARN("store: cannot accept connections (%s, %zu open); retrying every "
                                "100 ms",
                                strerror(errno), srv->nconns);
                srv->accept_resume_ns = td_now_ns() + 100000000ull;
            } else {
                srv->accept_resume_ns = 0; /* EAGAIN: nothing pending, accepting as usual */
            }
            return;
        }
        srv->accept_resume_ns = 0;
        conn *c = td_xcalloc(1, sizeof(*c));
        c->fd = fd;
        char host[INET6_ADDRSTRLEN] = "?", serv[16] = "?";
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV);
        snprintf(c->peer, sizeof(c->peer), "%s:%s", host, serv);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->state = C_HELLO;
        c->deadline_ns = ms_from_now(srv->handshake_ms);
        td_store_hello h = {.magic = TD_STORE_MAGIC_HELLO, .version = TD_STORE_VERSION};
        if (td__random_bytes(c->nonce, sizeof(c->nonce)) != 0) {
            TD_LOG_WARN("store: getrandom failed; refusing %s", c->peer);
            conn_free(c);
            continue;
        }
        memcpy(h.nonce, c->nonce, sizeof(h.nonce));
        out_append(c, &h, sizeof(h));
        if (!flush_out(c)) {
            conn_free(c);
            continue;
        }
        if (srv->nconns == srv->cap_conns) {
            srv->cap_conns = srv->cap_conns ? srv->cap_conns * 2 : 16;
            srv->conns = td_xrealloc(srv->conns, srv->cap_conns * sizeof(*srv->conns));
        }
        srv->conns[srv->nconns++] = c;
    }
}

static void *server_main(void *arg) {
    td_store_server_t *srv = arg;
    struct pollfd *pfds = NULL;
    size_t pcap = 0;
    while (!atomic_load(&srv->stop)) {
        if (srv->nconns + 2 > pcap) {
            pcap = (srv->nconns + 2) * 2;
            pfds = td_xrealloc(pfds, pcap * sizeof(*pfds));
        }
        uint64_t now = td_now_ns(), next = UINT64_MAX;
        bool accepting = !srv->accept_resume_ns || now >= srv->accept_resume_ns;
        pfds[0] = (struct pollfd){.fd = srv->listen_fd, .events = accepting ? POLLIN : 0};
        if (!accepting) next = srv->accept_resume_ns;
        pfds[1] = (struct pollfd){.fd = srv->wake_fd, .events = POLLIN};
        for (size_t i = 0; i < srv->nconns; i++) {
            conn *c = srv->conns[i];
            short ev = 0;
            if (c->out_len) ev |= POLLOUT;
            if (c->state != C_WAITING && !c->out_len) ev |= POLLIN;
            pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
            if (c->deadline_ns && c->deadline_ns < next) next = c->deadline_ns;
            if (c->state == C_WAITING && c->wait_deadline_ns && c->wait_deadline_ns < next)
                next = c->wait_deadline_ns;
        }
        int timeout = -1;
        if (next != UINT64_MAX) timeout = next <= now ? 0 : (int)((next - now) / 1000000 + 1);
        size_t n = srv->nconns; /* conns accepted below are polled next round */
        if (poll(pfds, n + 2, timeout) < 0 && errno != EINTR) {
            TD_LOG_ERROR("store: poll failed: %s", strerror(errno));
            break;
        }
        if (pfds[1].revents) {
            uint64_t v;
            ssize_t r = read(srv->wake_fd, &v, sizeof(v));
            (void)r;
        }
        /* Walk backwards so dropping (swap with last) doesn't skip anyone. */
        now = td_now_ns();
        for (size_t k = n; k-- > 0;) {
            conn *c = srv->conns[k];
            short re = pfds[k + 2].revents;
            const char *why = NULL;
            if (re & POLLOUT && !flush_out(c)) why = "write error";
            if (!why && c->out_len > OUT_MAX) why = "not reading its replies";
            if (!why && re & (POLLIN | POLLHUP | POLLERR)) why = conn_read(srv, c);
            if (!why && c->deadline_ns && now >= c->deadline_ns)
                why = c->state == C_HELLO ? "did not authenticate in time (stalled handshake)"
                                          : "stalled in the middle of a request";
            if (!why && c->state == C_WAITING && c->wait_deadline_ns &&
                now >= c->wait_deadline_ns) {
                try_complete_wait(srv, c, true);
                c->state = C_READY;
                free(c->body);
                c->body = NULL;
                if (!flush_out(c)) why = "write error";
            }
            if (why) drop(srv, k, *why ? why : NULL);
        }
        if (pfds[0].revents & POLLIN ||
            (srv->accept_resume_ns && td_now_ns() >= srv->accept_resume_ns))
            accept_all(srv);
    }
    free(pfds);
    return NULL;
}

td_status td_store_server_start(const char *host, int port, const char *token,
                                td_store_server_t **out) {
    *out = NULL;
    if (!token || !*token)
        return td_error(TD_ERR_INVALID, "store server: empty token; set TANDEM_TOKEN (any secret "
                                        "string shared by the job) or let the launcher make one");
    if (port < 0 || port > 65535)
        return td_error(TD_ERR_INVALID, "store server: port %d out of range 0..65535", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    if (host && !*host) host = NULL;
    if (host && !strcmp(host, "0.0.0.0")) hints.ai_family = AF_INET;
    int gai = getaddrinfo(host, portstr, &hints, &ai);
    if (gai)
        return td_error(TD_ERR_INVALID, "store server: cannot resolve bind address '%s': %s",
                        host ? host : "*", gai_strerror(gai));
    int fd = -1;
    td_status st = TD_OK;
    for (struct addrinfo *p = ai; p; p = p->ai_next) {
        fd = socket(p->ai_family, p->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, p->ai_addr, p->ai_addrlen) == 0 && listen(fd, 512) == 0) break;
        st = td_error_errno(TD_ERR_SYS,
                            "store server: cannot listen on %s:%d (another process "
                            "may hold the port; pass port 0 for a free one)",
                            host ? host : "*", port);
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) return st != TD_OK ? st : td_error_errno(TD_ERR_SYS, "store server: socket");
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    td_store_server_t *srv = td_xcalloc(1, sizeof(*srv));
    srv->listen_fd = fd;
    srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    srv->token = td_xstrdup(token);
    srv->kv.nbuckets = 64;
    srv->kv.buckets = td_xcalloc(srv->kv.nbuckets, sizeof(entry *));
    srv->handshake_ms = 10000;
    srv->frame_ms = 60000;
    srv->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (srv->wake_fd < 0) {
        st = td_error_errno(TD_ERR_SYS, "store server: eventfd");
        goto fail;
    }
    int rc = pthread_create(&srv->thread, NULL, server_main, srv);
    if (rc) {
        errno = rc;
        st = td_error_errno(TD_ERR_SYS, "store server: cannot start its thread");
        goto fail;
    }
    *out = srv;
    return TD_OK;
fail:
    if (srv->wake_fd >= 0) close(srv->wake_fd);
    close(fd);
    table_free(&srv->kv);
    free(srv->token);
    free(srv);
    return st;
}

int td_store_server_port(const td_store_server_t *srv) {
    return srv ? srv->port : -1;
}

void td_store_server_stop(td_store_server_t *srv) {
    if (!srv) return;
    atomic_store(&srv->stop, true);
    uint64_t one = 1;
    ssize_t r = write(srv->wake_fd, &one, sizeof(one));
    (void)r;
    pthread_join(srv->thread, NULL);
    for (size_t i = 0; i < srv->nconns; i++) conn_free(srv->conns[i]);
    free(srv->conns);
    close(srv->listen_fd);
    close(srv->wake_fd);
    table_free(&srv->kv);
    free(srv->token);
    free(srv);
}
