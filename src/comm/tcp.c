/* The tcp transport: one connection per pair of ranks on different hosts.
 *
 * Setup: every rank listens on port 0 and publishes "ip port" in the store; the higher rank of
 * each pair connects and sends a hello (magic, version, world size, rank, the group's prefix as
 * the job id), the lower one checks it and acknowledges. Strangers are logged and dropped.
 * Data: non-blocking sockets. Whenever a rank would block (sending into a full socket or waiting
 * for a message) it also drains every other connection into a per-peer staging buffer, so two
 * ranks that send to each other at once can never deadlock on full kernel buffers. Receives
 * that find nothing staged read straight into their destination. */
#include "comm/pg_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm/store_internal.h"
#include "tandem/os.h"

#define HELLO_MAGIC    0x50435454u /* "TTCP" */
#define HELLO_VERSION  1
#define SOCK_BUF_BYTES (4 << 20)
#define MAX_MSG        (4u << 20)
#define POLL_MS        20
#define CONNECT_MIN_S  1.0 /* the least one connect waits for an answer */

typedef struct __attribute__((packed)) {
    uint32_t magic;
    uint32_t version;
    int32_t world;
    int32_t rank;
    uint32_t prefix_len;
} hello_msg;

typedef struct {
    int fd;
    bool eof;
    bool lent;    /* recv_ptr handed out a pointer into buf: don't move it until recv_done */
    uint8_t *buf; /* staging */
    size_t cap, rd, wr;
} tcp_peer;

typedef struct {
    td_transport base;
    int rank, world;
    tcp_peer *p; /* per rank; fd -1 when not ours */
    struct pollfd *pfds;
} tcp_t;

static td_status peer_closed(tcp_t *t, int peer) {
    char what[96];
    td_pg_t *pg = t->base.pg;
    td__fp_describe(&pg->cur, what, sizeof(what));
    td_status first = TD_ERR_PEER;
    char *cause = td__pg_first_failure(pg, &first);
    /* A peer that hung up because the group disagreed or timed out: report that, on every
     * rank, not the hang-up it caused. */
    td_status st = td_error(
        first == TD_ERR_MISMATCH || first == TD_ERR_TIMEOUT ? first : TD_ERR_PEER,
        "rank %d closed its connection while rank %d waited for "
        "it in %s at seq %llu (%s%s)",
        peer, t->rank, what, (unsigned long long)pg->cur.seq,
        cause ? "first failure in the group: " : "it died or was killed", cause ? cause : "");
    free(cause);
    return st;
}

/* Reads whatever is available from peer into its staging buffer. */
static td_status drain(tcp_t *t, int peer) {
    tcp_peer *p = &t->p[peer];
    while (!p->eof) {
        if (p->cap - p->wr < 65536) {
            if (p->lent) {
                if (p->cap == p->wr) break; /* full; the rest waits in the socket */
            } else if (p->rd) {             /* compact first */
                memmove(p->buf, p->buf + p->rd, p->wr - p->rd);
                p->wr -= p->rd;
                p->rd = 0;
            }
            if (!p->lent && p->cap - p->wr < 65536) {
                p->cap = TD_MAX(p->cap * 2, (size_t)1 << 20);
                p->buf = td_xrealloc(p->buf, p->cap);
            }
        }
        ssize_t n = recv(p->fd, p->buf + p->wr, p->cap - p->wr, MSG_DONTWAIT);
        if (n > 0) {
            p->wr += (size_t)n;
            continue;
        }
        if (n == 0) {
            p->eof = true;
            break;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        p->eof = true; /* reset: same as closed for our purposes */
    }
    return TD_OK;
}

/* Blocks until peer's socket is ready for `events`, draining the others meanwhile. */
static td_status block_on(tcp_t *t, int peer, short events) {
    int n = 0, idx = -1;
    for (int j = 0; j < t->world; j++) {
        if (t->p[j].fd < 0) continue;
        short ev = j == peer ? events : (t->p[j].eof || t->p[j].lent ? 0 : POLLIN);
        if (j == peer) idx = n;
        t->pfds[n++] = (struct pollfd){.fd = t->p[j].fd, .events = ev};
    }
    int rc = poll(t->pfds, (nfds_t)n, POLL_MS);
    if (rc < 0 && errno != EINTR) return td_error_errno(TD_ERR_SYS, "tcp: poll");
    if (rc > 0) {
        int k = 0;
        for (int j = 0; j < t->world; j++) {
            if (t->p[j].fd < 0) continue;
            if (j != peer && t->pfds[k].revents) TD_CHECK(drain(t, j));
            k++;
        }
        if (t->pfds[idx].revents) return TD_OK;
    }
    return td__pg_check(t->base.pg, peer);
}

static td_status tcp_send2(td_transport *tr, int peer, const void *a, size_t na, const void *b,
                           size_t nb) {
    tcp_t *t = (tcp_t *)tr;
    struct iovec iov[2] = {{(void *)a, na}, {(void *)b, nb}};
    struct iovec *v = iov;
    int cnt = 2;
    while (cnt && v->iov_len == 0) v++, cnt--;
    while (cnt) {
        struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)cnt};
        ssize_t w = sendmsg(t->p[peer].fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            size_t left = (size_t)w;
            while (cnt && left >= v->iov_len) left -= v->iov_len, v++, cnt--;
            if (cnt) {
                v->iov_base = (uint8_t *)v->iov_base + left;
                v->iov_len -= left;
            }
            while (cnt && v->iov_len == 0) v++, cnt--;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            TD_CHECK(block_on(t, peer, POLLOUT));
            continue;
        }
        return peer_closed(t, peer);
    }
    return TD_OK;
}

