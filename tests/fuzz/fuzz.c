/* fuzz.h's helpers, shared by the fuzz targets: an in-memory file, a scratch directory, quiet logs.
 */
#include "fuzz.h"

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s:%d: fuzz check failed: %s: ", file, line, cond);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void fuzz_init(void) {
    static int done;
    if (done) return;
    done = 1;
    /* Warnings such as "store: dropping connection" or "malformed metrics line" are the parsers
     * doing their job; millions of them would bury libFuzzer's own lines. */
    setenv("TANDEM_LOG_LEVEL", "error", 0);
}

const char *fuzz_file(const void *data, size_t size) {
    static int fd = -1;
    static char path[32];
    if (fd < 0) {
        fd = memfd_create("tandem-fuzz", MFD_CLOEXEC);
        if (fd < 0) fuzz_fail(__FILE__, __LINE__, "memfd_create", "%s", strerror(errno));
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) fuzz_fail(__FILE__, __LINE__, "ftruncate", "%s", strerror(errno));
    const char *p = data;
    size_t off = 0;
    while (off < size) {
        ssize_t n = pwrite(fd, p + off, size - off, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fuzz_fail(__FILE__, __LINE__, "pwrite", "%s", strerror(errno));
        off += (size_t)n;
    }
    return path;
}

static char dir_path[256];

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void remove_dir(void) {
    if (dir_path[0]) nftw(dir_path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fuzz_dir(void) {
    if (dir_path[0]) return dir_path;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    snprintf(dir_path, sizeof dir_path, "%s/tandem-fuzz-XXXXXX", base);
    if (!mkdtemp(dir_path)) fuzz_fail(__FILE__, __LINE__, "mkdtemp", "%s", strerror(errno));
    atexit(remove_dir);
    return dir_path;
}
