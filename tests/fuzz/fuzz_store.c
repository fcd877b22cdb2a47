/* The rendezvous store's wire protocol (src/comm/store_server.c, store_proto.h, docs/comm.md),
 * fuzzed from outside: one server runs in the process for its whole life, and each input is one
 * TCP connection to it. Byte 0 picks the mode:
 *   bit 0 clear: the rest goes out raw, before any authentication (the server reads it as the
 *                client's 72-byte auth message);
 *   bit 0 set:   the client authenticates properly, then the rest is the request stream.
 * The client sends while reading replies (a stream of GETs must not deadlock on full socket
 * buffers), half-closes, and reads until the server closes; the server must close within
 * CLOSE_MS, and every reply must be a whole, well-formed response.
 *
 * So that connections never outlive their input, two things are adjusted: a GET or WAIT's
 * timeout becomes 0-2 ms (a parked request is not read from, so with a long or infinite wait
 * the server would keep the connection after the client has gone), and after the input the keys
 * it may have created are deleted, so the next input finds an empty table (determinism, and
 * bounded memory over millions of runs). */
#include "fuzz.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/store_proto.h"

#define TOKEN    "fuzz-token"
#define CLOSE_MS 5000

static td_store_server_t *server;
static int port;

static uint64_t deadline_after(int ms) {
    return td_now_ns() + (uint64_t)ms * 1000000ull;
}

static int ms_left(uint64_t deadline) {
    uint64_t now = td_now_ns();
    return now >= deadline ? 0 : (int)((deadline - now) / 1000000 + 1);
}

/* libFuzzer's timeout alarm (SIGALRM) interrupts blocking calls now and then: every wait here
 * goes on after EINTR. */
static int connect_server(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_ASSERT(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        /* interrupted, the connection goes on being made: wait until it is writable */
        FUZZ_ASSERT(errno == EINTR, "connect to port %d: %s", port, strerror(errno));
        uint64_t deadline = deadline_after(CLOSE_MS);
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        while (poll(&pfd, 1, ms_left(deadline)) < 0 && errno == EINTR) continue;
        int err = ETIMEDOUT;
        socklen_t len = sizeof err;
        if (pfd.revents) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        FUZZ_ASSERT(err == 0, "connect to port %d: %s", port, strerror(err));
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Reads (or with `writing`, sends) exactly n bytes, with a deadline; 0 when the server closed
 * the connection first. */
static int io_exact(int fd, bool writing, void *buf, size_t n, uint64_t deadline) {
    uint8_t *p = buf;
    while (n) {
        struct pollfd pfd = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        int ms = ms_left(deadline);
        FUZZ_ASSERT(ms > 0, "the store did not %s in %d ms", writing ? "take" : "answer", CLOSE_MS);
        if (poll(&pfd, 1, ms) <= 0) continue; /* EINTR, or time to check the deadline */
        ssize_t r =
            writing ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r <= 0) return 0;
        p += r;
        n -= (size_t)r;
    }
    return 1;
}

/* Sends data[0..n) while collecting replies into *in, half-closes after the last byte, and
 * returns when the server has closed the connection: 1 when it closed in order (every reply
 * it queued has arrived), 0 when it reset it (it dropped the connection, say for a malformed
 * frame, with bytes of ours unread: TCP then discards its replies still in flight). */
static int exchange(int fd, const uint8_t *data, size_t n, uint8_t **in, size_t *in_len) {
    size_t sent = 0, cap = 4096;
    *in = malloc(cap);
    *in_len = 0;
    FUZZ_ASSERT(*in, "%s", "malloc");
    if (n == 0) shutdown(fd, SHUT_WR);
    uint64_t deadline = deadline_after(CLOSE_MS);
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN | (sent < n ? POLLOUT : 0)};
        int ms = ms_left(deadline);
        FUZZ_ASSERT(ms > 0,
                    "the store kept the connection open %d ms after the client's "
                    "last byte (%zu of %zu sent, %zu received)",
                    CLOSE_MS, sent, n, *in_len);
        if (poll(&pfd, 1, ms) < 0) continue;
        if (sent < n && pfd.revents & POLLOUT) {
            ssize_t w = send(fd, data + sent, n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) sent += (size_t)w;
            if (w < 0 && errno != EINTR && errno != EAGAIN) sent = n; /* dropped: read the rest */
            if (sent == n) shutdown(fd, SHUT_WR);
        }
        if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
            if (*in_len == cap) *in = realloc(*in, cap *= 2);
            FUZZ_ASSERT(*in, "%s", "realloc");
            ssize_t r = recv(fd, *in + *in_len, cap - *in_len, MSG_DONTWAIT);
            if (r > 0) *in_len += (size_t)r;
            if (r == 0) return 1;
            if (r < 0 && errno != EINTR && errno != EAGAIN) return 0;
        }
    }
}

typedef struct {
    char **keys;
    int nkeys;
} created;

/* Walks the request frames as the server will: clamps waits and notes the keys a SET, ADD or
 * CAS may create. */
