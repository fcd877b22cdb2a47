/* Append-only files over one byte stream, each byte once (include/tandem/mirror.h). The link's
 * handshake is auth.c. */
#include "tandem/mirror.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/os.h"

/* A frame header line is short; a longer one is garbage, not a reason to buffer without end. */
#define HEADER_MAX 1024
/* A whole file larger than this is a corrupt header, not an artifact (a checkpoint is far less). */
#define FILE_MAX ((int64_t)64 << 30)
/* Components of a file frame's NAME at most (PREFIX/a/b/c.ext). */
#define FILE_DEPTH_MAX 32

/* FILE of PREFIX/FILE: what a rank log or metric stream is called, nothing a path could hide in. */
static int file_name_ok(const char *s, size_t n) {
    if (n == 0 || n > 200 || s[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* A component of a file frame's NAME: FILE's set, '+' and '=' (Lightning's ModelCheckpoint
 * names its files "epoch=E-step=S.ckpt"), never "..", nor hidden. */
static int component_ok(const char *s, size_t n) {
    if (n == 0 || n > 200 || s[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == '+' || c == '='))
            return 0;
    }
    return 1;
}

/* PREFIX/a/b/FILE: at least two components, each component_ok (the prefix is checked apart). */
static int path_name_ok(const char *name) {
    size_t len = strlen(name), depth = 0;
    if (len == 0 || len > 500) return 0;
    for (const char *p = name;;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (!component_ok(p, n) || ++depth > FILE_DEPTH_MAX) return 0;
        if (!slash) break;
        p = slash + 1;
    }
    return depth >= 2;
}

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* ---------------------------------------------------------------- sender ---- */

typedef struct {
    char *name;   /* prefix/FILE */
    int64_t sent; /* bytes of the local file the receiver has (sent, or had already) */
    int64_t base; /* the receiver's offset of local byte 0: 0, or where a new spool continues */
    /* The base this agent chose for the file on an earlier link: a reset forgets base (the next
     * receiver may have nothing), and the next "have" line brings it back when it fits. */
    int64_t origin;
    bool announced; /* sent at least once: an empty file exists on the other side too */
    /* A "have" line came before its prefix was watched: decided at the first poll. */
    bool pending;
    bool decided; /* a "have" line set its base once already (td_mirror_out_fresh_spool) */
    int64_t have;
} out_file;

typedef struct {
    char *prefix, *dir;
} out_dir;

struct td_mirror_out {
    int fd;
    bool fresh; /* td_mirror_out_fresh_spool */
    out_dir *dirs;
    size_t ndirs;
    out_file *files;
    size_t nfiles;
    char *buf; /* TD_MIRROR_CHUNK */
};

td_mirror_out *td_mirror_out_new(int fd) {
    td_mirror_out *m = td_xcalloc(1, sizeof *m);
    m->fd = fd;
    m->buf = td_xmalloc(TD_MIRROR_CHUNK);
    return m;
}

void td_mirror_out_free(td_mirror_out *m) {
    if (!m) return;
    for (size_t i = 0; i < m->ndirs; i++) {
        free(m->dirs[i].prefix);
        free(m->dirs[i].dir);
    }
    for (size_t i = 0; i < m->nfiles; i++) free(m->files[i].name);
    free(m->dirs);
    free(m->files);
    free(m->buf);
    free(m);
}

void td_mirror_out_watch(td_mirror_out *m, const char *prefix, const char *dir) {
    m->dirs = td_xrealloc(m->dirs, (m->ndirs + 1) * sizeof *m->dirs);
    m->dirs[m->ndirs++] = (out_dir){td_xstrdup(prefix), td_xstrdup(dir)};
}

static out_file *out_find(td_mirror_out *m, const char *name, int create) {
    for (size_t i = 0; i < m->nfiles; i++)
        if (!strcmp(m->files[i].name, name)) return &m->files[i];
    if (!create || m->nfiles >= TD_MIRROR_MAX_FILES) return NULL;
    m->files = td_xrealloc(m->files, (m->nfiles + 1) * sizeof *m->files);
    m->files[m->nfiles] = (out_file){.name = td_xstrdup(name)};
    return &m->files[m->nfiles++];
}

/* Where sending starts, given that the receiver has size bytes and the local file local bytes
 * (-1: none). */
static void out_resume(const td_mirror_out *m, out_file *f, int64_t size, int64_t local) {
    f->pending = false;
    f->announced = true; /* the receiver has it */
    bool first = !f->decided;
    f->decided = true;
    if (m->fresh && first) {
        f->base = f->origin = size; /* the sender said: all of this file is new */
        f->sent = 0;
    } else if (f->origin > 0 && size >= f->origin && size - f->origin <= TD_MAX(local, 0)) {
        /* This agent continued the copy on an earlier link; the copy has size - origin of it. */
        f->base = f->origin;
        f->sent = size - f->origin;
    } else if (local >= size) {
        f->base = f->origin = 0; /* the copy came from this file */
        f->sent = size;
    } else {
        f->base = f->origin = size; /* a new spool: its bytes follow the copy's */
        f->sent = 0;
    }
}

/* The local path of a watched file's name, or NULL when its prefix is not watched. */
static char *out_path(const td_mirror_out *m, const char *name) {
    const char *slash = strchr(name, '/');
    if (!slash) return NULL;
    for (size_t d = 0; d < m->ndirs; d++) {
        size_t plen = strlen(m->dirs[d].prefix);
        if (plen == (size_t)(slash - name) && !strncmp(m->dirs[d].prefix, name, plen))
            return td_xasprintf("%s/%s", m->dirs[d].dir, slash + 1);
    }
    return NULL;
}

td_status td_mirror_out_have(td_mirror_out *m, const char *line) {
    char name[512];
    int64_t size;
    int used = 0;
    if (sscanf(line, "have %511s %" SCNd64 "%n", name, &size, &used) != 2 || size < 0 ||
        (line[used] && line[used] != '\n'))
        return td_error(TD_ERR_FORMAT, "mirror: '%.80s' is not a manifest line (have NAME SIZE)",
                        line);
    out_file *f = out_find(m, name, 1);
    if (!f) return td_error(TD_ERR_FORMAT, "mirror: more than %d files", TD_MIRROR_MAX_FILES);
    char *path = out_path(m, name);
    if (!path) {
        f->pending = true;
        f->have = size;
        f->announced = true;
        return TD_OK;
    }
    struct stat sb;
    out_resume(m, f, size, stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? sb.st_size : -1);
    free(path);
    return TD_OK;
}

void td_mirror_out_fresh_spool(td_mirror_out *m) {
    m->fresh = true;
}

void td_mirror_out_reset(td_mirror_out *m, int fd) {
    m->fd = fd;
    for (size_t i = 0; i < m->nfiles; i++) {
        out_file *f = &m->files[i];
        f->sent = f->base = 0;
        f->announced = f->pending = false;
        f->have = 0;
    }
}

static td_status send_header(td_mirror_out *m, const char *fmt, ...) TD_PRINTF(2, 3);
static td_status send_header(td_mirror_out *m, const char *fmt, ...) {
    char line[HEADER_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof line)
        return td_error(TD_ERR_INVALID, "mirror: a frame header over %d bytes", HEADER_MAX);
    if (write_all(m->fd, line, (size_t)n) != 0)
        return td_error_errno(TD_ERR_IO, "mirror: writing to the link");
    return TD_OK;
}

/* Sends what path gained beyond f->sent. */
static td_status send_file(td_mirror_out *m, out_file *f, const char *path, int64_t *sent) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return TD_OK; /* deleted between readdir and open */
        return td_error_errno(TD_ERR_IO, "mirror: opening %s", path);
    }
    td_status st = TD_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = td_error_errno(TD_ERR_IO, "mirror: stat %s", path);
        goto out;
    }
    if (f->pending) out_resume(m, f, f->have, sb.st_size);
    if (sb.st_size < f->sent) {
        /* The receiver holds more than this file: not the file its copy came from (the agent's
         * directory was replaced). Appending our bytes there would corrupt the copy. */
        TD_LOG_WARN("mirror: %s has %lld bytes, the supervisor's copy %lld: not sending it (was "
                    "the node's run directory replaced?)",
                    path, (long long)sb.st_size, (long long)f->sent);
        f->sent = INT64_MAX;
        goto out;
    }
    while (f->sent < sb.st_size) {
        size_t want = (size_t)TD_MIN((int64_t)TD_MIRROR_CHUNK, sb.st_size - f->sent);
        ssize_t r = pread(fd, m->buf, want, f->sent);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = td_error_errno(TD_ERR_IO, "mirror: reading %s", path);
            goto out;
        }
        if (r == 0) break; /* truncated under us */
        st = send_header(m, "tdm data %s %" PRId64 " %zd\n", f->name, f->base + f->sent, r);
        if (st != TD_OK) goto out;
        if (write_all(m->fd, m->buf, (size_t)r) != 0) {
            st = td_error_errno(TD_ERR_IO, "mirror: writing to the link");
            goto out;
        }
        f->sent += r;
        if (sent) *sent += r;
    }
