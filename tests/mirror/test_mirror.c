/* The mirror (tandem/mirror.h): append-only files over a byte stream that breaks, each byte
 * once, and nothing written outside the receiver's directories; whole files; the link's mutual
 * authentication, checked against an independent implementation of the exchange. */
#include "test.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nettle/hmac.h>

#include "tandem/mirror.h"
#include "tandem/os.h"

static char dir[] = "/tmp/tandem-test-mirror-XXXXXX";
static char *src_logs, *src_metrics, *dst;

static void append(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    ASSERT(fd >= 0);
    ASSERT_EQ(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = td_xcalloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    if (len) *len = n;
    return buf;
}

/* Everything a sender wrote into the stream file so far, from *pos on. */
static char *take_stream(int fd, off_t *pos, size_t *n) {
    off_t end = lseek(fd, 0, SEEK_END);
    char *buf = td_xmalloc((size_t)(end - *pos) + 1);
    ASSERT_EQ(pread(fd, buf, (size_t)(end - *pos), *pos), end - *pos);
    *n = (size_t)(end - *pos);
    *pos = end;
    return buf;
}

/* Feeds in awkward pieces (1, 2, 3, ... bytes) so headers and payloads split anywhere. */
static td_status feed_pieces(td_mirror_in *in, const char *buf, size_t n) {
    for (size_t off = 0, k = 1; off < n; off += k, k = k % 7 + 1) {
        td_status st = td_mirror_in_feed(in, buf + off, TD_MIN(k, n - off));
        if (st != TD_OK) return st;
    }
    return TD_OK;
}

static void assert_same(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    ASSERT(x && y);
    ASSERT_EQ(na, nb);
    ASSERT(memcmp(x, y, na) == 0);
    free(x);
    free(y);
}

typedef struct {
    char port[32];
    size_t echoed;
} seen;

static void on_note(void *user, const char *key, const char *value) {
    if (!strcmp(key, "store_port")) snprintf(((seen *)user)->port, 32, "%s", value);
}
static void on_data(void *user, const char *name, const char *bytes, size_t n) {
    (void)name;
    (void)bytes;
    ((seen *)user)->echoed += n;
}

static const char *const prefixes[] = {"logs", "metrics"};

static void test_copy_restart_and_duplicates(void) {
    char *log0 = td_xasprintf("%s/rank-0.log", src_logs);
    char *met1 = td_xasprintf("%s/rank-1.jsonl", src_metrics);
    char *copy_log0 = td_xasprintf("%s/logs/rank-0.log", dst);
    char *copy_met1 = td_xasprintf("%s/metrics/rank-1.jsonl", dst);
    append(log0, "hello from rank 0\n");
    append(met1, "{\"step\": 1, \"loss\": 2.5}\n");
    char *empty = td_xasprintf("%s/rank-5.log", src_logs); /* a rank that printed nothing */
    append(empty, "");
    char *copy_empty = td_xasprintf("%s/logs/rank-5.log", dst);

    char *stream_path = td_xasprintf("%s/stream", dir);
    int sfd = open(stream_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT(sfd >= 0);
    off_t pos = 0;
    seen s = {0};
    td_mirror_callbacks cb = {.note = on_note, .data = on_data, .user = &s};
    td_mirror_in *in = td_mirror_in_new(dst, prefixes, 2, &cb);

    /* first link: everything there, then what grows */
    char *manifest = td_mirror_in_manifest(in);
    ASSERT_STREQ(manifest, "");
    free(manifest);
    td_mirror_out *out = td_mirror_out_new(sfd);
    td_mirror_out_watch(out, "logs", src_logs);
    td_mirror_out_watch(out, "metrics", src_metrics);
    int64_t sent = 0;
    ASSERT_OK(td_mirror_out_note(out, "store_port", "41234"));
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    ASSERT_EQ(sent, 18 + 25);
    size_t n;
    char *bytes = take_stream(sfd, &pos, &n);
    ASSERT_OK(feed_pieces(in, bytes, n));
    free(bytes);
    ASSERT_STREQ(s.port, "41234");
    assert_same(log0, copy_log0);
    assert_same(met1, copy_met1);
    assert_same(empty, copy_empty); /* an empty file is mirrored as one */
    free(empty);
    free(copy_empty);
    append(log0, "step 2\n");
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    ASSERT_EQ(sent, 7);
    ASSERT_OK(td_mirror_out_poll(out, &sent)); /* nothing new: nothing sent */
    ASSERT_EQ(sent, 0);

    /* the link breaks in the middle of a frame: the copy has part of the tail */
    append(log0, "a line the link cuts in half\n");
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    bytes = take_stream(sfd, &pos, &n);
    ASSERT_OK(feed_pieces(in, bytes, n - 10));
    free(bytes);
    td_mirror_out_free(out);
    td_mirror_in_reset(in);

    /* the agent restarts and gets the receiver's manifest: only the missing tail comes */
    append(log0, "after the restart\n");
    append(met1, "{\"step\": 2, \"loss\": 2.0}\n");
    manifest = td_mirror_in_manifest(in);
    ASSERT_CONTAINS(manifest, "have logs/rank-0.log ");
    ASSERT_CONTAINS(manifest, "have metrics/rank-1.jsonl 25\n");
    out = td_mirror_out_new(sfd);
    td_mirror_out_watch(out, "logs", src_logs);
    td_mirror_out_watch(out, "metrics", src_metrics);
    for (char *line = strtok(manifest, "\n"); line; line = strtok(NULL, "\n"))
        ASSERT_OK(td_mirror_out_have(out, line));
    free(manifest);
    ASSERT_OK(td_mirror_out_end(out));
    td_mirror_out_free(out);
    bytes = take_stream(sfd, &pos, &n);
    ASSERT_OK(feed_pieces(in, bytes, n));
    free(bytes);
    ASSERT(td_mirror_in_ended(in));
    assert_same(log0, copy_log0);
    assert_same(met1, copy_met1);
    int64_t appended, duplicate;
    td_mirror_in_counts(in, &appended, &duplicate);
    ASSERT_EQ(duplicate, 0);

    /* a sender without a manifest resends everything: the copy does not change */
    out = td_mirror_out_new(sfd);
    td_mirror_out_watch(out, "logs", src_logs);
    td_mirror_out_watch(out, "metrics", src_metrics);
    ASSERT_OK(td_mirror_out_end(out));
    td_mirror_out_free(out);
    td_mirror_in_reset(in);
    bytes = take_stream(sfd, &pos, &n);
    ASSERT_OK(feed_pieces(in, bytes, n));
    free(bytes);
    assert_same(log0, copy_log0);
    assert_same(met1, copy_met1);
    int64_t appended2;
    td_mirror_in_counts(in, &appended2, &duplicate);
    ASSERT_EQ(appended2, appended);
    struct stat sb;
    ASSERT(stat(log0, &sb) == 0);
    ASSERT(duplicate >= sb.st_size);
    ASSERT_EQ(s.echoed, (size_t)appended);

    /* a frame that would leave a hole is refused; the copy is unchanged */
    td_mirror_in_reset(in);
    const char *gap = "tdm data logs/rank-0.log 999999 3\nabc";
    ASSERT_STATUS(td_mirror_in_feed(in, gap, strlen(gap)), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "the copy has only");
    assert_same(log0, copy_log0);

    td_mirror_in_free(in);
    close(sfd);
    free(stream_path);
    free(log0);
    free(met1);
    free(copy_log0);
    free(copy_met1);
}

/* A remote host controls the stream: no name may leave the prefixes' directories. */
static void test_names_refused(void) {
    static const char *const bad[] = {
        "tdm data ../escape 0 1\nx",
        "tdm data logs/../../escape 0 1\nx",
        "tdm data /tmp/escape 0 1\nx",
        "tdm data logs/.hidden 0 1\nx",
        "tdm data logs/a/b 0 1\nx",
        "tdm data other/rank-0.log 0 1\nx",
        "tdm data logs/ 0 1\nx",
        "tdm data logs/x -1 1\nx",
        "tdm data logs/x 0 99999999999\nx",
        "tdm data logs/x 0\nx",
        "tdm bogus\n",
        "tdm note\n",
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        td_mirror_in *in = td_mirror_in_new(dst, prefixes, 2, NULL);
        ASSERT_STATUS(td_mirror_in_feed(in, bad[i], strlen(bad[i])), TD_ERR_FORMAT);
        td_mirror_in_free(in);
    }
    char *escaped = td_xasprintf("%s/../escape", dst);
    ASSERT(access(escaped, F_OK) != 0);
    free(escaped);

    /* a header that never ends is an error, not unbounded buffering */
    td_mirror_in *in = td_mirror_in_new(dst, prefixes, 2, NULL);
    char junk[2048];
    memset(junk, 'x', sizeof junk);
    ASSERT_STATUS(td_mirror_in_feed(in, junk, sizeof junk), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "longer than");
    td_mirror_in_free(in);

    /* a symlink planted where a copy goes is not written through */
    char *target = td_xasprintf("%s/target", dir);
    char *link = td_xasprintf("%s/logs/rank-9.log", dst);
    append(target, "");
    ASSERT_OK(td_mkdirs(dst));
    char *logs_dir = td_xasprintf("%s/logs", dst);
    ASSERT_OK(td_mkdirs(logs_dir));
    ASSERT(symlink(target, link) == 0);
    in = td_mirror_in_new(dst, prefixes, 2, NULL);
    const char *frame = "tdm data logs/rank-9.log 0 4\nevil";
    ASSERT_STATUS(td_mirror_in_feed(in, frame, strlen(frame)), TD_ERR_IO);
    td_mirror_in_free(in);
    struct stat sb;
    ASSERT(stat(target, &sb) == 0);
    ASSERT_EQ(sb.st_size, 0);
    char *manifest = td_mirror_in_manifest(in = td_mirror_in_new(dst, prefixes, 2, NULL));
    ASSERT(!strstr(manifest, "rank-9")); /* the manifest lists regular files only */
    free(manifest);
    td_mirror_in_free(in);
    free(target);
    free(link);
    free(logs_dir);

    /* manifest lines from a receiver are checked too */
    td_mirror_out *out = td_mirror_out_new(-1);
    ASSERT_STATUS(td_mirror_out_have(out, "have logs/x"), TD_ERR_FORMAT);
    ASSERT_STATUS(td_mirror_out_have(out, "have logs/x -3"), TD_ERR_FORMAT);
    ASSERT_OK(td_mirror_out_have(out, "have logs/x 3"));
    td_mirror_out_free(out);
}

/* A broken link is an error the caller sees (EPIPE), not a silent loss. */
static void test_broken_link(void) {
    int p[2];
    ASSERT(pipe(p) == 0);
    close(p[0]);
    signal(SIGPIPE, SIG_IGN);
    td_mirror_out *out = td_mirror_out_new(p[1]);
    td_mirror_out_watch(out, "logs", src_logs);
    ASSERT_STATUS(td_mirror_out_poll(out, NULL), TD_ERR_IO);
    ASSERT_CONTAINS(td_error_msg(), "writing to the link");
    td_mirror_out_free(out);
    close(p[1]);
}

/* ---- authentication ---- */

static const char token[] = "run-token-7f3a";

typedef struct {
    int fd;
    const char *token;
    int timeout_ms, server;
    td_status st;
    char msg[1024];
} auth_side;

static void *auth_thread(void *arg) {
    auth_side *a = arg;
    a->st = a->server ? td_mirror_auth_accept(a->fd, a->token, a->timeout_ms)
                      : td_mirror_auth_connect(a->fd, a->token, a->timeout_ms);
    snprintf(a->msg, sizeof a->msg, "%s", td_error_msg());
    return NULL;
}

/* Both ends, each with its own token, over a socketpair; the server in a thread. */
static void auth_pair(const char *server_token, const char *client_token, auth_side *server,
                      auth_side *client) {
    int sv[2];
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    *server = (auth_side){.fd = sv[0], .token = server_token, .timeout_ms = 5000, .server = 1};
    *client = (auth_side){.fd = sv[1], .token = client_token, .timeout_ms = 5000};
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, auth_thread, server) == 0);
    auth_thread(client);
    ASSERT(pthread_join(t, NULL) == 0);
}

