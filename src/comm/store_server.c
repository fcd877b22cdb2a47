/* The rendezvous store server: one thread running a td_loop (include/tandem/loop.h) over
 * non-blocking sockets, a hash table of keys. Each connection is a watched descriptor, and its
 * deadlines (handshake, frame, parked request, replies not read) are one timer set to the
 * nearest, re-set before each sleep. Requests that wait (GET with a timeout, WAIT) park their
 * connection until the keys appear or the deadline passes; every mutation re-checks the parked
 * connections. A connection that fails authentication, sends garbage or an oversize frame, or
 * stalls mid-handshake/mid-frame is logged and dropped without disturbing the others.
 *
 * Everything a client can make the server hold is bounded (issue 8: an authenticated client grew
 * the launcher to 1 GB in 6 s): keys, bytes of keys and values, one value, connections (pending
 * and authenticated), request bodies being received, parked requests and unsent replies. A
 * request over a bound gets a TD_STORE_R_LIMIT reply naming the bound and its value, and the
 * server goes on serving everyone else. Replies reference stored values instead of copying them,
 * so clients that do not read their replies cannot multiply a value. */
#include "tandem/comm.h"
#include "tandem/loop.h"
#include "tandem/os.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
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

/* What tandem itself stores, per rank and attempt (a restart is a new attempt under a new prefix,
 * and nothing deletes the old one): the process group's info/, shm/, shm_mapped/ and tcp/ keys,
 * about 45-byte keys with values up to ~300 bytes (pid and host key), ~0.6 KB in all; the launcher
 * adds a few keys per node and attempt. PyTorch-style users store ids and small configs.
 * - 256 Ki keys: 4096 ranks for 16 attempts, or 512 ranks for 128; the server's bookkeeping per
 *   key (entry, key and value allocations, bucket) is ~100 bytes, so ~25 MiB at the limit.
 * - 64 MiB of keys and values: 4096 ranks for ~25 attempts, and 1/16 of the 1 GB seen in issue 8.
 * - 16 MiB per value (64 MiB before): a quarter of the total, so no single value fills the store,
 *   and still far above anything a rendezvous needs (the largest tandem value is ~300 bytes).
 * - 8192 authenticated connections: every worker and every node's launcher holds one, so jobs of
 *   up to ~8000 processes; an idle connection costs ~0.5 KB here (plus its descriptor).
 * - 256 connections in the handshake: it takes one round trip, so 256 cover a job's connect storm;
 *   strangers cannot hold the slots, since the oldest is dropped once it is 1/10 of the handshake
 *   deadline old.
 * - 48 MiB of request bodies in flight: one CAS of two maximal values (32 MiB) plus many small
 *   requests; past that, requests wait their turn (nothing is refused).
 * - 64 MiB of parked requests: every rank of a group waits for all ranks' keys at once (pg.c), so
 *   this grows with the square of the world size: ~44 bytes per key and waiter, less the keys
 *   already there, fits groups of ~1700 ranks arriving together. */
void td__store_limits_default(td__store_limits *l) {
    *l = (td__store_limits){
        .max_keys = (size_t)1 << 18,
        .max_bytes = (size_t)64 << 20,
        .max_value_bytes = TD_STORE_MAX_VALUE,
        .max_conns = 8192,
        .max_pending = 256,
        .max_request_bytes = (size_t)48 << 20,
        .max_waiting_bytes = (size_t)64 << 20,
    };
}

/* ---------------- values and the key table ---------------- */

/* A stored value, shared by the table and the replies that are sending it. */
typedef struct blob {
    size_t refs;
    size_t nbytes;
    uint8_t data[];
} blob;