out:
    close(fd);
    return st;
}

td_status td_mirror_out_poll(td_mirror_out *m, int64_t *sent) {
    if (sent) *sent = 0;
    for (size_t d = 0; d < m->ndirs; d++) {
        /* A prefix the receiver refuses would end the stream at its first frame. */
        if (!file_name_ok(m->dirs[d].prefix, strlen(m->dirs[d].prefix))) continue;
        DIR *dir = opendir(m->dirs[d].dir);
        if (!dir) continue; /* not made yet */
        td_status st = TD_OK;
        for (struct dirent *e; st == TD_OK && (e = readdir(dir));) {
            if (!file_name_ok(e->d_name, strlen(e->d_name))) continue;
            char name[512], path[4096];
            snprintf(name, sizeof name, "%s/%s", m->dirs[d].prefix, e->d_name);
            snprintf(path, sizeof path, "%s/%s", m->dirs[d].dir, e->d_name);
            struct stat sb;
            if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
            out_file *f = out_find(m, name, 1);
            if (!f) {
                st = td_error(TD_ERR_INVALID, "mirror: more than %d files", TD_MIRROR_MAX_FILES);
                break;
            }
            if (f->pending || sb.st_size > f->sent) {
                st = send_file(m, f, path, sent);
            } else if (!f->announced && sb.st_size == 0) {
                /* An empty file (a rank that printed nothing yet) is a file all the same. */
                st = send_header(m, "tdm data %s %" PRId64 " 0\n", f->name, f->base);
            }
            f->announced = true;
            f->decided = true; /* its base is set: a later manifest's "have" continues it */
        }
        closedir(dir);
        if (st != TD_OK) return st;
    }
    return TD_OK;
}