/* The exchange written out again, from the header's description, for the fake peers. */
static void mac_of(const char *tok, const char *label, const uint8_t *n1, const uint8_t *n2,
                   uint8_t out[32]) {
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, strlen(tok), (const uint8_t *)tok);
    hmac_sha256_update(&ctx, strlen(label), (const uint8_t *)label);
    hmac_sha256_update(&ctx, 32, n1);
    hmac_sha256_update(&ctx, 32, n2);
    hmac_sha256_digest(&ctx, 32, out);
}

static void to_hex(char *out, const uint8_t *in, size_t n) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", in[i]);
}

static void from_hex(uint8_t *out, const char *in, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        ASSERT(sscanf(in + 2 * i, "%2x", &v) == 1);
        out[i] = (uint8_t)v;
    }
}

static void read_line(int fd, char *line, size_t cap) {
    size_t len = 0;
    for (char c; read(fd, &c, 1) == 1 && c != '\n';) {
        ASSERT(len + 1 < cap);
        line[len++] = c;
    }
    line[len] = '\0';
}

static void write_str(int fd, const char *s) {
    ASSERT_EQ(write(fd, s, strlen(s)), (ssize_t)strlen(s));
}

static void test_auth_ok(void) {
    auth_side server, client;
    auth_pair(token, token, &server, &client);
    ASSERT_EQ(server.st, TD_OK);
    ASSERT_EQ(client.st, TD_OK);
    /* the connection is the caller's after it */
    write_str(client.fd, "hello 0 1\n");
    char line[64];
    read_line(server.fd, line, sizeof line);
    ASSERT_STREQ(line, "hello 0 1");
    close(server.fd);
    close(client.fd);
}