typedef struct entry {
    struct entry *next;
    char *key;
    blob *val;
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

/* ---------------- connections ---------------- */

typedef enum {
    C_HELLO,   /* authenticating */
    C_READY,   /* reading a request (or idle) */
    C_ROOM,    /* read a header; its body waits for room among the request bodies */
    C_WAITING, /* parked GET or WAIT */
} conn_state;

typedef struct conn {
    td_store_server_t *srv;
    int fd;
    size_t slot;      /* its index in srv->conns */
    unsigned watched; /* the TD_LOOP_* events it is watched for on the loop (0: not watched) */
    bool parked;      /* C_WAITING or C_ROOM: registered with srv->hup_fd instead */
    char peer[96];    /* escaped: it reaches the log */
    conn_state state;
    uint8_t nonce[TD_STORE_NONCE_BYTES];
    uint64_t since_ns;    /* accepted at */
    uint64_t deadline_ns; /* handshake or frame-in-progress deadline; 0 = none */
    /* input: the fixed header first, then the body it announces */
    uint8_t hdr[sizeof(td_store_auth)];
    size_t hdr_have;
    td_store_req req;
    uint8_t *body; /* in C_READY: the body being read; in C_WAITING: the parked request */
    size_t body_len, body_have;
    size_t charge;   /* bytes of body counted in request_bytes (C_READY) or waiting_bytes */
    uint64_t ticket; /* C_ROOM: order of arrival */
    /* parked request */
    uint64_t wait_deadline_ns; /* 0 = forever */
    /* output: bytes of its own, then (a reply's data) a stored value */
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    size_t out_charge; /* bytes of out counted in waiting_bytes (a WAIT's timeout reply) */
    blob *out_val;
    size_t out_val_off;
    uint64_t out_stall_ns; /* unsent output and no progress by then: not reading its replies */
} conn;

/* A request body small enough to pass large ones waiting for room (take_room). */
#define SMALL_REQUEST ((size_t)64 << 10)

static bool is_small(const conn *c) {
    return c->body_len + 1 <= SMALL_REQUEST;
}

/* At most one log line a second per kind: a flood of connections must not flood the log. */
typedef struct {
    uint64_t next_ns;
    unsigned long suppressed;
} ratelimit;

struct td_store_server {
    int listen_fd;
    int wake_fd;
    /* A parked connection (C_WAITING, C_ROOM) is not read, its next bytes stay in its socket,
     * yet a client that goes away must give its place back at once: the peer's hang-up
     * (EPOLLRDHUP) without readability, which td_loop does not offer. So parked connections
     * sit in an epoll set of their own, for EPOLLRDHUP alone, and that set's descriptor is
     * watched on the loop like any other (it is readable while a member has an event). */
    int hup_fd;
    td_loop *loop;
    bool listening;       /* listen_fd is watched (not while accepting is paused) */
    uint64_t sweep;       /* the deadline timer, or 0 */
    uint64_t sweep_at_ns; /* when it is due */
    int port;
    char *token;
    pthread_t thread;
    atomic_bool stop;
    table kv;
    conn **conns;
    size_t nconns, cap_conns;
    int handshake_ms, frame_ms;
    uint64_t accept_resume_ns; /* out of descriptors: accept again from then on (0: now) */
    td__store_limits lim;
    size_t nauth, npending;        /* connections past / in the handshake */
    size_t stored_bytes;           /* keys in the table and live values (stored or being sent) */
    size_t request_bytes;          /* request bodies being read */
    size_t waiting_bytes;          /* parked requests and their timeout replies */
    size_t nroom_big, nroom_small; /* connections in C_ROOM */
    bool run_again;                /* a connection has work without any bytes to come */
    uint64_t next_ticket;
    ratelimit rl_drop, rl_full, rl_refuse;
};

void td__store_server_set_deadlines(td_store_server_t *srv, int handshake_ms, int frame_ms) {
    srv->handshake_ms = handshake_ms;
    srv->frame_ms = frame_ms;
}

void td__store_server_set_limits(td_store_server_t *srv, const td__store_limits *limits) {
    srv->lim = *limits;
    if (srv->lim.max_value_bytes > TD_STORE_MAX_VALUE)
        srv->lim.max_value_bytes = TD_STORE_MAX_VALUE;
    if (srv->lim.max_pending < 1) srv->lim.max_pending = 1;
}

static bool rl_allow(ratelimit *r, unsigned long *suppressed) {
    uint64_t now = td_now_ns();
    if (now < r->next_ns) {
        r->suppressed++;
        return false;
    }
    r->next_ns = now + 1000000000ull;
    *suppressed = r->suppressed;
    r->suppressed = 0;
    return true;
}

static void log_limited(ratelimit *r, const char *fmt, ...) TD_PRINTF(2, 3);
static void log_limited(ratelimit *r, const char *fmt, ...) {
    unsigned long suppressed;
    if (!rl_allow(r, &suppressed)) return;
    char line[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (suppressed)
        TD_LOG_WARN("%s (and %lu more like it since the last such line)", line, suppressed);
    else
        TD_LOG_WARN("%s", line);
}

static uint64_t ms_from_now(int64_t ms) {
    return td_now_ns() + (uint64_t)ms * 1000000ull;
}

static blob *blob_new(td_store_server_t *srv, const void *p, size_t n) {
    blob *b = td_xmalloc(sizeof(*b) + n + 1);
    b->refs = 1;
    b->nbytes = n;
    if (n) memcpy(b->data, p, n);
    b->data[n] = 0;
    srv->stored_bytes += n;
    return b;
}

static void blob_release(td_store_server_t *srv, blob *b) {
    if (b && --b->refs == 0) {
        srv->stored_bytes -= b->nbytes;
        free(b);
    }
}

/* Takes over the caller's reference to val. */
static void table_put(td_store_server_t *srv, const char *key, blob *val) {
    table *t = &srv->kv;
    entry *e = table_find(t, key);
    if (e) {
        blob_release(srv, e->val);
        e->val = val;
        return;
    }
    if (t->count + 1 > t->nbuckets) table_grow(t);
    e = td_xcalloc(1, sizeof(*e));
    e->key = td_xstrdup(key);
    e->val = val;
    size_t h = hash_key(key) & (t->nbuckets - 1);
    e->next = t->buckets[h];
    t->buckets[h] = e;
    t->count++;
    srv->stored_bytes += strlen(key);
}

static bool table_delete(td_store_server_t *srv, const char *key) {
    table *t = &srv->kv;
    for (entry **pp = &t->buckets[hash_key(key) & (t->nbuckets - 1)]; *pp; pp = &(*pp)->next) {
        entry *e = *pp;
        if (!strcmp(e->key, key)) {
            *pp = e->next;
            srv->stored_bytes -= strlen(e->key);
            blob_release(srv, e->val);
            free(e->key);
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
            if (--e->val->refs == 0) free(e->val); /* replies hold none by now */
            free(e);
        }
    }
    free(t->buckets);
}

static bool out_pending(const conn *c) {
    return c->out_len > c->out_off || c->out_val;
}

/* Gives back what the connection's request holds. */
static void release_body(td_store_server_t *srv, conn *c) {
    if (c->state == C_WAITING)
        srv->waiting_bytes -= c->charge;
    else
        srv->request_bytes -= c->charge;
    c->charge = 0;
    free(c->body);
    c->body = NULL;
}

static void release_out(td_store_server_t *srv, conn *c) {
    srv->waiting_bytes -= c->out_charge;
    c->out_charge = 0;
    blob_release(srv, c->out_val);
    c->out_val = NULL;
    c->out_val_off = 0;
    c->out_off = c->out_len = 0;
    c->out_stall_ns = 0;
}

/* Closes the connection and gives back everything it holds (it stays in srv->conns). */
static void conn_free(td_store_server_t *srv, conn *c) {
    if (c->fd >= 0) {
        td_loop_unwatch(srv->loop, c->fd);
        if (c->parked) epoll_ctl(srv->hup_fd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    release_body(srv, c);
    release_out(srv, c);
    if (c->state == C_ROOM) {
        if (is_small(c))
            srv->nroom_small--;
        else
            srv->nroom_big--;
    }
    if (c->state == C_HELLO)
        srv->npending--;
    else
        srv->nauth--;
    free(c->out);
    free(c);
}

static void drop(td_store_server_t *srv, size_t i, const char *why) {
    conn *c = srv->conns[i];
    if (why) log_limited(&srv->rl_drop, "store: dropping connection from %s: %s", c->peer, why);
    conn_free(srv, c);
    if (i < --srv->nconns) {
        srv->conns[i] = srv->conns[srv->nconns];
        srv->conns[i]->slot = i;
    }
}

static void out_append(conn *c, const void *p, size_t n) {
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 256;
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

/* A reply whose data is a stored value: the reply shares it rather than copying it. */
static void respond_val(conn *c, int64_t num, blob *val) {
    td_store_resp r = {
        .magic = TD_STORE_MAGIC_RESP, .status = TD_STORE_R_OK, .len = val->nbytes, .num = num};
    out_append(c, &r, sizeof(r));
    if (val->nbytes) {
        val->refs++;
        c->out_val = val;
        c->out_val_off = 0;
    }
}

/* A refusal at a limit: the client shows the text, so it names the limit, its value, the fix. */
static void refuse(td_store_server_t *srv, conn *c, int which, const char *key, const char *fmt,
                   ...) TD_PRINTF(5, 6);
static void refuse(td_store_server_t *srv, conn *c, int which, const char *key, const char *fmt,
                   ...) {
    char text[400], safe_key[80];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    respond(c, TD_STORE_R_LIMIT, which, text, strlen(text));
    td_escape_text(safe_key, sizeof(safe_key), key, strlen(key));
    log_limited(&srv->rl_refuse, "store: refused a request from %s (key '%s'): %s", c->peer,
                safe_key, text);
}

/* Returns false when the connection broke. */
static bool flush_out(td_store_server_t *srv, conn *c) {
    while (out_pending(c)) {
        const uint8_t *p;
        size_t n;
        if (c->out_off < c->out_len) {
            p = c->out + c->out_off;
            n = c->out_len - c->out_off;
        } else {
            p = c->out_val->data + c->out_val_off;
            n = c->out_val->nbytes - c->out_val_off;
        }
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
            return false;
        }
        c->out_stall_ns = ms_from_now(srv->frame_ms);
        if (c->out_off < c->out_len) {
            c->out_off += (size_t)w;
        } else {
            c->out_val_off += (size_t)w;
            if (c->out_val_off == c->out_val->nbytes) {
                blob_release(srv, c->out_val);
                c->out_val = NULL;
            }
        }
    }
    release_out(srv, c);
    if (c->out_cap > (64u << 10)) { /* don't keep a WAIT's long timeout reply around */
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    return true;
}

/* WAIT's key list: repeated (u32 length, bytes). Returns the number of keys or -1. */
static int wait_keys_missing(td_store_server_t *srv, const uint8_t *list, size_t len) {
    size_t off = 0;
    int missing = 0;
    char key[TD_STORE_MAX_KEY + 1];
    while (off < len) {
        uint32_t kl;
        if (len - off < 4) return -1;
        memcpy(&kl, list + off, 4);
        off += 4;
        if (kl == 0 || kl > TD_STORE_MAX_KEY || kl > len - off) return -1;
        memcpy(key, list + off, kl);
        key[kl] = 0;
        off += kl;
        if (memchr(key, 0, kl)) return -1;
        if (!table_find(&srv->kv, key)) missing++;
    }
    return missing;
}

/* A WAIT keeps only the keys still missing, from the first check on: a parked one holds and
 * rescans less as keys arrive, so a group whose ranks all wait for all ranks' keys holds less
 * than the square of its size. Returns how many keys are missing. */
static size_t wait_compact(td_store_server_t *srv, conn *c) {
    uint8_t *list = c->body + c->req.key_len + 1;
    size_t len = c->req.a_len, off = 0, kept = 0, missing = 0;
    char key[TD_STORE_MAX_KEY + 1];
    while (off < len) { /* well-formed: wait_keys_missing checked it */
        uint32_t kl;
        memcpy(&kl, list + off, 4);
        memcpy(key, list + off + 4, kl);
        key[kl] = 0;
        if (!table_find(&srv->kv, key)) {
            memmove(list + kept, list + off, 4 + (size_t)kl);
            kept += 4 + (size_t)kl;
            missing++;
        }
        off += 4 + (size_t)kl;
    }
    c->req.a_len = kept;
    return missing;
}

/* Gives back the memory of a WAIT's list once it has shrunk to less than half. */
static void shrink_wait(td_store_server_t *srv, conn *c) {
    size_t need = c->req.key_len + 1 + c->req.a_len;
    if (c->req.op == TD_STORE_OP_WAIT && c->charge >= (64u << 10) && need < c->charge / 2) {
        c->body = td_xrealloc(c->body, need);
        if (c->state == C_WAITING)
            srv->waiting_bytes -= c->charge - need;
        else
            srv->request_bytes -= c->charge - need;
        c->charge = need;
    }
}

/* Tries to answer a parked (or about to be parked) request; returns true when it was answered. */
static bool try_complete_wait(td_store_server_t *srv, conn *c, bool timed_out) {
    const char *key = (const char *)c->body;
    if (c->req.op == TD_STORE_OP_GET) {
        entry *e = table_find(&srv->kv, key);
        if (e) {
            respond_val(c, 0, e->val);
            return true;
        }
        if (timed_out) {
            respond(c, TD_STORE_R_TIMEOUT, 0, NULL, 0);
            return true;
        }
        return false;
    }
    /* WAIT */
    if (wait_compact(srv, c) == 0) {
        respond(c, TD_STORE_R_OK, 0, NULL, 0);
        return true;
    }
    if (!timed_out) return false;
    /* The reply's data names the missing keys, one per line; it is no longer than the list it
     * replaces, and counts as waiting bytes until sent. */
    const uint8_t *list = c->body + c->req.key_len + 1;
    td_store_resp r = {.magic = TD_STORE_MAGIC_RESP, .status = TD_STORE_R_TIMEOUT};
    size_t at = c->out_len;
    out_append(c, &r, sizeof(r));
    for (size_t off = 0; off < c->req.a_len;) {
        uint32_t kl;
        memcpy(&kl, list + off, 4);
        if (off) out_append(c, "\n", 1);
        out_append(c, list + off + 4, kl);
        off += 4 + (size_t)kl;
    }
    uint64_t len = c->out_len - at - sizeof(r);
    memcpy(c->out + at + offsetof(td_store_resp, len), &len, sizeof(len));
    c->out_charge = len;
    srv->waiting_bytes += len;
    return true;
}

static void finish_wait(td_store_server_t *srv, conn *c) {
    release_body(srv, c);
    c->state = C_READY;
}

static void wake_waiters(td_store_server_t *srv) {
    for (size_t i = 0; i < srv->nconns; i++) {
        conn *c = srv->conns[i];
        if (c->state != C_WAITING) continue;
        if (try_complete_wait(srv, c, false))
            finish_wait(srv, c);
        else
            shrink_wait(srv, c);
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

/* Whether storing nbytes under key (already there: e) stays within the limits; if not, the
 * refusal is the reply. */
static bool fits(td_store_server_t *srv, conn *c, const char *key, const entry *e, size_t nbytes) {
    const td__store_limits *l = &srv->lim;
    if (nbytes > l->max_value_bytes) {
        refuse(srv, c, TD_STORE_LIMIT_VALUE, key,
               "a value of %zu bytes is over the store's limit of %zu bytes per value; keep large "
               "data elsewhere (a file) and store its path",
               nbytes, l->max_value_bytes);
        return false;
    }
    if (!e && srv->kv.count >= l->max_keys) {
        refuse(srv, c, TD_STORE_LIMIT_KEYS, key,
               "store is full: it holds %zu keys, its limit; delete keys that are no longer "
               "needed (td_store_delete)",
               l->max_keys);
        return false;
    }
    /* What the store holds afterwards: a replaced value goes unless a reply is still sending it. */
    size_t freed = e && e->val->refs == 1 ? e->val->nbytes : 0;
    size_t add = (e ? 0 : strlen(key)) + nbytes;
    if (srv->stored_bytes - freed + add > l->max_bytes) {
        refuse(srv, c, TD_STORE_LIMIT_BYTES, key,
               "store is full: %zu more bytes would pass its limit of %zu bytes (%zu MiB) of keys "
               "and values, %zu in use; delete keys that are no longer needed (td_store_delete)",
               add, l->max_bytes, l->max_bytes >> 20, srv->stored_bytes - freed);
        return false;
    }
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
    case TD_STORE_OP_SET:
        if (!fits(srv, c, key, table_find(&srv->kv, key), q->a_len)) break;
        table_put(srv, key, blob_new(srv, a, q->a_len));
        respond(c, TD_STORE_R_OK, 0, NULL, 0);
        mutated = true;
        break;
    case TD_STORE_OP_GET:
    case TD_STORE_OP_WAIT:
        if (q->op == TD_STORE_OP_WAIT && wait_keys_missing(srv, a, q->a_len) < 0) return false;
        if (try_complete_wait(srv, c, q->arg == 0)) break;
        /* Park it: the body moves from the request bodies to the waiting bytes. */
        shrink_wait(srv, c);
        if (srv->waiting_bytes + c->charge > srv->lim.max_waiting_bytes) {
            refuse(srv, c, TD_STORE_LIMIT_WAITING, key,
                   "store is busy: %zu bytes of waiting requests (get with a timeout, wait) are "
                   "parked, and %zu more would pass its limit of %zu bytes; wait for fewer keys "
                   "at once, or retry",
                   srv->waiting_bytes, c->charge, srv->lim.max_waiting_bytes);
            break;
        }
        srv->request_bytes -= c->charge;
        srv->waiting_bytes += c->charge;
        c->state = C_WAITING;
        c->wait_deadline_ns = q->arg < 0 ? 0 : ms_from_now(q->arg);
        return true; /* body kept until answered */
    case TD_STORE_OP_ADD: {
        entry *e = table_find(&srv->kv, key);
        int64_t cur = 0;
        if (e && !parse_i64(e->val->data, e->val->nbytes, &cur)) {
            respond(c, TD_STORE_R_INVALID, 0, NULL, 0);
            break;
        }
        int64_t sum = (int64_t)((uint64_t)cur + (uint64_t)q->arg);
        char txt[32];
        int n = snprintf(txt, sizeof(txt), "%lld", (long long)sum);
        if (!fits(srv, c, key, e, (size_t)n)) break;
        table_put(srv, key, blob_new(srv, txt, (size_t)n));
        respond(c, TD_STORE_R_OK, sum, NULL, 0);
        mutated = true;
        break;
    }
    case TD_STORE_OP_CAS: {
        entry *e = table_find(&srv->kv, key);
        bool expect_absent = q->flags & TD_STORE_CAS_EXPECT_ABSENT;
        bool match = expect_absent
                         ? e == NULL
                         : (e && e->val->nbytes == q->a_len && !memcmp(e->val->data, a, q->a_len));
        if (match) {
            if (!fits(srv, c, key, e, q->b_len)) break;
            table_put(srv, key, blob_new(srv, b, q->b_len));
            mutated = true;
            e = table_find(&srv->kv, key);
        }
        if (e)
            respond_val(c, 1, e->val);
        else
            respond(c, TD_STORE_R_OK, 0, NULL, 0);
        break;
    }
    case TD_STORE_OP_DELETE:
        respond(c, TD_STORE_R_OK, table_delete(srv, key) ? 1 : 0, NULL, 0);
        break;
    default:
        return false;
    }
    release_body(srv, c);
    if (mutated) wake_waiters(srv);
    return true;
}

/* Room for request bodies among all connections (max_request_bytes). Past it, requests wait
 * their turn, which costs nothing: the body stays in the client's socket. Large bodies go first
 * come first served; one alone always fits, so any legal request gets through. Small ones (every
 * request of a rendezvous) pass whenever they fit, so a large body that a client stalls on (until
 * the frame deadline) holds up only other large ones (is_small). */
static bool take_room(td_store_server_t *srv, conn *c) {
    size_t need = c->body_len + 1;
    if (srv->request_bytes && srv->request_bytes + need > srv->lim.max_request_bytes) return false;
    c->body = malloc(need);
    if (!c->body) return false;
    srv->request_bytes += need;
    c->charge = need;
    c->body_have = 0;
    return true;
}

static void admit(td_store_server_t *srv, conn *c) {
    if (is_small(c))
        srv->nroom_small--;
    else
        srv->nroom_big--;
    c->state = C_READY;
    c->deadline_ns = ms_from_now(srv->frame_ms); /* from now on the body must flow */
    if (c->body_len == 0) srv->run_again = true; /* nothing more will arrive to wake it */
}

static void admit_waiting(td_store_server_t *srv) {
    while (srv->nroom_big) {
        conn *first = NULL;
        for (size_t i = 0; i < srv->nconns; i++) {
            conn *c = srv->conns[i];
            if (c->state == C_ROOM && !is_small(c) && (!first || c->ticket < first->ticket))
                first = c;
        }
        if (!take_room(srv, first)) break;
        admit(srv, first);
    }
    for (size_t i = 0; i < srv->nconns && srv->nroom_small; i++) {
        conn *c = srv->conns[i];
        if (c->state == C_ROOM && is_small(c) && take_room(srv, c)) admit(srv, c);
    }
}

/* The client's auth message is in c->hdr: checks its MAC and answers. NULL, or why to drop. */
static const char *conn_auth(td_store_server_t *srv, conn *c) {
    td_store_auth au;
    memcpy(&au, c->hdr, sizeof(au));
    if (au.magic != TD_STORE_MAGIC_HELLO) return "not a tandem store client (bad magic)";
    if (au.version != TD_STORE_VERSION) return "unsupported protocol version";
    uint8_t expect[TD_STORE_MAC_BYTES];
    td__store_mac(srv->token, "tandem-store-client", c->nonce, au.nonce, expect);
    td_store_auth_reply rep = {.status = TD_STORE_AUTH_REFUSED};
    if (!td__store_mac_equal(expect, au.mac)) {
        /* Tell the client, so it can report TD_ERR_AUTH instead of a reset. */
        send(c->fd, &rep, sizeof(rep), MSG_NOSIGNAL | MSG_DONTWAIT);
        return "wrong token (authentication failed)";
    }
    if (srv->nauth >= srv->lim.max_conns) {
        /* Filled up since this one was accepted: tell the client, which retries. */
        uint32_t lim = (uint32_t)TD_MIN(srv->lim.max_conns, (size_t)UINT32_MAX);
        rep.status = TD_STORE_AUTH_FULL;
        memcpy(rep.mac, &lim, sizeof(lim));
        send(c->fd, &rep, sizeof(rep), MSG_NOSIGNAL | MSG_DONTWAIT);
        return "at the limit of authenticated connections";
    }
    rep.status = TD_STORE_AUTH_OK;
    td__store_mac(srv->token, "tandem-store-server", au.nonce, c->nonce, rep.mac);
    out_append(c, &rep, sizeof(rep));
    c->state = C_READY;
    srv->npending--;
    srv->nauth++;
    c->hdr_have = 0;
    c->deadline_ns = 0;
    return flush_out(srv, c) ? NULL : "write error";
}

/* A request header is in c->hdr: checks it and takes room for its body, or queues the
 * connection for room (C_ROOM). NULL, or why to drop. */
static const char *conn_header(td_store_server_t *srv, conn *c) {
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
    if ((!is_small(c) && srv->nroom_big) || !take_room(srv, c)) {
        c->state = C_ROOM;
        c->ticket = ++srv->next_ticket;
        c->deadline_ns = 0; /* nothing is read meanwhile */
        if (is_small(c))
            srv->nroom_small++;
        else
            srv->nroom_big++;
    }
    return NULL;
}

/* The body arrived: splits the key off with a NUL (shifting a and b one byte) and executes it.
 * NULL, or why to drop. */
static const char *conn_request(td_store_server_t *srv, conn *c) {
    const td_store_req *q = &c->req;
    memmove(c->body + q->key_len + 1, c->body + q->key_len, q->a_len + q->b_len);
    c->body[q->key_len] = 0;
    c->hdr_have = 0;
    c->body_have = c->body_len = 0;
    c->deadline_ns = 0;
    if (!execute(srv, c)) return "malformed request";
    if (!flush_out(srv, c)) return "write error";
    return NULL;
}

/* Reads what is available. Returns NULL to keep the connection, or why to drop it ("" for an
 * ordinary close, not logged). */
static const char *conn_read(td_store_server_t *srv, conn *c) {
    for (;;) {
        /* one request at a time: the next is read once this one's reply is out */
        if (c->state == C_WAITING || c->state == C_ROOM || out_pending(c)) return NULL;
        const char *why = NULL;
        if (c->body && c->body_have == c->body_len) {
            if ((why = conn_request(srv, c))) return why;
            continue;
        }
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
        if (c->hdr_have >= hdr_size) {
            c->body_have += (size_t)n;
            continue;
        }
        c->hdr_have += (size_t)n;
        if (c->hdr_have < hdr_size) continue;
        why = c->state == C_HELLO ? conn_auth(srv, c) : conn_header(srv, c);
        if (why) return why;
    }
}

/* The handshake slots are full: drops the oldest connection still in the handshake if it has had
 * a tenth of the handshake deadline (a real client needs one round trip), so strangers that
 * connect and say nothing cannot keep the job's own clients out. Returns whether one was
 * dropped. */
static bool evict_pending(td_store_server_t *srv, uint64_t now) {
    size_t oldest = SIZE_MAX;
    for (size_t i = 0; i < srv->nconns; i++)
        if (srv->conns[i]->state == C_HELLO &&
            (oldest == SIZE_MAX || srv->conns[i]->since_ns < srv->conns[oldest]->since_ns))
            oldest = i;
    if (oldest == SIZE_MAX) return false;                        /* max_pending is 0 */
    uint64_t grace_ns = (uint64_t)srv->handshake_ms * 100000ull; /* 1/10 */
    if (now < srv->conns[oldest]->since_ns + grace_ns) return false;
    char why[120];
    snprintf(why, sizeof(why), "oldest of %zu connections still authenticating (the limit)",
             srv->npending);
    drop(srv, oldest, why);
    return true;
}

static void accept_all(td_store_server_t *srv) {
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(srv->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* At the descriptor (or memory) limit the pending connection stays queued and the
             * listening socket readable: stop watching it for a while instead of spinning. */
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
        char host[INET6_ADDRSTRLEN] = "?", serv[16] = "?", peer[INET6_ADDRSTRLEN + 20];
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV);
        snprintf(peer, sizeof(peer), "%s:%s", host, serv);
        td_store_hello h = {.magic = TD_STORE_MAGIC_HELLO, .version = TD_STORE_VERSION};
        if (srv->nauth >= srv->lim.max_conns) {
            /* Closed at once, with a hello that says why, so the client can say so (and retry). */
            uint32_t lim = (uint32_t)TD_MIN(srv->lim.max_conns, (size_t)UINT32_MAX);
            h.flags = TD_STORE_HELLO_FULL;
            memcpy(h.nonce, &lim, sizeof(lim));
            send(fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
            close(fd);
            char safe[sizeof(peer) * 4];
            td_escape_text(safe, sizeof(safe), peer, strlen(peer));
            log_limited(&srv->rl_full,
                        "store: refusing a connection from %s: %zu clients are connected, the "
                        "limit",
                        safe, srv->nauth);
            continue;
        }
        if (srv->npending >= srv->lim.max_pending && !evict_pending(srv, td_now_ns())) {
            /* A storm of the job's own clients: this one tries again (see store_client.c). */
            close(fd);
            char safe[sizeof(peer) * 4];
            td_escape_text(safe, sizeof(safe), peer, strlen(peer));
            log_limited(&srv->rl_full,
                        "store: refusing a connection from %s: %zu connections are still "
                        "authenticating, the limit",
                        safe, srv->npending);
            continue;
        }
        conn *c = td_xcalloc(1, sizeof(*c));
        c->srv = srv;
        c->fd = fd;
        td_escape_text(c->peer, sizeof(c->peer), peer, strlen(peer));
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->state = C_HELLO;
        c->since_ns = td_now_ns();
        c->deadline_ns = ms_from_now(srv->handshake_ms);
        if (srv->nconns == srv->cap_conns) {
            srv->cap_conns = srv->cap_conns ? srv->cap_conns * 2 : 16;
            srv->conns = td_xrealloc(srv->conns, srv->cap_conns * sizeof(*srv->conns));
        }
        c->slot = srv->nconns;
        srv->conns[srv->nconns++] = c;
        srv->npending++;
        if (td__random_bytes(c->nonce, sizeof(c->nonce)) != 0) {
            TD_LOG_WARN("store: getrandom failed; refusing %s", c->peer);
            drop(srv, srv->nconns - 1, NULL);
            continue;
        }
        memcpy(h.nonce, c->nonce, sizeof(h.nonce));
        out_append(c, &h, sizeof(h));
        if (!flush_out(srv, c)) drop(srv, srv->nconns - 1, NULL);
    }
}

/* ---------------- the loop ---------------- */

static void on_conn(td_loop *l, int fd, unsigned events, void *user);

/* What a connection's deadlines say now: NULL to keep it, or why to drop it (into buf). A parked
 * request whose deadline passed is answered here. */
static const char *conn_expired(td_store_server_t *srv, conn *c, uint64_t now, char *buf,
                                size_t cap) {
    if (out_pending(c) && c->out_stall_ns && now >= c->out_stall_ns) {
        snprintf(buf, cap, "not reading its replies (%zu bytes unsent, none taken for %d ms)",
                 c->out_len - c->out_off + (c->out_val ? c->out_val->nbytes - c->out_val_off : 0),
                 srv->frame_ms);
        return buf;
    }
    if (c->deadline_ns && now >= c->deadline_ns)
        return c->state == C_HELLO ? "did not authenticate in time (stalled handshake)"
                                   : "stalled in the middle of a request";
    if (c->state == C_WAITING && c->wait_deadline_ns && now >= c->wait_deadline_ns) {
        try_complete_wait(srv, c, true);
        finish_wait(srv, c);
        if (!flush_out(srv, c)) return "write error";
    }
    return NULL;
}

/* The deadline timer: every connection whose deadline passed, and accepting again after a
 * pause. The next one is set before the loop sleeps (before_sleep). */
static void on_sweep(td_loop *l, void *user) {
    (void)l;
    td_store_server_t *srv = user;
    srv->sweep = 0;
    uint64_t now = td_now_ns();
    /* Backwards, so that dropping (swap with last) skips no one. */
    for (size_t k = srv->nconns; k-- > 0;) {
        char buf[120];
        const char *why = conn_expired(srv, srv->conns[k], now, buf, sizeof buf);
        if (why) drop(srv, k, why);
    }
    if (srv->accept_resume_ns && now >= srv->accept_resume_ns) accept_all(srv);
}

static void on_conn(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd;
    conn *c = user;
    td_store_server_t *srv = c->srv;
    const char *why = NULL;
    if (events & TD_LOOP_WRITE && !flush_out(srv, c)) why = "write error";
    /* A hang-up or an error counts as readable: the read sees it. */
    if (!why && events & TD_LOOP_READ) why = conn_read(srv, c);
    if (why) drop(srv, c->slot, *why ? why : NULL);
}

/* A parked connection's client went away (or its socket failed). */
static void on_hangup(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd, (void)events;
    td_store_server_t *srv = user;
    struct epoll_event evs[64];
    int n = epoll_wait(srv->hup_fd, evs, (int)TD_ARRAY_LEN(evs), 0);
    for (int i = 0; i < n; i++) {
        conn *c = evs[i].data.ptr;
        /* answered and unparked earlier in this turn: before_sleep takes it out of the set */
        if (c->state != C_WAITING && c->state != C_ROOM) continue;
        drop(srv, c->slot,
             c->state == C_WAITING ? "closed while its request was parked"
                                   : "closed in the middle of a request");
    }
}

static void on_listen(td_loop *l, int fd, unsigned events, void *user) {
    (void)l, (void)fd, (void)events;
    accept_all(user);
}

static void on_wake(td_loop *l, int fd, unsigned events, void *user) {
    (void)events;
    td_store_server_t *srv = user;
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof(v));
    (void)r;
    if (atomic_load(&srv->stop)) td_loop_stop(l);
}

/* Watches c for what its state wants: its replies' room while any are unsent, else its next
 * bytes while it reads requests; parked, only its hang-up (hup_fd). Returns 0, or the errno
 * of a descriptor that cannot be watched. */
static int conn_watch(td_store_server_t *srv, conn *c) {
    bool out = out_pending(c);
    if (out && !c->out_stall_ns) c->out_stall_ns = ms_from_now(srv->frame_ms);
    bool parked = c->state == C_WAITING || c->state == C_ROOM;
    unsigned want = out ? TD_LOOP_WRITE : parked ? 0 : TD_LOOP_READ;
    if (want != c->watched) {
        if (!want)
            td_loop_unwatch(srv->loop, c->fd);
        else if (td_loop_watch(srv->loop, c->fd, want, on_conn, c) != TD_OK)
            return errno ? errno : EINVAL;
        c->watched = want;
    }
    if (parked != c->parked) {
        struct epoll_event ev = {.events = EPOLLRDHUP, .data.ptr = c};
        if (epoll_ctl(srv->hup_fd, parked ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, c->fd, &ev) != 0)
            return errno;
        c->parked = parked;
    }
    return 0;
}

static uint64_t conn_next_deadline(const conn *c) {
    uint64_t next = UINT64_MAX;
    if (out_pending(c) && c->out_stall_ns) next = c->out_stall_ns;
    if (c->deadline_ns) next = TD_MIN(next, c->deadline_ns);
    if (c->state == C_WAITING && c->wait_deadline_ns) next = TD_MIN(next, c->wait_deadline_ns);
    return next;
}

/* Sets the deadline timer to `next` (UINT64_MAX: none). */
static void arm_sweep(td_store_server_t *srv, uint64_t next) {
    if (srv->sweep && srv->sweep_at_ns == next) return;
    td_loop_cancel(srv->loop, srv->sweep);
    srv->sweep = 0;
    if (next == UINT64_MAX) return;
    uint64_t now = td_now_ns();
    /* A tenth of a millisecond late, so that the deadline has passed by td_now_ns's clock when
     * the timer runs on the loop's (double seconds). */
    double after_s = next > now ? (double)(next - now) / 1e9 + 1e-4 : 0;
    srv->sweep = td_loop_timer(srv->loop, after_s, 0, on_sweep, srv);
    srv->sweep_at_ns = next;
}

/* Before each sleep: what the last turn's callbacks changed. Bodies finished or dropped may make
 * room for requests waiting for it; each connection is watched for what it waits for now; the
 * deadline timer is set to the nearest deadline. */
static void before_sleep(td_loop *l, void *user) {
    (void)l;
    td_store_server_t *srv = user;
    for (;;) {
        admit_waiting(srv);
        if (!srv->run_again) break;
        /* Admitted with no body: nothing will arrive to wake it, so it runs here (and what it
         * gives back may admit more). */
        srv->run_again = false;
        for (size_t k = srv->nconns; k-- > 0;) {
            conn *c = srv->conns[k];
            if (c->state != C_READY || !c->body || c->body_have != c->body_len) continue;
            const char *why = conn_read(srv, c);
            if (why) drop(srv, k, *why ? why : NULL);
        }
    }
    uint64_t next = UINT64_MAX;
    for (size_t k = srv->nconns; k-- > 0;) {
        conn *c = srv->conns[k];
        int err = conn_watch(srv, c);
        if (err) {
            char why[80];
            snprintf(why, sizeof why, "cannot watch its socket (%s)", strerror(err));
            td_error_clear();
            drop(srv, k, why);
            continue;
        }
        next = TD_MIN(next, conn_next_deadline(c));
    }
    bool accepting = !srv->accept_resume_ns;
    if (accepting != srv->listening) {
        if (!accepting) {
            td_loop_unwatch(srv->loop, srv->listen_fd);
        } else if (td_loop_watch(srv->loop, srv->listen_fd, TD_LOOP_READ, on_listen, srv) !=
                   TD_OK) {
            /* as at the descriptor limit: try again in a while */
            TD_LOG_WARN("store: %s; retrying in 100 ms", td_error_msg());
            td_error_clear();
            srv->accept_resume_ns = td_now_ns() + 100000000ull;
            accepting = false;
        }
        srv->listening = accepting;
    }
    if (srv->accept_resume_ns) next = TD_MIN(next, srv->accept_resume_ns);
    arm_sweep(srv, next);
}

static void *server_main(void *arg) {
    td_store_server_t *srv = arg;
    if (td_loop_run(srv->loop) != TD_OK) {
        TD_LOG_ERROR("store: its event loop failed: %s", td_error_msg());
        td_error_clear();
    }
    return NULL;
}

td_status td_store_server_start(const char *host, int port, const char *token,
                                td_store_server_t **out) {
    *out = NULL;
    if (port < 0 || port > 65535)
        return td_error(TD_ERR_INVALID, "store server: port %d out of range 0..65535", port);
    int fd = -1, bound = 0;
    td_status st = td_listen_tcp(host, port, 512, &fd, &bound);
    if (st != TD_OK)
        return td_error(st,
                        "store server: %s (another process may hold the port; pass port 0 for a "
                        "free one)",
                        td_error_msg());
    return td_store_server_start_fd(fd, token, out);
}

td_status td_store_server_start_fd(int fd, const char *token, td_store_server_t **out) {
    *out = NULL;
    if (!token || !*token) {
        close(fd);
        return td_error(TD_ERR_INVALID, "store server: empty token; set TANDEM_TOKEN (any secret "
                                        "string shared by the job) or let the launcher make one");
    }
    int listening = 0;
    socklen_t optlen = sizeof listening;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &optlen) != 0 || !listening ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        close(fd);
        return td_error(TD_ERR_INVALID,
                        "store server: descriptor %d is not a listening TCP socket (it was handed "
                        "over by the parent process, which must create it with td_listen_tcp)",
                        fd);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    td_status st = TD_OK;
    td_store_server_t *srv = td_xcalloc(1, sizeof(*srv));
    srv->listen_fd = fd;
    srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    srv->token = td_xstrdup(token);
    srv->kv.nbuckets = 64;
    srv->kv.buckets = td_xcalloc(srv->kv.nbuckets, sizeof(entry *));
    srv->handshake_ms = 10000;
    srv->frame_ms = 60000;
    td__store_limits_default(&srv->lim);
    srv->hup_fd = -1;
    srv->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (srv->wake_fd < 0) {
        st = td_error_errno(TD_ERR_SYS, "store server: eventfd");
        goto fail;
    }
    srv->hup_fd = epoll_create1(EPOLL_CLOEXEC);
    if (srv->hup_fd < 0) {
        st = td_error_errno(TD_ERR_SYS, "store server: epoll_create1");
        goto fail;
    }
    /* The loop is made here, so that its failure is the caller's error; from the thread's start
     * on only the thread touches it. */
    if ((st = td_loop_new(&srv->loop)) != TD_OK ||
        (st = td_loop_watch(srv->loop, srv->wake_fd, TD_LOOP_READ, on_wake, srv)) != TD_OK ||
        (st = td_loop_watch(srv->loop, srv->hup_fd, TD_LOOP_READ, on_hangup, srv)) != TD_OK ||
        (st = td_loop_watch(srv->loop, fd, TD_LOOP_READ, on_listen, srv)) != TD_OK)
        goto fail;
    srv->listening = true;
    td_loop_before_sleep(srv->loop, before_sleep, srv);
    int rc = pthread_create(&srv->thread, NULL, server_main, srv);
    if (rc) {
        errno = rc;
        st = td_error_errno(TD_ERR_SYS, "store server: cannot start its thread");
        goto fail;
    }
    *out = srv;
    return TD_OK;
fail:
    td_loop_free(srv->loop);
    if (srv->hup_fd >= 0) close(srv->hup_fd);
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
    for (size_t i = 0; i < srv->nconns; i++) conn_free(srv, srv->conns[i]);
    free(srv->conns);
    td_loop_free(srv->loop); /* closes none of the descriptors it watched */
    close(srv->listen_fd);
    close(srv->hup_fd);
    close(srv->wake_fd);
    table_free(&srv->kv);
    free(srv->token);
    free(srv);
}
