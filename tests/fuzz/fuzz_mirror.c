/* The mirror receiver (src/mirror/mirror.c, include/tandem/mirror.h): the supervisor appends
 * what a node agent's link sends into the run directory, and the link is outside input (a TCP
 * connection anyone on the network can make, or a remote host's stdout). Byte 0 of an input
 * picks how the rest, the stream, is cut into pieces; the rest goes to two receivers, one fed
 * the whole stream in one call and one fed it in those pieces, each over a root of its own.
 *
 * Each root starts as a receiver's would after an attacker had planted links in it:
 *   ROOT/linked -> ../outside          a prefix's directory that is a link
 *   ROOT/logs/escape -> ../../outside  a directory below a prefix that is a link
 *   ROOT/metrics/rank-9.jsonl -> ../../outside/sentinel   a copy that is a link
 * with the prefixes "logs", "metrics" and "linked". After the input (and the receivers freed):
 *   - nothing was written outside the roots: outside/ holds its one sentinel file, unchanged,
 *     and the scratch directory nothing else but the two roots and outside/;
 *   - every file in a root is a regular file under a real prefix directory, each component of
 *     its name of the receiver's character set and none starting with '.' (no '..', no
 *     absolute name, no temporary of an unfinished whole-file frame left behind); a link is
 *     one of the planted ones, pointing where it did (a whole file may have replaced one);
 *   - every name the receiver reported (data and file callbacks) is PREFIX/... without '..';
 *   - bounded output: the bytes in a root are at most the stream's bytes, and the appended
 *     and duplicate counts add up to at most the payload fed;
 *   - bounded memory: under ASan (the libFuzzer build), what the receiver holds after each
 *     piece is at most 64 KiB plus 16 bytes per stream byte fed so far, so nothing announced
 *     by a header is buffered;
 *   - pieces do not matter: both roots end up the same (names, types, bytes). */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/mirror.h"

#define SENTINEL "the supervisor's own file: no stream may change it\n"

/* ASan's count of the bytes malloc'd and not freed; absent without ASan (the replay build). */
size_t __sanitizer_get_current_allocated_bytes(void) __attribute__((weak));

static const char *const prefixes[] = {"logs", "metrics", "linked"};

static char *path_of(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    FUZZ_ASSERT(p, "%s", "malloc");
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag;
    if (ftw->level > 0) remove(path);
    return 0;
}