static td_status tcp_send(td_transport *tr, int peer, const void *buf, size_t n) {
    return tcp_send2(tr, peer, buf, n, NULL, 0);
}

/* One non-blocking read of up to n bytes from peer's socket into dst; *got is 0 when nothing
 * came (after waiting for the socket, which may stage data from any peer meanwhile) or the
 * connection ended (p->eof). Callers re-check staging and eof before the next step. */
static td_status recv_step(tcp_t *t, int peer, void *dst, size_t n, size_t *got) {
    tcp_peer *p = &t->p[peer];
    *got = 0;
    ssize_t r = recv(p->fd, dst, n, MSG_DONTWAIT);
    if (r > 0)
        *got = (size_t)r;
    else if (r == 0)
        p->eof = true;
    else if (errno == EAGAIN || errno == EWOULDBLOCK)
        return block_on(t, peer, POLLIN);
    else if (errno != EINTR)
        p->eof = true; /* reset: same as closed for our purposes */
    return TD_OK;
}

static td_status tcp_recv_into(td_transport *tr, int peer, void *dst, size_t n) {
    tcp_t *t = (tcp_t *)tr;
    tcp_peer *p = &t->p[peer];
    uint8_t *d = dst;
    while (n) {
        /* liveness checks drain sockets into staging, so look there on every round */
        size_t staged = TD_MIN(n, p->wr - p->rd);
        if (staged) {
            memcpy(d, p->buf + p->rd, staged);
            p->rd += staged;
            if (p->rd == p->wr) p->rd = p->wr = 0;
            d += staged;
            n -= staged;
            continue;
        }
        if (p->eof) return peer_closed(t, peer);
        size_t got;
        TD_CHECK(recv_step(t, peer, d, n, &got));
        d += got;
        n -= got;
    }
    return TD_OK;
}

static td_status tcp_recv_ptr(td_transport *tr, int peer, size_t n, const void **ptr) {
    tcp_t *t = (tcp_t *)tr;
    tcp_peer *p = &t->p[peer];
    if (p->rd & 15) { /* callers read floats in place: keep the message aligned */
        memmove(p->buf, p->buf + p->rd, p->wr - p->rd);
        p->wr -= p->rd;
        p->rd = 0;
    }
    if (p->wr - p->rd < n) {
        if (p->cap - p->rd < n) { /* make room for the whole message */
            if (p->rd) memmove(p->buf, p->buf + p->rd, p->wr - p->rd);
            p->wr -= p->rd;
            p->rd = 0;
            if (p->cap < n) {
                p->cap = TD_MAX(n, (size_t)1 << 20);
                p->buf = td_xrealloc(p->buf, p->cap);
            }
        }
        while (p->wr - p->rd < n) {
            if (p->eof) return peer_closed(t, peer);
            size_t got;
            /* exactly the rest of this message: reading ahead would only stage the next one
             * (often a result that recv_into could take straight into its destination) */
            TD_CHECK(recv_step(t, peer, p->buf + p->wr, n - (p->wr - p->rd), &got));
            p->wr += got;
        }
    }
    *ptr = p->buf + p->rd;
    p->lent = n > 0;
    return TD_OK;
}