td_status td_mirror_out_note(td_mirror_out *m, const char *key, const char *value) {
    if (strpbrk(key, " \n") || strchr(value, '\n'))
        return td_error(TD_ERR_INVALID, "mirror: a note's key has no space, its value no newline");
    return send_header(m, "tdm note %s %s\n", key, value);
}

td_status td_mirror_out_file(td_mirror_out *m, const char *name, const char *path) {
    if (!path_name_ok(name)) {
        TD_LOG_WARN("mirror: not sending %s as '%s': the supervisor accepts only PREFIX/DIR/FILE "
                    "names of [A-Za-z0-9._+=-] with no component starting with '.'",
                    path, name);
        return TD_OK;
    }
    /* O_NONBLOCK: a FIFO put where a file was expected fails the check below, not blocks. */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return td_error_errno(TD_ERR_IO, "mirror: opening %s to send it", path);
    td_status st = TD_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = td_error_errno(TD_ERR_IO, "mirror: stat %s", path);
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = td_error(TD_ERR_IO, "mirror: %s is not a regular file; only files are sent", path);
        goto out;
    }
    if (sb.st_size > FILE_MAX) {
        st = td_error(TD_ERR_IO, "mirror: %s has %lld bytes, over the %lld a link carries", path,
                      (long long)sb.st_size, (long long)FILE_MAX);
        goto out;
    }
    TD_CHECK_GOTO(send_header(m, "tdm file %s %lld\n", name, (long long)sb.st_size), st, out);
    for (int64_t done = 0; done < sb.st_size;) {
        size_t want = (size_t)TD_MIN((int64_t)TD_MIRROR_CHUNK, sb.st_size - done);
        ssize_t r = read(fd, m->buf, want);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = td_error_errno(TD_ERR_IO, "mirror: reading %s", path);
            goto out;
        }
        if (r == 0) {
            st = td_error(TD_ERR_IO,
                          "mirror: %s shrank while being sent (%lld of its %lld bytes read); "
                          "is something still writing it?",
                          path, (long long)done, (long long)sb.st_size);
            goto out;
        }
        if (write_all(m->fd, m->buf, (size_t)r) != 0) {
            st = td_error_errno(TD_ERR_IO, "mirror: writing to the link");
            goto out;
        }
        done += r;
    }