/* Empties the scratch directory (links are removed, never followed). */
static void clear_dir(const char *dir) {
    nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void must(int ok, const char *what, const char *path) {
    FUZZ_ASSERT(ok, "%s %s: %s", what, path, strerror(errno));
}

static void plant_root(const char *root) {
    char buf[512];
    must(mkdir(root, 0755) == 0, "mkdir", root);
    snprintf(buf, sizeof buf, "%s/logs", root);
    must(mkdir(buf, 0755) == 0, "mkdir", buf);
    snprintf(buf, sizeof buf, "%s/metrics", root);
    must(mkdir(buf, 0755) == 0, "mkdir", buf);
    snprintf(buf, sizeof buf, "%s/linked", root);
    must(symlink("../outside", buf) == 0, "symlink", buf);
    snprintf(buf, sizeof buf, "%s/logs/escape", root);
    must(symlink("../../outside", buf) == 0, "symlink", buf);
    snprintf(buf, sizeof buf, "%s/metrics/rank-9.jsonl", root);
    must(symlink("../../outside/sentinel", buf) == 0, "symlink", buf);
}

static void setup(const char *top) {
    clear_dir(top);
    char *outside = path_of(top, "outside"), *sentinel = path_of(outside, "sentinel");
    must(mkdir(outside, 0755) == 0, "mkdir", outside);
    FILE *f = fopen(sentinel, "w");
    must(f != NULL, "fopen", sentinel);
    fputs(SENTINEL, f);
    fclose(f);
    char *a = path_of(top, "a"), *b = path_of(top, "b");
    plant_root(a);
    plant_root(b);
    free(a), free(b), free(outside), free(sentinel);
}

/* ---- what a root holds ---- */

typedef struct {
    char *text; /* "TYPE NAME SIZE\n" per entry, then each file's bytes, in readdir order sorted */
    size_t len, cap;
    size_t file_bytes;
} listing;

static void add(listing *l, const void *p, size_t n) {
    if (l->len + n > l->cap) {
        while (l->len + n > l->cap) l->cap = l->cap ? 2 * l->cap : 4096;
        l->text = realloc(l->text, l->cap);
        FUZZ_ASSERT(l->text, "%s", "realloc");
    }
    memcpy(l->text + l->len, p, n);
    l->len += n;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool component_ok(const char *s) {
    if (!s[0] || s[0] == '.') return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-' || *s == '+' || *s == '='))
            return false;
    return true;
}

static void expect_link(const char *path, const char *target) {
    char buf[256];
    ssize_t n = readlink(path, buf, sizeof buf - 1);
    FUZZ_ASSERT(n > 0, "the planted link %s is gone (%s)", path, strerror(errno));
    buf[n] = '\0';
    FUZZ_ASSERT(!strcmp(buf, target), "the planted link %s now points to %s", path, buf);
}

/* Lists dir (rel: its name under the root, "" for the root) into l, checking each entry. */
static void walk(const char *root, const char *rel, listing *l) {
    char *dir = rel[0] ? path_of(root, rel) : strdup(root);
    DIR *d = opendir(dir);
    must(d != NULL, "opendir", dir);
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        names = realloc(names, (n + 1) * sizeof *names);
        FUZZ_ASSERT(names && (names[n] = strdup(e->d_name)), "%s", "malloc");
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, name_cmp); /* names is NULL when n is 0 */
    for (size_t i = 0; i < n; i++) {
        char *r = rel[0] ? path_of(rel, names[i]) : strdup(names[i]);
        char *p = path_of(root, r);
        struct stat sb;
        must(lstat(p, &sb) == 0, "lstat", p);
        char head[600];
        if (S_ISLNK(sb.st_mode)) {
            /* only the planted ones, as planted (a whole file may replace one: a rename, which
             * writes nothing through it) */
            if (!strcmp(r, "linked"))
                expect_link(p, "../outside");
            else if (!strcmp(r, "logs/escape"))
                expect_link(p, "../../outside");
            else if (!strcmp(r, "metrics/rank-9.jsonl"))
                expect_link(p, "../../outside/sentinel");
            else
                FUZZ_ASSERT(0, "a link the stream made: %s", p);
            snprintf(head, sizeof head, "L %s\n", r);
            add(l, head, strlen(head));
        } else if (S_ISDIR(sb.st_mode)) {
            FUZZ_ASSERT(rel[0] || !strcmp(r, "logs") || !strcmp(r, "metrics"),
                        "a directory outside the prefixes: %s", p);
            FUZZ_ASSERT(component_ok(names[i]), "a directory named '%s'", r);
            snprintf(head, sizeof head, "D %s\n", r);
            add(l, head, strlen(head));
            walk(root, r, l);
        } else {
            FUZZ_ASSERT(S_ISREG(sb.st_mode), "not a regular file: %s", p);
            FUZZ_ASSERT(rel[0], "a file directly in the root: %s", p);
            FUZZ_ASSERT(component_ok(names[i]), "a file named '%s' (a temporary left behind?)", r);
            snprintf(head, sizeof head, "F %s %lld\n", r, (long long)sb.st_size);
            add(l, head, strlen(head));
            int fd = open(p, O_RDONLY);
            must(fd >= 0, "open", p);
            char buf[4096];
            for (ssize_t k; (k = read(fd, buf, sizeof buf)) > 0;) add(l, buf, (size_t)k);
            close(fd);
            l->file_bytes += (size_t)sb.st_size;
        }
        free(p);
        free(r);
        free(names[i]);
    }
    free(names);
    free(dir);
}

/* Nothing but the roots and outside/ in the scratch directory; outside/ as it was. */
static void check_outside(const char *top) {
    DIR *d = opendir(top);
    must(d != NULL, "opendir", top);
    for (struct dirent *e; (e = readdir(d));)
        FUZZ_ASSERT(!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
                        !strcmp(e->d_name, "a") || !strcmp(e->d_name, "b") ||
                        !strcmp(e->d_name, "outside"),
                    "%s/%s was written, outside the receivers' roots", top, e->d_name);
    closedir(d);
    char *outside = path_of(top, "outside"), *sentinel = path_of(outside, "sentinel");
    d = opendir(outside);
    must(d != NULL, "opendir", outside);
    for (struct dirent *e; (e = readdir(d));)
        FUZZ_ASSERT(!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
                        !strcmp(e->d_name, "sentinel"),
                    "%s/%s was written, outside the receivers' roots", outside, e->d_name);
    closedir(d);
    char buf[256] = "";
    int fd = open(sentinel, O_RDONLY | O_NOFOLLOW);
    must(fd >= 0, "open", sentinel);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    FUZZ_ASSERT(n == (ssize_t)strlen(SENTINEL) && !memcmp(buf, SENTINEL, (size_t)n),
                "%s changed: %zd bytes '%.100s'", sentinel, n, n > 0 ? buf : "");
    free(sentinel);
    free(outside);
}

/* ---- the receivers ---- */

static void check_name(const char *name) {
    bool prefixed = false;
    for (size_t i = 0; i < TD_ARRAY_LEN(prefixes); i++) {
        size_t n = strlen(prefixes[i]);
        if (!strncmp(name, prefixes[i], n) && name[n] == '/') prefixed = true;
    }
    bool dots = false; /* a component "", "." or ".." ("a..b" is a name like any other) */
    for (const char *p = name;; p++) {
        const char *end = strchrnul(p, '/');
        size_t n = (size_t)(end - p);
        if (n == 0 || (n <= 2 && !strncmp(p, "..", n))) dots = true;
        if (!*end) break;
        p = end;
    }
    FUZZ_ASSERT(prefixed && !dots, "the receiver reported '%s', not PREFIX/... without '..'", name);
}

static void on_data(void *user, const char *name, const char *bytes, size_t n) {
    (void)bytes;
    check_name(name);
    *(size_t *)user += n;
}

static void on_file(void *user, const char *name, int64_t size) {
    (void)user;
    FUZZ_ASSERT(size >= 0, "a whole file '%s' of %lld bytes", name, (long long)size);
    check_name(name);
}

static size_t allocated(void) {
    return __sanitizer_get_current_allocated_bytes ? __sanitizer_get_current_allocated_bytes() : 0;
}

/* Feeds stream[0..n) in pieces cut by seed (0: whole), stopping at the first error, as a
 * supervisor does. */
static void feed(const char *root, const uint8_t *stream, size_t n, unsigned seed) {
    size_t data_bytes = 0, fed = 0, base = allocated();
    td_mirror_callbacks cb = {.data = on_data, .file = on_file, .user = &data_bytes};
    td_mirror_in *in = td_mirror_in_new(root, prefixes, TD_ARRAY_LEN(prefixes), &cb);
    FUZZ_ASSERT(in, "td_mirror_in_new(%s): %s", root, td_error_msg());
    uint32_t r = seed * 2654435761u + 1;
    while (fed < n) {
        size_t piece = n - fed;
        if (seed) {
            r = r * 1103515245u + 12345u;
            piece = 1 + (r >> 16) % (seed % 97 + 1);
            if (piece > n - fed) piece = n - fed;
        }
        td_status st = td_mirror_in_feed(in, stream + fed, piece);
        fed += piece;
        if (base) {
            long long held = (long long)allocated() - (long long)base;
            FUZZ_ASSERT(held <= 65536 + 16 * (long long)fed,
                        "the receiver holds %lld bytes after %zu fed", held, fed);
        }
        if (st != TD_OK) break;
    }
    int64_t appended, duplicate;
    td_mirror_in_counts(in, &appended, &duplicate);
    FUZZ_ASSERT(appended >= 0 && duplicate >= 0 && (size_t)(appended + duplicate) <= fed,
                "appended %lld and duplicate %lld of %zu bytes fed", (long long)appended,
                (long long)duplicate, fed);
    FUZZ_ASSERT((int64_t)data_bytes == appended, "the data callback saw %zu bytes, appended %lld",
                data_bytes, (long long)appended);
    td_mirror_in_free(in);
    td_error_clear();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_init();
    if (size == 0) return 0;
    const char *top = fuzz_dir();
    setup(top);
    char *a = path_of(top, "a"), *b = path_of(top, "b");
    const uint8_t *stream = data + 1;
    size_t n = size - 1;
    feed(a, stream, n, 0);
    feed(b, stream, n, data[0] ? data[0] : 1);
    check_outside(top);
    listing la = {0}, lb = {0};
    walk(a, "", &la);
    walk(b, "", &lb);
    FUZZ_ASSERT(la.file_bytes <= n, "the root holds %zu bytes from a %zu-byte stream",
                la.file_bytes, n);
    /* An error stops both at the same byte of the stream, however it was cut. */
    FUZZ_ASSERT(la.len == lb.len && !memcmp(la.text, lb.text, la.len),
                "the stream fed whole and in pieces (seed %u) left different copies:\n%.*s\n--- "
                "vs ---\n%.*s",
                data[0], (int)(la.len < 400 ? la.len : 400), la.text,
                (int)(lb.len < 400 ? lb.len : 400), lb.text);
    free(la.text);
    free(lb.text);
    free(a);
    free(b);
    return 0;
}
