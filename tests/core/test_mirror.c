/* core's mirror (tandem/mirror.h): append-only files over a byte stream that breaks, each byte
 * once, and nothing written outside the receiver's directories. */
#include "test.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
    char *cmd = td_xasprintf("rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    free(cmd);
    free(src_logs);
    free(src_metrics);
    free(dst);
    printf("test_mirror: ok\n");
    return 0;
}