static void tcp_recv_done(td_transport *tr, int peer, size_t n) {
    tcp_peer *p = &((tcp_t *)tr)->p[peer];
    p->lent = false;
    p->rd += n;
    if (p->rd == p->wr) p->rd = p->wr = 0;
}

static bool tcp_ready(td_transport *tr, int peer, size_t n) {
    tcp_t *t = (tcp_t *)tr;
    drain(t, peer);
    return t->p[peer].wr - t->p[peer].rd >= n;
}

static td_status tcp_check(td_transport *tr, int waiting_peer) {
    tcp_t *t = (tcp_t *)tr;
    for (int j = 0; j < t->world; j++)
        if (t->p[j].fd >= 0) TD_CHECK(drain(t, j));
    /* A closed connection only matters to a rank that still needs data from it: peers that
     * finished and exited normally close theirs too. What the peer sent before it closed may
     * have just been staged by the drain above (its last message, then its FIN): the waiting
     * caller takes that first, and finds the end itself if it was not enough. Reporting the
     * close here failed a rank whose peer had finished the last collective and exited. */
    const tcp_peer *w = waiting_peer >= 0 ? &t->p[waiting_peer] : NULL;
    if (w && w->eof && w->wr == w->rd) return peer_closed(t, waiting_peer);
    return TD_OK;
}

static void tcp_abort(td_transport *tr, td_status st, const char *why) {
    (void)st;
    (void)why;
    tcp_t *t = (tcp_t *)tr;
    for (int j = 0; j < t->world; j++)
        if (t->p[j].fd >= 0) shutdown(t->p[j].fd, SHUT_RDWR);
}

static void tcp_free(td_transport *tr) {
    tcp_t *t = (tcp_t *)tr;
    for (int j = 0; j < t->world; j++) {
        if (t->p[j].fd >= 0) close(t->p[j].fd);
        free(t->p[j].buf);
    }
    free(t->p);
    free(t->pfds);
    free(t);
}

static const td_transport_ops tcp_ops = {
    .name = "tcp",
    .send = tcp_send,
    .send2 = tcp_send2,
    .recv_ptr = tcp_recv_ptr,
    .recv_done = tcp_recv_done,
    .recv_into = tcp_recv_into,
    .ready = tcp_ready,
    .check = tcp_check,
    .abort = tcp_abort,
    .free = tcp_free,
};

static void tune(int fd) {
    int one = 1, sz = SOCK_BUF_BYTES;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
}

static bool is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

/* Over loopback, a paced congestion control (bbr, the default on some hosts) spaces segments
 * out with timers and the ranks sit idle between them: measured 1.7 vs 2.9 GB/s busbw at
 * 16 MiB on a busy 2-core host. cubic sends whatever the window allows. Other links keep the
 * host's choice; failure (cubic not loaded or not allowed) changes nothing. */
static void loopback_cc(int fd, const struct sockaddr *peer) {
    static const char cc[] = "cubic";
    if (is_loopback(peer)) setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, sizeof(cc) - 1);
}

/* Blocking exact read/write with a deadline, for the setup handshake. */
static bool io_exact(int fd, bool writing, void *buf, size_t n, uint64_t deadline_ns) {
    uint8_t *b = buf;
    while (n) {
        ssize_t r =
            writing ? send(fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL) : recv(fd, b, n, MSG_DONTWAIT);
        if (r > 0) {
            b += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0) return false;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
        uint64_t now = td_now_ns();
        if (now >= deadline_ns) return false;
        struct pollfd p = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        poll(&p, 1, (int)TD_MIN((deadline_ns - now) / 1000000 + 1, 100u));
    }
    return true;
}