/* A fake supervisor: checks the agent's MAC by the header's formula, then proves itself (or
 * not), its next bytes in the same write as the proof. */
static void *fake_server(void *arg) {
    auth_side *a = arg;
    uint8_t ns[32], nc[32], mac[32], got[32];
    for (int i = 0; i < 32; i++) ns[i] = (uint8_t)(i * 7 + 1);
    char hex[65], line[512];
    to_hex(hex, ns, 32);
    snprintf(line, sizeof line, "tandem-link 1 %s\n", hex);
    write_str(a->fd, line);
    read_line(a->fd, line, sizeof line);
    ASSERT_EQ(strlen(line), 129);
    ASSERT_EQ(line[64], ' ');
    from_hex(nc, line, 32);
    from_hex(got, line + 65, 32);
    mac_of(token, "tandem-link-agent", ns, nc, mac);
    ASSERT(memcmp(mac, got, 32) == 0); /* the agent's MAC is the documented one */
    mac_of(token, "tandem-link-supervisor", nc, ns, mac);
    if (!a->server) mac[0] ^= 1; /* an impostor that did not check and cannot prove */
    to_hex(hex, mac, 32);
    snprintf(line, sizeof line, "ok %s\ntdm after the proof\n", hex);
    write_str(a->fd, line);
    return NULL;
}

static void test_auth_wire_and_leftover(void) {
    /* agent side: the supervisor's next bytes, sent with its proof, stay in the socket */
    int sv[2];
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    auth_side fake = {.fd = sv[0], .server = 1};
    pthread_t t;
    ASSERT(pthread_create(&t, NULL, fake_server, &fake) == 0);
    ASSERT_OK(td_mirror_auth_connect(sv[1], token, 5000));
    ASSERT(pthread_join(t, NULL) == 0);
    char line[512];
    read_line(sv[1], line, sizeof line);
    ASSERT_STREQ(line, "tdm after the proof");
    close(sv[0]);
    close(sv[1]);

    /* an impostor supervisor that answers ok with a MAC it could not compute */
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    fake = (auth_side){.fd = sv[0], .server = 0};
    ASSERT(pthread_create(&t, NULL, fake_server, &fake) == 0);
    ASSERT_STATUS(td_mirror_auth_connect(sv[1], token, 5000), TD_ERR_AUTH);
    ASSERT_CONTAINS(td_error_msg(), "the supervisor did not prove it knows the run's token");
    ASSERT(pthread_join(t, NULL) == 0);
    close(sv[0]);
    close(sv[1]);

    /* supervisor side: a fake agent sends its answer and its first bytes in one write */
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    auth_side server = {.fd = sv[0], .token = token, .timeout_ms = 5000, .server = 1};
    ASSERT(pthread_create(&t, NULL, auth_thread, &server) == 0);
    read_line(sv[1], line, sizeof line);
    ASSERT(!strncmp(line, "tandem-link 1 ", 14));
    ASSERT_EQ(strlen(line), 14 + 64);
    uint8_t ns[32], nc[32], mac[32], got[32];
    from_hex(ns, line + 14, 32);
    memset(nc, 0x5a, sizeof nc);
    mac_of(token, "tandem-link-agent", ns, nc, mac);
    char hn[65], hm[65];
    to_hex(hn, nc, 32);
    to_hex(hm, mac, 32);
    snprintf(line, sizeof line, "%s %s\nhello 3 0\n", hn, hm);
    write_str(sv[1], line);
    ASSERT(pthread_join(t, NULL) == 0);
    ASSERT_EQ(server.st, TD_OK);
    read_line(sv[1], line, sizeof line);
    ASSERT(!strncmp(line, "ok ", 3));
    from_hex(got, line + 3, 32);
    mac_of(token, "tandem-link-supervisor", nc, ns, mac);
    ASSERT(memcmp(mac, got, 32) == 0); /* the supervisor's proof is the documented one */
    read_line(sv[0], line, sizeof line);
    ASSERT_STREQ(line, "hello 3 0");
    close(sv[0]);
    close(sv[1]);
}