out:
    close(fd);
    return st;
}

td_status td_mirror_out_end(td_mirror_out *m) {
    TD_CHECK(td_mirror_out_poll(m, NULL));
    return send_header(m, "tdm end\n");
}

/* -------------------------------------------------------------- receiver ---- */

typedef struct {
    char *name;
    int fd;
    int64_t size; /* bytes the copy has */
} in_file;

struct td_mirror_in {
    char *root;
    char **prefixes;
    size_t nprefixes;
    td_mirror_callbacks cb;
    in_file *files;
    size_t nfiles;
    char header[HEADER_MAX];
    size_t hlen;
    /* inside a data frame: */
    in_file *cur;
    int64_t pos;       /* offset in the file of the next payload byte */
    int64_t remaining; /* payload bytes still to come (of a data or a file frame) */
    /* inside a file frame: its directory, the temporary being written there, the final name */
    int wdir, wfd;
    char wtmp[64];
    char *wname;  /* NAME from the frame */
    char *wfinal; /* its last component */
    int64_t wsize;
    int ended;
    int64_t appended, duplicate;
};

td_mirror_in *td_mirror_in_new(const char *root, const char *const *prefixes, size_t nprefixes,
                               const td_mirror_callbacks *cb) {
    td_mirror_in *m = td_xcalloc(1, sizeof *m);
    m->root = td_xstrdup(root);
    m->prefixes = td_xcalloc(nprefixes, sizeof *m->prefixes);
    for (size_t i = 0; i < nprefixes; i++) m->prefixes[i] = td_xstrdup(prefixes[i]);
    m->nprefixes = nprefixes;
    if (cb) m->cb = *cb;
    m->wdir = m->wfd = -1;
    return m;
}

/* Drops a whole file being received: the temporary goes, the copy stays as it was. */
static void in_file_abort(td_mirror_in *m) {
    if (m->wfd >= 0) {
        close(m->wfd);
        unlinkat(m->wdir, m->wtmp, 0);
    }
    if (m->wdir >= 0) close(m->wdir);
    m->wdir = m->wfd = -1;
    free(m->wname);
    free(m->wfinal);
    m->wname = m->wfinal = NULL;
    m->remaining = 0;
}

void td_mirror_in_free(td_mirror_in *m) {
    if (!m) return;
    in_file_abort(m);
    for (size_t i = 0; i < m->nfiles; i++) {
        if (m->files[i].fd >= 0) close(m->files[i].fd);
        free(m->files[i].name);
    }
    for (size_t i = 0; i < m->nprefixes; i++) free(m->prefixes[i]);
    free(m->prefixes);
    free(m->files);
    free(m->root);
    free(m);
}

/* "PREFIX/..." with a prefix this receiver accepts. */
static int prefix_ok(const td_mirror_in *m, const char *name) {
    const char *slash = strchr(name, '/');
    if (!slash) return 0;
    size_t plen = (size_t)(slash - name);
    for (size_t i = 0; i < m->nprefixes; i++)
        if (strlen(m->prefixes[i]) == plen && !strncmp(m->prefixes[i], name, plen)) return 1;
    return 0;
}