static td_status local_addr(td_pg_t *pg, char *host, size_t n) {
    if (pg->bind_addr) {
        snprintf(host, n, "%s", pg->bind_addr);
        return TD_OK;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(td__store_fd(pg->store), (struct sockaddr *)&ss, &sl) != 0)
        return td_error_errno(TD_ERR_SYS, "tcp: getsockname on the store connection");
    int gai = getnameinfo((struct sockaddr *)&ss, sl, host, (socklen_t)n, NULL, 0, NI_NUMERICHOST);
    if (gai) return td_error(TD_ERR_SYS, "tcp: getnameinfo: %s", gai_strerror(gai));
    return TD_OK;
}

/* Socket options that must be set before the connect: accepted sockets inherit the listener's,
 * a connecting one needs them before the handshake sizes its window. */
static void before_connect(int fd, const struct sockaddr *addr, socklen_t len, void *user) {
    (void)len, (void)user;
    tune(fd);
    loopback_cc(fd, addr);
}

/* Dials rank j at its published "ip port" until it listens or the deadline passes. */
static td_status connect_to(tcp_t *t, int j, const char *addr, uint64_t deadline) {
    char host[256], peer[32];
    int port = 0;
    if (sscanf(addr, "%255s %d", host, &port) != 2)
        return td_error(TD_ERR_PROTOCOL, "tcp: rank %d published a bad address '%s'", j, addr);
    snprintf(peer, sizeof(peer), "rank %d", j);
    td_connect_opts o = {.numeric_host = true, .before = before_connect, .peer = peer};
    for (;;) {
        td_connect_result how;
        int fd;
        /* the deadline decides whether to dial again; a dial near it still gets its full second
         * (loopback answers in microseconds, but not always before a zero-length wait) */
        o.deadline_s = TD_MAX((double)deadline * 1e-9, td_now_s() + CONNECT_MIN_S);
        td_status st = td_connect_tcp(host, port, &o, &fd, &how);
        if (st == TD_OK) {
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            t->p[j].fd = fd;
            return TD_OK;
        }
        int e = errno;
        if (how != TD_CONNECT_REFUSED || td_now_ns() >= deadline ||
            (e != ECONNREFUSED && e != EAGAIN && e != ETIMEDOUT))
            return td_error(st, "tcp: rank %d: %s", t->rank, td_error_msg());
        usleep(10000);
    }
}

