/* The agent link's handshake (include/tandem/mirror.h): both ends prove they know the run's
 * token over fresh nonces, one text line each way. */
#include "tandem/mirror.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nettle/hmac.h>
#include <nettle/memops.h>

#include "tandem/loop.h"
#include "tandem/os.h"

#define AUTH_NONCE_BYTES 32
#define AUTH_MAC_BYTES   SHA256_DIGEST_SIZE
/* The longest line of the exchange is the agent's (129 bytes); anything much longer is not it. */
#define AUTH_LINE_MAX 256
#define AUTH_VERSION  "1"

static void auth_mac(const char *token, const char *label, const uint8_t *n1, const uint8_t *n2,
                     uint8_t out[AUTH_MAC_BYTES]) {
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, strlen(token), (const uint8_t *)token);
    hmac_sha256_update(&ctx, strlen(label), (const uint8_t *)label);
    hmac_sha256_update(&ctx, AUTH_NONCE_BYTES, n1);
    hmac_sha256_update(&ctx, AUTH_NONCE_BYTES, n2);
    hmac_sha256_digest(&ctx, AUTH_MAC_BYTES, out);
    memset(&ctx, 0, sizeof ctx); /* keyed state */
}

static td_status auth_random(uint8_t *buf, size_t n) {
    while (n > 0) {
        ssize_t r = getrandom(buf, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return td_error_errno(TD_ERR_SYS, "link: getrandom for a nonce");
        buf += r;
        n -= (size_t)r;
    }
    return TD_OK;
}

static void hex_encode(char *out, const uint8_t *in, size_t n) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Exactly 2n hex digits at s; returns the characters used (2n) or 0. */
static size_t hex_decode(uint8_t *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int hi = hex_value(s[2 * i]), lo = hi < 0 ? -1 : hex_value(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return 0;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 2 * n;
}

static int remaining_ms(uint64_t deadline_ns) {
    uint64_t now = td_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* Waits until fd is ready for events, or the deadline: TD_ERR_TIMEOUT naming what was awaited. */
static td_status wait_ready(int fd, short events, uint64_t deadline_ns, const char *what) {
    for (;;) {
        int ms = remaining_ms(deadline_ns);
        if (ms == 0)
            return td_error(TD_ERR_TIMEOUT,
                            "link: gave up waiting for %s (is the other end a tandem of this "
                            "version, and not stalled?)",
                            what);
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return td_error_errno(TD_ERR_IO, "link: waiting for %s", what);
        if (r > 0) return TD_OK; /* ready, or an error/hangup the read or write reports */
    }
}

td_status td_mirror_read_line(int fd, char *line, size_t cap, uint64_t deadline_ns,
                              const char *what) {
    size_t len = 0;
    for (;;) {
        if (deadline_ns) TD_CHECK(wait_ready(fd, POLLIN, deadline_ns, what));
        char c;
        ssize_t r = read(fd, &c, 1);
        if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (r < 0) return td_error_errno(TD_ERR_IO, "link: reading %s", what);
        if (r == 0)
            return td_error(TD_ERR_IO, "link: the connection closed while waiting for %s", what);
        if (c == '\n') {
            line[len] = '\0';
            return TD_OK;
        }
        if (len + 1 >= cap) {
            char quoted[96];
            td_escape_text(quoted, sizeof quoted, line, len);
            return td_error(TD_ERR_PROTOCOL,
                            "link: %s is a line over %zu bytes ('%s'): not a tandem link", what,
                            cap - 1, quoted);
        }
        line[len++] = c;
    }
}

/* The handshake's deadline runs from the connection: a timeout says how long that was. */
static td_status auth_timed(td_status st, const char *what, int timeout_ms) {
    if (st != TD_ERR_TIMEOUT) return st;
    return td_error(
        TD_ERR_TIMEOUT,
        "link: %s did not come within %d ms of the connection (is the other end a tandem of "
        "this version, and not stalled?)",
        what, timeout_ms);
}

static td_status auth_malformed(const char *what, const char *line, const char *expected) {
    char quoted[96];
    td_escape_text(quoted, sizeof quoted, line, strlen(line));
    return td_error(TD_ERR_PROTOCOL,
                    "link: %s was '%s', not '%s': the other end is not a tandem link of this "
                    "version",
                    what, quoted, expected);
}

static td_status auth_args(int fd, const char *token, int timeout_ms) {
    if (fd < 0 || timeout_ms <= 0)
        return td_error(TD_ERR_INVALID,
                        "link: authentication needs a connection and a timeout "
                        "(fd %d, timeout_ms %d)",
                        fd, timeout_ms);
    if (!token || !*token)
        return td_error(TD_ERR_INVALID, "link: no run token to authenticate with (TANDEM_TOKEN)");
    return TD_OK;
}

/* ---- the exchange as steps: what each line must be, and the answer to it ---- */

enum { PHASE_CHALLENGE, PHASE_ANSWER, PHASE_VERDICT, PHASE_DONE };

struct td_mirror_auth {
    int fd;
    int role;
    int phase;     /* the line awaited next (PHASE_DONE once the last one is out) */
    bool not_sock; /* a pipe or a tty: one byte per step, as a read may block */
    char *token;
    uint8_t nonce_s[AUTH_NONCE_BYTES], nonce_c[AUTH_NONCE_BYTES];
    char line[AUTH_LINE_MAX];
    size_t len;
    char out[AUTH_LINE_MAX];
    size_t out_len, out_off;
    const char *sending; /* what out holds */
};

static const char *awaited(const td_mirror_auth *a) {
    switch (a->phase) {
    case PHASE_CHALLENGE:
        return "the supervisor's challenge (tandem-link)";
    case PHASE_ANSWER:
        return "the agent's answer to the challenge";
    default:
        return "the supervisor's verdict (ok or denied)";
    }
}

static void queue_line(td_mirror_auth *a, const char *what, const char *text) {
    a->out_len = strlen(text);
    memcpy(a->out, text, a->out_len);
    a->out_off = 0;
    a->sending = what;
}

/* The supervisor has the agent's "NONCE_C MAC_C": the proof goes out, or TD_ERR_AUTH with
 * "denied" queued. */
static td_status on_answer(td_mirror_auth *a) {
    uint8_t want[AUTH_MAC_BYTES], got[AUTH_MAC_BYTES];
    size_t k = hex_decode(a->nonce_c, a->line, AUTH_NONCE_BYTES);
    if (k == 0 || a->line[k] != ' ' || hex_decode(got, a->line + k + 1, AUTH_MAC_BYTES) == 0 ||
        a->line[k + 1 + 2 * AUTH_MAC_BYTES] != '\0')
        return auth_malformed(awaited(a), a->line, "NONCE MAC");
    auth_mac(a->token, "tandem-link-agent", a->nonce_s, a->nonce_c, want);
    if (!memeql_sec(want, got, AUTH_MAC_BYTES)) {
        queue_line(a, "the refusal", "denied\n");
        return td_error(TD_ERR_AUTH,
                        "link: refused a connection: the peer does not know the run's token "
                        "(TANDEM_TOKEN); an agent of another run, or not an agent");
    }
    char hex[2 * AUTH_MAC_BYTES + 1], text[AUTH_LINE_MAX];
    auth_mac(a->token, "tandem-link-supervisor", a->nonce_c, a->nonce_s, want);
    hex_encode(hex, want, sizeof want);
    snprintf(text, sizeof text, "ok %s\n", hex);
    queue_line(a, "the proof", text);
    a->phase = PHASE_DONE;
    return TD_OK;
}

/* The agent has the challenge: its answer goes out. */
static td_status on_challenge(td_mirror_auth *a) {
    static const char greeting[] = "tandem-link " AUTH_VERSION " ";
    size_t glen = sizeof greeting - 1;
    if (strncmp(a->line, greeting, glen) != 0 ||
        hex_decode(a->nonce_s, a->line + glen, AUTH_NONCE_BYTES) == 0 ||
        a->line[glen + 2 * AUTH_NONCE_BYTES] != '\0')
        return auth_malformed(awaited(a), a->line, "tandem-link " AUTH_VERSION " NONCE");
    TD_CHECK(auth_random(a->nonce_c, sizeof a->nonce_c));
    uint8_t mac[AUTH_MAC_BYTES];
    char hex_n[2 * AUTH_NONCE_BYTES + 1], hex_m[2 * AUTH_MAC_BYTES + 1], text[AUTH_LINE_MAX];
    auth_mac(a->token, "tandem-link-agent", a->nonce_s, a->nonce_c, mac);
    hex_encode(hex_n, a->nonce_c, sizeof a->nonce_c);
    hex_encode(hex_m, mac, sizeof mac);
    snprintf(text, sizeof text, "%s %s\n", hex_n, hex_m);
    queue_line(a, "the answer to the challenge", text);
    a->phase = PHASE_VERDICT;
    return TD_OK;
}

/* The agent has the verdict. */
static td_status on_verdict(td_mirror_auth *a) {
    uint8_t want[AUTH_MAC_BYTES], got[AUTH_MAC_BYTES];
    if (!strcmp(a->line, "denied"))
        return td_error(TD_ERR_AUTH,
                        "link: the supervisor refused this agent's token: it is not the run's "
                        "(TANDEM_TOKEN); was the job started by another run?");
    if (strncmp(a->line, "ok ", 3) != 0 || hex_decode(got, a->line + 3, AUTH_MAC_BYTES) == 0 ||
        a->line[3 + 2 * AUTH_MAC_BYTES] != '\0')
        return auth_malformed(awaited(a), a->line, "ok MAC");
    auth_mac(a->token, "tandem-link-supervisor", a->nonce_c, a->nonce_s, want);
    if (!memeql_sec(want, got, AUTH_MAC_BYTES))
        return td_error(TD_ERR_AUTH,
                        "link: the supervisor did not prove it knows the run's token "
                        "(TANDEM_TOKEN): not sending it this node's logs (is the link host and "
                        "port the run's?)");
    a->phase = PHASE_DONE;
    return TD_OK;
}

td_status td_mirror_auth_begin(td_mirror_auth **out, int fd, const char *token, int role) {
    *out = NULL;
    if (fd < 0 || (role != TD_MIRROR_AUTH_ACCEPT && role != TD_MIRROR_AUTH_CONNECT))
        return td_error(TD_ERR_INVALID,
                        "link: authentication needs a connection and a side "
                        "(fd %d, role %d)",
                        fd, role);
    if (!token || !*token)
        return td_error(TD_ERR_INVALID, "link: no run token to authenticate with (TANDEM_TOKEN)");
    td_mirror_auth *a = td_xcalloc(1, sizeof *a);
    a->fd = fd;
    a->role = role;
    a->token = td_xstrdup(token);
    a->phase = PHASE_CHALLENGE;
    if (role == TD_MIRROR_AUTH_ACCEPT) {
        td_status st = auth_random(a->nonce_s, sizeof a->nonce_s);
        if (st != TD_OK) {
            td_mirror_auth_free(a);
            return st;
        }
        char hex[2 * AUTH_NONCE_BYTES + 1], text[AUTH_LINE_MAX];
        hex_encode(hex, a->nonce_s, sizeof a->nonce_s);
        snprintf(text, sizeof text, "tandem-link " AUTH_VERSION " %s\n", hex);
        queue_line(a, "the challenge", text);
        a->phase = PHASE_ANSWER;
    }
    *out = a;
    return TD_OK;
}

void td_mirror_auth_free(td_mirror_auth *a) {
    if (!a) return;
    memset(a->nonce_s, 0, sizeof a->nonce_s);
    if (a->token) memset(a->token, 0, strlen(a->token));
    free(a->token);
    free(a);
}

const char *td_mirror_auth_waiting_for(const td_mirror_auth *a) {
    return a->out_off < a->out_len ? a->sending : awaited(a);
}

/* Sends what is queued: 1 when it is out, 0 when the socket is full. */
static td_status flush_line(td_mirror_auth *a, int *sent) {
    *sent = 0;
    while (a->out_off < a->out_len) {
        /* MSG_NOSIGNAL: a peer that hung up is an error here, not a SIGPIPE for the process. */
        const char *p = a->out + a->out_off;
        size_t n = a->out_len - a->out_off;
        ssize_t w = a->not_sock ? -1 : send(a->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (a->not_sock || errno == ENOTSOCK)) {
            a->not_sock = true;
            w = write(a->fd, p, n);
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return TD_OK;
        if (w < 0) return td_error_errno(TD_ERR_IO, "link: sending %s", a->sending);
        a->out_off += (size_t)w;
    }
    *sent = 1;
    return TD_OK;
}

/* Reads one byte: 1, or 0 when none is there yet. */
static td_status read_byte(td_mirror_auth *a, char *c, int *got) {
    *got = 0;
    for (;;) {
        ssize_t r = a->not_sock ? -1 : recv(a->fd, c, 1, MSG_DONTWAIT);
        if (r < 0 && (a->not_sock || errno == ENOTSOCK)) {
            a->not_sock = true;
            r = read(a->fd, c, 1);
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return TD_OK;
        if (r < 0) return td_error_errno(TD_ERR_IO, "link: reading %s", awaited(a));
        if (r == 0)
            return td_error(TD_ERR_IO, "link: the connection closed while waiting for %s",
                            awaited(a));
        *got = 1;
        return TD_OK;
    }
}

/* A whole line arrived: what it says decides the next step. */
static td_status on_line(td_mirror_auth *a) {
    switch (a->phase) {
    case PHASE_CHALLENGE:
        return on_challenge(a);
    case PHASE_ANSWER:
        return on_answer(a);
    default:
        return on_verdict(a);
    }
}

td_status td_mirror_auth_step(td_mirror_auth *a, unsigned *wants) {
    bool may_read = true;
    for (;;) {
        int sent;
        TD_CHECK(flush_line(a, &sent));
        if (!sent) {
            *wants = TD_LOOP_WRITE;
            return TD_OK;
        }
        if (a->phase == PHASE_DONE) {
            *wants = 0;
            return TD_OK;
        }
        char c;
        int got = 0;
        if (may_read) TD_CHECK(read_byte(a, &c, &got));
        if (!got) {
            *wants = TD_LOOP_READ;
            return TD_OK;
        }
        /* A pipe's next read may block: one byte per step there (the caller waits first). */
        if (a->not_sock) may_read = false;
        if (c != '\n') {
            if (a->len + 1 >= sizeof a->line) {
                char quoted[96];
                td_escape_text(quoted, sizeof quoted, a->line, a->len);
                return td_error(TD_ERR_PROTOCOL,
                                "link: %s is a line over %zu bytes ('%s'): not a tandem link",
                                awaited(a), sizeof a->line - 1, quoted);
            }
            a->line[a->len++] = c;
            continue;
        }
        a->line[a->len] = '\0';
        a->len = 0;
        td_status st = on_line(a);
        if (st == TD_ERR_AUTH && a->out_off < a->out_len) {
            /* the refusal, if the socket takes it now (seven bytes: it does); the error stands */
            ssize_t w = send(a->fd, a->out, a->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0 && errno == ENOTSOCK) w = write(a->fd, a->out, a->out_len);
            (void)w;
        }
        if (st != TD_OK) return st;
    }
}

/* ---- the blocking calls: the steps, waiting for fd in between ---- */

static td_status auth_run(int fd, const char *token, int timeout_ms, int role) {
    TD_CHECK(auth_args(fd, token, timeout_ms));
    uint64_t deadline = td_now_ns() + (uint64_t)timeout_ms * 1000000;
    td_mirror_auth *a;
    TD_CHECK(td_mirror_auth_begin(&a, fd, token, role));
    td_status st;
    for (;;) {
        unsigned wants = 0;
        st = td_mirror_auth_step(a, &wants);
        if (st != TD_OK || !wants) break;
        const char *what = td_mirror_auth_waiting_for(a);
        st = auth_timed(wait_ready(fd, wants & TD_LOOP_WRITE ? POLLOUT : POLLIN, deadline, what),
                        what, timeout_ms);
        if (st != TD_OK) break;
    }
    td_mirror_auth_free(a);
    return st;
}

td_status td_mirror_auth_accept(int fd, const char *token, int timeout_ms) {
    return auth_run(fd, token, timeout_ms, TD_MIRROR_AUTH_ACCEPT);
}

td_status td_mirror_auth_connect(int fd, const char *token, int timeout_ms) {
    return auth_run(fd, token, timeout_ms, TD_MIRROR_AUTH_CONNECT);
}