/* "prefix/FILE" with an accepted prefix and a plain file name. */
static int name_ok(const td_mirror_in *m, const char *name) {
    const char *slash = strchr(name, '/');
    return prefix_ok(m, name) && file_name_ok(slash + 1, strlen(slash + 1));
}

static td_status in_open(td_mirror_in *m, const char *name, in_file **out) {
    for (size_t i = 0; i < m->nfiles; i++)
        if (!strcmp(m->files[i].name, name)) {
            *out = &m->files[i];
            return TD_OK;
        }
    if (m->nfiles >= TD_MIRROR_MAX_FILES)
        return td_error(TD_ERR_FORMAT, "mirror: the link names more than %d files",
                        TD_MIRROR_MAX_FILES);
    char *path = td_xasprintf("%s/%s", m->root, name);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    td_status st = td_mkdirs(path);
    *slash = '/';
    if (st != TD_OK) {
        free(path);
        return st;
    }
    /* NAME is PREFIX/FILE (name_ok). O_NOFOLLOW on both: a link planted where a copy goes, or
     * in place of the prefix's directory, is refused, not written through (as a file frame's
     * directories are entered, in_file_header). */
    char *prefix = td_xstrdup(name), *file = strchr(prefix, '/');
    *file++ = '\0';
    int dfd = open(m->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC), pfd = -1, fd = -1;
    if (dfd >= 0) pfd = openat(dfd, prefix, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (pfd >= 0)
        fd = openat(pfd, file, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = td_error_errno(TD_ERR_IO, "mirror: opening %s for appending", path);
        if (fd >= 0) close(fd);
    }
    if (pfd >= 0) close(pfd);
    if (dfd >= 0) close(dfd);
    free(prefix);
    free(path);
    if (st != TD_OK) return st;
    m->files = td_xrealloc(m->files, (m->nfiles + 1) * sizeof *m->files);
    m->files[m->nfiles] = (in_file){td_xstrdup(name), fd, sb.st_size};
    *out = &m->files[m->nfiles++];
    return TD_OK;
}

char *td_mirror_in_manifest(td_mirror_in *m) {
    size_t cap = 256, len = 0;
    char *text = td_xmalloc(cap);
    text[0] = '\0';
    for (size_t p = 0; p < m->nprefixes; p++) {
        char *dirpath = td_xasprintf("%s/%s", m->root, m->prefixes[p]);
        DIR *dir = opendir(dirpath);
        for (struct dirent *e; dir && (e = readdir(dir));) {
            if (!file_name_ok(e->d_name, strlen(e->d_name))) continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dirpath, e->d_name);
            struct stat sb;
            if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
            char line[600];
            int n = snprintf(line, sizeof line, "have %s/%s %lld\n", m->prefixes[p], e->d_name,
                             (long long)sb.st_size);
            while (len + (size_t)n + 1 > cap) text = td_xrealloc(text, cap *= 2);
            memcpy(text + len, line, (size_t)n + 1);
            len += (size_t)n;
        }
        if (dir) closedir(dir);
        free(dirpath);
    }
    return text;
}

/* Payload bytes at m->pos of m->cur: only what lies beyond the copy's end is written. */
static td_status in_payload(td_mirror_in *m, const char *p, size_t n) {
    in_file *f = m->cur;
    int64_t end = m->pos + (int64_t)n;
    if (m->pos > f->size) {
        /* A gap: bytes the copy never got would be missing from the middle. Only a sender that
         * started from a manifest it was not given can do this; refuse rather than corrupt. */
        return td_error(TD_ERR_FORMAT,
                        "mirror: %s: bytes from offset %lld arrived, but the copy has only %lld",
                        f->name, (long long)m->pos, (long long)f->size);
    }
    if (end > f->size) {
        size_t skip = (size_t)(f->size - m->pos);
        if (write_all(f->fd, p + skip, n - skip) != 0)
            return td_error_errno(TD_ERR_IO, "mirror: appending to %s/%s", m->root, f->name);
        if (m->cb.data) m->cb.data(m->cb.user, f->name, p + skip, n - skip);
        m->appended += (int64_t)(n - skip);
        m->duplicate += (int64_t)skip;
        f->size = end;
    } else {
        m->duplicate += (int64_t)n;
    }
    m->pos = end;
    return TD_OK;
}