static void test_auth_wrong_token(void) {
    /* Either side's token may be the wrong one: the supervisor sees a MAC it does not expect,
     * refuses, and the agent hears it. */
    for (int wrong_server = 0; wrong_server < 2; wrong_server++) {
        auth_side server, client;
        auth_pair(wrong_server ? "another-run" : token, wrong_server ? token : "another-run",
                  &server, &client);
        ASSERT_EQ(server.st, TD_ERR_AUTH);
        ASSERT_CONTAINS(server.msg, "the peer does not know the run's token");
        ASSERT_EQ(client.st, TD_ERR_AUTH);
        ASSERT_CONTAINS(client.msg,
                        "the supervisor refused this agent's token: it is not the run's "
                        "(TANDEM_TOKEN)");
        ASSERT(!strstr(server.msg, token) && !strstr(client.msg, token));
        close(server.fd);
        close(client.fd);
    }
}

static void test_auth_garbage_silence_close(void) {
    int sv[2];
    /* a stranger on the port: its line is quoted, printable only */
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    write_str(sv[0], "SSH-2.0-OpenSSH_9.2\r\n");
    ASSERT_STATUS(td_mirror_auth_connect(sv[1], token, 5000), TD_ERR_PROTOCOL);
    ASSERT_CONTAINS(td_error_msg(), "SSH-2.0-OpenSSH_9.2");
    ASSERT(!strchr(td_error_msg(), '\r'));
    close(sv[0]);
    close(sv[1]);

    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    write_str(sv[1], "GET / HTTP/1.1\n");
    ASSERT_STATUS(td_mirror_auth_accept(sv[0], token, 5000), TD_ERR_PROTOCOL);
    ASSERT_CONTAINS(td_error_msg(), "GET / HTTP/1.1");
    close(sv[0]);
    close(sv[1]);

    /* a line that never ends is refused, not buffered */
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    char junk[4096];
    memset(junk, 'x', sizeof junk);
    ASSERT_EQ(write(sv[1], junk, sizeof junk), (ssize_t)sizeof junk);
    ASSERT_STATUS(td_mirror_auth_accept(sv[0], token, 5000), TD_ERR_PROTOCOL);
    ASSERT_CONTAINS(td_error_msg(), "over");
    close(sv[0]);
    close(sv[1]);

    /* a verdict that is neither ok nor denied */
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    char line[256], hex[65];
    uint8_t ns[32] = {1};
    to_hex(hex, ns, 32);
    snprintf(line, sizeof line, "tandem-link 1 %s\nmaybe\n", hex);
    write_str(sv[0], line);
    ASSERT_STATUS(td_mirror_auth_connect(sv[1], token, 5000), TD_ERR_PROTOCOL);
    ASSERT_CONTAINS(td_error_msg(), "'maybe'");
    close(sv[0]);
    close(sv[1]);

    /* a silent peer: a timeout naming the wait, on time */
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    double t0 = td_now_s();
    ASSERT_STATUS(td_mirror_auth_connect(sv[1], token, 300), TD_ERR_TIMEOUT);
    double waited = td_now_s() - t0;
    ASSERT_CONTAINS(td_error_msg(), "challenge");
    ASSERT_CONTAINS(td_error_msg(), "300 ms");
    ASSERT(waited >= 0.25 && waited < 2.0);
    t0 = td_now_s();
    ASSERT_STATUS(td_mirror_auth_accept(sv[0], token, 300), TD_ERR_TIMEOUT);
    waited = td_now_s() - t0;
    ASSERT_CONTAINS(td_error_msg(), "answer");
    ASSERT(waited >= 0.25 && waited < 2.0);
    /* a peer that dribbles bytes does not stretch the deadline */
    write_str(sv[1], "abc");
    t0 = td_now_s();
    ASSERT_STATUS(td_mirror_auth_accept(sv[0], token, 300), TD_ERR_TIMEOUT);
    ASSERT(td_now_s() - t0 < 2.0);
    close(sv[0]);
    close(sv[1]);

    /* a peer that hangs up */
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    close(sv[0]);
    ASSERT_STATUS(td_mirror_auth_connect(sv[1], token, 5000), TD_ERR_IO);
    ASSERT_CONTAINS(td_error_msg(), "closed");
    close(sv[1]);
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    close(sv[1]);
    ASSERT_STATUS(td_mirror_auth_accept(sv[0], token, 5000), TD_ERR_IO);
    close(sv[0]);
}

/* ---- new spools, new links ---- */

static int open_stream(const char *base, const char *name) {
    char *path = td_xasprintf("%s/%s", base, name);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT(fd >= 0);
    free(path);
    return fd;
}

/* The receiver's manifest, line by line, into the sender. */
static void give_manifest(td_mirror_in *in, td_mirror_out *out) {
    char *manifest = td_mirror_in_manifest(in);
    for (char *line = strtok(manifest, "\n"); line; line = strtok(NULL, "\n"))
        ASSERT_OK(td_mirror_out_have(out, line));
    free(manifest);
}

/* Everything new in the stream file, fed to the receiver. */
static void deliver(int sfd, off_t *pos, td_mirror_in *in) {
    size_t n;
    char *bytes = take_stream(sfd, pos, &n);
    ASSERT_OK(feed_pieces(in, bytes, n));
    free(bytes);
}