static void prepare(uint8_t *stream, size_t n, created *made) {
    size_t off = 0;
    while (n - off >= sizeof(td_store_req)) {
        td_store_req q;
        memcpy(&q, stream + off, sizeof q);
        if (q.magic != TD_STORE_MAGIC_REQ || q.a_len > TD_STORE_MAX_VALUE ||
            q.b_len > TD_STORE_MAX_VALUE)
            return; /* the server drops the connection here */
        if (q.op == TD_STORE_OP_GET || q.op == TD_STORE_OP_WAIT) {
            q.arg = (int64_t)((uint64_t)q.arg % 3);
            memcpy(stream + off, &q, sizeof q);
        }
        uint64_t body = (uint64_t)q.key_len + q.a_len + q.b_len;
        if (body > n - off - sizeof q) return;
        bool creates =
            q.op == TD_STORE_OP_SET || q.op == TD_STORE_OP_ADD || q.op == TD_STORE_OP_CAS;
        const uint8_t *key = stream + off + sizeof q;
        if (creates && q.key_len && q.key_len <= TD_STORE_MAX_KEY && !memchr(key, 0, q.key_len)) {
            char *k = malloc(q.key_len + 1);
            made->keys = realloc(made->keys, (size_t)(made->nkeys + 1) * sizeof *made->keys);
            FUZZ_ASSERT(k && made->keys, "%s", "malloc");
            memcpy(k, key, q.key_len);
            k[q.key_len] = '\0';
            made->keys[made->nkeys++] = k;
        }
        off += sizeof q + body;
    }
}

/* Every reply in buf is a well-formed response: magic, a known status, its announced data;
 * after an orderly close the last one is whole too. */
static void check_replies(const uint8_t *buf, size_t n, int orderly) {
    size_t off = 0;
    while (off < n) {
        td_store_resp r;
        if (n - off < sizeof r && !orderly) return;
        FUZZ_ASSERT(n - off >= sizeof r, "a partial reply header at byte %zu of %zu", off, n);
        memcpy(&r, buf + off, sizeof r);
        FUZZ_ASSERT(r.magic == TD_STORE_MAGIC_RESP && r.status <= TD_STORE_R_LIMIT,
                    "reply at byte %zu: magic 0x%08x status %u", off, r.magic, r.status);
        if (r.len > n - off - sizeof r && !orderly) return;
        FUZZ_ASSERT(r.len <= n - off - sizeof r, "reply at byte %zu announces %llu bytes, %zu came",
                    off, (unsigned long long)r.len, n - off - sizeof r);
        off += sizeof r + r.len;
    }
}

static void start_server(void) {
    FUZZ_ASSERT(td_store_server_start("127.0.0.1", 0, TOKEN, &server) == TD_OK, "%s",
                td_error_msg());
    port = td_store_server_port(server);
}

/* Connects and reads the hello; with `auth`, completes the handshake as td_store_connect does
 * (the ordinary client is not used: it gives up when a signal interrupts its connect). */
static int open_conn(bool auth) {
    int fd = connect_server();
    uint64_t deadline = deadline_after(CLOSE_MS);
    td_store_hello hello;
    FUZZ_ASSERT(io_exact(fd, false, &hello, sizeof hello, deadline) &&
                    hello.magic == TD_STORE_MAGIC_HELLO && hello.version == TD_STORE_VERSION,
                "%s", "no valid hello from the store");
    if (!auth) return fd;
    td_store_auth au = {.magic = TD_STORE_MAGIC_HELLO, .version = TD_STORE_VERSION};
    memset(au.nonce, 0x5a, sizeof au.nonce); /* the server's nonce is the random one */
    td__store_mac(TOKEN, "tandem-store-client", hello.nonce, au.nonce, au.mac);
    FUZZ_ASSERT(io_exact(fd, true, &au, sizeof au, deadline), "%s",
                "the store closed the connection before the auth message");
    td_store_auth_reply rep;
    uint8_t expect[TD_STORE_MAC_BYTES];
    td__store_mac(TOKEN, "tandem-store-server", au.nonce, hello.nonce, expect);
    FUZZ_ASSERT(io_exact(fd, false, &rep, sizeof rep, deadline) && rep.status == TD_STORE_AUTH_OK &&
                    td__store_mac_equal(rep.mac, expect),
                "%s", "the store refused a correct token");
    return fd;
}

/* Deletes the keys the input may have created: one DELETE each on a fresh connection, each
 * answered. */
static void cleanup(created *made) {
    if (!made->nkeys) return;
    size_t n = 0;
    uint8_t *frames = malloc((size_t)made->nkeys * (sizeof(td_store_req) + TD_STORE_MAX_KEY));
    FUZZ_ASSERT(frames, "%s", "malloc");
    for (int i = 0; i < made->nkeys; i++) {
        size_t klen = strlen(made->keys[i]);
        td_store_req q = {
            .magic = TD_STORE_MAGIC_REQ, .op = TD_STORE_OP_DELETE, .key_len = (uint32_t)klen};
        memcpy(frames + n, &q, sizeof q);
        memcpy(frames + n + sizeof q, made->keys[i], klen);
        n += sizeof q + klen;
        free(made->keys[i]);
    }
    int fd = open_conn(true);
    uint8_t *in;
    size_t in_len;
    FUZZ_ASSERT(exchange(fd, frames, n, &in, &in_len) &&
                    in_len == (size_t)made->nkeys * sizeof(td_store_resp),
                "%d deletes: %zu bytes of replies", made->nkeys, in_len);
    check_replies(in, in_len, 1);
    close(fd);
    free(in);
    free(frames);
    free(made->keys);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    if (!server) start_server();
    if (size == 0) return 0;
    bool authed = data[0] & 1;
    int fd = open_conn(authed);
    size_t n = size - 1;
    uint8_t *stream = malloc(n ? n : 1);
    FUZZ_ASSERT(stream, "%s", "malloc");
    memcpy(stream, data + 1, n);
    created made = {NULL, 0};
    if (authed) prepare(stream, n, &made);
    uint8_t *in;
    size_t in_len;
    int orderly = exchange(fd, stream, n, &in, &in_len);
    if (authed) check_replies(in, in_len, orderly);
    close(fd);
    free(in);
    free(stream);
    cleanup(&made);
    td_error_clear();
    return 0;
}