/* The file is complete: it replaces the copy in one rename. */
static td_status in_file_finish(td_mirror_in *m) {
    td_status st = TD_OK;
    int fd = m->wfd;
    m->wfd = -1;
    if (close(fd) != 0) {
        st = td_error_errno(TD_ERR_IO, "mirror: writing %s/%s", m->root, m->wname);
        unlinkat(m->wdir, m->wtmp, 0);
    } else if (renameat(m->wdir, m->wtmp, m->wdir, m->wfinal) != 0) {
        st = td_error_errno(TD_ERR_IO, "mirror: putting %s/%s in place", m->root, m->wname);
        unlinkat(m->wdir, m->wtmp, 0);
    } else if (m->cb.file) {
        m->cb.file(m->cb.user, m->wname, m->wsize);
    }
    in_file_abort(m);
    return st;
}

/* "NAME SIZE" of a file frame: the directories exist (made here, none of them a link) and a
 * temporary beside the final name is open for the payload. */
static td_status in_file_header(td_mirror_in *m, char *args) {
    char *sp = strrchr(args, ' ');
    if (!sp) return td_error(TD_ERR_FORMAT, "mirror: malformed file frame 'tdm file %.80s'", args);
    *sp = '\0';
    const char *name = args, *digits = sp + 1;
    size_t nd = strlen(digits);
    int64_t size = 0;
    int strict = nd >= 1 && nd <= 12 && !(nd > 1 && digits[0] == '0');
    for (size_t i = 0; strict && i < nd; i++) {
        if (digits[i] < '0' || digits[i] > '9')
            strict = 0;
        else
            size = size * 10 + (digits[i] - '0');
    }
    if (!strict || size > FILE_MAX)
        return td_error(TD_ERR_FORMAT,
                        "mirror: file frame for '%.80s' has size '%.20s', not a byte count up to "
                        "%lld",
                        name, digits, (long long)FILE_MAX);
    if (!prefix_ok(m, name) || !path_name_ok(name))
        return td_error(TD_ERR_FORMAT,
                        "mirror: the link names '%.80s', which is not a file it may write "
                        "(PREFIX/DIR/.../FILE of [A-Za-z0-9._+=-], nothing hidden, under the run "
                        "directory's prefixes)",
                        name);
    in_file_abort(m);
    td_status st = td_mkdirs(m->root);
    if (st != TD_OK) return st;
    /* The root is the supervisor's own; below it, every directory is entered without following
     * a link, so a symlink planted there cannot take the write elsewhere. */
    int dfd = open(m->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return td_error_errno(TD_ERR_IO, "mirror: opening %s", m->root);
    char *copy = td_xstrdup(name);
    char *comp = copy;
    for (char *slash; (slash = strchr(comp, '/')); comp = slash + 1) {
        *slash = '\0';
        if (mkdirat(dfd, comp, 0755) != 0 && errno != EEXIST) {
            st = td_error_errno(TD_ERR_IO, "mirror: making directory %s under %s for %s", comp,
                                m->root, name);
            break;
        }
        int next = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            st = td_error_errno(TD_ERR_IO,
                                "mirror: %s under %s, on the way to %s, is not a directory (a "
                                "link or a file there is not followed)",
                                comp, m->root, name);
            break;
        }
        close(dfd);
        dfd = next;
    }
    if (st != TD_OK) {
        close(dfd);
        free(copy);
        return st;
    }
    uint64_t r = td_mix64(td_now_ns() ^ (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)m);
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 16; tries++, r = td_mix64(r)) {
        /* A leading '.': no manifest lists it and no sender would send it. */
        snprintf(m->wtmp, sizeof m->wtmp, ".tdm-%016" PRIx64 ".part", r);
        fd = openat(dfd, m->wtmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        st = td_error_errno(TD_ERR_IO, "mirror: creating a temporary for %s/%s", m->root, name);
        close(dfd);
        free(copy);
        return st;
    }
    m->wdir = dfd;
    m->wfd = fd;
    m->wname = td_xstrdup(name);
    m->wfinal = td_xstrdup(comp); /* the last component: the final name within wdir */
    free(copy);
    m->wsize = size;
    m->remaining = size;
    if (size == 0) return in_file_finish(m);
    return TD_OK;
}