static void assert_content(const char *path, const char *want) {
    size_t n = 0;
    char *got = slurp(path, &n);
    ASSERT(got);
    ASSERT_EQ(n, strlen(want));
    ASSERT(memcmp(got, want, n) == 0);
    free(got);
}

static char *repeat(char c, size_t n) {
    char *s = td_xmalloc(n + 1);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

/* A requeued job on another machine: its spool is new, and continues the copies. */
static void test_fresh_spool_continues(void) {
    char *base = td_xasprintf("%s/fresh", dir);
    char *logs = td_xasprintf("%s/agent/logs", base), *run = td_xasprintf("%s/run", base);
    char *run_logs = td_xasprintf("%s/logs", run);
    ASSERT_OK(td_mkdirs(logs));
    ASSERT_OK(td_mkdirs(run_logs));
    char *copy0 = td_xasprintf("%s/rank-0.log", run_logs);
    char *copy1 = td_xasprintf("%s/rank-1.log", run_logs);
    char *old0 = repeat('A', 100), *old1 = repeat('C', 50);
    append(copy0, old0); /* what the first machine delivered */
    append(copy1, old1);
    char *local0 = td_xasprintf("%s/rank-0.log", logs);
    char *local1 = td_xasprintf("%s/rank-1.log", logs);
    char *new0 = repeat('b', 30);
    append(local0, new0);

    int sfd = open_stream(base, "stream1");
    off_t pos = 0;
    td_mirror_in *in = td_mirror_in_new(run, prefixes, 2, NULL);
    td_mirror_out *out = td_mirror_out_new(sfd);
    td_mirror_out_watch(out, "logs", logs);
    give_manifest(in, out);
    /* rank 1 had no file here when the manifest came: it starts after the copy, however long
     * it is by the time it is sent */
    char *new1 = repeat('d', 80);
    append(local1, new1);
    int64_t sent = 0;
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    ASSERT_EQ(sent, 30 + 80);
    deliver(sfd, &pos, in);
    char *want = td_xasprintf("%s%s", old0, new0);
    assert_content(copy0, want);
    free(want);
    want = td_xasprintf("%s%s", old1, new1);
    assert_content(copy1, want);
    free(want);

    /* it goes on growing, after them */
    append(local0, "0123456789");
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    ASSERT_EQ(sent, 10);
    deliver(sfd, &pos, in);
    want = td_xasprintf("%s%s0123456789", old0, new0);
    assert_content(copy0, want);
    free(want);
    td_mirror_in_free(in);

    /* the link drops; the same agent reconnects: the copy has 140 bytes, the local file 40, and
     * only what came since goes out, after them, nothing twice */
    append(local0, "tail\n");
    int sfd2 = open_stream(base, "stream2");
    off_t pos2 = 0;
    in = td_mirror_in_new(run, prefixes, 2, NULL);
    td_mirror_out_reset(out, sfd2);
    give_manifest(in, out);
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    ASSERT_EQ(sent, 5);
    deliver(sfd2, &pos2, in);
    want = td_xasprintf("%s%s0123456789tail\n", old0, new0);
    assert_content(copy0, want);
    free(want);
    want = td_xasprintf("%s%s", old1, new1);
    assert_content(copy1, want);
    free(want);
    int64_t appended, duplicate;
    td_mirror_in_counts(in, &appended, &duplicate);
    ASSERT_EQ(appended, 5);
    ASSERT_EQ(duplicate, 0);

    /* a local file at least as long as the copy is its source: sent from the copy's end */
    td_mirror_in_free(in);
    td_mirror_out_free(out);
    close(sfd);
    close(sfd2);
    free(old0);
    free(old1);
    free(new0);
    free(new1);
    free(local0);
    free(local1);
    free(copy0);
    free(copy1);
    free(run_logs);
    free(logs);
    free(run);
    free(base);
}

/* td_mirror_out_fresh_spool: a spool made for this sender alone follows the copies even where
 * its file is already longer than a short copy (a requeue line written before the link opened),
 * which the sizes alone would take for the copy's source and cut short. A reconnect of the same
 * sender then continues, and a file the first manifest did not name starts at 0. */
static void test_declared_fresh_spool(void) {
    char *base = td_xasprintf("%s/declared", dir);
    char *logs = td_xasprintf("%s/agent/logs", base), *run = td_xasprintf("%s/run", base);
    char *run_logs = td_xasprintf("%s/logs", run);
    ASSERT_OK(td_mkdirs(logs));
    ASSERT_OK(td_mkdirs(run_logs));
    char *copy1 = td_xasprintf("%s/rank-1.log", run_logs), *copy2 = NULL;
    append(copy1, "--- requeue 1 ---\n"); /* 18 bytes from the last machine */
    char *local1 = td_xasprintf("%s/rank-1.log", logs);
    append(local1, "--- requeue 2 ---\nstep 7\n"); /* longer than the copy: still all new */

    int sfd = open_stream(base, "s1");
    off_t pos = 0;
    td_mirror_in *in = td_mirror_in_new(run, prefixes, 2, NULL);
    td_mirror_out *out = td_mirror_out_new(sfd);
    td_mirror_out_watch(out, "logs", logs);
    td_mirror_out_fresh_spool(out);
    give_manifest(in, out);
    int64_t sent = 0;
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    ASSERT_EQ(sent, 25);
    deliver(sfd, &pos, in);
    assert_content(copy1, "--- requeue 1 ---\n--- requeue 2 ---\nstep 7\n");
    /* a file the receiver had none of */
    char *local2 = td_xasprintf("%s/rank-2.log", logs);
    append(local2, "two\n");
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    deliver(sfd, &pos, in);
    copy2 = td_xasprintf("%s/rank-2.log", run_logs);
    assert_content(copy2, "two\n");
    td_mirror_in_free(in);

    /* the link drops and comes back: the first manifest's bases stand, nothing twice */
    append(local1, "step 8\n");
    append(local2, "more\n");
    int sfd2 = open_stream(base, "s2");
    off_t pos2 = 0;
    in = td_mirror_in_new(run, prefixes, 2, NULL);
    td_mirror_out_reset(out, sfd2);
    give_manifest(in, out);
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    ASSERT_EQ(sent, 7 + 5);
    deliver(sfd2, &pos2, in);
    assert_content(copy1, "--- requeue 1 ---\n--- requeue 2 ---\nstep 7\nstep 8\n");
    assert_content(copy2, "two\nmore\n");
    int64_t appended, duplicate;
    td_mirror_in_counts(in, &appended, &duplicate);
    ASSERT_EQ(appended, 12);
    ASSERT_EQ(duplicate, 0);
    td_mirror_in_free(in);
    td_mirror_out_free(out);
    close(sfd);
    close(sfd2);
    free(local1);
    free(local2);
    free(copy1);
    free(copy2);
    free(run_logs);
    free(logs);
    free(run);
    free(base);
}

/* A link cut mid-frame, then a new connection (a new receiver on the same root, the sender
 * reset to the new fd): nothing lost, nothing doubled. */
static void test_reset_new_link(void) {
    char *base = td_xasprintf("%s/reset", dir);
    char *logs = td_xasprintf("%s/agent/logs", base), *run = td_xasprintf("%s/run", base);
    ASSERT_OK(td_mkdirs(logs));
    char *local = td_xasprintf("%s/rank-0.log", logs);
    char *copy = td_xasprintf("%s/logs/rank-0.log", run);
    append(local, "first line\n");

    int sfd1 = open_stream(base, "s1");
    off_t pos1 = 0;
    td_mirror_in *in = td_mirror_in_new(run, prefixes, 2, NULL);
    td_mirror_out *out = td_mirror_out_new(sfd1);
    td_mirror_out_watch(out, "logs", logs);
    give_manifest(in, out);
    ASSERT_OK(td_mirror_out_poll(out, NULL));
    deliver(sfd1, &pos1, in);
    append(local, "a line the link cuts in half\n");
    ASSERT_OK(td_mirror_out_poll(out, NULL));
    size_t n;
    char *bytes = take_stream(sfd1, &pos1, &n);
    ASSERT_OK(feed_pieces(in, bytes, n - 10));
    free(bytes);
    td_mirror_in_free(in); /* the connection is gone */

    /* a new link before its manifest: everything from the start, to the new fd */
    append(local, "while it was down\n");
    int sfd2 = open_stream(base, "s2");
    off_t pos2 = 0;
    td_mirror_out_reset(out, sfd2);
    int64_t sent = 0;
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    struct stat sb;
    ASSERT(stat(local, &sb) == 0);
    ASSERT_EQ(sent, sb.st_size);
    in = td_mirror_in_new(run, prefixes, 2, NULL);
    deliver(sfd2, &pos2, in);
    assert_same(local, copy);
    ASSERT_EQ(lseek(sfd1, 0, SEEK_END), pos1); /* nothing went to the old link */
    td_mirror_in_free(in);

    /* and cut again: with this link's manifest only the missing tail comes */
    append(local, "cut again\n");
    ASSERT_OK(td_mirror_out_poll(out, NULL));
    bytes = take_stream(sfd2, &pos2, &n);
    in = td_mirror_in_new(run, prefixes, 2, NULL);
    ASSERT_OK(feed_pieces(in, bytes, n - 4));
    free(bytes);
    td_mirror_in_free(in);
    append(local, "last\n");
    int sfd3 = open_stream(base, "s3");
    off_t pos3 = 0;
    in = td_mirror_in_new(run, prefixes, 2, NULL);
    struct stat cb;
    ASSERT(stat(copy, &cb) == 0);
    td_mirror_out_reset(out, sfd3);
    give_manifest(in, out);
    ASSERT_OK(td_mirror_out_end(out));
    deliver(sfd3, &pos3, in);
    ASSERT(td_mirror_in_ended(in));
    assert_same(local, copy);
    int64_t appended, duplicate;
    td_mirror_in_counts(in, &appended, &duplicate);
    ASSERT(stat(local, &sb) == 0);
    ASSERT_EQ(appended, sb.st_size - cb.st_size);
    ASSERT_EQ(duplicate, 0);

    td_mirror_in_free(in);
    td_mirror_out_free(out);
    close(sfd1);
    close(sfd2);
    close(sfd3);
    free(local);
    free(copy);
    free(logs);
    free(run);
    free(base);
}

/* Files a receiver would refuse are not sent: one would end the stream. */
static void test_sender_skips_refused_names(void) {
    char *base = td_xasprintf("%s/skip", dir);
    char *logs = td_xasprintf("%s/agent/logs", base), *odd = td_xasprintf("%s/agent/odd", base);
    char *run = td_xasprintf("%s/run", base);
    ASSERT_OK(td_mkdirs(logs));
    ASSERT_OK(td_mkdirs(odd));
    static const char *const names[] = {".rank-0.log.tmp", "rank 1.log", "rank-2.log~",
                                        "rank-3.log", "r\xc3\xa9sum\xc3\xa9.log"};
    for (size_t i = 0; i < TD_ARRAY_LEN(names); i++) {
        char *p = td_xasprintf("%s/%s", logs, names[i]);
        append(p, "x\n");
        free(p);
    }
    char *p = td_xasprintf("%s/rank-0.log", odd);
    append(p, "x\n");
    free(p);
    int sfd = open_stream(base, "stream");
    off_t pos = 0;
    td_mirror_out *out = td_mirror_out_new(sfd);
    td_mirror_out_watch(out, "logs", logs);
    td_mirror_out_watch(out, "a/b", odd); /* a prefix no receiver accepts */
    int64_t sent = 0;
    ASSERT_OK(td_mirror_out_poll(out, &sent));
    ASSERT_EQ(sent, 2);
    size_t n;
    char *bytes = take_stream(sfd, &pos, &n);
    bytes[n] = '\0'; /* take_stream leaves room for it */
    ASSERT_STREQ(bytes, "tdm data logs/rank-3.log 0 2\nx\n");
    td_mirror_in *in = td_mirror_in_new(run, prefixes, 2, NULL);
    ASSERT_OK(td_mirror_in_feed(in, bytes, n));
    free(bytes);
    td_mirror_in_free(in);
    td_mirror_out_free(out);
    close(sfd);
    free(logs);
    free(odd);
    free(run);
    free(base);
}

/* ---- whole files ---- */

typedef struct {
    char name[256];
    int64_t size;
    int calls;
} files_seen;

static void on_file(void *user, const char *name, int64_t size) {
    files_seen *f = user;
    snprintf(f->name, sizeof f->name, "%s", name);
    f->size = size;
    f->calls++;
}

static const char *const file_prefixes[] = {"logs", "metrics", "work"};

/* Names in a directory other than . and .. (a temporary left behind shows). */
static int count_entries(const char *path) {
    DIR *d = opendir(path);
    ASSERT(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void write_file(const char *path, const char *bytes, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT(fd >= 0);
    ASSERT_EQ(write(fd, bytes, n), (ssize_t)n);
    close(fd);
}

static void test_whole_files(void) {
    char *base = td_xasprintf("%s/files", dir);
    char *src = td_xasprintf("%s/src", base), *run = td_xasprintf("%s/run", base);
    char *outside = td_xasprintf("%s/outside", base);
    ASSERT_OK(td_mkdirs(src));
    ASSERT_OK(td_mkdirs(outside));
    files_seen seen_files = {0};
    td_mirror_callbacks cb = {.file = on_file, .user = &seen_files};

    /* a nested name, bigger than a chunk, in awkward pieces */
    size_t big = 300000;
    char *content = td_xmalloc(big);
    for (size_t i = 0; i < big; i++) content[i] = (char)(i * 31 + i / 977);
    char *model = td_xasprintf("%s/model.bin", src);
    write_file(model, content, big);
    int sfd = open_stream(base, "stream");
    off_t pos = 0;
    td_mirror_out *out = td_mirror_out_new(sfd);
    ASSERT_OK(td_mirror_out_file(out, "work/ckpt/step-1/model+v2.bin", model));
    size_t n;
    char *bytes = take_stream(sfd, &pos, &n);
    const char *header = "tdm file work/ckpt/step-1/model+v2.bin 300000\n";
    ASSERT_EQ(n, strlen(header) + big);
    ASSERT(!memcmp(bytes, header, strlen(header)));
    td_mirror_in *in = td_mirror_in_new(run, file_prefixes, 3, &cb);
    ASSERT_OK(feed_pieces(in, bytes, n));
    free(bytes);
    char *copy = td_xasprintf("%s/work/ckpt/step-1/model+v2.bin", run);
    assert_same(model, copy);
    ASSERT_STREQ(seen_files.name, "work/ckpt/step-1/model+v2.bin");
    ASSERT_EQ(seen_files.size, (int64_t)big);
    ASSERT_EQ(seen_files.calls, 1);

    /* sent again, shorter: replaced whole, no temporary left beside it */
    write_file(model, "v3\n", 3);
    ASSERT_OK(td_mirror_out_file(out, "work/ckpt/step-1/model+v2.bin", model));
    deliver(sfd, &pos, in);
    assert_content(copy, "v3\n");
    char *copy_dir = td_xasprintf("%s/work/ckpt/step-1", run);
    ASSERT_EQ(count_entries(copy_dir), 1);
    ASSERT_EQ(seen_files.calls, 2);

    /* an empty file is a file */
    char *empty = td_xasprintf("%s/empty", src);
    write_file(empty, "", 0);
    ASSERT_OK(td_mirror_out_file(out, "work/empty.txt", empty));
    deliver(sfd, &pos, in);
    char *empty_copy = td_xasprintf("%s/work/empty.txt", run);
    assert_content(empty_copy, "");
    td_mirror_in_free(in);

    /* the sender: no link followed, only regular files, odd names skipped (not sent) */
    char *link = td_xasprintf("%s/link.bin", src);
    ASSERT(symlink(model, link) == 0);
    ASSERT_STATUS(td_mirror_out_file(out, "work/link.bin", link), TD_ERR_IO);
    ASSERT_STATUS(td_mirror_out_file(out, "work/dir", src), TD_ERR_IO);
    ASSERT_OK(td_mirror_out_file(out, "work/.hidden/x", model));
    ASSERT_OK(td_mirror_out_file(out, "work/../x", model));
    ASSERT_EQ(lseek(sfd, 0, SEEK_END), pos); /* nothing was written for any of them */
    free(link);

    /* names the receiver refuses, and sizes it does not parse */
    static const char *const bad[] = {
        "tdm file ../x.bin 1\nx",
        "tdm file work/../x.bin 1\nx",
        "tdm file work/a/../../x.bin 1\nx",
        "tdm file work/.hidden 1\nx",
        "tdm file work/a/.b/c 1\nx",
        "tdm file work//x.bin 1\nx",
        "tdm file work/x.bin/ 1\nx",
        "tdm file /tmp/tandem-mirror-x.bin 1\nx",
        "tdm file work/ 1\nx",
        "tdm file work 1\nx",
        "tdm file other/x.bin 1\nx",
        "tdm file work/a b.bin 1\nx",
        "tdm file work/a\\b.bin 1\nx",
        "tdm file work/x.bin -1\nx",
        "tdm file work/x.bin +1\nx",
        "tdm file work/x.bin 1x\nx",
        "tdm file work/x.bin 01\nx",
        "tdm file work/x.bin \nx",
        "tdm file work/x.bin\nx",
        "tdm file work/x.bin 68719476737\nx",
        "tdm file work/x.bin 99999999999999999999\nx",
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        in = td_mirror_in_new(run, file_prefixes, 3, NULL);
        td_status st = td_mirror_in_feed(in, bad[i], strlen(bad[i]));
        if (st != TD_ERR_FORMAT) TEST_FAIL("'%s' gave %s", bad[i], td_status_name(st));
        td_mirror_in_free(in);
    }
    char *escaped = td_xasprintf("%s/x.bin", base);
    ASSERT(access(escaped, F_OK) != 0);
    ASSERT(access("/tmp/tandem-mirror-x.bin", F_OK) != 0);
    free(escaped);
    char *work = td_xasprintf("%s/work", run);
    ASSERT_EQ(count_entries(work), 2); /* ckpt, empty.txt */

    /* a symlink planted as a directory under the root is not followed */
    char *evil = td_xasprintf("%s/work/evil", run);
    ASSERT(symlink(outside, evil) == 0);
    in = td_mirror_in_new(run, file_prefixes, 3, NULL);
    const char *frame = "tdm file work/evil/x.bin 4\nevil";
    ASSERT(td_mirror_in_feed(in, frame, strlen(frame)) != TD_OK);
    td_mirror_in_free(in);
    ASSERT_EQ(count_entries(outside), 0);
    /* nor a prefix directory that is a link */
    char *run2 = td_xasprintf("%s/run2", base), *work2 = td_xasprintf("%s/run2/work", base);
    ASSERT_OK(td_mkdirs(run2));
    ASSERT(symlink(outside, work2) == 0);
    in = td_mirror_in_new(run2, file_prefixes, 3, NULL);
    frame = "tdm file work/x.bin 4\nevil";
    ASSERT(td_mirror_in_feed(in, frame, strlen(frame)) != TD_OK);
    td_mirror_in_free(in);
    ASSERT_EQ(count_entries(outside), 0);
    /* a link at the final name is replaced, its target untouched */
    char *target = td_xasprintf("%s/target", outside);
    write_file(target, "safe", 4);
    char *final_link = td_xasprintf("%s/work/final.bin", run);
    ASSERT(symlink(target, final_link) == 0);
    in = td_mirror_in_new(run, file_prefixes, 3, NULL);
    frame = "tdm file work/final.bin 4\nnew!";
    ASSERT_OK(td_mirror_in_feed(in, frame, strlen(frame)));
    td_mirror_in_free(in);
    assert_content(target, "safe");
    struct stat sb;
    ASSERT(lstat(final_link, &sb) == 0 && S_ISREG(sb.st_mode));
    assert_content(final_link, "new!");

    /* a frame cut short, then a new link: no partial file at the final name, the earlier copy
     * intact, no temporary left */
    in = td_mirror_in_new(run, file_prefixes, 3, &cb);
    frame = "tdm file work/ckpt/part.bin 100\n0123456789012345678901234567890123456789";
    ASSERT_OK(td_mirror_in_feed(in, frame, strlen(frame)));
    frame = "tdm file work/ckpt/step-1/model+v2.bin 100\n0123456789";
    td_mirror_in_reset(in);
    char *part = td_xasprintf("%s/work/ckpt/part.bin", run);
    ASSERT(access(part, F_OK) != 0);
    char *ckpt = td_xasprintf("%s/work/ckpt", run);
    ASSERT_EQ(count_entries(ckpt), 1); /* step-1 */
    ASSERT_OK(td_mirror_in_feed(in, frame, strlen(frame)));
    td_mirror_in_reset(in);
    assert_content(copy, "v3\n");
    ASSERT_EQ(count_entries(copy_dir), 1);
    /* the stream goes on cleanly after the reset */
    frame = "tdm file work/ckpt/part.bin 2\nok";
    ASSERT_OK(td_mirror_in_feed(in, frame, strlen(frame)));
    assert_content(part, "ok");
    /* and a receiver freed in the middle of a file leaves nothing either */
    frame = "tdm file work/ckpt/gone.bin 10\n01234";
    ASSERT_OK(td_mirror_in_feed(in, frame, strlen(frame)));
    td_mirror_in_free(in);
    ASSERT_EQ(count_entries(ckpt), 2); /* step-1, part.bin */

    td_mirror_out_free(out);
    close(sfd);
    free(content);
    free(model);
    free(copy);
    free(copy_dir);
    free(empty);
    free(empty_copy);
    free(work);
    free(evil);
    free(run2);
    free(work2);
    free(target);
    free(final_link);
    free(part);
    free(ckpt);
    free(outside);
    free(src);
    free(run);
    free(base);
}

int main(void) {
    ASSERT(mkdtemp(dir));
    src_logs = td_xasprintf("%s/agent/logs", dir);
    src_metrics = td_xasprintf("%s/agent/metrics", dir);
    dst = td_xasprintf("%s/run", dir);
    ASSERT_OK(td_mkdirs(src_logs));
    ASSERT_OK(td_mkdirs(src_metrics));
    test_copy_restart_and_duplicates();
    test_names_refused();
    test_broken_link();
    test_auth_ok();
    test_auth_wire_and_leftover();
    test_auth_wrong_token();
    test_auth_garbage_silence_close();
    test_fresh_spool_continues();
    test_declared_fresh_spool();
    test_reset_new_link();
    test_sender_skips_refused_names();
    test_whole_files();
    char *cmd = td_xasprintf("rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    free(cmd);
    free(src_logs);
    free(src_metrics);
    free(dst);
    printf("test_mirror: ok\n");
    return 0;
}