td_status td__tcp_transport_new(td_pg_t *pg, const bool *use, td_transport **out) {
    *out = NULL;
    int W = pg->world, r = pg->rank, nhigher = 0, npeers = 0;
    for (int j = 0; j < W; j++) {
        npeers += use[j];
        nhigher += use[j] && j > r;
    }
    if (!npeers) return TD_OK;
    td_status st = TD_OK;
    tcp_t *t = td_xcalloc(1, sizeof(*t));
    t->base.ops = &tcp_ops;
    t->base.pg = pg;
    t->base.max_msg = MAX_MSG;
    t->rank = r;
    t->world = W;
    t->p = td_xcalloc((size_t)W, sizeof(*t->p));
    t->pfds = td_xcalloc((size_t)W, sizeof(*t->pfds));
    for (int j = 0; j < W; j++) t->p[j].fd = -1;
    uint64_t deadline = td_now_ns() + (uint64_t)pg->timeout_ms * 1000000ull;
    int lfd = -1;
    char *key = NULL, *val = NULL;
    void *v = NULL;
    size_t plen = strlen(pg->prefix);
    char host[256];
    TD_CHECK_GOTO(local_addr(pg, host, sizeof(host)), st, out);

    /* listen on port 0 at the address peers can reach, keep the socket, publish the port */
    int port = 0;
    if (td_listen_tcp(host, 0, 128, &lfd, &port) != TD_OK) {
        st = td_error(TD_ERR_SYS, "tcp: rank %d: %s (set bind_addr to an address of this host)", r,
                      td_error_msg());
        goto out;
    }
    tune(lfd); /* accepted sockets inherit the options */
    fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK);
    val = td_xasprintf("%s %d", host, port);
    key = td__pg_key(pg, "tcp/%d", r);
    TD_CHECK_GOTO(td_store_set(pg->store, key, val, strlen(val)), st, out);

    /* connect to lower ranks (their backlog accepts us even before they call accept) */
    hello_msg h = {.magic = HELLO_MAGIC,
                   .version = HELLO_VERSION,
                   .world = W,
                   .rank = r,
                   .prefix_len = (uint32_t)plen};
    for (int j = 0; j < r; j++) {
        if (!use[j]) continue;
        free(key);
        key = td__pg_key(pg, "tcp/%d", j);
        TD_CHECK_GOTO(td_store_get(pg->store, key, &v, NULL, pg->timeout_ms), st, out);
        TD_CHECK_GOTO(connect_to(t, j, v, deadline), st, out);
        free(v);
        v = NULL;
        if (!io_exact(t->p[j].fd, true, &h, sizeof(h), deadline) ||
            !io_exact(t->p[j].fd, true, pg->prefix, plen, deadline)) {
            st = td_error(TD_ERR_PEER, "tcp: rank %d: handshake with rank %d failed", r, j);
            goto out;
        }
    }
    /* accept higher ranks, checking each hello */
    for (int got = 0; got < nhigher;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                st = td_error_errno(TD_ERR_SYS, "tcp: accept");
                goto out;
            }
            uint64_t now = td_now_ns();
            if (now >= deadline) {
                st = td_error(TD_ERR_TIMEOUT,
                              "tcp: rank %d: %d higher rank(s) never connected "
                              "within %d ms",
                              r, nhigher - got, pg->timeout_ms);
                goto out;
            }
            struct pollfd p = {.fd = lfd, .events = POLLIN};
            poll(&p, 1, 100);
            continue;
        }
        struct sockaddr_storage ps;
        socklen_t psl = sizeof(ps);
        char peer[64] = "?";
        getpeername(fd, (struct sockaddr *)&ps, &psl);
        getnameinfo((struct sockaddr *)&ps, psl, peer, sizeof(peer), NULL, 0, NI_NUMERICHOST);
        hello_msg ph;
        char pre[512];
        uint64_t hd = td_now_ns() + 5000000000ull;
        const char *why = NULL;
        if (!io_exact(fd, false, &ph, sizeof(ph), hd))
            why = "no hello";
        else if (ph.magic != HELLO_MAGIC || ph.version != HELLO_VERSION)
            why = "bad magic or version";
        else if (ph.prefix_len != plen || plen >= sizeof(pre) ||
                 !io_exact(fd, false, pre, plen, hd) || memcmp(pre, pg->prefix, plen))
            why = "belongs to another job (prefix differs)";
        else if (ph.world != W || ph.rank <= r || ph.rank >= W || !use[ph.rank] ||
                 t->p[ph.rank].fd >= 0)
            why = "unexpected rank";
        if (why) {
            TD_LOG_WARN("comm: rank %d dropped a connection from %s: %s", r, peer, why);
            close(fd);
            continue;
        }
        tune(fd);
        loopback_cc(fd, (struct sockaddr *)&ps);
        t->p[ph.rank].fd = fd;
        got++;
        uint32_t ack = HELLO_MAGIC;
        if (!io_exact(fd, true, &ack, sizeof(ack), hd)) {
            st = td_error(TD_ERR_PEER, "tcp: rank %d: handshake with rank %d failed", r, ph.rank);
            goto out;
        }
    }
    for (int j = 0; j < r; j++) {
        if (!use[j]) continue;
        uint32_t ack = 0;
        if (!io_exact(t->p[j].fd, false, &ack, sizeof(ack), deadline) || ack != HELLO_MAGIC) {
            st = td_error(TD_ERR_PEER,
                          "tcp: rank %d refused rank %d's connection (a different "
                          "job on that address?)",
                          j, r);
            goto out;
        }
    }
    *out = &t->base;
    t = NULL;
out:
    if (lfd >= 0) close(lfd);
    free(key);
    free(val);
    free(v);
    if (t) tcp_free(&t->base);
    return st;
}