static td_status in_header(td_mirror_in *m) {
    char *h = m->header;
    if (!strncmp(h, "tdm data ", 9)) {
        char name[512];
        int64_t off, len;
        int used = 0;
        if (sscanf(h + 9, "%511s %" SCNd64 " %" SCNd64 "%n", name, &off, &len, &used) != 3 ||
            h[9 + used] != '\0' || off < 0 || len < 0 || len > TD_MIRROR_CHUNK ||
            off > INT64_MAX - len) /* the chunk's end must be an offset too */
            return td_error(TD_ERR_FORMAT, "mirror: malformed frame header '%.80s'", h);
        if (!name_ok(m, name))
            return td_error(TD_ERR_FORMAT,
                            "mirror: the link names '%.80s', which is not a file it may write "
                            "(PREFIX/NAME under the run directory's logs/ or metrics/)",
                            name);
        TD_CHECK(in_open(m, name, &m->cur));
        /* Another receiver (an older connection's) may have appended since: the file decides. */
        struct stat sb;
        if (fstat(m->cur->fd, &sb) == 0) m->cur->size = sb.st_size;
        m->pos = off;
        m->remaining = len;
        return TD_OK;
    }
    if (!strncmp(h, "tdm file ", 9)) return in_file_header(m, h + 9);
    if (!strncmp(h, "tdm note ", 9)) {
        char *key = h + 9, *sp = strchr(key, ' ');
        if (!sp || sp == key) return td_error(TD_ERR_FORMAT, "mirror: malformed note '%.80s'", h);
        *sp = '\0';
        if (m->cb.note) m->cb.note(m->cb.user, key, sp + 1);
        return TD_OK;
    }
    if (!strcmp(h, "tdm end")) {
        m->ended = 1;
        return TD_OK;
    }
    return td_error(TD_ERR_FORMAT, "mirror: unknown frame '%.80s'", h);
}

td_status td_mirror_in_feed(td_mirror_in *m, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        if (m->remaining > 0 && m->wfd >= 0) {
            size_t take = (size_t)TD_MIN((int64_t)n, m->remaining);
            if (write_all(m->wfd, p, take) != 0) {
                td_status st =
                    td_error_errno(TD_ERR_IO, "mirror: writing %s/%s", m->root, m->wname);
                in_file_abort(m);
                return st;
            }
            m->remaining -= (int64_t)take;
            p += take;
            n -= take;
            if (m->remaining == 0) TD_CHECK(in_file_finish(m));
            continue;
        }
        if (m->remaining > 0) {
            size_t take = (size_t)TD_MIN((int64_t)n, m->remaining);
            TD_CHECK(in_payload(m, p, take));
            m->remaining -= (int64_t)take;
            p += take;
            n -= take;
            continue;
        }
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        if (m->hlen + take >= HEADER_MAX)
            return td_error(TD_ERR_FORMAT,
                            "mirror: a frame header longer than %d bytes (is "
                            "something else writing to the agent's stdout?)",
                            HEADER_MAX);
        memcpy(m->header + m->hlen, p, take);
        m->hlen += take;
        p += take;
        n -= take;
        if (!nl) break;
        p++; /* the newline */
        n--;
        m->header[m->hlen] = '\0';
        m->hlen = 0;
        TD_CHECK(in_header(m));
    }
    return TD_OK;
}

int td_mirror_in_ended(const td_mirror_in *m) {
    return m->ended;
}

void td_mirror_in_counts(const td_mirror_in *m, int64_t *appended, int64_t *duplicate) {
    if (appended) *appended = m->appended;
    if (duplicate) *duplicate = m->duplicate;
}

void td_mirror_in_reset(td_mirror_in *m) {
    in_file_abort(m);
    m->hlen = 0;
    m->remaining = 0;
    m->cur = NULL;
    m->ended = 0;
}
